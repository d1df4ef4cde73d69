//! The eight stages of a task and the commands a caller can issue.

use std::fmt;

/// What is true of a task's work right now.
///
/// A stage never claims more than is true: [`Stage::Paused`] means the last run has
/// returned and its future has been dropped; [`Stage::Running`] means exactly one run
/// is alive and a pause will reach it. While a run is being cancelled the stage says so
/// ([`Stage::Pausing`], [`Stage::Stopping`]).
///
/// # Examples
///
/// ```
/// use taskstage::Stage;
///
/// assert!(Stage::Pausing.run_may_be_alive());
/// assert!(!Stage::Paused.run_may_be_alive());
/// assert!(Stage::Stopped.is_terminal());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Stage {
    /// Created, not started. No run is alive.
    New = 0,
    /// Exactly one run is alive, and its cancel handle is installed.
    Running = 1,
    /// A pause was accepted; the run (or a pre-start check) is being cancelled and has
    /// not returned yet.
    Pausing = 2,
    /// The last run returned (cancelled, completed a unit, or failed: the outcome says
    /// which). No run is alive.
    Paused = 3,
    /// A resume was accepted; the unit's pre-start check is running. No run yet.
    Resuming = 4,
    /// A stop was accepted; the run (or a pre-start check) is being cancelled and has
    /// not returned yet.
    Stopping = 5,
    /// Terminal: the task was stopped and its units closed. No run is alive.
    Stopped = 6,
    /// Terminal: every unit completed. No run is alive.
    Finished = 7,
}

impl Stage {
    /// Every stage, in declaration order.
    pub const ALL: [Stage; 8] = [
        Stage::New,
        Stage::Running,
        Stage::Pausing,
        Stage::Paused,
        Stage::Resuming,
        Stage::Stopping,
        Stage::Stopped,
        Stage::Finished,
    ];

    /// The stage's name, as printed.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::New => "New",
            Stage::Running => "Running",
            Stage::Pausing => "Pausing",
            Stage::Paused => "Paused",
            Stage::Resuming => "Resuming",
            Stage::Stopping => "Stopping",
            Stage::Stopped => "Stopped",
            Stage::Finished => "Finished",
        }
    }

    /// Whether a run or a pre-start check may be alive in this stage.
    ///
    /// `false` is a guarantee: in New, Paused, Stopped and Finished nothing of the
    /// task's user code is executing.
    pub const fn run_may_be_alive(self) -> bool {
        matches!(
            self,
            Stage::Running | Stage::Pausing | Stage::Resuming | Stage::Stopping
        )
    }

    /// Whether the stage is at rest: nothing runs and nothing is in progress.
    pub const fn is_at_rest(self) -> bool {
        !self.run_may_be_alive()
    }

    /// Whether the stage is transitional: it lasts only until a run or a pre-start
    /// check returns.
    pub const fn is_transitional(self) -> bool {
        matches!(self, Stage::Pausing | Stage::Resuming | Stage::Stopping)
    }

    /// Whether no command can move the task out of this stage.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Stage::Stopped | Stage::Finished)
    }

    /// Decodes the value stored by the core's lock-free stage snapshot.
    ///
    /// The core only ever stores a stage's discriminant, and the eight discriminants
    /// are exactly `0..=7`, so the three low bits decode every stored value and the
    /// decode compiles to a mask: no branch on the read path. Debug builds assert that
    /// nothing else was stored.
    #[inline]
    pub(crate) fn from_raw(raw: u8) -> Stage {
        debug_assert!(raw < 8, "stage snapshot holds {raw}, which is not a stage");
        match raw & 0b111 {
            0 => Stage::New,
            1 => Stage::Running,
            2 => Stage::Pausing,
            3 => Stage::Paused,
            4 => Stage::Resuming,
            5 => Stage::Stopping,
            6 => Stage::Stopped,
            _ => Stage::Finished,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A command a caller issues to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Cancel the run and wait until it has really returned.
    Pause,
    /// Start (or restart) the current unit, after its pre-start check.
    Resume,
    /// Cancel the run, wait until it has returned, close every unit. Terminal.
    Stop,
    /// Replace the task's configuration; only while no run holds a unit.
    Update,
}

impl Command {
    /// Every command, in declaration order.
    pub const ALL: [Command; 4] = [
        Command::Pause,
        Command::Resume,
        Command::Stop,
        Command::Update,
    ];

    /// The command's name, as printed.
    pub const fn name(self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Stop => "stop",
            Command::Update => "update",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What caused a stage change: a command, or the report of a run, a pre-start check
/// or a stop's closing of the units.
///
/// It names the column of the transition table (docs/stages.md) that made the
/// change. New causes may be added, so a `match` needs a wildcard arm.
///
/// # Examples
///
/// ```
/// use taskstage::{Cause, Command};
///
/// assert_eq!(Cause::Pause.command(), Some(Command::Pause));
/// assert_eq!(Cause::RunFailed.command(), None);
/// assert_eq!(Cause::RunOk { last_unit: true }.name(), "run ok (last unit)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The pause command.
    Pause,
    /// The resume command.
    Resume,
    /// The stop command.
    Stop,
    /// The update-config command.
    Update,
    /// The unit's pre-start check (`Unit::prepare`) returned Ok.
    PrepareOk,
    /// The pre-start check returned an error (or panicked).
    PrepareFailed,
    /// The pre-start check returned because it was cancelled.
    PrepareCancelled,
    /// The run returned Ok: its unit is complete.
    RunOk {
        /// Whether the unit was the pipeline's last.
        last_unit: bool,
    },
    /// The run returned an error or panicked.
    RunFailed,
    /// The run returned because it was cancelled, or was aborted.
    RunCancelled,
    /// Every unit a stop closes has been closed: each `close()` has returned.
    Closed,
}

impl Cause {
    /// The command, if the cause is one.
    pub const fn command(self) -> Option<Command> {
        match self {
            Cause::Pause => Some(Command::Pause),
            Cause::Resume => Some(Command::Resume),
            Cause::Stop => Some(Command::Stop),
            Cause::Update => Some(Command::Update),
            _ => None,
        }
    }

    /// A short name, as the transition table and the event stream print it.
    pub const fn name(self) -> &'static str {
        match self {
            Cause::Pause => "pause",
            Cause::Resume => "resume",
            Cause::Stop => "stop",
            Cause::Update => "update",
            Cause::PrepareOk => "prep ok",
            Cause::PrepareFailed => "prep failed",
            Cause::PrepareCancelled => "prep cancelled",
            Cause::RunOk { last_unit: false } => "run ok (more units)",
            Cause::RunOk { last_unit: true } => "run ok (last unit)",
            Cause::RunFailed => "run failed",
            Cause::RunCancelled => "run cancelled",
            Cause::Closed => "units closed",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Stage;

    #[test]
    fn the_snapshot_encoding_round_trips_every_stage() {
        for stage in Stage::ALL {
            assert_eq!(Stage::from_raw(stage as u8), stage);
        }
    }
}
