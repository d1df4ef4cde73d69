//! The `metrics` feature: the values a recording backend sees after a scripted scenario.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]
#![cfg(feature = "metrics")]

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use taskstage::policy::{AutoResume, BackoffSettings};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};

/// Fails its first run with an I/O error; then runs until cancelled.
struct FailsOnce(u32);

impl Unit for FailsOnce {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.0 += 1;
        if self.0 == 1 {
            return Err(RunError::new(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )));
        }
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

fn labels(key: &CompositeKey) -> Vec<(String, String)> {
    key.key()
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect()
}

/// One snapshot of the recorder (taking it resets the recorder's values).
type Seen = Vec<(CompositeKey, DebugValue)>;

/// The value of metric `name` with exactly `want` as labels.
fn value<'a>(seen: &'a Seen, name: &str, want: &[(&str, &str)]) -> Option<&'a DebugValue> {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    seen.iter()
        .find(|(key, _)| {
            let mut have = labels(key);
            have.sort();
            let mut want = want.clone();
            want.sort();
            key.key().name() == name && have == want
        })
        .map(|(_, value)| value)
}

fn counter(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(seen, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

fn gauge(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> f64 {
    match value(seen, name, labels) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        None => 0.0,
        Some(other) => panic!("{name} {labels:?} is not a gauge: {other:?}"),
    }
}

fn histogram_count(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> usize {
    match value(seen, name, labels) {
        Some(DebugValue::Histogram(values)) => values.len(),
        None => 0,
        Some(other) => panic!("{name} {labels:?} is not a histogram: {other:?}"),
    }
}

#[test]
fn a_scripted_scenario_is_reported_through_the_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    // The process's recorder, as an application installs it: a stop's closes, and
    // the Stopped they lead to, are published from tokio's blocking pool.
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    {
        runtime.block_on(async {
            let settings =
                BackoffSettings::new(Duration::from_secs(1), Duration::from_secs(60), 2.0).unwrap();
            let policy = AutoResume::new(settings, |error: &RunError| {
                error.get_ref().downcast_ref::<std::io::Error>().is_some()
            });
            tokio::spawn(policy.run());
            let task = Task::builder("t")
                .unit(FailsOnce(0))
                .spawn_paused()
                .unwrap();
            policy.add(&task);
            task.resume().await.unwrap();
            // Fails, is auto-resumed, runs.
            let running = task.wait_for(|s| s.stage == Stage::Running && s.generation == 2);
            tokio::time::timeout(Duration::from_secs(3600), running)
                .await
                .expect("auto-resumed");
            assert!(task.resume().await.is_err(), "resume refused while Running");
            assert_eq!(task.pause().await.unwrap(), Stage::Paused);
            let mut observed = task.subscribe();
            assert_eq!(task.stop().await.unwrap(), Stage::Stopped);
            // Observers are told after the core published: the metrics first, then
            // the subscribers, from the thread that made the change (for a stop, the
            // blocking pool's, after the closes). Wait for the subscriber's view.
            let told = observed.wait_for(|event| event.stage == Stage::Stopped);
            tokio::time::timeout(Duration::from_secs(3600), told)
                .await
                .expect("the subscriber was told of Stopped")
                .expect("the task's channel is open");
            assert!(task.pause().await.is_err(), "pause refused in Stopped");

            let seen: Seen = snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| (key, value))
                .collect();
            let s = &seen;
            assert_eq!(gauge(s, "taskstage_tasks", &[("stage", "Stopped")]), 1.0);
            for stage in [
                "New", "Running", "Paused", "Resuming", "Pausing", "Stopping",
            ] {
                assert_eq!(
                    gauge(s, "taskstage_tasks", &[("stage", stage)]),
                    0.0,
                    "{stage}"
                );
            }
            let moves = |from, to| {
                counter(
                    s,
                    "taskstage_transitions_total",
                    &[("from", from), ("to", to)],
                )
            };
            assert_eq!(moves("New", "Resuming"), 1);
            assert_eq!(
                moves("Resuming", "Running"),
                2,
                "the start and the auto-resume"
            );
            assert_eq!(moves("Running", "Paused"), 1, "the failure");
            assert_eq!(moves("Paused", "Resuming"), 1);
            assert_eq!(moves("Running", "Pausing"), 1);
            assert_eq!(moves("Pausing", "Paused"), 1);
            assert_eq!(moves("Paused", "Stopping"), 1);
            assert_eq!(moves("Stopping", "Stopped"), 1);
            let refused = |command, stage| {
                counter(
                    s,
                    "taskstage_refused_total",
                    &[("command", command), ("stage", stage)],
                )
            };
            assert_eq!(refused("resume", "Running"), 1);
            assert_eq!(refused("pause", "Stopped"), 1);
            assert_eq!(
                histogram_count(s, "taskstage_pause_seconds", &[("reached", "Paused")]),
                1
            );
            assert_eq!(
                histogram_count(s, "taskstage_stop_seconds", &[("reached", "Stopped")]),
                1
            );
            assert_eq!(counter(s, "taskstage_auto_resumes_total", &[]), 1);
            drop(task);
        });
    }
    // A task counts until it is gone: its drop takes it off the Stopped gauge (the
    // snapshot above reset the gauge to 0, so the drop shows as -1 here).
    drop(runtime);
    let after: Seen = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key, value))
        .collect();
    assert_eq!(
        gauge(&after, "taskstage_tasks", &[("stage", "Stopped")]),
        -1.0
    );
}
