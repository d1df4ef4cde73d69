//! The cluster's typed errors.

use std::path::PathBuf;
use std::time::Duration;

use taskstage::BuildError;
use taskstage::Stage;

use super::keys::{TaskId, WorkerId};

/// An error from the cluster layer: bad input, an unreachable etcd, a rejected fenced
/// write, a lost lease, or a command whose answer did not come in time.
///
/// Every variant names what it is about (the task, the worker, the key), so that one
/// log line is enough to see what happened. Errors that come from bad input are
/// returned before anything is written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A task id is empty, too long, or holds a character that keys cannot carry.
    #[error("invalid task id {id:?}: {reason}")]
    InvalidTaskId {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A worker id is empty, too long, or holds a character that keys cannot carry.
    #[error("invalid worker id {id:?}: {reason}")]
    InvalidWorkerId {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key prefix is empty or holds a character that keys cannot carry.
    #[error("invalid key prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// The prefix as given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The lease TTL asked for is below the minimum the protocol needs.
    #[error("lease TTL {ttl:?} is below the minimum of {min:?}")]
    TtlTooShort {
        /// The TTL asked for.
        ttl: Duration,
        /// The smallest TTL accepted.
        min: Duration,
    },
    /// The timing settings leave the owner no time to renew its lease before it must
    /// stop its runs (see the worker's timing settings).
    #[error("timing settings leave no margin: {reason}")]
    InvalidTiming {
        /// Which setting is out of range, with the numbers.
        reason: String,
    },
    /// A desired stage read from the store (or given as text) is not one of Running,
    /// Paused, Stopped.
    #[error("unknown desired stage {value:?} at key {key}")]
    UnknownDesired {
        /// The key the value was read from.
        key: String,
        /// The value found there.
        value: String,
    },
    /// A value in the store cannot be decoded.
    #[error("corrupt value at key {key}: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// The coordination store did not answer (or answered with an error).
    #[error("coordination store unreachable during {op}: {detail}")]
    Unreachable {
        /// The operation that failed.
        op: &'static str,
        /// What the client reported.
        detail: String,
    },
    /// The store refused an operation for a reason other than reachability.
    #[error("coordination store refused {op}: {detail}")]
    Store {
        /// The operation that was refused.
        op: &'static str,
        /// What the store reported.
        detail: String,
    },
    /// A task with this id exists already.
    #[error("task {task} already exists")]
    TaskExists {
        /// The task.
        task: TaskId,
    },
    /// No task with this id exists.
    #[error("task {task} does not exist")]
    NoSuchTask {
        /// The task.
        task: TaskId,
    },
    /// No incarnation of this worker is a member now (it never joined, or its lease
    /// ended).
    #[error("{command}: worker {worker} is not a member")]
    NoSuchWorker {
        /// The command.
        command: &'static str,
        /// The worker.
        worker: WorkerId,
    },
    /// A drain was written, but the worker still held tasks at the deadline (their
    /// hand-over is under way, or a run has not returned).
    #[error("drain of worker {worker} timed out after {waited:?}: it still holds {held} task(s)")]
    DrainTimeout {
        /// The worker.
        worker: WorkerId,
        /// How many tasks it still held.
        held: usize,
        /// How long the drain waited.
        waited: Duration,
    },
    /// The task's desired stage is Stopped, which is final: it cannot be changed.
    #[error("{command} of task {task} refused: the task is stopped, and that is final")]
    Stopped {
        /// The command that was refused.
        command: &'static str,
        /// The task.
        task: TaskId,
    },
    /// The desired stage changed under the controller while it was setting it.
    #[error("{command} of task {task} lost a race: the desired stage changed meanwhile")]
    Conflict {
        /// The command.
        command: &'static str,
        /// The task.
        task: TaskId,
    },
    /// A command was written, but the task's current owner did not report that it
    /// answers it before the deadline.
    #[error(
        "{command} of task {task} timed out after {waited:?}: owner {}, observed stage {}",
        owner.as_ref().map_or("none", WorkerId::as_str),
        stage.map_or("none", Stage::name)
    )]
    Timeout {
        /// The command whose wait timed out.
        command: &'static str,
        /// The task.
        task: TaskId,
        /// The owner at the deadline, if any worker held the task.
        owner: Option<WorkerId>,
        /// The stage the current owner last reported, if it reported any.
        stage: Option<Stage>,
        /// How long the command waited.
        waited: Duration,
    },
    /// A fenced write was rejected: the writer is no longer the task's owner.
    #[error(
        "fenced write for task {task} by worker {worker} rejected: it no longer owns the task"
    )]
    Fenced {
        /// The task.
        task: TaskId,
        /// The worker whose token was stale.
        worker: WorkerId,
    },
    /// The worker's lease is gone (the store expired or revoked it); the worker has
    /// stopped its runs.
    #[error("the lease of worker {worker} was lost; its runs were stopped")]
    LeaseLost {
        /// The worker.
        worker: WorkerId,
    },
    /// The store answered at a revision below one already seen: its history was
    /// replaced (every member restored from a backup). Nothing cached from before
    /// is trusted: a worker stops its runs as if its lease were lost, moves the
    /// store's revision past the highest it saw (so that no fence token goes back),
    /// and ends with this error once the old runs anywhere are surely gone; join
    /// again. A controller's command that meets it changed nothing it can vouch
    /// for: read the task again and decide.
    #[error(
        "the store's history was replaced (restored from a backup?): {op} answered at revision {found}, below revision {seen} seen before"
    )]
    HistoryReplaced {
        /// The call that noticed it.
        op: &'static str,
        /// The highest revision seen before.
        seen: i64,
        /// The revision of the answer.
        found: i64,
    },
    /// A spec larger than the controller writes ([`MAX_SPEC_BYTES`](super::MAX_SPEC_BYTES)
    /// unless set otherwise); nothing was written.
    #[error("the spec of task {task} is {bytes} bytes, more than the {limit} a create writes")]
    SpecTooLarge {
        /// The task.
        task: TaskId,
        /// The spec's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The worker was shut down; the command cannot be carried out any more.
    #[error("worker {worker} is shut down")]
    ShutDown {
        /// The worker.
        worker: WorkerId,
    },
    /// The user factory refused to build a task from its spec.
    #[error("the factory could not build task {task}: {reason}")]
    Factory {
        /// The task.
        task: TaskId,
        /// What the factory reported.
        reason: String,
    },
    /// The task the factory built could not be spawned.
    #[error("task {task} could not be spawned: {source}")]
    Build {
        /// The task.
        task: TaskId,
        /// Why.
        source: BuildError,
    },
    /// A store file (the embedded store of feature `sqlite`) could not be opened:
    /// nothing was written to it.
    #[error("store file {}: {problem}", path.display())]
    StoreFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: FileProblem,
    },
}

