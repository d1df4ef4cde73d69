//! The reconcile loop: decides about one task at a time from the cache, and
//! carries the decisions out with up to `max_in_flight` store actions at once.
//!
//! Owns the tasks this worker holds (their slots: token, local handle) and the
//! cache ([`View`]). It is woken by what changes, and decides about exactly the
//! task that changed: a watched change of the store, a local task's stage change,
//! a rejected fenced write, an action done. `decide` is the one pure function that
//! says what to do, `gather` the one that reads its inputs out of what the loop
//! [`Known`]s; this loop fills that in (`step`, here), carries the answer out
//! (`execute.rs`) and takes the store's answer to it (`complete.rs`).
//! A decision reads nothing from the store: a watched change costs O(1) store work
//! and O(log tasks) here, and a resync re-decides every cached task from the cache.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, KeyValue, Op, Txn, TxnResult};
use crate::decide::{
    decide, gather, settled, Holding, Known, Local, ObservedKey, OwnerKey, Ownership, Report, Sent,
};
use crate::error::ClusterError;
use crate::fence::{within, FenceToken, Fencer};
use crate::history::Replaced;
use crate::keys::{DesiredStage, ObservedStatus, TaskId, WorkerId};
use taskstage::runtime::Handle;
use taskstage::Stage;

use super::guard::lease_now;
use super::handover;
use super::queue::WorkQueue;
use super::session::LeaseState;
use super::view::{reflect, Changes, Feed, Prefix, Record, View};
use super::{Inner, TaskSpec};

mod complete;
mod execute;

/// One task the worker holds.
struct Slot {
    token: FenceToken,
    task: Option<Running>,
}

