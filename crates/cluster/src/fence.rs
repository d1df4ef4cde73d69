//! Fence tokens, and the fenced writes units make with them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

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

/// Tells the worker that one task needs a decision again.
pub(crate) type Wake = mpsc::UnboundedSender<TaskId>;

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
    wake: Wake,
    timeout: Duration,
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
        wake: Wake,
        timeout: Duration,
    ) -> Self {
        Fencer {
            coord,
            keys,
            token,
            rejected: Arc::new(AtomicBool::new(false)),
            wake,
            timeout,
        }
    }

    /// The token this fencer writes with.
    pub fn token(&self) -> &FenceToken {
        &self.token
    }

    /// Whether a write with this token was rejected (the owner was deposed).
    pub fn is_rejected(&self) -> bool {
        // Relaxed: a flag read by the worker's loop after it is woken; the wake-up
        // (a channel message) orders it.
        self.rejected.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_rejected(&self) {
        self.rejected.store(true, Ordering::Relaxed);
        // A worker that has ended no longer listens: nothing is left to stop.
        let _ = self.wake.send(self.token.task.clone());
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
        .map(|_| ())
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

    /// Applies `ops` only if the token still owns the task; returns the revision
    /// of the write.
    pub(crate) async fn fenced(&self, ops: Vec<Op>) -> Result<i64, ClusterError> {
        let txn = Txn {
            when: self.token.compares(&self.keys),
            then: ops,
        };
        let result = within(self.timeout, "fenced write", self.coord.txn(txn)).await?;
        if result.succeeded {
            Ok(result.revision)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::Compare;
    use crate::MemoryCoordinator;

    /// Puts the owner key of `task` for `worker` under `lease`, only if absent, and
    /// returns its create revision.
    async fn claim(store: &MemoryCoordinator, keys: &Keys, token: &FenceToken) -> i64 {
        let owner = keys.owner(&token.task);
        let txn = Txn {
            when: vec![Compare::Absent(owner.clone())],
            then: vec![Op::Put {
                key: owner.clone(),
                value: owner_value(&token.worker, token.lease).into_bytes(),
                lease: Some(token.lease),
            }],
        };
        assert!(store.txn(txn).await.expect("claim").succeeded);
        let listing = store.list(owner.clone()).await.expect("list");
        listing.get(&owner).expect("the owner key").create_revision
    }

    fn fencer(store: &MemoryCoordinator, keys: &Keys, token: FenceToken) -> Fencer {
        Fencer::new(
            Arc::new(store.clone()),
            keys.clone(),
            token,
            mpsc::unbounded_channel().0,
            Duration::from_secs(5),
        )
    }

    /// The token is the owner key's create revision as well as its value: the same
    /// worker under the same lease that released the task and claimed it again holds
    /// a new token, and the old one is rejected.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_stale_token_of_the_same_worker_under_the_same_lease_is_rejected() {
        let store = MemoryCoordinator::new();
        let keys = Keys::new("fence").expect("a prefix");
        let lease = store
            .grant(Duration::from_secs(10))
            .await
            .expect("grant")
            .id;
        let mut token = FenceToken {
            task: TaskId::new("t").expect("an id"),
            worker: WorkerId::new("w1").expect("an id"),
            lease,
            revision: 0,
        };
        token.revision = claim(&store, &keys, &token).await;
        let old = fencer(&store, &keys, token.clone());
        old.put_checkpoint("pos", b"1".to_vec())
            .await
            .expect("the owner's write");
        assert!(!old.is_rejected());

        // Released and claimed again: same value (worker and lease), new revision.
        let owner = keys.owner(&token.task);
        let release = Txn {
            when: Vec::new(),
            then: vec![Op::Delete { key: owner }],
        };
        assert!(store.txn(release).await.expect("release").succeeded);
        let mut again = token.clone();
        again.revision = claim(&store, &keys, &token).await;
        assert!(again.revision > token.revision);

        let rejected = old.put_checkpoint("pos", b"2".to_vec()).await;
        assert!(
            matches!(&rejected, Err(ClusterError::Fenced { task, .. }) if *task == token.task),
            "a stale token was accepted: {rejected:?}"
        );
        assert!(old.is_rejected());
        assert_eq!(
            old.checkpoint("pos").await.expect("read"),
            Some(b"1".to_vec())
        );
        let new = fencer(&store, &keys, again);
        new.put_checkpoint("pos", b"3".to_vec())
            .await
            .expect("the current token's write");
        assert_eq!(
            new.checkpoint("pos").await.expect("read"),
            Some(b"3".to_vec())
        );
    }

    /// A fencer prints its token and whether it was rejected (and nothing of its
    /// store handle).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_fencer_prints_its_token_and_whether_it_was_rejected() {
        let store = MemoryCoordinator::new();
        let keys = Keys::new("fence").expect("a prefix");
        let token = FenceToken {
            task: TaskId::new("t").expect("an id"),
            worker: WorkerId::new("w1").expect("an id"),
            lease: 7,
            revision: 3,
        };
        let fencer = fencer(&store, &keys, token.clone());
        let text = format!("{fencer:?}");
        assert!(text.starts_with("Fencer {"), "{text}");
        assert!(text.contains(&format!("token: {token:?}")), "{text}");
        assert!(text.contains("rejected: false"), "{text}");
        // Nothing claimed the key: the write is rejected, and the fencer says so.
        assert!(fencer.put_checkpoint("pos", Vec::new()).await.is_err());
        assert!(format!("{fencer:?}").contains("rejected: true"));
    }

    /// A token of another worker, or of another lease of the same worker, is rejected
    /// even with the right revision.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_token_naming_another_worker_or_lease_is_rejected() {
        let store = MemoryCoordinator::new();
        let keys = Keys::new("fence").expect("a prefix");
        let lease = store
            .grant(Duration::from_secs(10))
            .await
            .expect("grant")
            .id;
        let mut token = FenceToken {
            task: TaskId::new("t").expect("an id"),
            worker: WorkerId::new("w1").expect("an id"),
            lease,
            revision: 0,
        };
        token.revision = claim(&store, &keys, &token).await;
        let mut other_worker = token.clone();
        other_worker.worker = WorkerId::new("w2").expect("an id");
        let mut other_lease = token.clone();
        other_lease.lease = lease + 1;
        for stale in [other_worker, other_lease] {
            let result = fencer(&store, &keys, stale.clone())
                .put_checkpoint("pos", b"x".to_vec())
                .await;
            assert!(
                matches!(result, Err(ClusterError::Fenced { .. })),
                "{stale:?}"
            );
        }
        assert_eq!(
            fencer(&store, &keys, token)
                .checkpoint("pos")
                .await
                .expect("read"),
            None
        );
    }
}
