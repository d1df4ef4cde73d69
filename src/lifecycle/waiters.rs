//! The list of async waiters parked on a lifecycle.
//!
//! It lives inside the core's mutex, so registering a waiter and changing the state
//! are serialised: a waiter either registered before a change (and is woken by it) or
//! checks its condition after the change (and sees it). That is what rules out a lost
//! wake-up (invariant 7).
//!
//! Most tasks have at most one waiter at a time (a command waiting to settle, or one
//! `wait_for`), and every change takes all of them: the first waiter is kept inline,
//! so that parking and waking it allocates nothing.

use std::task::Waker;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next_id: u64,
    /// The first waiter, kept out of the vector.
    first: Option<(u64, Waker)>,
    /// Every other waiter.
    rest: Vec<(u64, Waker)>,
}

/// The wakers of every waiter, taken under the lock to be woken after it is released.
#[derive(Debug)]
#[must_use = "the waiters are woken only by `wake`"]
pub(crate) struct Woken {
    first: Option<Waker>,
    rest: Vec<(u64, Waker)>,
}

impl Woken {
    /// Wakes every waiter (call with no lock held).
    pub(crate) fn wake(self) {
        if let Some(waker) = self.first {
            waker.wake();
        }
        for (_, waker) in self.rest {
            waker.wake();
        }
    }
}

impl Waiters {
    /// Registers (or refreshes) the waker of waiter `id`, allocating an id on first use.
    pub(crate) fn register(&mut self, id: &mut Option<u64>, waker: &Waker) {
        let key = *id.get_or_insert_with(|| {
            self.next_id += 1;
            self.next_id
        });
        let first_free = self.first.is_none();
        let stored = match &mut self.first {
            Some((k, stored)) if *k == key => Some(stored),
            _ => self
                .rest
                .iter_mut()
                .find(|(k, _)| *k == key)
                .map(|(_, w)| w),
        };
        match stored {
            Some(stored) => {
                #[cfg(taskstage_loom)]
                if super::prefix::on(super::prefix::Defect::StaleWaker) {
                    return;
                }
                // A future polled again may have moved to another task: the newest
                // waker is the one to wake.
                if !stored.will_wake(waker) {
                    stored.clone_from(waker);
                }
            }
            None if first_free => self.first = Some((key, waker.clone())),
            None => self.rest.push((key, waker.clone())),
        }
    }

    /// Forgets waiter `id` (it completed or was dropped).
    pub(crate) fn remove(&mut self, id: Option<u64>) {
        let Some(key) = id else { return };
        if matches!(&self.first, Some((k, _)) if *k == key) {
            self.first = None;
        } else if !self.rest.is_empty() {
            self.rest.retain(|(k, _)| *k != key);
        }
    }

    /// Takes every registered waker, to be woken once the lock is released.
    pub(crate) fn take(&mut self) -> Woken {
        Woken {
            first: self.first.take().map(|(_, w)| w),
            rest: std::mem::take(&mut self.rest),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}
