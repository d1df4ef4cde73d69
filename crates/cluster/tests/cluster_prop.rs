//! Property tests of the real worker and controller code on the in-memory store
//! (`MemoryCoordinator`, behind the same `Coordinator` trait as the etcd one).
//!
//! Each case runs up to 3 workers and 2 tasks on a current-thread runtime with
//! tokio's paused clock (leases, keep-alives and deadlines elapse deterministically
//! and at once), through a random sequence of up to 24 steps: desired-stage changes,
//! keep-alives that fail for a while (so the lease is lost for real: the worker
//! fences itself, the store expires the lease, another worker takes over), crashes,
//! restarts under the same worker id, clean shutdowns, an unreachable store, and
//! pauses of the test's clock; and, for the watched cache, watches cut (every
//! worker lists again), a compaction (a lagging watch ends and its worker lists
//! again), watch deliveries delayed (the caches lag) and sent twice. Only the first
//! 1 to 3 workers join at the start; the others join late, at a restart step, so
//! the shares change and tasks are handed over. Faults are part of the generated
//! sequence.
//!
//! Checked all along, by probes inside the units and between steps:
//! - no two runs of a task are ever alive at once (drop guards in the run futures);
//! - every fenced checkpoint write that the store accepted was made with the token
//!   that owned the task at that instant, and checkpoints only grow (each run
//!   resumes from the last accepted one);
//! - an observed status that claims a rest (no run) for the current desired
//!   revision is true: no run of the task is alive (checked between steps, and
//!   at every run's start against the store's current report).
//!
//! After the faults stop (every worker restarted, the store healed), every task's
//! current owner must answer its desired revision within 60 s of virtual time, and
//! exactly one run must be alive for each task desired Running, none otherwise.
//!
//! 1,000 cases by default (about 26 s in debug on two cores; `PROPTEST_CASES`
//! overrides). A report that lied after a hand-over met an outage (a rebuild under
//! the same token forgot the rest report it had sent) was found from outside at
//! 1,000 cases in 2 runs of 3 and never at 128. With that defect planted again
//! (mutant 117), 1,000 cases did not find it in 3 runs here: the deterministic test
//! `cluster_promises::what_was_sent_under_a_token_outlives_a_rebuild_under_the_same_token`
//! is what holds it.
//!
//! Beside them, plain tests: 30 tasks on 3 workers, a 4th joins and gets its share
//! (7 or 8 each) by hand-over with no task stopped or failed and never two runs;
//! three reproducers of defects the stateright model found in the worker as first
//! written for the cache, each seen to fail before its fix (a hand-over given up
//! after its Paused report; a release whose answer is lost; a late claim that runs
//! a stopped task from a lagging cache);
//! a pause nobody can answer, and one stuck on a run
//! that ignores cancellation, time out with an error naming the task, its owner and
//! the stage it is stuck in; a stop then escalates to abort and is answered. Each case must end
//! within 30 s of real time.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use taskstage::{RunContext, RunError, RunExit, Task, TaskBuilder, Unit};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, Fencer, LeaseKeeping, MemoryCoordinator, TaskId,
    TaskSpec, Worker,
};

const PREFIX: &str = "prop";
const TASKS: [&str; 2] = ["alpha", "beta"];
const WORKERS: [&str; 3] = ["w0", "w1", "w2"];

