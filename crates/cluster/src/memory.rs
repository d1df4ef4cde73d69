//! An in-memory [`Coordinator`] with etcd's semantics and injectable faults.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::coord::{
    watch_channel, BoxFuture, Compare, Coordinator, Grant, KeepAlive, KeyValue, Listing, Op, Txn,
    TxnResult, WatchEvent, WatchMessage, WatchStream,
};
use super::error::ClusterError;

/// An in-memory store with etcd's revisions, transactions and leases.
///
/// Leases expire on tokio's clock (so tests under a paused clock control time), at
/// `last keep-alive received + TTL`, like etcd's. Every call yields to the runtime
/// once before it takes effect, as a round trip would, so that other tasks can act
/// between a read and the write decided from it; the effect and the answer then
/// come together. It serves the property tests of the
/// worker, and users' own tests; faults can be injected: an unreachable store, a
/// store that answers nothing (every call hangs), keep-alives that fail, a lease that
/// expires early; and, for watches, a compaction, a cut watch (the watcher must
/// read again), delayed and duplicated deliveries.
///
/// # Examples
///
/// ```
/// use taskstage_cluster::{Controller, DesiredStage, MemoryCoordinator};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryCoordinator::new();
/// let controller = Controller::new(store.clone(), "app")?;
/// controller.create("orders", b"{}".to_vec(), DesiredStage::Paused).await?;
/// assert_eq!(controller.status("orders").await?.desired, DesiredStage::Paused);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryCoordinator {
    inner: std::sync::Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    revision: watch::Sender<i64>,
    /// While true, every call waits (a store that answers nothing).
    hanging: watch::Sender<bool>,
    /// Moved to end every open watch (a lost watch).
    cuts: watch::Sender<u64>,
}

/// How many changes the store keeps for watches; older ones are compacted away.
const HISTORY: usize = 100_000;

#[derive(Debug, Default)]
struct State {
    revision: i64,
    kvs: BTreeMap<String, KeyValue>,
    leases: HashMap<i64, LeaseEntry>,
    next_lease: i64,
    unreachable: bool,
    failing_keep_alives: HashSet<i64>,
    /// The changes a watch can still replay, oldest first.
    history: VecDeque<WatchEvent>,
    /// Every change up to this revision is gone from `history`.
    compacted: i64,
    /// How long each watch delivery waits.
    watch_delay: Duration,
    /// Whether each watch delivery is sent twice.
    duplicate_events: bool,
}

/// A backup of a [`MemoryCoordinator`], made by [`MemoryCoordinator::snapshot`].
#[derive(Debug, Clone)]
pub struct MemorySnapshot {
    revision: i64,
    kvs: BTreeMap<String, KeyValue>,
    leases: Vec<(i64, Duration)>,
    history: VecDeque<WatchEvent>,
    compacted: i64,
}

