//! The tokio runtime layer through its public API: the migration tool's own subtask
//! scenarios (normal use, rules, fast quit, races), faults and bounded waiting, each
//! on the current-thread and the multi-thread runtime.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::time::Duration;

use support::{scripted, stubborn, Check, Instant, Live, Order};
use taskstage::{BuildError, Command, Error, Outcome, Refusal, Stage, Task};

async fn paused_or_finished(handle: &taskstage::Handle) -> taskstage::TaskSnapshot {
    handle.wait_for_stage(Stage::is_at_rest).await
}

// ---------------------------------------------------------------- normal use

#[test]
fn a_pipeline_with_no_units_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let err = runtime.block_on(async { Task::builder("empty").spawn().unwrap_err() });
    assert_eq!(err, BuildError::EmptyPipeline);
    assert!(err.to_string().contains("at least one unit"), "{err}");
}

#[test]
fn spawning_outside_a_runtime_is_refused() {
    let live = Live::new();
    let (unit, _remote) = scripted("dump", &live);
    let err = Task::builder("t").unit(unit).spawn().unwrap_err();
    assert_eq!(err, BuildError::NoRuntime);
}

on_both_runtimes! {
    async fn dump_finishes_then_load_runs() {
        let live = Live::new();
        let (dump, dump_remote) = scripted("dump", &live);
        let (load, _load_remote) = scripted("load", &live);
        let handle = Task::builder("migrate").unit(dump).unit(load).spawn().unwrap();
        handle.wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(0)).await;
        dump_remote.order(Order::Complete);
        let snap = handle
            .wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(1))
            .await;
        assert_eq!(snap.unit, Some((1, "load".into())));
        assert!(matches!(snap.outcome, Some(Outcome::Completed)));
        // The run that completed closed its unit before the switch was published.
        assert_eq!(dump_remote.closed(), 1, "a completed unit is closed once, before the next starts");
        live.wait(|_, started| started == 2).await;
        assert_eq!(live.max(), 1);
        handle.stop().await.unwrap();
    }
}

on_both_runtimes! {
    async fn load_fails_then_resume_runs_it_again() {
        let live = Live::new();
        let (load, remote) = scripted("load", &live);
        let handle = Task::builder("migrate").unit(load).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        remote.order(Order::Fail("disk full"));
        let snap = paused_or_finished(&handle).await;
        assert_eq!(snap.stage, Stage::Paused);
        let error = snap.outcome.as_ref().and_then(Outcome::error).expect("an error outcome");
        assert_eq!(error.to_string(), "disk full");
        assert!(!snap.user_paused, "an error pause is not a user pause");
        assert_eq!(live.now(), 0);

        handle.resume().await.unwrap();
        let snap = handle.wait_for_stage(|s| s == Stage::Running).await;
        assert_eq!(snap.generation, 2);
        live.wait(|now, started| now == 1 && started == 2).await;
        assert_eq!(remote.runs(), vec![(1, false), (2, true)], "the second run is a resume");
        handle.stop().await.unwrap();
    }
}

on_both_runtimes! {
    async fn update_is_refused_while_running_and_applied_while_paused() {
        use std::sync::{Arc, Mutex};
        use taskstage::{RunContext, RunError, RunExit, Unit};

        #[derive(Debug)]
        struct Batch {
            seen: Arc<Mutex<Vec<u32>>>,
            applied: Arc<Mutex<Vec<u32>>>,
        }
        impl Unit<u32> for Batch {
            async fn run(&mut self, ctx: RunContext<u32>) -> Result<RunExit, RunError> {
                self.seen.lock().unwrap().push(*ctx.config());
                ctx.cancelled().await;
                Ok(RunExit::Cancelled)
            }
            fn apply_config(&mut self, config: &u32) -> Result<(), RunError> {
                self.applied.lock().unwrap().push(*config);
                Ok(())
            }
        }

        let seen = Arc::new(Mutex::new(Vec::new()));
        let applied = Arc::new(Mutex::new(Vec::new()));
        let handle = Task::builder("cfg")
            .config(100_u32)
            .unit(Batch { seen: seen.clone(), applied: applied.clone() })
            .spawn()
            .unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        let err = handle.update(500).await.unwrap_err();
        assert_eq!(
            err,
            Error::Refused { command: Command::Update, stage: Stage::Running, reason: Refusal::UnitInUse }
        );
        assert_eq!(*handle.config(), 100, "a refused update changes nothing");

        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        handle.update(500).await.unwrap();
        assert_eq!(*handle.config(), 500);
        assert!(applied.lock().unwrap().is_empty(), "applied only before the next run");
        handle.resume().await.unwrap();
        handle.wait_for(|s| s.stage == Stage::Running && s.generation == 2).await;
        handle.pause().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![100, 500]);
        assert_eq!(*applied.lock().unwrap(), vec![500]);
    }
}