/// What the probes saw.
#[derive(Default)]
struct Registry {
    next_run: u64,
    alive: HashMap<String, Vec<u64>>,
    checkpoint: HashMap<String, u64>,
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Registry>>;

fn lock(reg: &Shared) -> std::sync::MutexGuard<'_, Registry> {
    reg.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct AliveGuard {
    reg: Shared,
    task: String,
    run: u64,
}

impl Drop for AliveGuard {
    fn drop(&mut self) {
        let mut reg = lock(&self.reg);
        if let Some(runs) = reg.alive.get_mut(&self.task) {
            runs.retain(|r| *r != self.run);
        }
    }
}

struct Probe {
    task: String,
    fencer: Fencer,
    reg: Shared,
    store: MemoryCoordinator,
}

impl Probe {
    /// Called right after the store accepted a fenced write: nothing else ran in
    /// between (the in-memory store answers without yielding, on one thread).
    fn check_accepted(&self, value: u64) {
        let owner_key = format!("{PREFIX}/tasks/{}/owner", self.task);
        let token = self.fencer.token();
        let owner = self.store.dump().into_iter().find(|kv| kv.key == owner_key);
        let mut reg = lock(&self.reg);
        match owner {
            Some(kv) if kv.create_revision == token.revision => {}
            other => reg.violations.push(format!(
                "a write by {} (token {}) was accepted while the owner key is {:?}",
                token.worker, token.revision, other
            )),
        }
        let last = reg.checkpoint.insert(self.task.clone(), value).unwrap_or(0);
        if value <= last {
            reg.violations.push(format!(
                "checkpoint of {} went from {last} to {value}",
                self.task
            ));
        }
    }
}

impl Probe {
    /// Called as a run starts, before it yields: the report the task's current
    /// owner published must not claim a rest for the current desired revision,
    /// since a run is alive from now on (an observed stage never claims more than
    /// is true). Reads the store without yielding, so nothing runs in between.
    fn check_start(&self, run: u64) {
        let kvs = self.store.dump();
        let key = |name: &str| format!("{PREFIX}/tasks/{}/{name}", self.task);
        let find = |name: &str| kvs.iter().find(|kv| kv.key == key(name));
        let (Some(owner), Some(desired), Some(observed)) =
            (find("owner"), find("desired"), find("observed"))
        else {
            return;
        };
        let text = String::from_utf8_lossy(&observed.value);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_default()
                .to_owned()
        };
        let stage = taskstage::Stage::ALL
            .into_iter()
            .find(|s| s.name() == field("stage"));
        let current = field("owner_revision") == owner.create_revision.to_string();
        let answers = field("desired_revision") == desired.mod_revision.to_string();
        let stopped = desired.value == DesiredStage::Stopped.to_string().as_bytes();
        if stopped && answers && stage == Some(taskstage::Stage::Stopped) {
            lock(&self.reg).violations.push(format!(
                "run {run} of {} started after its stop was answered (desired revision {})",
                self.task, desired.mod_revision
            ));
        }
        if current && answers && stage.is_some_and(taskstage::Stage::is_at_rest) {
            lock(&self.reg).violations.push(format!(
                "run {run} of {} started while its owner's report says {} for the current desired revision {}",
                self.task,
                field("stage"),
                desired.mod_revision
            ));
        }
    }
}

