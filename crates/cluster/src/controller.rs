//! The controller: creates tasks, sets their desired stage, waits for the answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::coord::{
    next_message, Compare, Coordinator, KeyValue, Listing, Op, Txn, WatchEvent, WatchMessage,
    WatchStream,
};
use super::error::ClusterError;
use super::fence::within;
use super::history::{Checked, History};
use super::keys::{
    is_draining, parse_owner_value, DesiredStage, Keys, ObservedStatus, TaskId, TaskKey, WorkerId,
    DRAINING,
};

/// How long [`Controller::pause`], [`Controller::resume`] and [`Controller::stop`]
/// wait for the owner's answer, unless told otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest spec [`Controller::create`] writes by default: 1 MiB, under etcd's
/// default request limit of 1.5 MiB (`--max-request-bytes`), with room for the
/// rest of the transaction. [`Controller::with_max_spec_bytes`] changes it for a
/// store configured otherwise.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// A task's state in the store, read at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// The task.
    pub task: TaskId,
    /// The desired stage.
    pub desired: DesiredStage,
    /// The desired stage's revision (the revision of its last write).
    pub desired_revision: i64,
    /// The current owner, if a worker holds the task.
    pub owner: Option<WorkerId>,
    /// The owner key's create revision (the current fence token), if owned.
    pub owner_revision: Option<i64>,
    /// The owner's lease, if owned. An owner that crashed stays the owner until
    /// the store expires this lease (at most its TTL later).
    pub owner_lease: Option<i64>,
    /// The last status an owner published, if any.
    pub observed: Option<ObservedStatus>,
    /// The store's revision of this read.
    pub revision: i64,
}

impl TaskStatus {
    /// The observed status if the *current* owner wrote it, or, for a task nobody
    /// owns, if it is terminal (a released task: nothing of it runs anywhere).
    pub fn current_observed(&self) -> Option<&ObservedStatus> {
        let observed = self.observed.as_ref()?;
        match (&self.owner, self.owner_revision) {
            (Some(owner), Some(rev)) => {
                (observed.owner == *owner && observed.owner_revision == rev).then_some(observed)
            }
            _ => observed.stage.is_terminal().then_some(observed),
        }
    }

    /// Whether the current owner's report answers desired revision `revision`.
    pub fn answers(&self, revision: i64) -> bool {
        self.desired_revision == revision
            && self.current_observed().is_some_and(|o| {
                o.desired_revision >= revision
                    && self.desired.answered_by(o.stage, o.outcome.is_failed())
            })
    }
}

/// A worker that is a member now, as [`Controller::worker_statuses`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The worker.
    pub worker: WorkerId,
    /// The leases of its live incarnations (usually one; two while a frozen
    /// incarnation past its lease and a fresh start under the same id overlap).
    pub leases: Vec<i64>,
    /// Whether it was drained ([`Controller::drain`]): every live incarnation hands
    /// its tasks over and claims none.
    pub draining: bool,
}

/// A checkpoint of a task, as [`Controller::checkpoints`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its name (the `name` given to [`Fencer::put_checkpoint`](super::Fencer::put_checkpoint)).
    pub name: String,
    /// Its value's size in bytes.
    pub size: usize,
    /// The revision of its last write.
    pub revision: i64,
}

/// Writes desired stages and reads observed ones.
///
/// Cheap to clone. Every write is a transaction; bad input is refused before
/// anything is written.
#[derive(Clone)]
pub struct Controller {
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    op_timeout: Duration,
    poll: Duration,
    max_spec_bytes: usize,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// A controller of the tasks under `prefix`.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidPrefix`] for an empty prefix or one with whitespace.
    pub fn new(coordinator: impl Coordinator, prefix: &str) -> Result<Self, ClusterError> {
        // A command that meets a store whose revision went back (its history was
        // replaced) answers ClusterError::HistoryReplaced; the next one reads the
        // new history.
        let checked = Checked::new(Arc::new(coordinator), History::new(false));
        Ok(Controller {
            coord: Arc::new(checked),
            keys: Keys::new(prefix)?,
            op_timeout: Duration::from_secs(2),
            poll: Duration::from_millis(250),
            max_spec_bytes: MAX_SPEC_BYTES,
        })
    }

    /// The largest spec [`Controller::create`] writes ([`MAX_SPEC_BYTES`] unless
    /// set): a larger one is refused with [`ClusterError::SpecTooLarge`] before
    /// anything is written. Raise it only with the store's own request limit.
    pub fn with_max_spec_bytes(mut self, limit: usize) -> Self {
        self.max_spec_bytes = limit;
        self
    }

