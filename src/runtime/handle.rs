//! The task handle: the async, cloneable way to command and observe one task.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;

use super::events::Events;
use super::shared::Shared;
use super::unit::Progress;
use super::StageEvent;
use crate::error::Error;
use crate::lifecycle::driver::Driver;
use crate::lifecycle::{Settle, Snapshot};
use crate::outcome::Outcome;
use crate::stage::{Command, Stage};
use crate::sync::{Arc, Weak};

/// How long [`Handle::pause`] waits for the run to return, unless told otherwise.
pub(crate) const DEFAULT_PAUSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Handle::stop`] lets the run wind down before aborting it.
pub(crate) const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// A handle to one supervised task.
///
/// `Clone + Send + Sync`: clones command the same task. When the last handle is
/// dropped the task is stopped: its run is cancelled (and aborted after the default
/// stop grace period, if it ignores cancellation) and its units are closed.
///
/// # Examples
///
/// ```
/// use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
///
/// struct Wait;
///
/// impl Unit for Wait {
///     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
///         ctx.cancelled().await;
///         Ok(RunExit::Cancelled)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let handle = Task::builder("wait").unit(Wait).spawn()?;
/// handle.wait_for_stage(|s| s == Stage::Running).await;
///
/// // Pause returns only once the run has really returned.
/// assert_eq!(handle.pause().await?, Stage::Paused);
/// assert!(handle.snapshot().user_paused);
///
/// handle.resume().await?;
/// assert_eq!(handle.stop().await?, Stage::Stopped);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the last handle stops the task"]
pub struct Handle<C: Send + Sync + 'static = ()> {
    /// The task's state, held directly so that a stage read is one pointer away from
    /// its atomic.
    shared: Arc<Shared<C>>,
    /// Counts the handles: the task stops when the last one goes.
    owner: Arc<Owner<C>>,
}

/// A handle that does not keep its task alive.
///
/// Made by [`Handle::downgrade`]. A supervisor that watches tasks (such as the
/// auto-resume policy) holds these, so that dropping the user's last [`Handle`] still
/// stops the task.
pub struct WeakHandle<C: Send + Sync + 'static = ()> {
    owner: Weak<Owner<C>>,
}

impl<C: Send + Sync + 'static> Clone for WeakHandle<C> {
    fn clone(&self) -> Self {
        WeakHandle {
            owner: Weak::clone(&self.owner),
        }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for WeakHandle<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakHandle")
            .field("alive", &(self.owner.strong_count() > 0))
            .finish()
    }
}

impl<C: Send + Sync + 'static> WeakHandle<C> {
    /// A full handle, if any [`Handle`] of the task is still alive.
    ///
    /// Dropping the returned handle stops the task if it has become the last one.
    pub fn upgrade(&self) -> Option<Handle<C>> {
        self.owner.upgrade().map(|owner| Handle {
            shared: Arc::clone(&owner.shared),
            owner,
        })
    }
}

/// Stops the task when the last handle goes.
struct Owner<C: Send + Sync + 'static> {
    shared: Arc<Shared<C>>,
    stop_grace: Duration,
    pause_timeout: Duration,
    event_capacity: usize,
}

