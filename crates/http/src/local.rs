//! One process's tasks, as the API serves them.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use taskstage::ErrorCode;

use axum::http::StatusCode;
use serde_json::Value;

use super::error::ApiError;
use super::hub::{Hub, DEFAULT_CAPACITY};
use super::listing::Listing;
use super::{now_ms, BoxFuture, Cmd, Item, PolicyItem, Reached, Source};
use taskstage::policy::{AutoResume, AutoResumeObserver, Standing, Status};
use taskstage::runtime::{Event, TaskObserver, TaskSnapshot, WeakHandle};
use taskstage::Error;
use taskstage::Stage;
use taskstage::{Handle, Outcome, TaskGroup};

/// A task could not be served: one of its name is served already, and the API
/// names a task by its name ([`LocalTasks::add`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a task named {name:?} is served already: the API names each task by its name")]
pub struct NameTaken {
    /// The name.
    pub name: String,
}

/// One task: read through its observer, commanded through a weak handle, so that
/// serving it keeps nothing alive (dropping the application's last handle stops the
/// task as it would without the API).
struct Entry<C: Send + Sync + 'static> {
    id: Arc<str>,
    observer: TaskObserver<C>,
    handle: WeakHandle<C>,
    /// When the API saw the task enter its stage (ms since the epoch).
    since: Arc<AtomicU64>,
}

/// The tasks in the order of addition, and each name's place among them (one task
/// per name).
type Table<C> = (Vec<Arc<Entry<C>>>, HashMap<Arc<str>, usize>);

struct Inner<C: Send + Sync + 'static> {
    entries: RwLock<Table<C>>,
    /// Moved on every change of `entries`, under its write lock: a listing of
    /// another table is built anew.
    table: AtomicU64,
    /// The last listing built, with what each of its items was built from.
    cached: Mutex<Option<Arc<Cached>>>,
    /// Taken (and awaited) by the request that builds a listing: the others wait
    /// for it and are served its listing, not a build of their own. Held across no
    /// `.await` (the build is synchronous).
    building: tokio::sync::Mutex<()>,
    hub: Arc<Hub>,
    /// The policy whose standing of each task is shown ([`LocalTasks::show_policy`]).
    policy: RwLock<Option<AutoResumeObserver<C>>>,
}

/// What one task's item was built from: its change counter and progress
/// ([`TaskObserver::version`]), and its `since`. The same key read again means
/// the same item.
type Key = (u64, taskstage::runtime::Progress, u64);

/// The policy revision of a listing built without a policy.
const NO_POLICY: u64 = u64::MAX;

/// A listing, and the key of each of its items (in the same order).
struct Cached {
    table: u64,
    /// The policy's revision the items were built at ([`NO_POLICY`] without one):
    /// another one means other standings, so every item is built anew.
    policy: u64,
    keys: Vec<Key>,
    listing: Arc<Listing>,
}

/// The tasks of one process that an [`Api::local`](super::Api::local) serves, by name.
///
/// Cheap to clone (clones share the tasks). It keeps no task alive: each is read
/// through a [`TaskObserver`] and commanded through a [`WeakHandle`]. Names are the
/// ids of the API: a name added twice is served as the first task of that name.
pub struct LocalTasks<C: Send + Sync + 'static = ()> {
    inner: Arc<Inner<C>>,
}

impl<C: Send + Sync + 'static> Clone for LocalTasks<C> {
    fn clone(&self) -> Self {
        LocalTasks {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for LocalTasks<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTasks")
            .field("tasks", &self.len())
            .finish()
    }
}

impl<C: Send + Sync + 'static> Default for LocalTasks<C> {
    fn default() -> Self {
        Self::with_event_capacity(DEFAULT_CAPACITY)
    }
}

