//! The lifecycle core alone, without a runtime: one pause/resume cycle's four inputs
//! against a state word.
//!
//! Group `core_cycle` takes the core: the four
//! inputs one cycle makes to it (resume, the check's Ok, pause, the run's exit), each
//! decided by the transition table, against the same four moves of a *state word*
//! (stage and generation in one `AtomicU64`, moved by compare-and-swap, the table
//! still deciding each move from the word) and of that word under a `Mutex`. The core
//! also moves the unit between its slot and the start, keeps the change counter and
//! the waiter list, and builds each input's effects; the state word keeps nothing but
//! the word. The difference is the most that replacing the core's lock by a state word
//! could save per cycle (docs/performance.md, "The state word, bounded").
//!
//! The core's layers are private; this benchmark reaches them under the crate's own
//! cfg `taskstage_internals`, which is not part of the API:
//!
//! ```text
//! RUSTFLAGS="--cfg taskstage_internals" CARGO_TARGET_DIR=target/internals \
//!     cargo bench -p taskstage --bench core_cycle
//! ```
//!
//! Built without it, the benchmark says so and measures nothing.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

#[cfg(not(taskstage_internals))]
fn main() {
    eprintln!(
        "core_cycle measures the core's private layers: run it with \
         RUSTFLAGS=\"--cfg taskstage_internals\" (see the top of benches/core_cycle.rs)"
    );
}

#[cfg(taskstage_internals)]
fn main() {
    internals::main();
}

#[cfg(taskstage_internals)]
mod internals {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant};

    use criterion::{criterion_group, Criterion};
    use taskstage::lifecycle::{CancelHandle, Interrupt, Lifecycle};
    use taskstage::outcome::Exit;
    use taskstage::table::{self, Input, Verdict};
    use taskstage::{Command, Stage};

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
            Verdict::Step(step) => {
                Some(word(step.to, gen + u64::from(step.effects.new_generation)))
            }
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
                match state.compare_exchange_weak(
                    current,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
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

    criterion_group!(benches, core_cycle);

    /// `cargo bench --bench core_cycle -- --profile <contender> <cycles>` runs `cycles`
    /// cycles of one contender (`lifecycle_core`, `state_word`, `locked_word`) outside
    /// criterion, for a profiler. Without `--profile`, criterion runs as usual.
    pub(super) fn main() {
        let args: Vec<String> = std::env::args().collect();
        if let Some(at) = args.iter().position(|a| a == "--profile") {
            let contender = args.get(at + 1).map(String::as_str).unwrap_or_default();
            let cycles: u64 = args
                .get(at + 2)
                .and_then(|n| n.parse().ok())
                .unwrap_or(10_000);
            if !matches!(contender, "lifecycle_core" | "state_word" | "locked_word") {
                eprintln!("--profile: unknown contender {contender:?}");
                std::process::exit(2);
            }
            let elapsed = core_cycles(contender, cycles);
            println!(
                "{contender}: {cycles} cycles, {:.0} ns per cycle",
                elapsed.as_secs_f64() * 1e9 / cycles as f64
            );
            return;
        }
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
}