impl<C: Send + Sync + 'static> Clone for Handle<C> {
    fn clone(&self) -> Self {
        Handle {
            shared: Arc::clone(&self.shared),
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<C: Send + Sync + 'static> AsRef<Handle<C>> for Handle<C> {
    fn as_ref(&self) -> &Handle<C> {
        self
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for Handle<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("name", &self.shared.runtime().name)
            .field("stage", &self.stage())
            .finish_non_exhaustive()
    }
}

/// A copy of a task's state, with the names and progress a person wants to see.
///
/// The names are shared with the task (`Arc<str>`): taking a snapshot, which every
/// `wait_for` does, allocates nothing for them.
#[derive(Debug, Clone)]
pub struct TaskSnapshot {
    /// The task's name.
    pub name: std::sync::Arc<str>,
    /// The stage.
    pub stage: Stage,
    /// The current generation (one more for every run).
    pub generation: u64,
    /// The current unit's index and name, or `None` once every unit completed.
    pub unit: Option<(usize, std::sync::Arc<str>)>,
    /// How many units the pipeline has.
    pub units: usize,
    /// What the last run or check returned.
    pub outcome: Option<Outcome>,
    /// Whether the task is paused because the pause command was issued.
    pub user_paused: bool,
    /// The current unit's latest reported progress.
    pub progress: Progress,
    /// How many inputs the lifecycle has accepted.
    pub seq: u64,
}

impl TaskSnapshot {
    /// The current unit's index, or `None` once every unit completed.
    pub fn unit_index(&self) -> Option<usize> {
        self.unit.as_ref().map(|(index, _)| *index)
    }
}

impl<C: Send + Sync + 'static> Handle<C> {
    pub(crate) fn new(
        shared: Arc<Shared<C>>,
        pause_timeout: Duration,
        stop_grace: Duration,
        event_capacity: usize,
    ) -> Self {
        Handle {
            shared: Arc::clone(&shared),
            owner: Arc::new(Owner {
                shared,
                stop_grace,
                pause_timeout,
                event_capacity,
            }),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared<C>> {
        &self.shared
    }

    /// The typed owner for the task's current stage (a snapshot: see
    /// [`AnyTask`](crate::typestate::AnyTask)).
    pub fn into_typed(self) -> crate::typestate::AnyTask<C> {
        crate::typestate::AnyTask::from_handle(self)
    }

    /// A handle that does not keep the task alive: see [`WeakHandle`].
    pub fn downgrade(&self) -> WeakHandle<C> {
        WeakHandle {
            owner: Arc::downgrade(&self.owner),
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.shared().runtime().name
    }

    /// The stage, read without taking a lock.
    #[inline]
    pub fn stage(&self) -> Stage {
        self.shared().core().stage()
    }

    /// The whole state, taken consistently.
    pub fn snapshot(&self) -> TaskSnapshot {
        let core = self.shared().core().snapshot();
        self.decorate(core)
    }

    /// A read-only view of the task: see [`TaskObserver`].
    pub fn observer(&self) -> TaskObserver<C> {
        TaskObserver {
            shared: Arc::clone(&self.shared),
            event_capacity: self.owner.event_capacity,
        }
    }

    fn decorate(&self, core: Snapshot) -> TaskSnapshot {
        decorate(self.shared(), core)
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<C> {
        self.shared().core().config()
    }

    /// Every change of the task from now on, in order, as a
    /// [`Stream`](futures_core::Stream) of [`Event`](crate::Event)s.
    ///
    /// Nothing is skipped silently: consecutive changes have consecutive
    /// [`Change::seq`](crate::lifecycle::Change::seq) numbers, and a reader that falls
    /// more than the task's event capacity behind gets one
    /// [`Event::Lagged`](crate::Event::Lagged) saying how many changes it missed. The
    /// stream ends after the first terminal stage. It does
    /// not keep the task alive. To see the first start too, make the stream before it:
    /// [`TaskBuilder::spawn_with_events`](crate::TaskBuilder::spawn_with_events), or
    /// [`spawn_paused`](crate::TaskBuilder::spawn_paused) then `events()` then
    /// [`Handle::resume`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
    /// use taskstage::Event;
    /// # struct Copy;
    /// # impl Unit for Copy {
    /// #     async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
    /// #         Ok(RunExit::Completed)
    /// #     }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (_task, mut events) = Task::builder("copy").unit(Copy).spawn_with_events().unwrap();
    /// let mut path = vec![];
    /// while let Some(event) = events.next().await {
    ///     if let Event::Change(change) = event {
    ///         path.push(change.stage);
    ///     }
    /// }
    /// assert_eq!(path, [Stage::Resuming, Stage::Running, Stage::Finished]);
    /// # }
    /// ```
    pub fn events(&self) -> Events<C> {
        Events::new(Arc::clone(&self.shared), self.owner.event_capacity)
    }

    /// A receiver of the task's latest stage change.
    ///
    /// A `watch` receiver holds the newest value: a subscriber that reads slowly may
    /// skip intermediate stages, never see them out of order. [`StageEvent::seq`]
    /// counts every change. For every change, use [`Handle::events`].
    pub fn subscribe(&self) -> watch::Receiver<StageEvent> {
        self.shared().runtime().subscribe()
    }

    /// Waits until `predicate` holds for the task's state, and returns that state.
    ///
    /// The predicate sees the same [`TaskSnapshot`] this returns. It runs on a copy of
    /// the state with no lock of the task held, so it may call back into the task
    /// (read a snapshot, issue a command). It is called again after every change of
    /// the state and after every progress report
    /// ([`RunContext::report_progress`](crate::RunContext::report_progress)), so a wait
    /// on progress returns once that progress is reported; it may be called when
    /// nothing it reads changed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
    /// # struct Wait;
    /// # impl Unit for Wait {
    /// #     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
    /// #         ctx.cancelled().await;
    /// #         Ok(RunExit::Cancelled)
    /// #     }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), taskstage::Error> {
    /// let handle = Task::builder("copy").unit(Wait).spawn().unwrap();
    /// let running = handle
    ///     .wait_for(|s| s.stage == Stage::Running && s.unit_index() == Some(0))
    ///     .await;
    /// assert_eq!(running.generation, 1);
    /// # handle.stop().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn wait_for<P>(&self, mut predicate: P) -> TaskSnapshot
    where
        P: FnMut(&TaskSnapshot) -> bool,
    {
        let progress = &self.shared().runtime().progress;
        loop {
            // Enabled before the state is read: a progress report after the read wakes
            // this wait to look again (a stage change wakes it through the core).
            let mut reported = std::pin::pin!(progress.changed());
            reported.as_mut().enable();
            let mut ready = None;
            {
                let mut changed =
                    std::pin::pin!(self.shared().core().wait_until(|core: &Snapshot| {
                        let snapshot = self.decorate(core.clone());
                        let holds = predicate(&snapshot);
                        if holds {
                            ready = Some(snapshot);
                        }
                        holds
                    }));
                std::future::poll_fn(|cx| {
                    if changed.as_mut().poll(cx).is_ready() || reported.as_mut().poll(cx).is_ready()
                    {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
            }
            if let Some(snapshot) = ready {
                return snapshot;
            }
        }
    }

    /// Waits until the stage satisfies `predicate`, and returns the state then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn wait_for_stage<P>(&self, mut predicate: P) -> TaskSnapshot
    where
        P: FnMut(Stage) -> bool,
    {
        // The stage alone needs no names or progress: decorate only the result.
        let core = self
            .shared()
            .core()
            .wait_until(|s: &Snapshot| predicate(s.stage))
            .await;
        self.decorate(core)
    }

    /// Pauses the task, waiting up to the task's pause timeout (30 s by default) for
    /// the run to really return. See [`Handle::pause_within`].
    ///
    /// # Errors
    ///
    /// As [`Handle::pause_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Handle::pause_within`].
    pub async fn pause(&self) -> Result<Stage, Error> {
        self.pause_within(self.owner.pause_timeout).await
    }

    /// Pauses the task and waits up to `timeout` until its run has returned and its
    /// future has been dropped.
    ///
    /// Returns the stage the pause reached: `Paused`; `Finished` if the last unit
    /// completed as it was cancelled; `Stopped` if a stop overtook it. A pause in
    /// Paused returns at once and marks an error-paused task as user-paused.
    ///
    /// # Errors
    ///
    /// - [`Error::Refused`] when the stage does not allow a pause (New, Stopping,
    ///   Stopped, Finished); nothing changes.
    /// - [`Error::Timeout`] when the run has not returned within `timeout`; the stage
    ///   stays `Pausing` (it does not claim a rest that has not happened), and a later
    ///   pause or stop can wait again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. The pause is issued and the run cancelled at the first poll; if
    /// the future is dropped after that, the task still reaches Paused when the run
    /// returns. Dropped before its first poll, it does nothing.
    pub async fn pause_within(&self, timeout: Duration) -> Result<Stage, Error> {
        self.command_and_wait(Command::Pause, timeout).await
    }

    /// Resumes the task: its current unit's pre-start check runs (stage Resuming),
    /// then a run is launched (Running). Returns once the resume is accepted; wait for
    /// the stage (e.g. [`Handle::wait_for_stage`]) to see where it led.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] unless the stage is New or Paused; nothing changes then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the command is complete at the first poll.
    pub async fn resume(&self) -> Result<(), Error> {
        Driver::command(self.shared(), Command::Resume)?;
        Ok(())
    }

    /// Resumes the task, waiting first, up to `timeout`, for a pause that is still
    /// settling: the way to resume what a dropped or timed-out pause left behind.
    ///
    /// In Pausing (a pause was accepted and its run has not returned yet, so
    /// [`Handle::resume`] is refused with
    /// [`Refusal::StillRunning`](crate::Refusal::StillRunning)), this waits until the
    /// pause settles and then issues the resume once. In every other stage it is
    /// [`Handle::resume`]: accepted at once in New and Paused, refused otherwise.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] (command Resume, stage Pausing) when the pause has not
    ///   settled within `timeout`; nothing was issued.
    /// - [`Error::Refused`] as [`Handle::resume`], in the stage met when the resume
    ///   was issued (after the wait: a pause that ended in Finished or Stopped, or a
    ///   resume by somebody else in the meantime, is refused); nothing changes then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped during the wait, it has issued nothing.
    pub async fn resume_within(&self, timeout: Duration) -> Result<(), Error> {
        match Driver::command(self.shared(), Command::Resume) {
            Err(Error::Refused {
                reason: crate::error::Refusal::StillRunning,
                ..
            }) => {}
            done => return done.map(drop),
        }
        let settled = self
            .shared()
            .core()
            .wait_until(|s: &Snapshot| s.stage != Stage::Pausing);
        if tokio::time::timeout(timeout, settled).await.is_err() {
            return Err(Error::Timeout {
                command: Command::Resume,
                stage: self.stage(),
                waited: timeout,
            });
        }
        Driver::command(self.shared(), Command::Resume)?;
        Ok(())
    }

    /// Resumes the task only if nothing about it changed since `seq` (a
    /// [`TaskSnapshot::seq`] the caller observed): no command accepted, no run
    /// returned. Otherwise as [`Handle::resume`].
    ///
    /// This is how a supervisor acts on what it saw without racing the user: a task
    /// that the user paused (or resumed) after the snapshot is left alone.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] with [`Refusal::Changed`](crate::Refusal::Changed) when the
    /// task changed since `seq`; otherwise as [`Handle::resume`]. Nothing changes on an
    /// error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the command is complete at the first poll.
    pub async fn resume_if_unchanged(&self, seq: u64) -> Result<(), Error> {
        Driver::command_if_unchanged(self.shared(), Command::Resume, seq)?;
        Ok(())
    }

    /// Stops the task with the task's stop grace period (10 s by default). See
    /// [`Handle::stop_within`].
    ///
    /// # Errors
    ///
    /// As [`Handle::stop_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Handle::stop_within`].
    pub async fn stop(&self) -> Result<Stage, Error> {
        self.stop_within(self.owner.stop_grace).await
    }

    /// Stops the task: cancels its run, waits up to `grace` for it to return, then
    /// aborts it; closes every unit. Returns `Stopped` only once the run's future is
    /// gone and the units are closed (or `Finished`, for a finished task).
    ///
    /// # Errors
    ///
    /// - [`Error::Refused`] only in stages where stop is refused (none today: stop is
    ///   accepted everywhere, and is a no-op in a terminal stage).
    /// - [`Error::Timeout`] when even the aborted run has not gone within a second
    ///   `grace` period (a unit that blocks its thread cannot be aborted); the stage
    ///   stays `Stopping`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop is issued at the first poll and completes without this
    /// future; only the escalation to abort needs it to be polled past `grace`.
    pub async fn stop_within(&self, grace: Duration) -> Result<Stage, Error> {
        let settle = Driver::command(self.shared(), Command::Stop)?;
        stop_settled(self.shared(), settle, grace).await
    }

    /// Issues a pause now, without waiting, and returns the wait as a future to await
    /// later (or drop): the acceptance is immediate, so a control loop or a signal
    /// handler is never held up by a slow unit. The future settles as
    /// [`Handle::pause`] does, with the task's pause timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] at once, as [`Handle::pause_within`]; the returned future's
    /// own error is the timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// # use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
    /// # struct Wait;
    /// # impl Unit for Wait {
    /// #     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
    /// #         ctx.cancelled().await;
    /// #         Ok(RunExit::Cancelled)
    /// #     }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), taskstage::Error> {
    /// let handle = Task::builder("copy").unit(Wait).spawn().unwrap();
    /// handle.wait_for_stage(|s| s == Stage::Running).await;
    /// let settling = handle.pause_now()?; // accepted: the run is being cancelled
    /// assert_eq!(handle.stage(), Stage::Pausing);
    /// assert_eq!(settling.await?, Stage::Paused); // the run has returned
    /// # Ok(())
    /// # }
    /// ```
    pub fn pause_now(&self) -> Result<Settling, Error> {
        self.pause_now_within(self.owner.pause_timeout)
    }

    /// As [`Handle::pause_now`], with the wait bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// As [`Handle::pause_now`].
    pub fn pause_now_within(&self, timeout: Duration) -> Result<Settling, Error> {
        let settle = Driver::command(self.shared(), Command::Pause)?;
        let shared = Arc::clone(self.shared());
        Ok(Settling::new(async move {
            settled_within(&shared, settle, timeout).await
        }))
    }

    /// Issues a stop now, without waiting, and returns the wait as a future: it
    /// settles as [`Handle::stop`] does, aborting the run after the task's stop grace
    /// period. Dropping the future does not undo the stop, but gives up the
    /// escalation to abort (the last handle's drop still has its own).
    ///
    /// # Errors
    ///
    /// As [`Handle::stop_within`]: none at once today (stop is accepted everywhere);
    /// the returned future's error is the timeout.
    pub fn stop_now(&self) -> Result<Settling, Error> {
        self.stop_now_within(self.owner.stop_grace)
    }

    /// As [`Handle::stop_now`], with `grace` before the abort (and as much again for
    /// the aborted run to go).
    ///
    /// # Errors
    ///
    /// As [`Handle::stop_now`].
    pub fn stop_now_within(&self, grace: Duration) -> Result<Settling, Error> {
        let settle = Driver::command(self.shared(), Command::Stop)?;
        let shared = Arc::clone(self.shared());
        Ok(Settling::new(async move {
            stop_settled(&shared, settle, grace).await
        }))
    }

    /// Replaces the task's configuration. Units apply it before their next check or
    /// run (see [`Unit::apply_config`](crate::Unit::apply_config)).
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] unless the stage is New or Paused (a run holds the unit);
    /// the configuration is unchanged then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the command is complete at the first poll.
    pub async fn update(&self, config: C) -> Result<(), Error> {
        Driver::update(self.shared(), config)
    }

    /// Issues a stop and aborts the run at once, without a grace period, and returns
    /// the wait as a future: for an owner that can no longer let the run wind down
    /// (a cluster worker whose lease is ending, a process on its way out). The run's
    /// future is dropped at its next poll, wherever it was, so its outcome is
    /// [`Outcome::Aborted`](crate::Outcome::Aborted); the units' closes still run,
    /// and Stopped is published only once they have returned (invariant 9). The
    /// future settles as [`Handle::stop`] does, bounded by the task's stop grace;
    /// dropping it undoes neither the stop nor the abort.
    ///
    /// # Errors
    ///
    /// As [`Handle::stop_now`]: none at once today; the returned future's error is
    /// the timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// # use taskstage::{Outcome, RunContext, RunError, RunExit, Stage, Task, Unit};
    /// struct Deaf; // never looks at its cancellation token
    /// impl Unit for Deaf {
    ///     async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
    ///         std::future::pending().await
    ///     }
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), taskstage::Error> {
    /// let handle = Task::builder("copy").unit(Deaf).spawn().unwrap();
    /// handle.wait_for_stage(|s| s == Stage::Running).await;
    /// assert_eq!(handle.abort_now()?.await?, Stage::Stopped);
    /// assert!(matches!(handle.snapshot().outcome, Some(Outcome::Aborted)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn abort_now(&self) -> Result<Settling, Error> {
        let settle = Driver::command(self.shared(), Command::Stop)?;
        self.shared().abort(settle.generation());
        let shared = Arc::clone(self.shared());
        let grace = self.owner.stop_grace;
        Ok(Settling::new(async move {
            stop_settled(&shared, settle, grace).await
        }))
    }

    async fn command_and_wait(&self, command: Command, timeout: Duration) -> Result<Stage, Error> {
        let settle = Driver::command(self.shared(), command)?;
        settled_within(self.shared(), settle, timeout).await
    }
}

/// A core snapshot with the names and progress a person wants to see.
fn decorate<C: Send + Sync + 'static>(shared: &Shared<C>, core: Snapshot) -> TaskSnapshot {
    let shared = shared.runtime();
    TaskSnapshot {
        name: Arc::clone(&shared.name),
        stage: core.stage,
        generation: core.generation,
        unit: core.unit.map(|i| {
            (
                i,
                shared
                    .unit_names
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| "".into()),
            )
        }),
        units: core.units,
        outcome: core.outcome,
        user_paused: core.user_paused,
        progress: core
            .unit
            .map(|i| shared.progress.get(i))
            .unwrap_or_default(),
        seq: core.seq,
    }
}

/// A read-only view of a task: its name, stage, state and changes, and waits on
/// them; no command.
///
/// Made by [`Handle::observer`]. It does not keep the task alive, and it cannot pause,
/// resume or stop it: whoever owns the task (a [`Handle`]'s holder, or a cluster's
/// controller through its worker) stays the only one who commands it.
pub struct TaskObserver<C: Send + Sync + 'static = ()> {
    shared: Arc<Shared<C>>,
    event_capacity: usize,
}

impl<C: Send + Sync + 'static> Clone for TaskObserver<C> {
    fn clone(&self) -> Self {
        TaskObserver {
            shared: Arc::clone(&self.shared),
            event_capacity: self.event_capacity,
        }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for TaskObserver<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskObserver")
            .field("name", &self.shared.runtime().name)
            .field("stage", &self.stage())
            .finish_non_exhaustive()
    }
}

impl<C: Send + Sync + 'static> TaskObserver<C> {
    /// The task's name.
    pub fn name(&self) -> &str {
        &self.shared.runtime().name
    }

    /// The stage, read without taking a lock.
    pub fn stage(&self) -> Stage {
        self.shared.core().stage()
    }

    /// The whole state, taken consistently.
    pub fn snapshot(&self) -> TaskSnapshot {
        decorate(&self.shared, self.shared.core().snapshot())
    }

    /// Every change of the task from now on: as [`Handle::events`].
    pub fn events(&self) -> Events<C> {
        Events::new(Arc::clone(&self.shared), self.event_capacity)
    }

    /// The task's change counter and its current unit's progress, read together
    /// without copying a snapshot: what a cache of [`TaskSnapshot`]s is keyed on.
    /// The counter is [`TaskSnapshot::seq`], which every stage, generation, outcome
    /// or unit change moves; progress moves without a change, so it is read too. A
    /// snapshot taken when both read as now is still the task's state. Costs two
    /// short locks.
    ///
    /// # Examples
    ///
    /// ```
    /// # use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
    /// # struct Wait;
    /// # impl Unit for Wait {
    /// #     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
    /// #         ctx.cancelled().await;
    /// #         Ok(RunExit::Cancelled)
    /// #     }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), taskstage::Error> {
    /// let handle = Task::builder("copy").unit(Wait).spawn().unwrap();
    /// let observer = handle.observer();
    /// handle.wait_for_stage(|s| s == Stage::Running).await;
    /// let cached = handle.snapshot();
    /// let (seq, _progress) = observer.version();
    /// assert_eq!(seq, cached.seq); // nothing changed: the cached copy stands
    /// handle.pause().await?;
    /// assert!(observer.version().0 > cached.seq); // it changed: read it again
    /// # Ok(())
    /// # }
    /// ```
    pub fn version(&self) -> (u64, Progress) {
        let (seq, unit) = self.shared.core().seq_and_unit();
        let progress = unit
            .map(|i| self.shared.runtime().progress.get(i))
            .unwrap_or_default();
        (seq, progress)
    }

    /// Waits until the stage satisfies `predicate`, and returns the state then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn wait_for_stage<P>(&self, mut predicate: P) -> TaskSnapshot
    where
        P: FnMut(Stage) -> bool,
    {
        let core = self
            .shared
            .core()
            .wait_until(|s: &Snapshot| predicate(s.stage))
            .await;
        decorate(&self.shared, core)
    }
}

