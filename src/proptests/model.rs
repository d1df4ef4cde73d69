//! A reference model of a task's lifecycle, written straight from the normative table
//! of the specification (docs/design.md) as plain Rust.
//!
//! It does not call the crate's transition table: every cell below is restated here,
//! stage by stage, so that the property tests compare two independent readings of the
//! specification. Where the specification leaves a detail open, the model takes the
//! reading that `src/table/tests.rs` and `docs/stages.md` record, and says so at the cell.
//!
//! Beyond the stage, the model knows what a real driver would see: which run or
//! pre-start check ("prep") is alive, of which generation, and whether it was asked to
//! stop; the outcome of the last exit, with the exit it came from; the user-paused
//! mark; the configuration; which units were closed; and how many inputs were
//! accepted (the core's change counter).

use crate::{Refusal, Stage};

/// A caller's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    Pause,
    Resume,
    Stop,
    /// Replace the configuration with this value.
    Update(u32),
}

/// What is alive: a pre-start check or a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Prep,
    Run,
}

/// How a failure came about, so that a test can tell one failure from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The run or check returned an error.
    Error,
    /// The run or check panicked.
    Panic,
    /// The run or check reported a cancellation that no command asked for.
    Unrequested,
}

/// How a run or a check ended, as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Ok,
    Failed(Failure),
    Cancelled,
}

/// The recorded outcome of the last exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    Cancelled,
    /// A failure, with the exit it came from: which kind of user code, of which
    /// generation, failing how. A later exit that overwrote it would change these.
    Failed {
        kind: Kind,
        generation: u64,
        failure: Failure,
    },
}

/// The run or check that is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alive {
    pub(crate) kind: Kind,
    pub(crate) generation: u64,
    pub(crate) unit: usize,
    /// Whether the unit ran before (this start resumes it).
    pub(crate) resume: bool,
    /// The configuration it was started with.
    pub(crate) config: u32,
    /// Whether a pause or a stop has asked it to stop.
    pub(crate) cancelled: bool,
}

/// The model's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) stage: Stage,
    pub(crate) generation: u64,
    /// Index of the current unit; equals `units` once every unit completed.
    pub(crate) unit: usize,
    pub(crate) units: usize,
    /// Whether the current unit has been launched before.
    pub(crate) unit_started: bool,
    pub(crate) alive: Option<Alive>,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) user_paused: bool,
    pub(crate) config: u32,
    /// Accepted inputs.
    pub(crate) seq: u64,
    /// Which units were closed (each exactly once).
    pub(crate) closed: Vec<bool>,
}

/// The error message of a scripted failure, shared by the drivers and the checks so
/// that a failure can be traced to the exit that produced it.
pub(crate) fn failure_message(kind: Kind, generation: u64) -> String {
    match kind {
        Kind::Prep => format!("scripted prep failure of generation {generation}"),
        Kind::Run => format!("scripted run failure of generation {generation}"),
    }
}

/// The panic message of a scripted panic.
pub(crate) fn panic_message(kind: Kind, generation: u64) -> String {
    match kind {
        Kind::Prep => format!("scripted prep panic of generation {generation}"),
        Kind::Run => format!("scripted run panic of generation {generation}"),
    }
}

impl Model {
    /// A task in New with `units` units and configuration 0.
    pub(crate) fn new(units: usize) -> Self {
        assert!(units > 0, "a task has at least one unit");
        Model {
            stage: Stage::New,
            generation: 0,
            unit: 0,
            units,
            unit_started: false,
            alive: None,
            outcome: None,
            user_paused: false,
            config: 0,
            seq: 0,
            closed: vec![false; units],
        }
    }

    /// The current unit, or `None` once every unit completed.
    pub(crate) fn current_unit(&self) -> Option<usize> {
        (self.unit < self.units).then_some(self.unit)
    }

    /// Whether a pause issued in this generation has settled: its waiter wakes once
    /// the stage leaves Pausing and Stopping.
    pub(crate) fn pause_settled(&self) -> bool {
        !matches!(self.stage, Stage::Pausing | Stage::Stopping)
    }

