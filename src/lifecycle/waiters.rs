//! The list of async waiters parked on a lifecycle.
//!
//! It lives inside the core's mutex, so registering a waiter and changing the state
//! are serialised: a waiter either registered before a change (and is woken by it) or
//! checks its condition after the change (and sees it). That is what rules out a lost
//! wake-up (invariant 7).

use std::task::Waker;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next_id: u64,
    list: Vec<(u64, Waker)>,
}

impl Waiters {
    /// Registers (or refreshes) the waker of waiter `id`, allocating an id on first use.
    pub(crate) fn register(&mut self, id: &mut Option<u64>, waker: &Waker) {
        let key = *id.get_or_insert_with(|| {
            self.next_id += 1;
            self.next_id
        });
        match self.list.iter_mut().find(|(k, _)| *k == key) {
            Some((_, stored)) => {
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
            None => self.list.push((key, waker.clone())),
        }
    }

    /// Forgets waiter `id` (it completed or was dropped).
    pub(crate) fn remove(&mut self, id: Option<u64>) {
        if let Some(key) = id {
            self.list.retain(|(k, _)| *k != key);
        }
    }

    /// Takes every registered waker, to be woken once the lock is released.
    pub(crate) fn take(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.list)
            .into_iter()
            .map(|(_, w)| w)
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}
