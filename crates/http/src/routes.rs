//! The routes: parsing, authorization, the answers, the event streams.

use std::collections::HashSet;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use taskstage::ErrorCode;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_core::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::auth::Scope;
use super::error::{json_response, ApiError};
use super::hub::Hub;
use super::{now_ms, page, Cmd, Reached, Shared, DEFAULT_WAIT, MAX_WAIT};
use taskstage::Stage;

type St = State<Arc<Shared>>;

/// How many tasks `GET /v1/tasks` returns unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 1000;
/// The largest `limit`.
const MAX_LIMIT: usize = 10_000;
/// How long an idle event stream waits before it sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The most tasks one bulk command may name.
const MAX_BULK: usize = 10_000;
/// How many commands of one bulk command run at once.
const BULK_AT_ONCE: usize = 64;
/// How many events an event stream buffers for a slow client before it waits (and,
/// if the hub moves on meanwhile, sends a gap).
const STREAM_BUFFER: usize = 256;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.body_limit;
    Router::new()
        .route("/v1/tasks", get(list).post(create))
        .route("/v1/tasks/{id}", get(show))
        .route("/v1/tasks/{id}/pause", post(pause))
        .route("/v1/tasks/{id}/resume", post(resume))
        .route("/v1/tasks/{id}/stop", post(stop))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/bulk/{command}", post(bulk))
        .route("/v1/events", get(all_events))
        .route("/v1/workers", get(workers))
        .route("/v1/workers/{id}/drain", post(drain))
        .route("/v1/auth", get(whoami))
        .route("/v1/health", get(health))
        .route("/", get(status_page))
        .route("/ui", get(status_page))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        // Outside the routing: a caller without a token learns nothing of the API,
        // not even which of its routes exist or which methods they take.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            authorize,
        ))
        // Outermost: every route, the page and the fallbacks (see `origin`).
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            same_origin,
        ))
        .with_state(shared)
}

/// Health's reason, for a caller without a token, when the tasks' store cannot
/// be read.
const UNREACHABLE_BRIEF: &str = "store unreachable (a token's holder sees why)";

async fn same_origin(State(shared): St, request: Request, next: Next) -> Response {
    let mut response =
        match shared
            .browsers
            .check(request.headers(), request.method(), shared.auth.is_open())
        {
            Ok(()) => next.run(request).await,
            Err(error) => error.into_response(),
        };
    forbid_framing(response.headers_mut());
    response
}

/// Tells a browser that no page may frame this answer (so none can put the status
/// page's buttons under a click it does not show) and that its type is the one
/// given, never guessed from its bytes. Headers already set are kept.
fn forbid_framing(headers: &mut axum::http::HeaderMap) {
    use axum::http::header::{CONTENT_SECURITY_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS};
    use axum::http::HeaderValue;
    for (name, value) in [
        (X_FRAME_OPTIONS, "DENY"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
    ] {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
}

/// Every path under `/v1/` but `/v1/health` needs a token: the routes, the
/// methods they do not take and the paths that are no route alike. The page and
/// the paths outside `/v1/` need none.
fn needs_a_token(path: &str) -> bool {
    path.starts_with("/v1/") && path != "/v1/health"
}

async fn authorize(State(shared): St, mut request: Request, next: Next) -> Response {
    if !needs_a_token(request.uri().path()) {
        return next.run(request).await;
    }
    match shared.auth.check(request.headers(), request.method()) {
        Ok(scope) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        "this route does not take this method",
    )
}

async fn status_page() -> Html<&'static str> {
    Html(page::html())
}

async fn whoami(Extension(scope): Extension<Scope>, State(shared): St) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"scope": scope.name(), "open": shared.auth.is_open(), "source": shared.source.kind()}),
    )
}

/// The query's parameters, each named in `allowed` and given at most once.
fn params(raw: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    params_repeating(raw, allowed, None)
}

