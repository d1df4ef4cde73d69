//! The worker: joins with a lease, claims tasks, runs them, fences itself.
//!
//! One [`Worker`] is one etcd *session* in the sense of etcd's Go `concurrency`
//! package: one lease, one keep-alive loop, and one clear place where the lease is
//! kept, lost and reported (the [`Session`] half below). The other half is the
//! reconcile loop: it reads the store, asks [`decide`] what to do about each task,
//! and carries the one action out. Every store call has a deadline; no lock is held
//! across an `.await` or across user code (the factory, a unit).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::{Handle, TaskBuilder};
use crate::stage::Stage;

use super::coord::{Coordinator, KeepAlive, KeyValue, Listing, Op, Txn};
use super::decide::{self, decide, Action, Local, Ownership, Report, TaskView};
use super::error::ClusterError;
use super::fence::{within, FenceToken, Fencer};
use super::keys::{
    owner_value, DesiredStage, Keys, ObservedOutcome, ObservedStatus, TaskId, TaskKey, WorkerId,
};

/// The smallest lease TTL a worker accepts.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// What the factory is given to build one task.
#[derive(Debug)]
pub struct TaskSpec {
    /// The task.
    pub task: TaskId,
    /// The spec bytes the controller stored (opaque to the cluster).
    pub spec: Vec<u8>,
    /// Fenced writes with this owner's token, for the units to use.
    pub fencer: Fencer,
}

/// The error a factory returns for a spec it cannot build.
pub type FactoryError = Box<dyn std::error::Error + Send + Sync>;

type Factory = dyn Fn(TaskSpec) -> Result<TaskBuilder, FactoryError> + Send + Sync;

/// Settings of a worker; made by [`Worker::builder`].
pub struct WorkerBuilder {
    coord: Arc<dyn Coordinator>,
    prefix: String,
    id: String,
    ttl: Duration,
    drift: f64,
    stop_bound: Duration,
    capacity: usize,
    resync: Duration,
    op_timeout: Duration,
    unfenced: bool,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("prefix", &self.prefix)
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("drift", &self.drift)
            .field("stop_bound", &self.stop_bound)
            .field("capacity", &self.capacity)
            .field("resync", &self.resync)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// The lease TTL (default 5 s, at least [`MIN_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// ρ, the clock drift allowed between this machine and the store's over one TTL
    /// (default 0.05; at most 0.5).
    pub fn drift(mut self, rho: f64) -> Self {
        self.drift = rho;
        self
    }

    /// The longest a local stop may take: half of it is the grace period a run gets
    /// to return, then it is aborted and waited for the rest (default 1 s).
    pub fn stop_bound(mut self, bound: Duration) -> Self {
        self.stop_bound = bound;
        self
    }

    /// How many tasks the worker holds at most (default 16).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// How often the worker re-reads the store even without a change notification
    /// (default 500 ms): the safety net for a missed watch event.
    pub fn resync(mut self, every: Duration) -> Self {
        self.resync = every;
        self
    }

    /// The deadline of each store call (default 1 s).
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// **Breaks the crate's promise; for tests of the checks only.** The worker
    /// skips self-fencing (it ignores its lease deadline, a lost lease and a key
    /// taken by another worker) and fencing (its writes carry no compare). The
    /// fault tests use it to show that their history checker catches what the
    /// fences prevent.
    #[doc(hidden)]
    pub fn unfenced_for_tests(mut self, unfenced: bool) -> Self {
        self.unfenced = unfenced;
        self
    }

    /// The keep-alive period: a third of the time a lease is trusted for.
    fn keep_alive_every(&self, rho_permille: u64) -> Duration {
        let ttl = self.ttl.as_millis() as u64;
        let trusted = decide::stop_at(0, ttl, rho_permille, self.stop_bound.as_millis() as u64);
        Duration::from_millis(trusted / 3)
    }

