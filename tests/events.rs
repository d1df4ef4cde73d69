//! The event stream through the public API: complete, ordered, explicit about lag.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use taskstage::runtime::Change;
use taskstage::{Event, Events, Handle, RunContext, RunError, RunExit, Stage, Task, Unit};

/// Runs until cancelled.
struct UntilCancelled;

impl Unit for UntilCancelled {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// The next event, failing within seconds if none comes.
async fn next(events: &mut Events, what: &str) -> Option<Event> {
    match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
        Ok(event) => event,
        Err(_) => panic!("{what} never came"),
    }
}

fn change(event: Option<Event>) -> Change {
    match event {
        Some(Event::Change(change)) => change,
        other => panic!("expected a change, got {other:?}"),
    }
}

/// One pause and one resume, waiting for Running again.
async fn cycle(handle: &Handle) {
    assert_eq!(handle.pause().await.unwrap(), Stage::Paused);
    handle.resume().await.unwrap();
    let running = tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_for_stage(|s| s == Stage::Running),
    );
    running.await.expect("Running after a resume never came");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_transitions_arrive_complete_and_in_order() {
    const ROUNDS: u64 = 2_500; // four transitions each
    let (handle, mut events) = Task::builder("t")
        .unit(UntilCancelled)
        .event_capacity(32_768)
        .spawn_with_events()
        .unwrap();
    // The reader runs on the other worker, concurrently with the changes.
    let reader = tokio::spawn(async move {
        let mut previous = Stage::New;
        let mut seq = 0;
        let mut count = 0u64;
        while let Some(event) = next(&mut events, "the next event").await {
            let change = change(Some(event));
            assert_eq!(change.seq, seq + 1, "a change was skipped or reordered");
            assert_eq!(
                change.from, previous,
                "change {} does not start where the last ended",
                change.seq
            );
            previous = change.stage;
            seq = change.seq;
            count += 1;
        }
        (count, previous)
    });
    support::within("transitions", support::REAL_BOUND, async {
        handle.wait_for_stage(|s| s == Stage::Running).await;
        for _ in 0..ROUNDS {
            cycle(&handle).await;
        }
        assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
    })
    .await;
    let (count, last) = reader.await.unwrap();
    // New → Resuming → Running, 4 per round, then the stop: → Stopping, the run's
    // return (Stopping while the units close), → Stopped on "units closed".
    assert_eq!(count, 2 + 4 * ROUNDS + 3);
    assert_eq!(last, Stage::Stopped);
    assert!(count >= 10_000);
}