/// As [`params`], with one key that may be given many times (`repeating`).
fn params_repeating(
    raw: Option<&str>,
    allowed: &[&str],
    repeating: Option<&str>,
) -> Result<Vec<(String, String)>, ApiError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key)?;
        let value = decode(value)?;
        if !allowed.contains(&key.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?} (known: {})",
                allowed.join(", ")
            )));
        }
        if repeating != Some(key.as_str()) && out.iter().any(|(k, _)| *k == key) {
            return Err(ApiError::bad_request(format!(
                "query parameter {key:?} given twice"
            )));
        }
        out.push((key, value));
    }
    Ok(out)
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Percent-decoding (and `+` as a space) into UTF-8 text.
fn decode(text: &str) -> Result<String, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request("malformed percent-encoding in the query")
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request("the query is not UTF-8"))
}

/// `0`, `500ms`, `10s`, `2m`: at most [`MAX_WAIT`].
pub(crate) fn parse_wait(text: &str) -> Result<Duration, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "malformed wait {text:?}: give 0, or a number with ms, s or m (at most {}s)",
            MAX_WAIT.as_secs()
        ))
    };
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    if digits.is_empty() || digits.len() > 9 {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let wait = match unit {
        "" if n == 0 => Duration::ZERO,
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(bad()),
    };
    if wait > MAX_WAIT {
        return Err(bad());
    }
    Ok(wait)
}

fn parse_stage(text: &str) -> Result<Stage, ApiError> {
    Stage::ALL
        .into_iter()
        .find(|s| s.name().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown stage {text:?} (one of New, Running, Pausing, Paused, Resuming, Stopping, Stopped, Finished)"
            ))
        })
}

fn parse_count(key: &str, text: &str, max: usize) -> Result<usize, ApiError> {
    text.parse::<usize>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{key} must be a number from 0 to {max}, not {text:?}"
            ))
        })
}

fn task_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) =
        path.map_err(|e| ApiError::bad_request(format!("bad task id in the path: {e}")))?;
    if id.is_empty() {
        return Err(ApiError::unknown_task(&id));
    }
    Ok(id)
}

async fn list(State(shared): St, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let params = params(
        query.as_deref(),
        &["stage", "worker", "q", "offset", "limit"],
    )?;
    let filter = Filter::of(&params)?;
    let offset = param(&params, "offset")
        .map(|t| parse_count("offset", t, usize::MAX))
        .transpose()?
        .unwrap_or(0);
    let limit = param(&params, "limit")
        .map(|t| parse_count("limit", t, MAX_LIMIT))
        .transpose()?
        .unwrap_or(DEFAULT_LIMIT);
    // Read before the list: a stream resumed from it misses no change after the list.
    let seq = shared.hub.last();
    let listing = shared.source.listing().await?;
    let selected = filter.select(&listing.items);
    Ok(listing.page(selected.as_deref(), offset, limit, seq))
}

/// Which tasks a list or a bulk command is about: `stage`, `worker` (the owner),
/// and `q`, a part of the name matched without regard to ASCII case.
struct Filter<'a> {
    stage: Option<Stage>,
    worker: Option<&'a str>,
    q: Option<String>,
}

impl<'a> Filter<'a> {
    fn of(params: &'a [(String, String)]) -> Result<Self, ApiError> {
        Ok(Filter {
            stage: param(params, "stage").map(parse_stage).transpose()?,
            worker: param(params, "worker"),
            q: param(params, "q")
                .filter(|q| !q.is_empty())
                .map(str::to_ascii_lowercase),
        })
    }

    fn is_empty(&self) -> bool {
        self.stage.is_none() && self.worker.is_none() && self.q.is_none()
    }

    fn matches(&self, item: &super::Item) -> bool {
        self.stage.is_none_or(|s| item.stage == Some(s))
            && self.worker.is_none_or(|w| item.owner.as_deref() == Some(w))
            && self
                .q
                .as_deref()
                .is_none_or(|q| item.id.to_ascii_lowercase().contains(q))
    }

