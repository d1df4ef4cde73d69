//! The tasks of `examples/examples/shutdown.rs` and their stop: a group of three, one
//! of whose units ignores cancellation, stopped within one deadline.

use std::time::Duration;

use taskstage::{
    BuildError, GroupReport, RunContext, RunError, RunExit, StopOrder, Task, TaskGroup, Unit,
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
