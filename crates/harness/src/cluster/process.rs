//! The worker *process* of the etcd test suites: the test binary started again as
//! its own ignored test `worker_process`, which does nothing unless its
//! `{env}_WORKER` variable is set. Then it joins the cluster as a worker, runs the
//! units its [`WorkerKind`] names, joins again whenever its lease is lost, and
//! exits when its stdin (a pipe from the test) closes, so none outlives the test
//! binary.
//!
//! Each test binary describes its processes once, as a [`WorkerKind`]: its
//! `worker_process` test calls [`worker_process`] with it, and its test side starts
//! processes with [`WorkerKind::spawn`], which returns a guard that kills by pid.
//!
//! The environment of a process, `{env}` being the kind's stem:
//!
//! - `{env}_WORKER`: the worker id (required: its presence makes the process a
//!   worker);
//! - `{env}_ENDPOINTS`: the etcd endpoints, comma-separated, or `sqlite:{path}`, a
//!   store file (required);
//! - `{env}_DIR`: the directory of the histories, for units that record (required
//!   then): the process appends to `worker-{id}-{pid}.history` there (see
//!   [`super::history`]) and writes a line `joined {lease:x}` to
//!   `worker-{id}-{pid}.joins` at each join;
//! - optional: `{env}_UNFENCED` (`1`: the worker runs on an [`Unfenced`] store, which
//!   takes its fences away),
//!   `{env}_CAPACITY`, `{env}_WRITE_MS` (a probe's write period), `{env}_BLOCK`
//!   (`{every ms},{span ms}`: the probes block the runtime's threads, see
//!   [`super::overload::Blocker`]), `{env}_STALL` (`1`: once a file `{id}.stall`
//!   appears in `{env}_DIR`, every probe spins on its thread without yielding, for
//!   good as far as the worker can tell), `{env}_STALL_BOUND_MS` (the worker's stall
//!   bound), `{env}_PREFIX` (another key prefix, for a session run by hand).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::unfenced::{Unfenced, BELIEVED_TTL};
use taskstage::{RunContext, RunError, RunExit, Task, TaskBuilder, Unit};
use taskstage_cluster::{
    ClusterError, Coordinator, FactoryError, FenceToken, Fencer, SqliteCoordinator, TaskSpec,
    Worker, WorkerBuilder,
};

use super::history::{now_ns, Recorder, WriteOutcome};
use super::overload::{Block, Blocker};
use super::{count_from, exit_when_stdin_closes, ChildGuard};

/// The worker processes' runtime threads.
const RUNTIME_THREADS: usize = 2;
/// The worker processes' lease TTL.
pub const TTL: Duration = Duration::from_secs(2);
/// The worker processes' stop bound.
pub const STOP_BOUND: Duration = Duration::from_millis(600);
/// The worker processes' resync period, and their pause before connecting or
/// joining again after a failure.
pub const RESYNC: Duration = Duration::from_millis(200);
/// At most this many joins per process; the test kills it long before.
const MAX_JOINS: usize = 10_000;

/// The worker processes of one test binary: what the test that starts them and the
/// processes themselves agree on.
#[derive(Clone, Copy, Debug)]
pub struct WorkerKind {
    /// The stem of the environment variables (`TASKSTAGE_FAULT` for
    /// `TASKSTAGE_FAULT_WORKER`, ...).
    pub env: &'static str,
    /// The workers' key prefix, unless `{env}_PREFIX` names another.
    pub prefix: &'static str,
    /// What the workers' units do.
    pub units: Units,
    /// How many tasks a worker holds at most, unless `{env}_CAPACITY` says;
    /// `None` leaves the worker's default.
    pub capacity: Option<usize>,
}

/// The units a worker process runs.
#[derive(Clone, Copy, Debug)]
pub enum Units {
    /// A [`Probe`] per task, writing its checkpoint `pos` every `every` (unless
    /// `{env}_WRITE_MS` says) with values of the form `values`, recording its run
    /// and its writes in the process's history.
    Probe {
        /// How often it writes.
        every: Duration,
        /// What it writes.
        values: Values,
    },
    /// A [`Writer`] per task, or a [`Stubborn`] unit for a task whose spec is
    /// `stubborn\n`; they record nothing.
    Writers,
}

/// The value a [`Probe`] writes in its `n`-th write of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// `{revision}.{n}`, the fence token's revision and the number.
    Numbered,
    /// `{n}`.
    Counted,
    /// `{worker}@{lease:x}|{revision}|{id}`: the owner value, the token's revision
    /// and an id unique to the write (`{pid}-{k}`, `k` counting this process's
    /// writes), which the history records too.
    Unique,
}

