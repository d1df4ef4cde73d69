//! Models of the runtime layer's protocol: the crate's real driver
//! (`taskstage::lifecycle::driver`) on loom threads.
//!
//! The driver is what the tokio layer runs: it spawns each check and run, hands the
//! unit to it and back in its report, closes a completed unit before reporting it,
//! closes the units of a stop before Stopped is published, races each run against its
//! abort signal, and reports a run dropped half-way. Here its seam is plugged with
//! loom: [`LoomRuntime`] spawns a loom thread per check or run, [`Signal`] is the
//! generation's cancel and abort with wakeable futures, [`ModelUnit`] is the user's
//! unit. So every lock, atomic and wake-up of that path is one loom explores.
//!
//! Each model comes with its pre-fix variant: the same model with one old defect put
//! back by a switch in the crate's own code (`taskstage::lifecycle::prefix`), which
//! the model must catch. Bounds are set per model and explained there.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use loom::thread::{self, JoinHandle};
use taskstage::lifecycle::driver::{BoxFuture, Driver, RunInfo, Runtime, Work};
use taskstage::lifecycle::prefix::{self, Defect};
use taskstage::lifecycle::signal::{self, RunSignal};
use taskstage::lifecycle::{CancelHandle, Interrupt, Lifecycle, Settle, Snapshot};
use taskstage::outcome::Exit;
use taskstage::sync::{lock, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};
use taskstage::{Command, Outcome, RunError, Stage};

use crate::harness::{block_on, explore};

// ---------------------------------------------------------------------------------------
// The seam, plugged with loom
// ---------------------------------------------------------------------------------------

/// The signals of one generation. The driver's side (its abort, and the cancel a
/// check quits on) is the crate's own [`RunSignal`], the one the tokio layer uses; the
/// units' side is a flag with wakeable futures, as a unit's token would be.
#[derive(Clone, Debug)]
pub(crate) struct Signal(Arc<SignalState>);

#[derive(Debug)]
struct SignalState {
    cancelled: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
    driver: RunSignal,
}

impl CancelHandle for Signal {
    fn new_handle() -> Self {
        Signal(Arc::new(SignalState {
            cancelled: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
            driver: RunSignal::new(),
        }))
    }

    fn cancel(&self) {
        self.0.driver.raise(signal::CANCEL);
        // SeqCst store, then take the wakers: a poll that registered before the
        // take is woken; one that registers after it sees the flag (it re-checks
        // after registering).
        self.0.cancelled.store(true, Ordering::SeqCst);
        let wakers = std::mem::take(&mut *lock(&self.0.wakers));
        for waker in wakers {
            waker.wake();
        }
    }

    fn abort(&self) {
        self.0.driver.raise(signal::ABORT);
    }

    fn interrupted(&self, on_cancel: bool) -> impl Future<Output = Interrupt> + Send + '_ {
        self.0.driver.interrupted(on_cancel)
    }
}

impl Signal {
    /// The units' side: completes once the generation is cancelled.
    fn cancelled(&self) -> Cancelled<'_> {
        Cancelled { signal: self }
    }
}

/// Completes once the signal's cancel flag is raised.
struct Cancelled<'a> {
    signal: &'a Signal,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let state = &self.signal.0;
        if state.cancelled.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        lock(&state.wakers).push(cx.waker().clone());
        if state.cancelled.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Spawns each check or run on a loom thread, and keeps the threads to join.
#[derive(Debug, Default)]
pub(crate) struct LoomRuntime {
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Runtime for LoomRuntime {
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        let thread = thread::spawn(move || block_on(future));
        lock(&self.threads).push(thread);
    }
}

/// What the model units did, counted with loom atomics so loom explores what each
/// check may see.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Runs alive now (entered and not yet returned or dropped).
    live: AtomicUsize,
    /// Closes that have returned.
    closes: AtomicUsize,
    /// Checks that ran.
    checks: AtomicUsize,
}

/// What a model unit's run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunDoes {
    /// Returns Cancelled once cancelled.
    HonoursCancel,
    /// Completes at once.
    Completes,
    /// Never returns by itself: only an abort ends it.
    IgnoresCancel,
}

/// What a model unit's pre-start check does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckDoes {
    /// Passes.
    Passes,
    /// Fails the first time it runs, then passes.
    FailsFirst,
}

/// The user's unit, as the models play it.
#[derive(Debug)]
pub(crate) struct ModelUnit {
    tally: Arc<Tally>,
    run: RunDoes,
    check: CheckDoes,
}

