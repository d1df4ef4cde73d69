//! Promises of the cluster layer that no scenario test pinned down, each checked in
//! process on the in-memory store and tokio's paused clock: the lease deadline's
//! arithmetic, the compare that makes `set_desired` a compare-and-set (a coordinator
//! wrapper makes the race happen on cue), a worker's capacity, and two rules of the
//! worker about store answers it never got (a wrapper loses the answer to a release):
//! a hand-over whose release was sent is carried through, and a key the store
//! refuses to confirm is never adopted.
//!
//! Each test here kills a mutant of `scripts/mutation-check.sh` that every other
//! suite let through (see docs/mutants.md).
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;
use taskstage_harness::pass_to_store;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use taskstage_cluster::{
    BoxFuture, ClusterError, Controller, Coordinator, DesiredStage, Grant, KeepAlive, LeaseKeeping,
    Listing, MemoryCoordinator, Op, Txn, TxnResult, WatchStream, Worker,
};
use tokio::time::Instant;

/// A run that waits for its cancellation.
struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// Waits, on the paused clock, until `probe` returns `Some`, failing after `bound`.
async fn eventually<T>(bound: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + bound;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < end, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `TTL·(1−ρ) − stop bound` after the keep-alive was sent, to the millisecond: at
/// join (the grant counts as the first keep-alive) and after a later keep-alive.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_lease_deadline_leaves_the_drift_and_the_stop_bound() {
    let store = MemoryCoordinator::new();
    let joined = Instant::now();
    // TTL 10 s, ρ = 0.1, stop bound 2 s: the lease is trusted for 10·0.9 − 2 = 7 s
    // after each keep-alive is sent, and keep-alives go every 7 s / 3 = 2333 ms.
    let worker = Worker::builder(store.clone(), "lease", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(10))
        .drift(0.1)
        .stop_bound(Duration::from_secs(2))
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join on the in-memory store");
    let first = worker.stop_deadline().expect("a deadline at join");
    assert_eq!(
        first.duration_since(joined),
        Duration::from_millis(7_000),
        "the deadline at join is not TTL·(1−ρ) − stop bound"
    );
    // The keep-alive at 2333 ms moves it to 2333 + 7000 ms.
    let moved = eventually(
        Duration::from_secs(5),
        "a keep-alive moving the deadline",
        || worker.stop_deadline().filter(|deadline| *deadline != first),
    )
    .await;
    assert_eq!(
        moved.duration_since(joined),
        Duration::from_millis(2_333 + 7_000),
        "a keep-alive's deadline is not sent + TTL·(1−ρ) − stop bound"
    );
    worker.shutdown().await.expect("shutdown");
}

/// A coordinator that forwards to the in-memory store and answers every
/// keep-alive `delay` late, and every transaction `txn_delay` late (the store
/// applies each at once: a watch may show a write before its answer comes).
#[derive(Clone)]
struct SlowAnswers {
    store: MemoryCoordinator,
    delay: Duration,
    txn_delay: Duration,
    list_delay: Duration,
}

impl Coordinator for SlowAnswers {
    pass_to_store!(grant, revoke, watch, wait_change);

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            let answer = self.store.keep_alive(lease).await;
            tokio::time::sleep(self.delay).await;
            answer
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            let answer = self.store.list(prefix).await;
            tokio::time::sleep(self.list_delay).await;
            answer
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let answer = self.store.txn(txn).await;
            tokio::time::sleep(self.txn_delay).await;
            answer
        })
    }
}

/// The deadline counts from when the keep-alive was *sent*, not from when its
/// answer came: with every answer 500 ms late, the keep-alive sent at 2333 ms
/// still moves the deadline to 2333 + 7000 ms.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_lease_deadline_counts_from_the_keep_alive_sent_not_answered() {
    let store = MemoryCoordinator::new();
    let slow = SlowAnswers {
        store: store.clone(),
        delay: Duration::from_millis(500),
        txn_delay: Duration::ZERO,
        list_delay: Duration::ZERO,
    };
    let joined = Instant::now();
    let worker = Worker::builder(slow, "sent", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(10))
        .drift(0.1)
        .stop_bound(Duration::from_secs(2))
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join on the in-memory store");
    let first = worker.stop_deadline().expect("a deadline at join");
    let moved = eventually(
        Duration::from_secs(5),
        "a keep-alive moving the deadline",
        || worker.stop_deadline().filter(|deadline| *deadline != first),
    )
    .await;
    assert_eq!(
        moved.duration_since(joined),
        Duration::from_millis(2_333 + 7_000),
        "the deadline does not count from when the keep-alive was sent"
    );
    worker.shutdown().await.expect("shutdown");
}

/// A write another writer makes, staged to land just before a transaction that
/// writes the same kind of key: the key's last component, the value and the lease.
type Staged = (&'static str, Vec<u8>, Option<i64>);

/// A coordinator that forwards to the in-memory store and, once a write is staged,
/// applies it to the key of the next transaction that puts a key with the staged
/// name, just before that transaction: the race a compare exists for, on cue.
#[derive(Clone)]
struct Racing {
    store: MemoryCoordinator,
    staged: Arc<std::sync::Mutex<Option<Staged>>>,
}

impl Racing {
    fn new(store: &MemoryCoordinator) -> Racing {
        Racing {
            store: store.clone(),
            staged: Arc::default(),
        }
    }

    fn stage(&self, name: &'static str, value: &[u8], lease: Option<i64>) {
        *self.lock() = Some((name, value.to_vec(), lease));
    }

    fn landed(&self) -> bool {
        self.lock().is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Coordinator for Racing {
    pass_to_store!(grant, keep_alive, revoke, list, watch, wait_change);

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let other = {
                let mut staged = self.lock();
                let key = staged.as_ref().and_then(|(name, _, _)| {
                    txn.then.iter().find_map(|op| match op {
                        Op::Put { key, .. } if key.rsplit('/').next() == Some(name) => {
                            Some(key.clone())
                        }
                        _ => None,
                    })
                });
                key.and_then(|key| staged.take().map(|(_, value, lease)| (key, value, lease)))
            };
            if let Some((key, value, lease)) = other {
                let other = Txn {
                    when: Vec::new(),
                    then: vec![Op::Put { key, value, lease }],
                };
                self.store.txn(other).await?;
            }
            self.store.txn(txn).await
        })
    }
}

/// A store whose watches from the head are opened only once `open` is set, so
/// that a command's watch begins after its read (which it runs beside) and misses
/// what changes in between. Counts the listings and the watches from a past
/// revision made while armed.
#[derive(Clone)]
struct LateWatch {
    store: MemoryCoordinator,
    open: tokio::sync::watch::Sender<bool>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
    replays: Arc<std::sync::atomic::AtomicUsize>,
}

impl Coordinator for LateWatch {
    pass_to_store!(grant, keep_alive, revoke, txn, wait_change);

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.store.list(prefix)
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            if from != 0 {
                self.replays.fetch_add(1, Ordering::SeqCst);
            } else {
                let mut open = self.open.subscribe();
                let _ = open.wait_for(|open| *open).await;
            }
            self.store.watch(prefix, from).await
        })
    }
}

/// A stop's watch is opened beside its read, from the store's head, so it may
/// begin after the read and miss a change made in between. Here the task changes
/// owner in that gap (w1's lease expires, w2 claims the task) and the watch sees
/// only what follows the command's write: w2's report, from an owner the status
/// read before does not know, and w2's release of the stopped task. The stop is
/// answered by them, not left waiting for a report of w1 that never comes. (A
/// pause of a running task writes first and reads after its watch is open: it has
/// no such gap.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stop_whose_watch_missed_an_owner_change_is_answered() {
    let store = MemoryCoordinator::new();
    let (open, _) = tokio::sync::watch::channel(true);
    let late = LateWatch {
        store: store.clone(),
        open,
        lists: Arc::default(),
        replays: Arc::default(),
    };
    let join = |id: &'static str| {
        Worker::builder(store.clone(), "late", id)
            .lease_keeping(LeaseKeeping::SharedRuntime)
            .ttl(Duration::from_secs(2))
            .stop_bound(Duration::from_millis(600))
            .resync(Duration::from_millis(200))
            .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
    };
    let w1 = join("w1").await.expect("join w1");
    let plain = Controller::new(store.clone(), "late").expect("a controller");
    plain
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let running = plain
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");
    assert_eq!(running.owner.as_str(), "w1");
    let w2 = join("w2").await.expect("join w2");

    late.open.send_replace(false);
    let read_before = late.lists.load(Ordering::SeqCst);
    let controller = Controller::new(late.clone(), "late").expect("a controller");
    let stop =
        tokio::spawn(async move { controller.stop_within("t", Duration::from_secs(20)).await });
    eventually(
        Duration::from_secs(1),
        "the command read the status",
        || (late.lists.load(Ordering::SeqCst) > read_before).then_some(()),
    )
    .await;
    let gap = Instant::now();
    store.expire_lease(w1.lease());
    eventually(Duration::from_millis(500), "w2 ran t", || {
        let running = w2
            .observer(&taskstage_cluster::TaskId::new("t").ok()?)?
            .stage()
            == Stage::Running;
        running.then_some(())
    })
    .await;
    late.open.send_replace(true);
    let stopped = stop
        .await
        .expect("the command's task")
        .expect("the stop was not answered by the new owner");
    assert_eq!(stopped.owner.as_str(), "w2");
    assert_eq!(stopped.stage, Stage::Stopped);
    assert!(
        gap.elapsed() < Duration::from_secs(1),
        "the gap outlasted the watch's deadline: the command may have watched from its read"
    );
    assert_eq!(
        late.replays.load(Ordering::SeqCst),
        0,
        "the command watched from a past revision: no gap was made"
    );
    drop(w1);
    w2.shutdown().await.expect("shutdown w2");
}

/// A worker's store whose reports of a Paused stage wait until `open` is set.
#[derive(Clone)]
struct HeldReport {
    store: MemoryCoordinator,
    open: tokio::sync::watch::Sender<bool>,
}

impl Coordinator for HeldReport {
    pass_to_store!(grant, keep_alive, revoke, list, watch, wait_change);

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let paused = txn.then.iter().any(|op| match op {
                Op::Put { key, value, .. } => {
                    key.ends_with("/observed") && value.starts_with(b"stage=Paused\n")
                }
                Op::Delete { .. } => false,
            });
            if paused {
                let mut open = self.open.subscribe();
                let _ = open.wait_for(|open| *open).await;
            }
            self.store.txn(txn).await
        })
    }
}

