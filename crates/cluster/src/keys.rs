//! The key layout under the user's prefix, and the values stored there.
//!
//! ```text
//! {prefix}/tasks/{task}/spec                  opaque config bytes (controller)
//! {prefix}/tasks/{task}/desired               Running | Paused | Stopped (controller)
//! {prefix}/tasks/{task}/owner                 "{worker}@{lease hex}", under the owner's lease
//! {prefix}/tasks/{task}/observed              the owner's status report (fenced)
//! {prefix}/checkpoints/{task}/{name}          unit checkpoints (fenced)
//! {prefix}/workers/{worker}@{lease hex}       membership of one incarnation, under its lease:
//!                                             "{lease hex}", or "draining" once drained
//! ```
//!
//! Workers watch `tasks/` and `workers/`; checkpoints live outside both, so a
//! unit's write wakes no worker.
//!
//! A worker id may have two live incarnations at once (one frozen past its lease
//! that came back, beside a fresh start under the same id): each is a member under a
//! key of its own, so neither's end removes the other's membership.

use std::fmt;
use std::str::FromStr;

use taskstage::Stage;

use super::error::ClusterError;

/// The longest task or worker id accepted, in bytes.
pub const MAX_ID_LEN: usize = 128;

fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("it is empty");
    }
    if id.len() > MAX_ID_LEN {
        return Err("it is longer than 128 bytes");
    }
    if id.contains('/') {
        return Err("it contains '/', which separates keys");
    }
    if id.contains('@') {
        return Err("it contains '@', which separates the owner value");
    }
    if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("it contains whitespace or a control character");
    }
    if id == "." || id == ".." {
        return Err("it is a path component");
    }
    Ok(())
}

/// A task's id: one key component (no `/`, no whitespace, at most 128 bytes).
///
/// # Examples
///
/// ```
/// use taskstage_cluster::TaskId;
///
/// assert!(TaskId::new("orders-2024").is_ok());
/// assert!(TaskId::new("orders/2024").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