    fn check(&self) -> Result<(Keys, WorkerId, u64), ClusterError> {
        let keys = Keys::new(&self.prefix)?;
        let id = WorkerId::new(self.id.clone())?;
        if self.ttl < MIN_TTL {
            return Err(ClusterError::TtlTooShort {
                ttl: self.ttl,
                min: MIN_TTL,
            });
        }
        if !(0.0..=0.5).contains(&self.drift) {
            return Err(ClusterError::InvalidTiming {
                reason: format!("drift ρ = {} is not within [0, 0.5]", self.drift),
            });
        }
        let rho = (self.drift * 1000.0).ceil() as u64;
        let every = self.keep_alive_every(rho);
        // At least three keep-alives, each with its own deadline, fit in the time a
        // lease is trusted for.
        if every < self.op_timeout.min(Duration::from_millis(100)) || self.capacity == 0 {
            return Err(ClusterError::InvalidTiming {
                reason: format!(
                    "TTL {:?}·(1−{}) − stop bound {:?} leaves {:?} between keep-alives; capacity {}",
                    self.ttl, self.drift, self.stop_bound, every, self.capacity
                ),
            });
        }
        Ok((keys, id, rho))
    }

    /// Joins the cluster: grants the lease, registers the worker under it, and starts
    /// the keep-alive and reconcile loops on the current tokio runtime.
    ///
    /// `factory` builds a task from its spec; it is given the owner's [`Fencer`] so
    /// that the units it builds can fence their side effects. The worker sets the
    /// builder's stop grace from its stop bound.
    ///
    /// # Errors
    ///
    /// - [`ClusterError::InvalidWorkerId`], [`ClusterError::InvalidPrefix`],
    ///   [`ClusterError::TtlTooShort`], [`ClusterError::InvalidTiming`] for bad
    ///   settings: nothing was written.
    /// - [`ClusterError::Unreachable`] when the store did not answer: nothing was
    ///   started (a lease granted before the failure is revoked, or expires).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped join may leave a granted lease to expire.
    pub async fn join<F>(self, factory: F) -> Result<Worker, ClusterError>
    where
        F: Fn(TaskSpec) -> Result<TaskBuilder, FactoryError> + Send + Sync + 'static,
    {
        let (keys, id, rho) = self.check()?;
        let op_timeout = self.op_timeout;
        let sent = Instant::now();
        let grant = within(op_timeout, "lease grant", self.coord.grant(self.ttl)).await?;
        // The store may raise the TTL it was asked for; the smaller of the two is
        // the one the deadline may trust either way.
        let ttl = grant.ttl.min(self.ttl);
        let register = Txn {
            when: vec![],
            then: vec![Op::Put {
                key: keys.worker(&id, grant.id),
                value: format!("{:x}", grant.id).into_bytes(),
                lease: Some(grant.id),
            }],
        };
        if let Err(e) = within(op_timeout, "register worker", self.coord.txn(register)).await {
            let _ = within(op_timeout, "lease revoke", self.coord.revoke(grant.id)).await;
            return Err(e);
        }
        let epoch = sent;
        let timing = Timing {
            ttl_ms: ttl.as_millis() as u64,
            rho_permille: rho,
            stop_bound_ms: self.stop_bound.as_millis() as u64,
            keep_alive_every: self.keep_alive_every(rho),
        };
        let first = decide::stop_at(0, timing.ttl_ms, rho, timing.stop_bound_ms);
        // The sender lives in `Inner`, as long as any loop: a receiver's `changed()`
        // then never fails at once (which would turn the reconcile loop's wait
        // into a spin after the session ended).
        let (lease_tx, lease_rx) = watch::channel(LeaseState {
            stop_at: Some(first),
        });
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            coord: self.coord,
            keys,
            id: id.clone(),
            lease: grant.id,
            owner_value: owner_value(&id, grant.id),
            epoch,
            capacity: self.capacity,
            resync: self.resync,
            op_timeout,
            grace: self.stop_bound / 2,
            unfenced: self.unfenced,
            factory: Box::new(factory),
            wake: Arc::new(Notify::new()),
            view: Mutex::new(BTreeMap::new()),
            lease_state: lease_tx,
        });
        let session = tokio::spawn(Session::run(Arc::clone(&inner), timing, shutdown.clone()));
        let guard = (!inner.unfenced).then(|| {
            tokio::spawn(guard(
                Arc::clone(&inner),
                lease_rx.clone(),
                shutdown.clone(),
            ))
        });
        let reconcile = tokio::spawn(reconcile(Arc::clone(&inner), lease_rx, shutdown.clone()));
        tracing::info!(worker = %id, lease = grant.id, ?ttl, "joined");
        Ok(Worker {
            inner,
            guard,
            session: Some(session),
            reconcile: Some(reconcile),
            shutdown,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    ttl_ms: u64,
    rho_permille: u64,
    stop_bound_ms: u64,
    keep_alive_every: Duration,
}

/// The lease as the worker knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeaseState {
    /// When to begin stopping runs (ms since the worker's epoch); `None` once the
    /// store answered that the lease is gone.
    stop_at: Option<u64>,
}

