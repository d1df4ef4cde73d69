//! The runtime layer's protocol, written once: how the core's effects are carried out.
//!
//! The core decides; this module does what it decided. It starts each pre-start check
//! and run, hands the unit to it and back, closes a completed unit before reporting it,
//! closes the units of a stop and reports when they are closed, drops an aborted run's
//! future, reports a run whose future was dropped half-way, and tells the runtime's
//! observers of each change. It is runtime-agnostic: it uses only the crate's sync
//! shim, and a [`Runtime`] plugs in what it cannot do itself (spawning a future, and
//! telling subscribers). The tokio layer is one such runtime; the loom models are
//! another, which spawns loom threads, so the models run this very code.
//!
//! # Invariants
//!
//! The numbers are those of the specification (`docs/design.md`).
//!
//! - **9a. Back before rest.** A check or run hands its unit back *in* its report
//!   ([`Lifecycle::report_prepared`], [`Lifecycle::report_exit`]): the core puts it in
//!   its slot in the critical section that publishes the stage, so a resume issued the
//!   instant New or Paused is seen finds the unit.
//! - **9b. Closed before terminal.** A run that completed its unit closes it before it
//!   reports (the stage is still Running, Pausing or Stopping while `close()` runs), so
//!   Finished and the next unit's Running follow the close. A stop's closes are done
//!   before [`Lifecycle::report_closed`], the only way from Stopping to Stopped.
//! - **9c. Abort never forgotten.** The abort signal is the generation's
//!   [`CancelHandle`], created with the generation under the core's lock; the run's
//!   future watches it from its first poll, and an abort sent before that poll is
//!   seen by it.
//! - **2. Reported after dropped.** Every report is made after the check's or run's
//!   future has been dropped; a future dropped half-way (a runtime shutting down) is
//!   reported by the exit guard, after the drop.
//!
//! # Deadlock safety
//!
//! No lock of the core is held while user code runs here: `prepare`, `run`, `close`,
//! `apply_config`, a unit's `Drop`, and the runtime's hooks are all called between the
//! core's critical sections.

use std::fmt;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::task::Poll;

use super::catch::CatchUnwind;
use super::{Applied, CancelHandle, Interrupt, Lifecycle, Settle, Start, StartKind, Transition};
use crate::error::{Error, RunError};
use crate::outcome::Exit;
use crate::stage::Command;
use crate::sync::Arc;

/// A boxed future that is `Send`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a check or run is told about itself.
#[derive(Debug)]
pub struct RunInfo<'a, K, C> {
    /// The generation of this check or run.
    pub generation: u64,
    /// The unit's index in the pipeline.
    pub unit: usize,
    /// Whether the unit has run before (a resume).
    pub resume: bool,
    /// The generation's signals.
    pub cancel: &'a K,
    /// The configuration in force.
    pub config: &'a Arc<C>,
}

/// A unit, as the driver runs it: the user's code behind the runtime's adapter.
pub trait Work<K, C>: Send + 'static {
    /// Brings the unit up to `config` before a check or run (a no-op if it is the one
    /// the unit already applied).
    ///
    /// # Errors
    ///
    /// The unit's error; the check or run then fails with it.
    fn apply_config(&mut self, config: &Arc<C>) -> Result<(), RunError>;
    /// The future of a pre-start check.
    type Prepare<'a>: Future<Output = Result<(), RunError>> + Send + Unpin + 'a
    where
        Self: 'a,
        K: 'a,
        C: 'a;
    /// The future of a run.
    type Run<'a>: Future<Output = Exit> + Send + Unpin + 'a
    where
        Self: 'a,
        K: 'a,
        C: 'a;
    /// The pre-start check.
    fn prepare<'a>(&'a mut self, info: RunInfo<'a, K, C>) -> Self::Prepare<'a>;
    /// One run: [`Exit::Ok`] when the unit completed, [`Exit::Cancelled`] when it
    /// returned because it was cancelled, [`Exit::Failed`] on error.
    fn run<'a>(&'a mut self, info: RunInfo<'a, K, C>) -> Self::Run<'a>;
    /// Releases the unit's resources.
    fn close(&mut self);
}

