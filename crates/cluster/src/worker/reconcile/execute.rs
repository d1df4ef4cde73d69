//! Carrying a decision out. Each action either issues a local command (resume,
//! pause, stop) and returns, or starts one store call on the action set, whose
//! answer comes back to [`done`](Reconciler::done) (`complete.rs`). Nothing here
//! waits on the store.

use std::sync::Arc;

use crate::coord::{Compare, KeyValue, Op, Txn};
use crate::decide::{Action, Report, Sent};
use crate::fence::{within, FenceToken};
use crate::keys::{DesiredStage, ObservedOutcome, ObservedStatus, TaskId};

use super::super::guard::spawn_stop;
use super::super::Held;
use super::{build, Done, Reconciler, Running, Slot};

impl Reconciler {
    /// Carries one decided action about `task` out; `desired` is the desired
    /// stage it was decided for.
    pub(super) async fn execute(
        &mut self,
        task: &TaskId,
        action: Action,
        desired: Option<(DesiredStage, i64)>,
    ) {
        let inner = Arc::clone(&self.inner);
        match action {
            Action::Claim => self.claim(task, desired),
            Action::Build => self.build_task(task, desired),
            Action::Resume { revision } => {
                if let Some(running) = self.running(task) {
                    running.acted = Some(revision);
                    running.yielded = false;
                    if let Err(error) = running.handle.resume().await {
                        tracing::debug!(worker = %inner.id, %task, %error, "resume refused");
                    }
                }
            }
            Action::Pause { revision } => {
                if let Some(running) = self.running(task) {
                    running.acted = Some(revision);
                    // Issues the pause and returns at once; the stage says when the
                    // run has returned, and its change wakes this loop.
                    if let Err(error) = running.handle.pause_now() {
                        tracing::debug!(worker = %inner.id, %task, %error, "pause refused");
                    }
                }
            }
            Action::Yield => {
                if let Some(running) = self.running(task) {
                    running.yielded = true;
                    if let Err(error) = running.handle.pause_now() {
                        tracing::debug!(worker = %inner.id, %task, %error, "pause refused");
                    }
                }
            }
            Action::Stop | Action::Fence => {
                if let Some(running) = self.running(task) {
                    let why = if action == Action::Fence {
                        "fence"
                    } else {
                        "stop"
                    };
                    tracing::info!(worker = %inner.id, %task, why, "stopping the local run");
                    running.stopping =
                        Some(spawn_stop(&inner, task.clone(), running.handle.clone()));
                }
            }
            Action::Drop => {
                // Only ever decided when the worker may not run the task (decide,
                // invariant 2): forget it; if the key is still ours, a later step
                // rebuilds it with a valid lease.
                self.forget(task);
            }
            Action::Publish(report) => self.publish(task, report),
            Action::Release => self.release(task, None),
            Action::Hand(report) => self.release(task, Some(report)),
        }
    }

    /// Claims the owner key of `task`, only if absent and only if the cache was
    /// current for it.
    fn claim(&mut self, task: &TaskId, desired: Option<(DesiredStage, i64)>) {
        let inner = Arc::clone(&self.inner);
        let record = self.view.record(task);
        if desired.is_some_and(|(_, rev)| self.unbuildable.get(task) == Some(&rev)) {
            return;
        }
        let owner = inner.keys.owner(task);
        // The claim holds only if the cache was current for this task when
        // it reaches the store: the desired stage and the report it was
        // decided from are unchanged (a claim decided from a lagging cache
        // must not run a task since stopped or finished).
        let seen = |entry: Option<&KeyValue>| entry.map_or(0, |kv| kv.mod_revision);
        let desired_rev = seen(record.and_then(|r| r.desired.kv.as_ref()));
        let observed_rev = seen(record.and_then(|r| r.observed.kv.as_ref()));
        let txn = Txn {
            when: vec![
                Compare::Absent(owner.clone()),
                Compare::ModRevision(inner.keys.desired(task), desired_rev),
                Compare::ModRevision(inner.keys.observed(task), observed_rev),
            ],
            then: vec![Op::Put {
                key: owner,
                value: inner.owner_value.clone().into_bytes(),
                lease: Some(inner.lease),
            }],
        };
        self.claiming += 1;
        let coord = Arc::clone(&inner.control_coord);
        let timeout = inner.op_timeout;
        self.start(task, async move {
            Done::Claimed(within(timeout, "claim", coord.txn(txn)).await)
        });
    }

