//! Test units and counters shared by the runtime tests.
#![allow(dead_code, unreachable_pub)] // reason: each test crate uses a different subset

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use taskstage::{RunContext, RunError, RunExit, Unit};
use tokio::sync::{mpsc, Notify};

/// Counts the runs whose futures are alive, through drop guards held by the runs.
#[derive(Debug, Default)]
pub struct Live {
    now: AtomicUsize,
    max: AtomicUsize,
    started: AtomicUsize,
    changed: Notify,
}

impl Live {
    pub fn new() -> Arc<Live> {
        Arc::new(Live::default())
    }

    /// Marks a run alive until the guard drops.
    pub fn enter(self: &Arc<Self>) -> LiveGuard {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        LiveGuard(Arc::clone(self))
    }

    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Waits until `predicate(now, started)` holds.
    pub async fn wait(&self, mut predicate: impl FnMut(usize, usize) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if predicate(self.now(), self.started()) {
                return;
            }
            notified.await;
        }
    }
}

/// Keeps one run counted as alive.
#[derive(Debug)]
pub struct LiveGuard(Arc<Live>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// What a scripted run does when told.
#[derive(Debug, Clone)]
pub enum Order {
    Complete,
    Fail(&'static str),
    Panic,
}

/// How a scripted unit's pre-start check behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Pass,
    Fail,
    Hang,
}

/// A unit that waits, in every run, for an order from the test or for cancellation.
#[derive(Debug)]
pub struct Scripted {
    pub name: &'static str,
    pub live: Arc<Live>,
    pub orders: mpsc::UnboundedReceiver<Order>,
    /// When set, the run does not react to cancellation.
    pub ignore_cancel: bool,
    pub check: Arc<Mutex<Check>>,
    pub closed: Arc<AtomicUsize>,
    /// Every run's (generation, resume) in order.
    pub runs: Arc<Mutex<Vec<(u64, bool)>>>,
}

/// The test's end of a [`Scripted`] unit.
#[derive(Debug, Clone)]
pub struct Remote {
    pub orders: mpsc::UnboundedSender<Order>,
    pub check: Arc<Mutex<Check>>,
    pub closed: Arc<AtomicUsize>,
    pub runs: Arc<Mutex<Vec<(u64, bool)>>>,
}

impl Remote {
    pub fn order(&self, order: Order) {
        self.orders.send(order).expect("the unit is alive");
    }

    pub fn set_check(&self, check: Check) {
        *self.check.lock().unwrap() = check;
    }

    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    pub fn runs(&self) -> Vec<(u64, bool)> {
        self.runs.lock().unwrap().clone()
    }
}

/// A scripted unit that ignores its cancellation: its run returns only when told to,
/// or when it is aborted.
pub fn stubborn(name: &'static str, live: &Arc<Live>) -> (Scripted, Remote) {
    let (mut unit, remote) = scripted(name, live);
    unit.ignore_cancel = true;
    (unit, remote)
}

pub fn scripted(name: &'static str, live: &Arc<Live>) -> (Scripted, Remote) {
    let (tx, rx) = mpsc::unbounded_channel();
    let check = Arc::new(Mutex::new(Check::Pass));
    let closed = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(Mutex::new(Vec::new()));
    (
        Scripted {
            name,
            live: Arc::clone(live),
            orders: rx,
            ignore_cancel: false,
            check: Arc::clone(&check),
            closed: Arc::clone(&closed),
            runs: Arc::clone(&runs),
        },
        Remote {
            orders: tx,
            check,
            closed,
            runs,
        },
    )
}

impl<C: Send + Sync + 'static> Unit<C> for Scripted {
    fn name(&self) -> &str {
        self.name
    }

    async fn run(&mut self, ctx: RunContext<C>) -> Result<RunExit, RunError> {
        self.runs
            .lock()
            .unwrap()
            .push((ctx.generation(), ctx.is_resume()));
        let _alive = self.live.enter();
        let order = if self.ignore_cancel {
            self.orders.recv().await
        } else {
            tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                order = self.orders.recv() => order,
            }
        };
        match order {
            Some(Order::Complete) => Ok(RunExit::Completed),
            Some(Order::Fail(message)) => Err(RunError::msg(message)),
            Some(Order::Panic) => panic!("scripted panic"),
            None => std::future::pending().await,
        }
    }

    async fn prepare(&mut self, _ctx: RunContext<C>) -> Result<(), RunError> {
        let check = *self.check.lock().unwrap();
        match check {
            Check::Pass => Ok(()),
            Check::Fail => Err(RunError::msg("pre-start check failed")),
            Check::Hang => std::future::pending().await,
        }
    }

    fn close(&mut self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// A unit that completes at once.
#[derive(Debug)]
pub struct Instant(pub &'static str);

impl<C: Send + Sync + 'static> Unit<C> for Instant {
    fn name(&self) -> &str {
        self.0
    }

    async fn run(&mut self, _ctx: RunContext<C>) -> Result<RunExit, RunError> {
        Ok(RunExit::Completed)
    }
}

/// Runs a test body, failing it (instead of hanging the suite) if it has not finished
/// within `bound`, with a message naming the test. The bound is a failure condition,
/// not synchronisation. On tokio's paused clock the bound is virtual time, which jumps
/// ahead whenever every task waits: a lost wake-up then fails at once.
pub async fn within<F: std::future::Future<Output = ()>>(
    test: &str,
    bound: std::time::Duration,
    body: F,
) {
    if tokio::time::timeout(bound, body).await.is_err() {
        panic!("{test}: a state it waits for never came within {bound:?}");
    }
}

/// The bound of a test on a real clock.
pub const REAL_BOUND: std::time::Duration = std::time::Duration::from_secs(20);

/// The bound of a test on tokio's paused clock (virtual time; see [`within`]).
pub const PAUSED_BOUND: std::time::Duration = std::time::Duration::from_secs(3600);

/// Builds a current-thread and a multi-thread test from one async body.
#[macro_export]
macro_rules! on_both_runtimes {
    ($(#[$meta:meta])* async fn $name:ident() $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $(#[$meta])*
            #[tokio::test(flavor = "current_thread")]
            async fn current_thread() {
                $crate::support::within(stringify!($name), $crate::support::REAL_BOUND, async move $body).await
            }

            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn multi_thread() {
                $crate::support::within(stringify!($name), $crate::support::REAL_BOUND, async move $body).await
            }
        }
    };
}

/// A gate that units' `close()` calls block their thread on, as a close that flushes
/// to a slow disk would: each close waits until the gate is opened, or until `needed`
/// closes are waiting at once, or until a bound passes, and counts which.
#[derive(Debug)]
pub struct Gate {
    /// (closes that arrived, opened by the test)
    state: Mutex<(usize, bool)>,
    changed: std::sync::Condvar,
    needed: usize,
    late: AtomicUsize,
}

/// How long a close waits at a gate before it gives up and counts as late: far longer
/// than any close that runs beside its caller needs, short enough that a close run
/// inside its caller fails the test in seconds.
pub const GATE_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

impl Gate {
    /// A gate that opens when the test opens it, or once `needed` closes wait at it.
    pub fn new(needed: usize) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new((0, false)),
            changed: std::sync::Condvar::new(),
            needed,
            late: AtomicUsize::new(0),
        })
    }

    /// Blocks the calling thread at the gate (what a unit's close does).
    pub fn pass(&self) {
        let mut state = self.state.lock().unwrap();
        state.0 += 1;
        self.changed.notify_all();
        let (_state, waited) = self
            .changed
            .wait_timeout_while(state, GATE_BOUND, |s| !s.1 && s.0 < self.needed)
            .unwrap();
        if waited.timed_out() {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Opens the gate for every close, waiting or to come.
    pub fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }

    /// How many closes have arrived at the gate.
    pub fn arrived(&self) -> usize {
        self.state.lock().unwrap().0
    }

    /// How many closes gave up waiting: each was run where nothing could open the
    /// gate (in the caller of a command, or one after another).
    pub fn late(&self) -> usize {
        self.late.load(Ordering::SeqCst)
    }
}

/// A unit that runs until cancelled and whose `close()` blocks its thread at a gate.
#[derive(Debug)]
pub struct SlowClose(pub Arc<Gate>);

impl Unit for SlowClose {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        self.0.pass();
    }
}
