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
//! Group `core_cycle` takes the lifecycle core alone, without a runtime: the four
//! inputs one cycle makes to it (resume, the check's Ok, pause, the run's exit), each
//! decided by the transition table, against the same four moves of a *state word*
//! (stage and generation in one `AtomicU64`, moved by compare-and-swap, the table
//! still deciding each move from the word) and of that word under a `Mutex`. The core
//! also moves the unit between its slot and the start, keeps the change counter and
//! the waiter list, and builds each input's effects; the state word keeps nothing but
//! the word. The difference is the most that replacing the core's lock by a state word
//! could save per cycle (docs/performance.md, "The state word, bounded").
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use taskstage::lifecycle::{CancelHandle, Interrupt, Lifecycle};
use taskstage::outcome::Exit;
use taskstage::table::{self, Input, Verdict};
use taskstage::{Command, RunContext, RunError, RunExit, Stage, Task, Unit};
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

/// A cancel handle that costs nothing, so that `core_cycle` measures the core alone.
#[derive(Debug, Clone, Copy)]
struct NoHandle;

impl CancelHandle for NoHandle {
    fn new_handle() -> Self {
        NoHandle
    }
    fn cancel(&self) {}
    fn abort(&self) {}
    fn interrupted(
        &self,
        _on_cancel: bool,
    ) -> impl std::future::Future<Output = Interrupt> + Send + '_ {
        std::future::pending()
    }
}

/// The four inputs of one pause/resume cycle through the lifecycle core, from Paused
/// back to Paused: resume (Resuming, a check starts), the check's Ok (Running, the
/// run launches), pause (Pausing, the run is cancelled), the run's exit (Paused, the
/// unit back in its slot). Panics if the core does not take that path, so a change
/// of the table cannot make the bench measure something else.
fn core_cycle_through_lifecycle(core: &Lifecycle<NoHandle, (), u32>) {
    let resumed = core
        .command(Command::Resume)
        .expect("Paused accepts a resume");
    let check = resumed.start.expect("a resume starts the unit's check");
    let checked = core.report_prepared(check.generation, Exit::Ok, check.held);
    let run = checked.start.expect("a passed check launches the run");
    assert_eq!(checked.transition.map(|t| t.to), Some(Stage::Running));
    let paused = core
        .command(Command::Pause)
        .expect("Running accepts a pause");
    black_box(paused.cancel);
    let exited = core.report_exit(run.generation, Exit::Cancelled, run.held);
    assert_eq!(exited.transition.map(|t| t.to), Some(Stage::Paused));
}

/// The inputs of [`core_cycle_through_lifecycle`], each with the generation a report
/// carries (`None` for a command).
const CYCLE: [(Input, bool); 4] = [
    (Input::Resume, false),
    (Input::PrepOk, true),
    (Input::Pause, false),
    (Input::RunCancelled, true),
];

/// A state word: the stage in the low byte, the generation above it.
fn word(stage: Stage, generation: u64) -> u64 {
    (generation << 8) | stage as u64
}

fn stage_of(word: u64) -> Stage {
    Stage::ALL
        .into_iter()
        .find(|s| *s as u64 == word & 0xff)
        .expect("the word holds a stage")
}

/// The word after `input`, as the table decides it; `None` when the input changes
/// nothing (refused, ignored, or a report of another generation: the stale fence).
fn next_word(current: u64, input: Input, generation: Option<u64>) -> Option<u64> {
    let gen = current >> 8;
    if generation.is_some_and(|g| g != gen) {
        return None;
    }
    match table::decide(stage_of(current), input) {
        Verdict::Step(step) => Some(word(step.to, gen + u64::from(step.effects.new_generation))),
        Verdict::Ignored | Verdict::Refused(_) => None,
    }
}

/// The cycle's four moves on a state word, each a compare-and-swap of the table's
/// decision (retried if the word changed under it).
fn core_cycle_on_state_word(state: &AtomicU64) {
    for (input, report) in CYCLE {
        let mut current = state.load(Ordering::Acquire);
        loop {
            let generation = report.then_some(current >> 8);
            let next = next_word(current, input, generation).expect("the cycle's path");
            match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
    }
}

/// The same four moves with the word under a lock.
fn core_cycle_on_locked_word(state: &Mutex<u64>) {
    for (input, report) in CYCLE {
        let mut current = state.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = report.then_some(*current >> 8);
        *current = next_word(*current, input, generation).expect("the cycle's path");
    }
}

fn core_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("core_cycle");

    let core: Lifecycle<NoHandle, (), u32> = Lifecycle::new(vec![7], ());
    // New to Paused: resume, the check passes, pause, the run returns.
    core_cycle_through_lifecycle_from_new(&core);
    group.bench_function("lifecycle_core", |b| {
        b.iter(|| core_cycle_through_lifecycle(black_box(&core)))
    });

    let state = AtomicU64::new(word(Stage::Paused, 1));
    group.bench_function("state_word", |b| {
        b.iter(|| core_cycle_on_state_word(black_box(&state)))
    });

    let locked = Mutex::new(word(Stage::Paused, 1));
    group.bench_function("locked_word", |b| {
        b.iter(|| core_cycle_on_locked_word(black_box(&locked)))
    });

    group.finish();
}

/// Brings a new core to Paused by the same four inputs (New + resume starts it).
fn core_cycle_through_lifecycle_from_new(core: &Lifecycle<NoHandle, (), u32>) {
    assert_eq!(core.stage(), Stage::New);
    core_cycle_through_lifecycle(core);
    assert_eq!(core.stage(), Stage::Paused);
}

criterion_group!(benches, pause_resume_cycle, core_cycle);

/// `cycles` cycles of one of `core_cycle`'s contenders, timed.
fn core_cycles(contender: &str, cycles: u64) -> Duration {
    let core: Lifecycle<NoHandle, (), u32> = Lifecycle::new(vec![7], ());
    core_cycle_through_lifecycle_from_new(&core);
    let state = AtomicU64::new(word(Stage::Paused, 1));
    let locked = Mutex::new(word(Stage::Paused, 1));
    let start = Instant::now();
    for _ in 0..cycles {
        match contender {
            "lifecycle_core" => core_cycle_through_lifecycle(&core),
            "state_word" => core_cycle_on_state_word(&state),
            _ => core_cycle_on_locked_word(&locked),
        }
    }
    start.elapsed()
}

/// `cargo bench --bench pause_resume_cycle -- --profile <contender> <cycles>` runs
/// `cycles` cycles of one contender (`taskstage_current_thread`,
/// `bare_tokio_current_thread`, `taskstage_multi_thread`, `bare_tokio_multi_thread`,
/// and `core_cycle`'s `lifecycle_core`, `state_word`, `locked_word`)
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
            "lifecycle_core" | "state_word" | "locked_word" => core_cycles(contender, cycles),
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
