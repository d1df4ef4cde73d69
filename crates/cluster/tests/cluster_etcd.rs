//! Integration tests on a real etcd: 3 members on 127.0.0.1 (see
//! `cluster_support`), workers as in-process tasks.
//!
//! Without an `etcd` binary each test says SKIPPED and passes, except under
//! `CI=true`, where it fails.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::{counters, dead_endpoint, eventually, probes, EtcdCluster, SharedProbes};
use taskstage::Stage;
use taskstage_cluster::{
    ClusterError, Compare, Controller, Coordinator, DesiredStage, EtcdCoordinator, EtcdOptions,
    KeepAlive, Op, TaskId, Txn, Worker,
};

const PREFIX: &str = "it";
const WAIT: Duration = Duration::from_secs(15);

async fn connect(cluster: &EtcdCluster) -> EtcdCoordinator {
    EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
        .await
        .expect("connect to the test cluster")
}

async fn join(cluster: &EtcdCluster, id: &str, shared: &SharedProbes) -> Worker {
    join_on(connect(cluster).await, id, shared).await
}

/// A worker with the tests' short timings, on the given connection.
async fn join_on(coordinator: EtcdCoordinator, id: &str, shared: &SharedProbes) -> Worker {
    Worker::builder(coordinator, PREFIX, id)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(counters(id, shared))
        .await
        .expect("join the test cluster")
}

/// One worker running `task`, with the controller connected from the other end of
/// the member list, and the member the worker talks to: the set-up of the tests that
/// take that member away.
struct OnOneMember {
    worker: Worker,
    /// The worker's connection, to see which member it uses.
    coordinator: EtcdCoordinator,
    controller: Controller,
    /// The endpoint the worker used when the task started, and its member.
    used: String,
    member: usize,
}