impl TaskId {
    /// Checks and wraps a task id.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`] naming what is wrong with it.
    pub fn new(id: impl Into<String>) -> Result<Self, ClusterError> {
        let id = id.into();
        match check_id(&id) {
            Ok(()) => Ok(TaskId(id)),
            Err(reason) => Err(ClusterError::InvalidTaskId { id, reason }),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A worker's id: one key component (no `/`, no `@`, no whitespace, at most 128 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(String);

impl WorkerId {
    /// Checks and wraps a worker id.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidWorkerId`] naming what is wrong with it.
    pub fn new(id: impl Into<String>) -> Result<Self, ClusterError> {
        let id = id.into();
        match check_id(&id) {
            Ok(()) => Ok(WorkerId(id)),
            Err(reason) => Err(ClusterError::InvalidWorkerId { id, reason }),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stage a controller asks a task to be in, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DesiredStage {
    /// One run alive, on whichever worker owns the task.
    Running,
    /// No run alive anywhere; the task stays owned and resumable.
    Paused,
    /// No run alive anywhere, units closed; final.
    Stopped,
}

impl DesiredStage {
    /// The stage's name, as stored.
    pub const fn name(self) -> &'static str {
        match self {
            DesiredStage::Running => "Running",
            DesiredStage::Paused => "Paused",
            DesiredStage::Stopped => "Stopped",
        }
    }

    /// Whether an observed local stage answers this desired stage: the owner has
    /// done what was asked (or the task ended in a way that makes it moot).
    ///
    /// - Running is answered by Running, by Finished, and by Paused with a failed
    ///   outcome (the run was started for this desire and failed; the outcome says
    ///   so).
    /// - Paused is answered by New, Paused and Finished: no run is alive.
    /// - Stopped is answered by Stopped and Finished.
    pub fn answered_by(self, stage: Stage, failed: bool) -> bool {
        match self {
            DesiredStage::Running => {
                matches!(stage, Stage::Running | Stage::Finished)
                    || (stage == Stage::Paused && failed)
            }
            DesiredStage::Paused => matches!(stage, Stage::New | Stage::Paused | Stage::Finished),
            DesiredStage::Stopped => matches!(stage, Stage::Stopped | Stage::Finished),
        }
    }
}

impl fmt::Display for DesiredStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DesiredStage {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Running" => Ok(DesiredStage::Running),
            "Paused" => Ok(DesiredStage::Paused),
            "Stopped" => Ok(DesiredStage::Stopped),
            other => Err(ClusterError::UnknownDesired {
                key: String::new(),
                value: other.to_owned(),
            }),
        }
    }
}

/// What the last run of an owner returned, as reported in the observed status.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObservedOutcome {
    /// No run has returned yet.
    None,
    /// The unit completed.
    Completed,
    /// The run was cancelled by a pause or a stop.
    Cancelled,
    /// The run did not return: it was aborted (a stop that escalated after its
    /// grace, or a worker that ended).
    Aborted,
    /// The run or its pre-start check failed; the error's text.
    Failed(String),
}

impl ObservedOutcome {
    /// Whether this is a failure.
    pub fn is_failed(&self) -> bool {
        matches!(self, ObservedOutcome::Failed(_))
    }

    /// The outcome's name, the same as [`taskstage::Outcome::name`]'s, or `None` when
    /// no run has returned yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskstage_cluster::ObservedOutcome;
    ///
    /// assert_eq!(ObservedOutcome::Cancelled.name(), Some("cancelled"));
    /// assert_eq!(ObservedOutcome::None.name(), None);
    /// ```
    pub fn name(&self) -> Option<&'static str> {
        match self {
            ObservedOutcome::None => None,
            ObservedOutcome::Completed => Some("completed"),
            ObservedOutcome::Cancelled => Some("cancelled"),
            ObservedOutcome::Aborted => Some("aborted"),
            ObservedOutcome::Failed(_) => Some("failed"),
        }
    }

    /// The error's text, if this is a failure.
    pub fn error(&self) -> Option<&str> {
        match self {
            ObservedOutcome::Failed(error) => Some(error),
            _ => None,
        }
    }

    pub(crate) fn from_outcome(outcome: Option<&taskstage::Outcome>) -> Self {
        match outcome {
            None => ObservedOutcome::None,
            Some(taskstage::Outcome::Completed) => ObservedOutcome::Completed,
            Some(taskstage::Outcome::Cancelled) => ObservedOutcome::Cancelled,
            Some(taskstage::Outcome::Aborted) => ObservedOutcome::Aborted,
            Some(taskstage::Outcome::Failed(e)) => ObservedOutcome::Failed(e.to_string()),
            // `Outcome` may grow; a newer core's outcome is reported, not hidden.
            Some(other) => {
                ObservedOutcome::Failed(format!("an outcome this worker does not know: {other:?}"))
            }
        }
    }
}

/// The status an owner publishes for a task (through a fenced write).
///
/// It reports a past fact: when it was written, the owner's local stage was `stage`
/// and the desired stage it had read was revision `desired_revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedStatus {
    /// The owner's local stage.
    pub stage: Stage,
    /// The local run's generation.
    pub generation: u64,
    /// What the last local run returned.
    pub outcome: ObservedOutcome,
    /// The revision of the desired stage this report answers.
    pub desired_revision: i64,
    /// The worker that wrote it.
    pub owner: WorkerId,
    /// The create revision of the owner key the writer held (its fence token).
    pub owner_revision: i64,
}

