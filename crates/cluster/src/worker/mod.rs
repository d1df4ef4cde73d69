//! The worker: joins with a lease, claims its share of the tasks, runs them,
//! fences itself.
//!
//! A worker is six parts, each a file that owns one thing:
//!
//! - [`session`]: the lease and the keep-alive loop, the only writer of the
//!   lease deadlines;
//! - [`guard`]: the deadlines' enforcer, which stops every local run once the
//!   lease no longer allows runs, and answers a run not gone by the last instant
//!   the lease allows with the [`OverrunPolicy`], whatever else is happening;
//! - [`keeper`]: where those two run: a thread of the worker's own by default
//!   ([`LeaseKeeping`]);
//! - [`view`]: what the worker knows of the store, a cache fed by one list and a
//!   watch per prefix;
//! - [`queue`]: which task is decided about next, each at most once at a time, up
//!   to `max_in_flight` store actions at once;
//! - [`handover`]: fair shares, and which tasks to hand over;
//!
//! and the [`reconcile`] loop that ties them together through the two pure
//! functions [`gather`](super::decide::gather) and
//! [`decide`](super::decide::decide). Every store call has a deadline; no
//! lock is held across an `.await` or across user code (the factory, a unit).

mod guard;
mod handover;
mod keeper;
mod queue;
mod reconcile;
mod session;
mod view;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use taskstage::runtime::{Handle, TaskBuilder};

use self::keeper::Keeper;
use self::session::{LeaseState, Session, Timing};
use super::coord::Coordinator;
use super::decide;
use super::error::ClusterError;
use super::fence::{within, FenceToken, Fencer, Wake};
use super::history::{Checked, History};
use super::keys::{owner_value, Keys, TaskId, WorkerId};

/// The smallest lease TTL a worker accepts.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The exit status of a process that [`OverrunPolicy::ExitProcess`] ended: 75
/// (`EX_TEMPFAIL` in BSD's `sysexits.h`, "try again later"). A supervisor that
/// restarts the process on it gets a fresh worker that joins with a new lease.
pub const OVERRUN_EXIT_CODE: i32 = 75;

/// Where a worker keeps its lease and enforces its deadlines; set by
/// [`WorkerBuilder::lease_keeping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseKeeping {
    /// On a thread of the worker's own, with a small runtime and a connection to
    /// the store of its own ([`Coordinator::fresh_connection`]): units that keep
    /// every thread of the application's runtime busy delay neither a keep-alive
    /// nor a deadline, as long as the OS schedules that one thread. The default.
    #[default]
    OwnThread,
    /// On the runtime that calls [`WorkerBuilder::join`], beside the units: for
    /// tests under tokio's paused clock, which only that runtime sees (the
    /// in-memory store measures its leases on it). **Gives up** the lease's
    /// independence from the application's load: a runtime the units keep busy
    /// delays keep-alives (the lease can be lost while the process is alive) and
    /// the guard (the overrun policy then acts late, or not before the lease may
    /// have expired).
    SharedRuntime,
}

