//! The testing kit (`taskstage::testing`) on the migrate example's real SQLite units:
//! 128 generated pause, resume, stop, restart and update schedules on a small
//! migration pass, and a load that writes its checkpoint before its rows is caught and shrunk
//! to a schedule of at most three commands.
//!
//! Each schedule gets its own copy of one generated source and a fresh target; a
//! restart builds a new task whose units know nothing but the target's checkpoints.
//! The seed is random unless `TASKSTAGE_KIT_SEED` is set; a failure prints it.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

// The example's units and the modules they stand on, included as examples/tests/migrate.rs
// does; this test uses the units and the databases, not all of each module.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use taskstage_examples::migrate::{db, live, report, units, writer};

use rusqlite::{params, Connection, TransactionBehavior};
use taskstage::testing::{End, Runner, Schedule, Schedules, Subject, Violation, Watch};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, TaskBuilder, Unit};
use tokio::sync::watch;

use db::{Db, WORK_BUSY};
use live::LiveRuns;
use report::{Screen, UnitRuns};
use units::{Env, UnitProgress};
use writer::WriterState;

/// Rows in the source: small, so that a schedule takes a few milliseconds.
const ROWS: u64 = 200;
/// Rows per dump and load batch: 8 batches (and 8 progress reports) per unit.
const BATCH: usize = 25;

/// A directory under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> std::io::Result<Scratch> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "taskstage-kit-test-{}-{name}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The generated source every schedule copies: made once per test binary.
fn template() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(Scratch, PathBuf), String>> = OnceLock::new();
    let made = TEMPLATE.get_or_init(|| {
        let dir = Scratch::new("template").map_err(|e| e.to_string())?;
        let source = dir.path("source.db");
        db::generate_source(&source, ROWS, 5).map_err(|e| e.to_string())?;
        Ok((dir, source))
    });
    match made {
        Ok((_, source)) => Ok(source),
        Err(e) => Err(e.clone()),
    }
}

/// One schedule's world: a copy of the source, a fresh target, and the units'
/// shared environment. `broken` swaps the load for [`CheckpointFirstLoad`].
struct Migration {
    env: Arc<Env>,
    broken: bool,
    /// The writer's state, kept so that the sync sees a stopped writer, not a gone one.
    _writer: watch::Sender<WriterState>,
    _dir: Scratch,
}

impl Migration {
    fn new(broken: bool) -> Result<Migration, String> {
        let dir = Scratch::new("case").map_err(|e| e.to_string())?;
        let (source, target) = (dir.path("source.db"), dir.path("target.db"));
        std::fs::copy(template()?, &source).map_err(|e| e.to_string())?;
        let info = db::inspect_source(&source).map_err(|e| e.to_string())?;
        let key = std::fs::canonicalize(&source)
            .map_err(|e| e.to_string())?
            .display()
            .to_string();
        db::prepare_target(&target, &key).map_err(|e| e.to_string())?;
        // No writer in these tests: the sync finds the change log as the dump left it.
        let (writer, writer_seen) = watch::channel(WriterState {
            stopped: true,
            ..WriterState::default()
        });
        let env = Arc::new(Env {
            source,
            target,
            change_log: info.change_log,
            batch: BATCH,
            sync_batch: 500,
            live: Arc::new(LiveRuns::default()),
            progress: watch::channel([UnitProgress::default(); 3]).0,
            screen: Arc::new(Screen::new(true)),
            writer: writer_seen,
            sync_started: watch::channel(false).0,
            runs: Mutex::new([UnitRuns::default(); 3]),
        });
        Ok(Migration {
            env,
            broken,
            _writer: writer,
            _dir: dir,
        })
    }
}

impl Subject for Migration {
    type Config = ();

    fn task(&mut self, watch: &Watch) -> TaskBuilder {
        // Fresh units: all they know comes from the target's checkpoints.
        let (dump, load, sync) = self.env.units();
        let task = Task::builder(format!("migrate-{}", watch.task())).unit(watch.unit(dump));
        let task = if self.broken {
            task.unit(watch.unit(CheckpointFirstLoad {
                target: self.env.target.clone(),
            }))
        } else {
            task.unit(watch.unit(load))
        };
        task.unit(watch.unit(sync))
    }

    fn update(&mut self, _n: u32) {}

