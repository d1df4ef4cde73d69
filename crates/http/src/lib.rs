//! An HTTP API and a status page for [`taskstage`]: an axum [`Router`] the application
//! mounts, for one process's tasks ([`LocalTasks`], made from a
//! [`TaskGroup`](taskstage::TaskGroup)) or, with feature `cluster`, for a cluster
//! ([`Controller`](taskstage_cluster::Controller)), with the same JSON shapes.
//!
//! The promise the API keeps is the crate's: **`POST /v1/tasks/{id}/pause` answers 200
//! only once the run has really returned** (locally: the run's future was dropped; in a
//! cluster: the task's owner reported so for this pause). When the wait (`?wait=10s`)
//! runs out first, the answer is 202 with `"stage": "Pausing"`: accepted, not done.
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /v1/health` | 200, or 503 with the reasons (store unreachable, stuck transitions) |
//! | `GET /v1/tasks?stage=&worker=&q=&offset=&limit=` | `{total, offset, seq, counts, items: [...]}` |
//! | `GET /v1/tasks/{id}` | one task, with more detail |
//! | `POST /v1/tasks/{id}/pause\|resume\|stop?wait=` | 200 reached, 202 still settling, 409 refused |
//! | `POST /v1/bulk/pause\|resume\|stop?stage=&worker=&q=&all=&wait=` | one command to many tasks (or `{"ids": [...]}`), one deadline: 200 all reached, 202 with the ones still settling |
//! | `POST /v1/tasks` | create a task (cluster) |
//! | `GET /v1/events`, `GET /v1/tasks/{id}/events` | Server-Sent Events, resumable (`Last-Event-ID`) |
//! | `GET /v1/workers` | the workers (cluster), each with `draining` |
//! | `POST /v1/workers/{id}/drain?wait=` | 200 once the worker holds no task, 202 still handing over (cluster) |
//! | `GET /v1/auth` | the caller's scope |
//! | `GET /`, `GET /ui` | the status page |
//!
//! Every error is `{error_code, error_msg, command, task, stage}`. The whole reference,
//! with real requests and answers, is in
//! [docs/http.md](https://github.com/taskstage/taskstage/blob/main/docs/http.md).
//!
//! # Examples
//!
//! ```
//! use taskstage_http::{Api, Auth, LocalTasks};
//! use taskstage::{RunContext, RunError, RunExit, Task, TaskGroup, Unit};
//!
//! struct Copy;
//!
//! impl Unit for Copy {
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         ctx.cancelled().await;
//!         Ok(RunExit::Cancelled)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mut group = TaskGroup::new();
//! group.add(Task::builder("orders").unit(Copy).spawn().unwrap());
//!
//! let tasks = LocalTasks::from_group(&group).expect("one task per name");
//! let api = Api::local(&tasks)
//!     .auth(Auth::tokens().admin("admin-token").read_only("read-token"))
//!     .router();
//! // Mount it in the application's own router, under any prefix:
//! let app: axum::Router = axum::Router::new().nest("/taskstage", api);
//! # drop(app);
//! # }
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod auth;
#[cfg(feature = "cluster")]
mod cluster;
mod error;
mod hub;
mod listing;
mod local;
mod origin;
mod page;
mod routes;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use taskstage::ErrorCode;

use axum::Router;
use serde_json::{json, Value};

pub use self::auth::{Auth, Scope};
pub use self::local::{LocalTasks, NameTaken};

use self::error::ApiError;
use self::hub::Hub;
use taskstage::Stage;

/// The body size `POST` bodies may have unless [`Api::body_limit`] says otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The longest `?wait=` a command accepts.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// The wait of a command without `?wait=`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// How long a task may stay in a transitional stage before health reports it stuck,
/// unless [`Api::stuck_after`] says otherwise.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(60);

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The command of a `POST /v1/tasks/{id}/…`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    Pause,
    Resume,
    Stop,
}

impl Cmd {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Cmd::Pause => "pause",
            Cmd::Resume => "resume",
            Cmd::Stop => "stop",
        }
    }

    /// The stage an accepted command shows until its truth arrives.
    #[cfg(feature = "cluster")]
    pub(crate) fn settling(self) -> Stage {
        match self {
            Cmd::Pause => Stage::Pausing,
            Cmd::Resume => Stage::Resuming,
            Cmd::Stop => Stage::Stopping,
        }
    }
}

