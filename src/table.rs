//! The transition table: the single place where a transition is decided.
//!
//! It is pure. [`decide`] maps a stage and an [`Input`] to a [`Verdict`]: the next
//! stage with the [`Effects`] the layer above must carry out, a [`Refusal`], or
//! [`Verdict::Ignored`] for an event that cannot belong to the stage. It takes no lock,
//! does no I/O and never awaits; the lifecycle core calls it under its lock and
//! carries the effects out after releasing it.
//!
//! The table is a [`statig`] state machine in blocking mode, one state handler per
//! stage. `docs/stages.md` is rendered from it by [`render_markdown`], and a test
//! fails when that file is stale.

use std::fmt;
#[cfg(test)]
use std::fmt::Write as _;

use statig::blocking::{InitializedStateMachine, IntoStateMachineExt as _, Outcome as Flow};
use statig::prelude::{Handled, Transition};

use crate::error::Refusal;
use crate::stage::{Cause, Command, Stage};

/// One input to the table: a caller's command, or an event reported by a run or by a
/// pre-start check ("preparation").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// The pause command.
    Pause,
    /// The resume command.
    Resume,
    /// The stop command.
    Stop,
    /// The update-config command.
    Update,
    /// The pre-start check returned Ok.
    PrepOk,
    /// The pre-start check returned an error (or panicked).
    PrepFailed,
    /// The pre-start check returned because it was cancelled.
    PrepCancelled,
    /// The run returned Ok: its unit is complete.
    RunOk {
        /// Whether the unit was the pipeline's last.
        last_unit: bool,
    },
    /// The run returned an error or panicked.
    RunFailed,
    /// The run returned because it was cancelled (or was aborted).
    RunCancelled,
    /// Every unit a stop closes has been closed: each `close()` has returned.
    Closed,
}

impl Input {
    /// Every input, in the order of the rendered table's columns.
    pub const ALL: [Input; 12] = [
        Input::Pause,
        Input::Resume,
        Input::Stop,
        Input::Update,
        Input::RunOk { last_unit: false },
        Input::RunOk { last_unit: true },
        Input::RunFailed,
        Input::RunCancelled,
        Input::PrepOk,
        Input::PrepFailed,
        Input::PrepCancelled,
        Input::Closed,
    ];

    /// The input for a caller's command.
    pub const fn from_command(command: Command) -> Input {
        match command {
            Command::Pause => Input::Pause,
            Command::Resume => Input::Resume,
            Command::Stop => Input::Stop,
            Command::Update => Input::Update,
        }
    }

    /// The command this input carries, if it is one.
    pub const fn command(self) -> Option<Command> {
        match self {
            Input::Pause => Some(Command::Pause),
            Input::Resume => Some(Command::Resume),
            Input::Stop => Some(Command::Stop),
            Input::Update => Some(Command::Update),
            _ => None,
        }
    }

    /// A short name for the rendered table.
    pub const fn label(self) -> &'static str {
        match self {
            Input::Pause => "pause",
            Input::Resume => "resume",
            Input::Stop => "stop",
            Input::Update => "update",
            Input::PrepOk => "prep ok",
            Input::PrepFailed => "prep failed",
            Input::PrepCancelled => "prep cancelled",
            Input::RunOk { last_unit: false } => "run ok (more units)",
            Input::RunOk { last_unit: true } => "run ok (last unit)",
            Input::RunFailed => "run failed",
            Input::RunCancelled => "run cancelled",
            Input::Closed => "units closed",
        }
    }
}

impl From<Input> for Cause {
    fn from(input: Input) -> Cause {
        match input {
            Input::Pause => Cause::Pause,
            Input::Resume => Cause::Resume,
            Input::Stop => Cause::Stop,
            Input::Update => Cause::Update,
            Input::PrepOk => Cause::PrepareOk,
            Input::PrepFailed => Cause::PrepareFailed,
            Input::PrepCancelled => Cause::PrepareCancelled,
            Input::RunOk { last_unit } => Cause::RunOk { last_unit },
            Input::RunFailed => Cause::RunFailed,
            Input::RunCancelled => Cause::RunCancelled,
            Input::Closed => Cause::Closed,
        }
    }
}

