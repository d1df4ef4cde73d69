//! The command's errors: each one a line naming the task, the stage and what to do,
//! with its exit code.

use std::time::Duration;

use serde_json::{json, Value};
use taskstage::ErrorCode;
use taskstage_cluster::{ClusterError, FileProblem};

/// Exit code: a command was refused or timed out.
pub(crate) const REFUSED: u8 = 1;
/// Exit code: bad usage or bad input; nothing was written.
pub(crate) const BAD_INPUT: u8 = 2;
/// Exit code: the store could not be reached; nothing was written.
pub(crate) const UNREACHABLE: u8 = 3;

/// What went wrong with a command, for one task (or for the whole command).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The command line does not parse.
    #[error("{message}")]
    Usage {
        /// clap's message, first line.
        message: String,
    },
    /// The key prefix cannot be used.
    #[error("invalid prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// As given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A task id cannot be a key component.
    #[error("{command}: invalid task id {id:?}: {reason}")]
    InvalidTask {
        /// The command.
        command: &'static str,
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A stage name that is not one of the desired stages.
    #[error("{command}: unknown stage {value:?}")]
    UnknownStage {
        /// The command.
        command: &'static str,
        /// As given.
        value: String,
    },
    /// No task with this id under the prefix.
    #[error("{command}: task {task} does not exist under prefix {prefix}")]
    NoSuchTask {
        /// The command.
        command: &'static str,
        /// The task.
        task: String,
        /// The prefix looked under.
        prefix: String,
    },
    /// A worker id cannot be a key component.
    #[error("{command}: invalid worker id {id:?}: {reason}")]
    InvalidWorker {
        /// The command.
        command: &'static str,
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No live member with this id under the prefix.
    #[error("{command}: worker {worker} is not a member under prefix {prefix}")]
    NoSuchWorker {
        /// The command.
        command: &'static str,
        /// The worker.
        worker: String,
        /// The prefix looked under.
        prefix: String,
    },
    /// A drained worker still held tasks at the deadline.
    #[error(
        "drain of worker {worker} not done within {}: it still holds {held} task(s)",
        seconds(*waited)
    )]
    NotDrained {
        /// The worker.
        worker: String,
        /// How many tasks it still held.
        held: usize,
        /// How long the command waited.
        waited: Duration,
    },
    /// `--all` found nothing to act on.
    #[error("{command} --all: no task to {command} under prefix {prefix}")]
    NoTasks {
        /// The command.
        command: &'static str,
        /// The prefix looked under.
        prefix: String,
    },
    /// The spec file cannot be read.
    #[error("create {task}: cannot read the spec file {path}: {source}")]
    SpecFile {
        /// The task.
        task: String,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The store file given with `--store` cannot be used as a store.
    #[error("{command}: store file {}: {problem}", path.display())]
    StoreFile {
        /// The command.
        command: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: FileProblem,
    },
    /// The store did not answer.
    #[error("{command}: store unreachable ({op}): {detail}")]
    Unreachable {
        /// The command.
        command: &'static str,
        /// The store operation.
        op: &'static str,
        /// What the client reported.
        detail: String,
    },
    /// The task is stopped, which is final.
    #[error("{command} of task {task} refused: it is stopped, and that is final")]
    Stopped {
        /// The command.
        command: &'static str,
        /// The task.
        task: String,
    },
    /// A task with this id exists already.
    #[error("create: task {task} already exists (desired stage {desired})")]
    Exists {
        /// The task.
        task: String,
        /// Its desired stage, when it could be read.
        desired: String,
    },
    /// The command lost a race with another controller.
    #[error("{command} of task {task} refused: its desired stage changed meanwhile")]
    Conflict {
        /// The command.
        command: &'static str,
        /// The task.
        task: String,
    },
    /// The task's owner did not answer before the deadline.
    #[error(
        "{command} of task {task} not answered within {}: owner {}, stuck in stage {}",
        seconds(*waited),
        owner.as_deref().unwrap_or("none"),
        stage.as_deref().unwrap_or("none (no report yet)")
    )]
    NotAnswered {
        /// The command.
        command: &'static str,
        /// The task.
        task: String,
        /// Its owner at the deadline.
        owner: Option<String>,
        /// The stage its owner last reported.
        stage: Option<String>,
        /// How long the command waited.
        waited: Duration,
        /// The desired stage that stays written.
        desired: &'static str,
    },
    /// `serve` could not listen on its address.
    #[error("serve: cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// `serve` could not make a token for the run (the operating system gave no
    /// random bytes).
    #[error("serve: cannot make a token for this run: {source}; set TASKSTAGE_ADMIN_TOKEN")]
    Token {
        /// Why.
        source: getrandom::Error,
    },
    /// Any other failure of the store or of its values.
    #[error("{command}: {error}")]
    Other {
        /// The command.
        command: &'static str,
        /// The task, when the failure is about one.
        task: Option<String>,
        /// The library's error (boxed: it is the largest variant).
        error: Box<ClusterError>,
    },
    /// A command's own task ended without an answer (a bug of this program).
    #[error("{command} of task {task}: {detail}")]
    Internal {
        /// The command.
        command: &'static str,
        /// The task.
        task: String,
        /// What happened.
        detail: String,
    },
    /// The output could not be written.
    #[error("{command}: cannot write the output: {source}")]
    Output {
        /// The command.
        command: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl CliError {
    /// Converts a library error of `command` on `task`.
    pub(crate) fn cluster(
        command: &'static str,
        task: Option<&str>,
        prefix: &str,
        error: ClusterError,
    ) -> Self {
        let task_text = task.map(str::to_owned);
        match error {
            ClusterError::NoSuchTask { task } => CliError::NoSuchTask {
                command,
                task: task.to_string(),
                prefix: prefix.to_owned(),
            },
            ClusterError::InvalidTaskId { id, reason } => CliError::InvalidTask {
                command,
                id,
                reason,
            },
            ClusterError::InvalidWorkerId { id, reason } => CliError::InvalidWorker {
                command,
                id,
                reason,
            },
            ClusterError::NoSuchWorker { worker, .. } => CliError::NoSuchWorker {
                command,
                worker: worker.to_string(),
                prefix: prefix.to_owned(),
            },
            ClusterError::DrainTimeout {
                worker,
                held,
                waited,
            } => CliError::NotDrained {
                worker: worker.to_string(),
                held,
                waited,
            },
            ClusterError::InvalidPrefix { prefix, reason } => {
                CliError::InvalidPrefix { prefix, reason }
            }
            ClusterError::StoreFile { path, problem } => CliError::StoreFile {
                command,
                path,
                problem,
            },
            ClusterError::Unreachable { op, detail } => CliError::Unreachable {
                command,
                op,
                detail,
            },
            ClusterError::Stopped { task, .. } => CliError::Stopped {
                command,
                task: task.to_string(),
            },
            ClusterError::TaskExists { task } => CliError::Exists {
                task: task.to_string(),
                desired: "unknown".into(),
            },
            ClusterError::Conflict { task, .. } => CliError::Conflict {
                command,
                task: task.to_string(),
            },
            ClusterError::Timeout {
                task,
                owner,
                stage,
                waited,
                ..
            } => CliError::NotAnswered {
                command,
                task: task.to_string(),
                owner: owner.map(|o| o.to_string()),
                stage: stage.map(|s| s.name().to_owned()),
                waited,
                desired: desired_of(command),
            },
            error => CliError::Other {
                command,
                task: task_text,
                error: Box::new(error),
            },
        }
    }

    /// The exit code.
    pub(crate) fn code(&self) -> u8 {
        match self {
            CliError::Usage { .. }
            | CliError::InvalidPrefix { .. }
            | CliError::InvalidTask { .. }
            | CliError::UnknownStage { .. }
            | CliError::NoSuchTask { .. }
            | CliError::InvalidWorker { .. }
            | CliError::NoSuchWorker { .. }
            | CliError::NoTasks { .. }
            | CliError::SpecFile { .. }
            | CliError::StoreFile { .. }
            | CliError::Listen { .. } => BAD_INPUT,
            CliError::Unreachable { .. } => UNREACHABLE,
            CliError::Stopped { .. }
            | CliError::Exists { .. }
            | CliError::Conflict { .. }
            | CliError::NotAnswered { .. }
            | CliError::NotDrained { .. }
            | CliError::Other { .. }
            | CliError::Internal { .. }
            | CliError::Output { .. }
            | CliError::Token { .. } => REFUSED,
        }
    }

    /// Its name in the library's error vocabulary (the HTTP API answers the same
    /// names), for scripts.
    pub(crate) fn kind(&self) -> ErrorCode {
        match self {
            CliError::Usage { .. }
            | CliError::InvalidPrefix { .. }
            | CliError::InvalidTask { .. }
            | CliError::UnknownStage { .. }
            | CliError::InvalidWorker { .. }
            | CliError::SpecFile { .. }
            | CliError::StoreFile { .. } => ErrorCode::BadRequest,
            CliError::Listen { .. } => ErrorCode::CannotListen,
            CliError::Token { .. } => ErrorCode::NoToken,
            CliError::NoSuchTask { .. } | CliError::NoTasks { .. } => ErrorCode::UnknownTask,
            CliError::NoSuchWorker { .. } => ErrorCode::UnknownWorker,
            CliError::NotDrained { .. } | CliError::NotAnswered { .. } => ErrorCode::Timeout,
            CliError::Unreachable { .. } => ErrorCode::Unreachable,
            CliError::Stopped { .. } => ErrorCode::Refused,
            CliError::Exists { .. } => ErrorCode::Exists,
            CliError::Conflict { .. } => ErrorCode::Conflict,
            CliError::Other { .. } | CliError::Internal { .. } => ErrorCode::Internal,
            CliError::Output { .. } => ErrorCode::Output,
        }
    }

    /// The task it is about, if one.
    pub(crate) fn task(&self) -> Option<&str> {
        match self {
            CliError::InvalidTask { id: task, .. }
            | CliError::NoSuchTask { task, .. }
            | CliError::SpecFile { task, .. }
            | CliError::Stopped { task, .. }
            | CliError::Exists { task, .. }
            | CliError::Conflict { task, .. }
            | CliError::NotAnswered { task, .. }
            | CliError::Internal { task, .. } => Some(task),
            CliError::Other { task, .. } => task.as_deref(),
            _ => None,
        }
    }

    /// The stage it met, if one is known: the observed stage a timed-out task is
    /// stuck in, or the desired stage that refused the command.
    pub(crate) fn stage(&self) -> Option<&str> {
        match self {
            CliError::NotAnswered { stage, .. } => stage.as_deref(),
            CliError::Stopped { .. } => Some("Stopped"),
            CliError::Exists { desired, .. } => Some(desired),
            _ => None,
        }
    }

    /// The owner it met, if one.
    pub(crate) fn owner(&self) -> Option<&str> {
        match self {
            CliError::NotAnswered { owner, .. } => owner.as_deref(),
            _ => None,
        }
    }

    /// What to do about it.
    pub(crate) fn hint(&self) -> String {
        match self {
            CliError::Usage { .. } => "see `taskstage --help`".into(),
            CliError::Listen { .. } => {
                "choose a free address you may bind (--listen IP:PORT)".into()
            }
            CliError::InvalidPrefix { .. } => {
                "give the prefix the workers use (--prefix or TASKSTAGE_PREFIX)".into()
            }
            CliError::InvalidTask { .. } => {
                "a task id is one key component: no '/', '@' or whitespace, at most 128 bytes"
                    .into()
            }
            CliError::UnknownStage { .. } => "give one of Running, Paused, Stopped".into(),
            CliError::NoSuchTask { .. } | CliError::NoTasks { .. } => {
                "`taskstage list` shows the tasks; check --prefix".into()
            }
            CliError::SpecFile { .. } => "give a readable file, or '-' for standard input".into(),
            CliError::InvalidWorker { .. } => {
                "a worker id is one key component: no '/', '@' or whitespace, at most 128 bytes"
                    .into()
            }
            CliError::NoSuchWorker { .. } => {
                "`taskstage workers` shows the members; check --prefix".into()
            }
            CliError::NotDrained { worker, .. } => format!(
                "its hand-overs are under way, or a run has not returned: `taskstage list` \
                 shows what {worker} holds; the drain stays written, run it again to wait more"
            ),
            CliError::Unreachable { .. } => "check --endpoints (or ETCD_ENDPOINTS) and that \
                 etcd is up, or with --store that no other program holds the file locked; \
                 nothing was written"
                .into(),
            CliError::StoreFile { .. } => "--store sqlite:PATH names a taskstage store file \
                 (its first open makes it); nothing was written"
                .into(),
            CliError::Stopped { task, .. } => {
                format!("create a new task to run it again (`taskstage status {task}`)")
            }
            CliError::Exists { task, .. } => {
                format!("choose another id, or act on this one (`taskstage status {task}`)")
            }
            CliError::Conflict { task, .. } => {
                format!("another controller changed it: `taskstage status {task}`, then retry")
            }
            CliError::NotAnswered {
                task,
                owner,
                stage,
                desired,
                ..
            } => match (owner, stage) {
                (None, _) => format!(
                    "no worker holds {task}: start one (`taskstage workers`); the desired \
                     stage stays {desired}"
                ),
                (Some(owner), None) => format!(
                    "worker {owner} has not reported on {task}: look at its log; the desired \
                     stage stays {desired}"
                ),
                (Some(owner), Some(_)) => format!(
                    "a unit of {task} on worker {owner} has not returned: look at its log, or \
                     `taskstage stop {task}` (a stop aborts a stuck run); the desired stage \
                     stays {desired}"
                ),
            },
            CliError::Other { .. } => "look at the key named, and at etcd's health".into(),
            CliError::Internal { task, .. } => {
                format!("`taskstage status {task}` shows where it is; please report this")
            }
            CliError::Output { .. } => "check where the output goes".into(),
            CliError::Token { .. } => {
                "choose a token with TASKSTAGE_ADMIN_TOKEN, or serve with --no-token".into()
            }
        }
    }

    /// The error as one line of text.
    pub(crate) fn line(&self) -> String {
        format!("taskstage: {self}; to do: {}", self.hint())
    }

    /// The error as one JSON object.
    pub(crate) fn json(&self) -> Value {
        json!({
            "error_code": self.kind().as_str(),
            "error_msg": self.to_string(),
            "exit_code": self.code(),
            "task": self.task(),
            "stage": self.stage(),
            "owner": self.owner(),
            "hint": self.hint(),
        })
    }
}

/// The desired stage a command writes.
fn desired_of(command: &str) -> &'static str {
    match command {
        "pause" => "Paused",
        "resume" => "Running",
        "stop" => "Stopped",
        _ => "as it was",
    }
}

