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
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::process::ExitCode;
use std::time::Duration;

use taskstage::{
    BuildError, GroupReport, RunContext, RunError, RunExit, Stage, StopOrder, Task, TaskGroup, Unit,
};

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

/// How long the stop of every task may take, in all.
pub const DEADLINE: Duration = Duration::from_secs(4);

/// The example's group: two tasks that copy, and one whose unit ignores cancellation.
///
/// # Errors
///
/// A task that cannot be spawned (outside a runtime, or one without timers).
pub fn start() -> Result<TaskGroup, BuildError> {
    let mut group = TaskGroup::new();
    for (name, stubborn) in [("orders", false), ("invoices", false), ("audit", true)] {
        let builder = Task::builder(name);
        let task = if stubborn {
            builder.unit(Stubborn).spawn()?
        } else {
            builder.unit(Copy).spawn()?
        };
        group.add(task);
    }
    Ok(group)
}

/// Stops every task of `group` within [`DEADLINE`]: the stubborn one is aborted
/// halfway to it.
pub async fn shut_down(group: &TaskGroup) -> GroupReport {
    group.stop_all(DEADLINE, StopOrder::AllAtOnce).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let after = std::env::args().nth(1).and_then(|s| s.parse::<u64>().ok());
    let group = match start() {
        Ok(group) => group,
        Err(error) => {
            eprintln!("cannot start the tasks: {error}");
            return ExitCode::FAILURE;
        }
    };
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
    println!("stopping every task within {} s", DEADLINE.as_secs());
    let report = shut_down(&group).await;
    print!("{report}");
    if report.all_reached(Stage::Stopped) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