    /// The indices of the items that match (`None`: no filter, every item).
    fn select(&self, items: &[super::Item]) -> Option<Vec<usize>> {
        (!self.is_empty()).then(|| {
            items
                .iter()
                .enumerate()
                .filter(|(_, i)| self.matches(i))
                .map(|(n, _)| n)
                .collect()
        })
    }
}

async fn show(
    State(shared): St,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = task_id(path)?;
    params(query.as_deref(), &[])?;
    let mut body = shared.source.detail(&id).await?;
    body["events"] = recent_events(&shared.hub, &id);
    Ok(json_response(StatusCode::OK, &body))
}

/// How many of a task's changes its detail shows.
const RECENT_EVENTS: usize = 20;

/// The task's newest changes the hub still keeps (at most [`RECENT_EVENTS`]),
/// oldest first, each as its stream sends it: `{"seq", "event", "data"}`.
fn recent_events(hub: &Hub, id: &str) -> Value {
    let events = hub.recent(id, RECENT_EVENTS).into_iter().map(|record| {
        let data = serde_json::from_str::<Value>(&record.data).unwrap_or(Value::Null);
        json!({"seq": record.seq, "event": record.kind, "data": data})
    });
    Value::Array(events.collect())
}

async fn pause(
    st: St,
    path: Result<Path<String>, PathRejection>,
    q: RawQuery,
) -> Result<Response, ApiError> {
    command(st, path, q, Cmd::Pause).await
}

async fn resume(
    st: St,
    path: Result<Path<String>, PathRejection>,
    q: RawQuery,
) -> Result<Response, ApiError> {
    command(st, path, q, Cmd::Resume).await
}

async fn stop(
    st: St,
    path: Result<Path<String>, PathRejection>,
    q: RawQuery,
) -> Result<Response, ApiError> {
    command(st, path, q, Cmd::Stop).await
}

async fn command(
    State(shared): St,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    cmd: Cmd,
) -> Result<Response, ApiError> {
    let id = task_id(path).map_err(|e| e.command(cmd.name()))?;
    let params =
        params(query.as_deref(), &["wait"]).map_err(|e| e.command(cmd.name()).task(&id))?;
    let wait = param(&params, "wait")
        .map(parse_wait)
        .transpose()
        .map_err(|e| e.command(cmd.name()).task(&id))?
        .unwrap_or(DEFAULT_WAIT);
    match shared.source.command(&id, cmd, wait).await.map_err(|e| {
        let e = if e.command.is_none() {
            e.command(cmd.name())
        } else {
            e
        };
        if e.task.is_none() {
            e.task(&id)
        } else {
            e
        }
    })? {
        Reached::Done(body) => Ok(json_response(StatusCode::OK, &body)),
        Reached::Settling(body) => Ok(json_response(StatusCode::ACCEPTED, &body)),
    }
}

