//! A running task cannot be reconfigured: its run holds the unit.
use taskstage::typestate::stages::Running;
use taskstage::Task;

async fn update(task: Task<Running, u32>) {
    let _ = task.update(7).await;
}

fn main() {
    let _ = update;
}