    /// Whether a stop has settled: the stage is terminal.
    pub(crate) fn stop_settled(&self) -> bool {
        matches!(self.stage, Stage::Stopped | Stage::Finished)
    }

    /// Applies a command. `Err` is a refusal, and then nothing changed.
    pub(crate) fn command(&mut self, cmd: Cmd) -> Result<(), Refusal> {
        use Stage::*;
        let result = match (cmd, self.stage) {
            // pause
            (Cmd::Pause, New) => Err(Refusal::NotStarted),
            (Cmd::Pause, Running | Resuming) => {
                self.cancel_alive();
                self.stage = Pausing;
                Ok(())
            }
            // "wait for Paused": accepted, nothing else changes.
            (Cmd::Pause, Pausing) => Ok(()),
            // "ok; an error-paused task becomes marked user-paused".
            (Cmd::Pause, Paused) => {
                self.user_paused = true;
                Ok(())
            }
            (Cmd::Pause, Stopping) => Err(Refusal::StopInProgress),
            (Cmd::Pause, Stopped) => Err(Refusal::Stopped),
            (Cmd::Pause, Finished) => Err(Refusal::Finished),

            // resume
            (Cmd::Resume, New | Paused) => {
                self.generation += 1;
                self.alive = Some(Alive {
                    kind: Kind::Prep,
                    generation: self.generation,
                    unit: self.unit,
                    resume: self.unit_started,
                    config: self.config,
                    cancelled: false,
                });
                // The mark is set by pause and cleared by resume.
                self.user_paused = false;
                self.stage = Resuming;
                Ok(())
            }
            (Cmd::Resume, Running) => Err(Refusal::AlreadyRunning),
            (Cmd::Resume, Pausing) => Err(Refusal::StillRunning),
            (Cmd::Resume, Resuming) => Err(Refusal::AlreadyResuming),
            (Cmd::Resume, Stopping) => Err(Refusal::StopInProgress),
            (Cmd::Resume, Stopped) => Err(Refusal::Stopped),
            (Cmd::Resume, Finished) => Err(Refusal::Finished),

            // stop
            // → Stopping while the units close, then → Stopped on the closes' report:
            // two accepted inputs, which a driver carries out before the command
            // returns.
            (Cmd::Stop, New | Paused) => {
                self.close_remaining();
                self.stage = Stopped;
                self.seq += 1;
                Ok(())
            }
            (Cmd::Stop, Running | Resuming) => {
                self.cancel_alive();
                self.stage = Stopping;
                Ok(())
            }
            // Already cancelled by the pause.
            (Cmd::Stop, Pausing) => {
                self.stage = Stopping;
                Ok(())
            }
            // "wait for Stopped" / "ok (no-op)".
            (Cmd::Stop, Stopping | Stopped | Finished) => Ok(()),

            // update config
            (Cmd::Update(config), New | Paused) => {
                self.config = config;
                Ok(())
            }
            (Cmd::Update(_), Running | Pausing | Resuming) => Err(Refusal::UnitInUse),
            (Cmd::Update(_), Stopping) => Err(Refusal::StopInProgress),
            (Cmd::Update(_), Stopped) => Err(Refusal::Stopped),
            (Cmd::Update(_), Finished) => Err(Refusal::Finished),
        };
        if result.is_ok() {
            self.seq += 1;
        }
        self.check_self();
        result
    }