/// A pause of a running task is written before its read, and the read waits for
/// the command's watch to be open: a report the owner makes before the watch
/// opens is in the read, and one made after it comes by the watch. Here the
/// owner's report is held until the pause's write is long done, and the watch
/// opens only after the report; a read made before the watch would hold the
/// task still Running, and the watch, from the head, would never bring the
/// answer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_pause_reads_after_its_watch_is_open() {
    let store = MemoryCoordinator::new();
    let (open, _) = tokio::sync::watch::channel(true);
    let late = LateWatch {
        store: store.clone(),
        open,
        lists: Arc::default(),
        replays: Arc::default(),
    };
    let (report, _) = tokio::sync::watch::channel(true);
    let held = HeldReport {
        store: store.clone(),
        open: report,
    };
    let worker = Worker::builder(held.clone(), "late", "w1")
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join");
    let plain = Controller::new(store.clone(), "late").expect("a controller");
    plain
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    plain
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");

    late.open.send_replace(false);
    held.open.send_replace(false);
    let controller = Controller::new(late.clone(), "late").expect("a controller");
    let pause =
        tokio::spawn(async move { controller.pause_within("t", Duration::from_secs(5)).await });
    let id = taskstage_cluster::TaskId::new("t").expect("a task id");
    eventually(Duration::from_secs(2), "w1 paused t", || {
        let observer = worker.observer(&id)?;
        (observer.stage() == Stage::Paused).then_some(())
    })
    .await;
    // Let every task that is ready run (a read among them) before the report.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    held.open.send_replace(true);
    let until = Instant::now() + Duration::from_secs(2);
    // Bounded by `until`, 10 ms apart.
    loop {
        let status = plain.status("t").await.expect("status");
        if status.answers(status.desired_revision) && status.current_observed().is_some() {
            break;
        }
        assert!(Instant::now() < until, "w1 never reported the pause");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reported = Instant::now();
    late.open.send_replace(true);
    let paused = pause
        .await
        .expect("the command's task")
        .expect("the pause missed the answer made before its watch opened");
    assert_eq!(paused.stage, Stage::Paused);
    assert!(
        reported.elapsed() < Duration::from_secs(1),
        "the answer came only from a read after the deadline"
    );
    assert_eq!(
        late.replays.load(Ordering::SeqCst),
        0,
        "the command watched from a past revision"
    );
    worker.shutdown().await.expect("shutdown");
}

/// `set_desired` reads the desired stage, then writes only if it is unchanged: a write
/// by someone else in between makes it a `Conflict` that writes nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn set_desired_is_a_compare_and_set_on_the_desired_stage() {
    let store = MemoryCoordinator::new();
    let racing = Racing::new(&store);
    let controller = Controller::new(racing.clone(), "cas").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    racing.stage("desired", b"Paused", None);
    let result = controller.set_desired("t", DesiredStage::Stopped).await;
    assert!(
        matches!(&result, Err(ClusterError::Conflict { task, .. }) if task.as_str() == "t"),
        "a desired stage changed between the read and the write was overwritten: {result:?}"
    );
    assert!(racing.landed(), "the race was never staged");
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        status.desired,
        DesiredStage::Paused,
        "the other writer's stage was lost"
    );
    // Without a race, the same call is applied.
    let revision = controller
        .set_desired("t", DesiredStage::Running)
        .await
        .expect("an uncontended set");
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        (status.desired, status.desired_revision),
        (DesiredStage::Running, revision)
    );
}

/// A pause of a task desired Running is written first, compared with the stage
/// it replaces, without a read before it. A stop written by someone else just
/// before that write makes the compare fail: the pause reads, finds the task
/// stopped and is refused, naming it, and the stop stays. A resume that meets a
/// pause written just before it is written after a read and waits for its answer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_command_written_without_a_read_replaces_only_the_stage_it_expects() {
    let store = MemoryCoordinator::new();
    let racing = Racing::new(&store);
    let controller = Controller::new(racing.clone(), "replace").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    racing.stage("desired", b"Stopped", None);
    let result = controller.pause_within("t", Duration::from_secs(5)).await;
    assert!(racing.landed(), "the race was never staged");
    assert!(
        matches!(
            &result,
            Err(ClusterError::Stopped { command: "pause", task }) if task.as_str() == "t"
        ),
        "a pause written over a stop: {result:?}"
    );
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        status.desired,
        DesiredStage::Stopped,
        "the stop was overwritten by the pause"
    );

    controller
        .create("u", Vec::new(), DesiredStage::Paused)
        .await
        .expect("create");
    let worker = Worker::builder(store.clone(), "replace", "w1")
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join");
    racing.stage("desired", b"Running", None);
    let running = controller
        .resume_within("u", Duration::from_secs(10))
        .await
        .expect("a resume that met an equal write");
    assert!(racing.landed(), "the second race was never staged");
    assert_eq!(running.stage, Stage::Running);
    let status = controller.status("u").await.expect("status");
    assert_eq!(status.desired, DesiredStage::Running);
    worker.shutdown().await.expect("shutdown");
}

/// A worker never holds more tasks than its capacity: with capacity 2 and three tasks,
/// the third is left for a second worker.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_holds_no_more_tasks_than_its_capacity() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "cap").expect("a controller");
    for task in ["a", "b", "c"] {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    let join = |id: &'static str| {
        Worker::builder(store.clone(), "cap", id)
            // tokio's paused clock: only this runtime sees it.
            .lease_keeping(LeaseKeeping::SharedRuntime)
            .ttl(Duration::from_secs(2))
            .stop_bound(Duration::from_millis(600))
            .resync(Duration::from_millis(200))
            .capacity(2)
            .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
    };
    let w1 = join("w1").await.expect("join w1");
    // w1 claims two tasks; give it several resyncs to (wrongly) claim the third.
    eventually(Duration::from_secs(5), "w1 holding two tasks", || {
        (w1.tasks().len() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w1.tasks().len(), 2, "w1 holds {:?}", w1.tasks());
    let w2 = join("w2").await.expect("join w2");
    for task in ["a", "b", "c"] {
        let status = controller
            .resume_within(task, Duration::from_secs(10))
            .await
            .expect("every task running on one of the two workers");
        assert_eq!(status.stage, Stage::Running);
    }
    assert_eq!((w1.tasks().len(), w2.tasks().len()), (2, 1));
    let third = w2.tasks();
    assert!(third.iter().all(|t| !w1.tasks().contains(t)));
    w1.shutdown().await.expect("shutdown w1");
    w2.shutdown().await.expect("shutdown w2");
}

/// A run that counts itself alive (and the most alive at once) until its future goes;
/// a cancelled run takes 100 ms to wind down.
struct Counted {
    alive: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

struct Leaves(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Leaves {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Unit for Counted {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        // SeqCst: counters read by the test on the same runtime.
        let now = self.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let _leaves = Leaves(Arc::clone(&self.alive));
        ctx.cancelled().await;
        // Winds down for a while, so a worker that ended before its runs stopped
        // is seen with one alive.
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(RunExit::Cancelled)
    }
}

type Counters = (
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
);

async fn join_counted(
    store: &MemoryCoordinator,
    prefix: &str,
    id: &str,
    counters: &Counters,
) -> Worker {
    let (alive, most) = (Arc::clone(&counters.0), Arc::clone(&counters.1));
    Worker::builder(store.clone(), prefix, id)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Counted {
                alive: Arc::clone(&alive),
                most: Arc::clone(&most),
            }))
        })
        .await
        .expect("join on the in-memory store")
}

/// A keep-alive answered "expired" ends the worker at once: its runs are stopped
/// before the deadline it had, `closed` returns `LeaseLost`, and the store has
/// dropped the keys under the lease, so the task is free for another worker.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_whose_lease_is_gone_stops_its_runs_and_ends() {
    let store = MemoryCoordinator::new();
    let counters: Counters = Default::default();
    let mut worker = join_counted(&store, "lost", "w1", &counters).await;
    let controller = Controller::new(store.clone(), "lost").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");
    assert_eq!(counters.0.load(Ordering::SeqCst), 1);
    let deadline = worker.stop_deadline().expect("a lease deadline");

    store.expire_lease(worker.lease());
    let closed = tokio::time::timeout(Duration::from_secs(10), worker.closed())
        .await
        .expect("the worker did not end after its lease expired");
    assert!(
        matches!(&closed, Err(ClusterError::LeaseLost { worker }) if worker.as_str() == "w1"),
        "{closed:?}"
    );
    assert!(worker.is_finished());
    assert_eq!(
        counters.0.load(Ordering::SeqCst),
        0,
        "a run outlived the lease"
    );
    assert!(
        Instant::now() < deadline,
        "the runs were stopped by the deadline, not by the expiry"
    );
    let status = controller.status("t").await.expect("status");
    assert_eq!(status.owner, None, "the owner key outlived its lease");
    drop(worker);

    let w2 = join_counted(&store, "lost", "w2", &counters).await;
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w2");
    assert_eq!(running.owner.as_str(), "w2");
    assert_eq!(counters.1.load(Ordering::SeqCst), 1, "two runs at once");
    w2.shutdown().await.expect("shutdown");
}

/// A run that, once cancelled, holds its thread for 1.2 s (a blocking flush): an
/// abort cannot end it sooner, so its future lives on after the stop was issued.
struct BlocksWhenCancelled {
    alive: Arc<std::sync::atomic::AtomicUsize>,
}

impl Unit for BlocksWhenCancelled {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.alive.fetch_add(1, Ordering::SeqCst);
        let _leaves = Leaves(Arc::clone(&self.alive));
        ctx.cancelled().await;
        std::thread::sleep(Duration::from_millis(1200));
        Ok(RunExit::Cancelled)
    }
}

/// On a lost lease the worker's loop ends, and `closed` answers, only once its local
/// runs are gone, even a run that an abort cannot end at once. With a 3 s TTL the
/// keep-alive (every ~0.6 s) hears "expired" while the run still holds its thread,
/// well before the last instant the lease allowed (the overrun policy only logs, so
/// a slow machine cannot end the test's process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_ends_only_once_its_runs_are_gone() {
    let store = MemoryCoordinator::new();
    let alive = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let for_factory = Arc::clone(&alive);
    let mut worker = Worker::builder(store.clone(), "blocked", "w1")
        .ttl(Duration::from_secs(3))
        .on_overrun(taskstage_cluster::OverrunPolicy::LogOnly)
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(BlocksWhenCancelled {
                alive: Arc::clone(&for_factory),
            }))
        })
        .await
        .expect("join on the in-memory store");
    let controller = Controller::new(store.clone(), "blocked").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");
    assert_eq!(alive.load(Ordering::SeqCst), 1);

    store.expire_lease(worker.lease());
    let closed = tokio::time::timeout(Duration::from_secs(10), worker.closed())
        .await
        .expect("the worker did not end after its lease expired");
    assert!(
        matches!(&closed, Err(ClusterError::LeaseLost { .. })),
        "{closed:?}"
    );
    assert_eq!(
        alive.load(Ordering::SeqCst),
        0,
        "closed() answered while a run of the worker was still alive"
    );
}

/// A run that, once `stall` is set, spins on its thread without yielding until
/// `release` is set (or 60 s pass): with one thread in its runtime, nothing else of
/// that runtime runs meanwhile, the worker's reconcile loop included.
struct Spins {
    stall: Arc<std::sync::atomic::AtomicBool>,
    release: Arc<std::sync::atomic::AtomicBool>,
}

