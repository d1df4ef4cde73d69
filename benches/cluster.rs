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
//! Only that span is timed: each task is stopped afterwards, untimed, so the number
//! of live runs stays at zero between iterations. The store itself costs nothing
//! here (no network, no disk); `tests/cluster_faults.rs`'s
//! `figures_create_to_first_run_at_the_ttl_users_run` gives the same span on a
//! real 3-member etcd (docs/cluster.md).
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use taskstage::cluster::{Controller, DesiredStage, MemoryCoordinator, Worker};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

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
        let store = MemoryCoordinator::new();
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

criterion_group!(benches, create_to_first_run);
criterion_main!(benches);