/// `POST /v1/bulk/{pause|resume|stop}?stage=&worker=&q=&all=&wait=`, with an
/// optional JSON body `{"ids": [...]}`: one command to many tasks under one deadline.
/// 200 when every task reached the command's stage, 202 when some are still settling
/// at the deadline (named under `settling`); tasks that refused are under `refused`
/// with the error each got, and change nothing.
async fn bulk(
    State(shared): St,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(|e| {
        ApiError::bad_request(format!("bad command in the path: {e}")).command("bulk")
    })?;
    let cmd = match name.as_str() {
        "pause" => Cmd::Pause,
        "resume" => Cmd::Resume,
        "stop" => Cmd::Stop,
        other => {
            return Err(ApiError::bad_request(format!(
                "no bulk command {other:?}: pause, resume or stop"
            ))
            .command("bulk"))
        }
    };
    let fail = |e: ApiError| e.command(cmd.name());
    let params =
        params(query.as_deref(), &["stage", "worker", "q", "all", "wait"]).map_err(fail)?;
    let filter = Filter::of(&params).map_err(fail)?;
    let all = match param(&params, "all") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(fail(ApiError::bad_request(format!(
                "all={other:?}: true or false"
            ))))
        }
    };
    let wait = param(&params, "wait")
        .map(parse_wait)
        .transpose()
        .map_err(fail)?
        .unwrap_or(DEFAULT_WAIT);
    let body = body.map_err(|rejection| fail(body_error(&rejection, shared.body_limit)))?;
    let ids: Option<Vec<String>> = if body.is_empty() {
        None
    } else {
        // JSON only where JSON is parsed (as for a create).
        if !is_json(&headers) {
            return Err(fail(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
                "the body must be sent as Content-Type: application/json",
            )));
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| fail(ApiError::bad_request(format!("the body is not JSON: {e}"))))?;
        let ids = value
            .get("ids")
            .and_then(Value::as_array)
            .and_then(|ids| ids.iter().map(|v| v.as_str().map(str::to_owned)).collect())
            .ok_or_else(|| {
                fail(ApiError::bad_request(
                    "the body must be {\"ids\": [\"name\", ...]}",
                ))
            })?;
        Some(ids)
    };
    if ids.is_some() && (all || !filter.is_empty()) {
        return Err(fail(ApiError::bad_request(
            "name the tasks one way: ids in the body, or a filter (stage, worker, q), or all=true",
        )));
    }
    let selected: Vec<String> = match ids {
        Some(ids) => ids,
        None if all || !filter.is_empty() => {
            let listing = shared.source.listing().await.map_err(fail)?;
            listing
                .items
                .iter()
                .filter(|i| filter.matches(i))
                .map(|i| i.id.to_string())
                .collect()
        }
        None => {
            return Err(fail(ApiError::bad_request(
                "name the tasks: ids in the body, a filter (stage, worker, q), or all=true",
            )))
        }
    };
    if selected.len() > MAX_BULK {
        return Err(fail(ApiError::bad_request(format!(
            "{} tasks selected; one bulk command takes at most {MAX_BULK}",
            selected.len()
        ))));
    }
    let deadline = tokio::time::Instant::now() + wait;
    let gate = Arc::new(tokio::sync::Semaphore::new(BULK_AT_ONCE));
    let mut runs = tokio::task::JoinSet::new();
    for (n, id) in selected.iter().enumerate() {
        let (shared, gate, id) = (Arc::clone(&shared), Arc::clone(&gate), id.clone());
        runs.spawn(async move {
            // The gate is never closed, so a permit comes.
            let _permit = gate.acquire_owned().await.ok();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            (n, shared.source.command(&id, cmd, left).await)
        });
    }
    let mut answers: Vec<Option<Result<Reached, ApiError>>> =
        selected.iter().map(|_| None).collect();
    // Bounded: one answer per task, each command bounded by its wait.
    while let Some(joined) = runs.join_next().await {
        if let Ok((n, answer)) = joined {
            answers[n] = Some(answer);
        }
    }
    let (mut reached, mut settling, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for (id, answer) in selected.iter().zip(answers) {
        match answer {
            Some(Ok(Reached::Done(body))) => {
                reached.push(json!({"id": id, "stage": body["stage"]}));
            }
            Some(Ok(Reached::Settling(body))) => {
                settling.push(json!({"id": id, "stage": body["stage"]}));
            }
            Some(Err(error)) => {
                let mut entry = error.command(cmd.name()).task(id).body();
                entry["id"] = Value::from(id.as_str());
                refused.push(entry);
            }
            None => refused.push(json!({
                "id": id,
                "error_code": ErrorCode::Internal.as_str(),
                "error_msg": "the command ended before it answered",
            })),
        }
    }
    let status = if settling.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let body = json!({
        "command": cmd.name(),
        "selected": selected.len(),
        "wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "reached": reached,
        "settling": settling,
        "refused": refused,
    });
    Ok(json_response(status, &body))
}

