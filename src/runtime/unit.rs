//! The unit trait: the user code a task runs, one pipeline step at a time.

use std::fmt;
use std::future::Future;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::shared::RunSignals;
use crate::error::RunError;
use crate::sync::{lock, Arc, Mutex};

/// How a run ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunExit {
    /// The unit's work is complete; the pipeline moves to the next unit.
    Completed,
    /// The run stopped early because its cancellation token was cancelled.
    ///
    /// Return this only when cancelled: a run that reports cancellation nobody asked
    /// for is recorded as a failure.
    Cancelled,
}

/// How far a unit has got, as it last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Items done.
    pub done: u64,
    /// Items in all, when known.
    pub total: Option<u64>,
}

/// The latest progress of a task, shared between its runs and its handles.
///
/// Progress is not a stage change (it has no sequence number and no event), but it is
/// a change a waiter can wait on: every report wakes the waits of
/// [`Handle::wait_for`](crate::Handle::wait_for).
#[derive(Debug, Default)]
pub(crate) struct ProgressCell {
    /// The unit that reported last, its progress, and how many reports the task's
    /// units have made in all (the testing kit counts them: two reports between two
    /// polls are two).
    latest: Mutex<(usize, Progress, u64)>,
    changed: tokio::sync::Notify,
}

impl ProgressCell {
    pub(crate) fn set(&self, unit: usize, progress: Progress) {
        {
            let mut latest = lock(&self.latest);
            let reports = latest.2.wrapping_add(1);
            *latest = (unit, progress, reports);
        }
        // After the store, with our lock released: a waiter enabled before it reads
        // the state is woken, and one enabled after it reads the new value.
        self.changed.notify_waiters();
    }

    /// A future that completes at the next report; enable it before reading the state.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    pub(crate) fn get(&self, unit: usize) -> Progress {
        let (at, progress, _) = *lock(&self.latest);
        if at == unit {
            progress
        } else {
            Progress::default()
        }
    }

    /// How many reports the task's units have made so far.
    #[cfg(feature = "testing")]
    pub(crate) fn reports(&self) -> u64 {
        lock(&self.latest).2
    }
}

/// What a run (or a pre-start check) is told about itself.
///
/// Cheap to clone.
pub struct RunContext<C = ()> {
    pub(crate) signals: RunSignals,
    pub(crate) resume: bool,
    pub(crate) generation: u64,
    pub(crate) unit: usize,
    pub(crate) config: Arc<C>,
    pub(crate) progress: Arc<ProgressCell>,
}

impl<C> Clone for RunContext<C> {
    fn clone(&self) -> Self {
        RunContext {
            signals: self.signals.clone(),
            resume: self.resume,
            generation: self.generation,
            unit: self.unit,
            config: Arc::clone(&self.config),
            progress: Arc::clone(&self.progress),
        }
    }
}

impl<C> fmt::Debug for RunContext<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("cancelled", &self.is_cancelled())
            .field("resume", &self.resume)
            .field("generation", &self.generation)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

impl<C> RunContext<C> {
    /// The token a pause or a stop cancels. Select on it, or pass it down.
    pub fn token(&self) -> &CancellationToken {
        self.signals.token()
    }

    /// Completes when the run is asked to stop.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes the token.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token().cancelled()
    }

    /// Whether the run has been asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.token().is_cancelled()
    }

    /// Whether the unit ran before (this run resumes it) or not (a fresh start).
    pub fn is_resume(&self) -> bool {
        self.resume
    }

    /// The generation of this run: it increases with every run of the task.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The unit's index in the pipeline.
    pub fn unit_index(&self) -> usize {
        self.unit
    }

    /// The task's configuration, as it was when this run started.
    pub fn config(&self) -> &C {
        &self.config
    }

    /// The same context without the task's configuration, for a unit of `()`.
    pub(crate) fn without_config(self) -> RunContext<()> {
        RunContext {
            signals: self.signals,
            resume: self.resume,
            generation: self.generation,
            unit: self.unit,
            config: Arc::new(()),
            progress: self.progress,
        }
    }

    /// Publishes how far the unit has got; it shows in the task's snapshot
    /// ([`TaskSnapshot::progress`](crate::TaskSnapshot::progress)), and it wakes every
    /// [`Handle::wait_for`](crate::Handle::wait_for), so a wait on progress returns once
    /// the progress it waits for is reported. It is not a stage change: the event
    /// streams and [`Handle::subscribe`](crate::Handle::subscribe) do not carry it.
    pub fn report_progress(&self, done: u64, total: Option<u64>) {
        self.progress.set(self.unit, Progress { done, total });
    }
}