impl MemorySnapshot {
    /// The store's revision when the snapshot was taken.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

#[derive(Debug)]
struct LeaseEntry {
    ttl: Duration,
    expires: Instant,
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryCoordinator {
    /// An empty store at revision 1.
    pub fn new() -> Self {
        let state = State {
            revision: 1,
            next_lease: 0x100,
            ..State::default()
        };
        MemoryCoordinator {
            inner: std::sync::Arc::new(Shared {
                state: Mutex::new(state),
                revision: watch::channel(1).0,
                hanging: watch::channel(false).0,
                cuts: watch::channel(0).0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every method (no method panics midway), so
        // a poisoned lock still holds a usable state.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every operation fail with [`ClusterError::Unreachable`] (or work again);
    /// an unreachable store also ends every open watch.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
        if unreachable {
            self.cut_watches();
        }
    }

    /// Ends every open watch with an error, as a lost connection does: each
    /// watcher must read again and watch from there.
    pub fn cut_watches(&self) {
        self.inner.cuts.send_modify(|n| *n += 1);
    }

    /// Compacts the history every watch could replay, up to the current revision:
    /// a watch that needs an older change ends with [`WatchMessage::Compacted`].
    pub fn compact(&self) {
        let mut state = self.lock();
        state.compacted = state.revision;
        state.history.clear();
    }

    /// Takes a backup of the store, as `etcdctl snapshot save` does: every key,
    /// every lease, the revision and the history watches can replay.
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut state = self.lock();
        state.expire_due(Instant::now());
        MemorySnapshot {
            revision: state.revision,
            kvs: state.kvs.clone(),
            leases: state.leases.iter().map(|(id, l)| (*id, l.ttl)).collect(),
            history: state.history.clone(),
            compacted: state.compacted,
        }
    }

    /// Replaces the store's history with `snapshot`'s, as restoring every member
    /// from a backup does. With `bump` 0 the revision goes back to the snapshot's
    /// (etcd 3.4's `snapshot restore`); with `bump` > 0 it moves `bump` past it and
    /// the history is marked compacted (etcd 3.5's `--bump-revision` with
    /// `--mark-compacted`). Leases come back with their whole TTL, as a restored
    /// member's do; every open watch ends, as the members' restart ends them.
    pub fn restore(&self, snapshot: &MemorySnapshot, bump: i64) {
        let revision = {
            let mut state = self.lock();
            let now = Instant::now();
            state.revision = snapshot.revision + bump.max(0);
            state.kvs = snapshot.kvs.clone();
            state.leases = snapshot
                .leases
                .iter()
                .map(|(id, ttl)| {
                    let entry = LeaseEntry {
                        ttl: *ttl,
                        expires: now + *ttl,
                    };
                    (*id, entry)
                })
                .collect();
            if bump > 0 {
                state.history.clear();
                state.compacted = state.revision;
            } else {
                state.history = snapshot.history.clone();
                state.compacted = snapshot.compacted;
            }
            state.revision
        };
        self.inner.revision.send_replace(revision);
        self.cut_watches();
    }

    /// Delays every watch delivery by `delay` (zero: none).
    pub fn set_watch_delay(&self, delay: Duration) {
        self.lock().watch_delay = delay;
    }

    /// Sends every watch delivery twice (or once again).
    pub fn set_duplicate_watch_events(&self, duplicate: bool) {
        self.lock().duplicate_events = duplicate;
    }

    /// Makes every call wait, without an answer, until this is called with `false`
    /// (a store that hangs, as a partition does): only the callers' own deadlines
    /// end their calls. Leases still expire on the store's clock.
    pub fn set_hanging(&self, hanging: bool) {
        self.inner.hanging.send_replace(hanging);
    }

    /// Where every call arrives: one yield (a round trip lets others act), then a
    /// wait while the store hangs.
    async fn arrive(&self) {
        tokio::task::yield_now().await;
        let mut hanging = self.inner.hanging.subscribe();
        // Ends when the store stops hanging; the sender lives as long as `self`.
        let _ = hanging.wait_for(|h| !*h).await;
    }

    /// Makes keep-alives of `lease` fail with [`ClusterError::Unreachable`] (or work
    /// again); the lease then expires on the store's clock as etcd's would.
    pub fn fail_keep_alives(&self, lease: i64, fail: bool) {
        let mut state = self.lock();
        if fail {
            state.failing_keep_alives.insert(lease);
        } else {
            state.failing_keep_alives.remove(&lease);
        }
    }

    /// Expires a lease now, as the store does at its TTL (or as a revoke does).
    pub fn expire_lease(&self, lease: i64) {
        let revision = {
            let mut state = self.lock();
            state.drop_lease(lease);
            state.revision
        };
        self.inner.revision.send_replace(revision);
    }

    /// The leases alive now.
    pub fn leases(&self) -> Vec<i64> {
        let mut state = self.lock();
        state.expire_due(Instant::now());
        let mut leases: Vec<i64> = state.leases.keys().copied().collect();
        leases.sort_unstable();
        leases
    }

    /// Every key and value, for tests.
    pub fn dump(&self) -> Vec<KeyValue> {
        let mut state = self.lock();
        state.expire_due(Instant::now());
        state.kvs.values().cloned().collect()
    }

    /// Runs `f` on the state after expiring due leases, failing when unreachable;
    /// tells watchers when the revision moved.
    fn with<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut State) -> Result<T, ClusterError>,
    ) -> Result<T, ClusterError> {
        let (result, before, after) = {
            let mut state = self.lock();
            let before = state.revision;
            state.expire_due(Instant::now());
            if state.unreachable {
                return Err(ClusterError::Unreachable {
                    op,
                    detail: "the in-memory store is set unreachable".into(),
                });
            }
            let result = f(&mut state);
            (result, before, state.revision)
        };
        if after != before {
            self.inner.revision.send_replace(after);
        }
        result
    }
}

impl State {
    fn expire_due(&mut self, now: Instant) {
        let due: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.drop_lease(id);
        }
    }