/// What a worker does when a run of its own is not confirmed gone at the last
/// instant its lease allows; set by [`WorkerBuilder::on_overrun`].
///
/// That instant is when the last answered keep-alive was sent, plus TTL·(1−ρ),
/// less the [overrun margin](WorkerBuilder::overrun_margin).
///
/// By then the run had its stop, its grace and its abort; what is left is a run
/// whose future cannot be dropped, because the thread polling it does not return
/// (a unit that blocks) or the runtime holding it does not get to it. Past that
/// instant the store may expire the lease, and another worker start the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OverrunPolicy {
    /// Logs the tasks concerned (through `tracing` and on stderr) and ends the
    /// process with [`OVERRUN_EXIT_CODE`]: the kernel ends every run with it. The
    /// default, and the only choice that keeps "at most one live run" for effects
    /// that carry no fence token.
    #[default]
    ExitProcess,
    /// Logs the tasks concerned (through `tracing`) and goes on. **Gives up** the
    /// promise for unfenced effects: the run may outlive the lease, and what it
    /// does without a fence token may be done twice once another worker runs the
    /// task. Fenced writes stay safe (the store rejects them). Choose it only
    /// where every effect of the units is fenced, or where ending the process is
    /// worse than a duplicate.
    LogOnly,
}

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
    max_in_flight: usize,
    resync: Duration,
    op_timeout: Duration,
    lease_keeping: LeaseKeeping,
    overrun: OverrunPolicy,
    overrun_margin: Option<Duration>,
    stall_bound: Duration,
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
            .field("max_in_flight", &self.max_in_flight)
            .field("resync", &self.resync)
            .field("lease_keeping", &self.lease_keeping)
            .field("overrun", &self.overrun)
            .field("overrun_margin", &self.margin())
            .field("stall_bound", &self.stall_bound)
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

    /// How many store actions (claims, reports, releases) the worker has in flight
    /// at most, across its tasks (default 64); one task's actions are always one
    /// at a time and in order.
    pub fn max_in_flight(mut self, actions: usize) -> Self {
        self.max_in_flight = actions;
        self
    }

    /// How often the worker decides again about every task it knows, from its
    /// cache and without reading the store (default 5 s): the safety net for a
    /// missed local wake-up. A lost watch is noticed by the watch itself and
    /// answered by a new listing.
    pub fn resync(mut self, every: Duration) -> Self {
        self.resync = every;
        self
    }

    /// The deadline of each store call (default 1 s).
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Where the lease is kept and its deadlines enforced (default
    /// [`LeaseKeeping::OwnThread`]).
    pub fn lease_keeping(mut self, keeping: LeaseKeeping) -> Self {
        self.lease_keeping = keeping;
        self
    }

    /// What the worker does when a run of its own is not confirmed gone at the
    /// last instant its lease allows (default [`OverrunPolicy::ExitProcess`]).
    pub fn on_overrun(mut self, policy: OverrunPolicy) -> Self {
        self.overrun = policy;
        self
    }

    /// How long before the store may expire the lease every run must be confirmed
    /// gone (default a quarter of the stop bound). It must be less than the stop
    /// bound, so that a stop has had its whole time before the overrun policy acts.
    /// A larger margin absorbs longer scheduling delays of the lease thread (a
    /// process stopped or starved for that long still ends before the lease may
    /// expire) at the price of less time for a stop.
    pub fn overrun_margin(mut self, margin: Duration) -> Self {
        self.overrun_margin = Some(margin);
        self
    }

    /// How long the reconcile loop may go without turning before the worker gives
    /// its lease up (default 10 s, at least twice the [store call
    /// deadline](WorkerBuilder::op_timeout)).
    ///
    /// The loop turns on every change it learns of and, when there is none, at
    /// least every quarter of the bound. A loop that has not turned for the bound
    /// is stalled: the units (or the factory) hold every thread of the
    /// application's runtime, or the loop waits on something that never comes. Its
    /// worker answers no command and moves no task, though its lease, kept on a
    /// thread of its own, would live on. So the keep-alives stop: from then on the
    /// lease is treated as lost (every run is stopped), and a run not confirmed
    /// gone at the last instant the lease allows meets the [`OverrunPolicy`] (by
    /// default the process ends). The store expires the lease one TTL after the
    /// last keep-alive; other workers then take the tasks over. A worker whose
    /// loop stalls gives its tasks up within the bound, a keep-alive period and
    /// the TTL.
    ///
    /// A factory or a unit that holds a runtime thread for longer than the bound,
    /// while every other thread of the runtime is held too, makes its worker give
    /// its lease up: choose a bound above the longest such hold.
    pub fn stall_bound(mut self, bound: Duration) -> Self {
        self.stall_bound = bound;
        self
    }

    fn margin(&self) -> Duration {
        self.overrun_margin.unwrap_or(self.stop_bound / 4)
    }

    /// The keep-alive period: a third of the time a lease is trusted for.
    fn keep_alive_every(&self, rho_permille: u64) -> Duration {
        let ttl = self.ttl.as_millis() as u64;
        let trusted = decide::stop_at(0, ttl, rho_permille, self.stop_bound.as_millis() as u64);
        Duration::from_millis(trusted / 3)
    }

    /// The lease's timing, in milliseconds of the worker's clock, for a granted
    /// `ttl` and a drift of `rho` parts per thousand.
    fn timing(&self, ttl: Duration, rho: u64) -> Timing {
        Timing {
            ttl_ms: ttl.as_millis() as u64,
            rho_permille: rho,
            stop_bound_ms: self.stop_bound.as_millis() as u64,
            margin_ms: self.margin().as_millis() as u64,
            keep_alive_every: self.keep_alive_every(rho),
            stall_bound_ms: u64::try_from(self.stall_bound.as_millis()).unwrap_or(u64::MAX),
        }
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
        if self.margin() >= self.stop_bound {
            return Err(ClusterError::InvalidTiming {
                reason: format!(
                    "overrun margin {:?} is not less than the stop bound {:?}: the overrun \
                     policy would act before a stop had its time",
                    self.margin(),
                    self.stop_bound
                ),
            });
        }
        if self.stall_bound < 2 * self.op_timeout {
            return Err(ClusterError::InvalidTiming {
                reason: format!(
                    "stall bound {:?} is less than twice the store call deadline {:?}: a \
                     loop waiting on one store call would count as stalled",
                    self.stall_bound, self.op_timeout
                ),
            });
        }
        let every = self.keep_alive_every(rho);
        // At least three keep-alives, each with its own deadline, fit in the time a
        // lease is trusted for.
        if every < self.op_timeout.min(Duration::from_millis(100))
            || self.capacity == 0
            || self.max_in_flight == 0
            || self.resync.is_zero()
        {
            return Err(ClusterError::InvalidTiming {
                reason: format!(
                    "TTL {:?}·(1−{}) − stop bound {:?} leaves {:?} between keep-alives; \
                     capacity {}, actions in flight {}, resync {:?}",
                    self.ttl,
                    self.drift,
                    self.stop_bound,
                    every,
                    self.capacity,
                    self.max_in_flight,
                    self.resync
                ),
            });
        }
        Ok((keys, id, rho))
    }

    /// Joins the cluster: grants the lease, and starts the keep-alive loop and the
    /// deadline guard where [`LeaseKeeping`] says (a thread of their own by
    /// default), and the reconcile loop on the current tokio runtime, where the
    /// tasks run. The worker registers as a member under its lease once it has
    /// listed the tasks and the members: from then on it counts in the fair shares
    /// ([`Controller::workers`](super::Controller::workers) lists it). A worker
    /// that cannot list (a store too far, or too large a listing) is counted
    /// nowhere, so no other worker hands it tasks it would never run.
    ///
    /// `factory` builds a task from its spec; it is given the owner's [`Fencer`] so
    /// that the units it builds can fence their side effects. The worker sets the
    /// builder's stop grace from its stop bound.
    ///
    /// # Errors
    ///
    /// - [`ClusterError::InvalidWorkerId`], [`ClusterError::InvalidPrefix`],
    ///   [`ClusterError::TtlTooShort`], [`ClusterError::InvalidTiming`] for bad
    ///   settings (an overrun margin not less than the stop bound among them):
    ///   nothing was written.
    /// - [`ClusterError::Unreachable`] when the store did not answer: nothing was
    ///   started (a lease granted before the failure is revoked, or expires).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped join may leave a granted lease to expire.
    pub async fn join<F>(mut self, factory: F) -> Result<Worker, ClusterError>
    where
        F: Fn(TaskSpec) -> Result<TaskBuilder, FactoryError> + Send + Sync + 'static,
    {
        let (keys, id, rho) = self.check()?;
        let op_timeout = self.op_timeout;
        // Every answer this worker gets is checked against the highest revision it
        // has seen: a store whose revision went back had its history replaced.
        let history = History::new(true);
        let raw = self.coord;
        let checked: Arc<dyn Coordinator> =
            Arc::new(Checked::new(Arc::clone(&raw), Arc::clone(&history)));
        self.coord = checked;
        let sent = Instant::now();
        let grant = within(op_timeout, "lease grant", self.coord.grant(self.ttl)).await?;
        // The store may raise the TTL it was asked for; the smaller of the two is
        // the one the deadline may trust either way.
        let ttl = grant.ttl.min(self.ttl);
        // The worker registers as a member (and so counts in every worker's fair
        // share) only once it has listed the tasks and the members: a worker that
        // cannot list would be handed tasks it never runs (`reconcile/`).
        let epoch = sent;
        let timing = self.timing(ttl, rho);
        let first = decide::stop_at(0, timing.ttl_ms, rho, timing.stop_bound_ms);
        let exit_at = decide::exit_at(0, timing.ttl_ms, rho, timing.margin_ms);
        // The sender lives in `Inner`, as long as any loop: a receiver's `changed()`
        // then never fails at once (which would turn the reconcile loop's wait
        // into a spin after the session ended).
        let (lease_tx, lease_rx) = watch::channel(LeaseState {
            stop_at: Some(first),
            exit_at,
        });
        let shutdown = CancellationToken::new();
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let prepared = match keeper::Prepared::new(self.lease_keeping) {
            Ok(prepared) => prepared,
            Err(error) => return Err(revoke_for(&*self.coord, grant.id, op_timeout, error).await),
        };
        let raw_control = keeper::lease_coordinator(self.lease_keeping, &raw);
        let control_coord: Arc<dyn Coordinator> =
            Arc::new(Checked::new(Arc::clone(&raw_control), Arc::clone(&history)));
        let inner = Arc::new(Inner {
            control: prepared.handle.clone(),
            control_coord: Arc::clone(&control_coord),
            raw_control,
            history: Arc::clone(&history),
            ttl,
            coord: self.coord,
            keys,
            id: id.clone(),
            lease: grant.id,
            owner_value: owner_value(&id, grant.id),
            epoch,
            capacity: self.capacity,
            max_in_flight: self.max_in_flight,
            resync: self.resync,
            op_timeout,
            grace: self.stop_bound / 2,
            overrun: self.overrun,
            factory: Box::new(factory),
            wake,
            view: Mutex::new(BTreeMap::new()),
            lease_state: lease_tx,
            draining: AtomicBool::new(false),
            turned: AtomicU64::new(0),
            stall_bound: self.stall_bound,
        });
        stop_on_a_replaced_history(&inner, &history);
        let keeper = start_keeper(
            &inner,
            prepared,
            control_coord,
            timing,
            &lease_rx,
            &shutdown,
        );
        let keeper = match keeper {
            Ok(keeper) => keeper,
            Err(error) => return Err(revoke_for(&*inner.coord, grant.id, op_timeout, error).await),
        };
        let reconcile = tokio::spawn(reconcile::reconcile(
            Arc::clone(&inner),
            lease_rx,
            shutdown.clone(),
            wake_rx,
        ));
        tracing::info!(worker = %id, lease = grant.id, ?ttl, "joined");
        Ok(Worker {
            inner,
            keeper: Some(keeper),
            reconcile: Some(reconcile),
            shutdown,
        })
    }
}

