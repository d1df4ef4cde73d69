//! Fence tokens, and the fenced writes units make with them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::coord::{Compare, Coordinator, Op, Txn};
use super::error::ClusterError;
use super::keys::{owner_value, Keys, TaskId, WorkerId};

/// Proof of ownership of one task: the owner key's create revision and value.
///
/// Every write an owner makes is a transaction that compares the owner key with
/// this token; once the key is gone (the lease expired or was revoked) or another
/// worker created it anew, the comparison fails and the write is rejected, however
/// late it arrives. A unit can also pass [`FenceToken::revision`] to a system of its
/// own that keeps the highest token it has seen, to fence effects outside etcd.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FenceToken {
    /// The task.
    pub task: TaskId,
    /// The owner.
    pub worker: WorkerId,
    /// The owner's lease.
    pub lease: i64,
    /// The owner key's create revision: it increases with every new owner.
    pub revision: i64,
}

impl FenceToken {
    /// The compares that make a transaction fenced on this token.
    pub(crate) fn compares(&self, keys: &Keys) -> Vec<Compare> {
        let owner = keys.owner(&self.task);
        vec![
            Compare::CreateRevision(owner.clone(), self.revision),
            Compare::Value(owner, owner_value(&self.worker, self.lease).into_bytes()),
        ]
    }
}

/// Fenced writes for one task's owner, handed to the units it builds.
///
/// Cheap to clone. A rejected write returns [`ClusterError::Fenced`] and tells the
/// worker, which then stops the local run (the owner was deposed).
#[derive(Clone)]
pub struct Fencer {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    token: FenceToken,
    rejected: Arc<AtomicBool>,
    wake: Arc<Notify>,
    timeout: Duration,
    /// Test-only: writes without the compares (`WorkerBuilder::unfenced_for_tests`).
    unfenced: bool,
}

impl std::fmt::Debug for Fencer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencer")
            .field("token", &self.token)
            .field("rejected", &self.is_rejected())
            .finish_non_exhaustive()
    }
}

impl Fencer {
    pub(crate) fn new(
        coord: Arc<dyn Coordinator>,
        keys: Keys,
        token: FenceToken,
        wake: Arc<Notify>,
        timeout: Duration,
        unfenced: bool,
    ) -> Self {
        Fencer {
            coord,
            keys,
            token,
            rejected: Arc::new(AtomicBool::new(false)),
            wake,
            timeout,
            unfenced,
        }
    }

    /// The token this fencer writes with.
    pub fn token(&self) -> &FenceToken {
        &self.token
    }

    /// Whether a write with this token was rejected (the owner was deposed).
    pub fn is_rejected(&self) -> bool {
        // Relaxed: a flag read by the worker's loop after it is woken; the wake-up
        // (a Notify) orders it.
        self.rejected.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_rejected(&self) {
        self.rejected.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Writes `value` to the task's checkpoint `name` (a key component, no `/`),
    /// only if this fencer's token still owns the task.
    ///
    /// # Errors
    ///
    /// - [`ClusterError::Fenced`] when the token no longer owns the task: nothing
    ///   was written, and the worker is told to stop the local run.
    /// - [`ClusterError::InvalidTaskId`] when `name` is not a valid key component.
    /// - [`ClusterError::Unreachable`] when the store did not answer in time; the
    ///   write may or may not have been applied (a retry is safe: it is fenced).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped call may still be applied, like
    /// any store write; it is never applied without the token's ownership.
    pub async fn put_checkpoint(&self, name: &str, value: Vec<u8>) -> Result<(), ClusterError> {
        TaskId::new(name)?;
        self.fenced(vec![Op::Put {
            key: self.keys.checkpoint(&self.token.task, name),
            value,
            lease: None,
        }])
        .await
    }

    /// Reads the task's checkpoint `name` (not fenced: any worker may read it).
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`] when the store did not answer in time.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn checkpoint(&self, name: &str) -> Result<Option<Vec<u8>>, ClusterError> {
        let key = self.keys.checkpoint(&self.token.task, name);
        let listing = within(
            self.timeout,
            "read checkpoint",
            self.coord.list(key.clone()),
        )
        .await?;
        Ok(listing.get(&key).map(|kv| kv.value.clone()))
    }

    /// Applies `ops` only if the token still owns the task.
    pub(crate) async fn fenced(&self, ops: Vec<Op>) -> Result<(), ClusterError> {
        let when = if self.unfenced {
            Vec::new()
        } else {
            self.token.compares(&self.keys)
        };
        let txn = Txn { when, then: ops };
        let result = within(self.timeout, "fenced write", self.coord.txn(txn)).await?;
        if result.succeeded {
            Ok(())
        } else {
            self.mark_rejected();
            Err(ClusterError::Fenced {
                task: self.token.task.clone(),
                worker: self.token.worker.clone(),
            })
        }
    }
}

/// Runs a store call with a deadline, turning a timeout into `Unreachable`.
pub(crate) async fn within<T>(
    timeout: Duration,
    op: &'static str,
    fut: impl std::future::Future<Output = Result<T, ClusterError>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(ClusterError::Unreachable {
            op,
            detail: format!("no answer within {timeout:?}"),
        }),
    }
}