impl Unit for Probe {
    fn name(&self) -> &str {
        "probe"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let run = {
            let mut reg = lock(&self.reg);
            reg.next_run += 1;
            let run = reg.next_run;
            let alive = reg.alive.entry(self.task.clone()).or_default();
            let before = alive.clone();
            alive.push(run);
            if !before.is_empty() {
                let msg = format!("run {run} of {} started while {before:?} alive", self.task);
                reg.violations.push(msg);
            }
            run
        };
        self.check_start(run);
        let _guard = AliveGuard {
            reg: Arc::clone(&self.reg),
            task: self.task.clone(),
            run,
        };
        // Resume from the last accepted checkpoint; while the store is unreachable,
        // try again every 100 ms (bounded by the run's cancellation: a run that
        // cannot read is still a run, and is stopped like any other).
        let mut at: u64 = loop {
            match self.fencer.checkpoint("pos").await {
                Ok(Some(bytes)) => break String::from_utf8_lossy(&bytes).parse().unwrap_or(0),
                Ok(None) => break 0,
                Err(_) => {}
            }
            tokio::select! {
                _ = ctx.cancelled() => return Ok(RunExit::Cancelled),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        };
        // Bounded by the test's virtual deadline: every turn is 100 ms of it.
        loop {
            tokio::select! {
                _ = ctx.cancelled() => return Ok(RunExit::Cancelled),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            match self
                .fencer
                .put_checkpoint("pos", (at + 1).to_string().into_bytes())
                .await
            {
                Ok(()) => {
                    at += 1;
                    self.check_accepted(at);
                }
                Err(ClusterError::Fenced { .. }) => {
                    // Deposed: the worker stops this run; wait for it.
                    ctx.cancelled().await;
                    return Ok(RunExit::Cancelled);
                }
                Err(_) => {} // unreachable for now: try again next turn
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Desire(usize, DesiredStage),
    FailKeepAlives(usize, u64),
    Crash(usize),
    /// Joins the worker if it is not running: after a crash, or for the first
    /// time (a worker that joins late, so that shares change and tasks are
    /// handed over).
    Restart(usize),
    Shutdown(usize),
    Unreachable(u64),
    Wait(u64),
    /// Every open watch is lost: each worker lists again.
    CutWatches,
    /// The store compacts its history: a watch that lags behind it ends.
    Compact,
    /// Every watch delivery waits this long from now on (0: none).
    WatchDelay(u64),
    /// Every watch delivery is sent twice from now on (or once again).
    DuplicateEvents(bool),
}

fn step() -> impl Strategy<Value = Step> {
    let stage = prop_oneof![
        4 => Just(DesiredStage::Running),
        3 => Just(DesiredStage::Paused),
        1 => Just(DesiredStage::Stopped),
    ];
    prop_oneof![
        6 => (0..TASKS.len(), stage).prop_map(|(t, s)| Step::Desire(t, s)),
        2 => (0..WORKERS.len(), 200u64..4_000).prop_map(|(w, ms)| Step::FailKeepAlives(w, ms)),
        2 => (0..WORKERS.len()).prop_map(Step::Crash),
        2 => (0..WORKERS.len()).prop_map(Step::Restart),
        1 => (0..WORKERS.len()).prop_map(Step::Shutdown),
        1 => (100u64..3_000).prop_map(Step::Unreachable),
        4 => (10u64..3_000).prop_map(Step::Wait),
        1 => Just(Step::CutWatches),
        1 => Just(Step::Compact),
        1 => prop_oneof![Just(0u64), 10u64..1_500].prop_map(Step::WatchDelay),
        1 => any::<bool>().prop_map(Step::DuplicateEvents),
    ]
}

fn factory(
    reg: Shared,
    store: MemoryCoordinator,
) -> impl Fn(TaskSpec) -> Result<TaskBuilder, taskstage_cluster::FactoryError> + Send + Sync + 'static
{
    move |spec: TaskSpec| {
        Ok(Task::builder(spec.task.as_str()).unit(Probe {
            task: spec.task.as_str().to_owned(),
            fencer: spec.fencer,
            reg: Arc::clone(&reg),
            store: store.clone(),
        }))
    }
}

async fn join(store: &MemoryCoordinator, id: &str, reg: &Shared) -> Worker {
    Worker::builder(store.clone(), PREFIX, id)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(factory(Arc::clone(reg), store.clone()))
        .await
        .expect("join on a reachable in-memory store")
}

/// Observed-truthfulness, checked between steps.
async fn check_observed(controller: &Controller, reg: &Shared) {
    for task in TASKS {
        let Ok(status) = controller.status(task).await else {
            continue;
        };
        let Some(observed) = status.current_observed() else {
            continue;
        };
        if observed.desired_revision == status.desired_revision && observed.stage.is_at_rest() {
            let alive = lock(reg).alive.get(task).cloned().unwrap_or_default();
            if !alive.is_empty() {
                lock(reg).violations.push(format!(
                    "{task}: observed {} for the current desired revision while runs {alive:?} are alive",
                    observed.stage
                ));
            }
        }
    }
}

async fn run_case(first: usize, steps: Vec<Step>) -> Result<(), String> {
    if std::env::var_os("CLUSTER_TRACE").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("taskstage=debug")
            .with_test_writer()
            .try_init();
    }
    let store = MemoryCoordinator::new();
    let reg: Shared = Arc::default();
    let controller = Controller::new(store.clone(), PREFIX).map_err(|e| e.to_string())?;
    for task in TASKS {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .map_err(|e| e.to_string())?;
    }
    // The first `first` workers join now; the others only when a step restarts
    // them (or when the faults stop): they join late and get their share by
    // hand-over.
    let mut workers: Vec<Option<Worker>> = Vec::new();
    for (w, id) in WORKERS.into_iter().enumerate() {
        workers.push(if w < first {
            Some(join(&store, id, &reg).await)
        } else {
            None
        });
    }
    let mut desired: Vec<DesiredStage> = vec![DesiredStage::Running; TASKS.len()];
    for step in steps {
        match step {
            Step::Desire(t, stage) => {
                match controller.set_desired(TASKS[t], stage).await {
                    Ok(_) => desired[t] = stage,
                    Err(ClusterError::Stopped { .. }) => {} // stopped is final
                    Err(e) => return Err(format!("set_desired: {e}")),
                }
            }
            Step::FailKeepAlives(w, ms) => {
                if let Some(worker) = &workers[w] {
                    store.fail_keep_alives(worker.lease(), true);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    store.fail_keep_alives(worker.lease(), false);
                }
            }
            Step::Crash(w) => {
                if let Some(worker) = workers[w].take() {
                    worker.crash().await;
                }
            }
            Step::Restart(w) => {
                if workers[w].as_ref().is_none_or(Worker::is_finished) {
                    workers[w] = Some(join(&store, WORKERS[w], &reg).await);
                }
            }
            Step::Shutdown(w) => {
                if let Some(worker) = workers[w].take() {
                    // A lost lease is a legitimate answer here.
                    let _ = worker.shutdown().await;
                }
            }
            Step::Unreachable(ms) => {
                store.set_unreachable(true);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                store.set_unreachable(false);
            }
            Step::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::CutWatches => store.cut_watches(),
            Step::Compact => store.compact(),
            Step::WatchDelay(ms) => store.set_watch_delay(Duration::from_millis(ms)),
            Step::DuplicateEvents(twice) => store.set_duplicate_watch_events(twice),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        check_observed(&controller, &reg).await;
        let violations = std::mem::take(&mut lock(&reg).violations);
        if !violations.is_empty() {
            return Err(violations.join("\n"));
        }
    }

    // Faults stop: the store healed, and every worker that is gone (crashed, shut
    // down, or ended by a lease lost during the faults, which may happen a moment
    // from now) is joined again, on every turn of the wait below.
    store.set_unreachable(false);
    store.set_watch_delay(Duration::ZERO);
    store.set_duplicate_watch_events(false);
    for (t, task) in TASKS.iter().enumerate() {
        // Converged: the answer comes from a live worker (a crashed owner stays the
        // owner until the store expires its lease), or the task is released.
        // Bounded: 600 turns of 100 ms of virtual time.
        let mut last = None;
        for _ in 0..600 {
            for (w, slot) in workers.iter_mut().enumerate() {
                if slot.as_ref().is_none_or(Worker::is_finished) {
                    *slot = Some(join(&store, WORKERS[w], &reg).await);
                }
            }
            let live: Vec<i64> = workers.iter().flatten().map(Worker::lease).collect();
            let status = controller.status(task).await.map_err(|e| e.to_string())?;
            if status.desired != desired[t] {
                return Err(format!(
                    "{task}: desired {} != {}",
                    status.desired, desired[t]
                ));
            }
            let live_owner = status.owner_lease.is_none_or(|l| live.contains(&l));
            // A report stays until its owner can write again: an owner that fenced
            // itself while the store was away still shows its last report. So
            // converged also means that what runs is what is desired.
            let alive = lock(&reg).alive.get(*task).map_or(0, Vec::len);
            let want = usize::from(desired[t] == DesiredStage::Running);
            if live_owner && status.answers(status.desired_revision) && alive == want {
                last = None;
                break;
            }
            last = Some((status, alive));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Some((status, alive)) = last {
            return Err(format!(
                "{task} never converged to {} within 60 s ({alive} runs alive): {status:?}",
                desired[t]
            ));
        }
    }
    check_observed(&controller, &reg).await;
    let violations = std::mem::take(&mut lock(&reg).violations);
    for worker in workers.into_iter().flatten() {
        let _ = worker.shutdown().await;
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("\n"))
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/cluster_prop.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_real_worker_keeps_one_run_and_converges(
        first in 1..=WORKERS.len(),
        steps in proptest::collection::vec(step(), 1..24),
    ) {
        // Virtual time bounds every wait inside a case; this bounds the real time, so
        // that a loop that spins without letting the clock advance fails the test
        // instead of hanging it.
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime");
            let _ = done.send(runtime.block_on(run_case(first, steps)));
        });
        let result = result
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| Err("the case ran 30 s of real time: a loop spins".into()));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}

/// A unit that never returns, whatever it is asked.
struct Stubborn;

impl Unit for Stubborn {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        std::future::pending::<()>().await;
        Ok(RunExit::Completed)
    }
}

#[tokio::test(start_paused = true)]
async fn a_pause_that_cannot_be_answered_times_out_naming_the_task_owner_and_stage() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), PREFIX).unwrap();
    controller
        .create("stuck", Vec::new(), DesiredStage::Running)
        .await
        .unwrap();
    // Nobody owns it yet.
    let error = controller
        .pause_within("stuck", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ClusterError::Timeout { command: "pause", task, owner: None, stage: None, .. } if task.as_str() == "stuck"),
        "{error}"
    );

    // Owned by a worker whose run ignores cancellation: the pause is stuck in Pausing.
    let worker = Worker::builder(store.clone(), PREFIX, "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .join(|spec: TaskSpec| Ok(Task::builder(spec.task.as_str()).unit(Stubborn)))
        .await
        .unwrap();
    controller
        .resume_within("stuck", Duration::from_secs(5))
        .await
        .unwrap();
    let error = controller
        .pause_within("stuck", Duration::from_secs(3))
        .await
        .unwrap_err();
    match &error {
        ClusterError::Timeout {
            owner: Some(owner),
            stage: Some(stage),
            ..
        } => {
            assert_eq!(owner.as_str(), "w1");
            assert_eq!(*stage, taskstage::Stage::Pausing);
        }
        other => panic!("not a timeout naming the owner and the stage: {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("stuck") && text.contains("w1") && text.contains("Pausing"),
        "{text}"
    );
    // A stop escalates to abort: the run goes, and the stop is answered.
    let stopped = controller
        .stop_within("stuck", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(stopped.stage, taskstage::Stage::Stopped);
    worker.shutdown().await.unwrap();
}

/// A unit that counts its live runs.
struct Live(Arc<std::sync::atomic::AtomicUsize>);

/// Takes one off the count when the run's future is dropped.
struct LiveGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        // SeqCst: a counter read by the test on the same thread.
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Unit for Live {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _alive = LiveGuard(Arc::clone(&self.0));
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// A store call that starts just before the lease deadline must not hold a run past
/// it: the run is gone by the deadline plus the stop bound even while every call
/// hangs (found by the fault suite: a worker cut off from etcd kept its run for a
/// call deadline longer, and another worker started one).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hanging_store_cannot_hold_a_run_past_the_lease_deadline() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let store = MemoryCoordinator::new();
    let live = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&live);
    let stop_bound = Duration::from_millis(600);
    let worker = Worker::builder(store.clone(), "hang", "w1")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(stop_bound)
        .resync(Duration::from_millis(200))
        // Longer than the lease is trusted for: a call that hangs covers the deadline.
        .op_timeout(Duration::from_secs(5))
        .join(move |spec| Ok(Task::builder(spec.task.as_str()).unit(Live(Arc::clone(&count)))))
        .await
        .expect("join");
    running_task(&store, "hang").await;
    assert_eq!(live.load(SeqCst), 1);

    store.set_hanging(true);
    // A keep-alive already past the store's door may still be answered.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let deadline = worker.stop_deadline().expect("a lease deadline");
    let bound = deadline + stop_bound;
    // Bounded by `bound` on the paused clock, polling every 10 ms.
    while live.load(SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() <= bound,
            "the run outlived its lease deadline plus the stop bound while the store hung"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.set_hanging(false);
    worker.crash().await;
}

/// A controller on `store` under [`PREFIX`], with every one of `tasks` created
/// desired Running.
async fn all_running(store: &MemoryCoordinator, tasks: &[String]) -> Controller {
    let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
    for task in tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create");
    }
    controller
}

/// A controller under `prefix` that has created task "t" and resumed it: the call
/// returns once a worker's run of it answered.
async fn running_task(store: &MemoryCoordinator, prefix: &str) -> Controller {
    let controller = Controller::new(store.clone(), prefix).expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running");
    controller
}

/// Joins worker `id` on `store` under prefix `prefix`, running [`Live`] units that
/// count into `live`.
async fn join_live(
    store: &MemoryCoordinator,
    prefix: &str,
    id: &str,
    live: &Arc<std::sync::atomic::AtomicUsize>,
) -> Worker {
    let count = Arc::clone(live);
    join_making(store, prefix, id, move || Live(Arc::clone(&count))).await
}

/// Joins worker `id`, building each task with one unit made by `make`.
async fn join_making<U, F>(store: &MemoryCoordinator, prefix: &str, id: &str, make: F) -> Worker
where
    U: Unit,
    F: Fn() -> U + Send + Sync + 'static,
{
    Worker::builder(store.clone(), prefix, id)
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(move |spec| Ok(Task::builder(spec.task.as_str()).unit(make())))
        .await
        .expect("join on a reachable in-memory store")
}

/// A unit that counts its live runs and ignores its cancellation: only an abort
/// ends its run.
struct StubbornLive(Arc<std::sync::atomic::AtomicUsize>);

impl Unit for StubbornLive {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _alive = LiveGuard(Arc::clone(&self.0));
        std::future::pending::<()>().await;
        Ok(RunExit::Completed)
    }
}

