//! The transition table against the specification, pair by pair.
//!
//! `expected` below is written straight from the normative table of the design
//! (docs/design.md), independently of the table in `src/table.rs`; the test walks every
//! (stage, input) pair and compares.

use super::{decide, render_markdown, Input, MarkChange, OutcomeChange, Verdict};
use crate::{Refusal, Stage};

/// The specification's answer, reduced to what the test compares.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    Refuse(Refusal),
    Ignore,
    To {
        stage: Stage,
        cancel: bool,
        start: Start,
        close_units: bool,
        unit_done: bool,
        outcome: OutcomeChange,
        mark: MarkChange,
    },
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Start {
    Nothing,
    /// A new generation whose pre-start check runs (Resuming).
    Prepare,
    /// The prepared generation's run.
    Launch,
    /// The next unit's first run, as a new generation.
    LaunchNext,
}

fn to(stage: Stage) -> Want {
    Want::To {
        stage,
        cancel: false,
        start: Start::Nothing,
        close_units: false,
        unit_done: false,
        outcome: OutcomeChange::Keep,
        mark: MarkChange::Keep,
    }
}

impl Want {
    fn with(mut self, f: impl FnOnce(&mut bool, &mut Start, &mut bool, &mut bool)) -> Want {
        if let Want::To {
            cancel,
            start,
            close_units,
            unit_done,
            ..
        } = &mut self
        {
            f(cancel, start, close_units, unit_done);
        }
        self
    }
    fn cancel(self) -> Want {
        self.with(|c, _, _, _| *c = true)
    }
    fn start(self, s: Start) -> Want {
        self.with(|_, st, _, _| *st = s)
    }
    fn close(self) -> Want {
        self.with(|_, _, c, _| *c = true)
    }
    fn unit_done(self) -> Want {
        self.with(|_, _, _, u| *u = true)
    }
    fn outcome(mut self, o: OutcomeChange) -> Want {
        if let Want::To { outcome, .. } = &mut self {
            *outcome = o;
        }
        self
    }
    fn mark(mut self, m: MarkChange) -> Want {
        if let Want::To { mark, .. } = &mut self {
            *mark = m;
        }
        self
    }
}

fn expected(stage: Stage, input: Input) -> Want {
    use Input::*;
    use MarkChange as M;
    use OutcomeChange as O;
    use Stage::*;
    let run_event = matches!(input, RunOk { .. } | RunFailed | RunCancelled);
    let prep_event = matches!(input, PrepOk | PrepFailed | PrepCancelled);
    match (stage, input) {
        // New
        (New, Pause) => Want::Refuse(Refusal::NotStarted),
        (New, Resume) => to(Resuming).start(Start::Prepare).mark(M::Clear),
        (New, Stop) => to(Stopping).close(),
        (New, Update) => to(New),
        (New, _) => Want::Ignore,
        // Running
        (Running, Pause) => to(Pausing).cancel(),
        (Running, Resume) => Want::Refuse(Refusal::AlreadyRunning),
        (Running, Stop) => to(Stopping).cancel(),
        (Running, Update) => Want::Refuse(Refusal::UnitInUse),
        (Running, RunOk { last_unit: false }) => to(Running)
            .unit_done()
            .start(Start::LaunchNext)
            .outcome(O::Completed),
        (Running, RunOk { last_unit: true }) => to(Finished).unit_done().outcome(O::Completed),
        (Running, RunFailed) => to(Paused).outcome(O::Failed),
        // Not cancelled by us: treated as an error.
        (Running, RunCancelled) => to(Paused).outcome(O::UnrequestedCancel),
        (Running, _) if prep_event => Want::Ignore,
        // Pausing
        (Pausing, Pause) => to(Pausing),
        (Pausing, Resume) => Want::Refuse(Refusal::StillRunning),
        (Pausing, Stop) => to(Stopping),
        (Pausing, Update) => Want::Refuse(Refusal::UnitInUse),
        (Pausing, RunOk { last_unit: false }) => {
            to(Paused).unit_done().outcome(O::Completed).mark(M::Set)
        }
        (Pausing, RunOk { last_unit: true }) => {
            to(Finished).unit_done().outcome(O::Completed).mark(M::Set)
        }
        (Pausing, RunFailed | PrepFailed) => to(Paused).outcome(O::Failed).mark(M::Set),
        (Pausing, RunCancelled | PrepCancelled | PrepOk) => {
            to(Paused).outcome(O::Cancelled).mark(M::Set)
        }
        // Paused
        (Paused, Pause) => to(Paused).mark(M::Set),
        (Paused, Resume) => to(Resuming).start(Start::Prepare).mark(M::Clear),
        (Paused, Stop) => to(Stopping).close(),
        (Paused, Update) => to(Paused),
        (Paused, _) => Want::Ignore,
        // Resuming
        (Resuming, Pause) => to(Pausing).cancel(),
        (Resuming, Resume) => Want::Refuse(Refusal::AlreadyResuming),
        (Resuming, Stop) => to(Stopping).cancel(),
        (Resuming, Update) => Want::Refuse(Refusal::UnitInUse),
        (Resuming, PrepOk) => to(Running).start(Start::Launch),
        (Resuming, PrepFailed) => to(Paused).outcome(O::Failed),
        (Resuming, PrepCancelled) => to(Paused).outcome(O::UnrequestedCancel),
        (Resuming, _) if run_event => Want::Ignore,
        // Stopping
        (Stopping, Pause | Resume | Update) => Want::Refuse(Refusal::StopInProgress),
        (Stopping, Stop) => to(Stopping),
        // Stopped means every unit closed (invariant 9): a stop stays Stopping until
        // the closes it asked for have returned.
        (Stopping, RunOk { .. }) => to(Stopping).unit_done().close().outcome(O::Completed),
        (Stopping, RunFailed | PrepFailed) => to(Stopping).close().outcome(O::Failed),
        (Stopping, RunCancelled | PrepCancelled | PrepOk) => {
            to(Stopping).close().outcome(O::Cancelled)
        }
        (Stopping, Closed) => to(Stopped),
        (_, Closed) => Want::Ignore,
        // Terminal stages
        (Stopped, Stop) => to(Stopped),
        (Stopped, Pause | Resume | Update) => Want::Refuse(Refusal::Stopped),
        (Finished, Stop) => to(Finished),
        (Finished, Pause | Resume | Update) => Want::Refuse(Refusal::Finished),
        (Stopped | Finished, _) => Want::Ignore,
        (stage, input) => panic!("the expected table has no cell for {stage} × {input:?}"),
    }
}

