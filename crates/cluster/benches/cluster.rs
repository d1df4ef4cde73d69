//! Create → first run through a cluster, beside the floor of the same task spawned
//! locally, in one process (feature `etcd`, the in-memory store).
//!
//! - `cluster_create_to_first_run`: `Controller::create` of a task desired Running,
//!   until its unit's run has begun on the one worker (TTL 20 s, as users run it).
//!   The worker sees the create on its watch, claims the task (a store write), builds
//!   it through the factory and resumes it; nothing is polled.
//! - `local_spawn_to_first_run`: `Task::builder(..).spawn()` of the same unit, until
//!   its run has begun: what the task costs with no store in between.
//!
//!
//! Only that span is timed: each task is stopped afterwards, untimed, so the number
//! of live runs stays at zero between iterations. The store itself costs nothing
//! here (no network, no disk); `crates/cluster/tests/cluster_faults.rs`'s
//! `figures_create_to_first_run_at_the_ttl_users_run` gives the same span on a
//! real 3-member etcd (docs/cluster.md).
//!
//! A second group, `pause_through_a_store`, counts the store round trips on a
//! pause's path: every read, write and watch opening of the controller and the
//! worker waits 1 ms before the in-memory store answers it (a round trip to a
//! store on the same machine under load), so a pause takes about as many
//! milliseconds as it has round trips in sequence.
//! - `cluster_pause_1ms_per_call`: `Controller::pause_within` of a running task,
//!   until the owner's report of Paused has come back; the resume after it is not
//!   timed.
//! - `local_pause`: `Handle::pause_within` of the same unit, running locally.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use taskstage_cluster::{
    BoxFuture, ClusterError, Controller, Coordinator, DesiredStage, Grant, KeepAlive, Listing,
    MemoryCoordinator, SqliteCoordinator, Txn, TxnResult, WatchStream, Worker,
};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use taskstage_harness::pass_to_store;

/// The TTL of the bench's worker: one users run.
const TTL: Duration = Duration::from_secs(20);

/// How long one create may take to reach its run before the bench fails.
const BOUND: Duration = Duration::from_secs(10);

/// A unit that signals `started` as its run begins, then waits for its
/// cancellation.
struct Started(Arc<Semaphore>);

impl Unit for Started {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.add_permits(1);
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Waits for one run to begin, failing the bench after [`BOUND`].
async fn started(runs: &Semaphore, what: &str) {
    tokio::time::timeout(BOUND, runs.acquire())
        .await
        .unwrap_or_else(|_| panic!("{what}: no run began within {BOUND:?}"))
        .expect("the semaphore is never closed")
        .forget();
}

/// A worker and a controller on one in-memory store.
struct Cluster {
    controller: Controller,
    worker: Worker,
    runs: Arc<Semaphore>,
    next: AtomicU64,
}

impl Cluster {
    async fn new() -> Cluster {
        Cluster::on(MemoryCoordinator::new()).await
    }

    /// A worker and a controller on `store`.
    async fn on(store: impl Coordinator + Clone) -> Cluster {
        let runs = Arc::new(Semaphore::new(0));
        let signal = Arc::clone(&runs);
        let worker = Worker::builder(store.clone(), "bench", "w1")
            .ttl(TTL)
            .capacity(1_000_000)
            .join(move |spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Started(Arc::clone(&signal))))
            })
            .await
            .expect("join the in-memory store");
        Cluster {
            controller: Controller::new(store, "bench").expect("a controller"),
            worker,
            runs,
            next: AtomicU64::new(0),
        }
    }

    /// `iters` creates, each timed until its run began; each task is stopped after.
    async fn creates(&self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let task = format!("c{}", self.next.fetch_add(1, Ordering::Relaxed));
            let asked = Instant::now();
            self.controller
                .create(&task, Vec::new(), DesiredStage::Running)
                .await
                .expect("create");
            started(&self.runs, &task).await;
            total += asked.elapsed();
            self.controller
                .stop_within(&task, BOUND)
                .await
                .expect("the task stops");
        }
        total
    }
}

/// `iters` local spawns, each timed until its run began; each task is stopped after.
async fn spawns(iters: u64) -> Duration {
    let runs = Arc::new(Semaphore::new(0));
    let mut total = Duration::ZERO;
    for i in 0..iters {
        let asked = Instant::now();
        let handle = Task::builder(format!("l{i}"))
            .unit(Started(Arc::clone(&runs)))
            .spawn()
            .expect("spawn");
        started(&runs, "a local task").await;
        total += asked.elapsed();
        let stage = handle.stop_within(BOUND).await.expect("the task stops");
        assert_eq!(stage, Stage::Stopped);
    }
    total
}

fn create_to_first_run(c: &mut Criterion) {
    let rt = runtime();
    let cluster = rt.block_on(Cluster::new());
    let mut group = c.benchmark_group("create_to_first_run");
    group.bench_function("cluster_create_to_first_run", |b| {
        b.iter_custom(|iters| rt.block_on(cluster.creates(iters)))
    });
    group.bench_function("local_spawn_to_first_run", |b| {
        b.iter_custom(|iters| rt.block_on(spawns(iters)))
    });
    group.finish();
    rt.block_on(async {
        cluster
            .worker
            .shutdown()
            .await
            .expect("the worker shuts down");
    });
}

/// How long each store call of `pause_through_a_store` waits before it is served.
const CALL: Duration = Duration::from_millis(1);

/// The in-memory store, with [`CALL`] before every read, write and watch opening.
#[derive(Clone)]
struct Distant {
    store: MemoryCoordinator,
}