/// Waits until `settle` is reached, for at most about `timeout`, and returns the
/// stage it reports, or `None` on the timeout.
///
/// A cooperative run returns within one turn of the scheduler of its cancellation, so
/// the wait first gives it that turn, and only if the settle is still pending after
/// it reads the clock and arms a timer (an entry in the runtime's timer wheel,
/// registered and removed again) for `timeout`. A pause that settles at once costs
/// neither.
async fn settle_by<C: Send + Sync + 'static>(
    shared: &Shared<C>,
    settle: Settle,
    timeout: Duration,
) -> Option<Stage> {
    let mut settled = std::pin::pin!(shared.core().settled(settle));
    for turn in 0..2 {
        let poll = std::future::poll_fn(|cx| Poll::Ready(settled.as_mut().poll(cx))).await;
        if let Poll::Ready(stage) = poll {
            return Some(stage);
        }
        if turn == 0 {
            tokio::task::yield_now().await;
        }
    }
    tokio::time::timeout(timeout, settled).await.ok()
}

/// Waits up to `timeout` for an accepted pause to settle.
async fn settled_within<C: Send + Sync + 'static>(
    shared: &Shared<C>,
    settle: Settle,
    timeout: Duration,
) -> Result<Stage, Error> {
    let accepted = super::metrics::Since::now();
    match settle_by(shared, settle, timeout).await {
        Some(stage) => {
            super::metrics::settled(settle.command(), stage, accepted);
            Ok(stage)
        }
        None => {
            let snapshot = shared.core().snapshot();
            match settle.reached(snapshot.stage, snapshot.generation) {
                Some(stage) => Ok(stage),
                None => Err(Error::Timeout {
                    command: settle.command(),
                    stage: snapshot.stage,
                    waited: timeout,
                }),
            }
        }
    }
}

