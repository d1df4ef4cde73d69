//! The graceful-shutdown example (`examples/examples/shutdown.rs`), run as its `main` runs it:
//! the group of three tasks, one of whose units ignores cancellation, stopped within
//! one deadline.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_examples::shutdown;

use std::time::Duration;

use taskstage::Stage;

/// On tokio's paused clock: the example's copies sleep between batches, and the stop
/// escalates to an abort after half its deadline; both are timers.
#[tokio::test(start_paused = true)]
async fn the_shutdown_example_stops_every_task_aborting_the_stubborn_one() {
    let group = shutdown::start().expect("the example's tasks start");
    for task in group.tasks() {
        let running = task.wait_for_stage(|s| s == Stage::Running);
        tokio::time::timeout(Duration::from_secs(60), running)
            .await
            .unwrap_or_else(|_| panic!("{} never ran", task.name()));
    }
    // The copies make progress before the stop (progress is not a change of the
    // lifecycle, so it is read from snapshots: at most 100 looks, 50 ms of the paused
    // clock apart).
    let orders = &group.tasks()[0];
    let mut looks = 0;
    while orders.snapshot().progress.done < 3 {
        looks += 1;
        assert!(looks <= 100, "the orders copy made no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let started = tokio::time::Instant::now();
    let report = shutdown::shut_down(&group).await;
    let took = started.elapsed();
    assert!(report.all_reached(Stage::Stopped), "{report}");
    assert_eq!(report.stuck().count(), 0, "{report}");
    assert_eq!(
        report.to_string(),
        "orders: Stopped\ninvoices: Stopped\naudit: Stopped\n"
    );
    // The copies stop at once; the stubborn unit only when it is aborted, halfway
    // to the deadline.
    assert!(
        took >= shutdown::DEADLINE / 2 && took < shutdown::DEADLINE,
        "the stop took {took:?}"
    );
}