/// Dropping a worker ends its guard of the lease, so it stops its runs first,
/// whatever a caller holds of them: the run is gone long before the lease could
/// expire, and the worker that takes the task over after the expiry never runs it
/// beside the old run (the drop used to leave the run alive while a caller held its
/// handle, and two runs were live once the lease expired).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_a_worker_stops_its_runs_whatever_a_caller_holds() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let store = MemoryCoordinator::new();
    let live = Arc::new(AtomicUsize::new(0));
    // A run that ignores its cancellation: the drop must abort it at once, not leave
    // it to a stop's grace period.
    let count = Arc::clone(&live);
    let w1 = join_making(&store, "drop", "w1", move || {
        StubbornLive(Arc::clone(&count))
    })
    .await;
    let controller = running_task(&store, "drop").await;
    assert_eq!(live.load(SeqCst), 1);
    let held = w1.observer(&TaskId::new("t").expect("a valid id"));
    assert!(held.is_some(), "w1 runs the task");
    let lease = w1.lease();
    drop(w1);

    // At once, on the paused clock: well before the stop grace a task's owner would
    // give it (half the stop bound, 300 ms), and far inside the lease's TTL (2 s).
    let bound = tokio::time::Instant::now() + Duration::from_millis(100);
    while live.load(SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() <= bound,
            "the dropped worker's run was still alive 100 ms later"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.leases().contains(&lease), "the drop is not a revoke");

    // After the lease expires, a new worker takes the task over: one run again.
    store.expire_lease(lease);
    let w2 = join_live(&store, "drop", "w2", &live).await;
    controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("w2 runs the task");
    assert_eq!(live.load(SeqCst), 1, "two runs of one task");
    drop(held);
    w2.shutdown().await.expect("a clean shutdown");
}

