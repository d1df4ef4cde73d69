//! The protocol this crate replaces, kept only to prove the models' checks are not
//! vacuous.
//!
//! It is the data-migration tool's original protocol: `pause` flips the stage to
//! Paused and cancels the run, but does **not** wait for the run to return; `resume`
//! from Paused launches a new run at once; exit reports carry no generation fence.
//! Driven through the same harness as the real core, the models must catch it.
//!
//! [`LookThenResume`] is the real core with the auto-resume policy's original race put
//! back: look at the task, then resume it whatever happened in between.

use taskstage::lifecycle::{Applied, CancelHandle, Snapshot, Start, StartKind, Transition};
use taskstage::outcome::Exit;
use taskstage::sync::{lock, Arc, Mutex};
use taskstage::table::Input;
use taskstage::{Command, Error, Outcome, Refusal, Stage};

use crate::harness::{Core, Fx, ModelCancel, Protocol, Wait};

/// The pre-fix protocol.
#[derive(Debug)]
pub(crate) struct PreFix(Mutex<State>);

#[derive(Debug)]
struct State {
    stage: Stage,
    generation: u64,
    cancel: Option<ModelCancel>,
    unit: usize,
    units: usize,
    outcome: Option<Outcome>,
    user_paused: bool,
    seq: u64,
}

impl State {
    /// Records a change and returns its effects (none yet).
    fn step(&mut self, from: Stage, to: Stage, cause: Input) -> Fx {
        self.stage = to;
        self.seq += 1;
        Applied {
            transition: Some(Transition {
                from,
                to,
                generation: self.generation,
                cause,
                seq: self.seq,
            }),
            cancel: None,
            start: None,
            close: None,
            orphan: None,
        }
    }

    /// A new generation and its run, launched at once.
    fn launch(&mut self) -> Start<ModelCancel, (), ()> {
        self.generation += 1;
        let cancel = ModelCancel::new_handle();
        self.cancel = Some(cancel.clone());
        Start {
            kind: StartKind::Launch,
            generation: self.generation,
            unit: self.unit,
            resume: false,
            cancel,
            config: Arc::new(()),
            held: Some(()),
        }
    }

    fn refuse(&self, command: Command, reason: Refusal) -> Error {
        Error::Refused {
            command,
            stage: self.stage,
            reason,
        }
    }
}

impl Protocol for PreFix {
    fn with_units(units: usize) -> Self {
        PreFix(Mutex::new(State {
            stage: Stage::New,
            generation: 0,
            cancel: None,
            unit: 0,
            units,
            outcome: None,
            user_paused: false,
            seq: 0,
        }))
    }

    /// The bug: Running goes straight to Paused; the run is cancelled but still alive.
    fn pause(&self) -> Result<Fx, Error> {
        let mut s = lock(&self.0);
        let from = s.stage;
        match from {
            Stage::Running => {
                s.user_paused = true;
                let mut fx = s.step(from, Stage::Paused, Input::Pause);
                fx.cancel = s.cancel.clone();
                Ok(fx)
            }
            Stage::Paused => {
                s.user_paused = true;
                Ok(s.step(from, Stage::Paused, Input::Pause))
            }
            Stage::New => Err(s.refuse(Command::Pause, Refusal::NotStarted)),
            Stage::Stopped => Err(s.refuse(Command::Pause, Refusal::Stopped)),
            _ => Err(s.refuse(Command::Pause, Refusal::Finished)),
        }
    }

    /// The other half of the bug: Paused launches a new run at once.
    fn resume(&self) -> Result<Fx, Error> {
        let mut s = lock(&self.0);
        let from = s.stage;
        match from {
            Stage::New | Stage::Paused => {
                s.user_paused = false;
                let start = s.launch();
                let mut fx = s.step(from, Stage::Running, Input::Resume);
                fx.start = Some(start);
                Ok(fx)
            }
            Stage::Running => Err(s.refuse(Command::Resume, Refusal::AlreadyRunning)),
            Stage::Stopped => Err(s.refuse(Command::Resume, Refusal::Stopped)),
            _ => Err(s.refuse(Command::Resume, Refusal::Finished)),
        }
    }

