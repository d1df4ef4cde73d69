//! The models. Each one sets up a task, lets two to four parties race, joins them and
//! runs the end-of-execution checks; every party's steps are checked as they happen
//! (see `harness`).
//!
//! Bounds: a model whose parties are two loom threads runs with no preemption bound, so
//! loom explores every interleaving. A model with three or more parties sets the bound
//! to 3 in code, because the state space explodes without one: each party takes and
//! releases the core's lock several times, waits on the condition variable or the
//! waiter list, and touches the bookkeeping atomics, and every one of those is a
//! scheduling point. Measured on model (b) (HonoursCancel): bound 2 explores 643
//! interleavings, 3 explores 3,860, 4 explores 18,773, 5 explores 72,280, and without a
//! bound it did not finish in 5 minutes; model (c) goes from 12,980 (bound 3) to 95,465
//! (4) and 488,998 (5). A switch forced on a thread that blocks (on the lock, the
//! condition variable, a park) is not a preemption, so with 3 preemptions loom still
//! tries every order of the parties' critical sections that needs at most three forced
//! switches; the races the models are about (a command landing between a run's last
//! look at its flag and its exit report, a resume between a pause's acceptance and the
//! run's exit, a stop joining a pause) each need one or two.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Wake, Waker};

use loom::thread::{self, JoinHandle};
use taskstage::lifecycle::{Settle, StartKind};
use taskstage::outcome::Exit;
use taskstage::sync::Arc;
use taskstage::{Command, RunError, Stage};

use crate::harness::{
    check_end, cover, explore, survey, violated, Behaviour, Core, Driver, Event, Explored,
    Protocol, Run, Wait, World,
};
use crate::prefix::{LookThenResume, PreFix};

/// The bound of the three-party models (see the module docs for why).
const THREE_PARTY_BOUND: Option<usize> = Some(3);