    fn drop_lease(&mut self, id: i64) {
        if self.leases.remove(&id).is_none() {
            return;
        }
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        if !keys.is_empty() {
            self.revision += 1;
            let revision = self.revision;
            for key in keys {
                self.kvs.remove(&key);
                self.record(WatchEvent::Delete { key, revision });
            }
        }
    }

    /// Keeps a change for watches, compacting the oldest beyond [`HISTORY`].
    fn record(&mut self, event: WatchEvent) {
        self.history.push_back(event);
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted = self.compacted.max(old.revision());
            }
        }
        // A revision is never half compacted.
        while self
            .history
            .front()
            .is_some_and(|e| e.revision() <= self.compacted)
        {
            self.history.pop_front();
        }
    }

    /// The changes under `prefix` from revision `from` on, or the compaction
    /// revision when some of them are gone.
    fn changes_since(&self, prefix: &str, from: i64) -> Result<Vec<WatchEvent>, i64> {
        if from <= self.compacted {
            return Err(self.compacted);
        }
        let start = self.history.partition_point(|e| e.revision() < from);
        Ok(self
            .history
            .range(start..)
            .filter(|e| e.key().starts_with(prefix))
            .cloned()
            .collect())
    }

    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::Absent(key) => !self.kvs.contains_key(key),
            Compare::CreateRevision(key, rev) => {
                self.kvs.get(key).map(|kv| kv.create_revision) == Some(*rev)
            }
            Compare::ModRevision(key, rev) => {
                self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *rev
            }
            Compare::Value(key, value) => self.kvs.get(key).map(|kv| &kv.value) == Some(value),
        }
    }
}