impl Coordinator for Distant {
    pass_to_store!(grant, keep_alive, revoke, wait_change);

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            tokio::time::sleep(CALL).await;
            self.store.list(prefix).await
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            tokio::time::sleep(CALL).await;
            self.store.txn(txn).await
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            tokio::time::sleep(CALL).await;
            self.store.watch(prefix, from).await
        })
    }
}

/// `iters` cluster-wide pauses of one running task, each timed until answered;
/// each is resumed after, untimed.
async fn cluster_pauses(controller: &Controller, runs: &Semaphore, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let asked = Instant::now();
        let paused = controller.pause_within("p", BOUND).await.expect("pause");
        total += asked.elapsed();
        assert_eq!(paused.stage, Stage::Paused);
        controller.resume_within("p", BOUND).await.expect("resume");
        started(runs, "the resumed task").await;
    }
    total
}

/// `iters` local pauses of one running task, each timed; each is resumed after,
/// untimed.
async fn local_pauses(handle: &taskstage::Handle, runs: &Semaphore, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let asked = Instant::now();
        let stage = handle.pause_within(BOUND).await.expect("pause");
        total += asked.elapsed();
        assert_eq!(stage, Stage::Paused);
        handle.resume_within(BOUND).await.expect("resume");
        started(runs, "the resumed local task").await;
    }
    total
}

fn pause_through_a_store(c: &mut Criterion) {
    let rt = runtime();
    let runs = Arc::new(Semaphore::new(0));
    let (controller, worker, handle) = rt.block_on(async {
        let store = Distant {
            store: MemoryCoordinator::new(),
        };
        let signal = Arc::clone(&runs);
        let worker = Worker::builder(store.clone(), "pause", "w1")
            .ttl(TTL)
            .join(move |spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Started(Arc::clone(&signal))))
            })
            .await
            .expect("join the store");
        let controller = Controller::new(store, "pause").expect("a controller");
        controller
            .create("p", Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
        started(&runs, "the cluster's task").await;
        let handle = Task::builder("local")
            .unit(Started(Arc::clone(&runs)))
            .spawn()
            .expect("spawn");
        started(&runs, "the local task").await;
        (controller, worker, handle)
    });
    let mut group = c.benchmark_group("pause_through_a_store");
    group.bench_function("cluster_pause_1ms_per_call", |b| {
        b.iter_custom(|iters| rt.block_on(cluster_pauses(&controller, &runs, iters)))
    });
    group.bench_function("local_pause", |b| {
        b.iter_custom(|iters| rt.block_on(local_pauses(&handle, &runs, iters)))
    });
    group.finish();
    rt.block_on(async {
        worker.shutdown().await.expect("the worker shuts down");
        handle
            .stop_within(BOUND)
            .await
            .expect("the local task stops");
    });
}

/// The store file beside the in-memory store, each with a worker and a controller
/// in this process: create → first run, and a pause of a running task, answered.
/// The tasks running beside the paused one in `the_file_beside_memory`'s pauses: the
/// size the goal names.
const RUNNING: usize = 1_000;

/// A memory and a file cluster (the file in `dir`), each with a task "p" running
/// and `others` more running beside it.
fn file_and_memory(rt: &Runtime, dir: &std::path::Path, others: usize) -> [Cluster; 2] {
    rt.block_on(async {
        let file = SqliteCoordinator::open(dir.join(format!("store-{others}.db")))
            .await
            .expect("a store file");
        let pair = [
            Cluster::on(MemoryCoordinator::new()).await,
            Cluster::on(file).await,
        ];
        for cluster in &pair {
            for i in 0..=others {
                let task = if i == 0 {
                    "p".to_owned()
                } else {
                    format!("r{i}")
                };
                cluster
                    .controller
                    .create(&task, Vec::new(), DesiredStage::Running)
                    .await
                    .expect("create");
            }
            for _ in 0..=others {
                started(&cluster.runs, "a task beside the paused one").await;
            }
        }
        pair
    })
}

fn the_file_beside_memory(c: &mut Criterion) {
    let rt = runtime();
    let dir = std::env::temp_dir().join(format!("taskstage-bench-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let mut group = c.benchmark_group("the_file_beside_memory");
    // Each measurement on clusters of its own: the creates leave thousands of
    // stopped tasks behind, which the pauses must not meet.
    let [memory, file] = file_and_memory(&rt, &dir, 0);
    group.bench_function("memory_create_to_first_run", |b| {
        b.iter_custom(|iters| rt.block_on(memory.creates(iters)))
    });
    group.bench_function("file_create_to_first_run", |b| {
        b.iter_custom(|iters| rt.block_on(file.creates(iters)))
    });
    let mut clusters = vec![memory, file];
    let [memory, file] = file_and_memory(&rt, &dir, RUNNING - 1);
    group.bench_function("memory_pause_at_1000_running", |b| {
        b.iter_custom(|iters| rt.block_on(cluster_pauses(&memory.controller, &memory.runs, iters)))
    });
    group.bench_function("file_pause_at_1000_running", |b| {
        b.iter_custom(|iters| rt.block_on(cluster_pauses(&file.controller, &file.runs, iters)))
    });
    group.finish();
    clusters.extend([memory, file]);
    rt.block_on(async {
        for cluster in clusters {
            cluster
                .worker
                .shutdown()
                .await
                .expect("the worker shuts down");
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(
    benches,
    create_to_first_run,
    pause_through_a_store,
    the_file_beside_memory
);
criterion_main!(benches);
