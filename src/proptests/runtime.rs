//! Property tests of the tokio runtime handle: random sequences of up to 50 inputs run
//! against a real task (`Task::builder(..).unit(..).spawn()` / `spawn_paused()`) whose
//! units are scripted, and, step by step, against the independent reference model of
//! the specification (`src/proptests/model.rs`).
//!
//! Each unit does what the sequence says, when it says: a pre-start check passes,
//! fails or panics on order and otherwise hangs; a run finishes, fails, panics or
//! returns Cancelled on order, and reacts to a pause or a stop as the sequence says
//! (returns Cancelled, finishes right as it is cancelled, fails, or ignores the
//! cancellation so that the pause times out and the stop aborts it). Deadlines run on
//! tokio's paused clock, so they elapse at once and deterministically.
//!
//! After every step the test checks that the task's stage, generation, unit, outcome,
//! user-paused mark, change counter and configuration equal the model's; that every
//! pause and stop returned what the model says (a rest stage, a timeout in Pausing, or
//! a refusal that changed nothing); that no more than one run or check was ever alive
//! (a counter kept by drop guards inside the unit's futures), and none at all the
//! instant a pause or a stop returned Ok; that what is alive is what the model says,
//! with the right generation, unit, resume flag and configuration; and that every unit
//! was closed once, when the model says (a unit whose run was aborted is gone and
//! cannot be closed).
//!
//! 1,000 cases on a current-thread runtime with the paused clock, and 200 on a
//! multi-thread runtime with real (short) deadlines; `PROPTEST_CASES` overrides both.

use super as common;

use std::future::{poll_fn, Future};
use std::panic::PanicHookInfo;
use std::pin::pin;
use std::sync::{Arc, Once};
use std::task::Poll;
use std::time::Duration;

use crate::{Command, Error, Handle, Refusal, RunContext, RunError, RunExit, Stage, Task, Unit};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use tokio::sync::{mpsc, watch};

use common::model::{self, failure_message, panic_message, Cmd, Exit, Failure, Kind, Model, Seen};

/// How a run behaves once a pause or a stop has cancelled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reaction {
    /// Returns Cancelled.
    Cooperate,
    /// Finishes its unit right as it is cancelled.
    Finish,
    /// Fails right as it is cancelled.
    Fail,
    /// Goes on as if nothing happened: a pause times out, a stop aborts it.
    Ignore,
}

/// What the live run does next, on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunAct {
    Finish,
    Fail,
    Panic,
    /// Returns Cancelled (unrequested, unless a pause it ignored is pending).
    ReturnCancelled,
}

/// How the live pre-start check ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrepAct {
    Ok,
    Fail,
    Panic,
}

/// One input of a generated sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `pause()`, with how the live run (if any) reacts to the cancellation.
    Pause(Reaction),
    Resume,
    /// `stop()`, with how the live run (if any) reacts to the cancellation.
    Stop(Reaction),
    Update(u32),
    /// The live run acts; nothing happens when no run is alive.
    Run(RunAct),
    /// The live check ends; nothing happens when no check is alive.
    Prep(PrepAct),
}

/// What the model says the last step must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Start,
    /// Resume or update accepted.
    Accepted,
    Refused(Refusal),
    /// Pause or stop returned Ok with this stage.
    Settled(Stage),
    /// Pause gave up waiting; the stage is still this.
    Timeout(Stage),
    /// Nothing to do: a run or check step with nothing of its kind alive. The
    /// generator never makes these; deleting steps while shrinking does, and letting
    /// them pass keeps shrinking effective.
    Idle,
}

/// The reference state: the lifecycle model plus what the runtime layer adds.
#[derive(Debug, Clone)]
struct Reference {
    model: Model,
    expect: Expect,
    /// Built with `spawn()` (started at once) rather than `spawn_paused()`.
    started: bool,
}

impl Reference {
    /// The runtime's handling of what a pause or a stop cancelled: a check is
    /// dropped at once; a run reacts as scripted, and one that ignores a stop is
    /// aborted after the grace period (its exit then reads as cancelled).
    fn react(&mut self, reaction: Reaction, stopping: bool) {
        let model = &mut self.model;
        let Some(alive) = model.alive.filter(|a| a.cancelled) else {
            return;
        };
        let generation = alive.generation;
        let exit = match (alive.kind, reaction) {
            (Kind::Prep, _) => Some(Exit::Cancelled),
            (Kind::Run, Reaction::Cooperate) => Some(Exit::Cancelled),
            (Kind::Run, Reaction::Finish) => Some(Exit::Ok),
            (Kind::Run, Reaction::Fail) => Some(Exit::Failed(Failure::Error)),
            // Aborted: the run's future is dropped, the unit is kept, and the stop
            // closes it with the others.
            (Kind::Run, Reaction::Ignore) if stopping => Some(Exit::Cancelled),
            (Kind::Run, Reaction::Ignore) => None,
        };
        if let Some(exit) = exit {
            assert!(model.report(alive.kind, generation, exit));
        }
    }