struct Inner {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    id: WorkerId,
    lease: i64,
    owner_value: String,
    epoch: Instant,
    capacity: usize,
    resync: Duration,
    op_timeout: Duration,
    grace: Duration,
    /// Test-only: no self-fencing, no fencing ([`WorkerBuilder::unfenced_for_tests`]).
    unfenced: bool,
    factory: Box<Factory>,
    wake: Arc<Notify>,
    /// What the worker holds, for [`Worker::tasks`]; written by the reconcile loop
    /// only, never held across an await.
    view: Mutex<BTreeMap<TaskId, Held>>,
    /// The lease deadline: written by the session only.
    lease_state: watch::Sender<LeaseState>,
}

#[derive(Clone)]
struct Held {
    token: FenceToken,
    handle: Option<Handle>,
}

impl Inner {
    fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// A fencer for `token`, the only way the worker makes one.
    fn fencer(&self, token: FenceToken) -> Fencer {
        Fencer::new(
            Arc::clone(&self.coord),
            self.keys.clone(),
            token,
            Arc::clone(&self.wake),
            self.op_timeout,
            self.unfenced,
        )
    }

    /// Empties the view and returns the handles of the local runs it held: for an
    /// end of the worker, which stops each of them.
    fn take_handles(&self) -> Vec<Handle> {
        std::mem::take(&mut *self.view())
            .into_values()
            .filter_map(|h| h.handle)
            .collect()
    }

    fn view(&self) -> MutexGuard<'_, BTreeMap<TaskId, Held>> {
        // Only the reconcile loop writes it, with plain inserts and removes: a
        // poisoned lock still holds a consistent map.
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The lease half: one keep-alive loop, the only writer of the lease deadline.
struct Session;

impl Session {
    async fn run(inner: Arc<Inner>, timing: Timing, shutdown: CancellationToken) {
        let lease_tx = &inner.lease_state;
        let mut ticker = tokio::time::interval(timing.keep_alive_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            // Record when the keep-alive was sent, on the monotonic clock: only an
            // answer with TTL > 0 moves the deadline, and it moves it to
            // sent + TTL·(1−ρ) − stop bound (decide::stop_at).
            let sent = inner.now_ms();
            let timeout = inner.op_timeout.min(timing.keep_alive_every);
            match within(timeout, "keep-alive", inner.coord.keep_alive(inner.lease)).await {
                Ok(KeepAlive::Alive { ttl }) => {
                    let ttl_ms = (ttl.as_millis() as u64).min(timing.ttl_ms);
                    let next =
                        decide::stop_at(sent, ttl_ms, timing.rho_permille, timing.stop_bound_ms);
                    lease_tx.send_if_modified(|state| match state.stop_at {
                        Some(current) if next > current => {
                            state.stop_at = Some(next);
                            true
                        }
                        _ => false,
                    });
                }
                Ok(KeepAlive::Expired) => {
                    tracing::warn!(worker = %inner.id, "lease expired");
                    lease_tx.send_replace(LeaseState { stop_at: None });
                    inner.wake.notify_one();
                    return;
                }
                Err(error) => {
                    // The deadline stays where the last answer put it.
                    tracing::debug!(worker = %inner.id, %error, "keep-alive failed");
                }
            }
        }
    }
}

/// A member of the cluster that claims and runs tasks.
///
/// Made by [`Worker::builder`] → [`WorkerBuilder::join`]. Dropping a worker is a
/// crash without the wait: it aborts every local run at once (a run can never
/// outlive the loop that guards its lease, whatever a caller holds of it), then its
/// loops, and leaves the lease for the store to expire after its TTL, so other
/// workers take the tasks over only then. Use [`Worker::shutdown`] for a clean exit
/// that lets others take over at once.
pub struct Worker {
    inner: Arc<Inner>,
    guard: Option<JoinHandle<()>>,
    session: Option<JoinHandle<()>>,
    reconcile: Option<JoinHandle<Result<(), ClusterError>>>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.inner.id)
            .field("lease", &self.inner.lease)
            .field("tasks", &self.tasks())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Settings for a worker with id `id`, on `coordinator`, under `prefix`.
    pub fn builder(
        coordinator: impl Coordinator,
        prefix: impl Into<String>,
        id: impl Into<String>,
    ) -> WorkerBuilder {
        WorkerBuilder {
            coord: Arc::new(coordinator),
            prefix: prefix.into(),
            id: id.into(),
            ttl: Duration::from_secs(5),
            drift: 0.05,
            stop_bound: Duration::from_secs(1),
            capacity: 16,
            resync: Duration::from_millis(500),
            op_timeout: Duration::from_secs(1),
            unfenced: false,
        }
    }