async fn running_on_one_member(
    cluster: &EtcdCluster,
    task: &str,
    shared: &SharedProbes,
) -> OnOneMember {
    let coordinator = connect(cluster).await;
    let worker = join_on(coordinator.clone(), "w1", shared).await;
    let controller = Controller::new(
        EtcdCoordinator::connect(
            cluster.endpoints().into_iter().rev(),
            EtcdOptions::default(),
        )
        .await
        .unwrap(),
        PREFIX,
    )
    .unwrap();
    controller
        .create(task, Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    controller.resume_within(task, WAIT).await.unwrap();
    let used = coordinator.current_endpoint().to_owned();
    let member = cluster.member_of(&used).unwrap();
    OnOneMember {
        worker,
        coordinator,
        controller,
        used,
        member,
    }
}

fn alive(shared: &SharedProbes, task: &str) -> usize {
    probes(shared).alive.get(task).map_or(0, Vec::len)
}

/// Waits until one run of `task` is alive, as its probe records it. A run is alive
/// from its launch, when Running is published; the probe unit records itself after
/// its first store read (its checkpoint), which a slow or frozen member delays. More
/// than one is never waited for: each start checks that none was alive before it
/// (see [`no_overlaps`]).
async fn one_alive(shared: &SharedProbes, task: &str) {
    eventually(WAIT, &format!("a run of {task} recorded alive"), || {
        let n = alive(shared, task);
        async move { (n == 1).then_some(()) }
    })
    .await;
}

fn no_overlaps(shared: &SharedProbes) {
    let violations = probes(shared).violations.clone();
    assert!(violations.is_empty(), "runs overlapped: {violations:#?}");
}

async fn checkpoint(coord: &EtcdCoordinator, task: &str) -> u64 {
    let key = format!("{PREFIX}/checkpoints/{task}/pos");
    let listing = coord.list(key.clone()).await.expect("read the checkpoint");
    listing
        .get(&key)
        .and_then(|kv| String::from_utf8_lossy(&kv.value).parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_run_pause_resume_and_stop_across_the_cluster() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let w1 = join(&cluster, "w1", &shared).await;
    let w2 = join(&cluster, "w2", &shared).await;
    let controller = Controller::new(connect(&cluster).await, PREFIX).unwrap();

    controller
        .create("orders", b"spec".to_vec(), DesiredStage::Running)
        .await
        .unwrap();
    let running = controller.resume_within("orders", WAIT).await.unwrap();
    assert_eq!(running.stage, Stage::Running);
    one_alive(&shared, "orders").await;
    let owner = running.owner.clone();

    // A cluster-wide pause returns only when the run has returned, wherever it is.
    let started = Instant::now();
    let paused = controller.pause_within("orders", WAIT).await.unwrap();
    eprintln!("pause answered in {:?}", started.elapsed());
    // Paused, or New when the owner built its task again before answering (as
    // `pause_within` documents): either way no run is alive, checked below.
    assert!(
        matches!(paused.stage, Stage::Paused | Stage::New),
        "{paused:?}"
    );
    assert_eq!(paused.owner, owner, "the task moved during a pause");
    assert_eq!(
        alive(&shared, "orders"),
        0,
        "pause returned with a run alive"
    );

    let resumed = controller.resume_within("orders", WAIT).await.unwrap();
    assert_eq!(resumed.stage, Stage::Running);
    one_alive(&shared, "orders").await;

    let stopped = controller.stop_within("orders", WAIT).await.unwrap();
    assert_eq!(stopped.stage, Stage::Stopped);
    assert_eq!(alive(&shared, "orders"), 0);
    assert!(matches!(
        controller.resume_within("orders", WAIT).await,
        Err(ClusterError::Stopped { .. })
    ));

    // Created Paused: claimed and built, never run.
    let rev = controller
        .create("later", Vec::new(), DesiredStage::Paused)
        .await
        .unwrap();
    let report = controller
        .wait_for_revision("later", rev, WAIT)
        .await
        .unwrap();
    assert_eq!(report.stage, Stage::New);
    assert_eq!(alive(&shared, "later"), 0);
    let mut watch = controller.watch("later").unwrap();
    let first = watch.changed(WAIT).await.unwrap();
    let resumed = controller.resume_within("later", WAIT).await.unwrap();
    assert_eq!(resumed.stage, Stage::Running);
    let next = watch.changed(WAIT).await.unwrap();
    assert_ne!(
        first.observed, next.observed,
        "the watch returned no change"
    );

    no_overlaps(&shared);
    w1.shutdown().await.unwrap();
    w2.shutdown().await.unwrap();
}

/// Waits until the latest run of `task` the probes saw start is `worker`'s, and
/// returns the checkpoint it started from.
async fn started_by(shared: &SharedProbes, task: &str, worker: &str) -> u64 {
    eventually(WAIT, &format!("{worker}'s run of {task} started"), || {
        let last = probes(shared)
            .starts
            .get(task)
            .and_then(|s| s.last().cloned());
        async move { last.filter(|(w, _)| w == worker).map(|(_, from)| from) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_replaced_and_the_new_owner_resumes_from_the_checkpoint() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let coord = connect(&cluster).await;
    let controller = Controller::new(coord.clone(), PREFIX).unwrap();
    let w1 = join(&cluster, "w1", &shared).await;
    controller
        .create("copy", Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    let running = controller.resume_within("copy", WAIT).await.unwrap();
    assert_eq!(running.owner.as_str(), "w1");
    eventually(WAIT, "3 checkpoints by w1", || {
        let coord = coord.clone();
        async move { (checkpoint(&coord, "copy").await >= 3).then_some(()) }
    })
    .await;
    let w2 = join(&cluster, "w2", &shared).await;

    // A crash: no revoke, so w2 can take over only once etcd expires w1's lease.
    w1.crash().await;
    let before = checkpoint(&coord, "copy").await;
    let killed = Instant::now();
    let status = eventually(WAIT, "w2 running the task", || {
        let controller = controller.clone();
        async move {
            let status = controller.status("copy").await.ok()?;
            (status.owner.as_ref().map(|w| w.as_str()) == Some("w2")
                && status.answers(status.desired_revision))
            .then_some(status)
        }
    })
    .await;
    eprintln!("takeover after a crash in {:?}", killed.elapsed());
    assert_eq!(status.current_observed().unwrap().stage, Stage::Running);
    // Running is published when the run is launched; the unit records its start
    // after its first store read (the checkpoint), so wait for that record.
    let from = started_by(&shared, "copy", "w2").await;
    assert!(
        from >= before,
        "w2 started from {from}, below the checkpoint {before}"
    );

    // A clean shutdown revokes the lease: the takeover is immediate.
    let w3 = join(&cluster, "w3", &shared).await;
    let left = Instant::now();
    w2.shutdown().await.unwrap();
    let before = checkpoint(&coord, "copy").await;
    eventually(WAIT, "w3 running the task", || {
        let controller = controller.clone();
        async move {
            let status = controller.status("copy").await.ok()?;
            (status.owner.as_ref().map(|w| w.as_str()) == Some("w3")
                && status.answers(status.desired_revision))
            .then_some(())
        }
    })
    .await;
    eprintln!("takeover after a clean shutdown in {:?}", left.elapsed());
    let from = started_by(&shared, "copy", "w3").await;
    assert!(
        from >= before,
        "w3 started from {from}, below the checkpoint {before}"
    );
    assert_eq!(alive(&shared, "copy"), 1);
    no_overlaps(&shared);
    w3.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owners_fenced_write_is_rejected_and_its_run_stopped() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let coord = connect(&cluster).await;
    let controller = Controller::new(coord.clone(), PREFIX).unwrap();
    let w1 = join(&cluster, "w1", &shared).await;
    controller
        .create("sync", Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    controller.resume_within("sync", WAIT).await.unwrap();
    let task = TaskId::new("sync").unwrap();
    let handle = w1.observer(&task).expect("w1 runs the task");
    let old = probes(&shared)
        .fencers
        .get(&("sync".to_owned(), "w1".to_owned()))
        .cloned()
        .expect("w1's fencer");
    old.put_checkpoint("pos", b"100".to_vec()).await.unwrap();

    // Depose w1 as an expiry would: its lease goes, its owner key with it.
    coord.revoke(w1.lease()).await.unwrap();
    let w2 = join(&cluster, "w2", &shared).await;
    eventually(WAIT, "w2 owning the task", || {
        let controller = controller.clone();
        async move {
            let status = controller.status("sync").await.ok()?;
            (status.owner.as_ref().map(|w| w.as_str()) == Some("w2")).then_some(())
        }
    })
    .await;
    let rejected = old.put_checkpoint("pos", b"1".to_vec()).await;
    assert!(
        matches!(rejected, Err(ClusterError::Fenced { ref worker, .. }) if worker.as_str() == "w1"),
        "a deposed owner's write was not rejected: {rejected:?}"
    );
    assert!(
        checkpoint(&coord, "sync").await >= 100,
        "the stale write landed"
    );
    // The deposed owner stopped its local run.
    let stopped = tokio::time::timeout(WAIT, handle.wait_for_stage(Stage::is_terminal))
        .await
        .expect("w1's local run never stopped");
    assert_eq!(stopped.stage, Stage::Stopped);
    no_overlaps(&shared);
    w2.shutdown().await.unwrap();
    let _ = w1.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_the_same_worker_id_rejects_the_old_token() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let coord = connect(&cluster).await;
    let controller = Controller::new(coord.clone(), PREFIX).unwrap();
    let w1 = join(&cluster, "w1", &shared).await;
    controller
        .create("load", Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    controller.resume_within("load", WAIT).await.unwrap();
    let task = TaskId::new("load").unwrap();
    let old_token = w1.token(&task).expect("w1's token");
    let old = probes(&shared)
        .fencers
        .get(&("load".to_owned(), "w1".to_owned()))
        .cloned()
        .unwrap();
    w1.crash().await;

    let again = join(&cluster, "w1", &shared).await;
    assert_ne!(again.lease(), old_token.lease);
    let new_token = eventually(WAIT, "the restarted w1 owning the task", || {
        let token = again.token(&task);
        async move { token.filter(|t| t.lease != old_token.lease) }
    })
    .await;
    assert!(new_token.revision > old_token.revision);
    let rejected = old.put_checkpoint("pos", b"0".to_vec()).await;
    assert!(
        matches!(rejected, Err(ClusterError::Fenced { .. })),
        "the old incarnation's token was accepted: {rejected:?}"
    );
    controller.resume_within("load", WAIT).await.unwrap();
    no_overlaps(&shared);
    again.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_an_etcd_member_moves_the_worker_to_another() {
    let Some(mut cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let OnOneMember {
        worker: w1,
        coordinator: worker_coord,
        controller,
        used,
        member,
    } = running_on_one_member(&cluster, "stream", &shared).await;
    cluster.kill_member(member);

    // The worker keeps its lease through another member and still answers.
    let paused = controller.pause_within("stream", WAIT).await.unwrap();
    // Paused, or New: when the move to another member outlasts the self-fencing
    // deadline (TTL·(1−ρ) − stop bound, 1.3 s here; seen on a loaded machine) the
    // worker stops its run first and rebuilds the task, which then answers the pause
    // without ever starting. Either is a truthful rest.
    assert!(
        matches!(paused.stage, Stage::Paused | Stage::New),
        "the pause was answered by {}",
        paused.stage
    );
    let resumed = controller.resume_within("stream", WAIT).await.unwrap();
    assert_eq!(resumed.owner.as_str(), "w1");
    // The worker's own store I/O (its lease, cache and reports) runs on a
    // connection of its own, which answered above; the units' fenced writes go
    // through the application's connection, which must leave the dead member too.
    let fencer = probes(&shared)
        .fencers
        .get(&("stream".to_owned(), "w1".to_owned()))
        .cloned()
        .expect("the unit's fencer");
    fencer
        .put_checkpoint("pos", b"1".to_vec())
        .await
        .expect("a unit's fenced write after the member was lost");
    assert_ne!(
        worker_coord.current_endpoint(),
        used,
        "the worker's units stayed on a dead member"
    );
    assert!(!w1.is_finished(), "the worker lost its lease with a member");
    no_overlaps(&shared);
    w1.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_etcd_member_is_left_behind_on_timeouts() {
    let Some(mut cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let shared = SharedProbes::default();
    let OnOneMember {
        worker: w1,
        coordinator: worker_coord,
        controller,
        used,
        member,
    } = running_on_one_member(&cluster, "tail", &shared).await;
    // The member answers nothing and closes nothing: only deadlines reveal it.
    cluster.freeze_member(member);
    let frozen = Instant::now();
    eventually(WAIT, "the worker leaving the frozen member", || {
        let moved = worker_coord.current_endpoint() != used;
        async move { moved.then_some(()) }
    })
    .await;
    eprintln!("left a frozen member after {:?}", frozen.elapsed());
    // A frozen leader means an election, and w1 may have had to fence itself or
    // even lose its lease meanwhile: a second worker can take over then. Either
    // way the task answers again, with one run at most.
    let w2 = join(&cluster, "w2", &shared).await;
    let paused = controller.pause_within("tail", WAIT).await;
    let paused = paused.unwrap_or_else(|e| panic!("no pause answer after the freeze: {e}"));
    assert!(
        !paused.stage.run_may_be_alive(),
        "paused in {}",
        paused.stage
    );
    let resumed = controller.resume_within("tail", WAIT).await;
    let resumed = resumed.unwrap_or_else(|e| panic!("no resume answer after the freeze: {e}"));
    assert_eq!(resumed.stage, Stage::Running);
    one_alive(&shared, "tail").await;
    no_overlaps(&shared);
    let _ = w1.shutdown().await;
    let _ = w2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_is_a_typed_error_and_nothing_starts() {
    // Nothing listens: connecting fails fast with a typed error.
    let started = Instant::now();
    let error =
        EtcdCoordinator::connect([dead_endpoint(), dead_endpoint()], EtcdOptions::default())
            .await
            .unwrap_err();
    assert!(
        matches!(error, ClusterError::Unreachable { op: "connect", .. }),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // A store that goes away after connecting: joining fails, nothing is built.
    let Some(mut cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let coord = connect(&cluster).await;
    for member in 0..3 {
        cluster.kill_member(member);
    }
    let shared = SharedProbes::default();
    let joined = Worker::builder(coord, PREFIX, "w1")
        .ttl(Duration::from_secs(2))
        .join(counters("w1", &shared))
        .await;
    let Err(ClusterError::Unreachable { detail, .. }) = &joined else {
        panic!("expected Unreachable, got {joined:?}");
    };
    for endpoint in cluster.endpoints() {
        assert!(
            detail.contains(endpoint.as_str()),
            "the error does not name {endpoint}, which was tried: {detail}"
        );
    }
    assert_eq!(probes(&shared).built, 0, "a task was built without a store");
}

/// A keep-alive answers with the TTL the store gives the lease, and a lease the store
/// no longer has is Expired, not an error or a default TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_answers_with_the_stores_ttl_or_expired() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let coord = connect(&cluster).await;
    // Another connection than the one that granted the lease (a restarted process
    // keeping its lease): it can know the TTL only from the store's answer.
    let other = connect(&cluster).await;
    for asked in [Duration::from_secs(7), Duration::from_secs(11)] {
        let grant = coord.grant(asked).await.expect("a lease");
        assert_eq!(grant.ttl, asked);
        match other.keep_alive(grant.id).await.expect("an answer") {
            KeepAlive::Alive { ttl, revision } => {
                assert_eq!(ttl, asked, "the keep-alive of a {asked:?} lease");
                assert!(
                    revision > 0,
                    "a keep-alive answer names the store's revision"
                );
            }
            KeepAlive::Expired => panic!("the keep-alive of a {asked:?} lease: expired"),
        }
        coord.revoke(grant.id).await.expect("revoked");
        assert_eq!(
            other.keep_alive(grant.id).await.expect("an answer"),
            KeepAlive::Expired,
            "the keep-alive of a revoked lease"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_writes_nothing() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let coord = connect(&cluster).await;
    let controller = Controller::new(coord.clone(), PREFIX).unwrap();
    let everything = || {
        let coord = coord.clone();
        async move { coord.list(format!("{PREFIX}/")).await.unwrap().kvs }
    };

    let error = controller
        .create("a/b", Vec::new(), DesiredStage::Running)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClusterError::InvalidTaskId { .. }),
        "{error}"
    );
    let shared = SharedProbes::default();
    let short = Worker::builder(coord.clone(), PREFIX, "w1")
        .ttl(Duration::from_secs(1))
        .join(counters("w1", &shared))
        .await
        .unwrap_err();
    assert!(matches!(short, ClusterError::TtlTooShort { .. }), "{short}");
    let bad_id = Worker::builder(coord.clone(), PREFIX, "w/1")
        .join(counters("w/1", &shared))
        .await
        .unwrap_err();
    assert!(
        matches!(bad_id, ClusterError::InvalidWorkerId { .. }),
        "{bad_id}"
    );
    assert!(everything().await.is_empty(), "bad input wrote something");

    // An unknown desired stage read back: typed errors, nothing written, and no
    // worker claims the task.
    let key = format!("{PREFIX}/tasks/odd/desired");
    let txn = Txn {
        when: vec![Compare::Absent(key.clone())],
        then: vec![
            Op::Put {
                key: key.clone(),
                value: b"Sideways".to_vec(),
                lease: None,
            },
            Op::Put {
                key: format!("{PREFIX}/tasks/odd/spec"),
                value: Vec::new(),
                lease: None,
            },
        ],
    };
    assert!(coord.txn(txn).await.unwrap().succeeded);
    let before = everything().await;
    let error = controller.status("odd").await.unwrap_err();
    assert!(
        matches!(error, ClusterError::UnknownDesired { ref value, .. } if value == "Sideways"),
        "{error}"
    );
    let error = controller.pause_within("odd", WAIT).await.unwrap_err();
    assert!(
        matches!(error, ClusterError::UnknownDesired { .. }),
        "{error}"
    );
    assert_eq!(
        everything().await,
        before,
        "a refused command wrote something"
    );

    let w1 = join(&cluster, "w1", &shared).await;
    controller
        .create("fine", Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    // w1 read "odd" in the same listings in which it claimed and ran "fine".
    controller.resume_within("fine", WAIT).await.unwrap();
    let odd_owner = coord
        .list(format!("{PREFIX}/tasks/odd/owner"))
        .await
        .unwrap();
    assert!(
        odd_owner.kvs.is_empty(),
        "a task with an unknown desired stage was claimed"
    );
    w1.shutdown().await.unwrap();
    let _ = Arc::new(());
}

/// A keep-alive of a lease the store no longer has (revoked, or never granted) is
/// read as `Expired`, not as an answer that keeps the lease alive: the worker's
/// session ends its runs on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_of_a_lease_that_no_longer_exists_is_expired() {
    use taskstage_cluster::KeepAlive;
    let Some(cluster) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    let coord = connect(&cluster).await;
    let grant = coord.grant(Duration::from_secs(10)).await.expect("grant");
    assert!(
        matches!(
            coord.keep_alive(grant.id).await,
            Ok(KeepAlive::Alive { ttl, .. }) if ttl > Duration::ZERO
        ),
        "a live lease's keep-alive"
    );
    coord.revoke(grant.id).await.expect("revoke");
    let answer = coord.keep_alive(grant.id).await;
    assert_eq!(answer, Ok(KeepAlive::Expired), "a revoked lease");
    let answer = coord.keep_alive(grant.id ^ 0x5a5a_5a5a).await;
    assert_eq!(answer, Ok(KeepAlive::Expired), "a lease never granted");
}

/// Which tasks have a live run, on which worker; and the spec sizes their
/// factories were given.
#[derive(Clone, Default)]
struct Live(Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>>>);

impl Live {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, Vec<String>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn running(&self) -> usize {
        self.map().values().filter(|on| !on.is_empty()).count()
    }
}

/// A run that counts itself live while its future lives.
struct Sized {
    task: String,
    worker: String,
    live: Live,
}

struct Gone(Live, String, String);

impl Drop for Gone {
    fn drop(&mut self) {
        if let Some(on) = self.0.map().get_mut(&self.1) {
            on.retain(|w| *w != self.2);
        }
    }
}

impl taskstage::Unit for Sized {
    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        self.live
            .map()
            .entry(self.task.clone())
            .or_default()
            .push(self.worker.clone());
        let _gone = Gone(self.live.clone(), self.task.clone(), self.worker.clone());
        ctx.cancelled().await;
        Ok(taskstage::RunExit::Cancelled)
    }
}

/// A worker whose factory refuses a spec of any other size than `size`.
async fn join_sized(cluster: &EtcdCluster, id: &str, size: usize, live: &Live) -> Worker {
    let (worker, live) = (id.to_owned(), live.clone());
    Worker::builder(connect(cluster).await, PREFIX, id)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .capacity(2_000)
        .join(move |spec| {
            if spec.spec.len() != size {
                return Err(format!("a spec of {} bytes, not {size}", spec.spec.len()).into());
            }
            Ok(taskstage::Task::builder(spec.task.as_str()).unit(Sized {
                task: spec.task.as_str().to_owned(),
                worker: worker.clone(),
                live: live.clone(),
            }))
        })
        .await
        .expect("join the test cluster")
}

/// `count` specs of `size` bytes: listed by a controller, claimed and run by two
/// workers, and again after one of them restarts. A listing of them is larger than
/// a message of the client may be (4 MiB), so it is paged by size.
async fn specs_listed_claimed_and_run(count: usize, size: usize) {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let controller = Controller::new(connect(&cluster).await, PREFIX).expect("a controller");
    let names: Vec<String> = (0..count).map(|i| format!("s{i:04}")).collect();
    for (i, task) in names.iter().enumerate() {
        let spec = vec![b'a' + (i % 26) as u8; size];
        controller
            .create(task, spec, DesiredStage::Running)
            .await
            .expect("create a task with a big spec");
    }
    let listed = controller.list().await.expect("a listing of every task");
    assert_eq!(listed.len(), count, "listed");
    let live = Live::default();
    let w1 = join_sized(&cluster, "w1", size, &live).await;
    let w2 = join_sized(&cluster, "w2", size, &live).await;
    eventually(Duration::from_secs(60), "every task runs", || {
        let running = live.running();
        std::future::ready((running == count).then_some(()))
    })
    .await;
    // w1 restarts: its tasks run again, on w2 or on w1's next incarnation.
    w1.shutdown().await.expect("w1 shuts down");
    let w1 = join_sized(&cluster, "w1", size, &live).await;
    eventually(
        Duration::from_secs(60),
        "every task runs after a restart",
        || {
            let running = live.running();
            let map = live.map();
            let on_w1 = map
                .values()
                .filter(|on| on.contains(&"w1".to_owned()))
                .count();
            std::future::ready((running == count && on_w1 > 0).then_some(()))
        },
    )
    .await;
    assert!(
        live.map().values().all(|on| on.len() <= 1),
        "two runs of one task"
    );
    let listed = controller
        .list()
        .await
        .expect("a listing after the restart");
    assert_eq!(listed.len(), count);
    w1.shutdown().await.expect("w1 shuts down");
    w2.shutdown().await.expect("w2 shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_specs_of_120_kib_are_listed_claimed_and_run() {
    specs_listed_claimed_and_run(40, 120 * 1024).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_specs_of_16_kib_are_listed_claimed_and_run() {
    specs_listed_claimed_and_run(1_000, 16 * 1024).await;
}