fn actual(stage: Stage, input: Input) -> Want {
    match decide(stage, input) {
        Verdict::Refused(reason) => Want::Refuse(reason),
        Verdict::Ignored => Want::Ignore,
        Verdict::Step(step) => {
            let e = step.effects;
            let start = match (e.new_generation, e.prepare, e.launch) {
                (false, false, false) => Start::Nothing,
                (true, true, false) => Start::Prepare,
                (false, false, true) => Start::Launch,
                (true, false, true) => Start::LaunchNext,
                other => panic!("{stage} × {input:?}: incoherent start effects {other:?}"),
            };
            let want = Want::To {
                stage: step.to,
                cancel: e.cancel,
                start,
                close_units: e.close_units,
                unit_done: e.unit_done,
                outcome: step.outcome,
                mark: step.mark,
            };
            // Config is applied exactly where update is accepted.
            assert_eq!(
                e.apply_config,
                input == Input::Update,
                "{stage} × {input:?}: apply_config"
            );
            want
        }
    }
}

#[test]
fn every_stage_input_pair_matches_the_specification() {
    let mut checked = 0;
    for stage in Stage::ALL {
        for input in Input::ALL {
            assert_eq!(
                actual(stage, input),
                expected(stage, input),
                "cell {stage} × {input:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, Stage::ALL.len() * Input::ALL.len());
    assert_eq!(checked, 96);
}

#[test]
fn a_pause_in_running_cancels_and_a_resume_in_pausing_is_refused() {
    let Verdict::Step(step) = decide(Stage::Running, Input::Pause) else {
        panic!("a pause in Running is accepted");
    };
    assert_eq!(step.to, Stage::Pausing);
    assert!(step.effects.cancel);
    assert_eq!(
        decide(Stage::Pausing, Input::Resume),
        Verdict::Refused(Refusal::StillRunning)
    );
}

#[test]
fn refusals_are_exactly_commands() {
    for stage in Stage::ALL {
        for input in Input::ALL {
            if let Verdict::Refused(_) = decide(stage, input) {
                assert!(input.command().is_some(), "{stage} refused event {input:?}");
            }
        }
    }
}

#[test]
fn no_transitional_stage_outlives_its_cause() {
    // Invariant 4 at table level: in every transitional stage, every exit of what
    // may be in flight leads out of that stage (Resuming has only a preparation in
    // flight; Pausing and Stopping may wait for either).
    let events = || Input::ALL.into_iter().filter(|i| i.command().is_none());
    let prep_only =
        |i: &Input| matches!(i, Input::PrepOk | Input::PrepFailed | Input::PrepCancelled);
    let stopping_only = |i: &Input| *i == Input::Closed;
    for stage in [Stage::Pausing, Stage::Stopping, Stage::Resuming] {
        for input in events()
            .filter(|i| stage != Stage::Resuming || prep_only(i))
            .filter(|i| stage == Stage::Stopping || !stopping_only(i))
        {
            match decide(stage, input) {
                // Stopping hands over from the run to the closes: it is left on their
                // report, `units closed`.
                Verdict::Step(step) if stage == Stage::Stopping && input != Input::Closed => {
                    assert!(
                        step.effects.close_units,
                        "{stage} × {input:?} closes nothing"
                    );
                    let Verdict::Step(after) = decide(step.to, Input::Closed) else {
                        panic!("{stage} × {input:?}: the closes' report is not accepted");
                    };
                    assert_eq!(after.to, Stage::Stopped, "{stage} × {input:?}, then closed");
                }
                Verdict::Step(step) => assert_ne!(step.to, stage, "{stage} × {input:?}"),
                other => panic!("{stage} × {input:?} gave {other:?}"),
            }
        }
    }
}

#[test]
fn docs_stages_md_is_rendered_from_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/stages.md");
    let rendered = render_markdown();
    if std::env::var_os("TASKSTAGE_BLESS").is_some() {
        std::fs::write(path, &rendered).expect("write docs/stages.md");
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "docs/stages.md is stale: regenerate it with `TASKSTAGE_BLESS=1 cargo test -p taskstage --lib table`"
    );
}

/// The public cause of every input names it as the table does, and is the same command.
#[test]
fn every_input_has_a_cause_of_the_same_name_and_command() {
    for input in Input::ALL {
        let cause = crate::Cause::from(input);
        assert_eq!(cause.name(), input.label(), "{input:?}");
        assert_eq!(cause.command(), input.command(), "{input:?}");
    }
}
