//! A cluster, as the API serves it: commands through the controller, the task list
//! from a watched copy of the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;
use taskstage::ErrorCode;

use axum::http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::ApiError;
use super::hub::Hub;
use super::listing::Listing;
use super::{now_ms, BoxFuture, Cmd, Item, Reached, Source};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, ObservedOutcome, ObservedStatus, TaskStatus,
};

/// How long the watch waits for a change before it reads again anyway.
const RELIST: Duration = Duration::from_secs(10);
/// The least time between two reads of the store: a store that reports a change at
/// once (or fails at once) is not read in a busy loop.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// How long a request waits for the first read of the store.
const FIRST_READ: Duration = Duration::from_secs(5);

/// The watched copy of the store's tasks: their listing, and each task's place in it.
#[derive(Debug, Default)]
struct Cache {
    listing: Arc<Listing>,
    index: HashMap<Arc<str>, usize>,
}

struct Inner {
    controller: Controller,
    cache: RwLock<Option<Arc<Cache>>>,
    loaded: watch::Sender<bool>,
    /// Why the last read of the store failed, if it did.
    problem: Mutex<Option<String>>,
    hub: Arc<Hub>,
}

/// Aborts the watch when the source goes.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) struct ClusterSource {
    inner: Arc<Inner>,
    _watch: Abort,
}

impl ClusterSource {
    pub(crate) fn start(controller: Controller, hub: Arc<Hub>) -> Self {
        let inner = Arc::new(Inner {
            controller,
            cache: RwLock::new(None),
            loaded: watch::Sender::new(false),
            problem: Mutex::new(None),
            hub,
        });
        let task = tokio::spawn(follow(Arc::downgrade(&inner)));
        ClusterSource {
            inner,
            _watch: Abort(task),
        }
    }

    async fn cache(&self) -> Result<Arc<Cache>, ApiError> {
        let mut loaded = self.inner.loaded.subscribe();
        let ready = tokio::time::timeout(FIRST_READ, loaded.wait_for(|l| *l)).await;
        if let Some(cache) = self
            .inner
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(cache);
        }
        let why = self
            .inner
            .problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "the store has not been read yet".to_owned());
        let _ = ready;
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unreachable,
            why,
        ))
    }
}

/// Reads the store's tasks, publishes each change to the hub, and waits for the next
/// change; ends when the API is gone.
async fn follow(inner: Weak<Inner>) {
    let mut revision = 0;
    loop {
        let started = Instant::now();
        let Some(this) = inner.upgrade() else { return };
        match this.controller.list_with_revision().await {
            Ok((read_at, list)) => {
                // The listing's own revision, not its tasks': an empty prefix has
                // none, and a wait from 0 would see every change since the store
                // began, again and again.
                revision = read_at;
                apply(&this, &list);
                *this.problem.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            Err(error) => {
                *this.problem.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(format!("store unreachable: {error}"));
            }
        }
        let controller = this.controller.clone();
        drop(this);
        if controller
            .wait_tasks_change(revision, RELIST)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::time::sleep_until(started + MIN_INTERVAL).await;
    }
}

fn stage_of(status: &TaskStatus) -> Option<&ObservedStatus> {
    status.current_observed()
}

fn outcome(outcome: &ObservedOutcome) -> Option<(&'static str, Option<String>)> {
    outcome
        .name()
        .map(|name| (name, outcome.error().map(str::to_owned)))
}

fn item_of(status: &TaskStatus, since: Option<u64>) -> Item {
    let observed = stage_of(status);
    Item {
        id: Arc::from(status.task.as_str()),
        stage: observed.map(|o| o.stage),
        desired: Some(status.desired.name()),
        owner: status.owner.as_ref().map(|w| w.as_str().to_owned()),
        token: status.owner_revision,
        since,
        outcome: observed.and_then(|o| outcome(&o.outcome)),
        progress: None,
        user_paused: Some(status.desired == taskstage_cluster::DesiredStage::Paused),
        policy: None,
    }
}

/// Replaces the cache with `list`; every task whose item changed is published.
fn apply(inner: &Inner, list: &[TaskStatus]) {
    let old = inner
        .cache
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let now = now_ms();
    let mut index = HashMap::with_capacity(list.len());
    let mut items = Vec::with_capacity(list.len());
    // For each item, its place in the old listing when it did not change there.
    let mut same = Vec::with_capacity(list.len());
    let mut changed = Vec::new();
    for status in list {
        let at = old
            .as_ref()
            .and_then(|c| c.index.get(status.task.as_str()).copied());
        let before = old
            .as_ref()
            .zip(at)
            .and_then(|(c, i)| c.listing.items.get(i));
        let mut item = item_of(status, Some(now));
        match before {
            Some(b) if b.stage == item.stage => item.since = b.since,
            _ => {}
        }
        if before == Some(&item) {
            same.push(at);
        } else {
            same.push(None);
            changed.push((before.and_then(|b| b.stage), item.clone()));
        }
        index.insert(Arc::clone(&item.id), items.len());
        items.push(item);
    }
    // One serialization per change, of the items that changed only.
    let listing = Listing::reusing(items, |i| {
        let at = same.get(i).copied().flatten()?;
        old.as_ref()?.listing.text_of(at)
    });
    let cache = Cache {
        listing: Arc::new(listing),
        index,
    };
    *inner.cache.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(cache));
    inner.loaded.send_replace(true);
    // Published after the cache holds them: a client that reloads on an event sees
    // at least that change.
    for (from, item) in changed {
        let data = json!({
            "task": &*item.id,
            "from": from.map(taskstage::Stage::name),
            "cause": null,
            "item": item.to_json(),
        });
        inner
            .hub
            .push(Arc::clone(&item.id), "change", data.to_string());
    }
}

