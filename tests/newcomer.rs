//! What a newcomer meets first: waits that return, a builder that keeps every unit,
//! `?` inside a unit, and groups that can be waited on and drained. Each test names
//! the hang or the footgun it rules out.

mod support;

use std::time::Duration;

use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};

/// Reports progress one item at a time until cancelled.
struct Count;

impl Unit for Count {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let mut done = 0;
        loop {
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled);
            }
            done += 1;
            ctx.report_progress(done, None);
            tokio::task::yield_now().await;
        }
    }
}

on_both_runtimes! {
    async fn a_wait_on_progress_returns_once_progress_passes() {
        let handle = Task::builder("count").unit(Count).spawn().unwrap();
        // A deadline's last poll would see the progress too: the wait must return well
        // before it, woken by the progress itself.
        let started = std::time::Instant::now();
        let seen = tokio::time::timeout(
            Duration::from_secs(10),
            handle.wait_for(|s| s.progress.done > 100),
        )
        .await
        .expect("a wait on progress must wake on progress, not only on a stage change");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the wait returned only at its deadline ({:?}): progress woke nobody",
            started.elapsed()
        );
        assert!(seen.progress.done > 100, "{seen:?}");
        assert_eq!(seen.stage, Stage::Running);
        handle.stop().await.unwrap();
    }
}
