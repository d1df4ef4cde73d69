//! The restart run: several tables migrated by a worker process on the store file of
//! one machine, which is killed with SIGKILL in the middle of a copy and started
//! again.
//!
//! The controller (this process) opens the store file, creates one task per table,
//! and starts one worker process (this program again, with [`WORKER_FLAG`]). When
//! every table is being copied it pauses the first [`PAUSED`] tables, and once the
//! others are in the middle of their load it kills the worker with SIGKILL. It checks
//! the store file's integrity and starts the worker again. Then it checks what the
//! kill could have broken:
//! - the paused tables are still Paused, and none of their units ran again;
//! - the others resume from their checkpoints: the new process continues each step
//!   from the rows the killed one committed;
//! - no two runs of a table were ever live at once (the history checker over every
//!   process's history);
//! - after a resume of the paused tables, every target equals its source.
//!
//! Needs no server: the store is one SQLite file in the run's work directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use taskstage::{Stage, Task};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, SqliteCoordinator, TaskSpec, TaskStatus, Worker,
};
use taskstage_harness::cluster::history::{now_ns, Fault, History, Recorder, Verdict};
use taskstage_harness::cluster::ChildGuard;
use tokio::time::Instant;

use crate::migrate::db::{self, Db, WORK_BUSY};
pub use crate::migrate::fenced::Launcher;
use crate::migrate::fenced::{FencedStep, Table};
use crate::migrate::report::{thousands, Screen, UNIT_NAMES};

/// The first argument of the restart run.
pub const RESTART_FLAG: &str = "--restart";
/// The hidden first argument of the worker process that the restart run starts.
pub const WORKER_FLAG: &str = "--restart-worker";
/// The tables migrated, one task each.
pub const TABLES: usize = 4;
/// How many of them (the first ones) the controller pauses before the kill.
pub const PAUSED: usize = 2;
/// Rows per table unless `--rows` says otherwise.
pub const DEFAULT_ROWS: u64 = 50_000;
/// The smallest `--rows`: enough batches for the kill to land in a copy.
pub const MIN_ROWS: u64 = 1_000;

/// The worker's lease TTL: a killed worker's tables move after it.
const TTL: Duration = Duration::from_secs(2);
const STOP_BOUND: Duration = Duration::from_millis(600);
const RESYNC: Duration = Duration::from_millis(200);
/// The history checker's allowance for a frozen process (none is frozen here).
const ALLOWANCE: Duration = Duration::from_millis(1_500);
/// The bound of every wait of the controller.
const WAIT: Duration = Duration::from_secs(30);

/// The options of a restart run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOptions {
    /// Rows in each generated table.
    pub rows: u64,
    /// The seed of the generated data.
    pub seed: u64,
    /// Print only the final summary.
    pub quiet: bool,
}