    /// Applies an exit report of `kind` for `generation`. Returns whether it was
    /// accepted; a stale report (another generation), or one that belongs to nothing
    /// alive, changes nothing.
    ///
    /// # Panics
    ///
    /// If the report is of the current generation but of the other kind than what is
    /// alive: no driver can send that.
    pub(crate) fn report(&mut self, kind: Kind, generation: u64, exit: Exit) -> bool {
        // Stale fence: "a report whose generation is not the current run's is ignored".
        if generation != self.generation {
            return false;
        }
        let Some(alive) = self.alive else {
            // A second report of a run that already returned: the table's "–".
            assert!(
                matches!(
                    self.stage,
                    Stage::New | Stage::Paused | Stage::Stopped | Stage::Finished
                ),
                "model: nothing alive in {}",
                self.stage
            );
            return false;
        };
        assert_eq!(alive.kind, kind, "model: a report of the wrong kind");
        self.alive = None;
        let failed = |failure| Outcome::Failed {
            kind,
            generation,
            failure,
        };
        use Stage::*;
        match (kind, self.stage, exit) {
            // A run returned.
            (Kind::Run, Running, Exit::Ok) => {
                // "next unit → Running, or → Finished".
                self.outcome = Some(Outcome::Completed);
                self.complete_unit();
                if self.unit < self.units {
                    self.generation += 1;
                    self.launch();
                    self.stage = Running;
                } else {
                    self.stage = Finished;
                }
            }
            (Kind::Run, Running, Exit::Failed(failure)) => {
                self.outcome = Some(failed(failure));
                self.stage = Paused;
            }
            // "not cancelled by us: treat as error".
            (Kind::Run, Running, Exit::Cancelled) => {
                self.outcome = Some(failed(Failure::Unrequested));
                self.stage = Paused;
            }
            // "→ Paused before the next unit (→ Finished if it was the last)".
            (Kind::Run, Pausing, Exit::Ok) => {
                self.outcome = Some(Outcome::Completed);
                self.user_paused = true;
                self.complete_unit();
                self.stage = if self.unit < self.units {
                    Paused
                } else {
                    Finished
                };
            }
            (Kind::Run, Pausing, Exit::Failed(failure)) => {
                self.outcome = Some(failed(failure));
                self.user_paused = true;
                self.stage = Paused;
            }
            (Kind::Run, Pausing, Exit::Cancelled) => {
                self.outcome = Some(Outcome::Cancelled);
                self.user_paused = true;
                self.stage = Paused;
            }
            // A pre-start check returned.
            (Kind::Prep, Resuming, Exit::Ok) => {
                // "preparation ok → launch run → Running", same generation.
                self.launch();
                self.stage = Running;
            }
            (Kind::Prep, Resuming, Exit::Failed(failure)) => {
                self.outcome = Some(failed(failure));
                self.stage = Paused;
            }
            // Nobody asked the check to stop: like a run, an unrequested cancel is
            // an error (the crate's reading, src/table/tests.rs).
            (Kind::Prep, Resuming, Exit::Cancelled) => {
                self.outcome = Some(failed(Failure::Unrequested));
                self.stage = Paused;
            }
            // A check that completed although it was cancelled launches nothing: the
            // pause wins, and the outcome says cancelled (src/table/tests.rs).
            (Kind::Prep, Pausing, Exit::Ok | Exit::Cancelled) => {
                self.outcome = Some(Outcome::Cancelled);
                self.user_paused = true;
                self.stage = Paused;
            }
            (Kind::Prep, Pausing, Exit::Failed(failure)) => {
                self.outcome = Some(failed(failure));
                self.user_paused = true;
                self.stage = Paused;
            }
            // Stopping: any exit → Stopped, units closed; an error is kept as the
            // outcome. A run that returned Ok completed its unit; a check that
            // returned Ok completed nothing, so it counts as cancelled.
            (kind, Stopping, exit) => {
                self.outcome = Some(match (kind, exit) {
                    (Kind::Run, Exit::Ok) => {
                        self.complete_unit();
                        Outcome::Completed
                    }
                    (Kind::Prep, Exit::Ok) | (_, Exit::Cancelled) => Outcome::Cancelled,
                    (_, Exit::Failed(failure)) => failed(failure),
                });
                // Stopping lasts until the closes' report: one more accepted input.
                self.close_remaining();
                self.stage = Stopped;
                self.seq += 1;
            }
            (kind, stage, exit) => {
                panic!("model: {kind:?} exit {exit:?} with something alive in {stage}")
            }
        }
        self.seq += 1;
        self.check_self();
        true
    }

