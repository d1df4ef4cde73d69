//! Unit tests of the core that need its private parts (the waiter list).

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Wake, Waker};

use super::*;

#[derive(Debug, Clone, Default)]
struct Flag(StdArc<AtomicBool>);

impl CancelHandle for Flag {
    fn new_handle() -> Self {
        Flag::default()
    }
    fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn abort(&self) {
        self.cancel();
    }
    // These tests drive the core by hand and never await a signal.
    fn interrupted(&self, _on_cancel: bool) -> impl Future<Output = Interrupt> + Send + '_ {
        std::future::pending()
    }
}

#[derive(Default)]
struct CountWakes(AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn running() -> (Lifecycle<Flag>, Start<Flag, (), ()>) {
    let core = Lifecycle::<Flag>::new(vec![()], ());
    let applied = core.command(Command::Resume).unwrap();
    let prepare = applied.start.unwrap();
    assert_eq!(prepare.kind, StartKind::Prepare);
    let applied = core.report_prepared(prepare.generation, Exit::Ok, prepare.held);
    let launch = applied.start.unwrap();
    assert_eq!(launch.kind, StartKind::Launch);
    assert_eq!(core.stage(), Stage::Running);
    (core, launch)
}

#[test]
fn the_cancel_handle_is_installed_before_running_is_published() {
    let (core, launch) = running();
    let applied = core.command(Command::Pause).unwrap();
    let cancel = applied.cancel.expect("pause cancels the run");
    cancel.cancel();
    assert!(
        launch.cancel.0.load(Ordering::SeqCst),
        "the pause reached the handle the run holds"
    );
}

/// A running core with an accepted pause, and a waker that counts its wakes.
fn pausing() -> (Lifecycle<Flag>, u64, StdArc<CountWakes>, Waker) {
    let (core, _launch) = running();
    let applied = core.command(Command::Pause).unwrap();
    let generation = applied.transition.unwrap().generation;
    let wakes = StdArc::new(CountWakes::default());
    let waker = Waker::from(StdArc::clone(&wakes));
    (core, generation, wakes, waker)
}

#[test]
fn a_dropped_wait_unregisters_its_waker() {
    let (core, generation, wakes, waker) = pausing();
    let mut cx = Context::from_waker(&waker);
    {
        let mut settled = pin!(core.settled(Settle::new(Command::Pause, generation)));
        assert_eq!(settled.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(settled.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(
            lock(&core.state).waiters.len(),
            1,
            "re-polling does not duplicate"
        );
    }
    assert_eq!(lock(&core.state).waiters.len(), 0, "drop unregisters");
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    assert_eq!(core.stage(), Stage::Paused);
}

#[test]
fn a_waiting_pause_is_woken_by_the_exit() {
    let (core, generation, wakes, waker) = pausing();
    let mut cx = Context::from_waker(&waker);
    let mut settled = pin!(core.settled(Settle::new(Command::Pause, generation)));
    assert_eq!(settled.as_mut().poll(&mut cx), Poll::Pending);
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert_eq!(settled.as_mut().poll(&mut cx), Poll::Ready(Stage::Paused));
}

#[test]
fn a_waiter_polled_again_with_another_waker_is_woken_through_the_new_one() {
    let (core, generation, first_wakes, first) = pausing();
    let second_wakes = StdArc::new(CountWakes::default());
    let second = Waker::from(StdArc::clone(&second_wakes));
    let mut settled = pin!(core.settled(Settle::new(Command::Pause, generation)));
    assert_eq!(
        settled.as_mut().poll(&mut Context::from_waker(&first)),
        Poll::Pending
    );
    // The future moved to another task: the newest waker is the one that counts.
    assert_eq!(
        settled.as_mut().poll(&mut Context::from_waker(&second)),
        Poll::Pending
    );
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    assert_eq!(
        second_wakes.0.load(Ordering::SeqCst),
        1,
        "the new waker was not woken"
    );
    assert_eq!(
        first_wakes.0.load(Ordering::SeqCst),
        0,
        "the old waker was woken instead"
    );
}

#[test]
fn a_wait_until_predicate_runs_with_no_lock_held() {
    let core = StdArc::new(Lifecycle::<Flag>::new(vec![()], ()));
    let inner = StdArc::clone(&core);
    let calls = AtomicUsize::new(0);
    // The predicate takes the core's lock itself: under the lock this would deadlock.
    let mut waiting = pin!(core.wait_until(|s| {
        calls.fetch_add(1, Ordering::SeqCst);
        inner.snapshot().seq == s.seq && s.stage == Stage::Resuming
    }));
    let waker = Waker::from(StdArc::new(CountWakes::default()));
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let _ = core.command(Command::Resume).unwrap();
    match waiting.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(snapshot) => assert_eq!(snapshot.stage, Stage::Resuming),
        Poll::Pending => panic!("the predicate held, but the wait did not end"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_stale_report_changes_nothing() {
    let (core, launch) = running();
    let _ = core.command(Command::Pause).unwrap();
    let _ = core.report_exit(launch.generation, Exit::Cancelled, Some(()));
    let applied = core.command(Command::Resume).unwrap();
    let prepare = applied.start.unwrap();
    let _ = core.report_prepared(prepare.generation, Exit::Ok, Some(()));
    let before = core.snapshot();
    assert_eq!((before.stage, before.generation), (Stage::Running, 2));
    let applied = core.report_exit(
        launch.generation,
        Exit::Failed(RunError::msg("late")),
        Some(()),
    );
    assert!(applied.transition.is_none());
    let after = core.snapshot();
    assert_eq!(
        (after.stage, after.generation, after.seq),
        (before.stage, before.generation, before.seq)
    );
    assert!(matches!(after.outcome, Some(Outcome::Cancelled)));
}

#[test]
fn a_refused_command_changes_nothing() {
    let (core, _launch) = running();
    let before = core.snapshot();
    let err = core.command(Command::Resume).unwrap_err();
    assert_eq!(err.command(), Command::Resume);
    assert_eq!(err.stage(), Stage::Running);
    let after = core.snapshot();
    assert_eq!(after.seq, before.seq);
    assert_eq!(after.stage, before.stage);
}

#[test]
fn update_replaces_the_config_only_when_accepted() {
    let core = Lifecycle::<Flag, u8>::new(vec![()], 1);
    let _ = core.update(2).unwrap();
    assert_eq!(*core.config(), 2);
    let applied = core.command(Command::Resume).unwrap();
    assert_eq!(*applied.start.unwrap().config, 2);
    assert!(core.update(3).is_err());
    assert_eq!(*core.config(), 2);
}

#[test]
fn a_blocking_pause_returns_once_the_run_reports() {
    let (core, launch) = running();
    let core = StdArc::new(core);
    let run = {
        let core = StdArc::clone(&core);
        std::thread::spawn(move || {
            // The run: wait until cancelled, then report. A pause that never reaches
            // the run fails the test after the deadline instead of hanging it: the run
            // reports anyway, so the pause returns, and says it was never cancelled.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut cancelled = launch.cancel.0.load(Ordering::SeqCst);
            while !cancelled && std::time::Instant::now() < deadline {
                std::thread::yield_now();
                cancelled = launch.cancel.0.load(Ordering::SeqCst);
            }
            let _ = core.report_exit(launch.generation, Exit::Cancelled, Some(()));
            cancelled
        })
    };
    assert_eq!(core.pause_blocking().unwrap(), Stage::Paused);
    assert!(
        run.join().unwrap(),
        "the pause never reached the run's cancel handle"
    );
    assert!(core.snapshot().user_paused);
}

#[test]
fn a_unit_handed_back_in_a_report_is_in_its_slot_at_the_rest_stage() {
    let core = Lifecycle::<Flag, (), &'static str>::new(vec!["dump"], ());
    let prepare = core.command(Command::Resume).unwrap().start.unwrap();
    assert_eq!(prepare.held, Some("dump"), "a start carries its unit");
    let launch = core
        .report_prepared(prepare.generation, Exit::Ok, prepare.held)
        .start
        .unwrap();
    let _ = core.command(Command::Pause).unwrap();
    let applied = core.report_exit(launch.generation, Exit::Cancelled, launch.held);
    assert_eq!(applied.stage(), Some(Stage::Paused));
    assert!(applied.orphan.is_none());
    // The very next start finds the unit: it went back with the report.
    let again = core.command(Command::Resume).unwrap().start.unwrap();
    assert_eq!(again.held, Some("dump"));
}

#[test]
fn stopped_waits_for_the_report_that_every_unit_is_closed() {
    let core = Lifecycle::<Flag, (), u8>::new(vec![1, 2, 3], ());
    let applied = core.command(Command::Stop).unwrap();
    assert_eq!(applied.stage(), Some(Stage::Stopping));
    assert_eq!(
        applied.close,
        Some(vec![1, 2, 3]),
        "the units to close leave their slots"
    );
    assert_eq!(
        core.stage(),
        Stage::Stopping,
        "not Stopped before the closes"
    );
    let generation = applied.transition.unwrap().generation;
    let closed = core.report_closed(generation);
    assert_eq!(closed.stage(), Some(Stage::Stopped));
    // A second report changes nothing.
    assert!(core.report_closed(generation).transition.is_none());
}

#[test]
fn a_stale_report_hands_its_unit_back_as_an_orphan() {
    let (core, launch) = running();
    let applied = core.report_exit(launch.generation + 1, Exit::Cancelled, Some(()));
    assert!(applied.transition.is_none());
    assert_eq!(applied.orphan, Some(()));
    assert_eq!(core.stage(), Stage::Running);
}

#[test]
fn an_abort_reaches_the_current_generation_only() {
    let (core, launch) = running();
    assert!(
        !core.abort(launch.generation + 1),
        "another generation's abort is dropped"
    );
    assert!(!launch.cancel.0.load(Ordering::SeqCst));
    assert!(core.abort(launch.generation));
    assert!(
        launch.cancel.0.load(Ordering::SeqCst),
        "the signal made with the generation fires"
    );
}