    /// Creates a task with its spec and initial desired stage (any of the three).
    ///
    /// Returns the revision of the desired stage.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`] and [`ClusterError::SpecTooLarge`] (nothing
    /// written), [`ClusterError::TaskExists`], [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// A dropped call may still be applied (like any store write).
    pub async fn create(
        &self,
        task: &str,
        spec: Vec<u8>,
        desired: DesiredStage,
    ) -> Result<i64, ClusterError> {
        let task = TaskId::new(task)?;
        if spec.len() > self.max_spec_bytes {
            return Err(ClusterError::SpecTooLarge {
                task,
                bytes: spec.len(),
                limit: self.max_spec_bytes,
            });
        }
        let txn = Txn {
            when: vec![
                Compare::Absent(self.keys.spec(&task)),
                Compare::Absent(self.keys.desired(&task)),
            ],
            then: vec![
                Op::Put {
                    key: self.keys.spec(&task),
                    value: spec,
                    lease: None,
                },
                Op::Put {
                    key: self.keys.desired(&task),
                    value: desired.name().as_bytes().to_vec(),
                    lease: None,
                },
            ],
        };
        let result = within(self.op_timeout, "create task", self.coord.txn(txn)).await?;
        if result.succeeded {
            Ok(result.revision)
        } else {
            Err(ClusterError::TaskExists { task })
        }
    }

    /// Sets the desired stage and returns its revision, without waiting. Setting
    /// Stopped on a task already desired Stopped writes nothing and returns the
    /// existing revision (Stopped is final; its answer is the one already given or
    /// on its way).
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`], [`ClusterError::NoSuchTask`],
    /// [`ClusterError::Stopped`] (a stopped task stays stopped),
    /// [`ClusterError::UnknownDesired`] (the stored stage is unreadable),
    /// [`ClusterError::Conflict`] (it changed meanwhile), [`ClusterError::Unreachable`].
    /// Nothing is written on an error.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may still be applied.
    pub async fn set_desired(
        &self,
        task: &str,
        desired: DesiredStage,
    ) -> Result<i64, ClusterError> {
        let task = TaskId::new(task)?;
        self.set(&task, desired, "set desired", false)
            .await
            .map(|set| set.revision)
    }

    /// Writes the desired stage; returns the desired revision to wait for, the
    /// task's status read around the write and, when `follow`, a watch of the
    /// task's keys opened before that read.
    ///
    /// The watch is opened from the store's head (a watch from a past revision
    /// waits for etcd's catch-up loop, up to 100 ms), beside the first store call
    /// rather than before it. A pause of a task desired Running, or a resume of one
    /// desired Paused (the common cases), is written first, compared with the
    /// stage it replaces, and the status is read after it, while the owner is
    /// already answering: one round trip before the write instead of two. Any other
    /// case is read first and written compared with the revision read, so that a
    /// stopped task is refused and a conflict is named.
    async fn set(
        &self,
        task: &TaskId,
        desired: DesiredStage,
        command: &'static str,
        follow: bool,
    ) -> Result<Set, ClusterError> {
        let task = task.clone();
        let key = self.keys.desired(&task);
        let dir = self.keys.task_dir(&task);
        let watching = within(self.op_timeout, "watch task", self.coord.watch(dir, 0));
        let (watch, status) = match (follow, replaces(desired)) {
            (true, Some(from)) => {
                let txn = Txn {
                    when: vec![Compare::Value(key.clone(), from.name().as_bytes().to_vec())],
                    then: vec![Op::Put {
                        key: key.clone(),
                        value: desired.name().as_bytes().to_vec(),
                        lease: None,
                    }],
                };
                let (watch, written) = tokio::join!(
                    watching,
                    within(self.op_timeout, "set desired", self.coord.txn(txn))
                );
                let (watch, written) = (watch.ok(), written?);
                // The watch was open before this read: the read and the watch
                // together miss no change after the write.
                let status = self.status_of(&task).await?;
                if written.succeeded {
                    return Ok(Set {
                        revision: written.revision,
                        before: status,
                        watch,
                    });
                }
                (watch, status)
            }
            (true, None) => {
                // A stop: beside the read, the watch may begin after it and miss a
                // change made in between, an owner change among them. None keeps
                // the stop from its answer: Stopped is terminal, and its owner
                // releases the task once it has reported it (or its lease ends),
                // and a terminal report of a task no one owns answers.
                let (watch, status) = tokio::join!(watching, self.status_of(&task));
                (watch.ok(), status?)
            }
            (false, _) => (None, self.status_of(&task).await?),
        };
        if status.desired == DesiredStage::Stopped {
            if desired != DesiredStage::Stopped {
                return Err(ClusterError::Stopped { command, task });
            }
            // Stopped is final and already desired: a new revision would be one the
            // task's terminal report does not answer, and a worker would claim and
            // rebuild the released task only to answer it. The first stop's revision
            // is the one to wait for.
            return Ok(Set {
                revision: status.desired_revision,
                before: status,
                watch,
            });
        }
        let txn = Txn {
            when: vec![Compare::ModRevision(key.clone(), status.desired_revision)],
            then: vec![Op::Put {
                key,
                value: desired.name().as_bytes().to_vec(),
                lease: None,
            }],
        };
        let result = within(self.op_timeout, "set desired", self.coord.txn(txn)).await?;
        if result.succeeded {
            Ok(Set {
                revision: result.revision,
                before: status,
                watch,
            })
        } else {
            Err(ClusterError::Conflict { command, task })
        }
    }

    /// Pauses the task cluster-wide, waiting up to [`DEFAULT_COMMAND_TIMEOUT`]. See
    /// [`Controller::pause_within`].
    ///
    /// # Errors
    ///
    /// As [`Controller::pause_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Controller::pause_within`].
    pub async fn pause(&self, task: &str) -> Result<ObservedStatus, ClusterError> {
        self.pause_within(task, DEFAULT_COMMAND_TIMEOUT).await
    }

    /// Sets the desired stage to Paused and waits until the task's current owner
    /// reports that it answers that desired revision: its local run has returned
    /// (stage Paused, or New / Finished). Returns that report.
    ///
    /// # Errors
    ///
    /// As [`Controller::set_desired`], and [`ClusterError::Timeout`] naming the
    /// task, its owner and the stage it last reported when no answer came within
    /// `timeout` (the desired stage stays Paused).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the desired stage is written leaves it written.
    pub async fn pause_within(
        &self,
        task: &str,
        timeout: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        self.command(task, DesiredStage::Paused, "pause", timeout)
            .await
    }

    /// Resumes the task cluster-wide, waiting up to [`DEFAULT_COMMAND_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// As [`Controller::resume_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Controller::pause_within`].
    pub async fn resume(&self, task: &str) -> Result<ObservedStatus, ClusterError> {
        self.resume_within(task, DEFAULT_COMMAND_TIMEOUT).await
    }

