//! The program as one async function: check the databases, start the writer and the
//! pipeline, let the controller drive it, then verify the target against the source.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::migrate::cli::Options;
use crate::migrate::controller::{self, Act, Pipeline, Trigger};
use crate::migrate::db::{self, Db, DbError, Role, WORK_BUSY};
use crate::migrate::live::LiveRuns;
use crate::migrate::report::{thousands, Counts, Screen, Summary, Timeline, UnitRuns};
use crate::migrate::units::{Env, UnitProgress};
use crate::migrate::writer::{self, WriterPlan, WriterState};

/// Change-log entries per sync batch.
const SYNC_BATCH: usize = 500;

/// A run that could not start: bad input, or a database that cannot be used. Nothing
/// was written to the source.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A database failed its checks (or could not be generated).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The work directory could not be created.
    #[error("could not create a work directory in {}: {source}", .dir.display())]
    WorkDir {
        /// Where it was to be created.
        dir: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A check on the blocking pool did not complete.
    #[error("a database check did not complete: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl MigrateError {
    /// The process exit status for this error: 2, "cannot use this input".
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs one migration as `options` say, reporting progress on `screen`.
///
/// Returns the summary whether or not the migration succeeded (see
/// [`Summary::verified`]); an error means it could not start.
///
/// # Errors
///
/// [`MigrateError`] when an argument or a database cannot be used; the source is
/// never written then.
pub async fn run(options: &Options, screen: Arc<Screen>) -> Result<Summary, MigrateError> {
    let work = if options.source.is_none() || options.target.is_none() {
        Some(create_work_dir()?)
    } else {
        None
    };
    let in_work = |file: &str| work.as_ref().map(|dir| dir.join(file)).unwrap_or_default();
    let generated = options.source.is_none();
    let source = options
        .source
        .clone()
        .unwrap_or_else(|| in_work("source.db"));
    let target = options
        .target
        .clone()
        .unwrap_or_else(|| in_work("target.db"));
    let seed = options.seed;

    let checked = check_databases(options, &source, &target, &screen).await;
    let (info, target_info) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            if let Some(dir) = &work {
                // Nothing in it is worth keeping: the run never started.
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e);
        }
    };

    let script = controller::plan(seed, options.pauses);
    screen.say(&format!(
        "migrating {} rows: {} -> {}",
        thousands(info.rows),
        source.display(),
        target.display()
    ));
    screen.say(&describe_script(seed, &script, generated));

    // The writer runs only on a source this program generated.
    let initial = WriterState {
        stopped: !generated,
        ..WriterState::default()
    };
    let (writer_state, writer_seen) = watch::channel(initial);
    let (sync_started, sync_seen) = watch::channel(false);
    let stop_writer = CancellationToken::new();
    let writer = generated.then(|| {
        tokio::spawn(writer::write(
            source.clone(),
            seed,
            WriterPlan::default(),
            writer_state,
            sync_seen,
            stop_writer.clone(),
        ))
    });

    let (progress, progress_seen) = watch::channel([UnitProgress::default(); 3]);
    let batch = usize::try_from((info.rows / 100).clamp(50, 2_000)).unwrap_or(2_000);
    let env = Arc::new(Env {
        source: source.clone(),
        target: target.clone(),
        change_log: info.change_log,
        batch,
        sync_batch: SYNC_BATCH,
        live: Arc::new(LiveRuns::default()),
        progress,
        screen: Arc::clone(&screen),
        writer: writer_seen,
        sync_started,
        runs: Mutex::new([UnitRuns::default(); 3]),
    });
    // The totals the screen shows before the units report their own.
    env.progress.send_modify(|p| p[0].total = Some(info.rows));
    screen.progress(0, 0, Some(info.rows));

    let timeline = Arc::new(Timeline::new());
    let mut counts = Counts::default();
    let mut failure = None;
    match Pipeline::start(Arc::clone(&env), Arc::clone(&timeline), Arc::clone(&screen)).await {
        Ok(mut pipeline) => {
            if let Err(e) =
                controller::drive(&mut pipeline, &script, &progress_seen, &mut counts).await
            {
                failure = Some(e.to_string());
            }
            // Stop whatever is left (nothing, after a success) before reading the target.
            pipeline.close().await;
        }
        Err(e) => failure = Some(e.to_string()),
    }
    let elapsed = timeline.elapsed();

    stop_writer.cancel();
    let writes = match writer {
        Some(writer) => match writer.await {
            Ok(Ok(writes)) => writes,
            Ok(Err(e)) => {
                failure.get_or_insert_with(|| format!("the writer failed: {e}"));
                env.writer.borrow().writes
            }
            Err(e) => {
                failure.get_or_insert_with(|| format!("the writer did not complete: {e}"));
                env.writer.borrow().writes
            }
        },
        None => db::Writes::default(),
    };

    let (source_path, target_path) = (source.clone(), target.clone());
    let compared = tokio::task::spawn_blocking(move || {
        let s = db::digest(&Db::source_read_only(&source_path, WORK_BUSY)?)?;
        let t = Db::target(&target_path, WORK_BUSY)?;
        Ok::<_, DbError>((s, db::digest(&t)?, db::checkpoints(&t)?))
    })
    .await;
    let (source_digest, target_digest, checkpoints) = match compared {
        Ok(Ok((s, t, c))) => (Some(s), Some(t), c),
        Ok(Err(e)) => {
            failure.get_or_insert_with(|| format!("verification could not read: {e}"));
            (None, None, Vec::new())
        }
        Err(e) => {
            failure.get_or_insert_with(|| format!("verification did not complete: {e}"));
            (None, None, Vec::new())
        }
    };

    let runs = *env
        .runs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut summary = Summary {
        source,
        target,
        generated_rows: generated.then_some(options.rows),
        seed,
        continued_target: target_info.continued,
        elapsed,
        timeline: timeline.entries(),
        counts,
        runs,
        max_live: env.live.max(),
        live_at_end: env.live.now(),
        runs_entered: env.live.entered(),
        writes,
        source_digest,
        target_digest,
        checkpoints,
        failure,
        kept_dir: None,
    };
    if let Some(dir) = work {
        if summary.verified() && !options.keep {
            // Best effort: a leftover temporary directory harms nothing.
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            summary.kept_dir = Some(dir);
        }
    }
    Ok(summary)
}

