//! The lifecycle core: runtime-agnostic, model-checked by loom.
//!
//! A [`Lifecycle`] holds a task's stage, the current run's generation, the outcome of
//! the last run, the user-paused mark, the task's configuration and the waiters. Every
//! input goes through [`table::decide`] under one mutex; the
//! core then applies the verdict, and hands the effects back to the caller as an
//! [`Applied`] value **after** the mutex is released. The caller (the tokio runtime
//! handle, or a loom model's scripted driver) carries them out: cancelling a handle,
//! starting a pre-start check, launching a run, closing units.
//!
//! # Invariants
//!
//! The numbers are those of the specification (`docs/design.md`); code that relies on
//! one cites it.
//!
//! 1. **Single run.** A run or preparation is started only by a `prepare` or `launch`
//!    effect, and the table emits those only when the previous run of the task has
//!    reported its exit (or, for `launch`, from the same generation's preparation).
//! 2. **Truthful rest.** New, Paused, Stopped and Finished are entered only on an
//!    exit report, which a driver sends after the run's future is dropped.
//! 3. **Reachable run.** The cancel handle of a generation is created under the lock,
//!    in the same critical section that makes the generation current, before Running
//!    (or Resuming) is published; a pause clones that same handle.
//! 4. **No stuck transitions.** Every exit report of the current generation moves a
//!    transitional stage to a stage that is not transitional or starts the next step.
//! 5. **No lost outcome.** The outcome is written only by exit reports, never by
//!    commands; a launch happens only after a successful preparation.
//! 6. **Stale fence.** An exit report whose generation is not the current one is
//!    ignored before the table is consulted.
//! 7. **No lost wake-up, no deadlock.** Waiters register under the same lock that
//!    changes the state; every accepted input wakes them all after the lock is
//!    released. The lock is never held across user code or an await.
//!
//! # Deadlock safety
//!
//! The core's mutex is a leaf: nothing is called while it is held except the pure
//! table and allocation. Effects, wakers and condition-variable notifications all run
//! after it is released.

mod catch;
pub mod driver;
mod journal;
#[cfg(taskstage_loom)]
pub mod prefix;
pub mod signal;
mod waiters;

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::{Error, RunError};
use crate::outcome::{Exit, Outcome};
use crate::stage::{Command, Stage};
use crate::sync::{lock, Arc, AtomicU8, Condvar, Mutex, MutexGuard, Ordering};
use crate::table::{self, Input, MarkChange, OutcomeChange, Verdict};

use self::journal::Journal;
pub use self::journal::{Change, Event};
use self::waiters::Waiters;

/// The signals of one run or pre-start check: a cooperative cancel, and an abort.
///
/// The core creates one per generation, under its lock, in the critical section that
/// makes the generation current, so both exist before the stage that names the run is
/// published (invariants 3 and 9): a pause or an abort issued at any instant after that
/// reaches the run, however late the run's future is spawned or first polled. The
/// core hands clones to the driver (which gives one to the run) and to every pause,
/// stop or abort that targets it.
pub trait CancelHandle: Clone + Send + Sync + 'static {
    /// A fresh handle, neither cancelled nor aborted.
    fn new_handle() -> Self;
    /// Requests cancellation: the run should return soon. Idempotent.
    fn cancel(&self);
    /// Requests an abort: the driver drops the run's future at its next poll, without
    /// the run's cooperation. Idempotent.
    fn abort(&self);
    /// Completes once [`CancelHandle::abort`] was called, or, when `on_cancel`, once
    /// [`CancelHandle::cancel`] was; says which (an abort first, if both were). The
    /// driver has one such future per check or run at a time.
    fn interrupted(&self, on_cancel: bool) -> impl Future<Output = Interrupt> + Send + '_;
}

/// What interrupted a check or run: see [`CancelHandle::interrupted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// It was aborted.
    Aborted,
    /// It was cancelled (reported only to a listener that asked for cancels).
    Cancelled,
}

/// A copy of a task's state, taken under the core's lock.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The stage.
    pub stage: Stage,
    /// The current generation: 0 before the first run, then one more for every
    /// run (a resume, or the start of the next unit).
    pub generation: u64,
    /// The index of the current unit, or `None` once every unit completed.
    pub unit: Option<usize>,
    /// How many units the pipeline has.
    pub units: usize,
    /// What the last run or pre-start check returned, if any has returned.
    pub outcome: Option<Outcome>,
    /// Whether the task is paused because the pause command was issued (not because
    /// a run failed). Set by the lifecycle, never inferred from an error.
    pub user_paused: bool,
    /// How many inputs the core has accepted: increases with every change.
    pub seq: u64,
}

