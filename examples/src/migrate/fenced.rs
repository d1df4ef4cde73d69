//! The unit that a worker process runs for one step of one table's migration, with
//! every batch fenced: it commits, in the same target transaction as its rows, the
//! highest fence token seen, and a batch with a lower token is refused
//! ([`db::fence_writes`]). Shared by the cluster mode on etcd and the restart run on
//! the store file; each run and batch is recorded for the history checker.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Unit};
use taskstage_cluster::Fencer;
use taskstage_harness::cluster::history::{now_ns, Recorder, WriteOutcome};

use crate::migrate::db::{self, Db, Step, SyncStep, WORK_BUSY};
use crate::migrate::report::UNIT_NAMES;

/// A unit's pause between batches: the demonstration is about faults, and a gap
/// between transactions is where a frozen or killed owner is most often caught.
pub const PACE: Duration = Duration::from_millis(20);

/// How to start a worker process.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program.
    pub program: PathBuf,
    /// Its arguments before the worker's own.
    pub args: Vec<OsString>,
    /// Where the worker's own arguments go: `None` on the command line, `Some(var)`
    /// in that environment variable (one a line).
    pub env: Option<String>,
}

impl Launcher {
    /// A command that starts a worker with `worker_args`.
    pub fn command(&self, worker_args: &[String]) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command.args(&self.args);
        match &self.env {
            Some(var) => command.env(var, worker_args.join("\n")),
            None => command.args(worker_args),
        };
        command
    }
}

/// Runs a worker process: its history recorder (named after `id` and the pid), an
/// exit when its stdin (a pipe from the controller) closes, and `serve` on a runtime
/// of its own.
pub fn worker_process<F, Fut>(
    history: &std::path::Path,
    id: &str,
    serve: F,
) -> std::process::ExitCode
where
    F: FnOnce(Arc<Recorder>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use std::process::ExitCode;
    let name = format!("worker-{id}-{}", std::process::id());
    let recorder = match Recorder::create(history, &name) {
        Ok(recorder) => recorder,
        Err(e) => {
            eprintln!("migrate: cannot create the worker's history: {e}");
            return ExitCode::FAILURE;
        }
    };
    taskstage_harness::cluster::exit_when_stdin_closes();
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("migrate: could not start the tokio runtime");
        return ExitCode::FAILURE;
    };
    runtime.block_on(serve(recorder));
    ExitCode::SUCCESS
}

/// Items done per step (dump, load, sync) in the target `target`, from its
/// checkpoints; zeros when it cannot be read.
pub async fn progress(target: PathBuf) -> [u64; 3] {
    let read = tokio::task::spawn_blocking(move || {
        let db = Db::target(&target, Duration::from_millis(200))?;
        db::checkpoints(&db)
    })
    .await;
    let mut done = [0; 3];
    if let Ok(Ok(checkpoints)) = read {
        for (unit, cp) in checkpoints {
            if let Some(step) = UNIT_NAMES.iter().position(|n| *n == unit) {
                done[step] = cp.items;
            }
        }
    }
    done
}

/// The databases of one table's migration.
#[derive(Debug, Clone)]
pub struct Table {
    /// The task that migrates it.
    pub task: String,
    /// The source database.
    pub source: PathBuf,
    /// The target database.
    pub target: PathBuf,
    /// Rows per batch.
    pub batch: usize,
}

/// The connections of one step's run: the source (dump and sync) and the fenced
/// target.
struct Conns {
    source: Option<Db>,
    target: Db,
}

/// What one batch did.
enum Batch {
    /// Rows were written; more are left.
    Wrote(u64),
    /// The step is complete.
    Done,
    /// The target was busy (another writer's transaction): try again.
    Busy,
    /// The fence refused the batch: a newer owner has written.
    Fenced,
}

/// One step of the migration (0 dump, 1 load, 2 sync) of one table, writing through
/// the fence.
pub struct FencedStep {
    /// 0 dump, 1 load, 2 sync.
    pub step: usize,
    /// The table.
    pub table: Arc<Table>,
    /// The worker that runs it, as the history names it.
    pub worker: String,
    /// The fence of the task's current owner.
    pub fencer: Fencer,
    /// Where runs and batches are recorded.
    pub recorder: Arc<Recorder>,
}

