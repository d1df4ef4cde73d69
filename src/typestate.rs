//! The typestate API: a task owner whose type names its stage, so that invalid
//! commands do not compile.
//!
//! [`Task<S, C>`](Task) is a thin owner over one [`Handle`]. Its stage `S` is one of
//! the zero-sized markers in [`stages`], and only the commands that the transition
//! table accepts in that stage exist as methods: a `Task<Running>` can be paused or
//! stopped, never resumed or reconfigured; a `Task<Pausing>` can only be awaited or
//! stopped. Transitions consume `self`, so a task cannot be commanded again through
//! the value that claimed the old stage.
//!
//! # Examples
//!
//! ```
//! use taskstage::typestate::{AtRest, Started};
//! use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
//!
//! struct Mirror;
//!
//! impl Unit for Mirror {
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         ctx.cancelled().await; // copy rows here, checkpointing, until asked to stop
//!         Ok(RunExit::Cancelled)
//!     }
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Task<Resuming>: the start was accepted and the pre-start check runs.
//!     let task = Task::builder("mirror").unit(Mirror).spawn_typed()?;
//!     // The stage actually reached: Running, or Paused if the check failed, ...
//!     let Started::Running(task) = task.started().await else {
//!         return Err("the mirror did not start".into());
//!     };
//!     // `task.resume()` does not compile here: a run is alive.
//!     let task = match task.pause().await? {
//!         AtRest::Paused(task) => task, // the run has returned and been dropped
//!         other => return Err(format!("the run ended by itself: {}", other.stage()).into()),
//!     };
//!     let task = task.resume().await?; // Task<Resuming>: cannot start a second copy
//!     assert_eq!(task.stop().await?.stage(), Stage::Stopped);
//!     Ok(())
//! }
//! ```
//!
//! # Commands per stage
//!
//! | typed task | commands (methods) | result |
//! |---|---|---|
//! | `Task<New>` | [`start`](Task::start), [`update`](Task::update), [`stop`](Task::stop) | `Task<Resuming>`, `Task<New>`, [`Ended`] |
//! | `Task<Resuming>` | [`started`](Task::started), [`pause`](Task::pause), [`stop`](Task::stop) | [`Started`], [`AtRest`], [`Ended`] |
//! | `Task<Running>` | [`pause`](Task::pause), [`stop`](Task::stop), [`join`](Task::join) | [`AtRest`], [`Ended`], [`AtRest`] |
//! | `Task<Pausing>` | [`paused`](Task::paused), [`stop`](Task::stop) | [`AtRest`], [`Ended`] |
//! | `Task<Paused>` | [`resume`](Task::resume), [`update`](Task::update), [`hold`](Task::hold), [`stop`](Task::stop) | `Task<Resuming>`, `Task<Paused>`, [`AtRest`], [`Ended`] |
//! | `Task<Stopping>` | [`stop`](Task::stop) (waits for Stopped) | [`Ended`] |
//! | `Task<Stopped>`, `Task<Finished>` | none: terminal | |
//!
//! Every stage also has the observers [`Task::name`], [`Task::snapshot`],
//! [`Task::handle`], and the conversions [`Task::refresh`] and [`Task::into_handle`].
//!
//! # Honesty under races
//!
//! A typed task names the stage that was true when the value was made. The run's own
//! exit can overtake the transitional stages (Running, Resuming, Pausing, Stopping):
//! the unit completes or fails while you hold a `Task<Running>`. So a transition never
//! trusts `S`: it issues the command, looks at the stage the core actually reached, and
//! returns it as an enum of typed tasks ([`AtRest`], [`Ended`], [`Started`]). A pause
//! of a `Task<Running>` whose last unit has just completed returns
//! [`AtRest::Finished`], not an error and never a `Task<Paused>`.
//!
//! The stages at rest (New, Paused, Stopped, Finished) change only by a command. While
//! the typed owner is the only party commanding the task, a `Task<New>` or
//! `Task<Paused>` stays true until it is consumed. Commands issued through a clone of
//! the [`Handle`] (or by an auto-resume policy) can move any stage; the typed
//! transitions then still report what they met, and refuse with a [`TaskError`] that
//! gives the task back.
//!
//! # Errors give the task back
//!
//! A transition that fails returns a [`TaskError`]: the [`Error`] (a refusal or a
//! timeout, naming the command and the stage it met) together with the task, re-typed
//! from the stage it is in after the failure ([`AnyTask`]). No error loses the task:
//! a pause that times out hands back a `Task<Pausing>` to wait on or to stop.
//!
//! # Proofs that invalid commands do not compile
//!
//! `tests/ui/` holds one compile-fail case per forbidden command (resume on Running,
//! resume on Pausing, update on Running, pause on Paused, pause on New, use of a task
//! consumed by a transition, forging a task, implementing a stage marker), each with the
//! compiler's expected error. The same holds for these doc tests, which are only
//! checked to fail to compile (the error code is checked by `tests/ui/`):
//!
//! ```compile_fail,E0599
//! # use taskstage::{typestate::stages::Running, Task};
//! async fn f(task: Task<Running>) {
//!     let _ = task.resume().await; // a run is alive: there is no resume
//! }
//! ```
//!
//! ```compile_fail,E0382
//! # use taskstage::{typestate::stages::Paused, Task};
//! async fn f(task: Task<Paused>) {
//!     let _resuming = task.resume().await;
//!     let _ = task.stop().await; // `task` was moved by the resume
//! }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{BuildError, Error};
use crate::runtime::{Handle, StageEvent, TaskBuilder, TaskSnapshot};
use crate::stage::{Command, Stage};
use crate::sync::Arc;

