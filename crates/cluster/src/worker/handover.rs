//! Fair shares: how many tasks this worker should hold, and which ones it hands
//! over when it holds more.
//!
//! Every worker computes the same shares from the same two facts, the live members
//! (the `workers/` keys, one per incarnation) and the tasks that want an owner:
//! with `n` tasks and `w` members sorted by key, member `i` gets `n / w` tasks, and
//! one more when `i < n % w`. The shares add up to `n`, so when every task is held
//! the largest and smallest holdings differ by at most one.
//!
//! A worker below its share claims; a worker above it hands the excess over: it
//! pauses the task (the run really returns), publishes that, and releases the owner
//! key (`decide` with `hand_over`), and a worker below its share claims the task and
//! resumes it from its checkpoint. At most [`MAX_HANDING_OVER`] tasks of one worker
//! are being handed over at a time: that bounds the rate, and a member that leaves
//! meanwhile costs no more than that many pauses.

use std::collections::BTreeSet;

/// How many tasks one worker hands over at a time.
pub(super) const MAX_HANDING_OVER: usize = 16;

/// This worker's share of `tasks` among `members` (sorted, deduplicated member
/// keys), where `me` is this worker's own member key. A worker counts itself a
/// member whether or not its key is seen (not yet, or its lease is gone): its own
/// membership is the session's business, not the share's.
pub(super) fn share(tasks: usize, members: &BTreeSet<String>, me: &str) -> usize {
    let count = members.len() + usize::from(!members.contains(me));
    let index = members.iter().filter(|m| m.as_str() < me).count();
    let base = tasks / count;
    base + usize::from(index < tasks % count)
}

/// Which held tasks to start handing over: enough that, with the ones already
/// being handed over, the worker ends at its share, at most [`MAX_HANDING_OVER`]
/// at a time. `candidates` are the held tasks that may be handed over (running
/// normally, not failed), in the order to pick them.
pub(super) fn pick<K: Clone + Ord>(
    held: usize,
    share: usize,
    handing_over: &BTreeSet<K>,
    candidates: impl IntoIterator<Item = K>,
) -> Vec<K> {
    let excess = held.saturating_sub(share);
    let room = MAX_HANDING_OVER.saturating_sub(handing_over.len());
    let wanted = excess.saturating_sub(handing_over.len()).min(room);
    candidates
        .into_iter()
        .filter(|k| !handing_over.contains(k))
        .take(wanted)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn shares_add_up_to_every_task_and_differ_by_at_most_one() {
        for workers in 1..=7usize {
            let names: Vec<String> = (0..workers).map(|i| format!("w{i}@1")).collect();
            let set: BTreeSet<String> = names.iter().cloned().collect();
            for tasks in [0usize, 1, 5, 30, 100, 10_000] {
                let shares: Vec<usize> = names.iter().map(|m| share(tasks, &set, m)).collect();
                assert_eq!(
                    shares.iter().sum::<usize>(),
                    tasks,
                    "{workers} workers, {tasks} tasks"
                );
                let (max, min) = (shares.iter().max(), shares.iter().min());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{shares:?}");
            }
        }
    }

    #[test]
    fn thirty_tasks_over_four_workers_is_eight_eight_seven_seven() {
        let set = members(&["a@1", "b@1", "c@1", "d@1"]);
        let shares: Vec<usize> = ["a@1", "b@1", "c@1", "d@1"]
            .iter()
            .map(|m| share(30, &set, m))
            .collect();
        assert_eq!(shares, [8, 8, 7, 7]);
        // Not (yet, or no longer) among the members: counted where its key sorts.
        assert_eq!(share(30, &members(&["a@1", "b@1", "c@1"]), "d@1"), 7);
        assert_eq!(share(30, &members(&["b@1", "c@1", "d@1"]), "a@1"), 8);
        assert_eq!(share(1, &members(&["w2@2"]), "w1@1"), 1);
    }

    #[test]
    fn the_excess_is_picked_at_most_sixteen_at_a_time() {
        let none = BTreeSet::new();
        assert_eq!(pick(10, 8, &none, 0..10), vec![0, 1]);
        assert_eq!(pick(8, 8, &none, 0..10), Vec::<i32>::new());
        let picked = pick(100, 10, &none, 0..100);
        assert_eq!(picked.len(), MAX_HANDING_OVER);
        // Those already under way count, and are not picked again.
        let under_way: BTreeSet<i32> = [0, 1].into_iter().collect();
        assert_eq!(pick(11, 8, &under_way, 0..10), vec![2]);
    }
}