/// What the layer above must do after the core releases its lock.
///
/// The fields are independent; the core carries them out in this order:
/// `cancel`, `unit_done`, `new_generation`, `prepare`, `launch`, `close_units`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Effects {
    /// Cancel the live run or preparation of the current generation.
    pub cancel: bool,
    /// The current unit completed (the run closed it before reporting): move to the
    /// next one.
    pub unit_done: bool,
    /// Start a new generation (with a fresh cancel handle) before preparing or
    /// launching.
    pub new_generation: bool,
    /// Start the current unit's pre-start check.
    pub prepare: bool,
    /// Launch a run of the current unit.
    pub launch: bool,
    /// Close every unit that has not completed, then report [`Input::Closed`]. The
    /// stage stays Stopping until that report: Stopped means every `close()` returned.
    pub close_units: bool,
    /// Store the new configuration.
    pub apply_config: bool,
}

impl Effects {
    const NONE: Effects = Effects {
        cancel: false,
        unit_done: false,
        new_generation: false,
        prepare: false,
        launch: false,
        close_units: false,
        apply_config: false,
    };
}

/// How a step changes the recorded outcome of the last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeChange {
    /// Leave the outcome as it is.
    Keep,
    /// The unit completed.
    Completed,
    /// The run (or preparation) failed; the error it returned is recorded.
    Failed,
    /// The run reported a cancellation that no command asked for: recorded as a
    /// failure.
    UnrequestedCancel,
    /// The run was cancelled by a pause or a stop.
    Cancelled,
}

/// How a step changes the user-paused mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkChange {
    /// Leave the mark as it is.
    Keep,
    /// Set it: the pause command was issued.
    Set,
    /// Clear it: a resume was accepted.
    Clear,
}

/// An accepted input: where the task goes and what must happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// The stage after the input (may equal the stage before).
    pub to: Stage,
    /// The effects to carry out.
    pub effects: Effects,
    /// The change to the recorded outcome.
    pub outcome: OutcomeChange,
    /// The change to the user-paused mark.
    pub mark: MarkChange,
}

/// The table's answer for one (stage, input) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum Verdict {
    /// The input is accepted.
    Step(Step),
    /// The command is refused; nothing changes.
    Refused(Refusal),
    /// The event cannot belong to this stage (the specification's "–"); nothing
    /// changes.
    Ignored,
}

/// Decides what `input` does in `stage`: for example, a pause in Running steps to
/// Pausing with the cancel effect, and a resume in Pausing is refused with
/// `Refusal::StillRunning` (`src/table/tests.rs` checks every cell).
pub fn decide(stage: Stage, input: Input) -> Verdict {
    let mut record = Record {
        verdict: Verdict::Ignored,
        effects: Effects::NONE,
        outcome: OutcomeChange::Keep,
        mark: MarkChange::Keep,
    };
    let mut machine = machine_at(stage, &mut record);
    machine.handle_with_context(&input, &mut record);
    match record.verdict {
        Verdict::Step(_) => Verdict::Step(Step {
            to: machine.state().stage(),
            effects: record.effects,
            outcome: record.outcome,
            mark: record.mark,
        }),
        other => other,
    }
}

fn machine_at(stage: Stage, record: &mut Record) -> InitializedStateMachine<Table> {
    let mut machine = Table.uninitialized_state_machine();
    *machine.state_mut() = TableState::of(stage);
    // No state has an entry action, so initialising runs no handler.
    machine.init_with_context(record)
}

/// What a handler writes while deciding.
#[derive(Debug)]
struct Record {
    verdict: Verdict,
    effects: Effects,
    outcome: OutcomeChange,
    mark: MarkChange,
}

impl Record {
    fn refuse(&mut self, reason: Refusal) -> Flow<TableState> {
        self.verdict = Verdict::Refused(reason);
        Handled
    }

    fn ignore(&mut self) -> Flow<TableState> {
        self.verdict = Verdict::Ignored;
        Handled
    }

    /// Accepts the input and stays in the same stage.
    fn stay(&mut self) -> Flow<TableState> {
        self.accept();
        Handled
    }

