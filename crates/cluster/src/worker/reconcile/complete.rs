//! Completing an action: what the loop learns from a store call's answer, and
//! when the task is decided about again.

use std::sync::Arc;

use crate::coord::{KeyValue, TxnResult};
use crate::error::ClusterError;
use crate::fence::FenceToken;
use crate::keys::TaskId;

use super::super::Held;
use super::{Done, Reconciler, Slot};

/// When a task whose action finished is decided about again.
enum Next {
    /// At once: the action changed something.
    Now,
    /// When something about it changes (the watch shows why the store refused
    /// it).
    OnChange,
    /// After a pause: the action did not reach the store.
    Later,
}

impl Next {
    /// After a fenced write that failed: one the store refused is decided about
    /// again at once (its refusal fences the task); one that did not reach the
    /// store is tried again later.
    fn after(error: &ClusterError) -> Next {
        if matches!(error, ClusterError::Fenced { .. }) {
            Next::Now
        } else {
            Next::Later
        }
    }
}

impl Reconciler {
    /// Applies the result of a finished action.
    pub(super) fn done(
        &mut self,
        done: Result<(tokio::task::Id, (TaskId, Done)), tokio::task::JoinError>,
    ) {
        let (id, task, done) = match done {
            Ok((id, (task, done))) => (id, task, Some(done)),
            Err(error) => {
                let Some(task) = self.action_tasks.get(&error.id()).cloned() else {
                    return;
                };
                tracing::warn!(worker = %self.inner.id, %task, %error, "a store action failed");
                (error.id(), task, None)
            }
        };
        self.action_tasks.remove(&id);
        let next = match done {
            Some(Done::Claimed(result)) => self.claimed(&task, result),
            Some(Done::Confirmed { token, result }) => self.confirmed(&task, token, result),
            Some(Done::Published { key, value, result }) => {
                self.published(&task, key, value, result)
            }
            Some(Done::Released { key, rest, result }) => self.released(&task, key, rest, result),
            None => {
                // A panicked claim still counted as held.
                if !self.slots.contains_key(&task) {
                    self.claiming = self.claiming.saturating_sub(1);
                }
                Next::Later
            }
        };
        match next {
            Next::Now => self.queue.finish(task, true),
            Next::OnChange => self.queue.finish(task, false),
            Next::Later => {
                self.queue.finish(task.clone(), false);
                self.retry_later(task);
            }
        }
    }

    /// A claim's answer: the key is ours (a slot with its token), or someone
    /// else's (the watch tells whose).
    fn claimed(&mut self, task: &TaskId, result: Result<TxnResult, ClusterError>) -> Next {
        let inner = Arc::clone(&self.inner);
        self.claiming = self.claiming.saturating_sub(1);
        match result {
            Ok(result) if result.succeeded => {
                let revision = result.revision;
                tracing::info!(worker = %inner.id, %task, revision, "claimed");
                let token = FenceToken {
                    task: task.clone(),
                    worker: inner.id.clone(),
                    lease: inner.lease,
                    revision,
                };
                inner.view().insert(
                    task.clone(),
                    Held {
                        token: token.clone(),
                        handle: None,
                    },
                );
                self.slots.insert(task.clone(), Slot { token, task: None });
                let key = inner.keys.owner(task);
                let kv = KeyValue {
                    key: key.clone(),
                    value: inner.owner_value.clone().into_bytes(),
                    create_revision: revision,
                    mod_revision: revision,
                    lease: inner.lease,
                };
                let changes = self.view.own_write(key, Some(kv), revision);
                self.changed(changes);
                Next::Now
            }
            Ok(_) => Next::OnChange, // someone else was first; the watch tells who
            Err(error) => {
                tracing::debug!(worker = %inner.id, %task, %error, "claim failed");
                Next::Later
            }
        }
    }

    /// The store's answer about a key the cache showed as ours: adopted, or
    /// refused (remembered, so the cache is not believed until it moves on).
    fn confirmed(
        &mut self,
        task: &TaskId,
        token: FenceToken,
        result: Result<i64, ClusterError>,
    ) -> Next {
        match result {
            Ok(_) => {
                tracing::info!(worker = %self.inner.id, %task, revision = token.revision, "adopted");
                self.inner.view().insert(
                    task.clone(),
                    Held {
                        token: token.clone(),
                        handle: None,
                    },
                );
                self.slots.insert(task.clone(), Slot { token, task: None });
                Next::Now
            }
            Err(ClusterError::Fenced { .. }) => {
                self.dead.insert(task.clone(), token.revision);
                Next::OnChange // the watch shows whose it is
            }
            Err(error) => {
                tracing::debug!(worker = %self.inner.id, %task, %error, "confirm failed");
                Next::Later
            }
        }
    }

    /// A report's answer: written (into the cache at once), or refused.
    fn published(
        &mut self,
        task: &TaskId,
        key: String,
        value: Vec<u8>,
        result: Result<i64, ClusterError>,
    ) -> Next {
        match result {
            Ok(revision) => {
                let kv = KeyValue {
                    key: key.clone(),
                    value,
                    create_revision: revision,
                    mod_revision: revision,
                    lease: 0,
                };
                let changes = self.view.own_write(key, Some(kv), revision);
                self.changed(changes);
                Next::Now
            }
            Err(error) => {
                tracing::debug!(worker = %self.inner.id, %task, %error, "publish failed");
                self.refused(task, &error);
                Next::after(&error)
            }
        }
    }

    /// A release's answer (with the rest report of a hand-over): the task is
    /// forgotten and the shares computed again, or the release was refused.
    fn released(
        &mut self,
        task: &TaskId,
        key: String,
        rest: Option<(String, Vec<u8>)>,
        result: Result<i64, ClusterError>,
    ) -> Next {
        match result {
            Ok(revision) => {
                tracing::info!(worker = %self.inner.id, %task, handed = rest.is_some(), "released");
                self.forget(task);
                if let Some((observed, value)) = rest {
                    let kv = KeyValue {
                        key: observed.clone(),
                        value,
                        create_revision: revision,
                        mod_revision: revision,
                        lease: 0,
                    };
                    let changes = self.view.own_write(observed, Some(kv), revision);
                    self.changed(changes);
                }
                let changes = self.view.own_write(key, None, revision);
                self.changed(changes);
                self.rebalance_due = true;
                Next::Now
            }
            Err(error) => {
                tracing::debug!(worker = %self.inner.id, %task, %error, "release failed");
                self.refused(task, &error);
                Next::after(&error)
            }
        }
    }

    /// Remembers that the store refused the held token of `task` as this worker's.
    fn refused(&mut self, task: &TaskId, error: &ClusterError) {
        if let (ClusterError::Fenced { .. }, Some(slot)) = (error, self.slots.get(task)) {
            self.dead.insert(task.clone(), slot.token.revision);
        }
    }
}
