//! The signal of one generation: a cancel and an abort, raised once each, awaited by
//! the one future that races the generation's check or run against them.
//!
//! The driver needs to learn of a generation's abort (to drop its run's future) and,
//! for a pre-start check, of its cancel (to drop the check at once). One listener at
//! a time does that, so the signal is two bits and one waker slot: no token tree, and
//! a 32-byte future in every run's task instead of two `Notified`s. The unit's own
//! `CancellationToken` is separate (the runtime layer cancels both). It is built on
//! the crate's sync shim, so the loom models run it.
//!
//! # Invariants
//!
//! 1. A raised bit is never lowered.
//! 2. No wake-up is lost: [`RunSignal::raise`] sets its bits *then* looks at the slot
//!    under its lock; [`Raised::poll`] fills the slot under that lock *then* loads the
//!    bits. Whichever takes the lock second sees the other's write: either the raise
//!    finds the listener, or the listener finds the bit.
//! 3. A raise empties the slot only if it raises a bit the listener waits for. So a
//!    listener that finds its own waker still in place may skip the lock: the slot can
//!    only have been emptied by a raise that the listener's load of the bits sees.
//! 4. One listener at a time: a listener replaces the one before it. The driver has
//!    one race per check or run.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::Interrupt;
use crate::sync::{lock, AtomicU8, Mutex, Ordering};

/// The bit a cancel raises.
pub const CANCEL: u8 = 1;
/// The bit an abort raises.
pub const ABORT: u8 = 2;

/// A generation's cancel and abort bits, and the waker of the future waiting for them.
#[derive(Debug, Default)]
pub struct RunSignal {
    raised: AtomicU8,
    /// The listener: the bits it waits for, and its waker.
    listener: Mutex<Option<(u8, Waker)>>,
}

impl RunSignal {
    /// A signal with nothing raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises `bits` ([`CANCEL`], [`ABORT`]) and wakes the listener if it waits for one
    /// of them. Idempotent.
    pub fn raise(&self, bits: u8) {
        // SeqCst with the load in `poll` (invariant 2); the lock below orders the two
        // sides as well.
        self.raised.fetch_or(bits, Ordering::SeqCst);
        let waker = {
            let mut listener = lock(&self.listener);
            #[cfg(taskstage_loom)]
            let any = super::prefix::on(super::prefix::Defect::WakeAnyListener);
            #[cfg(not(taskstage_loom))]
            let any = false;
            match &*listener {
                // Invariant 3: only a raise the listener waits for empties the slot.
                Some((mask, _)) if any || mask & bits != 0 => listener.take().map(|(_, w)| w),
                _ => None,
            }
        };
        if let Some(waker) = waker {
            // Woken with the lock released: the waker is not ours.
            waker.wake();
        }
    }

    /// The bits raised so far.
    pub fn raised(&self) -> u8 {
        self.raised.load(Ordering::SeqCst)
    }

    /// Completes once the abort is raised, or, when `on_cancel`, the cancel: the
    /// listener of [`CancelHandle::interrupted`](super::CancelHandle::interrupted),
    /// saying which (the abort, if both were).
    pub async fn interrupted(&self, on_cancel: bool) -> Interrupt {
        let mask = if on_cancel { ABORT | CANCEL } else { ABORT };
        if self.wait(mask).await & ABORT != 0 {
            Interrupt::Aborted
        } else {
            Interrupt::Cancelled
        }
    }

    /// Completes once one of `mask`'s bits is raised, with the raised bits of `mask`.
    pub fn wait(&self, mask: u8) -> Raised<'_> {
        Raised {
            signal: self,
            mask,
            registered: None,
        }
    }
}

/// Future returned by [`RunSignal::wait`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Raised<'a> {
    signal: &'a RunSignal,
    mask: u8,
    /// The waker this future last put in the slot.
    registered: Option<Waker>,
}

impl Future for Raised<'_> {
    type Output = u8;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u8> {
        let seen = self.signal.raised() & self.mask;
        if seen != 0 {
            return Poll::Ready(seen);
        }
        if self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // Invariant 3: the slot still holds this task's waker.
            return Poll::Pending;
        }
        let waker = cx.waker().clone();
        let replaced = lock(&self.signal.listener).replace((self.mask, waker.clone()));
        // The waker it replaces is dropped with the lock released: it is not ours.
        drop(replaced);
        self.registered = Some(waker);
        #[cfg(taskstage_loom)]
        if super::prefix::on(super::prefix::Defect::AbortNoRecheck) {
            return Poll::Pending;
        }
        // Invariant 2: loaded after the slot was filled under the lock.
        match self.signal.raised() & self.mask {
            0 => Poll::Pending,
            seen => Poll::Ready(seen),
        }
    }
}
