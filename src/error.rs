//! Typed errors: refused commands, timeouts, and the errors runs return.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::stage::{Command, Stage};

/// Why the transition table refused a command.
///
/// A refusal changes nothing: the stage, the generation, the outcome and the
/// user-paused mark are exactly as they were before the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The task was never started, so there is nothing to pause.
    NotStarted,
    /// A run is alive already.
    AlreadyRunning,
    /// A pause was accepted but the run has not returned yet.
    StillRunning,
    /// A resume was accepted already; its pre-start check is running.
    AlreadyResuming,
    /// A run or a pre-start check holds the unit, so the configuration cannot change.
    UnitInUse,
    /// A stop was accepted; only stop (to wait for it) is allowed.
    StopInProgress,
    /// The task was stopped; that is final.
    Stopped,
    /// Every unit completed; that is final.
    Finished,
    /// A conditional command found that the task had changed since the caller
    /// observed it (see `Handle::resume_if_unchanged`).
    Changed,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::NotStarted => "the task was never started",
            Refusal::AlreadyRunning => "a run is already alive",
            Refusal::StillRunning => "the run has not returned yet",
            Refusal::AlreadyResuming => "a resume is already in progress",
            Refusal::UnitInUse => "a run holds the unit",
            Refusal::StopInProgress => "a stop is in progress",
            Refusal::Stopped => "the task is stopped",
            Refusal::Finished => "the task is finished",
            Refusal::Changed => "the task changed since it was observed",
        })
    }
}

/// An error from a command issued to a task.
///
/// Every variant names the command and the stage it met, so a log line is enough
/// to see what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transition table refused the command; nothing changed.
    #[error("{command} refused in stage {stage}: {reason}")]
    Refused {
        /// The command that was refused.
        command: Command,
        /// The stage the command met.
        stage: Stage,
        /// Why it was refused.
        reason: Refusal,
    },
    /// The command was accepted, but the run did not return before the deadline.
    ///
    /// The stage is still transitional (`Pausing` or `Stopping`): it does not claim a
    /// rest that has not happened. Waiting again, or a stop, can follow.
    #[error("{command} timed out after {waited:?}: the task is still {stage}")]
    Timeout {
        /// The command whose wait timed out.
        command: Command,
        /// The stage when the wait gave up.
        stage: Stage,
        /// How long the command waited.
        waited: Duration,
    },
}

impl Error {
    /// The command this error is about.
    pub fn command(&self) -> Command {
        match self {
            Error::Refused { command, .. } | Error::Timeout { command, .. } => *command,
        }
    }

    /// The stage the command met (for a timeout: the stage when the wait gave up).
    pub fn stage(&self) -> Stage {
        match self {
            Error::Refused { stage, .. } | Error::Timeout { stage, .. } => *stage,
        }
    }

    /// What went wrong, without the figures (how long a timeout waited): for
    /// assertions and for deciding what to do next.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskstage::{Command, Error, ErrorKind, Refusal, Stage};
    ///
    /// let timeout = Error::Timeout { command: Command::Pause, stage: Stage::Pausing, waited: Duration::from_secs(3) };
    /// assert_eq!(timeout.kind(), ErrorKind::Timeout);
    /// let refused = Error::Refused { command: Command::Resume, stage: Stage::Pausing, reason: Refusal::StillRunning };
    /// assert_eq!(refused.kind(), ErrorKind::Refused(Refusal::StillRunning));
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Refused { reason, .. } => ErrorKind::Refused(*reason),
            Error::Timeout { .. } => ErrorKind::Timeout,
        }
    }

    /// Its name in the error vocabulary: [`ErrorCode::Refused`] or
    /// [`ErrorCode::Timeout`].
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Refused { .. } => ErrorCode::Refused,
            Error::Timeout { .. } => ErrorCode::Timeout,
        }
    }
}

/// Which kind of [`Error`] it is: see [`Error::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The command was refused, for this reason; nothing changed.
    Refused(Refusal),
    /// The command was accepted, but its wait ended before the run returned.
    Timeout,
}