/// Spawns a party running `script` with its own driver; joining it yields the party's
/// log and what the script returned.
fn spawn<P, F, R>(
    world: &Arc<World<P>>,
    behaviour: Behaviour,
    wait: Wait,
    script: F,
) -> JoinHandle<(Vec<Event>, R)>
where
    P: Protocol,
    F: FnOnce(&mut Driver<'_, P>) -> R + Send + 'static,
    R: Send + 'static,
{
    let world = Arc::clone(world);
    thread::spawn(move || {
        let mut driver = Driver::new(&world, behaviour, wait);
        let result = script(&mut driver);
        (driver.into_log(), result)
    })
}

/// Joins a party; returns its log and its script's result.
fn join<R>(party: JoinHandle<(Vec<Event>, R)>) -> (Vec<Event>, R) {
    party.join().expect("a party panicked")
}

/// Joins a party whose script returns nothing; returns its log.
fn join_log(party: JoinHandle<(Vec<Event>, ())>) -> Vec<Event> {
    join(party).0
}

/// The union of what several explorations of one model went through.
#[derive(Debug, Default)]
struct Covered {
    labels: BTreeSet<String>,
    executions: usize,
}

impl Covered {
    fn add(&mut self, explored: Explored) {
        self.labels.extend(explored.covered.into_keys());
        self.executions += explored.executions;
    }

    /// Asserts every label was reached by at least one of the explorations, and prints
    /// the model's total.
    fn expect(&self, labels: &[&str]) {
        for label in labels {
            assert!(
                self.labels.contains(*label),
                "no exploration reached `{label}`; reached: {:#?}",
                self.labels
            );
        }
        println!(
            "  all variants: {} interleavings; reached every one of: {labels:?}",
            self.executions
        );
    }
}

/// Sets up the task in Running: resume, the preparation succeeds, generation 1 is
/// launched. Returns the set-up's log and the launched run, for a party to play.
fn running<P: Protocol>(world: &World<P>) -> (Vec<Event>, Run) {
    let mut setup = Driver::new(world, Behaviour::Completes, Wait::Blocking);
    setup
        .issue(Command::Resume)
        .expect("resume is accepted in New");
    setup.play_preparations();
    let run = setup.take_start();
    (setup.into_log(), run)
}

/// Brings the task to Running (generation 1) and spawns the party that plays that run
/// with `behaviour`. Returns the setup's log and the run's party.
fn spawn_running<P: Protocol>(
    world: &Arc<World<P>>,
    behaviour: Behaviour,
) -> (Vec<Event>, JoinHandle<(Vec<Event>, ())>) {
    let (setup, run) = running(world);
    let runner = spawn(world, behaviour, Wait::Blocking, move |d| {
        d.give_start(run);
        d.play_all();
    });
    (setup, runner)
}

/// A pause may be refused only once every unit finished (the run completed first).
fn refused_only_when_finished(command: Command, result: &Result<Stage, taskstage::Error>) {
    if let Err(error) = result {
        check!(
            error.stage() == Stage::Finished,
            "harness: {command} refused unexpectedly: {error}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// (a) pause ∥ run exit
// ---------------------------------------------------------------------------------------

/// (a) pause ∥ run exit. Two parties, no preemption bound: exhaustive.
///
/// The task is Running (generation 1). One party pauses and waits; the other plays the
/// run, which ends as `behaviour` says (Ok, an error, or Cancelled if it saw its flag),
/// and, with two units, goes on to play the next unit's run.
///
/// Proves, on every interleaving: the pause returns only once the run it cancelled has
/// returned and been dropped, in a rest stage (2); never two live runs (1); the exit
/// report is never ignored and leaves Pausing (4); Running always has its run and a
/// pause reaches it (3); the outcome is the last report's and the user-paused mark is
/// set exactly when the pause was accepted (5); no lost wake-up (7: loom reports a
/// deadlock otherwise).
fn pause_vs_run_exit<P: Protocol>(world: Arc<World<P>>, behaviour: Behaviour) {
    let (setup, runner) = spawn_running(&world, behaviour);
    let mut pauser = Driver::new(&world, behaviour, Wait::Blocking);
    let paused = pauser.pause();
    refused_only_when_finished(Command::Pause, &paused);
    let pauser = pauser.into_log();
    check_end(&world, vec![setup, pauser, join_log(runner)]);
}

#[test]
fn a_pause_vs_run_exit() {
    let mut covered = Covered::default();
    for units in [1, 2] {
        for behaviour in Behaviour::ALL {
            covered.add(explore(
                &format!("(a) pause ∥ run exit [{behaviour:?}, {units} unit(s)]"),
                None,
                move || pause_vs_run_exit(World::<Core>::new(units), behaviour),
            ));
        }
    }
    covered.expect(&[
        "pause accepted in Running",
        "pause accepted in Paused",
        "pause refused in Finished",
        "run report: Pausing -> Paused",
        "run report: Pausing -> Finished",
        "run report: Running -> Running",
        "run report: Running -> Paused",
    ]);
}

// ---------------------------------------------------------------------------------------
// (b) pause ∥ resume ∥ run exit: the original race
// ---------------------------------------------------------------------------------------

/// (b) pause ∥ resume ∥ run exit: the race of the original incident. Three parties,
/// preemption bound 3.
///
/// The task is Running (generation 1). One party pauses; one resumes (refused while the
/// run is alive; if accepted it plays the preparation and the run of generation 2,
/// which honours cancellation); one plays the run of generation 1 with `behaviour`.
///
/// Proves: never two live runs, in particular never a second run launched while the
/// first is alive (1); the pause returns only once its run is gone (2); every report
/// leaves the transitional stage (4); the end state agrees with what is alive (2, 3,
/// 4); outcome and user-paused mark (5); no deadlock (7).
fn pause_resume_run<P: Protocol>(world: Arc<World<P>>, behaviour: Behaviour) {
    let (setup, runner) = spawn_running(&world, behaviour);
    let resumer = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        // Refused while generation 1 is alive; that is the point.
        let _ = d.resume();
    });
    let mut pauser = Driver::new(&world, behaviour, Wait::Blocking);
    let paused = pauser.pause();
    refused_only_when_finished(Command::Pause, &paused);
    let pauser = pauser.into_log();
    check_end(
        &world,
        vec![setup, pauser, join_log(runner), join_log(resumer)],
    );
}

#[test]
fn b_pause_resume_run_exit() {
    let mut covered = Covered::default();
    for behaviour in Behaviour::ALL {
        covered.add(explore(
            &format!("(b) pause ∥ resume ∥ run exit [{behaviour:?}]"),
            THREE_PARTY_BOUND,
            move || pause_resume_run(World::<Core>::new(1), behaviour),
        ));
    }
    covered.expect(&[
        "resume refused in Running",
        "resume refused in Pausing",
        "resume accepted in Paused",
        "pause accepted in Resuming",
        "prep report: Pausing -> Paused",
        "run report: Pausing -> Paused",
    ]);
}

/// Starts the task and lets its first run fail, before the parties start: the task is
/// Paused by an error (not user-paused) and nothing is alive. Returns the setup's log.
fn error_paused<P: Protocol>(world: &Arc<World<P>>) -> Vec<Event> {
    let mut setup = Driver::new(world, Behaviour::Fails, Wait::Blocking);
    setup
        .issue(Command::Resume)
        .expect("resume is accepted in New");
    setup.play_all();
    setup.into_log()
}

// ---------------------------------------------------------------------------------------
// (c) stop ∥ pause ∥ resume
// ---------------------------------------------------------------------------------------

/// (c) stop ∥ pause ∥ resume. Three parties, preemption bound 3.
///
/// The task starts Paused after its first run failed (error-paused, not user-paused),
/// so no run is alive at the start. One party stops and waits; one pauses and waits;
/// one resumes and, if accepted, plays what the resume starts: the preparation of
/// generation 2 and, if that is launched, its run (both honour cancellation). No
/// fourth party plays a run here: the only user code alive during the race is what the
/// resume started, played by the resuming party, so a stop or a pause can land before
/// the preparation, during it, between it and the launch, during the run, or after
/// it. Model (c') adds a fourth party playing a run that is alive from the start.
///
/// Proves: stop returns only in a terminal stage with nothing alive, and pause only in
/// a rest stage with its generation gone (2); never a run beside a preparation or a
/// second run (1); no report leaves Pausing, Resuming or Stopping behind (4); a stop
/// landing in Resuming or Pausing still waits for the preparation (2, 4); the outcome
/// and the user-paused mark (5; a pause in error-paused Paused sets the mark); no
/// deadlock (7).
fn stop_pause_resume<P: Protocol>(world: Arc<World<P>>) {
    let setup = error_paused(&world);
    let stopper = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        if let Err(error) = d.stop() {
            violated(format!("harness: stop refused: {error}"));
        }
    });
    let pauser = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        // Refused once the stop was accepted.
        let _ = d.pause();
    });
    let mut resumer = Driver::new(&world, Behaviour::HonoursCancel, Wait::Blocking);
    // Refused while a preparation or run is alive, or once stopped.
    let _ = resumer.resume();
    let resumer = resumer.into_log();
    let logs = vec![setup, resumer, join_log(stopper), join_log(pauser)];
    check_end(&world, logs);
    let stage = world.core.snapshot().stage;
    check!(
        stage.is_terminal(),
        "invariant 4 violated: a stop was accepted but the task ended in {stage}"
    );
}