/// Marker types for the stages a [`Task`] can be in.
///
/// They are uninhabited (no value of them exists) and sealed: [`StageMarker`] cannot
/// be implemented outside this crate, so `Task<S>` only ever names a real stage.
pub mod stages {
    use crate::stage::Stage;

    mod sealed {
        /// Keeps [`StageMarker`](super::StageMarker) closed to this crate.
        pub trait Sealed {}
    }

    /// A type that names one stage; implemented by the markers of this module only.
    pub trait StageMarker: sealed::Sealed + 'static {
        /// The stage the marker names.
        const STAGE: Stage;
    }

    macro_rules! markers {
        ($($(#[$doc:meta])* $name:ident,)*) => {$(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}

            impl sealed::Sealed for $name {}

            impl StageMarker for $name {
                const STAGE: Stage = Stage::$name;
            }
        )*};
    }

    markers! {
        /// Created, not started: no run has ever been alive.
        New,
        /// A run was alive when the task was typed.
        Running,
        /// A pause was accepted and the run had not returned yet.
        Pausing,
        /// No run alive: the last run returned (cancelled, or failed).
        Paused,
        /// A resume was accepted; the pre-start check runs, no run yet.
        Resuming,
        /// A stop was accepted and the run had not returned yet.
        Stopping,
        /// Terminal: stopped, units closed.
        Stopped,
        /// Terminal: every unit completed.
        Finished,
    }
}

use self::stages::{
    Finished, New, Paused, Pausing, Resuming, Running, StageMarker, Stopped, Stopping,
};

/// A task owner whose type names its stage.
///
/// `S` is a marker of [`stages`]; `C` is the task's configuration type. The marker is
/// held as `PhantomData<fn() -> S>`, so the auto traits do not depend on it:
/// `Task<S, C>` is `Send + Sync + Unpin` for every stage.
///
/// Dropping a task drops its handle; when that was the last handle, the task is
/// stopped (see [`Handle`]).
///
/// See the [module docs](self) for the commands of each stage and how the
/// transitions stay truthful when the run's own exit overtakes them.
#[must_use = "dropping the last owner of a task stops it"]
pub struct Task<S: StageMarker = New, C: Send + Sync + 'static = ()> {
    handle: Handle<C>,
    stage: PhantomData<fn() -> S>,
}

impl<S: StageMarker, C: Send + Sync + 'static> fmt::Debug for Task<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("typed", &S::STAGE)
            .field("handle", &self.handle)
            .finish()
    }
}

impl Task<New> {
    /// Starts building a task named `name`.
    ///
    /// [`TaskBuilder::spawn`] returns the shared [`Handle`];
    /// [`TaskBuilder::spawn_typed`] returns a typed owner instead.
    pub fn builder(name: impl Into<String>) -> TaskBuilder<()> {
        TaskBuilder::new(name)
    }
}