    /// Sets the desired stage to Running and waits until the current owner reports
    /// Running for it (or Finished, or Paused with the failure of the run it started
    /// for it: see [`DesiredStage::answered_by`]).
    ///
    /// # Errors
    ///
    /// As [`Controller::pause_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Controller::pause_within`].
    pub async fn resume_within(
        &self,
        task: &str,
        timeout: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        self.command(task, DesiredStage::Running, "resume", timeout)
            .await
    }

    /// Stops the task cluster-wide, waiting up to [`DEFAULT_COMMAND_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// As [`Controller::stop_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Controller::pause_within`].
    pub async fn stop(&self, task: &str) -> Result<ObservedStatus, ClusterError> {
        self.stop_within(task, DEFAULT_COMMAND_TIMEOUT).await
    }

    /// Sets the desired stage to Stopped (final) and waits until the owner reports
    /// Stopped (or Finished) for it.
    ///
    /// # Errors
    ///
    /// As [`Controller::pause_within`].
    ///
    /// # Cancel safety
    ///
    /// As [`Controller::pause_within`].
    pub async fn stop_within(
        &self,
        task: &str,
        timeout: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        self.command(task, DesiredStage::Stopped, "stop", timeout)
            .await
    }

    async fn command(
        &self,
        task: &str,
        desired: DesiredStage,
        command: &'static str,
        timeout: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        let started = Instant::now();
        let deadline = started + timeout;
        let task = TaskId::new(task)?;
        // A store that cannot be reached, or is electing a leader, is tried again
        // within the command's deadline: the write compares the stage it replaces
        // or the revision it read, so a retry of a write that was applied after
        // all only writes the same stage again.
        let mut pause = Duration::from_millis(50);
        // Bounded by the deadline.
        let set = loop {
            match self.set(&task, desired, command, true).await {
                Err(
                    error @ (ClusterError::Unreachable { .. }
                    | ClusterError::HistoryReplaced { .. }),
                ) if Instant::now() + pause < deadline => {
                    tracing::debug!(%task, %error, command, "trying the store again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.poll * 4);
                }
                result => break result?,
            }
        };
        self.wait_answer(
            set.before,
            set.watch,
            set.revision,
            command,
            started,
            deadline,
        )
        .await
    }

    /// Waits until the current owner's report answers desired revision `revision`.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Timeout`] at `timeout`; errors of [`Controller::status`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn wait_for_revision(
        &self,
        task: &str,
        revision: i64,
        timeout: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        let task = TaskId::new(task)?;
        let started = Instant::now();
        let status = self.status_of(&task).await?;
        self.wait_answer(status, None, revision, "wait", started, started + timeout)
            .await
    }