impl<C: Send + Sync + 'static> LocalTasks<C> {
    /// No tasks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// No tasks yet; the event streams keep the last `capacity` changes of all the
    /// tasks together (4,096 unless set; at least 1): a client that falls further
    /// behind, or resumes from an older event id, is sent a `gap` event.
    pub fn with_event_capacity(capacity: usize) -> Self {
        LocalTasks {
            inner: Arc::new(Inner {
                entries: RwLock::new((Vec::new(), HashMap::new())),
                table: AtomicU64::new(0),
                cached: Mutex::new(None),
                building: tokio::sync::Mutex::new(()),
                hub: Arc::new(Hub::new(capacity)),
                policy: RwLock::new(None),
            }),
        }
    }

    /// The tasks of `group` (the group keeps its handles and its commands).
    ///
    /// # Panics
    ///
    /// If and only if called outside a tokio runtime (each task's events are
    /// followed by a spawned tokio task).
    ///
    /// # Errors
    ///
    /// [`NameTaken`] when two tasks of the group share a name: the API names a
    /// task by its name, so the second would be listed and out of reach.
    pub fn from_group(group: &TaskGroup<C>) -> Result<Self, NameTaken> {
        let tasks = Self::new();
        for handle in group.tasks() {
            tasks.add(handle)?;
        }
        Ok(tasks)
    }

    /// Serves one more task, named by its name.
    ///
    /// # Errors
    ///
    /// [`NameTaken`] when a task of that name is served already (until
    /// [`LocalTasks::remove_ended`] removes it, once it has ended); nothing
    /// changes.
    ///
    /// # Panics
    ///
    /// If and only if called outside a tokio runtime (the task's events are
    /// followed by a spawned tokio task).
    pub fn add(&self, handle: &Handle<C>) -> Result<(), NameTaken> {
        let observer = handle.observer();
        // The stream is made before the stage is read: no change falls between them.
        let mut events = observer.events();
        let entry = Arc::new(Entry {
            id: Arc::from(handle.name()),
            observer,
            handle: handle.downgrade(),
            since: Arc::new(AtomicU64::new(now_ms())),
        });
        {
            let mut entries = self
                .inner
                .entries
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if entries.1.contains_key(&entry.id) {
                return Err(NameTaken {
                    name: handle.name().to_owned(),
                });
            }
            let index = entries.0.len();
            entries.1.insert(Arc::clone(&entry.id), index);
            entries.0.push(Arc::clone(&entry));
            // Relaxed: read and written under the entries' lock, which orders it.
            self.inner.table.fetch_add(1, Ordering::Relaxed);
        }
        let hub = Arc::downgrade(&self.inner.hub);
        let id = Arc::clone(&entry.id);
        let since = Arc::clone(&entry.since);
        let observer = entry.observer.clone();
        tokio::spawn(async move {
            // Ends after the task's terminal stage (the stream ends), or once the API
            // is gone.
            while let Some(event) = events.next().await {
                let Some(hub) = hub.upgrade() else { break };
                match event {
                    Event::Change(change) => {
                        let at = now_ms();
                        if change.stage != change.from {
                            // Relaxed: `since` is a display value; nothing is ordered by it.
                            since.store(at, Ordering::Relaxed);
                        }
                        let snapshot = observer.snapshot();
                        let item = Item {
                            id: Arc::clone(&id),
                            stage: Some(change.stage),
                            desired: None,
                            owner: None,
                            token: None,
                            since: Some(since.load(Ordering::Relaxed)),
                            outcome: change.outcome.as_ref().map(outcome),
                            progress: Some((snapshot.progress.done, snapshot.progress.total)),
                            user_paused: Some(snapshot.user_paused),
                            policy: None,
                        };
                        let mut item = item.to_json();
                        // The policy decides after this change (see `show_policy`).
                        if let Some(fields) = item.as_object_mut() {
                            fields.remove("policy");
                        }
                        let data = serde_json::json!({
                            "task": &*id,
                            "from": change.from.name(),
                            "cause": change.cause.name(),
                            "generation": change.generation,
                            "item": item,
                        });
                        hub.push(Arc::clone(&id), "change", data.to_string());
                    }
                    Event::Lagged { missed } => {
                        let data = serde_json::json!({"task": &*id, "missed": missed});
                        hub.push(Arc::clone(&id), "gap", data.to_string());
                    }
                }
            }
        });
        Ok(())
    }

    /// Shows `policy`'s standing of each served task it watches (matched by the
    /// task's name): the list and a task's detail then carry `policy`, with the
    /// standing (`backing_off` with when the retry is due, `blocked`, `user_paused`,
    /// `healthy`…), the backoff step and how many times the policy resumed it. A
    /// task the policy does not watch has `policy: null`. Serving the policy does not
    /// keep it alive (it is read through an [`AutoResumeObserver`]). A second call
    /// replaces the first.
    ///
    /// A change event's item carries no `policy`: the policy decides after the
    /// change it reacts to, so its standing is read from the list or the detail.
    pub fn show_policy(&self, policy: &AutoResume<C>) {
        *self
            .inner
            .policy
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(policy.observer());
        // Relaxed: a listing of another table is built anew, nothing else.
        self.inner.table.fetch_add(1, Ordering::Relaxed);
    }

    /// The policy shown, and its revision now.
    fn policy(&self) -> (Option<AutoResumeObserver<C>>, u64) {
        let policy = self
            .inner
            .policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let revision = policy
            .as_ref()
            .map_or(NO_POLICY, AutoResumeObserver::revision);
        (policy, revision)
    }

    /// How many tasks are served.
    pub fn len(&self) -> usize {
        self.inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .len()
    }

    /// Whether no task is served.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops serving the tasks that have ended (Stopped or Finished), and returns
    /// how many; the others keep their order.
    pub fn remove_ended(&self) -> usize {
        let mut entries = self
            .inner
            .entries
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let before = entries.0.len();
        entries.0.retain(|e| !e.observer.stage().is_terminal());
        let mut index = HashMap::new();
        for (i, e) in entries.0.iter().enumerate() {
            index.entry(Arc::clone(&e.id)).or_insert(i);
        }
        entries.1 = index;
        // Relaxed: read and written under the entries' lock, which orders it.
        self.inner.table.fetch_add(1, Ordering::Relaxed);
        before - entries.0.len()
    }

    pub(crate) fn hub(&self) -> Arc<Hub> {
        Arc::clone(&self.inner.hub)
    }

    /// The last listing, if it is still every task's state now: the table is the
    /// same and every task's key reads as it did when its item was built.
    fn fresh(&self) -> Option<Arc<Listing>> {
        let cached = self
            .inner
            .cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        if cached.policy != self.policy().1 {
            return None;
        }
        let entries = self
            .inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        // Relaxed: under the entries' lock.
        let same_table = cached.table == self.inner.table.load(Ordering::Relaxed);
        let unchanged = same_table
            && entries.0.len() == cached.keys.len()
            && entries
                .0
                .iter()
                .zip(&cached.keys)
                .all(|(entry, key)| key_of(entry) == *key);
        unchanged.then(|| Arc::clone(&cached.listing))
    }

    /// A listing of every task now, reusing the items of the last one whose keys
    /// read the same.
    fn build(&self) -> Arc<Listing> {
        let old = self
            .inner
            .cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // The revision is read before the statuses: a change in between moves it
        // past the one recorded, and the next request builds again.
        let (policy, revision) = self.policy();
        let statuses = statuses_by_name(policy.as_ref());
        let entries = self
            .inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        // Relaxed: under the entries' lock.
        let table = self.inner.table.load(Ordering::Relaxed);
        let old = old.filter(|o| o.table == table && o.policy == revision);
        let mut keys = Vec::with_capacity(entries.0.len());
        let mut items = Vec::with_capacity(entries.0.len());
        let mut reused = Vec::with_capacity(entries.0.len());
        for (i, entry) in entries.0.iter().enumerate() {
            let key = key_of(entry);
            let kept = old.as_ref().and_then(|o| {
                (o.keys.get(i) == Some(&key))
                    .then(|| o.listing.items.get(i).cloned())
                    .flatten()
            });
            match kept {
                Some(item) => {
                    keys.push(key);
                    items.push(item);
                    reused.push(true);
                }
                None => {
                    let snapshot = entry.observer.snapshot();
                    let mut item = item_of(entry, &snapshot);
                    item.policy = statuses.get(&*entry.id).map(policy_item);
                    keys.push((
                        snapshot.seq,
                        snapshot.progress,
                        item.since.unwrap_or_default(),
                    ));
                    items.push(item);
                    reused.push(false);
                }
            }
        }
        drop(entries);
        let listing = Arc::new(Listing::reusing(items, |i| {
            if reused.get(i) == Some(&true) {
                old.as_ref()?.listing.text_of(i)
            } else {
                None
            }
        }));
        *self
            .inner
            .cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Cached {
            table,
            policy: revision,
            keys,
            listing: Arc::clone(&listing),
        }));
        listing
    }

    /// The shown policy's standing of the task named `id`, if it watches it.
    fn policy_of(&self, id: &str) -> Option<PolicyItem> {
        let (policy, _) = self.policy();
        let statuses = policy?.statuses();
        statuses
            .iter()
            .find(|(_, status)| status.name == id)
            .map(|(_, status)| policy_item(status))
    }

    fn find(&self, id: &str) -> Option<Arc<Entry<C>>> {
        let entries = self
            .inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        entries.1.get(id).and_then(|&i| entries.0.get(i)).cloned()
    }
}

