//! Building a task: its pipeline of units, its configuration and its deadlines.

use std::fmt;
use std::time::Duration;

use super::events::{Events, DEFAULT_EVENT_CAPACITY};
use super::handle::{Handle, DEFAULT_PAUSE_TIMEOUT, DEFAULT_STOP_GRACE};
use super::shared::new_task;
use super::unit::{DynUnit, RunContext, Unit};
use crate::error::BuildError;
use crate::lifecycle::driver::Driver;
use crate::stage::Command;
use crate::sync::Arc;

/// Builds a task: an ordered pipeline of units (dump → load → sync style).
///
/// Made by [`Task::builder`](crate::Task::builder).
pub struct TaskBuilder<C = ()> {
    name: String,
    units: Vec<Box<dyn DynUnit<C>>>,
    config: C,
    pause_timeout: Duration,
    stop_grace: Duration,
    event_capacity: usize,
}

impl<C> fmt::Debug for TaskBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskBuilder")
            .field("name", &self.name)
            .field(
                "units",
                &self.units.iter().map(|u| u.name()).collect::<Vec<_>>(),
            )
            .field("pause_timeout", &self.pause_timeout)
            .field("stop_grace", &self.stop_grace)
            .field("event_capacity", &self.event_capacity)
            .finish_non_exhaustive()
    }
}

impl TaskBuilder<()> {
    pub(crate) fn new(name: impl Into<String>) -> Self {
        TaskBuilder {
            name: name.into(),
            units: Vec::new(),
            config: (),
            pause_timeout: DEFAULT_PAUSE_TIMEOUT,
            stop_grace: DEFAULT_STOP_GRACE,
            event_capacity: DEFAULT_EVENT_CAPACITY,
        }
    }

    /// Gives the task a configuration of type `C`; the units added after it receive
    /// it through [`RunContext::config`](crate::RunContext::config) and
    /// [`Unit::apply_config`].
    ///
    /// Units added before it stay in the pipeline, in their place: they are units
    /// without a configuration (`Unit<()>`), so they run as they would in a task
    /// without one, and an [`update`](crate::Handle::update) does not concern them.
    /// The builder never drops a unit.
    pub fn config<C: Send + Sync + 'static>(self, config: C) -> TaskBuilder<C> {
        TaskBuilder {
            name: self.name,
            units: self
                .units
                .into_iter()
                .map(|unit| Box::new(Unconfigured(unit)) as Box<dyn DynUnit<C>>)
                .collect(),
            config,
            pause_timeout: self.pause_timeout,
            stop_grace: self.stop_grace,
            event_capacity: self.event_capacity,
        }
    }
}

impl<C: Send + Sync + 'static> TaskBuilder<C> {
    /// Appends a unit to the pipeline.
    pub fn unit<U: Unit<C>>(mut self, unit: U) -> Self {
        self.units.push(Box::new(unit));
        self
    }

    /// How long [`Handle::pause`] waits for the run to return (default 30 s).
    pub fn pause_timeout(mut self, timeout: Duration) -> Self {
        self.pause_timeout = timeout;
        self
    }

    /// How long [`Handle::stop`] (and dropping the last handle) lets a run wind down
    /// before aborting it (default 10 s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// How many changes, at most, the task keeps for its event streams (default
    /// 1,024): a reader of [`Handle::events`] that falls further behind is told how
    /// many it missed ([`Event::Lagged`](crate::Event::Lagged)). Only the changes some
    /// live stream has not read yet are kept: nothing while no stream exists, nothing
    /// once every stream has read everything.
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity.max(1);
        self
    }

    /// Spawns the task, subscribes to its events, then starts it: the stream sees
    /// every change from the first resume on, with no race against the start.
    ///
    /// # Errors
    ///
    /// As [`TaskBuilder::spawn`].
    pub fn spawn_with_events(self) -> Result<(Handle<C>, Events<C>), BuildError> {
        let handle = self.spawn_paused()?;
        let events = handle.events();
        let _ = Driver::command(handle.shared(), Command::Resume);
        Ok((handle, events))
    }

    /// Spawns the task on the current tokio runtime and starts it (stage Resuming,
    /// then Running).
    ///
    /// # Errors
    ///
    /// [`BuildError::EmptyPipeline`] when no unit was added;
    /// [`BuildError::NoRuntime`] outside a tokio runtime;
    /// [`BuildError::NoTimers`] on a runtime built without timers.
    pub fn spawn(self) -> Result<Handle<C>, BuildError> {
        let handle = self.spawn_paused()?;
        // A task in New always accepts resume (see the table), so there is no error
        // to report here.
        let _ = Driver::command(handle.shared(), Command::Resume);
        Ok(handle)
    }

    /// Spawns the task on the current tokio runtime without starting it: it stays in
    /// New until [`Handle::resume`].
    ///
    /// The stage is New, not Paused, although nothing runs: Paused says that a run
    /// returned (its outcome is kept, its unit's next run is a resume), and no run
    /// has happened yet; the first run after the resume is a fresh start
    /// ([`RunContext::is_resume`](crate::RunContext::is_resume) is false). A pause
    /// in New is refused ([`Refusal::NotStarted`](crate::Refusal::NotStarted)); a
    /// stop closes the units.
    ///
    /// # Errors
    ///
    /// As [`TaskBuilder::spawn`].
    pub fn spawn_paused(self) -> Result<Handle<C>, BuildError> {
        if self.units.is_empty() {
            return Err(BuildError::EmptyPipeline);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        if !timers_enabled() {
            return Err(BuildError::NoTimers);
        }
        let shared = Arc::new(new_task(self.name, self.units, self.config, runtime));
        Ok(Handle::new(
            shared,
            self.pause_timeout,
            self.stop_grace,
            self.event_capacity,
        ))
    }
}

/// A unit added before the configuration: it runs as a unit of `()`, and the task's
/// configuration does not concern it.
struct Unconfigured(Box<dyn DynUnit<()>>);

impl<C: Send + Sync + 'static> Unit<C> for Unconfigured {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn run(
        &mut self,
        ctx: RunContext<C>,
    ) -> impl std::future::Future<Output = Result<crate::RunExit, crate::RunError>> + Send {
        self.0.run_boxed(ctx.without_config())
    }

    fn prepare(
        &mut self,
        ctx: RunContext<C>,
    ) -> impl std::future::Future<Output = Result<(), crate::RunError>> + Send {
        self.0.prepare_boxed(ctx.without_config())
    }

    fn close(&mut self) {
        self.0.close();
    }
}

/// Whether the current tokio runtime has timers, which a task needs: a pause's wait is
/// bounded by one, and a stop aborts a run that ignores it after its grace period.
///
/// tokio has no query for it; making a sleep on a runtime without timers panics at
/// once, before anything is registered, so the probe catches that panic (tokio's
/// panic message, which says to call `enable_time`, is printed by the panic hook).
/// Under `panic = "abort"` a runtime without timers aborts here, at the spawn,
/// instead of at a later command.
fn timers_enabled() -> bool {
    std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}