    fn expected_closes(&self) -> Vec<u32> {
        self.model
            .closed
            .iter()
            .map(|&closed| u32::from(closed))
            .collect()
    }
}

impl ReferenceStateMachine for Reference {
    type State = Reference;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Reference> {
        (1usize..=4, any::<bool>())
            .prop_map(|(units, started)| {
                let mut model = Model::new(units);
                if started {
                    model.command(Cmd::Resume).expect("New accepts resume");
                }
                Reference {
                    model,
                    expect: Expect::Start,
                    started,
                }
            })
            .boxed()
    }

    fn transitions(state: &Reference) -> BoxedStrategy<Step> {
        let reaction = || {
            prop_oneof![
                2 => Just(Reaction::Cooperate),
                1 => Just(Reaction::Finish),
                1 => Just(Reaction::Fail),
                3 => Just(Reaction::Ignore),
            ]
        };
        // Most weight on what moves the task on from its stage; stop is final, so it
        // stays rare enough that most sequences get far before it. (No step ends in
        // Stopping: a stop returns once the task is terminal.)
        let [pause, resume, stop, update, act] = match state.model.stage {
            Stage::New | Stage::Paused => [12, 40, 1, 8, 0],
            Stage::Running => [30, 6, 1, 4, 40],
            Stage::Pausing => [12, 6, 6, 4, 16],
            Stage::Resuming => [20, 6, 1, 4, 40],
            Stage::Stopping | Stage::Stopped | Stage::Finished => [1, 1, 1, 1, 0],
        };
        let mut options: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (pause, reaction().prop_map(Step::Pause).boxed()),
            (resume, Just(Step::Resume).boxed()),
            (stop, reaction().prop_map(Step::Stop).boxed()),
            (update, (1u32..1000).prop_map(Step::Update).boxed()),
        ];
        match state.model.alive.map(|a| a.kind) {
            Some(Kind::Run) => options.push((
                act,
                prop_oneof![
                    2 => Just(RunAct::Finish),
                    1 => Just(RunAct::Fail),
                    1 => Just(RunAct::Panic),
                    1 => Just(RunAct::ReturnCancelled),
                ]
                .prop_map(Step::Run)
                .boxed(),
            )),
            Some(Kind::Prep) => options.push((
                act,
                prop_oneof![
                    4 => Just(PrepAct::Ok),
                    1 => Just(PrepAct::Fail),
                    1 => Just(PrepAct::Panic),
                ]
                .prop_map(Step::Prep)
                .boxed(),
            )),
            None => {}
        }
        options.retain(|(weight, _)| *weight > 0);
        Union::new_weighted(options).boxed()
    }

    fn apply(mut state: Reference, step: &Step) -> Reference {
        let generation = state.model.generation;
        state.expect = match *step {
            Step::Pause(reaction) => match state.model.command(Cmd::Pause) {
                Err(reason) => Expect::Refused(reason),
                Ok(()) => {
                    state.react(reaction, false);
                    if state.model.pause_settled() {
                        Expect::Settled(state.model.stage)
                    } else {
                        Expect::Timeout(state.model.stage)
                    }
                }
            },
            Step::Stop(reaction) => match state.model.command(Cmd::Stop) {
                Err(reason) => Expect::Refused(reason),
                Ok(()) => {
                    state.react(reaction, true);
                    assert!(state.model.stop_settled(), "a stop always ends");
                    Expect::Settled(state.model.stage)
                }
            },
            Step::Resume => match state.model.command(Cmd::Resume) {
                Err(reason) => Expect::Refused(reason),
                Ok(()) => Expect::Accepted,
            },
            Step::Update(value) => match state.model.command(Cmd::Update(value)) {
                Err(reason) => Expect::Refused(reason),
                Ok(()) => Expect::Accepted,
            },
            Step::Run(act) => {
                let exit = match act {
                    RunAct::Finish => Exit::Ok,
                    RunAct::Fail => Exit::Failed(Failure::Error),
                    RunAct::Panic => Exit::Failed(Failure::Panic),
                    RunAct::ReturnCancelled => Exit::Cancelled,
                };
                if state.model.alive.is_some_and(|a| a.kind == Kind::Run) {
                    assert!(state.model.report(Kind::Run, generation, exit));
                    Expect::Accepted
                } else {
                    Expect::Idle
                }
            }
            Step::Prep(act) => {
                let exit = match act {
                    PrepAct::Ok => Exit::Ok,
                    PrepAct::Fail => Exit::Failed(Failure::Error),
                    PrepAct::Panic => Exit::Failed(Failure::Panic),
                };
                if state.model.alive.is_some_and(|a| a.kind == Kind::Prep) {
                    assert!(state.model.report(Kind::Prep, generation, exit));
                    Expect::Accepted
                } else {
                    Expect::Idle
                }
            }
        };
        state
    }
}