/// A held task that was built: its local handle and what the loop did to it.
struct Running {
    handle: Handle,
    fencer: Fencer,
    /// The same token on the worker's own connection, for the loop's reports and
    /// releases.
    control: Fencer,
    /// The desired revision last resumed or paused for.
    acted: Option<i64>,
    /// Paused for a hand-over since the last resume.
    yielded: bool,
    stopping: Option<JoinHandle<()>>,
    forwarder: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// A store action that finished.
enum Done {
    Claimed(Result<TxnResult, ClusterError>),
    /// A key the cache says is this worker's, confirmed (or not) by the store.
    Confirmed {
        token: FenceToken,
        result: Result<i64, ClusterError>,
    },
    Published {
        key: String,
        value: Vec<u8>,
        result: Result<i64, ClusterError>,
    },
    /// The owner key deleted; with the report of the task's rest put in the same
    /// write when it was handed over (`Action::Hand`).
    Released {
        key: String,
        rest: Option<(String, Vec<u8>)>,
        result: Result<i64, ClusterError>,
    },
}

/// The loop's state.
struct Reconciler {
    inner: Arc<Inner>,
    view: View,
    slots: HashMap<TaskId, Slot>,
    queue: WorkQueue<TaskId>,
    actions: JoinSet<(TaskId, Done)>,
    /// Which task each action in flight is about (a panicked action still frees
    /// its task).
    action_tasks: HashMap<tokio::task::Id, TaskId>,
    /// Tasks whose factory failed, with the desired revision it failed for.
    unbuildable: HashMap<TaskId, i64>,
    /// Claims in flight: they count as held.
    claiming: usize,
    /// Tasks being handed over (fair shares).
    handing_over: BTreeSet<TaskId>,
    /// What was sent about each held task under its token, answered or not: a
    /// report or a release whose answer was lost may still land, and one that
    /// landed still stands. Kept per task, not per local run, so that it outlives a
    /// rebuild under the same token (a fence stops and drops the local task when
    /// the store is out of reach; once the lease is back the key is still this
    /// worker's and the task is built again): the rebuilt task must not run under a
    /// rest report of its own (decide, invariant 6). Forgotten once the cache shows
    /// the task under another token or none.
    sent: HashMap<TaskId, Sent>,
    /// Tasks that want an owner: a desired stage, and owned or not settled.
    wanting: HashSet<TaskId>,
    /// This worker's member key.
    me: String,
    /// This worker's fair share (see [`handover::share`]); 0 once draining.
    share: usize,
    /// Whether a controller drained this worker (its member key says so): it
    /// claims nothing and hands every task over (decide, invariant 7).
    draining: bool,
    /// The shares must be computed again (the members or the tasks changed).
    rebalance_due: bool,
    /// Tasks whose action failed to reach the store, and when to decide again.
    retry: BTreeSet<(Instant, TaskId)>,
    /// Unowned tasks this worker would claim if it had room: decided again, as
    /// many as there is room for, when room appears.
    starved: BTreeSet<TaskId>,
    /// Owner keys (by create revision) the store refused as this worker's: the
    /// cache may still show them as its own until the watch catches up.
    dead: HashMap<TaskId, i64>,
    /// Whether this worker's member key was written (once its cache knew the
    /// tasks and the members), and when to try again if not.
    registered: bool,
    register_at: Instant,
}

/// The reconcile loop, until shutdown or the end of the lease.
pub(super) async fn reconcile(
    inner: Arc<Inner>,
    mut lease_rx: watch::Receiver<LeaseState>,
    shutdown: CancellationToken,
    mut wake_rx: mpsc::UnboundedReceiver<TaskId>,
) -> Result<(), ClusterError> {
    let follow = shutdown.child_token();
    // Ends the reflectors whichever way this loop ends (an abort included).
    let _follow_guard = follow.clone().drop_guard();
    let mut feed_rx = follow_the_store(&inner, &follow);
    let mut loop_state = Reconciler::new(&inner);
    let state = &mut loop_state;
    let mut resync = tokio::time::interval_at(Instant::now() + inner.resync, inner.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The loop turns at least this often, so that a quiet loop is not taken for a
    // stalled one (WorkerBuilder::stall_bound).
    let mut turn = tokio::time::interval(
        (inner.stall_bound / 4).clamp(Duration::from_millis(1), Duration::from_secs(3600)),
    );
    turn.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        inner.turned();
        if shutdown.is_cancelled() {
            state.wind_down().await;
            return Ok(());
        }
        if !state.registered && state.view.is_known() && Instant::now() >= state.register_at {
            state.register().await;
        }
        if state.rebalance_due {
            state.rebalance();
        }
        state.feed_the_starved();
        let lease = state.decide_queued(&mut lease_rx).await;
        if lease.stop_at.is_none() && state.slots.values().all(|s| s.task.is_none()) {
            if let Some(replaced) = inner.history.replaced() {
                state.actions.shutdown().await;
                return Err(after_replaced(&inner, replaced, &shutdown).await);
            }
            tracing::warn!(worker = %inner.id, "lease lost; every run stopped");
            return Err(ClusterError::LeaseLost {
                worker: inner.id.clone(),
            });
        }
        let deadline = lease
            .stop_at
            .map(|ms| inner.at(ms))
            .filter(|at| *at > Instant::now());
        let retry_at = state.retry.first().map(|(at, _)| *at);
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {}
            Some(done) = state.actions.join_next_with_id(), if !state.actions.is_empty() => {
                state.done(done);
            }
            Some(task) = wake_rx.recv() => {
                state.queue.add(task);
                while let Ok(task) = wake_rx.try_recv() {
                    state.queue.add(task);
                }
            }
            _ = lease_rx.changed() => state.queue_held(),
            Some(feed) = feed_rx.recv() => state.feed(feed),
            _ = resync.tick() => {
                state.rebalance_due = true;
                state.queue_all();
            }
            _ = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => state.queue_held(),
            _ = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => state.retry_due(),
            _ = turn.tick() => {}
        }
    }
}

/// Starts the reflectors of the tasks' and the members' prefixes, until
/// `follow` is cancelled; their listings and changes arrive on the receiver.
fn follow_the_store(inner: &Arc<Inner>, follow: &CancellationToken) -> mpsc::Receiver<Feed> {
    let (feed_tx, feed_rx) = mpsc::channel(64);
    for (which, prefix) in [
        (Prefix::Tasks, inner.keys.tasks()),
        (Prefix::Workers, inner.keys.workers()),
    ] {
        // On the lease thread's runtime, with its connection: the cache stays fresh
        // however busy the units keep this runtime.
        inner.control.spawn(reflect(
            Arc::clone(&inner.control_coord),
            which,
            prefix,
            inner.op_timeout,
            inner.op_timeout.min(inner.resync),
            feed_tx.clone(),
            follow.clone(),
        ));
    }
    drop(feed_tx);
    feed_rx
}