impl Unit for Spins {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        // Bounded by the run's cancellation.
        loop {
            tokio::select! {
                _ = ctx.cancelled() => return Ok(RunExit::Cancelled),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            if self.stall.load(Ordering::SeqCst) {
                let end = std::time::Instant::now() + Duration::from_secs(60);
                // Bounded by `release` or 60 s: a unit that holds its thread.
                while !self.release.load(Ordering::SeqCst) && std::time::Instant::now() < end {
                    std::hint::spin_loop();
                }
                self.stall.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// The stalled worker's own runtime, released and shut down however the test ends.
struct Stalled {
    runtime: Option<tokio::runtime::Runtime>,
    release: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.release.store(true, Ordering::SeqCst);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A worker whose loop stops turning (its unit holds the one thread of the
/// application's runtime, for good as far as the worker can tell) gives its lease
/// up once the loop has not turned for the stall bound: the keep-alives stop though
/// the lease thread is fine, and another worker runs the task once the store
/// expired the lease. When the loop turns again it finds the lease gone, and
/// `closed` answers `LeaseLost` once the run is stopped. (The overrun policy only
/// logs here, so that the test's process is not ended; under the default, the
/// process would have ended before the store could expire the lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_loop_stalls_gives_up_its_lease_and_its_task_runs_elsewhere() {
    let store = MemoryCoordinator::new();
    let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = Stalled {
        runtime: Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime of one thread"),
        ),
        release: Arc::clone(&release),
    };
    let ttl = Duration::from_secs(2);
    let bound = Duration::from_secs(2);
    let (for_stall, for_release) = (Arc::clone(&stall), Arc::clone(&release));
    let builder = Worker::builder(store.clone(), "stall", "w1")
        .ttl(ttl)
        .stall_bound(bound)
        .on_overrun(taskstage_cluster::OverrunPolicy::LogOnly);
    let runtime = held.runtime.as_ref().expect("the runtime");
    let mut w1 = runtime
        .spawn(builder.join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Spins {
                stall: Arc::clone(&for_stall),
                release: Arc::clone(&for_release),
            }))
        }))
        .await
        .expect("the join task")
        .expect("join on the in-memory store");
    let controller = Controller::new(store.clone(), "stall").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");
    assert_eq!(running.owner.as_str(), "w1");

    stall.store(true, Ordering::SeqCst);
    let stalled = std::time::Instant::now();
    let w2 = Worker::builder(store.clone(), "stall", "w2")
        .ttl(ttl)
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join w2");
    // The bound, a keep-alive period, the TTL, and room for a claim.
    let within = bound + ttl + Duration::from_secs(3);
    let elsewhere = loop {
        let status = controller.status("t").await.expect("status");
        if status.owner.as_ref().is_some_and(|w| w.as_str() == "w2") {
            break stalled.elapsed();
        }
        assert!(
            stalled.elapsed() < within,
            "the stalled worker still holds its task {within:?} after its loop stopped: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        elsewhere >= bound,
        "the task left the stalled worker after {elsewhere:?}, before the stall bound"
    );
    assert_eq!(
        w1.stop_deadline(),
        None,
        "the stalled worker still trusts its lease"
    );

    release.store(true, Ordering::SeqCst);
    let closed = runtime
        .spawn(async move {
            let closed = tokio::time::timeout(Duration::from_secs(10), w1.closed()).await;
            (closed, w1)
        })
        .await
        .expect("the close task");
    let (closed, w1) = closed;
    let closed = closed.expect("the worker did not end once its loop turned again");
    assert!(
        matches!(&closed, Err(ClusterError::LeaseLost { worker }) if worker.as_str() == "w1"),
        "{closed:?}"
    );
    drop(w1);
    w2.shutdown().await.expect("shutdown w2");
    drop(held);
}

/// A quiet loop is not a stalled one: with no change to learn of (keep-alives that
/// fail for a while move no deadline, the store is still, the resync is a minute
/// away) the loop still turns at least every quarter of the stall bound, so the
/// worker keeps its lease through the whole quiet spell and its task runs on.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_quiet_loop_is_not_taken_for_a_stalled_one() {
    let store = MemoryCoordinator::new();
    let worker = Worker::builder(store.clone(), "quiet", "w1")
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(4))
        .op_timeout(Duration::from_millis(100))
        .stall_bound(Duration::from_millis(500))
        .resync(Duration::from_secs(60))
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join on the in-memory store");
    let controller = Controller::new(store.clone(), "quiet").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(5))
        .await
        .expect("running on w1");
    // Well within the time a lease is trusted for (TTL·0.95 − 1 s), four stall
    // bounds with nothing to learn of.
    store.fail_keep_alives(worker.lease(), true);
    let before = worker.stop_deadline().expect("a lease deadline");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        worker.stop_deadline(),
        Some(before),
        "a quiet loop was taken for a stalled one: the lease was given up"
    );
    store.fail_keep_alives(worker.lease(), false);
    eventually(
        Duration::from_secs(2),
        "a keep-alive answered again",
        || worker.stop_deadline().filter(|at| *at > before),
    )
    .await;
    let status = controller.status("t").await.expect("status");
    assert_eq!(status.owner.as_ref().map(|w| w.as_str()), Some("w1"));
    worker.shutdown().await.expect("shutdown");
}

/// Stopped is final: a later desired stage other than Stopped is refused and changes
/// nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stopped_task_stays_stopped() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "final").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let stopped = controller
        .set_desired("t", DesiredStage::Stopped)
        .await
        .expect("stop");
    for desired in [DesiredStage::Running, DesiredStage::Paused] {
        let refused = controller.set_desired("t", desired).await;
        assert!(
            matches!(&refused, Err(ClusterError::Stopped { task, .. }) if task.as_str() == "t"),
            "{desired}: {refused:?}"
        );
    }
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        (status.desired, status.desired_revision),
        (DesiredStage::Stopped, stopped)
    );
}

/// A claim creates the owner key only if it is absent: a worker that lists the task
/// unowned and claims it just after another worker did leaves the other's key alone.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_claim_never_overwrites_another_workers_owner_key() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "race").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    // The other worker's claim, staged to land just before w1's.
    let other = store.grant(Duration::from_secs(60)).await.expect("grant");
    let racing = Racing::new(&store);
    racing.stage(
        "owner",
        format!("w0@{:x}", other.id).as_bytes(),
        Some(other.id),
    );
    let counters: Counters = Default::default();
    let (alive, most) = (Arc::clone(&counters.0), Arc::clone(&counters.1));
    let w1 = Worker::builder(racing.clone(), "race", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Counted {
                alive: Arc::clone(&alive),
                most: Arc::clone(&most),
            }))
        })
        .await
        .expect("join");
    eventually(Duration::from_secs(5), "w1 claiming the task", || {
        racing.landed().then_some(())
    })
    .await;
    // A few resyncs for w1 to act on a claim it wrongly thinks it won.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        status.owner.as_ref().map(|w| w.as_str()),
        Some("w0"),
        "w1's claim overwrote w0's owner key"
    );
    assert_eq!(status.owner_lease, Some(other.id));
    assert!(w1.tasks().is_empty(), "w1 holds {:?}", w1.tasks());
    assert_eq!(
        counters.1.load(Ordering::SeqCst),
        0,
        "w1 ran a task it does not own"
    );
    w1.shutdown().await.expect("shutdown w1");
}

/// A clean shutdown stops the runs, withdraws the owner keys and the reports, and
/// revokes the lease: another worker takes the task over at once, not a TTL later.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_clean_shutdown_withdraws_its_keys_and_revokes_its_lease() {
    let store = MemoryCoordinator::new();
    let counters: Counters = Default::default();
    let w1 = join_counted(&store, "clean", "w1", &counters).await;
    let controller = Controller::new(store.clone(), "clean").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w1");
    let lease = w1.lease();
    let shut = Instant::now();
    w1.shutdown().await.expect("a clean shutdown");
    assert_eq!(
        counters.0.load(Ordering::SeqCst),
        0,
        "a run outlived shutdown"
    );
    assert!(
        !store.leases().contains(&lease),
        "the lease was not revoked"
    );
    let status = controller.status("t").await.expect("status");
    assert_eq!(status.owner, None, "the owner key was not withdrawn");
    assert_eq!(status.observed, None, "the report was not withdrawn");

    let w2 = join_counted(&store, "clean", "w2", &counters).await;
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w2");
    assert_eq!(running.owner.as_str(), "w2");
    assert!(
        shut.elapsed() < Duration::from_secs(2),
        "the takeover waited {:?}, as long as the TTL",
        shut.elapsed()
    );
    w2.shutdown().await.expect("shutdown w2");
}

/// A controller's answer comes from the task's current owner only: a report counts
/// when its writer and fence token are the owner key's; with no owner, only a
/// terminal report (a released task's) still stands.
#[test]
fn only_the_current_owners_report_answers() {
    use taskstage_cluster::{ObservedOutcome, ObservedStatus, TaskStatus, WorkerId};
    let w1 = WorkerId::new("w1").expect("an id");
    let report = |stage: Stage, owner_revision: i64| ObservedStatus {
        stage,
        generation: 1,
        outcome: ObservedOutcome::None,
        desired_revision: 7,
        owner: w1.clone(),
        owner_revision,
    };
    let status = |owner: Option<(&WorkerId, i64)>, observed: ObservedStatus| TaskStatus {
        task: taskstage_cluster::TaskId::new("t").expect("an id"),
        desired: DesiredStage::Paused,
        desired_revision: 7,
        owner: owner.map(|(w, _)| w.clone()),
        owner_revision: owner.map(|(_, r)| r),
        owner_lease: owner.map(|_| 1),
        observed: Some(observed),
        revision: 9,
    };
    let current = status(Some((&w1, 5)), report(Stage::Paused, 5));
    assert!(current.current_observed().is_some());
    assert!(current.answers(7));
    // The same worker id, an older token: an earlier incarnation's report.
    let stale = status(Some((&w1, 5)), report(Stage::Paused, 4));
    assert_eq!(stale.current_observed(), None);
    assert!(!stale.answers(7));
    let other = WorkerId::new("w2").expect("an id");
    assert_eq!(
        status(Some((&other, 5)), report(Stage::Paused, 5)).current_observed(),
        None
    );
    // No owner: a Paused report of a vanished owner does not stand; Stopped does.
    assert_eq!(
        status(None, report(Stage::Paused, 5)).current_observed(),
        None
    );
    assert!(status(None, report(Stage::Stopped, 5))
        .current_observed()
        .is_some());
}

/// Creating a task that exists is `TaskExists` and writes nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn creating_an_existing_task_is_refused_and_writes_nothing() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "exists").expect("a controller");
    let created = controller
        .create("t", b"first".to_vec(), DesiredStage::Running)
        .await
        .expect("create");
    let again = controller
        .create("t", b"second".to_vec(), DesiredStage::Paused)
        .await;
    assert!(
        matches!(&again, Err(ClusterError::TaskExists { task }) if task.as_str() == "t"),
        "{again:?}"
    );
    let status = controller.status("t").await.expect("status");
    assert_eq!(
        (status.desired, status.desired_revision),
        (DesiredStage::Running, created)
    );
    let spec = store
        .list("exists/tasks/t/spec".to_owned())
        .await
        .expect("list");
    assert_eq!(
        spec.get("exists/tasks/t/spec")
            .map(|kv| kv.value.as_slice()),
        Some(&b"first"[..])
    );
}