    /// Follows the task from `status` (read at `status.revision`) by a watch of its
    /// keys: every change is applied to the status as the watch delivers it, with no
    /// read per change, until the status answers `revision`. A lost watch falls back
    /// to reading the status again.
    async fn wait_answer(
        &self,
        mut status: TaskStatus,
        mut opened: Option<WatchStream>,
        revision: i64,
        command: &'static str,
        started: Instant,
        deadline: Instant,
    ) -> Result<ObservedStatus, ClusterError> {
        let task = status.task.clone();
        // Bounded: every turn waits at most until `deadline`, and a lost watch is
        // opened again at most once per `poll`.
        loop {
            if status.answers(revision) {
                if let Some(observed) = status.current_observed() {
                    return Ok(observed.clone());
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ClusterError::Timeout {
                    command,
                    task: task.clone(),
                    owner: status.owner.clone(),
                    stage: status.current_observed().map(|o| o.stage),
                    waited: now - started,
                });
            }
            let dir = self.keys.task_dir(&task);
            let opening = match opened.take() {
                Some(stream) => Ok(Ok(stream)),
                None => {
                    tokio::time::timeout_at(
                        deadline,
                        within(
                            self.op_timeout,
                            "watch task",
                            self.coord.watch(dir, status.revision + 1),
                        ),
                    )
                    .await
                }
            };
            let mut stream = match opening {
                Ok(Ok(stream)) => stream,
                Err(_) => continue, // the deadline: answered above
                Ok(Err(error)) => {
                    tracing::debug!(%task, %error, "watch failed; reading again");
                    tokio::time::sleep(self.poll.min(deadline - Instant::now())).await;
                    status = self.reread(&task, status).await?;
                    continue;
                }
            };
            // A watch opened before the read may deliver changes the read already
            // holds: only those after it are applied.
            let mut applied = status.revision;
            // Bounded by the deadline: each message is applied or ends the watch.
            loop {
                let message =
                    match tokio::time::timeout_at(deadline, next_message(&mut stream)).await {
                        Ok(message) => message,
                        Err(_) => break,
                    };
                match message {
                    Some(Ok(WatchMessage::Events {
                        revision: head,
                        events,
                    })) => {
                        let newer = events.iter().filter(|e| e.revision() > applied);
                        let mut last = applied;
                        for event in newer {
                            self.apply(&mut status, event)?;
                            last = last.max(event.revision());
                        }
                        applied = last;
                        status.revision = status.revision.max(head);
                        if status.answers(revision) {
                            break;
                        }
                    }
                    Some(Ok(WatchMessage::Compacted { .. })) | Some(Err(_)) | None => {
                        status = self.reread(&task, status).await?;
                        break;
                    }
                }
            }
        }
    }

    /// The status read again after a lost watch (or a report from another owner than
    /// the one known); the last one known while the store cannot be read.
    async fn reread(&self, task: &TaskId, last: TaskStatus) -> Result<TaskStatus, ClusterError> {
        match self.status_of(task).await {
            Ok(status) => Ok(status),
            Err(error @ ClusterError::Unreachable { .. }) => {
                tracing::debug!(%task, %error, "status read failed; retrying");
                Ok(last)
            }
            Err(error) => Err(error),
        }
    }

    /// Applies one watched change of the task's keys to `status`.
    fn apply(&self, status: &mut TaskStatus, event: &WatchEvent) -> Result<(), ClusterError> {
        let task = &status.task;
        let kv = match event {
            WatchEvent::Put(kv) => Some(kv),
            WatchEvent::Delete { .. } => None,
        };
        let key = event.key();
        if key == self.keys.desired(task) {
            let Some(kv) = kv else {
                return Err(ClusterError::NoSuchTask { task: task.clone() });
            };
            status.desired = decode_desired(key, kv)?;
            status.desired_revision = kv.mod_revision;
        } else if key == self.keys.owner(task) {
            let owner = kv.map(|kv| decode_owner(key, kv)).transpose()?;
            status.owner = owner.as_ref().map(|(w, _, _)| w.clone());
            status.owner_revision = owner.as_ref().map(|(_, r, _)| *r);
            status.owner_lease = owner.map(|(_, _, l)| l);
        } else if key == self.keys.observed(task) {
            status.observed = kv
                .map(|kv| ObservedStatus::decode(key, &kv.value))
                .transpose()?;
        }
        status.revision = status.revision.max(event.revision());
        Ok(())
    }