    /// Finished: the target equals the source and every checkpoint is complete.
    /// Stopped for good: the rows written are exactly those the checkpoints claim.
    /// Either way the example's own counter never saw two live runs.
    fn check(&mut self, end: &End) -> Result<(), String> {
        if self.env.live.max() > 1 {
            return Err(format!(
                "the example's counter saw {} live runs",
                self.env.live.max()
            ));
        }
        let text = |e: db::DbError| e.to_string();
        let target = Db::target(&self.env.target, WORK_BUSY).map_err(text)?;
        if end.stage == Stage::Finished {
            let source = Db::source_read_only(&self.env.source, WORK_BUSY).map_err(text)?;
            let (s, t) = (
                db::digest(&source).map_err(text)?,
                db::digest(&target).map_err(text)?,
            );
            if s != t {
                return Err(format!("the target {t:?} differs from the source {s:?}"));
            }
            for (unit, cp) in db::checkpoints(&target).map_err(text)? {
                if !cp.done {
                    return Err(format!("finished, but the {unit} checkpoint is {cp:?}"));
                }
            }
        } else {
            for unit in ["dump", "load"] {
                db::check_checkpoint(&target, unit).map_err(text)?;
            }
        }
        Ok(())
    }
}

/// The bug the kit must find: a load that commits its checkpoint, then checks for
/// cancellation, then writes the rows the checkpoint already claims. A pause between
/// the two loses a batch: the next run starts after it.
struct CheckpointFirstLoad {
    target: PathBuf,
}

/// Claims the next batch in the checkpoint (committed), without its rows: `(after,
/// last, items)`, or `None` once the load is complete.
fn claim_batch(target: &Path) -> rusqlite::Result<Option<(i64, i64, u64)>> {
    let mut conn = Connection::open(target)?;
    conn.busy_timeout(WORK_BUSY)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (position, items, done): (i64, i64, bool) = tx.query_row(
        "SELECT position, items, done FROM _migration_checkpoint WHERE unit = 'load'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0)),
    )?;
    if done {
        return Ok(None);
    }
    let (n, last): (i64, Option<i64>) = tx.query_row(
        "SELECT count(*), max(id) FROM \
         (SELECT id FROM _staging_accounts WHERE id > ?1 ORDER BY id LIMIT ?2)",
        params![position, BATCH as i64],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let Some(last) = last else {
        tx.execute(
            "UPDATE _migration_checkpoint SET done = 1 WHERE unit = 'load'",
            [],
        )?;
        tx.execute_batch("DROP TABLE _staging_accounts")?;
        tx.commit()?;
        return Ok(None);
    };
    tx.execute(
        "UPDATE _migration_checkpoint SET position = ?1, items = ?2 WHERE unit = 'load'",
        params![last, items + n],
    )?;
    tx.commit()?;
    Ok(Some((
        position,
        last,
        u64::try_from(items + n).unwrap_or(0),
    )))
}

/// Writes the staged rows `after < id <= last` into `accounts`.
fn write_rows(target: &Path, after: i64, last: i64) -> rusqlite::Result<()> {
    let conn = Connection::open(target)?;
    conn.busy_timeout(WORK_BUSY)?;
    conn.execute(
        "INSERT INTO accounts (id, name, email, country, balance_cents, updated_at) \
         SELECT id, name, email, country, balance_cents, updated_at \
         FROM _staging_accounts WHERE id > ?1 AND id <= ?2",
        params![after, last],
    )?;
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, RunError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RunError::msg(format!("a batch did not complete: {e}")))?
        .map_err(RunError::new)
}

impl Unit for CheckpointFirstLoad {
    fn name(&self) -> &str {
        "load"
    }

    /// The real load's check: the rows must be those the checkpoint claims.
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        let target = self.target.clone();
        tokio::task::spawn_blocking(move || {
            let db = Db::target(&target, WORK_BUSY)?;
            db::check_checkpoint(&db, "load").map(|_| ())
        })
        .await
        .map_err(|e| RunError::msg(format!("the check did not complete: {e}")))?
        .map_err(RunError::new)
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        loop {
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled);
            }
            let target = self.target.clone();
            let Some((after, last, items)) = blocking(move || claim_batch(&target)).await? else {
                return Ok(RunExit::Completed);
            };
            ctx.report_progress(items, None);
            tokio::task::yield_now().await;
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled); // the bug: the claimed rows are never written
            }
            let target = self.target.clone();
            blocking(move || write_rows(&target, after, last)).await?;
        }
    }
}