/// The guard stops every run at the lease deadline even while the reconcile loop
/// is held up: here a factory blocks the loop's thread past the deadline (the loop
/// never waits for the store, but it does run the user's factory), and the run of
/// another task must still be gone within the stop bound after the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_stops_runs_at_the_deadline_while_the_loop_is_held_up() {
    let store = MemoryCoordinator::new();
    let counters: Counters = Default::default();
    let (alive, most) = (Arc::clone(&counters.0), Arc::clone(&counters.1));
    let stop_bound = Duration::from_millis(600);
    let worker = Worker::builder(store.clone(), "held", "w1")
        .ttl(Duration::from_secs(2))
        .stop_bound(stop_bound)
        .join(move |spec| {
            if spec.task.as_str() == "slow" {
                // User code that blocks its thread well past the lease deadline.
                std::thread::sleep(Duration::from_secs(4));
            }
            Ok(Task::builder(spec.task.as_str()).unit(Counted {
                alive: Arc::clone(&alive),
                most: Arc::clone(&most),
            }))
        })
        .await
        .expect("join on the in-memory store");
    let controller = Controller::new(store.clone(), "held").expect("a controller");
    controller
        .create("a", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("a", Duration::from_secs(5))
        .await
        .expect("running on w1");
    assert_eq!(counters.0.load(Ordering::SeqCst), 1);
    // No keep-alive is answered from now on: the deadline stays where it is.
    store.fail_keep_alives(worker.lease(), true);
    let deadline = worker.stop_deadline().expect("a lease deadline");
    controller
        .create("slow", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let limit = deadline + stop_bound + Duration::from_millis(200);
    // Bounded by `limit`, polling every 10 ms.
    while counters.0.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < limit,
            "a run outlived the lease deadline by more than the stop bound while the loop was held up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(worker);
}

/// What the probed units of [`join_probed`] saw: every run's start (worker and
/// fence token), the runs alive now and the most alive at once.
#[derive(Clone, Default)]
struct Probes {
    starts: Arc<std::sync::Mutex<Vec<(String, i64)>>>,
    alive: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Probes {
    fn starts(&self) -> Vec<(String, i64)> {
        self.starts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many runs `worker` started under the token of revision `token`.
    fn started(&self, worker: &str, token: Option<i64>) -> usize {
        self.starts()
            .iter()
            .filter(|(w, t)| w == worker && token.is_none_or(|token| *t == token))
            .count()
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// A run that records its start and counts itself alive until its future goes; a
/// cancelled run takes 250 ms to wind down (within the 300 ms a stop grants it).
struct Lingering {
    worker: String,
    token: i64,
    probes: Probes,
}

impl Unit for Lingering {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let probes = &self.probes;
        probes
            .starts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((self.worker.clone(), self.token));
        // SeqCst: counters read by the test on the same runtime.
        let now = probes.alive.fetch_add(1, Ordering::SeqCst) + 1;
        probes.most.fetch_max(now, Ordering::SeqCst);
        let _leaves = Leaves(Arc::clone(&probes.alive));
        ctx.cancelled().await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        Ok(RunExit::Cancelled)
    }
}

/// Joins worker `id` on `coordinator`, running [`Lingering`] units that report to
/// `probes`; with `flaky`, its factory fails the first time it is asked to build.
async fn join_probed(
    coordinator: impl Coordinator,
    prefix: &str,
    id: &str,
    probes: &Probes,
    flaky: bool,
) -> Worker {
    let (worker, probes) = (id.to_owned(), probes.clone());
    let failed_once = std::sync::atomic::AtomicBool::new(!flaky);
    Worker::builder(coordinator, prefix, id)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .op_timeout(Duration::from_secs(1))
        .join(move |spec| {
            if !failed_once.swap(true, Ordering::SeqCst) {
                return Err("the task's resources are not ready yet".into());
            }
            Ok(Task::builder(spec.task.as_str()).unit(Lingering {
                worker: worker.clone(),
                token: spec.fencer.token().revision,
                probes: probes.clone(),
            }))
        })
        .await
        .expect("join on the in-memory store")
}

/// What a [`LostAnswer`] does with the release whose answer it loses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Landing {
    /// Kept on its way: it reaches the store when the test calls
    /// [`LostAnswer::land`].
    Later,
    /// Applied at once; from then on the worker's watches deliver nothing (its cache
    /// still says the key is its own) until [`LostAnswer::catch_up`].
    NowWatchesLag,
}

/// One worker's door to the store that, once armed, loses the answer to the
/// worker's next release of an owner key (a fenced delete): the call never answers,
/// so the worker's own deadline turns it into `Unreachable`. It also counts the
/// worker's confirmations (fenced transactions that write nothing) the store
/// refused.
#[derive(Clone)]
struct LostAnswer {
    store: MemoryCoordinator,
    landing: Landing,
    armed: Arc<std::sync::atomic::AtomicBool>,
    /// The lost release, once sent: `Some(None)` when it was applied at once.
    lost: Arc<std::sync::Mutex<Option<Option<Txn>>>>,
    /// While true, what the worker's watches deliver waits.
    lagging: Arc<tokio::sync::watch::Sender<bool>>,
    refused_confirms: Arc<std::sync::atomic::AtomicUsize>,
}

impl LostAnswer {
    fn new(store: &MemoryCoordinator, landing: Landing) -> LostAnswer {
        LostAnswer {
            store: store.clone(),
            landing,
            armed: Arc::default(),
            lost: Arc::default(),
            lagging: Arc::new(tokio::sync::watch::channel(false).0),
            refused_confirms: Arc::default(),
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Option<Txn>>> {
        self.lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the release whose answer is lost was sent.
    fn sent(&self) -> bool {
        self.lock().is_some()
    }

    /// Applies the kept release to the store now; whether the store accepted it.
    async fn land(&self) -> bool {
        let kept = self.lock().as_mut().and_then(Option::take);
        let txn = kept.expect("no release kept on its way");
        self.store
            .txn(txn)
            .await
            .expect("the store answers")
            .succeeded
    }

    /// Lets the worker's watches deliver again.
    fn catch_up(&self) {
        self.lagging.send_replace(false);
    }

    fn refused_confirms(&self) -> usize {
        self.refused_confirms.load(Ordering::SeqCst)
    }
}

impl Coordinator for LostAnswer {
    pass_to_store!(grant, keep_alive, revoke, list, wait_change);

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let fenced = !txn.when.is_empty();
            // A release, alone or with the report of a hand-over's rest.
            let releases = fenced
                && txn
                    .then
                    .iter()
                    .any(|op| matches!(op, Op::Delete { key } if key.ends_with("/owner")));
            if releases && self.armed.swap(false, Ordering::SeqCst) {
                let kept = match self.landing {
                    Landing::Later => Some(txn),
                    Landing::NowWatchesLag => {
                        self.lagging.send_replace(true);
                        let applied = self.store.txn(txn).await;
                        assert!(
                            applied.is_ok_and(|r| r.succeeded),
                            "the release to lose was refused"
                        );
                        None
                    }
                };
                *self.lock() = Some(kept);
                // No answer: the worker's deadline ends the call.
                return std::future::pending().await;
            }
            let confirms = fenced && txn.then.is_empty();
            let result = self.store.txn(txn).await;
            if confirms && result.as_ref().is_ok_and(|r| !r.succeeded) {
                self.refused_confirms.fetch_add(1, Ordering::SeqCst);
            }
            result
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            let inner = self.store.watch(prefix, from).await?;
            Ok(cluster_support::held_back(inner, self.lagging.subscribe()))
        })
    }
}

/// Once a hand-over's release was sent, the task is handed over whatever its answer:
/// a release whose answer was lost may still land. w2 runs the task; w1 joins (the
/// first member, so the task is its share) and w2 hands it over: it pauses it and
/// sends the release with its Paused report, whose answer never comes and which
/// stays on its way. Before w2's deadline ends the call, w1 leaves (the task is w2's share
/// again: the hand-over is given up) and the desired stage is written again (w2's
/// Paused report no longer answers it). w2 must release all the same, not resume
/// the task under the key it sent away: when that release lands, the key is gone,
/// w0 takes the task, and w2's run, resumed, would still be alive beside w0's.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hand_over_whose_release_was_sent_is_carried_through_when_given_up() {
    let store = MemoryCoordinator::new();
    let probes = Probes::default();
    let controller = Controller::new(store.clone(), "late").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let door = LostAnswer::new(&store, Landing::Later);
    let w2 = join_probed(door.clone(), "late", "w2", &probes, false).await;
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w2");
    let task = taskstage_cluster::TaskId::new("t").expect("an id");
    let token = w2.token(&task).expect("w2 holds t").revision;
    door.arm();
    let w1 = join_probed(store.clone(), "late", "w1", &probes, false).await;
    eventually(Duration::from_secs(5), "w2 releasing t to w1", || {
        door.sent().then_some(())
    })
    .await;
    // Within the release's deadline (1 s): the hand-over is given up, and the
    // desired stage gets a new revision.
    w1.shutdown().await.expect("shutdown w1");
    controller
        .set_desired("t", DesiredStage::Running)
        .await
        .expect("the desired stage written again");
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("t running again on w2");
    assert_eq!(running.owner.as_str(), "w2");
    let landed = door.land().await;
    let w0 = join_probed(store.clone(), "late", "w0", &probes, false).await;
    eventually(Duration::from_secs(10), "w0 running t", || {
        (probes.started("w0", None) > 0).then_some(())
    })
    .await;
    assert!(
        probes.most() <= 1,
        "two runs of t alive at once: w2's lost release of key {token} landed \
         (accepted: {landed}) after w2 ran t again; runs started: {:?}",
        probes.starts()
    );
    assert_eq!(
        probes.started("w2", Some(token)),
        1,
        "w2 ran t again under the key {token} whose release it had sent: {:?}",
        probes.starts()
    );
    w0.shutdown().await.expect("shutdown w0");
    w2.shutdown().await.expect("shutdown w2");
}

/// A key the cache says is the worker's is confirmed by the store before it is
/// adopted, and a key the store refuses is never adopted. w1 claims the task, but
/// its factory fails (for now), so it releases the key; the store applies the
/// release, w1 hears no answer, and its watches lag from then on: its cache still
/// says the key is its own, and it holds no slot for the task. w0 joins, takes the
/// task and runs it. When w1 decides about the task again it must confirm the key
/// first; the store refuses, and w1 must neither build nor run the task, which w0
/// runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_key_the_store_refuses_to_confirm_is_never_adopted() {
    let store = MemoryCoordinator::new();
    let probes = Probes::default();
    let controller = Controller::new(store.clone(), "confirm").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let door = LostAnswer::new(&store, Landing::NowWatchesLag);
    door.arm();
    let w1 = join_probed(door.clone(), "confirm", "w1", &probes, true).await;
    eventually(
        Duration::from_secs(5),
        "w1 releasing t after its factory failed",
        || door.sent().then_some(()),
    )
    .await;
    // Within the release's deadline (1 s): w0, the first member, takes the task.
    let w0 = join_probed(store.clone(), "confirm", "w0", &probes, false).await;
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("t running on w0");
    assert_eq!(running.owner.as_str(), "w0");
    eventually(Duration::from_secs(5), "w1 confirming the key", || {
        (door.refused_confirms() > 0).then_some(())
    })
    .await;
    // Several resyncs (200 ms) for w1 to act on a key it wrongly adopted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        probes.most() <= 1 && probes.started("w1", None) == 0,
        "w1 adopted the key the store refused and ran t beside w0 (most alive at once: \
         {}); runs started: {:?}",
        probes.most(),
        probes.starts()
    );
    assert!(w1.tasks().is_empty(), "w1 holds {:?}", w1.tasks());
    door.catch_up();
    w0.shutdown().await.expect("shutdown w0");
    w1.shutdown().await.expect("shutdown w1");
}

