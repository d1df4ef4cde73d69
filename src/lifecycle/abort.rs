//! The abort signal of one generation: raised once, awaited by the one future that
//! races the generation's check or run against it.
//!
//! It replaces a second `CancellationToken` per generation: an abort has exactly one
//! listener (the driver's race), so it needs a flag and one waker slot, not a token
//! tree. It is built on the crate's sync shim, so the loom models run it too.
//!
//! # Invariants
//!
//! 1. Once raised, the flag is never lowered.
//! 2. No wake-up is lost: [`AbortSignal::raise`] stores the flag *then* takes the slot
//!    under its lock; [`Aborted::poll`] fills the slot under that lock *then* loads the
//!    flag. Whichever takes the lock second sees the other's write: either the raise
//!    finds the waker, or the poll finds the flag.
//! 3. One listener at a time: a second future polling the same signal replaces the
//!    first one's waker. The driver has one race per generation.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{lock, AtomicBool, Mutex, Ordering};

/// A flag raised once, and the waker of the future waiting for it.
#[derive(Debug, Default)]
pub struct AbortSignal {
    raised: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl AbortSignal {
    /// A signal not yet raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the signal and wakes its listener. Idempotent.
    pub fn raise(&self) {
        // SeqCst with the load in `poll` (invariant 2); the lock below orders the two
        // sides as well.
        self.raised.store(true, Ordering::SeqCst);
        let waker = lock(&self.waker).take();
        if let Some(waker) = waker {
            // Woken with the lock released: the waker is not ours.
            waker.wake();
        }
    }

    /// Whether the signal was raised.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// Completes once the signal is raised.
    pub fn raised(&self) -> Aborted<'_> {
        Aborted {
            signal: self,
            registered: None,
        }
    }
}

/// Future returned by [`AbortSignal::raised`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Aborted<'a> {
    signal: &'a AbortSignal,
    /// The waker this future last put in the slot: while the task polling it is the
    /// same, a poll needs no lock.
    registered: Option<Waker>,
}

impl Future for Aborted<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.is_raised() {
            return Poll::Ready(());
        }
        if self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // The slot holds this task's waker (a raise takes it and wakes us, and
            // only a raise empties the slot), so nothing can be missed.
            return Poll::Pending;
        }
        let waker = cx.waker().clone();
        *lock(&self.signal.waker) = Some(waker.clone());
        self.registered = Some(waker);
        #[cfg(taskstage_loom)]
        if super::prefix::on(super::prefix::Defect::AbortNoRecheck) {
            return Poll::Pending;
        }
        // Invariant 2: loaded after the slot was filled under the lock.
        if self.signal.is_raised() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