    /// Builds the local task of a key that is this worker's: from its spec, once
    /// the store confirmed the key (a key only the cache shows as ours is
    /// confirmed first).
    fn build_task(&mut self, task: &TaskId, desired: Option<(DesiredStage, i64)>) {
        let inner = Arc::clone(&self.inner);
        let record = self.view.record(task);
        let owner_kv = record.and_then(|r| r.owner.kv.as_ref());
        let token = match self.slots.get(task) {
            Some(slot) => slot.token.clone(),
            None => {
                // Our value under our lease in the cache, and no claim of
                // ours answered: a claim whose answer was lost, or a key
                // already released whose release's answer was lost (the
                // cache may lag). The store says which before anything runs.
                let Some(kv) = owner_kv else { return };
                let token = FenceToken {
                    task: task.clone(),
                    worker: inner.id.clone(),
                    lease: inner.lease,
                    revision: kv.create_revision,
                };
                let fencer = inner.control_fencer(token.clone());
                self.start(task, async move {
                    let result = fencer.fenced(Vec::new()).await;
                    Done::Confirmed { token, result }
                });
                return;
            }
        };
        let spec = record.and_then(|r| r.spec.kv.as_ref().map(|kv| kv.value.clone()));
        match build(&inner, task, spec, token.clone()) {
            Ok(running) => {
                inner.view().insert(
                    task.clone(),
                    Held {
                        token: token.clone(),
                        handle: Some(running.handle.clone()),
                    },
                );
                self.slots.insert(
                    task.clone(),
                    Slot {
                        token,
                        task: Some(running),
                    },
                );
                // Built in New: nothing of the task changes by itself now,
                // so it is decided about again at once (to resume it, or
                // publish New), not at the next unrelated wake-up.
                self.queue.add(task.clone());
            }
            Err(error) => {
                tracing::warn!(worker = %inner.id, %task, %error, "cannot build; releasing");
                if let Some((_, rev)) = desired {
                    self.unbuildable.insert(task.clone(), rev);
                }
                self.forget(task);
                let fencer = inner.control_fencer(token);
                let key = inner.keys.owner(task);
                let ops = vec![Op::Delete { key: key.clone() }];
                self.start(task, async move {
                    let result = fencer.fenced(ops).await;
                    Done::Released {
                        key,
                        rest: None,
                        result,
                    }
                });
            }
        }
    }

    /// Publishes `report` through a fenced write.
    fn publish(&mut self, task: &TaskId, report: Report) {
        let Some((key, value)) = self.report(task, report) else {
            return;
        };
        let Some(running) = self.running(task) else {
            return;
        };
        let ops = vec![Op::Put {
            key: key.clone(),
            value: value.clone(),
            lease: None,
        }];
        let fencer = running.control.clone();
        self.start(task, async move {
            let result = fencer.fenced(ops).await;
            Done::Published { key, value, result }
        });
    }

    /// Releases the owner key, with the report of the task's rest in the same
    /// write when it is handed over (`rest`).
    fn release(&mut self, task: &TaskId, rest: Option<Report>) {
        let inner = Arc::clone(&self.inner);
        // A hand-over's rest goes in the same write as the release: one
        // store round trip, not two, between the run's end and the new
        // owner's claim (decide, invariant 6).
        let rest = match rest {
            Some(report) => match self.report(task, report) {
                Some(rest) => Some(rest),
                None => return,
            },
            None => None,
        };
        if self.running(task).is_none() {
            return;
        }
        self.sent_about(task, |sent| sent.releasing = true);
        let Some(running) = self.running(task) else {
            return;
        };
        let key = inner.keys.owner(task);
        let mut ops = Vec::with_capacity(2);
        if let Some((observed, value)) = &rest {
            ops.push(Op::Put {
                key: observed.clone(),
                value: value.clone(),
                lease: None,
            });
        }
        ops.push(Op::Delete { key: key.clone() });
        let fencer = running.control.clone();
        self.start(task, async move {
            let result = fencer.fenced(ops).await;
            Done::Released { key, rest, result }
        });
    }

    /// The observed key of `task` and the encoded `report` to put there, recorded
    /// as sent when it is a rest (decide, invariant 6); `None` when no run of the
    /// task is held.
    fn report(&mut self, task: &TaskId, report: Report) -> Option<(String, Vec<u8>)> {
        let slot = self.slots.get(task)?;
        let snapshot = slot.task.as_ref()?.handle.snapshot();
        let status = ObservedStatus {
            stage: report.stage,
            generation: report.generation,
            outcome: ObservedOutcome::from_outcome(snapshot.outcome.as_ref()),
            desired_revision: report.desired_revision,
            owner: self.inner.id.clone(),
            owner_revision: slot.token.revision,
        };
        if report.stage.is_at_rest() {
            self.sent_about(task, |sent| sent.rest = Some(report.desired_revision));
        }
        Some((self.inner.keys.observed(task), status.encode()))
    }

    /// Records something sent about `task` under the token of its slot.
    fn sent_about(&mut self, task: &TaskId, record: impl FnOnce(&mut Sent)) {
        let Some(token) = self.slots.get(task).map(|s| s.token.revision) else {
            return;
        };
        let sent = self.sent.entry(task.clone()).or_insert(Sent {
            token,
            rest: None,
            releasing: false,
        });
        if sent.token != token {
            *sent = Sent {
                token,
                rest: None,
                releasing: false,
            };
        }
        record(sent);
    }

    fn running(&mut self, task: &TaskId) -> Option<&mut Running> {
        self.slots.get_mut(task).and_then(|s| s.task.as_mut())
    }

    /// Starts a store action about `task`; the task gets no other decision until
    /// it is done.
    fn start(
        &mut self,
        task: &TaskId,
        action: impl std::future::Future<Output = Done> + Send + 'static,
    ) {
        let about = task.clone();
        // On the lease thread's runtime: the store round trip does not wait for
        // this one.
        let handle = self
            .actions
            .spawn_on(async move { (about, action.await) }, &self.inner.control);
        self.action_tasks.insert(handle.id(), task.clone());
        self.queue.start(task.clone());
    }
}
