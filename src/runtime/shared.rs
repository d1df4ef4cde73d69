//! What the tokio layer plugs into the driver: the run signals, the unit adapter, and
//! the runtime (spawning, subscribers, logs).
//!
//! The protocol itself (hand-off of units, closes, aborts, exit reports) is the
//! driver's, in `lifecycle::driver`, which the loom models run; nothing here decides
//! or orders a transition.

use std::future::Future;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::unit::{DynUnit, ProgressCell, RunContext, RunExit};
use super::StageEvent;
use crate::error::RunError;
use crate::lifecycle::driver::{BoxFuture, Driver, RunInfo, Runtime, Work};
use crate::lifecycle::signal::{self, RunSignal};
use crate::lifecycle::{CancelHandle, Interrupt, Lifecycle, Transition};
use crate::outcome::Exit;
use crate::sync::{lock, Arc, Mutex};

/// The signals of one generation: the token the unit sees, and the driver's signal
/// (its abort, and the cancel a pre-start check quits on), which only the driver's
/// race listens to, so it is two bits and a waker slot rather than more tokens.
///
/// Shared behind one `Arc`: a generation's signals are cloned for its start, for the
/// cancel a pause carries out, and for each context a unit is given, and cloning a
/// `CancellationToken` itself takes the lock of its tree node (twice, with the drop).
#[derive(Debug, Clone)]
pub(crate) struct RunSignals(Arc<Signals>);

#[derive(Debug)]
pub(crate) struct Signals {
    cancel: CancellationToken,
    driver: RunSignal,
}

impl CancelHandle for RunSignals {
    fn new_handle() -> Self {
        RunSignals(Arc::new(Signals {
            cancel: CancellationToken::new(),
            driver: RunSignal::new(),
        }))
    }

    fn cancel(&self) {
        self.0.driver.raise(signal::CANCEL);
        self.0.cancel.cancel();
    }

    fn abort(&self) {
        self.0.driver.raise(signal::ABORT);
    }

    fn interrupted(&self, on_cancel: bool) -> impl Future<Output = Interrupt> + Send + '_ {
        self.0.driver.interrupted(on_cancel)
    }
}

impl RunSignals {
    /// The token the unit sees.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.0.cancel
    }
}

/// A user's unit in its slot, with the configuration it last applied.
pub(crate) struct Held<C> {
    unit: Box<dyn DynUnit<C>>,
    /// The configuration the unit last applied (compared by pointer).
    applied: Arc<C>,
    progress: Arc<ProgressCell>,
}

impl<C: Send + Sync + 'static> Work<RunSignals, C> for Held<C> {
    fn apply_config(&mut self, config: &Arc<C>) -> Result<(), RunError> {
        if Arc::ptr_eq(&self.applied, config) {
            return Ok(());
        }
        self.unit.apply_config(config)?;
        self.applied = Arc::clone(config);
        Ok(())
    }

    type Prepare<'a> = BoxFuture<'a, Result<(), RunError>>;
    type Run<'a> = RunOutcome<'a>;

    fn prepare<'a>(&'a mut self, info: RunInfo<'a, RunSignals, C>) -> Self::Prepare<'a> {
        let ctx = self.context(&info);
        self.unit.prepare_boxed(ctx)
    }

    fn run<'a>(&'a mut self, info: RunInfo<'a, RunSignals, C>) -> Self::Run<'a> {
        let ctx = self.context(&info);
        RunOutcome(self.unit.run_boxed(ctx))
    }

    fn close(&mut self) {
        self.unit.close();
    }
}

/// A unit's run, read as the driver's [`Exit`] (no second allocation).
pub(crate) struct RunOutcome<'a>(BoxFuture<'a, Result<RunExit, RunError>>);

impl Future for RunOutcome<'_> {
    type Output = Exit;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Exit> {
        self.0.as_mut().poll(cx).map(|result| match result {
            Ok(RunExit::Completed) => Exit::Ok,
            Ok(RunExit::Cancelled) => Exit::Cancelled,
            Err(error) => Exit::Failed(error),
        })
    }
}

impl<C> Held<C> {
    fn context(&self, info: &RunInfo<'_, RunSignals, C>) -> RunContext<C> {
        RunContext {
            signals: info.cancel.clone(),
            resume: info.resume,
            generation: info.generation,
            unit: info.unit,
            config: Arc::clone(info.config),
            progress: Arc::clone(&self.progress),
        }
    }
}