    fn accept(&mut self) -> &mut Self {
        // The `to` field is filled in from the machine's state by `decide`.
        self.verdict = Verdict::Step(Step {
            to: Stage::New,
            effects: Effects::NONE,
            outcome: OutcomeChange::Keep,
            mark: MarkChange::Keep,
        });
        self
    }

    fn effects(&mut self, f: impl FnOnce(&mut Effects)) -> &mut Self {
        f(&mut self.effects);
        self
    }

    fn outcome(&mut self, outcome: OutcomeChange) -> &mut Self {
        self.outcome = outcome;
        self
    }

    fn mark(&mut self, mark: MarkChange) -> &mut Self {
        self.mark = mark;
        self
    }

    fn to(&mut self, state: TableState) -> Flow<TableState> {
        Transition(state)
    }
}

/// The statig machine. It has no storage of its own: everything it decides goes into
/// the [`Record`] context.
#[derive(Debug, Default)]
struct Table;

#[statig::blocking::state_machine(
    initial = "TableState::new()",
    state(name = "TableState", derive(Debug, Clone, Copy, PartialEq, Eq)),
    visibility = "pub(crate)"
)]
impl Table {
    #[allow(
        clippy::new_ret_no_self,
        reason = "statig names each state after its handler, and this state is New"
    )]
    #[state]
    fn new(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Pause => context.refuse(Refusal::NotStarted),
            Input::Resume => context
                .accept()
                .effects(|e| {
                    e.new_generation = true;
                    e.prepare = true;
                })
                .mark(MarkChange::Clear)
                .to(TableState::resuming()),
            // Nothing is alive; Stopped waits for the units' closes.
            Input::Stop => context
                .accept()
                .effects(|e| e.close_units = true)
                .to(TableState::stopping()),
            Input::Update => {
                context.accept().effects(|e| e.apply_config = true);
                Handled
            }
            _ => context.ignore(),
        }
    }

    #[state]
    fn running(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Pause => context
                .accept()
                .effects(|e| e.cancel = true)
                .to(TableState::pausing()),
            Input::Resume => context.refuse(Refusal::AlreadyRunning),
            Input::Stop => context
                .accept()
                .effects(|e| e.cancel = true)
                .to(TableState::stopping()),
            Input::Update => context.refuse(Refusal::UnitInUse),
            Input::RunOk { last_unit: false } => context
                .accept()
                .effects(|e| {
                    e.unit_done = true;
                    e.new_generation = true;
                    e.launch = true;
                })
                .outcome(OutcomeChange::Completed)
                .to(TableState::running()),
            Input::RunOk { last_unit: true } => context
                .accept()
                .effects(|e| e.unit_done = true)
                .outcome(OutcomeChange::Completed)
                .to(TableState::finished()),
            Input::RunFailed => context
                .accept()
                .outcome(OutcomeChange::Failed)
                .to(TableState::paused()),
            Input::RunCancelled => context
                .accept()
                .outcome(OutcomeChange::UnrequestedCancel)
                .to(TableState::paused()),
            Input::PrepOk | Input::PrepFailed | Input::PrepCancelled | Input::Closed => {
                context.ignore()
            }
        }
    }

    #[state]
    fn pausing(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            // A second pause joins the first: it waits for Paused too.
            Input::Pause => context.stay(),
            Input::Resume => context.refuse(Refusal::StillRunning),
            // The run (or preparation) is already being cancelled.
            Input::Stop => context.accept().to(TableState::stopping()),
            Input::Update => context.refuse(Refusal::UnitInUse),
            Input::RunOk { last_unit: false } => context
                .accept()
                .effects(|e| e.unit_done = true)
                .outcome(OutcomeChange::Completed)
                .mark(MarkChange::Set)
                .to(TableState::paused()),
            Input::RunOk { last_unit: true } => context
                .accept()
                .effects(|e| e.unit_done = true)
                .outcome(OutcomeChange::Completed)
                .mark(MarkChange::Set)
                .to(TableState::finished()),
            Input::RunFailed | Input::PrepFailed => context
                .accept()
                .outcome(OutcomeChange::Failed)
                .mark(MarkChange::Set)
                .to(TableState::paused()),
            // A preparation that completed although it was cancelled launches nothing.
            Input::RunCancelled | Input::PrepCancelled | Input::PrepOk => context
                .accept()
                .outcome(OutcomeChange::Cancelled)
                .mark(MarkChange::Set)
                .to(TableState::paused()),
            Input::Closed => context.ignore(),
        }
    }

    #[state]
    fn paused(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            // Already at rest; an error-paused task becomes user-paused.
            Input::Pause => {
                context.accept().mark(MarkChange::Set);
                Handled
            }
            Input::Resume => context
                .accept()
                .effects(|e| {
                    e.new_generation = true;
                    e.prepare = true;
                })
                .mark(MarkChange::Clear)
                .to(TableState::resuming()),
            // Nothing is alive; Stopped waits for the units' closes.
            Input::Stop => context
                .accept()
                .effects(|e| e.close_units = true)
                .to(TableState::stopping()),
            Input::Update => {
                context.accept().effects(|e| e.apply_config = true);
                Handled
            }
            _ => context.ignore(),
        }
    }

    #[state]
    fn resuming(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Pause => context
                .accept()
                .effects(|e| e.cancel = true)
                .to(TableState::pausing()),
            Input::Resume => context.refuse(Refusal::AlreadyResuming),
            Input::Stop => context
                .accept()
                .effects(|e| e.cancel = true)
                .to(TableState::stopping()),
            Input::Update => context.refuse(Refusal::UnitInUse),
            Input::PrepOk => context
                .accept()
                .effects(|e| e.launch = true)
                .to(TableState::running()),
            Input::PrepFailed => context
                .accept()
                .outcome(OutcomeChange::Failed)
                .to(TableState::paused()),
            Input::PrepCancelled => context
                .accept()
                .outcome(OutcomeChange::UnrequestedCancel)
                .to(TableState::paused()),
            Input::RunOk { .. } | Input::RunFailed | Input::RunCancelled | Input::Closed => {
                context.ignore()
            }
        }
    }

    #[state]
    fn stopping(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Pause | Input::Resume | Input::Update => context.refuse(Refusal::StopInProgress),
            // A second stop joins the first: it waits for Stopped too.
            Input::Stop => context.stay(),
            // The unit completed as it was being stopped (its run closed it): the pointer
            // moves past it and the rest are closed; Stopped waits for those closes.
            Input::RunOk { .. } => {
                context
                    .accept()
                    .effects(|e| {
                        e.unit_done = true;
                        e.close_units = true;
                    })
                    .outcome(OutcomeChange::Completed);
                Handled
            }
            Input::RunFailed | Input::PrepFailed => {
                context
                    .accept()
                    .effects(|e| e.close_units = true)
                    .outcome(OutcomeChange::Failed);
                Handled
            }
            // A check that passed although it was cancelled completed nothing.
            Input::RunCancelled | Input::PrepCancelled | Input::PrepOk => {
                context
                    .accept()
                    .effects(|e| e.close_units = true)
                    .outcome(OutcomeChange::Cancelled);
                Handled
            }
            // Every close has returned: now the task is stopped.
            Input::Closed => context.accept().to(TableState::stopped()),
        }
    }

    #[state]
    fn stopped(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Stop => context.stay(),
            Input::Pause | Input::Resume | Input::Update => context.refuse(Refusal::Stopped),
            _ => context.ignore(),
        }
    }

    #[state]
    fn finished(context: &mut Record, event: &Input) -> Flow<TableState> {
        match event {
            Input::Stop => context.stay(),
            Input::Pause | Input::Resume | Input::Update => context.refuse(Refusal::Finished),
            _ => context.ignore(),
        }
    }
}

