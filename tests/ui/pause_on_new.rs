//! A task that was never started cannot be paused.
use taskstage::typestate::stages::New;
use taskstage::Task;

async fn pause(task: Task<New, u32>) {
    let _ = task.pause().await;
}

fn main() {
    let _ = pause;
}