impl Reconciler {
    /// The loop's state at its start: nothing known, nothing held.
    fn new(inner: &Arc<Inner>) -> Reconciler {
        Reconciler {
            me: inner.keys.worker(&inner.id, inner.lease),
            view: View::new(inner.keys.clone()),
            slots: HashMap::new(),
            queue: WorkQueue::new(inner.max_in_flight),
            actions: JoinSet::new(),
            action_tasks: HashMap::new(),
            unbuildable: HashMap::new(),
            claiming: 0,
            handing_over: BTreeSet::new(),
            sent: HashMap::new(),
            wanting: HashSet::new(),
            share: 0,
            draining: false,
            rebalance_due: false,
            retry: BTreeSet::new(),
            starved: BTreeSet::new(),
            dead: HashMap::new(),
            registered: false,
            register_at: Instant::now(),
            inner: Arc::clone(inner),
        }
    }

    /// Decides about every queued task, reading the lease again for each (a
    /// lease lost meanwhile must reach the next decision), and yields now and
    /// then, so that a resync of many tasks does not hold the thread. Returns the
    /// lease as last read.
    async fn decide_queued(&mut self, lease_rx: &mut watch::Receiver<LeaseState>) -> LeaseState {
        let inner = Arc::clone(&self.inner);
        let mut lease = lease_now(&inner, lease_rx);
        let mut decided = 0u32;
        while let Some(task) = self.queue.pop() {
            lease = lease_now(&inner, lease_rx);
            self.step(&task, lease).await;
            decided += 1;
            if decided.is_multiple_of(256) {
                inner.turned();
                tokio::task::yield_now().await;
            }
        }
        lease
    }

    /// Registers this worker as a member under its lease, once its cache knows
    /// the tasks and the members; tried again after a resync period when the
    /// store does not answer.
    async fn register(&mut self) {
        let inner = Arc::clone(&self.inner);
        let txn = Txn {
            when: vec![],
            then: vec![Op::Put {
                key: self.me.clone(),
                value: format!("{:x}", inner.lease).into_bytes(),
                lease: Some(inner.lease),
            }],
        };
        let coord = Arc::clone(&inner.control_coord);
        let timeout = inner.op_timeout;
        // On the lease thread's runtime, with its connection; bounded by the
        // call's deadline.
        let answer = inner
            .control
            .spawn(async move { within(timeout, "register worker", coord.txn(txn)).await })
            .await;
        match answer {
            Ok(Ok(_)) => {
                self.registered = true;
                self.rebalance_due = true;
                tracing::info!(worker = %inner.id, "registered as a member");
            }
            Ok(Err(error)) => {
                tracing::debug!(worker = %inner.id, %error, "registering failed; trying again");
                self.register_at = Instant::now() + inner.resync;
            }
            Err(error) => {
                tracing::debug!(worker = %inner.id, %error, "registering failed; trying again");
                self.register_at = Instant::now() + inner.resync;
            }
        }
    }

    /// Applies a reflector's message to the cache and queues what it changed.
    fn feed(&mut self, feed: Feed) {
        let changes = self.view.feed(feed);
        if let Some((seen, found)) = changes.replaced {
            // Stops every run at once, as a lost lease does (the history's hook).
            self.inner.history.replace("listing", seen, found);
        }
        self.changed(changes);
    }

    fn changed(&mut self, changes: Changes) {
        if changes.members {
            self.rebalance_due = true;
        }
        let mut tasks = changes.tasks;
        if tasks.len() > 1 {
            // Workers that learn of the same tasks at once (a listing, a member's
            // lease ending with all its owner keys) claim them in orders of their
            // own, so that few claims collide.
            let me = self.me.as_str();
            tasks.sort_by_cached_key(|task| {
                let mut hasher = DefaultHasher::new();
                (me, task).hash(&mut hasher);
                hasher.finish()
            });
        }
        for task in tasks {
            self.update_wanting(&task);
            self.queue.add(task);
        }
    }

    /// Queues the tasks whose retry is due.
    fn retry_due(&mut self) {
        let now = Instant::now();
        while let Some((at, _)) = self.retry.first() {
            if *at > now {
                break;
            }
            if let Some((_, task)) = self.retry.pop_first() {
                self.queue.add(task);
            }
        }
    }

    /// Decides about `task` again after a pause: its action did not reach the store.
    fn retry_later(&mut self, task: TaskId) {
        let delay = self.inner.op_timeout.min(self.inner.resync) / 4;
        self.retry.insert((Instant::now() + delay, task));
    }

    fn queue_held(&mut self) {
        let held: Vec<TaskId> = self.slots.keys().cloned().collect();
        for task in held {
            self.queue.add(task);
        }
    }

