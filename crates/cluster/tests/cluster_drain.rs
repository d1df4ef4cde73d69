//! Draining a worker (`Controller::drain`), in process on the in-memory store and
//! tokio's paused clock: the drained worker hands every task it holds over, a failed
//! one included, claims nothing more and stays alive; its peers run every task; and
//! the history checker (`cluster_support::history`, rule 1) finds no two runs of a
//! task alive at once.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cluster_support::history::{histories, remove_histories, History, Recorder};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, Fencer, LeaseKeeping, MemoryCoordinator, TaskStatus,
    Worker,
};
use tokio::time::Instant;

/// A unit that records its run in the history and counts the runs alive; on the
/// worker `fails_on`, it fails at once.
struct Tracked {
    task: String,
    worker: String,
    fencer: Fencer,
    recorder: Arc<Recorder>,
    live: Arc<AtomicUsize>,
    fails_on: Option<&'static str>,
}

struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Unit for Tracked {
    fn name(&self) -> &str {
        "tracked"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let _alive = self.recorder.alive(
            &self.task,
            &self.worker,
            ctx.generation(),
            self.fencer.token().revision,
        );
        self.live.fetch_add(1, Ordering::SeqCst);
        let _count = Alive(Arc::clone(&self.live));
        if self.fails_on == Some(self.worker.as_str()) {
            return Err(RunError::msg("fails on this worker"));
        }
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

async fn join(
    store: &MemoryCoordinator,
    id: &'static str,
    recorder: &Arc<Recorder>,
    live: &Arc<AtomicUsize>,
) -> Worker {
    let (recorder, live) = (Arc::clone(recorder), Arc::clone(live));
    Worker::builder(store.clone(), "drain", id)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(4))
        .resync(Duration::from_secs(1))
        .join(move |spec| {
            let task = spec.task.as_str().to_owned();
            let fails_on = (task == "flaky").then_some("w1");
            Ok(Task::builder(task.clone()).unit(Tracked {
                task,
                worker: id.to_owned(),
                fencer: spec.fencer,
                recorder: Arc::clone(&recorder),
                live: Arc::clone(&live),
                fails_on,
            }))
        })
        .await
        .expect("join on the in-memory store")
}

/// Waits on the store's changes until `done` holds for the list of tasks, failing
/// after `bound` (of the paused clock) with `what` and the last list.
async fn until(
    controller: &Controller,
    bound: Duration,
    what: &str,
    done: impl Fn(&[TaskStatus]) -> bool,
) -> Vec<TaskStatus> {
    let end = Instant::now() + bound;
    // Bounded by `end`: every turn waits at most until it.
    loop {
        let list = controller.list().await.expect("the store answers");
        if done(&list) {
            return list;
        }
        let now = Instant::now();
        assert!(now < end, "not within {bound:?}: {what}: {list:#?}");
        let revision = list.iter().map(|s| s.revision).max().unwrap_or(0);
        controller
            .wait_tasks_change(revision, (end - now).min(Duration::from_secs(1)))
            .await
            .expect("the store answers");
    }
}

/// The observed stage of a task as its current owner reported it, and the owner.
fn observed(status: &TaskStatus) -> Option<(Stage, &str)> {
    let o = status.current_observed()?;
    Some((o.stage, o.owner.as_str()))
}

fn holders(list: &[TaskStatus]) -> BTreeMap<String, usize> {
    let mut held = BTreeMap::new();
    for owner in list.iter().filter_map(|s| s.owner.as_ref()) {
        *held.entry(owner.as_str().to_owned()).or_insert(0) += 1;
    }
    held
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_drained_worker_hands_every_task_over_and_no_run_overlaps_another() {
    let (dir, recorder) = histories("drain");
    let live = Arc::new(AtomicUsize::new(0));
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "drain").expect("a controller");

    // w1 alone takes every task, "flaky" among them, whose run fails on w1.
    let w1_live = Arc::new(AtomicUsize::new(0));
    let w1 = join(&store, "w1", &recorder, &w1_live).await;
    let tasks: Vec<String> = (0..11)
        .map(|i| format!("t{i:02}"))
        .chain(["flaky".to_owned()])
        .collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("created");
    }
    until(
        &controller,
        Duration::from_secs(30),
        "w1 runs every task, flaky failed",
        |list| {
            list.len() == tasks.len()
                && list.iter().all(|s| {
                    let want = if s.task.as_str() == "flaky" {
                        Stage::Paused
                    } else {
                        Stage::Running
                    };
                    observed(s) == Some((want, "w1"))
                })
        },
    )
    .await;

    // Two more workers: the shares move tasks to them, not the failed one.
    let w2 = join(&store, "w2", &recorder, &live).await;
    let w3 = join(&store, "w3", &recorder, &live).await;
    let list = until(
        &controller,
        Duration::from_secs(60),
        "the shares are 4, 4, 4 and every task is answered",
        |list| {
            holders(list).values().all(|n| *n == 4)
                && holders(list).len() == 3
                && list.iter().all(|s| s.answers(s.desired_revision))
        },
    )
    .await;
    let flaky = list
        .iter()
        .find(|s| s.task.as_str() == "flaky")
        .and_then(observed);
    assert_eq!(flaky, Some((Stage::Paused, "w1")), "a failure is not moved");
    assert!(!w1.is_draining());

    // Bad input: typed errors, nothing written.
    assert!(matches!(
        controller.drain("nobody").await,
        Err(ClusterError::NoSuchWorker { command: "drain", ref worker }) if worker.as_str() == "nobody"
    ));
    assert!(matches!(
        controller.drain("a/b").await,
        Err(ClusterError::InvalidWorkerId { .. })
    ));
    let members = controller.worker_statuses().await.expect("members");
    assert!(members.iter().all(|m| !m.draining), "{members:?}");

    // The drain returns once w1 holds nothing.
    controller
        .drain_within("w1", Duration::from_secs(60))
        .await
        .expect("w1 drained in time");
    assert_eq!(controller.held_by("w1").await.expect("a read"), Vec::new());
    assert_eq!(w1_live.load(Ordering::SeqCst), 0, "a run alive on w1");
    assert!(w1.is_draining());
    assert!(!w1.is_finished(), "a drained worker stays alive");
    let members = controller.worker_statuses().await.expect("members");
    let drained: Vec<(&str, bool)> = members
        .iter()
        .map(|m| (m.worker.as_str(), m.draining))
        .collect();
    assert_eq!(drained, [("w1", true), ("w2", false), ("w3", false)]);
    // Draining again changes nothing.
    controller.drain("w1").await.expect("drained again");

    // The peers run every task, the failed one included (it fails on w1 only); a
    // task created now is not claimed by w1.
    controller
        .create("late", Vec::new(), DesiredStage::Running)
        .await
        .expect("created");
    let list = until(
        &controller,
        Duration::from_secs(60),
        "w2 and w3 run every task",
        |list| {
            list.len() == tasks.len() + 1
                && list.iter().all(|s| {
                    observed(s)
                        .is_some_and(|(stage, owner)| stage == Stage::Running && owner != "w1")
                })
        },
    )
    .await;
    let held = holders(&list);
    assert_eq!(held.get("w1"), None, "{held:?}");
    assert_eq!(held.values().sum::<usize>(), tasks.len() + 1);
    assert!(
        held.values().all(|n| (6..=7).contains(n)),
        "the two peers share the tasks: {held:?}"
    );
    assert_eq!(
        live.load(Ordering::SeqCst),
        tasks.len() + 1,
        "one run a task"
    );
    assert_eq!(w1_live.load(Ordering::SeqCst), 0);
    assert!(w1.tasks().is_empty(), "w1 still holds {:?}", w1.tasks());

    // The drain lives under w1's lease: once w1 ends without a word (a crash),
    // its membership ends with its lease, drained or not.
    w1.crash().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let members = controller.worker_statuses().await.expect("members");
    let ids: Vec<&str> = members.iter().map(|m| m.worker.as_str()).collect();
    assert_eq!(ids, ["w2", "w3"], "a drain outlived its worker's lease");
    for worker in [w2, w3] {
        worker.shutdown().await.expect("a clean shutdown");
    }
    assert_eq!(
        live.load(Ordering::SeqCst) + w1_live.load(Ordering::SeqCst),
        0
    );
    let history = History::load(&dir).expect("the history reads back");
    let verdict = history.check(Duration::ZERO);
    assert!(verdict.passed(), "the history checker: {verdict}");
    assert!(verdict.runs > tasks.len(), "runs moved: {verdict}");
    assert_eq!(verdict.max_live, 1, "{verdict}");
    remove_histories(&dir);
}
