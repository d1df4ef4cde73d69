//! Graceful shutdown: on ctrl-c, stop a group of tasks within a deadline and print
//! what each reached, naming any task still stuck.
//!
//! ```text
//! cargo run --example shutdown            # runs until ctrl-c
//! cargo run --example shutdown -- 2       # or stops by itself after 2 s
//! ```
//!
//! One of the three tasks runs a unit that ignores cancellation, as a unit blocked on
//! a slow call would: the stop aborts it after half the deadline, and the report says
//! so. Exit status 0 when every task stopped, 1 otherwise.

use std::process::ExitCode;
use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Stage, StopOrder, Task, TaskGroup, Unit};

/// Copies in batches until cancelled.
struct Copy;

impl Unit for Copy {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let mut batch = 0u64;
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    batch += 1;
                    ctx.report_progress(batch, None);
                }
            }
        }
    }
}

/// Waits on a call that never looks at its cancellation.
struct Stubborn;

impl Unit for Stubborn {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        std::future::pending::<()>().await;
        Ok(RunExit::Completed)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let after = std::env::args().nth(1).and_then(|s| s.parse::<u64>().ok());
    let mut group = TaskGroup::new();
    for (name, stubborn) in [("orders", false), ("invoices", false), ("audit", true)] {
        let builder = Task::builder(name);
        let task = if stubborn {
            builder.unit(Stubborn).spawn()
        } else {
            builder.unit(Copy).spawn()
        };
        match task {
            Ok(task) => group.add(task),
            Err(error) => {
                eprintln!("cannot start {name}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    match after {
        Some(secs) => {
            println!("running; stopping by itself in {secs} s (or on ctrl-c)");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = tokio::time::sleep(Duration::from_secs(secs)) => {}
            }
        }
        None => {
            println!("running; press ctrl-c to stop");
            if let Err(error) = tokio::signal::ctrl_c().await {
                eprintln!("cannot listen for ctrl-c: {error}");
            }
        }
    }
    println!("stopping every task within 4 s");
    let report = group
        .stop_all(Duration::from_secs(4), StopOrder::AllAtOnce)
        .await;
    print!("{report}");
    if report.all_reached(Stage::Stopped) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
