//! A running task cannot be resumed: a run is alive already.
use taskstage::typestate::stages::Running;
use taskstage::Task;

async fn resume(task: Task<Running>) {
    let _ = task.resume().await;
}

fn main() {
    let _ = resume;
}
