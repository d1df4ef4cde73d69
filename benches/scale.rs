//! Scale: many tasks on one runtime, through the crate and as bare tokio tasks with a
//! `CancellationToken` (the floor), in the same process.
//!
//! For each contender it measures the heap bytes held per task while every run is
//! alive (a counting global allocator, so the figure is exact and not blurred by page
//! granularity), and the time to pause all, resume all and stop all. "All" means: the
//! command is issued to every task first, then every task is awaited, so the tasks
//! wind down concurrently, for both contenders alike. Resume-all ends when every new
//! run is alive (each run signals a semaphore as it starts).
//!
//! Under `cargo bench` (which passes `--bench`) it uses 100,000 tasks and three rounds
//! (alternating which contender goes first; the medians are reported) and ends with
//! one line:
//!
//! ```text
//! scale tasks=100000 bytes_per_task=… floor_bytes_per_task=… pause_all_ms=… floor_pause_all_ms=… resume_all_ms=… floor_resume_all_ms=…
//! ```
//!
//! Under `cargo test` it runs one round of 1,000 tasks and checks the same things: every
//! task reaches the stage each command promises, and every figure is measured.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::alloc::System;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cap::Cap;
use taskstage::{Handle, RunContext, RunError, RunExit, Stage, Task, Unit};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Counts the bytes currently allocated on the heap, by every thread.
#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

/// A unit that signals `started` when its run begins, then waits for cancellation.
struct Started {
    started: Arc<Semaphore>,
}

impl Unit for Started {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.started.add_permits(1);
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// What one round measured for one contender.
#[derive(Debug, Clone, Copy)]
struct Figures {
    bytes_per_task: f64,
    spawn_all: Duration,
    pause_all: Duration,
    resume_all: Duration,
    stop_all: Duration,
}

/// Waits until `n` more runs have started.
async fn wait_started(started: &Semaphore, n: usize) {
    let n = u32::try_from(n).expect("the task count fits a semaphore");
    started
        .acquire_many(n)
        .await
        .expect("the semaphore is never closed")
        .forget();
}

/// Either a future still waiting, or what it returned.
enum Slot<F: Future> {
    Waiting(Pin<Box<F>>),
    Done(F::Output),
}

/// Polls every future once, so that each issues its command at once, then awaits them
/// in order. The first poll uses a no-op waker; the await polls again with the real one.
async fn issue_then_await<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let slots: Vec<Slot<F>> = {
        // Scoped: a `Context` must not live across the awaits below (it is not `Send`).
        let mut cx = Context::from_waker(Waker::noop());
        futures
            .map(|future| {
                let mut future = Box::pin(future);
                match future.as_mut().poll(&mut cx) {
                    Poll::Ready(output) => Slot::Done(output),
                    Poll::Pending => Slot::Waiting(future),
                }
            })
            .collect()
    };
    let mut outputs = Vec::with_capacity(slots.len());
    for slot in slots {
        outputs.push(match slot {
            Slot::Waiting(future) => future.await,
            Slot::Done(output) => output,
        });
    }
    outputs
}

fn bytes_per_task(before: usize, n: usize) -> f64 {
    let held = ALLOC.allocated().saturating_sub(before);
    assert!(
        held > 0,
        "{n} live tasks hold no heap memory: the counter is not counting"
    );
    held as f64 / n as f64
}

/// One round through the crate: spawn `n` tasks, pause all, resume all, stop all.
async fn taskstage_round(n: usize) -> Figures {
    let started = Arc::new(Semaphore::new(0));
    let before = ALLOC.allocated();
    let t = Instant::now();
    let handles: Vec<Handle> = (0..n)
        .map(|_| {
            let unit = Started {
                started: Arc::clone(&started),
            };
            Task::builder("scale")
                .unit(unit)
                .spawn()
                .expect("spawn inside a runtime")
        })
        .collect();
    wait_started(&started, n).await;
    let spawn_all = t.elapsed();
    let bytes_per_task = bytes_per_task(before, n);
    assert_all_at(&handles, Stage::Running);

    let t = Instant::now();
    let paused = issue_then_await(handles.iter().map(|h| h.pause())).await;
    let pause_all = t.elapsed();
    assert_all_reached(paused, Stage::Paused);
    assert_all_at(&handles, Stage::Paused);

    let t = Instant::now();
    for handle in &handles {
        handle.resume().await.expect("resume");
    }
    wait_started(&started, n).await;
    let resume_all = t.elapsed();
    assert_all_at(&handles, Stage::Running);

    let t = Instant::now();
    let stopped = issue_then_await(handles.iter().map(|h| h.stop())).await;
    let stop_all = t.elapsed();
    assert_all_reached(stopped, Stage::Stopped);
    drop(handles);

    Figures {
        bytes_per_task,
        spawn_all,
        pause_all,
        resume_all,
        stop_all,
    }
}

/// A bare tokio run: signal the start, wait for the token.
fn spawn_floor_run(token: &CancellationToken, started: &Arc<Semaphore>) -> JoinHandle<RunExit> {
    let token = token.clone();
    let started = Arc::clone(started);
    tokio::spawn(async move {
        started.add_permits(1);
        token.cancelled().await;
        RunExit::Cancelled
    })
}

