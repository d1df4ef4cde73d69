//! Task groups through the public API: one deadline, a report of what is stuck,
//! reverse-order stops, merged events, and dropping the group.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{stubborn, Live};
use taskstage::{
    ErrorKind, Event, RunContext, RunError, RunExit, Stage, StopOrder, Task, TaskGroup, Unit,
};

/// Runs until cancelled; on close, writes its name into a shared log.
struct Logs {
    name: &'static str,
    log: Arc<Mutex<Vec<&'static str>>>,
}

impl Unit for Logs {
    fn name(&self) -> &str {
        self.name
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        self.log.lock().unwrap().push(self.name);
    }
}

fn logged(names: &[&'static str], log: &Arc<Mutex<Vec<&'static str>>>) -> TaskGroup {
    let mut group = TaskGroup::new();
    for &name in names {
        let unit = Logs {
            name,
            log: Arc::clone(log),
        };
        group.add(Task::builder(name).unit(unit).spawn().unwrap());
    }
    group
}

#[tokio::test(start_paused = true)]
async fn pause_all_names_the_task_that_is_stuck() {
    support::within("pause_all", support::PAUSED_BOUND, async {
        let live = Live::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut group = logged(&["a", "b"], &log);
        let (stubborn, _remote) = stubborn("stubborn", &live);
        group.add(Task::builder("c").unit(stubborn).spawn().unwrap());
        for task in group.tasks() {
            task.wait_for_stage(|s| s == Stage::Running).await;
        }
        let started = tokio::time::Instant::now();
        let report = group.pause_all(Duration::from_secs(5)).await;
        assert!(
            started.elapsed() <= Duration::from_secs(6),
            "one deadline for all, not one each"
        );
        let results: Vec<_> = report
            .tasks
            .iter()
            .map(|t| t.result.as_ref().map_err(|e| e.kind()).copied())
            .collect();
        assert_eq!(
            results,
            [
                Ok(Stage::Paused),
                Ok(Stage::Paused),
                Err(ErrorKind::Timeout)
            ]
        );
        assert!(
            !report.all_reached(Stage::Paused),
            "all_reached with a task stuck: {report}"
        );
        let stuck: Vec<_> = report.stuck().collect();
        assert_eq!(stuck.len(), 1, "{report}");
        assert_eq!(&*stuck[0].task, "c");
        assert_eq!(stuck[0].unit, Some((0, "stubborn".into())));
        assert_eq!(stuck[0].stage, Stage::Pausing);
        assert!(stuck[0].waited >= Duration::from_secs(5));
        assert!(
            report
                .to_string()
                .contains("c: stuck in Pausing (unit stubborn)"),
            "{report}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_all_in_reverse_stops_downstream_first() {
    support::within("stop_all reverse", support::REAL_BOUND, async {
        let log = Arc::new(Mutex::new(Vec::new()));
        let group = logged(&["extract", "transform", "load"], &log);
        let report = group
            .stop_all(Duration::from_secs(10), StopOrder::ReverseOfAddition)
            .await;
        assert!(report.all_reached(Stage::Stopped), "{report}");
        assert_eq!(*log.lock().unwrap(), ["load", "transform", "extract"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_all_at_once_stops_every_task() {
    support::within("stop_all", support::REAL_BOUND, async {
        let log = Arc::new(Mutex::new(Vec::new()));
        let group = logged(&["a", "b", "c"], &log);
        let report = group
            .stop_all(Duration::from_secs(10), StopOrder::AllAtOnce)
            .await;
        assert!(report.all_reached(Stage::Stopped), "{report}");
        assert_eq!(report.stuck().count(), 0);
        let mut closed = log.lock().unwrap().clone();
        closed.sort_unstable();
        assert_eq!(closed, ["a", "b", "c"]);
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_merged_stream_carries_every_change_of_every_task_in_order() {
    support::within("merged events", support::REAL_BOUND, async {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut group = TaskGroup::new();
        for name in ["a", "b"] {
            let unit = Logs {
                name,
                log: Arc::clone(&log),
            };
            group.add(Task::builder(name).unit(unit).spawn_paused().unwrap());
        }
        let mut events = group.events();
        let resumed = group.resume_all(Duration::from_secs(10)).await;
        assert!(resumed.tasks.iter().all(|t| t.result.is_ok()));
        for task in group.tasks() {
            task.wait_for_stage(|s| s == Stage::Running).await;
        }
        let stopped = group
            .stop_all(Duration::from_secs(10), StopOrder::AllAtOnce)
            .await;
        assert!(stopped.all_reached(Stage::Stopped), "{stopped}");
        let mut seqs = [0u64; 2];
        let mut last = [Stage::New; 2];
        while let Some((index, event)) = events.next().await {
            let Event::Change(change) = event else {
                panic!("lag in a short run")
            };
            assert_eq!(
                change.seq,
                seqs[index] + 1,
                "task {index} skipped or reordered"
            );
            seqs[index] = change.seq;
            last[index] = change.stage;
        }
        assert_eq!(last, [Stage::Stopped; 2]);
        // Resuming, Running, Stopping, Stopping (closing), Stopped.
        assert_eq!(seqs, [5, 5]);
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_group_stops_its_tasks() {
    support::within("dropped group", support::REAL_BOUND, async {
        let log = Arc::new(Mutex::new(Vec::new()));
        let group = logged(&["a", "b"], &log);
        let mut events = group.events();
        drop(group);
        let mut ends = vec![];
        while let Some((index, event)) = events.next().await {
            if let Event::Change(change) = event {
                if change.stage.is_terminal() {
                    ends.push((index, change.stage));
                }
            }
        }
        ends.sort_unstable_by_key(|(index, _)| *index);
        assert_eq!(ends, [(0, Stage::Stopped), (1, Stage::Stopped)]);
        assert_eq!(log.lock().unwrap().len(), 2, "every unit closed");
    })
    .await;
}

/// The merged stream takes turns: while several tasks have changes waiting, it does
/// not serve one task's backlog before the others'.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_merged_stream_takes_turns_between_tasks_with_changes_waiting() {
    support::within("fair merge", support::PAUSED_BOUND, async {
        let log = Arc::new(Mutex::new(Vec::new()));
        let group = logged(&["a", "b"], &log);
        let mut events = group.events();
        // Both tasks run and stop before the stream is read: their changes wait in
        // their journals.
        for task in group.tasks() {
            task.wait_for_stage(|s| s == Stage::Running).await;
        }
        for task in group.tasks() {
            assert_eq!(task.stop().await.ok(), Some(Stage::Stopped));
        }
        let mut order = Vec::new();
        while let Some((index, _)) = events.next().await {
            order.push(index);
        }
        let counts = [0, 1].map(|i| order.iter().filter(|&&o| o == i).count());
        assert!(counts[0] >= 3 && counts[1] >= 3, "{order:?}");
        let turns = 2 * counts[0].min(counts[1]);
        let expected: Vec<usize> = (0..turns).map(|i| i % 2).collect();
        assert_eq!(
            order[..turns],
            expected[..],
            "one task's backlog was served before the other's: {order:?}"
        );
    })
    .await;
}

/// `stop_all` aborts a run that ignores its cancellation halfway to the deadline, and
/// so returns within it: all at once, every stubborn run is aborted at half the
/// deadline; in reverse order, each task gets half of what is left.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stop_all_aborts_stubborn_runs_halfway_to_the_deadline() {
    support::within("stop_all deadline", support::PAUSED_BOUND, async {
        let deadline = Duration::from_secs(4);
        let live = Live::new();
        for (order, expected) in [
            (StopOrder::AllAtOnce, Duration::from_secs(2)),
            // The last task: aborted after 4 s / 2; the first: after (4 − 2) s / 2.
            (StopOrder::ReverseOfAddition, Duration::from_secs(3)),
        ] {
            let mut group = TaskGroup::new();
            let mut remotes = Vec::new();
            for name in ["first", "last"] {
                let (unit, remote) = stubborn(name, &live);
                remotes.push(remote);
                group.add(Task::builder(name).unit(unit).spawn().unwrap());
            }
            for task in group.tasks() {
                task.wait_for_stage(|s| s == Stage::Running).await;
            }
            let started = tokio::time::Instant::now();
            let report = group.stop_all(deadline, order).await;
            let took = started.elapsed();
            assert!(report.all_reached(Stage::Stopped), "{order:?}: {report}");
            assert!(
                took >= expected && took < expected + Duration::from_millis(100),
                "{order:?}: took {took:?}, not {expected:?}"
            );
            assert_eq!(live.now(), 0, "{order:?}: a stubborn run outlived stop_all");
        }
    })
    .await;
}

/// Ten tasks in New whose units' closes wait at `gate`.
fn closing_group(gate: &Arc<support::Gate>) -> TaskGroup {
    let mut group = TaskGroup::new();
    for _ in 0..10 {
        let task = Task::builder("flush")
            .unit(support::SlowClose(Arc::clone(gate)))
            .spawn_paused()
            .unwrap();
        group.add(task);
    }
    group
}

/// Ten tasks at rest whose closes block their threads: `stop_all` issues every stop
/// without running a close, and its one deadline bounds the whole call; the closes
/// run side by side (each waits at a gate that opens only when all ten wait), and the
/// tasks still closing at the deadline are named as stuck in Stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_all_shares_one_deadline_over_closes_that_block() {
    let gate = support::Gate::new(usize::MAX);
    let group = closing_group(&gate);
    let deadline = Duration::from_millis(300);
    let report = group.stop_all(deadline, StopOrder::AllAtOnce).await;
    // Before the gate opens: every close is still blocked, so every task is stuck.
    assert_eq!(report.stuck().count(), 10, "{report}");
    assert!(
        report.stuck().all(|s| s.stage == Stage::Stopping),
        "{report}"
    );
    gate.open();
    assert_eq!(gate.late(), 0, "a close ran in the caller of stop_all");
    let stopped = group
        .stop_all(Duration::from_secs(10), StopOrder::AllAtOnce)
        .await;
    assert!(stopped.all_reached(Stage::Stopped), "{stopped}");
    assert_eq!(gate.arrived(), 10);
}

/// The closes of a group's stops run at once, not one after another: each waits at a
/// gate that opens only when all ten are waiting.
#[tokio::test(flavor = "current_thread")]
async fn a_groups_closes_run_side_by_side() {
    let gate = support::Gate::new(10);
    let group = closing_group(&gate);
    let stopped = group
        .stop_all(Duration::from_secs(10), StopOrder::AllAtOnce)
        .await;
    assert!(stopped.all_reached(Stage::Stopped), "{stopped}");
    assert_eq!(gate.late(), 0, "the closes ran one after another");
}

/// A group's merged stream over a task that is already terminal ends once the others'
/// streams end (it waited forever on the finished task).
#[tokio::test(flavor = "current_thread")]
async fn the_merged_stream_ends_over_a_task_that_is_already_terminal() {
    let mut group = TaskGroup::new();
    let done = Task::builder("done")
        .unit(support::Instant("once"))
        .spawn()
        .unwrap();
    done.wait_for_stage(|s| s == Stage::Finished).await;
    group.add(done);
    let mut events = group.events();
    let end = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "the merged stream of a finished task did not end: {end:?}"
    );
}
