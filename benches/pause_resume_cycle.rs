//! One pause-until-really-stopped plus resume, through the crate, beside the floor of
//! the same work done by hand with tokio, on both runtime flavours.
//!
//! Every iteration starts with one run alive and waiting for its cancellation:
//!
//! - `taskstage_*`: `Handle::pause` (returns once the run has returned and its future
//!   has been dropped), `Handle::resume`, then waiting on the task's stage events until
//!   the stage is Running again (the new run is launched and a pause would reach it).
//! - `bare_tokio_*`: cancel the run's `CancellationToken`, await its `JoinHandle`, then
//!   make a new token and spawn the next run. That is the least any correct
//!   pause/resume must do, with no stage kept at all.
//!
//! The measured loop runs as a task on the runtime, as a command handler in a service
//! would, for both contenders alike.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// A unit that waits for its cancellation and nothing else.
struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn multi_thread() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a multi-thread runtime")
}

/// `iters` taskstage cycles on `rt`, timed inside a task on the runtime.
fn taskstage_cycles(rt: &Runtime, iters: u64) -> Duration {
    rt.block_on(async {
        tokio::spawn(async move {
            let handle = Task::builder("cycle")
                .unit(Wait)
                .spawn()
                .expect("spawn inside a runtime");
            let mut events = handle.subscribe();
            events
                .wait_for(|e| e.stage == Stage::Running)
                .await
                .expect("the task outlives its handle");
            let start = Instant::now();
            for _ in 0..iters {
                let reached = handle.pause().await.expect("pause");
                assert_eq!(reached, Stage::Paused);
                handle.resume().await.expect("resume");
                events
                    .wait_for(|e| e.stage == Stage::Running)
                    .await
                    .expect("the task outlives its handle");
            }
            let elapsed = start.elapsed();
            assert_eq!(handle.stop().await.expect("stop"), Stage::Stopped);
            elapsed
        })
        .await
        .expect("the measuring task did not panic")
    })
}

/// `iters` hand-rolled cycles on `rt`, timed inside a task on the runtime.
fn bare_tokio_cycles(rt: &Runtime, iters: u64) -> Duration {
    fn spawn_run(token: &CancellationToken) -> tokio::task::JoinHandle<RunExit> {
        let token = token.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            RunExit::Cancelled
        })
    }

    rt.block_on(async {
        tokio::spawn(async move {
            let mut token = CancellationToken::new();
            let mut run = spawn_run(&token);
            let start = Instant::now();
            for _ in 0..iters {
                token.cancel();
                let exit = (&mut run).await.expect("the run did not panic");
                assert_eq!(exit, RunExit::Cancelled);
                token = CancellationToken::new();
                run = spawn_run(&token);
            }
            let elapsed = start.elapsed();
            token.cancel();
            run.await.expect("the run did not panic");
            elapsed
        })
        .await
        .expect("the measuring task did not panic")
    })
}

fn pause_resume_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("pause_resume_cycle");

    let rt = current_thread();
    group.bench_function("taskstage_current_thread", |b| {
        b.iter_custom(|iters| taskstage_cycles(&rt, iters))
    });
    group.bench_function("bare_tokio_current_thread", |b| {
        b.iter_custom(|iters| bare_tokio_cycles(&rt, iters))
    });
    drop(rt);

    let rt = multi_thread();
    group.bench_function("taskstage_multi_thread", |b| {
        b.iter_custom(|iters| taskstage_cycles(&rt, iters))
    });
    group.bench_function("bare_tokio_multi_thread", |b| {
        b.iter_custom(|iters| bare_tokio_cycles(&rt, iters))
    });
    drop(rt);

    group.finish();
}

criterion_group!(benches, pause_resume_cycle);
criterion_main!(benches);
