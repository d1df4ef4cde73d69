//! The scripted controller: pauses and resumes the task at random moments drawn from
//! a seed, pauses at the very moment the pipeline switches units, tries to resume
//! before a pause has returned (the original bug's recipe, which must be refused), and
//! once stops the whole task and builds a new one that continues from the
//! checkpoints.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use taskstage::runtime::{Change, Progress};
use taskstage::{
    BuildError, Command, Error, Event, Events, Handle, Outcome, Refusal, Stage, Task, TaskSnapshot,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::migrate::report::{Counts, Screen, Timeline, UNIT_NAMES};
use crate::migrate::units::{Env, UnitProgress};

/// When an action happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// When `unit` has done `percent` of its rows.
    Progress {
        /// The unit.
        unit: usize,
        /// Percent of its rows.
        percent: u64,
    },
    /// The moment the pipeline switches to unit `into`.
    Switch {
        /// The unit switched to.
        into: usize,
    },
    /// `after` once `unit` is current (the sync, whose total is not known).
    Delay {
        /// The unit.
        unit: usize,
        /// How long after the previous action.
        after: Duration,
    },
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Trigger::Progress { unit, percent } => write!(f, "at {percent}% of {}", name(unit)),
            Trigger::Switch { into } => write!(f, "at the switch to {}", name(into)),
            Trigger::Delay { unit, after } => {
                write!(f, "{} ms into {}", after.as_millis(), name(unit))
            }
        }
    }
}

/// What an action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Pause, wait `hold`, resume.
    Pause {
        /// How long the task stays paused (zero: resume at once).
        hold: Duration,
        /// Try to resume before the pause has returned (must be refused while the
        /// run is still alive).
        impatient: bool,
    },
    /// Stop the task, then build a new one that continues from the checkpoints.
    StopAndRestart,
}

/// One step of the controller's script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    /// When.
    pub trigger: Trigger,
    /// What.
    pub act: Act,
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn name(unit: usize) -> &'static str {
    UNIT_NAMES.get(unit).copied().unwrap_or("?")
}

/// The script for `pauses` pauses, drawn from `seed`: the same seed gives the same
/// script. Two pauses (when there are two) land on the unit switches; the rest are
/// spread over the three units; one stop-and-restart lands in the load.
pub fn plan(seed: u64, pauses: u32) -> Vec<Action> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let pause = |rng: &mut fastrand::Rng| Act::Pause {
        // One in four resumes at once: the pattern of the original bug report.
        hold: if rng.u8(0..4) == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(rng.u64(1..=40))
        },
        impatient: rng.bool(),
    };
    let at_switches = pauses.min(2);
    let rest = pauses - at_switches;
    let in_dump = rest * 3 / 10;
    let in_load = rest * 4 / 10;
    let in_sync = rest - in_dump - in_load;
    let points = |unit: usize, n: u32, rng: &mut fastrand::Rng| {
        let mut percents: Vec<u64> = (0..n).map(|_| rng.u64(1..=95)).collect();
        percents.sort_unstable();
        percents
            .into_iter()
            .map(|percent| Trigger::Progress { unit, percent })
            .collect::<Vec<_>>()
    };

    let mut script = Vec::new();
    for trigger in points(0, in_dump, &mut rng) {
        let act = pause(&mut rng);
        script.push(Action { trigger, act });
    }
    if at_switches >= 1 {
        let act = pause(&mut rng);
        script.push(Action {
            trigger: Trigger::Switch { into: 1 },
            act,
        });
    }
    let stop_at = rng.u64(25..=70);
    let mut load: Vec<Action> = points(1, in_load, &mut rng)
        .into_iter()
        .map(|trigger| Action {
            trigger,
            act: pause(&mut rng),
        })
        .collect();
    let at = load
        .iter()
        .position(|a| matches!(a.trigger, Trigger::Progress { percent, .. } if percent > stop_at))
        .unwrap_or(load.len());
    load.insert(
        at,
        Action {
            trigger: Trigger::Progress {
                unit: 1,
                percent: stop_at,
            },
            act: Act::StopAndRestart,
        },
    );
    script.extend(load);
    if at_switches >= 2 {
        let act = pause(&mut rng);
        script.push(Action {
            trigger: Trigger::Switch { into: 2 },
            act,
        });
    }
    for _ in 0..in_sync {
        let after = Duration::from_millis(rng.u64(5..=60));
        let act = pause(&mut rng);
        script.push(Action {
            trigger: Trigger::Delay { unit: 2, after },
            act,
        });
    }
    script
}

