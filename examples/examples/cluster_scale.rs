//! The cluster at scale, measured the same way every time (feature `etcd`).
//!
//! ```text
//! cargo run --release -p taskstage-examples --features etcd --example cluster_scale -- --tasks 1000 --workers 3
//! ```
//!
//! Starts a local 3-member etcd (temporary directories in `/dev/shm` where it exists,
//! random 127.0.0.1 ports; or uses `ETCD_ENDPOINTS`, comma-separated), or with
//! `--on-file` opens a store file of its own (the embedded store: no server, and no
//! store reads are counted), creates the
//! tasks, starts the worker *processes* (this program again, with the hidden
//! `--scale-worker` flag) and runs these phases, each bounded in time:
//!
//! 1. **all running**: from the start of the worker processes until every task is
//!    observed Running (its current owner's report answers its desired revision);
//! 2. **rest**: a 10 s window right after; store reads per second per worker (range
//!    requests counted by etcd itself, from every member's `/metrics`; lease
//!    keep-alives are not range requests), and CPU per worker process (from
//!    `/proc/PID/stat`), as a percentage of one core;
//! 3. **pauses**: 50 tasks spread over the id space, each paused cluster-wide
//!    (`Controller::pause_within`, timed) and resumed;
//! 4. **writes**: min(1000, N) tasks write one fenced checkpoint a second each; the
//!    accepted writes per second over a 10 s window, then 50 more timed pauses while
//!    they write;
//! 5. **rebalance**: one more worker joins; the time until balance (most tasks per
//!    worker over fewest, owners read from `Controller::list`) is at most 1.25, or
//!    `timeout` after 60 s; `moved` counts the tasks whose owner changed;
//! 6. **takeover**: the busiest worker is killed with SIGKILL; the time until every
//!    task it held is observed Running on another worker.
//!
//! Every process records when each run began and ended (and each fenced write) in a
//! history file; the fault suite's checker (`crates/harness/src/cluster/history.rs`)
//! merges them at the end: `max_live_runs` is the most runs of one task alive at
//! once, anywhere. The last line printed is
//!
//! ```text
//! cluster_scale tasks=N workers=3 all_running_s=… rest_reads_per_s=… rest_cpu_pct=…
//! pause_p50_ms=… pause_p99_ms=… writes_per_s=… pause_p99_ms_under_writes=… takeover_s=…
//! rebalance_s=… moved=… max_live_runs=… balance=…
//! ```
//!
//! (one line; a figure not measured is `-`). The exit status is 0 when every phase
//! completed and the history checker passed with at most one live run per task, 1
//! otherwise (a phase that did not complete within its bound, or a broken rule: the
//! line is printed all the same, with what was measured), 2 for bad arguments. A slow
//! figure is not a failure: the run measures, it does not judge speed. Ctrl-C stops
//! every process it started (etcd members and workers) by pid.
//!
//! ## `--overload`: the run under load
//!
//! With `--overload`, the same phases run under three more faults, and the history
//! checker holds every rule over all of it:
//!
//! - **CPU-bound processes on every core**, at the run's own priority, for the whole
//!   writes phase (phase 4): two per core (`2 * available_parallelism`), or
//!   `--hogs N`. Each is a child of this program, killed by pid when the phase ends
//!   or fails, and ends by itself after 600 s or once this program is gone. The
//!   phase's pauses under writes start no new pause after 60 s (the figure is over
//!   those made, and the run says how many).
//! - **Units that block their runtime's threads** on the first worker (`w1`): every
//!   2 s, two of its units (as many as its runtime has threads) each spin for 150 ms
//!   inside their run without yielding, so that the runtime's threads are all held
//!   at once, for the whole run.
//! - **A duty-cycle freeze** of the last of the first workers (`w3` of three): SIGSTOP
//!   for 90 ms, SIGCONT for 10 ms, for two TTLs from the start of the writes window,
//!   then SIGCONT for good (also when the run fails or is interrupted).
//!
//! A worker process that ends itself with the status of an overrun (75: a run not
//! confirmed gone by its lease's last safe instant) is restarted under the same id,
//! as a supervisor would; any other exit of a worker fails the run. The line printed
//! last then ends with `hogs=… lease_losses=… overrun_exits=… restarts=…`: the CPU
//! hogs, the times a worker joined again after losing its lease, the workers that
//! ended themselves on an overrun, and the restarts. Without `--overload`, nothing of
//! this happens and the line is as above.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::cell::Cell;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, EtcdCoordinator, EtcdOptions, Fencer,
    SqliteCoordinator, TaskSpec, TaskStatus, Worker,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use harness::history::{now_ns, Fault, History, Recorder, WriteOutcome};
use harness::overload::{self, Block, Blocker, DutyCycle, Hogs};
use harness::{AnyStore, ChildGuard, EtcdCluster};
use taskstage_harness::cluster as harness;

/// The hidden first argument of a worker process.
const WORKER_FLAG: &str = "--scale-worker";
/// The length of the rest window and of the writes window.
const WINDOW: Duration = Duration::from_secs(10);
/// How long the writers get to reach their pace before the writes window opens.
const WRITES_WARM_UP: Duration = Duration::from_secs(3);
/// How many tasks write in the writes phase, at most.
const MAX_WRITERS: usize = 1_000;
/// How long a rebalance may take before it is reported as `timeout`.
const REBALANCE_BOUND: Duration = Duration::from_secs(60);
/// The balance a rebalance must reach (most tasks per worker over fewest).
const BALANCE_GOAL: f64 = 1.25;
/// The bound of each pause and each resume: generous, since a debug build of a
/// worker that re-lists every task has taken 29 s for one pause under writes.
const COMMAND_BOUND: Duration = Duration::from_secs(60);
/// The bound of a takeover beyond the lease TTL.
const TAKEOVER_BOUND: Duration = Duration::from_secs(120);
/// The bound of any wait of the set-up (a worker registered, the tasks created).
const SETUP_BOUND: Duration = Duration::from_secs(60);
/// How soon after a thaw a frozen owner must drop its run (the checker's allowance;
/// nothing is frozen here, so it never applies).
const THAW_ALLOWANCE: Duration = Duration::from_millis(1_500);
/// How often a wait for every task says how far it got.
const PROGRESS: Duration = Duration::from_secs(10);
/// How often the controller reads the task list while it waits for a state.
const POLL: Duration = Duration::from_millis(250);
/// How long a CPU hog of `--overload` runs at most, if nothing kills it first.
const HOG_BOUND: Duration = Duration::from_secs(600);
/// How the units of `--overload`'s blocking worker block its runtime's threads.
const BLOCK: Block = Block {
    every: Duration::from_secs(2),
    span: Duration::from_millis(150),
};
/// A worker process's runtime threads (and so the units that block at once).
const RUNTIME_THREADS: usize = 2;
/// The duty cycle of `--overload`'s frozen worker: stopped, then running.
const DUTY_STOPPED: Duration = Duration::from_millis(90);
const DUTY_RUNNING: Duration = Duration::from_millis(10);
/// With `--overload`, no pause under writes starts after this long: the CPU hogs
/// run until the pauses are done, and the run must fit in CI's time.
const OVERLOAD_PAUSES_BUDGET: Duration = Duration::from_secs(60);
/// How many worker processes `--overload` restarts at most, in all.
const MAX_RESTARTS: usize = 50;

// ------------------------------------------------------------------ arguments