/// The statuses of the tasks `policy` watches, by name (the first of a name).
fn statuses_by_name<C: Send + Sync + 'static>(
    policy: Option<&AutoResumeObserver<C>>,
) -> HashMap<String, Status> {
    let mut by_name = HashMap::new();
    for (_, status) in policy.map(AutoResumeObserver::statuses).unwrap_or_default() {
        by_name.entry(status.name.clone()).or_insert(status);
    }
    by_name
}

/// `at` as ms since the Unix epoch, by its distance from now.
fn epoch_ms(at: tokio::time::Instant) -> u64 {
    let now = tokio::time::Instant::now();
    let wall = now_ms();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if at >= now {
        wall.saturating_add(ms(at - now))
    } else {
        wall.saturating_sub(ms(now - at))
    }
}

fn policy_item(status: &Status) -> PolicyItem {
    let (standing, since) = match status.standing {
        Standing::NotStarted => ("not_started", None),
        Standing::Healthy { since } => ("healthy", Some(epoch_ms(since))),
        Standing::Changing => ("changing", None),
        Standing::BackingOff { .. } => ("backing_off", None),
        Standing::NotResumable { since } => ("blocked", Some(epoch_ms(since))),
        Standing::UserPaused => ("user_paused", None),
        Standing::Idle => ("idle", None),
        // A standing a later version of the core adds.
        _ => ("other", None),
    };
    PolicyItem {
        standing,
        due: status.next_due.map(epoch_ms),
        since,
        step: status.step,
        auto_resumes: status.auto_resumes,
    }
}

