//! The writer: the application that keeps using the source while it is migrated.
//!
//! It inserts, updates and deletes rows of a source this program generated, in small
//! transactions; the source's triggers log every change for the sync unit. It writes
//! until the sync unit has started and then a little longer, so the sync really
//! catches up with a moving source, and then stops for good.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::migrate::db::{self, Db, DbError, Role, Writes};

/// How hard the writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterPlan {
    /// Changes per transaction.
    pub ops_per_batch: usize,
    /// The wait between transactions.
    pub pace: Duration,
    /// Transactions still written after the sync has started.
    pub tail_batches: u64,
}

impl Default for WriterPlan {
    fn default() -> Self {
        WriterPlan {
            ops_per_batch: 10,
            pace: Duration::from_millis(2),
            tail_batches: 100,
        }
    }
}

/// What the writer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterState {
    /// Transactions committed.
    pub batches: u64,
    /// Changes committed.
    pub writes: Writes,
    /// Set once the writer has committed its last transaction.
    pub stopped: bool,
}

/// Writes to the source at `path` until the sync has started and `plan.tail_batches`
/// more transactions are committed, or until `stop` is cancelled. Publishes its state
/// after every commit, and `stopped` when it ends, whatever the reason.
///
/// # Errors
///
/// A [`DbError`] naming the source.
pub async fn write(
    path: PathBuf,
    seed: u64,
    plan: WriterPlan,
    state: watch::Sender<WriterState>,
    mut sync_started: watch::Receiver<bool>,
    stop: CancellationToken,
) -> Result<Writes, DbError> {
    let result = write_until_done(path, seed, plan, &state, &mut sync_started, &stop).await;
    state.send_modify(|s| s.stopped = true);
    result.map(|()| state.borrow().writes)
}

async fn write_until_done(
    path: PathBuf,
    seed: u64,
    plan: WriterPlan,
    state: &watch::Sender<WriterState>,
    sync_started: &mut watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Result<(), DbError> {
    let gone = |e: tokio::task::JoinError| DbError::Io {
        role: Role::Source,
        path: path.clone(),
        source: std::io::Error::other(format!("a writer transaction did not complete: {e}")),
    };
    let open_path = path.clone();
    let (mut db, mut max_id) = tokio::task::spawn_blocking(move || {
        let db = Db::source_writer(&open_path)?;
        let max_id = db::max_id(&db)?;
        Ok::<_, DbError>((db, max_id))
    })
    .await
    .map_err(gone)??;
    // A different stream from the schedule's, so the two do not mirror each other.
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5752_4954_4552);
    let mut tail = 0u64;
    let mut clock = 10_000_000i64;
    loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        clock += 1;
        let ops = plan.ops_per_batch;
        let batch = tokio::task::spawn_blocking(move || {
            let writes = db::write_batch(&mut db, &mut rng, ops, &mut max_id, clock);
            (db, rng, max_id, writes)
        })
        .await
        .map_err(gone)?;
        let (back, back_rng, back_max, writes) = batch;
        (db, rng, max_id) = (back, back_rng, back_max);
        let writes = writes?;
        state.send_modify(|s| {
            s.batches += 1;
            s.writes.add(writes);
        });
        if *sync_started.borrow_and_update() {
            tail += 1;
            if tail >= plan.tail_batches {
                return Ok(());
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(plan.pace) => {}
        }
    }
}