    fn queue_all(&mut self) {
        let all: Vec<TaskId> = self
            .view
            .tasks()
            .cloned()
            .chain(self.slots.keys().cloned())
            .collect();
        for task in all {
            self.queue.add(task);
        }
    }

    /// Keeps the set of tasks that want an owner up to date for one task.
    fn update_wanting(&mut self, task: &TaskId) {
        let wants = self.view.record(task).is_some_and(|record| {
            let desired = record.desired.kv.as_ref().and_then(parse_desired);
            let report = observed_key(record, &self.inner.id).map(|o| o.report);
            desired.is_some() && (record.owner.kv.is_some() || !settled(report, desired))
        });
        let changed = if wants {
            self.wanting.insert(task.clone())
        } else {
            self.wanting.remove(task)
        };
        if changed {
            self.rebalance_due = true;
        }
    }

    /// Computes this worker's share again, and starts or gives up hand-overs.
    fn rebalance(&mut self) {
        self.rebalance_due = false;
        if !self.view.is_known() {
            return;
        }
        let draining = self.view.is_draining(&self.me);
        if draining && !self.draining {
            tracing::info!(worker = %self.inner.id, held = self.slots.len(), "drained: handing every task over");
            // Every held task is decided again, now with `draining`.
            self.queue_held();
        }
        self.draining = draining;
        // Relaxed: a flag for Worker::is_draining; nothing is ordered by it.
        self.inner
            .draining
            .store(draining, std::sync::atomic::Ordering::Relaxed);
        let members = self.view.members();
        self.share = if draining {
            0
        } else {
            handover::share(self.wanting.len(), &members, &self.me)
        };
        // A hand-over ends with the release; one whose task is gone, failed or
        // ending is no longer under way.
        let slots = &self.slots;
        self.handing_over.retain(|task| {
            slots
                .get(task)
                .and_then(|s| s.task.as_ref())
                .is_some_and(|r| still_handing_over(&r.handle))
        });
        let held = self.slots.len() + self.claiming;
        if held <= self.share {
            // The share grew (a member left): keep what is left to hand over.
            for task in std::mem::take(&mut self.handing_over) {
                self.queue.add(task);
            }
            return;
        }
        // Lazily: only as many held tasks are looked at as are picked (and those
        // already being handed over), not every one at every release.
        let handing_over = &self.handing_over;
        let candidates = self
            .slots
            .iter()
            .filter(|(task, _)| !handing_over.contains(*task))
            .filter(|(_, slot)| slot.task.as_ref().is_some_and(|r| can_hand_over(&r.handle)))
            .map(|(task, _)| task.clone());
        let picked = handover::pick(held, self.share, handing_over, candidates);
        for task in picked {
            tracing::debug!(worker = %self.inner.id, %task, share = self.share, held, "handing over");
            self.handing_over.insert(task.clone());
            self.queue.add(task);
        }
    }

    /// Queues as many starved tasks as there is room for.
    fn feed_the_starved(&mut self) {
        if !self.view.is_known() {
            return;
        }
        let held = self.slots.len() + self.claiming;
        let room = self.inner.capacity.min(self.share).saturating_sub(held);
        for _ in 0..room {
            let Some(task) = self.starved.pop_first() else {
                return;
            };
            self.queue.add(task);
        }
    }

    /// Whether the worker has room for one more task.
    fn capacity_left(&self) -> bool {
        let held = self.slots.len() + self.claiming;
        self.view.is_known() && held < self.inner.capacity.min(self.share)
    }