on_both_runtimes! {
    async fn pause_and_resume_repeatedly() {
        let live = Live::new();
        let (unit, remote) = scripted("sync", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        for round in 1..=20_u64 {
            handle.wait_for(|s| s.stage == Stage::Running && s.generation == round).await;
            assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
            assert_eq!(live.now(), 0, "round {round}: Paused with a live run");
            let snap = handle.snapshot();
            assert!(snap.user_paused);
            assert!(matches!(snap.outcome, Some(Outcome::Cancelled)));
            handle.resume().await.unwrap();
        }
        handle.wait_for(|s| s.stage == Stage::Running && s.generation == 21).await;
        remote.order(Order::Complete);
        let snap = paused_or_finished(&handle).await;
        assert_eq!(snap.stage, Stage::Finished);
        assert_eq!(snap.unit, None);
        assert_eq!(live.max(), 1);
        assert_eq!(live.started(), 21);
    }
}

on_both_runtimes! {
    async fn the_last_unit_finishing_finishes_the_task() {
        let handle = Task::builder("t")
            .unit(Instant("dump"))
            .unit(Instant("load"))
            .unit(Instant("sync"))
            .spawn()
            .unwrap();
        let snap = paused_or_finished(&handle).await;
        assert_eq!(snap.stage, Stage::Finished);
        assert_eq!(snap.generation, 3, "one run per unit");
        // Stop on Finished is a no-op; every other command is refused.
        assert_eq!(handle.stop().await.unwrap(), Stage::Finished);
        let err = handle.resume().await.unwrap_err();
        assert_eq!((err.command(), err.stage()), (Command::Resume, Stage::Finished));
    }
}

// ---------------------------------------------------------------- rules

on_both_runtimes! {
    async fn a_second_pause_while_paused_is_a_no_op() {
        let live = Live::new();
        let (unit, _remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        let before = handle.snapshot();
        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        let after = handle.snapshot();
        assert_eq!(after.stage, Stage::Paused);
        assert_eq!(after.generation, before.generation);
        assert!(matches!(after.outcome, Some(Outcome::Cancelled)));
    }
}

on_both_runtimes! {
    async fn pausing_an_error_paused_task_keeps_the_error_and_marks_it_user_paused() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        remote.order(Order::Fail("network blip"));
        let snap = paused_or_finished(&handle).await;
        assert!(!snap.user_paused);
        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        let snap = handle.snapshot();
        assert!(snap.user_paused);
        assert_eq!(snap.outcome.and_then(|o| o.error().map(ToString::to_string)).as_deref(), Some("network blip"));
    }
}

on_both_runtimes! {
    async fn a_second_resume_is_refused_and_changes_nothing() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        remote.set_check(Check::Hang);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        assert_eq!(handle.stage(), Stage::Resuming);
        let before = handle.snapshot();
        let err = handle.resume().await.unwrap_err();
        assert_eq!(
            err,
            Error::Refused { command: Command::Resume, stage: Stage::Resuming, reason: Refusal::AlreadyResuming }
        );
        assert!(err.to_string().contains("resume refused in stage Resuming"), "{err}");
        let after = handle.snapshot();
        assert_eq!((after.stage, after.generation, after.seq), (before.stage, before.generation, before.seq));

        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        remote.set_check(Check::Pass);
        handle.resume().await.unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        let err = handle.resume().await.unwrap_err();
        assert_eq!(err.stage(), Stage::Running);
        live.wait(|now, _| now == 1).await;
        assert_eq!(live.max(), 1);
    }
}

on_both_runtimes! {
    async fn a_task_created_paused_starts_on_resume() {
        let live = Live::new();
        let (unit, _remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn_paused().unwrap();
        assert_eq!(handle.stage(), Stage::New);
        let err = handle.pause().await.unwrap_err();
        assert_eq!(err, Error::Refused { command: Command::Pause, stage: Stage::New, reason: Refusal::NotStarted });
        assert_eq!(live.started(), 0);
        handle.resume().await.unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        live.wait(|now, _| now == 1).await;
        assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
        assert_eq!(live.now(), 0);
    }
}

// ---------------------------------------------------------------- fast quit

on_both_runtimes! {
    async fn pause_while_the_pre_start_check_hangs_returns_promptly() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        remote.set_check(Check::Hang);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        assert_eq!(handle.stage(), Stage::Resuming);
        // A deadline far beyond what the check needs to be dropped: only a hang fails.
        let reached = handle.pause_within(Duration::from_secs(60)).await.unwrap();
        assert_eq!(reached, Stage::Paused);
        let snap = handle.snapshot();
        assert!(!snap.stage.is_transitional());
        assert!(snap.user_paused);
        assert_eq!(live.started(), 0, "no run was launched");
    }
}