/// Counts a run alive until dropped (the run's future is dropped with it).
struct Alive<'a>(&'a Tally);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Work<Signal, ()> for ModelUnit {
    fn apply_config(&mut self, _config: &Arc<()>) -> Result<(), RunError> {
        Ok(())
    }

    type Prepare<'a> = BoxFuture<'a, Result<(), RunError>>;
    type Run<'a> = BoxFuture<'a, Exit>;

    fn prepare<'a>(
        &'a mut self,
        _info: RunInfo<'a, Signal, ()>,
    ) -> BoxFuture<'a, Result<(), RunError>> {
        let first = self.tally.checks.fetch_add(1, Ordering::SeqCst) == 0;
        let fails = first && self.check == CheckDoes::FailsFirst;
        Box::pin(async move {
            if fails {
                Err(RunError::msg("the check failed"))
            } else {
                Ok(())
            }
        })
    }

    fn run<'a>(&'a mut self, info: RunInfo<'a, Signal, ()>) -> BoxFuture<'a, Exit> {
        let tally = &*self.tally;
        let does = self.run;
        Box::pin(async move {
            let now = tally.live.fetch_add(1, Ordering::SeqCst) + 1;
            check!(now == 1, "invariant 1 violated: {now} runs alive at once");
            let _alive = Alive(tally);
            match does {
                RunDoes::Completes => Exit::Ok,
                RunDoes::HonoursCancel => {
                    info.cancel.cancelled().await;
                    Exit::Cancelled
                }
                RunDoes::IgnoresCancel => {
                    std::future::pending::<()>().await;
                    Exit::Cancelled
                }
            }
        })
    }

    fn close(&mut self) {
        self.tally.closes.fetch_add(1, Ordering::SeqCst);
    }
}

type Task = Driver<Signal, (), ModelUnit, LoomRuntime>;

/// A task in New with one model unit per entry of `runs`.
fn task(tally: &Arc<Tally>, runs: &[RunDoes], check: CheckDoes) -> Arc<Task> {
    let units = runs
        .iter()
        .map(|&run| ModelUnit {
            tally: Arc::clone(tally),
            run,
            check,
        })
        .collect();
    Arc::new(Driver::new(
        Lifecycle::new(units, ()),
        LoomRuntime::default(),
    ))
}

/// Joins every check and run the task spawned, including those spawned meanwhile.
fn join_all(task: &Task) {
    loop {
        let next = lock(&task.runtime().threads).pop();
        match next {
            Some(thread) => thread.join().expect("a check or run panicked"),
            None => return,
        }
    }
}

/// Blocks until the task's state satisfies `predicate` (the async waiter, polled by
/// [`block_on`]: a lost wake-up is a loom deadlock).
fn wait_until(task: &Task, predicate: impl FnMut(&Snapshot) -> bool + Unpin) -> Snapshot {
    block_on(task.core().wait_until(predicate))
}

/// Spins, yielding to loom, until the core's own state satisfies `predicate`: a
/// reader of `Handle::stage()` or `Handle::snapshot()`, which read the core
/// directly, ahead of the async waiters (those judge a change only once the
/// runtime was told of it).
fn read_until(task: &Task, mut predicate: impl FnMut(&Snapshot) -> bool) -> Snapshot {
    loop {
        let snapshot = task.core().snapshot();
        if predicate(&snapshot) {
            return snapshot;
        }
        thread::yield_now();
    }
}

/// Stops the task and blocks until it settles; returns the stage reached.
fn stop(task: &Arc<Task>) -> Stage {
    let settle = Driver::command(task, Command::Stop).expect("stop is never refused");
    task.core().settled_blocking(settle)
}

/// A party that pauses the task and waits until the pause settles.
fn spawn_pauser(task: &Arc<Task>) -> JoinHandle<Stage> {
    let task = Arc::clone(task);
    thread::spawn(move || {
        let settle = Driver::command(&task, Command::Pause).expect("a started task accepts pause");
        task.core().settled_blocking(settle)
    })
}

fn gone(outcome: Option<&Outcome>) -> bool {
    matches!(outcome, Some(Outcome::Failed(e)) if e.to_string().contains("is gone"))
}

// ---------------------------------------------------------------------------------------
// (i) a resume racing the publication of Paused
// ---------------------------------------------------------------------------------------