/// Two incarnations of one worker id alive at once (one frozen past its lease came
/// back and rejoined beside a fresh start): each is a member under its own lease, and
/// the id stays listed while either lives.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_id_stays_listed_while_any_incarnation_lives() {
    let store = MemoryCoordinator::new();
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let first = join_live(&store, "twice", "w1", &live).await;
    let second = join_live(&store, "twice", "w1", &live).await;
    let other = join_live(&store, "twice", "w2", &live).await;
    let controller = Controller::new(store.clone(), "twice").expect("a controller");
    // Each registers once it has listed the tasks and the members.
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    // Bounded by `end`.
    while store
        .dump()
        .iter()
        .filter(|kv| kv.key.starts_with("twice/workers/"))
        .count()
        < 3
    {
        assert!(
            tokio::time::Instant::now() < end,
            "three members never registered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let listed = controller.workers().await.expect("a listing");
    let names: Vec<&str> = listed.iter().map(|w| w.as_str()).collect();
    assert_eq!(names, ["w1", "w2"], "each id once");

    store.expire_lease(second.lease());
    let listed = controller.workers().await.expect("a listing");
    let names: Vec<&str> = listed.iter().map(|w| w.as_str()).collect();
    assert_eq!(
        names,
        ["w1", "w2"],
        "w1's first incarnation lives, yet the id is no longer listed"
    );
    drop(second);
    first.shutdown().await.expect("a clean shutdown");
    let listed = controller.workers().await.expect("a listing");
    let names: Vec<&str> = listed.iter().map(|w| w.as_str()).collect();
    assert_eq!(names, ["w2"]);
    other.shutdown().await.expect("a clean shutdown");
}

/// Stopped is final: a second stop of a stopped task writes nothing and returns the
/// answer to the first, so no worker claims and rebuilds the released task only to
/// answer a new desired revision.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_second_stop_writes_nothing_and_builds_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let store = MemoryCoordinator::new();
    let builds = Arc::new(AtomicUsize::new(0));
    let live = Arc::new(AtomicUsize::new(0));
    let (counted, count) = (Arc::clone(&builds), Arc::clone(&live));
    let worker = join_making(&store, "again", "w1", move || {
        counted.fetch_add(1, SeqCst);
        Live(Arc::clone(&count))
    })
    .await;
    let controller = running_task(&store, "again").await;
    let first = controller
        .stop_within("t", Duration::from_secs(10))
        .await
        .expect("stopped");
    let stopped = controller.status("t").await.expect("a status");
    let built = builds.load(SeqCst);

    let second = controller
        .stop_within("t", Duration::from_secs(10))
        .await
        .expect("a second stop answers");
    let after = controller.status("t").await.expect("a status");
    assert_eq!(
        after.desired_revision, stopped.desired_revision,
        "the second stop wrote a new desired revision"
    );
    assert_eq!(second.desired_revision, first.desired_revision);
    // Long enough for any worker to act on a write (several resync periods).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        builds.load(SeqCst),
        built,
        "the stopped task was built again"
    );
    assert_eq!(live.load(SeqCst), 0);
    worker.shutdown().await.expect("a clean shutdown");
}