/// The machine-readable name of an error: one vocabulary, defined here, that the
/// HTTP API answers as `error_code` and the command line prints as `error_code` in
/// its JSON errors, so a script reads one name per kind of failure whichever
/// door it came through.
///
/// Each code is one kind of failure a caller can act on; the message beside it
/// says which input, which stage, which key. Not every layer answers every code:
/// the core's own errors map to two of them ([`Error::code`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskstage::{Command, Error, ErrorCode, Stage};
///
/// let timeout = Error::Timeout { command: Command::Pause, stage: Stage::Pausing, waited: Duration::from_secs(3) };
/// assert_eq!(timeout.code(), ErrorCode::Timeout);
/// assert_eq!(ErrorCode::Timeout.as_str(), "timeout");
/// assert_eq!(ErrorCode::from_name("unknown_task"), Some(ErrorCode::UnknownTask));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The input is malformed: a usage error, an invalid id, prefix or stage
    /// name, a body that does not parse, a spec file that cannot be read.
    BadRequest,
    /// No task of that id exists.
    UnknownTask,
    /// No worker of that id is a member.
    UnknownWorker,
    /// A task of that id exists already.
    Exists,
    /// The task's stage refuses the command (a stopped task is final); nothing
    /// changed.
    Refused,
    /// A stop's run has returned, but the task's stage has not been published
    /// yet; asking again succeeds.
    StillSettling,
    /// Another controller changed the task between the read and the write.
    Conflict,
    /// The command was accepted, and its wait ended before the work answered it.
    Timeout,
    /// The store could not be reached; nothing was written.
    Unreachable,
    /// The input is over a documented limit.
    TooLarge,
    /// No credentials, or wrong ones.
    Unauthorized,
    /// The credentials do not allow the command.
    Forbidden,
    /// A request from a page of another origin, which a browser would let any
    /// web page send.
    CrossOrigin,
    /// A request for another host name than the server's (a rebound name).
    ForbiddenHost,
    /// No such route.
    NotFound,
    /// The route exists, with other methods.
    MethodNotAllowed,
    /// A body of a type the route does not take.
    UnsupportedMediaType,
    /// The server was built without what the route needs.
    NotAvailable,
    /// The server cannot listen on the address asked for.
    CannotListen,
    /// A server that would be open to every caller, started without a token.
    NoToken,
    /// The output could not be written.
    Output,
    /// A failure the caller cannot fix: a bug, or a store that holds what no
    /// version of the crate wrote.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order they are declared.
    pub const ALL: [ErrorCode; 22] = [
        ErrorCode::BadRequest,
        ErrorCode::UnknownTask,
        ErrorCode::UnknownWorker,
        ErrorCode::Exists,
        ErrorCode::Refused,
        ErrorCode::StillSettling,
        ErrorCode::Conflict,
        ErrorCode::Timeout,
        ErrorCode::Unreachable,
        ErrorCode::TooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::CrossOrigin,
        ErrorCode::ForbiddenHost,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::NotAvailable,
        ErrorCode::CannotListen,
        ErrorCode::NoToken,
        ErrorCode::Output,
        ErrorCode::Internal,
    ];

    /// The code as it goes on the wire: lower case, words joined by `_`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownTask => "unknown_task",
            ErrorCode::UnknownWorker => "unknown_worker",
            ErrorCode::Exists => "exists",
            ErrorCode::Refused => "refused",
            ErrorCode::StillSettling => "still_settling",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unreachable => "unreachable",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::CrossOrigin => "cross_origin",
            ErrorCode::ForbiddenHost => "forbidden_host",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::NotAvailable => "not_available",
            ErrorCode::CannotListen => "cannot_listen",
            ErrorCode::NoToken => "no_token",
            ErrorCode::Output => "output",
            ErrorCode::Internal => "internal",
        }
    }

    /// The code named `name` on the wire; `None` for a name this version does not
    /// know (a newer server's, perhaps).
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error a task cannot be built from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The pipeline has no units: there would be nothing to run.
    #[error("a task needs at least one unit, and this pipeline has none")]
    EmptyPipeline,
    /// The task was built outside a tokio runtime, so there is nowhere to run it.
    #[error("a task must be spawned from within a tokio runtime")]
    NoRuntime,
    /// The tokio runtime was built without timers: nothing could bound a pause's
    /// wait or abort a run that ignores its stop after the grace period.
    #[error(
        "a task needs a tokio runtime with timers: call `enable_time` (or `enable_all`) \
         on the runtime builder"
    )]
    NoTimers,
}

