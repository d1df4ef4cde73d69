//! The worker's view of the store: one list, then a watch, into a local cache.
//!
//! Owns what the worker knows of the store. For each prefix it follows (the tasks
//! and the members), a reflector task reads every key once (a paged list at one
//! revision), then watches from that revision + 1 and forwards each change. When
//! the watch is lost or the store compacted the history it needs, it lists again and
//! the cache diffs the new listing against what it holds, so a lost event delays
//! what the worker learns and never hides it. The worker's own writes are applied
//! to the cache as soon as the store accepts them (read-your-writes), so a decision
//! taken before the watch delivers them does not repeat them.
//!
//! Cost: the list is O(keys) once per join and per lost watch; each change costs
//! O(1) store work and O(log tasks) here; nothing is read per decision. Unit
//! checkpoints live outside both prefixes and wake nobody.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::coord::{next_message, Coordinator, KeyValue, WatchEvent, WatchMessage};
use crate::fence::within;
use crate::keys::{is_draining, Keys, TaskId, TaskKey};

/// The two prefixes a worker follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prefix {
    /// `tasks/`: specs, desired stages, owners, observed reports.
    Tasks,
    /// `workers/`: one key per live member incarnation.
    Workers,
}

/// What a reflector tells the worker.
#[derive(Debug)]
pub(super) enum Feed {
    /// Every key under the prefix, read at `revision` (at join, and after a lost
    /// watch).
    Listed {
        prefix: Prefix,
        revision: i64,
        kvs: Vec<KeyValue>,
    },
    /// Changes the watch delivered; every change up to `revision` has been.
    Changed {
        prefix: Prefix,
        revision: i64,
        events: Vec<WatchEvent>,
    },
}

/// How many call deadlines a listing may take at most, after failures.
const LIST_DEADLINE_GROWTH: u32 = 32;

/// Follows `prefix`: list, watch from the list, list again when the watch is lost.
///
/// Bounded by the worker: it returns when `shutdown` is cancelled or the worker no
/// longer listens. A failed list or watch is tried again after `retry`; a failed
/// list with twice the deadline.
pub(super) async fn reflect(
    coord: Arc<dyn Coordinator>,
    which: Prefix,
    prefix: String,
    op_timeout: Duration,
    retry: Duration,
    feed: mpsc::Sender<Feed>,
    shutdown: CancellationToken,
) {
    let pause = || async {
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(retry) => true,
        }
    };
    // A listing is many keys, in pages: on a busy machine (or a store far away) the
    // whole of it may not fit one call's deadline, and a listing that never fits
    // leaves the cache blind for good. Each failure doubles the deadline of the
    // next try, up to LIST_DEADLINE_GROWTH call deadlines; a success resets it.
    let mut list_deadline = op_timeout;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let listing = match within(list_deadline, "list", coord.list(prefix.clone())).await {
            Ok(listing) => {
                list_deadline = op_timeout;
                listing
            }
            Err(error) => {
                tracing::debug!(%prefix, %error, ?list_deadline, "list failed; trying again");
                list_deadline = (list_deadline * 2).min(op_timeout * LIST_DEADLINE_GROWTH);
                if !pause().await {
                    return;
                }
                continue;
            }
        };
        let revision = listing.revision;
        let listed = Feed::Listed {
            prefix: which,
            revision,
            kvs: listing.kvs,
        };
        if feed.send(listed).await.is_err() {
            return;
        }
        let mut stream = match within(
            op_timeout,
            "watch",
            coord.watch(prefix.clone(), revision + 1),
        )
        .await
        {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%prefix, %error, "watch failed; listing again");
                if !pause().await {
                    return;
                }
                continue;
            }
        };
        // Bounded by the watch: it ends when the stream is lost or the worker ends.
        loop {
            let message = tokio::select! {
                _ = shutdown.cancelled() => return,
                message = next_message(&mut stream) => message,
            };
            match message {
                Some(Ok(WatchMessage::Events { revision, events })) => {
                    let changed = Feed::Changed {
                        prefix: which,
                        revision,
                        events,
                    };
                    if feed.send(changed).await.is_err() {
                        return;
                    }
                }
                Some(Ok(WatchMessage::Compacted { revision })) => {
                    tracing::info!(%prefix, revision, "watch history compacted; listing again");
                    break;
                }
                Some(Err(error)) => {
                    tracing::debug!(%prefix, %error, "watch lost; listing again");
                    break;
                }
                None => {
                    tracing::debug!(%prefix, "watch ended; listing again");
                    break;
                }
            }
        }
    }
}

