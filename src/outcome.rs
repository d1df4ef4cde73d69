//! What the last run returned.

use crate::error::RunError;

/// What the last run (or pre-start check) of a task returned.
///
/// Whether the *user* paused the task is a separate mark (see
/// [`TaskSnapshot::user_paused`](crate::TaskSnapshot::user_paused)), set because the
/// pause command was issued, never inferred from an error's text.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Outcome {
    /// The unit completed.
    Completed,
    /// The run or the pre-start check failed (returned an error or panicked).
    Failed(RunError),
    /// The run returned because a pause or a stop cancelled it.
    Cancelled,
    /// The run (or check) did not return: it was aborted, its future dropped
    /// unfinished, by a stop that escalated after its grace, a dropped last handle,
    /// or a runtime that shut down. What it was doing was cut off wherever it was;
    /// as with [`Outcome::Cancelled`], the task's stage says where it stands.
    Aborted,
}

impl Outcome {
    /// The error, if the outcome is a failure.
    pub fn error(&self) -> Option<&RunError> {
        match self {
            Outcome::Failed(error) => Some(error),
            Outcome::Completed | Outcome::Cancelled | Outcome::Aborted => None,
        }
    }

    /// Whether the outcome is a failure.
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }

    /// The outcome's name, as the HTTP API and the command line print it:
    /// `completed`, `failed`, `cancelled` or `aborted`.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskstage::{Outcome, RunError};
    ///
    /// assert_eq!(Outcome::Completed.name(), "completed");
    /// assert_eq!(Outcome::Failed(RunError::msg("disk full")).name(), "failed");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed(_) => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Aborted => "aborted",
        }
    }
}

/// How a run or a pre-start check ended, as reported to the lifecycle core.
#[derive(Debug, Clone)]
pub enum Exit {
    /// It returned Ok: for a run, the unit is complete.
    Ok,
    /// It returned an error or panicked.
    Failed(RunError),
    /// It returned because it was cancelled.
    Cancelled,
    /// It did not return: its future was dropped unfinished (an abort).
    Aborted,
}