/// What the driver needs from a runtime.
pub trait Runtime: Send + Sync + Sized + 'static {
    /// Runs `future` to completion, concurrently with the caller.
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F);
    /// Told of every accepted transition, after the core published it and with no
    /// lock of the core held (subscribers, logs). Called in the order the driver
    /// carries effects out, which may differ from the core's order: use
    /// [`Transition::seq`] to keep the newest.
    fn published(&self, transition: &Transition) {
        let _ = transition;
    }
    /// Told of every command the table refused, with no lock held.
    fn refused(&self, error: &Error) {
        let _ = error;
    }
    /// Told once, when the task is dropped, of the stage it was last in.
    fn retired(&self, stage: crate::stage::Stage) {
        let _ = stage;
    }
    /// Runs `closes` (units' `close()`, user code that may block its thread, then the
    /// report that publishes Stopped) apart from the caller of a command or a drop,
    /// so that none of them waits for a unit's close. (The closes that follow a run's
    /// end run in the run's own future instead: nobody waits there.) `closes` does its work when
    /// it is called or when it is dropped uncalled, so a runtime that drops it (one
    /// shutting down) still closes every unit.
    ///
    /// The default calls it at once, in the caller: the loom models' runtime, whose
    /// models check the order of the closes and the report inside `closes`.
    fn spawn_closes<F: FnOnce() + Send + 'static>(&self, closes: F) {
        closes();
    }
}

/// A task: its lifecycle core and the runtime its checks and runs are spawned on.
pub struct Driver<K, C, U, R: Runtime> {
    core: Lifecycle<K, C, U>,
    runtime: R,
    /// The generation whose run last started to be polled (pre-fix variant only).
    #[cfg(taskstage_loom)]
    installed: crate::sync::AtomicU64,
}

impl<K, C, U, R: Runtime + fmt::Debug> fmt::Debug for Driver<K, C, U, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("core", &self.core)
            .field("runtime", &self.runtime)
            .finish()
    }
}

impl<K, C, U, R: Runtime> Drop for Driver<K, C, U, R> {
    fn drop(&mut self) {
        self.runtime.retired(self.core.stage_unlocked());
    }
}

