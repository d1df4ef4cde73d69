//! The three units of the pipeline: dump, load and sync.
//!
//! Each run checks for cancellation between batches, runs each batch on the blocking
//! pool and awaits it before looking again, and keeps no lock across an await. Its
//! progress lives in the target's checkpoints, not in the unit value, so a resumed
//! run, and a run of a new task built after a stop, both continue exactly where the
//! last committed batch left off.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use taskstage::{RunContext, RunError, RunExit, Unit};
use tokio::sync::watch;

use crate::migrate::db::{self, Db, Step, SyncStep, WORK_BUSY};
use crate::migrate::live::{LiveRun, LiveRuns};
use crate::migrate::report::{Screen, UnitRuns};
use crate::migrate::writer::WriterState;

/// A unit's progress, as the controller and the screen see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitProgress {
    /// Rows (or changes) done in all runs.
    pub done: u64,
    /// Rows in all, when known.
    pub total: Option<u64>,
}

impl UnitProgress {
    /// Percent done, 0 when the total is not known.
    pub fn percent(&self) -> u64 {
        match self.total {
            Some(total) if total > 0 => self.done.min(total) * 100 / total,
            _ => 0,
        }
    }
}

/// What every unit shares: where the databases are, and where to report.
#[derive(Debug)]
pub struct Env {
    /// The source database (opened read-only by the units).
    pub source: PathBuf,
    /// The target database.
    pub target: PathBuf,
    /// Whether the source has a change log for the sync.
    pub change_log: bool,
    /// Rows per dump and load batch.
    pub batch: usize,
    /// Change-log entries per sync batch.
    pub sync_batch: usize,
    /// The live-run counter.
    pub live: Arc<LiveRuns>,
    /// Each unit's progress.
    pub progress: watch::Sender<[UnitProgress; 3]>,
    /// The progress display.
    pub screen: Arc<Screen>,
    /// The writer's state: the sync finishes only once it has stopped.
    pub writer: watch::Receiver<WriterState>,
    /// Set when the sync first runs: the writer stops a little after.
    pub sync_started: watch::Sender<bool>,
    /// Runs per unit.
    pub runs: Mutex<[UnitRuns; 3]>,
}

impl Env {
    fn report(&self, ctx: &RunContext, unit: usize, done: u64, total: Option<u64>) {
        ctx.report_progress(done, total);
        self.progress.send_modify(|all| {
            if let Some(p) = all.get_mut(unit) {
                p.done = done;
                if total.is_some() {
                    p.total = total;
                }
            }
        });
        let total = total.or_else(|| self.progress.borrow().get(unit).and_then(|p| p.total));
        self.screen.progress(unit, done, total);
    }

    fn count_run(&self, unit: usize, continued: bool) {
        let mut runs = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = runs.get_mut(unit) {
            r.runs += 1;
            r.continued += u32::from(continued);
        }
    }

    /// The three units, fresh: everything they know comes from the checkpoints.
    pub fn units(self: &Arc<Self>) -> (CopyUnit, CopyUnit, SyncUnit) {
        (
            CopyUnit {
                env: Arc::clone(self),
                kind: CopyKind::Dump,
                conns: None,
            },
            CopyUnit {
                env: Arc::clone(self),
                kind: CopyKind::Load,
                conns: None,
            },
            SyncUnit {
                env: Arc::clone(self),
                writer: self.writer.clone(),
                conns: None,
            },
        )
    }
}

/// Runs `f` on the blocking pool with `state` (the connections), and hands the state
/// back with the result. The live-run token goes along, so a run counts as live until
/// its batch is over even if its future were dropped first.
async fn on_blocking<S, T, F>(live: &LiveRun, state: S, f: F) -> Result<(S, T), RunError>
where
    S: Send + 'static,
    T: Send + 'static,
    F: FnOnce(&mut S) -> T + Send + 'static,
{
    let token = live.clone();
    tokio::task::spawn_blocking(move || {
        let _live = token;
        let mut state = state;
        let out = f(&mut state);
        (state, out)
    })
    .await
    .map_err(|e| RunError::msg(format!("a database batch did not complete: {e}")))
}