/// Everything before the pipeline: the target's path, the generated source (if any),
/// then both databases' checks. Nothing here writes to a source it did not create.
async fn check_databases(
    options: &Options,
    source: &std::path::Path,
    target: &std::path::Path,
    screen: &Screen,
) -> Result<(db::SourceInfo, db::TargetInfo), MigrateError> {
    // A bad target path is found before a minute is spent generating a source.
    db::check_directory(Role::Target, target)?;
    if options.source.is_none() {
        screen.say(&format!(
            "generating a source with {} rows: {}",
            thousands(options.rows),
            source.display()
        ));
        let (path, rows, seed) = (source.to_owned(), options.rows, options.seed);
        tokio::task::spawn_blocking(move || db::generate_source(&path, rows, seed)).await??;
    }
    let path = source.to_owned();
    let info = tokio::task::spawn_blocking(move || db::inspect_source(&path)).await??;
    let source_key = std::fs::canonicalize(source)
        .map_err(|e| DbError::Io {
            role: Role::Source,
            path: source.to_owned(),
            source: e,
        })?
        .display()
        .to_string();
    let path = target.to_owned();
    let target_info =
        tokio::task::spawn_blocking(move || db::prepare_target(&path, &source_key)).await??;
    Ok((info, target_info))
}

/// The script in one paragraph, for the header.
fn describe_script(
    seed: u64,
    script: &[crate::migrate::controller::Action],
    generated: bool,
) -> String {
    let pauses = script
        .iter()
        .filter(|a| matches!(a.act, Act::Pause { .. }))
        .count();
    let at_switch = script
        .iter()
        .filter(|a| matches!(a.trigger, Trigger::Switch { .. }))
        .count();
    let stop = script
        .iter()
        .find(|a| a.act == Act::StopAndRestart)
        .map(|a| format!(", one stop and restart {}", a.trigger))
        .unwrap_or_default();
    let writer = if generated {
        "; a writer changes the source until the sync has caught up"
    } else {
        "; the source is only read (no writer)"
    };
    format!("controller: seed {seed}, {pauses} pauses ({at_switch} at unit switches){stop}{writer}")
}

static WORK_DIRS: AtomicU64 = AtomicU64::new(0);

fn create_work_dir() -> Result<PathBuf, MigrateError> {
    let base = std::env::temp_dir();
    // Relaxed: the counter only has to hand out distinct numbers.
    let n = WORK_DIRS.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = base.join(format!(
        "taskstage-migrate-{}-{n}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir(&dir).map_err(|source| MigrateError::WorkDir {
        dir: base.clone(),
        source,
    })?;
    Ok(dir)
}