impl<K, C, U, R> Driver<K, C, U, R>
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    /// A task in New.
    pub fn new(core: Lifecycle<K, C, U>, runtime: R) -> Self {
        // Every accepted change goes through `carry_out_at`, which tells it.
        core.defer_waiters();
        Driver {
            core,
            runtime,
            #[cfg(taskstage_loom)]
            installed: crate::sync::AtomicU64::new(0),
        }
    }

    /// The lifecycle core.
    #[inline]
    pub fn core(&self) -> &Lifecycle<K, C, U> {
        &self.core
    }

    /// The runtime.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// Issues a pause, resume or stop and carries out its effects. Returns what the
    /// command's wait settles on (see [`Lifecycle::settled`]).
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] as [`Lifecycle::command`]; nothing changes then.
    pub fn command(this: &Arc<Self>, command: Command) -> Result<Settle, Error> {
        let applied = this
            .core
            .command(command)
            .inspect_err(|e| this.runtime.refused(e))?;
        Ok(Self::accepted(this, command, applied))
    }

    /// Issues `command` only if nothing changed since `seq`, and carries out its
    /// effects.
    ///
    /// # Errors
    ///
    /// As [`Lifecycle::command_if_unchanged`]; nothing changes then.
    pub fn command_if_unchanged(
        this: &Arc<Self>,
        command: Command,
        seq: u64,
    ) -> Result<Settle, Error> {
        let applied = this
            .core
            .command_if_unchanged(command, seq)
            .inspect_err(|e| this.runtime.refused(e))?;
        Ok(Self::accepted(this, command, applied))
    }

    /// Replaces the configuration and carries out the effects.
    ///
    /// # Errors
    ///
    /// As [`Lifecycle::update`]; nothing changes then.
    pub fn update(this: &Arc<Self>, config: C) -> Result<(), Error> {
        let applied = this
            .core
            .update(config)
            .inspect_err(|e| this.runtime.refused(e))?;
        Self::carry_out(this, applied);
        Ok(())
    }

    fn accepted(this: &Arc<Self>, command: Command, applied: Applied<K, C, U>) -> Settle {
        let generation = applied.transition.map(|t| t.generation).unwrap_or_default();
        Self::carry_out(this, applied);
        Settle::new(command, generation)
    }

    /// Aborts the run or check of `generation` (see [`Lifecycle::abort`]).
    pub fn abort(&self, generation: u64) -> bool {
        #[cfg(taskstage_loom)]
        if super::prefix::on(super::prefix::Defect::ForgetEarlyAbort)
            && self.installed.load(crate::sync::Ordering::SeqCst) != generation
        {
            // The old bookkeeping: an abort before the run's handle was installed.
            return false;
        }
        self.core.abort(generation)
    }

    /// Carries out the effects of one accepted input, with no lock held: cancels,
    /// tells the runtime, spawns the start, closes the units of a stop and reports
    /// them closed (which publishes Stopped).
    ///
    /// For the caller of a command or a drop: the closes (user code that may block)
    /// go to [`Runtime::spawn_closes`], never run here.
    pub fn carry_out(this: &Arc<Self>, applied: Applied<K, C, U>) {
        Self::carry_out_at(this, applied, Closing::Apart);
    }

    /// As [`Driver::carry_out`], from a check's or run's own future after it ended
    /// (its report): no caller waits on it, so the closes run right here, as the
    /// close of a completed unit does, and no stop pays a hand-off to the runtime.
    fn carry_out_in_run(this: &Arc<Self>, applied: Applied<K, C, U>) {
        Self::carry_out_at(this, applied, Closing::Here);
    }

    fn carry_out_at(this: &Arc<Self>, applied: Applied<K, C, U>, closing: Closing) {
        let Applied {
            transition,
            cancel,
            start,
            close,
            orphan,
        } = applied;
        // Told before the cancel is carried out: the run it cancels reports its exit
        // (the next change) only after this one is out, so every channel tells the
        // changes in the core's order.
        if let Some(t) = &transition {
            this.runtime.published(t);
            // Only now the waiters: a command that returns the new stage finds the
            // runtime's channels (subscribers, logs, metrics) telling it already.
            this.core.told(t.seq);
        }
        if let Some(handle) = cancel {
            handle.cancel();
        }
        // A unit's `Drop` is user code: here, with no lock held.
        drop(orphan);
        if let Some(start) = start {
            this.runtime.spawn(run(Arc::clone(this), start));
        }
        if let Some(units) = close {
            let generation = transition.map(|t| t.generation).unwrap_or_default();
            #[cfg(taskstage_loom)]
            if super::prefix::on(super::prefix::Defect::CloseAfterPublish) {
                let closed = this.core.report_closed(generation);
                close_all(units);
                Self::carry_out(this, closed);
                return;
            }
            // Invariant 9b: every close returns before the report that publishes
            // Stopped; both are done by the guard, wherever the runtime runs it.
            let closes = Closes {
                driver: Arc::clone(this),
                units,
                generation,
            };
            match closing {
                Closing::Here => drop(closes),
                Closing::Apart => this.runtime.spawn_closes(move || drop(closes)),
            }
        }
    }

    /// The pre-fix variant's late hand-back: the unit re-enters its slot after the
    /// report's stage was published, or goes to the launch of the same generation.
    #[cfg(taskstage_loom)]
    fn late_hand_back(&self, index: usize, unit: U, launch: Option<&mut Start<K, C, U>>) {
        match launch {
            Some(launch) => {
                self.core.prefix_reclaim(index);
                launch.held = Some(unit);
            }
            None => self.core.prefix_put_back(index, unit),
        }
    }

    #[cfg(not(taskstage_loom))]
    fn late_hand_back(&self, _index: usize, _unit: U, _launch: Option<&mut Start<K, C, U>>) {
        unreachable!("the late hand-back exists only in the loom models' pre-fix variant")
    }

    fn report(
        &self,
        kind: StartKind,
        generation: u64,
        exit: Exit,
        held: Option<U>,
    ) -> Applied<K, C, U> {
        match kind {
            StartKind::Prepare => self.core.report_prepared(generation, exit, held),
            StartKind::Launch => self.core.report_exit(generation, exit, held),
        }
    }
}

