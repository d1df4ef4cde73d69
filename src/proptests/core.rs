//! Property tests of the lifecycle core: random sequences of up to 50 inputs (pause,
//! resume, stop, update, and the exits of runs and pre-start checks, stale ones
//! included) run against `crate::lifecycle::Lifecycle` and, step by step, against
//! an independent reference model of the specification (`src/proptests/model.rs`).
//!
//! After every step the test checks that the stage, generation, unit, outcome,
//! user-paused mark, configuration and change counter equal the model's; that a
//! refused command or an ignored report changed nothing; that no more than one run or
//! check is ever alive (a counter kept by drop guards); that what is alive is exactly
//! what the model says, started with the right generation, unit and configuration, and
//! cancelled exactly when the model says; that every unit is closed once, when the
//! model says; and that a pause or a stop reports itself settled only once nothing is
//! alive any more.
//!
//! 10,000 cases by default; `PROPTEST_CASES` overrides it.

use super as common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::lifecycle::{Applied, CancelHandle, Lifecycle, Settle, StartKind};
use crate::{Command, Error, Refusal, RunError, Stage};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};

use common::model::{self, failure_message, Cmd, Exit, Failure, Kind, Model, Seen};

/// A cancel handle the test can read: a shared flag.
#[derive(Debug, Clone, Default)]
struct Flag(Arc<AtomicBool>);

impl Flag {
    fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl CancelHandle for Flag {
    fn new_handle() -> Self {
        Flag::default()
    }

    fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn abort(&self) {
        self.cancel();
    }

    // The scripted driver plays runs by hand and never awaits a signal.
    fn interrupted(
        &self,
        _on_cancel: bool,
    ) -> impl std::future::Future<Output = crate::lifecycle::Interrupt> + Send + '_ {
        std::future::pending()
    }
}

/// One input of a generated sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Pause,
    Resume,
    Stop,
    Update(u32),
    /// The live run returns (finishing right as it is cancelled, when a pause or stop
    /// cancelled it; returning Cancelled when nobody asked, when none did). Does
    /// nothing when no run is alive.
    RunExit(Exit),
    /// The live pre-start check returns. Does nothing when no check is alive.
    PrepExit(Exit),
    /// A report of a generation that is not current, or a second report of one that
    /// already returned. Does nothing if it would be the live one's own report.
    Stale {
        kind: Kind,
        generation: u64,
        exit: Exit,
    },
}

/// What the model says the last step must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Start,
    Accepted,
    Refused(Refusal),
    /// A report the core must ignore.
    Ignored,
    /// Nothing to do: an exit step with nothing of its kind alive, or a "stale"
    /// report that would be the live one's. The generator never makes these; deleting
    /// steps while shrinking does, and letting them pass keeps shrinking effective.
    Idle,
}

/// The reference state: the model and the expectation of the last step.
#[derive(Debug, Clone)]
struct Reference {
    model: Model,
    expect: Expect,
}

fn exit_strategy() -> impl Strategy<Value = Exit> {
    prop_oneof![
        Just(Exit::Ok),
        Just(Exit::Failed(Failure::Error)),
        Just(Exit::Cancelled),
    ]
}

impl ReferenceStateMachine for Reference {
    type State = Reference;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Reference> {
        (1usize..=4)
            .prop_map(|units| Reference {
                model: Model::new(units),
                expect: Expect::Start,
            })
            .boxed()
    }