#[test]
fn c_stop_pause_resume() {
    let explored = explore(
        "(c) stop ∥ pause ∥ resume [from error-paused]",
        THREE_PARTY_BOUND,
        || stop_pause_resume(World::<Core>::new(1)),
    );
    explored.expect_covered(&[
        "stop accepted in Paused",
        "stop accepted in Resuming",
        "stop accepted in Running",
        "stop accepted in Pausing",
        "pause accepted in Paused",
        "pause accepted in Resuming",
        "pause refused in Stopping",
        "resume refused in Stopped",
        "prep report: Stopping -> Stopping",
        "prep report: Pausing -> Paused",
        "run report: Stopping -> Stopping",
        "closed: Stopping -> Stopped",
    ]);
}

/// (c') stop ∥ pause ∥ resume ∥ run exit. Four parties, preemption bound 3 (as the
/// three-party models; four parties only make the reason stronger).
///
/// The task is Running (generation 1), played by its own party with `behaviour`; the
/// three others stop, pause and resume as in (c). The resume is refused until the run
/// has returned (and refused for good once the stop is accepted); when it is accepted
/// the resuming party plays generation 2's preparation and run.
///
/// Proves the same as (c), now with a live run at the start: the stop and the pause
/// both wait for generation 1's run whichever of them cancels it (2), the stop joins a
/// pause already in progress without a second cancel being needed (3: every cancel
/// reaches the live handle), never a second run (1), nothing left transitional (4),
/// outcome and mark (5), no deadlock (7).
fn stop_pause_resume_run<P: Protocol>(world: Arc<World<P>>, behaviour: Behaviour) {
    let (setup, runner) = spawn_running(&world, behaviour);
    let stopper = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        if let Err(error) = d.stop() {
            violated(format!("harness: stop refused: {error}"));
        }
    });
    let pauser = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        let _ = d.pause();
    });
    let mut resumer = Driver::new(&world, Behaviour::HonoursCancel, Wait::Blocking);
    let _ = resumer.resume();
    let resumer = resumer.into_log();
    let logs = vec![
        setup,
        resumer,
        join_log(runner),
        join_log(stopper),
        join_log(pauser),
    ];
    check_end(&world, logs);
    let stage = world.core.snapshot().stage;
    check!(
        stage.is_terminal(),
        "invariant 4 violated: a stop was accepted but the task ended in {stage}"
    );
}

