//! The typestate API with real units: every transition of the specification's table
//! that a caller can cause is reached through a typed method, and every transition
//! that can race with the run's own exit reports the stage actually reached (and
//! gives the task back on error). Each scenario runs on the current-thread runtime
//! (with tokio's paused clock) and on the multi-thread runtime.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::mem::size_of;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use taskstage::typestate::stages::{
    Finished, New, Paused, Pausing, Resuming, Running, StageMarker, Stopped, Stopping,
};
use taskstage::typestate::{AnyTask, AtRest, Ended, Started, TaskError};
use taskstage::{
    Command, Error, Handle, Outcome, Refusal, RunContext, RunError, RunExit, Stage, Task,
    TaskSnapshot, Unit,
};
use tokio::sync::{mpsc, oneshot, Notify};

// ------------------------------------------------------------------ test units

/// Waits for cancellation in every run; counts how often it was closed.
#[derive(Debug, Default)]
struct WaitsForCancel {
    closed: Arc<AtomicUsize>,
}

impl Unit for WaitsForCancel {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Completes when its gate opens (or returns when cancelled first).
#[derive(Debug)]
struct Finishes {
    gate: Arc<Notify>,
}

impl Unit for Finishes {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        tokio::select! {
            () = ctx.cancelled() => Ok(RunExit::Cancelled),
            () = self.gate.notified() => Ok(RunExit::Completed),
        }
    }
}

/// Fails when its gate opens (or returns when cancelled first).
#[derive(Debug)]
struct Fails {
    gate: Arc<Notify>,
}

impl Unit for Fails {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        tokio::select! {
            () = ctx.cancelled() => Ok(RunExit::Cancelled),
            () = self.gate.notified() => Err(RunError::msg("disk full")),
        }
    }
}

/// Reports a cancellation nobody asked for when its gate opens.
#[derive(Debug)]
struct FakesCancel {
    gate: Arc<Notify>,
}

impl Unit for FakesCancel {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        self.gate.notified().await;
        Ok(RunExit::Cancelled)
    }
}

/// Its pre-start check never returns by itself.
#[derive(Debug)]
struct HangingCheck;

impl Unit for HangingCheck {
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        std::future::pending().await
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// Its pre-start check fails.
#[derive(Debug)]
struct FailingCheck;

impl Unit for FailingCheck {
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        Err(RunError::msg("target unreachable"))
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// What a run that ignores cancellation does when the test tells it.
#[derive(Debug, Clone, Copy)]
enum Then {
    Complete,
    Fail,
    ReturnCancelled,
}

/// Ignores cancellation: every run waits for the test's order, and only for it.
#[derive(Debug)]
struct IgnoresCancel {
    orders: mpsc::UnboundedReceiver<Then>,
}

impl Unit for IgnoresCancel {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        match self.orders.recv().await {
            Some(Then::Complete) => Ok(RunExit::Completed),
            Some(Then::Fail) => Err(RunError::msg("failed while ignoring the pause")),
            Some(Then::ReturnCancelled) | None => Ok(RunExit::Cancelled),
        }
    }
}

fn ignores_cancel() -> (IgnoresCancel, mpsc::UnboundedSender<Then>) {
    let (orders_tx, orders) = mpsc::unbounded_channel();
    (IgnoresCancel { orders }, orders_tx)
}

/// Blocks its thread until released: even an abort cannot reach it meanwhile.
#[derive(Debug)]
struct BlocksThread {
    blocking: Option<oneshot::Sender<()>>,
    release: std::sync::mpsc::Receiver<()>,
}

impl Unit for BlocksThread {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        if let Some(blocking) = self.blocking.take() {
            let _ = blocking.send(());
        }
        // Deliberately blocking: the test proves a stop's bounded wait.
        let _ = self.release.recv();
        Ok(RunExit::Cancelled)
    }
}

/// Reports the configuration every run starts with.
#[derive(Debug)]
struct SeesConfig {
    seen: mpsc::UnboundedSender<u32>,
}

fn sees_config() -> (SeesConfig, mpsc::UnboundedReceiver<u32>) {
    let (seen, seen_rx) = mpsc::unbounded_channel();
    (SeesConfig { seen }, seen_rx)
}