/// The run's settings.
#[derive(Debug, Clone, PartialEq)]
struct Options {
    tasks: usize,
    workers: usize,
    ttl: Duration,
    capacity: Option<usize>,
    pauses: usize,
    /// The overload faults (module docs).
    overload: bool,
    /// The CPU hogs of `--overload`, if not two per core.
    hogs: Option<usize>,
    /// `--on-file`: the store is one SQLite file in the run's directory, no etcd.
    on_file: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tasks: 100,
            workers: 3,
            ttl: Duration::from_secs(5),
            capacity: None,
            pauses: 50,
            overload: false,
            hogs: None,
            on_file: false,
        }
    }
}

impl Options {
    /// How many CPU hogs the writes phase runs beside the cluster (0 without
    /// `--overload`).
    fn hog_count(&self) -> usize {
        match (self.overload, self.hogs) {
            (false, _) => 0,
            (true, Some(n)) => n,
            (true, None) => overload::hogs_per_core(),
        }
    }
}

/// Arguments the run cannot use.
#[derive(Debug, thiserror::Error, PartialEq)]
enum ArgError {
    /// An option without its value.
    #[error("{0} needs a value")]
    Missing(String),
    /// A value that is not a number in range.
    #[error("{option} {value:?}: {why}")]
    Bad {
        /// The option.
        option: String,
        /// The value given.
        value: String,
        /// What it must be.
        why: &'static str,
    },
    /// An option this program does not know.
    #[error("unknown argument {0:?} (known: --tasks N, --workers N, --ttl-secs S, --capacity N, --pauses N, --overload, --hogs N, --on-file)")]
    Unknown(String),
    /// An option that only means something with `--overload`.
    #[error("{0} is an option of --overload")]
    NeedsOverload(String),
}

fn parse(args: &[String]) -> Result<Options, ArgError> {
    let mut options = Options::default();
    let mut it = args.iter();
    // Bounded by the arguments.
    while let Some(arg) = it.next() {
        let mut value = |why: &'static str, min: u64, max: u64| -> Result<u64, ArgError> {
            let text = it.next().ok_or_else(|| ArgError::Missing(arg.clone()))?;
            text.parse::<u64>()
                .ok()
                .filter(|v| (min..=max).contains(v))
                .ok_or_else(|| ArgError::Bad {
                    option: arg.clone(),
                    value: text.clone(),
                    why,
                })
        };
        match arg.as_str() {
            "--tasks" => options.tasks = value("1 to 100000 tasks", 1, 100_000)? as usize,
            "--workers" => options.workers = value("1 to 16 workers", 1, 16)? as usize,
            "--ttl-secs" => options.ttl = Duration::from_secs(value("2 to 60 s", 2, 60)?),
            "--capacity" => {
                options.capacity = Some(value("1 to 1000000 tasks", 1, 1_000_000)? as usize)
            }
            "--pauses" => options.pauses = value("1 to 10000 pauses", 1, 10_000)? as usize,
            "--overload" => options.overload = true,
            "--on-file" => options.on_file = true,
            "--hogs" => options.hogs = Some(value("1 to 256 processes", 1, 256)? as usize),
            other => return Err(ArgError::Unknown(other.to_owned())),
        }
    }
    if options.hogs.is_some() && !options.overload {
        return Err(ArgError::NeedsOverload("--hogs".into()));
    }
    Ok(options)
}

// ------------------------------------------------------------------ the figures

/// What the run measured; `None` is printed `-`.
#[derive(Debug, Default, Clone)]
struct Figures {
    tasks: usize,
    workers: usize,
    all_running: Option<Duration>,
    rest_reads_per_s: Option<f64>,
    rest_cpu_pct: Option<f64>,
    pause_p50: Option<Duration>,
    pause_p99: Option<Duration>,
    writes_per_s: Option<f64>,
    pause_p99_under_writes: Option<Duration>,
    takeover: Option<Duration>,
    /// `Some(None)`: the bound passed first.
    rebalance: Option<Option<Duration>>,
    moved: Option<usize>,
    max_live_runs: Option<usize>,
    balance: Option<f64>,
    /// With `--overload` only.
    overload: Option<Overload>,
}

/// What `--overload` counts, printed at the end of the line.
#[derive(Debug, Default, Clone, PartialEq)]
struct Overload {
    /// The CPU hogs beside the writes phase.
    hogs: usize,
    /// Times a worker process joined again after losing its lease.
    lease_losses: usize,
    /// Worker processes that ended themselves on an overrun.
    overrun_exits: usize,
    /// Worker processes restarted after an overrun.
    restarts: usize,
}

fn or_dash<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), show)
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn millis(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}")
    } else {
        "inf".to_owned()
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster_scale tasks={} workers={} all_running_s={} rest_reads_per_s={} \
             rest_cpu_pct={} pause_p50_ms={} pause_p99_ms={} writes_per_s={} \
             pause_p99_ms_under_writes={} takeover_s={} rebalance_s={} moved={} \
             max_live_runs={} balance={}",
            self.tasks,
            self.workers,
            or_dash(self.all_running, secs),
            or_dash(self.rest_reads_per_s, |r| format!("{r:.1}")),
            or_dash(self.rest_cpu_pct, |c| format!("{c:.1}")),
            or_dash(self.pause_p50, millis),
            or_dash(self.pause_p99, millis),
            or_dash(self.writes_per_s, |w| format!("{w:.0}")),
            or_dash(self.pause_p99_under_writes, millis),
            or_dash(self.takeover, secs),
            match self.rebalance {
                None => "-".to_owned(),
                Some(None) => "timeout".to_owned(),
                Some(Some(took)) => secs(took),
            },
            or_dash(self.moved, |m| m.to_string()),
            or_dash(self.max_live_runs, |m| m.to_string()),
            or_dash(self.balance, ratio),
        )?;
        if let Some(o) = &self.overload {
            write!(
                f,
                " hogs={} lease_losses={} overrun_exits={} restarts={}",
                o.hogs, o.lease_losses, o.overrun_exits, o.restarts
            )?;
        }
        Ok(())
    }
}

/// The value at quantile `q` (nearest rank) of `samples`, sorted or not.
fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Most tasks per worker over fewest, among `workers` (a worker with none makes it
/// infinite); `None` without workers.
fn balance(owners: &[(String, Option<String>)], workers: &[String]) -> Option<f64> {
    let counts: Vec<usize> = workers
        .iter()
        .map(|w| {
            owners
                .iter()
                .filter(|(_, o)| o.as_deref() == Some(w.as_str()))
                .count()
        })
        .collect();
    let max = *counts.iter().max()?;
    let min = *counts.iter().min()?;
    Some(if min == 0 {
        f64::INFINITY
    } else {
        max as f64 / min as f64
    })
}

/// The sum of every sample of metric `name` whose labels contain `labels`, in the
/// Prometheus text format etcd serves on `/metrics`.
fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| line.contains(labels))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// User and system CPU time of process `pid`, in clock ticks, from `/proc/PID/stat`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the file are 12 and 13 after the name (state is 3).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

// ------------------------------------------------------------------ errors

