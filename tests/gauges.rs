//! The `taskstage_tasks{stage}` gauges count the tasks that exist, each once, in the
//! stage it is in, and a task that is gone leaves them: with tasks whose handles were
//! dropped (which stops them: some while running, some while paused, one never
//! started) beside kept tasks in every stage, on a current-thread and on a
//! multi-thread runtime. No gauge is ever below 0.
//!
//! One test function, so that the process-wide metrics recorder sees this test's
//! tasks only.
#![cfg(feature = "metrics")]
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use taskstage::{Handle, RunContext, RunError, RunExit, Stage, Task, Unit};

/// How long the gauges may take to settle after a change nobody waits for (a dropped
/// handle's stop, whose closes run on tokio's blocking pool).
const SETTLE: Duration = Duration::from_secs(20);

/// Runs until cancelled; its close yields its thread, as a flush does.
struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        std::thread::yield_now();
    }
}

/// Completes at once.
struct Done;

impl Unit for Done {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        Ok(RunExit::Completed)
    }
}

/// Ignores cancellation until released: keeps its task in Pausing.
struct Stubborn(Arc<tokio::sync::Notify>);

impl Unit for Stubborn {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.notified().await;
        Ok(RunExit::Cancelled)
    }
}

/// Its close blocks its thread until released: keeps its task in Stopping. (Stopped
/// at rest, so that the close runs on tokio's blocking pool, not on a runtime thread.)
struct SlowClose(Arc<AtomicBool>);