impl Unit<u32> for SeesConfig {
    async fn run(&mut self, ctx: RunContext<u32>) -> Result<RunExit, RunError> {
        let _ = self.seen.send(*ctx.config());
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

fn gate() -> Arc<Notify> {
    Arc::new(Notify::new())
}

// ------------------------------------------------------------------ helpers

/// Fails the test, naming it, if its body has not finished within `bound` (virtual
/// time on the paused clock, which jumps ahead when every task waits, so a lost
/// wake-up fails at once; real time otherwise). A failure condition, not
/// synchronisation.
async fn within<F: std::future::Future<Output = ()>>(test: &str, bound: Duration, body: F) {
    if tokio::time::timeout(bound, body).await.is_err() {
        panic!("{test}: a state it waits for never came within {bound:?}");
    }
}

/// Runs the scenario on the current-thread runtime with a paused clock (`short` is
/// then virtual time) and on the multi-thread runtime (`short` is real time, spent
/// only where a deadline is meant to pass while the unit is held).
macro_rules! on_both_runtimes {
    ($(async fn $name:ident($short:ident: Duration) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn current_thread() {
                #[allow(unused_variables)]
                let $short = Duration::from_secs(1);
                within(stringify!($name), Duration::from_secs(3600), async move $body).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn multi_thread() {
                #[allow(unused_variables)]
                let $short = Duration::from_millis(20);
                within(stringify!($name), Duration::from_secs(20), async move $body).await
            }
        }
    )*};
}

#[track_caller]
fn expect_running<C: Send + Sync + 'static>(started: Started<C>) -> Task<Running, C> {
    match started {
        Started::Running(task) => task,
        other => panic!("expected Running, reached {other:?}"),
    }
}

/// Spawns a one-unit task and waits until its run is alive.
async fn spawn_running<U: Unit>(unit: U) -> Task<Running> {
    expect_running(
        Task::builder("t")
            .unit(unit)
            .spawn_typed()
            .unwrap()
            .started()
            .await,
    )
}

#[track_caller]
fn expect_paused<C: Send + Sync + 'static>(rest: AtRest<C>) -> Task<Paused, C> {
    match rest {
        AtRest::Paused(task) => task,
        other => panic!("expected Paused, reached {other:?}"),
    }
}

#[track_caller]
fn expect_stopped<C: Send + Sync + 'static>(ended: Ended<C>) -> Task<Stopped, C> {
    match ended {
        Ended::Stopped(task) => task,
        other => panic!("expected Stopped, reached {other:?}"),
    }
}

/// Checks that a stop reached Stopped; the stopped task is dropped.
#[track_caller]
fn assert_stopped<C: Send + Sync + 'static>(ended: Ended<C>) {
    assert_eq!(expect_stopped(ended).snapshot().stage, Stage::Stopped);
}

fn outcome_is_cancelled(snapshot: &TaskSnapshot) -> bool {
    matches!(snapshot.outcome, Some(Outcome::Cancelled))
}

fn outcome_error(snapshot: &TaskSnapshot) -> String {
    match &snapshot.outcome {
        Some(Outcome::Failed(error)) => error.to_string(),
        other => panic!("expected a failed outcome, found {other:?}"),
    }
}

// ------------------------------------------------------------------ compile time

fn require_traits<T: Send + Sync + Unpin>() {}
fn require_send<T: Send>(_: T) {}

fn marker_independent<S: StageMarker>() {
    // Auto traits do not depend on the marker, and the marker costs nothing.
    require_traits::<Task<S>>();
    require_traits::<Task<S, u32>>();
    assert_eq!(size_of::<Task<S>>(), size_of::<Handle>());
}

#[test]
fn typed_tasks_are_send_sync_unpin_for_every_stage() {
    marker_independent::<New>();
    marker_independent::<Running>();
    marker_independent::<Pausing>();
    marker_independent::<Paused>();
    marker_independent::<Resuming>();
    marker_independent::<Stopping>();
    marker_independent::<Stopped>();
    marker_independent::<Finished>();
    require_traits::<AnyTask>();
    require_traits::<AtRest>();
    require_traits::<Ended>();
    require_traits::<Started>();
    require_traits::<TaskError>();
    assert_eq!(size_of::<Running>(), 0);
}