impl ObservedStatus {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let outcome = match &self.outcome {
            ObservedOutcome::None => "none".to_owned(),
            ObservedOutcome::Completed => "completed".to_owned(),
            ObservedOutcome::Cancelled => "cancelled".to_owned(),
            ObservedOutcome::Aborted => "aborted".to_owned(),
            ObservedOutcome::Failed(e) => format!("failed:{}", e.replace('\n', " ")),
        };
        format!(
            "stage={}\ngeneration={}\ndesired_revision={}\nowner={}\nowner_revision={}\noutcome={}\n",
            self.stage.name(),
            self.generation,
            self.desired_revision,
            self.owner,
            self.owner_revision,
            outcome
        )
        .into_bytes()
    }

    pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Self, ClusterError> {
        let corrupt = |reason: String| ClusterError::Corrupt {
            key: key.to_owned(),
            reason,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| corrupt(e.to_string()))?;
        let mut stage = None;
        let mut generation = None;
        let mut desired_revision = None;
        let mut owner = None;
        let mut owner_revision = None;
        let mut outcome = None;
        for line in text.lines() {
            let Some((name, value)) = line.split_once('=') else {
                return Err(corrupt(format!("line {line:?} is not name=value")));
            };
            match name {
                "stage" => {
                    stage = Some(
                        Stage::ALL
                            .into_iter()
                            .find(|s| s.name() == value)
                            .ok_or_else(|| corrupt(format!("unknown stage {value:?}")))?,
                    );
                }
                "generation" => {
                    generation = Some(value.parse().map_err(|_| corrupt("generation".into()))?)
                }
                "desired_revision" => {
                    desired_revision = Some(
                        value
                            .parse()
                            .map_err(|_| corrupt("desired_revision".into()))?,
                    )
                }
                "owner" => owner = Some(WorkerId::new(value).map_err(|e| corrupt(e.to_string()))?),
                "owner_revision" => {
                    owner_revision = Some(
                        value
                            .parse()
                            .map_err(|_| corrupt("owner_revision".into()))?,
                    )
                }
                "outcome" => {
                    outcome = Some(match value {
                        "none" => ObservedOutcome::None,
                        "completed" => ObservedOutcome::Completed,
                        "cancelled" => ObservedOutcome::Cancelled,
                        "aborted" => ObservedOutcome::Aborted,
                        v => match v.strip_prefix("failed:") {
                            Some(e) => ObservedOutcome::Failed(e.to_owned()),
                            None => return Err(corrupt(format!("unknown outcome {v:?}"))),
                        },
                    })
                }
                _ => {} // unknown fields are left for newer versions
            }
        }
        let missing = |field: &str| corrupt(format!("field {field} is missing"));
        Ok(ObservedStatus {
            stage: stage.ok_or_else(|| missing("stage"))?,
            generation: generation.ok_or_else(|| missing("generation"))?,
            outcome: outcome.ok_or_else(|| missing("outcome"))?,
            desired_revision: desired_revision.ok_or_else(|| missing("desired_revision"))?,
            owner: owner.ok_or_else(|| missing("owner"))?,
            owner_revision: owner_revision.ok_or_else(|| missing("owner_revision"))?,
        })
    }
}

/// The keys of one cluster, under its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    prefix: String,
}

/// What a key under `{prefix}/tasks/` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TaskKey {
    Spec,
    Desired,
    Owner,
    Observed,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Result<Self, ClusterError> {
        let trimmed = prefix.trim_end_matches('/');
        let bad = |reason| ClusterError::InvalidPrefix {
            prefix: prefix.to_owned(),
            reason,
        };
        if trimmed.is_empty() {
            return Err(bad("it is empty"));
        }
        if trimmed.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("it contains whitespace or a control character"));
        }
        Ok(Keys {
            prefix: trimmed.to_owned(),
        })
    }

    pub(crate) fn tasks(&self) -> String {
        format!("{}/tasks/", self.prefix)
    }

    pub(crate) fn task_dir(&self, task: &TaskId) -> String {
        format!("{}/tasks/{}/", self.prefix, task)
    }

    pub(crate) fn spec(&self, task: &TaskId) -> String {
        format!("{}spec", self.task_dir(task))
    }

    pub(crate) fn desired(&self, task: &TaskId) -> String {
        format!("{}desired", self.task_dir(task))
    }

    pub(crate) fn owner(&self, task: &TaskId) -> String {
        format!("{}owner", self.task_dir(task))
    }

    pub(crate) fn observed(&self, task: &TaskId) -> String {
        format!("{}observed", self.task_dir(task))
    }

    /// The directory of a task's checkpoints, outside the watched `tasks/`.
    pub(crate) fn checkpoints(&self, task: &TaskId) -> String {
        format!("{}/checkpoints/{}/", self.prefix, task)
    }

    pub(crate) fn checkpoint(&self, task: &TaskId, name: &str) -> String {
        format!("{}{}", self.checkpoints(task), name)
    }

    /// The key written to move the store's revision on after its history was
    /// replaced: outside the prefixes workers watch, so it wakes nobody.
    pub(crate) fn history(&self) -> String {
        format!("{}/history", self.prefix)
    }

    pub(crate) fn workers(&self) -> String {
        format!("{}/workers/", self.prefix)
    }

    /// The membership key of the incarnation of `worker` that holds lease `lease`.
    pub(crate) fn worker(&self, worker: &WorkerId, lease: i64) -> String {
        format!("{}/workers/{}", self.prefix, owner_value(worker, lease))
    }

    /// The worker and lease a membership key names.
    pub(crate) fn parse_worker_key(&self, key: &str) -> Option<(WorkerId, i64)> {
        parse_owner_value(key.strip_prefix(&self.workers())?.as_bytes())
    }

    /// Splits a key under `tasks/` into its task and what it names.
    pub(crate) fn parse_task_key(&self, key: &str) -> Option<(TaskId, TaskKey)> {
        let rest = key.strip_prefix(&self.tasks())?;
        let (task, name) = rest.split_once('/')?;
        let task = TaskId::new(task).ok()?;
        let kind = match name {
            "spec" => TaskKey::Spec,
            "desired" => TaskKey::Desired,
            "owner" => TaskKey::Owner,
            "observed" => TaskKey::Observed,
            _ => return None,
        };
        Some((task, kind))
    }
}

