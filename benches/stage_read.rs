//! Reading a task's stage: the handle's lock-free read beside a `RwLock<Stage>` read
//! (how the original migration tool kept its stage) and a bare atomic load (the floor).
//!
//! Group `stage_read` reads an idle stage. Group `stage_read_contended` reads it while
//! another thread keeps writing it, and every writer does the same work: a loop of
//! pause/resume cycles of a real tokio task on its own runtime, writing Pausing,
//! Paused, Resuming and Running once per cycle. The taskstage writer is the crate's own
//! lifecycle (through `Handle::pause` and `Handle::resume`); the two baselines write
//! their `RwLock` or atomic by hand around the same spawn / cancel / join. Each writer
//! prints how many stage writes per second it managed, so a reader of the results can
//! check that the contention was comparable.
//!
//! One iteration is a batch of [`READS`] reads of a black-boxed target, summed so that
//! none is dropped (see [`batch`]): a single sub-nanosecond read
//! per iteration is at the resolution of the timer and of criterion's loop overhead,
//! and its ratio to the floor moved between 0.85 and 1.56 from run to run. Criterion
//! reports the time of a batch; `scripts/bench-report.py` divides it by [`READS`].
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, PoisonError, RwLock};
use std::thread;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use taskstage::runtime::StageEvent;
use taskstage::{Handle, RunContext, RunError, RunExit, Stage, Task, Unit};
use tokio_util::sync::CancellationToken;

/// Reads per iteration of every `stage_read*` function.
const READS: u64 = 1_000;

/// `READS` reads of `target`, summed (a stage's discriminant is its value).
///
/// `target` goes through `black_box` once per batch, and criterion black-boxes the
/// sum: every read is an atomic load (or a lock), which the compiler neither merges
/// nor hoists, so all of them are executed. A `black_box` around each read would store
/// the reference to the stack and load it back every time, and that store, aliasing
/// with the read's own load at some heap addresses and not others, made the figures
/// jump from run to run.
#[inline(always)]
fn batch<T: ?Sized>(target: &T, read: impl Fn(&T) -> u8) -> u64 {
    let target = black_box(target);
    let mut sum = 0u64;
    for _ in 0..READS {
        sum += u64::from(read(target));
    }
    sum
}

/// A unit that waits for its cancellation and nothing else.
struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

/// Spawns a `Wait` task on the current runtime and waits until it is Running.
async fn running_task() -> Handle {
    let handle = Task::builder("stage-read")
        .unit(Wait)
        .spawn()
        .expect("spawn inside a runtime");
    handle.wait_for_stage(|s| s == Stage::Running).await;
    handle
}

fn stage_read(c: &mut Criterion) {
    let rt = current_thread_runtime();
    let handle = rt.block_on(running_task());
    let lock = RwLock::new(Stage::Running);
    let atomic = AtomicU8::new(Stage::Running as u8);

    let mut group = c.benchmark_group("stage_read");
    group.bench_function("taskstage", |b| {
        b.iter(|| batch(&handle, |h| h.stage() as u8))
    });
    group.bench_function("rwlock_baseline", |b| {
        b.iter(|| {
            batch(&lock, |l| {
                *l.read().unwrap_or_else(PoisonError::into_inner) as u8
            })
        })
    });
    group.bench_function("atomic_floor", |b| {
        // Acquire, as the crate's read uses: on the machines we bench it is a plain load.
        b.iter(|| batch(&atomic, |a| a.load(Ordering::Acquire)))
    });
    group.finish();
    assert_eq!(handle.stage(), Stage::Running);
}

/// A thread that keeps writing a stage until it is told to stop.
struct Writer {
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    started: Instant,
    thread: Option<thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts a writer thread with its own current-thread runtime; returns what the
    /// reader reads once the writer is set up.
    fn start<W: StageWriter>() -> (Self, W::Output) {
        let stop = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            let writes = Arc::clone(&writes);
            thread::spawn(move || {
                current_thread_runtime().block_on(async move {
                    let (mut writer, output) = W::setup().await;
                    // One cycle before the reader starts, so that every measurement,
                    // even a single test-mode iteration, runs against a writing writer.
                    writer.cycle().await;
                    writes.fetch_add(4, Ordering::Relaxed);
                    tx.send(output)
                        .expect("the bench waits for the writer's output");
                    // Relaxed: the flag carries no data; the join below synchronises.
                    while !stop.load(Ordering::Relaxed) {
                        writer.cycle().await;
                        writes.fetch_add(4, Ordering::Relaxed);
                    }
                    writer.teardown().await;
                });
            })
        };
        let output = rx.recv().expect("the writer thread sends its output");
        let writer = Writer {
            stop,
            writes,
            started: Instant::now(),
            thread: Some(thread),
        };
        (writer, output)
    }

    /// Stops the writer and prints its write rate.
    fn finish(mut self, name: &str) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the writer thread did not panic");
        }
        let secs = self.started.elapsed().as_secs_f64();
        let writes = self.writes.load(Ordering::Relaxed);
        println!(
            "stage_read_contended/{name} writer: {writes} stage writes in {secs:.2} s \
             ({:.0} per second)",
            writes as f64 / secs.max(f64::MIN_POSITIVE)
        );
        assert!(writes > 0, "the {name} writer never wrote the stage");
    }
}