/// Where [`Driver::carry_out_at`] runs a stop's closes.
#[derive(Debug, Clone, Copy)]
enum Closing {
    /// In the current thread: a check's or run's own future, after it ended.
    Here,
    /// Through [`Runtime::spawn_closes`]: the caller of a command or a drop.
    Apart,
}

/// The closes of a stop and the report that follows them, owned until done.
///
/// All the work is in its `Drop`: whether the runtime calls the closure that owns it
/// or drops that closure uncalled (a runtime shutting down), every unit is closed and
/// Stopped is published after the last close returned (invariants 4 and 9b).
struct Closes<K, C, U, R>
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    driver: Arc<Driver<K, C, U, R>>,
    units: Vec<U>,
    generation: u64,
}

impl<K, C, U, R> Drop for Closes<K, C, U, R>
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    fn drop(&mut self) {
        close_all(std::mem::take(&mut self.units));
        let closed = self.driver.core.report_closed(self.generation);
        Driver::carry_out(&self.driver, closed);
    }
}

/// Closes units, each with no lock held; a panic in one `close` is logged and the
/// others are still closed.
fn close_all<K, C, U: Work<K, C>>(units: Vec<U>) {
    for mut unit in units {
        close_one(&mut unit);
    }
}

fn close_one<K, C, U: Work<K, C>>(unit: &mut U) {
    if catch_unwind(AssertUnwindSafe(|| unit.close())).is_err() {
        tracing::error!("a unit's close panicked");
    }
}

/// Reports a cancelled exit if the future of a check or run is dropped before it
/// reported (a runtime shutting down drops its tasks). A parameter of [`run_armed`],
/// it is dropped after the unit and the run's future, locals of its loop (invariant
/// 2). It holds the kind and generation of the current start, once. Until the
/// future is first polled it holds the unit, so a start dropped unpolled (a spawn
/// on a runtime that has shut down) hands the unit back to its slot, where a stop
/// still closes it; dropped mid-run, the unit is lost with the run's future.
struct ExitGuard<K, C, U, R>
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    driver: Arc<Driver<K, C, U, R>>,
    kind: StartKind,
    generation: u64,
    armed: bool,
    held: Option<U>,
}

impl<K, C, U, R> Drop for ExitGuard<K, C, U, R>
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            let held = self.held.take();
            let applied = self
                .driver
                .report(self.kind, self.generation, Exit::Aborted, held);
            Driver::carry_out_in_run(&self.driver, applied);
        }
    }
}

/// How racing a check or run against its signals ended.
enum Ended<T> {
    Aborted,
    Cancelled,
    Done(T),
}

/// Polls `interrupt` (the generation's abort and, for a check, its cancel) first,
/// then `work`: an abort, or a pause or stop of a check, issued before a poll drops
/// the work unpolled.
///
/// The futures are pinned by the caller, in its own state: an `async fn` taking them
/// by value would hold each twice (the argument, and the pinned local it moves into),
/// which made every run's task hundreds of bytes larger.
fn race<'a, I, W>(
    mut interrupt: Pin<&'a mut I>,
    mut work: Pin<&'a mut W>,
) -> impl Future<Output = Ended<W::Output>> + 'a
where
    I: Future<Output = Interrupt>,
    W: Future,
{
    poll_fn(move |cx| {
        if let Poll::Ready(interrupt) = interrupt.as_mut().poll(cx) {
            return Poll::Ready(match interrupt {
                Interrupt::Aborted => Ended::Aborted,
                Interrupt::Cancelled => Ended::Cancelled,
            });
        }
        work.as_mut().poll(cx).map(Ended::Done)
    })
}

