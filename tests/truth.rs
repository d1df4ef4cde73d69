//! Invariant 9 through the public API: a stage is published only with its effects done.
//!
//! Each test is a defect that was once in the runtime layer, reproduced
//! deterministically. The observer that catches it is a *waker*: a waker runs the moment
//! a stage is published (the lifecycle wakes its waiters once the change is told, after
//! releasing its lock), so an observer built from one sees the stage at the earliest instant any user
//! can, on either runtime, without racing anything.
#![allow(
    clippy::incompatible_msrv,
    reason = "tests build on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use taskstage::{Handle, Outcome, RunContext, RunError, RunExit, Stage, Task, TaskSnapshot, Unit};

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

type Parked = Pin<Box<dyn Future<Output = TaskSnapshot> + Send>>;
type OnReady = Box<dyn FnOnce(TaskSnapshot) + Send>;

/// A waiter that is its own waker: every wake polls the parked `wait_for_stage` again
/// at once, on the waking thread, and runs `on_ready` with the snapshot it ends with.
struct Observer(Mutex<Option<(Parked, OnReady)>>);

impl Wake for Observer {
    fn wake(self: Arc<Self>) {
        let Some((mut parked, on_ready)) = self.0.lock().unwrap().take() else {
            return;
        };
        let waker = Waker::from(Arc::clone(&self));
        match parked.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(snapshot) => on_ready(snapshot),
            Poll::Pending => *self.0.lock().unwrap() = Some((parked, on_ready)),
        }
    }
}

/// Registers a waiter of `handle` that runs `on_ready` the instant the stage satisfies
/// `until`, on the thread that published it.
fn observe(
    handle: &Handle,
    until: fn(Stage) -> bool,
    on_ready: impl FnOnce(TaskSnapshot) + Send + 'static,
) {
    let handle = handle.clone();
    let parked: Parked = Box::pin(async move { handle.wait_for_stage(until).await });
    let observer = Arc::new(Observer(Mutex::new(Some((parked, Box::new(on_ready))))));
    assert!(observer.0.lock().unwrap().is_some());
    Waker::from(Arc::clone(&observer)).wake_by_ref();
    assert!(
        observer.0.lock().unwrap().is_some(),
        "the observer must be registered before the change it watches for"
    );
}

/// Waits for the stage to satisfy `until`, failing within seconds (not hanging) with
/// a message that names what never came.
async fn eventually(
    handle: &Handle,
    what: &str,
    until: fn(Stage) -> bool,
) -> taskstage::TaskSnapshot {
    match tokio::time::timeout(Duration::from_secs(10), handle.wait_for_stage(until)).await {
        Ok(snapshot) => snapshot,
        Err(_) => panic!("{what} never came; the task is {:?}", handle.snapshot()),
    }
}

// ------------------------------------------------- a resume the instant Paused is seen

/// A unit whose pre-start check, the first time it runs, issues a pause from inside the
/// check and then passes: the pause lands while the check is passing.
struct PausesItsOwnCheck {
    handle: Arc<OnceLock<Handle>>,
    checks: Arc<AtomicUsize>,
}

impl Unit for PausesItsOwnCheck {
    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        if self.checks.fetch_add(1, Ordering::SeqCst) == 0 {
            let handle = self
                .handle
                .get()
                .expect("the handle is set before the resume");
            // Issued at the first poll; the pause goes on without this future.
            assert!(
                poll_once(handle.pause()).is_none(),
                "the pause cannot settle yet"
            );
        }
        Ok(())
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

on_both_runtimes! {
    async fn a_resume_the_instant_paused_is_published_finds_its_unit() {
        let cell = Arc::new(OnceLock::new());
        let checks = Arc::new(AtomicUsize::new(0));
        let unit = PausesItsOwnCheck { handle: Arc::clone(&cell), checks: Arc::clone(&checks) };
        let handle = Task::builder("t").unit(unit).spawn_paused().unwrap();
        assert!(cell.set(handle.clone()).is_ok());

        // Resumes the task the moment Paused is published.
        let resumed = Arc::new(AtomicBool::new(false));
        {
            let inner = handle.clone();
            let resumed = Arc::clone(&resumed);
            observe(&handle, |s| s == Stage::Paused, move |_| {
                let accepted = poll_once(inner.resume());
                assert!(matches!(accepted, Some(Ok(()))), "resume refused: {accepted:?}");
                resumed.store(true, Ordering::SeqCst);
            });
        }
        handle.resume().await.unwrap();
        let snapshot = match tokio::time::timeout(
            Duration::from_secs(10),
            handle.wait_for(|s| {
                s.stage == Stage::Running
                    || (s.stage == Stage::Paused && matches!(s.outcome, Some(Outcome::Failed(_))))
            }),
        )
        .await
        {
            Ok(snapshot) => snapshot,
            Err(_) => panic!("neither Running nor a failure came: {:?}", handle.snapshot()),
        };
        assert!(resumed.load(Ordering::SeqCst), "the observer never saw Paused");
        assert_eq!(
            snapshot.stage,
            Stage::Running,
            "the resume issued on Paused did not lead to a run: {:?}",
            snapshot.outcome
        );
        assert_eq!(checks.load(Ordering::SeqCst), 2, "one check per resume");
        assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
    }
}

// ------------------------------------------------- Stopped and Finished: closes done

/// A unit that counts its closes, finishing them only after `close_takes`, and
/// tells its [`Witness`] the stage its task is in while each close runs.
struct Closes {
    closed: Arc<AtomicUsize>,
    close_takes: Duration,
    complete: bool,
    witness: Witness,
}

/// The stages a task was in while its units' closes ran: read by the close itself,
/// so a stage published before a close returned is seen whatever thread or
/// runtime tells the waiters of it (invariants 4 and 9b).
#[derive(Clone, Default)]
struct Witness {
    handle: Arc<OnceLock<Handle>>,
    stages: Arc<Mutex<Vec<Stage>>>,
}

impl Witness {
    fn watch(&self, handle: &Handle) {
        assert!(
            self.handle.set(handle.clone()).is_ok(),
            "one task per witness"
        );
    }