/// The typed owners' spawns: beside [`TaskBuilder::spawn`] and
/// [`TaskBuilder::spawn_paused`], which return the shared [`Handle`], so that every
/// way to spawn is spelled on the builder.
impl<C: Send + Sync + 'static> TaskBuilder<C> {
    /// Spawns the built task on the current tokio runtime and starts it, as
    /// [`TaskBuilder::spawn`] does, and returns its typed owner: the start is
    /// accepted, and its pre-start check runs. Wait with [`Task::started`] to see
    /// where it led.
    ///
    /// # Errors
    ///
    /// As [`TaskBuilder::spawn`].
    pub fn spawn_typed(self) -> Result<Task<Resuming, C>, BuildError> {
        self.spawn().map(Task::typed)
    }

    /// Spawns the built task without starting it (stage New), as
    /// [`TaskBuilder::spawn_paused`] does, and returns its typed owner.
    ///
    /// # Errors
    ///
    /// As [`TaskBuilder::spawn_paused`].
    pub fn spawn_typed_paused(self) -> Result<Task<New, C>, BuildError> {
        self.spawn_paused().map(Task::typed)
    }
}

/// Everything every stage has: observers and conversions.
impl<S: StageMarker, C: Send + Sync + 'static> Task<S, C> {
    /// Types `handle` as `S`. Callers make sure the claim was true at some instant
    /// (the core accepted a command into `S`, or the stage was read as `S`).
    fn typed(handle: Handle<C>) -> Self {
        Task {
            handle,
            stage: PhantomData,
        }
    }

    /// The stage this value was typed as (`S`). The live stage may have moved on;
    /// read it with [`Task::snapshot`].
    pub const fn typed_stage(&self) -> Stage {
        S::STAGE
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        self.handle.name()
    }

    /// The task's live state (which may already be past `S`).
    pub fn snapshot(&self) -> TaskSnapshot {
        self.handle.snapshot()
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<C> {
        self.handle.config()
    }

    /// A receiver of the task's latest stage change (see [`Handle::subscribe`]).
    pub fn subscribe(&self) -> watch::Receiver<StageEvent> {
        self.handle.subscribe()
    }

    /// The shared runtime handle, to observe the task (e.g. [`Handle::wait_for`]).
    ///
    /// Commands issued through it (or a clone of it) bypass the typestate: they are
    /// checked at run time only. The typed transitions stay truthful after them, since
    /// they report the stage the core reached, not `S`.
    pub fn handle(&self) -> &Handle<C> {
        &self.handle
    }

    /// Gives up the typed owner and returns the shared runtime handle.
    pub fn into_handle(self) -> Handle<C> {
        self.handle
    }

    /// Reads the stage now and returns the task typed as that stage.
    pub fn refresh(self) -> AnyTask<C> {
        AnyTask::from_handle(self.handle)
    }

    fn fail(self, error: Error) -> TaskError<C> {
        TaskError::new(error, self.handle)
    }

    fn retype<T: StageMarker>(self) -> Task<T, C> {
        Task::typed(self.handle)
    }
}

/// Issues a pause (or, in Pausing, waits for the one in progress) and types the stage
/// it settled in.
async fn pause_task<S: StageMarker, C: Send + Sync + 'static>(
    task: Task<S, C>,
    timeout: Option<Duration>,
) -> Result<AtRest<C>, TaskError<C>> {
    let result = match timeout {
        Some(timeout) => task.handle.pause_within(timeout).await,
        None => task.handle.pause().await,
    };
    match result {
        Ok(stage) => Ok(AtRest::reached(task.handle, stage)),
        // The task ended before the pause met it (its last unit completed, or another
        // party stopped it): a terminal stage is never left, so it is the stage the
        // pause reached.
        Err(Error::Refused { stage, .. }) if stage.is_terminal() => {
            Ok(AtRest::reached(task.handle, stage))
        }
        Err(error) => Err(task.fail(error)),
    }
}