    fn transitions(state: &Reference) -> BoxedStrategy<Step> {
        let model = &state.model;
        // Most weight on what moves the task on from its stage; stop is final, so it
        // stays rare enough that most sequences get far before it.
        let [pause, resume, stop, update, exit, stale] = match model.stage {
            Stage::New | Stage::Paused => [12, 40, 1, 8, 0, 6],
            Stage::Running => [30, 6, 1, 4, 40, 6],
            Stage::Pausing => [12, 6, 6, 4, 24, 6],
            Stage::Resuming => [20, 6, 1, 4, 40, 6],
            Stage::Stopping => [2, 2, 2, 1, 10, 2],
            Stage::Stopped | Stage::Finished => [1, 1, 1, 1, 0, 1],
        };
        let mut options: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (pause, Just(Step::Pause).boxed()),
            (resume, Just(Step::Resume).boxed()),
            (stop, Just(Step::Stop).boxed()),
            (update, (1u32..1000).prop_map(Step::Update).boxed()),
        ];
        match model.alive.map(|a| a.kind) {
            Some(Kind::Run) => {
                options.push((exit, exit_strategy().prop_map(Step::RunExit).boxed()))
            }
            Some(Kind::Prep) => {
                options.push((exit, exit_strategy().prop_map(Step::PrepExit).boxed()))
            }
            None => {}
        }
        // Any generation but the live one: older, the next one, or the current one
        // once nothing of it is alive.
        let current = model.generation;
        let alive = model.alive.is_some();
        let stale_generation = (0..=current).prop_map(move |g| {
            if alive && g == current {
                current + 1
            } else {
                g
            }
        });
        let kind = prop_oneof![Just(Kind::Run), Just(Kind::Prep)];
        options.push((
            stale,
            (kind, stale_generation, exit_strategy())
                .prop_map(|(kind, generation, exit)| Step::Stale {
                    kind,
                    generation,
                    exit,
                })
                .boxed(),
        ));
        options.retain(|(weight, _)| *weight > 0);
        Union::new_weighted(options).boxed()
    }

    fn apply(mut state: Reference, step: &Step) -> Reference {
        let model = &mut state.model;
        let command = |model: &mut Model, cmd| match model.command(cmd) {
            Ok(()) => Expect::Accepted,
            Err(reason) => Expect::Refused(reason),
        };
        state.expect = match *step {
            Step::Pause => command(model, Cmd::Pause),
            Step::Resume => command(model, Cmd::Resume),
            Step::Stop => command(model, Cmd::Stop),
            Step::Update(value) => command(model, Cmd::Update(value)),
            Step::RunExit(exit) | Step::PrepExit(exit) => {
                let kind = match step {
                    Step::RunExit(_) => Kind::Run,
                    _ => Kind::Prep,
                };
                let generation = model.generation;
                if model.alive.is_some_and(|a| a.kind == kind) {
                    assert!(model.report(kind, generation, exit));
                    Expect::Accepted
                } else {
                    Expect::Idle
                }
            }
            Step::Stale { generation, .. }
                if generation == model.generation && model.alive.is_some() =>
            {
                Expect::Idle
            }
            Step::Stale {
                kind,
                generation,
                exit,
            } => {
                assert!(!model.report(kind, generation, exit));
                Expect::Ignored
            }
        };
        state
    }
}

/// Counts the runs and checks that are alive, through guards they hold.
#[derive(Debug, Default)]
struct Counter {
    now: AtomicUsize,
    max: AtomicUsize,
}

/// Counts one run or check as alive until dropped.
#[derive(Debug)]
struct LiveGuard(Arc<Counter>);

