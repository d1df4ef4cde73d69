//! The auto-resume policy: per-task state, the dispatch step and its driver loop.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, BackoffSettings};
use crate::error::RunError;
use crate::outcome::Outcome;
use crate::runtime::{Handle, StageEvent, TaskSnapshot, WeakHandle};
use crate::stage::Stage;
use crate::sync::{lock, Arc, Mutex};

/// The key of one task watched by an [`AutoResume`], returned by [`AutoResume::add`].
///
/// Keys are never reused within one policy: a task removed and added again gets a
/// new key, and none of its old state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(u64);

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// What the policy makes of a task, as of its last observation: whether it is
/// healthy, and if it is at rest, why the policy does or does not resume it.
///
/// The three *skip reasons* are [`Standing::UserPaused`],
/// [`Standing::NotResumable`] and [`Standing::BackingOff`] (see
/// [`Standing::is_skipped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// The task is New: the policy never starts a task, it only resumes.
    NotStarted,
    /// The task is Running. Every healthy period it stays so, one backoff step is
    /// rolled back.
    Healthy {
        /// Since when the policy has seen it run without a failure in between.
        since: Instant,
    },
    /// The task is Pausing, Resuming or Stopping; the policy waits for it to settle.
    Changing,
    /// Skipped for now: the task failed with a resumable error and will be resumed
    /// at `until` (also [`Status::next_due`]).
    BackingOff {
        /// When the auto-resume is due.
        until: Instant,
    },
    /// Skipped: the task failed with an error the classifier does not consider
    /// resumable. It is never auto-resumed; a resume by the user, or a later failure
    /// that is resumable, changes that.
    NotResumable {
        /// Since when the task is blocked (when the policy first saw the failure).
        since: Instant,
    },
    /// Skipped: the user paused the task (including a task that had failed and was
    /// then paused by the user). It is never auto-resumed.
    UserPaused,
    /// The task is Paused without a failure and without the user's mark; the policy
    /// has nothing to resume.
    Idle,
}

impl Standing {
    /// Whether this is one of the reasons the policy skips a paused task: user-paused,
    /// not resumable, or backing off.
    pub fn is_skipped(&self) -> bool {
        matches!(
            self,
            Standing::UserPaused | Standing::NotResumable { .. } | Standing::BackingOff { .. }
        )
    }
}

/// The policy's state for one task, as [`AutoResume::status`] reports it.
///
/// It is the policy's view as of its last observation of the task
/// ([`Status::observed_at`]); the driver ([`AutoResume::run`]) observes a task at
/// every stage change, when a resume is due, and when a rollback is due.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The task's name.
    pub name: String,
    /// The stage the policy last saw.
    pub stage: Stage,
    /// The generation the policy last saw.
    pub generation: u64,
    /// When the policy last looked at the task.
    pub observed_at: Instant,
    /// What the policy makes of the task, including why it skips it.
    pub standing: Standing,
    /// The backoff step: how many more auto-resumes than rollbacks (the step stops
    /// growing once the delay has reached the maximum).
    pub step: u32,
    /// The delay of the current step before jitter: what the next failure waits.
    pub delay: Duration,
    /// When the next auto-resume is due, if one is scheduled.
    pub next_due: Option<Instant>,
    /// When the next backoff step is rolled back, if the task is healthy and the
    /// step is above 0.
    pub rollback_due: Option<Instant>,
    /// How many times the policy has resumed the task.
    pub auto_resumes: u64,
}

/// A read-only view of an [`AutoResume`], made by [`AutoResume::observer`].
///
/// It reads what the policy reads out (each task's [`Status`], and a counter of its
/// changes) and commands nothing. Holding it does not keep the policy's driver
/// running: once the last [`AutoResume`] is dropped, the driver returns and the
/// statuses stay as they were last recorded.
pub struct AutoResumeObserver<C: Send + Sync + 'static = ()> {
    inner: Arc<Inner<C>>,
}

impl<C: Send + Sync + 'static> Clone for AutoResumeObserver<C> {
    fn clone(&self) -> Self {
        AutoResumeObserver {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for AutoResumeObserver<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoResumeObserver")
            .field("revision", &self.revision())
            .finish_non_exhaustive()
    }
}