    /// One decision about one task, and starting to carry it out.
    async fn step(&mut self, task: &TaskId, lease: LeaseState) {
        let inner = Arc::clone(&self.inner);
        let record = self.view.record(task);
        let slot_rev = self.slots.get(task).map(|s| s.token.revision);
        let desired = record
            .and_then(|r| r.desired.kv.as_ref())
            .and_then(parse_desired);
        let owner_kv = record.and_then(|r| r.owner.kv.as_ref());
        let dead = self.dead.get(task).copied();
        if dead.is_some() && owner_kv.map(|kv| kv.create_revision) != dead {
            // The cache has moved past the key the store refused.
            self.dead.remove(task);
        }
        let running_ref = self.slots.get(task).and_then(|s| s.task.as_ref());
        let known = Known {
            desired,
            owner: owner_kv.map(|kv| OwnerKey {
                create_revision: kv.create_revision,
                ours: kv.value == inner.owner_value.as_bytes(),
            }),
            observed: record.and_then(|r| observed_key(r, &inner.id)),
            slot_token: slot_rev,
            refused: dead,
            holding: running_ref.map(|r| Holding {
                local: local_of(&r.handle),
                acted: r.acted,
                fence_rejected: r.fencer.is_rejected(),
                stopping: r.stopping.is_some(),
                yielded: r.yielded,
            }),
            sent: self.sent.get(task).copied(),
            picked_to_hand_over: self.handing_over.contains(task),
            now: inner.now_ms(),
            stop_at: lease.stop_at,
            capacity_left: self.capacity_left(),
            draining: self.draining,
        };
        let gathered = gather(&known);
        if gathered.sent_is_stale {
            // The key is gone, or another's: what was sent under it is settled.
            self.sent.remove(task);
        }
        let view = gathered.view;
        let ownership = view.ownership;
        let starved = view.local.is_none()
            && ownership == Ownership::Unowned
            && !view.capacity_left
            && !view.settled
            && view.desired.is_some();
        if starved {
            self.starved.insert(task.clone());
        } else {
            self.starved.remove(task);
        }
        let Some(action) = decide(&view) else {
            // A slot whose key is gone and that runs nothing is forgotten.
            if view.local.is_none() && ownership != Ownership::Mine {
                self.forget(task);
            }
            if !self.slots.contains_key(task) {
                self.view.forget_if_gone(task);
            }
            return;
        };
        tracing::debug!(worker = %inner.id, %task, ?action, "decided");
        self.execute(task, action, desired).await;
    }

    /// Forgets a held task: the slot, and the worker's public view of it.
    fn forget(&mut self, task: &TaskId) {
        self.slots.remove(task);
        self.inner.view().remove(task);
        self.handing_over.remove(task);
    }

    /// Shutdown: stop every local run, withdraw owner keys and reports (fenced).
    async fn wind_down(&mut self) {
        self.actions.shutdown().await;
        let inner = Arc::clone(&self.inner);
        // The membership goes first: the other workers' shares grow at once, so
        // each task is claimed the moment its key is withdrawn, not after the
        // lease's revoke. Safe: no task can be claimed while its owner key stands.
        if self.registered {
            let leave = Txn {
                when: vec![],
                then: vec![Op::Delete {
                    key: self.me.clone(),
                }],
            };
            let coord = Arc::clone(&inner.control_coord);
            let timeout = inner.op_timeout;
            let _ = inner
                .control
                .spawn(async move { within(timeout, "leave membership", coord.txn(leave)).await })
                .await;
        }
        // Each task's keys are withdrawn as soon as its own run is gone, not once
        // every run is: stops are concurrent, and a slow one delays only its task.
        // At most `max_in_flight` withdrawals at the store at once.
        let writes = Arc::new(tokio::sync::Semaphore::new(inner.max_in_flight.max(1)));
        let mut work = JoinSet::new();
        for (task, slot) in std::mem::take(&mut self.slots) {
            let inner = Arc::clone(&inner);
            let writes = Arc::clone(&writes);
            let handle = slot.task.as_ref().map(|running| running.handle.clone());
            work.spawn(async move {
                if let Some(handle) = &handle {
                    if let Err(error) = handle.stop_within(inner.grace).await {
                        tracing::warn!(%task, %error, "stop at shutdown timed out");
                    }
                    // A run that could not be stopped keeps the key until the lease
                    // expires.
                    if handle.stage().run_may_be_alive() {
                        return;
                    }
                }
                inner.view().remove(&task);
                let fencer = inner.fencer(slot.token);
                let ops = vec![
                    Op::Delete {
                        key: inner.keys.observed(&task),
                    },
                    Op::Delete {
                        key: inner.keys.owner(&task),
                    },
                ];
                // The semaphore is never closed.
                let _permit = writes.acquire().await;
                let _ = fencer.fenced(ops).await;
            });
        }
        while work.join_next().await.is_some() {}
    }
}

/// Whether a held task may be handed over now: built, running or at rest, not
/// failed.
fn can_hand_over(handle: &Handle) -> bool {
    let local = local_of(handle);
    matches!(local.stage, Stage::New | Stage::Running | Stage::Paused) && !local.failed
}