/// Revokes a lease granted to a join that then failed with `error`, and returns
/// `error` (a revoke that fails leaves the lease to expire).
async fn revoke_for(
    coord: &dyn Coordinator,
    lease: i64,
    op_timeout: Duration,
    error: ClusterError,
) -> ClusterError {
    let _ = within(op_timeout, "lease revoke", coord.revoke(lease)).await;
    error
}

/// Treats a replaced store history like a lost lease: every run stops, nothing
/// cached is trusted.
fn stop_on_a_replaced_history(inner: &Arc<Inner>, history: &History) {
    let weak = Arc::downgrade(inner);
    history.on_replaced(move |replaced| {
        if let Some(inner) = weak.upgrade() {
            tracing::error!(
                worker = %inner.id,
                op = replaced.op,
                seen = replaced.seen,
                found = replaced.found,
                "the store's history was replaced: stopping every run, as on a lost lease"
            );
            inner.lease_state.send_modify(|state| state.stop_at = None);
        }
    });
}

/// Starts the lease thread: the session that keeps the lease and the guard that
/// ends what outlives it.
fn start_keeper(
    inner: &Arc<Inner>,
    prepared: keeper::Prepared,
    control_coord: Arc<dyn Coordinator>,
    timing: Timing,
    lease_rx: &watch::Receiver<LeaseState>,
    shutdown: &CancellationToken,
) -> Result<Keeper, ClusterError> {
    let session = Session::run(Arc::clone(inner), control_coord, timing, shutdown.clone());
    let guard = guard::guard(Arc::clone(inner), lease_rx.clone(), shutdown.clone());
    Keeper::start(
        prepared,
        format!("taskstage-lease-{}", inner.id),
        keeper::both(session, guard),
    )
}