/// A claimed task is decided about again as soon as it is built: with a TTL of 20 s
/// and a resync of a minute (so that neither a keep-alive's wake-up nor a resync
/// comes soon), a task created Running runs within 50 ms of its creation. Every
/// answer to a write comes 10 ms late, so the watch shows the claim while it is
/// still in flight (as etcd's often does): the claim's answer is then the last
/// thing that names the task before it is built.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_built_task_is_decided_at_once_not_at_the_next_wake_up() {
    let store = MemoryCoordinator::new();
    let slow = SlowAnswers {
        store: store.clone(),
        delay: Duration::ZERO,
        txn_delay: Duration::from_millis(10),
        list_delay: Duration::ZERO,
    };
    let worker = Worker::builder(slow, "built", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(20))
        .resync(Duration::from_secs(60))
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join on the in-memory store");
    let controller = Controller::new(store.clone(), "built").expect("a controller");
    let created = Instant::now();
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(30))
        .await
        .expect("the task runs");
    let took = created.elapsed();
    assert!(
        took <= Duration::from_millis(50),
        "create → Running took {took:?}: the built task waited for an unrelated wake-up"
    );
    worker.shutdown().await.expect("shutdown");
}

/// A coordinator that forwards to the in-memory store until, once armed, a worker
/// sends a release (a write that deletes an owner key): that write is kept, not
/// applied, and answered as unreachable, as a write whose answer was lost is; from
/// then on, until the test says, every call but a watch fails as unreachable (the
/// watches it opened go on).
#[derive(Clone)]
struct LoseTheRelease {
    store: MemoryCoordinator,
    cut: Arc<std::sync::atomic::AtomicBool>,
    armed: Arc<std::sync::atomic::AtomicBool>,
    kept: Arc<std::sync::Mutex<Option<Txn>>>,
}

impl LoseTheRelease {
    fn check(&self, op: &'static str) -> Result<(), ClusterError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(ClusterError::Unreachable {
                op,
                detail: "cut off by the test".into(),
            });
        }
        Ok(())
    }
}

impl Coordinator for LoseTheRelease {
    pass_to_store!(grant, watch, wait_change);

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            self.check("keep-alive")?;
            self.store.keep_alive(lease).await
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.check("revoke")?;
            self.store.revoke(lease).await
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            self.check("list")?;
            self.store.list(prefix).await
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            self.check("txn")?;
            let release = txn
                .then
                .iter()
                .any(|op| matches!(op, Op::Delete { key } if key.ends_with("/owner")));
            if release && self.armed.swap(false, Ordering::SeqCst) {
                self.cut.store(true, Ordering::SeqCst);
                *self.kept.lock().expect("the kept release") = Some(txn);
                return Err(ClusterError::Unreachable {
                    op: "txn",
                    detail: "the answer was lost".into(),
                });
            }
            self.store.txn(txn).await
        })
    }
}

/// What a worker sent about a task under its token outlives a rebuild under the
/// same token. w2 hands t over to w1: it pauses t and sends the release (with the
/// Paused report of its rest), whose answer is lost and which has not landed; then
/// w2 loses the store (its keep-alives and writes fail) until just past its lease
/// deadline, so its guard stops t and the loop drops it, but the lease is still
/// alive in the store when w2 gets the store back. The key is still w2's, so w2
/// meets t again under the same token: the release it sent may still land, so it
/// must carry the hand-over through, never run t again under that token (decide,
/// invariant 6). The lost release then lands late and changes nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn what_was_sent_under_a_token_outlives_a_rebuild_under_the_same_token() {
    let store = MemoryCoordinator::new();
    let probes = Probes::default();
    let controller = Controller::new(store.clone(), "rebuilt").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let door = LoseTheRelease {
        store: store.clone(),
        cut: Arc::default(),
        armed: Arc::default(),
        kept: Arc::default(),
    };
    let w2 = join_probed(door.clone(), "rebuilt", "w2", &probes, false).await;
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running on w2");
    let task = taskstage_cluster::TaskId::new("t").expect("an id");
    let token = w2.token(&task).expect("w2 holds t").revision;
    door.armed.store(true, Ordering::SeqCst);
    let w1 = join_probed(store.clone(), "rebuilt", "w1", &probes, false).await;
    eventually(
        Duration::from_secs(5),
        "w2's release of t for the hand-over, its answer lost",
        || door.cut.load(Ordering::SeqCst).then_some(()),
    )
    .await;
    let deadline = w2.stop_deadline().expect("w2's lease deadline");
    // Past the deadline (the guard stops t, the loop drops it), well before the
    // store may expire the lease (a stop bound and ρ·TTL later).
    tokio::time::sleep_until(deadline + Duration::from_millis(200)).await;
    eventually(
        Duration::from_secs(1),
        "w2 dropping t at its deadline",
        || w2.observer(&task).is_none().then_some(()),
    )
    .await;
    door.cut.store(false, Ordering::SeqCst);
    eventually(Duration::from_secs(10), "w1 running t", || {
        (probes.started("w1", None) > 0).then_some(())
    })
    .await;
    assert_eq!(
        probes.started("w2", Some(token)),
        1,
        "w2 ran t again under the key {token} whose release it had sent: {:?}",
        probes.starts()
    );
    let late = door.kept.lock().expect("the kept release").take();
    let late = late.expect("the release whose answer was lost");
    let landed = store
        .txn(late)
        .await
        .expect("the late release reaches the store");
    assert!(
        !landed.succeeded,
        "the late release of w2's old key removed w1's claim"
    );
    assert!(probes.most() <= 1, "two runs of t alive at once");
    w1.shutdown().await.expect("shutdown w1");
    w2.shutdown().await.expect("shutdown w2");
}

/// A listing that does not fit one call's deadline is tried again with a longer
/// one, not for ever with the same: with every listing answered 2.5 s late (a big
/// prefix on a busy machine) and a call deadline of 1 s, the worker still lists,
/// claims and runs a task.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_listing_slower_than_the_call_deadline_still_gets_through() {
    let store = MemoryCoordinator::new();
    let slow = SlowAnswers {
        store: store.clone(),
        delay: Duration::ZERO,
        txn_delay: Duration::ZERO,
        list_delay: Duration::from_millis(2_500),
    };
    let controller = Controller::new(store.clone(), "slowlist").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let worker = Worker::builder(slow, "slowlist", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .op_timeout(Duration::from_secs(1))
        .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
        .await
        .expect("join on the in-memory store");
    controller
        .resume_within("t", Duration::from_secs(60))
        .await
        .expect("the worker never listed the task: every listing missed its deadline");
    worker.shutdown().await.expect("shutdown");
}

/// What the runs of every task did, across workers: how many are alive per task
/// (and the most ever at once), and every start with its worker and token.
#[derive(Clone, Default)]
struct Runs(Arc<std::sync::Mutex<RunsState>>);

#[derive(Default)]
struct RunsState {
    alive: std::collections::BTreeMap<String, Vec<String>>,
    most: usize,
    overlaps: Vec<String>,
    starts: Vec<(String, String, i64)>,
    /// Runs cancelled and still winding down, and the most at once.
    winding: usize,
    most_winding: usize,
}

/// Counts a cancelled run as winding down until it is dropped.
struct Winding(Runs);

impl Winding {
    fn new(runs: &Runs) -> Winding {
        let mut state = runs.state();
        state.winding += 1;
        state.most_winding = state.most_winding.max(state.winding);
        drop(state);
        Winding(runs.clone())
    }
}

impl Drop for Winding {
    fn drop(&mut self) {
        self.0.state().winding -= 1;
    }
}

impl Runs {
    fn state(&self) -> std::sync::MutexGuard<'_, RunsState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The tasks with a live run, and where.
    fn live(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let state = self.state();
        state
            .alive
            .iter()
            .filter(|(_, on)| !on.is_empty())
            .map(|(task, on)| (task.clone(), on.clone()))
            .collect()
    }

    /// Asserts that no run on `worker` is alive (its future not yet dropped).
    fn assert_none_alive_on(&self, worker: &str, when: &str) {
        let live = self.live();
        let on: Vec<&String> = live
            .iter()
            .filter(|(_, on)| on.iter().any(|w| w == worker))
            .map(|(task, _)| task)
            .collect();
        assert!(
            on.is_empty(),
            "{when}: runs of {on:?} still alive on {worker}"
        );
    }

    /// The highest token each task's runs were handed so far.
    /// Asserts that no two runs of a task were ever alive at once, and that every
    /// run started since the `since`-th start had a token above the highest one
    /// `before` (a restore must not hand out lower tokens).
    fn assert_one_live_and_tokens_above(
        &self,
        since: usize,
        before: &std::collections::BTreeMap<String, i64>,
    ) {
        let state = self.state();
        assert_eq!(
            state.most, 1,
            "two live runs of one task: {:?}",
            state.overlaps
        );
        for (task, worker, token) in &state.starts[since..] {
            assert!(
                *token > before[task],
                "{worker} ran {task} under token {token}, below {} handed out before the restore",
                before[task]
            );
        }
    }

    fn highest_tokens(&self) -> std::collections::BTreeMap<String, i64> {
        let mut highest = std::collections::BTreeMap::new();
        for (task, _, token) in &self.state().starts {
            let entry = highest.entry(task.clone()).or_insert(*token);
            *entry = (*entry).max(*token);
        }
        highest
    }
}

/// A run that records itself in [`Runs`] while its future lives; a cancelled run
/// takes 250 ms to wind down.
struct Tracked {
    task: String,
    worker: String,
    token: i64,
    runs: Runs,
}

struct Untrack(Runs, String, String);

impl Drop for Untrack {
    fn drop(&mut self) {
        let mut state = self.0.state();
        if let Some(on) = state.alive.get_mut(&self.1) {
            if let Some(at) = on.iter().position(|w| *w == self.2) {
                on.remove(at);
            }
        }
    }
}