/// Why a run did not complete.
#[derive(Debug, thiserror::Error)]
enum ScaleError {
    /// No etcd binary and no `ETCD_ENDPOINTS`.
    #[error("no etcd binary found (install etcd-server, or set ETCD_BIN or ETCD_ENDPOINTS)")]
    NoEtcd,
    /// A cluster call failed where the run cannot go on.
    #[error("{what}: {source}")]
    Cluster {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: ClusterError,
    },
    /// A file or a process could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A phase did not complete within its bound.
    #[error("{phase} did not complete within {bound:?}: {detail}")]
    Timeout {
        /// The phase.
        phase: &'static str,
        /// Its bound.
        bound: Duration,
        /// What was left.
        detail: String,
    },
    /// A worker process ended otherwise than on an overrun (with `--overload`).
    #[error("worker {id} (pid {pid}) exited unexpectedly: {status}")]
    WorkerExited {
        /// The worker.
        id: String,
        /// Its process.
        pid: u32,
        /// How it ended.
        status: std::process::ExitStatus,
    },
    /// More overruns than [`MAX_RESTARTS`].
    #[error("{0} worker processes restarted after an overrun: giving up")]
    TooManyRestarts(usize),
    /// Ctrl-C.
    #[error("interrupted")]
    Interrupted,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ScaleError {
    let what = what.into();
    move |source| ScaleError::Io { what, source }
}

fn cluster(what: impl Into<String>) -> impl FnOnce(ClusterError) -> ScaleError {
    let what = what.into();
    move |source| ScaleError::Cluster { what, source }
}

// ------------------------------------------------------------------ the worker

/// A task's unit: records its run; a writer writes one fenced checkpoint a second
/// while the writes are on; an idle unit waits for its cancellation. With a
/// blocker (`--overload`'s blocking worker), it also blocks its runtime thread in
/// the blocker's windows.
struct Load {
    task: String,
    worker: String,
    writer: bool,
    fencer: Fencer,
    recorder: Arc<Recorder>,
    writes: watch::Receiver<bool>,
    blocker: Option<Arc<Blocker>>,
}

impl Unit for Load {
    fn name(&self) -> &str {
        "load"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let token = self.fencer.token().revision;
        let _alive = self
            .recorder
            .alive(&self.task, &self.worker, ctx.generation(), token);
        let Some(blocker) = self.blocker.clone() else {
            return self.load(&ctx, token).await;
        };
        let load = self.load(&ctx, token);
        tokio::pin!(load);
        tokio::select! {
            exit = &mut load => exit,
            () = blocker.pulse() => load.await,
        }
    }
}

impl Load {
    /// The run's work, until the run is cancelled.
    async fn load(&mut self, ctx: &RunContext, token: i64) -> Result<RunExit, RunError> {
        if !self.writer {
            ctx.cancelled().await;
            return Ok(RunExit::Cancelled);
        }
        let mut written = 0u64;
        // Bounded by the run's cancellation.
        loop {
            let closed = tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                on = self.writes.wait_for(|on| *on) => on.is_err(),
            };
            if closed {
                ctx.cancelled().await;
                return Ok(RunExit::Cancelled);
            }
            // Spread the writers over the second.
            let mut next = Instant::now() + Duration::from_millis(fastrand::u64(0..1_000));
            while *self.writes.borrow() {
                tokio::select! {
                    () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                    () = tokio::time::sleep_until(next) => {}
                }
                next += Duration::from_secs(1);
                written += 1;
                let sent = now_ns();
                let outcome = match self
                    .fencer
                    .put_checkpoint("pos", written.to_string().into_bytes())
                    .await
                {
                    Ok(()) => WriteOutcome::Accepted,
                    Err(ClusterError::Fenced { .. }) => WriteOutcome::Rejected,
                    Err(_) => WriteOutcome::Unknown,
                };
                self.recorder
                    .write(&self.task, &self.worker, token, sent, outcome);
                if outcome == WriteOutcome::Rejected {
                    ctx.cancelled().await;
                    return Ok(RunExit::Cancelled);
                }
            }
        }
    }
}

/// The arguments of a worker process, after [`WORKER_FLAG`].
#[derive(Debug, Clone, PartialEq)]
struct WorkerArgs {
    id: String,
    endpoints: Vec<String>,
    prefix: String,
    history: PathBuf,
    ttl: Duration,
    capacity: usize,
    /// `--overload`'s blocking units (a seventh argument, `block={every},{span}`).
    block: Option<Block>,
}

impl WorkerArgs {
    fn to_vec(&self) -> Vec<String> {
        let mut args = vec![
            self.id.clone(),
            self.endpoints.join(","),
            self.prefix.clone(),
            self.history.display().to_string(),
            self.ttl.as_secs().to_string(),
            self.capacity.to_string(),
        ];
        if let Some(block) = self.block {
            args.push(format!("block={}", block.to_arg()));
        }
        args
    }

    fn parse(args: &[String]) -> Option<WorkerArgs> {
        let (block, args) = match args {
            [first @ .., last] if last.starts_with("block=") => {
                (Some(Block::parse(&last["block=".len()..])?), first)
            }
            _ => (None, args),
        };
        let [id, endpoints, prefix, history, ttl, capacity] = args else {
            return None;
        };
        Some(WorkerArgs {
            id: id.clone(),
            endpoints: endpoints.split(',').map(str::to_owned).collect(),
            prefix: prefix.clone(),
            history: history.into(),
            ttl: Duration::from_secs(ttl.parse().ok()?),
            capacity: capacity.parse().ok()?,
            block,
        })
    }
}