impl Unit for SlowClose {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        let began = Instant::now();
        while !self.0.load(Ordering::Acquire) && began.elapsed() < SETTLE * 2 {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

/// The gauges as the recorder holds them (a snapshot resets what it reports, so they
/// are the sums of every snapshot taken).
struct Gauges {
    snapshotter: Snapshotter,
    sums: BTreeMap<String, f64>,
}

impl Gauges {
    /// Takes a snapshot; panics if any gauge is below 0.
    fn read(&mut self, what: &str) -> BTreeMap<String, f64> {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            if key.key().name() != "taskstage_tasks" {
                continue;
            }
            let stage = key
                .key()
                .labels()
                .find(|l| l.key() == "stage")
                .map(|l| l.value().to_owned())
                .expect("taskstage_tasks has a stage label");
            let DebugValue::Gauge(v) = value else {
                panic!("taskstage_tasks is not a gauge: {value:?}")
            };
            *self.sums.entry(stage).or_default() += v.into_inner();
        }
        for (stage, v) in &self.sums {
            assert!(*v >= 0.0, "{what}: taskstage_tasks{{stage={stage}}} = {v}");
        }
        self.sums
            .iter()
            .filter(|(_, v)| **v != 0.0)
            .map(|(s, v)| (s.clone(), *v))
            .collect()
    }

    /// Waits, up to [`SETTLE`], until the gauges show exactly `want` (the stages of
    /// the tasks that exist); never below 0 on the way.
    async fn settle(&mut self, want: &[Stage], what: &str) {
        let mut expected = BTreeMap::new();
        for stage in want {
            *expected.entry(stage.name().to_owned()).or_insert(0.0) += 1.0;
        }
        let began = Instant::now();
        loop {
            let seen = self.read(what);
            if seen == expected {
                return;
            }
            assert!(
                began.elapsed() < SETTLE,
                "{what}: after {SETTLE:?} the gauges read {seen:?}, but the tasks that exist are {expected:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

async fn running(handle: &Handle) {
    handle.wait_for_stage(|s| s == Stage::Running).await;
}

/// Kept tasks in every stage, and dropped ones beside them; then every task gone.
async fn scenario(gauges: &mut Gauges, runtime: &str) {
    let new = Task::builder("kept-new").unit(Wait).spawn_paused().unwrap();
    let run = Task::builder("kept-running").unit(Wait).spawn().unwrap();
    running(&run).await;
    let paused = Task::builder("kept-paused").unit(Wait).spawn().unwrap();
    running(&paused).await;
    assert_eq!(paused.pause().await.unwrap(), Stage::Paused);
    let stopped = Task::builder("kept-stopped").unit(Wait).spawn().unwrap();
    running(&stopped).await;
    assert_eq!(stopped.stop().await.unwrap(), Stage::Stopped);
    let finished = Task::builder("kept-finished").unit(Done).spawn().unwrap();
    finished.wait_for_stage(Stage::is_terminal).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let pausing = Task::builder("kept-pausing")
        .unit(Stubborn(Arc::clone(&release)))
        .pause_timeout(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    running(&pausing).await;
    let pause = pausing.pause_now().unwrap();
    assert_eq!(pausing.stage(), Stage::Pausing);
    let closing = Arc::new(AtomicBool::new(false));
    let stopping = Task::builder("kept-stopping")
        .unit(SlowClose(Arc::clone(&closing)))
        .spawn()
        .unwrap();
    running(&stopping).await;
    assert_eq!(stopping.pause().await.unwrap(), Stage::Paused);
    let stop = stopping.stop_now().unwrap();
    stopping.wait_for_stage(|s| s == Stage::Stopping).await;

    // Dropped: two running, two paused, one never started. Dropping the last handle
    // stops each; nothing waits for those stops.
    for i in 0..2 {
        let h = Task::builder(format!("dropped-running-{i}"))
            .unit(Wait)
            .spawn()
            .unwrap();
        running(&h).await;
        drop(h);
        let h = Task::builder(format!("dropped-paused-{i}"))
            .unit(Wait)
            .spawn()
            .unwrap();
        running(&h).await;
        assert_eq!(h.pause().await.unwrap(), Stage::Paused);
        drop(h);
    }
    drop(
        Task::builder("dropped-new")
            .unit(Wait)
            .spawn_paused()
            .unwrap(),
    );

    let kept = [
        &new, &run, &paused, &stopped, &finished, &pausing, &stopping,
    ];
    let stages: Vec<Stage> = kept.iter().map(|h| h.stage()).collect();
    assert_eq!(
        stages,
        [
            Stage::New,
            Stage::Running,
            Stage::Paused,
            Stage::Stopped,
            Stage::Finished,
            Stage::Pausing,
            Stage::Stopping
        ],
        "{runtime}: the kept tasks"
    );
    gauges
        .settle(&stages, &format!("{runtime}: handles dropped"))
        .await;

    // The kept ones leave their transitional stages, then go too.
    release.notify_one();
    assert_eq!(pause.await.unwrap(), Stage::Paused);
    closing.store(true, Ordering::Release);
    assert_eq!(stop.await.unwrap(), Stage::Stopped);
    let stages: Vec<Stage> = kept.iter().map(|h| h.stage()).collect();
    gauges
        .settle(&stages, &format!("{runtime}: pausing and stopping settled"))
        .await;
    drop((new, run, paused, stopped, finished, pausing, stopping));
    gauges
        .settle(&[], &format!("{runtime}: every handle dropped"))
        .await;
}

/// Tasks dropped just before their runtime ends, some with an event stream and an
/// observer kept until their stops are done: their stops are still in flight when
/// the runtime drops its tasks. Returns the kept tasks.
async fn dropped_before_the_runtime_ends() -> Vec<Handle> {
    let mut kept = Vec::new();
    let mut watched = Vec::new();
    for i in 0..2 {
        let h = Task::builder(format!("late-running-{i}"))
            .unit(Wait)
            .spawn()
            .unwrap();
        running(&h).await;
        drop(h);
        let h = Task::builder(format!("late-paused-{i}"))
            .unit(Wait)
            .spawn()
            .unwrap();
        running(&h).await;
        assert_eq!(h.pause().await.unwrap(), Stage::Paused);
        drop(h);
        let (h, events) = Task::builder(format!("watched-running-{i}"))
            .unit(Wait)
            .spawn_with_events()
            .unwrap();
        running(&h).await;
        watched.push((events, h.observer()));
        drop(h);
        let h = Task::builder(format!("late-kept-{i}"))
            .unit(Wait)
            .spawn()
            .unwrap();
        running(&h).await;
        kept.push(h);
    }
    for (_, observer) in &watched {
        observer.wait_for_stage(Stage::is_terminal).await;
    }
    drop(watched);
    kept
}

fn runtime(flavor: &str) -> tokio::runtime::Runtime {
    match flavor {
        "current-thread" => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut multi = tokio::runtime::Builder::new_multi_thread();
            multi.worker_threads(2);
            multi
        }
    }
    .enable_all()
    .build()
    .unwrap()
}

const FLAVORS: [&str; 2] = ["current-thread", "multi-thread"];

/// Every scenario, on both runtimes; `within` runs each runtime's work (under a
/// recorder of its own, or the global one).
fn rounds(gauges: &mut Gauges, recorder: &str, within: &dyn Fn(&mut dyn FnMut())) {
    for round in 0..5 {
        for flavor in FLAVORS {
            let what = format!("{recorder} recorder, {flavor}, round {round}");
            let rt = runtime(flavor);
            within(&mut || rt.block_on(scenario(gauges, &what)));
            drop(rt);
            let rt = runtime(flavor);
            let mut kept = Vec::new();
            within(&mut || kept = rt.block_on(dropped_before_the_runtime_ends()));
            drop(rt);
            let stages: Vec<Stage> = kept.iter().map(|h| h.stage()).collect();
            let after = runtime("current-thread");
            let what = format!("{what}: the runtime ended after handles were dropped");
            after.block_on(gauges.settle(&stages, &what));
            drop(kept);
            after.block_on(gauges.settle(&[], &format!("{what}, then every handle")));
        }
    }
}

#[test]
fn the_stage_gauges_count_each_task_that_exists_once_in_its_stage() {
    // A recorder set for the thread that spawns the tasks (`with_local_recorder`):
    // the changes made on other threads (a run's, the blocking pool's) reach it too.
    for flavor in FLAVORS {
        let recorder = DebuggingRecorder::new();
        let mut gauges = Gauges {
            snapshotter: recorder.snapshotter(),
            sums: BTreeMap::new(),
        };
        let rt = runtime(flavor);
        let what = format!("local recorder, {flavor}");
        metrics::with_local_recorder(&recorder, || rt.block_on(scenario(&mut gauges, &what)));
    }
    // The process-wide recorder.
    let recorder = DebuggingRecorder::new();
    let mut gauges = Gauges {
        snapshotter: recorder.snapshotter(),
        sums: BTreeMap::new(),
    };
    metrics::set_global_recorder(recorder).expect("the only global recorder of this test binary");
    rounds(&mut gauges, "global", &|work| work());
}