/// A pre-start check on the blocking pool. It only reads, so if the check is
/// dropped (a pause during Resuming) the detached read is harmless.
async fn check<F>(f: F) -> Result<(), RunError>
where
    F: FnOnce() -> Result<(), db::DbError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RunError::msg(format!("the pre-start check did not complete: {e}")))?
        .map_err(RunError::new)
}

/// Which copying unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Source rows into the staging table.
    Dump,
    /// Staged rows into `accounts`.
    Load,
}

impl CopyKind {
    fn index(self) -> usize {
        match self {
            CopyKind::Dump => 0,
            CopyKind::Load => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            CopyKind::Dump => "dump",
            CopyKind::Load => "load",
        }
    }
}

/// The connections a copying unit keeps between its runs.
#[derive(Debug)]
pub struct CopyConns {
    source: Option<Db>,
    target: Db,
}

/// The dump (snapshot the source into a staging table) or the load (batched inserts
/// from the staging table into the target's `accounts`).
#[derive(Debug)]
pub struct CopyUnit {
    env: Arc<Env>,
    kind: CopyKind,
    conns: Option<CopyConns>,
}

impl CopyUnit {
    /// Opens the connections (if the last run did not leave them) and reads the
    /// checkpoint and the total for the progress bar.
    fn open(
        env: &Env,
        kind: CopyKind,
        conns: Option<CopyConns>,
    ) -> Result<(CopyConns, db::Checkpoint, Option<u64>), db::DbError> {
        let conns = match conns {
            Some(conns) => conns,
            None => CopyConns {
                source: match kind {
                    CopyKind::Dump => Some(Db::source_read_only(&env.source, WORK_BUSY)?),
                    CopyKind::Load => None,
                },
                target: Db::target(&env.target, WORK_BUSY)?,
            },
        };
        let cp = db::checkpoint(&conns.target, kind.name())?;
        let total = match (&conns.source, kind) {
            (Some(source), CopyKind::Dump) => Some(db::source_rows(source)?.max(cp.items)),
            _ if cp.done => Some(cp.items),
            _ => Some(db::staged_rows(&conns.target)?),
        };
        Ok((conns, cp, total))
    }

    async fn copy(&mut self, ctx: &RunContext, live: &LiveRun) -> Result<RunExit, RunError> {
        let (env, kind) = (Arc::clone(&self.env), self.kind);
        let conns = self.conns.take();
        let ((), opened) =
            on_blocking(live, (), move |()| CopyUnit::open(&env, kind, conns)).await?;
        let (mut conns, cp, total) = opened.map_err(RunError::new)?;
        self.env.count_run(kind.index(), cp.items > 0 && !cp.done);
        self.env.report(ctx, kind.index(), cp.items, total);
        loop {
            if ctx.is_cancelled() {
                self.conns = Some(conns);
                return Ok(RunExit::Cancelled);
            }
            let (change_log, batch) = (self.env.change_log, self.env.batch);
            let (back, step) = on_blocking(live, conns, move |c| match (kind, &mut c.source) {
                (CopyKind::Dump, Some(source)) => {
                    db::dump_batch(source, &mut c.target, change_log, batch)
                }
                _ => db::load_batch(&mut c.target, batch),
            })
            .await?;
            conns = back;
            match step {
                Ok(Step::More { items }) => self.env.report(ctx, kind.index(), items, None),
                Ok(Step::Done { items }) => {
                    self.env.report(ctx, kind.index(), items, Some(items));
                    self.conns = Some(conns);
                    return Ok(RunExit::Completed);
                }
                Err(e) => {
                    self.conns = Some(conns);
                    return Err(RunError::new(e));
                }
            }
        }
    }
}

impl Unit for CopyUnit {
    fn name(&self) -> &str {
        self.kind.name()
    }

