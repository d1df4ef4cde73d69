//! Control calls that never block: a command accepted now, its wait awaited later.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::time::Duration;

use support::{scripted, stubborn, Live, Order};
use taskstage::{Command, ErrorKind, Outcome, Refusal, Stage, Task};

#[tokio::test(start_paused = true)]
async fn pause_now_is_accepted_at_once_and_settles_when_the_run_returns() {
    support::within("pause_now", support::PAUSED_BOUND, async {
        let live = Live::new();
        let (unit, remote) = stubborn("slow", &live);
        let (next, _next_remote) = scripted("next", &live);
        let handle = Task::builder("t").unit(unit).unit(next).spawn().unwrap();
        live.wait(|now, _| now == 1).await;
        let settling = handle.pause_now().expect("Running accepts pause");
        // Nothing was awaited, yet the pause is accepted and the run is cancelled.
        assert_eq!(handle.stage(), Stage::Pausing);
        remote.order(Order::Complete);
        // The unit completed as it was cancelled: Paused before the next unit.
        assert_eq!(settling.await.unwrap(), Stage::Paused);
        assert_eq!(live.now(), 0, "Paused while the run is alive");
        assert!(
            matches!(handle.snapshot().outcome, Some(Outcome::Completed)),
            "{:?}",
            handle.snapshot().outcome
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_pause_now_says_so_at_once_and_changes_nothing() {
    let live = Live::new();
    let (unit, _remote) = scripted("u", &live);
    let handle = Task::builder("t").unit(unit).spawn_paused().unwrap();
    let before = handle.snapshot().seq;
    let err = handle.pause_now().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused(Refusal::NotStarted));
    assert_eq!((err.command(), err.stage()), (Command::Pause, Stage::New));
    assert_eq!(
        handle.snapshot().seq,
        before,
        "a refused command changed the task"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_settling_future_does_not_undo_the_pause() {
    support::within("dropped settling", support::PAUSED_BOUND, async {
        let live = Live::new();
        let (unit, _remote) = scripted("u", &live);
        let handle = Task::builder("t").unit(unit).spawn().unwrap();
        live.wait(|now, _| now == 1).await;
        drop(handle.pause_now().unwrap());
        let rest = handle.wait_for_stage(Stage::is_at_rest).await;
        assert_eq!(rest.stage, Stage::Paused);
        assert_eq!(live.now(), 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn stop_now_escalates_to_abort_after_the_grace_period() {
    support::within("stop_now", support::PAUSED_BOUND, async {
        let live = Live::new();
        let (unit, remote) = stubborn("stubborn", &live);
        let handle = Task::builder("t")
            .unit(unit)
            .stop_grace(Duration::from_secs(2))
            .spawn()
            .unwrap();
        live.wait(|now, _| now == 1).await;
        let started = tokio::time::Instant::now();
        let settling = handle.stop_now().unwrap();
        assert_eq!(handle.stage(), Stage::Stopping);
        assert_eq!(settling.await.unwrap(), Stage::Stopped);
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "aborted before the grace period"
        );
        assert_eq!(live.now(), 0, "Stopped while the aborted run is alive");
        assert_eq!(
            remote.closed(),
            1,
            "the aborted run's unit is closed by the stop"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_pause_now_that_outlives_its_timeout_is_a_typed_timeout() {
    support::within("pause_now timeout", support::PAUSED_BOUND, async {
        let live = Live::new();
        let (unit, _remote) = stubborn("stubborn", &live);
        let handle = Task::builder("t")
            .unit(unit)
            .pause_timeout(Duration::from_secs(3))
            .spawn()
            .unwrap();
        live.wait(|now, _| now == 1).await;
        let err = handle.pause_now().unwrap().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert_eq!(
            err.stage(),
            Stage::Pausing,
            "a timed-out pause does not claim a rest"
        );
        assert_eq!(live.now(), 1);
    })
    .await;
}