/// Issues a stop (or, in Stopping, waits for the one in progress) and types the
/// terminal stage it reached.
async fn stop_task<S: StageMarker, C: Send + Sync + 'static>(
    task: Task<S, C>,
    grace: Option<Duration>,
) -> Result<Ended<C>, TaskError<C>> {
    let result = match grace {
        Some(grace) => task.handle.stop_within(grace).await,
        None => task.handle.stop().await,
    };
    match result {
        // A stop settles only in a terminal stage.
        Ok(stage) => Ok(Ended::reached(task.handle, stage)),
        Err(error) => Err(task.fail(error)),
    }
}

macro_rules! stop_methods {
    ($($stage:ident),*) => {$(
        impl<C: Send + Sync + 'static> Task<$stage, C> {
            /// Stops the task with the task's stop grace period (10 s by default). See
            /// [`Handle::stop_within`].
            ///
            /// # Errors
            ///
            /// As [`Task::stop_within`].
            ///
            /// # Cancel safety
            ///
            /// As [`Handle::stop_within`]; the future owns the task, and dropping it drops
            /// the task (which stops it if that was its last handle).
            #[must_use = "the task moves into the result; dropping the last owner stops it"]
            pub async fn stop(self) -> Result<Ended<C>, TaskError<C>> {
                stop_task(self, None).await
            }

            /// Stops the task: cancels its run (or pre-start check), waits up to
            /// `grace` for it to return, then aborts it; closes every unit.
            ///
            /// Returns the terminal stage reached: `Stopped`, or `Finished` when the
            /// last unit had completed before the stop met it.
            ///
            /// # Errors
            ///
            /// A [`TaskError`] holding [`Error::Timeout`] when even the aborted run has
            /// not gone within a second `grace` (a unit that blocks its thread); its
            /// task is then typed as it is, normally `Task<Stopping>`, on which
            /// [`stop`](Task::stop) waits again.
            ///
            /// # Cancel safety
            ///
            /// As [`Handle::stop_within`]; the future owns the task, and dropping it drops
            /// the task (which stops it if that was its last handle).
            #[must_use = "the task moves into the result; dropping the last owner stops it"]
            pub async fn stop_within(self, grace: Duration) -> Result<Ended<C>, TaskError<C>> {
                stop_task(self, Some(grace)).await
            }
        }
    )*};
}

stop_methods!(New, Running, Pausing, Paused, Resuming, Stopping);

macro_rules! pause_methods {
    ($($stage:ident),*) => {$(
        impl<C: Send + Sync + 'static> Task<$stage, C> {
            /// Pauses the task, waiting up to the task's pause timeout (30 s by
            /// default). See [`pause_within`](Task::pause_within).
            ///
            /// # Errors
            ///
            /// As [`pause_within`](Task::pause_within).
            ///
            /// # Cancel safety
            ///
            /// As [`Handle::pause_within`]; the future owns the task, and dropping it drops
            /// the task (which stops it if that was its last handle).
            #[must_use = "the task moves into the result; dropping the last owner stops it"]
            pub async fn pause(self) -> Result<AtRest<C>, TaskError<C>> {
                pause_task(self, None).await
            }

            /// Pauses the task and waits up to `timeout` until its run (or pre-start
            /// check) has returned and been dropped.
            ///
            /// Returns the stage actually reached: [`AtRest::Paused`];
            /// [`AtRest::Finished`] when the last unit completed before or as the pause
            /// met it; [`AtRest::Stopped`] when a stop overtook it. A run that failed
            /// before the pause met it is Paused already: the pause then marks it
            /// user-paused, and the outcome keeps the error.
            ///
            /// # Errors
            ///
            /// A [`TaskError`] that gives the task back:
            /// - [`Error::Timeout`] when the run has not returned within `timeout`; the
            ///   task comes back as it is, normally a `Task<Pausing>` (wait on it with
            ///   [`paused`](Task::paused), or [`stop`](Task::stop) it).
            /// - [`Error::Refused`] when another party's command moved the task to a
            ///   stage that refuses a pause (Stopping).
            ///
            /// # Cancel safety
            ///
            /// As [`Handle::pause_within`]; the future owns the task, and dropping it drops
            /// the task (which stops it if that was its last handle).
            #[must_use = "the task moves into the result; dropping the last owner stops it"]
            pub async fn pause_within(self, timeout: Duration) -> Result<AtRest<C>, TaskError<C>> {
                pause_task(self, Some(timeout)).await
            }
        }
    )*};
}

