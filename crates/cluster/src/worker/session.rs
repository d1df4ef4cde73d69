//! The session: the worker's lease and the one loop that keeps it.
//!
//! One worker is one etcd *session* in the sense of etcd's Go `concurrency`
//! package: one lease, one keep-alive loop, and one clear place where the lease is
//! kept, lost and reported. The loop is the only writer of the lease deadlines
//! ([`LeaseState`]); the reconcile loop and the guard read them. Its cost is one
//! keep-alive per period, whatever the number of tasks.
//!
//! By default it runs on the worker's lease thread (see `keeper`), with a
//! connection of its own to the store, so that a runtime that the units keep busy
//! cannot delay a keep-alive.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, KeepAlive};
use crate::decide;
use crate::fence::within;

use super::Inner;

#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) ttl_ms: u64,
    pub(super) rho_permille: u64,
    pub(super) stop_bound_ms: u64,
    /// How long before the lease may expire a run must be confirmed gone.
    pub(super) margin_ms: u64,
    pub(super) keep_alive_every: Duration,
    /// How long the reconcile loop may go without turning before the lease is
    /// given up.
    pub(super) stall_bound_ms: u64,
}

/// The lease as the worker knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseState {
    /// When to begin stopping runs (ms since the worker's epoch); `None` once the
    /// store answered that the lease is gone, or the worker gave it up (its
    /// reconcile loop stalled).
    pub(super) stop_at: Option<u64>,
    /// The last instant a run may still be alive (ms since the worker's epoch; see
    /// [`decide::exit_at`]). Only an answered keep-alive moves it, and nothing
    /// clears it: a lease the store says is gone was trusted until then all the
    /// same, and no later.
    pub(super) exit_at: u64,
}

/// The lease half: one keep-alive loop, the only writer of the lease deadline.
pub(super) struct Session;

impl Session {
    /// Keeps the lease through `coord` (the store, on a connection that the lease
    /// thread uses alone) until `shutdown`, or until the store says it is gone.
    pub(super) async fn run(
        inner: Arc<Inner>,
        coord: Arc<dyn Coordinator>,
        timing: Timing,
        shutdown: CancellationToken,
    ) {
        let lease_tx = &inner.lease_state;
        let mut ticker = tokio::time::interval(timing.keep_alive_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if inner.history.replaced().is_some() {
                // Treated like a lost lease: no answer is trusted any more.
                return;
            }
            let stalled = inner.unturned_for(inner.now_ms());
            if stalled > timing.stall_bound_ms {
                // The worker answers no command and moves no task: its tasks are
                // better run elsewhere. Treated like a lost lease; the store expires
                // it one TTL after the last keep-alive, and the guard sees that no
                // run outlives it.
                tracing::error!(
                    worker = %inner.id,
                    stalled_ms = stalled,
                    bound_ms = timing.stall_bound_ms,
                    "the reconcile loop has not turned within the stall bound: giving the lease up"
                );
                lease_tx.send_modify(|state| state.stop_at = None);
                return;
            }
            // Record when the keep-alive was sent, on the monotonic clock: only an
            // answer with TTL > 0 moves the deadline, and it moves it to
            // sent + TTL·(1−ρ) − stop bound (decide::stop_at).
            let sent = inner.now_ms();
            // Room for the store to fail over once: a member that does not answer
            // (or cannot be connected to) within one call deadline is left inside
            // the call, for the next one. A shorter deadline dropped the call
            // before that, and the next keep-alive tried the same member again (an
            // etcd leader frozen, in the fault suite). Safety does not depend on it:
            // the guard enforces the deadlines the last answer set, however long
            // this call takes.
            let timeout = inner.op_timeout * 2;
            match within(timeout, "keep-alive", coord.keep_alive(inner.lease)).await {
                Ok(KeepAlive::Alive { ttl, .. }) => {
                    let ttl_ms = (ttl.as_millis() as u64).min(timing.ttl_ms);
                    let next =
                        decide::stop_at(sent, ttl_ms, timing.rho_permille, timing.stop_bound_ms);
                    let exit_at =
                        decide::exit_at(sent, ttl_ms, timing.rho_permille, timing.margin_ms);
                    lease_tx.send_if_modified(|state| match state.stop_at {
                        Some(current) if next > current => {
                            state.stop_at = Some(next);
                            state.exit_at = state.exit_at.max(exit_at);
                            true
                        }
                        _ => false,
                    });
                }
                Ok(KeepAlive::Expired) => {
                    tracing::warn!(worker = %inner.id, "lease expired");
                    // The reconcile loop and the guard wake on this change.
                    lease_tx.send_modify(|state| state.stop_at = None);
                    return;
                }
                Err(error) => {
                    // The deadline stays where the last answer put it.
                    tracing::debug!(worker = %inner.id, %error, "keep-alive failed");
                }
            }
        }
    }
}