impl<C: Send + Sync + 'static> AutoResumeObserver<C> {
    /// The policy's state for one task, as [`AutoResume::status`] gives it.
    pub fn status(&self, id: Key) -> Option<Status> {
        self.inner.status(id)
    }

    /// Every watched task's status, in the order the tasks were added, read at one
    /// instant (under one lock).
    pub fn statuses(&self) -> Vec<(Key, Status)> {
        lock(&self.inner.state)
            .entries
            .iter()
            .map(|(id, entry)| (*id, entry.status(&self.inner.settings)))
            .collect()
    }

    /// A counter that moves after every change of the recorded state (a task added,
    /// removed or observed): the same number read twice means no status changed in
    /// between, so a reader can keep what it built from the last one.
    pub fn revision(&self) -> u64 {
        *self.inner.revision.borrow()
    }
}

/// What one [`AutoResume::dispatch_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dispatch {
    /// The tasks it resumed.
    pub resumed: Vec<Key>,
    /// The earliest instant after the dispatch's `now` at which something is due (an
    /// auto-resume or a rollback), if anything is: the next dispatch should happen
    /// then, or at the next stage change of a watched task, whichever comes first.
    pub next_wake: Option<Instant>,
}

type Classifier = dyn Fn(&RunError) -> bool + Send + Sync;

/// Resumes tasks that a resumable error paused, with a per-task exponential backoff.
///
/// The policy watches a set of tasks ([`AutoResume::add`]). When one is Paused by a
/// failure and the user did not pause it, the user's classifier decides whether the
/// error is resumable. A resumable failure is resumed after the task's current backoff
/// delay (1 s, 2 s, 4 s … up to 5 min by default, with equal jitter); each auto-resume
/// steps the backoff up, and each healthy period (5 min Running by default) steps it
/// back down by one. A failure that is not resumable is never auto-resumed: the status
/// records since when the task is blocked. A task the user paused is never
/// auto-resumed. A task that is stopped, finished or removed loses all its policy
/// state.
///
/// The work is done by [`AutoResume::dispatch_once`], one deterministic step at a
/// given instant; [`AutoResume::run`] is the driver that calls it at every stage
/// change of a watched task and whenever something is due. Run one driver per policy.
///
/// `Clone + Send + Sync`: clones share the same policy. When the last clone is
/// dropped, the driver returns.
///
/// The policy holds only a [`WeakHandle`] of every watched task: it never keeps a
/// task alive. When the user's last [`Handle`] goes, the task stops and the policy
/// forgets it, as it forgets a task that is removed or settles in a terminal stage.
///
/// # Examples
///
/// ```
/// use taskstage::policy::{AutoResume, BackoffSettings, Standing};
/// use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
///
/// /// Fails its first run with a network blip, then works until cancelled.
/// struct Flaky {
///     runs: u32,
/// }
///
/// impl Unit for Flaky {
///     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
///         self.runs += 1;
///         if self.runs == 1 {
///             let blip = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
///             return Err(RunError::new(blip));
///         }
///         ctx.cancelled().await;
///         Ok(RunExit::Cancelled)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Network errors are worth another try; anything else needs a person.
/// let policy = AutoResume::new(BackoffSettings::default(), |error: &RunError| {
///     error
///         .get_ref()
///         .downcast_ref::<std::io::Error>()
///         .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
/// });
/// let driver = tokio::spawn(policy.run());
///
/// let task = Task::builder("copy").unit(Flaky { runs: 0 }).spawn_paused()?;
/// let id = policy.add(&task);
/// task.resume().await?;
///
/// // The first run fails; the policy resumes the task within the first delay.
/// let status = policy
///     .wait_for(id, |s| s.is_some_and(|s| matches!(s.standing, Standing::BackingOff { .. })))
///     .await
///     .expect("the task is watched");
/// assert!(status.next_due.is_some());
///
/// let running = task.wait_for(|s| s.stage == Stage::Running && s.generation == 2).await;
/// assert_eq!(running.generation, 2);
/// let status = policy.wait_for(id, |s| s.is_some_and(|s| s.auto_resumes == 1)).await;
/// assert_eq!(status.map(|s| s.step), Some(1));
///
/// // A user's pause is never undone by the policy.
/// task.pause().await?;
/// policy.wait_for(id, |s| s.is_some_and(|s| s.standing == Standing::UserPaused)).await;
///
/// drop(policy); // the driver returns
/// driver.await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the last clone of the policy stops its driver"]
pub struct AutoResume<C: Send + Sync + 'static = ()> {
    owner: Arc<Owner<C>>,
}