pause_methods!(Running, Resuming);

/// Issues `command` (a resume or an update) that is accepted or refused at once, and
/// types the accepted task as `T`.
fn accepted<S: StageMarker, T: StageMarker, C: Send + Sync + 'static>(
    task: Task<S, C>,
    result: Result<(), Error>,
) -> Result<Task<T, C>, TaskError<C>> {
    match result {
        Ok(()) => Ok(task.retype()),
        Err(error) => Err(task.fail(error)),
    }
}

macro_rules! update_method {
    ($($stage:ident),*) => {$(
        impl<C: Send + Sync + 'static> Task<$stage, C> {
            /// Replaces the task's configuration; units apply it before their next
            /// check or run (see [`Handle::update`]).
            ///
            /// # Errors
            ///
            /// A [`TaskError`] holding [`Error::Refused`] when another party's command
            /// moved the task out of this stage (a run holds the unit); the
            /// configuration is unchanged then, and the task comes back typed as it is.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: the command is complete at the first poll.
            #[must_use = "the task moves into the result; dropping the last owner stops it"]
            pub async fn update(self, config: C) -> Result<Task<$stage, C>, TaskError<C>> {
                let result = self.handle.update(config).await;
                accepted(self, result)
            }
        }
    )*};
}

update_method!(New, Paused);

impl<C: Send + Sync + 'static> Task<New, C> {
    /// Starts the task: its first unit's pre-start check runs (stage Resuming), then
    /// its first run. Returns once the start is accepted; wait with
    /// [`Task::started`] to see where it led.
    ///
    /// # Errors
    ///
    /// A [`TaskError`] holding [`Error::Refused`] when another party's command moved
    /// the task out of New.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the command is complete at the first poll.
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn start(self) -> Result<Task<Resuming, C>, TaskError<C>> {
        let result = self.handle.resume().await;
        accepted(self, result)
    }
}

impl<C: Send + Sync + 'static> Task<Paused, C> {
    /// Resumes the task: its current unit's pre-start check runs (stage Resuming),
    /// then a run is launched. Returns once the resume is accepted; wait with
    /// [`Task::started`] to see where it led.
    ///
    /// # Errors
    ///
    /// A [`TaskError`] holding [`Error::Refused`] when another party's command moved
    /// the task out of Paused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the command is complete at the first poll.
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn resume(self) -> Result<Task<Resuming, C>, TaskError<C>> {
        let result = self.handle.resume().await;
        accepted(self, result)
    }

    /// Keeps the task paused: the table's pause in Paused, which marks a task that a
    /// failed run left Paused as paused by the user, so that an auto-resume policy
    /// leaves it alone. (It is not called `pause`: there is no run to pause.)
    ///
    /// Returns the stage reached, [`AtRest::Paused`] unless another party's command
    /// had moved the task on (then as [`pause_within`](Task::pause_within)).
    ///
    /// # Errors
    ///
    /// As [`pause_within`](Task::pause_within), only after another party's command.
    ///
    /// # Cancel safety
    ///
    /// As [`Handle::pause`]; the future owns the task, and dropping it drops the task
    /// (which stops it if that was its last handle).
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn hold(self) -> Result<AtRest<C>, TaskError<C>> {
        pause_task(self, None).await
    }
}

impl<C: Send + Sync + 'static> Task<Running, C> {
    /// Waits until the task comes to rest without a command from this owner: its last
    /// unit completes ([`AtRest::Finished`]), a run fails ([`AtRest::Paused`], with
    /// the error as the outcome), or another party pauses or stops it. Completed units
    /// that have a successor do not end the wait: the next unit runs.
    ///
    /// # Cancel safety
    ///
    /// The wait only observes, but the future owns the task: dropping it drops the
    /// task (which stops it if that was its last handle). To bound the wait without
    /// losing the task, keep a clone of [`Task::handle`] or wait on the handle.
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn join(self) -> AtRest<C> {
        let snapshot = self.handle.wait_for_stage(Stage::is_at_rest).await;
        AtRest::reached(self.handle, snapshot.stage)
    }
}