/// One key as the cache knows it: its value (`None`: absent) and the revision of
/// the change that made it so. A change older than the one held is ignored, so
/// duplicated and late deliveries change nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) kv: Option<KeyValue>,
    pub(super) rev: i64,
}

impl Entry {
    /// Applies a change at `rev`; whether it changed the entry.
    fn apply(&mut self, kv: Option<KeyValue>, rev: i64) -> bool {
        if rev <= self.rev {
            return false;
        }
        let changed = self.kv != kv;
        self.kv = kv;
        self.rev = rev;
        changed
    }
}

/// The keys of one task, as cached.
#[derive(Debug, Clone, Default)]
pub(super) struct Record {
    pub(super) spec: Entry,
    pub(super) desired: Entry,
    pub(super) owner: Entry,
    pub(super) observed: Entry,
}

impl Record {
    fn entry(&mut self, kind: TaskKey) -> &mut Entry {
        match kind {
            TaskKey::Spec => &mut self.spec,
            TaskKey::Desired => &mut self.desired,
            TaskKey::Owner => &mut self.owner,
            TaskKey::Observed => &mut self.observed,
        }
    }

    fn entries(&self) -> [&Entry; 4] {
        [&self.spec, &self.desired, &self.owner, &self.observed]
    }

    /// Whether every key is absent, and has been since `revision` or earlier.
    fn is_gone_by(&self, revision: i64) -> bool {
        self.entries()
            .iter()
            .all(|e| e.kv.is_none() && e.rev <= revision)
    }
}

/// What a feed changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// The tasks whose record changed, in the order met.
    pub(super) tasks: Vec<TaskId>,
    /// Whether the membership changed.
    pub(super) members: bool,
    /// A listing showed a key whose last write is older than the one the cache
    /// holds, though the listing is newer: the store's history was replaced (a
    /// restore with a revision bump). The revision held and the one listed.
    pub(super) replaced: Option<(i64, i64)>,
}

/// The cache: every task's record and the live members.
#[derive(Debug)]
pub(super) struct View {
    keys: Keys,
    tasks: BTreeMap<TaskId, Record>,
    members: BTreeMap<String, Entry>,
    /// Every change of `tasks/` up to this revision has been applied.
    tasks_seen: i64,
    /// Whether each prefix has been listed once.
    listed: (bool, bool),
}

impl View {
    pub(super) fn new(keys: Keys) -> Self {
        View {
            keys,
            tasks: BTreeMap::new(),
            members: BTreeMap::new(),
            tasks_seen: 0,
            listed: (false, false),
        }
    }

    /// Whether both prefixes have been listed: the worker knows the tasks and the
    /// membership.
    pub(super) fn is_known(&self) -> bool {
        self.listed.0 && self.listed.1
    }

    /// The record of `task`, if the cache holds one.
    pub(super) fn record(&self, task: &TaskId) -> Option<&Record> {
        self.tasks.get(task)
    }

