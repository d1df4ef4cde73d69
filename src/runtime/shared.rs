//! The state a task's handles and its spawned runs share, and the one place where
//! the core's effects are carried out.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::catch::CatchUnwind;
use super::unit::{DynUnit, ProgressCell, RunContext, RunExit};
use super::StageEvent;
use crate::error::RunError;
use crate::lifecycle::{Applied, Lifecycle, Start, StartKind, Transition};
use crate::outcome::Exit;
use crate::sync::{lock, Arc, AtomicBool, Mutex, Ordering};

pub(crate) type Core<C> = Lifecycle<CancellationToken, C>;

/// A unit's place in the pipeline. `unit` is `None` while a run or a pre-start check
/// holds it (and forever, if that run was aborted).
pub(crate) struct Slot<C> {
    pub(crate) unit: Option<Box<dyn DynUnit<C>>>,
    /// The configuration the unit last applied (compared by pointer).
    pub(crate) applied: Arc<C>,
    pub(crate) closed: bool,
}

/// The latest stage change, and the channel that carries it once somebody subscribed
/// (most tasks are never subscribed to, so the channel is not made for them).
#[derive(Debug)]
struct Events {
    latest: StageEvent,
    sender: Option<watch::Sender<StageEvent>>,
}

/// The abort handle of the task's newest spawned run or check.
#[derive(Debug, Default)]
struct Live {
    generation: u64,
    abort: Option<AbortHandle>,
    /// An abort asked for before the run's handle was installed.
    abort_requested: Option<u64>,
}

pub(crate) struct Shared<C> {
    pub(crate) core: Core<C>,
    pub(crate) name: String,
    pub(crate) unit_names: Vec<String>,
    pub(crate) slots: Mutex<Vec<Slot<C>>>,
    pub(crate) progress: Arc<ProgressCell>,
    live: Mutex<Live>,
    /// The latest stage change, and its channel once somebody subscribed.
    events: Mutex<Events>,
    /// Set once every unit of a stopped task has been closed; `closed_notify` wakes
    /// the stops waiting for it.
    closed: AtomicBool,
    closed_notify: Notify,
    runtime: tokio::runtime::Handle,
    pub(crate) span: tracing::Span,
}