struct Inner {
    coord: Arc<dyn Coordinator>,
    /// Where the worker's own store I/O runs: the lease thread's runtime (or the
    /// joining one, under [`LeaseKeeping::SharedRuntime`]).
    control: tokio::runtime::Handle,
    /// The store, on the connection that runtime drives.
    control_coord: Arc<dyn Coordinator>,
    /// The same connection, its answers unchecked: for moving the revision of a
    /// replaced history on, and for the revoke after it.
    raw_control: Arc<dyn Coordinator>,
    /// The highest revision seen, and whether the store's history was replaced.
    history: Arc<History>,
    /// The lease's TTL (the smaller of the one asked for and the one granted).
    ttl: Duration,
    keys: Keys,
    id: WorkerId,
    lease: i64,
    owner_value: String,
    epoch: Instant,
    capacity: usize,
    max_in_flight: usize,
    resync: Duration,
    op_timeout: Duration,
    grace: Duration,
    overrun: OverrunPolicy,
    factory: Box<Factory>,
    /// Names a task the reconcile loop must decide about again (a local stage
    /// change, a rejected fenced write, a stop done).
    wake: Wake,
    /// What the worker holds, for [`Worker::tasks`] and the guard; written by the
    /// reconcile loop only, one entry at a time, never held across an await.
    view: Mutex<BTreeMap<TaskId, Held>>,
    /// The lease deadline: written by the session only.
    lease_state: watch::Sender<LeaseState>,
    /// Whether a controller drained this worker, as the reconcile loop last saw it;
    /// for [`Worker::is_draining`].
    draining: AtomicBool,
    /// When the reconcile loop last turned (ms since the epoch): written by the
    /// loop, read by the session, which gives the lease up once it is older than
    /// the stall bound.
    turned: AtomicU64,
    /// [`WorkerBuilder::stall_bound`]: how often, at least, the loop turns.
    stall_bound: Duration,
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