    /// Asserts that no close ran with its task already in a terminal stage.
    fn assert_no_close_after(&self, what: &str) {
        let stages = self.stages.lock().unwrap().clone();
        assert!(!stages.is_empty(), "no close was witnessed");
        assert!(
            stages.iter().all(|stage| !stage.is_terminal()),
            "{what} was published while a close still ran: stages at the closes {stages:?}"
        );
    }
}

impl Unit for Closes {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        if self.complete {
            return Ok(RunExit::Completed);
        }
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        // A slow release of resources: blocking user code, on purpose.
        std::thread::sleep(self.close_takes);
        if let Some(handle) = self.witness.handle.get() {
            let stage = handle.stage();
            self.witness.stages.lock().unwrap().push(stage);
        }
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

fn closes(closed: &Arc<AtomicUsize>, complete: bool, close_takes: Duration) -> Closes {
    witnessed(closed, complete, close_takes, &Witness::default())
}

fn witnessed(
    closed: &Arc<AtomicUsize>,
    complete: bool,
    close_takes: Duration,
    witness: &Witness,
) -> Closes {
    Closes {
        closed: Arc::clone(closed),
        close_takes,
        complete,
        witness: witness.clone(),
    }
}

/// Registers an observer that records the terminal stage it sees first and how many
/// closes had returned at that instant. The record is sent on a watch channel, since
/// the observer runs on whichever thread published the stage.
fn record_closes_at_terminal(
    handle: &Handle,
    closed: &Arc<AtomicUsize>,
) -> tokio::sync::watch::Receiver<Option<(Stage, usize)>> {
    let (record, seen) = tokio::sync::watch::channel(None);
    let closed = Arc::clone(closed);
    observe(handle, Stage::is_terminal, move |snapshot| {
        record.send_replace(Some((snapshot.stage, closed.load(Ordering::SeqCst))));
    });
    seen
}

/// What the observer recorded, waited for with a deadline.
async fn recorded(
    mut seen: tokio::sync::watch::Receiver<Option<(Stage, usize)>>,
) -> (Stage, usize) {
    match tokio::time::timeout(Duration::from_secs(10), seen.wait_for(Option::is_some)).await {
        Ok(Ok(record)) => record.expect("waited for a record"),
        _ => panic!("the observer of the terminal stage never ran"),
    }
}

on_both_runtimes! {
    async fn an_observer_that_sees_stopped_finds_every_unit_closed() {
        let closed = Arc::new(AtomicUsize::new(0));
        let witness = Witness::default();
        let handle = Task::builder("t")
            .unit(witnessed(&closed, false, Duration::ZERO, &witness))
            .unit(witnessed(&closed, false, Duration::ZERO, &witness))
            .unit(witnessed(&closed, false, Duration::ZERO, &witness))
            .spawn_paused()
            .unwrap();
        witness.watch(&handle);
        let seen = record_closes_at_terminal(&handle, &closed);
        assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
        assert_eq!(closed.load(Ordering::SeqCst), 3, "stop returned before every close");
        let seen = recorded(seen).await;
        assert_eq!(seen, (Stage::Stopped, 3), "Stopped was published before the closes returned: {seen:?}");
        witness.assert_no_close_after("Stopped");
    }
}

on_both_runtimes! {
    async fn an_observer_that_sees_finished_finds_the_last_unit_closed() {
        let closed = Arc::new(AtomicUsize::new(0));
        let witness = Witness::default();
        let handle = Task::builder("t")
            .unit(witnessed(&closed, true, Duration::ZERO, &witness))
            .unit(witnessed(&closed, true, Duration::ZERO, &witness))
            .spawn_paused()
            .unwrap();
        witness.watch(&handle);
        let seen = record_closes_at_terminal(&handle, &closed);
        handle.resume().await.unwrap();
        eventually(&handle, "Finished", Stage::is_terminal).await;
        // A stop of a finished task is a no-op and returns at once: the closes must
        // already be done.
        assert_eq!(handle.stop().await.unwrap(), Stage::Finished);
        assert_eq!(closed.load(Ordering::SeqCst), 2, "stop of Finished returned before the last close");
        let seen = recorded(seen).await;
        assert_eq!(seen, (Stage::Finished, 2), "Finished was published before the last close returned: {seen:?}");
        witness.assert_no_close_after("Finished");
    }
}

/// The report as it was filed: the first unit completes as a pause lands and its
/// `close()` is slow; the stop of the paused task must not return before that close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_a_pause_that_completed_a_unit_waits_for_its_slow_close() {
    support::within(
        "stop_after_a_pause_that_completed_a_unit_waits_for_its_slow_close",
        support::REAL_BOUND,
        async move {
            let closed = Arc::new(AtomicUsize::new(0));
            // The first unit completes when cancelled: it has just finished its last row.
            struct CompletesOnCancel(Arc<AtomicUsize>);
            impl Unit for CompletesOnCancel {
                async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
                    ctx.cancelled().await;
                    Ok(RunExit::Completed)
                }
                fn close(&mut self) {
                    std::thread::sleep(Duration::from_millis(150));
                    self.0.fetch_add(1, Ordering::SeqCst);
                }
            }
            let handle = Task::builder("t")
                .unit(CompletesOnCancel(Arc::clone(&closed)))
                .unit(closes(&closed, false, Duration::ZERO))
                .spawn()
                .unwrap();
            eventually(&handle, "Running", |s| s == Stage::Running).await;
            let paused = handle.pause().await.unwrap();
            assert_eq!(paused, Stage::Paused);
            assert!(matches!(
                handle.snapshot().outcome,
                Some(Outcome::Completed)
            ));
            assert_eq!(handle.stop().await.unwrap(), Stage::Stopped);
            assert_eq!(
                closed.load(Ordering::SeqCst),
                2,
                "stop returned while a close was still running"
            );
        },
    )
    .await
}