/// One accepted input, for logs and subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The stage before.
    pub from: Stage,
    /// The stage after (may equal `from`, e.g. a pause in Paused sets the mark).
    pub to: Stage,
    /// The generation after the input.
    pub generation: u64,
    /// The input that caused it.
    pub cause: Input,
    /// The core's change counter after the input.
    pub seq: u64,
}

/// Whether a start is a pre-start check or a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    /// Run the unit's pre-start check, then report it with
    /// [`Lifecycle::report_prepared`].
    Prepare,
    /// Launch a run of the unit, then report its exit with [`Lifecycle::report_exit`].
    Launch,
}

/// An effect that starts user code: a pre-start check or a run.
///
/// It carries the unit itself, taken out of its slot in the critical section that
/// decided the start: no other start can hold it until a report puts it back.
#[derive(Debug)]
pub struct Start<K, C, U> {
    /// What to start.
    pub kind: StartKind,
    /// The generation to report the exit with.
    pub generation: u64,
    /// The unit's index in the pipeline.
    pub unit: usize,
    /// Whether the unit has run before (a resume) or not (a fresh start).
    pub resume: bool,
    /// The generation's cancel handle, installed before the stage was published.
    pub cancel: K,
    /// The configuration in force.
    pub config: Arc<C>,
    /// The unit, out of its slot; `None` if it was lost (a run that held it was
    /// dropped by its runtime without returning it).
    pub held: Option<U>,
}

/// The result of an accepted input: the transition and the effects to carry out.
///
/// It is produced after the core's lock is released. Carry the effects out in field
/// order: `cancel`, `start`, `close`; drop `orphan` with no lock held.
#[derive(Debug)]
#[must_use = "the effects of an accepted input must be carried out"]
pub struct Applied<K, C, U> {
    /// The transition, or `None` when the input was ignored (a stale or impossible
    /// exit report).
    pub transition: Option<Transition>,
    /// Cancel this handle (the live run's or preparation's).
    pub cancel: Option<K>,
    /// Start a pre-start check or a run.
    pub start: Option<Start<K, C, U>>,
    /// Close these units, then report [`Lifecycle::report_closed`] with the
    /// transition's generation: the stage stays Stopping until then. Present (maybe
    /// empty) exactly when the table asked for the closes.
    pub close: Option<Vec<U>>,
    /// A unit handed back by an ignored report; the caller drops it (its `Drop` is
    /// user code, so the core never runs it under its lock).
    pub orphan: Option<U>,
}

impl<K, C, U> Applied<K, C, U> {
    /// The result of an input that changed nothing: no transition, no effects. What
    /// the core returns for a stale or impossible exit report; also what another
    /// protocol written against the same effect vocabulary returns for one.
    pub fn ignored() -> Self {
        Applied {
            transition: None,
            cancel: None,
            start: None,
            close: None,
            orphan: None,
        }
    }

    /// The stage after the input, if it was accepted.
    #[cfg_attr(
        not(any(test, taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the tests, the loom models and the core benchmark")
    )]
    pub fn stage(&self) -> Option<Stage> {
        self.transition.map(|t| t.to)
    }
}

/// What a pause or a stop waits for after it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    command: Command,
    generation: u64,
}

impl Settle {
    /// The wait of `command`, accepted while `generation` was current.
    pub fn new(command: Command, generation: u64) -> Self {
        Settle {
            command,
            generation,
        }
    }

    /// The command whose wait this is.
    pub fn command(&self) -> Command {
        self.command
    }

    /// The generation that was current when the command was accepted.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The stage this wait reports as reached, or `None` while it must go on.
    ///
    /// A pause is settled once its stage has left Pausing and Stopping (the run
    /// returned), or once the generation moved on: the only way from Pausing to a new
    /// generation is through Paused and a resume. A stop is settled in a terminal
    /// stage. Any other command is settled at once.
    pub fn reached(&self, stage: Stage, generation: u64) -> Option<Stage> {
        match self.command {
            Command::Pause if generation != self.generation => Some(Stage::Paused),
            Command::Pause if matches!(stage, Stage::Pausing | Stage::Stopping) => None,
            Command::Stop if !stage.is_terminal() => None,
            _ => Some(stage),
        }
    }
}

/// Where a unit is, as the core's slot for it says.
#[derive(Debug)]
enum Slot<U> {
    /// In its slot: no run or check holds it.
    Here(U),
    /// Held by the run or check of the current generation.
    Out,
    /// Completed and closed by its run, or closed by a stop.
    Done,
    /// Dropped with a run that never returned it (a runtime shutting down).
    Lost,
}

