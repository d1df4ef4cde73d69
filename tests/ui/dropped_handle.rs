//! A handle dropped at once stops its task: the compiler says so.
#![deny(unused_must_use)]
use taskstage::{RunContext, RunError, RunExit, Task, TaskGroup, Unit};

struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

async fn start() -> Result<(), Box<dyn std::error::Error>> {
    Task::builder("dropped").unit(Wait).spawn()?;
    TaskGroup::<()>::new();
    let group = TaskGroup::<()>::new();
    group.pause_all(std::time::Duration::from_secs(1)).await;
    Ok(())
}

fn main() {
    let _ = start;
}
