//! A pausing task cannot be resumed: its run has not returned yet.
use taskstage::typestate::stages::Pausing;
use taskstage::Task;

async fn resume(task: Task<Pausing>) {
    let _ = task.resume().await;
}

fn main() {
    let _ = resume;
}