// ------------------------------------------------- no user code under our lock

/// A predicate that calls back into the task must not deadlock it. The waiter runs on
/// its own thread so that a deadlock fails this test within seconds; on failure the
/// runtimes are leaked, because shutting them down would block on the wedged lock.
fn a_wait_for_predicate_may_use_the_handle(runtime: tokio::runtime::Runtime) {
    let handle = runtime.block_on(async {
        Task::builder("t")
            .unit(closes(
                &Arc::new(AtomicUsize::new(0)),
                false,
                Duration::ZERO,
            ))
            .spawn()
            .unwrap()
    });
    let inner = handle.clone();
    let waiter = handle.clone();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let own = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The predicate reads the handle (the point of the test) and the snapshot
        // it is given: the one wait_for returns, which may be older than the
        // handle's when the task moves on between the two.
        let snapshot = own.block_on(waiter.wait_for(move |s| {
            inner.snapshot().stage == Stage::Running && s.stage == Stage::Running
        }));
        let _ = done.send(snapshot.stage);
    });
    // Drive the task's runtime on a thread of its own (a current-thread runtime runs
    // its tasks only inside `block_on`): a deadlock that wedges it cannot hold up this
    // thread's deadline.
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let driver = std::thread::spawn(move || {
        runtime.block_on(async {
            let _ = released.await;
        });
        runtime
    });
    match finished.recv_timeout(Duration::from_secs(10)) {
        Ok(stage) => assert_eq!(stage, Stage::Running),
        Err(_) => {
            // The driver thread and the runtime are left wedged on the lock.
            std::mem::forget(handle);
            panic!("wait_for deadlocked: its predicate ran under the task's lock");
        }
    }
    let _ = release.send(());
    let runtime = driver.join().expect("the driver thread panicked");
    assert_eq!(runtime.block_on(handle.stop()).unwrap(), Stage::Stopped);
}

#[test]
fn a_wait_for_predicate_may_use_the_handle_current_thread() {
    a_wait_for_predicate_may_use_the_handle(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    );
}

#[test]
fn a_wait_for_predicate_may_use_the_handle_multi_thread() {
    a_wait_for_predicate_may_use_the_handle(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    );
}

/// A runtime that shuts down right after a start was spawned drops the start's future
/// before its first poll. The start must still be reported (invariant 4: no stage
/// outlives its cause): the task ends Paused, not Resuming for ever.
#[test]
fn a_start_dropped_before_its_first_poll_is_still_reported() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let closed = Arc::new(AtomicUsize::new(0));
    let handle = runtime.block_on(async {
        Task::builder("t")
            .unit(closes(&closed, false, Duration::ZERO))
            .spawn()
            .unwrap()
    });
    // The check was spawned but never polled: the current-thread runtime only runs
    // tasks inside `block_on`.
    drop(runtime);
    let snapshot = handle.snapshot();
    assert_eq!(
        snapshot.stage,
        Stage::Paused,
        "a start dropped unpolled left the task in {}",
        snapshot.stage
    );
    assert!(
        matches!(&snapshot.outcome, Some(Outcome::Failed(e)) if e.is_unrequested_cancel()),
        "{:?}",
        snapshot.outcome
    );
}
