//! The HTTP API's cost over the library it serves (feature `http`), each figure
//! beside its baseline:
//!
//! - **pause over HTTP**: a pause and a resume of one task through
//!   `POST /v1/tasks/{id}/pause?wait=10s` and `…/resume?wait=10s` (200 once the run
//!   returned, and once the new run is alive), against `Handle::pause` and
//!   `Handle::resume` with a wait for Running, called directly;
//! - **list**: `GET /v1/tasks?limit=10000` of 10,000 tasks (the whole answer, as
//!   bytes), against a snapshot of each task taken directly;
//! - **50 clients**: 50 concurrent clients listing 10,000 tasks, 20 requests each:
//!   the p50 and p99 of one request (printed, no baseline: the goal is p99 ≤ 50 ms);
//! - **a change to an open stream**: from a pause issued to its Paused arriving on an
//!   open `GET /v1/events` stream, against the same Paused arriving on
//!   `Handle::events` (p50 and p99 over 200 pauses).
//!
//! The requests go through the router in process (`tower::ServiceExt::oneshot`),
//! without a socket: the figures are the API's own cost. Under `cargo bench` it uses
//! 10,000 tasks and ends with one line:
//!
//! ```text
//! http tasks=10000 list_p50_ms=… list_p99_ms=… stream_p50_ms=… stream_p99_ms=… events_p50_ms=… events_p99_ms=…
//! ```
//!
//! Under `cargo test` it runs each benchmark once on 200 tasks, and checks every
//! answer (200, the stage reached, every task listed).
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

#[path = "../tests/http_common/mod.rs"]
mod http_common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use criterion::{criterion_group, Criterion};
use http_body_util::BodyExt;
use http_common::{Live, Probe, SseReader};
use taskstage::http::{Api, Auth, LocalTasks};
use taskstage::{Event, Handle, Stage, StopOrder, Task, TaskGroup};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Whether this is `cargo bench` (which passes `--bench`), not a test run.
fn benching() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn tasks() -> usize {
    if benching() {
        10_000
    } else {
        200
    }
}

struct Served {
    runtime: Runtime,
    group: TaskGroup,
    router: Router,
}

fn serve(count: usize) -> Served {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (group, router) = runtime.block_on(async {
        let mut group = TaskGroup::new();
        for i in 0..count {
            let probe = Probe {
                live: Live::default(),
                hold: None,
            };
            let handle = Task::builder(format!("t{i:05}"))
                .unit(probe)
                .spawn()
                .expect("spawned");
            group.add(handle);
        }
        for handle in group.tasks() {
            handle.wait_for_stage(|s| s == Stage::Running).await;
        }
        let tasks = LocalTasks::from_group(&group);
        // No token: the figures are the API's, not a comparison of strings.
        let router = Api::local(&tasks).auth(Auth::open()).router();
        (group, router)
    });
    Served {
        runtime,
        group,
        router,
    }
}