/// The lifecycle core of one task.
///
/// `K` is the cancel handle type; `C` is the configuration type; `U` is the unit type
/// the slots hold (the runtime layer's boxed unit, or a model's unit).
pub struct Lifecycle<K, C = (), U = ()> {
    state: Mutex<State<K, C, U>>,
    /// Lock-free copy of `state.stage`.
    ///
    /// Written only under `state`'s lock with `Release`, read with `Acquire`: a reader
    /// that sees a stage also sees everything that happened before the core published
    /// it, such as a run's future having been dropped before its exit was reported
    /// (invariant 2).
    stage: AtomicU8,
    changed: Condvar,
}

struct State<K, C, U> {
    stage: Stage,
    generation: u64,
    /// The current generation's cancel handle; `None` only before the first run.
    cancel: Option<K>,
    unit: usize,
    units: usize,
    /// One slot per unit. A unit leaves its slot only in the critical section that
    /// decides its start, and re-enters it only in the one that decides the stage its
    /// report leads to (invariant 9: New and Paused find every unit here).
    slots: Vec<Slot<U>>,
    /// Whether the current unit has been launched before (its next start is a resume).
    unit_started: bool,
    outcome: Option<Outcome>,
    user_paused: bool,
    config: Arc<C>,
    seq: u64,
    waiters: Waiters,
    /// Every change since the first subscription, bounded; `None` until then.
    journal: Option<Journal>,
    /// Every change up to this one has been told to the driver's runtime (its
    /// subscribers, logs and metrics): see [`Lifecycle::defer_waiters`]. Equal to
    /// `seq` unless waiters are deferred.
    told: u64,
    /// Changes told out of order, above `told + 1`.
    told_early: Vec<u64>,
    /// Whether the async waiters judge a change only once it was told
    /// ([`Lifecycle::told`]), rather than as soon as it is made.
    defer: bool,
    /// Threads blocked in `settled_blocking` on the condition variable. Changed only
    /// under the lock, so a change that reads it as zero cannot miss a thread: one
    /// that blocks later checks its condition first, under the same lock.
    blocked: usize,
}

impl<K, C, U> fmt::Debug for Lifecycle<K, C, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Lifecycle")
            .field("stage", &state.stage)
            .field("generation", &state.generation)
            .field("unit", &state.unit)
            .field("units", &state.units)
            .field("outcome", &state.outcome)
            .field("user_paused", &state.user_paused)
            .field("seq", &state.seq)
            .finish_non_exhaustive()
    }
}

impl<K, C, U> Lifecycle<K, C, U> {
    /// The stage, read as [`Lifecycle::stage`] does, for code without the
    /// [`CancelHandle`] bound (a drop).
    pub(crate) fn stage_unlocked(&self) -> Stage {
        // Acquire: pairs with the Release store in `input`.
        Stage::from_raw(self.stage.load(Ordering::Acquire))
    }
}

impl<K: CancelHandle, C, U> Lifecycle<K, C, U> {
    /// A task in stage New with the given units and configuration.
    #[cfg_attr(
        not(any(test, taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the tests, the loom models and the core benchmark")
    )]
    pub fn new(units: Vec<U>, config: C) -> Self {
        Self::with_shared_config(units, Arc::new(config))
    }

    /// As [`Lifecycle::new`], with a configuration the caller also holds.
    pub fn with_shared_config(units: Vec<U>, config: Arc<C>) -> Self {
        Lifecycle {
            state: Mutex::new(State {
                stage: Stage::New,
                generation: 0,
                cancel: None,
                unit: 0,
                units: units.len(),
                slots: units.into_iter().map(Slot::Here).collect(),
                unit_started: false,
                outcome: None,
                user_paused: false,
                config,
                seq: 0,
                told: 0,
                told_early: Vec::new(),
                defer: false,
                waiters: Waiters::default(),
                journal: None,
                blocked: 0,
            }),
            stage: AtomicU8::new(Stage::New as u8),
            changed: Condvar::new(),
        }
    }

    /// The stage, without taking the lock.
    pub fn stage(&self) -> Stage {
        // Acquire: pairs with the Release store in `apply` (see the field's docs).
        Stage::from_raw(self.stage.load(Ordering::Acquire))
    }