// ------------------------------------------------------------------ scripted units

/// An order to the live run or check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    React(Reaction),
    Run(RunAct),
    Prep(PrepAct),
}

/// A run or check that is alive, as it registered itself.
#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    kind: Kind,
    unit: usize,
    generation: u64,
    resume: bool,
    config: u32,
    orders: mpsc::UnboundedSender<Msg>,
}

/// What the scripted units publish.
#[derive(Debug, Default)]
struct Observed {
    live: Vec<Entry>,
    max_live: usize,
    next_id: u64,
    closes: Vec<u32>,
}

/// Shared by the scripted units and the test.
#[derive(Debug)]
struct Control {
    observed: watch::Sender<Observed>,
}

impl Control {
    fn new(units: usize) -> Arc<Self> {
        Arc::new(Control {
            observed: watch::Sender::new(Observed {
                closes: vec![0; units],
                ..Observed::default()
            }),
        })
    }

    /// Registers a run or check as alive until the returned guard drops, and gives it
    /// the receiving end of its orders.
    fn enter(
        self: &Arc<Self>,
        kind: Kind,
        unit: usize,
        ctx: &RunContext<u32>,
    ) -> (LiveGuard, mpsc::UnboundedReceiver<Msg>) {
        let (orders, receiver) = mpsc::unbounded_channel();
        let mut id = 0;
        self.observed.send_modify(|o| {
            o.next_id += 1;
            id = o.next_id;
            o.live.push(Entry {
                id,
                kind,
                unit,
                generation: ctx.generation(),
                resume: ctx.is_resume(),
                config: *ctx.config(),
                orders,
            });
            o.max_live = o.max_live.max(o.live.len());
        });
        (
            LiveGuard {
                control: Arc::clone(self),
                id,
            },
            receiver,
        )
    }

    fn live_count(&self) -> usize {
        self.observed.borrow().live.len()
    }

    /// Sends an order to the live run or check of `kind`.
    fn order(&self, kind: Kind, msg: Msg) {
        let observed = self.observed.borrow();
        let entry = observed
            .live
            .iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| panic!("the model says a {kind:?} is alive; none registered"));
        entry.orders.send(msg).expect("a registered unit listens");
    }
}

/// Counts one run or check as alive until dropped, with the future that holds it.
#[derive(Debug)]
struct LiveGuard {
    control: Arc<Control>,
    id: u64,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.control
            .observed
            .send_modify(|o| o.live.retain(|e| e.id != self.id));
    }
}

/// A unit that does what the test orders, when it orders it.
#[derive(Debug)]
struct Scripted {
    index: usize,
    control: Arc<Control>,
}

