//! What a newcomer meets first: waits that return, a builder that keeps every unit,
//! `?` inside a unit, and groups that can be waited on and drained. Each test names
//! the hang or the footgun it rules out.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};

/// Reports progress one item at a time until cancelled.
struct Count;

impl Unit for Count {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let mut done = 0;
        loop {
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled);
            }
            done += 1;
            ctx.report_progress(done, None);
            tokio::task::yield_now().await;
        }
    }
}

on_both_runtimes! {
    async fn a_wait_on_progress_returns_once_progress_passes() {
        let handle = Task::builder("count").unit(Count).spawn().unwrap();
        // A deadline's last poll would see the progress too: the wait must return well
        // before it, woken by the progress itself.
        let started = std::time::Instant::now();
        let seen = tokio::time::timeout(
            Duration::from_secs(10),
            handle.wait_for(|s| s.progress.done > 100),
        )
        .await
        .expect("a wait on progress must wake on progress, not only on a stage change");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the wait returned only at its deadline ({:?}): progress woke nobody",
            started.elapsed()
        );
        assert!(seen.progress.done > 100, "{seen:?}");
        assert_eq!(seen.stage, Stage::Running);
        handle.stop().await.unwrap();
    }
}

/// Takes a second of (paused-clock) time to wind down after a pause or a stop.
struct Slow;