/// The value of a membership key whose worker was drained
/// ([`Controller::drain`](super::Controller::drain)): written by a controller under
/// the member's own lease, so it ends with that incarnation. A draining member counts
/// in no fair share, claims nothing and hands every task it holds over.
pub(crate) const DRAINING: &[u8] = b"draining";

/// Whether a membership key's value says its worker is draining.
pub(crate) fn is_draining(value: &[u8]) -> bool {
    value == DRAINING
}

/// The owner key's value for a worker holding lease `lease`.
pub(crate) fn owner_value(worker: &WorkerId, lease: i64) -> String {
    format!("{worker}@{lease:x}")
}

/// Splits an owner key's value into the worker and the lease.
pub(crate) fn parse_owner_value(value: &[u8]) -> Option<(WorkerId, i64)> {
    let text = std::str::from_utf8(value).ok()?;
    let (worker, lease) = text.rsplit_once('@')?;
    Some((
        WorkerId::new(worker).ok()?,
        i64::from_str_radix(lease, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_incarnation_of_a_worker_has_a_membership_key_of_its_own() {
        let keys = Keys::new("p").expect("a valid prefix");
        let id = WorkerId::new("w1").expect("a valid id");
        let first = keys.worker(&id, 0x1f);
        let second = keys.worker(&id, 0x2a);
        assert_eq!(first, "p/workers/w1@1f");
        assert_ne!(first, second);
        assert_eq!(keys.parse_worker_key(&second), Some((id, 0x2a)));
        assert_eq!(keys.parse_worker_key("p/workers/w1"), None);
        assert_eq!(keys.parse_worker_key("p/tasks/w1@1f"), None);
    }

    #[test]
    fn ids_with_separators_are_refused() {
        for bad in ["", "a/b", "a b", "a@b", "..", "a\nb"] {
            assert!(TaskId::new(bad).is_err(), "{bad:?} was accepted");
            assert!(WorkerId::new(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(TaskId::new("orders-1.v2_x").is_ok());
    }

    #[test]
    fn ids_of_up_to_128_bytes_are_accepted_and_longer_ones_refused() {
        let longest = "x".repeat(MAX_ID_LEN);
        assert_eq!(
            TaskId::new(longest.clone()).map(|t| t.0),
            Ok(longest.clone())
        );
        assert_eq!(WorkerId::new(longest.clone()).map(|w| w.0), Ok(longest));
        // Bytes, not characters: 64 two-byte characters are 128 bytes.
        assert!(TaskId::new("é".repeat(64)).is_ok());
        assert!(TaskId::new("é".repeat(65)).is_err());
        let too_long = "x".repeat(MAX_ID_LEN + 1);
        assert!(matches!(
            TaskId::new(too_long.clone()),
            Err(ClusterError::InvalidTaskId {
                reason: "it is longer than 128 bytes",
                ..
            })
        ));
        assert!(matches!(
            WorkerId::new(too_long),
            Err(ClusterError::InvalidWorkerId {
                reason: "it is longer than 128 bytes",
                ..
            })
        ));
    }

    #[test]
    fn observed_round_trips() {
        let status = ObservedStatus {
            stage: Stage::Paused,
            generation: 3,
            outcome: ObservedOutcome::Failed("disk\nfull".into()),
            desired_revision: 42,
            owner: WorkerId::new("w1").unwrap(),
            owner_revision: 17,
        };
        let decoded = ObservedStatus::decode("k", &status.encode()).unwrap();
        assert_eq!(decoded.outcome, ObservedOutcome::Failed("disk full".into()));
        assert_eq!(decoded.stage, Stage::Paused);
        assert_eq!(decoded.desired_revision, 42);
        assert!(ObservedStatus::decode("k", b"stage=Bogus\n").is_err());
    }

    #[test]
    fn owner_values_round_trip() {
        let w = WorkerId::new("w-1").unwrap();
        assert_eq!(
            parse_owner_value(owner_value(&w, 0x1234).as_bytes()),
            Some((w, 0x1234))
        );
        assert_eq!(parse_owner_value(b"nonsense"), None);
    }

    #[test]
    fn task_keys_parse() {
        let keys = Keys::new("app/").unwrap();
        let t = TaskId::new("t1").unwrap();
        assert_eq!(
            keys.parse_task_key(&keys.owner(&t)),
            Some((t.clone(), TaskKey::Owner))
        );
        assert_eq!(keys.parse_task_key(&keys.checkpoint(&t, "pos")), None);
        assert!(Keys::new("/").is_err());
    }

    #[test]
    fn desired_stages_parse_and_answer() {
        assert_eq!(
            "Paused".parse::<DesiredStage>().unwrap(),
            DesiredStage::Paused
        );
        assert!("paused".parse::<DesiredStage>().is_err());
        assert!(DesiredStage::Paused.answered_by(Stage::Paused, false));
        assert!(!DesiredStage::Paused.answered_by(Stage::Pausing, false));
        assert!(DesiredStage::Running.answered_by(Stage::Paused, true));
        assert!(!DesiredStage::Running.answered_by(Stage::Paused, false));
    }

    #[test]
    fn ids_and_desired_stages_read_back_as_given() {
        let task = TaskId::new("orders-1").expect("a task id");
        assert_eq!(
            (task.as_str(), task.to_string()),
            ("orders-1", "orders-1".into())
        );
        let worker = WorkerId::new("w-1").expect("a worker id");
        assert_eq!((worker.as_str(), worker.to_string()), ("w-1", "w-1".into()));
        for (stage, name) in [
            (DesiredStage::Running, "Running"),
            (DesiredStage::Paused, "Paused"),
            (DesiredStage::Stopped, "Stopped"),
        ] {
            assert_eq!((stage.name(), stage.to_string()), (name, name.to_owned()));
            assert_eq!(name.parse::<DesiredStage>().ok(), Some(stage));
        }
    }

    #[test]
    fn only_a_failed_outcome_is_failed() {
        assert!(ObservedOutcome::Failed("disk full".into()).is_failed());
        for outcome in [
            ObservedOutcome::None,
            ObservedOutcome::Completed,
            ObservedOutcome::Cancelled,
            ObservedOutcome::Aborted,
        ] {
            assert!(!outcome.is_failed(), "{outcome:?}");
        }
    }

    /// The task keys of the documented layout (docs/cluster.md), each parsed back to
    /// what it names; a key of no known kind is not a task key.
    #[test]
    fn task_keys_follow_the_documented_layout() {
        let keys = Keys::new("app/").expect("a prefix");
        let t = TaskId::new("t1").expect("an id");
        let layout = [
            (keys.spec(&t), "app/tasks/t1/spec", TaskKey::Spec),
            (keys.desired(&t), "app/tasks/t1/desired", TaskKey::Desired),
            (keys.owner(&t), "app/tasks/t1/owner", TaskKey::Owner),
            (
                keys.observed(&t),
                "app/tasks/t1/observed",
                TaskKey::Observed,
            ),
        ];
        for (key, documented, kind) in layout {
            assert_eq!(key, documented);
            assert_eq!(keys.parse_task_key(&key), Some((t.clone(), kind)), "{key}");
        }
        assert_eq!(keys.tasks(), "app/tasks/");
        assert_eq!(keys.task_dir(&t), "app/tasks/t1/");
        // Checkpoints live outside the watched tasks/ directory.
        assert_eq!(keys.checkpoint(&t, "pos"), "app/checkpoints/t1/pos");
        assert_eq!(keys.checkpoints(&t), "app/checkpoints/t1/");
        for other in [
            "app/tasks/t1/lease",
            "app/tasks/t1/checkpoint/pos",
            "app/checkpoints/t1/pos",
            "app/tasks/t1",
        ] {
            assert_eq!(keys.parse_task_key(other), None, "{other}");
        }
    }
}