/// The error a run (or a pre-start check) returned, kept as the task's outcome.
///
/// Cheap to clone (it is shared), so snapshots and subscribers can all hold it.
///
/// It works the way `anyhow::Error` does, so `?` works inside a unit: every error
/// type (`std::error::Error + Send + Sync + 'static`) converts into it and stays
/// reachable for a downcast ([`RunError::downcast_ref`]); text becomes one with
/// [`RunError::msg`]. For that conversion to exist, `RunError` itself does not
/// implement `std::error::Error` (it would convert into itself); it converts into
/// `Box<dyn std::error::Error + Send + Sync>` (and `Box<dyn std::error::Error>`), so
/// `?` on it works in a function that returns one of those, and
/// [`RunError::as_error`] lends it as one.
///
/// # Examples
///
/// ```
/// use taskstage::{RunContext, RunError, RunExit, Unit};
///
/// struct Load;
///
/// impl Unit for Load {
///     async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
///         let rows: u64 = "12".parse()?; // any error type converts
///         if rows == 0 {
///             return Err(RunError::msg("nothing to load")); // and so does text
///         }
///         Ok(RunExit::Completed)
///     }
/// }
///
/// # let _ = Load;
/// let err = RunError::msg("connection reset");
/// assert_eq!(err.to_string(), "connection reset");
/// assert!(!err.is_panic());
///
/// let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow disk");
/// let err = RunError::from(io);
/// assert_eq!(err.to_string(), "slow disk");
/// assert_eq!(err.downcast_ref::<std::io::Error>().map(|e| e.kind()), Some(std::io::ErrorKind::TimedOut));
/// ```
#[derive(Clone)]
pub struct RunError {
    inner: Arc<dyn StdError + Send + Sync + 'static>,
    kind: RunErrorKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunErrorKind {
    Returned,
    Panicked,
    Unrequested,
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

impl RunError {
    /// Wraps any error; the same as `RunError::from(error)` or `?`.
    pub fn new<E>(error: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        RunError {
            inner: Arc::new(error),
            kind: RunErrorKind::Returned,
        }
    }

    /// An error with just a message: text (`&str`, `String`), or anything that
    /// displays.
    pub fn msg(message: impl fmt::Display) -> Self {
        RunError::new(Message(message.to_string()))
    }

    /// The error recorded when a unit panics; the message is the panic's, when it was
    /// a string.
    #[cfg_attr(
        taskstage_loom,
        allow(
            dead_code,
            reason = "only the tokio layer, left out under loom, catches panics"
        )
    )]
    pub(crate) fn from_panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let text = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic with a non-string payload".to_owned()
        };
        RunError {
            inner: Arc::new(Message(format!("unit panicked: {text}"))),
            kind: RunErrorKind::Panicked,
        }
    }

    /// The error recorded when a run reports that it was cancelled although nobody
    /// asked it to stop: the table treats that as a failure.
    pub(crate) fn unrequested_cancel() -> Self {
        RunError {
            inner: Arc::new(Message(
                "the run reported cancellation, but no pause or stop was issued".to_owned(),
            )),
            kind: RunErrorKind::Unrequested,
        }
    }

    /// Whether this error records a panic of the unit.
    pub fn is_panic(&self) -> bool {
        self.kind == RunErrorKind::Panicked
    }

    /// Whether this error records a cancellation that no command asked for.
    pub fn is_unrequested_cancel(&self) -> bool {
        self.kind == RunErrorKind::Unrequested
    }

    /// The wrapped error, to downcast to the type the unit returned.
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.inner
    }

    /// The wrapped error, if it is of type `E`.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.inner.downcast_ref::<E>()
    }

    /// The error as a `std::error::Error`, for an API that wants one (its `source`
    /// is the wrapped error's).
    pub fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.inner
    }
}

impl<E> From<E> for RunError
where
    E: StdError + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        RunError::new(error)
    }
}

impl From<RunError> for Box<dyn StdError + Send + Sync + 'static> {
    fn from(error: RunError) -> Self {
        Box::new(Shared(error))
    }
}

impl From<RunError> for Box<dyn StdError + 'static> {
    fn from(error: RunError) -> Self {
        Box::new(Shared(error))
    }
}

/// A [`RunError`] boxed as a `std::error::Error`: it shows as the error it wraps.
#[derive(Debug)]
struct Shared(RunError);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Shared {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.inner.source()
    }
}

impl fmt::Debug for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunError")
            .field("kind", &self.kind)
            .field("message", &self.inner.to_string())
            .finish()
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn every_code_has_one_name_of_its_own_that_reads_back() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.as_str()), Some(code), "{code:?}");
            assert_eq!(code.to_string(), code.as_str());
            assert!(
                code.as_str()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_'),
                "{code:?}"
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len(), "two codes share a name");
        assert_eq!(ErrorCode::from_name("no_such_task"), None);
    }
}