/// A worker process: joins (again whenever its lease is lost) and runs [`Load`]
/// units. Its stdin is a pipe from the run: `writes on` / `writes off` turn the
/// writers on and off; when it closes, the process exits.
fn worker_main(args: &[String]) -> ExitCode {
    let Some(args) = WorkerArgs::parse(args) else {
        eprintln!("cluster_scale: {WORKER_FLAG} is for the run's own worker processes");
        return ExitCode::from(2);
    };
    if std::env::var_os("RUST_LOG").is_some() {
        // The library's own log, into the worker's log file, when asked for.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let recorder = match Recorder::create(
        &args.history,
        &format!("worker-{}-{}", args.id, std::process::id()),
    ) {
        Ok(recorder) => recorder,
        Err(e) => {
            eprintln!("worker {}: cannot create its history: {e}", args.id);
            return ExitCode::FAILURE;
        }
    };
    let (writes, writes_rx) = watch::channel(false);
    std::thread::spawn(move || {
        // Bounded by the pipe: it ends when the run goes away.
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("writes on") => {
                    writes.send_replace(true);
                }
                Ok("writes off") => {
                    writes.send_replace(false);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .enable_all()
        .build()
    else {
        eprintln!("worker {}: could not start the tokio runtime", args.id);
        return ExitCode::FAILURE;
    };
    // One schedule for the whole process, over every join.
    let blocker = args.block.map(|block| Blocker::new(block, RUNTIME_THREADS));
    runtime.block_on(async move {
        // Bounded: at most 1,000 joins; the run ends the process long before.
        for _ in 0..1_000 {
            let file = args.endpoints[0].strip_prefix("sqlite:").map(PathBuf::from);
            let coord = match &file {
                Some(path) => SqliteCoordinator::open(path).await.map(AnyStore::new),
                None => EtcdCoordinator::connect(args.endpoints.clone(), EtcdOptions::default())
                    .await
                    .map(AnyStore::new),
            };
            let coord = match coord {
                Ok(coord) => coord,
                Err(error) => {
                    eprintln!("worker {}: connect failed: {error}", args.id);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let factory = {
                let (id, recorder, writes, blocker) = (
                    args.id.clone(),
                    Arc::clone(&recorder),
                    writes_rx.clone(),
                    blocker.clone(),
                );
                move |spec: TaskSpec| {
                    Ok(Task::builder(spec.task.as_str()).unit(Load {
                        task: spec.task.as_str().to_owned(),
                        worker: id.clone(),
                        writer: spec.spec == b"writer",
                        fencer: spec.fencer,
                        recorder: Arc::clone(&recorder),
                        writes: writes.clone(),
                        blocker: blocker.clone(),
                    }))
                }
            };
            let joined = Worker::builder(coord, &args.prefix, args.id.clone())
                .ttl(args.ttl)
                .capacity(args.capacity)
                .join(factory)
                .await;
            match joined {
                Ok(mut worker) => {
                    eprintln!("worker {}: joined, lease {:x}", args.id, worker.lease());
                    let ended = worker.closed().await;
                    eprintln!("worker {}: ended ({ended:?}); joining again", args.id);
                }
                Err(error) => {
                    eprintln!("worker {}: join failed: {error}", args.id);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    ExitCode::SUCCESS
}

// ------------------------------------------------------------------ the run

/// A worker process of the run.
struct Proc {
    id: String,
    /// What it was started with: a restart starts it again so.
    args: WorkerArgs,
    stdin: Option<ChildStdin>,
    /// Kills the process by pid when dropped (after `stdin` is closed).
    child: ChildGuard,
}

impl Proc {
    fn say(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// CPU ticks used so far, if the process is there.
    fn cpu_ticks(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.pid())).ok()?;
        cpu_ticks(&stat)
    }
}

/// The run's state: its processes, its controller and what it measured.
struct Run {
    options: Options,
    endpoints: Vec<String>,
    prefix: String,
    dir: PathBuf,
    history: PathBuf,
    controller: Controller,
    recorder: Arc<Recorder>,
    /// The worker processes. Locked between awaits only, never across one: the
    /// phases and the supervisor (with `--overload`) share them.
    procs: Mutex<Vec<Proc>>,
    next_worker: Cell<usize>,
    /// Whether the writers are on: a worker started meanwhile is told so.
    writes_on: Cell<bool>,
    /// With `--overload`: where each worker process's exit is sent.
    exits: Option<mpsc::UnboundedSender<u32>>,
    /// With `--overload`: workers that ended themselves on an overrun, and restarts.
    overruns: Cell<usize>,
    restarts: Cell<usize>,
    capacity: usize,
    tasks: Vec<String>,
    started: Instant,
}

fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "cluster_scale: {line}");
}

/// Whether the task is observed Running by its current owner for its desired
/// revision.
fn running(status: &TaskStatus) -> bool {
    status.desired == DesiredStage::Running
        && status.answers(status.desired_revision)
        && status.current_observed().map(|o| o.stage) == Some(Stage::Running)
}

impl Drop for Run {
    /// Also when the run is interrupted (Ctrl-C drops it): the checker must know
    /// that the runs of a killed process ended.
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Run {
    fn procs(&self) -> MutexGuard<'_, Vec<Proc>> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Kills every worker process by pid, each recorded once it is reaped.
    fn kill_all(&self) {
        let procs = std::mem::take(&mut *self.procs());
        for proc in procs {
            let pid = proc.child.pid();
            drop(proc);
            self.recorder.fault(Fault::Killed, pid);
        }
    }

    fn note(&self, line: &str) {
        say(&format!(
            "{:>7.2} s  {line}",
            self.started.elapsed().as_secs_f64()
        ));
    }

    /// Starts one more worker process.
    fn spawn_worker(&self) -> Result<(), ScaleError> {
        let n = self.next_worker.get();
        self.next_worker.set(n + 1);
        let id = format!("w{n}");
        let args = WorkerArgs {
            // --overload: the first worker's units block its runtime's threads.
            block: (self.options.overload && n == 1).then_some(BLOCK),
            id,
            endpoints: self.endpoints.clone(),
            prefix: self.prefix.clone(),
            history: self.history.clone(),
            ttl: self.options.ttl,
            capacity: self.capacity,
        };
        self.start(args)
    }

    /// Starts worker process `args.id` (again, after an overrun), its stderr
    /// appended to `{id}.log` in the run's directory; with `--overload`, its exit is
    /// watched.
    fn start(&self, args: WorkerArgs) -> Result<(), ScaleError> {
        let id = args.id.clone();
        let program = std::env::current_exe().map_err(io("find this program"))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{id}.log")))
            .map_err(io("create a worker's log"))?;
        let mut child = Command::new(program)
            .arg(WORKER_FLAG)
            .args(args.to_vec())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io("start a worker process"))?;
        let stdin = child.stdin.take();
        let pid = child.id();
        let blocks = if args.block.is_some() {
            ", its units blocking its runtime's threads"
        } else {
            ""
        };
        self.note(&format!("started worker {id} (pid {pid}){blocks}"));
        let mut proc = Proc {
            id,
            args,
            stdin,
            child: ChildGuard::new(child),
        };
        if let Some(exits) = &self.exits {
            let exits = exits.clone();
            overload::watch_exit(pid, Arc::clone(&self.recorder), move |pid| {
                let _ = exits.send(pid);
            });
        }
        if self.writes_on.get() {
            proc.say("writes on");
        }
        self.procs().push(proc);
        Ok(())
    }

    /// Turns the writers on or off, in every worker process, and in those started
    /// from now on.
    fn set_writes(&self, on: bool) {
        self.writes_on.set(on);
        for proc in self.procs().iter_mut() {
            proc.say(if on { "writes on" } else { "writes off" });
        }
    }

    /// With `--overload`: waits for worker processes' exits; restarts one that
    /// ended itself on an overrun, under the same id and arguments, as a supervisor
    /// would. Returns only with the failure that ends the run: any other exit of a
    /// worker process, or too many restarts. Without `--overload`, never returns.
    async fn supervise(&self, exits: Option<mpsc::UnboundedReceiver<u32>>) -> ScaleError {
        let Some(mut exits) = exits else {
            return std::future::pending().await;
        };
        // Bounded: one message per process started, and at most MAX_RESTARTS
        // processes are started again.
        while let Some(pid) = exits.recv().await {
            let Some((proc, status)) = self.reap(pid).await else {
                // One the run killed itself (the takeover's victim).
                continue;
            };
            if !overload::is_overrun(status) {
                return ScaleError::WorkerExited {
                    id: proc.id.clone(),
                    pid,
                    status,
                };
            }
            self.overruns.set(self.overruns.get() + 1);
            self.note(&format!(
                "worker {} (pid {pid}) ended itself on an overrun ({status}); its log says \
                 which tasks; restarting it",
                proc.id
            ));
            let args = proc.args.clone();
            drop(proc);
            if self.restarts.get() >= MAX_RESTARTS {
                return ScaleError::TooManyRestarts(self.restarts.get());
            }
            self.restarts.set(self.restarts.get() + 1);
            if let Err(e) = self.start(args) {
                return e;
            }
        }
        std::future::pending().await
    }

    /// The worker process `pid`, out of the run's list, and how it ended, once it
    /// is reaped; `None` if the run no longer holds it.
    async fn reap(&self, pid: u32) -> Option<(Proc, std::process::ExitStatus)> {
        // Bounded: 50 tries, 20 ms apart; the first succeeds, since the process
        // was seen gone (unreaped) before its pid was sent.
        for _ in 0..50 {
            {
                let mut procs = self.procs();
                let at = procs.iter().position(|p| p.child.pid() == pid)?;
                if let Some(status) = procs[at].child.try_wait() {
                    return Some((procs.remove(at), status));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn worker_ids(&self) -> Vec<String> {
        self.procs().iter().map(|p| p.id.clone()).collect()
    }

    /// How many worker processes the run holds.
    fn worker_count(&self) -> usize {
        self.procs().len()
    }

    /// With `--overload`: the CPU hogs, killed by pid when the guard drops.
    fn start_hogs(&self) -> Result<Option<Hogs>, ScaleError> {
        let n = self.options.hog_count();
        if n == 0 {
            return Ok(None);
        }
        let hogs = Hogs::start(n, HOG_BOUND).map_err(io("start the CPU hogs"))?;
        self.note(&format!(
            "{n} CPU-bound processes started beside the cluster (pids {:?})",
            hogs.pids()
        ));
        Ok(Some(hogs))
    }

    /// With `--overload`: the duty-cycle freeze of the last of the first workers,
    /// for two TTLs; the guard thaws it when dropped.
    fn start_freeze(&self) -> Result<Option<DutyCycle>, ScaleError> {
        if !self.options.overload {
            return Ok(None);
        }
        let id = format!("w{}", self.options.workers);
        let Some(pid) = self
            .procs()
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.child.pid())
        else {
            return Ok(None);
        };
        let span = 2 * self.options.ttl;
        let freeze = DutyCycle::start(pid, DUTY_STOPPED, DUTY_RUNNING, span)
            .map_err(io(format!("freeze worker {id}")))?;
        self.note(&format!(
            "worker {id} (pid {pid}) frozen {} ms of every {} ms for {} s",
            DUTY_STOPPED.as_millis(),
            (DUTY_STOPPED + DUTY_RUNNING).as_millis(),
            span.as_secs()
        ));
        Ok(Some(freeze))
    }

    /// Every task's status; a failed read is retried until `deadline`.
    async fn list(&self, deadline: Instant) -> Result<Vec<TaskStatus>, ClusterError> {
        // Bounded by the deadline.
        loop {
            match self.controller.list().await {
                Ok(list) => return Ok(list),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Waits until every task of `tasks` is [`running`] (all when `None`), reading
    /// the list every [`POLL`]; returns the last list.
    async fn until_running(
        &self,
        phase: &'static str,
        tasks: Option<&[String]>,
        bound: Duration,
        owner_not: Option<&str>,
    ) -> Result<Vec<TaskStatus>, ScaleError> {
        let deadline = Instant::now() + bound;
        let mut next_note = Instant::now() + PROGRESS;
        // Bounded by the deadline.
        loop {
            let list = self
                .list(deadline)
                .await
                .map_err(cluster(format!("{phase}: list the tasks")))?;
            let pending: Vec<&TaskStatus> = list
                .iter()
                .filter(|s| tasks.is_none_or(|t| t.iter().any(|t| t == s.task.as_str())))
                .filter(|s| {
                    !running(s)
                        || owner_not
                            .is_some_and(|o| s.owner.as_ref().map(|w| w.as_str()) == Some(o))
                })
                .collect();
            let counted = match tasks {
                Some(t) => t.len(),
                None => self.tasks.len(),
            };
            let seen = match tasks {
                Some(t) => list
                    .iter()
                    .filter(|s| t.iter().any(|t| t == s.task.as_str()))
                    .count(),
                None => list.len(),
            };
            if pending.is_empty() && seen == counted {
                return Ok(list);
            }
            if Instant::now() >= next_note {
                self.note(&format!(
                    "{phase}: {} of {counted} tasks observed Running",
                    seen - pending.len().min(seen)
                ));
                next_note = Instant::now() + PROGRESS;
            }
            if Instant::now() >= deadline {
                let first: Vec<String> = pending
                    .iter()
                    .take(3)
                    .map(|s| {
                        format!(
                            "{} (owner {:?}, observed {:?})",
                            s.task.as_str(),
                            s.owner.as_ref().map(|w| w.as_str()),
                            s.current_observed().map(|o| o.stage)
                        )
                    })
                    .collect();
                return Err(ScaleError::Timeout {
                    phase,
                    bound,
                    detail: format!(
                        "{} of {counted} tasks not observed Running, e.g. {}",
                        pending.len() + counted - seen,
                        first.join(", ")
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Range requests served so far, summed over every member's `/metrics`; `None`
    /// if a member did not answer.
    fn reads(&self) -> Option<f64> {
        if self.options.on_file {
            // No server counts them.
            return None;
        }
        let mut total = 0.0;
        for endpoint in &self.endpoints {
            let text = http_get(endpoint, "/metrics")?;
            total += metric_sum(
                &text,
                "grpc_server_handled_total",
                "grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\"",
            );
        }
        Some(total)
    }

    fn cpu(&self) -> Vec<Option<u64>> {
        self.procs().iter().map(Proc::cpu_ticks).collect()
    }

    /// Pauses and resumes each task of `tasks`, timing the pauses; with a budget,
    /// starts no pause once it is spent.
    async fn pauses(
        &self,
        tasks: &[String],
        budget: Option<Duration>,
    ) -> Result<Vec<Duration>, ScaleError> {
        let started = Instant::now();
        let mut took = Vec::with_capacity(tasks.len());
        for task in tasks {
            if budget.is_some_and(|budget| started.elapsed() >= budget) {
                break;
            }
            let sent = now_ns();
            let asked = Instant::now();
            let paused = self
                .controller
                .pause_within(task, COMMAND_BOUND)
                .await
                .map_err(cluster(format!("pause {task}")))?;
            took.push(asked.elapsed());
            // The checker holds the answer against the runs (rule 4: no rest stage
            // read while a run of the task was alive).
            self.recorder.observe(task, paused.stage, sent);
            self.controller
                .resume_within(task, COMMAND_BOUND)
                .await
                .map_err(cluster(format!("resume {task}")))?;
        }
        Ok(took)
    }

    /// Accepted fenced writes answered between `from` and `to` (`CLOCK_MONOTONIC`
    /// ns), from the workers' history files.
    fn accepted_between(&self, from: u64, to: u64) -> Result<usize, ScaleError> {
        let mut count = 0;
        let entries = std::fs::read_dir(&self.history).map_err(io("read the histories"))?;
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).map_err(io("read a history"))?;
            count += text
                .lines()
                .filter(|l| l.starts_with("write ") && l.ends_with(" accepted"))
                .filter_map(|l| l.split(' ').nth(2)?.parse::<u64>().ok())
                .filter(|acked| (from..to).contains(acked))
                .count();
        }
        Ok(count)
    }
}

/// `count` tasks of `tasks`, spread evenly, starting at `offset`.
fn spread(tasks: &[String], count: usize, offset: usize) -> Vec<String> {
    let count = count.min(tasks.len());
    (0..count)
        .map(|i| tasks[(offset + i * tasks.len() / count) % tasks.len()].clone())
        .collect()
}

/// GETs `path` from an `http://host:port` endpoint; the body, if it answered 200
/// within 2 s.
fn http_get(endpoint: &str, path: &str) -> Option<String> {
    let address = endpoint.strip_prefix("http://")?.trim_end_matches('/');
    let socket = std::net::ToSocketAddrs::to_socket_addrs(address)
        .ok()?
        .next()?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.")
        .then_some(())
        .filter(|()| head.split(' ').nth(1) == Some("200"))?;
    Some(body.to_owned())
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Sets up the cluster and runs every phase, filling `figures` as it goes.
async fn run(options: &Options, figures: &mut Figures, dir: &Path) -> Result<(), ScaleError> {
    let started = Instant::now();
    figures.tasks = options.tasks;
    figures.workers = options.workers;
    let file = dir.join("store.db");
    let (_etcd, endpoints) = match std::env::var("ETCD_ENDPOINTS") {
        _ if options.on_file => (None, vec![format!("sqlite:{}", file.display())]),
        Ok(list) if !list.trim().is_empty() => (
            None,
            list.split(',')
                .map(|e| e.trim().to_owned())
                .collect::<Vec<_>>(),
        ),
        _ => {
            let cluster = EtcdCluster::start_or_skip(3).ok_or(ScaleError::NoEtcd)?;
            let endpoints = cluster.endpoints();
            (Some(cluster), endpoints)
        }
    };
    let prefix = format!("scale-{}-{}", std::process::id(), now_ns());
    let history = dir.join("history");
    let coord = if options.on_file {
        AnyStore::new(
            SqliteCoordinator::open(&file)
                .await
                .map_err(cluster("open the store file"))?,
        )
    } else {
        AnyStore::new(
            EtcdCoordinator::connect(endpoints.clone(), EtcdOptions::default())
                .await
                .map_err(cluster("connect to etcd"))?,
        )
    };
    let recorder = Recorder::create(&history, "controller").map_err(io("create the history"))?;
    let (exits, exited) = if options.overload {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let run = Run {
        options: options.clone(),
        endpoints: endpoints.clone(),
        prefix: prefix.clone(),
        dir: dir.to_owned(),
        history,
        controller: Controller::new(coord, &prefix).map_err(cluster("make a controller"))?,
        recorder,
        procs: Mutex::new(Vec::new()),
        next_worker: Cell::new(1),
        writes_on: Cell::new(false),
        exits,
        overruns: Cell::new(0),
        restarts: Cell::new(0),
        capacity: options.capacity.unwrap_or(options.tasks),
        tasks: (0..options.tasks).map(|i| format!("t{i:05}")).collect(),
        started,
    };
    run.note(&format!(
        "store at {}; prefix {prefix}; {} tasks, {} workers, TTL {} s, capacity {}",
        endpoints.join(","),
        options.tasks,
        options.workers,
        options.ttl.as_secs(),
        run.capacity
    ));
    if options.overload {
        run.note(&format!(
            "overload: {} CPU hogs in the writes phase; w1's units block its runtime's \
             threads ({} ms of every {} ms); w{} frozen in a duty cycle for two TTLs from \
             the writes window",
            options.hog_count(),
            BLOCK.span.as_millis(),
            BLOCK.every.as_millis(),
            options.workers
        ));
    }
    let result = tokio::select! {
        result = phases(&run, figures) => result,
        failed = run.supervise(exited) => Err(failed),
    };
    if options.overload {
        figures.overload = Some(Overload {
            hogs: options.hog_count(),
            overrun_exits: run.overruns.get(),
            restarts: run.restarts.get(),
            ..Overload::default()
        });
    }
    // Every worker is killed (and recorded so) before the history is read.
    let final_list = run.controller.list().await;
    if let Ok(list) = &final_list {
        for status in list {
            run.recorder.end(
                status.task.as_str(),
                status.desired.name(),
                status.owner.as_ref().map(|w| w.as_str()),
            );
        }
    }
    run.kill_all();
    result
}

/// Every phase in turn; a phase that does not complete within its bound ends the run.
async fn phases(run: &Run, figures: &mut Figures) -> Result<(), ScaleError> {
    let writers = create_tasks(run).await?;
    let bound = SETUP_BOUND + Duration::from_millis(20 * run.options.tasks as u64);
    all_running(run, figures, bound).await?;
    rest(run, figures).await;
    pauses(run, figures).await?;
    writes(run, figures, writers).await?;
    rebalance(run, figures, bound).await?;
    takeover(run, figures, bound).await
}

/// Creates every task, 64 at a time; the first min(1,000, N) are writers. Returns
/// how many writers there are.
async fn create_tasks(run: &Run) -> Result<usize, ScaleError> {
    let n = run.options.tasks;
    let writers = n.min(MAX_WRITERS);
    let bound = SETUP_BOUND + Duration::from_millis(10 * n as u64);
    let deadline = Instant::now() + bound;
    for chunk in run.tasks.chunks(64).map(<[String]>::to_vec) {
        let mut set = tokio::task::JoinSet::new();
        for task in chunk {
            let controller = run.controller.clone();
            let index: usize = task[1..].parse().unwrap_or(usize::MAX);
            let spec = if index < writers { "writer" } else { "idle" };
            set.spawn(async move {
                let made = controller
                    .create(&task, spec.as_bytes().to_vec(), DesiredStage::Running)
                    .await;
                (task, made)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (task, made) = joined.map_err(|e| ScaleError::Io {
                what: "create a task".into(),
                source: std::io::Error::other(e),
            })?;
            made.map_err(cluster(format!("create {task}")))?;
        }
        if Instant::now() >= deadline {
            return Err(ScaleError::Timeout {
                phase: "creating the tasks",
                bound,
                detail: String::new(),
            });
        }
    }
    run.note(&format!("{n} tasks created ({writers} of them writers)"));
    Ok(writers)
}

/// Phase 1: from the start of the worker processes until every task is observed
/// Running.
async fn all_running(run: &Run, figures: &mut Figures, bound: Duration) -> Result<(), ScaleError> {
    let spawned = Instant::now();
    for _ in 0..run.options.workers {
        run.spawn_worker()?;
    }
    run.until_running("all running", None, bound, None).await?;
    figures.all_running = Some(spawned.elapsed());
    run.note(&format!(
        "every task observed Running {:.2} s after the workers started",
        spawned.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Phase 2: store reads and CPU per worker over [`WINDOW`], right after phase 1.
async fn rest(run: &Run, figures: &mut Figures) {
    let ticks = clock_ticks_per_second();
    let (reads0, cpu0, t0) = (run.reads(), run.cpu(), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (reads1, cpu1, window) = (run.reads(), run.cpu(), t0.elapsed().as_secs_f64());
    let workers = run.worker_count() as f64;
    if let (Some(a), Some(b)) = (reads0, reads1) {
        figures.rest_reads_per_s = Some((b - a) / window / workers);
    }
    let per_worker: Vec<f64> = cpu0
        .iter()
        .zip(&cpu1)
        .filter_map(|(a, b)| Some((b.as_ref()? - a.as_ref()?) as f64 / ticks / window * 100.0))
        .collect();
    if per_worker.len() == run.worker_count() {
        figures.rest_cpu_pct = Some(per_worker.iter().sum::<f64>() / workers);
    }
    run.note(&format!(
        "at rest over {window:.1} s: {} range reads a second per worker, CPU per worker {:?} % of a core",
        or_dash(figures.rest_reads_per_s, |r| format!("{r:.1}")),
        per_worker
            .iter()
            .map(|c| (c * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    ));
}

/// Phase 3: timed cluster-wide pauses of tasks spread over the ids.
async fn pauses(run: &Run, figures: &mut Figures) -> Result<(), ScaleError> {
    let pauses = run
        .pauses(&spread(&run.tasks, run.options.pauses, 0), None)
        .await?;
    figures.pause_p50 = quantile(&pauses, 0.5);
    figures.pause_p99 = quantile(&pauses, 0.99);
    run.note(&format!(
        "{} pauses: p50 {} ms, p99 {} ms, max {} ms",
        pauses.len(),
        or_dash(figures.pause_p50, millis),
        or_dash(figures.pause_p99, millis),
        or_dash(pauses.iter().max().copied(), millis)
    ));
    Ok(())
}

/// Phase 4: the writers write; accepted writes per second, then timed pauses of
/// writers while they write.
async fn writes(run: &Run, figures: &mut Figures, writers: usize) -> Result<(), ScaleError> {
    // --overload: the CPU hogs for the whole phase, killed by pid when this guard
    // drops (at the end of the phase, on an error, or when the run is interrupted).
    let _hogs = run.start_hogs()?;
    run.set_writes(true);
    tokio::time::sleep(WRITES_WARM_UP).await;
    let (reads0, from, t0) = (run.reads(), now_ns(), Instant::now());
    // --overload: the duty-cycle freeze from here, for two TTLs; thawed when the
    // guard drops, however the phase ends.
    let freeze = run.start_freeze()?;
    tokio::time::sleep(WINDOW).await;
    let (reads1, to, window) = (run.reads(), now_ns(), t0.elapsed().as_secs_f64());
    let accepted = run.accepted_between(from, to)?;
    figures.writes_per_s = Some(accepted as f64 / window);
    // --overload: the CPU hogs run until the pauses are done, so these get a time
    // budget (a debug build took 9 min for 50 pauses and resumes under overload).
    let budget = run.options.overload.then_some(OVERLOAD_PAUSES_BUDGET);
    let under = run
        .pauses(
            &spread(&run.tasks[..writers], run.options.pauses, 1),
            budget,
        )
        .await;
    run.set_writes(false);
    if let Some(freeze) = freeze {
        // Bounded by the freeze's span (two TTLs from the window's start, over by
        // now unless the TTL is longer than the window and the pauses together).
        let deadline = Instant::now() + 2 * run.options.ttl;
        while !freeze.is_done() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cycles = freeze.finish();
        run.note(&format!(
            "duty-cycle freeze over after {cycles} freezes; thawed"
        ));
    }
    let under = under?;
    let workers = run.worker_count() as f64;
    figures.pause_p99_under_writes = quantile(&under, 0.99);
    let planned = run.options.pauses.min(writers);
    let cut = if under.len() < planned {
        format!(
            " (of {planned}: --overload starts none after {} s)",
            OVERLOAD_PAUSES_BUDGET.as_secs()
        )
    } else {
        String::new()
    };
    run.note(&format!(
        "{writers} writers: {accepted} fenced writes accepted in {window:.1} s, {} range reads \
         a second per worker meanwhile; {} pauses under writes{cut}: p50 {} ms, p99 {} ms",
        or_dash(
            reads0.zip(reads1).map(|(a, b)| (b - a) / window / workers),
            |r| format!("{r:.1}")
        ),
        under.len(),
        or_dash(quantile(&under, 0.5), millis),
        or_dash(figures.pause_p99_under_writes, millis),
    ));
    Ok(())
}

/// Phase 5: one more worker joins; the time until the balance is reached.
async fn rebalance(run: &Run, figures: &mut Figures, bound: Duration) -> Result<(), ScaleError> {
    let before = run
        .until_running("all running before the rebalance", None, bound, None)
        .await?;
    let owner_of = |list: &[TaskStatus]| -> Vec<(String, Option<String>)> {
        list.iter()
            .map(|s| {
                (
                    s.task.as_str().to_owned(),
                    s.owner.as_ref().map(|w| w.as_str().to_owned()),
                )
            })
            .collect()
    };
    let before = owner_of(&before);
    run.spawn_worker()?;
    let joined = Instant::now();
    let ids = run.worker_ids();
    let deadline = joined + REBALANCE_BOUND;
    let mut last = before.clone();
    figures.rebalance = Some(None);
    // Bounded by the deadline.
    loop {
        if let Ok(list) = run.controller.list().await {
            last = owner_of(&list);
            let b = balance(&last, &ids).unwrap_or(f64::INFINITY);
            figures.balance = Some(b);
            if b <= BALANCE_GOAL {
                figures.rebalance = Some(Some(joined.elapsed()));
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let moved = before
        .iter()
        .zip(&last)
        .filter(|((ta, a), (tb, b))| ta == tb && a != b)
        .count();
    figures.moved = Some(moved);
    let counts: Vec<(String, usize)> = ids
        .iter()
        .map(|w| {
            let held = last
                .iter()
                .filter(|(_, o)| o.as_deref() == Some(w.as_str()))
                .count();
            (w.clone(), held)
        })
        .collect();
    let reached = match figures.rebalance {
        Some(Some(took)) => format!("balance <= {BALANCE_GOAL} reached in {} s", secs(took)),
        _ => format!(
            "balance still {} after {} s",
            or_dash(figures.balance, ratio),
            REBALANCE_BOUND.as_secs()
        ),
    };
    run.note(&format!(
        "rebalance: {reached} ({moved} tasks moved); tasks per worker {counts:?}"
    ));
    Ok(())
}

/// Phase 6: the busiest worker killed with SIGKILL; the time until each of its
/// tasks is observed Running on another worker.
async fn takeover(run: &Run, figures: &mut Figures, bound: Duration) -> Result<(), ScaleError> {
    let list = run
        .until_running("all running before the takeover", None, bound, None)
        .await?;
    let ids = run.worker_ids();
    let Some((victim, _)) = harness::per_worker(&list, &ids)
        .into_iter()
        .max_by_key(|(_, held)| *held)
    else {
        return Ok(());
    };
    let held: Vec<String> = list
        .iter()
        .filter(|s| s.owner.as_ref().map(|w| w.as_str()) == Some(victim.as_str()))
        .map(|s| s.task.as_str().to_owned())
        .collect();
    let victim_proc = {
        let mut procs = run.procs();
        procs
            .iter()
            .position(|p| p.id == victim)
            .map(|at| procs.remove(at))
    };
    let Some(proc) = victim_proc else {
        return Ok(());
    };
    let pid = proc.child.pid();
    let killed = Instant::now();
    drop(proc);
    run.recorder.fault(Fault::Killed, pid);
    run.note(&format!(
        "killed worker {victim} (pid {pid}) with SIGKILL, holding {} tasks",
        held.len()
    ));
    let takeover_bound = run.options.ttl + TAKEOVER_BOUND;
    run.until_running("takeover", Some(&held), takeover_bound, Some(&victim))
        .await?;
    figures.takeover = Some(killed.elapsed());
    run.note(&format!(
        "takeover: every task of {victim} observed Running elsewhere after {:.2} s",
        killed.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Runs the scale run, then the history checker; prints the figures last.
fn scale_main(args: &[String]) -> ExitCode {
    let options = match parse(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("cluster_scale: {e}");
            return ExitCode::from(2);
        }
    };
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("cluster_scale: could not start the tokio runtime");
        return ExitCode::FAILURE;
    };
    let dir = std::env::temp_dir().join(format!(
        "taskstage-cluster-scale-{}-{}",
        std::process::id(),
        now_ns()
    ));
    let mut figures = Figures {
        tasks: options.tasks,
        workers: options.workers,
        ..Figures::default()
    };
    let outcome = match std::fs::create_dir_all(&dir) {
        Err(e) => Err(ScaleError::Io {
            what: format!("create {}", dir.display()),
            source: e,
        }),
        Ok(()) => runtime.block_on(async {
            tokio::select! {
                outcome = run(&options, &mut figures, &dir) => outcome,
                _ = tokio::signal::ctrl_c() => Err(ScaleError::Interrupted),
            }
        }),
    };
    // The run's future is gone: every process it started has been stopped by pid.
    let mut ok = true;
    if let Err(e) = &outcome {
        eprintln!("cluster_scale: FAILED: {e}");
        ok = false;
    }
    let history = dir.join("history");
    match History::load(&history) {
        // Nothing ran: the failure above says why.
        Err(_) if outcome.is_err() && !history.exists() => {}
        Ok(history) => {
            let verdict = history.check(THAW_ALLOWANCE);
            eprintln!("cluster_scale: history: {verdict}");
            figures.max_live_runs = Some(verdict.max_live);
            if !verdict.passed() || verdict.max_live > 1 {
                eprintln!("cluster_scale: FAILED: the history checker found violations");
                ok = false;
            }
        }
        Err(e) => {
            eprintln!("cluster_scale: FAILED: the history could not be read: {e}");
            ok = false;
        }
    }
    let lease_losses = overload::rejoins(&dir);
    eprintln!(
        "cluster_scale: worker processes joined again after losing their lease {lease_losses} times"
    );
    if options.overload {
        let o = figures.overload.get_or_insert_with(|| Overload {
            hogs: options.hog_count(),
            ..Overload::default()
        });
        o.lease_losses = lease_losses;
        eprintln!(
            "cluster_scale: worker processes ended themselves on an overrun (status {}) {} \
             times, and were restarted {} times",
            overload::OVERRUN_EXIT_CODE,
            o.overrun_exits,
            o.restarts
        );
    }
    if ok {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "cluster_scale: the work directory is kept: {}",
            dir.display()
        );
    }
    println!("{figures}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == WORKER_FLAG) {
        return worker_main(&args[1..]);
    }
    scale_main(&args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn arguments_are_parsed_and_bad_ones_refused_by_name() {
        let options = parse(&args("--tasks 1000 --workers 3 --ttl-secs 2 --pauses 60"))
            .expect("good arguments");
        assert_eq!(options.tasks, 1_000);
        assert_eq!(options.workers, 3);
        assert_eq!(options.ttl, Duration::from_secs(2));
        assert_eq!(options.pauses, 60);
        assert_eq!(parse(&[]), Ok(Options::default()));
        assert_eq!(
            parse(&args("--tasks")),
            Err(ArgError::Missing("--tasks".into()))
        );
        assert!(matches!(
            parse(&args("--tasks 0")),
            Err(ArgError::Bad { option, .. }) if option == "--tasks"
        ));
        assert!(matches!(
            parse(&args("--ttl-secs 1")),
            Err(ArgError::Bad { option, .. }) if option == "--ttl-secs"
        ));
        assert_eq!(
            parse(&args("--task 3")),
            Err(ArgError::Unknown("--task".into()))
        );
    }

    #[test]
    fn overload_and_its_hogs_are_parsed_and_hogs_alone_refused() {
        let plain = parse(&args("--tasks 1000 --workers 3")).expect("good arguments");
        assert!(!plain.overload);
        assert_eq!(plain.hog_count(), 0, "no hog without --overload");
        let loaded = parse(&args("--tasks 1000 --workers 3 --overload")).expect("good arguments");
        assert!(loaded.overload);
        assert_eq!(loaded.hogs, None);
        assert_eq!(loaded.hog_count(), overload::hogs_per_core());
        assert_eq!(
            Options {
                overload: false,
                ..loaded.clone()
            },
            plain,
            "--overload changes nothing else"
        );
        let counted = parse(&args("--hogs 12 --overload")).expect("good arguments");
        assert_eq!((counted.overload, counted.hogs), (true, Some(12)));
        assert_eq!(counted.hog_count(), 12);
        assert_eq!(
            parse(&args("--hogs 12")),
            Err(ArgError::NeedsOverload("--hogs".into()))
        );
        assert!(matches!(
            parse(&args("--overload --hogs 0")),
            Err(ArgError::Bad { option, .. }) if option == "--hogs"
        ));
        assert_eq!(
            parse(&args("--overload --hogs")),
            Err(ArgError::Missing("--hogs".into()))
        );
        let unknown = ArgError::Unknown("--x".into()).to_string();
        assert!(
            unknown.contains("--overload") && unknown.contains("--hogs N"),
            "{unknown}"
        );
    }

    #[test]
    fn a_worker_s_arguments_go_through_its_command_line_unchanged() {
        let worker = WorkerArgs {
            id: "w4".into(),
            endpoints: vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
            prefix: "scale-1-2".into(),
            history: "/tmp/h".into(),
            ttl: Duration::from_secs(5),
            capacity: 1_000,
            block: None,
        };
        assert_eq!(worker.to_vec().len(), 6, "without --overload, as before");
        assert_eq!(WorkerArgs::parse(&worker.to_vec()), Some(worker.clone()));
        let blocking = WorkerArgs {
            block: Some(BLOCK),
            ..worker
        };
        assert_eq!(blocking.to_vec().len(), 7);
        assert_eq!(WorkerArgs::parse(&blocking.to_vec()), Some(blocking));
        assert_eq!(WorkerArgs::parse(&args("w1 x")), None);
        assert_eq!(
            WorkerArgs::parse(&args("w1 e p h 5 10 block=150,2000")),
            None,
            "a span longer than its period"
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(quantile(&samples, 0.5), Some(ms(50)));
        assert_eq!(quantile(&samples, 0.99), Some(ms(99)));
        assert_eq!(quantile(&samples[..50], 0.99), Some(ms(100)));
        assert_eq!(quantile(&[ms(7)], 0.5), Some(ms(7)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn balance_is_most_over_fewest_and_infinite_for_an_idle_worker() {
        let owners: Vec<(String, Option<String>)> = [
            ("a", Some("w1")),
            ("b", Some("w1")),
            ("c", Some("w2")),
            ("d", None),
        ]
        .iter()
        .map(|(t, o)| ((*t).to_owned(), o.map(str::to_owned)))
        .collect();
        let two = ["w1".to_owned(), "w2".to_owned()];
        assert_eq!(balance(&owners, &two), Some(2.0));
        let three = ["w1".to_owned(), "w2".to_owned(), "w3".to_owned()];
        assert_eq!(balance(&owners, &three), Some(f64::INFINITY));
        assert_eq!(balance(&owners, &[]), None);
    }

    #[test]
    fn range_requests_are_summed_over_codes_from_etcd_s_metrics() {
        let text = "\
# HELP grpc_server_handled_total Total number of RPCs completed on the server.
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 120
grpc_server_handled_total{grpc_code=\"Unavailable\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 50
grpc_server_handled_total_other{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\"} 1000
etcd_mvcc_range_total 7
";
        let labels = "grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\"";
        assert_eq!(metric_sum(text, "grpc_server_handled_total", labels), 123.0);
        assert_eq!(metric_sum(text, "etcd_mvcc_range_total", ""), 7.0);
        assert_eq!(metric_sum(text, "absent", ""), 0.0);
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name_even_with_spaces() {
        let stat = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 37 5 0 0 20 0 3 0";
        assert_eq!(cpu_ticks(stat), Some(42));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn the_line_names_every_figure_and_dashes_what_was_not_measured() {
        let figures = Figures {
            tasks: 100,
            workers: 3,
            all_running: Some(Duration::from_millis(1_250)),
            rebalance: Some(None),
            balance: Some(f64::INFINITY),
            max_live_runs: Some(1),
            ..Figures::default()
        };
        assert_eq!(
            figures.to_string(),
            "cluster_scale tasks=100 workers=3 all_running_s=1.25 rest_reads_per_s=- \
             rest_cpu_pct=- pause_p50_ms=- pause_p99_ms=- writes_per_s=- \
             pause_p99_ms_under_writes=- takeover_s=- rebalance_s=timeout moved=- \
             max_live_runs=1 balance=inf"
        );
        let loaded = Figures {
            overload: Some(Overload {
                hogs: 4,
                lease_losses: 36,
                overrun_exits: 2,
                restarts: 2,
            }),
            ..figures.clone()
        };
        assert_eq!(
            loaded.to_string(),
            format!("{figures} hogs=4 lease_losses=36 overrun_exits=2 restarts=2"),
            "--overload's counts at the end, the rest unchanged"
        );
    }

    #[test]
    fn spread_picks_distinct_tasks_across_the_range() {
        let tasks: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        assert_eq!(spread(&tasks, 5, 0), ["t0", "t2", "t4", "t6", "t8"]);
        assert_eq!(spread(&tasks, 5, 1), ["t1", "t3", "t5", "t7", "t9"]);
        assert_eq!(spread(&tasks, 50, 0).len(), 10);
    }
}