impl Unit for Slow {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(RunExit::Cancelled)
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_group_resumes_what_a_dropped_pause_left_pausing() {
    let mut group = taskstage::TaskGroup::new();
    for name in ["a", "b"] {
        group.add(Task::builder(name).unit(Slow).spawn().unwrap());
    }
    let running = group
        .wait_all(|s| s == Stage::Running, Duration::from_secs(5))
        .await;
    assert!(running.all_reached(Stage::Running), "{running}");
    // A controller's pause, dropped in flight (ctrl-c): the tasks are left Pausing.
    for task in group.tasks() {
        drop(task.pause_now().unwrap());
        assert_eq!(task.stage(), Stage::Pausing);
    }
    // A plain resume is refused while the run winds down...
    let refused = group.tasks()[0].resume().await.unwrap_err();
    assert_eq!(
        refused.kind(),
        taskstage::ErrorKind::Refused(taskstage::Refusal::StillRunning)
    );
    // ...and the group's resume waits for the pause to settle, then resumes.
    let resumed = group.resume_all(Duration::from_secs(5)).await;
    assert!(
        resumed
            .tasks
            .iter()
            .all(|t| matches!(t.result, Ok(Stage::Resuming | Stage::Running))),
        "{resumed}"
    );
    assert_eq!(resumed.stuck().count(), 0);
    let running = group
        .wait_all(|s| s == Stage::Running, Duration::from_secs(5))
        .await;
    assert!(running.all_reached(Stage::Running), "{running}");
    let stopped = group
        .stop_all(Duration::from_secs(10), taskstage::StopOrder::AllAtOnce)
        .await;
    assert!(stopped.all_reached(Stage::Stopped), "{stopped}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_resume_within_gives_up_at_its_deadline_and_issues_nothing() {
    let handle = Task::builder("slow").unit(Slow).spawn().unwrap();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    drop(handle.pause_now().unwrap());
    let err = handle
        .resume_within(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), taskstage::ErrorKind::Timeout);
    assert_eq!(
        (err.command(), err.stage()),
        (taskstage::Command::Resume, Stage::Pausing)
    );
    // The pause settles on its own; nothing was resumed.
    let rest = handle.wait_for_stage(|s| s != Stage::Pausing).await;
    assert_eq!(rest.stage, Stage::Paused);
    assert_eq!(rest.generation, 1, "no resume was issued after the timeout");
}

/// Asked to pause, finishes its work instead (a second of paused-clock time later).
struct FinishesWhenAsked;

impl Unit for FinishesWhenAsked {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(RunExit::Completed)
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_resume_within_after_a_pause_that_ended_finished_is_refused_at_once() {
    let handle = Task::builder("finishes")
        .unit(FinishesWhenAsked)
        .spawn()
        .unwrap();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    drop(handle.pause_now().unwrap());
    assert_eq!(handle.stage(), Stage::Pausing);
    let asked = tokio::time::Instant::now();
    let err = handle
        .resume_within(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        taskstage::ErrorKind::Refused(taskstage::Refusal::Finished),
        "{err}"
    );
    assert_eq!(
        (err.command(), err.stage()),
        (taskstage::Command::Resume, Stage::Finished)
    );
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "refused only after {:?}: the wait did not end when the pause settled",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_resume_within_after_a_pause_that_a_stop_ended_is_refused_at_once() {
    let handle = Task::builder("slow").unit(Slow).spawn().unwrap();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    drop(handle.pause_now().unwrap());
    let asked = tokio::time::Instant::now();
    let (resumed, stopped) = tokio::join!(handle.resume_within(Duration::from_secs(60)), async {
        // Issued once the resume is waiting on the pause.
        tokio::task::yield_now().await;
        handle.stop_now().unwrap().await
    });
    let err = resumed.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            taskstage::ErrorKind::Refused(
                taskstage::Refusal::StopInProgress | taskstage::Refusal::Stopped
            )
        ),
        "{err}"
    );
    assert_eq!(err.command(), taskstage::Command::Resume);
    assert!(
        matches!(err.stage(), Stage::Stopping | Stage::Stopped),
        "{err}"
    );
    assert_eq!(stopped.unwrap(), Stage::Stopped);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "refused only after {:?}: the wait did not end when the stop ended the pause",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_group_wait_names_the_tasks_that_did_not_reach_the_stage() {
    let mut group = taskstage::TaskGroup::new();
    group.add(Task::builder("started").unit(Slow).spawn().unwrap());
    group.add(Task::builder("idle").unit(Slow).spawn_paused().unwrap());
    let report = group
        .wait_all(|s| s == Stage::Running, Duration::from_secs(2))
        .await;
    assert!(!report.all_reached(Stage::Running), "{report}");
    let stuck: Vec<_> = report
        .stuck()
        .map(|s| (s.task.to_string(), s.stage))
        .collect();
    assert_eq!(stuck, [("idle".to_owned(), group.tasks()[1].stage())]);
    assert!(
        matches!(report.tasks[0].result, Ok(Stage::Running)),
        "{report}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_group_counts_removes_and_drops_its_ended_tasks() {
    let mut group = taskstage::TaskGroup::new();
    assert!(group.is_empty());
    // A typed owner is accepted where a handle is.
    group.add(Task::builder("typed").unit(Slow).spawn_typed().unwrap());
    group.add(Task::builder("plain").unit(Slow).spawn().unwrap());
    group.add(Task::builder("third").unit(Slow).spawn().unwrap());
    assert_eq!(group.len(), 3);
    let removed = group.remove(1).expect("a task at index 1");
    assert_eq!(removed.name(), "plain");
    assert!(group.remove(5).is_none());
    assert_eq!(group.len(), 2);
    assert_eq!(removed.stop().await.unwrap(), Stage::Stopped);
    group.tasks()[0].stop().await.unwrap();
    assert_eq!(group.remove_ended(), 1);
    let names: Vec<_> = group.tasks().iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(names, ["third"]);
}

/// Records its name when it runs, then completes.
struct Step(
    &'static str,
    std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
);

impl<C: Send + Sync + 'static> Unit<C> for Step {
    async fn run(&mut self, _ctx: RunContext<C>) -> Result<RunExit, RunError> {
        self.1.lock().unwrap().push(self.0);
        Ok(RunExit::Completed)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_configuration_given_after_units_keeps_them_in_order() {
    let ran = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handle = Task::builder("pipeline")
        .unit(Step("a", ran.clone()))
        .config(7_u32)
        .unit(Step("b", ran.clone()))
        .spawn()
        .unwrap();
    assert_eq!(
        handle.snapshot().units,
        2,
        "the unit added before the configuration was lost"
    );
    let done = handle.wait_for_stage(Stage::is_terminal).await;
    assert_eq!(done.stage, Stage::Finished);
    assert_eq!(*ran.lock().unwrap(), ["a", "b"]);
}

/// Parses its input with `?`, as ordinary code does.
struct Parse(&'static str);

impl Unit for Parse {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        let _rows: u64 = self.0.parse()?;
        Ok(RunExit::Completed)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn question_mark_works_in_a_unit_and_keeps_the_error(
) -> Result<(), Box<dyn std::error::Error>> {
    let handle = Task::builder("parse").unit(Parse("twelve")).spawn()?;
    let paused = handle.wait_for_stage(Stage::is_at_rest).await;
    assert_eq!(paused.stage, Stage::Paused);
    let error = paused
        .outcome
        .as_ref()
        .and_then(|o| o.error())
        .expect("a failure");
    assert!(
        error.downcast_ref::<std::num::ParseIntError>().is_some(),
        "{error:?}"
    );
    // And a RunError goes up through `?` in a function returning a boxed error.
    let boxed: Box<dyn std::error::Error> = error.clone().into();
    assert_eq!(boxed.to_string(), error.to_string());
    handle.stop().await?;
    Ok(())
}

/// Records whether each run was a resume, then runs until cancelled.
struct Starts(std::sync::Arc<std::sync::Mutex<Vec<bool>>>);

impl Unit for Starts {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.0.lock().unwrap().push(ctx.is_resume());
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn spawn_paused_leaves_the_task_new_and_its_first_run_is_a_fresh_start() {
    let starts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handle = Task::builder("later")
        .unit(Starts(starts.clone()))
        .spawn_paused()
        .unwrap();
    let snapshot = handle.snapshot();
    assert_eq!((snapshot.stage, snapshot.generation), (Stage::New, 0));
    let refused = handle.pause().await.unwrap_err();
    assert_eq!(
        refused.kind(),
        taskstage::ErrorKind::Refused(taskstage::Refusal::NotStarted)
    );
    handle.resume().await.unwrap();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    assert_eq!(*starts.lock().unwrap(), [false]);
    handle.stop().await.unwrap();
}