#[test]
fn c4_stop_pause_resume_run_exit() {
    let mut covered = Covered::default();
    for behaviour in Behaviour::ALL {
        covered.add(explore(
            &format!("(c') stop ∥ pause ∥ resume ∥ run exit [{behaviour:?}]"),
            THREE_PARTY_BOUND,
            move || stop_pause_resume_run(World::<Core>::new(1), behaviour),
        ));
    }
    covered.expect(&[
        "stop accepted in Running",
        "stop accepted in Pausing",
        "stop accepted in Resuming",
        "resume accepted in Paused",
        "pause refused in Stopping",
        "run report: Stopping -> Stopping",
        "closed: Stopping -> Stopped",
    ]);
}

// ---------------------------------------------------------------------------------------
// (d) two pauses at once
// ---------------------------------------------------------------------------------------

/// (d) two pauses at once ∥ run exit. Three parties, preemption bound 3.
///
/// The task is Running (generation 1). Two parties pause: one waits on the condition
/// variable (`settled_blocking`), the other on the waiter list (the `settled` future
/// driven by `harness::block_on`). The third plays the run with `behaviour`.
///
/// Proves: both pauses return only once the run is gone (2), and when both are
/// accepted they report the same stage, the one the task is in (2); the second pause
/// joins the first in Pausing without cancelling anything new (3: both cancels reach
/// the same run's handle); neither waiter misses its wake-up, whichever way it waits
/// (7); plus the end checks (1, 4, 5).
fn two_pauses<P: Protocol>(world: Arc<World<P>>, behaviour: Behaviour) {
    let (setup, runner) = spawn_running(&world, behaviour);
    let second = spawn(&world, behaviour, Wait::Async, move |d| {
        let paused = d.pause();
        refused_only_when_finished(Command::Pause, &paused);
        paused.ok()
    });
    let mut first = Driver::new(&world, behaviour, Wait::Blocking);
    let paused = first.pause();
    refused_only_when_finished(Command::Pause, &paused);
    let first = first.into_log();
    let (second, other) = join(second);
    let logs = vec![setup, first, join_log(runner), second];
    let stage = world.core.snapshot().stage;
    if let (Ok(a), Some(b)) = (paused, other) {
        cover("both pauses returned".to_owned());
        check!(
            a == b && a == stage,
            "invariant 2 violated: two pauses returned different stages ({a} and {b}; \
             the task is {stage})"
        );
    }
    check_end(&world, logs);
}

#[test]
fn d_two_pauses() {
    let mut covered = Covered::default();
    for behaviour in Behaviour::ALL {
        covered.add(explore(
            &format!("(d) pause ∥ pause ∥ run exit [{behaviour:?}]"),
            THREE_PARTY_BOUND,
            move || two_pauses(World::<Core>::new(1), behaviour),
        ));
    }
    covered.expect(&[
        "pause accepted in Pausing",
        "pause returned Paused",
        "pause returned Finished",
        "both pauses returned",
    ]);
}

// ---------------------------------------------------------------------------------------
// (e) the pause's caller goes away half-way
// ---------------------------------------------------------------------------------------

/// A waker that does nothing; its reference count shows whether the core still holds a
/// clone of it.
///
/// It is allocated with `std`'s `Arc` because `Waker::from` needs one. It is shared
/// only through the core's waiter list, which loom sees through the core's mutex.
struct Probe;