fn outcome(outcome: &Outcome) -> (&'static str, Option<String>) {
    (outcome.name(), outcome.error().map(ToString::to_string))
}

/// What `entry`'s item is built from, read now (see [`Key`]).
fn key_of<C: Send + Sync + 'static>(entry: &Entry<C>) -> Key {
    let (seq, progress) = entry.observer.version();
    // Relaxed: a display value.
    (seq, progress, entry.since.load(Ordering::Relaxed))
}

fn item_of<C: Send + Sync + 'static>(entry: &Entry<C>, snapshot: &TaskSnapshot) -> Item {
    Item {
        id: Arc::clone(&entry.id),
        stage: Some(snapshot.stage),
        desired: None,
        owner: None,
        token: None,
        // Relaxed: a display value.
        since: Some(entry.since.load(Ordering::Relaxed)),
        outcome: snapshot.outcome.as_ref().map(outcome),
        progress: Some((snapshot.progress.done, snapshot.progress.total)),
        user_paused: Some(snapshot.user_paused),
        policy: None,
    }
}

/// The answer body of a command: the task as it is now.
fn answer<C: Send + Sync + 'static>(entry: &Entry<C>, cmd: Cmd, stage: Stage) -> Value {
    let snapshot = entry.observer.snapshot();
    let mut body = item_of(entry, &snapshot).to_json();
    body["stage"] = Value::from(stage.name());
    body["command"] = Value::from(cmd.name());
    body
}

fn refused(cmd: Cmd, id: &str, error: &Error) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        ErrorCode::Refused,
        format!("{} of task {id}: {error}", cmd.name()),
    )
    .command(cmd.name())
    .task(id)
    .stage(Some(error.stage()))
}