    /// A consistent copy of the whole state.
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.state).snapshot()
    }

    /// The change counter and the current unit's index (`None` once every unit
    /// completed), read together under the lock: what a cached copy of the state is
    /// keyed on, without the copy a [`Lifecycle::snapshot`] makes. Every accepted
    /// input moves the counter, so an unchanged counter means an unchanged snapshot.
    #[cfg(not(taskstage_loom))]
    pub(crate) fn seq_and_unit(&self) -> (u64, Option<usize>) {
        let state = lock(&self.state);
        (state.seq, (state.unit < state.units).then_some(state.unit))
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<C> {
        Arc::clone(&lock(&self.state).config)
    }

    /// Issues a pause, resume or stop.
    ///
    /// For [`Command::Update`] use [`Lifecycle::update`], which carries the new
    /// configuration; through this method an update is accepted or refused without
    /// changing the configuration.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] when the table refuses the command in the current stage;
    /// nothing changes then.
    pub fn command(&self, command: Command) -> Result<Applied<K, C, U>, Error> {
        self.input(Input::from_command(command), None, None, None)
    }

    /// Issues `command` only if the core's change counter still equals `seq` (taken
    /// from a [`Snapshot`]): a compare-and-set for callers that decide from what they
    /// observed, such as an auto-resume policy that must not resume a task the user
    /// paused a moment ago.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] with [`Refusal::Changed`](crate::Refusal::Changed) when
    /// anything changed since `seq`; otherwise as [`Lifecycle::command`]. Nothing
    /// changes on an error.
    pub fn command_if_unchanged(
        &self,
        command: Command,
        seq: u64,
    ) -> Result<Applied<K, C, U>, Error> {
        self.input(Input::from_command(command), None, None, Some(seq))
    }

    /// Replaces the configuration, if no run holds a unit.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] outside New and Paused; the configuration is unchanged then.
    pub fn update(&self, config: C) -> Result<Applied<K, C, U>, Error> {
        self.input(Input::Update, None, Some(config), None)
    }

    /// Reports how the pre-start check of `generation` ended, handing back the unit
    /// it held (`None` if it was lost). The unit re-enters its slot in the same
    /// critical section that decides the stage this report leads to.
    ///
    /// A report of another generation than the current one is ignored (invariant 6);
    /// the unit then comes back as [`Applied::orphan`].
    pub fn report_prepared(
        &self,
        generation: u64,
        exit: Exit,
        held: Option<U>,
    ) -> Applied<K, C, U> {
        let input = match exit {
            Exit::Ok => Input::PrepOk,
            Exit::Failed(_) => Input::PrepFailed,
            Exit::Cancelled | Exit::Aborted => Input::PrepCancelled,
        };
        self.report(generation, input, exit, Return::Unit(held))
    }

    /// Reports how the run of `generation` ended. Call it only once the run's future
    /// has been dropped (invariant 2 rests on it).
    ///
    /// A run that completed (`Exit::Ok`) has closed its unit before reporting and
    /// hands nothing back (a unit passed anyway comes back as [`Applied::orphan`]);
    /// any other exit hands the unit back (`None` if it was lost), and it re-enters
    /// its slot in the critical section that decides the stage the report leads to.
    ///
    /// A report of another generation than the current one is ignored (invariant 6).
    pub fn report_exit(&self, generation: u64, exit: Exit, held: Option<U>) -> Applied<K, C, U> {
        let input = match exit {
            // Filled in under the lock, where the unit index is known.
            Exit::Ok => Input::RunOk { last_unit: false },
            Exit::Failed(_) => Input::RunFailed,
            Exit::Cancelled | Exit::Aborted => Input::RunCancelled,
        };
        self.report(generation, input, exit, Return::Unit(held))
    }

    /// Reports that every unit of a `close` effect has been closed (each `close()`
    /// returned). `generation` is the one of the transition that asked for the closes.
    pub fn report_closed(&self, generation: u64) -> Applied<K, C, U> {
        self.report(generation, Input::Closed, Exit::Ok, Return::Nothing)
    }

    /// Aborts the run or check of `generation`, if it is still the current one: its
    /// future is dropped at its next poll, and its report follows as for a cancel.
    /// Returns whether the abort was sent. The abort signal exists from the moment
    /// the generation became current, so an abort can never be forgotten, however
    /// early it comes (invariant 9).
    pub fn abort(&self, generation: u64) -> bool {
        let handle = {
            let state = lock(&self.state);
            (state.generation == generation)
                .then(|| state.cancel.clone())
                .flatten()
        };
        match handle {
            Some(handle) => {
                handle.abort();
                true
            }
            None => false,
        }
    }

    /// Puts `unit` back into slot `index` if that slot lost it: the old, late
    /// hand-back, for the pre-fix variant of the models only.
    #[cfg(taskstage_loom)]
    pub(crate) fn prefix_put_back(&self, index: usize, unit: U) {
        let mut state = lock(&self.state);
        if let Some(slot) = state.slots.get_mut(index) {
            if matches!(slot, Slot::Lost) {
                *slot = Slot::Here(unit);
            }
        }
    }

    /// Marks slot `index`, which lost its unit, as held again: the old code kept the
    /// unit for a launch of the same generation. Pre-fix variant only.
    #[cfg(taskstage_loom)]
    pub(crate) fn prefix_reclaim(&self, index: usize) {
        let mut state = lock(&self.state);
        if let Some(slot) = state.slots.get_mut(index) {
            if matches!(slot, Slot::Lost) {
                *slot = Slot::Out;
            }
        }
    }

    fn report(
        &self,
        generation: u64,
        input: Input,
        exit: Exit,
        held: Return<U>,
    ) -> Applied<K, C, U> {
        let aborted = matches!(exit, Exit::Aborted);
        let error = match exit {
            Exit::Failed(error) => Some(error),
            Exit::Ok | Exit::Cancelled | Exit::Aborted => None,
        };
        match self.input(input, Some((generation, error, held, aborted)), None, None) {
            Ok(applied) => applied,
            // Reports are events, which the table never refuses.
            Err(_) => Applied::ignored(),
        }
    }

    fn input(
        &self,
        mut input: Input,
        report: Option<(u64, Option<RunError>, Return<U>, bool)>,
        config: Option<C>,
        expected_seq: Option<u64>,
    ) -> Result<Applied<K, C, U>, Error> {
        let mut state = lock(&self.state);
        if let (Some(seq), Some(command)) = (expected_seq, input.command()) {
            if seq != state.seq {
                return Err(Error::Refused {
                    command,
                    stage: state.stage,
                    reason: crate::error::Refusal::Changed,
                });
            }
        }
        let mut error = None;
        let mut held = Return::Nothing;
        // Whether the reported run (or check) was aborted rather than returned.
        let mut aborted = false;
        if let Some((generation, reported_error, returned, cut_off)) = report {
            aborted = cut_off;
            // Invariant 6: the stale fence comes before the table.
            if generation != state.generation {
                return Ok(Applied::ignored_with(returned));
            }
            error = reported_error;
            held = returned;
            if let Input::RunOk { .. } = input {
                input = Input::RunOk {
                    last_unit: state.unit + 1 >= state.units,
                };
            }
        }
        let from = state.stage;
        let step = match table::decide(from, input) {
            Verdict::Step(step) => step,
            Verdict::Ignored => return Ok(Applied::ignored_with(held)),
            Verdict::Refused(reason) => {
                return Err(Error::Refused {
                    command: input
                        .command()
                        .unwrap_or_else(|| panic!("the table refused the event {input:?}")),
                    stage: from,
                    reason,
                })
            }
        };

        let mut applied = Applied::ignored();
        // Invariant 9: the unit a report hands back re-enters its slot here, in the
        // critical section that publishes the stage the report leads to.
        if let Return::Unit(returned) = held {
            applied.orphan = state.put_back(input, returned);
        }
        let effects = step.effects;
        if effects.cancel {
            applied.cancel = Some(state.current_cancel(from));
        }
        if effects.unit_done {
            state.unit += 1;
            state.unit_started = false;
        }
        if effects.new_generation {
            state.generation += 1;
            // Invariant 3: the handle exists before the new stage is published below.
            state.cancel = Some(K::new_handle());
        }
        if effects.prepare || effects.launch {
            let kind = if effects.launch {
                StartKind::Launch
            } else {
                StartKind::Prepare
            };
            let unit = state.unit;
            applied.start = Some(Start {
                kind,
                generation: state.generation,
                unit,
                resume: state.unit_started,
                cancel: state.current_cancel(from),
                config: Arc::clone(&state.config),
                held: state.take_out(unit),
            });
            if effects.launch {
                state.unit_started = true;
            }
        }
        if effects.close_units {
            let remaining = state.unit.min(state.units)..state.units;
            applied.close = Some(state.take_for_close(remaining));
        }
        if effects.apply_config {
            if let Some(config) = config {
                state.config = Arc::new(config);
            }
        }
        match step.outcome {
            OutcomeChange::Keep => {}
            OutcomeChange::Completed => state.outcome = Some(Outcome::Completed),
            OutcomeChange::Cancelled => {
                state.outcome = Some(if aborted {
                    Outcome::Aborted
                } else {
                    Outcome::Cancelled
                });
            }
            OutcomeChange::UnrequestedCancel => {
                state.outcome = Some(Outcome::Failed(RunError::unrequested_cancel()));
            }
            OutcomeChange::Failed => {
                let error = error.unwrap_or_else(|| RunError::msg("failed without an error value"));
                state.outcome = Some(Outcome::Failed(error));
            }
        }
        match step.mark {
            MarkChange::Keep => {}
            MarkChange::Set => state.user_paused = true,
            MarkChange::Clear => state.user_paused = false,
        }
        state.stage = step.to;
        state.seq += 1;
        // Release: see the field's docs. Stored under the lock, so snapshots taken by
        // different threads are published in the order the lock serialised them.
        self.stage.store(step.to as u8, Ordering::Release);
        applied.transition = Some(Transition {
            from,
            to: step.to,
            generation: state.generation,
            cause: input,
            seq: state.seq,
        });
        // In the critical section that made the change: the journal's order is the
        // core's, and no change is missing from it.
        if state.journal.is_some() {
            let change = state.change(from, input);
            if let Some(journal) = &mut state.journal {
                journal.push(change);
            }
        }
        // Deferred, the async waiters are woken when the change is told (`told`).
        let wakers = (!state.defer).then(|| {
            state.told = state.seq;
            state.waiters.take()
        });
        let notify_threads = state.blocked > 0;
        drop(state);
        // Invariant 7: wake after the lock is released. The condition variable is
        // notified only when a thread is blocked on it (a notify is a system call).
        if let Some(wakers) = wakers {
            wakers.wake();
        }
        if notify_threads {
            self.changed.notify_all();
        }
        Ok(applied)
    }

    /// Makes the async waiters ([`Lifecycle::settled`], [`Lifecycle::wait_until`])
    /// judge a change only once the driver has told its runtime of it and said so
    /// with [`Lifecycle::told`]: a command that returns stage S then finds every
    /// channel the runtime feeds (subscribers, logs, metrics) telling S already.
    /// Called once, before the first input, by a driver that tells every accepted
    /// change; a change never told would hold its waiters for ever.
    pub fn defer_waiters(&self) {
        lock(&self.state).defer = true;
    }

    /// Says that change `seq` (a [`Transition::seq`]) has been told to the runtime,
    /// and wakes the waiters once every change up to the latest was told. Changes may
    /// be told out of order; a waiter goes on only when none before it is missing.
    pub fn told(&self, seq: u64) {
        let wakers = {
            let mut state = lock(&self.state);
            if seq == state.told + 1 {
                state.told = seq;
                while let Some(at) = state.told_early.iter().position(|&s| s == state.told + 1) {
                    state.told_early.swap_remove(at);
                    state.told += 1;
                }
            } else if seq > state.told {
                state.told_early.push(seq);
            }
            (state.told == state.seq).then(|| state.waiters.take())
        };
        // Invariant 7: woken with the lock released.
        if let Some(wakers) = wakers {
            wakers.wake();
        }
    }

    /// Starts journaling changes (keeping at least `capacity` of them), and returns the
    /// change counter a new reader starts after (it will read every change from the
    /// next one on) and whether the reader has already ended: a task that is terminal
    /// when the reader subscribes has no change left to deliver, so its reader ends at
    /// once (a reader ends after the first terminal stage, whether it read it or the
    /// stage was there before it).
    pub fn subscribe_changes(&self, capacity: usize) -> (u64, bool) {
        let mut state = lock(&self.state);
        // Read under the lock that every change takes: a terminal stage published
        // after this point is journaled and read like any change.
        if state.stage.is_terminal() {
            return (state.seq, true);
        }
        let seen = state.seq;
        match &mut state.journal {
            Some(journal) => {
                journal.reserve(capacity);
                journal.join(seen);
            }
            None => state.journal = Some(Journal::new(capacity, seen)),
        }
        (seen, false)
    }

    /// Polls for the journal entry after change `*seen`, for a reader registered as
    /// waiter `*id`. Returns `Ready(None)` once the reader has read a terminal stage,
    /// or when nothing is journaled.
    pub fn poll_change(
        &self,
        seen: &mut u64,
        ended: &mut bool,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Event>> {
        let mut state = lock(&self.state);
        if *ended {
            state.waiters.remove(id.take());
            return Poll::Ready(None);
        }
        let Some(journal) = &mut state.journal else {
            state.waiters.remove(id.take());
            return Poll::Ready(None);
        };
        match journal.read_after(seen) {
            Some(entry) => {
                if let Event::Change(change) = &entry {
                    *ended = change.stage.is_terminal();
                }
                // A reader that read the terminal stage reads nothing more: it
                // leaves, and with the last reader the journal goes.
                if *ended && !journal.leave(*seen) {
                    state.journal = None;
                }
                Poll::Ready(Some(entry))
            }
            None => {
                // Registered under the lock that every change takes: the next change
                // wakes this reader (invariant 7).
                state.waiters.register(id, cx.waker());
                Poll::Pending
            }
        }
    }

    /// Forgets the reader registered as waiter `id` that has read up to change
    /// `seen` (its stream was dropped); with the last reader the journal goes. A
    /// reader that `ended` has left the journal already (or never joined it).
    pub fn forget_reader(&self, id: Option<u64>, seen: u64, ended: bool) {
        if id.is_none() && ended {
            return;
        }
        let mut state = lock(&self.state);
        state.waiters.remove(id);
        if !ended {
            if let Some(journal) = &mut state.journal {
                if !journal.leave(seen) {
                    state.journal = None;
                }
            }
        }
    }

    /// Waits (async) until `settle` is reached, and returns the stage it reports.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future unregisters its waker and changes nothing else.
    pub fn settled(&self, settle: Settle) -> Settled<'_, K, C, U> {
        Settled {
            core: self,
            settle,
            id: None,
        }
    }

    /// Waits (blocking the thread) until `settle` is reached, and returns the stage it
    /// reports.
    #[cfg_attr(
        not(any(test, taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the tests, the loom models and the core benchmark")
    )]
    pub fn settled_blocking(&self, settle: Settle) -> Stage {
        let mut state = lock(&self.state);
        loop {
            if let Some(stage) = settle.reached(state.stage, state.generation) {
                return stage;
            }
            state.blocked += 1;
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.blocked -= 1;
        }
    }

    /// Waits (async) until `predicate` holds for a snapshot, and returns that snapshot.
    ///
    /// The predicate is user code: it runs on a copy of the state, with no lock of the
    /// core held (invariant 7), so it may call back into the task. The waiter is
    /// registered in the critical section that takes the copy, so a change after the
    /// copy always wakes it to look again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future unregisters its waker and changes nothing else.
    pub fn wait_until<P>(&self, predicate: P) -> WaitUntil<'_, K, C, U, P>
    where
        P: FnMut(&Snapshot) -> bool,
    {
        WaitUntil {
            core: self,
            predicate,
            id: None,
        }
    }

    /// Pauses and blocks the thread until the pause settles.
    ///
    /// A convenience for thread-based drivers and models: it issues the command,
    /// carries out the cancel effect, and waits. It returns the stage reached.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] as [`Lifecycle::command`].
    #[cfg_attr(
        not(any(test, taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the tests, the loom models and the core benchmark")
    )]
    pub fn pause_blocking(&self) -> Result<Stage, Error> {
        self.command_blocking(Command::Pause)
    }

    /// Stops and blocks the thread until the task is terminal. See
    /// [`Lifecycle::pause_blocking`].
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] as [`Lifecycle::command`].
    #[cfg_attr(
        not(any(taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the loom models")
    )]
    pub fn stop_blocking(&self) -> Result<Stage, Error> {
        self.command_blocking(Command::Stop)
    }

    #[cfg_attr(
        not(any(test, taskstage_loom, taskstage_internals)),
        allow(dead_code, reason = "driven by the tests, the loom models and the core benchmark")
    )]
    fn command_blocking(&self, command: Command) -> Result<Stage, Error> {
        let applied = self.command(command)?;
        let generation = applied.transition.map(|t| t.generation).unwrap_or_default();
        if let Some(cancel) = &applied.cancel {
            cancel.cancel();
        }
        Ok(self.settled_blocking(Settle::new(command, generation)))
    }
}