/// Why a store file could not be opened or used; part of
/// [`ClusterError::StoreFile`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileProblem {
    /// The file is not a taskstage store: another SQLite database, or not a
    /// database at all. Nothing was written to it.
    #[error("it is not a taskstage store ({detail})")]
    NotAStore {
        /// What was found instead.
        detail: String,
    },
    /// The file was written by a newer taskstage, with a schema this build does not
    /// know. Nothing was written to it.
    #[error("its schema version {found} is newer than this build's {supported}")]
    NewerSchema {
        /// The file's schema version.
        found: i32,
        /// The newest version this build reads.
        supported: i32,
    },
    /// The file, or the directory that must hold its journal, cannot be written.
    #[error("it cannot be written (a read-only file or directory): {detail}")]
    ReadOnly {
        /// What SQLite reported.
        detail: String,
    },
    /// The disk holding the file is full; the write was not made.
    #[error("the disk is full: {detail}")]
    Full {
        /// What SQLite reported.
        detail: String,
    },
    /// Another program held the file locked for longer than the lock timeout.
    #[error("another program held it locked for longer than {waited:?}")]
    Locked {
        /// The lock timeout that passed.
        waited: Duration,
    },
    /// SQLite found the file damaged.
    #[error("it is corrupt: {detail}")]
    Corrupt {
        /// What SQLite reported.
        detail: String,
    },
    /// Another failure of the file or of SQLite.
    #[error("{detail}")]
    Io {
        /// What was reported.
        detail: String,
    },
}