#[tokio::test(flavor = "current_thread")]
async fn a_reader_that_falls_behind_is_told_how_many_changes_it_missed() {
    let handle = Task::builder("t")
        .unit(UntilCancelled)
        .event_capacity(8)
        .spawn_paused()
        .unwrap();
    let mut events = handle.events();
    // Twenty-two changes, none read: the start (2) and five cycles (4 each).
    handle.resume().await.unwrap();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    for _ in 0..5 {
        cycle(&handle).await;
    }
    let made = handle.snapshot().seq;
    assert_eq!(made, 22);
    match next(&mut events, "the lag").await {
        Some(Event::Lagged { missed }) => assert_eq!(missed, made - 8, "the eight newest are kept"),
        other => panic!("expected a lag, got {other:?}"),
    }
    for seq in made - 7..=made {
        assert_eq!(change(next(&mut events, "a kept change").await).seq, seq);
    }
    // After the lag the reader is current again: nothing is skipped from here on.
    assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
    let stopping = change(next(&mut events, "Stopping").await);
    let returned = change(next(&mut events, "the run's return").await);
    let stopped = change(next(&mut events, "Stopped").await);
    assert_eq!((stopping.seq, stopping.stage), (made + 1, Stage::Stopping));
    assert_eq!((returned.seq, returned.stage), (made + 2, Stage::Stopping));
    assert_eq!((stopped.seq, stopped.stage), (made + 3, Stage::Stopped));
    assert_eq!(stopped.cause, taskstage::Cause::Closed);
    assert!(
        next(&mut events, "the end").await.is_none(),
        "the stream ends at a terminal stage"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_stream_does_not_keep_its_task_alive() {
    let (handle, mut events) = Task::builder("t")
        .unit(UntilCancelled)
        .spawn_with_events()
        .unwrap();
    let mut stages = vec![];
    drop(handle);
    while let Some(event) = next(&mut events, "the stop of a task whose last handle went").await {
        stages.push(change(Some(event)).stage);
    }
    assert_eq!(
        stages,
        [
            Stage::Resuming,
            Stage::Stopping,
            Stage::Stopping,
            Stage::Stopped
        ],
        "dropping the last handle stops the task"
    );
}

/// A stream made on a task that is already terminal ends at once: it has nothing to
/// wait for (docs/events.md: the stream ends after the first terminal stage).
#[tokio::test(flavor = "current_thread")]
async fn a_stream_made_on_a_terminal_task_ends_at_once() {
    let finished = Task::builder("done")
        .unit(support::Instant("once"))
        .spawn()
        .unwrap();
    finished.wait_for_stage(|s| s == Stage::Finished).await;
    let mut events = finished.events();
    assert!(
        next(&mut events, "the end of a finished task's stream")
            .await
            .is_none(),
        "a finished task's stream delivered an event"
    );

    let stopped = Task::builder("stopped")
        .unit(UntilCancelled)
        .spawn()
        .unwrap();
    assert_eq!(stopped.stop().await.unwrap(), Stage::Stopped);
    let mut events = stopped.events();
    assert!(next(&mut events, "the end of a stopped task's stream")
        .await
        .is_none());
}

/// A task that ran and was paused, whose unit's close waits at `gate`.
async fn paused_with_slow_close(name: &'static str, gate: &Arc<support::Gate>) -> Handle {
    let task = Task::builder(name)
        .unit(support::SlowClose(Arc::clone(gate)))
        .spawn()
        .unwrap();
    task.wait_for_stage(|s| s == Stage::Running).await;
    assert_eq!(task.pause().await.unwrap(), Stage::Paused);
    task
}

/// A unit's `close()` is user code that may block its thread: `stop_now` and the last
/// handle's drop issue the stop and return without running it (docs/events.md:
/// commands that never block).
#[tokio::test(flavor = "current_thread")]
async fn stop_now_and_the_last_drop_do_not_run_close_in_the_caller() {
    let gate = support::Gate::new(usize::MAX);
    let task = paused_with_slow_close("flush", &gate).await;
    let settling = task.stop_now().unwrap();
    // Only a close running elsewhere can be let through by this line.
    gate.open();
    assert_eq!(settling.await.unwrap(), Stage::Stopped);
    assert_eq!(
        gate.late(),
        0,
        "stop_now ran the unit's close in its caller"
    );

    let gate = support::Gate::new(usize::MAX);
    let task = paused_with_slow_close("flush-on-drop", &gate).await;
    let mut events = task.events();
    drop(task);
    gate.open();
    let mut last = None;
    while let Some(event) = next(&mut events, "the dropped task's end").await {
        last = Some(change(Some(event)).stage);
    }
    assert_eq!(last, Some(Stage::Stopped));
    assert_eq!(
        gate.late(),
        0,
        "dropping the last handle ran close in the dropper"
    );
}

/// Without `event_capacity`, a task keeps its 1,024 newest changes for a reader that
/// fell behind (docs/events.md), and tells it how many it missed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_default_capacity_keeps_the_1024_newest_changes() {
    let handle = Task::builder("t").unit(UntilCancelled).spawn().unwrap();
    // Nothing runs between the two lines: the stream starts after change `start`.
    let start = handle.snapshot().seq;
    let mut events = handle.events();
    handle.wait_for_stage(|s| s == Stage::Running).await;
    // Four changes a cycle: 260 cycles make 1,040 unread changes after the start.
    for _ in 0..260 {
        cycle(&handle).await;
    }
    let made = handle.snapshot().seq;
    assert!(made - start > 1_024 + 8, "{made} changes");
    match next(&mut events, "the lag").await {
        Some(Event::Lagged { missed }) => assert_eq!(
            made - start - missed,
            1_024,
            "the default capacity is not 1,024"
        ),
        other => panic!("expected a lag, got {other:?}"),
    }
    assert_eq!(
        change(next(&mut events, "the oldest kept").await).seq,
        made - 1_023
    );
}