/// Fair shares by hand-over: 30 tasks run on 3 workers (10 each); a 4th joins.
/// Within 30 s of virtual time every worker holds 7 or 8 tasks and each task runs
/// again, once, under its new owner; no task is stopped or fails on the way, and
/// never are two runs of a task alive (the probes say so at every run's start).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fourth_worker_gets_its_share_by_hand_over_with_nothing_stopped_or_failed() {
    let store = MemoryCoordinator::new();
    let reg: Shared = Arc::default();
    let tasks: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    let controller = all_running(&store, &tasks).await;
    let mut workers = Vec::new();
    for id in ["w0", "w1", "w2", "w3"] {
        if id == "w3" {
            // Every task runs on the first three, in their shares, before w3 joins.
            settled(&controller, &workers, &tasks, &reg, &[10, 10, 10]).await;
        }
        workers.push(join(&store, id, &reg).await);
    }
    settled(&controller, &workers, &tasks, &reg, &[7, 8]).await;
    let violations = std::mem::take(&mut lock(&reg).violations);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    for worker in workers {
        worker.shutdown().await.expect("a clean shutdown");
    }
}

/// Waits, at most 30 s of virtual time, until each of `workers` holds a number of
/// tasks in `shares` (one number: exactly that many; two: within them), every task
/// is observed Running by its current live owner and has exactly one run alive.
/// Fails at once on a probe's violation, or on a task observed stopped or failed.
async fn settled(
    controller: &Controller,
    workers: &[Worker],
    tasks: &[String],
    reg: &Shared,
    shares: &[usize],
) {
    let (low, high) = match shares {
        [one, two] => (*one, *two),
        _ => (shares[0], shares[0]),
    };
    let mut last = String::new();
    // Bounded: 300 turns of 100 ms of virtual time.
    for _ in 0..300 {
        let violations = std::mem::take(&mut lock(reg).violations);
        assert!(violations.is_empty(), "{}", violations.join("\n"));
        let counts: Vec<usize> = workers.iter().map(|w| w.tasks().len()).collect();
        let live: Vec<i64> = workers.iter().map(Worker::lease).collect();
        let mut waiting = Vec::new();
        for task in tasks {
            let status = controller.status(task).await.expect("a status");
            if let Some(observed) = &status.observed {
                assert!(
                    observed.stage != taskstage::Stage::Stopped && !observed.outcome.is_failed(),
                    "{task} was stopped or failed on the way: {status:?}"
                );
            }
            assert_eq!(status.desired, DesiredStage::Running, "{task}");
            let alive = lock(reg).alive.get(task.as_str()).map_or(0, Vec::len);
            let owned = status.owner_lease.is_some_and(|l| live.contains(&l));
            if !(owned && status.answers(status.desired_revision) && alive == 1) {
                waiting.push(format!("{task} ({alive} alive)"));
            }
        }
        if waiting.is_empty() && counts.iter().all(|c| (low..=high).contains(c)) {
            return;
        }
        last = format!("held {counts:?}, not yet Running once: {waiting:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no fair shares {shares:?} within 30 s: {last}");
}

/// Reproduces a defect of the hand-over as first built (found by the stateright model):
/// a hand-over given up while its pause's report is on its way. w0 runs both tasks;
/// w1 joins, so w0 yields one and publishes Paused for the current desired
/// revision; before that report lands (the store hangs for a moment) w1's lease
/// ends, w0's share grows back and it gives the hand-over up; once the report lands
/// w0 resumes the task under the same desired revision, and the stored report says
/// Paused while the run is alive (the probe at every run's start reads it).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hand_over_given_up_leaves_no_report_that_claims_a_rest() {
    let store = MemoryCoordinator::new();
    let reg: Shared = Arc::default();
    let tasks: Vec<String> = TASKS.iter().map(|t| (*t).to_owned()).collect();
    let controller = all_running(&store, &tasks).await;
    let w0 = join(&store, "w0", &reg).await;
    settled(&controller, std::slice::from_ref(&w0), &tasks, &reg, &[2]).await;
    let w1 = join(&store, "w1", &reg).await;
    // Bounded: 100,000 turns of the runtime, no virtual time.
    let paused = 'found: {
        for _ in 0..100_000 {
            for task in TASKS {
                let id = TaskId::new(task).expect("a valid id");
                if w0
                    .observer(&id)
                    .is_some_and(|o| o.stage() == taskstage::Stage::Paused)
                {
                    store.set_hanging(true);
                    break 'found Some(task);
                }
            }
            tokio::task::yield_now().await;
        }
        None
    };
    let task = paused.expect("w0 never paused a task to hand it over");
    store.expire_lease(w1.lease());
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
    store.set_hanging(false);
    // Long enough for the report to land and the run to start again (virtual).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let violations = std::mem::take(&mut lock(&reg).violations);
    drop(w1);
    w0.shutdown().await.expect("a clean shutdown");
    assert!(violations.is_empty(), "{task}: {}", violations.join("\n"));
}