/// Stops the driver when the last clone of the policy goes.
struct Owner<C: Send + Sync + 'static> {
    inner: Arc<Inner<C>>,
    shutdown: CancellationToken,
}

impl<C: Send + Sync + 'static> Drop for Owner<C> {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl<C: Send + Sync + 'static> Clone for AutoResume<C> {
    fn clone(&self) -> Self {
        AutoResume {
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for AutoResume<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.owner.inner;
        f.debug_struct("AutoResume")
            .field("settings", &inner.settings)
            .field("tasks", &lock(&inner.state).entries.len())
            .finish_non_exhaustive()
    }
}

/// The shared state of a policy and its driver.
///
/// # Deadlock safety
///
/// `state`'s mutex is a leaf: while it is held nothing is called but the policy's own
/// bookkeeping, the backoff arithmetic and clones of handles. The classifier (user
/// code), every handle command and snapshot, and the drop of a removed handle (which
/// may stop the task and run its units' `close`) all happen after it is released.
struct Inner<C: Send + Sync + 'static> {
    settings: BackoffSettings,
    classifier: Box<Classifier>,
    state: Mutex<State<C>>,
    /// Notified (with a stored permit) when a task is added or removed, so the driver
    /// subscribes to the new set.
    members_changed: Notify,
    /// Bumped after every change of the recorded state; [`AutoResume::wait_for`]
    /// watches it.
    revision: watch::Sender<u64>,
}

struct State<C: Send + Sync + 'static> {
    entries: BTreeMap<Key, Entry<C>>,
    next_id: u64,
    /// Each task's jitter generator is forked from this one when it is added, so a
    /// seeded policy gives the same delays for the same sequence of additions.
    rng: fastrand::Rng,
}

/// The policy's state for one task.
struct Entry<C: Send + Sync + 'static> {
    /// Weak, so that the policy never keeps a task alive: when the user's last handle
    /// goes, the task stops and the policy forgets it.
    handle: WeakHandle<C>,
    name: String,
    backoff: Backoff,
    stage: Stage,
    generation: u64,
    observed_at: Instant,
    standing: Standing,
    /// The failure being handled, keyed by the generation that failed.
    failure: Option<Failure>,
    /// The healthy streak, while the task is Running.
    healthy: Option<Healthy>,
    auto_resumes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Failure {
    generation: u64,
    decision: Decision,
}

#[derive(Debug, Clone, Copy)]
enum Decision {
    /// Resumable: resume at `due`.
    Scheduled { due: Instant },
    /// Resumable, and a dispatch is resuming it right now.
    Claimed { due: Instant },
    /// Not resumable, since `since`.
    Blocked { since: Instant },
}

#[derive(Debug, Clone, Copy)]
struct Healthy {
    since: Instant,
    /// Where the current rollback period started.
    anchor: Instant,
    generation: u64,
    unit: Option<usize>,
}

/// What a dispatch must do about one task after observing it.
#[derive(Debug, Clone, Copy)]
enum Action {
    Nothing,
    Resume { generation: u64 },
    Forget,
}