/// The exit status of a command that failed with `errors`: the highest of their
/// codes (an unreachable store over a refusal, a refusal over nothing).
pub(crate) fn exit_code(errors: &[CliError]) -> u8 {
    errors.iter().map(CliError::code).max().unwrap_or(REFUSED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_status_is_the_highest_code() {
        let timeout = || CliError::NotAnswered {
            command: "pause",
            task: "a".into(),
            owner: Some("w1".into()),
            stage: Some("Pausing".into()),
            waited: Duration::from_secs(1),
            desired: "Paused",
        };
        let unreachable = CliError::Unreachable {
            command: "pause",
            op: "set desired",
            detail: "down".into(),
        };
        let missing = CliError::NoSuchTask {
            command: "pause",
            task: "b".into(),
            prefix: "app".into(),
        };
        assert_eq!(exit_code(&[timeout()]), REFUSED);
        assert_eq!(exit_code(&[timeout(), missing]), BAD_INPUT);
        assert_eq!(exit_code(&[timeout(), unreachable, timeout()]), UNREACHABLE);
        assert_eq!(exit_code(&[]), REFUSED);
    }

    #[test]
    fn a_conflict_is_refused_with_exit_status_one() {
        let task = taskstage_cluster::TaskId::new("orders").expect("an id");
        let error = CliError::cluster(
            "pause",
            Some("orders"),
            "app",
            ClusterError::Conflict {
                command: "pause",
                task,
            },
        );
        assert!(matches!(error, CliError::Conflict { .. }), "{error:?}");
        assert_eq!(exit_code(std::slice::from_ref(&error)), REFUSED);
        let json = error.json();
        assert_eq!(json["error_code"], "conflict");
        assert_eq!(json["exit_code"], 1);
    }

    #[test]
    fn a_timeout_names_the_task_its_owner_its_stage_and_what_to_do() {
        let error = CliError::NotAnswered {
            command: "pause",
            task: "orders".into(),
            owner: Some("w1".into()),
            stage: Some("Pausing".into()),
            waited: Duration::from_millis(3_020),
            desired: "Paused",
        };
        assert_eq!(
            error.line(),
            "taskstage: pause of task orders not answered within 3.0 s: owner w1, stuck in \
             stage Pausing; to do: a unit of orders on worker w1 has not returned: look at \
             its log, or `taskstage stop orders` (a stop aborts a stuck run); the desired \
             stage stays Paused"
        );
        let json = error.json();
        assert_eq!(json["error_code"], "timeout");
        assert_eq!(json["stage"], "Pausing");
        assert_eq!(json["owner"], "w1");
        assert_eq!(json["exit_code"], 1);
    }

    #[test]
    fn an_unknown_task_has_the_http_apis_name_and_shape() {
        let error = CliError::NoSuchTask {
            command: "pause",
            task: "refunds".into(),
            prefix: "app".into(),
        };
        let json = error.json();
        assert_eq!(json["error_code"], "unknown_task");
        assert_eq!(
            ErrorCode::from_name(json["error_code"].as_str().unwrap_or_default()),
            Some(ErrorCode::UnknownTask)
        );
        assert_eq!(
            json["error_msg"],
            "pause: task refunds does not exist under prefix app"
        );
        assert_eq!(json["task"], "refunds");
        assert_eq!(json["exit_code"], 2);
    }
}