impl LiveGuard {
    fn enter(counter: &Arc<Counter>) -> Self {
        let now = counter.now.fetch_add(1, Ordering::SeqCst) + 1;
        counter.max.fetch_max(now, Ordering::SeqCst);
        LiveGuard(Arc::clone(counter))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A run or check the scripted driver started and has not reported yet.
#[derive(Debug)]
struct LiveRun {
    kind: StartKind,
    generation: u64,
    unit: usize,
    resume: bool,
    config: u32,
    cancel: Flag,
    _guard: LiveGuard,
}

/// The system under test: a lifecycle core and a scripted driver that carries out its
/// effects.
#[derive(Debug)]
struct Driver {
    /// The slots hold each unit's index, so a close can be counted per unit.
    core: Lifecycle<Flag, u32, usize>,
    live: Vec<LiveRun>,
    counter: Arc<Counter>,
    closes: Vec<u32>,
    /// Pauses and stops whose wait has not settled, with the generation they met.
    waiting: Vec<(Command, u64)>,
}

impl Driver {
    /// Carries out the effects of an accepted input, in the documented order.
    fn carry_out(&mut self, applied: Applied<Flag, u32, usize>) {
        if let Some(cancel) = applied.cancel {
            cancel.cancel();
        }
        assert!(
            applied.orphan.is_none(),
            "an accepted report left a unit without a slot"
        );
        if let Some(start) = applied.start {
            assert_eq!(
                start.held,
                Some(start.unit),
                "a start must carry its own unit"
            );
            self.live.push(LiveRun {
                kind: start.kind,
                generation: start.generation,
                unit: start.unit,
                resume: start.resume,
                config: *start.config,
                cancel: start.cancel,
                _guard: LiveGuard::enter(&self.counter),
            });
        }
        if let Some(units) = applied.close {
            for unit in units {
                self.closes[unit] += 1;
            }
            let generation = applied.transition.map(|t| t.generation).unwrap_or_default();
            let closed = self.core.report_closed(generation);
            assert_eq!(
                closed.stage(),
                Some(Stage::Stopped),
                "the closes' report ends the stop"
            );
            self.carry_out(closed);
        }
    }

    /// Removes (and so drops) the live run or check of `kind`, and returns its
    /// generation: a driver reports an exit only after the future is gone.
    fn finish(&mut self, kind: StartKind) -> (u64, usize) {
        let index = self
            .live
            .iter()
            .position(|run| run.kind == kind)
            .unwrap_or_else(|| panic!("the model says a {kind:?} is alive; the driver has none"));
        let run = self.live.remove(index);
        (run.generation, run.unit)
    }

    fn command(&mut self, step: Step, expect: Expect) {
        let before = self.core.snapshot();
        let (command, result) = match step {
            Step::Pause => (Command::Pause, self.core.command(Command::Pause)),
            Step::Resume => (Command::Resume, self.core.command(Command::Resume)),
            Step::Stop => (Command::Stop, self.core.command(Command::Stop)),
            Step::Update(value) => (Command::Update, self.core.update(value)),
            other => unreachable!("{other:?} is not a command"),
        };
        match (result, expect) {
            (Ok(applied), Expect::Accepted) => {
                let transition = applied.transition.expect("an accepted command");
                assert_eq!(transition.from, before.stage, "transition.from");
                if matches!(command, Command::Pause | Command::Stop) {
                    self.waiting.push((command, transition.generation));
                }
                self.carry_out(applied);
            }
            (
                Err(Error::Refused {
                    command: refused,
                    stage,
                    reason,
                }),
                Expect::Refused(want),
            ) => {
                assert_eq!(refused, command, "the refusal names the command");
                assert_eq!(stage, before.stage, "the refusal names the stage");
                assert_eq!(reason, want, "refusal reason");
                common::assert_unchanged(&before, &self.core.snapshot(), "a refused command");
            }
            (result, expect) => {
                panic!(
                    "{step:?} in {}: got {result:?}, the model says {expect:?}",
                    before.stage
                )
            }
        }
    }

    /// Checks the pending pause and stop waits: each reports itself settled exactly
    /// when the model says, and only once nothing is alive (its waiter would wake now).
    fn check_waits(&mut self, model: &Model) {
        let snapshot = self.core.snapshot();
        let live = self.counter.now.load(Ordering::SeqCst);
        self.waiting.retain(|&(command, generation)| {
            let reached =
                Settle::new(command, generation).reached(snapshot.stage, snapshot.generation);
            let want = match command {
                Command::Pause => model.pause_settled() || model.generation != generation,
                _ => model.stop_settled(),
            };
            assert_eq!(
                reached.is_some(),
                want,
                "{command} wait of generation {generation} in {}: settled {reached:?}",
                snapshot.stage
            );
            if let Some(stage) = reached {
                assert_eq!(live, 0, "{command} settled at {stage} while a run is alive");
                let allowed: &[Stage] = match command {
                    Command::Pause => &[Stage::Paused, Stage::Finished, Stage::Stopped],
                    _ => &[Stage::Stopped, Stage::Finished],
                };
                assert!(allowed.contains(&stage), "{command} settled at {stage}");
            }
            reached.is_none()
        });
    }
}

fn core_exit(kind: Kind, generation: u64, exit: Exit) -> crate::outcome::Exit {
    match exit {
        Exit::Ok => crate::outcome::Exit::Ok,
        Exit::Cancelled => crate::outcome::Exit::Cancelled,
        Exit::Failed(_) => {
            crate::outcome::Exit::Failed(RunError::msg(failure_message(kind, generation)))
        }
    }
}

/// The property test itself.
#[derive(Debug)]
struct CoreTest;

impl StateMachineTest for CoreTest {
    type SystemUnderTest = Driver;
    type Reference = Reference;

    fn init_test(reference: &Reference) -> Driver {
        Driver {
            core: Lifecycle::new((0..reference.model.units).collect(), 0),
            live: Vec::new(),
            counter: Arc::default(),
            closes: vec![0; reference.model.units],
            waiting: Vec::new(),
        }
    }

    fn apply(mut driver: Driver, reference: &Reference, step: Step) -> Driver {
        let expect = reference.expect;
        match step {
            _ if expect == Expect::Idle => {}
            Step::Pause | Step::Resume | Step::Stop | Step::Update(_) => {
                driver.command(step, expect);
            }
            Step::RunExit(exit) | Step::PrepExit(exit) => {
                let (kind, start) = match step {
                    Step::RunExit(_) => (Kind::Run, StartKind::Launch),
                    _ => (Kind::Prep, StartKind::Prepare),
                };
                let (generation, unit) = driver.finish(start);
                let exit = core_exit(kind, generation, exit);
                let applied = match kind {
                    // A completed run closes its unit before it reports.
                    Kind::Run if matches!(exit, crate::outcome::Exit::Ok) => {
                        driver.closes[unit] += 1;
                        driver.core.report_exit(generation, exit, None)
                    }
                    Kind::Run => driver.core.report_exit(generation, exit, Some(unit)),
                    Kind::Prep => driver.core.report_prepared(generation, exit, Some(unit)),
                };
                assert!(
                    applied.transition.is_some(),
                    "the exit of the live generation {generation} was ignored"
                );
                driver.carry_out(applied);
            }
            Step::Stale {
                kind,
                generation,
                exit,
            } => {
                let before = driver.core.snapshot();
                let exit = core_exit(kind, generation, exit);
                // A stale report hands back a stand-in unit, which must come back.
                let applied = match kind {
                    Kind::Run => driver.core.report_exit(generation, exit, Some(usize::MAX)),
                    Kind::Prep => driver
                        .core
                        .report_prepared(generation, exit, Some(usize::MAX)),
                };
                assert_eq!(
                    applied.orphan,
                    Some(usize::MAX),
                    "a stale report kept its unit"
                );
                assert!(
                    applied.transition.is_none()
                        && applied.cancel.is_none()
                        && applied.start.is_none()
                        && applied.close.is_none(),
                    "a stale report of generation {generation} was acted on: {applied:?}"
                );
                common::assert_unchanged(&before, &driver.core.snapshot(), "a stale report");
            }
        }
        driver.check_waits(&reference.model);
        driver
    }

    fn check_invariants(driver: &Driver, reference: &Reference) {
        let model = &reference.model;
        let snapshot = driver.core.snapshot();
        model::assert_agrees(
            &Seen {
                stage: snapshot.stage,
                generation: snapshot.generation,
                unit: snapshot.unit,
                outcome: snapshot.outcome.as_ref(),
                user_paused: snapshot.user_paused,
                seq: snapshot.seq,
            },
            model,
        );
        assert_eq!(driver.core.stage(), snapshot.stage, "lock-free stage");
        assert_eq!(*driver.core.config(), model.config, "configuration");

        // Single run, counted by the guards the runs hold.
        let max = driver.counter.max.load(Ordering::SeqCst);
        assert!(max <= 1, "{max} runs or checks were alive at once");
        let now = driver.counter.now.load(Ordering::SeqCst);
        assert_eq!(now, driver.live.len(), "guards and live runs");
        match (model.alive, driver.live.first()) {
            (None, None) => {}
            (Some(alive), Some(run)) => {
                let kind = match run.kind {
                    StartKind::Prepare => Kind::Prep,
                    StartKind::Launch => Kind::Run,
                };
                assert_eq!(kind, alive.kind, "what is alive");
                assert_eq!(run.generation, alive.generation, "live generation");
                assert_eq!(run.unit, alive.unit, "live unit");
                assert_eq!(run.resume, alive.resume, "live run's resume flag");
                assert_eq!(run.config, alive.config, "live run's configuration");
                assert_eq!(
                    run.cancel.is_set(),
                    alive.cancelled,
                    "live run's cancel flag"
                );
            }
            (want, seen) => panic!("alive: the driver has {seen:?}, the model {want:?}"),
        }

        // Every unit closed once, when the model says.
        let want: Vec<u32> = model.closed.iter().map(|&c| u32::from(c)).collect();
        assert_eq!(driver.closes, want, "unit closes");
    }
}

prop_state_machine! {
    #![proptest_config(common::config(10_000, "proptest-regressions/prop_core.txt"))]

    /// Random sequences of commands and exits against the reference model.
    #[test]
    fn core_follows_the_reference_model(sequential 1..=50 => CoreTest);
}