/// A later instant, or an instant so far away that it never comes, instead of
/// overflowing.
fn later(at: Instant, by: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    at.checked_add(by)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

impl<C: Send + Sync + 'static> Entry<C> {
    fn new(handle: &Handle<C>, backoff: Backoff, now: Instant) -> Self {
        Entry {
            handle: handle.downgrade(),
            name: handle.name().to_owned(),
            backoff,
            stage: Stage::New,
            generation: 0,
            observed_at: now,
            standing: Standing::NotStarted,
            failure: None,
            healthy: None,
            auto_resumes: 0,
        }
    }

    /// The error to classify, if `snap` shows a failure the policy has not decided
    /// about yet.
    fn unclassified(&self, snap: &TaskSnapshot) -> Option<RunError> {
        let error = failed_not_user_paused(snap)?;
        match self.failure {
            Some(failure) if failure.generation == snap.generation => None,
            _ => Some(error.clone()),
        }
    }

    /// Records what `snap` shows at `now`, and says what to do about it. `resumable`
    /// is the classifier's verdict on the failure `snap` shows, if it was asked.
    fn observe(
        &mut self,
        snap: &TaskSnapshot,
        resumable: Option<bool>,
        now: Instant,
        settings: &BackoffSettings,
    ) -> Action {
        self.stage = snap.stage;
        self.generation = snap.generation;
        self.observed_at = now;
        if snap.stage != Stage::Running {
            self.healthy = None;
        }
        match snap.stage {
            Stage::Stopped | Stage::Finished => return Action::Forget,
            Stage::New => self.standing = Standing::NotStarted,
            Stage::Pausing | Stage::Resuming | Stage::Stopping => {
                // The failure is over: the task was resumed (a new generation), or
                // is being stopped. Keeping its due instant would wake the driver
                // for nothing until the stage settles.
                self.settle_failure();
                self.standing = Standing::Changing;
            }
            Stage::Running => {
                self.settle_failure();
                self.observe_healthy(snap, now, settings);
            }
            Stage::Paused if snap.user_paused => {
                // The user's mark wins over any schedule (an error-paused task that
                // the user then paused included).
                self.settle_failure();
                self.standing = Standing::UserPaused;
            }
            Stage::Paused => return self.observe_failure(snap, resumable, now),
        }
        Action::Nothing
    }

    fn observe_healthy(&mut self, snap: &TaskSnapshot, now: Instant, settings: &BackoffSettings) {
        let unit = snap.unit.as_ref().map(|(index, _)| *index);
        let mut healthy = match self.healthy {
            // The same run, or a later unit of the pipeline: still the same streak.
            // A new generation of the same unit means the unit was resumed, so the
            // task was at rest in between: a new streak.
            Some(h) if h.generation == snap.generation || h.unit != unit => Healthy {
                generation: snap.generation,
                unit,
                ..h
            },
            _ => Healthy {
                since: now,
                anchor: now,
                generation: snap.generation,
                unit,
            },
        };
        if self.backoff.step() == 0 {
            // Nothing to roll back: a rollback period starts once there is a step.
            healthy.anchor = now;
        } else {
            let period = settings.healthy_period();
            let elapsed = now.saturating_duration_since(healthy.anchor);
            let periods = elapsed.as_nanos() / period.as_nanos().max(1);
            let steps = u32::try_from(periods)
                .unwrap_or(u32::MAX)
                .min(self.backoff.step());
            if steps > 0 {
                for _ in 0..steps {
                    self.backoff.rollback();
                }
                healthy.anchor = match period.checked_mul(steps) {
                    Some(span) => later(healthy.anchor, span),
                    None => now,
                };
                tracing::info!(
                    task = self.name.as_str(),
                    step = self.backoff.step(),
                    "healthy for {steps} period(s): backoff rolled back"
                );
            }
        }
        self.healthy = Some(healthy);
        self.standing = Standing::Healthy {
            since: healthy.since,
        };
    }

    fn observe_failure(
        &mut self,
        snap: &TaskSnapshot,
        resumable: Option<bool>,
        now: Instant,
    ) -> Action {
        if failed_not_user_paused(snap).is_none() {
            // Paused without a failure and without the user's mark.
            self.failure = None;
            self.standing = Standing::Idle;
            return Action::Nothing;
        }
        let decision = match self.failure {
            Some(failure) if failure.generation == snap.generation => failure.decision,
            _ => match resumable {
                Some(true) => {
                    let delay = self.backoff.delay();
                    let due = later(now, delay);
                    tracing::info!(
                        task = self.name.as_str(),
                        generation = snap.generation,
                        step = self.backoff.step(),
                        ?delay,
                        "resumable failure: auto-resume scheduled"
                    );
                    Decision::Scheduled { due }
                }
                Some(false) => {
                    tracing::warn!(
                        task = self.name.as_str(),
                        generation = snap.generation,
                        "failure is not resumable: the task is blocked"
                    );
                    Decision::Blocked { since: now }
                }
                // Not classified (another dispatch decided meanwhile, or the task
                // changed between the two looks): the next observation decides.
                None => return Action::Nothing,
            },
        };
        let (decision, action) = match decision {
            Decision::Scheduled { due } if now >= due => (
                Decision::Claimed { due },
                Action::Resume {
                    generation: snap.generation,
                },
            ),
            other => (other, Action::Nothing),
        };
        self.failure = Some(Failure {
            generation: snap.generation,
            decision,
        });
        self.standing = match decision {
            Decision::Scheduled { due } | Decision::Claimed { due } => {
                Standing::BackingOff { until: due }
            }
            Decision::Blocked { since } => Standing::NotResumable { since },
        };
        action
    }

    /// Forgets the failure record, unless it is a resume in flight: the dispatch
    /// that claimed it settles it.
    fn settle_failure(&mut self) {
        if !matches!(
            self.failure,
            Some(Failure {
                decision: Decision::Claimed { .. },
                ..
            })
        ) {
            self.failure = None;
        }
    }

    /// The resume of `generation`'s failure, claimed by the caller, was accepted.
    ///
    /// Only the dispatch that turned the failure from scheduled into claimed (under
    /// the policy's lock) calls this, so each auto-resume steps the backoff once.
    fn resumed(&mut self, generation: u64) {
        self.backoff.advance();
        self.auto_resumes += 1;
        if matches!(self.failure, Some(Failure { generation: g, .. }) if g == generation) {
            self.failure = None;
            self.standing = Standing::Changing;
        }
    }

    /// The resume of `generation`'s failure did not happen: due again.
    fn unclaim(&mut self, generation: u64) {
        if let Some(Failure {
            generation: g,
            decision: Decision::Claimed { due },
        }) = self.failure
        {
            if g == generation {
                self.failure = Some(Failure {
                    generation,
                    decision: Decision::Scheduled { due },
                });
            }
        }
    }

    fn next_due(&self) -> Option<Instant> {
        match self.failure?.decision {
            Decision::Scheduled { due } | Decision::Claimed { due } => Some(due),
            Decision::Blocked { .. } => None,
        }
    }

    fn rollback_due(&self, settings: &BackoffSettings) -> Option<Instant> {
        let healthy = self.healthy?;
        (self.backoff.step() > 0).then(|| later(healthy.anchor, settings.healthy_period()))
    }

    /// When the driver must look at this task again even if its stage does not change.
    fn next_wake(&self, settings: &BackoffSettings) -> Option<Instant> {
        let due = match self.failure.map(|f| f.decision) {
            Some(Decision::Scheduled { due }) => Some(due),
            // A claimed resume is in flight; its dispatch finishes it.
            _ => None,
        };
        match (due, self.rollback_due(settings)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn status(&self, settings: &BackoffSettings) -> Status {
        Status {
            name: self.name.as_str().to_owned(),
            stage: self.stage,
            generation: self.generation,
            observed_at: self.observed_at,
            standing: self.standing,
            step: self.backoff.step(),
            delay: self.backoff.current(),
            next_due: self.next_due(),
            rollback_due: self.rollback_due(settings),
            auto_resumes: self.auto_resumes,
        }
    }
}

/// The failure a snapshot shows, unless the user paused the task.
fn failed_not_user_paused(snap: &TaskSnapshot) -> Option<&RunError> {
    if snap.stage != Stage::Paused || snap.user_paused {
        return None;
    }
    match &snap.outcome {
        Some(Outcome::Failed(error)) => Some(error),
        _ => None,
    }
}

/// A resume in flight. If the resume does not happen (refused, or the dispatch future
/// is dropped half-way), dropping the claim makes the failure due again.
struct Claim<'a, C: Send + Sync + 'static> {
    inner: &'a Inner<C>,
    id: Key,
    generation: u64,
    settled: bool,
}

impl<C: Send + Sync + 'static> Drop for Claim<'_, C> {
    fn drop(&mut self) {
        if !self.settled {
            if let Some(entry) = lock(&self.inner.state).entries.get_mut(&self.id) {
                entry.unclaim(self.generation);
            }
        }
    }
}

impl<C: Send + Sync + 'static> Inner<C> {
    /// Asks the user's classifier, with no lock held. A panicking classifier counts as
    /// "not resumable": a person looks at the task.
    fn classify(&self, task: &str, error: &RunError) -> bool {
        match catch_unwind(AssertUnwindSafe(|| (self.classifier)(error))) {
            Ok(resumable) => resumable,
            Err(_) => {
                tracing::error!(task, %error, "the classifier panicked; the error counts as not resumable");
                false
            }
        }
    }

    /// The watched tasks that still have a handle. A task whose last handle is gone
    /// was stopped by that drop: its state is forgotten here.
    fn members(&self) -> Vec<(Key, Handle<C>)> {
        let mut state = lock(&self.state);
        let mut live = Vec::with_capacity(state.entries.len());
        state
            .entries
            .retain(|id, entry| match entry.handle.upgrade() {
                Some(handle) => {
                    live.push((*id, handle));
                    true
                }
                None => false,
            });
        live
    }

    fn status(&self, id: Key) -> Option<Status> {
        lock(&self.state)
            .entries
            .get(&id)
            .map(|entry| entry.status(&self.settings))
    }

    fn changed(&self) {
        self.revision.send_modify(|revision| *revision += 1);
    }

    async fn dispatch(&self, now: Instant) -> Dispatch {
        let mut resumed = Vec::new();
        let mut forgotten = Vec::new();
        for (id, handle) in self.members() {
            let snap = handle.snapshot();
            let unclassified = match lock(&self.state).entries.get(&id) {
                Some(entry) => entry.unclassified(&snap),
                None => continue,
            };
            // User code: no lock held.
            let resumable = unclassified.map(|error| self.classify(handle.name(), &error));
            let action = {
                let mut state = lock(&self.state);
                let Some(entry) = state.entries.get_mut(&id) else {
                    continue;
                };
                let action = entry.observe(&snap, resumable, now, &self.settings);
                if let Action::Forget = action {
                    // Dropped after the lock is released (see Deadlock safety).
                    forgotten.extend(state.entries.remove(&id));
                }
                action
            };
            match action {
                Action::Nothing => {}
                Action::Forget => {
                    tracing::info!(task = handle.name(), stage = %snap.stage, "task settled: policy state dropped");
                }
                Action::Resume { generation } => {
                    if self.resume(id, &handle, generation).await {
                        resumed.push(id);
                    }
                }
            }
        }
        // Only instants after `now`: anything due by now was handled above, or
        // waits for a stage change (which wakes the driver anyway), so a past
        // instant would only make the driver spin.
        let next_wake = lock(&self.state)
            .entries
            .values()
            .filter_map(|entry| entry.next_wake(&self.settings))
            .filter(|at| *at > now)
            .min();
        if !forgotten.is_empty() {
            self.members_changed.notify_one();
        }
        drop(forgotten);
        self.changed();
        Dispatch { resumed, next_wake }
    }

    /// Resumes the task whose failure of `generation` is due and claimed.
    async fn resume(&self, id: Key, handle: &Handle<C>, generation: u64) -> bool {
        let mut claim = Claim {
            inner: self,
            id,
            generation,
            settled: false,
        };
        // Look again right before the command: the user may have paused or resumed
        // the task since it was observed. The resume is conditional on nothing having
        // changed since this look, so a pause in between wins.
        let snap = handle.snapshot();
        if snap.generation != generation || failed_not_user_paused(&snap).is_none() {
            return false;
        }
        match handle.resume_if_unchanged(snap.seq).await {
            Ok(()) => {
                claim.settled = true;
                crate::runtime::metrics::auto_resumed();
                if let Some(entry) = lock(&self.state).entries.get_mut(&id) {
                    entry.resumed(generation);
                    tracing::info!(
                        task = handle.name(),
                        generation,
                        step = entry.backoff.step(),
                        "auto-resumed"
                    );
                }
                true
            }
            Err(error) => {
                tracing::warn!(task = handle.name(), %error, "auto-resume refused");
                false
            }
        }
    }
}

impl<C: Send + Sync + 'static> AutoResume<C> {
    /// A policy with `settings` and the `classifier` that decides which errors are
    /// resumable. Jitter is drawn from a randomly seeded generator.
    ///
    /// The classifier is user code: it is called without any lock held, once per
    /// failure (a failure is one failed generation of a task). If it panics, the
    /// error counts as not resumable.
    pub fn new<F>(settings: BackoffSettings, classifier: F) -> Self
    where
        F: Fn(&RunError) -> bool + Send + Sync + 'static,
    {
        Self::with_rng(settings, Box::new(classifier), fastrand::Rng::new())
    }

    /// As [`AutoResume::new`], with jitter drawn from generators derived from `seed`:
    /// the same seed and the same order of [`AutoResume::add`] calls give the same
    /// delays.
    pub fn with_rng_seed<F>(settings: BackoffSettings, classifier: F, seed: u64) -> Self
    where
        F: Fn(&RunError) -> bool + Send + Sync + 'static,
    {
        Self::with_rng(
            settings,
            Box::new(classifier),
            fastrand::Rng::with_seed(seed),
        )
    }

    fn with_rng(
        settings: BackoffSettings,
        classifier: Box<Classifier>,
        rng: fastrand::Rng,
    ) -> Self {
        AutoResume {
            owner: Arc::new(Owner {
                inner: Arc::new(Inner {
                    settings,
                    classifier,
                    state: Mutex::new(State {
                        entries: BTreeMap::new(),
                        next_id: 0,
                        rng,
                    }),
                    members_changed: Notify::new(),
                    revision: watch::Sender::new(0),
                }),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    fn inner(&self) -> &Inner<C> {
        &self.owner.inner
    }

    /// The settings.
    pub fn settings(&self) -> &BackoffSettings {
        &self.inner().settings
    }

    /// Watches a task (a [`Handle`], or a typed owner: [`Task<S>`](crate::Task),
    /// [`AnyTask`](crate::typestate::AnyTask)), and returns its key. The policy keeps
    /// a weak handle: it never keeps the task alive.
    ///
    /// The task is observed at once: a task already Paused by a failure is classified
    /// now (the classifier runs on the caller's thread) and its first delay starts
    /// now. A task already Stopped or Finished is not kept (its status is `None`).
    /// Adding the same task twice watches it twice, with two independent states;
    /// don't.
    pub fn add<T: AsRef<Handle<C>>>(&self, task: &T) -> Key {
        let handle = task.as_ref();
        let inner = self.inner();
        let now = Instant::now();
        let snap = handle.snapshot();
        let resumable =
            failed_not_user_paused(&snap).map(|error| inner.classify(handle.name(), error));
        let mut state = lock(&inner.state);
        let id = Key(state.next_id);
        state.next_id += 1;
        let rng = state.rng.fork();
        let mut entry = Entry::new(handle, Backoff::with_rng(inner.settings, rng), now);
        let forgotten = match entry.observe(&snap, resumable, now, &inner.settings) {
            Action::Forget => Some(entry),
            Action::Nothing => {
                state.entries.insert(id, entry);
                None
            }
            // A zero first delay (possible only with a minimum of a nanosecond or
            // two under equal jitter): leave the resume to the driver.
            Action::Resume { generation } => {
                entry.unclaim(generation);
                state.entries.insert(id, entry);
                None
            }
        };
        drop(state);
        // Dropped after the lock is released (see Deadlock safety).
        drop(forgotten);
        inner.members_changed.notify_one();
        inner.changed();
        id
    }

    /// Stops watching a task and drops all its policy state. Returns a handle to it,
    /// or `None` if the key is not watched (never was, was removed, the task settled
    /// in a terminal stage, or its last handle is gone).
    ///
    /// Dropping the returned handle stops the task if it is the task's last handle.
    pub fn remove(&self, id: Key) -> Option<Handle<C>> {
        let inner = self.inner();
        let removed = lock(&inner.state).entries.remove(&id);
        inner.members_changed.notify_one();
        inner.changed();
        removed.and_then(|entry| entry.handle.upgrade())
    }

    /// The keys of the watched tasks, in the order they were added.
    pub fn tasks(&self) -> Vec<Key> {
        lock(&self.inner().state).entries.keys().copied().collect()
    }

    /// How many tasks are watched.
    pub fn len(&self) -> usize {
        lock(&self.inner().state).entries.len()
    }

    /// Whether no task is watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policy's state for one task, as of its last observation, or `None` if the
    /// task is not watched (removed, or dropped after it settled in Stopped or
    /// Finished).
    pub fn status(&self, id: Key) -> Option<Status> {
        self.inner().status(id)
    }

    /// A read-only view of the policy that does not keep it alive: its driver still
    /// returns once every clone of the policy has been dropped. A server that shows
    /// the policy's standing of each task beside the task holds one.
    pub fn observer(&self) -> AutoResumeObserver<C> {
        AutoResumeObserver {
            inner: Arc::clone(&self.owner.inner),
        }
    }

    /// Waits until `predicate` holds for the task's status (`None` once it is not
    /// watched), and returns that status.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn wait_for<P>(&self, id: Key, mut predicate: P) -> Option<Status>
    where
        P: FnMut(Option<&Status>) -> bool,
    {
        let mut revisions = self.inner().revision.subscribe();
        loop {
            // Marked seen before the status is read, so no change is missed.
            revisions.borrow_and_update();
            let status = self.status(id);
            if predicate(status.as_ref()) {
                return status;
            }
            if revisions.changed().await.is_err() {
                // Impossible: the sender lives as long as `self`.
                return status;
            }
        }
    }

    /// Observes every watched task at `now`: records failures (asking the classifier
    /// about new ones), resumes those whose delay has passed, rolls back the backoff
    /// of tasks healthy for a whole period, and drops the state of tasks that settled
    /// in Stopped or Finished.
    ///
    /// Deterministic for a given `now` and the tasks' states; [`AutoResume::run`]
    /// calls it with the current time. Pass `tokio::time::Instant::now()` unless you
    /// are simulating time.
    ///
    /// A resume is issued only after a second look at the task, right before the
    /// command, shows it still Paused by the same failure and not marked user-paused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: every resume command completes at its first poll, and a resume
    /// that was decided but not issued when the future is dropped stays due.
    pub async fn dispatch_once(&self, now: Instant) -> Dispatch {
        self.inner().dispatch(now).await
    }

    /// The driver: dispatches at every stage change of a watched task, when a task is
    /// added or removed, and when an auto-resume or a rollback is due; sleeps with
    /// `tokio::time` in between (so tokio's paused clock drives it in tests).
    ///
    /// Spawn it: `tokio::spawn(policy.run())`. It returns once every clone of the
    /// policy has been dropped. The future does not keep the policy alive.
    pub fn run(&self) -> impl Future<Output = ()> + Send + 'static {
        drive(Arc::clone(&self.owner.inner), self.owner.shutdown.clone())
    }
}

async fn drive<C: Send + Sync + 'static>(inner: Arc<Inner<C>>, shutdown: CancellationToken) {
    let mut watched: BTreeMap<Key, watch::Receiver<StageEvent>> = BTreeMap::new();
    loop {
        let members = inner.members();
        let ids: BTreeSet<Key> = members.iter().map(|(id, _)| *id).collect();
        watched.retain(|id, _| ids.contains(id));
        for (id, handle) in &members {
            watched.entry(*id).or_insert_with(|| handle.subscribe());
        }
        drop(members);
        // Marked seen before the dispatch looks, so a change during or after it
        // wakes the wait below.
        for receiver in watched.values_mut() {
            receiver.borrow_and_update();
        }
        let dispatch = inner.dispatch(Instant::now()).await;

        let mut changes: Vec<_> = watched
            .values_mut()
            .map(|receiver| Box::pin(receiver.changed()))
            .collect();
        let any_change = std::future::poll_fn(|cx| {
            for change in &mut changes {
                // `Err` means the task's sender is gone, which cannot happen while
                // the policy holds its handle; either way, look again.
                if change.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        });
        let due = async {
            match dispatch.next_wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = inner.members_changed.notified() => {}
            () = any_change => {}
            () = due => {}
        }
    }
}
