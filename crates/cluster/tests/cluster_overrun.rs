//! The lease off the application's runtime, and the last resort the kernel
//! enforces (docs/cluster.md, "Safety on a busy machine").
//!
//! - Units that keep every thread of the application's runtime busy cost the
//!   worker no lease: its keep-alives go out from its own thread, on the in-memory
//!   store and on a real etcd. The same worker with its lease kept on the shared
//!   runtime (the placement before the lease thread) loses it: the check is not
//!   vacuous.
//! - At the lease deadline the guard stops a task in every stage that is not
//!   terminal (New, Paused, Pausing with a run alive, Resuming with a check alive),
//!   even while the reconcile loop is held up.
//! - A run that cannot be stopped (its unit blocks the only runtime thread) ends
//!   the process with [`OVERRUN_EXIT_CODE`] before the store may expire the lease,
//!   checked from outside: the test binary starts itself again as that process.
//! - Settings that cannot hold the promise are refused at join.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::{ChildGuard, EtcdCluster};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use taskstage_cluster::{
    ClusterError, Controller, Coordinator, DesiredStage, EtcdCoordinator, EtcdOptions,
    LeaseKeeping, MemoryCoordinator, OverrunPolicy, Worker, OVERRUN_EXIT_CODE,
};

const TTL: Duration = Duration::from_secs(2);
const STOP_BOUND: Duration = Duration::from_millis(600);

/// A unit that, once started, blocks its thread for `block` (in short sleeps that
/// never yield to the runtime), then waits for its cancellation.
struct Blocking {
    block: Duration,
    started: Arc<AtomicBool>,
}