/// The future of one pre-start check, and of the run it launches; or of one run.
///
/// When a check passes and the core answers with the launch of the same generation,
/// the run continues in this future with the unit the core hands straight back: one
/// spawn per resume.
fn run<K, C, U, R>(
    driver: Arc<Driver<K, C, U, R>>,
    start: Start<K, C, U>,
) -> impl Future<Output = ()> + Send + 'static
where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    // Made before the future is first polled and moved into it: a future dropped
    // unpolled (a runtime shutting down right after the spawn, or a spawn on one
    // that has shut down) drops its captures, so the guard still reports the start
    // (invariant 4), and hands the unit it holds back to its slot. The start is taken
    // apart so that its kind, generation and unit are held once, by the guard: the
    // future is the run's tokio task, and every byte of it is a byte of every task.
    let (plan, guard) = Plan::split(&driver, start);
    run_armed(driver, plan, guard)
}

/// What a start says besides its kind, generation and unit, which the [`ExitGuard`]
/// holds.
struct Plan<K, C> {
    unit: usize,
    resume: bool,
    cancel: K,
    config: Arc<C>,
}

impl<K: CancelHandle, C: Send + Sync + 'static> Plan<K, C> {
    /// The plan of `start`, and the guard that holds its kind, generation and unit.
    fn split<U, R>(
        driver: &Arc<Driver<K, C, U, R>>,
        start: Start<K, C, U>,
    ) -> (Self, ExitGuard<K, C, U, R>)
    where
        U: Work<K, C>,
        R: Runtime,
    {
        let (kind, generation) = (start.kind, start.generation);
        let (plan, held) = Plan::of(start);
        let guard = ExitGuard {
            driver: Arc::clone(driver),
            kind,
            generation,
            armed: true,
            held,
        };
        (plan, guard)
    }
}

impl<K, C> Plan<K, C> {
    /// The plan of `start`, and the unit it carries. Its kind and generation are
    /// the guard's to keep: set by [`Plan::split`], or, for a launch that continues
    /// a passed check in its future, the check's generation and `Launch`.
    fn of<U>(start: Start<K, C, U>) -> (Self, Option<U>) {
        let plan = Plan {
            unit: start.unit,
            resume: start.resume,
            cancel: start.cancel,
            config: start.config,
        };
        (plan, start.held)
    }
}

