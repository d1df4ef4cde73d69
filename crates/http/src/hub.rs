//! The event hub: every change the API has seen, numbered, in a bounded ring.
//!
//! # Invariants
//!
//! 1. Sequence numbers start at 1 and increase by one with every record, in the order
//!    the records were pushed: a reader that reads `n` then `n + 1` missed nothing.
//! 2. The ring keeps the newest `capacity` records; a reader whose next number is
//!    older than the oldest kept is told how many it missed (a gap), never silently
//!    moved on.
//! 3. The lock is held only to push or copy records: never across an `.await`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// How many records the hub keeps for its readers.
pub(crate) const DEFAULT_CAPACITY: usize = 4096;

/// One numbered record: a change of a task, or a gap a source itself reported.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// Its number (invariant 1).
    pub(crate) seq: u64,
    /// The task it is about.
    pub(crate) task: Arc<str>,
    /// `"change"`, or `"gap"` when the source missed changes of this task.
    pub(crate) kind: &'static str,
    /// The JSON text of its data, without the number (added when sent).
    pub(crate) data: Arc<str>,
}

/// What a reader gets from [`Hub::read`].
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// How many records the reader missed before the first one returned (invariant 2).
    pub(crate) missed: u64,
    /// The records, in order.
    pub(crate) records: Vec<Record>,
}

#[derive(Debug)]
struct Ring {
    records: VecDeque<Record>,
    last: u64,
    capacity: usize,
}

/// The hub. Cheap to share (`Arc<Hub>`).
#[derive(Debug)]
pub(crate) struct Hub {
    ring: Mutex<Ring>,
    /// The last number pushed; readers wait on its changes.
    last: watch::Sender<u64>,
}

impl Hub {
    pub(crate) fn new(capacity: usize) -> Self {
        Hub {
            ring: Mutex::new(Ring {
                records: VecDeque::with_capacity(capacity.min(DEFAULT_CAPACITY)),
                last: 0,
                capacity: capacity.max(1),
            }),
            last: watch::Sender::new(0),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A panic while the ring is locked can only come from an allocation failure
        // in push; the ring is still consistent (each field is written whole).
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pushes a record and returns its number; `data` is the record's JSON text.
    pub(crate) fn push(&self, task: Arc<str>, kind: &'static str, data: String) -> u64 {
        let seq = {
            let mut ring = self.ring();
            ring.last += 1;
            let seq = ring.last;
            if ring.records.len() == ring.capacity {
                ring.records.pop_front();
            }
            ring.records.push_back(Record {
                seq,
                task,
                kind,
                data: data.into(),
            });
            seq
        };
        // After the lock is released (invariant 3); a reader that saw the old value
        // and waits is woken by this.
        self.last.send_replace(seq);
        seq
    }

    /// The last number pushed (0 before the first).
    pub(crate) fn last(&self) -> u64 {
        self.ring().last
    }

    /// A receiver that changes whenever a record is pushed.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.last.subscribe()
    }

    /// The newest `max` records about `task` still kept, oldest first.
    pub(crate) fn recent(&self, task: &str, max: usize) -> Vec<Record> {
        let ring = self.ring();
        let mut found: Vec<Record> = ring
            .records
            .iter()
            .rev()
            .filter(|r| &*r.task == task)
            .take(max)
            .cloned()
            .collect();
        drop(ring);
        found.reverse();
        found
    }

    /// Up to `max` records from number `next` on, with the count of those missed
    /// before them when `next` is older than the oldest kept.
    pub(crate) fn read(&self, next: u64, max: usize) -> Batch {
        let ring = self.ring();
        let Some(oldest) = ring.records.front().map(|r| r.seq) else {
            return Batch::default();
        };
        let (start, missed) = if next < oldest {
            (oldest, oldest - next)
        } else {
            (next, 0)
        };
        if start > ring.last {
            return Batch {
                missed,
                records: Vec::new(),
            };
        }
        // Numbers are consecutive in the ring (invariant 1), so the index is exact.
        let from = usize::try_from(start - oldest).unwrap_or(usize::MAX);
        let records = ring.records.iter().skip(from).take(max).cloned().collect();
        Batch { missed, records }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_behind_the_ring_is_told_how_many_it_missed() {
        let hub = Hub::new(3);
        for i in 0..5 {
            hub.push("t".into(), "change", format!("{{\"i\":{i}}}"));
        }
        let batch = hub.read(1, 10);
        assert_eq!(batch.missed, 2);
        let seqs: Vec<u64> = batch.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [3, 4, 5]);
        let batch = hub.read(4, 10);
        assert_eq!(batch.missed, 0);
        assert_eq!(batch.records.len(), 2);
        assert!(hub.read(6, 10).records.is_empty());
    }
}