impl Unit<u32> for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn prepare(&mut self, ctx: RunContext<u32>) -> Result<(), RunError> {
        let generation = ctx.generation();
        let (_alive, mut orders) = self.control.enter(Kind::Prep, self.index, &ctx);
        loop {
            match orders.recv().await {
                Some(Msg::Prep(PrepAct::Ok)) => return Ok(()),
                Some(Msg::Prep(PrepAct::Fail)) => {
                    return Err(RunError::msg(failure_message(Kind::Prep, generation)))
                }
                Some(Msg::Prep(PrepAct::Panic)) => {
                    panic!("{}", panic_message(Kind::Prep, generation))
                }
                // A check has no run to react with; it is dropped when cancelled.
                Some(Msg::React(_)) => {}
                other => panic!("a check got the order {other:?}"),
            }
        }
    }

    async fn run(&mut self, ctx: RunContext<u32>) -> Result<RunExit, RunError> {
        let generation = ctx.generation();
        let fail = || Err(RunError::msg(failure_message(Kind::Run, generation)));
        let (_alive, mut orders) = self.control.enter(Kind::Run, self.index, &ctx);
        let mut reaction = Reaction::Ignore;
        loop {
            if ctx.is_cancelled() {
                match reaction {
                    Reaction::Cooperate => return Ok(RunExit::Cancelled),
                    Reaction::Finish => return Ok(RunExit::Completed),
                    Reaction::Fail => return fail(),
                    Reaction::Ignore => {}
                }
            }
            tokio::select! {
                biased;
                msg = orders.recv() => match msg {
                    Some(Msg::React(r)) => reaction = r,
                    Some(Msg::Run(RunAct::Finish)) => return Ok(RunExit::Completed),
                    Some(Msg::Run(RunAct::Fail)) => return fail(),
                    Some(Msg::Run(RunAct::Panic)) => {
                        panic!("{}", panic_message(Kind::Run, generation))
                    }
                    Some(Msg::Run(RunAct::ReturnCancelled)) => return Ok(RunExit::Cancelled),
                    other => panic!("a run got the order {other:?}"),
                },
                () = ctx.cancelled(), if !ctx.is_cancelled() => {}
            }
        }
    }

    fn close(&mut self) {
        let index = self.index;
        self.control.observed.send_modify(|o| o.closes[index] += 1);
    }
}

/// Keeps the scripted panics (which the runtime turns into outcomes) off the output;
/// every other panic, a failed assertion included, still prints.
fn quiet_scripted_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            let scripted = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("scripted "));
            if !scripted {
                default(info);
            }
        }));
    });
}

// ------------------------------------------------------------------ the runtime SUT

/// The runtime flavour and the deadlines that go with its clock.
trait Flavor: std::fmt::Debug {
    fn runtime() -> tokio::runtime::Runtime;
    /// The wait of a pause that must time out (the run ignores cancellation).
    const PAUSE_GIVES_UP: Duration;
    /// The grace period of a stop whose run ignores cancellation; the abort must land
    /// within a second such period.
    const STOP_GRACE: Duration;
    /// A wait that only a bug can exhaust.
    const PATIENCE: Duration = Duration::from_secs(10);
}

/// A current-thread runtime with the paused clock: deadlines elapse at once.
#[derive(Debug)]
struct CurrentThread;

impl Flavor for CurrentThread {
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime")
    }
    const PAUSE_GIVES_UP: Duration = Duration::from_millis(100);
    const STOP_GRACE: Duration = Duration::from_millis(100);
}

/// A multi-thread runtime with two workers and the real clock.
#[derive(Debug)]
struct MultiThread;

impl Flavor for MultiThread {
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a multi-thread runtime")
    }
    // The run never returns, so any wait times out: keep it short.
    const PAUSE_GIVES_UP: Duration = Duration::from_millis(2);
    // The abort has this long to land: generous on a loaded machine.
    const STOP_GRACE: Duration = Duration::from_millis(500);
}

/// The system under test: a real task on its own runtime.
#[derive(Debug)]
struct Sut {
    runtime: tokio::runtime::Runtime,
    handle: Option<Handle<u32>>,
    control: Arc<Control>,
    /// The reference state after the last step, for the teardown.
    reference: Reference,
}

impl Sut {
    fn handle(&self) -> &Handle<u32> {
        self.handle
            .as_ref()
            .expect("the handle lives until teardown")
    }