/// One way of keeping a stage written: set up, then pause/resume cycles of a real
/// tokio task, each writing Pausing, Paused, Resuming and Running once.
trait StageWriter: Sized + 'static {
    /// What the reader reads.
    type Output: Send + 'static;
    /// Builds the writer inside its runtime.
    async fn setup() -> (Self, Self::Output);
    /// One pause/resume cycle.
    async fn cycle(&mut self);
    /// Ends the work.
    async fn teardown(self);
}

/// The taskstage writer: a real task, paused and resumed through its handle.
struct TaskstageWriter {
    handle: Handle,
    events: tokio::sync::watch::Receiver<StageEvent>,
}

impl StageWriter for TaskstageWriter {
    type Output = Handle;

    async fn setup() -> (Self, Handle) {
        let handle = running_task().await;
        let events = handle.subscribe();
        let writer = TaskstageWriter {
            handle: handle.clone(),
            events,
        };
        (writer, handle)
    }

    async fn cycle(&mut self) {
        let reached = self.handle.pause().await.expect("pause");
        assert_eq!(reached, Stage::Paused);
        self.handle.resume().await.expect("resume");
        self.events
            .wait_for(|e| e.stage == Stage::Running)
            .await
            .expect("the task outlives its handle");
    }

    async fn teardown(self) {
        let reached = self.handle.stop().await.expect("stop");
        assert_eq!(reached, Stage::Stopped);
    }
}

/// The stage store of a hand-rolled writer.
trait StageCell: Send + Sync + 'static {
    fn initial() -> Self;
    fn write(&self, stage: Stage);
}

impl StageCell for RwLock<Stage> {
    fn initial() -> Self {
        RwLock::new(Stage::Running)
    }

    fn write(&self, stage: Stage) {
        *self.write().unwrap_or_else(PoisonError::into_inner) = stage;
    }
}

impl StageCell for AtomicU8 {
    fn initial() -> Self {
        AtomicU8::new(Stage::Running as u8)
    }

    fn write(&self, stage: Stage) {
        // Release, pairing with the reader's Acquire, as a real publisher would.
        self.store(stage as u8, Ordering::Release);
    }
}

/// A hand-rolled task whose stage lives in `S`, written around spawn / cancel / join.
struct ManualWriter<S> {
    stage: Arc<S>,
    token: CancellationToken,
    join: tokio::task::JoinHandle<()>,
}

fn spawn_waiter(token: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let token = token.clone();
    tokio::spawn(async move { token.cancelled().await })
}

impl<S: StageCell> StageWriter for ManualWriter<S> {
    type Output = Arc<S>;

    async fn setup() -> (Self, Arc<S>) {
        let stage = Arc::new(S::initial());
        let token = CancellationToken::new();
        let join = spawn_waiter(&token);
        let writer = ManualWriter {
            stage: Arc::clone(&stage),
            token,
            join,
        };
        (writer, stage)
    }

    async fn cycle(&mut self) {
        self.stage.write(Stage::Pausing);
        self.token.cancel();
        (&mut self.join).await.expect("the waiter did not panic");
        self.stage.write(Stage::Paused);
        self.stage.write(Stage::Resuming);
        self.token = CancellationToken::new();
        self.join = spawn_waiter(&self.token);
        self.stage.write(Stage::Running);
    }

    async fn teardown(self) {
        self.token.cancel();
        self.join.await.expect("the waiter did not panic");
    }
}

fn stage_read_contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("stage_read_contended");

    let (writer, handle) = Writer::start::<TaskstageWriter>();
    group.bench_function("taskstage", |b| {
        b.iter(|| batch(&handle, |h| h.stage() as u8))
    });
    writer.finish("taskstage");

    let (writer, lock) = Writer::start::<ManualWriter<RwLock<Stage>>>();
    group.bench_function("rwlock_baseline", |b| {
        b.iter(|| {
            batch(&*lock, |l| {
                *l.read().unwrap_or_else(PoisonError::into_inner) as u8
            })
        })
    });
    writer.finish("rwlock_baseline");

    let (writer, atomic) = Writer::start::<ManualWriter<AtomicU8>>();
    group.bench_function("atomic_floor", |b| {
        b.iter(|| batch(&*atomic, |a| a.load(Ordering::Acquire)))
    });
    writer.finish("atomic_floor");

    group.finish();
}

criterion_group!(benches, stage_read, stage_read_contended);
criterion_main!(benches);