/// What one worker process is started with beyond its [`WorkerKind`]; `None`
/// leaves the variable unset.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settings {
    /// `{env}_UNFENCED`.
    pub unfenced: Option<bool>,
    /// `{env}_CAPACITY`.
    pub capacity: Option<usize>,
    /// `{env}_WRITE_MS`.
    pub write_every: Option<Duration>,
    /// `{env}_BLOCK`: the probes block the runtime's threads so.
    pub block: Option<Block>,
    /// `{env}_TTL_MS`: the lease's TTL ([`TTL`] when unset).
    pub ttl: Option<Duration>,
    /// `{env}_STALL`: the probes spin for good once the file `{id}.stall` appears.
    pub stall: bool,
    /// `{env}_STALL_BOUND_MS`: the worker's stall bound (its default when unset).
    pub stall_bound: Option<Duration>,
}

impl WorkerKind {
    /// The name of the variable `{env}_{name}`.
    fn var(&self, name: &str) -> String {
        format!("{}_{name}", self.env)
    }

    /// The variable `{env}_{name}`, if set.
    fn optional(&self, name: &str) -> Option<String> {
        std::env::var(self.var(name)).ok()
    }

    /// Whether the units record in a history (and the process needs `{env}_DIR`).
    fn records(&self) -> bool {
        matches!(self.units, Units::Probe { .. })
    }