/// Why the controller gave up.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A unit's run (or its pre-start check) failed; the task is Paused with the error.
    #[error("the {unit} unit failed: {error}")]
    UnitFailed {
        /// The unit.
        unit: String,
        /// Its error.
        error: taskstage::RunError,
    },
    /// A command failed (a timeout, or a refusal the controller did not expect).
    #[error(transparent)]
    Command(#[from] Error),
    /// The new task after the stop could not be built.
    #[error("the task could not be restarted: {0}")]
    Build(#[from] BuildError),
    /// A command reached a stage the controller does not expect.
    #[error("{command} reached {stage}, which the controller did not expect")]
    Unexpected {
        /// The command.
        command: Command,
        /// The stage it reached.
        stage: Stage,
    },
}

/// The task being controlled, and how to build it again.
#[derive(Debug)]
pub struct Pipeline {
    env: Arc<Env>,
    timeline: Arc<Timeline>,
    screen: Arc<Screen>,
    task: usize,
    handle: Handle,
    recorders: Vec<JoinHandle<()>>,
}

impl Pipeline {
    /// Builds the first task and starts it.
    ///
    /// # Errors
    ///
    /// [`ControlError::Build`] outside a runtime (never, from the program).
    pub async fn start(
        env: Arc<Env>,
        timeline: Arc<Timeline>,
        screen: Arc<Screen>,
    ) -> Result<Pipeline, ControlError> {
        let (handle, recorder) = Pipeline::spawn(&env, &timeline, &screen, 1)?;
        let pipeline = Pipeline {
            env,
            timeline,
            screen,
            task: 1,
            handle,
            recorders: vec![recorder],
        };
        pipeline.handle.resume().await?;
        Ok(pipeline)
    }

    fn spawn(
        env: &Arc<Env>,
        timeline: &Arc<Timeline>,
        screen: &Arc<Screen>,
        task: usize,
    ) -> Result<(Handle, JoinHandle<()>), BuildError> {
        let (dump, load, sync) = env.units();
        let handle = Task::builder(format!("migrate-{task}"))
            .unit(dump)
            .unit(load)
            .unit(sync)
            .spawn_paused()?;
        // Subscribed before the task starts: the timeline sees every change.
        let recorder = tokio::spawn(record(
            handle.events(),
            handle.name().to_owned(),
            task,
            Arc::clone(timeline),
            Arc::clone(screen),
        ));
        Ok((handle, recorder))
    }

    /// Builds a new task with fresh units, after a stop, and starts it: the units
    /// know nothing but what the checkpoints say.
    async fn restart(&mut self) -> Result<(), ControlError> {
        let task = self.task + 1;
        let (handle, recorder) = Pipeline::spawn(&self.env, &self.timeline, &self.screen, task)?;
        self.task = task;
        self.handle = handle;
        self.recorders.push(recorder);
        self.note(
            "restart: a new task with fresh units, continuing from the checkpoints".to_owned(),
            true,
        );
        self.handle.resume().await?;
        Ok(())
    }

    /// Stops the task unless it is already terminal (after a failure), then waits
    /// until the recorders have seen the tasks' last stages.
    pub async fn close(mut self) {
        if !self.handle.stage().is_terminal() {
            // A stop that times out leaves nothing more to do here; the summary's
            // live-run count at the end shows whether a run outlived it.
            let _ = self.handle.stop().await;
        }
        for recorder in std::mem::take(&mut self.recorders) {
            // A recorder only ends when its task is terminal; it cannot fail.
            let _ = recorder.await;
        }
    }

    fn note(&self, text: String, important: bool) {
        self.screen
            .note(&format!("task {}: {text}", self.task), important);
        self.timeline.action(self.task, text);
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // On an early return the recorders would keep their handles (and so the task)
        // alive; without them the last handle goes and the task is stopped.
        for recorder in &self.recorders {
            recorder.abort();
        }
    }
}

/// Records every stage change of one task, in order, until it is terminal. It reads
/// the task's event stream, which skips nothing (it would say so with a lag), and does
/// not keep the task alive.
async fn record(
    mut events: Events,
    name: String,
    task: usize,
    timeline: Arc<Timeline>,
    screen: Arc<Screen>,
) {
    while let Some(event) = events.next().await {
        match event {
            Event::Change(change) => {
                let snap = snapshot_of(&name, &change);
                timeline.stage(task, &snap);
                screen.stage(&snap);
            }
            Event::Lagged { missed } => {
                timeline.action(
                    task,
                    format!("{missed} changes not recorded: the timeline fell behind"),
                );
            }
        }
    }
}

/// The task's state right after `change`, as the timeline and the screen show it.
fn snapshot_of(task: &str, change: &Change) -> TaskSnapshot {
    TaskSnapshot {
        name: task.into(),
        stage: change.stage,
        generation: change.generation,
        unit: change.unit.map(|index| (index, name(index).into())),
        units: UNIT_NAMES.len(),
        outcome: change.outcome.clone(),
        user_paused: change.user_paused,
        progress: Progress::default(),
        seq: change.seq,
    }
}

fn failed(stage: Stage, outcome: Option<&Outcome>) -> bool {
    stage == Stage::Paused && outcome.is_some_and(Outcome::is_failed)
}

/// The task has ended, or stopped on a failure: no trigger can come any more.
fn over(s: &taskstage::TaskSnapshot) -> bool {
    s.stage.is_terminal() || failed(s.stage, s.outcome.as_ref())
}

/// The unit has been left behind: the task moved past it, ended, or failed.
fn past(s: &taskstage::TaskSnapshot, unit: usize) -> bool {
    s.unit_index().is_none_or(|u| u > unit) || over(s)
}

fn failure(snap: &TaskSnapshot) -> Option<ControlError> {
    if !failed(snap.stage, snap.outcome.as_ref()) {
        return None;
    }
    let error = snap.outcome.as_ref().and_then(Outcome::error).cloned()?;
    let unit = snap
        .unit
        .as_ref()
        .map_or_else(|| "last".to_owned(), |(_, name)| name.to_string());
    Some(ControlError::UnitFailed { unit, error })
}

/// Runs the script against the pipeline, then waits for the end. Counts what it did
/// into `counts` as it goes, so the figures are there even when it fails.
///
/// # Errors
///
/// [`ControlError::UnitFailed`] when a unit failed; any other variant when a command
/// did something the script does not allow for.
pub async fn drive(
    pipeline: &mut Pipeline,
    script: &[Action],
    progress: &watch::Receiver<[UnitProgress; 3]>,
    counts: &mut Counts,
) -> Result<(), ControlError> {
    for action in script {
        let on_time = reached(pipeline, action.trigger, progress).await;
        let snap = pipeline.handle.snapshot();
        if let Some(error) = failure(&snap) {
            return Err(error);
        }
        match action.act {
            Act::Pause { hold, impatient } if on_time => {
                pause_cycle(pipeline, action.trigger, hold, impatient, counts).await?;
            }
            // The moment passed (the unit completed first): skip the pause.
            Act::Pause { .. } => counts.skipped += 1,
            Act::StopAndRestart if on_time || !snap.stage.is_terminal() => {
                // The stop happens once in every run: late, if its moment passed.
                let when = if on_time {
                    action.trigger.to_string()
                } else {
                    format!("late (the moment {} had passed)", action.trigger)
                };
                stop_and_restart(pipeline, &when, counts).await?;
            }
            Act::StopAndRestart => counts.skipped += 1,
        }
        if let Some(error) = failure(&pipeline.handle.snapshot()) {
            return Err(error);
        }
    }
    let end = pipeline.handle.wait_for(over).await;
    if let Some(error) = failure(&end) {
        return Err(error);
    }
    match end.stage {
        Stage::Finished => Ok(()),
        stage => Err(ControlError::Unexpected {
            command: Command::Resume,
            stage,
        }),
    }
}

/// Waits for the trigger; `false` when its moment can no longer come.
async fn reached(
    pipeline: &Pipeline,
    trigger: Trigger,
    progress: &watch::Receiver<[UnitProgress; 3]>,
) -> bool {
    let handle = &pipeline.handle;
    match trigger {
        Trigger::Progress { unit, percent } => {
            let mut progress = progress.clone();
            tokio::select! {
                biased;
                _ = handle.wait_for(move |s| past(s, unit)) => false,
                seen = progress.wait_for(|p| p.get(unit).is_some_and(|p| p.percent() >= percent)) => {
                    seen.is_ok() && !past_now(handle, unit)
                }
            }
        }
        Trigger::Switch { into } => {
            let snap = handle
                .wait_for(move |s| s.unit_index().is_none_or(|u| u >= into) || over(s))
                .await;
            snap.unit.as_ref().is_some_and(|(u, _)| *u == into)
                && !snap.stage.is_terminal()
                && failure(&snap).is_none()
        }
        Trigger::Delay { unit, after } => {
            let snap = handle
                .wait_for(move |s| s.unit_index().is_none_or(|u| u >= unit) || over(s))
                .await;
            if snap.unit.as_ref().map(|(u, _)| *u) != Some(unit) || failure(&snap).is_some() {
                return false;
            }
            // A scripted delay, not a wait for a state: the pause lands wherever the
            // sync happens to be after this long.
            tokio::time::sleep(after).await;
            !past_now(handle, unit)
        }
    }
}

fn past_now(handle: &Handle, unit: usize) -> bool {
    let s = handle.snapshot();
    s.unit.as_ref().is_none_or(|(u, _)| *u > unit)
        || s.stage.is_terminal()
        || failed(s.stage, s.outcome.as_ref())
}

async fn pause_cycle(
    pipeline: &Pipeline,
    trigger: Trigger,
    hold: Duration,
    impatient: bool,
    counts: &mut Counts,
) -> Result<(), ControlError> {
    let handle = &pipeline.handle;
    let before = handle.snapshot();
    pipeline.note(format!("pause {trigger}"), false);
    let issued = tokio::time::Instant::now();
    let pause = handle.pause();
    tokio::pin!(pause);
    let mut resumed_early = false;
    let mut settled = None;
    if impatient {
        // Issue the pause (its first poll cancels the run) and, without waiting for it,
        // resume at once: what the original tool allowed.
        settled = tokio::select! {
            biased;
            result = &mut pause => Some(result),
            () = std::future::ready(()) => None,
        };
        if settled.is_none() {
            let stage = handle.stage();
            match handle.resume().await {
                Err(Error::Refused {
                    reason: Refusal::StillRunning,
                    ..
                }) => {
                    counts.early_resumes_refused += 1;
                    pipeline.note(
                        format!("early resume refused in {stage}: the run has not returned yet"),
                        false,
                    );
                }
                Ok(()) => {
                    // The run had already returned: the resume is a normal one.
                    resumed_early = true;
                    counts.resumes += 1;
                    pipeline.note(
                        "early resume accepted: the run had already returned".to_owned(),
                        false,
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let result = match settled {
        Some(result) => result,
        None => pause.await,
    };
    // Invariant 2, measured on the real program: a returned pause leaves no run alive
    // (unless the early resume was accepted and started the next one).
    if !resumed_early {
        counts.live_after_pause = counts.live_after_pause.max(pipeline.env.live.now());
    }
    match result {
        Ok(Stage::Paused) => {
            pipeline.note(
                format!(
                    "pause returned Paused after {}: the run has returned",
                    millis(issued.elapsed())
                ),
                false,
            );
            counts.pauses += 1;
            if matches!(trigger, Trigger::Switch { .. }) {
                counts.pauses_at_switch += 1;
            }
            let after = handle.snapshot();
            if after.unit.as_ref().map(|(u, _)| *u) != before.unit.as_ref().map(|(u, _)| *u)
                && before.stage == Stage::Running
            {
                counts.pauses_over_completion += 1;
            }
            if failure(&after).is_some() {
                return Ok(());
            }
            if resumed_early {
                return Ok(());
            }
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            pipeline.note(
                format!("resume after {} ms paused", hold.as_millis()),
                false,
            );
            handle.resume().await?;
            counts.resumes += 1;
            Ok(())
        }
        Ok(Stage::Finished)
        | Err(Error::Refused {
            reason: Refusal::Finished,
            ..
        }) => {
            counts.skipped += 1;
            pipeline.note("the pause met the end of the pipeline".to_owned(), false);
            Ok(())
        }
        Ok(stage) => Err(ControlError::Unexpected {
            command: Command::Pause,
            stage,
        }),
        Err(e) => Err(e.into()),
    }
}

async fn stop_and_restart(
    pipeline: &mut Pipeline,
    when: &str,
    counts: &mut Counts,
) -> Result<(), ControlError> {
    pipeline.note(format!("stop {when}"), true);
    let issued = tokio::time::Instant::now();
    let stopped = pipeline.handle.stop().await?;
    pipeline.note(
        format!(
            "stop returned {stopped} after {}: the run has returned, the units are closed",
            millis(issued.elapsed())
        ),
        false,
    );
    counts.live_after_pause = counts.live_after_pause.max(pipeline.env.live.now());
    match stopped {
        Stage::Stopped => {
            counts.stops += 1;
            pipeline.restart().await?;
            counts.restarts += 1;
            Ok(())
        }
        Stage::Finished => {
            pipeline.note("the stop met the end of the pipeline".to_owned(), true);
            Ok(())
        }
        stage => Err(ControlError::Unexpected {
            command: Command::Stop,
            stage,
        }),
    }
}
