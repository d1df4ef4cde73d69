//! The scripted driver and the invariant checks every model shares.
//!
//! A model is a handful of *parties* (loom threads). Each party owns a [`Driver`],
//! which issues commands to a [`Protocol`] and carries out the effects they return
//! exactly as the real runtime will: a cancel sets the handle's flag, a start makes a
//! run (or a preparation) alive, and the party that started it later *plays* it: reads
//! its cancel flag, drops it (it is no longer alive), and reports its exit.
//!
//! The checks live here too, so that the real core and the pre-fix protocol
//! ([`crate::prefix::PreFix`]) go through the very same assertions. Each failed check
//! fails the model with a message that starts with the number of the invariant it
//! protects (`docs/design.md`, "Invariants"), e.g. "invariant 1 violated: two live
//! runs"; a thread blocked forever is reported by loom itself as a deadlock
//! (invariant 7). See [`violated`] for why a check records its failure rather than
//! panicking on the spot.
//!
//! Bookkeeping uses the crate's sync shim (loom types under `--cfg taskstage_loom`),
//! so loom sees it and explores the values it may hold: a check such as "pause returned
//! and the run is gone" holds only if the core made the run's exit happen-before the
//! return of the pause.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use loom::model::Builder;
use loom::thread;
use taskstage::lifecycle::{
    Applied, CancelHandle, Interrupt, Lifecycle, Settle, Snapshot, Start, StartKind, Transition,
};
use taskstage::outcome::Exit;
use taskstage::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use taskstage::{Command, Error, Outcome, RunError, Stage};

/// The effects of one accepted input, as the core (and the pre-fix protocol) return them.
pub(crate) type Fx = Applied<ModelCancel, (), ()>;

/// A start effect: a preparation or a run to make alive.
pub(crate) type Run = Start<ModelCancel, (), ()>;

// ---------------------------------------------------------------------------------------
// Exploration
// ---------------------------------------------------------------------------------------

/// How many times the model closure ran: one per interleaving loom explored.
///
/// A plain `std` atomic on purpose: it counts executions from outside the model and
/// must not itself become a loom object (which would add scheduling points and be
/// reset with every execution).
static EXECUTIONS: StdAtomicUsize = StdAtomicUsize::new(0);

/// Serialises [`explore`], so that the count above belongs to one model even if the
/// test binary is run without `--test-threads=1`.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The checks that failed in the current execution, in the order they failed.
///
/// A failed check does not panic where it fails: a panic in one loom thread unwinds
/// while the other threads still hold loom objects, whose destructors then run outside
/// the execution and abort the whole test binary. Instead the failure is recorded here,
/// the parties go on (nothing in the models blocks on a check), and at the end of the
/// execution, on the model's main thread once every party has been joined, [`explore`]
/// panics with the first message (and [`survey`] tallies them). A `std` mutex: like
/// [`EXECUTIONS`] it is bookkeeping about the exploration, not part of the model.
static VIOLATIONS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records a failed check (see [`VIOLATIONS`]).
pub(crate) fn violated(message: String) {
    VIOLATIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(message);
}