#[test]
fn transition_futures_are_send() {
    // Type-checked, never run: each transition's future can go to `tokio::spawn`.
    let _ = |t: Task<New>| require_send(t.start());
    let _ = |t: Task<New>| require_send(t.update(()));
    let _ = |t: Task<Running>| require_send(t.pause());
    let _ = |t: Task<Running>| require_send(t.join());
    let _ = |t: Task<Running>| require_send(t.stop());
    let _ = |t: Task<Pausing>| require_send(t.paused());
    let _ = |t: Task<Paused>| require_send(t.resume());
    let _ = |t: Task<Paused>| require_send(t.hold());
    let _ = |t: Task<Resuming>| require_send(t.started());
    let _ = |t: Task<Resuming>| require_send(t.started_within(Duration::ZERO));
    let _ = |t: Task<Stopping>| require_send(t.stop_within(Duration::ZERO));
}

#[test]
fn markers_name_their_stages() {
    assert_eq!(New::STAGE, Stage::New);
    assert_eq!(Running::STAGE, Stage::Running);
    assert_eq!(Pausing::STAGE, Stage::Pausing);
    assert_eq!(Paused::STAGE, Stage::Paused);
    assert_eq!(Resuming::STAGE, Stage::Resuming);
    assert_eq!(Stopping::STAGE, Stage::Stopping);
    assert_eq!(Stopped::STAGE, Stage::Stopped);
    assert_eq!(Finished::STAGE, Stage::Finished);
}

/// The code block under "## README example" in a markdown file.
fn readme_example(markdown: &str) -> String {
    let (_, after) = markdown
        .split_once("## README example\n\n```rust\n")
        .expect("docs/typestate.md has a README example");
    let (code, _) = after.split_once("```\n").expect("the code block ends");
    code.to_owned()
}