/// The latest stage change, and the channel that carries it once somebody subscribed
/// (most tasks are never subscribed to, so the channel is not made for them).
#[derive(Debug)]
struct Events {
    latest: StageEvent,
    sender: Option<watch::Sender<StageEvent>>,
    /// Moved with `latest`, under the same lock, so the gauges follow the newest
    /// change in the core's order, whichever thread publishes it.
    gauges: super::metrics::TaskGauges,
}

/// The tokio runtime of one task, and what its handles show besides the core's state.
pub(crate) struct Tokio {
    pub(crate) name: std::sync::Arc<str>,
    pub(crate) unit_names: Vec<std::sync::Arc<str>>,
    pub(crate) progress: Arc<ProgressCell>,
    events: Mutex<Events>,
    runtime: tokio::runtime::Handle,
    pub(crate) span: tracing::Span,
}

impl std::fmt::Debug for Tokio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokio")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A task under tokio.
pub(crate) type Shared<C> = Driver<RunSignals, C, Held<C>, Tokio>;

/// Builds the shared state of a task in New.
pub(crate) fn new_task<C: Send + Sync + 'static>(
    name: String,
    units: Vec<Box<dyn DynUnit<C>>>,
    config: C,
    runtime: tokio::runtime::Handle,
) -> Shared<C> {
    let config = Arc::new(config);
    let progress = Arc::new(ProgressCell::default());
    let unit_names = units.iter().map(|u| u.name().into()).collect();
    let held = units
        .into_iter()
        .map(|unit| Held {
            unit,
            applied: Arc::clone(&config),
            progress: Arc::clone(&progress),
        })
        .collect();
    let span = tracing::info_span!("task", task = %name);
    let tokio = Tokio {
        name: name.into(),
        unit_names,
        progress,
        events: Mutex::new(Events {
            latest: StageEvent::initial(),
            sender: None,
            gauges: super::metrics::TaskGauges::created(),
        }),
        runtime,
        span,
    };
    Driver::new(Lifecycle::with_shared_config(held, config), tokio)
}

impl Runtime for Tokio {
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        // With no subscriber interested in the task's span, the run goes without it:
        // no span clone, no enter and exit on every poll, a smaller tokio task.
        if self.span.is_disabled() {
            drop(self.runtime.spawn(future));
        } else {
            drop(
                self.runtime
                    .spawn(tracing::Instrument::instrument(future, self.span.clone())),
            );
        }
    }

    fn spawn_closes<F: FnOnce() + Send + 'static>(&self, closes: F) {
        // The closes of a stop at rest, handed over by the caller of a command or a
        // drop. `close()` is synchronous user code that may block its thread (a
        // flush to a slow disk): tokio's blocking pool, never the caller's thread. A runtime shutting down drops `closes` uncalled, which still
        // closes the units (see `Runtime::spawn_closes`). The caller's tracing
        // dispatcher goes along (one `Arc` clone), so a subscriber set for a scope
        // (`with_default`) still sees the closes and the Stopped they lead to.
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        drop(
            self.runtime
                .spawn_blocking(move || tracing::dispatcher::with_default(&dispatch, closes)),
        );
    }

    fn refused(&self, error: &crate::error::Error) {
        super::metrics::refused(error.command(), error.stage());
    }

    fn retired(&self, _stage: crate::stage::Stage) {
        // The stage the gauges count the task in is their own (the newest published
        // change), not the core's: a change still on its way to `published` is
        // dropped with the task.
        lock(&self.events).gauges.retired();
    }

    fn published(&self, t: &Transition) {
        super::metrics::transition(t.from, t.to);
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
        let event = StageEvent::from(*t);
        let sender = {
            let mut events = lock(&self.events);
            if event.seq <= events.latest.seq {
                return;
            }
            events.latest = event;
            events.gauges.moved(event.stage);
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
}

impl Tokio {
    /// A receiver of the latest stage change. The channel is made on the first
    /// subscription, from the latest change, under the same lock `published` takes,
    /// so no change falls between the two.
    pub(crate) fn subscribe(&self) -> watch::Receiver<StageEvent> {
        let mut events = lock(&self.events);
        let latest = events.latest;
        events
            .sender
            .get_or_insert_with(|| watch::Sender::new(latest))
            .subscribe()
    }

    pub(crate) fn spawn_detached<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.runtime.spawn(future));
    }
}