impl Coordinator for MemoryCoordinator {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move {
            // Like a round trip: other tasks run between the call and its effect.
            self.arrive().await;
            self.with("grant", |state| {
                let id = state.next_lease;
                state.next_lease += 1;
                // etcd rounds to whole seconds, and never grants less than it was asked.
                let ttl =
                    Duration::from_secs(ttl.as_secs().max(1) + u64::from(ttl.subsec_nanos() > 0));
                state.leases.insert(
                    id,
                    LeaseEntry {
                        ttl,
                        expires: Instant::now() + ttl,
                    },
                );
                Ok(Grant { id, ttl })
            })
        })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            self.arrive().await;
            self.with("keep-alive", |state| {
                if state.failing_keep_alives.contains(&lease) {
                    return Err(ClusterError::Unreachable {
                        op: "keep-alive",
                        detail: "keep-alives of this lease are set to fail".into(),
                    });
                }
                Ok(match state.leases.get_mut(&lease) {
                    Some(entry) => {
                        entry.expires = Instant::now() + entry.ttl;
                        KeepAlive::Alive {
                            ttl: entry.ttl,
                            revision: state.revision,
                        }
                    }
                    None => KeepAlive::Expired,
                })
            })
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.arrive().await;
            self.with("revoke", |state| {
                state.drop_lease(lease);
                Ok(())
            })
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            self.arrive().await;
            self.with("list", |state| {
                Ok(Listing {
                    revision: state.revision,
                    kvs: state
                        .kvs
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(_, kv)| kv.clone())
                        .collect(),
                })
            })
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            self.arrive().await;
            self.with("txn", |state| {
                if !txn.when.iter().all(|c| state.holds(c)) {
                    return Ok(TxnResult {
                        succeeded: false,
                        revision: state.revision,
                    });
                }
                for op in &txn.then {
                    if let Op::Put {
                        lease: Some(lease), ..
                    } = op
                    {
                        if !state.leases.contains_key(lease) {
                            return Err(ClusterError::Store {
                                op: "txn",
                                detail: format!("requested lease {lease:x} not found"),
                            });
                        }
                    }
                }
                if txn.then.is_empty() {
                    return Ok(TxnResult {
                        succeeded: true,
                        revision: state.revision,
                    });
                }
                state.revision += 1;
                let revision = state.revision;
                for op in txn.then {
                    match op {
                        Op::Put { key, value, lease } => {
                            let create_revision = state
                                .kvs
                                .get(&key)
                                .map_or(revision, |kv| kv.create_revision);
                            let kv = KeyValue {
                                key: key.clone(),
                                value,
                                create_revision,
                                mod_revision: revision,
                                lease: lease.unwrap_or(0),
                            };
                            state.kvs.insert(key, kv.clone());
                            state.record(WatchEvent::Put(kv));
                        }
                        Op::Delete { key } => {
                            if state.kvs.remove(&key).is_some() {
                                state.record(WatchEvent::Delete { key, revision });
                            }
                        }
                    }
                }
                Ok(TxnResult {
                    succeeded: true,
                    revision,
                })
            })
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            self.arrive().await;
            self.with("watch", |_| Ok(()))?;
            let (tx, stream) = watch_channel(64);
            let store = self.clone();
            // From 0: from the next change on.
            let from = if from > 0 {
                from
            } else {
                self.lock().revision + 1
            };
            let mut revisions = self.inner.revision.subscribe();
            let mut cuts = self.inner.cuts.subscribe();
            cuts.borrow_and_update();
            // Bounded by the watcher: it ends when the stream is dropped, the watch
            // is cut, or the history it needs is compacted.
            tokio::spawn(async move {
                let mut next = from.max(1);
                loop {
                    revisions.borrow_and_update();
                    let (head, changes, delay, twice) = {
                        let state = store.lock();
                        let changes = state.changes_since(&prefix, next);
                        (
                            state.revision,
                            changes,
                            state.watch_delay,
                            state.duplicate_events,
                        )
                    };
                    match changes {
                        Err(revision) => {
                            let _ = tx.send(Ok(WatchMessage::Compacted { revision })).await;
                            return;
                        }
                        Ok(events) if !events.is_empty() => {
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            let message = WatchMessage::Events {
                                revision: head,
                                events,
                            };
                            if twice && tx.send(Ok(message.clone())).await.is_err() {
                                return;
                            }
                            if tx.send(Ok(message)).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                    }
                    next = head + 1;
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = cuts.changed() => {
                            let _ = tx
                                .send(Err(ClusterError::Unreachable {
                                    op: "watch",
                                    detail: "the in-memory store cut the watch".into(),
                                }))
                                .await;
                            return;
                        }
                        _ = revisions.changed() => {}
                    }
                }
            });
            Ok(stream)
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        // A change anywhere wakes the waiter (allowed: callers re-read).
        let _ = prefix;
        let mut rx = self.inner.revision.subscribe();
        let unreachable = self.lock().unreachable;
        Box::pin(async move {
            if unreachable {
                tokio::time::sleep(timeout).await;
                return Err(ClusterError::Unreachable {
                    op: "watch",
                    detail: "the in-memory store is set unreachable".into(),
                });
            }
            let _ = tokio::time::timeout(timeout, rx.wait_for(|rev| *rev > after)).await;
            Ok(())
        })
    }
}