    /// The task's desired stage, owner and observed status, read at one revision.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`], [`ClusterError::NoSuchTask`],
    /// [`ClusterError::UnknownDesired`] / [`ClusterError::Corrupt`] for values that
    /// cannot be decoded, [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn status(&self, task: &str) -> Result<TaskStatus, ClusterError> {
        let task = TaskId::new(task)?;
        self.status_of(&task).await
    }

    async fn status_of(&self, task: &TaskId) -> Result<TaskStatus, ClusterError> {
        let listing = within(
            self.op_timeout,
            "read task",
            self.coord.list(self.keys.task_dir(task)),
        )
        .await?;
        self.decode(task, &listing)
    }

    fn decode(&self, task: &TaskId, listing: &Listing) -> Result<TaskStatus, ClusterError> {
        let desired_key = self.keys.desired(task);
        let Some(desired_kv) = listing.get(&desired_key) else {
            return Err(ClusterError::NoSuchTask { task: task.clone() });
        };
        let desired = decode_desired(&desired_key, desired_kv)?;
        let owner_key = self.keys.owner(task);
        let owner = listing
            .get(&owner_key)
            .map(|kv| decode_owner(&owner_key, kv))
            .transpose()?;
        let observed_key = self.keys.observed(task);
        let observed = match listing.get(&observed_key) {
            Some(kv) => Some(ObservedStatus::decode(&observed_key, &kv.value)?),
            None => None,
        };
        Ok(TaskStatus {
            task: task.clone(),
            desired,
            desired_revision: desired_kv.mod_revision,
            owner: owner.as_ref().map(|(w, _, _)| w.clone()),
            owner_revision: owner.as_ref().map(|(_, r, _)| *r),
            owner_lease: owner.map(|(_, _, l)| l),
            observed,
            revision: listing.revision,
        })
    }

    /// Every task under the prefix with its status, read at one revision, sorted by
    /// task id. Keys of a task without a desired stage (none that
    /// [`Controller::create`] makes) are left out.
    ///
    /// # Errors
    ///
    /// [`ClusterError::UnknownDesired`] / [`ClusterError::Corrupt`] naming the key of
    /// a value that cannot be decoded, [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list(&self) -> Result<Vec<TaskStatus>, ClusterError> {
        Ok(self.list_with_revision().await?.1)
    }

    /// As [`Controller::list`], with the store's revision of the read: the `after`
    /// of a [`Controller::wait_tasks_change`] that misses no change since the
    /// listing, also when it holds no task (each task's
    /// [`TaskStatus::revision`] is the same revision).
    ///
    /// ```no_run
    /// # async fn follow(controller: taskstage_cluster::Controller) -> Result<(), taskstage_cluster::ClusterError> {
    /// use std::time::Duration;
    /// loop {
    ///     let (revision, tasks) = controller.list_with_revision().await?;
    ///     println!("{} tasks at revision {revision}", tasks.len());
    ///     controller.wait_tasks_change(revision, Duration::from_secs(10)).await?;
    /// }
    /// # }
    /// # let _ = follow;
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Controller::list`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list_with_revision(&self) -> Result<(i64, Vec<TaskStatus>), ClusterError> {
        let listing = within(
            self.op_timeout,
            "list tasks",
            self.coord.list(self.keys.tasks()),
        )
        .await?;
        let mut by_task: std::collections::BTreeMap<TaskId, Vec<_>> = Default::default();
        for kv in listing.kvs {
            if let Some((task, _)) = self.keys.parse_task_key(&kv.key) {
                by_task.entry(task).or_default().push(kv);
            }
        }
        let mut tasks = Vec::with_capacity(by_task.len());
        for (task, kvs) in by_task {
            let one = Listing {
                revision: listing.revision,
                kvs,
            };
            match self.decode(&task, &one) {
                Ok(status) => tasks.push(status),
                Err(ClusterError::NoSuchTask { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok((listing.revision, tasks))
    }

    /// The checkpoints the units of `task` wrote through their
    /// [`Fencer`](super::Fencer): each one's name and size, sorted by name.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`], [`ClusterError::NoSuchTask`],
    /// [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn checkpoints(&self, task: &str) -> Result<Vec<CheckpointInfo>, ClusterError> {
        let task = TaskId::new(task)?;
        let listing = within(
            self.op_timeout,
            "read task",
            self.coord.list(self.keys.task_dir(&task)),
        )
        .await?;
        if listing.get(&self.keys.desired(&task)).is_none() {
            return Err(ClusterError::NoSuchTask { task });
        }
        let prefix = self.keys.checkpoints(&task);
        let listing = within(
            self.op_timeout,
            "read checkpoints",
            self.coord.list(prefix.clone()),
        )
        .await?;
        Ok(listing
            .kvs
            .iter()
            .filter_map(|kv| {
                Some(CheckpointInfo {
                    name: kv.key.strip_prefix(&prefix)?.to_owned(),
                    size: kv.value.len(),
                    revision: kv.mod_revision,
                })
            })
            .collect())
    }

    /// Returns once some key of some task changed after store revision `after` (a
    /// [`TaskStatus::revision`]), or when `timeout` has passed, whichever is first.
    /// It may return early; callers read again and compare, as
    /// [`StatusWatch::changed`] does for one task.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn wait_tasks_change(
        &self,
        after: i64,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        self.coord
            .wait_change(self.keys.tasks(), after, timeout)
            .await
    }

    /// The workers that are members now, each id once, in order: an id is listed
    /// while any incarnation of it holds a live lease.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn workers(&self) -> Result<Vec<WorkerId>, ClusterError> {
        let listing = within(
            self.op_timeout,
            "list workers",
            self.coord.list(self.keys.workers()),
        )
        .await?;
        let ids: std::collections::BTreeSet<WorkerId> = listing
            .kvs
            .iter()
            .filter_map(|kv| Some(self.keys.parse_worker_key(&kv.key)?.0))
            .collect();
        Ok(ids.into_iter().collect())
    }

    /// Every worker that is a member now, each id once, in order, with its leases
    /// and whether it is draining.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn worker_statuses(&self) -> Result<Vec<WorkerStatus>, ClusterError> {
        let listing = within(
            self.op_timeout,
            "list workers",
            self.coord.list(self.keys.workers()),
        )
        .await?;
        let mut by_id: std::collections::BTreeMap<WorkerId, WorkerStatus> = Default::default();
        for kv in &listing.kvs {
            let Some((worker, lease)) = self.keys.parse_worker_key(&kv.key) else {
                continue;
            };
            let status = by_id.entry(worker.clone()).or_insert(WorkerStatus {
                worker,
                leases: Vec::new(),
                draining: true,
            });
            status.leases.push(lease);
            // Draining only if every live incarnation is.
            status.draining &= is_draining(&kv.value);
        }
        Ok(by_id.into_values().collect())
    }

    /// Drains `worker`: every live incarnation of it stops claiming, leaves the fair
    /// shares, and hands every task it holds over to its peers through the
    /// hand-over path (each run is paused and has returned before its owner key is
    /// released, so no run of a task overlaps another), while it stays alive. Returns
    /// once the drain is written, without waiting: [`Controller::drain_within`]
    /// waits for the worker to hold nothing.
    ///
    /// The drain is written into the worker's membership key, under the worker's own
    /// lease: it lasts as long as that incarnation, and a restarted worker (a new
    /// lease) claims again. Draining a worker already draining changes nothing.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidWorkerId`] and [`ClusterError::NoSuchWorker`] (nothing
    /// written), [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// A dropped call may still be applied.
    pub async fn drain(&self, worker: &str) -> Result<(), ClusterError> {
        let worker = WorkerId::new(worker)?;
        // Bounded: each turn either writes every incarnation, or meets one that
        // changed since it was read (its lease ended, or another controller drained
        // it); three turns are more than a race needs.
        for _ in 0..3 {
            let listing = within(
                self.op_timeout,
                "list workers",
                self.coord.list(self.keys.workers()),
            )
            .await?;
            let mine: Vec<_> = listing
                .kvs
                .iter()
                .filter_map(|kv| {
                    let (id, lease) = self.keys.parse_worker_key(&kv.key)?;
                    (id == worker).then_some((kv, lease))
                })
                .collect();
            if mine.is_empty() {
                return Err(ClusterError::NoSuchWorker {
                    command: "drain",
                    worker,
                });
            }
            let mut raced = false;
            for (kv, lease) in mine {
                if is_draining(&kv.value) {
                    continue;
                }
                // Compared with the write just read, and under the member's own
                // lease: a key whose lease ended meanwhile is not brought back.
                let txn = Txn {
                    when: vec![Compare::ModRevision(kv.key.clone(), kv.mod_revision)],
                    then: vec![Op::Put {
                        key: kv.key.clone(),
                        value: DRAINING.to_vec(),
                        lease: Some(lease),
                    }],
                };
                let result = within(self.op_timeout, "drain worker", self.coord.txn(txn)).await?;
                raced |= !result.succeeded;
            }
            if !raced {
                return Ok(());
            }
        }
        Err(ClusterError::Store {
            op: "drain worker",
            detail: format!("the membership of worker {worker} changed under every attempt"),
        })
    }

    /// Drains `worker` (see [`Controller::drain`]) and waits until no task is held
    /// by it any more: every one of its owner keys was released, each only after its
    /// run had returned and that was published. Returns at once when it holds
    /// nothing.
    ///
    /// # Errors
    ///
    /// As [`Controller::drain`], and [`ClusterError::DrainTimeout`] with the count
    /// still held when `timeout` passed first (the drain stays written).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the drain is written leaves it written.
    pub async fn drain_within(&self, worker: &str, timeout: Duration) -> Result<(), ClusterError> {
        let started = Instant::now();
        let deadline = started + timeout;
        self.drain(worker).await?;
        let worker = WorkerId::new(worker)?;
        // Bounded by the deadline: every turn waits at most until it.
        loop {
            let (held, revision) = self.held(&worker).await?;
            if held.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ClusterError::DrainTimeout {
                    worker,
                    held: held.len(),
                    waited: now - started,
                });
            }
            self.coord
                .wait_change(self.keys.tasks(), revision, self.poll.min(deadline - now))
                .await?;
        }
    }

    /// The tasks `worker` (any incarnation of it) holds now: those whose owner key
    /// is its, sorted.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidWorkerId`], [`ClusterError::Unreachable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn held_by(&self, worker: &str) -> Result<Vec<TaskId>, ClusterError> {
        let worker = WorkerId::new(worker)?;
        Ok(self.held(&worker).await?.0)
    }

    /// The tasks `worker` holds, and the revision of the read.
    async fn held(&self, worker: &WorkerId) -> Result<(Vec<TaskId>, i64), ClusterError> {
        let listing = within(
            self.op_timeout,
            "list tasks",
            self.coord.list(self.keys.tasks()),
        )
        .await?;
        let held = listing
            .kvs
            .iter()
            .filter_map(|kv| {
                let (task, kind) = self.keys.parse_task_key(&kv.key)?;
                let (owner, _) = parse_owner_value(&kv.value)?;
                (kind == TaskKey::Owner && owner == *worker).then_some(task)
            })
            .collect();
        Ok((held, listing.revision))
    }

    /// A watch of the task's status: each [`StatusWatch::changed`] returns once the
    /// owner or the observed status differs from the last one returned.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidTaskId`].
    pub fn watch(&self, task: &str) -> Result<StatusWatch, ClusterError> {
        Ok(StatusWatch {
            controller: self.clone(),
            task: TaskId::new(task)?,
            last: None,
        })
    }
}

