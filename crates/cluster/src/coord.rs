//! The seam between the worker/controller logic and the store that carries it out.
//!
//! [`Coordinator`] is the small part of etcd's API the protocol needs: leases,
//! a prefix read at one revision, a transaction of compares and writes, a watch of a
//! prefix resumable from a revision, and a bounded wait for a change. [`EtcdCoordinator`](super::EtcdCoordinator) implements it on a
//! real etcd; [`MemoryCoordinator`](super::MemoryCoordinator) implements it in memory
//! (with fault injection) so that the same worker code can be property-tested.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;

use super::error::ClusterError;

/// A boxed, `Send` future: what [`Coordinator`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One key and its value, with the revisions etcd keeps for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision at which the key was created (0: it does not exist).
    pub create_revision: i64,
    /// The revision of the key's last write.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// Every key under a prefix, read at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The store's revision when the read was served.
    pub revision: i64,
    /// The keys, sorted.
    pub kvs: Vec<KeyValue>,
}

impl Listing {
    /// The entry for exactly `key`, if it exists.
    pub fn get(&self, key: &str) -> Option<&KeyValue> {
        self.kvs.iter().find(|kv| kv.key == key)
    }
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists and was created at this revision.
    CreateRevision(String, i64),
    /// The key's last write was at this revision.
    ModRevision(String, i64),
    /// The key exists and holds this value.
    Value(String, Vec<u8>),
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Puts a value, attached to a lease when `lease` is set.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease to attach the key to.
        lease: Option<i64>,
    },
    /// Deletes a key (nothing if it is absent).
    Delete {
        /// The key.
        key: String,
    },
}

/// A transaction: if every compare holds, every op is applied, atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    /// The conditions.
    pub when: Vec<Compare>,
    /// The writes applied when every condition holds.
    pub then: Vec<Op>,
}

/// What a transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every compare held (and so the writes were applied).
    pub succeeded: bool,
    /// The store's revision after the transaction (its writes' revision when it
    /// succeeded and wrote something).
    pub revision: i64,
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The lease's id.
    pub id: i64,
    /// The TTL the store granted (it may raise the one asked for).
    pub ttl: Duration,
}

/// The answer to one keep-alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// The lease was renewed; it lives `ttl` from when the store received the
    /// keep-alive.
    Alive {
        /// The TTL the store answered with (> 0).
        ttl: Duration,
        /// The store's revision when it answered (0: not known). A worker checks it
        /// against the highest revision it has seen: a store whose revision went
        /// back had its history replaced (a restore from a backup).
        revision: i64,
    },
    /// The store answered TTL 0: the lease has expired or was revoked.
    Expired,
}

/// One change of one key, as a watch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was written: its value and revisions after the write.
    Put(KeyValue),
    /// The key was deleted (by a write or by its lease's end) at `revision`.
    Delete {
        /// The key.
        key: String,
        /// The revision of the deletion.
        revision: i64,
    },
}

impl WatchEvent {
    /// The key the event is about.
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put(kv) => &kv.key,
            WatchEvent::Delete { key, .. } => key,
        }
    }

    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        match self {
            WatchEvent::Put(kv) => kv.mod_revision,
            WatchEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// One message of a [`WatchStream`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Changes in revision order, and the store's revision when they were sent:
    /// every change up to `revision` under the watched prefix has been delivered.
    /// A progress notice carries no events.
    Events {
        /// The store's revision at the time of the message.
        revision: i64,
        /// The changes, oldest first.
        events: Vec<WatchEvent>,
    },
    /// The store no longer holds the history the watch needs (it was compacted up
    /// to `revision`): the watch has ended, and the watcher must read the prefix
    /// again and watch from that read's revision.
    Compacted {
        /// The store's compaction revision.
        revision: i64,
    },
}

/// The changes under a prefix, from a revision on; made by [`Coordinator::watch`].
///
/// A stream that ends, or yields an error, has lost the watch: the watcher reads
/// the prefix again and watches from there (a lost watch may delay what the
/// watcher learns, never hide it). Dropping it cancels the watch.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchMessage, ClusterError>> + Send>>;

/// The receiving end of a channel as a [`WatchStream`]: what this crate's
/// coordinators return, and a way for other implementations to feed a watch from
/// a task of their own.
///
/// # Examples
///
/// ```
/// use taskstage_cluster::{watch_channel, WatchMessage};
///
/// let (sender, stream) = watch_channel(8);
/// sender
///     .try_send(Ok(WatchMessage::Compacted { revision: 7 }))
///     .expect("room in the channel");
/// # drop(stream);
/// ```
pub fn watch_channel(
    capacity: usize,
) -> (
    mpsc::Sender<Result<WatchMessage, ClusterError>>,
    WatchStream,
) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (tx, Box::pin(ChannelStream(rx)))
}

struct ChannelStream(mpsc::Receiver<Result<WatchMessage, ClusterError>>);

impl Stream for ChannelStream {
    type Item = Result<WatchMessage, ClusterError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// The next message of a watch stream (`None`: the stream ended).
pub(crate) async fn next_message(
    stream: &mut WatchStream,
) -> Option<Result<WatchMessage, ClusterError>> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

/// The store operations the cluster protocol is built on.
///
/// Implementations must be linearizable like etcd: every read and transaction is
/// served at one revision, and a transaction's compares and writes happen atomically.
/// Every method returns in bounded time: an implementation that cannot reach its
/// store returns [`ClusterError::Unreachable`] after its own timeout.
pub trait Coordinator: Send + Sync + 'static {
    /// Grants a lease of (at least) `ttl`.
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>>;

    /// Sends one keep-alive for `lease` and returns the store's answer.
    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>>;

    /// Revokes a lease: the store deletes every key attached to it at once.
    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>>;

    /// Reads every key under `prefix` at one revision.
    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>>;

    /// Applies a transaction.
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>>;

    /// Watches every key under `prefix`, from revision `from` on (changes at `from`
    /// included; `from` 0: from the next change on): the changes already made since
    /// `from` come first, then each new one, in revision order. When `from` is older than the history the store keeps,
    /// the stream yields [`WatchMessage::Compacted`] and ends. The watch is not
    /// bounded in time: the stream ends (or yields an error) when it is lost.
    ///
    /// Answers in bounded time: opening a watch that cannot reach the store returns
    /// [`ClusterError::Unreachable`].
    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>>;

    /// Returns once some key under `prefix` changed after revision `after`, or when
    /// `timeout` has passed, whichever is first. A spurious early return is allowed
    /// (callers re-read and decide again: the loop is level-triggered).
    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>>;

    /// A coordinator on the same store with a connection of its own, made on its
    /// first call, on the runtime that makes that call.
    ///
    /// A [`Worker`](super::Worker) keeps its lease through one on its lease thread,
    /// so that no keep-alive waits for the application's runtime: a network client
    /// does its I/O on tasks of the runtime that connected it, and those wait when
    /// the units keep that runtime busy. `None` (the default) means that this
    /// coordinator's calls do not depend on the runtime that made it, as for
    /// [`MemoryCoordinator`](super::MemoryCoordinator): the worker uses it as it is.
    fn fresh_connection(&self) -> Option<std::sync::Arc<dyn Coordinator>> {
        None
    }
}