async fn run_armed<K, C, U, R>(
    driver: Arc<Driver<K, C, U, R>>,
    mut plan: Plan<K, C>,
    mut guard: ExitGuard<K, C, U, R>,
) where
    K: CancelHandle,
    C: Send + Sync + 'static,
    U: Work<K, C>,
    R: Runtime,
{
    #[cfg(taskstage_loom)]
    driver
        .installed
        .store(guard.generation, crate::sync::Ordering::SeqCst);
    loop {
        let (kind, generation) = (guard.kind, guard.generation);
        // The unit leaves the guard here, at the first poll (see ExitGuard).
        let Some(mut unit) = guard.held.take() else {
            guard.armed = false;
            let gone = RunError::msg(format!(
                "unit {} is gone: a run that held it was dropped without returning it",
                plan.unit
            ));
            let applied = driver.report(kind, generation, Exit::Failed(gone), None);
            Driver::carry_out_in_run(&driver, applied);
            return;
        };
        let exit = {
            let info = || RunInfo {
                generation,
                unit: plan.unit,
                resume: plan.resume,
                cancel: &plan.cancel,
                config: &plan.config,
            };
            let unit = &mut unit;
            let work = async move {
                match catch_unwind(AssertUnwindSafe(|| unit.apply_config(info().config))) {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => return Exit::Failed(error),
                    Err(payload) => return Exit::Failed(RunError::from_panic(&*payload)),
                }
                match kind {
                    StartKind::Prepare => match CatchUnwind::new(unit.prepare(info())).await {
                        Ok(Ok(())) => Exit::Ok,
                        Ok(Err(error)) => Exit::Failed(error),
                        Err(payload) => Exit::Failed(RunError::from_panic(&*payload)),
                    },
                    StartKind::Launch => match CatchUnwind::new(unit.run(info())).await {
                        Ok(exit) => exit,
                        Err(payload) => Exit::Failed(RunError::from_panic(&*payload)),
                    },
                }
            };
            // A pause or stop drops a check at once (fast quit); a run is told through
            // its token and returns by itself, unless it is aborted.
            let interrupt = pin!(plan.cancel.interrupted(kind == StartKind::Prepare));
            match race(interrupt, pin!(work)).await {
                Ended::Aborted => Exit::Aborted,
                Ended::Cancelled => Exit::Cancelled,
                Ended::Done(exit) => exit,
            }
        };
        // The check's or run's future has been dropped by now (the block above).
        guard.armed = false;
        match (kind, exit) {
            (StartKind::Launch, Exit::Ok) => {
                // Invariant 9b: the completed unit is closed before its report.
                #[cfg(taskstage_loom)]
                if super::prefix::on(super::prefix::Defect::CloseAfterPublish) {
                    let applied = driver.core.report_exit(generation, Exit::Ok, None);
                    close_one(&mut unit);
                    drop(unit);
                    Driver::carry_out_in_run(&driver, applied);
                    return;
                }
                close_one(&mut unit);
                drop(unit);
                let applied = driver.core.report_exit(generation, Exit::Ok, None);
                Driver::carry_out_in_run(&driver, applied);
                return;
            }
            (StartKind::Prepare, Exit::Ok) => {
                // Invariant 9a: the unit goes back in the report; a launch of this
                // generation hands it straight back out. (The pre-fix variant keeps it
                // out of the report and puts it back after the stage is published.)
                #[cfg(taskstage_loom)]
                let late = super::prefix::on(super::prefix::Defect::LateUnit);
                #[cfg(not(taskstage_loom))]
                let late = false;
                let (held, kept) = if late {
                    (None, Some(unit))
                } else {
                    (Some(unit), None)
                };
                let mut applied = driver.core.report_prepared(generation, Exit::Ok, held);
                match applied.start.take() {
                    Some(mut launch)
                        if launch.kind == StartKind::Launch && launch.generation == generation =>
                    {
                        if let Some(unit) = kept {
                            driver.late_hand_back(plan.unit, unit, Some(&mut launch));
                        }
                        // No await from the report to here: this future cannot be
                        // dropped while the launch is unreported.
                        guard.kind = StartKind::Launch;
                        guard.armed = true;
                        Driver::carry_out_in_run(&driver, applied);
                        (plan, guard.held) = Plan::of(launch);
                        continue;
                    }
                    other => {
                        applied.start = other;
                        if let Some(unit) = kept {
                            driver.late_hand_back(plan.unit, unit, None);
                        }
                        Driver::carry_out_in_run(&driver, applied);
                        return;
                    }
                }
            }
            (kind, exit) => {
                #[cfg(taskstage_loom)]
                if kind == StartKind::Prepare
                    && matches!(exit, Exit::Failed(_))
                    && super::prefix::on(super::prefix::Defect::LoseUnitOnFailedCheck)
                {
                    drop(unit);
                    let applied = driver.report(kind, generation, exit, None);
                    Driver::carry_out_in_run(&driver, applied);
                    return;
                }
                let applied = driver.report(kind, generation, exit, Some(unit));
                Driver::carry_out_in_run(&driver, applied);
                return;
            }
        }
    }
}