/// The first doc test of `src/typestate.rs`, without its comment markers.
fn module_example(source: &str) -> String {
    let (_, after) = source
        .split_once("//! # Examples\n//!\n//! ```\n")
        .expect("the module docs have an example");
    let (code, _) = after.split_once("//! ```\n").expect("the code block ends");
    code.lines()
        .map(|line| {
            line.strip_prefix("//! ")
                .unwrap_or(line.trim_start_matches("//!"))
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn the_readme_example_in_docs_is_the_doc_test_that_runs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/docs/typestate.md")).unwrap();
    let source = std::fs::read_to_string(format!("{root}/src/typestate.rs")).unwrap();
    let example = readme_example(&docs);
    assert!(example.contains("spawn_typed()"), "{example}");
    assert_eq!(
        example,
        module_example(&source),
        "docs/typestate.md and src/typestate.rs differ"
    );
}

// ------------------------------------------------------------------ New

on_both_runtimes! {
    // New + update → apply; New + resume → Resuming; Resuming + prep ok → Running;
    // Running + stop → Stopping → Stopped.
    async fn new_task_is_configured_started_and_stopped(short: Duration) {
        let (unit, mut seen) = sees_config();
        let task: Task<New, u32> =
            Task::builder("t").config(1).unit(unit).spawn_typed_paused().unwrap();
        assert_eq!(task.snapshot().stage, Stage::New);
        assert_eq!(task.typed_stage(), Stage::New);

        let task = task.update(2).await.unwrap();
        assert_eq!(*task.config(), 2);
        assert!(seen.try_recv().is_err(), "nothing ran in New");

        let task = expect_running(task.start().await.unwrap().started().await);
        assert_eq!(task.snapshot().stage, Stage::Running);
        assert_eq!(seen.recv().await, Some(2), "the run saw the update");

        let stopped = expect_stopped(task.stop().await.unwrap());
        assert_eq!(stopped.snapshot().stage, Stage::Stopped);
    }

    // New + stop → Stopped, units closed, nothing ever ran.
    async fn new_task_stops_without_running(short: Duration) {
        let unit = WaitsForCancel::default();
        let closed = Arc::clone(&unit.closed);
        let task = Task::builder("t").unit(unit).spawn_typed_paused().unwrap();
        let stopped = expect_stopped(task.stop().await.unwrap());
        let snap = stopped.snapshot();
        assert_eq!(snap.stage, Stage::Stopped);
        assert_eq!(snap.generation, 0, "no run was ever started");
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }
}

// ------------------------------------------------------------------ Running

on_both_runtimes! {
    // Running + pause → Pausing → (run cancelled) Paused; Paused + resume → Resuming
    // → Running; Paused + stop → Stopped.
    async fn pause_resume_and_stop(short: Duration) {
        let unit = WaitsForCancel::default();
        let closed = Arc::clone(&unit.closed);
        let task = spawn_running(unit).await;
        assert!(format!("{task:?}").contains("Running"), "{task:?}");

        let task = expect_paused(task.pause().await.unwrap());
        let snap = task.snapshot();
        assert_eq!(snap.stage, Stage::Paused);
        assert!(outcome_is_cancelled(&snap));
        assert!(snap.user_paused);

        let task = expect_running(task.resume().await.unwrap().started().await);
        let snap = task.snapshot();
        assert_eq!(snap.generation, 2, "the resume is a second run");
        assert!(!snap.user_paused, "the resume cleared the mark");

        let task = expect_paused(task.pause_within(short).await.unwrap());
        let stopped = expect_stopped(task.stop().await.unwrap());
        assert_eq!(stopped.snapshot().stage, Stage::Stopped);
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }

    // Running + run failed → Paused (error) before the pause met it; the pause then
    // reports Paused truthfully and marks it user-paused (Paused + pause).
    async fn pause_of_a_run_that_already_failed_reports_paused(short: Duration) {
        let go = gate();
        let unit = Fails { gate: Arc::clone(&go) };
        let task = spawn_running(unit).await;
        go.notify_one();
        let snap = task.handle().wait_for_stage(|s| s == Stage::Paused).await;
        assert!(!snap.user_paused);
        // `task` is a stale Task<Running> now: the pause must look at the core.
        let task = expect_paused(task.pause().await.unwrap());
        let snap = task.snapshot();
        assert_eq!(outcome_error(&snap), "disk full");
        assert!(snap.user_paused, "a pause in Paused marks the task user-paused");
        assert_stopped(task.stop().await.unwrap());
    }

    // Running + run ok (last unit) → Finished before the pause met it: the pause
    // reports Finished, not an error and not a Task<Paused>.
    async fn pause_of_a_run_that_already_finished_reports_finished(short: Duration) {
        let go = gate();
        let unit = Finishes { gate: Arc::clone(&go) };
        let task = spawn_running(unit).await;
        go.notify_one();
        task.handle().wait_for_stage(|s| s == Stage::Finished).await;
        match task.pause().await.unwrap() {
            AtRest::Finished(task) => {
                assert_eq!(task.snapshot().stage, Stage::Finished);
                assert!(matches!(task.snapshot().outcome, Some(Outcome::Completed)));
            }
            other => panic!("expected Finished, reached {other:?}"),
        }
    }

    // A stop of a stale Task<Running> whose last unit completed reports Finished (the
    // table's stop in Finished, a no-op).
    async fn stop_of_a_run_that_already_finished_reports_finished(short: Duration) {
        let go = gate();
        let unit = Finishes { gate: Arc::clone(&go) };
        let task = spawn_running(unit).await;
        go.notify_one();
        task.handle().wait_for_stage(|s| s == Stage::Finished).await;
        match task.stop().await.unwrap() {
            Ended::Finished(task) => assert_eq!(task.snapshot().stage, Stage::Finished),
            other => panic!("expected Finished, reached {other:?}"),
        }
    }

    // Running + run ok (more units) → Running (next unit); Running + run ok (last
    // unit) → Finished; observed through join.
    async fn join_follows_the_pipeline_to_finished(short: Duration) {
        let (first, second) = (gate(), gate());
        let task = Task::builder("t")
                .unit(Finishes { gate: Arc::clone(&first) })
                .unit(Finishes { gate: Arc::clone(&second) }).spawn_typed()
        .unwrap();
        let task = expect_running(task.started().await);
        first.notify_one();
        let snap = task
            .handle()
            .wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(1))
            .await;
        assert_eq!(snap.generation, 2, "the next unit is a new run");
        second.notify_one();
        match task.join().await {
            AtRest::Finished(task) => {
                let snap = task.snapshot();
                assert_eq!(snap.unit, None, "every unit completed");
                assert!(matches!(snap.outcome, Some(Outcome::Completed)));
            }
            other => panic!("expected Finished, reached {other:?}"),
        }
    }

    // Running + run failed → Paused, outcome = error, not user-paused.
    async fn join_reports_a_failed_run_as_paused(short: Duration) {
        let go = gate();
        let task = Task::builder("t").unit(Fails { gate: Arc::clone(&go) }).spawn_typed().unwrap();
        let task = expect_running(task.started().await);
        go.notify_one();
        let task = expect_paused(task.join().await);
        let snap = task.snapshot();
        assert_eq!(outcome_error(&snap), "disk full");
        assert!(!snap.user_paused);
        assert_stopped(task.stop().await.unwrap());
    }

    // Running + run cancelled (nobody asked) → Paused, outcome = error.
    async fn join_reports_an_unrequested_cancel_as_a_failure(short: Duration) {
        let go = gate();
        let task =
            Task::builder("t").unit(FakesCancel { gate: Arc::clone(&go) }).spawn_typed().unwrap();
        let task = expect_running(task.started().await);
        go.notify_one();
        let task = expect_paused(task.join().await);
        match task.snapshot().outcome {
            Some(Outcome::Failed(error)) => assert!(error.is_unrequested_cancel()),
            other => panic!("expected a failure, found {other:?}"),
        }
        assert_stopped(task.stop().await.unwrap());
    }
}

// ------------------------------------------------------------------ Resuming

on_both_runtimes! {
    // Resuming + prep failed → Paused, outcome = error.
    async fn started_reports_a_failed_check_as_paused(short: Duration) {
        let task = Task::builder("t").unit(FailingCheck).spawn_typed().unwrap();
        let task = match task.started().await {
            Started::Paused(task) => task,
            other => panic!("expected Paused, reached {other:?}"),
        };
        let snap = task.snapshot();
        assert_eq!(outcome_error(&snap), "target unreachable");
        assert!(!snap.user_paused);
        assert_stopped(task.stop().await.unwrap());
    }

    // A check that fails at once or a run that fails at once: started reports
    // whichever stage it saw, and either leads to the truthful Paused.
    async fn started_is_truthful_about_a_run_that_fails_at_once(short: Duration) {
        let go = gate();
        go.notify_one(); // the run fails as soon as it starts
        let task = Task::builder("t").unit(Fails { gate: Arc::clone(&go) }).spawn_typed().unwrap();
        let task = match task.started().await {
            Started::Running(task) => expect_paused(task.join().await),
            Started::Paused(task) => task,
            other => panic!("expected Running or Paused, reached {other:?}"),
        };
        assert_eq!(outcome_error(&task.snapshot()), "disk full");
        assert_stopped(task.stop().await.unwrap());
    }

    // Resuming + pause → Pausing, cancel the check → Paused, outcome = cancelled.
    async fn pause_during_a_hanging_check(short: Duration) {
        let task = Task::builder("t").unit(HangingCheck).spawn_typed().unwrap();
        let task = expect_paused(task.pause_within(short * 100).await.unwrap());
        let snap = task.snapshot();
        assert!(outcome_is_cancelled(&snap));
        assert!(snap.user_paused);
        // The check can be retried: Paused + resume → Resuming again.
        let task = task.resume().await.unwrap();
        assert_eq!(task.snapshot().stage, Stage::Resuming);
        assert_stopped(task.stop().await.unwrap());
    }

    // Resuming + stop → Stopping, cancel the check → Stopped.
    async fn stop_during_a_hanging_check(short: Duration) {
        let task = Task::builder("t").unit(HangingCheck).spawn_typed().unwrap();
        let stopped = expect_stopped(task.stop().await.unwrap());
        assert_eq!(stopped.snapshot().stage, Stage::Stopped);
    }

    // A wait for a hanging check times out and gives the task back as Resuming.
    async fn started_within_times_out_and_gives_the_task_back(short: Duration) {
        let task = Task::builder("t").unit(HangingCheck).spawn_typed().unwrap();
        let err = task.started_within(short).await.unwrap_err();
        assert_eq!(
            *err.error(),
            Error::Timeout { command: Command::Resume, stage: Stage::Resuming, waited: short }
        );
        assert!(err.to_string().contains("resume timed out"), "{err}");
        let AnyTask::Resuming(task) = err.into_task() else {
            panic!("the check is still running")
        };
        assert_stopped(task.stop().await.unwrap());
    }
}

// ------------------------------------------------------------------ Pausing

/// Pauses a run that ignores cancellation: the pause times out and gives back a
/// `Task<Pausing>`; then the run does `then` and the wait on the Pausing task settles.
async fn pausing_then(then: Then, units: usize, short: Duration) -> AtRest {
    let (unit, orders) = ignores_cancel();
    let mut builder = Task::builder("t").unit(unit);
    for _ in 1..units {
        builder = builder.unit(WaitsForCancel::default());
    }
    let task = expect_running(builder.spawn_typed().unwrap().started().await);
    let err = task.pause_within(short).await.unwrap_err();
    assert_eq!(
        *err.error(),
        Error::Timeout {
            command: Command::Pause,
            stage: Stage::Pausing,
            waited: short
        }
    );
    let (_, task) = err.into_parts();
    let AnyTask::Pausing(task) = task else {
        panic!("the run ignores cancellation: the stage stays Pausing, found {task:?}")
    };
    assert_eq!(task.snapshot().stage, Stage::Pausing);
    orders.send(then).unwrap();
    let rest = task.paused().await.unwrap();
    drop(orders);
    rest
}

on_both_runtimes! {
    // Pausing + pause → wait; Pausing + run cancelled → Paused, outcome = cancelled.
    async fn a_timed_out_pause_gives_back_a_pausing_task(short: Duration) {
        let task = expect_paused(pausing_then(Then::ReturnCancelled, 1, short).await);
        let snap = task.snapshot();
        assert!(outcome_is_cancelled(&snap));
        assert!(snap.user_paused);
        assert_stopped(task.stop().await.unwrap());
    }

    // Pausing + run ok (more units) → Paused before the next unit.
    async fn pausing_run_that_completes_a_unit_pauses_before_the_next(short: Duration) {
        let task = expect_paused(pausing_then(Then::Complete, 2, short).await);
        let snap = task.snapshot();
        assert_eq!(snap.unit.map(|(i, _)| i), Some(1), "the next unit has not started");
        assert!(matches!(snap.outcome, Some(Outcome::Completed)));
        assert!(snap.user_paused);
        assert_stopped(task.stop().await.unwrap());
    }

    // Pausing + run ok (last unit) → Finished.
    async fn pausing_run_that_completes_the_last_unit_finishes(short: Duration) {
        match pausing_then(Then::Complete, 1, short).await {
            AtRest::Finished(task) => assert_eq!(task.snapshot().stage, Stage::Finished),
            other => panic!("expected Finished, reached {other:?}"),
        }
    }

    // Pausing + run failed → Paused, outcome = error, marked user-paused.
    async fn pausing_run_that_fails_is_paused_by_the_user(short: Duration) {
        let task = expect_paused(pausing_then(Then::Fail, 1, short).await);
        let snap = task.snapshot();
        assert_eq!(outcome_error(&snap), "failed while ignoring the pause");
        assert!(snap.user_paused);
        assert_stopped(task.stop().await.unwrap());
    }

    // Pausing + stop → Stopping; the run ignores it, so the stop aborts it after the
    // grace period and reports Stopped once it is gone.
    async fn a_pausing_task_can_be_stopped(short: Duration) {
        let (unit, orders) = ignores_cancel();
        let task = spawn_running(unit).await;
        let AnyTask::Pausing(task) = task.pause_within(short).await.unwrap_err().into_task() else {
            panic!("the stage stays Pausing")
        };
        let stopped = expect_stopped(task.stop_within(short).await.unwrap());
        assert_eq!(stopped.snapshot().stage, Stage::Stopped);
        drop(orders);
    }
}

// ------------------------------------------------------------------ Paused

on_both_runtimes! {
    // Paused + pause (hold) → Paused, marks an error-paused task user-paused.
    async fn hold_marks_an_error_pause_as_user_paused(short: Duration) {
        let go = gate();
        let task = Task::builder("t").unit(Fails { gate: Arc::clone(&go) }).spawn_typed().unwrap();
        let task = expect_running(task.started().await);
        go.notify_one();
        let task = expect_paused(task.join().await);
        assert!(!task.snapshot().user_paused);
        let generation = task.snapshot().generation;

        let task = expect_paused(task.hold().await.unwrap());
        let snap = task.snapshot();
        assert!(snap.user_paused);
        assert_eq!(outcome_error(&snap), "disk full", "the outcome is kept");
        assert_eq!(snap.generation, generation, "nothing ran");
        assert_stopped(task.stop().await.unwrap());
    }

    // Paused + update → apply; the next run sees it.
    async fn a_paused_task_is_reconfigured_for_its_next_run(short: Duration) {
        let (unit, mut seen) = sees_config();
        let task = Task::builder("t").config(1).unit(unit).spawn_typed().unwrap();
        let task = expect_running(task.started().await);
        assert_eq!(seen.recv().await, Some(1));
        let task = expect_paused(task.pause().await.unwrap());
        let task = task.update(5).await.unwrap();
        assert_eq!(*task.config(), 5);
        let task = expect_running(task.resume().await.unwrap().started().await);
        assert_eq!(seen.recv().await, Some(5), "the resumed run saw the update");
        assert_stopped(task.stop().await.unwrap());
    }
}

// ------------------------------------------------------------------ Stopping

on_both_runtimes! {
    // Stopping + stop → wait for Stopped. The Task<Stopping> comes from the handle's
    // current stage while another party's stop is in progress.
    async fn a_stopping_task_waits_for_the_stop(short: Duration) {
        let (unit, orders) = ignores_cancel();
        let task = spawn_running(unit).await;
        let other = task.handle().clone();
        let other_stop = tokio::spawn(async move { other.stop().await });
        task.handle().wait_for_stage(|s| s == Stage::Stopping).await;
        let AnyTask::Stopping(task) = task.refresh() else {
            panic!("the run ignores cancellation: the stage stays Stopping")
        };
        orders.send(Then::ReturnCancelled).unwrap();
        let stopped = expect_stopped(task.stop().await.unwrap());
        assert!(outcome_is_cancelled(&stopped.snapshot()));
        assert_eq!(other_stop.await.unwrap(), Ok(Stage::Stopped));
    }
}

// Stopping + stop after a timed-out stop. Only the multi-thread runtime can hold a
// thread-blocking unit while the stop's deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_stop_gives_back_a_stopping_task() {
    within(
        "a_timed_out_stop_gives_back_a_stopping_task",
        Duration::from_secs(20),
        async move {
            let (blocking_tx, blocking) = oneshot::channel();
            let (release, release_rx) = std::sync::mpsc::channel();
            let unit = BlocksThread {
                blocking: Some(blocking_tx),
                release: release_rx,
            };
            let task = expect_running(
                Task::builder("t")
                    .unit(unit)
                    .spawn_typed()
                    .unwrap()
                    .started()
                    .await,
            );
            blocking.await.unwrap();
            let grace = Duration::from_millis(20);
            let err = task.stop_within(grace).await.unwrap_err();
            assert_eq!(
                *err.error(),
                Error::Timeout {
                    command: Command::Stop,
                    stage: Stage::Stopping,
                    waited: grace * 2
                }
            );
            let AnyTask::Stopping(task) = err.into_task() else {
                panic!("the run blocks its thread: the stage stays Stopping")
            };
            release.send(()).unwrap();
            let stopped = expect_stopped(task.stop().await.unwrap());
            assert_eq!(stopped.snapshot().stage, Stage::Stopped);
        },
    )
    .await
}