fn map_error(error: ClusterError, id: &str, command: &'static str) -> ApiError {
    let msg = error.to_string();
    let e = match &error {
        ClusterError::InvalidTaskId { .. } | ClusterError::NoSuchTask { .. } => {
            return ApiError::unknown_task(id).command(command)
        }
        ClusterError::Stopped { .. } => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::Refused, msg)
                .stage(Some(taskstage::Stage::Stopped))
        }
        ClusterError::Conflict { .. } => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, msg)
        }
        ClusterError::TaskExists { .. } => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::Exists, msg)
        }
        // Bad input, as a body over the API's own limit is: the limit is the store's.
        ClusterError::SpecTooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge, msg)
        }
        ClusterError::Unreachable { .. }
        | ClusterError::Store { .. }
        | ClusterError::HistoryReplaced { .. } => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unreachable, msg)
        }
        _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, msg),
    };
    e.command(command).task(id)
}

fn map_worker_error(error: ClusterError, id: &str) -> ApiError {
    match error {
        ClusterError::InvalidWorkerId { .. } | ClusterError::NoSuchWorker { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownWorker,
            format!("worker {id:?} is not a member"),
        )
        .command("drain"),
        error => map_error(error, "", "drain"),
    }
}

fn answer(id: &str, cmd: Cmd, desired: DesiredStage, observed: &ObservedStatus) -> Value {
    json!({
        "id": id,
        "command": cmd.name(),
        "stage": observed.stage.name(),
        "desired": desired.name(),
        "owner": observed.owner.as_str(),
        "token": observed.owner_revision,
        "since": null,
        "outcome": outcome(&observed.outcome).map(|(kind, error)| json!({"kind": kind, "error": error})),
        "progress": null,
        "generation": observed.generation,
        "desired_revision": observed.desired_revision,
    })
}