impl Unit for Tracked {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        {
            let mut state = self.runs.state();
            state
                .starts
                .push((self.task.clone(), self.worker.clone(), self.token));
            let on = state.alive.entry(self.task.clone()).or_default();
            on.push(self.worker.clone());
            let now = on.len();
            if now > 1 {
                let line = format!("{}: {:?}", self.task, on);
                state.overlaps.push(line);
            }
            state.most = state.most.max(now);
        }
        let _untrack = Untrack(self.runs.clone(), self.task.clone(), self.worker.clone());
        ctx.cancelled().await;
        let _winding = Winding::new(&self.runs);
        tokio::time::sleep(Duration::from_millis(250)).await;
        Ok(RunExit::Cancelled)
    }
}

const RESTORE_TTL: Duration = Duration::from_secs(2);

async fn join_tracked(store: &MemoryCoordinator, id: &str, runs: &Runs) -> Worker {
    join_tracked_holding(store, id, runs, 16).await
}

async fn join_tracked_holding(
    store: &MemoryCoordinator,
    id: &str,
    runs: &Runs,
    capacity: usize,
) -> Worker {
    join_tracked_on(store.clone(), id, runs, capacity).await
}

/// [`join_tracked`] through a door of the test's own to the store.
async fn join_tracked_on(
    store: impl Coordinator,
    id: &str,
    runs: &Runs,
    capacity: usize,
) -> Worker {
    let (worker, runs) = (id.to_owned(), runs.clone());
    Worker::builder(store, "restore", id)
        .capacity(capacity)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(RESTORE_TTL)
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .op_timeout(Duration::from_secs(1))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Tracked {
                task: spec.task.as_str().to_owned(),
                worker: worker.clone(),
                token: spec.fencer.token().revision,
                runs: runs.clone(),
            }))
        })
        .await
        .expect("join on the in-memory store")
}

/// The store restored from a backup taken before a pause, a resume and a takeover
/// (`bump` 0: its revision goes back, as etcd 3.4's restore does; `bump` > 0: it
/// moves forward and the history is marked compacted). What the store says after
/// the restore is the truth from then on: a worker that cached the world after the
/// backup must not go on deciding from it.
async fn restore_from_a_backup(bump: i64, other_writes: usize) {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let w1 = join_tracked(&store, "w1", &runs).await;
    let w2 = join_tracked(&store, "w2", &runs).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    let tasks: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    // t5 is Paused in the backup, Running after it.
    controller
        .pause_within("t5", Duration::from_secs(10))
        .await
        .expect("pause t5");
    eventually(Duration::from_secs(10), "every other task runs", || {
        (runs.live().len() == 5).then_some(())
    })
    .await;
    let snapshot = store.snapshot();

    // After the backup: t5 resumed, t0 paused and resumed, w1 gone and its tasks
    // taken over by w2.
    controller
        .resume_within("t5", Duration::from_secs(10))
        .await
        .expect("resume t5");
    controller
        .pause_within("t0", Duration::from_secs(10))
        .await
        .expect("pause t0");
    controller
        .resume_within("t0", Duration::from_secs(10))
        .await
        .expect("resume t0");
    w1.crash().await;
    eventually(Duration::from_secs(10), "w2 runs every task", || {
        let live = runs.live();
        (live.len() == 6 && live.values().all(|on| on == &["w2".to_owned()])).then_some(())
    })
    .await;
    let before = runs.highest_tokens();
    let started_before = runs.state().starts.len();

    store.restore(&snapshot, bump);
    let restored = Instant::now();
    // Other writers on the same store move its revision on, below what w2 saw.
    for i in 0..other_writes {
        let put = Txn {
            when: vec![],
            then: vec![Op::Put {
                key: format!("elsewhere/{i}"),
                value: b"x".to_vec(),
                lease: None,
            }],
        };
        store.txn(put).await.expect("another writer's put");
    }
    // A worker that starts after the restore, knowing nothing of before.
    let w3 = join_tracked(&store, "w3", &runs).await;
    // w2 notices (its revision going back, or with a bump its cache's keys going
    // back), stops its runs and ends, naming why; the application joins again.
    let mut w2 = w2;
    let ended = tokio::time::timeout(RESTORE_TTL * 5, w2.closed())
        .await
        .expect("w2 ends once it sees the store's history replaced");
    assert!(
        matches!(ended, Err(ClusterError::HistoryReplaced { .. })),
        "w2 ended with {ended:?}"
    );
    runs.assert_none_alive_on("w2", "after w2's loop ended on the replaced history");
    drop(w2);
    let w2 = join_tracked(&store, "w2", &runs).await;

    // The restored desired stages are the truth: t5 is Paused, the rest run.
    let bound = RESTORE_TTL + Duration::from_secs(10);
    eventually(bound, "t0..t4 run again and t5 is paused", || {
        let live = runs.live();
        let running: Vec<&String> = live.keys().collect();
        (running == tasks[..5].iter().collect::<Vec<_>>()).then_some(())
    })
    .await;
    // Every report is its current owner's, says what is true, and stays so.
    let end = restored + bound;
    // Bounded by `end`.
    loop {
        let mut wrong = Vec::new();
        for task in &tasks {
            let status = controller.status(task).await.expect("status");
            let observed = status.current_observed().map(|o| o.stage);
            // A task built while its desired stage is Paused is at rest in New.
            let at_rest = matches!(observed, Some(Stage::New | Stage::Paused));
            let right = if task == "t5" {
                at_rest
            } else {
                observed == Some(Stage::Running)
            };
            let live = runs.live().contains_key(task);
            if !right || live != (task != "t5") {
                wrong.push(format!("{task}: reported {observed:?}, live run: {live}"));
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "not settled {bound:?} after the restore: {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        restored.elapsed() <= bound,
        "converged {:?} after the restore",
        restored.elapsed()
    );
    runs.assert_one_live_and_tokens_above(started_before, &before);
    w2.shutdown().await.expect("w2 shuts down");
    w3.shutdown().await.expect("w3 shuts down");
}

/// A controller command that meets a store whose history was replaced (its revision
/// went back below what the controller had seen) is tried again within its
/// deadline, as one that meets an unreachable store is: the pause is written on the
/// new history and answered by the worker there.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_command_that_meets_a_replaced_history_is_tried_again_within_its_deadline() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let snapshot = store.snapshot();
    // After the backup the store moves far on (another writer), and the controller
    // sees its revision there.
    for i in 0..50 {
        let put = Txn {
            when: vec![],
            then: vec![Op::Put {
                key: format!("elsewhere/{i}"),
                value: b"x".to_vec(),
                lease: None,
            }],
        };
        store.txn(put).await.expect("another writer's put");
    }
    let seen = controller.list().await.expect("a listing");
    assert_eq!(seen.len(), 1);
    store.restore(&snapshot, 0);
    // A worker of the new history runs t (its joining writes stay far below what
    // the controller saw).
    let w1 = join_tracked(&store, "w1", &runs).await;
    eventually(Duration::from_secs(10), "t runs on w1", || {
        (runs.live().len() == 1).then_some(())
    })
    .await;
    let asked = Instant::now();
    let paused = controller
        .pause_within("t", Duration::from_secs(10))
        .await
        .expect("the pause is tried again on the new history and answered");
    assert_eq!(paused.owner.as_str(), "w1");
    assert!(
        matches!(paused.stage, Stage::Paused),
        "answered {:?}",
        paused.stage
    );
    assert!(asked.elapsed() < Duration::from_secs(10));
    assert!(runs.live().is_empty(), "a Paused answer with a run alive");
    let listed = controller.list().await.expect("a listing");
    assert_eq!(listed.len(), 1, "the store's truth is the restored one");
    w1.shutdown().await.expect("w1 shuts down");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_store_restored_with_its_revision_going_back_is_noticed_and_survived() {
    restore_from_a_backup(0, 0).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_restore_with_other_writers_moving_the_revision_on_is_noticed_and_survived() {
    restore_from_a_backup(0, 40).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_store_restored_with_a_revision_bump_is_survived() {
    restore_from_a_backup(1_000, 0).await;
}

/// One worker's door to the store that, once shut, holds every call until it is
/// opened again: a worker that cannot reach the store (and so cannot notice that
/// its history was replaced) while others can.
#[derive(Clone)]
struct Door {
    store: MemoryCoordinator,
    shut: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Door {
    fn new(store: &MemoryCoordinator) -> Door {
        Door {
            store: store.clone(),
            shut: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }

    async fn pass(&self) {
        let mut shut = self.shut.subscribe();
        // Ends when the door opens; the sender lives as long as `self`.
        let _ = shut.wait_for(|shut| !*shut).await;
    }
}

impl Coordinator for Door {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.grant(ttl).await
        })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.keep_alive(lease).await
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.revoke(lease).await
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.list(prefix).await
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.txn(txn).await
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.watch(prefix, from).await
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.pass().await;
            self.store.wait_change(prefix, after, timeout).await
        })
    }
}

/// Two workers notice the restore at once; a third, that took tasks over from them
/// after the backup, cannot reach the store, and its runs go on until its own lease
/// deadline. The two that noticed must not claim those tasks again (their next
/// incarnations) while those runs may be alive: they wait one TTL after noticing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn after_a_restore_no_task_is_claimed_while_a_worker_that_did_not_notice_may_run_it() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let w1 = join_tracked(&store, "w1", &runs).await;
    let w2 = join_tracked(&store, "w2", &runs).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    let tasks: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    eventually(Duration::from_secs(10), "every task runs", || {
        (runs.live().len() == 6).then_some(())
    })
    .await;
    let snapshot = store.snapshot();
    // After the backup, w3 joins and is handed its share from w1 and w2.
    let door = Door::new(&store);
    let mut w3 = join_tracked_on(door.clone(), "w3", &runs, 16).await;
    eventually(Duration::from_secs(10), "w3 runs its share", || {
        let live = runs.live();
        let on_w3 = live
            .values()
            .filter(|on| on.contains(&"w3".to_owned()))
            .count();
        (live.len() == 6 && on_w3 == 2).then_some(())
    })
    .await;

    door.shut.send_replace(true);
    store.restore(&snapshot, 0);
    let mut ended = Vec::new();
    for mut worker in [w1, w2] {
        let end = tokio::time::timeout(RESTORE_TTL * 5, worker.closed())
            .await
            .expect("a worker that noticed ends");
        assert!(
            matches!(end, Err(ClusterError::HistoryReplaced { .. })),
            "{end:?}"
        );
        runs.assert_none_alive_on(
            worker.id().as_str(),
            "after its loop ended on the replaced history",
        );
        ended.push(worker.id().as_str().to_owned());
    }
    // Their next incarnations.
    let w1 = join_tracked(&store, "w1", &runs).await;
    let w2 = join_tracked(&store, "w2", &runs).await;
    eventually(
        RESTORE_TTL + Duration::from_secs(10),
        "every task runs again",
        || {
            let live = runs.live();
            (live.len() == 6 && live.values().all(|on| !on.contains(&"w3".to_owned())))
                .then_some(())
        },
    )
    .await;
    door.shut.send_replace(false);
    let end = tokio::time::timeout(RESTORE_TTL * 5, w3.closed())
        .await
        .expect("w3 ends once it reaches the store");
    assert!(
        matches!(
            end,
            Err(ClusterError::HistoryReplaced { .. } | ClusterError::LeaseLost { .. })
        ),
        "{end:?}"
    );
    {
        let state = runs.state();
        assert_eq!(
            state.most, 1,
            "two live runs of one task: {:?}",
            state.overlaps
        );
    }
    w1.shutdown().await.expect("w1 shuts down");
    w2.shutdown().await.expect("w2 shuts down");
}