/// What [`Controller::set`] did.
struct Set {
    /// The desired revision to wait for.
    revision: i64,
    /// The task as read before the write.
    before: TaskStatus,
    /// A watch of the task's keys from `before`, if asked for and opened.
    watch: Option<WatchStream>,
}

/// The desired stage a command for `desired` replaces in the common case, written
/// without a read before it: a pause replaces Running, a resume Paused. A stop
/// is always read first.
fn replaces(desired: DesiredStage) -> Option<DesiredStage> {
    match desired {
        DesiredStage::Paused => Some(DesiredStage::Running),
        DesiredStage::Running => Some(DesiredStage::Paused),
        DesiredStage::Stopped => None,
    }
}

fn decode_desired(key: &str, kv: &KeyValue) -> Result<DesiredStage, ClusterError> {
    let text = String::from_utf8_lossy(&kv.value);
    text.parse::<DesiredStage>()
        .map_err(|_| ClusterError::UnknownDesired {
            key: key.to_owned(),
            value: text.into_owned(),
        })
}

fn decode_owner(key: &str, kv: &KeyValue) -> Result<(WorkerId, i64, i64), ClusterError> {
    let (worker, lease) = parse_owner_value(&kv.value).ok_or_else(|| ClusterError::Corrupt {
        key: key.to_owned(),
        reason: "not worker@lease".into(),
    })?;
    Ok((worker, kv.create_revision, lease))
}

