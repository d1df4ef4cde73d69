//! The guard: the lease deadline's own enforcer, beside the reconcile loop.
//!
//! Owns one promise: from the instant the lease no longer allows runs, every
//! local task is being stopped, whatever the reconcile loop and the store are
//! doing. It waits for nothing but the clock and the lease state, so a store call
//! that hangs up to its deadline cannot hold the stop back. Its cost is nothing
//! until the deadline, then one pass over the held tasks per [`REPEAT`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::decide;
use crate::cluster::keys::TaskId;
use crate::runtime::Handle;
use crate::stage::Stage;

use super::session::LeaseState;
use super::Inner;

/// How often the guard stops again what is not stopping yet, while the lease does
/// not allow runs.
const REPEAT: Duration = Duration::from_millis(250);

/// Stops `handle`'s task in the background, escalating to abort after the grace
/// (the stop bound's first half), and tells the reconcile loop when it is done.
pub(super) fn spawn_stop(inner: &Inner, task: TaskId, handle: Handle) -> JoinHandle<()> {
    let (grace, wake) = (inner.grace, inner.wake.clone());
    tokio::spawn(async move {
        let _ = handle.stop_within(grace).await;
        // A worker that has ended no longer listens.
        let _ = wake.send(task);
    })
}

/// The lease state the reconcile loop decides with now.
pub(super) fn lease_now(inner: &Inner, lease_rx: &mut watch::Receiver<LeaseState>) -> LeaseState {
    let lease = *lease_rx.borrow_and_update();
    if inner.unfenced {
        // Test-only: a lease that never ends, whatever the store says.
        LeaseState {
            stop_at: Some(u64::MAX),
        }
    } else {
        lease
    }
}

/// The reconcile loop decides the fence at the deadline (decide, invariant 2), but
/// only once it gets there: a store call that started just before the deadline can
/// hold it for a whole call deadline past it (the fault tests caught a worker cut off
/// from etcd still running its task when another worker had started it). This task
/// waits for nothing but the clock and the lease state: from `stop_at` on, it stops
/// every local task that `decide` would fence and that is not stopping yet (New and
/// Paused included, so that a resume issued just after the deadline is refused;
/// escalating to abort after the grace), again every [`REPEAT`] until the lease is
/// extended or the worker ends. The handles come from the view the reconcile loop
/// keeps up to date with each change.
pub(super) async fn guard(
    inner: Arc<Inner>,
    mut lease_rx: watch::Receiver<LeaseState>,
    shutdown: CancellationToken,
) {
    // Bounded by the worker's life: it ends with the shutdown token, or is aborted.
    loop {
        let lease = *lease_rx.borrow_and_update();
        if let Some(ms) = lease
            .stop_at
            .filter(|ms| decide::lease_allows(inner.now_ms(), Some(*ms)))
        {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = lease_rx.changed() => {}
                _ = tokio::time::sleep_until(inner.at(ms)) => {}
            }
            continue;
        }
        let handles: Vec<(TaskId, Handle)> = inner
            .view()
            .iter()
            .filter_map(|(task, held)| Some((task.clone(), held.handle.clone()?)))
            // The tasks decide fences (invariant 2), but for those already stopping.
            .filter(|(_, handle)| {
                let stage = handle.stage();
                decide::must_fence(stage) && stage != Stage::Stopping
            })
            .collect();
        for (task, handle) in handles {
            tracing::info!(worker = %inner.id, %task, "lease deadline: stopping the local run");
            drop(spawn_stop(&inner, task, handle));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lease_rx.changed() => {}
            _ = tokio::time::sleep(REPEAT) => {}
        }
    }
}