impl Source for ClusterSource {
    fn kind(&self) -> &'static str {
        "cluster"
    }

    fn listing(&self) -> BoxFuture<'_, Result<Arc<Listing>, ApiError>> {
        Box::pin(async move { Ok(Arc::clone(&self.cache().await?.listing)) })
    }

    fn detail<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Value, ApiError>> {
        Box::pin(async move {
            let status = self
                .inner
                .controller
                .status(id)
                .await
                .map_err(|e| map_error(e, id, "show"))?;
            let mut body = item_of(&status, None).to_json();
            if let Ok(cache) = self.cache().await {
                if let Some(item) = cache
                    .index
                    .get(id)
                    .and_then(|&i| cache.listing.items.get(i))
                {
                    body["since"] = json!(item.since);
                }
            }
            body["desired_revision"] = json!(status.desired_revision);
            body["answers"] = json!(status.answers(status.desired_revision));
            body["generation"] = json!(stage_of(&status).map(|o| o.generation));
            body["revision"] = json!(status.revision);
            Ok(body)
        })
    }

    fn exists<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, ApiError>> {
        Box::pin(async move {
            match self.inner.controller.status(id).await {
                Ok(_) => Ok(true),
                Err(ClusterError::InvalidTaskId { .. } | ClusterError::NoSuchTask { .. }) => {
                    Ok(false)
                }
                Err(e) => Err(map_error(e, id, "events")),
            }
        })
    }

    fn command<'a>(
        &'a self,
        id: &'a str,
        cmd: Cmd,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Reached, ApiError>> {
        Box::pin(async move {
            let controller = &self.inner.controller;
            let desired = match cmd {
                Cmd::Pause => DesiredStage::Paused,
                Cmd::Resume => DesiredStage::Running,
                Cmd::Stop => DesiredStage::Stopped,
            };
            let settling = |observed: Option<taskstage::Stage>, owner: Option<&str>| {
                json!({
                    "id": id,
                    "command": cmd.name(),
                    // Written, not yet answered by the owner.
                    "stage": cmd.settling().name(),
                    "desired": desired.name(),
                    "observed": observed.map(taskstage::Stage::name),
                    "owner": owner,
                })
            };
            if wait.is_zero() {
                controller
                    .set_desired(id, desired)
                    .await
                    .map_err(|e| map_error(e, id, cmd.name()))?;
                return Ok(Reached::Settling(settling(None, None)));
            }
            let result = match cmd {
                Cmd::Pause => controller.pause_within(id, wait).await,
                Cmd::Resume => controller.resume_within(id, wait).await,
                Cmd::Stop => controller.stop_within(id, wait).await,
            };
            match result {
                Ok(observed) => Ok(Reached::Done(answer(id, cmd, desired, &observed))),
                Err(ClusterError::Timeout { owner, stage, .. }) => Ok(Reached::Settling(settling(
                    stage,
                    owner.as_ref().map(|w| w.as_str()),
                ))),
                Err(e) => Err(map_error(e, id, cmd.name())),
            }
        })
    }

    fn create<'a>(
        &'a self,
        id: &'a str,
        spec: Vec<u8>,
        stage: &'a str,
    ) -> BoxFuture<'a, Result<Value, ApiError>> {
        Box::pin(async move {
            let desired: DesiredStage = stage.parse().map_err(|_| {
                ApiError::bad_request(format!("unknown initial stage {stage:?}")).task(id)
            })?;
            let revision = self
                .inner
                .controller
                .create(id, spec, desired)
                .await
                .map_err(|e| match e {
                    ClusterError::InvalidTaskId { .. } => {
                        ApiError::bad_request(e.to_string()).task(id)
                    }
                    e => map_error(e, id, "create"),
                })?;
            Ok(json!({"id": id, "desired": desired.name(), "desired_revision": revision}))
        })
    }

    fn workers(&self) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let members = self
                .inner
                .controller
                .worker_statuses()
                .await
                .map_err(|e| map_error(e, "", "workers"))?;
            let cache = self.cache().await.ok();
            let items: Vec<Value> = members
                .iter()
                .map(|w| {
                    let held = cache.as_ref().map(|c| {
                        c.listing
                            .items
                            .iter()
                            .filter(|i| i.owner.as_deref() == Some(w.worker.as_str()))
                            .count()
                    });
                    json!({
                        "id": w.worker.as_str(),
                        "tasks": held,
                        "draining": w.draining,
                        "lease_left": null,
                    })
                })
                .collect();
            Ok(json!({"total": items.len(), "items": items}))
        })
    }

    fn drain<'a>(
        &'a self,
        id: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Reached, ApiError>> {
        Box::pin(async move {
            let controller = &self.inner.controller;
            let body = |held: usize| json!({"id": id, "command": "drain", "draining": true, "tasks": held});
            let result = if wait.is_zero() {
                controller.drain(id).await
            } else {
                controller.drain_within(id, wait).await
            };
            match result {
                Ok(()) if !wait.is_zero() => Ok(Reached::Done(body(0))),
                // Written: how many tasks it still holds, read after the write.
                Ok(()) => {
                    let held = controller
                        .held_by(id)
                        .await
                        .map_err(|e| map_worker_error(e, id))?
                        .len();
                    Ok(if held == 0 {
                        Reached::Done(body(0))
                    } else {
                        Reached::Settling(body(held))
                    })
                }
                Err(ClusterError::DrainTimeout { held, .. }) => Ok(Reached::Settling(body(held))),
                Err(e) => Err(map_worker_error(e, id)),
            }
        })
    }

    fn problems(&self) -> Vec<String> {
        self.inner
            .problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}