/// One step of a task's pipeline: user code that the lifecycle runs, pauses, resumes
/// and closes.
///
/// The unit value moves into the run's future and comes back when the run returns,
/// so two runs can never hold it at once.
///
/// `run` is awaited while the stage is Running. It should watch
/// [`RunContext::cancelled`] and return [`RunExit::Cancelled`] promptly when it fires;
/// it should make its progress durable (checkpoints) so that a later run with
/// [`RunContext::is_resume`] can continue.
///
/// # Examples
///
/// ```
/// use taskstage::{RunContext, RunError, RunExit, Unit};
///
/// struct Count {
///     upto: u64,
///     at: u64,
/// }
///
/// impl Unit for Count {
///     fn name(&self) -> &str {
///         "count"
///     }
///
///     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
///         while self.at < self.upto {
///             if ctx.is_cancelled() {
///                 return Ok(RunExit::Cancelled);
///             }
///             self.at += 1; // the checkpoint lives in the unit itself
///             ctx.report_progress(self.at, Some(self.upto));
///             tokio::task::yield_now().await;
///         }
///         Ok(RunExit::Completed)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let task = taskstage::Task::builder("count").unit(Count { upto: 3, at: 0 }).spawn()?;
/// let done = task.wait_for_stage(taskstage::Stage::is_terminal).await;
/// assert_eq!(done.stage, taskstage::Stage::Finished);
/// # Ok(())
/// # }
/// ```
pub trait Unit<C = ()>: Send + 'static {
    /// The unit's name, shown in snapshots and logs.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }

    /// One run of the unit. Returns when the work is complete, when cancelled, or on
    /// error. A panic is caught and recorded as an error outcome.
    fn run(&mut self, ctx: RunContext<C>)
        -> impl Future<Output = Result<RunExit, RunError>> + Send;

    /// The pre-start check, awaited while the stage is Resuming, before every run
    /// that follows a resume (including the first start). An error leaves the task
    /// Paused with that error.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: a pause or a stop during the check drops its future.
    fn prepare(&mut self, ctx: RunContext<C>) -> impl Future<Output = Result<(), RunError>> + Send {
        let _ = ctx;
        NoCheck
    }

    /// Applies a new configuration, before the unit's next check or run. It is called
    /// only while no run holds the unit; an error fails that check or run.
    fn apply_config(&mut self, config: &C) -> Result<(), RunError> {
        let _ = config;
        Ok(())
    }

    /// Releases the unit's resources: after it completed, or when the task stops.
    ///
    /// It never runs in the caller of a command or of a drop, and the stage stays
    /// Stopping until every close has returned. A stop of a task at rest (New,
    /// Paused) runs the closes on tokio's blocking pool, so they may block (a flush, a
    /// file sync); after a run (the unit completed, or a stop reached the live run)
    /// they run in that run's task, on a runtime thread, like the run itself.
    fn close(&mut self) {}
}

/// The check of a unit that has none: passes at once. Zero-sized, so the boxing that
/// every check goes through allocates nothing for it.
#[derive(Debug)]
struct NoCheck;

impl Future for NoCheck {
    type Output = Result<(), RunError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::task::Poll::Ready(Ok(()))
    }
}

pub(crate) use crate::lifecycle::driver::BoxFuture;

/// The object-safe form of [`Unit`], so a pipeline can hold units of different types.
pub(crate) trait DynUnit<C>: Send {
    fn name(&self) -> &str;
    fn run_boxed(&mut self, ctx: RunContext<C>) -> BoxFuture<'_, Result<RunExit, RunError>>;
    fn prepare_boxed(&mut self, ctx: RunContext<C>) -> BoxFuture<'_, Result<(), RunError>>;
    fn apply_config(&mut self, config: &C) -> Result<(), RunError>;
    fn close(&mut self);
}

impl<C, U> DynUnit<C> for U
where
    U: Unit<C>,
    C: Send + Sync + 'static,
{
    fn name(&self) -> &str {
        Unit::name(self)
    }

    fn run_boxed(&mut self, ctx: RunContext<C>) -> BoxFuture<'_, Result<RunExit, RunError>> {
        Box::pin(Unit::run(self, ctx))
    }

    fn prepare_boxed(&mut self, ctx: RunContext<C>) -> BoxFuture<'_, Result<(), RunError>> {
        Box::pin(Unit::prepare(self, ctx))
    }

    fn apply_config(&mut self, config: &C) -> Result<(), RunError> {
        Unit::apply_config(self, config)
    }

    fn close(&mut self) {
        Unit::close(self);
    }
}