    /// Records that the reconcile loop turned now.
    fn turned(&self) {
        // Relaxed: a timestamp the session compares with its clock; nothing else is
        // published through it.
        self.turned.store(self.now_ms(), Ordering::Relaxed);
    }

    /// How long the reconcile loop has gone without turning, at `now` (ms since
    /// the epoch).
    fn unturned_for(&self, now: u64) -> u64 {
        now.saturating_sub(self.turned.load(Ordering::Relaxed))
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// A fencer for `token` on the application's connection, for the units.
    fn fencer(&self, token: FenceToken) -> Fencer {
        self.fencer_on(&self.coord, token)
    }

    /// A fencer for `token` on `coord`: one of the two ways in, the only place a
    /// fencer is made.
    fn fencer_on(&self, coord: &Arc<dyn Coordinator>, token: FenceToken) -> Fencer {
        Fencer::new(
            Arc::clone(coord),
            self.keys.clone(),
            token,
            self.wake.clone(),
            self.op_timeout,
        )
    }

    /// A fencer for `token` on the worker's own connection, for the reconcile
    /// loop's writes (reports, releases, confirmations): they do not wait for the
    /// application's runtime. The units get [`Inner::fencer`]'s.
    fn control_fencer(&self, token: FenceToken) -> Fencer {
        self.fencer_on(&self.control_coord, token)
    }

    /// The handles of the local tasks the view holds. They stay in the view: the
    /// guard watches what a worker that ends leaves there until each run is gone.
    fn handles(&self) -> Vec<Handle> {
        self.view()
            .values()
            .filter_map(|h| h.handle.clone())
            .collect()
    }

    /// Whether a run (or pre-start check) of a held task may be alive.
    fn runs_may_be_alive(&self) -> bool {
        self.view()
            .values()
            .filter_map(|h| h.handle.as_ref())
            .any(|h| h.stage().run_may_be_alive())
    }

    fn view(&self) -> MutexGuard<'_, BTreeMap<TaskId, Held>> {
        // Only the reconcile loop writes it, with plain inserts and removes: a
        // poisoned lock still holds a consistent map.
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A member of the cluster that claims and runs tasks.
///
/// Made by [`Worker::builder`] → [`WorkerBuilder::join`]. Dropping a worker is a
/// crash without the wait: it aborts every local run at once, then its loops, and
/// leaves the lease for the store to expire after its TTL, so other workers take
/// the tasks over only then. Its guard watches the aborted runs until each is gone:
/// one still alive at the last instant the lease allows is an overrun
/// ([`OverrunPolicy`]), so a run never outlives the lease, whatever a caller holds
/// of it. Use [`Worker::shutdown`] for a clean exit.
pub struct Worker {
    inner: Arc<Inner>,
    /// The session and the guard.
    keeper: Option<Keeper>,
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
            max_in_flight: 64,
            resync: Duration::from_secs(5),
            op_timeout: Duration::from_secs(1),
            lease_keeping: LeaseKeeping::default(),
            overrun: OverrunPolicy::default(),
            overrun_margin: None,
            stall_bound: Duration::from_secs(10),
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
    pub fn observer(&self, task: &TaskId) -> Option<taskstage::runtime::TaskObserver> {
        self.inner
            .view()
            .get(task)
            .and_then(|h| h.handle.as_ref().map(Handle::observer))
    }

    /// Whether a controller drained this worker
    /// ([`Controller::drain`](super::Controller::drain)), as its loop last saw it:
    /// it claims nothing and hands every task it holds over, and stays a live
    /// member until it shuts down.
    pub fn is_draining(&self) -> bool {
        // Relaxed: a flag for display and tests; nothing is ordered by it.
        self.inner.draining.load(Ordering::Relaxed)
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
    /// A run that is not gone after its stop keeps its owner key and the lease is
    /// not revoked: the guard waits for the run until the last instant the lease
    /// allows, and applies the [`OverrunPolicy`] if it is still alive then (by
    /// default the process ends); the store expires the lease after its TTL.
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
        // The session has ended; the guard ends once every run is gone.
        if let Some(keeper) = self.keeper.take() {
            keeper.ended().await;
        }
        if self.inner.runs_may_be_alive() {
            // Only under OverrunPolicy::LogOnly: the runs outlived the lease the
            // guard allowed them; revoking would hand their tasks over at once.
            tracing::error!(worker = %self.inner.id, "runs still alive at shutdown; the lease is left to expire");
            return result;
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
    ///
    /// Returns once every run is gone (or, under [`OverrunPolicy::LogOnly`], the
    /// lease ran out).
    pub async fn crash(mut self) {
        if let Some(task) = self.reconcile.take() {
            task.abort();
            let _ = task.await;
        }
        // No more keep-alives; the guard now watches the runs until they are gone.
        self.shutdown.cancel();
        for handle in self.inner.handles() {
            // A zero grace aborts the run at once; the error only says it is gone
            // a moment later.
            let _ = handle.stop_within(Duration::ZERO).await;
        }
        if let Some(keeper) = self.keeper.take() {
            keeper.ended().await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Every run stops first: aborted at once (nobody is left to wait for a
        // graceful stop), whatever a caller holds of it. A run the reconcile loop
        // starts while this drop runs is stopped when the aborted loop's future is
        // dropped, within the task's stop grace (half the stop bound). The keeper is
        // left to end by itself: the session stops at once, and the guard watches
        // the runs left in the view until each is gone, or applies the overrun
        // policy at the last instant the lease allows.
        self.shutdown.cancel();
        for handle in self.inner.handles() {
            // A stop is accepted in every stage; the wait is not needed.
            drop(handle.abort_now());
        }
        if let Some(task) = self.reconcile.take() {
            task.abort();
        }
    }
}
