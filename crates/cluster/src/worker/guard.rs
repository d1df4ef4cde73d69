//! The guard: the lease deadlines' own enforcer, beside the reconcile loop.
//!
//! Owns two promises, both from the lease state alone, whatever the reconcile loop
//! and the store are doing:
//!
//! 1. From `stop_at` on, every local task is being stopped (escalating to abort
//!    after the grace).
//! 2. At `exit_at` and after it, no run of this worker is alive; a run that is not
//!    confirmed gone then is an *overrun*, and the worker's [`OverrunPolicy`]
//!    answers it (by default the process ends, which the kernel enforces whatever
//!    the runtime that holds the run is doing).
//!
//! It waits for nothing but the clock, the lease state and the tasks' stages (a
//! lock-free read each), so a store call that hangs up to its deadline cannot hold
//! a stop back. By default it runs on the worker's lease thread, so a runtime that
//! the units keep busy cannot delay it either. After the worker is shut down or
//! dropped it keeps watching the runs it left until each is gone, or `exit_at`.
//! Its cost is nothing until a deadline, then one pass over the held tasks per
//! [`REPEAT`] (per [`WATCH`] after a shutdown).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::decide;
use crate::keys::TaskId;
use taskstage::runtime::Handle;
use taskstage::Stage;

use super::session::LeaseState;
use super::{Inner, OverrunPolicy, OVERRUN_EXIT_CODE};

/// How often the guard stops again what is not stopping yet, while the lease does
/// not allow runs.
const REPEAT: Duration = Duration::from_millis(250);

/// How often the guard looks at the runs a shut-down worker left, until each is
/// gone or the lease runs out.
const WATCH: Duration = Duration::from_millis(20);

/// Stops `handle`'s task in the background, escalating to abort after the grace
/// (the stop bound's first half), and tells the reconcile loop when it is done.
/// The stop and its timer run on the runtime that calls this (the guard's, for the
/// guard's stops); the run's future is dropped on its own runtime.
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
    if inner.history.replaced().is_some() {
        // The store's history was replaced: treated like a lost lease.
        LeaseState {
            stop_at: None,
            ..lease
        }
    } else {
        lease
    }
}

/// The held tasks whose run (or pre-start check) may be alive, with their stage.
fn live_runs(inner: &Inner) -> Vec<(TaskId, Stage)> {
    inner
        .view()
        .iter()
        .filter_map(|(task, held)| {
            let stage = held.handle.as_ref()?.stage();
            stage.run_may_be_alive().then(|| (task.clone(), stage))
        })
        .collect()
}

/// Answers runs found alive at or after `exit_at`, by the worker's policy. Returns
/// only under [`OverrunPolicy::LogOnly`].
fn overrun(inner: &Inner, alive: &[(TaskId, Stage)]) {
    let tasks = alive
        .iter()
        .map(|(task, stage)| format!("{task} ({stage})"))
        .collect::<Vec<_>>()
        .join(", ");
    match inner.overrun {
        OverrunPolicy::ExitProcess => {
            tracing::error!(
                worker = %inner.id,
                lease = inner.lease,
                %tasks,
                code = OVERRUN_EXIT_CODE,
                "lease overrun: runs not confirmed gone before the lease may expire; ending the process"
            );
            // Written directly as well: the process ends now, whatever subscriber
            // the application has (or has not) installed.
            eprintln!(
                "taskstage: worker {} (lease {:x}): lease overrun: runs not confirmed gone \
                 before the lease may expire: {tasks}; ending the process with status {}",
                inner.id, inner.lease, OVERRUN_EXIT_CODE
            );
            std::process::exit(OVERRUN_EXIT_CODE);
        }
        OverrunPolicy::LogOnly => {
            tracing::error!(
                worker = %inner.id,
                lease = inner.lease,
                %tasks,
                "lease overrun: runs not confirmed gone before the lease may expire; \
                 they may outlive it (overrun policy: log only)"
            );
        }
    }
}

/// The guard's loop; see the module docs. Bounded by the worker's life: after
/// `shutdown`, by the runs it left or `exit_at`, whichever is first.
pub(super) async fn guard(
    inner: Arc<Inner>,
    mut lease_rx: watch::Receiver<LeaseState>,
    shutdown: CancellationToken,
) {
    loop {
        if shutdown.is_cancelled() {
            return watch_what_is_left(&inner, &lease_rx).await;
        }
        let lease = *lease_rx.borrow_and_update();
        let now = inner.now_ms();
        if let Some(ms) = lease
            .stop_at
            .filter(|ms| decide::lease_allows(now, Some(*ms)))
        {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lease_rx.changed() => {}
                _ = tokio::time::sleep_until(inner.at(ms)) => {}
            }
            continue;
        }
        stop_the_rest(&inner);
        let next = if now >= lease.exit_at {
            let alive = live_runs(&inner);
            if !alive.is_empty() {
                overrun(&inner, &alive);
            }
            now + REPEAT.as_millis() as u64
        } else {
            lease.exit_at.min(now + REPEAT.as_millis() as u64)
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = lease_rx.changed() => {}
            _ = tokio::time::sleep_until(inner.at(next)) => {}
        }
    }
}

/// Stops every held task that `decide` would fence and that is not stopping yet
/// (New and Paused included, so that a resume issued just after the deadline is
/// refused).
fn stop_the_rest(inner: &Inner) {
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
        drop(spawn_stop(inner, task, handle));
    }
}

/// After a shutdown or a drop: the lease is no longer kept, so `exit_at` is final.
/// Waits until no held run may be alive; one still alive at `exit_at` is an
/// overrun. Bounded by `exit_at`.
async fn watch_what_is_left(inner: &Inner, lease_rx: &watch::Receiver<LeaseState>) {
    loop {
        let alive = live_runs(inner);
        if alive.is_empty() {
            return;
        }
        let exit_at = lease_rx.borrow().exit_at;
        let now = inner.now_ms();
        if now >= exit_at {
            overrun(inner, &alive);
            return;
        }
        let next = exit_at.min(now + WATCH.as_millis() as u64);
        tokio::time::sleep_until(inner.at(next)).await;
    }
}