/// What a report hands back to the core.
enum Return<U> {
    /// Nothing: the report is about closes, not about a run.
    Nothing,
    /// The unit the run or check held (`None` if it was lost).
    Unit(Option<U>),
}

impl<K, C, U> Applied<K, C, U> {
    fn ignored_with(returned: Return<U>) -> Self {
        let mut applied = Applied::ignored();
        if let Return::Unit(unit) = returned {
            applied.orphan = unit;
        }
        applied
    }
}

impl<K, C, U> State<K, C, U> {
    /// Puts the unit a report of the current generation hands back into its slot.
    /// Returns a unit that has no place (a completed run passed one anyway).
    fn put_back(&mut self, input: Input, returned: Option<U>) -> Option<U> {
        let Some(slot) = self.slots.get_mut(self.unit) else {
            return returned;
        };
        match (&*slot, &returned) {
            // Out: the start took the unit. Lost: the start found none, and reports
            // that.
            (Slot::Out | Slot::Lost, _) => {}
            // A start that found no unit reports nothing back, while the unit came back
            // late by another way: only the pre-fix variant of the models does that.
            (Slot::Here(_), None) => return None,
            (Slot::Here(_) | Slot::Done, _) => panic!(
                "a report of the current generation found unit {} in its slot",
                self.unit
            ),
        }
        match (input, returned) {
            // The run completed and closed its unit.
            (Input::RunOk { .. }, extra) => {
                *slot = Slot::Done;
                extra
            }
            (_, Some(unit)) => {
                *slot = Slot::Here(unit);
                None
            }
            (_, None) => {
                *slot = Slot::Lost;
                None
            }
        }
    }