impl Wake for Probe {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// (e) the pause future dropped half-way. Two parties, no preemption bound: exhaustive.
///
/// The task is Running (generation 1). One party issues a pause (carrying out the
/// cancel), creates the core's `settled` future, polls it once with its own waker and
/// drops it, as a caller that gives up (a cancelled request, a dropped handle) would.
/// With `rewait` it then waits again through a fresh future driven by
/// `harness::block_on`; without, it just leaves. The other party plays the run
/// with `behaviour`, at any point of that.
///
/// Proves: dropping the future unregisters its waker (7: checked whenever no change
/// happened between the poll and the drop, so that no wake-up can be in flight); the
/// task still reaches a rest stage once the run returns, whether or not anyone waits
/// (4); the second wait wakes and returns only once the run is gone (7, 2); without
/// it, a lock-free `stage()` read that says Paused or Finished implies the run is gone
/// as seen from the reading thread (2: the Release/Acquire pair of the stage atomic);
/// the end checks (1, 3, 5).
fn dropped_pause_future(behaviour: Behaviour, rewait: bool) {
    let world = World::<Core>::new(1);
    let (setup, runner) = spawn_running(&world, behaviour);
    let lifecycle = world.core.lifecycle();
    let mut pauser = Driver::new(&world, behaviour, Wait::Async);
    let issued = pauser.issue(Command::Pause).map(|accepted| {
        let before = lifecycle.snapshot().seq;
        let probe = std::sync::Arc::new(Probe);
        {
            let waker = Waker::from(std::sync::Arc::clone(&probe));
            let mut cx = Context::from_waker(&waker);
            let settle = Settle::new(Command::Pause, accepted.generation);
            let mut future = pin!(lifecycle.settled(settle));
            let polled = future.as_mut().poll(&mut cx);
            cover(format!(
                "dropped future: was {}",
                if polled.is_ready() {
                    "ready"
                } else {
                    "pending"
                }
            ));
            // The future and the waker are dropped here: the caller went away.
        }
        // No change since before the poll means nothing took the waiter list, so any
        // clone of the waker still alive is one the core kept.
        let after = lifecycle.snapshot().seq;
        if after == before {
            cover("dropped future: leak check applied".to_owned());
            check!(
                std::sync::Arc::strong_count(&probe) == 1,
                "invariant 7 violated: a dropped pause future left its waker registered"
            );
        }
        if rewait {
            pauser.settle(Command::Pause, &accepted);
        } else {
            // A caller that gave up may still read the stage without the lock. If the
            // lock-free read says the task is at rest, the run it paused must be gone
            // as far as this thread can see: the core publishes the stage with Release
            // after the exit report, and `stage()` reads it with Acquire.
            let seen = lifecycle.stage();
            if seen.is_at_rest() {
                cover(format!("lock-free stage read {seen}"));
                check!(
                    !world.alive(accepted.generation),
                    "invariant 2 violated: the lock-free stage read {seen} while the run \
                     is alive"
                );
            }
        }
    });
    refused_only_when_finished(Command::Pause, &issued.map(|()| Stage::Paused));
    let pauser = pauser.into_log();
    check_end(&world, vec![setup, pauser, join_log(runner)]);
    let stage = world.core.snapshot().stage;
    check!(
        stage.is_at_rest(),
        "invariant 4 violated: the task stayed {stage} after the pause future was dropped"
    );
}

#[test]
fn e_dropped_pause_future() {
    let mut covered = Covered::default();
    for rewait in [false, true] {
        for behaviour in [Behaviour::HonoursCancel, Behaviour::Fails] {
            covered.add(explore(
                &format!("(e) pause future dropped ∥ run exit [{behaviour:?}, rewait: {rewait}]"),
                None,
                move || dropped_pause_future(behaviour, rewait),
            ));
        }
    }
    covered.expect(&[
        "dropped future: was pending",
        "dropped future: was ready",
        "dropped future: leak check applied",
        "lock-free stage read Paused",
        "pause returned Paused",
    ]);
}

// ---------------------------------------------------------------------------------------
// (f) a stale exit report
// ---------------------------------------------------------------------------------------

/// The stale report a model sends for generation 1.
#[derive(Debug, Clone, Copy)]
enum Stale {
    RunOk,
    RunFailed,
    RunCancelled,
    PrepOk,
}

impl Stale {
    const ALL: [Stale; 4] = [
        Stale::RunOk,
        Stale::RunFailed,
        Stale::RunCancelled,
        Stale::PrepOk,
    ];