/// A watch of one task's observed changes; made by [`Controller::watch`].
#[derive(Debug)]
pub struct StatusWatch {
    controller: Controller,
    task: TaskId,
    last: Option<TaskStatus>,
}

impl StatusWatch {
    /// Waits up to `timeout` for the task's owner or observed status to change from
    /// the last value returned (the first call returns the current one at once).
    ///
    /// # Errors
    ///
    /// [`ClusterError::Timeout`] (command "watch") when nothing changed in time;
    /// errors of [`Controller::status`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; the last value returned is kept.
    pub async fn changed(&mut self, timeout: Duration) -> Result<TaskStatus, ClusterError> {
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let status = self.controller.status_of(&self.task).await?;
            let differs = self.last.as_ref().is_none_or(|last| {
                last.observed != status.observed
                    || last.owner != status.owner
                    || last.owner_revision != status.owner_revision
            });
            if differs {
                self.last = Some(status.clone());
                return Ok(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ClusterError::Timeout {
                    command: "watch",
                    task: self.task.clone(),
                    owner: status.owner.clone(),
                    stage: status.current_observed().map(|o| o.stage),
                    waited: now - started,
                });
            }
            let wait = self.controller.poll.min(deadline - now);
            let _ = self
                .controller
                .coord
                .wait_change(
                    self.controller.keys.task_dir(&self.task),
                    status.revision,
                    wait,
                )
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryCoordinator;

    async fn put(store: &MemoryCoordinator, key: String, value: &[u8]) {
        let txn = Txn {
            when: Vec::new(),
            then: vec![Op::Put {
                key,
                value: value.to_vec(),
                lease: None,
            }],
        };
        assert!(store.txn(txn).await.unwrap().succeeded);
    }

    /// A command's answer is followed from the watched changes after its write: an
    /// owner that lost the task meanwhile does not answer, its successor does.
    #[tokio::test(start_paused = true)]
    async fn a_commands_answer_follows_owner_changes_seen_after_the_write() {
        let store = MemoryCoordinator::new();
        let controller = Controller::new(store.clone(), "app").unwrap();
        let keys = Keys::new("app").unwrap();
        let t = TaskId::new("t").unwrap();
        controller
            .create("t", Vec::new(), DesiredStage::Running)
            .await
            .unwrap();
        put(&store, keys.owner(&t), b"w1@1").await;
        let first_owner = controller.status("t").await.unwrap().owner_revision;
        let pausing = tokio::spawn({
            let controller = controller.clone();
            async move { controller.pause_within("t", Duration::from_secs(5)).await }
        });
        // Bounded: the paused clock moves only when every task waits.
        let desired = loop {
            let status = controller.status("t").await.unwrap();
            if status.desired == DesiredStage::Paused {
                break status.desired_revision;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // The task moves to w2; then w1's late report, then w2's.
        let delete = Txn {
            when: Vec::new(),
            then: vec![Op::Delete {
                key: keys.owner(&t),
            }],
        };
        store.txn(delete).await.unwrap();
        put(&store, keys.owner(&t), b"w2@2").await;
        let second_owner = controller.status("t").await.unwrap().owner_revision;
        let report = |owner: &str, owner_revision: Option<i64>| ObservedStatus {
            stage: taskstage::Stage::Paused,
            generation: 1,
            outcome: crate::ObservedOutcome::Cancelled,
            desired_revision: desired,
            owner: WorkerId::new(owner).unwrap(),
            owner_revision: owner_revision.unwrap(),
        };
        put(
            &store,
            keys.observed(&t),
            &report("w1", first_owner).encode(),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!pausing.is_finished(), "a deposed owner's report answered");
        put(
            &store,
            keys.observed(&t),
            &report("w2", second_owner).encode(),
        )
        .await;
        let answer = pausing.await.unwrap().unwrap();
        assert_eq!(answer.owner.as_str(), "w2");
    }

    #[tokio::test(start_paused = true)]
    async fn list_reads_every_task_sorted_and_as_status_does() {
        let store = MemoryCoordinator::new();
        let controller = Controller::new(store.clone(), "app").unwrap();
        assert_eq!(controller.list().await.unwrap(), Vec::new());
        controller
            .create("b", b"x".to_vec(), DesiredStage::Running)
            .await
            .unwrap();
        controller
            .create("a", Vec::new(), DesiredStage::Paused)
            .await
            .unwrap();
        // A key of no task (no desired stage), and a task under another prefix.
        let keys = Keys::new("app").unwrap();
        let ghost = TaskId::new("ghost").unwrap();
        put(&store, keys.checkpoint(&ghost, "pos"), b"1").await;
        Controller::new(store.clone(), "other")
            .unwrap()
            .create("c", Vec::new(), DesiredStage::Running)
            .await
            .unwrap();

        let tasks = controller.list().await.unwrap();
        let ids: Vec<&str> = tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(tasks[0].revision, tasks[1].revision, "one read");
        for listed in &tasks {
            let status = controller.status(listed.task.as_str()).await.unwrap();
            assert_eq!(
                TaskStatus {
                    revision: status.revision,
                    ..listed.clone()
                },
                status
            );
        }
        assert_eq!(tasks[0].desired, DesiredStage::Paused);
        assert_eq!(tasks[1].desired, DesiredStage::Running);

        // A value that cannot be decoded is named, not skipped.
        put(&store, keys.desired(&TaskId::new("a").unwrap()), b"Bogus").await;
        let error = controller.list().await.unwrap_err();
        assert!(
            matches!(&error, ClusterError::UnknownDesired { key, value } if key == "app/tasks/a/desired" && value == "Bogus"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn checkpoints_are_listed_with_their_sizes_and_only_the_tasks_own() {
        let store = MemoryCoordinator::new();
        let controller = Controller::new(store.clone(), "app").unwrap();
        for task in ["a", "ab"] {
            controller
                .create(task, Vec::new(), DesiredStage::Paused)
                .await
                .unwrap();
        }
        assert_eq!(controller.checkpoints("a").await.unwrap(), Vec::new());
        let keys = Keys::new("app").unwrap();
        let (a, ab) = (TaskId::new("a").unwrap(), TaskId::new("ab").unwrap());
        put(&store, keys.checkpoint(&a, "pos"), b"12345").await;
        put(&store, keys.checkpoint(&a, "lsn"), b"").await;
        put(&store, keys.checkpoint(&ab, "other"), b"1").await;
        let found = controller.checkpoints("a").await.unwrap();
        let named: Vec<(&str, usize)> = found.iter().map(|c| (c.name.as_str(), c.size)).collect();
        assert_eq!(named, [("lsn", 0), ("pos", 5)]);
        assert!(found.iter().all(|c| c.revision > 1));

        assert!(matches!(
            controller.checkpoints("nobody").await,
            Err(ClusterError::NoSuchTask { .. })
        ));
        assert!(matches!(
            controller.checkpoints("a/b").await,
            Err(ClusterError::InvalidTaskId { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_tasks_change_returns_on_a_write_and_at_its_timeout() {
        let store = MemoryCoordinator::new();
        let controller = Controller::new(store.clone(), "app").unwrap();
        controller
            .create("a", Vec::new(), DesiredStage::Paused)
            .await
            .unwrap();
        let at = controller.status("a").await.unwrap().revision;

        let started = Instant::now();
        controller
            .wait_tasks_change(at, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(5), "nothing changed");

        let waiter = {
            let controller = controller.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                controller
                    .wait_tasks_change(at, Duration::from_secs(60))
                    .await
                    .map(|()| started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        controller
            .set_desired("a", DesiredStage::Running)
            .await
            .unwrap();
        let waited = waiter.await.unwrap().unwrap();
        assert!(
            waited < Duration::from_secs(2),
            "woken by the write: {waited:?}"
        );
    }
}