on_both_runtimes! {
    async fn stop_while_the_pre_start_check_hangs_returns_promptly() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        remote.set_check(Check::Hang);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        let reached = handle.stop_within(Duration::from_secs(60)).await.unwrap();
        assert_eq!(reached, Stage::Stopped);
        assert_eq!(remote.closed(), 1, "stop closes the unit");
        assert_eq!(live.started(), 0);
    }
}

on_both_runtimes! {
    async fn a_failing_pre_start_check_leaves_the_task_paused_with_its_error() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        remote.set_check(Check::Fail);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        let snap = paused_or_finished(&handle).await;
        assert_eq!(snap.stage, Stage::Paused);
        assert_eq!(snap.outcome.and_then(|o| o.error().map(ToString::to_string)).as_deref(), Some("pre-start check failed"));
        assert_eq!(live.started(), 0);
    }
}

// ---------------------------------------------------------------- races

on_both_runtimes! {
    async fn a_unit_that_fails_the_instant_it_is_resumed_ends_paused_with_its_error() {
        use taskstage::{RunContext, RunError, RunExit, Unit};
        #[derive(Debug)]
        struct FailsAtOnce;
        impl Unit for FailsAtOnce {
            async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
                Err(RunError::msg("refused by the target"))
            }
        }
        let handle = Task::builder("t").unit(FailsAtOnce).spawn_paused().unwrap();
        let mut events = handle.subscribe();
        for round in 1..=50_u64 {
            handle.resume().await.unwrap();
            let snap = handle.wait_for(|s| s.stage == Stage::Paused && s.generation == round).await;
            assert!(snap.outcome.as_ref().is_some_and(Outcome::is_failed), "round {round}");
            // Nothing later overwrites the outcome: the stage stays Paused.
            assert_eq!(handle.stage(), Stage::Paused);
        }
        // Subscribers are told after the core has changed; they catch up with the
        // final Paused and never see a later Running.
        let last = *events
            .wait_for(|e| e.generation == 50 && e.stage == Stage::Paused)
            .await
            .unwrap();
        assert_eq!(last.from, Stage::Running);
        assert_eq!(handle.stage(), Stage::Paused);
    }
}

on_both_runtimes! {
    async fn a_pause_issued_as_the_pipeline_switches_reaches_the_next_unit() {
        for _ in 0..30 {
            let live = Live::new();
            let (dump, dump_remote) = scripted("dump", &live);
            let (load, load_remote) = scripted("load", &live);
            let handle = Task::builder("t").unit(dump).unit(load).spawn().unwrap();
            handle.wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(0)).await;
            dump_remote.order(Order::Complete);
            // Pause the instant the core has switched to load: load's run may not
            // have been spawned yet, but its cancel handle exists (invariant 3).
            handle.wait_for(|s| s.unit_index() == Some(1)).await;
            assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
            assert_eq!(live.now(), 0, "Paused while a run is alive");
            let snap = handle.snapshot();
            assert_eq!(snap.unit.map(|(i, _)| i), Some(1));
            assert!(matches!(snap.outcome, Some(Outcome::Cancelled)), "{:?}", snap.outcome);
            assert_eq!(snap.generation, 2, "the pause met load's first run");
            assert!(load_remote.runs().len() <= 1);
            assert_eq!(live.max(), 1);
        }
    }
}