    /// Marks what is alive as asked to stop.
    fn cancel_alive(&mut self) {
        if let Some(alive) = &mut self.alive {
            alive.cancelled = true;
        }
    }

    /// Launches a run of the current unit in the current generation.
    fn launch(&mut self) {
        self.alive = Some(Alive {
            kind: Kind::Run,
            generation: self.generation,
            unit: self.unit,
            resume: self.unit_started,
            config: self.config,
            cancelled: false,
        });
        self.unit_started = true;
    }

    /// The current unit completed: it is closed, and the next one becomes current.
    fn complete_unit(&mut self) {
        self.closed[self.unit] = true;
        self.unit += 1;
        self.unit_started = false;
    }

    /// The task stops: every unit that has not completed is closed.
    fn close_remaining(&mut self) {
        for closed in &mut self.closed[self.unit..] {
            *closed = true;
        }
    }

    /// The model's own consistency: something is alive exactly in the stages where
    /// the specification says a run or a check may be.
    fn check_self(&self) {
        assert_eq!(
            self.alive.is_some(),
            matches!(
                self.stage,
                Stage::Running | Stage::Pausing | Stage::Resuming | Stage::Stopping
            ),
            "model: alive = {:?} in {}",
            self.alive,
            self.stage
        );
        if let Some(alive) = self.alive {
            assert_eq!(alive.generation, self.generation, "model: alive generation");
            assert_eq!(
                alive.cancelled,
                matches!(self.stage, Stage::Pausing | Stage::Stopping),
                "model: cancelled in {}",
                self.stage
            );
            assert!(
                alive.kind == Kind::Run || self.stage != Stage::Running,
                "model: a check alive in Running"
            );
        }
    }
}

/// Compares an outcome the crate recorded with the model's.
pub(crate) fn outcome_matches(seen: Option<&crate::Outcome>, want: Option<Outcome>) -> bool {
    use crate::Outcome as O;
    match (seen, want) {
        (None, None) => true,
        (Some(O::Completed), Some(Outcome::Completed)) => true,
        // The model does not tell a run that returned when cancelled from one a stop
        // aborted after its grace: both are its Cancelled. The difference is held by
        // `runtime::an_aborted_run_says_so_and_a_cancelled_one_says_that`.
        (Some(O::Cancelled | O::Aborted), Some(Outcome::Cancelled)) => true,
        (
            Some(O::Failed(error)),
            Some(Outcome::Failed {
                kind,
                generation,
                failure,
            }),
        ) => match failure {
            Failure::Unrequested => error.is_unrequested_cancel() && !error.is_panic(),
            Failure::Panic => {
                error.is_panic() && error.to_string().contains(&panic_message(kind, generation))
            }
            Failure::Error => {
                !error.is_panic()
                    && !error.is_unrequested_cancel()
                    && error.to_string() == failure_message(kind, generation)
            }
        },
        _ => false,
    }
}

/// What a test sees of a task, whichever layer it comes from.
#[derive(Debug)]
pub(crate) struct Seen<'a> {
    pub(crate) stage: Stage,
    pub(crate) generation: u64,
    pub(crate) unit: Option<usize>,
    pub(crate) outcome: Option<&'a crate::Outcome>,
    pub(crate) user_paused: bool,
    pub(crate) seq: u64,
}

/// Asserts that what the test sees of the task agrees with the model.
///
/// # Panics
///
/// If and only if a field differs; the message names the field.
pub(crate) fn assert_agrees(seen: &Seen<'_>, model: &Model) {
    assert_eq!(seen.stage, model.stage, "stage (model: {model:?})");
    assert_eq!(seen.generation, model.generation, "generation");
    assert_eq!(seen.unit, model.current_unit(), "current unit");
    assert!(
        outcome_matches(seen.outcome, model.outcome),
        "outcome: the task has {:?}, the model {:?}",
        seen.outcome,
        model.outcome
    );
    assert_eq!(seen.user_paused, model.user_paused, "user-paused mark");
    assert_eq!(seen.seq, model.seq, "accepted inputs (seq)");
}
