//! What the crate reports through the `metrics` facade (feature `metrics`).
//!
//! Without the feature every function here is empty and compiles away. With it, the
//! metrics go to whatever recorder the application installed (Prometheus, StatsD, a
//! test's recorder); the crate installs none.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `taskstage_tasks` | gauge | `stage` | tasks in each stage now: each task that exists once, in the stage of its newest change (a task counts until the last of its handles, observers and event streams is gone and no run or close of it is in flight); reported to the recorder current where the task was spawned |
//! | `taskstage_transitions_total` | counter | `from`, `to` | accepted changes (including those that keep the stage, such as a pause in Paused) |
//! | `taskstage_refused_total` | counter | `command`, `stage` | commands the table refused |
//! | `taskstage_pause_seconds` | histogram | `reached` | from a pause's acceptance until its rest (`Paused`, `Finished` or `Stopped`) |
//! | `taskstage_stop_seconds` | histogram | `reached` | from a stop's acceptance until `Stopped` (or `Finished`) |
//! | `taskstage_auto_resumes_total` | counter | – | resumes issued by the auto-resume policy and accepted |

use crate::stage::{Command, Stage};

#[cfg(feature = "metrics")]
mod names {
    pub(super) const TASKS: &str = "taskstage_tasks";
    pub(super) const TRANSITIONS: &str = "taskstage_transitions_total";
    pub(super) const REFUSED: &str = "taskstage_refused_total";
    pub(super) const PAUSE: &str = "taskstage_pause_seconds";
    pub(super) const STOP: &str = "taskstage_stop_seconds";
    pub(super) const AUTO_RESUMES: &str = "taskstage_auto_resumes_total";
}

/// The `taskstage_tasks{stage}` gauges of one task, and the stage they count it in.
///
/// The gauge handles are registered once, when the task is created, with the
/// recorder current there (the process-wide one, or one set for that thread with
/// `metrics::with_local_recorder`); every later change goes to those handles,
/// whichever thread makes it (a run's, the blocking pool's), so a task is counted by
/// one recorder for its whole life.
///
/// # Invariants
/// 1. While the task exists it adds exactly 1 to one gauge: the one of `counted`,
///    the stage of its newest published change.
/// 2. Once retired it adds 0 to every gauge, and nothing moves it again.
///
/// The owner calls [`TaskGauges::moved`] only for a change newer than every one it
/// told before, and every method under one lock of its own, so the moves of one task
/// are applied one at a time, in the core's order: no gauge goes below 0 even for an
/// instant. That lock is a leaf: the recorder's gauge handle is the only code run
/// under it, and no taskstage lock is taken inside it.
pub(crate) struct TaskGauges {
    #[cfg(feature = "metrics")]
    handles: [metrics::Gauge; Stage::ALL.len()],
    /// `None` once retired.
    #[cfg(feature = "metrics")]
    counted: Option<Stage>,
}

impl std::fmt::Debug for TaskGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TaskGauges");
        #[cfg(feature = "metrics")]
        d.field("counted", &self.counted);
        d.finish_non_exhaustive()
    }
}

impl TaskGauges {
    /// A task was created: it counts in New.
    #[inline]
    pub(crate) fn created() -> Self {
        #[cfg(feature = "metrics")]
        {
            let handles =
                Stage::ALL.map(|stage| metrics::gauge!(names::TASKS, "stage" => stage.name()));
            handles[Stage::New as usize].increment(1.0);
            TaskGauges {
                handles,
                counted: Some(Stage::New),
            }
        }
        #[cfg(not(feature = "metrics"))]
        TaskGauges {}
    }

    /// The task's newest published change left it in `to`.
    #[inline]
    pub(crate) fn moved(&mut self, to: Stage) {
        #[cfg(feature = "metrics")]
        if let Some(from) = self.counted.filter(|&from| from != to) {
            // The new stage first: the task is never counted nowhere.
            self.handles[to as usize].increment(1.0);
            self.handles[from as usize].decrement(1.0);
            self.counted = Some(to);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = to;
    }

    /// The task is gone: it leaves the gauge it was counted in (invariant 2).
    #[inline]
    pub(crate) fn retired(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(stage) = self.counted.take() {
            self.handles[stage as usize].decrement(1.0);
        }
    }
}

/// A change from `from` to `to` was accepted (the tasks gauge moves apart, in
/// [`TaskGauges`]).
#[inline]
pub(crate) fn transition(from: Stage, to: Stage) {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::TRANSITIONS, "from" => from.name(), "to" => to.name()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (from, to);
}

/// `command` was refused in `stage`.
#[inline]
pub(crate) fn refused(command: Command, stage: Stage) {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::REFUSED, "command" => command.name(), "stage" => stage.name())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (command, stage);
}

/// When a command was accepted, for the latency histograms. Without the feature it
/// is empty, and reading it costs no clock read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Since {
    #[cfg(feature = "metrics")]
    at: tokio::time::Instant,
}

impl Since {
    /// Now.
    #[inline]
    pub(crate) fn now() -> Self {
        Since {
            #[cfg(feature = "metrics")]
            at: tokio::time::Instant::now(),
        }
    }
}

/// A pause or a stop, accepted at `since`, settled in `reached`.
#[inline]
pub(crate) fn settled(command: Command, reached: Stage, since: Since) {
    #[cfg(feature = "metrics")]
    {
        let elapsed = since.at.elapsed();
        match command {
            Command::Pause => {
                metrics::histogram!(names::PAUSE, "reached" => reached.name()).record(elapsed)
            }
            Command::Stop => {
                metrics::histogram!(names::STOP, "reached" => reached.name()).record(elapsed)
            }
            Command::Resume | Command::Update => {}
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (command, reached, since);
}

/// The auto-resume policy resumed a task.
#[inline]
pub(crate) fn auto_resumed() {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::AUTO_RESUMES).increment(1);
}