on_both_runtimes! {
    async fn a_pause_racing_a_unit_completion_leaves_a_truthful_stage() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..30 {
            let live = Live::new();
            let (dump, dump_remote) = scripted("dump", &live);
            let (load, _load_remote) = scripted("load", &live);
            let handle = Task::builder("t").unit(dump).unit(load).spawn().unwrap();
            handle.wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(0)).await;
            // Complete dump and pause at the same moment.
            dump_remote.order(Order::Complete);
            assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
            assert_eq!(live.now(), 0, "Paused while a run is alive");
            let snap = handle.snapshot();
            let unit = snap.unit.map(|(i, _)| i);
            // The pause met dump's run (cancelled it, or it completed while Pausing:
            // Paused before load), or it met load's first run (cancelled).
            match (unit, &snap.outcome, snap.generation) {
                (Some(0), Some(Outcome::Cancelled), 1)
                | (Some(1), Some(Outcome::Completed), 1)
                | (Some(1), Some(Outcome::Cancelled), 2) => {}
                other => panic!("untruthful end state {other:?}"),
            }
            seen.insert((unit, snap.generation));
            assert_eq!(live.max(), 1);
        }
        // The race must really have been run both ways, or the rounds above proved
        // one order only. The run sees its order and its cancellation ready at once,
        // and `tokio::select!` picks a ready branch at random, so 30 rounds that all
        // go one way have odds of 2^-29.
        assert!(seen.len() >= 2, "the pause met the completion only one way: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_hammered_from_many_tasks_never_see_two_live_runs() {
    support::within(
        "pause_and_resume_hammered_from_many_tasks_never_see_two_live_runs",
        support::REAL_BOUND,
        async move {
            let live = Live::new();
            let (unit, _remote) = scripted("u", &live);
            let handle = Task::builder("t").unit(unit).spawn().unwrap();
            let mut hammers = Vec::new();
            for worker in 0..4 {
                let handle = handle.clone();
                hammers.push(tokio::spawn(async move {
                    let mut accepted = 0;
                    for i in 0..200 {
                        let result = if (i + worker) % 2 == 0 {
                            handle.pause().await.map(|_| ())
                        } else {
                            handle.resume().await
                        };
                        match result {
                            Ok(()) => accepted += 1,
                            Err(Error::Refused { .. }) => {}
                            Err(other) => panic!("unexpected error: {other}"),
                        }
                    }
                    accepted
                }));
            }
            let mut accepted = 0;
            for hammer in hammers {
                accepted += hammer.await.unwrap();
            }
            assert!(accepted > 0);
            assert!(live.max() <= 1, "two runs were alive at once");
            handle.stop().await.unwrap();
            assert_eq!(live.now(), 0);
        },
    )
    .await
}

// ---------------------------------------------------------------- faults

on_both_runtimes! {
    async fn a_panicking_unit_becomes_an_error_outcome_and_can_be_resumed() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        remote.order(Order::Panic);
        let snap = paused_or_finished(&handle).await;
        assert_eq!(snap.stage, Stage::Paused);
        let error = snap.outcome.as_ref().and_then(Outcome::error).unwrap();
        assert!(error.is_panic());
        assert!(error.to_string().contains("scripted panic"), "{error}");
        assert_eq!(live.now(), 0);
        handle.resume().await.unwrap();
        handle.wait_for(|s| s.stage == Stage::Running && s.generation == 2).await;
        remote.order(Order::Complete);
        assert_eq!(paused_or_finished(&handle).await.stage, Stage::Finished);
    }
}