/// One task as the API shows it; the same shape for both layers (a field a layer
/// lacks is null).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    pub(crate) id: Arc<str>,
    /// The stage now (cluster: the current owner's report; null when none).
    pub(crate) stage: Option<Stage>,
    /// The desired stage (cluster only).
    pub(crate) desired: Option<&'static str>,
    pub(crate) owner: Option<String>,
    /// The fence token (the owner key's create revision; cluster only).
    pub(crate) token: Option<i64>,
    /// When the API saw the task enter its stage (ms since the Unix epoch).
    pub(crate) since: Option<u64>,
    /// `(kind, error text)`.
    pub(crate) outcome: Option<(&'static str, Option<String>)>,
    pub(crate) progress: Option<(u64, Option<u64>)>,
    /// Whether an operator paused it: locally the lifecycle's user-paused mark (a
    /// pause command, not a failure, holds it); in a cluster, desired Paused.
    pub(crate) user_paused: Option<bool>,
    /// The auto-resume policy's standing of the task, when a policy watches it
    /// ([`LocalTasks::show_policy`]).
    pub(crate) policy: Option<PolicyItem>,
}

/// What an [`AutoResume`](taskstage::policy::AutoResume) makes of one task, as the
/// API shows it: its standing's name, the instants as ms since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyItem {
    /// `not_started`, `healthy`, `changing`, `backing_off`, `blocked` (a failure the
    /// classifier does not resume), `user_paused` or `idle`.
    pub(crate) standing: &'static str,
    /// When the next auto-resume is due.
    pub(crate) due: Option<u64>,
    /// Since when the task is healthy or blocked.
    pub(crate) since: Option<u64>,
    /// The backoff step: auto-resumes not yet rolled back by healthy periods.
    pub(crate) step: u32,
    /// How many times the policy resumed the task.
    pub(crate) auto_resumes: u64,
}

impl PolicyItem {
    fn to_json(&self) -> Value {
        json!({
            "standing": self.standing,
            "due": self.due,
            "since": self.since,
            "step": self.step,
            "auto_resumes": self.auto_resumes,
        })
    }
}

impl Item {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": &*self.id,
            "stage": self.stage.map(Stage::name),
            "desired": self.desired,
            "owner": self.owner,
            "token": self.token,
            "since": self.since,
            "outcome": self.outcome.as_ref().map(|(kind, error)| json!({"kind": kind, "error": error})),
            "progress": self.progress.map(|(done, total)| json!({"done": done, "total": total})),
            "user_paused": self.user_paused,
            "policy": self.policy.as_ref().map(PolicyItem::to_json),
        })
    }
}

/// What a command reached within its wait.
#[derive(Debug)]
pub(crate) enum Reached {
    /// Its truth: the stage reached (200).
    Done(Value),
    /// Accepted, still settling when the wait ran out (202).
    Settling(Value),
}

/// A layer the API serves: one process's tasks, or a cluster.
pub(crate) trait Source: Send + Sync + 'static {
    /// `"local"` or `"cluster"`.
    fn kind(&self) -> &'static str;
    /// Every task, in the source's order, with its JSON text: a listing shared by
    /// every request until the source's state moves.
    fn listing(&self) -> BoxFuture<'_, Result<Arc<listing::Listing>, ApiError>>;
    /// One task with its detail.
    fn detail<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Value, ApiError>>;
    /// Whether a task of this id exists now.
    fn exists<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, ApiError>>;
    /// Carries out a command, waiting up to `wait` for its truth.
    fn command<'a>(
        &'a self,
        id: &'a str,
        cmd: Cmd,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Reached, ApiError>>;
    /// Creates a task (cluster only).
    fn create<'a>(
        &'a self,
        id: &'a str,
        spec: Vec<u8>,
        stage: &'a str,
    ) -> BoxFuture<'a, Result<Value, ApiError>> {
        let _ = (id, spec, stage);
        Box::pin(async {
            Err(ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::NotAvailable,
                "create is available for a cluster only: this API serves one process's tasks",
            )
            .command("create"))
        })
    }
    /// The workers (cluster only).
    fn workers(&self) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async {
            Err(ApiError::not_available(
                "workers are listed for a cluster only: this API serves one process's tasks",
            ))
        })
    }
    /// Drains a worker, waiting up to `wait` for it to hold nothing (cluster only).
    fn drain<'a>(
        &'a self,
        id: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Reached, ApiError>> {
        let _ = (id, wait);
        Box::pin(async {
            Err(ApiError::not_available(
                "workers are drained in a cluster only: this API serves one process's tasks",
            )
            .command("drain"))
        })
    }
    /// Why the source is unhealthy now, beside stuck tasks (e.g. the store is
    /// unreachable).
    fn problems(&self) -> Vec<String>;
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Everything a request needs, shared by the router.
pub(crate) struct Shared {
    pub(crate) source: Box<dyn Source>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) auth: Auth,
    pub(crate) browsers: origin::Browsers,
    pub(crate) body_limit: usize,
    pub(crate) stuck_after: Duration,
    pub(crate) streams_end: tokio_util::sync::CancellationToken,
}