impl TableState {
    fn of(stage: Stage) -> TableState {
        match stage {
            Stage::New => TableState::new(),
            Stage::Running => TableState::running(),
            Stage::Pausing => TableState::pausing(),
            Stage::Paused => TableState::paused(),
            Stage::Resuming => TableState::resuming(),
            Stage::Stopping => TableState::stopping(),
            Stage::Stopped => TableState::stopped(),
            Stage::Finished => TableState::finished(),
        }
    }

    fn stage(self) -> Stage {
        match self {
            TableState::New {} => Stage::New,
            TableState::Running {} => Stage::Running,
            TableState::Pausing {} => Stage::Pausing,
            TableState::Paused {} => Stage::Paused,
            TableState::Resuming {} => Stage::Resuming,
            TableState::Stopping {} => Stage::Stopping,
            TableState::Stopped {} => Stage::Stopped,
            TableState::Finished {} => Stage::Finished,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ignored => f.write_str("–"),
            Verdict::Refused(reason) => write!(f, "refuse ({reason})"),
            Verdict::Step(step) => {
                write!(f, "→ {}", step.to)?;
                let e = step.effects;
                let mut parts = Vec::new();
                if e.cancel {
                    parts.push("cancel");
                }
                if e.unit_done {
                    parts.push("next unit");
                }
                if e.new_generation {
                    parts.push("new generation");
                }
                if e.prepare {
                    parts.push("prepare");
                }
                if e.launch {
                    parts.push("launch");
                }
                if e.close_units {
                    parts.push("close units");
                }
                if e.apply_config {
                    parts.push("apply config");
                }
                match step.outcome {
                    OutcomeChange::Keep => {}
                    OutcomeChange::Completed => parts.push("outcome = completed"),
                    OutcomeChange::Failed => parts.push("outcome = error"),
                    OutcomeChange::UnrequestedCancel => {
                        parts.push("outcome = error (unrequested cancel)")
                    }
                    OutcomeChange::Cancelled => parts.push("outcome = cancelled"),
                }
                match step.mark {
                    MarkChange::Keep => {}
                    MarkChange::Set => parts.push("user-paused"),
                    MarkChange::Clear => parts.push("clear user-paused"),
                }
                if !parts.is_empty() {
                    write!(f, "; {}", parts.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

/// Renders the whole table, and a state diagram, as the Markdown of `docs/stages.md`.
#[cfg(test)]
pub(crate) fn render_markdown() -> String {
    let mut out = String::new();
    out.push_str("# Stages and transitions\n\n");
    out.push_str(
        "This file is generated from the transition table in `src/table.rs` by \
         `render_markdown`; the test `src/table/tests.rs` fails when it is stale. \
         Regenerate it with `TASKSTAGE_BLESS=1 cargo test -p taskstage --lib table`.\n\n",
    );
    out.push_str(
        "Rows are stages, columns are inputs: the four commands, then the events a run \
         or a pre-start check (\"prep\") reports. \"refuse\" changes nothing; \"–\" is an \
         event that cannot belong to the stage and is ignored.\n\n",
    );
    out.push_str("| stage \\ input |");
    for input in Input::ALL {
        let _ = write!(out, " {} |", input.label());
    }
    out.push_str("\n|---|");
    for _ in Input::ALL {
        out.push_str("---|");
    }
    out.push('\n');
    for stage in Stage::ALL {
        let _ = write!(out, "| **{stage}** |");
        for input in Input::ALL {
            let _ = write!(out, " {} |", decide(stage, input));
        }
        out.push('\n');
    }
    out.push_str("\n## Diagram\n\n```mermaid\nstateDiagram-v2\n");
    out.push_str("    [*] --> New\n");
    let mut edges: Vec<(Stage, Stage, Vec<&'static str>)> = Vec::new();
    for stage in Stage::ALL {
        for input in Input::ALL {
            if let Verdict::Step(step) = decide(stage, input) {
                if step.to == stage {
                    continue;
                }
                match edges
                    .iter_mut()
                    .find(|(from, to, _)| *from == stage && *to == step.to)
                {
                    Some((_, _, labels)) => labels.push(input.label()),
                    None => edges.push((stage, step.to, vec![input.label()])),
                }
            }
        }
    }
    for (from, to, labels) in edges {
        let _ = writeln!(out, "    {from} --> {to}: {}", labels.join(", "));
    }
    out.push_str("    Stopped --> [*]\n    Finished --> [*]\n```\n");
    out
}

#[cfg(test)]
mod tests;
