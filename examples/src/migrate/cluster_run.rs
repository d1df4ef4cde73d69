//! The cluster mode: a local 3-member etcd (or `ETCD_ENDPOINTS`), N worker processes
//! (this program again, with the hidden [`WORKER_FLAG`]) and a controller.
//!
//! Each worker joins the cluster and, when it owns the task, runs the migration's
//! three steps (dump, load, sync) as fenced units: every batch commits, in the same
//! target transaction as its rows, the highest fence token seen, and a batch with
//! a lower token is refused ([`db::fence_writes`]). The controller pauses and
//! resumes the task through etcd, kills the owner with SIGKILL during the load and
//! freezes the next owner with SIGSTOP for three lease TTLs, then waits for the end.
//! Every process records its runs and writes in a history file; the history
//! checker (`crates/harness/src/cluster/history.rs`) merges them at the end. No writer
//! changes the source in this mode: the sync applies the change log as it is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use taskstage::{Stage, Task};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, EtcdCoordinator, EtcdOptions, TaskSpec, Worker,
};
use tokio::time::Instant;

use super::{ClusterOptions, WORKER_FLAG};
use crate::migrate::db::{self, Db, WORK_BUSY};
pub use crate::migrate::fenced::Launcher;
use crate::migrate::fenced::{FencedStep, Table};
use crate::migrate::report::{thousands, Screen, UNIT_NAMES};

use harness::history::{now_ns, Fault, History, Recorder, Verdict};
use harness::{signal_pid, ChildGuard};
use taskstage_harness::cluster as harness;

/// The one task.
const TASK: &str = "migration";
/// The workers' lease TTL.
const TTL: Duration = Duration::from_secs(2);
const STOP_BOUND: Duration = Duration::from_millis(600);
const RESYNC: Duration = Duration::from_millis(200);
/// How soon after a thaw a frozen owner must have dropped its run.
const THAW_ALLOWANCE: Duration = Duration::from_millis(1_500);
/// The bound of every wait of the controller.
const WAIT: Duration = Duration::from_secs(30);