/// The error of a body that could not be read: 413 over `limit`, else 400.
fn body_error(rejection: &BytesRejection, limit: usize) -> ApiError {
    let status = rejection.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            status,
            ErrorCode::TooLarge,
            format!("the body is over the limit of {limit} bytes"),
        )
    } else {
        ApiError::bad_request(format!("unreadable body: {rejection}"))
    }
}

/// Whether `headers` say the body is JSON.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

async fn create(
    State(shared): St,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let fail = |e: ApiError| e.command("create");
    params(query.as_deref(), &[]).map_err(fail)?;
    // JSON only where JSON is parsed: no HTML form can send this type, so no page
    // of another origin can create a task without the browser asking first.
    if !is_json(&headers) {
        return Err(fail(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::UnsupportedMediaType,
            "the body must be sent as Content-Type: application/json",
        )));
    }
    let body = body.map_err(|rejection| fail(body_error(&rejection, shared.body_limit)))?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| fail(ApiError::bad_request(format!("the body is not JSON: {e}"))))?;
    let Value::Object(fields) = value else {
        return Err(fail(ApiError::bad_request(
            "the body must be a JSON object: {\"id\": ..., \"stage\": ..., \"spec\": ...}",
        )));
    };
    if let Some(key) = fields
        .keys()
        .find(|k| !["id", "stage", "spec"].contains(&k.as_str()))
    {
        return Err(fail(ApiError::bad_request(format!(
            "unknown field {key:?} (known: id, stage, spec)"
        ))));
    }
    let id = match fields.get("id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => {
            return Err(fail(ApiError::bad_request(
                "\"id\" must be a non-empty string",
            )))
        }
    };
    let stage = match fields.get("stage") {
        None => "Running",
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "running" => "Running",
            "paused" => "Paused",
            "stopped" => "Stopped",
            _ => {
                return Err(fail(
                    ApiError::bad_request(format!(
                        "unknown initial stage {s:?} (one of Running, Paused, Stopped)"
                    ))
                    .task(&id),
                ))
            }
        },
        Some(_) => {
            return Err(fail(
                ApiError::bad_request("\"stage\" must be a string").task(&id),
            ))
        }
    };
    let spec = match fields.get("spec") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s.clone().into_bytes(),
        Some(other) => other.to_string().into_bytes(),
    };
    let created = shared.source.create(&id, spec, stage).await.map_err(fail)?;
    Ok(json_response(StatusCode::CREATED, &created))
}

async fn workers(State(shared): St, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    params(query.as_deref(), &[])?;
    let body = shared.source.workers().await?;
    Ok(json_response(StatusCode::OK, &body))
}

async fn drain(
    State(shared): St,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let fail = |e: ApiError| e.command("drain");
    let Path(id) = path.map_err(|e| {
        fail(ApiError::bad_request(format!(
            "bad worker id in the path: {e}"
        )))
    })?;
    let params = params(query.as_deref(), &["wait"]).map_err(fail)?;
    let wait = param(&params, "wait")
        .map(parse_wait)
        .transpose()
        .map_err(fail)?
        .unwrap_or(DEFAULT_WAIT);
    match shared.source.drain(&id, wait).await? {
        Reached::Done(body) => Ok(json_response(StatusCode::OK, &body)),
        Reached::Settling(body) => Ok(json_response(StatusCode::ACCEPTED, &body)),
    }
}

