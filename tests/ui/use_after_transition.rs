//! A transition consumes the task: the value that claimed Paused cannot be used
//! once the resume has moved it.
use taskstage::typestate::stages::Paused;
use taskstage::Task;

async fn resume_twice(task: Task<Paused>) {
    let _resuming = task.resume().await;
    let _again = task.resume().await;
}

fn main() {
    let _ = resume_twice;
}
