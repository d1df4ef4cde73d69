//! A paused task has no `pause`: there is no run to pause (`hold` marks it instead).
use taskstage::typestate::stages::Paused;
use taskstage::Task;

async fn pause(task: Task<Paused>) {
    let _ = task.pause().await;
}

fn main() {
    let _ = pause;
}