    /// Takes unit `index` out of its slot for a start (`None` if it is not there).
    fn take_out(&mut self, index: usize) -> Option<U> {
        let slot = self.slots.get_mut(index)?;
        match std::mem::replace(slot, Slot::Out) {
            Slot::Here(unit) => Some(unit),
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Takes every unit of `range` still in its slot, to be closed.
    fn take_for_close(&mut self, range: Range<usize>) -> Vec<U> {
        let mut units = Vec::new();
        for slot in self.slots.get_mut(range).into_iter().flatten() {
            // A lost unit stays lost: there is nothing to close.
            if matches!(slot, Slot::Here(_)) {
                if let Slot::Here(unit) = std::mem::replace(slot, Slot::Done) {
                    units.push(unit);
                }
            }
        }
        units
    }
}

impl<K, C, U> State<K, C, U> {
    fn change(&self, from: Stage, cause: Input) -> Change {
        Change {
            from,
            stage: self.stage,
            cause: cause.into(),
            seq: self.seq,
            generation: self.generation,
            unit: (self.unit < self.units).then_some(self.unit),
            outcome: self.outcome.clone(),
            user_paused: self.user_paused,
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            stage: self.stage,
            generation: self.generation,
            unit: (self.unit < self.units).then_some(self.unit),
            units: self.units,
            outcome: self.outcome.clone(),
            user_paused: self.user_paused,
            seq: self.seq,
        }
    }
}

impl<K: Clone, C, U> State<K, C, U> {
    fn current_cancel(&self, stage: Stage) -> K {
        match &self.cancel {
            Some(handle) => handle.clone(),
            None => panic!("no cancel handle in stage {stage}: a run was never started"),
        }
    }
}

/// Future returned by [`Lifecycle::settled`].
#[must_use = "futures do nothing unless polled"]
pub struct Settled<'a, K, C, U> {
    core: &'a Lifecycle<K, C, U>,
    settle: Settle,
    id: Option<u64>,
}

impl<K, C, U> fmt::Debug for Settled<'_, K, C, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settled")
            .field("settle", &self.settle)
            .finish_non_exhaustive()
    }
}