/// Health needs no token, so a caller without one learns what is wrong but not the
/// store's own words (which may name its hosts and addresses): those go to a
/// caller with a token, or to everyone on an open server.
async fn health(State(shared): St, headers: HeaderMap) -> Response {
    let detailed = shared.auth.scope_of(&headers).is_ok();
    let mut reasons = shared.source.problems();
    if !detailed && !reasons.is_empty() {
        reasons = vec![UNREACHABLE_BRIEF.to_owned()];
    }
    match shared.source.listing().await {
        Ok(listing) => {
            let items = &listing.items;
            let now = now_ms();
            let limit = u64::try_from(shared.stuck_after.as_millis()).unwrap_or(u64::MAX);
            for stage in [Stage::Pausing, Stage::Resuming, Stage::Stopping] {
                let stuck = items
                    .iter()
                    .filter(|i| i.stage == Some(stage))
                    .filter(|i| i.since.is_some_and(|s| now.saturating_sub(s) > limit))
                    .count();
                if stuck > 0 {
                    reasons.push(format!(
                        "{stuck} task(s) stuck in {stage} for more than {:?}",
                        shared.stuck_after
                    ));
                }
            }
        }
        Err(error) if detailed => reasons.push(error.msg),
        Err(_) => reasons.push(UNREACHABLE_BRIEF.to_owned()),
    }
    reasons.dedup();
    if reasons.is_empty() {
        json_response(StatusCode::OK, &json!({"status": "ok", "reasons": []}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unhealthy", "reasons": reasons}),
        )
    }
}

/// Where a stream starts: after `Last-Event-ID` (or `?since=`), or from now.
fn start_of(
    shared: &Shared,
    headers: &HeaderMap,
    params: &[(String, String)],
) -> Result<(u64, bool), ApiError> {
    let given = match (headers.get("last-event-id"), param(params, "since")) {
        (_, Some(since)) => Some(since.to_owned()),
        (Some(header), None) => Some(
            header
                .to_str()
                .map_err(|_| ApiError::bad_request("Last-Event-ID is not text"))?
                .to_owned(),
        ),
        (None, None) => None,
    };
    let last = shared.hub.last();
    match given {
        None => Ok((last + 1, false)),
        Some(text) => {
            let seen: u64 = text.trim().parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "the event id to resume from must be a number, not {text:?}"
                ))
            })?;
            if seen > last {
                // Not a number this hub handed out (a restarted server): from now, with
                // a gap so that the client reloads.
                Ok((last + 1, true))
            } else {
                Ok((seen + 1, false))
            }
        }
    }
}

/// How many tasks one filtered stream (`GET /v1/events?task=…`) may follow.
const MAX_STREAM_TASKS: usize = 1_000;

/// The tasks a stream is filtered to.
type Only = Arc<HashSet<Arc<str>>>;

async fn all_events(
    State(shared): St,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = params_repeating(query.as_deref(), &["since", "task"], Some("task"))?;
    let (next, unknown) = start_of(&shared, &headers, &params)?;
    let tasks: HashSet<Arc<str>> = params
        .iter()
        .filter(|(k, _)| k == "task")
        .map(|(_, v)| Arc::from(v.as_str()))
        .collect();
    if tasks.len() > MAX_STREAM_TASKS {
        return Err(ApiError::bad_request(format!(
            "a stream follows at most {MAX_STREAM_TASKS} tasks, not {}",
            tasks.len()
        )));
    }
    let only = (!tasks.is_empty()).then(|| Arc::new(tasks));
    let end = shared.streams_end.clone();
    Ok(stream(Arc::clone(&shared.hub), next, only, unknown, end).into_response())
}

async fn task_events(
    State(shared): St,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = task_id(path)?;
    let params = params(query.as_deref(), &["since"])?;
    let (next, unknown) = start_of(&shared, &headers, &params)?;
    if !shared.source.exists(&id).await? {
        return Err(ApiError::unknown_task(&id));
    }
    let end = shared.streams_end.clone();
    Ok(stream(
        Arc::clone(&shared.hub),
        next,
        Some(Arc::new(HashSet::from([Arc::from(id)]))),
        unknown,
        end,
    )
    .into_response())
}