/// One worker's door to the store that loses the answer to its first release of
/// an owner key once armed (the store applies the release, the worker hears an
/// error), and from that moment holds back what its watches deliver: its cache
/// still says the key is its own. Its claims can be held on their way too.
#[derive(Clone)]
struct LostRelease {
    store: MemoryCoordinator,
    armed: Arc<std::sync::atomic::AtomicBool>,
    held: Arc<tokio::sync::watch::Sender<bool>>,
    /// While true, the worker's claims wait on their way to the store.
    claims_wait: Arc<tokio::sync::watch::Sender<bool>>,
}

impl LostRelease {
    fn new(store: &MemoryCoordinator) -> Self {
        LostRelease {
            store: store.clone(),
            armed: Arc::default(),
            held: Arc::new(tokio::sync::watch::channel(false).0),
            claims_wait: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

impl taskstage_cluster::Coordinator for LostRelease {
    fn grant(
        &self,
        ttl: Duration,
    ) -> taskstage_cluster::BoxFuture<'_, Result<taskstage_cluster::Grant, ClusterError>> {
        self.store.grant(ttl)
    }

    fn keep_alive(
        &self,
        lease: i64,
    ) -> taskstage_cluster::BoxFuture<'_, Result<taskstage_cluster::KeepAlive, ClusterError>> {
        self.store.keep_alive(lease)
    }

    fn revoke(&self, lease: i64) -> taskstage_cluster::BoxFuture<'_, Result<(), ClusterError>> {
        self.store.revoke(lease)
    }