impl<C: Send + Sync + 'static> Shared<C> {
    pub(crate) fn new(
        core: Core<C>,
        name: String,
        units: Vec<Box<dyn DynUnit<C>>>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let config = core.config();
        let unit_names = units.iter().map(|u| u.name().to_owned()).collect();
        let slots = units
            .into_iter()
            .map(|unit| Slot {
                unit: Some(unit),
                applied: Arc::clone(&config),
                closed: false,
            })
            .collect();
        let span = tracing::info_span!("task", task = %name);
        Shared {
            core,
            name,
            unit_names,
            slots: Mutex::new(slots),
            progress: Arc::new(ProgressCell::default()),
            live: Mutex::new(Live::default()),
            events: Mutex::new(Events {
                latest: StageEvent::initial(),
                sender: None,
            }),
            closed: AtomicBool::new(false),
            closed_notify: Notify::new(),
            runtime,
            span,
        }
    }

    /// Carries out the effects of one accepted input. Called with no lock held.
    ///
    /// Subscribers are told last, so a subscriber that sees a change also sees its
    /// effects done (for Stopped: every unit closed).
    pub(crate) fn carry_out(self: &Arc<Self>, applied: Applied<CancellationToken, C>) {
        if let Some(token) = applied.cancel {
            token.cancel();
        }
        if let Some(index) = applied.closed_unit {
            self.close_unit(index);
        }
        if let Some(start) = applied.start {
            self.start(start);
        }
        if let Some(range) = applied.close_units {
            for index in range {
                self.close_unit(index);
            }
            // Release: pairs with the Acquire in `units_closed`, so a stop that sees
            // the flag also sees every `close` done.
            self.closed.store(true, Ordering::Release);
            self.closed_notify.notify_waiters();
        }
        if let Some(transition) = applied.transition {
            self.publish(transition);
        }
    }

    fn publish(&self, t: Transition) {
        tracing::info!(
            parent: &self.span,
            from = %t.from,
            to = %t.to,
            generation = t.generation,
            cause = t.cause.label(),
            "transition"
        );
        // Effects are carried out after the core's lock is released, so two
        // transitions can reach this point out of order; the sequence number keeps
        // subscribers from ever going back to an older stage.
        let event = StageEvent::from(t);
        let sender = {
            let mut events = lock(&self.events);
            if event.seq <= events.latest.seq {
                return;
            }
            events.latest = event;
            events.sender.clone()
        };
        // Sent with our lock released: waking a subscriber runs its waker, which is
        // not ours. The channel's own lock orders racing sends; the sequence check
        // keeps the newest.
        if let Some(sender) = sender {
            sender.send_if_modified(|current| {
                let newer = event.seq > current.seq;
                if newer {
                    *current = event;
                }
                newer
            });
        }
    }

    /// A receiver of the latest stage change. The channel is made on the first
    /// subscription, from the latest change, under the same lock `publish` takes, so
    /// no change falls between the two.
    pub(crate) fn subscribe(&self) -> watch::Receiver<StageEvent> {
        let mut events = lock(&self.events);
        let latest = events.latest;
        events
            .sender
            .get_or_insert_with(|| watch::Sender::new(latest))
            .subscribe()
    }

    /// Waits until every unit of the stopped task has been closed.
    pub(crate) async fn units_closed(&self) {
        loop {
            let notified = self.closed_notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is checked, so a store in between wakes it.
            notified.as_mut().enable();
            // Acquire: see the store in `carry_out`.
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn close_unit(&self, index: usize) {
        let unit = {
            let mut slots = lock(&self.slots);
            match slots.get_mut(index) {
                Some(slot) if !slot.closed => {
                    slot.closed = true;
                    slot.unit.take()
                }
                _ => None,
            }
        };
        if let Some(mut unit) = unit {
            // User code, with no lock held. A panic in `close` is logged, not spread.
            if catch_unwind(AssertUnwindSafe(|| unit.close())).is_err() {
                tracing::error!(parent: &self.span, unit = index, "close panicked");
            }
        }
    }

    fn start(self: &Arc<Self>, start: Start<CancellationToken, C>) {
        let (unit, apply) = {
            let mut slots = lock(&self.slots);
            match slots.get_mut(start.unit) {
                Some(slot) => {
                    let apply = (!Arc::ptr_eq(&slot.applied, &start.config))
                        .then(|| Arc::clone(&start.config));
                    (slot.unit.take(), apply)
                }
                None => (None, None),
            }
        };
        let generation = start.generation;
        let task = run_task(Arc::clone(self), start, unit, apply);
        let join = self
            .runtime
            .spawn(tracing::Instrument::instrument(task, self.span.clone()));
        self.install_abort(generation, join.abort_handle());
    }

    fn install_abort(&self, generation: u64, handle: AbortHandle) {
        let mut live = lock(&self.live);
        let abort_now = live.abort_requested == Some(generation);
        live.generation = generation;
        live.abort = Some(handle.clone());
        drop(live);
        if abort_now {
            handle.abort();
        }
    }

    /// Aborts the run (or check) of `generation`, now if it is spawned, or as soon as
    /// it is. Its future is then dropped and its exit guard reports it as cancelled.
    pub(crate) fn abort_generation(&self, generation: u64) {
        let mut live = lock(&self.live);
        live.abort_requested = Some(generation);
        let handle = (live.generation == generation)
            .then(|| live.abort.clone())
            .flatten();
        drop(live);
        if let Some(handle) = handle {
            handle.abort();
        }
    }

    /// Puts a unit back into its slot after a run or check returned.
    fn return_unit(&self, index: usize, unit: Box<dyn DynUnit<C>>, applied: Option<Arc<C>>) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get_mut(index) {
            slot.unit = Some(unit);
            if let Some(config) = applied {
                slot.applied = config;
            }
        }
    }

    pub(crate) fn spawn_detached<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        drop(self.runtime.spawn(future));
    }
}

/// Reports a cancelled exit if the task's future is dropped before it reported
/// (aborted after a stop's grace period, or dropped by a runtime shutting down).
struct ExitGuard<C: Send + Sync + 'static> {
    shared: Arc<Shared<C>>,
    kind: StartKind,
    generation: u64,
    armed: bool,
}

impl<C: Send + Sync + 'static> ExitGuard<C> {
    fn report(mut self, exit: Exit) {
        self.armed = false;
        let applied = match self.kind {
            StartKind::Prepare => self.shared.core.report_prepared(self.generation, exit),
            StartKind::Launch => self.shared.core.report_exit(self.generation, exit),
        };
        self.shared.carry_out(applied);
    }
}