/// Whether a hand-over of a held task is still under way: its pause may still be
/// in progress (Pausing), not failed, not ending.
fn still_handing_over(handle: &Handle) -> bool {
    let local = local_of(handle);
    matches!(
        local.stage,
        Stage::New | Stage::Running | Stage::Resuming | Stage::Pausing | Stage::Paused
    ) && !local.failed
}

/// The observed key of a task's record, as `gather` takes it; `None` when absent
/// or unreadable.
fn observed_key(record: &Record, me: &WorkerId) -> Option<ObservedKey> {
    let kv = record.observed.kv.as_ref()?;
    let o = ObservedStatus::decode(&kv.key, &kv.value).ok()?;
    Some(ObservedKey {
        ours: o.owner == *me,
        owner_revision: o.owner_revision,
        report: Report {
            stage: o.stage,
            failed: o.outcome.is_failed(),
            generation: o.generation,
            desired_revision: o.desired_revision,
        },
    })
}

fn parse_desired(kv: &KeyValue) -> Option<(DesiredStage, i64)> {
    let text = std::str::from_utf8(&kv.value).ok()?;
    match text.parse::<DesiredStage>() {
        Ok(stage) => Some((stage, kv.mod_revision)),
        Err(_) => {
            tracing::warn!(key = %kv.key, value = %text, "unknown desired stage; task left alone");
            None
        }
    }
}

fn local_of(handle: &Handle) -> Local {
    let snapshot = handle.snapshot();
    Local {
        stage: snapshot.stage,
        failed: snapshot
            .outcome
            .as_ref()
            .is_some_and(|o| o.error().is_some()),
        generation: snapshot.generation,
    }
}

fn build(
    inner: &Arc<Inner>,
    task: &TaskId,
    spec: Option<Vec<u8>>,
    token: FenceToken,
) -> Result<Running, ClusterError> {
    let spec = spec.ok_or_else(|| ClusterError::Factory {
        task: task.clone(),
        reason: "the task has no spec".into(),
    })?;
    let control = inner.control_fencer(token.clone());
    let fencer = inner.fencer(token);
    let request = TaskSpec {
        task: task.clone(),
        spec,
        fencer: fencer.clone(),
    };
    // User code: called with no lock held; a panic is the factory's error.
    let built = catch_unwind(AssertUnwindSafe(|| (inner.factory)(request)));
    let builder = match built {
        Ok(Ok(builder)) => builder,
        Ok(Err(error)) => {
            return Err(ClusterError::Factory {
                task: task.clone(),
                reason: error.to_string(),
            })
        }
        Err(_) => {
            return Err(ClusterError::Factory {
                task: task.clone(),
                reason: "the factory panicked".into(),
            })
        }
    };
    let handle = builder
        .stop_grace(inner.grace)
        .spawn_paused()
        .map_err(|source| ClusterError::Build {
            task: task.clone(),
            source,
        })?;
    let mut events = handle.subscribe();
    let wake = inner.wake.clone();
    let about = task.clone();
    // Bounded by the task: it ends when the task's events end or the slot goes.
    let forwarder = tokio::spawn(async move {
        while events.changed().await.is_ok() {
            if wake.send(about.clone()).is_err() {
                return;
            }
        }
    });
    Ok(Running {
        handle,
        fencer,
        control,
        acted: None,
        yielded: false,
        stopping: None,
        forwarder,
    })
}

/// How many writes may be in flight while the store's revision is moved on.
const ADVANCE_IN_FLIGHT: usize = 32;

/// How long a write that failed waits before it is sent again.
const ADVANCE_BACKOFF: Duration = Duration::from_millis(100);

/// How often a worker that could not move the store's revision on in time says so
/// again while it keeps trying.
const ADVANCE_RETRY: Duration = Duration::from_secs(10);

