//! The seam between the worker/controller logic and the store that carries it out.
//!
//! [`Coordinator`] is the small part of etcd's API the protocol needs: leases,
//! a prefix read at one revision, a transaction of compares and writes, and a bounded
//! wait for a change. [`EtcdCoordinator`](super::EtcdCoordinator) implements it on a
//! real etcd; [`MemoryCoordinator`](super::MemoryCoordinator) implements it in memory
//! (with fault injection) so that the same worker code can be property-tested.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

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
    },
    /// The store answered TTL 0: the lease has expired or was revoked.
    Expired,
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

    /// Returns once some key under `prefix` changed after revision `after`, or when
    /// `timeout` has passed, whichever is first. A spurious early return is allowed
    /// (callers re-read and decide again: the loop is level-triggered).
    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>>;
}