    /// Carries out one step on the real task, and checks what the call returned.
    async fn step<F: Flavor>(&self, step: Step, reference: &Reference) {
        let handle = self.handle();
        let before = handle.snapshot();
        let expect = reference.expect;
        match step {
            Step::Pause(reaction) | Step::Stop(reaction) => {
                let run_alive = self
                    .control
                    .observed
                    .borrow()
                    .live
                    .iter()
                    .any(|e| e.kind == Kind::Run);
                // Short deadlines only where a run ignores the cancellation, so that
                // on the real clock nothing else can miss them.
                let ignored = run_alive && reaction == Reaction::Ignore;
                let react = || {
                    if run_alive {
                        self.control.order(Kind::Run, Msg::React(reaction));
                    }
                };
                let (command, result) = match (step, ignored) {
                    (Step::Pause(_), true) => (
                        Command::Pause,
                        issue_then(handle.pause_within(F::PAUSE_GIVES_UP), react).await,
                    ),
                    (Step::Pause(_), false) => (
                        Command::Pause,
                        issue_then(handle.pause_within(F::PATIENCE), react).await,
                    ),
                    (_, true) => (
                        Command::Stop,
                        issue_then(handle.stop_within(F::STOP_GRACE), react).await,
                    ),
                    (_, false) => (
                        Command::Stop,
                        issue_then(handle.stop_within(F::PATIENCE), react).await,
                    ),
                };
                // Read at the instant the call returned, before anything else runs
                // on this task.
                let live = self.control.live_count();
                match (result, expect) {
                    (Ok(stage), Expect::Settled(want)) => {
                        assert_eq!(stage, want, "{command} returned");
                        assert_eq!(live, 0, "{command} returned Ok({stage}) with a run alive");
                    }
                    (
                        Err(Error::Timeout {
                            command: c, stage, ..
                        }),
                        Expect::Timeout(want),
                    ) => {
                        assert_eq!(c, command, "the timeout names the command");
                        assert_eq!(stage, want, "the stage when {command} gave up");
                        assert_eq!(live, 1, "{command} timed out with nothing alive");
                    }
                    (Err(error), Expect::Refused(reason)) => {
                        assert_refused(&error, command, &before, reason);
                        common::assert_unchanged(&before, &handle.snapshot(), "a refused command");
                    }
                    (result, expect) => panic!(
                        "{step:?} in {}: got {result:?}, the model says {expect:?}",
                        before.stage
                    ),
                }
            }
            Step::Resume | Step::Update(_) => {
                let (command, result) = match step {
                    Step::Update(value) => (Command::Update, handle.update(value).await),
                    _ => (Command::Resume, handle.resume().await),
                };
                match (result, expect) {
                    (Ok(()), Expect::Accepted) => {}
                    (Err(error), Expect::Refused(reason)) => {
                        assert_refused(&error, command, &before, reason);
                        common::assert_unchanged(&before, &handle.snapshot(), "a refused command");
                    }
                    (result, expect) => panic!(
                        "{step:?} in {}: got {result:?}, the model says {expect:?}",
                        before.stage
                    ),
                }
            }
            Step::Run(_) | Step::Prep(_) if expect == Expect::Idle => {}
            Step::Run(act) => self.control.order(Kind::Run, Msg::Run(act)),
            Step::Prep(act) => self.control.order(Kind::Prep, Msg::Prep(act)),
        }
        self.settle::<F>(reference).await;
    }

    /// Waits until the task has taken every input the model took, and until what the
    /// model says is alive has registered and the closes it says have happened; a bug
    /// that never gets there fails the wait.
    async fn settle<F: Flavor>(&self, reference: &Reference) {
        let model = &reference.model;
        let handle = self.handle();
        let want = model.seq;
        let reached = tokio::time::timeout(F::PATIENCE, handle.wait_for(move |s| s.seq >= want));
        let snapshot = reached.await.unwrap_or_else(|_| {
            panic!("the task never took input {want}: {:?}", handle.snapshot())
        });
        if !snapshot.stage.run_may_be_alive() {
            // Truthful rest: a rest stage is published only after the future is gone.
            assert_eq!(
                self.control.live_count(),
                0,
                "a run is alive in {}",
                snapshot.stage
            );
        }
        let alive = model.alive;
        let closes = reference.expected_closes();
        let mut observed = self.control.observed.subscribe();
        let waited = tokio::time::timeout(
            F::PATIENCE,
            observed.wait_for(|o| {
                let live_ok = match alive {
                    None => o.live.is_empty(),
                    Some(a) => o
                        .live
                        .iter()
                        .any(|e| e.generation == a.generation && e.kind == a.kind),
                };
                live_ok && o.closes == closes
            }),
        )
        .await;
        if waited.is_err() {
            panic!(
                "alive / closes never matched the model ({alive:?}, {closes:?}): {:?}",
                self.control.observed.borrow()
            );
        }
    }