fn take_violations() -> Vec<String> {
    std::mem::take(
        &mut *VIOLATIONS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// What the current execution went through (see [`cover`]).
static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// For each label, in how many executions of the current model it was seen.
static COVERED: std::sync::Mutex<BTreeMap<String, usize>> = std::sync::Mutex::new(BTreeMap::new());

/// Records that the current execution went through `label` ("pause accepted in
/// Running", "run report: Pausing -> Paused", ...). The tests use the tally to show
/// that the interleavings they are about were really explored. Bookkeeping outside the
/// model, like [`EXECUTIONS`]: it adds no scheduling point.
pub(crate) fn cover(label: String) {
    SEEN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(label);
}

/// Tallies the labels of the execution that just ended.
fn tally_coverage() {
    let mut seen = std::mem::take(
        &mut *SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    seen.sort();
    seen.dedup();
    let mut covered = COVERED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for label in seen {
        *covered.entry(label).or_default() += 1;
    }
}

fn reset_bookkeeping() {
    EXECUTIONS.store(0, StdOrdering::Relaxed);
    let _ = take_violations();
    SEEN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    COVERED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
}

/// What one model's exploration went through.
#[derive(Debug)]
pub(crate) struct Explored {
    /// How many interleavings loom explored.
    pub(crate) executions: usize,
    /// For each [`cover`] label, in how many interleavings it was seen.
    pub(crate) covered: BTreeMap<String, usize>,
}

impl Explored {
    /// Asserts that every label was seen in at least one interleaving: the model did
    /// explore the situations it claims to (runs outside loom, so it may panic).
    pub(crate) fn expect_covered(&self, labels: &[&str]) {
        for label in labels {
            assert!(
                self.covered.contains_key(*label),
                "model never reached `{label}`; reached: {:#?}",
                self.covered
            );
        }
        println!("  reached every one of: {labels:?}");
    }
}

fn describe(bound: Option<usize>) -> String {
    match bound {
        None => "none (exhaustive)".to_owned(),
        Some(bound) => bound.to_string(),
    }
}

fn builder(preemption_bound: Option<usize>) -> Builder {
    let mut builder = Builder::new();
    builder.preemption_bound = preemption_bound;
    builder.max_duration = None;
    builder.max_permutations = None;
    builder.checkpoint_file = None;
    builder
}

/// Runs `model` under loom with the given preemption bound, and prints how many
/// interleavings were explored and how long it took. Panics with the first failed
/// check of the first execution that fails one.
///
/// The bound is set here in code (`None` = exhaustive) and overrides
/// `LOOM_MAX_PREEMPTIONS`; the duration and permutation limits are switched off so that
/// no environment variable can silently shorten a model.
pub(crate) fn explore<F>(name: &str, preemption_bound: Option<usize>, model: F) -> Explored
where
    F: Fn() + Sync + Send + 'static,
{
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    reset_bookkeeping();
    let bound = describe(preemption_bound);
    let started = Instant::now();
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder(preemption_bound).check(move || {
            EXECUTIONS.fetch_add(1, StdOrdering::Relaxed);
            model();
            tally_coverage();
            // Every party has been joined: panicking here unwinds no other thread.
            if let Some(first) = take_violations().into_iter().next() {
                panic!("{first}");
            }
        });
    }));
    let elapsed = started.elapsed();
    let executions = EXECUTIONS.load(StdOrdering::Relaxed);
    if let Err(panic) = checked {
        println!(
            "loom model {name}: a check failed in interleaving {executions}, after \
             {elapsed:.2?} (preemption bound: {bound})"
        );
        std::panic::resume_unwind(panic);
    }
    println!(
        "loom model {name}: {executions} interleavings explored in {elapsed:.2?} \
         (preemption bound: {bound})"
    );
    let covered = std::mem::take(
        &mut *COVERED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if std::env::var_os("TASKSTAGE_LOOM_COVERAGE").is_some() {
        for (label, count) in &covered {
            println!("  {label}: in {count} interleavings");
        }
    }
    Explored {
        executions,
        covered,
    }
}

/// Runs `model` like [`explore`], but instead of stopping at the first failed check it
/// explores every interleaving and returns, for each kind of failed check (its message
/// up to the first parenthesis), in how many interleavings it failed.
pub(crate) fn survey<F>(
    name: &str,
    preemption_bound: Option<usize>,
    model: F,
) -> BTreeMap<String, usize>
where
    F: Fn() + Sync + Send + 'static,
{
    static FOUND: std::sync::Mutex<BTreeMap<String, usize>> =
        std::sync::Mutex::new(BTreeMap::new());
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    reset_bookkeeping();
    FOUND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    let started = Instant::now();
    builder(preemption_bound).check(move || {
        EXECUTIONS.fetch_add(1, StdOrdering::Relaxed);
        model();
        let mut kinds: Vec<String> = take_violations()
            .into_iter()
            .map(|m| m.split(" (").next().unwrap_or_default().to_owned())
            .collect();
        kinds.sort();
        kinds.dedup();
        let mut found = FOUND
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for kind in kinds {
            *found.entry(kind).or_default() += 1;
        }
    });
    let elapsed = started.elapsed();
    let executions = EXECUTIONS.load(StdOrdering::Relaxed);
    let found = std::mem::take(
        &mut *FOUND
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    println!(
        "loom model {name}: {executions} interleavings explored in {elapsed:.2?} \
         (preemption bound: {}); failed checks:",
        describe(preemption_bound)
    );
    for (kind, count) in &found {
        println!("  {kind}: in {count} interleavings");
    }
    found
}

// ---------------------------------------------------------------------------------------
// The cancel handle
// ---------------------------------------------------------------------------------------

/// The cancel handle of the models: a flag the run reads before it returns.
#[derive(Clone, Debug)]
pub(crate) struct ModelCancel(Arc<AtomicBool>);

impl CancelHandle for ModelCancel {
    fn new_handle() -> Self {
        ModelCancel(Arc::new(AtomicBool::new(false)))
    }

    fn cancel(&self) {
        // SeqCst: the flag is a plain signal; the models want no weaker behaviour than
        // a `CancellationToken` (whose state sits behind a mutex).
        self.0.store(true, Ordering::SeqCst);
    }

    /// The scripted parties play a run by reading its flag; to them an abort is a
    /// cancel. (The driver models use `driver::Signal`, whose futures wake.)
    fn abort(&self) {
        self.cancel();
    }

    // The scripted parties read the flag; they never await a signal.
    fn interrupted(&self, _on_cancel: bool) -> impl Future<Output = Interrupt> + Send + '_ {
        std::future::pending()
    }
}

impl ModelCancel {
    /// Whether a pause or a stop cancelled this handle.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Whether both are clones of the same handle.
    pub(crate) fn same(&self, other: &ModelCancel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

// ---------------------------------------------------------------------------------------
// Blocking on a future
// ---------------------------------------------------------------------------------------

/// Wakes a loom thread parked in [`block_on`].
struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives `future` to completion on the current loom thread, parking it while the
/// future is pending.
///
/// This is what `loom::future::block_on` does; that function sits behind loom's
/// `futures` feature, which the manifest does not enable, so the models carry this
/// equivalent built on `loom::thread::park` / `unpark`. loom tracks the park: a waker
/// that is never woken leaves the thread blocked forever, which loom reports as a
/// deadlock (invariant 7). A wake that comes before the park is kept as the thread's
/// token, as with `std::thread::park`, so no wake-up is lost between a poll and the park.
/// The waker is allocated with `std`'s `Arc` because `Waker::from` needs one; it holds
/// nothing but the loom thread handle.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

// ---------------------------------------------------------------------------------------
// The protocol under test
// ---------------------------------------------------------------------------------------

/// How a party waits for an accepted pause or stop to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Blocks the thread on the core's condition variable (`settled_blocking`).
    Blocking,
    /// Drives the core's `settled` future with [`block_on`] (waker list).
    Async,
}

/// What the harness and its assertions are written against: the real lifecycle core
/// ([`Core`]) or the pre-fix protocol ([`crate::prefix::PreFix`]).
pub(crate) trait Protocol: Send + Sync + Sized + 'static {
    /// A task with `units` units, in stage New.
    fn with_units(units: usize) -> Self;
    /// Issues a pause; the effects are carried out by the caller.
    fn pause(&self) -> Result<Fx, Error>;
    /// Issues a resume.
    fn resume(&self) -> Result<Fx, Error>;
    /// Issues a stop.
    fn stop(&self) -> Result<Fx, Error>;
    /// Issues a resume only if the change counter still equals `seq`.
    fn resume_if_unchanged(&self, seq: u64) -> Result<Fx, Error>;
    /// Waits until the accepted pause or stop settles; returns the stage it reports.
    fn settle(&self, command: Command, accepted: &Transition, wait: Wait) -> Stage;
    /// Reports how the run of `generation` ended, handing back its unit.
    fn report_exit(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx;
    /// Reports how the preparation of `generation` ended, handing back its unit.
    fn report_prepared(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx;
    /// Reports that the units a stop closes are closed.
    fn report_closed(&self, generation: u64) -> Fx;
    /// A consistent copy of the state.
    fn snapshot(&self) -> Snapshot;
}

/// The real lifecycle core, driven with [`ModelCancel`] handles.
#[derive(Debug)]
pub(crate) struct Core(Lifecycle<ModelCancel>);

impl Core {
    /// The lifecycle itself, for models that poll its futures by hand.
    pub(crate) fn lifecycle(&self) -> &Lifecycle<ModelCancel> {
        &self.0
    }
}

impl Protocol for Core {
    fn with_units(units: usize) -> Self {
        Core(Lifecycle::new(vec![(); units], ()))
    }

    fn pause(&self) -> Result<Fx, Error> {
        self.0.command(Command::Pause)
    }

    fn resume(&self) -> Result<Fx, Error> {
        self.0.command(Command::Resume)
    }

    fn stop(&self) -> Result<Fx, Error> {
        self.0.command(Command::Stop)
    }

    fn resume_if_unchanged(&self, seq: u64) -> Result<Fx, Error> {
        self.0.command_if_unchanged(Command::Resume, seq)
    }

    fn settle(&self, command: Command, accepted: &Transition, wait: Wait) -> Stage {
        let settle = Settle::new(command, accepted.generation);
        match wait {
            Wait::Blocking => self.0.settled_blocking(settle),
            Wait::Async => block_on(self.0.settled(settle)),
        }
    }

    fn report_exit(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx {
        self.0.report_exit(generation, exit, held)
    }

    fn report_prepared(&self, generation: u64, exit: Exit, held: Option<()>) -> Fx {
        self.0.report_prepared(generation, exit, held)
    }

    fn report_closed(&self, generation: u64) -> Fx {
        self.0.report_closed(generation)
    }

    fn snapshot(&self) -> Snapshot {
        self.0.snapshot()
    }
}

// ---------------------------------------------------------------------------------------
// Liveness bookkeeping
// ---------------------------------------------------------------------------------------

/// Which runs and preparations are alive, per generation.
///
/// Bit `2g` is set while the run of generation `g` is alive, bit `2g + 1` while its
/// preparation is. The number of run bits set is the "live runs" counter of
/// invariant 1. One atomic holds it all so that the bookkeeping adds few scheduling
/// points.
///
/// Every access is `Relaxed`, on purpose: the bookkeeping must create no
/// happens-before edge of its own, so that whatever a check relies on comes from the
/// core. When a pause returns and checks that its run is gone, the load sees the run's
/// `returned` only if the run's exit report (which follows it in the run's thread)
/// happened-before the pause's return through the core's lock, condition variable,
/// waker or stage atomic; otherwise loom is free to show the older value, and does.
#[derive(Debug)]
pub(crate) struct Liveness(AtomicU64);

/// The run bits of every generation.
const RUN_BITS: u64 = 0x5555_5555_5555_5555;

impl Liveness {
    fn new() -> Self {
        Liveness(AtomicU64::new(0))
    }

    fn bit(start: &Run) -> u64 {
        check!(
            start.generation < 32,
            "the models use fewer than 32 generations"
        );
        let run = 1u64 << (2 * start.generation);
        match start.kind {
            StartKind::Launch => run,
            StartKind::Prepare => run << 1,
        }
    }

    /// A start effect was carried out: the run or preparation is alive.
    ///
    /// Checks invariant 1 right there: at most one run, and never a run beside a
    /// preparation (both hold the unit).
    ///
    /// Two views are checked: what the starting party can see (a plain load, which
    /// shows a previous run's return only if it happened-before this start), and the
    /// latest value (the read-modify-write). A previous run that returned but whose
    /// return is not ordered before this start counts as alive: user code of the two
    /// runs would not be ordered.
    fn started(&self, start: &Run) {
        let bit = Self::bit(start);
        let seen = self.0.load(Ordering::Relaxed);
        let before = self.0.fetch_or(bit, Ordering::Relaxed);
        check!(
            before & bit == 0,
            "harness: generation {} {:?} started twice",
            start.generation,
            start.kind
        );
        let now = seen | before | bit;
        check!(
            (now & RUN_BITS).count_ones() <= 1,
            "invariant 1 violated: two live runs (launching generation {}, alive as seen \
             by the launcher: {}, alive at the launch: {})",
            start.generation,
            Alive(seen),
            Alive(before)
        );
        check!(
            now & !RUN_BITS == 0 || now.count_ones() <= 1,
            "invariant 1 violated: a run and a preparation alive at once (starting \
             generation {} {:?}, alive: {})",
            start.generation,
            start.kind,
            Alive(now)
        );
    }

    /// The run or preparation returned and its future was dropped.
    fn returned(&self, start: &Run) {
        self.0.fetch_and(!Self::bit(start), Ordering::Relaxed);
    }

    /// Whether the run or the preparation of `generation` is alive.
    fn alive(&self, generation: u64) -> bool {
        self.0.load(Ordering::Relaxed) & (0b11 << (2 * generation)) != 0
    }

    /// Everything alive.
    fn mask(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Prints a liveness mask as "run 1, prep 2".
struct Alive(u64);

impl fmt::Display for Alive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for bit in 0..64 {
            if self.0 & (1 << bit) != 0 {
                let what = if bit % 2 == 0 { "run" } else { "prep" };
                write!(f, "{}{what} {}", if first { "" } else { ", " }, bit / 2)?;
                first = false;
            }
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The world and its parties
// ---------------------------------------------------------------------------------------

/// What one model execution shares between its parties.
#[derive(Debug)]
pub(crate) struct World<P> {
    /// The protocol under test.
    pub(crate) core: P,
    live: Liveness,
}

impl<P: Protocol> World<P> {
    /// A task of `units` units in stage New, shared by the parties.
    pub(crate) fn new(units: usize) -> Arc<Self> {
        Arc::new(World {
            core: P::with_units(units),
            live: Liveness::new(),
        })
    }

    /// Whether the run or the preparation of `generation` is alive, as far as the
    /// calling party can see (see [`Liveness`]).
    pub(crate) fn alive(&self, generation: u64) -> bool {
        self.live.alive(generation)
    }
}

/// How a run played by a party ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Returns Ok (its unit is complete), whether it was cancelled or not.
    Completes,
    /// Returns an error, whether it was cancelled or not.
    Fails,
    /// Returns `Cancelled` if it saw its cancel flag, else Ok.
    HonoursCancel,
}

impl Behaviour {
    /// Every behaviour: one per exit column of the table.
    pub(crate) const ALL: [Behaviour; 3] = [
        Behaviour::Completes,
        Behaviour::Fails,
        Behaviour::HonoursCancel,
    ];

    fn exit(self, kind: StartKind, generation: u64, cancelled: bool) -> Exit {
        match kind {
            // Preparations always honour cancellation and otherwise succeed: the
            // models are about runs; `PrepOk` after a cancel still happens whenever
            // the flag is read before the cancel lands.
            StartKind::Prepare if cancelled => Exit::Cancelled,
            StartKind::Prepare => Exit::Ok,
            StartKind::Launch => match self {
                Behaviour::Completes => Exit::Ok,
                Behaviour::Fails => Exit::Failed(failure(generation)),
                Behaviour::HonoursCancel if cancelled => Exit::Cancelled,
                Behaviour::HonoursCancel => Exit::Ok,
            },
        }
    }
}

/// The error the run of `generation` fails with: distinct per generation, so the
/// outcome check can tell which run's error was kept.
fn failure(generation: u64) -> RunError {
    RunError::msg(format!("run {generation} failed"))
}

/// What a party did, for the end-of-execution checks.
#[derive(Debug)]
pub(crate) enum Event {
    /// A command was accepted.
    Command {
        command: Command,
        transition: Transition,
    },
    /// The party cancelled `handle`, the handle of `generation`.
    Cancel {
        generation: u64,
        handle: ModelCancel,
    },
    /// The party started a run or a preparation.
    Start {
        generation: u64,
        handle: ModelCancel,
    },
    /// The party reported the exit of a run or preparation it played.
    Report {
        kind: StartKind,
        exit: Exit,
        transition: Transition,
    },
    /// The party reported the units of a stop closed.
    Closed { transition: Transition },
}

/// One party's driver: issues commands, carries out effects, plays runs, checks.
#[derive(Debug)]
pub(crate) struct Driver<'w, P> {
    world: &'w World<P>,
    behaviour: Behaviour,
    wait: Wait,
    /// Starts this party carried out and has not played yet.
    pending: VecDeque<Run>,
    log: Vec<Event>,
}

impl<'w, P: Protocol> Driver<'w, P> {
    /// A party that plays the runs it starts with `behaviour`, and waits with `wait`.
    pub(crate) fn new(world: &'w World<P>, behaviour: Behaviour, wait: Wait) -> Self {
        Driver {
            world,
            behaviour,
            wait,
            pending: VecDeque::new(),
            log: Vec::new(),
        }
    }

    /// Everything this party did.
    pub(crate) fn into_log(self) -> Vec<Event> {
        check!(
            self.pending.is_empty(),
            "harness: a party ended with starts it did not play: {:?}",
            self.pending
        );
        self.log
    }

    /// Carries out the effects of an accepted input, in the order the core documents:
    /// `cancel`, `start`, `close` (then the closes' report).
    fn carry_out(&mut self, fx: Fx) {
        if let (Some(handle), Some(t)) = (fx.cancel, fx.transition) {
            handle.cancel();
            self.log.push(Event::Cancel {
                generation: t.generation,
                handle,
            });
        }
        if let Some(start) = fx.start {
            self.world.live.started(&start);
            self.log.push(Event::Start {
                generation: start.generation,
                handle: start.cancel.clone(),
            });
            self.pending.push_back(start);
        }
        // Closing a unit needs nothing from these models beyond having been asked;
        // the driver models check the closes themselves. The report that they are
        // done is an accepted input like any other.
        if let (Some(_units), Some(t)) = (fx.close, fx.transition) {
            let closed = self.world.core.report_closed(t.generation);
            if let Some(transition) = closed.transition {
                check!(
                    transition.to == Stage::Stopped,
                    "invariant 4 violated: the closes' report left the task in {}",
                    transition.to
                );
                cover(format!("closed: {} -> {}", transition.from, transition.to));
                self.log.push(Event::Closed { transition });
            }
            self.carry_out(closed);
        }
    }

    /// Issues `command` and carries out its effects, without waiting.
    pub(crate) fn issue(&mut self, command: Command) -> Result<Transition, Error> {
        let core = &self.world.core;
        let fx = match command {
            Command::Pause => core.pause(),
            Command::Resume => core.resume(),
            Command::Stop => core.stop(),
            Command::Update => panic!("the models do not update the configuration"),
        };
        self.accepted(command, fx)
    }

    /// A snapshot of the protocol's state, as a caller deciding from it would take.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.world.core.snapshot()
    }

    /// Resumes only if nothing changed since the snapshot with change counter `seq`
    /// (the auto-resume policy's way), then plays what the resume starts.
    pub(crate) fn resume_if_unchanged(&mut self, seq: u64) -> Result<Transition, Error> {
        let fx = self.world.core.resume_if_unchanged(seq);
        let accepted = self.accepted(Command::Resume, fx)?;
        self.play_all();
        Ok(accepted)
    }

    /// Records a command's result and carries out its effects.
    fn accepted(&mut self, command: Command, fx: Result<Fx, Error>) -> Result<Transition, Error> {
        let fx = match fx {
            Ok(fx) => fx,
            Err(error) => {
                cover(format!("{command} refused in {}", error.stage()));
                return Err(error);
            }
        };
        let transition = fx
            .transition
            .unwrap_or_else(|| panic!("harness: {command} accepted without a transition"));
        cover(format!("{command} accepted in {}", transition.from));
        self.log.push(Event::Command {
            command,
            transition,
        });
        self.carry_out(fx);
        Ok(transition)
    }

    /// Pauses: issues the command, carries out the cancel, waits, and checks
    /// invariant 2 on return.
    pub(crate) fn pause(&mut self) -> Result<Stage, Error> {
        let accepted = self.issue(Command::Pause)?;
        Ok(self.settle(Command::Pause, &accepted))
    }

    /// Stops: as [`Driver::pause`].
    pub(crate) fn stop(&mut self) -> Result<Stage, Error> {
        let accepted = self.issue(Command::Stop)?;
        Ok(self.settle(Command::Stop, &accepted))
    }

    /// Resumes, then plays the preparation and the run it leads to (the runtime
    /// would spawn them; here the resuming party plays them).
    pub(crate) fn resume(&mut self) -> Result<Stage, Error> {
        let accepted = self.issue(Command::Resume)?;
        self.play_all();
        Ok(accepted.to)
    }

    /// Waits for an accepted pause or stop, and checks invariant 2 on return.
    pub(crate) fn settle(&mut self, command: Command, accepted: &Transition) -> Stage {
        let stage = self.world.core.settle(command, accepted, self.wait);
        cover(format!("{command} returned {stage}"));
        self.check_rest(command, accepted.generation, stage);
        stage
    }

    /// Invariant 2: when pause / stop return Ok, the run they waited for is gone.
    fn check_rest(&self, command: Command, generation: u64, stage: Stage) {
        match command {
            Command::Pause => {
                check!(
                    !self.world.live.alive(generation),
                    "invariant 2 violated: pause returned Ok while a run is alive \
                     (generation {generation}, pause returned {stage})"
                );
                check!(
                    !stage.run_may_be_alive(),
                    "invariant 2 violated: pause returned Ok in stage {stage}, where a \
                     run may be alive"
                );
            }
            Command::Stop => {
                let alive = self.world.live.mask();
                check!(
                    alive == 0,
                    "invariant 2 violated: stop returned Ok while a run is alive \
                     (alive: {}, stop returned {stage})",
                    Alive(alive)
                );
                check!(
                    stage.is_terminal(),
                    "invariant 2 violated: stop returned Ok in non-terminal stage {stage}"
                );
            }
            Command::Resume | Command::Update => {}
        }
    }

    /// Takes the oldest start this party carried out, to hand it to another party.
    pub(crate) fn take_start(&mut self) -> Run {
        self.pending
            .pop_front()
            .expect("harness: no start to hand over")
    }

    /// Receives a start carried out by another party; this party will play it.
    pub(crate) fn give_start(&mut self, start: Run) {
        self.pending.push_back(start);
    }

    /// Plays the oldest pending start, and carries out the effects of its report.
    pub(crate) fn play_next(&mut self) {
        let start = self.pending.pop_front().expect("harness: no start to play");
        self.play(start);
    }

    /// Plays pending preparations until a run is launched, and leaves that run
    /// pending (to be played later, or handed to another party).
    pub(crate) fn play_preparations(&mut self) {
        while matches!(self.pending.front(), Some(s) if s.kind == StartKind::Prepare) {
            self.play_next();
        }
    }

    /// Plays every pending start, including those their reports lead to.
    pub(crate) fn play_all(&mut self) {
        while let Some(start) = self.pending.pop_front() {
            self.play(start);
        }
    }

    /// Plays one run or preparation to its end: reads the cancel flag, drops the
    /// future (it is no longer alive), then reports the exit and carries out what the
    /// report leads to. This is the order the runtime follows (invariant 2 rests on it).
    fn play(&mut self, start: Run) {
        let cancelled = start.cancel.is_cancelled();
        let exit = self.behaviour.exit(start.kind, start.generation, cancelled);
        self.world.live.returned(&start);
        drop(start.cancel);
        // A run that completed closed its unit; anything else hands it back.
        let held = match (start.kind, &exit) {
            (StartKind::Launch, Exit::Ok) => None,
            _ => start.held,
        };
        let fx = match start.kind {
            StartKind::Prepare => {
                self.world
                    .core
                    .report_prepared(start.generation, exit.clone(), held)
            }
            StartKind::Launch => self
                .world
                .core
                .report_exit(start.generation, exit.clone(), held),
        };
        // Invariant 4: the report of the live generation is never ignored, and it leaves
        // the transitional stage (or starts the next step).
        let Some(transition) = fx.transition else {
            violated(format!(
                "invariant 4 violated: the exit report of the live generation {} was \
                 ignored (stage {})",
                start.generation,
                self.world.core.snapshot().stage
            ));
            return;
        };
        // Stopping hands over to the closes, whose report follows in `carry_out`.
        check!(
            !transition.to.is_transitional()
                || (transition.to == Stage::Stopping && fx.close.is_some()),
            "invariant 4 violated: an exit report left the task in {}",
            transition.to
        );
        let what = match start.kind {
            StartKind::Prepare => "prep",
            StartKind::Launch => "run",
        };
        cover(format!(
            "{what} report: {} -> {}",
            transition.from, transition.to
        ));
        // Invariant 6: the report applies to its own generation (a run that completed
        // its unit may start the next generation, and then launches it).
        let next = fx
            .start
            .as_ref()
            .is_some_and(|s| s.kind == StartKind::Launch && s.generation == transition.generation);
        check!(
            transition.generation == start.generation
                || (next && transition.generation == start.generation + 1),
            "invariant 6 violated: a report of generation {} was applied to generation {}",
            start.generation,
            transition.generation
        );
        // Invariant 3: Running is published only with its run.
        if transition.to == Stage::Running {
            check!(
                matches!(&fx.start, Some(s) if s.kind == StartKind::Launch),
                "invariant 3 violated: Running published without a run to launch"
            );
        }
        self.log.push(Event::Report {
            kind: start.kind,
            exit,
            transition,
        });
        self.carry_out(fx);
    }

    /// Reports an exit of `generation` that this party never played: a late duplicate
    /// or a stale report. Checks invariant 6: it must change nothing.
    ///
    /// Snapshots taken just before and just after the report: when nothing else changed
    /// in between (same change counter), the report met exactly the stage of the first
    /// snapshot, and the second must equal it in every field.
    pub(crate) fn stale_report(&mut self, generation: u64, kind: StartKind, exit: Exit) {
        let before = self.world.core.snapshot();
        let fx = match kind {
            StartKind::Prepare => self.world.core.report_prepared(generation, exit, Some(())),
            StartKind::Launch => self.world.core.report_exit(generation, exit, Some(())),
        };
        let after = self.world.core.snapshot();
        if before.seq == after.seq {
            cover(format!("stale report in {}", before.stage));
            check!(
                before.stage == after.stage
                    && before.generation == after.generation
                    && before.unit == after.unit
                    && before.user_paused == after.user_paused
                    && format!("{:?}", before.outcome) == format!("{:?}", after.outcome),
                "invariant 6 violated: stale report changed the stage ({before:?} -> \
                 {after:?}) without counting a change"
            );
        }
        if let Some(t) = fx.transition {
            violated(format!(
                "invariant 6 violated: stale report changed the stage ({} -> {} by a \
                 {kind:?} report of generation {generation}; generation now {})",
                t.from, t.to, t.generation
            ));
        }
        check!(
            fx.cancel.is_none() && fx.start.is_none() && fx.close.is_none(),
            "invariant 6 violated: stale report produced effects"
        );
    }
}

// ---------------------------------------------------------------------------------------
// End-of-execution checks
// ---------------------------------------------------------------------------------------

/// The outcome a sequence of reports must leave.
#[derive(Debug)]
enum Expected {
    Completed,
    Cancelled,
    Aborted,
    Failed(String),
    Unrequested,
}

impl Expected {
    fn matches(&self, outcome: &Outcome) -> bool {
        match (self, outcome) {
            (Expected::Completed, Outcome::Completed) => true,
            (Expected::Cancelled, Outcome::Cancelled) => true,
            (Expected::Aborted, Outcome::Aborted) => true,
            (Expected::Failed(msg), Outcome::Failed(e)) => {
                !e.is_unrequested_cancel() && e.to_string() == *msg
            }
            (Expected::Unrequested, Outcome::Failed(e)) => e.is_unrequested_cancel(),
            _ => false,
        }
    }
}

/// Checks the state after every party joined: `logs` holds every party's events,
/// including the set-up's.
///
/// - Every change is accounted for: the core's change counter equals the number of
///   accepted inputs, and the stage is the last one's (invariant 6: nothing changed
///   silently).
/// - The stage agrees with what is alive: nothing transitional is left without a run
///   (invariant 4), Running has its run and it is the current generation's
///   (invariant 3), a rest stage has nothing alive (invariant 2).
/// - Every pause or stop that cancelled reached the handle of the run it cancelled
///   (invariant 3).
/// - The outcome is the one the last report left (invariant 5), and the user-paused
///   mark is set exactly when a pause was accepted since the last resume.
pub(crate) fn check_end<P: Protocol>(world: &World<P>, logs: Vec<Vec<Event>>) {
    let snapshot = world.core.snapshot();
    let events: Vec<Event> = logs.into_iter().flatten().collect();

    let mut transitions: Vec<Transition> = events
        .iter()
        .filter_map(|e| match e {
            Event::Command { transition, .. }
            | Event::Report { transition, .. }
            | Event::Closed { transition } => Some(*transition),
            Event::Cancel { .. } | Event::Start { .. } => None,
        })
        .collect();
    transitions.sort_by_key(|t| t.seq);
    let seqs: Vec<u64> = transitions.iter().map(|t| t.seq).collect();
    let expected_seqs: Vec<u64> = (1..=snapshot.seq).collect();
    check!(
        seqs == expected_seqs,
        "invariant 6 violated: the state changed without an accepted input (accepted \
         inputs {seqs:?}, but the core counts {} changes)",
        snapshot.seq
    );
    if let Some(last) = transitions.last() {
        check!(
            last.to == snapshot.stage && last.generation == snapshot.generation,
            "invariant 6 violated: the last accepted input left {} (generation {}), but \
             the core is in {} (generation {})",
            last.to,
            last.generation,
            snapshot.stage,
            snapshot.generation
        );
    }

    // Stage against liveness.
    let alive = world.live.mask();
    let stage = snapshot.stage;
    if alive == 0 {
        check!(
            !stage.is_transitional(),
            "invariant 4 violated: stuck in {stage} (no run or preparation is alive)"
        );
        check!(
            stage != Stage::Running,
            "invariant 3 violated: Running with no live run"
        );
    } else {
        check!(
            stage.run_may_be_alive(),
            "invariant 2 violated: {stage} while a run is alive (alive: {})",
            Alive(alive)
        );
        let current = 0b11 << (2 * snapshot.generation);
        check!(
            alive & !current == 0,
            "invariant 3 violated: the live run is not the current generation's (alive: \
             {}, generation {})",
            Alive(alive),
            snapshot.generation
        );
    }

    // Every cancel reached the run it was meant for.
    for event in &events {
        if let Event::Cancel { generation, handle } = event {
            let started = events.iter().rev().find_map(|e| match e {
                Event::Start {
                    generation: g,
                    handle: h,
                } if g == generation => Some(h),
                _ => None,
            });
            let Some(started) = started else {
                violated(format!(
                    "invariant 3 violated: generation {generation} cancelled but never started"
                ));
                continue;
            };
            check!(
                started.same(handle) && started.is_cancelled(),
                "invariant 3 violated: a pause or stop cancelled a handle that is not the \
                 run's (generation {generation})"
            );
        }
    }

    // Invariant 5: the outcome is the one the last accepted report left.
    let mut reports: Vec<(&Transition, StartKind, &Exit)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Report {
                kind,
                exit,
                transition,
            } => Some((transition, *kind, exit)),
            _ => None,
        })
        .collect();
    reports.sort_by_key(|(t, _, _)| t.seq);
    let expected = reports.iter().rev().find_map(|(t, kind, exit)| {
        let cancelled_by_us = matches!(t.from, Stage::Pausing | Stage::Stopping);
        match (kind, exit) {
            // A preparation that succeeded leads to a launch and records nothing.
            (StartKind::Prepare, Exit::Ok) if t.from == Stage::Resuming => None,
            // One that succeeded after a pause or a stop cancelled it completed nothing.
            (StartKind::Prepare, Exit::Ok) => Some(Expected::Cancelled),
            (StartKind::Launch, Exit::Ok) => Some(Expected::Completed),
            (_, Exit::Failed(e)) => Some(Expected::Failed(e.to_string())),
            (_, Exit::Cancelled) if cancelled_by_us => Some(Expected::Cancelled),
            (_, Exit::Aborted) if cancelled_by_us => Some(Expected::Aborted),
            (_, Exit::Cancelled | Exit::Aborted) => Some(Expected::Unrequested),
        }
    });
    match (&expected, &snapshot.outcome) {
        (None, None) => {}
        (Some(expected), Some(outcome)) if expected.matches(outcome) => {}
        (expected, outcome) => violated(format!(
            "invariant 5 violated: the outcome is {outcome:?}, but the last exit reported \
             leads to {expected:?}"
        )),
    }

    // The user-paused mark: set by an accepted pause, cleared by an accepted resume.
    if matches!(stage, Stage::Paused | Stage::Running) {
        let mut commands: Vec<(u64, Command)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Command {
                    command,
                    transition,
                } => Some((transition.seq, *command)),
                _ => None,
            })
            .collect();
        commands.sort_by_key(|(seq, _)| *seq);
        let paused_since_resume = commands
            .iter()
            .rev()
            .take_while(|(_, c)| *c != Command::Resume)
            .any(|(_, c)| *c == Command::Pause);
        check!(
            snapshot.user_paused == paused_since_resume,
            "user-paused mark violated: the mark is {} in {stage}, but a pause was {} \
             since the last resume",
            snapshot.user_paused,
            if paused_since_resume {
                "accepted"
            } else {
                "not accepted"
            }
        );
    }
}