fn open(step: usize, args: &Table, token: i64) -> Result<Conns, db::DbError> {
    let source = match step {
        1 => None,
        _ => Some(Db::source_read_only(&args.source, WORK_BUSY)?),
    };
    let target = Db::target(&args.target, WORK_BUSY)?;
    db::fence_writes(&target, token)?;
    Ok(Conns { source, target })
}

fn batch(step: usize, c: &mut Conns, size: usize, token: i64) -> Result<Batch, db::DbError> {
    let result = match (step, &mut c.source) {
        (0, Some(source)) => db::dump_batch(source, &mut c.target, true, size).map(|s| match s {
            Step::More { items } => Batch::Wrote(items),
            Step::Done { .. } => Batch::Done,
        }),
        (1, _) => db::load_batch(&mut c.target, size).map(|s| match s {
            Step::More { items } => Batch::Wrote(items),
            Step::Done { .. } => Batch::Done,
        }),
        (_, Some(source)) => match db::sync_batch(source, &mut c.target, true, size) {
            Ok(SyncStep::Applied { applied, items }) if applied > 0 => Ok(Batch::Wrote(items)),
            // Caught up, and no writer in this mode: the sync is complete.
            Ok(SyncStep::Applied { .. }) => db::finish_sync(&mut c.target).map(Batch::Wrote),
            Ok(SyncStep::Done { .. }) => Ok(Batch::Done),
            Err(e) => Err(e),
        },
        _ => Ok(Batch::Done),
    };
    match result {
        // A step found complete writes nothing; a deposed owner must not move on to
        // the next step on that news either.
        Ok(Batch::Done) if db::fence_token(&c.target)? > token => Ok(Batch::Fenced),
        Err(e) if db::is_fenced(&e) => Ok(Batch::Fenced),
        Err(e) if db::is_locked(&e) => Ok(Batch::Busy),
        other => other,
    }
}

impl Unit for FencedStep {
    fn name(&self) -> &str {
        UNIT_NAMES.get(self.step).copied().unwrap_or("?")
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let token = self.fencer.token().revision;
        let (worker, task) = (self.worker.clone(), self.table.task.clone());
        // Shared with each blocking batch: the run counts as alive until its last
        // batch is over, even if its future is dropped first.
        let alive = Arc::new(self.recorder.alive(&task, &worker, ctx.generation(), token));
        let (step, args) = (self.step, Arc::clone(&self.table));
        let guard = Arc::clone(&alive);
        let opened = tokio::task::spawn_blocking(move || {
            let _alive = guard;
            open(step, &args, token)
        })
        .await
        .map_err(|e| RunError::msg(format!("opening the databases did not complete: {e}")))?;
        let mut conns = opened.map_err(RunError::new)?;
        // Bounded by the step's rows (each batch advances the checkpoint) and by
        // the run's cancellation.
        loop {
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled);
            }
            let sent = now_ns();
            let (guard, size) = (Arc::clone(&alive), self.table.batch);
            let (back, result) = tokio::task::spawn_blocking(move || {
                let _alive = guard;
                let result = batch(step, &mut conns, size, token);
                (conns, result)
            })
            .await
            .map_err(|e| RunError::msg(format!("a batch did not complete: {e}")))?;
            conns = back;
            let pause = match result.map_err(RunError::new)? {
                Batch::Wrote(items) => {
                    self.recorder
                        .write(&task, &worker, token, sent, WriteOutcome::Accepted);
                    ctx.report_progress(items, None);
                    PACE
                }
                Batch::Done => return Ok(RunExit::Completed),
                Batch::Busy => PACE * 5,
                Batch::Fenced => {
                    self.recorder
                        .write(&task, &worker, token, sent, WriteOutcome::Rejected);
                    // Deposed: the worker stops this run as soon as it sees so.
                    ctx.cancelled().await;
                    return Ok(RunExit::Cancelled);
                }
            };
            tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}