/// The records of `hub` from `next` on (of the tasks `only` names, if it does), as Server-Sent
/// Events, with a `gap` event wherever the client fell behind the hub's ring; the
/// stream ends when `end` is cancelled ([`Api::end_streams_on`](super::Api::end_streams_on)).
fn stream(
    hub: Arc<Hub>,
    next: u64,
    only: Option<Only>,
    unknown: bool,
    end: tokio_util::sync::CancellationToken,
) -> Sse<Events> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        // Dropping the sender ends the response's body, so the connection can close.
        tokio::select! {
            () = end.cancelled() => {}
            () = feed(hub, next, only, unknown, &tx) => {}
        }
    });
    Sse::new(Events(rx))
}

/// Sends the records of `hub` from `next` on into `tx` until the client goes.
async fn feed(
    hub: Arc<Hub>,
    mut next: u64,
    only: Option<Only>,
    unknown: bool,
    tx: &mpsc::Sender<SseEvent>,
) {
    {
        let mut pushed = hub.subscribe();
        if unknown {
            let gap = json!({"missed": null, "next_seq": next, "reason": "unknown event id"});
            if tx
                .send(SseEvent::default().event("gap").data(gap.to_string()))
                .await
                .is_err()
            {
                return;
            }
        }
        // Ends when the client goes (the receiver is dropped).
        loop {
            // Marked seen before the read: a push after it wakes the wait below.
            pushed.borrow_and_update();
            let batch = hub.read(next, STREAM_BUFFER);
            if batch.missed > 0 {
                let first = batch.records.first().map_or(next + batch.missed, |r| r.seq);
                let gap = json!({"missed": batch.missed, "next_seq": first, "reason": "lagged"});
                if tx
                    .send(SseEvent::default().event("gap").data(gap.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let full = batch.records.len() == STREAM_BUFFER;
            for record in batch.records {
                next = record.seq + 1;
                if only.as_ref().is_some_and(|o| !o.contains(&record.task)) {
                    continue;
                }
                // The record's JSON object, with its number first.
                let data = match record.data.strip_prefix('{') {
                    Some(rest) if rest.trim_start().starts_with('}') => {
                        format!("{{\"seq\":{}}}", record.seq)
                    }
                    Some(rest) => format!("{{\"seq\":{},{rest}", record.seq),
                    None => continue,
                };
                let event = SseEvent::default()
                    .id(record.seq.to_string())
                    .event(record.kind)
                    .data(data);
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            tokio::select! {
                () = tx.closed() => return,
                changed = pushed.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(KEEP_ALIVE) => {
                    if tx.send(SseEvent::default().comment("keep-alive")).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The events of one stream, as the spawned reader sends them.
pub(crate) struct Events(mpsc::Receiver<SseEvent>);

impl Stream for Events {
    type Item = Result<SseEvent, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().0.poll_recv(cx).map(|e| e.map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_wait("0").ok(), Some(Duration::ZERO));
        assert_eq!(parse_wait("500ms").ok(), Some(Duration::from_millis(500)));
        assert_eq!(parse_wait("10s").ok(), Some(Duration::from_secs(10)));
        assert_eq!(parse_wait("2m").ok(), Some(Duration::from_secs(120)));
        for bad in [
            "",
            "s",
            "10",
            "-1s",
            "10h",
            "1.5s",
            "301s",
            "6m",
            "99999999999s",
            "10 s",
        ] {
            assert!(parse_wait(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn queries_decode_and_unknown_or_repeated_keys_are_refused() {
        let p = params(Some("stage=Paused&worker=w%2D1+x"), &["stage", "worker"]).ok();
        assert_eq!(
            p,
            Some(vec![
                ("stage".to_owned(), "Paused".to_owned()),
                ("worker".to_owned(), "w-1 x".to_owned())
            ])
        );
        assert!(params(Some("bogus=1"), &["stage"]).is_err());
        assert!(params(Some("stage=a&stage=b"), &["stage"]).is_err());
        assert!(params(Some("stage=%ZZ"), &["stage"]).is_err());
        assert!(params(Some("stage=%FF"), &["stage"]).is_err());
    }
}