impl<C: Send + Sync + 'static> Drop for ExitGuard<C> {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            let applied = match self.kind {
                StartKind::Prepare => self
                    .shared
                    .core
                    .report_prepared(self.generation, Exit::Cancelled),
                StartKind::Launch => self
                    .shared
                    .core
                    .report_exit(self.generation, Exit::Cancelled),
            };
            self.shared.carry_out(applied);
        }
    }
}

/// The spawned future of one pre-start check or one run.
///
/// When a check passes and the core answers with the launch of the same generation,
/// the run continues in this task with the unit it already holds: one spawn per
/// resume instead of two.
async fn run_task<C: Send + Sync + 'static>(
    shared: Arc<Shared<C>>,
    mut start: Start<CancellationToken, C>,
    unit: Option<Box<dyn DynUnit<C>>>,
    apply: Option<Arc<C>>,
) {
    // Declared first, so that if this future is dropped half-way the guard is dropped
    // last: its report then follows the drop of the unit and of the run's future
    // (invariant 2).
    let mut guard = ExitGuard {
        shared: Arc::clone(&shared),
        kind: start.kind,
        generation: start.generation,
        armed: true,
    };
    let Some(mut unit) = unit else {
        guard.report(Exit::Failed(RunError::msg(format!(
            "unit {} is gone: an earlier run of it was aborted",
            start.unit
        ))));
        return;
    };
    let mut applied = None;
    let mut early_exit = match apply {
        Some(config) => match catch_unwind(AssertUnwindSafe(|| unit.apply_config(&config))) {
            Ok(Ok(())) => {
                applied = Some(config);
                None
            }
            Ok(Err(error)) => Some(Exit::Failed(error)),
            Err(payload) => Some(Exit::Failed(RunError::from_panic(&*payload))),
        },
        None => None,
    };
    loop {
        let ctx = RunContext {
            cancel: start.cancel.clone(),
            resume: start.resume,
            generation: start.generation,
            unit: start.unit,
            config: Arc::clone(&start.config),
            progress: Arc::clone(&shared.progress),
        };
        let exit = match early_exit.take() {
            Some(exit) => exit,
            None => match start.kind {
                StartKind::Prepare => {
                    let check = CatchUnwind::new(unit.prepare_boxed(ctx));
                    // A pause or stop during the check drops it at once (fast quit).
                    tokio::select! {
                        biased;
                        () = start.cancel.cancelled() => Exit::Cancelled,
                        result = check => match result {
                            Ok(Ok(())) => Exit::Ok,
                            Ok(Err(error)) => Exit::Failed(error),
                            Err(payload) => Exit::Failed(RunError::from_panic(&*payload)),
                        },
                    }
                }
                StartKind::Launch => match CatchUnwind::new(unit.run_boxed(ctx)).await {
                    Ok(Ok(RunExit::Completed)) => Exit::Ok,
                    Ok(Ok(RunExit::Cancelled)) => Exit::Cancelled,
                    Ok(Err(error)) => Exit::Failed(error),
                    Err(payload) => Exit::Failed(RunError::from_panic(&*payload)),
                },
            },
        };
        // The check's or run's future has been dropped by now (a temporary of the
        // match above).
        if start.kind == StartKind::Prepare && matches!(exit, Exit::Ok) {
            // No await from here to the re-armed guard, so this future cannot be
            // dropped while the launch is unreported.
            guard.armed = false;
            let mut next = shared.core.report_prepared(start.generation, Exit::Ok);
            match next.start.take() {
                Some(launch)
                    if launch.kind == StartKind::Launch
                        && launch.generation == start.generation
                        && launch.unit == start.unit =>
                {
                    guard.kind = StartKind::Launch;
                    guard.armed = true;
                    shared.carry_out(next);
                    start = launch;
                    continue;
                }
                other => {
                    next.start = other;
                    shared.return_unit(start.unit, unit, applied);
                    shared.carry_out(next);
                    return;
                }
            }
        }
        // The unit goes back to its slot before the exit is reported, so the stage
        // that the report publishes finds it there.
        shared.return_unit(start.unit, unit, applied);
        guard.report(exit);
        return;
    }
}
