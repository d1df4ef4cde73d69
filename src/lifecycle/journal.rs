//! The journal: every change of a task, in order, for the event stream.
//!
//! It lives inside the core's mutex and is written in the critical section that makes
//! each change, so its order is the core's order and no change can be missing from it.
//! Readers take entries under the same lock and register their waker there when they
//! have read everything (invariant 7: no lost wake-up). It is bounded: it keeps the
//! newest `capacity` changes, and a reader that fell further behind is told how many
//! it missed instead of silently skipping them. A task nobody subscribed to has no
//! journal and pays nothing for it.

use std::collections::VecDeque;

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
}

impl Journal {
    pub(crate) fn new(capacity: usize) -> Self {
        Journal {
            capacity: capacity.max(1),
            entries: VecDeque::new(),
        }
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

    /// The entry for a reader whose next change is `next`, and the `next` after it;
    /// `None` when the reader has read everything.
    pub(crate) fn read(&self, next: u64) -> Option<(Event, u64)> {
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