/// Cancels every run, then awaits every one.
async fn cancel_and_join_all(runs: &mut [(CancellationToken, JoinHandle<RunExit>)]) {
    for (token, _) in runs.iter() {
        token.cancel();
    }
    for (_, join) in runs.iter_mut() {
        assert_eq!(
            join.await.expect("the run did not panic"),
            RunExit::Cancelled
        );
    }
}

/// The same round done by hand: tokio tasks with a token each, and no stage at all.
async fn floor_round(n: usize) -> Figures {
    let started = Arc::new(Semaphore::new(0));
    let before = ALLOC.allocated();
    let t = Instant::now();
    let mut runs: Vec<(CancellationToken, JoinHandle<RunExit>)> = (0..n)
        .map(|_| {
            let token = CancellationToken::new();
            let join = spawn_floor_run(&token, &started);
            (token, join)
        })
        .collect();
    wait_started(&started, n).await;
    let spawn_all = t.elapsed();
    let bytes_per_task = bytes_per_task(before, n);

    let t = Instant::now();
    cancel_and_join_all(&mut runs).await;
    let pause_all = t.elapsed();
    assert!(runs.iter().all(|(_, join)| join.is_finished()));

    let t = Instant::now();
    for (token, join) in runs.iter_mut() {
        *token = CancellationToken::new();
        *join = spawn_floor_run(token, &started);
    }
    wait_started(&started, n).await;
    let resume_all = t.elapsed();

    let t = Instant::now();
    cancel_and_join_all(&mut runs).await;
    drop(runs);
    let stop_all = t.elapsed();

    Figures {
        bytes_per_task,
        spawn_all,
        pause_all,
        resume_all,
        stop_all,
    }
}

fn median<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).expect("figures are comparable"));
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The medians of each figure over the rounds.
fn medians(rounds: &[Figures]) -> Figures {
    Figures {
        bytes_per_task: median(rounds.iter().map(|f| f.bytes_per_task).collect()),
        spawn_all: median(rounds.iter().map(|f| f.spawn_all).collect()),
        pause_all: median(rounds.iter().map(|f| f.pause_all).collect()),
        resume_all: median(rounds.iter().map(|f| f.resume_all).collect()),
        stop_all: median(rounds.iter().map(|f| f.stop_all).collect()),
    }
}

fn print_round(label: &str, round: usize, f: &Figures) {
    println!(
        "scale round={round} {label}: bytes_per_task={:.0} spawn_all_ms={:.2} pause_all_ms={:.2} \
         resume_all_ms={:.2} stop_all_ms={:.2}",
        f.bytes_per_task,
        ms(f.spawn_all),
        ms(f.pause_all),
        ms(f.resume_all),
        ms(f.stop_all)
    );
}

fn main() {
    // cargo passes `--bench` to bench targets under `cargo bench` only; under
    // `cargo test` this is a quick check of the same code.
    let bench = std::env::args().skip(1).any(|arg| arg == "--bench");
    let (tasks, rounds) = if bench { (100_000, 3) } else { (1_000, 1) };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a multi-thread runtime");

    let mut taskstage = Vec::with_capacity(rounds);
    let mut floor = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Alternate which contender goes first, so neither always meets a warmer heap.
        let (ts, fl) = rt.block_on(async move {
            tokio::spawn(async move {
                if round % 2 == 0 {
                    let fl = floor_round(tasks).await;
                    (taskstage_round(tasks).await, fl)
                } else {
                    let ts = taskstage_round(tasks).await;
                    (ts, floor_round(tasks).await)
                }
            })
            .await
            .expect("the measuring task did not panic")
        });
        print_round("taskstage", round, &ts);
        print_round("floor", round, &fl);
        taskstage.push(ts);
        floor.push(fl);
    }
    drop(rt);

    let ts = medians(&taskstage);
    let fl = medians(&floor);
    println!(
        "scale-detail tasks={tasks} rounds={rounds} spawn_all_ms={:.2} floor_spawn_all_ms={:.2} \
         stop_all_ms={:.2} floor_stop_all_ms={:.2}",
        ms(ts.spawn_all),
        ms(fl.spawn_all),
        ms(ts.stop_all),
        ms(fl.stop_all)
    );
    println!(
        "scale tasks={tasks} bytes_per_task={:.0} floor_bytes_per_task={:.0} pause_all_ms={:.2} \
         floor_pause_all_ms={:.2} resume_all_ms={:.2} floor_resume_all_ms={:.2}",
        ts.bytes_per_task,
        fl.bytes_per_task,
        ms(ts.pause_all),
        ms(fl.pause_all),
        ms(ts.resume_all),
        ms(fl.resume_all)
    );
}

/// Every task is in `stage` (outside the timed sections).
fn assert_all_at(handles: &[Handle], stage: Stage) {
    for handle in handles {
        assert_eq!(handle.stage(), stage, "{}", handle.name());
    }
}

/// Every command returned Ok with `stage`.
fn assert_all_reached(results: Vec<Result<Stage, taskstage::Error>>, stage: Stage) {
    for reached in results {
        assert_eq!(reached.expect("the command is accepted"), stage);
    }
}