/// A door to the store that refuses, while `refusing` is set, every write of the
/// key a worker moves the store's revision on with after a restore.
#[derive(Clone)]
struct NoHistoryWrites {
    store: MemoryCoordinator,
    refusing: Arc<std::sync::atomic::AtomicBool>,
}

impl Coordinator for NoHistoryWrites {
    pass_to_store!(grant, keep_alive, revoke, list, watch, wait_change);

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let moves_on = txn
                .then
                .iter()
                .any(|op| matches!(op, Op::Put { key, .. } if key == "restore/history"));
            if moves_on && self.refusing.load(Ordering::SeqCst) {
                return Err(ClusterError::Unreachable {
                    op: "txn",
                    detail: "refused by the test".into(),
                });
            }
            self.store.txn(txn).await
        })
    }
}

/// A worker that noticed a restore but cannot move the store's revision past the
/// highest it saw does not end: were it to, its application would join again and
/// claim tasks under fence tokens below ones already handed out. It ends once the
/// revision is moved on, and the tasks' next tokens are above the old ones.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_that_cannot_move_the_revision_on_does_not_end_until_it_has() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let door = NoHistoryWrites {
        store: store.clone(),
        refusing: Arc::clone(&refusing),
    };
    let mut w1 = join_tracked_on(door, "w1", &runs, 16).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    let tasks: Vec<String> = (0..3).map(|i| format!("t{i}")).collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    eventually(Duration::from_secs(10), "every task runs", || {
        (runs.live().len() == 3).then_some(())
    })
    .await;
    let snapshot = store.snapshot();
    // After the backup: every task paused and resumed, under new tokens.
    for task in &tasks {
        controller
            .pause_within(task, Duration::from_secs(10))
            .await
            .expect("pause");
        controller
            .resume_within(task, Duration::from_secs(10))
            .await
            .expect("resume");
    }
    eventually(Duration::from_secs(10), "every task runs again", || {
        (runs.live().len() == 3).then_some(())
    })
    .await;
    let before = runs.highest_tokens();
    let seen = store.list("restore/".into()).await.expect("list").revision;

    refusing.store(true, Ordering::SeqCst);
    store.restore(&snapshot, 0);
    eventually(RESTORE_TTL * 3, "w1 stops its runs", || {
        runs.live().is_empty().then_some(())
    })
    .await;
    let still = tokio::time::timeout(RESTORE_TTL * 10, w1.closed()).await;
    assert!(
        still.is_err(),
        "w1 ended ({still:?}) though the store's revision is still below {seen}: its next \
         incarnation would claim tasks under tokens below {before:?}"
    );
    let now = store.list("restore/".into()).await.expect("list").revision;
    assert!(now <= seen, "the store moved on by itself: {now} > {seen}");

    refusing.store(false, Ordering::SeqCst);
    let ended = tokio::time::timeout(RESTORE_TTL * 10, w1.closed())
        .await
        .expect("w1 ends once it moved the revision on");
    assert!(
        matches!(ended, Err(ClusterError::HistoryReplaced { .. })),
        "w1 ended with {ended:?}"
    );
    let now = store.list("restore/".into()).await.expect("list").revision;
    assert!(now > seen, "the store's revision {now} is not past {seen}");
    drop(w1);
    let started_before = runs.state().starts.len();
    let w1 = join_tracked(&store, "w1", &runs).await;
    eventually(
        RESTORE_TTL + Duration::from_secs(10),
        "every task runs",
        || (runs.live().len() == 3).then_some(()),
    )
    .await;
    runs.assert_one_live_and_tokens_above(started_before, &before);
    w1.shutdown().await.expect("w1 shuts down");
}

/// A door to the store whose listings never answer in time: a worker that cannot
/// list (a listing too large for its messages, a store too far).
#[derive(Clone)]
struct NoListing {
    store: MemoryCoordinator,
}

impl Coordinator for NoListing {
    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        let _ = prefix;
        Box::pin(async move {
            Err(ClusterError::Unreachable {
                op: "list",
                detail: "the listing is larger than a message may be".into(),
            })
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        self.store.txn(txn)
    }

    pass_to_store!(grant, keep_alive, revoke, watch, wait_change);
}

/// A worker that cannot list counts nowhere: the others do not hand it tasks it
/// would never run, and it is not listed among the members.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_that_cannot_list_is_handed_no_tasks() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let w1 = join_tracked(&store, "w1", &runs).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    let tasks: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    eventually(Duration::from_secs(10), "w1 runs every task", || {
        (runs.live().len() == 10).then_some(())
    })
    .await;
    let blind = Worker::builder(
        NoListing {
            store: store.clone(),
        },
        "restore",
        "w2",
    )
    .lease_keeping(LeaseKeeping::SharedRuntime)
    .ttl(RESTORE_TTL)
    .stop_bound(Duration::from_millis(600))
    .resync(Duration::from_millis(200))
    .op_timeout(Duration::from_secs(1))
    .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
    .await
    .expect("w2 joins");
    // Ten resyncs, two TTLs: long enough for a hand-over of half the tasks.
    let until = Instant::now() + RESTORE_TTL * 2;
    // Bounded by `until`.
    while Instant::now() < until {
        let live = runs.live();
        assert_eq!(
            live.len(),
            10,
            "a task stopped running after a worker that cannot list joined: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let members = controller.workers().await.expect("the members");
    let names: Vec<&str> = members.iter().map(|w| w.as_str()).collect();
    assert_eq!(names, ["w1"], "a worker that cannot list is not a member");
    drop(blind);
    w1.shutdown().await.expect("w1 shuts down");
}

/// A spec larger than the controller writes is refused with a typed error that
/// names the task and the sizes, and nothing is written; a controller told of a
/// store with a larger limit writes it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_spec_larger_than_the_store_accepts_is_refused_at_create() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "specs").expect("a controller");
    let big = vec![b'x'; taskstage_cluster::MAX_SPEC_BYTES + 1];
    let refused = controller
        .create("big", big.clone(), DesiredStage::Running)
        .await;
    assert!(
        matches!(
            &refused,
            Err(ClusterError::SpecTooLarge { task, bytes, limit })
                if task.as_str() == "big"
                    && *bytes == big.len()
                    && *limit == taskstage_cluster::MAX_SPEC_BYTES
        ),
        "{refused:?}"
    );
    assert!(
        store.dump().is_empty(),
        "a refused create wrote {:?}",
        store.dump()
    );
    let roomy = controller.with_max_spec_bytes(big.len());
    roomy
        .create("big", big, DesiredStage::Running)
        .await
        .expect("a store told to take it");
}

/// A command meets a store that cannot be reached for a while (an election, a
/// member replaced): it tries again within its own deadline instead of failing
/// at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_command_rides_out_an_unreachable_store_within_its_deadline() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let worker = join_tracked(&store, "w1", &runs).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("t runs");
    store.set_unreachable(true);
    let healer = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            store.set_unreachable(false);
        })
    };
    let paused = controller
        .pause_within("t", Duration::from_secs(10))
        .await
        .expect("a pause through a store unreachable for 0.8 s");
    assert_eq!(paused.stage, Stage::Paused);
    assert!(runs.live().is_empty(), "Paused, yet a run is alive");
    healer.await.expect("the healer");
    // Past its deadline, it fails, naming the store.
    store.set_unreachable(true);
    let failed = controller
        .resume_within("t", Duration::from_millis(500))
        .await;
    assert!(
        matches!(failed, Err(ClusterError::Unreachable { .. })),
        "{failed:?}"
    );
    store.set_unreachable(false);
    worker.shutdown().await.expect("shutdown");
}

/// A worker above its fair share hands the excess over at most sixteen tasks at a
/// time: forty tasks on one worker, a second joins, and never more than sixteen
/// of them are without a run at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_hands_over_at_most_sixteen_tasks_at_a_time() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let w1 = join_tracked_holding(&store, "w1", &runs, 64).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    for i in 0..40 {
        controller
            .create(&format!("t{i:02}"), Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    eventually(Duration::from_secs(10), "w1 runs all forty", || {
        (runs.live().len() == 40).then_some(())
    })
    .await;
    let w2 = join_tracked_holding(&store, "w2", &runs, 64).await;
    eventually(Duration::from_secs(20), "a 20/20 split", || {
        let live = runs.live();
        let on_w2 = live.values().filter(|on| on == &&["w2".to_owned()]).count();
        (live.len() == 40 && on_w2 == 20).then_some(())
    })
    .await;
    let most = runs.state().most_winding;
    assert!(most > 0, "no hand-over was seen under way");
    assert!(
        most <= 16,
        "{most} runs were being stopped for a hand-over at once; at most 16 may be"
    );
    w1.shutdown().await.expect("w1 shuts down");
    w2.shutdown().await.expect("w2 shuts down");
}