on_both_runtimes! {
    async fn dropping_the_last_handle_stops_the_task_and_leaves_nothing_running() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        let second = handle.clone();
        live.wait(|now, _| now == 1).await;
        drop(handle);
        assert_eq!(second.stage(), Stage::Running, "a clone keeps the task alive");
        let mut events = second.subscribe();
        drop(second);
        live.wait(|now, _| now == 0).await;
        events.wait_for(|e| e.stage == Stage::Stopped).await.unwrap();
        assert_eq!(remote.closed(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_aborts_a_unit_that_ignores_cancellation() {
    support::within(
        "dropping_the_last_handle_aborts_a_unit_that_ignores_cancellation",
        support::PAUSED_BOUND,
        async move {
            let live = Live::new();
            let (unit, _remote) = stubborn("stubborn", &live);
            let handle = Task::builder("t")
                .unit(unit)
                .stop_grace(Duration::from_secs(5))
                .spawn()
                .unwrap();
            live.wait(|now, _| now == 1).await;
            let mut events = handle.subscribe();
            drop(handle);
            // The paused clock jumps to the grace deadline once everything is idle.
            live.wait(|now, _| now == 0).await;
            events
                .wait_for(|e| e.stage == Stage::Stopped)
                .await
                .unwrap();
        },
    )
    .await
}

#[test]
fn shutting_the_runtime_down_never_hangs_and_drops_every_run() {
    let live = Live::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime.block_on(async {
        let (stubborn, _r1) = stubborn("stubborn", &live);
        let (polite, _r2) = scripted("polite", &live);
        let a = Task::builder("a").unit(stubborn).spawn().unwrap();
        let b = Task::builder("b").unit(polite).spawn().unwrap();
        live.wait(|now, _| now == 2).await;
        (a, b)
    });
    // A bounded wait is the failure condition here, not synchronisation.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(runtime);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("runtime shutdown hung");
    assert_eq!(live.now(), 0, "a run outlived its runtime");
    // The exit guards reported the dropped runs: nothing claims to be running.
    for task in [&handle.0, &handle.1] {
        let snap = task.snapshot();
        assert_eq!(snap.stage, Stage::Paused, "{}", snap.name);
        let error = snap.outcome.as_ref().and_then(Outcome::error).unwrap();
        assert!(error.is_unrequested_cancel(), "{error}");
    }
}

/// A unit whose pre-start check says that it has started, then never returns.
struct HangsInItsCheck(std::sync::mpsc::Sender<()>);

impl taskstage::Unit for HangsInItsCheck {
    async fn prepare(&mut self, _ctx: taskstage::RunContext) -> Result<(), taskstage::RunError> {
        let _ = self.0.send(());
        std::future::pending().await
    }

    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        ctx.cancelled().await;
        Ok(taskstage::RunExit::Cancelled)
    }
}

#[test]
fn shutting_the_runtime_down_during_a_pre_start_check_leaves_no_stage_stuck() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (started, in_check) = std::sync::mpsc::channel();
    let handle =
        runtime.block_on(async { Task::builder("t").unit(HangsInItsCheck(started)).spawn() });
    let handle = handle.unwrap();
    // The check is being polled (a check dropped before its first poll is another case).
    in_check
        .recv_timeout(Duration::from_secs(10))
        .expect("the pre-start check never started");
    assert_eq!(handle.stage(), Stage::Resuming);
    // A bounded wait is the failure condition here, not synchronisation.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(runtime);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("runtime shutdown hung");
    // The exit guard reported the dropped check: the task is not left Resuming.
    let snap = handle.snapshot();
    assert_eq!(
        snap.stage,
        Stage::Paused,
        "a check dropped with its runtime was never reported"
    );
    let error = snap.outcome.as_ref().and_then(Outcome::error).unwrap();
    assert!(error.is_unrequested_cancel(), "{error}");
}

// ---------------------------------------------------------------- bounded waiting

#[tokio::test(start_paused = true)]
async fn pause_of_a_unit_that_ignores_cancellation_times_out_and_stays_pausing() {
    support::within(
        "pause_of_a_unit_that_ignores_cancellation_times_out_and_stays_pausing",
        support::PAUSED_BOUND,
        async move {
            let live = Live::new();
            let (unit, remote) = stubborn("stubborn", &live);
            let handle = Task::builder("t").unit(unit).spawn().unwrap();
            handle.wait_for_stage(|s| s == Stage::Running).await;
            let err = handle
                .pause_within(Duration::from_secs(3))
                .await
                .unwrap_err();
            assert_eq!(
                err,
                Error::Timeout {
                    command: Command::Pause,
                    stage: Stage::Pausing,
                    waited: Duration::from_secs(3)
                }
            );
            assert_eq!(
                handle.stage(),
                Stage::Pausing,
                "the stage does not claim a rest"
            );
            assert_eq!(live.now(), 1);
            // A resume is still refused: the run has not returned.
            assert_eq!(handle.resume().await.unwrap_err().stage(), Stage::Pausing);
            // When the unit finally returns, a second pause sees it through.
            remote.order(Order::Fail("gave up"));
            assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
            assert!(handle.snapshot().user_paused);
            assert_eq!(live.now(), 0);
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn stop_aborts_a_unit_that_ignores_cancellation_and_reports_stopped_once_it_is_gone() {
    support::within(
        "stop_aborts_a_unit_that_ignores_cancellation_and_reports_stopped_once_it_is_gone",
        support::PAUSED_BOUND,
        async move {
            let live = Live::new();
            let (unit, remote) = stubborn("stubborn", &live);
            let handle = Task::builder("t").unit(unit).spawn().unwrap();
            live.wait(|now, _| now == 1).await;
            let start = tokio::time::Instant::now();
            let reached = handle.stop_within(Duration::from_secs(2)).await.unwrap();
            assert_eq!(reached, Stage::Stopped);
            assert_eq!(live.now(), 0, "Stopped while the aborted run is alive");
            assert!(
                start.elapsed() >= Duration::from_secs(2),
                "aborted before the grace period"
            );
            let snap = handle.snapshot();
            assert!(
                matches!(snap.outcome, Some(Outcome::Aborted)),
                "{:?}",
                snap.outcome
            );
            // The aborted run's future was dropped; its unit was kept and closed by the stop.
            assert_eq!(remote.closed(), 1);
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_aborts_a_stubborn_unit_on_the_multi_thread_runtime() {
    support::within(
        "stop_aborts_a_stubborn_unit_on_the_multi_thread_runtime",
        support::REAL_BOUND,
        async move {
            let live = Live::new();
            let (unit, _remote) = stubborn("stubborn", &live);
            let handle = Task::builder("t").unit(unit).spawn().unwrap();
            live.wait(|now, _| now == 1).await;
            let reached = handle.stop_within(Duration::from_millis(20)).await.unwrap();
            assert_eq!(reached, Stage::Stopped);
            assert_eq!(live.now(), 0);
        },
    )
    .await
}

on_both_runtimes! {
    async fn a_pause_future_dropped_half_way_still_reaches_paused() {
        let live = Live::new();
        let (unit, remote) = stubborn("slow", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        {
            let pause = handle.pause();
            tokio::pin!(pause);
            // One poll issues the pause; then the future is dropped.
            assert!(futures_poll_once(pause.as_mut()).await.is_none());
        }
        assert_eq!(handle.stage(), Stage::Pausing);
        remote.order(Order::Complete);
        let snap = handle.wait_for_stage(|s| s != Stage::Pausing).await;
        assert_eq!(snap.stage, Stage::Finished, "the last unit completed while pausing");
        assert_eq!(live.now(), 0);
    }
}

/// Polls a future once; `Some` if it completed.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

// ---------------------------------------------------------------- observation

on_both_runtimes! {
    async fn snapshot_shows_the_unit_and_its_progress() {
        use taskstage::{RunContext, RunError, RunExit, Unit};
        #[derive(Debug)]
        struct Reports;
        impl Unit for Reports {
            fn name(&self) -> &str {
                "reports"
            }
            async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
                ctx.report_progress(40, Some(100));
                ctx.cancelled().await;
                Ok(RunExit::Cancelled)
            }
        }
        let handle = Task::builder("named").unit(Reports).spawn().unwrap();
        let snap = handle.wait_for(|s| s.stage == Stage::Running).await;
        assert_eq!(&*snap.name, "named");
        assert_eq!(snap.unit, Some((0, "reports".into())));
        let snap = loop {
            let snap = handle.snapshot();
            if snap.progress.done == 40 {
                break snap;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(snap.progress.total, Some(100));
        assert_eq!(handle.name(), "named");
    }
}

on_both_runtimes! {
    async fn subscribers_see_changes_in_order() {
        let live = Live::new();
        let (unit, _remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn_paused().unwrap();
        let mut events = handle.subscribe();
        let watcher = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut last_seq = 0;
            loop {
                if events.changed().await.is_err() {
                    return (seen, last_seq);
                }
                let event = *events.borrow_and_update();
                assert!(event.seq > last_seq, "went back from {last_seq} to {}", event.seq);
                last_seq = event.seq;
                seen.push(event.stage);
                if event.stage == Stage::Stopped {
                    return (seen, last_seq);
                }
            }
        });
        handle.resume().await.unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        handle.pause().await.unwrap();
        handle.stop().await.unwrap();
        let (seen, last_seq) = watcher.await.unwrap();
        // A watch may coalesce intermediate changes (a slow subscriber sees fewer),
        // but it ends on the last one, with the core's own change count.
        assert_eq!(seen.last(), Some(&Stage::Stopped));
        assert_eq!(last_seq, handle.snapshot().seq);
    }
}

on_both_runtimes! {
    async fn a_conditional_resume_loses_to_a_pause_issued_after_the_snapshot() {
        let live = Live::new();
        let (unit, remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        remote.order(Order::Fail("network blip"));
        let observed = paused_or_finished(&handle).await;
        assert!(!observed.user_paused);
        // The user pauses the error-paused task after a supervisor looked at it.
        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        let err = handle.resume_if_unchanged(observed.seq).await.unwrap_err();
        assert_eq!(
            err,
            Error::Refused { command: Command::Resume, stage: Stage::Paused, reason: Refusal::Changed }
        );
        let now = handle.snapshot();
        assert_eq!((now.stage, now.generation), (Stage::Paused, observed.generation));
        assert!(now.user_paused);
        // With a fresh look it goes through.
        handle.resume_if_unchanged(now.seq).await.unwrap();
        handle.wait_for(|s| s.stage == Stage::Running && s.generation == 2).await;
        handle.stop().await.unwrap();
    }
}

/// Current-thread only, so that the order is certain: observers are told of a change
/// right after the core publishes it, from the thread that made it. A stop that
/// reaches a live run is finished by the run's own task (the run returns, the unit is
/// closed, Stopped is published and its observers told) in one poll, before the woken
/// caller of `stop` can run. (A stop of a task at rest closes on the blocking pool,
/// whose thread may still be telling the observers when `stop` returns.)
#[tokio::test(flavor = "current_thread")]
async fn a_first_subscriber_starts_from_the_latest_change() {
    support::within("first subscriber", support::REAL_BOUND, async {
        let live = Live::new();
        let (unit, _remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        // Nobody has subscribed, so no channel exists yet.
        assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
        let events = handle.subscribe();
        let event = *events.borrow();
        assert_eq!(
            (event.stage, event.seq),
            (Stage::Stopped, handle.snapshot().seq),
            "a first subscriber was told of a stage the task has left: {event:?}"
        );
    })
    .await;
}

/// A runtime built without timers cannot bound a pause or abort a stubborn run after
/// its grace period: spawning on it is refused with a typed error, instead of a later
/// command panicking inside tokio.
#[test]
fn spawn_on_a_runtime_without_timers_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let spawned = Task::builder("no-timers").unit(Instant("x")).spawn();
        let error = spawned.expect_err("spawn accepted a runtime without timers");
        assert_eq!(error, BuildError::NoTimers);
        assert!(
            error.to_string().contains("enable_time"),
            "the error does not say what to do: {error}"
        );
    });
}

// ---------------------------------------------------------------- a close that panics

/// A unit whose `close` panics; its run completes at once or waits for its cancel.
struct PanicsOnClose {
    completes: bool,
}

impl taskstage::Unit for PanicsOnClose {
    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        if !self.completes {
            ctx.cancelled().await;
            return Ok(taskstage::RunExit::Cancelled);
        }
        Ok(taskstage::RunExit::Completed)
    }

    fn close(&mut self) {
        panic!("close fails");
    }
}

/// A unit that waits for its cancel and counts its closes.
struct CountsCloses(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl taskstage::Unit for CountsCloses {
    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        ctx.cancelled().await;
        Ok(taskstage::RunExit::Cancelled)
    }

    fn close(&mut self) {
        // SeqCst: read by the test after the stage says the units are closed.
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A panic in one unit's `close` is caught: the pipeline moves on after a completed
/// unit, a stop (from Running or from Paused) still ends Stopped, and the other units
/// are still closed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_close_that_panics_neither_sticks_the_task_nor_skips_the_other_closes() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    support::within("close panics", support::PAUSED_BOUND, async {
        for (completes, pause_first) in [(true, false), (false, false), (false, true)] {
            let closed = Arc::new(AtomicUsize::new(0));
            let handle = Task::builder("t")
                .unit(PanicsOnClose { completes })
                .unit(CountsCloses(Arc::clone(&closed)))
                .spawn()
                .unwrap();
            let expected_unit = if completes { 1 } else { 0 };
            let running = handle
                .wait_for(|snapshot| {
                    snapshot.stage == Stage::Running && snapshot.unit_index() == Some(expected_unit)
                })
                .await;
            assert_eq!(running.unit_index(), Some(expected_unit));
            if pause_first {
                assert_eq!(handle.pause().await.ok(), Some(Stage::Paused));
            }
            assert_eq!(
                handle.stop().await.ok(),
                Some(Stage::Stopped),
                "completes {completes}, paused first {pause_first}"
            );
            assert_eq!(
                closed.load(SeqCst),
                1,
                "completes {completes}, paused first {pause_first}: the other unit was not closed"
            );
        }
    })
    .await;
}
/// A task whose runtime shut down while it was Paused takes a resume without
/// hanging in Resuming: the start that can never run (its spawn on the runtime that
/// is gone is dropped unpolled) is reported as cancelled with its unit back in its
/// slot, and a stop still closes the unit and reaches Stopped. The unit used to be
/// lost with the dropped spawn, and never closed.
#[test]
fn a_resume_after_the_runtime_shut_down_leaves_no_stage_stuck() {
    let live = Live::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (handle, remote) = runtime.block_on(async {
        let (unit, remote) = scripted("load", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
        (handle, remote)
    });
    // A bounded wait is the failure condition here, not synchronisation.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(runtime);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("runtime shutdown hung");
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async {
        handle.resume().await.unwrap();
        let snap = handle.snapshot();
        assert_eq!(
            snap.stage,
            Stage::Paused,
            "the resume's start was never reported"
        );
        let error = snap.outcome.as_ref().and_then(Outcome::error).unwrap();
        assert!(error.is_unrequested_cancel(), "{error}");
        let stopped = tokio::time::timeout(Duration::from_secs(10), handle.stop())
            .await
            .expect("the stop hung");
        assert_eq!(stopped.unwrap(), Stage::Stopped);
    });
    assert_eq!(remote.closed(), 1, "the unit was not closed");
    assert_eq!(live.now(), 0);
}

/// A unit whose check counts how often its code ran.
struct CountedCheck {
    prepared: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl taskstage::Unit for CountedCheck {
    async fn prepare(&mut self, _ctx: taskstage::RunContext) -> Result<(), taskstage::RunError> {
        self.prepared
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        ctx.cancelled().await;
        Ok(taskstage::RunExit::Cancelled)
    }
}

/// A pause issued before a check's first poll drops the check unpolled: its code
/// never runs. On a current-thread runtime the check spawned by a resume is not
/// polled until the test yields, so the pause lands first, every time.
#[tokio::test(flavor = "current_thread")]
async fn a_check_paused_before_its_first_poll_never_runs_its_code() {
    let prepared = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handle = Task::builder("checked")
        .unit(CountedCheck {
            prepared: std::sync::Arc::clone(&prepared),
        })
        .spawn_paused()
        .expect("spawn");
    handle.resume().await.expect("New accepts a resume");
    assert_eq!(
        handle.stage(),
        Stage::Resuming,
        "the check is spawned, not polled"
    );
    let settling = handle.pause_now().expect("a check accepts a pause");
    let stage = settling.await.expect("the pause settles");
    assert!(matches!(stage, Stage::New | Stage::Paused), "{stage}");
    assert_eq!(
        prepared.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the check's code ran though it was paused before its first poll"
    );
    // Resumed again, the check runs once and the run starts.
    handle.resume().await.expect("a resume");
    tokio::time::timeout(
        Duration::from_secs(5),
        handle.wait_for_stage(|s| s == Stage::Running),
    )
    .await
    .expect("the task runs");
    assert_eq!(prepared.load(std::sync::atomic::Ordering::SeqCst), 1);
    handle.stop().await.expect("a stop");
}

/// A run that returned when cancelled is `Cancelled`; one that had to be aborted
/// (a stop that escalated after its grace) is `Aborted`: its code was cut off
/// wherever it was, and the outcome says so.
#[tokio::test(flavor = "current_thread")]
async fn an_aborted_run_says_so_and_a_cancelled_one_says_that() {
    let live = Live::new();
    let (polite, _polite_remote) = scripted("polite", &live);
    let handle = Task::builder("polite").unit(polite).spawn().expect("spawn");
    handle.wait_for_stage(|s| s == Stage::Running).await;
    assert_eq!(handle.stop().await, Ok(Stage::Stopped));
    assert!(
        matches!(handle.snapshot().outcome, Some(Outcome::Cancelled)),
        "{:?}",
        handle.snapshot().outcome
    );

    let (stubborn, _stubborn_remote) = stubborn("stubborn", &live);
    let handle = Task::builder("stubborn")
        .unit(stubborn)
        .spawn()
        .expect("spawn");
    handle.wait_for_stage(|s| s == Stage::Running).await;
    assert_eq!(
        handle.stop_within(Duration::from_millis(50)).await,
        Ok(Stage::Stopped)
    );
    assert!(
        matches!(handle.snapshot().outcome, Some(Outcome::Aborted)),
        "{:?}",
        handle.snapshot().outcome
    );
}

/// `abort_now` aborts at once: a run that ignores its token is gone with no grace
/// period waited (the paused clock does not move), its outcome says `Aborted`, and
/// Stopped comes only after its unit's close returned. Dropping the wait undoes
/// nothing: the abort happens when the call returns, not when the future is polled.
#[tokio::test(start_paused = true)]
async fn abort_now_aborts_at_once_and_still_closes_first() {
    let live = Live::new();
    let (unit, remote) = stubborn("deaf", &live);
    let handle = Task::builder("deaf")
        .unit(unit)
        .stop_grace(Duration::from_secs(60))
        .spawn()
        .expect("spawn");
    handle.wait_for_stage(|s| s == Stage::Running).await;
    let began = tokio::time::Instant::now();
    drop(
        handle
            .abort_now()
            .expect("a stop is accepted while running"),
    );
    let settled = tokio::time::timeout(
        Duration::from_secs(1),
        handle.wait_for_stage(Stage::is_terminal),
    )
    .await
    .expect("stopped within a second, well inside the 60 s grace");
    assert_eq!(settled.stage, Stage::Stopped);
    assert_eq!(
        began.elapsed(),
        Duration::ZERO,
        "no grace period was waited"
    );
    assert!(
        matches!(settled.outcome, Some(Outcome::Aborted)),
        "{:?}",
        settled.outcome
    );
    assert_eq!(remote.closed(), 1, "Stopped only after the close returned");
    assert_eq!(live.now(), 0, "the aborted run is gone");
}
