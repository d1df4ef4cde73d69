//! What the crate reports through the `metrics` facade (feature `metrics`).
//!
//! Without the feature every function here is empty and compiles away. With it, the
//! metrics go to whatever recorder the application installed (Prometheus, StatsD, a
//! test's recorder); the crate installs none.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `taskstage_tasks` | gauge | `stage` | tasks in each stage now (a task counts until the last of its handles, observers and event streams is gone and no run or close of it is in flight) |
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

/// A task was created (it is in New).
#[inline]
pub(crate) fn created() {
    #[cfg(feature = "metrics")]
    metrics::gauge!(names::TASKS, "stage" => Stage::New.name()).increment(1.0);
}

/// A task is gone; it was last in `stage`.
#[inline]
pub(crate) fn retired(stage: Stage) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(names::TASKS, "stage" => stage.name()).decrement(1.0);
    #[cfg(not(feature = "metrics"))]
    let _ = stage;
}

/// A change from `from` to `to` was accepted.
#[inline]
pub(crate) fn transition(from: Stage, to: Stage) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(names::TRANSITIONS, "from" => from.name(), "to" => to.name())
            .increment(1);
        if from != to {
            metrics::gauge!(names::TASKS, "stage" => from.name()).decrement(1.0);
            metrics::gauge!(names::TASKS, "stage" => to.name()).increment(1.0);
        }
    }
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
