//! The result of a transition must be used: it owns the task, and dropping the last
//! owner stops it.
#![deny(unused_must_use)]

use taskstage::typestate::stages::Running;
use taskstage::Task;

async fn ignore_where_it_came_to_rest(task: Task<Running>) {
    task.join().await;
}

fn main() {
    let _ = ignore_where_it_came_to_rest;
}