/// A restart run that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// A bad option or value.
    #[error(transparent)]
    Cli(#[from] crate::migrate::cli::CliError),
    /// A database step failed.
    #[error(transparent)]
    Db(#[from] db::DbError),
    /// A call to the store failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A file or a process could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A wait of the script ran past its bound.
    #[error("{0} did not happen within 30 s")]
    Timeout(String),
    /// A blocking step did not complete.
    #[error("a database step did not complete: {0}")]
    Join(#[from] tokio::task::JoinError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RestartError {
    let what = what.into();
    move |source| RestartError::Io { what, source }
}

/// Parses `--restart [--rows N] [--seed N] [--quiet]` (after the flag).
///
/// # Errors
///
/// A [`CliError`](crate::migrate::cli::CliError) naming the offending option.
pub fn parse(args: &[OsString], seed: u64) -> Result<RestartOptions, RestartError> {
    use crate::migrate::cli::{number, CliError, MAX_ROWS};
    let mut options = RestartOptions {
        rows: DEFAULT_ROWS,
        seed,
        quiet: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.to_string_lossy().as_ref() {
            "--quiet" => options.quiet = true,
            "--rows" => options.rows = number("--rows", args.next().cloned(), MIN_ROWS, MAX_ROWS)?,
            "--seed" => options.seed = number("--seed", args.next().cloned(), 0, u64::MAX)?,
            other => return Err(CliError::UnknownOption(other.to_owned()).into()),
        }
    }
    Ok(options)
}

/// What became of one table.
#[derive(Debug, Clone)]
pub struct TableReport {
    /// The task's name.
    pub task: String,
    /// Whether the controller paused it before the kill.
    pub paused: bool,
    /// Items done per step when the worker was killed.
    pub at_kill: [u64; 3],
    /// Items done per step when the second process first moved it on, or (a paused
    /// table) when it was resumed.
    pub after: [u64; 3],
    /// Its desired stage in the store after the restart, before any resume.
    pub desired_after_restart: DesiredStage,
    /// The stage the second process reported for it before any resume: for a paused
    /// table, New (it holds the task and has not run it) or Paused.
    pub stage_after_restart: Stage,
    /// Runs of it that started while it was paused (must be 0).
    pub runs_while_paused: usize,
    /// Source and target digests at the end.
    pub digests: (db::Digest, db::Digest),
}

impl TableReport {
    /// Whether the kill changed nothing this table's promise forbids.
    pub fn survived(&self) -> bool {
        let kept = self.at_kill.iter().zip(&self.after).all(|(a, b)| b >= a);
        let stage = if self.paused {
            self.desired_after_restart == DesiredStage::Paused
                && DesiredStage::Paused.answered_by(self.stage_after_restart, false)
                && self.runs_while_paused == 0
                && self.at_kill == self.after
        } else {
            self.desired_after_restart == DesiredStage::Running
                && DesiredStage::Running.answered_by(self.stage_after_restart, false)
        };
        kept && stage && self.digests.0 == self.digests.1
    }
}

/// What a restart run did and found.
#[derive(Debug)]
pub struct RestartSummary {
    /// Elapsed time and event, in order.
    pub timeline: Vec<(Duration, String)>,
    /// The fault injected.
    pub killed: String,
    /// SQLite's integrity check of the store file right after the kill.
    pub integrity: String,
    /// How long after the kill the second process answered for the running tables.
    pub takeover: Duration,
    /// Each table.
    pub tables: Vec<TableReport>,
    /// The history checker's verdict.
    pub verdict: Verdict,
}

impl RestartSummary {
    /// Whether every table survived, the store file is sound, and the history
    /// checker passed with at most one live run.
    pub fn verified(&self) -> bool {
        self.integrity == "ok"
            && self.tables.iter().all(TableReport::survived)
            && self.verdict.passed()
            && self.verdict.max_live == 1
    }

    /// The summary, as printed.
    pub fn render(&self) -> String {
        let mut out = String::from("\ntimeline (restart on the store file):\n");
        for (at, what) in &self.timeline {
            out.push_str(&format!("  {:>7.2} s  {what}\n", at.as_secs_f64()));
        }
        out.push_str(&format!("killed: {}\n", self.killed));
        out.push_str(&format!(
            "store file integrity after the kill: {}\n",
            self.integrity
        ));
        out.push_str("survived:\n");
        let step = |items: &[u64; 3]| {
            UNIT_NAMES
                .iter()
                .zip(items)
                .map(|(n, i)| format!("{n} {}", thousands(*i)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for t in &self.tables {
            let line = if t.paused {
                format!(
                    "{}: paused before the kill; after the restart desired {}, and w2 holds it as {:?} with {} runs until its resume; checkpoints kept ({})",
                    t.task,
                    t.desired_after_restart,
                    t.stage_after_restart,
                    t.runs_while_paused,
                    step(&t.at_kill)
                )
            } else {
                format!(
                    "{}: running at the kill ({}), resumed from there by the new process ({})",
                    t.task,
                    step(&t.at_kill),
                    step(&t.after)
                )
            };
            let mark = if t.survived() { "ok" } else { "FAILED" };
            out.push_str(&format!("  [{mark}] {line}\n"));
        }
        let v = &self.verdict;
        for violation in &v.violations {
            out.push_str(&format!("  violation: {violation}\n"));
        }
        out.push_str(&format!(
            "the new process answered for the running tables {:.2} s after the kill (lease TTL {} s)\n",
            self.takeover.as_secs_f64(),
            TTL.as_secs()
        ));
        out.push_str(&format!(
            "history: {} runs, {} fenced batches accepted; max live runs {} per table\n",
            v.runs, v.accepted, v.max_live
        ));
        let equal = self
            .tables
            .iter()
            .filter(|t| t.digests.0 == t.digests.1)
            .count();
        out.push_str(&format!(
            "targets equal to their sources: {equal} of {}\n",
            self.tables.len()
        ));
        out.push_str(if self.verified() {
            "restart verification: passed\n"
        } else {
            "restart verification: FAILED\n"
        });
        out
    }
}

/// The example's entry for the restart run: its worker (after [`WORKER_FLAG`]) or
/// the whole run (the options after [`RESTART_FLAG`]).
pub fn main(args: Vec<OsString>) -> ExitCode {
    if args.first().is_some_and(|a| a == WORKER_FLAG) {
        let rest: Vec<String> = args[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return worker_main(&rest);
    }
    let rest = if args.first().is_some_and(|a| a == RESTART_FLAG) {
        &args[1..]
    } else {
        &args[..]
    };
    let options = match parse(rest, fastrand::u64(..)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("migrate: {e}");
            return ExitCode::from(2);
        }
    };
    let screen = Arc::new(Screen::new(options.quiet));
    let result = run_blocking(&options, &screen);
    screen.finish();
    match result {
        Ok(summary) => {
            print!("{}", summary.render());
            if summary.verified() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("migrate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the restart run on a runtime of its own, with this program as its worker.
///
/// # Errors
///
/// As [`run`]; and [`RestartError::Io`] when this program's path or a runtime
/// cannot be had.
pub fn run_blocking(
    options: &RestartOptions,
    screen: &Arc<Screen>,
) -> Result<RestartSummary, RestartError> {
    let program = std::env::current_exe().map_err(io("find this program to start its worker"))?;
    let launcher = Launcher {
        program,
        args: vec![WORKER_FLAG.into()],
        env: None,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(io("start a tokio runtime"))?;
    runtime.block_on(run(options, &launcher, Arc::clone(screen)))
}

// ------------------------------------------------------------------ the worker

/// The arguments of the worker process, in order.
struct WorkerArgs {
    id: String,
    store: PathBuf,
    prefix: String,
    work: PathBuf,
    history: PathBuf,
    batch: usize,
}

impl WorkerArgs {
    fn to_vec(&self) -> Vec<String> {
        vec![
            self.id.clone(),
            self.store.display().to_string(),
            self.prefix.clone(),
            self.work.display().to_string(),
            self.history.display().to_string(),
            self.batch.to_string(),
        ]
    }

    fn parse(args: &[String]) -> Option<WorkerArgs> {
        let [id, store, prefix, work, history, batch] = args else {
            return None;
        };
        Some(WorkerArgs {
            id: id.clone(),
            store: store.into(),
            prefix: prefix.clone(),
            work: work.into(),
            history: history.into(),
            batch: batch.parse().ok()?,
        })
    }
}

/// The name of table `i` (from 1) and its task.
fn table_name(i: usize) -> String {
    format!("table-{i}")
}

/// Table `task`'s databases in the work directory `work`.
fn table(work: &Path, task: &str, batch: usize) -> Table {
    Table {
        task: task.to_owned(),
        source: work.join(task).join("source.db"),
        target: work.join(task).join("target.db"),
        batch,
    }
}

/// The worker process: joins on the store file and runs the tables it owns. It exits
/// when its stdin (a pipe from the controller) closes, or when it is killed.
pub fn worker_main(args: &[String]) -> ExitCode {
    let Some(args) = WorkerArgs::parse(args) else {
        eprintln!("migrate: the restart run's worker takes 6 arguments, not {args:?}");
        return ExitCode::from(2);
    };
    let (history, id) = (args.history.clone(), args.id.clone());
    crate::migrate::fenced::worker_process(&history, &id, |recorder| {
        serve(Arc::new(args), recorder)
    })
}

async fn serve(args: Arc<WorkerArgs>, recorder: Arc<Recorder>) {
    // Bounded: at most 1,000 joins; the controller ends the process long before.
    for _ in 0..1_000 {
        let coord = match SqliteCoordinator::open(&args.store).await {
            Ok(coord) => coord,
            Err(e) => {
                eprintln!("worker {}: {e}", args.id);
                tokio::time::sleep(RESYNC).await;
                continue;
            }
        };
        let factory = {
            let (args, recorder) = (Arc::clone(&args), Arc::clone(&recorder));
            move |spec: TaskSpec| {
                let name = spec.task.as_str();
                if !(1..=TABLES).any(|i| table_name(i) == name) {
                    return Err(format!("no table is named {name:?}").into());
                }
                let table = Arc::new(table(&args.work, name, args.batch));
                let unit = |step| FencedStep {
                    step,
                    table: Arc::clone(&table),
                    worker: args.id.clone(),
                    fencer: spec.fencer.clone(),
                    recorder: Arc::clone(&recorder),
                };
                Ok(Task::builder(name)
                    .unit(unit(0))
                    .unit(unit(1))
                    .unit(unit(2)))
            }
        };
        let joined = Worker::builder(coord, args.prefix.clone(), args.id.clone())
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .resync(RESYNC)
            .capacity(TABLES)
            .join(factory)
            .await;
        match joined {
            Ok(mut worker) => {
                let ended = worker.closed().await;
                eprintln!("worker {}: ended ({ended:?}); joining again", args.id);
            }
            Err(e) => {
                eprintln!("worker {}: {e}", args.id);
                tokio::time::sleep(RESYNC).await;
            }
        }
    }
}

// ------------------------------------------------------------------ the controller

/// The controller's view of the run.
struct Script {
    started: Instant,
    timeline: Vec<(Duration, String)>,
    screen: Arc<Screen>,
    controller: Controller,
    tables: Vec<Table>,
    rows: u64,
}

impl Script {
    fn note(&mut self, what: String) {
        self.screen.say(&what);
        self.timeline.push((self.started.elapsed(), what));
    }

    /// Items done per step of table `i`, from its target's checkpoints.
    async fn progress(&self, i: usize) -> [u64; 3] {
        let target = self.tables[i].target.clone();
        crate::migrate::fenced::progress(target).await
    }

    async fn show_progress(&self) {
        let mut sum = [0; 3];
        for i in 0..self.tables.len() {
            for (s, d) in sum.iter_mut().zip(self.progress(i).await) {
                *s += d;
            }
        }
        let total = self.rows * self.tables.len() as u64;
        for (step, items) in sum.iter().enumerate() {
            self.screen
                .progress(step, *items, (step < 2).then_some(total));
        }
    }

    /// Whether table `i` has done `share` % of step `step`'s rows, or gone past it.
    async fn reached(&self, i: usize, step: usize, share: u64) -> bool {
        let done = self.progress(i).await;
        done[step] * 100 >= self.rows * share || done[step + 1..].iter().any(|d| *d > 0)
    }

    async fn status(&self, i: usize) -> Option<TaskStatus> {
        self.controller.status(&self.tables[i].task).await.ok()
    }

    /// Polls until `check` returns `Some`, showing progress; bounded by [`WAIT`].
    async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> Result<T, RestartError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            self.show_progress().await;
            if let Some(value) = check().await {
                return Ok(value);
            }
            if Instant::now() >= deadline {
                return Err(RestartError::Timeout(what.to_owned()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The stage `worker` reported for table `i`, once that report answers the
    /// current desired revision.
    async fn answered_by(&self, i: usize, worker: &str) -> Option<Stage> {
        let status = self.status(i).await?;
        let observed = status.current_observed()?;
        (status.answers(status.desired_revision) && observed.owner.as_str() == worker)
            .then_some(observed.stage)
    }
}

/// Runs the whole restart run in a fresh work directory, removed when it verified.
///
/// # Errors
///
/// [`RestartError`] when the run could not be set up or a step of the script did
/// not happen within its bound; the worker processes are stopped by pid either way.
pub async fn run(
    options: &RestartOptions,
    launcher: &Launcher,
    screen: Arc<Screen>,
) -> Result<RestartSummary, RestartError> {
    let work = std::env::temp_dir().join(format!(
        "taskstage-migrate-restart-{}-{}",
        std::process::id(),
        now_ns()
    ));
    std::fs::create_dir_all(&work).map_err(io("create the work directory"))?;
    let result = run_in(options, launcher, screen, &work).await;
    if result.as_ref().is_ok_and(RestartSummary::verified) {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        eprintln!("migrate: the work directory is kept: {}", work.display());
    }
    result
}

/// Starts worker `id`; dropping the guard kills it with SIGKILL and reaps it.
fn start_worker(
    launcher: &Launcher,
    args: &WorkerArgs,
    work: &Path,
) -> Result<ChildGuard, RestartError> {
    let log = std::fs::File::create(work.join(format!("{}.log", args.id)))
        .map_err(io("create the worker's log"))?;
    let child = launcher
        .command(&args.to_vec())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(io("start the worker process"))?;
    Ok(ChildGuard::new(child))
}

/// SQLite's own check of the store file, from a connection of its own.
fn integrity(store: &Path) -> String {
    let check = || -> rusqlite::Result<String> {
        let conn = rusqlite::Connection::open_with_flags(
            store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))
    };
    check().unwrap_or_else(|e| format!("could not be read: {e}"))
}

async fn run_in(
    options: &RestartOptions,
    launcher: &Launcher,
    screen: Arc<Screen>,
    work: &Path,
) -> Result<RestartSummary, RestartError> {
    let started = Instant::now();
    let batch = usize::try_from((options.rows / 100).clamp(50, 2_000)).unwrap_or(2_000);
    let tables: Vec<Table> = (1..=TABLES)
        .map(|i| table(work, &table_name(i), batch))
        .collect();
    screen.say(&format!(
        "generating {TABLES} tables of {} rows each",
        thousands(options.rows)
    ));
    for (i, t) in tables.iter().enumerate() {
        std::fs::create_dir_all(work.join(&t.task)).map_err(io("create a table's directory"))?;
        let (source, target) = (t.source.clone(), t.target.clone());
        let (rows, seed) = (options.rows, options.seed.wrapping_add(i as u64));
        tokio::task::spawn_blocking(move || {
            db::generate_source(&source, rows, seed)?;
            db::inspect_source(&source)?;
            db::prepare_target(&target, &source.display().to_string())
        })
        .await??;
    }
    let store = work.join("store.db");
    let history = work.join("history");
    let prefix = "migrate".to_owned();
    let coord = SqliteCoordinator::open(&store).await?;
    let recorder = Recorder::create(&history, "controller").map_err(io("create the history"))?;
    let mut script = Script {
        started,
        timeline: Vec::new(),
        screen: Arc::clone(&screen),
        controller: Controller::new(coord, &prefix)?,
        tables,
        rows: options.rows,
    };
    let worker_args = |id: &str| WorkerArgs {
        id: id.to_owned(),
        store: store.clone(),
        prefix: prefix.clone(),
        work: work.to_owned(),
        history: history.clone(),
        batch,
    };
    script.note(format!("the store is one file: {}", store.display()));
    for t in &script.tables {
        script
            .controller
            .create(&t.task, Vec::new(), DesiredStage::Running)
            .await?;
    }
    let first = start_worker(launcher, &worker_args("w1"), work)?;
    let pid = first.pid();
    script.note(format!("started worker w1 (pid {pid}), a child process"));
    script
        .until("every table running on w1", || async {
            for i in 0..TABLES {
                (script.answered_by(i, "w1").await? == Stage::Running).then_some(())?;
            }
            Some(())
        })
        .await?;
    script
        .until("every table's dump at 20%", || async {
            for i in 0..TABLES {
                script.reached(i, 0, 20).await.then_some(())?;
            }
            Some(())
        })
        .await?;

    let mut paused_at = [0u64; TABLES];
    for (i, at) in paused_at.iter_mut().enumerate().take(PAUSED) {
        let task = script.tables[i].task.clone();
        let answer = script.controller.pause_within(&task, WAIT).await?;
        *at = now_ns();
        script.note(format!(
            "paused {task}: {} answered {:?} (its run had returned)",
            answer.owner.as_str(),
            answer.stage
        ));
    }
    script
        .until("the running tables in the middle of their load", || async {
            for i in PAUSED..TABLES {
                script.reached(i, 1, 25).await.then_some(())?;
            }
            Some(())
        })
        .await?;

    drop(first); // SIGKILL, reaped
    let killed_at = Instant::now();
    recorder.fault(Fault::Killed, pid);
    // What the killed process had committed: read once it is gone.
    let mut at_kill = [[0u64; 3]; TABLES];
    for (i, at) in at_kill.iter_mut().enumerate() {
        *at = script.progress(i).await;
    }
    let copying: Vec<String> = (PAUSED..TABLES)
        .map(|i| {
            format!(
                "{} at {} of {} rows loaded",
                script.tables[i].task,
                thousands(at_kill[i][1]),
                thousands(options.rows)
            )
        })
        .collect();
    let killed = format!(
        "worker w1 (pid {pid}) with SIGKILL, in the middle of a copy ({})",
        copying.join("; ")
    );
    script.note(format!("killed {killed}"));
    let store_file = store.clone();
    let integrity = tokio::task::spawn_blocking(move || integrity(&store_file)).await?;
    script.note(format!("the store file's integrity check: {integrity}"));

    let second = start_worker(launcher, &worker_args("w2"), work)?;
    script.note(format!(
        "started the worker again as w2 (pid {})",
        second.pid()
    ));
    // The paused tables first: the second process reports them Paused without
    // running them, and their checkpoints have not moved.
    let mut stage_after = [Stage::New; TABLES];
    let mut desired_after = [DesiredStage::Running; TABLES];
    let mut after = [[0u64; 3]; TABLES];
    for i in 0..PAUSED {
        stage_after[i] = script
            .until("w2's report of a paused table", || {
                script.answered_by(i, "w2")
            })
            .await?;
        desired_after[i] = script
            .status(i)
            .await
            .map_or(DesiredStage::Running, |s| s.desired);
        after[i] = script.progress(i).await;
    }
    script
        .until("w2 running the tables it took over", || async {
            for i in PAUSED..TABLES {
                script.answered_by(i, "w2").await?;
            }
            Some(())
        })
        .await?;
    let takeover = killed_at.elapsed();
    script.note(format!(
        "w2 answered for every table {:.2} s after the kill (lease TTL {} s)",
        takeover.as_secs_f64(),
        TTL.as_secs()
    ));
    for i in PAUSED..TABLES {
        stage_after[i] = script
            .until("a running table's first report on w2", || {
                script.answered_by(i, "w2")
            })
            .await?;
        desired_after[i] = script
            .status(i)
            .await
            .map_or(DesiredStage::Paused, |s| s.desired);
        after[i] = script
            .until("a batch of the new process", || async {
                let now = script.progress(i).await;
                (now != at_kill[i] || stage_after[i] == Stage::Finished).then_some(now)
            })
            .await?;
    }
    script
        .until("the running tables finished", || async {
            for i in PAUSED..TABLES {
                (script.answered_by(i, "w2").await? == Stage::Finished).then_some(())?;
            }
            Some(())
        })
        .await?;
    script.note("the tables that were running have finished on w2".to_owned());
    let mut runs_while_paused = [0usize; TABLES];
    for i in 0..PAUSED {
        let task = script.tables[i].task.clone();
        let h = History::load(&history).map_err(|e| RestartError::Io {
            what: "read the histories".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        runs_while_paused[i] = h.starts_since(&task, paused_at[i]);
        let answer = script.controller.resume_within(&task, WAIT).await?;
        script.note(format!(
            "resumed {task}: {} answered {:?}",
            answer.owner.as_str(),
            answer.stage
        ));
    }
    script
        .until("the resumed tables finished", || async {
            for i in 0..PAUSED {
                (script.answered_by(i, "w2").await? == Stage::Finished).then_some(())?;
            }
            Some(())
        })
        .await?;
    script.show_progress().await;
    script.note("every table has finished".to_owned());
    let pid = second.pid();
    drop(second);
    recorder.fault(Fault::Killed, pid);

    let mut reports = Vec::with_capacity(TABLES);
    for (i, t) in script.tables.iter().enumerate() {
        let (source, target) = (t.source.clone(), t.target.clone());
        let digests = tokio::task::spawn_blocking(move || {
            let s = db::digest(&Db::source_read_only(&source, WORK_BUSY)?)?;
            Ok::<_, db::DbError>((s, db::digest(&Db::target(&target, WORK_BUSY)?)?))
        })
        .await??;
        reports.push(TableReport {
            task: t.task.clone(),
            paused: i < PAUSED,
            at_kill: at_kill[i],
            after: after[i],
            desired_after_restart: desired_after[i],
            stage_after_restart: stage_after[i],
            runs_while_paused: runs_while_paused[i],
            digests,
        });
    }
    let verdict = History::load(&history)
        .map_err(|e| RestartError::Io {
            what: "read the histories".into(),
            source: std::io::Error::other(e.to_string()),
        })?
        .check(ALLOWANCE);
    Ok(RestartSummary {
        timeline: script.timeline,
        killed,
        integrity,
        takeover,
        tables: reports,
        verdict,
    })
}