/// Builds the router: pick the layer ([`Api::local`], [`Api::cluster`]), set the
/// authentication, then [`Api::router`].
#[must_use = "an Api does nothing until its router is mounted"]
pub struct Api {
    source: Box<dyn Source>,
    hub: Arc<Hub>,
    auth: Auth,
    browsers: origin::Browsers,
    body_limit: usize,
    stuck_after: Duration,
    streams_end: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("source", &self.source.kind())
            .field("auth", &self.auth)
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

impl Api {
    fn with(source: Box<dyn Source>, hub: Arc<Hub>) -> Self {
        Api {
            source,
            hub,
            auth: Auth::tokens(),
            browsers: origin::Browsers::default(),
            body_limit: DEFAULT_BODY_LIMIT,
            stuck_after: DEFAULT_STUCK_AFTER,
            streams_end: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// An API over one process's tasks. Tasks added to `tasks` later are served too.
    ///
    /// Authentication defaults to [`Auth::tokens`] with no token: set one with
    /// [`Api::auth`].
    pub fn local<C: Send + Sync + 'static>(tasks: &LocalTasks<C>) -> Self {
        let hub = tasks.hub();
        Api::with(Box::new(tasks.clone()), hub)
    }

    /// An API over a cluster, through `controller`. The task list is served from a
    /// watched copy of the store (one list, then a read only when the store
    /// changed), not a store read per request.
    ///
    /// # Panics
    ///
    /// If and only if called outside a tokio runtime (it spawns the watch).
    #[cfg(feature = "cluster")]
    pub fn cluster(controller: taskstage_cluster::Controller) -> Self {
        let hub = Arc::new(Hub::new(hub::DEFAULT_CAPACITY));
        let source = cluster::ClusterSource::start(controller, Arc::clone(&hub));
        Api::with(Box::new(source), hub)
    }

    /// Who may call: see [`Auth`].
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Allows the pages of `origin` (`https://ops.example.com`: scheme, host and port
    /// if not the scheme's own) to send commands, as the server's own page may; with
    /// [`Auth::open`], also to name the server by that host.
    ///
    /// Without it, a request that changes anything and carries an `Origin` other
    /// than the server's own is refused (403 `cross_origin`), and with
    /// [`Auth::open`] a `Host` that is not a loopback name is refused for every
    /// route (403 `forbidden_host`: a page whose name was rebound to 127.0.0.1).
    /// Clients that are not browsers send no `Origin` and are not concerned.
    ///
    /// ```
    /// # use taskstage_http::{Api, Auth, LocalTasks};
    /// # let tasks: LocalTasks = LocalTasks::new();
    /// let api = Api::local(&tasks)
    ///     .auth(Auth::tokens().admin("admin-token"))
    ///     .allow_origin("https://ops.example.com");
    /// # drop(api.router());
    /// ```
    pub fn allow_origin(mut self, origin: &str) -> Self {
        self.browsers.allow(origin);
        self
    }

    /// The largest `POST` body accepted (413 beyond it); [`DEFAULT_BODY_LIMIT`]
    /// unless set.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// How long a task may stay Pausing, Resuming or Stopping before `GET
    /// /v1/health` reports it stuck; [`DEFAULT_STUCK_AFTER`] unless set.
    pub fn stuck_after(mut self, after: Duration) -> Self {
        self.stuck_after = after;
        self
    }

    /// Ends every event stream of this router, open or opened later, when `token`
    /// is cancelled. An open stream never ends on its own, so a server's graceful
    /// shutdown, which waits for every connection to finish, waits for ever while a
    /// page or a `curl -N` watches; cancel the same token that starts the shutdown:
    ///
    /// ```
    /// # use taskstage_http::{Api, Auth, LocalTasks};
    /// use tokio_util::sync::CancellationToken;
    /// # let tasks: LocalTasks = LocalTasks::new();
    /// let shutdown = CancellationToken::new();
    /// let app = Api::local(&tasks)
    ///     .auth(Auth::tokens().admin("admin-token"))
    ///     .end_streams_on(shutdown.clone())
    ///     .router();
    /// // axum::serve(listener, app)
    /// //     .with_graceful_shutdown(shutdown.cancelled_owned())
    /// //     .await?;
    /// // and on ctrl-c (or SIGTERM): shutdown.cancel();
    /// # drop(app);
    /// ```
    pub fn end_streams_on(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        self.streams_end = token;
        self
    }

    /// The router: mount it with `Router::nest` or serve it as it is.
    pub fn router(self) -> Router {
        routes::router(Arc::new(Shared {
            source: self.source,
            hub: self.hub,
            auth: self.auth,
            browsers: self.browsers,
            body_limit: self.body_limit,
            stuck_after: self.stuck_after,
            streams_end: self.streams_end,
        }))
    }
}

/// The code blocks of `docs/http.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/http.md")]
struct HttpDoctests;