    fn stop(&self) -> Result<Fx, Error> {
        let mut s = lock(&self.0);
        let from = s.stage;
        if from.is_terminal() {
            return Ok(s.step(from, from, Input::Stop));
        }
        let mut fx = s.step(from, Stage::Stopped, Input::Stop);
        if from == Stage::Running {
            fx.cancel = s.cancel.clone();
        }
        fx.close = Some(vec![(); s.units - s.unit.min(s.units)]);
        Ok(fx)
    }

    /// The pre-fix auto-resume looked at the task, then resumed it unconditionally.
    fn resume_if_unchanged(&self, _seq: u64) -> Result<Fx, Error> {
        self.resume()
    }

    /// Nothing to wait for: the stage already says Paused (or Stopped).
    fn settle(&self, _command: Command, accepted: &Transition, _wait: Wait) -> Stage {
        accepted.to
    }

    /// No generation fence: any report in Running is taken as the live run's.
    fn report_exit(&self, _generation: u64, exit: Exit, _held: Option<()>) -> Fx {
        let mut s = lock(&self.0);
        let from = s.stage;
        if from != Stage::Running {
            return Fx::ignored();
        }
        match exit {
            Exit::Ok => {
                s.outcome = Some(Outcome::Completed);
                s.unit += 1;
                if s.unit >= s.units {
                    let fx = s.step(from, Stage::Finished, Input::RunOk { last_unit: true });
                    // (the old protocol closed the completed unit here)
                    fx
                } else {
                    let start = s.launch();
                    let mut fx = s.step(from, Stage::Running, Input::RunOk { last_unit: false });
                    // (the old protocol closed the completed unit here)
                    fx.start = Some(start);
                    fx
                }
            }
            Exit::Failed(error) => {
                s.outcome = Some(Outcome::Failed(error));
                s.step(from, Stage::Paused, Input::RunFailed)
            }
            // The old protocol did not tell an abort from a cancel.
            Exit::Cancelled | Exit::Aborted => {
                s.outcome = Some(Outcome::Cancelled);
                s.step(from, Stage::Paused, Input::RunCancelled)
            }
        }
    }

    /// The pre-fix protocol has no pre-start check.
    /// The old protocol went to Stopped at once: there is no closes' report.
    fn report_closed(&self, _generation: u64) -> Fx {
        Fx::ignored()
    }

    fn report_prepared(&self, _generation: u64, _exit: Exit, _held: Option<()>) -> Fx {
        Fx::ignored()
    }

    fn snapshot(&self) -> Snapshot {
        let s = lock(&self.0);
        Snapshot {
            stage: s.stage,
            generation: s.generation,
            unit: (s.unit < s.units).then_some(s.unit),
            units: s.units,
            outcome: s.outcome.clone(),
            user_paused: s.user_paused,
            seq: s.seq,
        }
    }
}

/// The real core, driven by the auto-resume policy as it was before the core offered a
/// compare-and-set: the policy looked at the task, then resumed it unconditionally.
/// Everything else is the real core, so a model that catches this catches the
/// policy's race and nothing else.
#[derive(Debug)]
pub(crate) struct LookThenResume(Core);

impl Protocol for LookThenResume {
    fn with_units(units: usize) -> Self {
        LookThenResume(Core::with_units(units))
    }

    fn pause(&self) -> Result<Fx, Error> {
        self.0.pause()
    }

    fn resume(&self) -> Result<Fx, Error> {
        self.0.resume()
    }

    fn stop(&self) -> Result<Fx, Error> {
        self.0.stop()
    }

    /// The race: whatever changed since the look, resume.
    fn resume_if_unchanged(&self, _seq: u64) -> Result<Fx, Error> {
        self.0.resume()
    }

    fn settle(&self, command: Command, accepted: &Transition, wait: Wait) -> Stage {
        self.0.settle(command, accepted, wait)
    }

    fn report_exit(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx {
        self.0.report_exit(generation, exit, held)
    }

    fn report_prepared(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx {
        self.0.report_prepared(generation, exit, held)
    }

    fn report_closed(&self, generation: u64) -> Fx {
        self.0.lifecycle().report_closed(generation)
    }

    fn snapshot(&self) -> Snapshot {
        self.0.snapshot()
    }
}
