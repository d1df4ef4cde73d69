//! Promises of the cluster layer that no scenario test pinned down, each checked in
//! process on the in-memory store and tokio's paused clock: the lease deadline's
//! arithmetic, the compare that makes `set_desired` a compare-and-set (a coordinator
//! wrapper makes the race happen on cue), and a worker's capacity.
//!
//! Each test here kills a mutant of `scripts/mutation-check.sh` that every other
//! suite let through (see docs/mutants.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use taskstage::cluster::{
    BoxFuture, ClusterError, Controller, Coordinator, DesiredStage, Grant, KeepAlive, Listing,
    MemoryCoordinator, Op, Txn, TxnResult, Worker,
};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
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

/// A coordinator that forwards to the in-memory store and, once armed, lets another
/// writer change a task's desired stage just before the next write of a desired stage
/// arrives: the race `set_desired`'s compare exists for, on cue.
#[derive(Clone)]
struct Racing {
    store: MemoryCoordinator,
    armed: Arc<AtomicBool>,
}

impl Coordinator for Racing {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        self.store.grant(ttl)
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        self.store.keep_alive(lease)
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        self.store.revoke(lease)
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        self.store.list(prefix)
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let desired = txn.then.iter().find_map(|op| match op {
                Op::Put { key, .. } if key.ends_with("/desired") => Some(key.clone()),
                _ => None,
            });
            if let Some(key) = desired {
                if self.armed.swap(false, Ordering::SeqCst) {
                    let other = Txn {
                        when: Vec::new(),
                        then: vec![Op::Put {
                            key,
                            value: b"Paused".to_vec(),
                            lease: None,
                        }],
                    };
                    self.store.txn(other).await?;
                }
            }
            self.store.txn(txn).await
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        self.store.wait_change(prefix, after, timeout)
    }
}

/// `set_desired` reads the desired stage, then writes only if it is unchanged: a write
/// by someone else in between makes it a `Conflict` that writes nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn set_desired_is_a_compare_and_set_on_the_desired_stage() {
    let store = MemoryCoordinator::new();
    let armed = Arc::new(AtomicBool::new(false));
    let racing = Racing {
        store: store.clone(),
        armed: Arc::clone(&armed),
    };
    let controller = Controller::new(racing, "cas").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    armed.store(true, Ordering::SeqCst);
    let result = controller.set_desired("t", DesiredStage::Stopped).await;
    assert!(
        matches!(&result, Err(ClusterError::Conflict { task, .. }) if task.as_str() == "t"),
        "a desired stage changed between the read and the write was overwritten: {result:?}"
    );
    assert!(!armed.load(Ordering::SeqCst), "the race was never staged");
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