/// (i) pause ∥ check passing ∥ resume-on-Paused. Three threads (the check's, a pauser,
/// an observer) plus the run the observer's resume starts; preemption bound 2.
///
/// The task is resumed; its check runs on its own thread. One party pauses (landing
/// before, during or after the check: the check may be cancelled, or pass while the
/// pause lands). The observer reads the stage as `Handle::stage()` does, straight
/// from the core, and resumes the moment it reads Paused: the earliest any user
/// can act on it (the async waiters, which judge a change only once the runtime was
/// told of it, see it later).
///
/// Proves (invariant 9, New and Paused): the observer's resume always finds the unit
/// in its slot, so it leads to a run and no outcome says the unit is gone; never two
/// runs (1). The bound: the race is one switch (the
/// observer between the core's publication of Paused and a late hand-back), so 2
/// covers it with one to spare; 3 explores the same outcomes in several times the
/// interleavings.
fn resume_on_paused() {
    let tally = Arc::new(Tally::default());
    let task = task(&tally, &[RunDoes::HonoursCancel], CheckDoes::Passes);
    Driver::command(&task, Command::Resume).expect("New accepts resume");
    let pauser = spawn_pauser(&task);
    let observer = {
        let task = Arc::clone(&task);
        thread::spawn(move || {
            read_until(&task, |s| s.stage == Stage::Paused);
            Driver::command(&task, Command::Resume).expect("Paused accepts resume");
        })
    };
    let paused = pauser.join().expect("the pauser panicked");
    check!(
        paused == Stage::Paused,
        "invariant 2 violated: pause ended in {paused}"
    );
    observer.join().expect("the observer panicked");
    let settled = wait_until(&task, |s| !s.stage.is_transitional());
    check!(
        !gone(settled.outcome.as_ref()),
        "invariant 9 violated: a resume issued when Paused was published found its unit gone ({:?})",
        settled.outcome
    );
    check!(
        settled.stage == Stage::Running,
        "invariant 9 violated: the resume on Paused did not lead to a run ({})",
        settled.stage
    );
    stop(&task);
    join_all(&task);
}

#[test]
fn i_resume_on_paused_finds_its_unit() {
    explore(
        "(i) pause ∥ check ∥ resume on Paused",
        Some(2),
        resume_on_paused,
    );
}

/// (i') Model (i) with the old late hand-back: Paused published, then the unit put
/// back. Must be caught.
#[test]
#[should_panic(expected = "invariant 9 violated")]
fn i_prefix_late_unit_is_caught() {
    prefix::with(Defect::LateUnit, || {
        explore("(i') pre-fix: late hand-back", Some(2), resume_on_paused)
    });
}

// ---------------------------------------------------------------------------------------
// (j) Stopped and Finished are published with every close returned
// ---------------------------------------------------------------------------------------

/// (j) stop ∥ run ∥ observer of the terminal stage. With `runs` = [Completes,
/// HonoursCancel]: the first unit completes and the second runs until the stop
/// cancels it (or the stop lands first). With [Completes, Completes] and no stop, the
/// task finishes on its own. Two to three threads; preemption bound 3.
///
/// Proves (invariant 9, Stopped and Finished): the observer, woken by the terminal
/// stage, finds both units' `close()` returned, and nothing alive (2).
fn closes_before_terminal(runs: [RunDoes; 2], stop_it: bool) {
    let tally = Arc::new(Tally::default());
    let task = task(&tally, &runs, CheckDoes::Passes);
    Driver::command(&task, Command::Resume).expect("New accepts resume");
    let observer = {
        let task = Arc::clone(&task);
        let tally = Arc::clone(&tally);
        thread::spawn(move || {
            let end = wait_until(&task, |s| s.stage.is_terminal());
            let closes = tally.closes.load(Ordering::SeqCst);
            check!(
                closes == 2,
                "invariant 9 violated: {} was published with {closes} of 2 closes returned",
                end.stage
            );
            let live = tally.live.load(Ordering::SeqCst);
            check!(
                live == 0,
                "invariant 2 violated: {} with {live} runs alive",
                end.stage
            );
        })
    };
    if stop_it {
        let reached = stop(&task);
        let closes = tally.closes.load(Ordering::SeqCst);
        check!(
            closes == 2,
            "invariant 9 violated: stop returned {reached} with {closes} of 2 closes returned"
        );
    }
    observer.join().expect("the observer panicked");
    join_all(&task);
}