    /// The worker's id.
    pub fn id(&self) -> &WorkerId {
        &self.inner.id
    }

    /// The worker's lease id.
    pub fn lease(&self) -> i64 {
        self.inner.lease
    }

    /// The tasks the worker owns now.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.inner.view().keys().cloned().collect()
    }

    /// The fence token the worker holds for `task`, if it owns it.
    pub fn token(&self, task: &TaskId) -> Option<FenceToken> {
        self.inner.view().get(task).map(|h| h.token.clone())
    }

    /// A read-only view of `task`'s local run, if the worker runs it: its stage,
    /// snapshot, events and waits. Commands go through the
    /// [`Controller`](super::Controller): a local pause behind its back would make
    /// the cluster's desired and observed stages disagree.
    pub fn observer(&self, task: &TaskId) -> Option<crate::runtime::TaskObserver> {
        self.inner
            .view()
            .get(task)
            .and_then(|h| h.handle.as_ref().map(Handle::observer))
    }

    /// When the worker will begin stopping its runs unless a keep-alive is answered;
    /// `None` once the lease is gone.
    pub fn stop_deadline(&self) -> Option<Instant> {
        let state = *self.inner.lease_state.borrow();
        state.stop_at.map(|ms| self.inner.at(ms))
    }

    /// Whether the worker's loop has ended (lease lost, or shut down).
    pub fn is_finished(&self) -> bool {
        self.reconcile.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Shuts the worker down cleanly: stops every local run (escalating to abort
    /// within the stop bound), withdraws its owner keys and observed reports through
    /// fenced writes, and revokes the lease, so that other workers take the tasks
    /// over at once.
    ///
    /// # Errors
    ///
    /// [`ClusterError::LeaseLost`] when the lease had already been lost (the runs
    /// were stopped then); [`ClusterError::Unreachable`] when the revoke did not
    /// reach the store (the lease then expires after its TTL).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped midway, the lease is left to expire.
    pub async fn shutdown(mut self) -> Result<(), ClusterError> {
        self.shutdown.cancel();
        let result = match self.reconcile.take() {
            Some(task) => task.await.unwrap_or_else(|e| {
                Err(ClusterError::Store {
                    op: "shutdown",
                    detail: e.to_string(),
                })
            }),
            None => Ok(()),
        };
        if let Some(session) = self.session.take() {
            let _ = session.await;
        }
        if let Some(guard) = self.guard.take() {
            let _ = guard.await;
        }
        let revoked = within(
            self.inner.op_timeout,
            "lease revoke",
            self.inner.coord.revoke(self.inner.lease),
        )
        .await;
        tracing::info!(worker = %self.inner.id, "shut down");
        result.and(revoked)
    }

    /// Waits until the worker's loop ends by itself: it returns
    /// [`ClusterError::LeaseLost`] once the lease is gone and every run stopped.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn closed(&mut self) -> Result<(), ClusterError> {
        match self.reconcile.as_mut() {
            Some(task) => {
                let result = task.await.unwrap_or_else(|e| {
                    Err(ClusterError::Store {
                        op: "worker loop",
                        detail: e.to_string(),
                    })
                });
                self.reconcile = None;
                result
            }
            None => Err(ClusterError::ShutDown {
                worker: self.inner.id.clone(),
            }),
        }
    }

    /// Ends the worker as a crash would: its loops are aborted and its runs aborted
    /// at once; the lease is *not* revoked, so the store expires it after its TTL.
    /// For tests and drills.
    pub async fn crash(mut self) {
        if let Some(task) = self.guard.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(task) = self.reconcile.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(task) = self.session.take() {
            task.abort();
            let _ = task.await;
        }
        let handles = self.inner.take_handles();
        for handle in handles {
            // A zero grace aborts the run at once; the error only says it is gone
            // a moment later.
            let _ = handle.stop_within(Duration::ZERO).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The lease guard goes with the worker, so every run stops first: aborted at
        // once (nobody is left to wait for a graceful stop), whatever a caller holds
        // of it. A run the reconcile loop starts while this drop runs is stopped when
        // the aborted loop's future is dropped, within the task's stop grace (half
        // the stop bound), still inside the lease's deadline.
        self.shutdown.cancel();
        for handle in self.inner.take_handles() {
            handle.stop_aborting();
        }
        if let Some(task) = self.guard.take() {
            task.abort();
        }
        if let Some(task) = self.reconcile.take() {
            task.abort();
        }
        if let Some(task) = self.session.take() {
            task.abort();
        }
    }
}

/// One task the reconcile loop holds.
struct Slot {
    token: FenceToken,
    task: Option<Running>,
}

struct Running {
    handle: Handle,
    fencer: Fencer,
    acted: Option<i64>,
    stopping: Option<JoinHandle<()>>,
    forwarder: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// The keys of one task, from one listing.
#[derive(Default)]
struct Record {
    spec: Option<Vec<u8>>,
    desired: Option<KeyValue>,
    owner: Option<KeyValue>,
    observed: Option<KeyValue>,
}

fn group(keys: &Keys, listing: &Listing) -> BTreeMap<TaskId, Record> {
    let mut records: BTreeMap<TaskId, Record> = BTreeMap::new();
    for kv in &listing.kvs {
        let Some((task, kind)) = keys.parse_task_key(&kv.key) else {
            continue;
        };
        let record = records.entry(task).or_default();
        match kind {
            TaskKey::Spec => record.spec = Some(kv.value.clone()),
            TaskKey::Desired => record.desired = Some(kv.clone()),
            TaskKey::Owner => record.owner = Some(kv.clone()),
            TaskKey::Observed => record.observed = Some(kv.clone()),
            TaskKey::Checkpoint => {}
        }
    }
    records
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

async fn reconcile(
    inner: Arc<Inner>,
    mut lease_rx: watch::Receiver<LeaseState>,
    shutdown: CancellationToken,
) -> Result<(), ClusterError> {
    let mut slots: BTreeMap<TaskId, Slot> = BTreeMap::new();
    // Tasks whose factory failed, with the desired revision it failed for.
    let mut unbuildable: HashMap<TaskId, i64> = HashMap::new();
    let tasks_prefix = inner.keys.tasks();
    loop {
        if shutdown.is_cancelled() {
            wind_down(&inner, &mut slots).await;
            return Ok(());
        }
        let mut lease = lease_now(&inner, &mut lease_rx);
        let listing = within(
            inner.op_timeout,
            "list tasks",
            inner.coord.list(tasks_prefix.clone()),
        )
        .await;
        let (revision, records) = match &listing {
            Ok(listing) => (listing.revision, Some(group(&inner.keys, listing))),
            Err(error) => {
                tracing::debug!(worker = %inner.id, %error, "could not read the tasks");
                (0, None)
            }
        };
        let ids: BTreeSet<TaskId> = records
            .iter()
            .flat_map(|r| r.keys().cloned())
            .chain(slots.keys().cloned())
            .collect();
        for task in ids {
            // Read again for every task: the listing may have taken a store call's
            // deadline, and a lease lost meanwhile must reach the next decision.
            lease = lease_now(&inner, &mut lease_rx);
            let record = records.as_ref().and_then(|r| r.get(&task));
            step(
                &inner,
                &mut slots,
                &mut unbuildable,
                &task,
                record,
                records.is_some(),
                lease,
            )
            .await;
            // At once, not after the pass: the guard stops what this view holds.
            publish_view(&inner, &slots);
        }
        publish_view(&inner, &slots);
        if lease.stop_at.is_none() && slots.values().all(|s| s.task.is_none()) {
            tracing::warn!(worker = %inner.id, "lease lost; every run stopped");
            return Err(ClusterError::LeaseLost {
                worker: inner.id.clone(),
            });
        }
        let deadline = lease
            .stop_at
            .filter(|_| !inner.unfenced)
            .map(|ms| inner.at(ms))
            .filter(|at| *at > Instant::now());
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = inner.wake.notified() => {}
            _ = lease_rx.changed() => {}
            _ = inner.coord.wait_change(tasks_prefix.clone(), revision, inner.resync) => {}
            _ = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// The lease deadline's own enforcer, beside the reconcile loop.
///
/// Stops `handle`'s task in the background, escalating to abort after the grace (the
/// stop bound's first half), and wakes the reconcile loop when it is done.
fn spawn_stop(inner: &Inner, handle: Handle) -> JoinHandle<()> {
    let (grace, wake) = (inner.grace, Arc::clone(&inner.wake));
    tokio::spawn(async move {
        let _ = handle.stop_within(grace).await;
        wake.notify_one();
    })
}

/// The lease state the reconcile loop decides with now.
fn lease_now(inner: &Inner, lease_rx: &mut watch::Receiver<LeaseState>) -> LeaseState {
    let lease = *lease_rx.borrow_and_update();
    if inner.unfenced {
        // Test-only: a lease that never ends, whatever the store says.
        LeaseState {
            stop_at: Some(u64::MAX),
        }
    } else {
        lease
    }
}

/// The reconcile loop decides the fence at the deadline (decide, invariant 2), but
/// only once it gets there: a store call that started just before the deadline can
/// hold it for a whole call deadline past it (the fault tests caught a worker cut off
/// from etcd still running its task when another worker had started it). This task
/// waits for nothing but the clock and the lease state: from `stop_at` on, it stops
/// every local task that `decide` would fence and that is not stopping yet (New and
/// Paused included, so that a resume issued just after the deadline is refused;
/// escalating to abort after the grace), again
/// every resync until the lease is extended or the worker ends. The handles come
/// from the view the reconcile loop publishes after each step.
async fn guard(
    inner: Arc<Inner>,
    mut lease_rx: watch::Receiver<LeaseState>,
    shutdown: CancellationToken,
) {
    // Bounded by the worker's life: it ends with the shutdown token, or is aborted.
    loop {
        let lease = *lease_rx.borrow_and_update();
        if let Some(ms) = lease
            .stop_at
            .filter(|ms| decide::lease_allows(inner.now_ms(), Some(*ms)))
        {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = lease_rx.changed() => {}
                _ = tokio::time::sleep_until(inner.at(ms)) => {}
            }
            continue;
        }
        let handles: Vec<Handle> = inner
            .view()
            .values()
            .filter_map(|held| held.handle.clone())
            // The tasks decide fences (invariant 2), but for those already stopping.
            .filter(|handle| {
                let stage = handle.stage();
                decide::must_fence(stage) && stage != Stage::Stopping
            })
            .collect();
        for handle in handles {
            tracing::info!(worker = %inner.id, task = handle.name(), "lease deadline: stopping the local run");
            drop(spawn_stop(&inner, handle));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lease_rx.changed() => {}
            _ = tokio::time::sleep(inner.resync) => {}
        }
    }
}

fn publish_view(inner: &Inner, slots: &BTreeMap<TaskId, Slot>) {
    let view: BTreeMap<TaskId, Held> = slots
        .iter()
        .map(|(id, slot)| {
            (
                id.clone(),
                Held {
                    token: slot.token.clone(),
                    handle: slot.task.as_ref().map(|t| t.handle.clone()),
                },
            )
        })
        .collect();
    *inner.view() = view;
}

/// One decision about one task, and carrying it out.
async fn step(
    inner: &Arc<Inner>,
    slots: &mut BTreeMap<TaskId, Slot>,
    unbuildable: &mut HashMap<TaskId, i64>,
    task: &TaskId,
    record: Option<&Record>,
    read_ok: bool,
    lease: LeaseState,
) {
    let slot_rev = slots.get(task).map(|s| s.token.revision);
    let desired = record
        .and_then(|r| r.desired.as_ref())
        .and_then(parse_desired);
    // Ownership from the listing; without a listing, what this worker knew.
    let ownership = match (read_ok, record.and_then(|r| r.owner.as_ref())) {
        // Test-only: a task once held stays "mine", whoever holds the key now.
        _ if inner.unfenced && slot_rev.is_some() => Ownership::Mine,
        (true, None) => Ownership::Unowned,
        (true, Some(kv)) if kv.value == inner.owner_value.as_bytes() => match slot_rev {
            Some(rev) if rev != kv.create_revision => Ownership::Other,
            _ => Ownership::Mine,
        },
        (true, Some(_)) => Ownership::Other,
        (false, _) if slot_rev.is_some() => Ownership::Mine,
        (false, _) => Ownership::Other,
    };
    let observed = record
        .and_then(|r| r.observed.as_ref())
        .and_then(|kv| ObservedStatus::decode(&kv.key, &kv.value).ok());
    let settled = match (&observed, desired) {
        (Some(o), Some((stage, rev))) => {
            o.stage.is_terminal()
                && o.desired_revision == rev
                && stage.answered_by(o.stage, o.outcome.is_failed())
        }
        _ => false,
    };
    let token_rev = match (slot_rev, record.and_then(|r| r.owner.as_ref())) {
        (Some(rev), _) => Some(rev),
        (None, Some(kv)) if ownership == Ownership::Mine => Some(kv.create_revision),
        _ => None,
    };
    let published = observed.as_ref().and_then(|o| {
        (o.owner == inner.id && Some(o.owner_revision) == token_rev).then_some(Report {
            stage: o.stage,
            failed: o.outcome.is_failed(),
            generation: o.generation,
            desired_revision: o.desired_revision,
        })
    });
    let held = slots.len();
    let running_ref = slots.get(task).and_then(|s| s.task.as_ref());
    let view = TaskView {
        desired: if read_ok { desired } else { None },
        ownership,
        settled,
        local: running_ref.map(|r| local_of(&r.handle)),
        acted: running_ref.and_then(|r| r.acted),
        published,
        now: inner.now_ms(),
        stop_at: lease.stop_at,
        fence_rejected: running_ref.is_some_and(|r| r.fencer.is_rejected()),
        stopping: running_ref.is_some_and(|r| r.stopping.is_some()),
        capacity_left: held < inner.capacity,
    };
    let Some(action) = decide(&view) else {
        // A slot whose key is gone and that runs nothing is forgotten.
        if view.local.is_none() && ownership != Ownership::Mine {
            slots.remove(task);
        }
        return;
    };
    tracing::debug!(worker = %inner.id, %task, ?action, "decided");
    match action {
        Action::Claim => {
            if desired.is_some_and(|(_, rev)| unbuildable.get(task) == Some(&rev)) {
                return;
            }
            claim(inner, slots, task).await;
        }
        Action::Build => {
            let token = match slots.get(task) {
                Some(slot) => slot.token.clone(),
                None => match record.and_then(|r| r.owner.as_ref()) {
                    // Our value under our lease: a claim whose answer was lost.
                    Some(kv) => FenceToken {
                        task: task.clone(),
                        worker: inner.id.clone(),
                        lease: inner.lease,
                        revision: kv.create_revision,
                    },
                    None => return,
                },
            };
            let spec = record.and_then(|r| r.spec.clone());
            match build(inner, task, spec, token.clone()) {
                Ok(running) => {
                    slots.insert(
                        task.clone(),
                        Slot {
                            token,
                            task: Some(running),
                        },
                    );
                }
                Err(error) => {
                    tracing::warn!(worker = %inner.id, %task, %error, "cannot build; releasing");
                    if let Some((_, rev)) = desired {
                        unbuildable.insert(task.clone(), rev);
                    }
                    let fencer = inner.fencer(token);
                    let _ = fencer
                        .fenced(vec![Op::Delete {
                            key: inner.keys.owner(task),
                        }])
                        .await;
                    slots.remove(task);
                }
            }
        }
        Action::Resume { revision } => {
            if let Some(running) = slots.get_mut(task).and_then(|s| s.task.as_mut()) {
                running.acted = Some(revision);
                if let Err(error) = running.handle.resume().await {
                    tracing::debug!(worker = %inner.id, %task, %error, "resume refused");
                }
            }
        }
        Action::Pause { revision } => {
            if let Some(running) = slots.get_mut(task).and_then(|s| s.task.as_mut()) {
                running.acted = Some(revision);
                // Issues the pause and returns at once; the stage says when the run
                // has returned, and its change wakes this loop.
                let _ = running.handle.pause_within(Duration::ZERO).await;
            }
        }
        Action::Stop | Action::Fence => {
            if let Some(running) = slots.get_mut(task).and_then(|s| s.task.as_mut()) {
                let why = if action == Action::Fence {
                    "fence"
                } else {
                    "stop"
                };
                tracing::info!(worker = %inner.id, %task, why, "stopping the local run");
                running.stopping = Some(spawn_stop(inner, running.handle.clone()));
            }
        }
        Action::Drop => {
            // Only ever decided when the worker may not run the task (decide,
            // invariant 2): forget it; if the key is still ours, a later step
            // rebuilds it with a valid lease.
            slots.remove(task);
        }
        Action::Publish(report) => {
            let Some(slot) = slots.get(task) else { return };
            let Some(running) = slot.task.as_ref() else {
                return;
            };
            let snapshot = running.handle.snapshot();
            let status = ObservedStatus {
                stage: report.stage,
                generation: report.generation,
                outcome: ObservedOutcome::from_outcome(snapshot.outcome.as_ref()),
                desired_revision: report.desired_revision,
                owner: inner.id.clone(),
                owner_revision: slot.token.revision,
            };
            let ops = vec![Op::Put {
                key: inner.keys.observed(task),
                value: status.encode(),
                lease: None,
            }];
            if let Err(error) = running.fencer.fenced(ops).await {
                tracing::debug!(worker = %inner.id, %task, %error, "publish failed");
            }
        }
        Action::Release => {
            let Some(slot) = slots.get(task) else { return };
            let Some(running) = slot.task.as_ref() else {
                return;
            };
            let ops = vec![Op::Delete {
                key: inner.keys.owner(task),
            }];
            if running.fencer.fenced(ops).await.is_ok() {
                tracing::info!(worker = %inner.id, %task, "released a finished task");
                slots.remove(task);
            }
        }
    }
}

async fn claim(inner: &Arc<Inner>, slots: &mut BTreeMap<TaskId, Slot>, task: &TaskId) {
    let owner = inner.keys.owner(task);
    let txn = Txn {
        when: vec![super::coord::Compare::Absent(owner.clone())],
        then: vec![Op::Put {
            key: owner,
            value: inner.owner_value.clone().into_bytes(),
            lease: Some(inner.lease),
        }],
    };
    match within(inner.op_timeout, "claim", inner.coord.txn(txn)).await {
        Ok(result) if result.succeeded => {
            tracing::info!(worker = %inner.id, %task, revision = result.revision, "claimed");
            slots.insert(
                task.clone(),
                Slot {
                    token: FenceToken {
                        task: task.clone(),
                        worker: inner.id.clone(),
                        lease: inner.lease,
                        revision: result.revision,
                    },
                    task: None,
                },
            );
        }
        Ok(_) => {} // someone else was first
        Err(error) => tracing::debug!(worker = %inner.id, %task, %error, "claim failed"),
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
    let wake = Arc::clone(&inner.wake);
    let forwarder = tokio::spawn(async move {
        while events.changed().await.is_ok() {
            wake.notify_one();
        }
    });
    Ok(Running {
        handle,
        fencer,
        acted: None,
        stopping: None,
        forwarder,
    })
}

/// Shutdown: stop every local run, withdraw owner keys and reports (fenced).
async fn wind_down(inner: &Arc<Inner>, slots: &mut BTreeMap<TaskId, Slot>) {
    let mut stops = Vec::new();
    for (task, slot) in slots.iter() {
        if let Some(running) = &slot.task {
            let handle = running.handle.clone();
            let grace = inner.grace;
            let task = task.clone();
            stops.push(tokio::spawn(async move {
                if let Err(error) = handle.stop_within(grace).await {
                    tracing::warn!(%task, %error, "stop at shutdown timed out");
                }
            }));
        }
    }
    for stop in stops {
        let _ = stop.await;
    }
    for (task, slot) in std::mem::take(slots) {
        let stage = slot.task.as_ref().map(|r| r.handle.stage());
        // A run that could not be stopped keeps the key until the lease expires.
        if stage.is_some_and(Stage::run_may_be_alive) {
            continue;
        }
        let fencer = inner.fencer(slot.token);
        let _ = fencer
            .fenced(vec![
                Op::Delete {
                    key: inner.keys.observed(&task),
                },
                Op::Delete {
                    key: inner.keys.owner(&task),
                },
            ])
            .await;
    }
    publish_view(inner, slots);
}
