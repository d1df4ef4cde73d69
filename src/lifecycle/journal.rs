//! The journal: every change of a task, in order, for the event stream.
//!
//! It lives inside the core's mutex and is written in the critical section that makes
//! each change, so its order is the core's order and no change can be missing from it.
//! Readers take entries under the same lock and register their waker there when they
//! have read everything (invariant 7: no lost wake-up). It is bounded twice: it keeps
//! only the changes some live reader has not read yet (a reader starts at the change
//! it subscribed after, so nothing older is ever read), and of those the newest
//! `capacity`; a reader that fell further behind is told how many it missed instead
//! of silently skipping them. A task nobody reads has no journal and pays nothing
//! for it: the journal goes with its last reader.

use std::collections::{BTreeMap, VecDeque};

use crate::outcome::Outcome;
use crate::stage::{Cause, Stage};

/// One change of a task, as the event stream delivers it: the transition and the state
/// it left.
#[derive(Debug, Clone)]
pub struct Change {
    /// The stage before.
    pub from: Stage,
    /// The stage after (may equal `from`, e.g. a pause in Paused sets the mark).
    pub stage: Stage,
    /// What caused it.
    pub cause: Cause,
    /// The change counter after it: consecutive changes have consecutive numbers.
    pub seq: u64,
    /// The generation after it.
    pub generation: u64,
    /// The current unit after it, or `None` once every unit completed.
    pub unit: Option<usize>,
    /// The outcome of the last run or check after it.
    pub outcome: Option<Outcome>,
    /// The user-paused mark after it.
    pub user_paused: bool,
}

/// What a reader of the journal gets next.
#[derive(Debug, Clone)]
pub enum Event {
    /// The next change.
    Change(Change),
    /// The reader fell behind the journal's bound: this many changes were dropped
    /// before it read them. The entries that follow are the oldest still kept.
    Lagged {
        /// How many changes the reader missed.
        missed: u64,
    },
}

#[derive(Debug)]
pub(crate) struct Journal {
    capacity: usize,
    entries: VecDeque<Change>,
    /// The live readers, by the last change each has read (or skipped): how many
    /// readers are at each. A reader that read the terminal stage has left.
    readers: BTreeMap<u64, usize>,
}

impl Journal {
    /// A journal with one reader, which has read up to change `seen`.
    pub(crate) fn new(capacity: usize, seen: u64) -> Self {
        let mut journal = Journal {
            capacity: capacity.max(1),
            entries: VecDeque::new(),
            readers: BTreeMap::new(),
        };
        journal.join(seen);
        journal
    }

    /// One more reader, which has read up to change `seen`.
    pub(crate) fn join(&mut self, seen: u64) {
        *self.readers.entry(seen).or_insert(0) += 1;
    }

    /// A reader at `seen` has gone; returns whether any reader is left.
    pub(crate) fn leave(&mut self, seen: u64) -> bool {
        self.forget(seen);
        self.trim();
        !self.readers.is_empty()
    }

    /// A reader moved from `from` to `to`: it is at `to` before it is taken from
    /// `from`, so the trim never sees it missing.
    fn moved(&mut self, from: u64, to: u64) {
        if from != to {
            self.join(to);
            self.forget(from);
            self.trim();
        }
    }

    fn forget(&mut self, seen: u64) {
        if let Some(count) = self.readers.get_mut(&seen) {
            *count -= 1;
            if *count == 0 {
                self.readers.remove(&seen);
            }
        }
    }

    /// Drops the changes every live reader has read.
    fn trim(&mut self) {
        let Some(&slowest) = self.readers.keys().next() else {
            self.entries.clear();
            return;
        };
        while self.entries.front().is_some_and(|c| c.seq <= slowest) {
            self.entries.pop_front();
        }
    }

    /// How many changes it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps at least `capacity` entries from now on.
    pub(crate) fn reserve(&mut self, capacity: usize) {
        self.capacity = self.capacity.max(capacity);
    }

    pub(crate) fn push(&mut self, change: Change) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(change);
    }

    /// The entry after change `*seen` for a reader that has read up to it, which it
    /// then has read up to (`*seen` moves); `None` when the reader has read
    /// everything.
    pub(crate) fn read_after(&mut self, seen: &mut u64) -> Option<Event> {
        let (event, next) = self.read(*seen + 1)?;
        self.moved(*seen, next - 1);
        *seen = next - 1;
        Some(event)
    }

    /// The entry for a reader whose next change is `next`, and the `next` after it;
    /// `None` when the reader has read everything.
    fn read(&self, next: u64) -> Option<(Event, u64)> {
        let oldest = self.entries.front()?.seq;
        if next < oldest {
            return Some((
                Event::Lagged {
                    missed: oldest - next,
                },
                oldest,
            ));
        }
        let offset = usize::try_from(next - oldest).ok()?;
        let change = self.entries.get(offset)?;
        Some((Event::Change(change.clone()), next + 1))
    }
}