    /// Starts worker process `id` of this kind on `endpoints`: this test binary
    /// again, its stdin a pipe from this process, its stderr appended to
    /// `{dir}/{id}.log`, its histories in `dir` when its units record.
    ///
    /// # Panics
    ///
    /// If the process cannot be started.
    pub fn spawn(
        &self,
        id: &str,
        endpoints: &[String],
        dir: &Path,
        settings: Settings,
    ) -> ChildGuard {
        let exe = std::env::current_exe().expect("the test binary's path");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{id}.log")))
            .map_or_else(|_| Stdio::null(), Stdio::from);
        let mut command = Command::new(exe);
        command
            .args(["worker_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(self.var("WORKER"), id)
            .env(self.var("ENDPOINTS"), endpoints.join(","));
        if self.records() {
            command.env(self.var("DIR"), dir);
        }
        if let Some(unfenced) = settings.unfenced {
            command.env(self.var("UNFENCED"), if unfenced { "1" } else { "0" });
        }
        if let Some(capacity) = settings.capacity {
            command.env(self.var("CAPACITY"), capacity.to_string());
        }
        if let Some(every) = settings.write_every {
            command.env(self.var("WRITE_MS"), every.as_millis().to_string());
        }
        if let Some(block) = settings.block {
            command.env(self.var("BLOCK"), block.to_arg());
        }
        if let Some(ttl) = settings.ttl {
            command.env(self.var("TTL_MS"), ttl.as_millis().to_string());
        }
        if settings.stall {
            command.env(self.var("STALL"), "1");
        }
        if let Some(bound) = settings.stall_bound {
            command.env(self.var("STALL_BOUND_MS"), bound.as_millis().to_string());
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start a worker process");
        ChildGuard::new(child)
    }
}

/// The body of a test binary's ignored test `worker_process`: returns at once
/// unless `{env}_WORKER` is set; else joins, runs the kind's units, joins again
/// whenever its lease is lost (at most [`MAX_JOINS`] times), and exits when stdin
/// closes.
///
/// # Panics
///
/// If a variable it needs is missing or malformed, or its history cannot be
/// created: the process was not started by its test.
pub fn worker_process(kind: &WorkerKind) {
    let Ok(id) = std::env::var(kind.var("WORKER")) else {
        return;
    };
    let endpoints = required_env(&kind.var("ENDPOINTS"));
    let file = endpoints.strip_prefix("sqlite:").map(PathBuf::from);
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let prefix = kind
        .optional("PREFIX")
        .unwrap_or_else(|| kind.prefix.to_owned());
    let unfenced = kind.optional("UNFENCED").is_some_and(|v| v == "1");
    let capacity = kind
        .optional("CAPACITY")
        .map(|c| c.parse::<usize>().expect("a capacity"))
        .or(kind.capacity);
    let ttl = kind.optional("TTL_MS").map_or(TTL, |ms| {
        Duration::from_millis(ms.parse().expect("a TTL in ms"))
    });
    let stall_bound = kind
        .optional("STALL_BOUND_MS")
        .map(|ms| Duration::from_millis(ms.parse().expect("a stall bound in ms")));
    let (factory, mut joins) = factory(kind, &id);
    // The test holds the other end of stdin: when it goes away, so does this.
    exit_when_stdin_closes();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        // SIGTERM, as a supervisor sends it: a clean shutdown (every run stopped,
        // the keys withdrawn, the lease revoked), then the process ends.
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        // Bounded: the test kills the process long before.
        for _ in 0..MAX_JOINS {
            let builder = match &file {
                Some(path) => SqliteCoordinator::open(path)
                    .await
                    .map(|coord| builder_on(coord, unfenced, ttl, &prefix, &id)),
                #[cfg(feature = "etcd")]
                None => taskstage_cluster::EtcdCoordinator::connect(
                    endpoints.clone(),
                    taskstage_cluster::EtcdOptions::default(),
                )
                .await
                .map(|coord| builder_on(coord, unfenced, ttl, &prefix, &id)),
                #[cfg(not(feature = "etcd"))]
                None => {
                    eprintln!(
                        "worker {id}: {endpoints:?} is not sqlite:PATH, and this build has no etcd"
                    );
                    std::process::exit(2);
                }
            };
            let builder = match builder {
                Ok(builder) => builder,
                Err(error) => {
                    eprintln!("worker {id}: connect failed: {error}");
                    tokio::time::sleep(RESYNC).await;
                    continue;
                }
            };
            let mut builder = builder.stop_bound(STOP_BOUND).resync(RESYNC);
            if let Some(capacity) = capacity {
                builder = builder.capacity(capacity);
            }
            if let Some(bound) = stall_bound {
                builder = builder.stall_bound(bound);
            }
            let factory = Arc::clone(&factory);
            match builder.join(move |spec| factory(spec)).await {
                Ok(mut worker) => {
                    eprintln!("worker {id}: joined, lease {:x}", worker.lease());
                    if let Some(joins) = joins.as_mut() {
                        let _ = writeln!(joins, "joined {:x}", worker.lease());
                    }
                    let ended = tokio::select! {
                        _ = terminate.recv() => None,
                        ended = worker.closed() => Some(ended),
                    };
                    let Some(ended) = ended else {
                        let shut = worker.shutdown().await;
                        eprintln!("worker {id}: SIGTERM; shut down ({shut:?})");
                        return;
                    };
                    eprintln!("worker {id}: ended ({ended:?}); joining again");
                }
                Err(error) => {
                    eprintln!("worker {id}: join failed: {error}");
                    tokio::time::sleep(RESYNC).await;
                }
            }
        }
    });
}

/// A worker of `prefix` and `id` on `coord` with the processes' TTL, on an
/// [`Unfenced`] store when `unfenced`.
fn builder_on(
    coord: impl Coordinator,
    unfenced: bool,
    ttl: Duration,
    prefix: &str,
    id: &str,
) -> WorkerBuilder {
    if unfenced {
        Worker::builder(Unfenced::new(Arc::new(coord), ttl), prefix, id).ttl(BELIEVED_TTL)
    } else {
        Worker::builder(coord, prefix, id).ttl(ttl)
    }
}

type Factory = dyn Fn(TaskSpec) -> Result<TaskBuilder, FactoryError> + Send + Sync;

/// The task factory of worker `id` of `kind`, and its joins file when it records.
fn factory(kind: &WorkerKind, id: &str) -> (Arc<Factory>, Option<std::fs::File>) {
    let Units::Probe { every, values } = kind.units else {
        let factory = |spec: TaskSpec| {
            let builder = Task::builder(spec.task.as_str());
            Ok(if spec.spec == b"stubborn\n" {
                builder.unit(Stubborn {
                    fencer: spec.fencer,
                })
            } else {
                builder.unit(Writer {
                    fencer: spec.fencer,
                })
            })
        };
        return (Arc::new(factory), None);
    };
    let every = kind.optional("WRITE_MS").map_or(every, |ms| {
        Duration::from_millis(ms.parse().expect("a write period in ms"))
    });
    let blocker = kind.optional("BLOCK").map(|block| {
        let block = Block::parse(&block).expect("a block as {every ms},{span ms}");
        Blocker::new(block, RUNTIME_THREADS)
    });
    let dir = PathBuf::from(required_env(&kind.var("DIR")));
    let stall = kind
        .optional("STALL")
        .is_some_and(|v| v == "1")
        .then(|| Arc::new(dir.join(format!("{id}.stall"))));
    let name = format!("worker-{id}-{}", std::process::id());
    let recorder = Recorder::create(&dir, &name).expect("create the worker's history file");
    let joins = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.joins")))
        .expect("create the worker's joins file");
    let worker = id.to_owned();
    let factory = move |spec: TaskSpec| {
        Ok(Task::builder(spec.task.as_str()).unit(Probe {
            task: spec.task.as_str().to_owned(),
            worker: worker.clone(),
            fencer: spec.fencer,
            every,
            values,
            recorder: Arc::clone(&recorder),
            blocker: blocker.clone(),
            stall: stall.clone(),
        }))
    };
    (Arc::new(factory), Some(joins))
}

/// Ids of this process's [`Values::Unique`] writes.
static NEXT_WRITE: AtomicU64 = AtomicU64::new(1);

/// A unit that records its run, then writes a fenced checkpoint `pos` every
/// `every`, recording each write and whether the fence accepted it; once rejected,
/// it waits for its cancellation. With a blocker, it also blocks its runtime thread
/// in the blocker's windows.
struct Probe {
    task: String,
    worker: String,
    fencer: Fencer,
    every: Duration,
    values: Values,
    recorder: Arc<Recorder>,
    blocker: Option<Arc<Blocker>>,
    /// Once this file exists, the probe spins on its thread without yielding.
    stall: Option<Arc<PathBuf>>,
}

/// The longest a stalled probe spins: the test ends its process long before.
const STALL_SPAN: Duration = Duration::from_secs(600);

impl Values {
    /// The value of the `n`-th write of a run under `token`, and the write's id
    /// when it has one.
    fn of(self, token: &FenceToken, n: u64) -> (String, Option<String>) {
        match self {
            Values::Numbered => (format!("{}.{n}", token.revision), None),
            Values::Counted => (n.to_string(), None),
            Values::Unique => {
                // Relaxed: a counter for unique ids within this process.
                let k = NEXT_WRITE.fetch_add(1, Ordering::Relaxed);
                let id = format!("{}-{k}", std::process::id());
                let value = format!("{}@{:x}|{}|{id}", token.worker, token.lease, token.revision);
                (value, Some(id))
            }
        }
    }
}

impl Unit for Probe {
    fn name(&self) -> &str {
        "probe"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let _alive = self.recorder.alive(
            &self.task,
            &self.worker,
            ctx.generation(),
            self.fencer.token().revision,
        );
        let Some(blocker) = self.blocker.clone() else {
            return self.probe(&ctx).await;
        };
        let probe = self.probe(&ctx);
        tokio::pin!(probe);
        tokio::select! {
            exit = &mut probe => exit,
            () = blocker.pulse() => probe.await,
        }
    }
}

impl Probe {
    /// The run's work: the writes, until the run is cancelled.
    async fn probe(&mut self, ctx: &RunContext) -> Result<RunExit, RunError> {
        let token = self.fencer.token().clone();
        let revision = token.revision;
        // Bounded by the run's cancellation.
        for n in 1u64.. {
            tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                () = tokio::time::sleep(self.every) => {}
            }
            if self.stall.as_ref().is_some_and(|file| file.exists()) {
                let until = std::time::Instant::now() + STALL_SPAN;
                // Bounded by the span: a busy loop that never yields to the runtime.
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            let (value, id) = self.values.of(&token, n);
            let sent = now_ns();
            let outcome = match self.fencer.put_checkpoint("pos", value.into_bytes()).await {
                Ok(()) => WriteOutcome::Accepted,
                Err(ClusterError::Fenced { .. }) => WriteOutcome::Rejected,
                Err(_) => WriteOutcome::Unknown,
            };
            let (task, worker) = (&self.task, &self.worker);
            match &id {
                Some(id) => self
                    .recorder
                    .write_with_id(task, worker, revision, sent, outcome, id),
                None => self.recorder.write(task, worker, revision, sent, outcome),
            }
            if outcome == WriteOutcome::Rejected {
                ctx.cancelled().await;
                return Ok(RunExit::Cancelled);
            }
        }
        Ok(RunExit::Completed)
    }
}

/// Writes checkpoint `pos` (a count) every 50 ms, from where the last run left it.
struct Writer {
    fencer: Fencer,
}

impl Unit for Writer {
    fn name(&self) -> &str {
        "writer"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let at: u64 = match self.fencer.checkpoint("pos").await {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).parse().unwrap_or(0),
            _ => 0,
        };
        count_from(&self.fencer, &ctx, at).await
    }
}

/// Writes one checkpoint, then ignores its cancellation: only a stop's abort ends it.
struct Stubborn {
    fencer: Fencer,
}

impl Unit for Stubborn {
    fn name(&self) -> &str {
        "stubborn"
    }

    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        let _ = self.fencer.put_checkpoint("began", b"1".to_vec()).await;
        std::future::pending::<()>().await;
        Ok(RunExit::Completed)
    }
}

/// A variable a worker process needs from the test that started it.
///
/// # Panics
///
/// If it is not set: the process was not started by its test.
fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the worker process needs {name}"))
}
