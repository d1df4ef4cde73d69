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

/// How many changes the journal holds (`None`: there is no journal).
fn journaled(core: &Lifecycle<Flag>) -> Option<usize> {
    lock(&core.state).journal.as_ref().map(Journal::len)
}

/// One reader of the journal, as an event stream holds it.
#[derive(Default)]
struct Reader {
    seen: u64,
    ended: bool,
    id: Option<u64>,
}

impl Reader {
    fn subscribe(core: &Lifecycle<Flag>) -> Self {
        let (seen, ended) = core.subscribe_changes(1024);
        Reader {
            seen,
            ended,
            id: None,
        }
    }

    fn read(&mut self, core: &Lifecycle<Flag>) -> Poll<Option<Event>> {
        let waker = Waker::from(StdArc::new(CountWakes::default()));
        let mut cx = Context::from_waker(&waker);
        core.poll_change(&mut self.seen, &mut self.ended, &mut self.id, &mut cx)
    }
}

/// A pause, its exit and a resume: three changes.
fn three_changes(core: &Lifecycle<Flag>) {
    let generation = core
        .command(Command::Pause)
        .unwrap()
        .transition
        .unwrap()
        .generation;
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    let _ = core.command(Command::Resume).unwrap();
}

#[test]
fn the_journal_keeps_only_the_changes_a_live_reader_has_not_read() {
    let (core, _launch) = running();
    let mut a = Reader::subscribe(&core);
    let mut b = Reader::subscribe(&core);
    three_changes(&core);
    assert_eq!(journaled(&core), Some(3));
    for _ in 0..3 {
        assert!(matches!(a.read(&core), Poll::Ready(Some(Event::Change(_)))));
    }
    assert!(a.read(&core).is_pending(), "a has read everything");
    assert_eq!(journaled(&core), Some(3), "b has read none of them");
    for _ in 0..2 {
        assert!(matches!(b.read(&core), Poll::Ready(Some(Event::Change(_)))));
    }
    assert_eq!(journaled(&core), Some(1), "only the one b has not read");
    core.forget_reader(b.id.take(), b.seen, b.ended);
    assert_eq!(journaled(&core), Some(0), "what a has read goes with b");
    core.forget_reader(a.id.take(), a.seen, a.ended);
    assert_eq!(journaled(&core), None, "no reader, no journal");
    // A change with no reader costs nothing; a new reader reads from now on.
    let generation = core.command(Command::Pause).unwrap().transition.unwrap().generation;
    assert_eq!(journaled(&core), None);
    let mut c = Reader::subscribe(&core);
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    match c.read(&core) {
        Poll::Ready(Some(Event::Change(change))) => assert_eq!(change.stage, Stage::Paused),
        other => panic!("expected the exit's change, got {other:?}"),
    }
    assert_eq!(journaled(&core), Some(0));
}

#[test]
fn a_reader_that_read_the_end_leaves_the_journal() {
    let (core, _launch) = running();
    let mut a = Reader::subscribe(&core);
    let mut b = Reader::subscribe(&core);
    let generation = core.command(Command::Stop).unwrap().transition.unwrap().generation;
    let _ = core.report_exit(generation, Exit::Cancelled, Some(()));
    let _ = core.report_closed(generation);
    assert_eq!(core.stage(), Stage::Stopped);
    while let Poll::Ready(Some(_)) = a.read(&core) {}
    assert!(a.ended, "a read the terminal stage");
    assert!(journaled(&core).is_some_and(|n| n > 0), "b has not read");
    while let Poll::Ready(Some(_)) = b.read(&core) {}
    assert!(b.ended);
    assert_eq!(journaled(&core), None, "both ended: no journal");
    // Dropping an ended reader leaves nothing to undo.
    core.forget_reader(a.id.take(), a.seen, a.ended);
    core.forget_reader(b.id.take(), b.seen, b.ended);
    assert_eq!(journaled(&core), None);
    // A reader made on a terminal task ends at once and never joined.
    let mut late = Reader::subscribe(&core);
    assert!(late.ended);
    assert!(matches!(late.read(&core), Poll::Ready(None)));
    core.forget_reader(late.id.take(), late.seen, late.ended);
    assert_eq!(journaled(&core), None);
}