    fn report(self) -> (StartKind, Exit) {
        match self {
            Stale::RunOk => (StartKind::Launch, Exit::Ok),
            Stale::RunFailed => (StartKind::Launch, Exit::Failed(RunError::msg("stale"))),
            Stale::RunCancelled => (StartKind::Launch, Exit::Cancelled),
            Stale::PrepOk => (StartKind::Prepare, Exit::Ok),
        }
    }
}

/// (f) a stale exit report ∥ pause of the new generation. Two parties, no preemption
/// bound: exhaustive.
///
/// Set-up: generation 1 runs, is paused, returns Cancelled (Paused); a resume starts
/// generation 2, whose run is launched (Running). Then one party pauses generation 2;
/// the other plays generation 2's run (honouring cancellation) and sends a late report
/// of generation 1 (`stale`), before the run's exit (`stale_first`) or after it. Both
/// orders together put the stale report in Running, Pausing, Paused and Finished.
///
/// Proves: the stale report is ignored (no transition, no effect) whatever the stage
/// (6), so the stage, the generation (2) and the outcome stay those of generation 2's
/// own inputs (6 and 5, end checks); the pause of generation 2 still waits for its own
/// run (2); no deadlock (7).
fn stale_report<P: Protocol>(world: Arc<World<P>>, stale: Stale, stale_first: bool) {
    let mut setup = Driver::new(&world, Behaviour::HonoursCancel, Wait::Blocking);
    setup
        .issue(Command::Resume)
        .expect("resume is accepted in New");
    setup.play_preparations();
    setup
        .issue(Command::Pause)
        .expect("pause is accepted in Running");
    // Generation 1 sees its flag and returns Cancelled: Paused.
    setup.play_next();
    setup
        .issue(Command::Resume)
        .expect("resume is accepted in Paused");
    setup.play_preparations();
    let run = setup.take_start();
    assert_eq!(run.generation, 2, "set-up: generation 2 is launched");
    let setup = setup.into_log();

    let runner = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, move |d| {
        let (kind, exit) = stale.report();
        if stale_first {
            d.stale_report(1, kind, exit);
            d.give_start(run);
            d.play_all();
        } else {
            d.give_start(run);
            d.play_all();
            d.stale_report(1, kind, exit);
        }
    });
    let mut pauser = Driver::new(&world, Behaviour::HonoursCancel, Wait::Blocking);
    let paused = pauser.pause();
    refused_only_when_finished(Command::Pause, &paused);
    let pauser = pauser.into_log();
    check_end(&world, vec![setup, pauser, join_log(runner)]);
    let generation = world.core.snapshot().generation;
    check!(
        generation == 2,
        "invariant 6 violated: the generation is {generation} after a stale report"
    );
}

#[test]
fn f_stale_report() {
    let mut covered = Covered::default();
    for stale_first in [true, false] {
        for stale in Stale::ALL {
            covered.add(explore(
                &format!(
                    "(f) stale report ∥ pause [{stale:?}, {}]",
                    if stale_first {
                        "before the run's exit"
                    } else {
                        "after the run's exit"
                    }
                ),
                None,
                move || stale_report(World::<Core>::new(1), stale, stale_first),
            ));
        }
    }
    covered.expect(&[
        "stale report in Running",
        "stale report in Pausing",
        "stale report in Paused",
        "stale report in Finished",
    ]);
}

// ---------------------------------------------------------------------------------------
// (h) a conditional auto-resume ∥ a user pause
// ---------------------------------------------------------------------------------------

/// (h) auto-resume ∥ user pause. Two parties, no preemption bound: exhaustive.
///
/// The task is error-paused: its first run failed (Paused, not user-paused). One party
/// plays an auto-resume policy: it takes a snapshot, and if the task is error-paused it
/// resumes with `resume_if_unchanged(snapshot.seq)`, then plays the preparation and
/// the run (both honour cancellation). The other party is the user: it pauses and
/// waits.
///
/// Proves: a resume decided from a snapshot taken before the user's pause is never
/// accepted after that pause (the user-paused mark stops auto-resume, as the table
/// says for Paused + pause); when the resume comes first, the user's pause cancels the
/// preparation or run it started and waits for it (2, 3); the end checks (1, 4, 5, the
/// mark); no deadlock (7).
fn auto_resume_vs_pause<P: Protocol>(world: Arc<World<P>>) {
    let setup = error_paused(&world);
    let policy = spawn(&world, Behaviour::HonoursCancel, Wait::Blocking, |d| {
        let seen = d.snapshot();
        if seen.stage != Stage::Paused || seen.user_paused {
            return None;
        }
        d.resume_if_unchanged(seen.seq)
            .ok()
            .map(|resumed| (seen.seq, resumed.seq))
    });
    let mut user = Driver::new(&world, Behaviour::HonoursCancel, Wait::Blocking);
    let paused = user.pause();
    let user = user.into_log();
    let (policy, resumed) = join(policy);
    let pause_seq = user.iter().find_map(|e| match e {
        Event::Command {
            command: Command::Pause,
            transition,
        } => Some(transition.seq),
        _ => None,
    });
    if let (Some((seen, resumed)), Some(pause)) = (resumed, pause_seq) {
        cover("both the auto-resume and the pause accepted".to_owned());
        check!(
            !(seen < pause && pause < resumed),
            "user-paused mark violated: an auto-resume decided before a user pause was \
             accepted after it (snapshot at change {seen}, pause at {pause}, resume at \
             {resumed})"
        );
    }
    refused_only_when_finished(Command::Pause, &paused);
    check_end(&world, vec![setup, user, policy]);
}