impl<C: Send + Sync + 'static> Source for LocalTasks<C> {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn listing(&self) -> BoxFuture<'_, Result<Arc<Listing>, ApiError>> {
        Box::pin(async move {
            if let Some(listing) = self.fresh() {
                return Ok(listing);
            }
            // One build at a time; a request that waited is served the build it
            // waited for when nothing moved since.
            let _turn = self.inner.building.lock().await;
            if let Some(listing) = self.fresh() {
                return Ok(listing);
            }
            Ok(self.build())
        })
    }

    fn detail<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Value, ApiError>> {
        Box::pin(async move {
            let entry = self.find(id).ok_or_else(|| ApiError::unknown_task(id))?;
            let snapshot = entry.observer.snapshot();
            let mut item = item_of(&entry, &snapshot);
            item.policy = self.policy_of(&entry.id);
            let mut body = item.to_json();
            body["generation"] = Value::from(snapshot.generation);
            body["units"] = Value::from(snapshot.units);
            body["unit"] = match &snapshot.unit {
                Some((index, name)) => serde_json::json!({"index": index, "name": &**name}),
                None => Value::Null,
            };
            body["seq"] = Value::from(snapshot.seq);
            Ok(body)
        })
    }

    fn exists<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, ApiError>> {
        Box::pin(async move { Ok(self.find(id).is_some()) })
    }

    fn command<'a>(
        &'a self,
        id: &'a str,
        cmd: Cmd,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Reached, ApiError>> {
        Box::pin(async move {
            let entry = self.find(id).ok_or_else(|| ApiError::unknown_task(id))?;
            let Some(handle) = entry.handle.upgrade() else {
                // Every handle is gone: the task was stopped by its owner's drop.
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    ErrorCode::Refused,
                    format!(
                        "{} of task {id} refused: the application dropped the task (stage {})",
                        cmd.name(),
                        entry.observer.stage()
                    ),
                )
                .command(cmd.name())
                .task(id)
                .stage(Some(entry.observer.stage())));
            };
            let deadline = tokio::time::Instant::now() + wait;
            let settled = match cmd {
                Cmd::Pause | Cmd::Stop => {
                    let issued = if cmd == Cmd::Pause {
                        handle.pause_now()
                    } else {
                        handle.stop_now()
                    };
                    let settling = issued.map_err(|e| refused(cmd, id, &e))?;
                    // The command stands if the wait runs out (the future is dropped).
                    match tokio::time::timeout_at(deadline, settling).await {
                        Ok(Ok(stage)) => Some(stage),
                        Ok(Err(Error::Timeout { .. })) | Err(_) => None,
                        // A refusal, or a kind of error a later version adds.
                        Ok(Err(error)) => return Err(refused(cmd, id, &error)),
                    }
                }
                Cmd::Resume => {
                    match tokio::time::timeout_at(deadline, handle.resume_within(wait)).await {
                        Ok(Ok(())) => {
                            // Accepted; wait for the check to end (Running, or Paused
                            // when it failed) as long as the wait allows.
                            let reached = tokio::time::timeout_at(
                                deadline,
                                handle.wait_for_stage(|s| s != Stage::Resuming),
                            )
                            .await;
                            reached.ok().map(|snapshot| snapshot.stage)
                        }
                        Ok(Err(Error::Timeout { .. })) | Err(_) => {
                            // The task was still settling an earlier pause: the resume
                            // waited for it and was never issued.
                            let stage = handle.stage();
                            return Err(ApiError::new(
                                StatusCode::CONFLICT,
                                ErrorCode::StillSettling,
                                format!(
                                    "resume of task {id} not issued: the task was still {stage} when the wait ran out"
                                ),
                            )
                            .command(cmd.name())
                            .task(id)
                            .stage(Some(stage)));
                        }
                        // A refusal, or a kind of error a later version adds.
                        Ok(Err(error)) => return Err(refused(cmd, id, &error)),
                    }
                }
            };
            Ok(match settled {
                Some(stage) => Reached::Done(answer(&entry, cmd, stage)),
                // Accepted, not done: the stage as it is (Pausing, Resuming, Stopping).
                None => Reached::Settling(answer(&entry, cmd, handle.stage())),
            })
        })
    }

    fn problems(&self) -> Vec<String> {
        Vec::new()
    }
}