/// Waits for an accepted stop to settle, aborting the run after `grace`.
async fn stop_settled<C: Send + Sync + 'static>(
    shared: &Shared<C>,
    settle: Settle,
    grace: Duration,
) -> Result<Stage, Error> {
    // Stopped is published only once every unit's close has returned (invariant 9),
    // so settling is all there is to wait for.
    let accepted = super::metrics::Since::now();
    let settled = |stage: Stage| {
        super::metrics::settled(Command::Stop, stage, accepted);
        Ok(stage)
    };
    match settle_by(shared, settle, grace).await {
        Some(stage) => settled(stage),
        None => {
            // Invariant 8: escalate, and still report Stopped only when the aborted
            // future is gone and the units are closed.
            tracing::warn!(parent: &shared.runtime().span, ?grace, "run ignored cancellation; aborting");
            shared.abort(settle.generation());
            match tokio::time::timeout(grace, shared.core().settled(settle)).await {
                Ok(stage) => settled(stage),
                Err(_) => Err(Error::Timeout {
                    command: Command::Stop,
                    stage: shared.core().stage(),
                    waited: grace.saturating_mul(2),
                }),
            }
        }
    }
}

/// The rest of a command issued with [`Handle::pause_now`] or [`Handle::stop_now`]:
/// resolves to the stage the command settled in. The command itself was accepted
/// before this existed.
#[must_use = "futures do nothing unless polled; dropping this does not undo the command"]
pub struct Settling(Pin<Box<dyn Future<Output = Result<Stage, Error>> + Send>>);

impl Settling {
    pub(super) fn new(future: impl Future<Output = Result<Stage, Error>> + Send + 'static) -> Self {
        Settling(Box::pin(future))
    }
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settling").finish_non_exhaustive()
    }
}

impl Future for Settling {
    type Output = Result<Stage, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<C: Send + Sync + 'static> Drop for Owner<C> {
    fn drop(&mut self) {
        let shared = &self.shared;
        if shared.core().stage().is_terminal() {
            return;
        }
        let Ok(settle) = Driver::command(shared, Command::Stop) else {
            return;
        };
        if shared.core().stage() == Stage::Stopping {
            // Nobody is left to wait for the stop: abort the run if it ignores the
            // cancellation for longer than the grace period.
            let reaper = Arc::clone(shared);
            let grace = self.stop_grace;
            shared.runtime().spawn_detached(async move {
                if tokio::time::timeout(grace, reaper.core().settled(settle))
                    .await
                    .is_err()
                {
                    reaper.abort(settle.generation());
                }
            });
        }
    }
}
