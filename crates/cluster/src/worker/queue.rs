//! The work queue: which task the worker decides about next.
//!
//! Owns the order of decisions and nothing else. A task is queued at most once
//! however many changes name it (dedup); a task with an action in flight is not
//! handed out again until that action is done, so one task's actions happen one at
//! a time and in order; and at most `limit` actions are in flight across tasks, so
//! that many store round trips overlap. Every operation is O(1) on average.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

/// Tasks waiting for a decision, and the ones with an action in flight.
#[derive(Debug)]
pub(super) struct WorkQueue<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
    in_flight: HashSet<K>,
    /// Named again while in flight: queued once the action is done.
    again: HashSet<K>,
    limit: usize,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// A queue that lets at most `limit` (≥ 1) actions be in flight.
    pub(super) fn new(limit: usize) -> Self {
        WorkQueue {
            order: VecDeque::new(),
            queued: HashSet::new(),
            in_flight: HashSet::new(),
            again: HashSet::new(),
            limit: limit.max(1),
        }
    }

    /// Asks for a decision about `key` (once, however often it is asked).
    pub(super) fn add(&mut self, key: K) {
        if self.in_flight.contains(&key) {
            self.again.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.order.push_back(key);
        }
    }

    /// The next task to decide about, while fewer than `limit` actions are in
    /// flight.
    pub(super) fn pop(&mut self) -> Option<K> {
        if self.in_flight.len() >= self.limit {
            return None;
        }
        let key = self.order.pop_front()?;
        self.queued.remove(&key);
        Some(key)
    }

    /// Records that an action about `key` is in flight.
    pub(super) fn start(&mut self, key: K) {
        self.in_flight.insert(key);
    }

    /// Records that the action about `key` is done. The task is decided about
    /// again when `again` (the action changed its state) or when it was named while
    /// the action was in flight.
    pub(super) fn finish(&mut self, key: K, again: bool) {
        self.in_flight.remove(&key);
        if self.again.remove(&key) || again {
            self.add(key);
        }
    }

    /// Whether an action about `key` is in flight.
    #[cfg(test)]
    pub(super) fn is_in_flight(&self, key: &K) -> bool {
        self.in_flight.contains(key)
    }

    /// How many actions are in flight.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// How many tasks wait for a decision.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_named_many_times_is_decided_once() {
        let mut queue = WorkQueue::new(4);
        for key in ["a", "b", "a", "a", "b", "c"] {
            queue.add(key);
        }
        let order: Vec<&str> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, ["a", "b", "c"]);
        assert_eq!(queue.len(), 0);
    }

    #[test]
    fn a_task_in_flight_is_not_handed_out_until_its_action_is_done() {
        let mut queue = WorkQueue::new(4);
        queue.add("a");
        let first = queue.pop();
        assert_eq!(first, Some("a"));
        queue.start("a");
        queue.add("a");
        queue.add("a");
        assert_eq!(queue.pop(), None, "a second action of a task in flight");
        assert!(queue.is_in_flight(&"a"));
        queue.finish("a", false);
        assert_eq!(queue.pop(), Some("a"));
        assert_eq!(
            queue.pop(),
            None,
            "named twice in flight, decided once after"
        );
        // Not named meanwhile: decided again only when the action changed something.
        queue.start("a");
        queue.finish("a", false);
        assert_eq!(queue.pop(), None);
        queue.start("a");
        queue.finish("a", true);
        assert_eq!(queue.pop(), Some("a"));
    }

    #[test]
    fn at_most_the_limit_of_actions_is_in_flight() {
        let mut queue = WorkQueue::new(2);
        for key in 0..5 {
            queue.add(key);
        }
        for _ in 0..2 {
            let key = queue.pop().expect("room for an action");
            queue.start(key);
        }
        assert_eq!(queue.in_flight(), 2);
        assert_eq!(queue.pop(), None, "a third action in flight");
        queue.finish(0, true);
        // The finished task is queued again, behind the ones waiting.
        let next = queue.pop();
        assert_eq!(next, Some(2));
    }
}