    fn check(&self, reference: &Reference) {
        let model = &reference.model;
        let handle = self.handle();
        let snapshot = handle.snapshot();
        model::assert_agrees(
            &Seen {
                stage: snapshot.stage,
                generation: snapshot.generation,
                unit: snapshot.unit.as_ref().map(|(index, _)| *index),
                outcome: snapshot.outcome.as_ref(),
                user_paused: snapshot.user_paused,
                seq: snapshot.seq,
            },
            model,
        );
        assert_eq!(handle.stage(), snapshot.stage, "lock-free stage");
        assert_eq!(*handle.config(), model.config, "configuration");

        let observed = self.control.observed.borrow();
        assert!(
            observed.max_live <= 1,
            "{} runs or checks were alive at once",
            observed.max_live
        );
        match (model.alive, observed.live.as_slice()) {
            (None, []) => {}
            (Some(alive), [entry]) => {
                assert_eq!(entry.kind, alive.kind, "what is alive");
                assert_eq!(entry.generation, alive.generation, "live generation");
                assert_eq!(entry.unit, alive.unit, "live unit");
                assert_eq!(entry.resume, alive.resume, "live resume flag");
                assert_eq!(entry.config, alive.config, "live configuration");
            }
            (want, seen) => panic!("alive: the task has {seen:?}, the model {want:?}"),
        }
        assert_eq!(observed.closes, reference.expected_closes(), "unit closes");
    }
}

/// Polls `call` once, which issues its command (pause and stop both do at their first
/// poll), then runs `then` (the run's scripted reaction) unless the call is already
/// complete, and finishes the call.
///
/// The order matters on a multi-thread runtime: a run that was cancelled earlier (a
/// pause it ignored) would otherwise react before the command reaches the task.
async fn issue_then<T>(call: impl Future<Output = T>, then: impl FnOnce()) -> T {
    let mut call = pin!(call);
    if let Poll::Ready(output) = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
        return output;
    }
    then();
    call.await
}

fn assert_refused(error: &Error, command: Command, before: &crate::TaskSnapshot, want: Refusal) {
    match error {
        Error::Refused {
            command: c,
            stage,
            reason,
        } => {
            assert_eq!(*c, command, "the refusal names the command");
            assert_eq!(*stage, before.stage, "the refusal names the stage");
            assert_eq!(*reason, want, "refusal reason");
        }
        other => panic!(
            "{command} in {}: {other:?}, the model says refused",
            before.stage
        ),
    }
}

/// The property test, on runtime flavour `F`.
#[derive(Debug)]
struct RuntimeTest<F>(std::marker::PhantomData<F>);

impl<F: Flavor> StateMachineTest for RuntimeTest<F> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(reference: &Reference) -> Sut {
        quiet_scripted_panics();
        let runtime = F::runtime();
        let units = reference.model.units;
        let control = Control::new(units);
        let handle = runtime.block_on(async {
            let mut builder = Task::builder("prop").config(0u32);
            for index in 0..units {
                builder = builder.unit(Scripted {
                    index,
                    control: Arc::clone(&control),
                });
            }
            let spawned = if reference.started {
                builder.spawn()
            } else {
                builder.spawn_paused()
            };
            spawned.expect("the task spawns")
        });
        let sut = Sut {
            runtime,
            handle: Some(handle),
            control,
            reference: reference.clone(),
        };
        sut.runtime.block_on(sut.settle::<F>(reference));
        sut
    }

    fn apply(mut sut: Sut, reference: &Reference, step: Step) -> Sut {
        sut.runtime.block_on(sut.step::<F>(step, reference));
        sut.reference = reference.clone();
        sut
    }

    fn check_invariants(sut: &Sut, reference: &Reference) {
        sut.check(reference);
    }

    fn teardown(mut sut: Sut) {
        // End every case with a stop whose run cooperates, and check it like a step.
        let step = Step::Stop(Reaction::Cooperate);
        let reference = Reference::apply(sut.reference.clone(), &step);
        sut.runtime.block_on(sut.step::<F>(step, &reference));
        sut.check(&reference);
        assert!(reference.model.stop_settled());
        drop(sut.handle.take());
        drop(sut.runtime);
    }
}

/// The current-thread property test.
type OnCurrentThread = RuntimeTest<CurrentThread>;
/// The multi-thread property test.
type OnMultiThread = RuntimeTest<MultiThread>;

prop_state_machine! {
    #![proptest_config(common::config(1_000, "proptest-regressions/prop_runtime.txt"))]

    /// Random sequences against a real task, on a current-thread runtime whose clock
    /// is paused.
    #[test]
    fn runtime_follows_the_reference_model_on_current_thread(sequential 1..=50 => OnCurrentThread);
}

prop_state_machine! {
    #![proptest_config(common::config(200, "proptest-regressions/prop_runtime_multi_thread.txt"))]

    /// Random sequences against a real task, on a multi-thread runtime.
    #[test]
    fn runtime_follows_the_reference_model_on_multi_thread(sequential 1..=50 => OnMultiThread);
}
