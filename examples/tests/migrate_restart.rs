//! The restart run of the migrate example (the second half of its default run), at
//! small scale, through its own code: four tables on one store file, a worker process
//! (this test binary started again as `worker_process`) killed with SIGKILL in the
//! middle of a copy and started again. Needs no server.
//!
//! Each promise of the run is read from its summary, not from its text alone: the
//! paused tables kept their desired stage and checkpoints and did not run, the others
//! went on from their checkpoints, the store file passed SQLite's integrity check,
//! the history checker found no overlap, and every target equals its source.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::sync::Arc;
use std::time::Duration;

use taskstage::Stage;
use taskstage_cluster::DesiredStage;
use taskstage_examples::migrate::report;
use taskstage_examples::migrate::restart::{
    run, worker_main, Launcher, RestartOptions, PAUSED, TABLES,
};

const WORKER_ENV: &str = "TASKSTAGE_MIGRATE_RESTART_WORKER";

/// The worker process of the restart run.
#[test]
#[ignore = "the worker process of the restart run; the test starts it with TASKSTAGE_MIGRATE_RESTART_WORKER set"]
fn worker_process() {
    let Ok(args) = std::env::var(WORKER_ENV) else {
        return;
    };
    let args: Vec<String> = args.lines().map(str::to_owned).collect();
    let _ = worker_main(&args);
}

#[test]
fn a_kill_in_the_middle_of_a_copy_keeps_the_pauses_and_the_checkpoints() {
    let launcher = Launcher {
        program: std::env::current_exe().expect("the test binary's path"),
        args: ["worker_process", "--exact", "--ignored", "--nocapture"]
            .map(Into::into)
            .to_vec(),
        env: Some(WORKER_ENV.to_owned()),
    };
    let options = RestartOptions {
        rows: 5_000,
        seed: 11,
        quiet: true,
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let screen = Arc::new(report::Screen::new(true));
    let started = std::time::Instant::now();
    let summary = runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(90), run(&options, &launcher, screen)).await
        })
        .expect("the restart run ended within 90 s")
        .expect("the restart run ran");
    let text = summary.render();
    eprintln!("{text}");
    eprintln!("restart run in {:?}", started.elapsed());

    assert_eq!(summary.integrity, "ok", "{text}");
    assert_eq!(summary.tables.len(), TABLES, "{text}");
    for (i, table) in summary.tables.iter().enumerate() {
        let rows = options.rows;
        assert_eq!(table.digests.0, table.digests.1, "{}: {text}", table.task);
        assert_eq!(table.digests.0.rows, rows, "{}: {text}", table.task);
        if i < PAUSED {
            assert!(table.paused, "{text}");
            assert_eq!(table.desired_after_restart, DesiredStage::Paused, "{text}");
            assert!(
                matches!(table.stage_after_restart, Stage::New | Stage::Paused),
                "{}: {text}",
                table.task
            );
            assert_eq!(table.runs_while_paused, 0, "{}: {text}", table.task);
            assert_eq!(table.at_kill, table.after, "{}: {text}", table.task);
            assert!(table.at_kill[0] > 0, "paused during its dump: {text}");
            assert!(table.at_kill[0] < rows, "paused during its dump: {text}");
        } else {
            assert!(!table.paused, "{text}");
            assert_eq!(table.desired_after_restart, DesiredStage::Running, "{text}");
            // Killed in the middle of the load, and the new process went on from
            // there: its first checkpoint is past the killed one's, not below it.
            assert_eq!(table.at_kill[0], rows, "{}: {text}", table.task);
            assert!(
                table.at_kill[1] > 0 && table.at_kill[1] < rows,
                "{}: killed in the middle of its load: {text}",
                table.task
            );
            assert!(table.after[1] > table.at_kill[1], "{}: {text}", table.task);
        }
        assert!(table.survived(), "{}: {text}", table.task);
    }
    assert!(summary.verdict.violations.is_empty(), "{text}");
    assert_eq!(summary.verdict.max_live, 1, "{text}");
    assert!(summary.verified(), "{text}");
    assert!(
        text.lines().any(|l| l == "restart verification: passed"),
        "{text}"
    );
}