/// A cluster run that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ClusterRunError {
    /// No etcd to use.
    #[error("no etcd binary found (install etcd-server, or set ETCD_BIN or ETCD_ENDPOINTS)")]
    NoEtcd,
    /// A database step failed.
    #[error(transparent)]
    Db(#[from] db::DbError),
    /// A cluster call failed.
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

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterRunError {
    let what = what.into();
    move |source| ClusterRunError::Io { what, source }
}

/// What a cluster run did and found.
#[derive(Debug)]
pub struct ClusterSummary {
    /// Elapsed time and event, in order.
    pub timeline: Vec<(Duration, String)>,
    /// The faults injected.
    pub faults: Vec<String>,
    /// The history checker's verdict.
    pub verdict: Verdict,
    /// The highest token that wrote to the target.
    pub fence_token: i64,
    /// Source and target digests.
    pub digests: (db::Digest, db::Digest),
    /// The cluster-wide pause's latency.
    pub pause: Duration,
}

impl ClusterSummary {
    /// Whether the target equals the source and the history checker passed.
    pub fn verified(&self) -> bool {
        self.digests.0 == self.digests.1 && self.verdict.passed() && self.verdict.max_live == 1
    }

    /// The summary, as printed.
    pub fn render(&self) -> String {
        let mut out = String::from("\ntimeline (cluster):\n");
        for (at, what) in &self.timeline {
            out.push_str(&format!("  {:>7.2} s  {what}\n", at.as_secs_f64()));
        }
        out.push_str("faults injected:\n");
        for fault in &self.faults {
            out.push_str(&format!("  - {fault}\n"));
        }
        let v = &self.verdict;
        out.push_str(&format!(
            "cluster-wide pause answered in {} ms\n",
            self.pause.as_millis()
        ));
        out.push_str(&format!(
            "stale writes rejected by the target's fence: {} (highest token {})\n",
            v.rejected, self.fence_token
        ));
        out.push_str(&format!(
            "history: {} runs, {} fenced batches accepted, {} runs of a frozen owner counted \
             as ended at the freeze (each dropped within {} ms of the thaw)\n",
            v.runs,
            v.accepted,
            v.frozen,
            THAW_ALLOWANCE.as_millis()
        ));
        for violation in &v.violations {
            out.push_str(&format!("  violation: {violation}\n"));
        }
        out.push_str(&format!(
            "max live runs {} across the cluster\n",
            v.max_live
        ));
        let (s, t) = self.digests;
        out.push_str(&format!(
            "source {} rows (checksum {:016x}), target {} rows (checksum {:016x})\n",
            thousands(s.rows),
            s.checksum,
            thousands(t.rows),
            t.checksum
        ));
        out.push_str(if self.verified() {
            "verification: passed\n"
        } else {
            "verification: FAILED\n"
        });
        out
    }
}

/// The example's entry: a worker (after [`WORKER_FLAG`]) or the whole cluster run.
pub fn main(args: Vec<OsString>) -> ExitCode {
    if args.first().is_some_and(|a| a == WORKER_FLAG) {
        let rest: Vec<String> = args[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return worker_main(&rest);
    }
    let options = match super::parse(&args, fastrand::u64(..)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("migrate: {e}");
            return ExitCode::from(2);
        }
    };
    let launcher = match std::env::current_exe() {
        Ok(program) => Launcher {
            program,
            args: vec![WORKER_FLAG.into()],
            env: None,
        },
        Err(e) => {
            eprintln!("migrate: cannot find this program to start its workers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("migrate: could not start the tokio runtime");
        return ExitCode::FAILURE;
    };
    let screen = Arc::new(Screen::new(options.quiet));
    let result = runtime.block_on(run(&options, &launcher, Arc::clone(&screen)));
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

// ------------------------------------------------------------------ the workers

/// The arguments of a worker process, in order.
struct WorkerArgs {
    id: String,
    endpoints: Vec<String>,
    prefix: String,
    source: PathBuf,
    target: PathBuf,
    history: PathBuf,
    batch: usize,
}

impl WorkerArgs {
    fn to_vec(&self) -> Vec<String> {
        vec![
            self.id.clone(),
            self.endpoints.join(","),
            self.prefix.clone(),
            self.source.display().to_string(),
            self.target.display().to_string(),
            self.history.display().to_string(),
            self.batch.to_string(),
        ]
    }

    fn parse(args: &[String]) -> Option<WorkerArgs> {
        let [id, endpoints, prefix, source, target, history, batch] = args else {
            return None;
        };
        Some(WorkerArgs {
            id: id.clone(),
            endpoints: endpoints.split(',').map(str::to_owned).collect(),
            prefix: prefix.clone(),
            source: source.into(),
            target: target.into(),
            history: history.into(),
            batch: batch.parse().ok()?,
        })
    }
}

/// A worker process: joins, runs the migration when it owns it, joins again when
/// its lease is lost. It exits when its stdin (a pipe from the controller) closes.
pub fn worker_main(args: &[String]) -> ExitCode {
    let Some(args) = WorkerArgs::parse(args) else {
        eprintln!("migrate: a cluster worker takes 7 arguments, not {args:?}");
        return ExitCode::from(2);
    };
    let (history, id) = (args.history.clone(), args.id.clone());
    crate::migrate::fenced::worker_process(&history, &id, |recorder| {
        serve(Arc::new(args), recorder)
    })
}

async fn serve(args: Arc<WorkerArgs>, recorder: Arc<Recorder>) {
    let table = Arc::new(Table {
        task: TASK.to_owned(),
        source: args.source.clone(),
        target: args.target.clone(),
        batch: args.batch,
    });
    // Bounded: at most 1,000 joins; the controller ends the process long before.
    for _ in 0..1_000 {
        let coord =
            match EtcdCoordinator::connect(args.endpoints.clone(), EtcdOptions::default()).await {
                Ok(coord) => coord,
                Err(e) => {
                    eprintln!("worker {}: {e}", args.id);
                    tokio::time::sleep(RESYNC).await;
                    continue;
                }
            };
        let factory = {
            let (table, recorder) = (Arc::clone(&table), Arc::clone(&recorder));
            let worker = args.id.clone();
            move |spec: TaskSpec| {
                let unit = |step| FencedStep {
                    step,
                    table: Arc::clone(&table),
                    worker: worker.clone(),
                    fencer: spec.fencer.clone(),
                    recorder: Arc::clone(&recorder),
                };
                Ok(Task::builder(spec.task.as_str())
                    .unit(unit(0))
                    .unit(unit(1))
                    .unit(unit(2)))
            }
        };
        let joined = Worker::builder(coord, args.prefix.clone(), args.id.clone())
            .ttl(TTL)
            .stop_bound(STOP_BOUND)
            .resync(RESYNC)
            .capacity(1)
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

/// A worker process; dropping it kills it by pid.
struct Proc {
    id: String,
    child: ChildGuard,
}

/// The controller's view of the run.
struct Script {
    started: Instant,
    timeline: Vec<(Duration, String)>,
    faults: Vec<String>,
    screen: Arc<Screen>,
    controller: Controller,
    recorder: Arc<Recorder>,
    procs: Vec<Proc>,
    target: PathBuf,
    history: PathBuf,
    rows: u64,
}

impl Script {
    fn note(&mut self, what: String) {
        self.screen.say(&what);
        self.timeline.push((self.started.elapsed(), what));
    }

    fn pid(&self, worker: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.id == worker)
            .map(|p| p.child.pid())
    }

    /// The owner, once its report answers the desired revision, if `ok` accepts it.
    async fn owner(&self, ok: impl Fn(&str) -> bool) -> Option<(String, Stage)> {
        let status = self.controller.status(TASK).await.ok()?;
        let owner = status.owner.as_ref()?.as_str().to_owned();
        let stage = status.current_observed()?.stage;
        (status.answers(status.desired_revision) && ok(&owner)).then_some((owner, stage))
    }

    /// Polls until `check` returns `Some`, showing progress; bounded by [`WAIT`].
    async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> Result<T, ClusterRunError>
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
                return Err(ClusterRunError::Timeout(what.to_owned()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The items done per step, from the target's checkpoints.
    async fn progress(&self) -> [u64; 3] {
        let target = self.target.clone();
        crate::migrate::fenced::progress(target).await
    }

    async fn show_progress(&self) {
        let done = self.progress().await;
        for (i, items) in done.iter().enumerate() {
            let total = (i < 2).then_some(self.rows);
            self.screen.progress(i, *items, total);
        }
    }

    /// Waits until step `step` has done `share` of the rows.
    async fn reached(&self, step: usize, share: u64) -> Result<(), ClusterRunError> {
        let what = format!("{} at {share}%", UNIT_NAMES[step]);
        self.until(&what, || async {
            let done = self.progress().await;
            (done[step] * 100 >= self.rows * share || done[step + 1..].iter().any(|d| *d > 0))
                .then_some(())
        })
        .await
    }
}

/// Runs the whole cluster form of the migration.
///
/// # Errors
///
/// [`ClusterRunError`] when the run could not be set up or a step of the script did
/// not happen within its bound; the processes and the etcd it started are stopped
/// by pid either way.
pub async fn run(
    options: &ClusterOptions,
    launcher: &Launcher,
    screen: Arc<Screen>,
) -> Result<ClusterSummary, ClusterRunError> {
    let work = std::env::temp_dir().join(format!(
        "taskstage-migrate-cluster-{}-{}",
        std::process::id(),
        now_ns()
    ));
    std::fs::create_dir_all(&work).map_err(io("create the work directory"))?;
    let result = run_in(options, launcher, screen, &work).await;
    if result.as_ref().is_ok_and(ClusterSummary::verified) {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        eprintln!("migrate: the work directory is kept: {}", work.display());
    }
    result
}

async fn run_in(
    options: &ClusterOptions,
    launcher: &Launcher,
    screen: Arc<Screen>,
    work: &Path,
) -> Result<ClusterSummary, ClusterRunError> {
    let started = Instant::now();
    let (etcd, endpoints) = match std::env::var("ETCD_ENDPOINTS") {
        Ok(list) if !list.trim().is_empty() => {
            (None, list.split(',').map(str::to_owned).collect::<Vec<_>>())
        }
        _ => {
            let cluster = harness::EtcdCluster::start_or_skip(3).ok_or(ClusterRunError::NoEtcd)?;
            let endpoints = cluster.endpoints();
            (Some(cluster), endpoints)
        }
    };
    let source = work.join("source.db");
    let target = work.join("target.db");
    let history = work.join("history");
    screen.say(&format!(
        "generating a source with {} rows; etcd at {}",
        thousands(options.rows),
        endpoints.join(",")
    ));
    let (path, rows, seed) = (source.clone(), options.rows, options.seed);
    tokio::task::spawn_blocking(move || db::generate_source(&path, rows, seed)).await??;
    let path = source.clone();
    let info = tokio::task::spawn_blocking(move || db::inspect_source(&path)).await??;
    let key = source.display().to_string();
    let path = target.clone();
    tokio::task::spawn_blocking(move || db::prepare_target(&path, &key)).await??;

    let prefix = format!("migrate-{}-{}", std::process::id(), now_ns());
    let coord = EtcdCoordinator::connect(endpoints.clone(), EtcdOptions::default()).await?;
    let recorder = Recorder::create(&history, "controller").map_err(io("create the history"))?;
    let mut script = Script {
        started,
        timeline: Vec::new(),
        faults: Vec::new(),
        screen: Arc::clone(&screen),
        controller: Controller::new(coord, &prefix)?,
        recorder,
        procs: Vec::new(),
        target: target.clone(),
        history: history.clone(),
        rows: info.rows,
    };
    let batch = usize::try_from((info.rows / 100).clamp(50, 2_000)).unwrap_or(2_000);
    for i in 1..=options.workers {
        let args = WorkerArgs {
            id: format!("w{i}"),
            endpoints: endpoints.clone(),
            prefix: prefix.clone(),
            source: source.clone(),
            target: target.clone(),
            history: history.clone(),
            batch,
        };
        let mut command = launcher.command(&args.to_vec());
        let log = std::fs::File::create(work.join(format!("{}.log", args.id)))
            .map_err(io("create a worker's log"))?;
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io("start a worker process"))?;
        script.note(format!("started worker {} (pid {})", args.id, child.id()));
        // The instant it exits is recorded: a worker thawed past its lease ends
        // itself (status 75) rather than let its run outlive the lease, and leaves
        // no drop for that run.
        harness::overload::watch_exit(child.id(), Arc::clone(&script.recorder), |_| {});
        script.procs.push(Proc {
            id: args.id,
            child: ChildGuard::new(child),
        });
    }

    let outcome = drive(&mut script).await;
    let pause = outcome?;
    // Every process is stopped before the target is read.
    let pids: Vec<u32> = script.procs.iter().map(|p| p.child.pid()).collect();
    script.procs.clear();
    for pid in pids {
        script.recorder.fault(Fault::Killed, pid);
    }
    drop(etcd);

    let (source_path, target_path) = (source.clone(), target.clone());
    let (digests, fence_token) = tokio::task::spawn_blocking(move || {
        let s = db::digest(&Db::source_read_only(&source_path, WORK_BUSY)?)?;
        let t = Db::target(&target_path, WORK_BUSY)?;
        Ok::<_, db::DbError>(((s, db::digest(&t)?), db::fence_token(&t)?))
    })
    .await??;
    let verdict = History::load(&history)
        .map_err(|e| ClusterRunError::Io {
            what: "read the histories".into(),
            source: std::io::Error::other(e.to_string()),
        })?
        .check(THAW_ALLOWANCE);
    Ok(ClusterSummary {
        timeline: script.timeline,
        faults: script.faults,
        verdict,
        fence_token,
        digests,
        pause,
    })
}

/// The controller's script; returns the cluster-wide pause's latency.
async fn drive(script: &mut Script) -> Result<Duration, ClusterRunError> {
    script
        .controller
        .create(TASK, Vec::new(), DesiredStage::Running)
        .await?;
    let (first, _) = script
        .until("a first owner running", || script.owner(|_| true))
        .await?;
    script.note(format!("{first} owns the migration and runs it"));

    script.reached(0, 30).await?;
    let asked = Instant::now();
    let paused = script.controller.pause_within(TASK, WAIT).await?;
    let pause = asked.elapsed();
    script.note(format!(
        "paused cluster-wide: {} answered {:?} in {} ms (its run had returned)",
        paused.owner.as_str(),
        paused.stage,
        pause.as_millis()
    ));
    let resumed = script.controller.resume_within(TASK, WAIT).await?;
    script.note(format!(
        "resumed: {} answered {:?}",
        resumed.owner.as_str(),
        resumed.stage
    ));

    script.reached(1, 25).await?;
    let (victim, _) = script
        .until("an owner during the load", || script.owner(|_| true))
        .await?;
    let pid = script.pid(&victim).unwrap_or(0);
    let at = Instant::now();
    if let Some(i) = script.procs.iter().position(|p| p.id == victim) {
        drop(script.procs.remove(i)); // SIGKILL, reaped
    }
    script.recorder.fault(Fault::Killed, pid);
    script.faults.push(format!(
        "SIGKILL to {victim} (pid {pid}), the owner, during the load"
    ));
    script.note(format!("killed {victim} (SIGKILL) during the load"));
    let (next, _) = script
        .until("a takeover after the kill", || {
            script.owner(|o| o != victim)
        })
        .await?;
    script.note(format!(
        "{next} took over {:.2} s after the kill (lease TTL {} s)",
        at.elapsed().as_secs_f64(),
        TTL.as_secs()
    ));

    let now = script.progress().await[1];
    script
        .until("the new owner's first batches", || async {
            (script.progress().await[1] > now || script.progress().await[2] > 0).then_some(())
        })
        .await?;
    let pid = script.pid(&next).unwrap_or(0);
    signal_pid(pid, rustix::process::Signal::STOP);
    script.recorder.fault(Fault::Freeze, pid);
    let frozen = Instant::now();
    script.faults.push(format!(
        "SIGSTOP to {next} (pid {pid}), the next owner, for {} s (3 lease TTLs)",
        3 * TTL.as_secs()
    ));
    script.note(format!("froze {next} (SIGSTOP) past its lease"));
    let (third, _) = script
        .until("a takeover from the frozen owner", || {
            script.owner(|o| o != next && o != victim)
        })
        .await?;
    script.note(format!(
        "{third} took over {:.2} s after the freeze",
        frozen.elapsed().as_secs_f64()
    ));
    script
        .until("three lease TTLs of freeze", || async {
            (frozen.elapsed() >= 3 * TTL).then_some(())
        })
        .await?;
    script.recorder.fault(Fault::Thaw, pid);
    signal_pid(pid, rustix::process::Signal::CONT);
    script.note(format!(
        "thawed {next} (SIGCONT): a late batch of it would meet the fence"
    ));

    let (last, _) = script
        .until("the migration finished", || async {
            let status = script.controller.status(TASK).await.ok()?;
            let observed = status.current_observed()?;
            (observed.stage == Stage::Finished).then(|| (observed.owner.as_str().to_owned(), ()))
        })
        .await?;
    script.show_progress().await;
    script.note(format!("finished on {last}"));
    let history = script.history.clone();
    script
        .until("the thawed owner's run dropped", || async {
            let h = History::load(&history).ok()?;
            (h.alive_runs_of(pid) == 0).then_some(())
        })
        .await?;
    script.note(format!(
        "{next}'s frozen run has ended (it fenced itself, or its process ended on the overrun)"
    ));
    Ok(pause)
}