impl<C: Send + Sync + 'static> Task<Resuming, C> {
    /// Waits until the stage leaves Resuming, and returns the stage seen then:
    /// [`Started::Running`] when the pre-start check passed and the run was launched;
    /// [`Started::Paused`] when the check failed (the outcome holds its error); a
    /// later stage when the run ended by itself, or another party's command moved the
    /// task, before this wait looked.
    ///
    /// # Cancel safety
    ///
    /// The wait only observes, but the future owns the task: dropping it drops the
    /// task (which stops it if that was its last handle). To bound the wait, use
    /// [`started_within`](Task::started_within), which gives the task back.
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn started(self) -> Started<C> {
        let snapshot = self
            .handle
            .wait_for_stage(|stage| stage != Stage::Resuming)
            .await;
        Started::reached(self.handle, snapshot.stage)
    }

    /// As [`started`](Task::started), waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// A [`TaskError`] holding [`Error::Timeout`] (command resume) when the pre-start
    /// check has not returned within `timeout`; the task comes back typed as it is,
    /// normally a `Task<Resuming>`.
    ///
    /// # Cancel safety
    ///
    /// The wait only observes, but the future owns the task: dropping it drops the
    /// task (which stops it if that was its last handle).
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn started_within(self, timeout: Duration) -> Result<Started<C>, TaskError<C>> {
        let left = self.handle.wait_for_stage(|stage| stage != Stage::Resuming);
        match tokio::time::timeout(timeout, left).await {
            Ok(snapshot) => Ok(Started::reached(self.handle, snapshot.stage)),
            Err(_) => {
                let error = Error::Timeout {
                    command: Command::Resume,
                    stage: self.handle.stage(),
                    waited: timeout,
                };
                Err(self.fail(error))
            }
        }
    }
}

impl<C: Send + Sync + 'static> Task<Pausing, C> {
    /// Waits for the pause in progress to settle, up to the task's pause timeout (30 s
    /// by default). See [`paused_within`](Task::paused_within).
    ///
    /// # Errors
    ///
    /// As [`paused_within`](Task::paused_within).
    ///
    /// # Cancel safety
    ///
    /// As [`Handle::pause_within`]; the future owns the task, and dropping it drops the
    /// task (which stops it if that was its last handle).
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn paused(self) -> Result<AtRest<C>, TaskError<C>> {
        pause_task(self, None).await
    }

    /// Waits up to `timeout` for the pause in progress to settle (the table's pause in
    /// Pausing), and returns the stage reached: [`AtRest::Paused`];
    /// [`AtRest::Finished`] when the cancelled run completed the last unit anyway;
    /// [`AtRest::Stopped`] when a stop overtook it.
    ///
    /// # Errors
    ///
    /// A [`TaskError`] holding [`Error::Timeout`] when the run still has not returned;
    /// the task comes back typed as it is, normally `Task<Pausing>` again.
    ///
    /// # Cancel safety
    ///
    /// As [`Handle::pause_within`]; the future owns the task, and dropping it drops the
    /// task (which stops it if that was its last handle).
    #[must_use = "the task moves into the result; dropping the last owner stops it"]
    pub async fn paused_within(self, timeout: Duration) -> Result<AtRest<C>, TaskError<C>> {
        pause_task(self, Some(timeout)).await
    }
}

/// A task typed as whatever stage it is in.
///
/// [`AnyTask::from_handle`] reads the stage once: the result is a snapshot. A run can
/// end by itself right after (a `Task<Running>` may already be Paused or Finished when
/// you command it), which is why the transitions of the transitional stages return the
/// stage they actually reached.
#[must_use = "dropping the last owner of a task stops it"]
pub enum AnyTask<C: Send + Sync + 'static = ()> {
    /// Created, not started.
    New(Task<New, C>),
    /// A run is alive.
    Running(Task<Running, C>),
    /// A pause is waiting for the run to return.
    Pausing(Task<Pausing, C>),
    /// No run alive; resumable.
    Paused(Task<Paused, C>),
    /// The pre-start check runs.
    Resuming(Task<Resuming, C>),
    /// A stop is waiting for the run to return.
    Stopping(Task<Stopping, C>),
    /// Terminal: stopped.
    Stopped(Task<Stopped, C>),
    /// Terminal: every unit completed.
    Finished(Task<Finished, C>),
}