impl<K, C, U> Future for Settled<'_, K, C, U> {
    type Output = Stage;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Stage> {
        let this = self.get_mut();
        let mut state: MutexGuard<'_, State<K, C, U>> = lock(&this.core.state);
        // `reached` is the crate's own code: it may run under the lock. A change not
        // told yet is not judged: its waiters are woken when it is (`told`).
        let told = state.told == state.seq;
        if let Some(stage) = this
            .settle
            .reached(state.stage, state.generation)
            .filter(|_| told)
        {
            state.waiters.remove(this.id.take());
            return Poll::Ready(stage);
        }
        state.waiters.register(&mut this.id, cx.waker());
        Poll::Pending
    }
}

impl<K, C, U> Drop for Settled<'_, K, C, U> {
    fn drop(&mut self) {
        if self.id.is_some() {
            lock(&self.core.state).waiters.remove(self.id.take());
        }
    }
}

/// Future returned by [`Lifecycle::wait_until`].
#[must_use = "futures do nothing unless polled"]
pub struct WaitUntil<'a, K, C, U, P> {
    core: &'a Lifecycle<K, C, U>,
    predicate: P,
    id: Option<u64>,
}

impl<K, C, U, P> fmt::Debug for WaitUntil<'_, K, C, U, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitUntil").finish_non_exhaustive()
    }
}

impl<K, C, U, P> Future for WaitUntil<'_, K, C, U, P>
where
    P: FnMut(&Snapshot) -> bool + Unpin,
{
    type Output = Snapshot;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Snapshot> {
        let this = self.get_mut();
        // Copy and register in one critical section: a change after the copy wakes
        // this waiter (invariant 7), so judging the copy later loses nothing.
        let snapshot = {
            let mut state = lock(&this.core.state);
            state.waiters.register(&mut this.id, cx.waker());
            // A change not told yet is not judged: `told` wakes this waiter.
            if state.told != state.seq {
                return Poll::Pending;
            }
            state.snapshot()
        };
        // Invariant 7: the predicate is user code; no lock of ours is held here.
        if (this.predicate)(&snapshot) {
            lock(&this.core.state).waiters.remove(this.id.take());
            return Poll::Ready(snapshot);
        }
        Poll::Pending
    }
}

impl<K, C, U, P> Drop for WaitUntil<'_, K, C, U, P> {
    fn drop(&mut self) {
        if self.id.is_some() {
            lock(&self.core.state).waiters.remove(self.id.take());
        }
    }
}

#[cfg(all(test, not(taskstage_loom)))]
mod tests;