/// Stopped tasks want no owner and count in nobody's share: seven running and
/// three stopped tasks over two workers split four and three.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stopped_tasks_do_not_count_in_the_fair_shares() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let w1 = join_tracked(&store, "w1", &runs).await;
    let controller = Controller::new(store.clone(), "restore").expect("a controller");
    for i in 0..10 {
        controller
            .create(&format!("t{i}"), Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    for i in 7..10 {
        controller
            .stop_within(&format!("t{i}"), Duration::from_secs(10))
            .await
            .expect("stop");
    }
    eventually(Duration::from_secs(10), "seven tasks run", || {
        (runs.live().len() == 7).then_some(())
    })
    .await;
    let w2 = join_tracked(&store, "w2", &runs).await;
    let split = eventually(Duration::from_secs(20), "the shares settle", || {
        let live = runs.live();
        let on_w2 = live.values().filter(|on| on == &&["w2".to_owned()]).count();
        (live.len() == 7 && on_w2 > 0).then_some((7 - on_w2, on_w2))
    })
    .await;
    // Let any further hand-over happen, then read again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let live = runs.live();
    let on_w2 = live.values().filter(|on| on == &&["w2".to_owned()]).count();
    let mut shares = [live.len() - on_w2, on_w2];
    shares.sort_unstable();
    assert_eq!(
        shares,
        [3, 4],
        "seven running tasks over two workers (first split {split:?}): {live:?}"
    );
    w1.shutdown().await.expect("w1 shuts down");
    w2.shutdown().await.expect("w2 shuts down");
}

/// A task whose factory keeps failing is released and not claimed again by the
/// same worker for the same desired revision: not in a tight loop, and not at
/// all until the desired stage is written again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_task_the_factory_cannot_build_is_not_claimed_again_in_a_loop() {
    let store = MemoryCoordinator::new();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let worker = Worker::builder(store.clone(), "unbuildable", "w1")
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(RESTORE_TTL)
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .op_timeout(Duration::from_secs(1))
        .join(move |spec| {
            if spec.task.as_str() == "bad" {
                counted.fetch_add(1, Ordering::SeqCst);
                return Err("the spec names a table that does not exist".into());
            }
            Ok(Task::builder(spec.task.as_str()).unit(Wait))
        })
        .await
        .expect("join");
    let controller = Controller::new(store.clone(), "unbuildable").expect("a controller");
    controller
        .create("bad", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    // Turns of the runtime first: a tight loop keeps the paused clock from moving
    // at all, so a wait on it would never end.
    let mut asked = false;
    for _ in 0..100_000 {
        if calls.load(Ordering::SeqCst) > 0 {
            asked = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    if !asked {
        eventually(Duration::from_secs(5), "the factory is asked", || {
            (calls.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
    }
    // A tight loop would ask again within a few turns of the runtime: look there
    // first, so that it fails at once.
    for _ in 0..10_000 {
        tokio::task::yield_now().await;
        if calls.load(Ordering::SeqCst) > 1 {
            break;
        }
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the factory was asked again at once, for the same desired revision"
    );
    // Fifty resyncs.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the factory was asked again for the same desired revision"
    );
    // A new desired revision is a new chance.
    controller
        .set_desired("bad", DesiredStage::Paused)
        .await
        .expect("set Paused");
    controller
        .set_desired("bad", DesiredStage::Running)
        .await
        .expect("set Running");
    eventually(Duration::from_secs(5), "the factory is asked again", || {
        (calls.load(Ordering::SeqCst) > 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        calls.load(Ordering::SeqCst) <= 3,
        "asked {} times for two desired revisions",
        calls.load(Ordering::SeqCst)
    );
    worker.shutdown().await.expect("shutdown");
}

/// A report for a later desired revision does not answer an earlier command: a
/// pause overtaken by a resume is not answered by the Running that answers the
/// resume (nor by anything else).
#[test]
fn a_report_for_a_later_desired_revision_does_not_answer_an_earlier_command() {
    use taskstage_cluster::{ObservedStatus, TaskId, TaskStatus, WorkerId};
    let owner = WorkerId::new("w1").expect("an id");
    let status = TaskStatus {
        task: TaskId::new("t").expect("an id"),
        desired: DesiredStage::Running,
        desired_revision: 12,
        owner: Some(owner.clone()),
        owner_revision: Some(5),
        owner_lease: Some(0x100),
        observed: Some(ObservedStatus {
            stage: Stage::Running,
            generation: 2,
            outcome: taskstage_cluster::ObservedOutcome::None,
            desired_revision: 12,
            owner,
            owner_revision: 5,
        }),
        revision: 13,
    };
    assert!(status.answers(12), "the resume's own report");
    assert!(
        !status.answers(10),
        "the pause at revision 10 was overtaken by the resume at 12: Running does not answer it"
    );
}

/// The in-memory store's watch from exactly the revision its history was compacted
/// to is told so (that history is gone); from the next revision it is served.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_watch_from_exactly_the_compaction_revision_is_told_it_was_compacted() {
    use taskstage_cluster::WatchMessage;
    let store = MemoryCoordinator::new();
    let put = |value: &str| Txn {
        when: vec![],
        then: vec![Op::Put {
            key: "c/k".into(),
            value: value.as_bytes().to_vec(),
            lease: None,
        }],
    };
    store.txn(put("1")).await.expect("a put");
    let at = store.txn(put("2")).await.expect("a put").revision;
    store.compact();
    let mut from_at = store.watch("c/".into(), at).await.expect("a watch");
    // On the paused clock: a watch that waits for nothing times out at once.
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(from_at.as_mut(), cx)),
    )
    .await
    .expect("the watch answers at once");
    assert_eq!(
        first,
        Some(Ok(WatchMessage::Compacted { revision: at })),
        "a watch from the compaction revision {at}"
    );
    let mut after = store.watch("c/".into(), at + 1).await.expect("a watch");
    let next = store.txn(put("3")).await.expect("a put").revision;
    let message = tokio::time::timeout(
        Duration::from_secs(5),
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(after.as_mut(), cx)),
    )
    .await
    .expect("the change is delivered");
    match message {
        Some(Ok(WatchMessage::Events { events, .. })) => {
            assert_eq!(events.len(), 1, "{events:?}");
            assert_eq!(events[0].revision(), next);
        }
        other => panic!("a watch from {}: {other:?}", at + 1),
    }
}

/// A run that waits for its cancellation; the first one cancelled after `slow` is
/// armed takes two seconds to wind down, the others none.
struct OneSlow {
    task: String,
    worker: String,
    runs: Runs,
    slow: Arc<std::sync::atomic::AtomicBool>,
}

impl Unit for OneSlow {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.runs
            .state()
            .alive
            .entry(self.task.clone())
            .or_default()
            .push(self.worker.clone());
        let _untrack = Untrack(self.runs.clone(), self.task.clone(), self.worker.clone());
        ctx.cancelled().await;
        if self.slow.swap(false, Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(RunExit::Cancelled)
    }
}

/// A clean shutdown hands each task over as soon as its own run is gone: it leaves
/// the membership first (so the others' shares grow at once) and withdraws each
/// task's keys when its run has returned, not once every run has. One of the
/// stopping worker's runs takes two seconds to return; the others' tasks run on the
/// other worker before it has.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_clean_shutdown_hands_each_task_over_as_soon_as_its_run_is_gone() {
    let store = MemoryCoordinator::new();
    let runs = Runs::default();
    let slow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let join = |id: &'static str| {
        let (store, runs, slow) = (store.clone(), runs.clone(), Arc::clone(&slow));
        async move {
            Worker::builder(store, "shutdown", id)
                .lease_keeping(LeaseKeeping::SharedRuntime)
                .ttl(Duration::from_secs(10))
                .stop_bound(Duration::from_secs(6))
                .resync(Duration::from_millis(200))
                .op_timeout(Duration::from_secs(1))
                .join(move |spec| {
                    Ok(Task::builder(spec.task.as_str()).unit(OneSlow {
                        task: spec.task.as_str().to_owned(),
                        worker: id.to_owned(),
                        runs: runs.clone(),
                        slow: Arc::clone(&slow),
                    }))
                })
                .await
                .expect("join")
        }
    };
    let w1 = join("w1").await;
    let w2 = join("w2").await;
    let controller = Controller::new(store.clone(), "shutdown").expect("a controller");
    for i in 0..8 {
        controller
            .create(&format!("t{i}"), Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    let on = |worker: &str| {
        runs.live()
            .into_iter()
            .filter(|(_, on)| on == &[worker.to_owned()])
            .map(|(task, _)| task)
            .collect::<Vec<_>>()
    };
    eventually(Duration::from_secs(20), "four tasks on each worker", || {
        (on("w1").len() == 4 && on("w2").len() == 4).then_some(())
    })
    .await;
    let held = on("w1");
    slow.store(true, Ordering::SeqCst);
    let shutdown = tokio::spawn(w1.shutdown());
    // One of w1's runs winds down for 2 s; the other three tasks are w2's before.
    let moved = eventually(Duration::from_secs(5), "w1's fast tasks run on w2", || {
        let live = runs.live();
        let moved: Vec<&String> = held
            .iter()
            .filter(|t| live.get(*t).is_some_and(|on| on == &["w2".to_owned()]))
            .collect();
        (moved.len() >= 3).then_some((moved.len(), live.clone()))
    })
    .await;
    let (count, live) = moved;
    let still_on_w1: Vec<&String> = held
        .iter()
        .filter(|t| live.get(*t).is_some_and(|on| on.contains(&"w1".to_owned())))
        .collect();
    assert_eq!(
        (count, still_on_w1.len()),
        (3, 1),
        "while w1's slow run winds down, its other tasks run on w2: {live:?}"
    );
    shutdown
        .await
        .expect("the shutdown task")
        .expect("w1 shuts down");
    eventually(Duration::from_secs(5), "every task runs on w2", || {
        (on("w2").len() == 8).then_some(())
    })
    .await;
    w2.shutdown().await.expect("w2 shuts down");
}

/// A unit whose every run fails at once, counting its runs.
struct FailsAtOnce(Arc<std::sync::atomic::AtomicUsize>);

impl Unit for FailsAtOnce {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(RunError::msg("the source table is gone"))
    }
}

/// Moves the paused clock on by `span`, 10 ms at a time, whether or not the
/// runtime goes idle: a worker that loops without waiting cannot stop the clock
/// (and so hang the test) instead of failing it.
async fn passes(span: Duration) {
    let step = Duration::from_millis(10);
    let mut left = span;
    while !left.is_zero() {
        let now = step.min(left);
        tokio::time::advance(now).await;
        tokio::task::yield_now().await;
        left -= now;
    }
}

/// A failed run is the answer to its desired revision (decide, invariant 4): the
/// worker reports the failure and does not run the task again for that revision,
/// however many passes go by; a new desired revision is a new chance.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_run_is_its_answer_and_is_not_run_again_for_the_same_revision() {
    let store = MemoryCoordinator::new();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let worker = Worker::builder(store.clone(), "fails", "w1")
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(RESTORE_TTL)
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(FailsAtOnce(Arc::clone(&counted))))
        })
        .await
        .expect("join");
    let controller = Controller::new(store.clone(), "fails").expect("a controller");
    controller
        .create("f", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    // Answered by the failure (a resume would write a new desired revision).
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let status = controller.status("f").await.expect("status");
        let failed = status
            .current_observed()
            .is_some_and(|o| o.outcome.is_failed() && o.stage == Stage::Paused);
        if failed && status.answers(status.desired_revision) {
            break;
        }
        assert!(Instant::now() < end, "no failure answered: {status:?}");
        passes(Duration::from_millis(10)).await;
    }
    // Fifty passes of the worker: nothing runs, nothing is written.
    let before = store.list("fails/".into()).await.expect("list").revision;
    passes(Duration::from_secs(10)).await;
    let after = store.list("fails/".into()).await.expect("list").revision;
    assert_eq!(
        after,
        before,
        "the store was written {} times in fifty passes of a settled failure",
        after - before
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the failed task was run again for the same desired revision"
    );
    let status = controller.status("f").await.expect("status");
    assert!(
        status.answers(status.desired_revision),
        "the failure no longer answers: {status:?}"
    );
    // A new desired revision (the resume's own write) runs it again, once.
    let answer = controller
        .resume_within("f", Duration::from_secs(10))
        .await
        .expect("the second failure answers the resume");
    assert!(
        answer.outcome.is_failed() && answer.stage == Stage::Paused,
        "not answered by the failure: {answer:?}"
    );
    passes(Duration::from_secs(10)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "not run exactly once for the second desired revision"
    );
    worker.shutdown().await.expect("shutdown");
}