#[test]
fn j_closes_return_before_stopped() {
    explore("(j) stop ∥ run ∥ observer of Stopped", Some(3), || {
        closes_before_terminal([RunDoes::Completes, RunDoes::HonoursCancel], true)
    });
}

#[test]
fn j_closes_return_before_finished() {
    explore("(j) runs ∥ observer of Finished", Some(3), || {
        closes_before_terminal([RunDoes::Completes, RunDoes::Completes], false)
    });
}

/// (j') Model (j) with closes after the publication. Must be caught.
#[test]
#[should_panic(expected = "invariant 9 violated")]
fn j_prefix_close_after_publish_is_caught() {
    prefix::with(Defect::CloseAfterPublish, || {
        explore("(j') pre-fix: close after publish", Some(3), || {
            closes_before_terminal([RunDoes::Completes, RunDoes::HonoursCancel], true)
        })
    });
}

// ---------------------------------------------------------------------------------------
// (k) an abort racing the spawn of the run it targets
// ---------------------------------------------------------------------------------------

/// (k) stop-and-abort ∥ spawn of the next unit's run. The first unit completes at
/// once and the driver spawns the second unit's run, which ignores cancellation. The
/// stopper waits for that run's generation to be Running and aborts it at once (a
/// stop whose grace period ran out at that instant), before or after the run's thread
/// first polls. Three threads; preemption bound 2.
///
/// Proves (invariant 9, Running; invariant 8): the abort always reaches the run, the
/// stop settles in Stopped with nothing alive and both units closed. (A forgotten
/// abort would leave the run alive for ever; the model records it instead of hanging,
/// because a loom deadlock aborts the test binary.)
fn abort_races_spawn() {
    let tally = Arc::new(Tally::default());
    let task = task(
        &tally,
        &[RunDoes::Completes, RunDoes::IgnoresCancel],
        CheckDoes::Passes,
    );
    Driver::command(&task, Command::Resume).expect("New accepts resume");
    wait_until(&task, |s| s.stage == Stage::Running && s.unit == Some(1));
    let settle = Driver::command(&task, Command::Stop).expect("stop is never refused");
    let sent = task.abort(settle.generation());
    check!(
        sent,
        "invariant 9 violated: the abort of the Running generation {} was forgotten",
        settle.generation()
    );
    if !sent {
        // A forgotten abort leaves the run alive for ever; a deadlock would end the
        // whole test binary, so the failure is recorded above and the run freed.
        task.core().abort(settle.generation());
    }
    let reached = task.core().settled_blocking(settle);
    check!(
        reached == Stage::Stopped,
        "invariant 8 violated: stop ended in {reached}"
    );
    join_all(&task);
    let live = tally.live.load(Ordering::SeqCst);
    check!(
        live == 0,
        "invariant 8 violated: Stopped with {live} runs alive"
    );
    let closes = tally.closes.load(Ordering::SeqCst);
    check!(closes == 2, "invariant 9 violated: {closes} of 2 closes");
}

#[test]
fn k_abort_reaches_a_run_not_yet_polled() {
    explore("(k) abort ∥ spawn of its run", Some(2), abort_races_spawn);
}

/// (k') Model (k) with the old abort bookkeeping: an abort before the run's handle is
/// installed is forgotten. Must be caught.
#[test]
#[should_panic(expected = "invariant 9 violated: the abort of the Running generation")]
fn k_prefix_forgotten_abort_is_caught() {
    prefix::with(Defect::ForgetEarlyAbort, || {
        explore(
            "(k') pre-fix: forgotten early abort",
            Some(2),
            abort_races_spawn,
        )
    });
}

// ---------------------------------------------------------------------------------------
// (l) a settle future polled again with another waker
// ---------------------------------------------------------------------------------------