/// What a worker does once its runs are gone after the store's history was found
/// replaced, before it ends: the store's revision is moved past the highest this
/// worker saw, so that every owner key created from then on (every fence token)
/// is above any token handed out before the restore; it waits until one TTL has
/// passed since the finding, by when every run of the old history anywhere was
/// stopped by its own worker's finding or its lease deadline, so that the
/// application's next join claims nothing that an old run may still hold; then it
/// revokes its lease.
///
/// If the revision cannot be moved on within one TTL and one call deadline (the
/// store unreachable, or far behind), the worker does not end: the application's
/// next join could claim tasks under tokens below ones already handed out. It says
/// so, loudly, every [`ADVANCE_RETRY`], and keeps writing until the store is past
/// the revision, or until [`Worker::shutdown`](super::Worker::shutdown), which ends
/// it with the error logged.
///
/// Bounded: one TTL and one call deadline after the finding when the store
/// answers; otherwise by the shutdown.
async fn after_replaced(
    inner: &Arc<Inner>,
    replaced: Replaced,
    shutdown: &CancellationToken,
) -> ClusterError {
    let until = replaced.at + inner.ttl + inner.op_timeout;
    let target = inner.history.high().max(replaced.seen);
    let mut round_end = until;
    let mut rounds = 0u64;
    // Bounded by the shutdown token; each round by its deadline.
    loop {
        let advanced = inner.control.spawn(advance(
            Arc::clone(&inner.raw_control),
            inner.keys.history(),
            target,
            inner.op_timeout,
            round_end,
        ));
        let advanced = tokio::select! {
            advanced = advanced => advanced,
            _ = shutdown.cancelled() => {
                tracing::error!(
                    worker = %inner.id,
                    target,
                    "shut down before the store's revision was past {target}: fence tokens of \
                     tasks claimed from now on may be lower than ones handed out before the \
                     restore"
                );
                break;
            }
        };
        match advanced {
            Ok(Ok(revision)) => {
                tracing::warn!(
                    worker = %inner.id,
                    target,
                    revision,
                    "the store's revision was moved past the highest seen before it was replaced"
                );
                break;
            }
            Ok(Err(error)) => tracing::error!(
                worker = %inner.id,
                target,
                %error,
                rounds,
                "cannot move the store's revision past {target}: the worker does not end (and \
                 its application cannot join again) until it has, so that no fence token goes \
                 below one handed out before the restore; on etcd 3.5 or later, restore with \
                 --bump-revision"
            ),
            Err(error) => {
                tracing::error!(worker = %inner.id, %error, "moving the revision on failed");
                break;
            }
        }
        rounds += 1;
        round_end = Instant::now().max(until) + ADVANCE_RETRY;
    }
    tokio::time::sleep_until(until).await;
    let _ = within(
        inner.op_timeout,
        "lease revoke",
        inner.raw_control.revoke(inner.lease),
    )
    .await;
    tracing::warn!(worker = %inner.id, "ending after the store's history was replaced; join again");
    replaced.error()
}

/// Writes `key` until the store's revision is above `target` or `until` passes;
/// returns the revision reached. Each transaction moves the revision by one; up to
/// [`ADVANCE_IN_FLIGHT`] are in flight at once.
async fn advance(
    coord: Arc<dyn Coordinator>,
    key: String,
    target: i64,
    op_timeout: Duration,
    until: Instant,
) -> Result<i64, ClusterError> {
    let write = |coord: &Arc<dyn Coordinator>| {
        let coord = Arc::clone(coord);
        let txn = Txn {
            when: vec![],
            then: vec![Op::Put {
                key: key.clone(),
                value: target.to_string().into_bytes(),
                lease: None,
            }],
        };
        async move { within(op_timeout, "advance revision", coord.txn(txn)).await }
    };
    let mut reached = 0;
    let mut writes = JoinSet::new();
    let mut last_error = None;
    // Bounded by `until`, and by the count: every answered write moves the
    // revision by one, and no more writes are sent than the gap left.
    loop {
        if reached > target {
            return Ok(reached);
        }
        let gap = if reached == 0 {
            1
        } else {
            (target - reached + 1) as usize
        };
        while writes.len() < gap.min(ADVANCE_IN_FLIGHT) {
            writes.spawn(write(&coord));
        }
        match tokio::time::timeout_at(until, writes.join_next()).await {
            Ok(Some(Ok(Ok(result)))) => reached = reached.max(result.revision),
            Ok(Some(Ok(Err(error)))) => {
                last_error = Some(error);
                // A store that refuses at once is not written to in a tight loop.
                tokio::time::sleep_until(until.min(Instant::now() + ADVANCE_BACKOFF)).await;
            }
            Ok(Some(Err(error))) => {
                last_error = Some(ClusterError::Store {
                    op: "advance revision",
                    detail: error.to_string(),
                })
            }
            Ok(None) => {}
            Err(_) => {
                return Err(last_error.unwrap_or(ClusterError::Unreachable {
                    op: "advance revision",
                    detail: format!("revision {reached} of {target} reached in time"),
                }))
            }
        }
    }
}