#[test]
fn h_auto_resume_vs_pause() {
    let explored = explore(
        "(h) auto-resume ∥ user pause [from error-paused]",
        None,
        || auto_resume_vs_pause(World::<Core>::new(1)),
    );
    explored.expect_covered(&[
        "resume refused in Paused",
        "pause accepted in Paused",
        "pause accepted in Resuming",
        "pause accepted in Running",
        "both the auto-resume and the pause accepted",
    ]);
}

// ---------------------------------------------------------------------------------------
// (g) non-vacuity: the pre-fix protocol is caught
// ---------------------------------------------------------------------------------------

/// (g1) Model (a) driving the pre-fix protocol. Two parties, exhaustive.
///
/// The pre-fix pause flips the stage to Paused and returns without waiting, so on the
/// interleavings where the run has not returned yet, the pause's own return-time check
/// of invariant 2 must fire.
#[test]
#[should_panic(expected = "invariant 2 violated: pause returned Ok while a run is alive")]
fn g1_prefix_pause_vs_run_exit_is_caught() {
    explore("(g1) pre-fix: pause ∥ run exit", None, || {
        pause_vs_run_exit(World::<PreFix>::new(1), Behaviour::HonoursCancel)
    });
}

/// (g2) Model (b), the original race, driving the pre-fix protocol. Three parties,
/// preemption bound 3.
///
/// The first violation loom meets is the pause returning while its run is alive
/// (invariant 2): the pre-fix pause does not wait.
#[test]
#[should_panic(expected = "invariant 2 violated: pause returned Ok while a run is alive")]
fn g2_prefix_original_race_is_caught() {
    explore(
        "(g2) pre-fix: pause ∥ resume ∥ run exit",
        THREE_PARTY_BOUND,
        || pause_resume_run(World::<PreFix>::new(1), Behaviour::HonoursCancel),
    );
}

/// (g4) Model (h) driving the real core with the auto-resume policy's original race
/// put back ([`LookThenResume`]: look at the task, then resume unconditionally). Two
/// parties, exhaustive. A user pause landing between the look and the resume is
/// overridden, and the model must catch it.
#[test]
#[should_panic(
    expected = "user-paused mark violated: an auto-resume decided before a user pause was accepted after it"
)]
fn g4_look_then_resume_is_caught() {
    explore(
        "(g4) look-then-resume: auto-resume ∥ user pause",
        None,
        || auto_resume_vs_pause(World::<LookThenResume>::new(1)),
    );
}

/// (g3) Model (b) driving the pre-fix protocol, every interleaving (bound 3): which
/// checks fail, and how often.
///
/// Beyond the pause's own return-time check (g2), the harness must catch the
/// incident's symptom itself: a resume launching a second run while the first is
/// alive (invariant 1), and the stage saying Paused while a run is alive at the end
/// (invariant 2).
#[test]
fn g3_prefix_survey_finds_two_live_runs() {
    let found = survey(
        "(g3) pre-fix: pause ∥ resume ∥ run exit, every failed check",
        THREE_PARTY_BOUND,
        || pause_resume_run(World::<PreFix>::new(1), Behaviour::HonoursCancel),
    );
    for expected in [
        "invariant 1 violated: two live runs",
        "invariant 2 violated: pause returned Ok while a run is alive",
    ] {
        assert!(
            found.contains_key(expected),
            "the pre-fix protocol was not caught by `{expected}`: {found:?}"
        );
    }
}