// ------------------------------------------------------------------ other parties

on_both_runtimes! {
    // A Task<Paused> that another party resumed: the update is refused, the error
    // names the command and the stage, and the task comes back typed as it is.
    async fn a_refused_update_gives_the_task_back(short: Duration) {
        let (unit, _seen) = sees_config();
        let task = Task::builder("t").config(1).unit(unit).spawn_typed().unwrap();
        let task = expect_paused(expect_running(task.started().await).pause().await.unwrap());
        task.handle().resume().await.unwrap();
        let err: TaskError<u32> = task.update(9).await.unwrap_err();
        match *err.error() {
            Error::Refused { command: Command::Update, stage, reason: Refusal::UnitInUse } => {
                assert!(matches!(stage, Stage::Resuming | Stage::Running), "{stage}");
            }
            ref other => panic!("expected a refused update, got {other}"),
        }
        assert_eq!(*err.task().handle().config(), 1, "nothing changed");
        let task = err.into_task();
        assert!(matches!(task.stage(), Stage::Resuming | Stage::Running), "{task:?}");
        assert_eq!(task.into_handle().stop().await, Ok(Stage::Stopped));
    }

    // A Task<Running> that another party is stopping: the pause is refused and the
    // task comes back as Stopping, to wait on.
    async fn a_refused_pause_gives_back_a_stopping_task(short: Duration) {
        let (unit, orders) = ignores_cancel();
        let task = spawn_running(unit).await;
        let other = task.handle().clone();
        let other_stop = tokio::spawn(async move { other.stop().await });
        task.handle().wait_for_stage(|s| s == Stage::Stopping).await;
        let err = task.pause().await.unwrap_err();
        assert_eq!(
            *err.error(),
            Error::Refused {
                command: Command::Pause,
                stage: Stage::Stopping,
                reason: Refusal::StopInProgress,
            }
        );
        let AnyTask::Stopping(task) = err.into_task() else {
            panic!("the stop is still waiting for the run")
        };
        orders.send(Then::ReturnCancelled).unwrap();
        assert_stopped(task.stop().await.unwrap());
        assert_eq!(other_stop.await.unwrap(), Ok(Stage::Stopped));
    }

    // A Task<Running> that another party stopped: the pause reports Stopped.
    async fn a_pause_after_another_partys_stop_reports_stopped(short: Duration) {
        let task = Task::builder("t").unit(WaitsForCancel::default()).spawn_typed().unwrap();
        let task = expect_running(task.started().await);
        assert_eq!(task.handle().stop().await, Ok(Stage::Stopped));
        match task.pause().await.unwrap() {
            AtRest::Stopped(task) => assert_eq!(task.snapshot().stage, Stage::Stopped),
            other => panic!("expected Stopped, reached {other:?}"),
        }
    }

    // A Task<Paused> that another party stopped: the stop meets Stopped (the table's
    // no-op stop in Stopped) and reports it.
    async fn a_stop_after_another_partys_stop_reports_stopped(short: Duration) {
        let unit = WaitsForCancel::default();
        let closed = Arc::clone(&unit.closed);
        let task = expect_paused(spawn_running(unit).await.pause().await.unwrap());
        assert_eq!(task.handle().stop().await, Ok(Stage::Stopped));
        assert_stopped(task.stop().await.unwrap());
        assert_eq!(closed.load(Ordering::SeqCst), 1, "units are closed once");
    }

    // AnyTask types the stage it reads, for every stage at rest and Running.
    async fn any_task_types_the_stage_it_reads(short: Duration) {
        let handle = Task::builder("t").unit(WaitsForCancel::default()).spawn_paused().unwrap();
        assert!(matches!(AnyTask::from_handle(handle.clone()), AnyTask::New(_)));
        handle.resume().await.unwrap();
        handle.wait_for_stage(|s| s == Stage::Running).await;
        let any = AnyTask::from(handle.clone());
        assert_eq!(any.stage(), Stage::Running);
        let AnyTask::Running(task) = any else { panic!("{any:?}") };
        assert_eq!(handle.pause().await, Ok(Stage::Paused));
        let any = task.refresh();
        assert!(matches!(any, AnyTask::Paused(_)), "{any:?}");
        assert_eq!(handle.stop().await, Ok(Stage::Stopped));
        let any = any.refresh();
        assert!(matches!(any, AnyTask::Stopped(_)), "{any:?}");

        let go = gate();
        go.notify_one();
        let handle = Task::builder("f").unit(Finishes { gate: go }).spawn().unwrap();
        handle.wait_for_stage(|s| s == Stage::Finished).await;
        assert!(matches!(AnyTask::from_handle(handle), AnyTask::Finished(_)));
    }
}