/// Applies `$body` to the typed task inside any variant of the enum `$ty`.
macro_rules! each_variant {
    ($value:expr, $ty:ident, $task:ident => $body:expr, $($variant:ident),*) => {
        match $value {
            $($ty::$variant($task) => $body,)*
        }
    };
}

impl<C: Send + Sync + 'static> AnyTask<C> {
    /// Reads the task's stage now and types `handle` as that stage.
    pub fn from_handle(handle: Handle<C>) -> Self {
        match handle.stage() {
            Stage::New => AnyTask::New(Task::typed(handle)),
            Stage::Running => AnyTask::Running(Task::typed(handle)),
            Stage::Pausing => AnyTask::Pausing(Task::typed(handle)),
            Stage::Paused => AnyTask::Paused(Task::typed(handle)),
            Stage::Resuming => AnyTask::Resuming(Task::typed(handle)),
            Stage::Stopping => AnyTask::Stopping(Task::typed(handle)),
            Stage::Stopped => AnyTask::Stopped(Task::typed(handle)),
            Stage::Finished => AnyTask::Finished(Task::typed(handle)),
        }
    }

    /// The stage this value was typed as.
    pub fn stage(&self) -> Stage {
        each_variant!(self, AnyTask, t => t.typed_stage(),
            New, Running, Pausing, Paused, Resuming, Stopping, Stopped, Finished)
    }

    /// The shared runtime handle (see [`Task::handle`]).
    pub fn handle(&self) -> &Handle<C> {
        each_variant!(self, AnyTask, t => t.handle(),
            New, Running, Pausing, Paused, Resuming, Stopping, Stopped, Finished)
    }

    /// Gives up the typed owner and returns the shared runtime handle.
    pub fn into_handle(self) -> Handle<C> {
        each_variant!(self, AnyTask, t => t.into_handle(),
            New, Running, Pausing, Paused, Resuming, Stopping, Stopped, Finished)
    }

    /// Reads the stage again and re-types the task.
    pub fn refresh(self) -> Self {
        AnyTask::from_handle(self.into_handle())
    }
}

impl<S: StageMarker, C: Send + Sync + 'static> From<Task<S, C>> for Handle<C> {
    /// The typed owner's handle: so a [`TaskGroup`](crate::TaskGroup) or an
    /// [`AutoResume`](crate::policy::AutoResume) accepts a typed owner wherever it
    /// accepts a handle.
    fn from(task: Task<S, C>) -> Self {
        task.into_handle()
    }
}

impl<S: StageMarker, C: Send + Sync + 'static> AsRef<Handle<C>> for Task<S, C> {
    fn as_ref(&self) -> &Handle<C> {
        &self.handle
    }
}

impl<C: Send + Sync + 'static> AsRef<Handle<C>> for AnyTask<C> {
    fn as_ref(&self) -> &Handle<C> {
        self.handle()
    }
}

impl<C: Send + Sync + 'static> From<AnyTask<C>> for Handle<C> {
    fn from(task: AnyTask<C>) -> Self {
        task.into_handle()
    }
}

impl<C: Send + Sync + 'static> From<Handle<C>> for AnyTask<C> {
    fn from(handle: Handle<C>) -> Self {
        AnyTask::from_handle(handle)
    }
}

macro_rules! into_any {
    ($($stage:ident),*) => {$(
        impl<C: Send + Sync + 'static> From<Task<$stage, C>> for AnyTask<C> {
            fn from(task: Task<$stage, C>) -> Self {
                AnyTask::$stage(task)
            }
        }
    )*};
}

into_any!(New, Running, Pausing, Paused, Resuming, Stopping, Stopped, Finished);