/// One request through the router: its status and whole body.
async fn call(router: &Router, method: &str, uri: &str) -> (StatusCode, axum::body::Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .expect("a request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, body)
}

fn first(group: &TaskGroup) -> Handle {
    group.tasks().first().expect("a task").clone()
}

fn pause_over_http(c: &mut Criterion, served: &Served) {
    let handle = first(&served.group);
    let name = handle.name().to_owned();
    let pause = format!("/v1/tasks/{name}/pause?wait=10s");
    let resume = format!("/v1/tasks/{name}/resume?wait=10s");
    let mut group = c.benchmark_group("http_pause");
    group.bench_function("direct", |b| {
        b.iter(|| {
            served.runtime.block_on(async {
                assert_eq!(handle.pause().await, Ok(Stage::Paused));
                handle.resume().await.expect("a resume");
                handle.wait_for_stage(|s| s == Stage::Running).await;
            })
        })
    });
    group.bench_function("over_http", |b| {
        b.iter(|| {
            served.runtime.block_on(async {
                let (status, body) = call(&served.router, "POST", &pause).await;
                assert_eq!(status, StatusCode::OK, "{body:?}");
                let (status, body) = call(&served.router, "POST", &resume).await;
                assert_eq!(status, StatusCode::OK, "{body:?}");
            })
        })
    });
    group.finish();
}

fn list(c: &mut Criterion, served: &Served) {
    let count = tasks();
    let uri = format!("/v1/tasks?limit={count}");
    let mut group = c.benchmark_group("http_list");
    group.sample_size(20);
    group.bench_function("snapshots_direct", |b| {
        b.iter(|| {
            let snapshots: Vec<_> = served.group.tasks().iter().map(Handle::snapshot).collect();
            assert_eq!(snapshots.len(), count);
            snapshots
        })
    });
    group.bench_function("get_v1_tasks", |b| {
        b.iter(|| {
            served.runtime.block_on(async {
                let (status, body) = call(&served.router, "GET", &uri).await;
                assert_eq!(status, StatusCode::OK);
                body
            })
        })
    });
    group.finish();
}

fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    samples.sort_unstable();
    samples[(samples.len() * p / 100).min(samples.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// 50 clients at once, 20 requests each (2 × 2 under `cargo test`).
fn concurrent_lists(served: &Served) -> (Duration, Duration) {
    let count = tasks();
    let (clients, each) = if benching() { (50, 20) } else { (2, 2) };
    let uri = format!("/v1/tasks?limit={count}");
    let mut samples = served.runtime.block_on(async {
        let mut clients_set = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (router, uri) = (served.router.clone(), uri.clone());
            clients_set.spawn(async move {
                let mut took = Vec::new();
                for _ in 0..each {
                    let started = Instant::now();
                    let (status, body) = call(&router, "GET", &uri).await;
                    took.push(started.elapsed());
                    assert_eq!(status, StatusCode::OK);
                    let value: serde_json::Value =
                        serde_json::from_slice(&body).expect("a JSON answer");
                    assert_eq!(value["total"], count, "every task counted");
                    assert_eq!(value["items"].as_array().map(Vec::len), Some(count));
                }
                took
            });
        }
        let mut all = Vec::new();
        while let Some(took) = clients_set.join_next().await {
            all.extend(took.expect("a client"));
        }
        all
    });
    (percentile(&mut samples, 50), percentile(&mut samples, 99))
}

/// From a pause issued to its Paused on an open event stream, and, in rounds of
/// their own, on `Handle::events`: the p50 and p99 of each, over 200 pauses (5
/// under `cargo test`).
fn change_to_stream(served: &Served) -> ((Duration, Duration), (Duration, Duration)) {
    let rounds = if benching() { 200 } else { 5 };
    let handle = first(&served.group);
    let uri = format!("/v1/tasks/{}/events", handle.name());
    served.runtime.block_on(async {
        let mut over_events = Vec::new();
        let mut events = handle.events();
        for _ in 0..rounds {
            let issued = Instant::now();
            let settling = handle.pause_now().expect("a pause");
            // Bounded: the task's own events, each within 5 s.
            loop {
                let event = tokio::time::timeout(Duration::from_secs(5), events.next())
                    .await
                    .expect("an event in time")
                    .expect("the stream lives");
                if let Event::Change(change) = event {
                    if change.stage == Stage::Paused {
                        over_events.push(issued.elapsed());
                        break;
                    }
                }
            }
            assert_eq!(settling.await, Ok(Stage::Paused));
            handle.resume().await.expect("a resume");
            handle.wait_for_stage(|s| s == Stage::Running).await;
        }
        drop(events);
        let mut over_stream = Vec::new();
        let mut stream = SseReader::open(&served.router, &uri, "", None).await;
        for _ in 0..rounds {
            let issued = Instant::now();
            let settling = handle.pause_now().expect("a pause");
            // Bounded: the stream's own deadline, 5 s a read.
            loop {
                let event = stream
                    .next(Duration::from_secs(5))
                    .await
                    .expect("the change arrives on the stream");
                if event.data["item"]["stage"] == "Paused" {
                    over_stream.push(issued.elapsed());
                    break;
                }
            }
            assert_eq!(settling.await, Ok(Stage::Paused));
            handle.resume().await.expect("a resume");
            handle.wait_for_stage(|s| s == Stage::Running).await;
        }
        (
            (
                percentile(&mut over_stream, 50),
                percentile(&mut over_stream, 99),
            ),
            (
                percentile(&mut over_events, 50),
                percentile(&mut over_events, 99),
            ),
        )
    })
}

fn benches(c: &mut Criterion) {
    let served = serve(tasks());
    pause_over_http(c, &served);
    list(c, &served);
    let (list_p50, list_p99) = concurrent_lists(&served);
    let ((stream_p50, stream_p99), (events_p50, events_p99)) = change_to_stream(&served);
    println!(
        "http tasks={} list_p50_ms={:.2} list_p99_ms={:.2} stream_p50_ms={:.3} \
         stream_p99_ms={:.3} events_p50_ms={:.3} events_p99_ms={:.3}",
        tasks(),
        ms(list_p50),
        ms(list_p99),
        ms(stream_p50),
        ms(stream_p99),
        ms(events_p50),
        ms(events_p99)
    );
    served.runtime.block_on(async {
        let report = served
            .group
            .stop_all(Duration::from_secs(10), StopOrder::AllAtOnce)
            .await;
        assert!(
            report.all_reached(Stage::Stopped),
            "every task stops: {report:?}"
        );
    });
}

criterion_group!(http, benches);

fn main() {
    http();
    Criterion::default().configure_from_args().final_summary();
}