/// (l) a pause's settle future, first polled with one waker and then with another,
/// ∥ the run's exit. Two threads besides the run's; no preemption bound (exhaustive).
///
/// Proves (invariant 7): the waiter is woken through the newest waker, and the pause
/// then settles in Paused. (A waiter list that keeps the first waker never wakes the
/// second; the model records that instead of blocking on it, because a loom deadlock
/// aborts the test binary.)
fn repolled_settle() {
    let tally = Arc::new(Tally::default());
    let task = task(&tally, &[RunDoes::HonoursCancel], CheckDoes::Passes);
    Driver::command(&task, Command::Resume).expect("New accepts resume");
    wait_until(&task, |s| s.stage == Stage::Running);
    let settle: Settle = Driver::command(&task, Command::Pause).expect("Running accepts pause");
    let mut settled = pin!(task.core().settled(settle));
    // First poll: a waker that wakes nobody (the future then moves to another task).
    let first = settled
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
    // Second poll: a waker that records that it was woken.
    let woken = Arc::new(AtomicBool::new(false));
    let second = Waker::from(std::sync::Arc::new(Flag(Arc::clone(&woken))));
    let pending = first.is_pending()
        && settled
            .as_mut()
            .poll(&mut Context::from_waker(&second))
            .is_pending();
    // The run returns (the pause cancelled it), and its report wakes the waiters.
    join_all(&task);
    if pending {
        check!(
            woken.load(Ordering::SeqCst),
            "invariant 7 violated: a waiter polled again with a new waker was never woken through it"
        );
    }
    let reached = task.core().settled_blocking(settle);
    check!(
        reached == Stage::Paused,
        "invariant 2 violated: pause ended in {reached}"
    );
    stop(&task);
    join_all(&task);
}

/// A waker that raises a flag.
struct Flag(Arc<AtomicBool>);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn l_repolled_settle_is_woken_through_its_new_waker() {
    explore(
        "(l) settle re-polled with a new waker ∥ run exit",
        None,
        repolled_settle,
    );
}

/// (l') Model (l) with the stale waker kept. Must be caught.
#[test]
#[should_panic(expected = "invariant 7 violated: a waiter polled again")]
fn l_prefix_stale_waker_is_caught() {
    prefix::with(Defect::StaleWaker, || {
        explore("(l') pre-fix: stale waker", None, repolled_settle)
    });
}

// ---------------------------------------------------------------------------------------
// (n), (o) the driver's signal: raises racing its listener's polls
// ---------------------------------------------------------------------------------------

/// A waker that counts its wake-ups.
struct Count(Arc<AtomicUsize>);

impl std::task::Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// (n) `RunSignal::raise(ABORT)` ∥ the first poll of a listener for the abort, then
/// a poll after the raise with the same waker. Two threads; no preemption bound
/// (exhaustive).
///
/// Proves (invariant 8, through the signal's invariant 2): a listener left pending is
/// always woken by the raise, and a poll after the raise completes; so an abort cannot
/// be lost between the listener's load of the bits and its waker reaching the slot.
/// (The listener is polled by hand with a counting waker rather than blocked on,
/// because a loom deadlock aborts the test binary.)
fn signal_wakes() {
    let signal = Arc::new(RunSignal::new());
    let raiser = {
        let signal = Arc::clone(&signal);
        thread::spawn(move || signal.raise(signal::ABORT))
    };
    let wakes = Arc::new(AtomicUsize::new(0));
    let waker = Waker::from(std::sync::Arc::new(Count(Arc::clone(&wakes))));
    let mut cx = Context::from_waker(&waker);
    let mut aborted = pin!(signal.wait(signal::ABORT));
    // One poll, as an executor makes until it is woken (a second, spurious poll
    // would see the bit and hide a lost wake-up).
    let pending = aborted.as_mut().poll(&mut cx).is_pending();
    raiser.join().expect("the raiser does not panic");
    if pending {
        check!(
            wakes.load(Ordering::SeqCst) > 0,
            "invariant 8 violated: an abort raised while its listener registered never woke it"
        );
    }
    check!(
        aborted.as_mut().poll(&mut cx).is_ready(),
        "invariant 8 violated: the listener of a raised abort is still pending"
    );
}

#[test]
fn n_signal_wakes_its_listener() {
    explore("(n) abort raise ∥ listener's poll", None, signal_wakes);
}

/// (n') Model (n) with the listener not loading the bits again after filling its
/// slot. Must be caught.
#[test]
#[should_panic(expected = "invariant 8 violated: an abort raised while its listener")]
fn n_prefix_listener_without_recheck_is_caught() {
    prefix::with(Defect::AbortNoRecheck, || {
        explore(
            "(n') pre-fix: listener without re-check",
            None,
            signal_wakes,
        )
    });
}