/// Declares an enum of typed tasks over some stages, with its accessors.
macro_rules! stage_enum {
    (
        $(#[$doc:meta])*
        $name:ident { $($(#[$vdoc:meta])* $variant:ident,)* }
    ) => {
        $(#[$doc])*
        #[must_use = "dropping the last owner of a task stops it"]
        pub enum $name<C: Send + Sync + 'static = ()> {
            $($(#[$vdoc])* $variant(Task<$variant, C>),)*
        }

        impl<C: Send + Sync + 'static> $name<C> {
            /// The stage reached.
            pub fn stage(&self) -> Stage {
                each_variant!(self, $name, t => t.typed_stage(), $($variant),*)
            }

            /// The shared runtime handle (see [`Task::handle`]).
            pub fn handle(&self) -> &Handle<C> {
                each_variant!(self, $name, t => t.handle(), $($variant),*)
            }

            /// The same task as an [`AnyTask`], typed as the stage reached.
            pub fn into_any(self) -> AnyTask<C> {
                each_variant!(self, $name, t => AnyTask::from(t), $($variant),*)
            }

            /// Gives up the typed owner and returns the shared runtime handle.
            pub fn into_handle(self) -> Handle<C> {
                each_variant!(self, $name, t => t.into_handle(), $($variant),*)
            }

            /// Types `handle` as `stage`, a stage this enum can hold.
            ///
            /// # Panics
            ///
            /// If and only if `stage` is not one of the enum's stages: callers pass
            /// the stage a command settled in, which the table confines to these.
            fn reached(handle: Handle<C>, stage: Stage) -> Self {
                match stage {
                    $(Stage::$variant => $name::$variant(Task::typed(handle)),)*
                    other => panic!(
                        concat!("{} cannot be reached here (", stringify!($name), ")"),
                        other
                    ),
                }
            }
        }

        impl<C: Send + Sync + 'static> From<$name<C>> for AnyTask<C> {
            fn from(reached: $name<C>) -> Self {
                reached.into_any()
            }
        }

        impl<C: Send + Sync + 'static> fmt::Debug for $name<C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name))
                    .field(&self.stage())
                    .field(self.handle())
                    .finish()
            }
        }
    };
}

stage_enum! {
    /// Where a pause (or a run left alone, see [`Task::join`]) came to rest.
    AtRest {
        /// No run alive: cancelled by the pause, or failed (the outcome says which).
        Paused,
        /// Terminal: a stop overtook the pause.
        Stopped,
        /// Terminal: the last unit completed before, or as, the pause met it.
        Finished,
    }
}

stage_enum! {
    /// Where a stop ended: a terminal stage.
    Ended {
        /// Stopped: the run returned (or was aborted and dropped), units closed.
        Stopped,
        /// Finished: the last unit had completed before the stop met it.
        Finished,
    }
}

stage_enum! {
    /// Where a start or resume led once the stage left Resuming (see [`Task::started`]).
    Started {
        /// The check passed and a run is alive.
        Running,
        /// Another party paused the task and the run has not returned yet.
        Pausing,
        /// The check failed (the outcome holds the error), or the run already
        /// failed, or another party paused it.
        Paused,
        /// Another party stopped the task and the run has not returned yet.
        Stopping,
        /// Another party stopped the task.
        Stopped,
        /// The run completed the last unit before this wait looked.
        Finished,
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for AnyTask<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnyTask")
            .field(&self.stage())
            .field(self.handle())
            .finish()
    }
}

/// A failed transition: the error, and the task given back.
///
/// The task is typed from the stage it is in after the failure (read then), so it is
/// never lost and never claims a stage it is not in: a pause that timed out gives
/// back a `Task<Pausing>`, a refused command gives back the task as another party's
/// command left it.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct TaskError<C: Send + Sync + 'static = ()> {
    error: Error,
    task: AnyTask<C>,
}

impl<C: Send + Sync + 'static> TaskError<C> {
    fn new(error: Error, handle: Handle<C>) -> Self {
        TaskError {
            error,
            task: AnyTask::from_handle(handle),
        }
    }

    /// The error: a refusal or a timeout, naming the command and the stage it met.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The task, typed as the stage it was in right after the failure.
    pub fn task(&self) -> &AnyTask<C> {
        &self.task
    }

    /// Takes the task back.
    pub fn into_task(self) -> AnyTask<C> {
        self.task
    }

    /// Splits into the error and the task.
    pub fn into_parts(self) -> (Error, AnyTask<C>) {
        (self.error, self.task)
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for TaskError<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskError")
            .field("error", &self.error)
            .field("task", &self.task.stage())
            .finish()
    }
}
