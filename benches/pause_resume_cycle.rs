//! One pause-until-really-stopped plus resume, through the crate, beside the floor of
//! the same work done by hand with tokio, on both runtime flavours.
//!
//! Every iteration starts with one run alive and waiting for its cancellation:
//!
//! - `taskstage_*`: `Handle::pause` (returns once the run has returned and its future
//!   has been dropped), `Handle::resume`, then `Handle::wait_for_stage` until the stage
//!   is Running again (the new run is launched and a pause would reach it). Nobody
//!   subscribes to the task's events: a subscriber's cost is its own (see
//!   docs/performance.md).
//! - `bare_tokio_*`: cancel the run's `CancellationToken`, await its `JoinHandle`, then
//!   make a new token and spawn the next run. That is the least any correct
//!   pause/resume must do, with no stage kept at all.
//!
//! The measured loop runs as a task on the runtime, as a command handler in a service
//! would, for both contenders alike.
//!
//! The lifecycle core alone, without a runtime, is measured in `benches/core_cycle.rs`.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
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
            handle.wait_for_stage(|s| s == Stage::Running).await;
            let start = Instant::now();
            for _ in 0..iters {
                let reached = handle.pause().await.expect("pause");
                assert_eq!(reached, Stage::Paused);
                handle.resume().await.expect("resume");
                handle.wait_for_stage(|s| s == Stage::Running).await;
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

/// `cargo bench --bench pause_resume_cycle -- --profile <contender> <cycles>` runs
/// `cycles` cycles of one contender (`taskstage_current_thread`,
/// `bare_tokio_current_thread`, `taskstage_multi_thread`, `bare_tokio_multi_thread`)
/// outside criterion, so that a profiler (`valgrind --tool=callgrind`, `perf`) sees
/// that loop alone; docs/performance.md's breakdown was taken this way. Without
/// `--profile`, criterion runs as usual.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--profile") {
        let contender = args.get(at + 1).map(String::as_str).unwrap_or_default();
        let cycles: u64 = args
            .get(at + 2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(10_000);
        let elapsed = match contender {
            "taskstage_current_thread" => taskstage_cycles(&current_thread(), cycles),
            "bare_tokio_current_thread" => bare_tokio_cycles(&current_thread(), cycles),
            "taskstage_multi_thread" => taskstage_cycles(&multi_thread(), cycles),
            "bare_tokio_multi_thread" => bare_tokio_cycles(&multi_thread(), cycles),
            other => {
                eprintln!("--profile: unknown contender {other:?}");
                std::process::exit(2);
            }
        };
        println!(
            "{contender}: {cycles} cycles, {:.0} ns per cycle",
            elapsed.as_secs_f64() * 1e9 / cycles as f64
        );
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