    /// Before a resumed run: the rows written must be exactly those the checkpoint
    /// claims (a second live copy would have broken this).
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        let target = self.env.target.clone();
        let unit = self.kind.name();
        check(move || {
            let db = Db::target(&target, WORK_BUSY)?;
            db::check_checkpoint(&db, unit).map(|_| ())
        })
        .await
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let live = self.env.live.enter();
        let result = self.copy(&ctx, &live).await;
        drop(live);
        result
    }

    fn close(&mut self) {
        self.conns = None;
    }
}

/// The sync: applies the source's change log to the target until it is caught up
/// and the writer has stopped.
#[derive(Debug)]
pub struct SyncUnit {
    env: Arc<Env>,
    writer: watch::Receiver<WriterState>,
    conns: Option<(Db, Db)>,
}

/// Which unit the sync is.
const SYNC: usize = 2;

impl SyncUnit {
    /// Whether the writer has stopped; marks the writer's state seen, so a later
    /// `changed()` reports only writes made after this call.
    fn writer_stopped(&mut self) -> bool {
        let stopped = self.writer.borrow_and_update().stopped;
        // A writer that is gone (its sender dropped) writes no more either.
        stopped || self.writer.has_changed().is_err()
    }

    async fn apply(&mut self, ctx: &RunContext, live: &LiveRun) -> Result<RunExit, RunError> {
        self.env.sync_started.send_replace(true);
        let env = Arc::clone(&self.env);
        let conns = self.conns.take();
        let ((), opened) = on_blocking(live, (), move |()| {
            let (source, target) = match conns {
                Some(conns) => conns,
                None => (
                    Db::source_read_only(&env.source, WORK_BUSY)?,
                    Db::target(&env.target, WORK_BUSY)?,
                ),
            };
            let cp = db::checkpoint(&target, "sync")?;
            Ok::<_, db::DbError>(((source, target), cp))
        })
        .await?;
        let (mut conns, cp) = opened.map_err(RunError::new)?;
        self.env.count_run(SYNC, cp.items > 0 && !cp.done);
        self.env.report(ctx, SYNC, cp.items, None);
        loop {
            if ctx.is_cancelled() {
                self.conns = Some(conns);
                return Ok(RunExit::Cancelled);
            }
            // Read before the batch: if the writer had stopped by now, an empty batch
            // means nothing is left, ever.
            let stopped = self.writer_stopped();
            let (change_log, batch) = (self.env.change_log, self.env.sync_batch);
            let (back, step) = on_blocking(live, conns, move |(source, target)| {
                db::sync_batch(source, target, change_log, batch)
            })
            .await?;
            conns = back;
            match step {
                Err(e) => {
                    self.conns = Some(conns);
                    return Err(RunError::new(e));
                }
                Ok(SyncStep::Done { items }) => {
                    self.env.report(ctx, SYNC, items, Some(items));
                    self.conns = Some(conns);
                    return Ok(RunExit::Completed);
                }
                Ok(SyncStep::Applied { applied, items }) if applied > 0 => {
                    self.env.report(ctx, SYNC, items, None);
                }
                Ok(SyncStep::Applied { .. }) if stopped => {
                    let (back, done) =
                        on_blocking(live, conns, |(_, target)| db::finish_sync(target)).await?;
                    self.conns = Some(back);
                    let items = done.map_err(RunError::new)?;
                    self.env.report(ctx, SYNC, items, Some(items));
                    return Ok(RunExit::Completed);
                }
                Ok(SyncStep::Applied { .. }) => {
                    // Caught up, but the writer is still writing: wait for its next
                    // commit, or for a pause.
                    tokio::select! {
                        biased;
                        () = ctx.cancelled() => {}
                        _ = self.writer.changed() => {}
                    }
                }
            }
        }
    }
}

impl Unit for SyncUnit {
    fn name(&self) -> &str {
        "sync"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let live = self.env.live.enter();
        let result = self.apply(&ctx, &live).await;
        drop(live);
        result
    }

    fn close(&mut self) {
        self.conns = None;
    }
}