impl Unit for Blocking {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.started.store(true, Ordering::SeqCst);
        let end = Instant::now() + self.block;
        // Bounded by `block`.
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// Polls `probe` from a plain thread every 10 ms until it holds, failing after
/// `bound` with `what`.
fn poll_until(bound: Duration, what: &str, mut probe: impl FnMut() -> bool) {
    let end = Instant::now() + bound;
    while !probe() {
        assert!(Instant::now() < end, "not within {bound:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A runtime of `threads` threads for a worker whose units may block them.
fn runtime_of(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The runtime of a worker whose units may block it: one thread, so that one
/// blocking unit keeps every thread of it busy.
fn one_thread_runtime() -> tokio::runtime::Runtime {
    runtime_of(1)
}

/// Joins a worker on `runtime` whose one task "t" blocks that runtime's only
/// thread for three TTLs once it runs, and returns once the block has begun.
fn join_blocked<C: Coordinator + Clone>(
    runtime: &tokio::runtime::Runtime,
    store: C,
    prefix: &str,
    keeping: LeaseKeeping,
) -> Worker {
    let started = Arc::new(AtomicBool::new(false));
    let worker = runtime.block_on(async {
        let controller = Controller::new(store.clone(), prefix).expect("a controller");
        controller
            .create("t", Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
        let started = Arc::clone(&started);
        Worker::builder(store, prefix, "w1")
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .lease_keeping(keeping)
            // The test is about the lease being kept; under the shared runtime the
            // run does outlive the lease, and ending this test binary would hide it.
            .on_overrun(OverrunPolicy::LogOnly)
            .join(move |spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Blocking {
                    block: TTL * 3,
                    started: Arc::clone(&started),
                }))
            })
            .await
            .expect("join")
    });
    poll_until(Duration::from_secs(10), "the blocking run starts", || {
        started.load(Ordering::SeqCst)
    });
    worker
}

/// Whether `lease` stayed alive on the in-memory store while the worker's only
/// runtime thread was blocked for three TTLs.
fn memory_lease_kept_while_blocked(keeping: LeaseKeeping) -> bool {
    let store = MemoryCoordinator::new();
    let runtime = one_thread_runtime();
    let worker = join_blocked(&runtime, store.clone(), "blocked", keeping);
    let lease = worker.lease();
    let end = Instant::now() + TTL * 3 - Duration::from_millis(200);
    let mut kept = true;
    // Bounded by `end`: three TTLs.
    while Instant::now() < end {
        kept &= store.leases().contains(&lease);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(worker);
    runtime.shutdown_timeout(Duration::from_secs(5));
    kept
}

#[test]
fn units_blocking_every_runtime_thread_cost_no_lease() {
    assert!(
        memory_lease_kept_while_blocked(LeaseKeeping::OwnThread),
        "the lease was lost while the units blocked the application's runtime"
    );
}

/// The placement before the lease thread, through the same check: the check
/// notices a keep-alive that waits for the application's runtime.
#[test]
fn with_the_lease_on_the_shared_runtime_the_same_block_costs_the_lease() {
    assert!(
        !memory_lease_kept_while_blocked(LeaseKeeping::SharedRuntime),
        "the check passed a lease kept on the blocked runtime: it is vacuous"
    );
}

/// Whether the worker's membership key, attached to its lease, stayed on a real
/// etcd while the worker's only runtime thread was blocked for three TTLs (read
/// from another runtime, on a connection of the test's own), and whether its stop
/// deadline stayed ahead all that time (no keep-alive missed its own deadline).
fn etcd_lease_kept_while_blocked(cluster: &EtcdCluster, keeping: LeaseKeeping) -> (bool, bool) {
    let prefix = match keeping {
        LeaseKeeping::SharedRuntime => "shared",
        _ => "own",
    };
    let runtime = one_thread_runtime();
    let coord = runtime
        .block_on(EtcdCoordinator::connect(
            cluster.endpoints(),
            EtcdOptions::default(),
        ))
        .expect("connect the worker");
    let worker = join_blocked(&runtime, coord, prefix, keeping);
    let reader_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let kept = reader_runtime.block_on(async {
        let reader = EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
            .await
            .expect("connect the reader");
        let end = tokio::time::Instant::now() + TTL * 3 - Duration::from_millis(200);
        let (mut kept, mut ahead) = (true, true);
        // Bounded by `end`: three TTLs.
        while tokio::time::Instant::now() < end {
            let listing = reader
                .list(format!("{prefix}/workers/"))
                .await
                .expect("read the membership keys");
            kept &= listing.kvs.iter().any(|kv| kv.lease == worker.lease());
            ahead &= worker
                .stop_deadline()
                .is_some_and(|at| at.into_std() > Instant::now());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (kept, ahead)
    });
    drop(worker);
    runtime.shutdown_timeout(Duration::from_secs(5));
    kept
}

#[test]
fn on_etcd_units_blocking_every_runtime_thread_cost_no_lease_and_shared_they_do() {
    let Some(cluster) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    let (kept, ahead) = etcd_lease_kept_while_blocked(&cluster, LeaseKeeping::OwnThread);
    assert!(
        kept,
        "the lease was lost on etcd while the units blocked the application's runtime"
    );
    assert!(
        ahead,
        "the stop deadline was reached on etcd while the units blocked the application's \
         runtime: a keep-alive waited for that runtime (its connection's I/O runs there?)"
    );
    let (kept, _) = etcd_lease_kept_while_blocked(&cluster, LeaseKeeping::SharedRuntime);
    assert!(
        !kept,
        "the check passed a lease kept on the blocked runtime: it is vacuous"
    );
}

// ------------------------------------------------------- every stage at the deadline

/// How a [`Staged`] unit behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Manner {
    /// Its run returns at its cancellation.
    Polite,
    /// Its run ignores its cancellation (but yields: an abort drops it).
    Stubborn,
    /// Its check never passes (but yields).
    HangingCheck,
}

/// A unit of the given manner; `alive` counts its live runs and checks.
struct Staged {
    manner: Manner,
    alive: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts one live run or check while it exists.
struct Live(Arc<std::sync::atomic::AtomicUsize>);

impl Live {
    fn new(alive: &Arc<std::sync::atomic::AtomicUsize>) -> Live {
        alive.fetch_add(1, Ordering::SeqCst);
        Live(Arc::clone(alive))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Unit for Staged {
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        if self.manner == Manner::HangingCheck {
            let _live = Live::new(&self.alive);
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let _live = Live::new(&self.alive);
        if self.manner == Manner::Polite {
            ctx.cancelled().await;
            return Ok(RunExit::Cancelled);
        }
        // Ignores the cancellation; bounded by a minute all the same.
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(RunExit::Completed)
    }
}

/// At the deadline the guard stops the tasks in New, Paused, Pausing (a run alive
/// that ignores its cancellation) and Resuming (a check alive), not only Running,
/// while a blocking factory holds the reconcile loop (which would fence them too):
/// within the stop bound after the deadline each is Stopped and no run or check is
/// alive, before the overrun policy would act.
#[test]
fn the_guard_stops_every_stage_at_the_deadline_while_the_loop_is_held_up() {
    let store = MemoryCoordinator::new();
    let runtime = runtime_of(2);
    let alive = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let controller = Controller::new(store.clone(), "stages").expect("a controller");
    let worker = runtime.block_on(async {
        let alive = Arc::clone(&alive);
        let worker = Worker::builder(store.clone(), "stages", "w1")
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .on_overrun(OverrunPolicy::LogOnly)
            .join(move |spec| {
                let manner = match spec.task.as_str() {
                    "slow" => {
                        // User code that blocks the reconcile loop well past the
                        // deadline.
                        std::thread::sleep(Duration::from_secs(4));
                        Manner::Polite
                    }
                    "pausing" => Manner::Stubborn,
                    "resuming" => Manner::HangingCheck,
                    _ => Manner::Polite,
                };
                Ok(Task::builder(spec.task.as_str()).unit(Staged {
                    manner,
                    alive: Arc::clone(&alive),
                }))
            })
            .await
            .expect("join");
        for (task, desired) in [
            ("new", DesiredStage::Paused),
            ("paused", DesiredStage::Running),
            ("pausing", DesiredStage::Running),
            ("resuming", DesiredStage::Running),
        ] {
            controller
                .create(task, Vec::new(), desired)
                .await
                .expect("create");
        }
        worker
    });
    let stage = |task: &str| {
        let id = taskstage_cluster::TaskId::new(task).expect("a task id");
        worker.observer(&id).map(|o| o.stage())
    };
    let reached = |task: &str, want: Stage| {
        poll_until(
            Duration::from_secs(10),
            &format!("{task} reaches {want}"),
            || stage(task) == Some(want),
        );
    };
    reached("new", Stage::New);
    reached("paused", Stage::Running);
    reached("pausing", Stage::Running);
    reached("resuming", Stage::Resuming);
    runtime.block_on(async {
        for task in ["paused", "pausing"] {
            controller
                .set_desired(task, DesiredStage::Paused)
                .await
                .expect("pause");
        }
    });
    reached("paused", Stage::Paused);
    reached("pausing", Stage::Pausing);
    // No keep-alive is answered from now on: the deadline stays where it is.
    store.fail_keep_alives(worker.lease(), true);
    let deadline = worker.stop_deadline().expect("a lease deadline");
    runtime.block_on(async {
        controller
            .create("slow", Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    });
    let limit = deadline.into_std() + STOP_BOUND;
    // Bounded by `limit` (and a margin for this thread's own wake-up).
    poll_until(
        limit.saturating_duration_since(Instant::now()) + Duration::from_millis(100),
        "every task Stopped and no run or check alive within the stop bound after the deadline",
        || {
            ["new", "paused", "pausing", "resuming"]
                .iter()
                .all(|t| stage(t) == Some(Stage::Stopped))
                && alive.load(Ordering::SeqCst) == 0
        },
    );
    drop(worker);
    runtime.shutdown_timeout(Duration::from_secs(5));
}

// ------------------------------------------------------------ the last resort

/// The variable that makes [`overrun_process`] a worker process.
const CHILD: &str = "TASKSTAGE_OVERRUN_CHILD";

/// The process of the overrun tests below: the test binary started again with
/// [`CHILD`] set to how the worker leaves (`lost`, `shutdown`, `crash`, `drop`). A
/// worker on the in-memory store whose one run blocks the only runtime thread for a
/// minute; once it runs, keep-alives fail (so the lease's deadlines stay where the
/// last answer put them), the process prints how long until its stop deadline, then
/// `lost` waits while the lease runs out alive, and the others shut the worker down,
/// crash it or drop it at once. The guard's stop cannot reach the run; at `exit_at`
/// the process must end with [`OVERRUN_EXIT_CODE`]. If it is still here after 20 s
/// it exits 0, which the tests take as a failure.
#[test]
#[ignore = "a worker process of the overrun test, started by it"]
fn overrun_process() {
    let Some(mode) = std::env::var_os(CHILD) else {
        return;
    };
    let store = MemoryCoordinator::new();
    let runtime = one_thread_runtime();
    let started = Arc::new(AtomicBool::new(false));
    let worker = runtime.block_on(async {
        let controller = Controller::new(store.clone(), "overrun").expect("a controller");
        controller
            .create("blocked-task", Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
        let started = Arc::clone(&started);
        Worker::builder(store.clone(), "overrun", "w1")
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .join(move |spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Blocking {
                    block: Duration::from_secs(60),
                    started: Arc::clone(&started),
                }))
            })
            .await
            .expect("join")
    });
    poll_until(Duration::from_secs(10), "the blocking run starts", || {
        started.load(Ordering::SeqCst)
    });
    store.fail_keep_alives(worker.lease(), true);
    let deadline = worker.stop_deadline().expect("a lease deadline");
    let stop_in = deadline
        .into_std()
        .saturating_duration_since(Instant::now());
    println!("stop_in_ms={}", stop_in.as_millis());
    match mode.to_str() {
        Some("lost") => {}
        // Each waits for the run, which never returns: the guard must end the
        // process meanwhile.
        Some("shutdown") => {
            let _ = runtime.block_on(worker.shutdown());
        }
        Some("crash") => runtime.block_on(worker.crash()),
        Some("drop") => drop(worker),
        other => panic!("{CHILD}={other:?}: not a way for a worker to leave"),
    }
    std::thread::sleep(Duration::from_secs(20));
    std::process::exit(0);
}

#[test]
fn a_run_that_cannot_be_stopped_ends_the_process_before_the_lease_may_expire() {
    an_overrun_ends_the_process("lost");
}

/// After a clean shutdown the guard keeps watching the run it left: one still alive
/// at the last instant the lease allows is an overrun, as for a worker alive.
#[test]
fn a_run_left_by_a_shutdown_that_cannot_be_stopped_ends_the_process_in_time() {
    an_overrun_ends_the_process("shutdown");
}

/// The same after a crash (`Worker::crash`: loops aborted, runs aborted).
#[test]
fn a_run_left_by_a_crash_that_cannot_be_stopped_ends_the_process_in_time() {
    an_overrun_ends_the_process("crash");
}

/// The same after the worker is dropped.
#[test]
fn a_run_left_by_a_dropped_worker_that_cannot_be_stopped_ends_the_process_in_time() {
    an_overrun_ends_the_process("drop");
}

/// Starts [`overrun_process`] in `mode` and checks that it ends with
/// [`OVERRUN_EXIT_CODE`], naming the task, after its stop deadline and before the
/// store may expire the lease.
fn an_overrun_ends_the_process(mode: &str) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args(["--exact", "overrun_process", "--ignored", "--nocapture"])
        .env(CHILD, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker process");
    let stdout = child.stdout.take().expect("its stdout");
    let mut stderr = child.stderr.take().expect("its stderr");
    // Kills the process by pid if the test fails before it ended.
    let mut child = ChildGuard::new(child);
    let mut lines = BufReader::new(stdout).lines();
    // Bounded: the process prints the line within seconds, or ends its stdout.
    let stop_in = loop {
        let line = lines
            .next()
            .expect("the worker process ended before its deadline line")
            .expect("read its stdout");
        if let Some(ms) = line.strip_prefix("stop_in_ms=") {
            break Duration::from_millis(ms.parse().expect("a number of ms"));
        }
    };
    let told = Instant::now();
    // The earliest instant the store may expire the lease, on this side's clock:
    // the stop deadline is TTL·(1−ρ) − stop bound after the last answered
    // keep-alive was sent, and that was before the line was printed.
    let expiry_bound = told + stop_in + STOP_BOUND;
    let end = told + Duration::from_secs(15);
    // Bounded by `end`.
    let status = loop {
        if let Some(status) = child.try_wait() {
            break status;
        }
        assert!(
            Instant::now() < end,
            "the worker process ({mode}) did not end on the overrun"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let ended = Instant::now();
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    assert_eq!(
        status.code(),
        Some(OVERRUN_EXIT_CODE),
        "the worker process ended otherwise than by the overrun policy: {status}; stderr:\n{err}"
    );
    assert!(
        err.contains("lease overrun") && err.contains("blocked-task"),
        "the exit does not name the task concerned; stderr:\n{err}"
    );
    assert!(
        ended >= told + stop_in,
        "the process ended before its stop deadline: the stop had no chance"
    );
    assert!(
        ended < expiry_bound,
        "the process ended {:?} after the store could expire the lease",
        ended - expiry_bound
    );
}

// ----------------------------------------------------------------- bad settings

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_overrun_margin_not_less_than_the_stop_bound_is_refused_and_nothing_written() {
    let store = MemoryCoordinator::new();
    for margin in [STOP_BOUND, STOP_BOUND * 10] {
        let joined = Worker::builder(store.clone(), "margin", "w1")
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .overrun_margin(margin)
            .lease_keeping(LeaseKeeping::SharedRuntime)
            .join(|spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Blocking {
                    block: Duration::ZERO,
                    started: Arc::new(AtomicBool::new(false)),
                }))
            })
            .await;
        match joined {
            Err(ClusterError::InvalidTiming { reason }) => assert!(
                reason.contains("overrun margin") && reason.contains("stop bound"),
                "the refusal does not say why: {reason}"
            ),
            other => panic!("margin {margin:?} was not refused: {other:?}"),
        }
    }
    assert!(store.leases().is_empty(), "a refused join granted a lease");
    assert!(store.dump().is_empty(), "a refused join wrote a key");
}

/// A stall bound shorter than two store call deadlines would take a loop that waits
/// on one store call for a stalled one: refused, naming both, and nothing written.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stall_bound_under_two_call_deadlines_is_refused_and_nothing_written() {
    let store = MemoryCoordinator::new();
    let op_timeout = Duration::from_millis(500);
    for bound in [
        Duration::ZERO,
        op_timeout,
        2 * op_timeout - Duration::from_millis(1),
    ] {
        let joined = Worker::builder(store.clone(), "stall", "w1")
            .ttl(TTL)
            .op_timeout(op_timeout)
            .stall_bound(bound)
            .lease_keeping(LeaseKeeping::SharedRuntime)
            .join(|spec| {
                Ok(Task::builder(spec.task.as_str()).unit(Blocking {
                    block: Duration::ZERO,
                    started: Arc::new(AtomicBool::new(false)),
                }))
            })
            .await;
        match joined {
            Err(ClusterError::InvalidTiming { reason }) => assert!(
                reason.contains("stall bound") && reason.contains("500ms"),
                "the refusal does not say why: {reason}"
            ),
            other => panic!("stall bound {bound:?} was not refused: {other:?}"),
        }
    }
    assert!(store.leases().is_empty(), "a refused join granted a lease");
    assert!(store.dump().is_empty(), "a refused join wrote a key");
    let joined = Worker::builder(store.clone(), "stall", "w1")
        .ttl(TTL)
        .op_timeout(op_timeout)
        .stall_bound(2 * op_timeout)
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .join(|spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Blocking {
                block: Duration::ZERO,
                started: Arc::new(AtomicBool::new(false)),
            }))
        })
        .await
        .expect("a stall bound of exactly two call deadlines is accepted");
    joined.shutdown().await.expect("shutdown");
}

// ------------------------------------------------------------------ a shutdown

/// A clean shutdown revokes the lease only once every run it stopped is gone: a
/// run that its stop cannot reach (its unit blocks its thread) keeps the lease, so
/// that no other worker is handed the task while it is alive. Under
/// [`OverrunPolicy::LogOnly`] the shutdown returns at the last instant the lease
/// allows, with the lease left to expire.
#[test]
fn a_shutdown_revokes_the_lease_only_once_its_runs_are_gone() {
    let store = MemoryCoordinator::new();
    // Two threads: one for the blocking run, one for the shutdown.
    let runtime = runtime_of(2);
    let worker = join_blocked(&runtime, store.clone(), "down", LeaseKeeping::OwnThread);
    let lease = worker.lease();
    runtime
        .block_on(worker.shutdown())
        .expect("a shutdown whose run outlived it is not an error of the store");
    assert!(
        store.leases().contains(&lease),
        "the lease was revoked while a run of the worker was still alive"
    );
    runtime.shutdown_timeout(Duration::from_secs(10));
}