    fn list(
        &self,
        prefix: String,
    ) -> taskstage_cluster::BoxFuture<'_, Result<taskstage_cluster::Listing, ClusterError>> {
        self.store.list(prefix)
    }

    fn txn(
        &self,
        txn: taskstage_cluster::Txn,
    ) -> taskstage_cluster::BoxFuture<'_, Result<taskstage_cluster::TxnResult, ClusterError>> {
        Box::pin(async move {
            let claims = txn
                .when
                .iter()
                .any(|c| matches!(c, taskstage_cluster::Compare::Absent(_)));
            if claims {
                // Ends when the test lets claims through; the sender lives in `self`.
                let _ = self.claims_wait.subscribe().wait_for(|w| !*w).await;
            }
            let releases = txn.then.iter().any(
                |op| matches!(op, taskstage_cluster::Op::Delete { key } if key.ends_with("/owner")),
            );
            // SeqCst: a flag read and written on the test's one thread.
            let lose = releases && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
            if !lose {
                return self.store.txn(txn).await;
            }
            self.held.send_replace(true);
            let applied = self.store.txn(txn).await;
            assert!(
                applied.is_ok_and(|r| r.succeeded),
                "the release to lose was not applied"
            );
            Err(ClusterError::Unreachable {
                op: "txn",
                detail: "the answer was lost".into(),
            })
        })
    }

    fn watch(
        &self,
        prefix: String,
        from: i64,
    ) -> taskstage_cluster::BoxFuture<'_, Result<taskstage_cluster::WatchStream, ClusterError>>
    {
        Box::pin(async move {
            let inner = self.store.watch(prefix, from).await?;
            Ok(cluster_support::held_back(inner, self.held.subscribe()))
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> taskstage_cluster::BoxFuture<'_, Result<(), ClusterError>> {
        self.store.wait_change(prefix, after, timeout)
    }
}

/// Reproduces a defect of the hand-over as first built (found by the stateright model):
/// a release whose answer is lost. w0 runs both tasks; w1 joins, so w0 hands one
/// over: it pauses it, reports, and releases; the store applies the release but
/// w0 hears an error, and its watch lags. w1 claims the task and runs it. w0
/// releases again, is refused (the key is w1's), fences the task, drops it, and,
/// its cache still saying the key is its own, builds and resumes it: two runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_release_whose_answer_is_lost_never_leaves_two_runs() {
    let store = MemoryCoordinator::new();
    let reg: Shared = Arc::default();
    let tasks: Vec<String> = TASKS.iter().map(|t| (*t).to_owned()).collect();
    let controller = all_running(&store, &tasks).await;
    let door = LostRelease::new(&store);
    let w0 = Worker::builder(door.clone(), PREFIX, "w0")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(factory(Arc::clone(&reg), store.clone()))
        .await
        .expect("join");
    settled(&controller, std::slice::from_ref(&w0), &tasks, &reg, &[2]).await;
    door.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let w1 = join(&store, "w1", &reg).await;
    // Virtual time enough for the hand-over, the claim and the retries.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let violations = std::mem::take(&mut lock(&reg).violations);
    door.held.send_replace(false);
    w1.shutdown().await.expect("a clean shutdown");
    let _ = w0.shutdown().await;
    assert!(
        !door.armed.load(std::sync::atomic::Ordering::SeqCst),
        "no release was lost: the test did not reach its case"
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Reproduces a defect of the cache as first built (found by the stateright model): a
/// claim that reaches the store late, decided from a cache that lags. z0 joins
/// alone and lists the task (unowned, desired Running); its claim waits on its way
/// and its watches lag (it does not learn that a1 joined). a1 joins (the first
/// member by key, so the one task is its share), claims the task, runs it, and
/// stops it for good (the stop is answered, the key released). Then z0's claim
/// arrives, the key being absent it succeeds, and z0 builds and resumes the task
/// from its cache, which still says Running: a stopped task runs again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_late_claim_never_runs_a_task_whose_stop_was_answered() {
    let store = MemoryCoordinator::new();
    let reg: Shared = Arc::default();
    let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("create");
    let door = LostRelease::new(&store);
    door.claims_wait.send_replace(true);
    door.held.send_replace(true);
    let z0 = Worker::builder(door.clone(), PREFIX, "z0")
        // tokio's paused clock: only this runtime sees it.
        .lease_keeping(LeaseKeeping::SharedRuntime)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .op_timeout(Duration::from_secs(5))
        .join(factory(Arc::clone(&reg), store.clone()))
        .await
        .expect("join");
    // z0 lists the task and sends its claim.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let a1 = join(&store, "a1", &reg).await;
    controller
        .resume_within("t", Duration::from_secs(2))
        .await
        .expect("a1 runs the task");
    let stopped = controller
        .stop_within("t", Duration::from_secs(2))
        .await
        .expect("a1 stops the task");
    assert_eq!(stopped.stage, taskstage::Stage::Stopped);
    // Bounded: 100 turns of 20 ms of virtual time.
    for _ in 0..100 {
        if a1.tasks().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a1.tasks().is_empty(), "a1 did not release the task");
    door.claims_wait.send_replace(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let violations = std::mem::take(&mut lock(&reg).violations);
    door.held.send_replace(false);
    let _ = a1.shutdown().await;
    let _ = z0.shutdown().await;
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