/// (o) a run's listener (abort only) polled twice with the same waker, the second
/// time on the lock-free path, ∥ a cancel then an abort of its generation (a stop
/// whose grace ran out). Two threads; no preemption bound (exhaustive).
///
/// Proves (invariant 8, through the signal's invariant 3): the cancel, which the
/// listener does not wait for, leaves its waker in the slot, so the abort after it
/// still wakes a listener that skipped the lock; the listener then completes.
fn cancel_then_abort() {
    let signal = Arc::new(RunSignal::new());
    let raiser = {
        let signal = Arc::clone(&signal);
        thread::spawn(move || {
            signal.raise(signal::CANCEL);
            signal.raise(signal::ABORT);
        })
    };
    let wakes = Arc::new(AtomicUsize::new(0));
    let waker = Waker::from(std::sync::Arc::new(Count(Arc::clone(&wakes))));
    let mut cx = Context::from_waker(&waker);
    let mut aborted = pin!(signal.wait(signal::ABORT));
    let _ = aborted.as_mut().poll(&mut cx);
    // A second poll (as after a wake-up from anything): wake-ups counted from here on
    // are the ones that would poll the listener again.
    let before = wakes.load(Ordering::SeqCst);
    let pending = aborted.as_mut().poll(&mut cx).is_pending();
    raiser.join().expect("the raiser does not panic");
    if pending {
        check!(
            wakes.load(Ordering::SeqCst) > before,
            "invariant 8 violated: an abort after a cancel never woke a run's listener"
        );
    }
    check!(
        aborted.as_mut().poll(&mut cx).is_ready(),
        "invariant 8 violated: the listener of a raised abort is still pending"
    );
}

#[test]
fn o_cancel_leaves_the_abort_listener_in_place() {
    explore(
        "(o) cancel then abort ∥ listener's two polls",
        None,
        cancel_then_abort,
    );
}

/// (o') Model (o) with a raise that takes the listener's waker whatever it waits for.
/// Must be caught.
#[test]
#[should_panic(expected = "invariant 8 violated: an abort after a cancel")]
fn o_prefix_raise_wakes_any_listener_is_caught() {
    prefix::with(Defect::WakeAnyListener, || {
        explore(
            "(o') pre-fix: a raise takes any listener",
            None,
            cancel_then_abort,
        )
    });
}

// ---------------------------------------------------------------------------------------
// (m) a failed pre-start check
// ---------------------------------------------------------------------------------------

/// (m) failing check ∥ pause, then a resume. The unit's first check fails; a pause
/// lands before, during or after it. Once the pause settles, the task is resumed, and
/// its second check passes. Two threads plus the checks'; preemption bound 3.
///
/// Proves: a failed check ends in Paused with its error (5) or, when the pause came
/// first, cancelled (2, 4); it hands its unit back, so the next resume's check runs
/// and leads to a run (9); never two runs (1).
fn failed_check() {
    let tally = Arc::new(Tally::default());
    let task = task(&tally, &[RunDoes::HonoursCancel], CheckDoes::FailsFirst);
    Driver::command(&task, Command::Resume).expect("New accepts resume");
    let pauser = spawn_pauser(&task);
    let paused = pauser.join().expect("the pauser panicked");
    check!(
        paused == Stage::Paused,
        "invariant 2 violated: pause ended in {paused}"
    );
    let at_rest = task.core().snapshot();
    check!(
        matches!(
            at_rest.outcome,
            Some(Outcome::Failed(_)) | Some(Outcome::Cancelled)
        ),
        "invariant 5 violated: a failed or cancelled check left outcome {:?}",
        at_rest.outcome
    );
    // A pause that cancelled the first check before it ran leaves the failing check
    // still to come: then this resume's check is the one that fails.
    let failed_already = tally.checks.load(Ordering::SeqCst) > 0;
    Driver::command(&task, Command::Resume).expect("Paused accepts resume");
    let after = wait_until(&task, |s| !s.stage.is_transitional());
    check!(
        !gone(after.outcome.as_ref()) && (after.stage == Stage::Running || !failed_already),
        "invariant 9 violated: the resume after a failed check found no unit ({}, {:?})",
        after.stage,
        after.outcome
    );
    stop(&task);
    join_all(&task);
}

#[test]
fn m_failed_check_hands_its_unit_back() {
    explore(
        "(m) failing check ∥ pause, then resume",
        Some(3),
        failed_check,
    );
}

/// (m') Model (m) with a failed check that drops its unit. Must be caught.
#[test]
#[should_panic(expected = "invariant 9 violated")]
fn m_prefix_lost_unit_is_caught() {
    prefix::with(Defect::LoseUnitOnFailedCheck, || {
        explore(
            "(m') pre-fix: failed check loses its unit",
            Some(3),
            failed_check,
        )
    });
}
