//! What the HTTP tests share: a unit that counts its live runs, and a client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use taskstage::{RunContext, RunError, RunExit, Stage, Task, TaskGroup, Unit};
use tower::ServiceExt;

/// Counts the runs alive: the count drops only when a run's future is dropped.
#[derive(Clone, Default)]
pub struct Live(Arc<AtomicUsize>);

impl Live {
    pub fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until `n` runs are alive, for at most 10 s: Running is published once
    /// a run is launched, and its code starts a moment later.
    pub async fn reaches(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        // Bounded by the deadline.
        while self.now() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} runs alive, not {n}, 10 s after Running",
                self.now()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

struct Alive(Live);

impl Drop for Alive {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A unit that runs until cancelled; with `hold`, it ignores its cancellation until
/// the semaphore gives it a permit.
pub struct Probe {
    pub live: Live,
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

impl Unit for Probe {
    fn name(&self) -> &str {
        "probe"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.live.0.fetch_add(1, Ordering::SeqCst);
        let _alive = Alive(self.live.clone());
        ctx.report_progress(1, Some(10));
        ctx.cancelled().await;
        if let Some(hold) = &self.hold {
            let _permit = hold.acquire().await;
        }
        Ok(RunExit::Cancelled)
    }
}

/// A unit whose every run fails at once with the message it holds.
pub struct Fails(pub &'static str);

impl Unit for Fails {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        Err(RunError::msg(self.0))
    }
}

/// `count` probe tasks named `t00000`, `t00001`, …, in one group, each with its
/// own [`Live`] count, returned once every one of them is Running.
pub async fn running_probes(count: usize) -> (TaskGroup, Vec<Live>) {
    let mut group = TaskGroup::new();
    let mut lives = Vec::with_capacity(count);
    for i in 0..count {
        let live = Live::default();
        let probe = Probe {
            live: live.clone(),
            hold: None,
        };
        let handle = Task::builder(format!("t{i:05}"))
            .unit(probe)
            .spawn()
            .expect("spawned");
        group.add(handle);
        lives.push(live);
    }
    for handle in group.tasks() {
        handle.wait_for_stage(|s| s == Stage::Running).await;
    }
    (group, lives)
}

/// One request through the router; the answer's status and JSON body (Null when
/// the body is not JSON).
pub async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(body.map_or_else(Body::empty, Body::from))
        .expect("a valid request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = tokio::time::timeout(Duration::from_secs(30), response.into_body().collect())
        .await
        .expect("the body within 30 s")
        .expect("a readable body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// An open event stream: reads whole events (`event`, `id`, `data`).
pub struct SseReader {
    body: Body,
    buffer: String,
    /// The bytes of the body read so far.
    bytes: u64,
}

#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<u64>,
    pub data: Value,
}

impl SseReader {
    pub async fn open(router: &Router, uri: &str, token: &str, last_id: Option<u64>) -> Self {
        let mut request = Request::builder()
            .uri(uri)
            .header("authorization", format!("Bearer {token}"));
        if let Some(id) = last_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).expect("a request"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK, "the stream opens");
        SseReader {
            body: response.into_body(),
            buffer: String::new(),
            bytes: 0,
        }
    }

    /// Reads (and drops) whatever the stream sends for `duration`, and returns how
    /// many bytes of the body it read in all, from its opening on.
    pub async fn read_for(mut self, duration: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + duration;
        // Bounded by the deadline.
        while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, self.body.frame()).await {
            if let Ok(bytes) = frame.into_data() {
                self.bytes += bytes.len() as u64;
            }
        }
        self.bytes
    }

    /// Whether the stream ends within `within` (what it sends meanwhile is read
    /// and dropped); `false` when it is still open at the deadline.
    pub async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        // Bounded by the deadline.
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// The next event (keep-alive comments skipped), within `within`.
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = SseEvent {
                    event: "message".into(),
                    id: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event.event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        event.id = v.parse().ok();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue; // a comment
                }
                event.data = serde_json::from_str(&data).unwrap_or(Value::Null);
                return Some(event);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(bytes) = frame.ok()?.into_data() {
                self.bytes += bytes.len() as u64;
                self.buffer.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
}