    /// Every task the cache holds a record of.
    pub(super) fn tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.tasks.keys()
    }

    /// The live members' keys (one per incarnation) that count in the fair shares,
    /// sorted: a draining member counts in none.
    pub(super) fn members(&self) -> BTreeSet<String> {
        self.members
            .iter()
            .filter(|(_, e)| e.kv.as_ref().is_some_and(|kv| !is_draining(&kv.value)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether the member key `member` is live and marked draining.
    pub(super) fn is_draining(&self, member: &str) -> bool {
        self.members
            .get(member)
            .and_then(|e| e.kv.as_ref())
            .is_some_and(|kv| is_draining(&kv.value))
    }

    /// Applies what a reflector sent.
    pub(super) fn feed(&mut self, feed: Feed) -> Changes {
        let mut changes = Changes::default();
        match feed {
            Feed::Listed {
                prefix,
                revision,
                kvs,
            } => {
                let listed: BTreeSet<String> = kvs.iter().map(|kv| kv.key.clone()).collect();
                for kv in kvs {
                    let rev = kv.mod_revision;
                    // A key's last write only moves forward in one history: one
                    // older than the write the cache holds, in a listing that is
                    // not older than that write, comes from another history.
                    let held = self.held_revision(prefix, &kv.key);
                    if rev < held && held <= revision && changes.replaced.is_none() {
                        changes.replaced = Some((held, rev));
                    }
                    self.apply(prefix, kv.key.clone(), Some(kv), rev, &mut changes);
                }
                // Whatever the cache holds that the listing does not was deleted
                // before the listing's revision (unless the cache knows better).
                let gone: Vec<String> = match prefix {
                    Prefix::Tasks => self
                        .tasks
                        .iter()
                        .flat_map(|(task, record)| {
                            let keys = &self.keys;
                            [
                                (keys.spec(task), &record.spec),
                                (keys.desired(task), &record.desired),
                                (keys.owner(task), &record.owner),
                                (keys.observed(task), &record.observed),
                            ]
                            .into_iter()
                            .filter(|(_, e)| e.kv.is_some())
                            .map(|(key, _)| key)
                            .collect::<Vec<_>>()
                        })
                        .filter(|key| !listed.contains(key))
                        .collect(),
                    Prefix::Workers => self
                        .members
                        .iter()
                        .filter(|(key, e)| e.kv.is_some() && !listed.contains(*key))
                        .map(|(key, _)| key.clone())
                        .collect(),
                };
                for key in gone {
                    self.apply(prefix, key, None, revision, &mut changes);
                }
                match prefix {
                    Prefix::Tasks => {
                        self.listed.0 = true;
                        self.tasks_seen = self.tasks_seen.max(revision);
                    }
                    Prefix::Workers => {
                        self.listed.1 = true;
                        changes.members = true;
                    }
                }
            }
            Feed::Changed {
                prefix,
                revision,
                events,
            } => {
                for event in events {
                    let rev = event.revision();
                    match event {
                        WatchEvent::Put(kv) => {
                            self.apply(prefix, kv.key.clone(), Some(kv), rev, &mut changes)
                        }
                        WatchEvent::Delete { key, .. } => {
                            self.apply(prefix, key, None, rev, &mut changes)
                        }
                    }
                }
                if prefix == Prefix::Tasks {
                    self.tasks_seen = self.tasks_seen.max(revision);
                }
            }
        }
        changes
    }

    /// The revision of the change the cache holds for `key` (0: none).
    fn held_revision(&self, prefix: Prefix, key: &str) -> i64 {
        match prefix {
            Prefix::Tasks => self
                .keys
                .parse_task_key(key)
                .and_then(|(task, kind)| {
                    let record = self.tasks.get(&task)?;
                    Some(match kind {
                        TaskKey::Spec => record.spec.rev,
                        TaskKey::Desired => record.desired.rev,
                        TaskKey::Owner => record.owner.rev,
                        TaskKey::Observed => record.observed.rev,
                    })
                })
                .unwrap_or(0),
            Prefix::Workers => self.members.get(key).map_or(0, |e| e.rev),
        }
    }

    /// Applies one of the worker's own writes, accepted by the store at `rev`;
    /// returns the task it concerns.
    pub(super) fn own_write(&mut self, key: String, kv: Option<KeyValue>, rev: i64) -> Changes {
        let mut changes = Changes::default();
        self.apply(Prefix::Tasks, key, kv, rev, &mut changes);
        changes
    }

    fn apply(
        &mut self,
        prefix: Prefix,
        key: String,
        kv: Option<KeyValue>,
        rev: i64,
        changes: &mut Changes,
    ) {
        match prefix {
            Prefix::Tasks => {
                let Some((task, kind)) = self.keys.parse_task_key(&key) else {
                    return;
                };
                let record = self.tasks.entry(task.clone()).or_default();
                if record.entry(kind).apply(kv, rev) {
                    changes.tasks.push(task);
                }
            }
            Prefix::Workers => {
                if self.members.entry(key).or_default().apply(kv, rev) {
                    changes.members = true;
                }
            }
        }
    }

    /// Forgets the record of `task` if every key of it is gone and the watch has
    /// passed the deletions (no late change can bring it back).
    pub(super) fn forget_if_gone(&mut self, task: &TaskId) {
        let seen = self.tasks_seen;
        if self.tasks.get(task).is_some_and(|r| r.is_gone_by(seen)) {
            self.tasks.remove(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, create: i64, rev: i64) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: rev,
            lease: 0,
        }
    }

    fn view() -> View {
        View::new(Keys::new("p").expect("a prefix"))
    }

    fn task(name: &str) -> TaskId {
        TaskId::new(name).expect("an id")
    }

    #[test]
    fn a_duplicated_or_late_event_changes_nothing() {
        let mut view = view();
        let put = |rev| Feed::Changed {
            prefix: Prefix::Tasks,
            revision: rev,
            events: vec![WatchEvent::Put(kv("p/tasks/a/desired", "Paused", 2, rev))],
        };
        assert_eq!(view.feed(put(5)).tasks, vec![task("a")]);
        assert_eq!(view.feed(put(5)).tasks, Vec::<TaskId>::new(), "a duplicate");
        assert_eq!(
            view.feed(put(4)).tasks,
            Vec::<TaskId>::new(),
            "a late event"
        );
        let record = view.record(&task("a")).expect("a record");
        assert_eq!(record.desired.rev, 5);
    }

    #[test]
    fn a_listing_after_a_lost_watch_removes_what_was_deleted_meanwhile() {
        let mut view = view();
        view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 10,
            kvs: vec![
                kv("p/tasks/a/desired", "Running", 3, 3),
                kv("p/tasks/a/owner", "w1@1", 7, 7),
                kv("p/tasks/b/desired", "Running", 4, 4),
            ],
        });
        // The watch is lost; meanwhile a's owner key went and b's desired changed.
        let changes = view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 20,
            kvs: vec![
                kv("p/tasks/a/desired", "Running", 3, 3),
                kv("p/tasks/b/desired", "Paused", 4, 15),
            ],
        });
        assert_eq!(changes.tasks, vec![task("b"), task("a")]);
        let a = view.record(&task("a")).expect("a");
        assert_eq!((a.owner.kv.clone(), a.owner.rev), (None, 20));
        assert!(!view.is_known(), "the members are not listed yet");
    }

    #[test]
    fn the_workers_own_write_is_not_undone_by_an_older_listing() {
        let mut view = view();
        view.own_write(
            "p/tasks/a/owner".into(),
            Some(kv("p/tasks/a/owner", "w1@1", 30, 30)),
            30,
        );
        view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 25,
            kvs: vec![kv("p/tasks/a/desired", "Running", 3, 3)],
        });
        let a = view.record(&task("a")).expect("a");
        assert!(
            a.owner.kv.is_some(),
            "a listing older than the write removed it"
        );
    }

    #[test]
    fn a_newer_listing_with_an_older_write_of_a_key_is_a_replaced_history() {
        let mut view = view();
        view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 10,
            kvs: vec![kv("p/tasks/a/desired", "Running", 3, 3)],
        });
        view.feed(Feed::Changed {
            prefix: Prefix::Tasks,
            revision: 12,
            events: vec![WatchEvent::Put(kv("p/tasks/a/desired", "Paused", 3, 12))],
        });
        // An older listing (sent before the change) is not a replaced history.
        let older = view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 11,
            kvs: vec![kv("p/tasks/a/desired", "Running", 3, 3)],
        });
        assert_eq!(older.replaced, None);
        // A newer one holding the write before the change is.
        let restored = view.feed(Feed::Listed {
            prefix: Prefix::Tasks,
            revision: 1_012,
            kvs: vec![kv("p/tasks/a/desired", "Running", 3, 3)],
        });
        assert_eq!(restored.replaced, Some((12, 3)));
    }

    #[test]
    fn members_come_and_go_and_a_gone_task_is_forgotten_once_passed() {
        let mut view = view();
        let changes = view.feed(Feed::Listed {
            prefix: Prefix::Workers,
            revision: 5,
            kvs: vec![
                kv("p/workers/w1@1", "1", 2, 2),
                kv("p/workers/w2@2", "2", 3, 3),
            ],
        });
        assert!(changes.members);
        assert_eq!(view.members().len(), 2);
        view.feed(Feed::Changed {
            prefix: Prefix::Workers,
            revision: 6,
            events: vec![WatchEvent::Delete {
                key: "p/workers/w1@1".into(),
                revision: 6,
            }],
        });
        assert_eq!(
            view.members().into_iter().collect::<Vec<_>>(),
            ["p/workers/w2@2"]
        );
        // A drained member stays live and counts in no share.
        let changes = view.feed(Feed::Changed {
            prefix: Prefix::Workers,
            revision: 7,
            events: vec![WatchEvent::Put(kv("p/workers/w2@2", "draining", 3, 7))],
        });
        assert!(changes.members);
        assert!(view.members().is_empty());
        assert!(view.is_draining("p/workers/w2@2"));
        assert!(!view.is_draining("p/workers/w1@1"), "gone, not draining");

        view.feed(Feed::Changed {
            prefix: Prefix::Tasks,
            revision: 8,
            events: vec![
                WatchEvent::Put(kv("p/tasks/a/desired", "Running", 7, 7)),
                WatchEvent::Delete {
                    key: "p/tasks/a/desired".into(),
                    revision: 8,
                },
            ],
        });
        view.forget_if_gone(&task("a"));
        assert!(view.record(&task("a")).is_none());
    }
}