fn runner(broken: bool, cases: u32) -> Runner<Migration> {
    let runner = Runner::new(move || Migration::new(broken))
        .cases(cases)
        .bound(Duration::from_secs(5));
    match std::env::var("TASKSTAGE_KIT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => runner.seed(seed),
        None => runner,
    }
}

/// Report points reach into the load (9 reports in the dump) and the sync. A pause
/// holds until a resume, and points cannot come while the task is paused, so resumes
/// are drawn a little more often than pauses.
fn schedules() -> Schedules {
    Schedules::new()
        .steps(1..=6)
        .units(3)
        .max_reports(20)
        .pause_weight(3)
        .resume_weight(4)
}

#[test]
fn the_migration_passes_128_generated_schedules() {
    let started = Instant::now();
    let summary = runner(false, 128)
        .check(&schedules())
        .unwrap_or_else(|report| panic!("{report}"));
    assert_eq!(summary.cases, 128);
    // The schedules did act: a third of their steps or more found their point (the
    // rest came while the task was paused, stopped or past the point).
    assert!(
        summary.skipped * 3 < summary.steps * 2,
        "{} of {} steps were skipped (seed {})",
        summary.skipped,
        summary.steps,
        summary.seed
    );
    eprintln!(
        "128 schedules ({} steps, {} skipped, seed {}) in {:.1?}",
        summary.steps,
        summary.skipped,
        summary.seed,
        started.elapsed()
    );
}

#[test]
fn a_checkpoint_written_before_its_rows_is_caught_and_shrunk_to_three_commands_or_fewer() {
    let started = Instant::now();
    // The runner stops at the first failure: 128 is a ceiling, not a cost.
    let report = runner(true, 128)
        .check(&schedules())
        .expect_err("the broken load must fail a schedule");
    let failure = report.failure().expect("a schedule failed");
    let text = report.to_string();
    eprintln!("{text}\n(found and shrunk in {:.1?})", started.elapsed());
    assert!(failure.schedule.len() <= 3, "{text}");
    assert!(!failure.schedule.is_empty(), "{text}");
    // The message shows the shrunk schedule, as a script that parses back.
    let script = failure.schedule.to_string();
    assert!(
        text.contains(&format!("shrunk to {} command", failure.schedule.len())),
        "{text}"
    );
    assert!(text.contains(&script), "{text}");
    assert_eq!(script.parse::<Schedule>().as_ref(), Ok(&failure.schedule));
    // The lost batch shows: the resumed load's check refuses the target, or the end
    // check finds rows missing.
    assert!(
        matches!(
            failure.violation,
            Violation::FinalStage { .. } | Violation::Check(_)
        ),
        "{text}"
    );
    // And the timeline of that run is in the message.
    assert!(text.contains("timeline:"), "{text}");
    assert!(
        text.contains("Pausing") || text.contains("Stopping"),
        "{text}"
    );
}

#[test]
fn a_written_schedule_replays_on_the_real_units() {
    // A pause at the switch to the load, another during the check that resumes it,
    // then a stop and a restart from the checkpoints mid-load, and a pause in the new
    // task: the target still equals the source.
    let schedule: Schedule = "at switch to unit 1: pause; after 5 ms: resume; in check: pause; \
                              after 1 ms: resume; after 3 reports: restart; after 1 report: pause"
        .parse()
        .expect("the script parses");
    let passed = runner(false, 1)
        .run(&schedule)
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(passed.end, Stage::Finished, "{}", passed.timeline);
    assert_eq!(passed.skipped, 0, "{}", passed.timeline);
    let timeline = passed.timeline.to_string();
    assert!(timeline.contains("task 2"), "{timeline}");
    // With the broken load, one pause in its gap (after the checkpoint, before the
    // rows) is enough to fail.
    let failure = runner(true, 1)
        .run(
            &"after 10 reports: pause"
                .parse()
                .expect("the script parses"),
        )
        .expect_err("a pause in the broken load's gap loses a batch");
    assert!(
        matches!(
            failure.violation,
            Violation::FinalStage {
                actual: Stage::Paused,
                ..
            }
        ),
        "{failure}"
    );
}
