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
//! With feature `etcd`, the two list figures again for a cluster (`Api::cluster`):
//! 10,000 tasks created through a `Controller` on the in-memory store
//! (`MemoryCoordinator`), run by two `Worker`s in the same process until every task
//! is observed Running (so that each item has its owner, token and observed stage);
//! the API's controller reads the store through a wrapper that counts its `list`
//! calls:
//!
//! - **list (cluster)**: `GET /v1/tasks?limit=10000`, against `Controller::list` (the
//!   store read of every task that the API does not make per request);
//! - **50 clients (cluster)**: as above, p50 and p99, and the store lists made while
//!   the clients ran, beside the wake-ups of the API's watch (expected: no list but
//!   the watch's, which reads the store when it changes and once in 10 s without a
//!   change).
//!
//! The requests go through the router in process (`tower::ServiceExt::oneshot`),
//! without a socket: the figures are the API's own cost. Under `cargo bench` it uses
//! 10,000 tasks and ends with one line (two with feature `etcd`):
//!
//! ```text
//! http tasks=10000 list_p50_ms=… list_p99_ms=… stream_p50_ms=… stream_p99_ms=… events_p50_ms=… events_p99_ms=…
//! http_cluster tasks=10000 workers=2 list_p50_ms=… list_p99_ms=… requests=1000 store_lists=… watch_wakeups=… run_s=…
//! ```
//!
//! Under `cargo test` it runs each benchmark once on 200 tasks, and checks every
//! answer (200, the stage reached, every task listed).
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::http as http_common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use criterion::{criterion_group, Criterion};
use http_body_util::BodyExt;
use http_common::{running_probes, SseReader};
use taskstage::{Event, Handle, Stage, StopOrder, TaskGroup};
use taskstage_http::{Api, Auth, LocalTasks};
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
        let (group, _) = running_probes(count).await;
        let tasks = LocalTasks::from_group(&group).expect("one task per name");
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

/// `GET /v1/tasks` of every task: the whole answer, as bytes.
fn get_all(runtime: &Runtime, router: &Router, count: usize) -> axum::body::Bytes {
    runtime.block_on(async {
        let (status, body) = call(router, "GET", &format!("/v1/tasks?limit={count}")).await;
        assert_eq!(status, StatusCode::OK);
        body
    })
}

fn list(c: &mut Criterion, served: &Served) {
    let count = tasks();
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
        b.iter(|| get_all(&served.runtime, &served.router, count))
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
fn clients() -> (usize, usize) {
    if benching() {
        (50, 20)
    } else {
        (2, 2)
    }
}

/// Every client's requests at once: the p50 and p99 of one request.
fn concurrent_lists(runtime: &Runtime, router: &Router) -> (Duration, Duration) {
    let count = tasks();
    let (clients, each) = clients();
    let uri = format!("/v1/tasks?limit={count}");
    let mut samples = runtime.block_on(async {
        let mut clients_set = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (router, uri) = (router.clone(), uri.clone());
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
    let (list_p50, list_p99) = concurrent_lists(&served.runtime, &served.router);
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
    // Gone before the cluster is set up: the two do not share the machine.
    drop(served);
    #[cfg(feature = "cluster")]
    cluster::benches(c);
}

/// The list figures for a cluster (feature `etcd`): see the file's docs.
#[cfg(feature = "cluster")]
mod cluster {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use axum::http::StatusCode;
    use axum::Router;
    use criterion::Criterion;
    use taskstage::{Stage, Task};
    use taskstage_cluster::{
        BoxFuture, ClusterError, Controller, Coordinator, DesiredStage, Grant, KeepAlive, Listing,
        MemoryCoordinator, Txn, TxnResult, WatchStream, Worker,
    };
    use taskstage_harness::pass_to_store;
    use taskstage_http::{Api, Auth};
    use tokio::runtime::Runtime;

    use super::http_common::{Live, Probe};
    use super::{benching, call, clients, concurrent_lists, get_all, ms, tasks};

    const PREFIX: &str = "bench";
    const WORKERS: usize = 2;

    /// The store as the API's controller sees it: every `list` is counted, and every
    /// return of `wait_change` (the API's watch waking, on a change or after its
    /// 10 s without one; it lists the store next); every call passed on as it is.
    struct CountingLists {
        store: MemoryCoordinator,
        lists: Arc<AtomicUsize>,
        wakeups: Arc<AtomicUsize>,
    }

    impl Coordinator for CountingLists {
        pass_to_store!(grant, keep_alive, revoke, txn, watch);

        fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            self.store.list(prefix)
        }

        fn wait_change(
            &self,
            prefix: String,
            after: i64,
            timeout: Duration,
        ) -> BoxFuture<'_, Result<(), ClusterError>> {
            Box::pin(async move {
                let answer = self.store.wait_change(prefix, after, timeout).await;
                self.wakeups.fetch_add(1, Ordering::SeqCst);
                answer
            })
        }
    }

    struct Cluster {
        runtime: Runtime,
        /// On the store itself, not counted: the set-up's reads and the baseline.
        controller: Controller,
        workers: Vec<Worker>,
        router: Router,
        /// The store lists of the API's controller.
        lists: Arc<AtomicUsize>,
        /// The wake-ups of the API's watch.
        wakeups: Arc<AtomicUsize>,
    }

    /// Every task observed Running under its owner, read from the store.
    async fn running(controller: &Controller) -> usize {
        controller
            .list()
            .await
            .expect("a list")
            .iter()
            .filter(|s| {
                s.owner.is_some()
                    && s.answers(s.desired_revision)
                    && s.current_observed().map(|o| o.stage) == Some(Stage::Running)
            })
            .count()
    }

    /// Every item of the API's listing Running, with its owner and token.
    async fn listed_running(router: &Router, count: usize) -> usize {
        let (status, body) = call(router, "GET", &format!("/v1/tasks?limit={count}")).await;
        if status != StatusCode::OK {
            return 0;
        }
        let value: serde_json::Value = serde_json::from_slice(&body).expect("a JSON answer");
        value["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|i| {
                    i["stage"] == "Running" && i["owner"].is_string() && i["token"].is_i64()
                })
                .count()
        })
    }

    fn serve(count: usize) -> Cluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (controller, workers, router, lists, wakeups) = runtime.block_on(async {
            let store = MemoryCoordinator::new();
            let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
            for i in 0..count {
                controller
                    .create(&format!("t{i:05}"), Vec::new(), DesiredStage::Running)
                    .await
                    .expect("created");
            }
            let live = Live::default();
            let mut workers = Vec::new();
            for w in 1..=WORKERS {
                let live = live.clone();
                let worker = Worker::builder(store.clone(), PREFIX, format!("worker-{w}"))
                    // Either may hold every task: the split is the workers' own.
                    .capacity(count)
                    .join(move |spec| {
                        Ok(Task::builder(spec.task.as_str()).unit(Probe {
                            live: live.clone(),
                            hold: None,
                        }))
                    })
                    .await
                    .expect("the worker joins");
                workers.push(worker);
            }
            let started = Instant::now();
            let bound = Duration::from_secs(if benching() { 300 } else { 60 });
            // Bounded: `bound`, then the assertion fails.
            loop {
                let running = running(&controller).await;
                if running == count {
                    break;
                }
                assert!(
                    started.elapsed() < bound,
                    "{running} of {count} tasks observed Running after {bound:?}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let lists = Arc::new(AtomicUsize::new(0));
            let wakeups = Arc::new(AtomicUsize::new(0));
            let counted = CountingLists {
                store,
                lists: Arc::clone(&lists),
                wakeups: Arc::clone(&wakeups),
            };
            let api = Controller::new(counted, PREFIX).expect("a controller");
            // No token: the figures are the API's, not a comparison of strings.
            let router = Api::cluster(api).auth(Auth::open()).router();
            // Bounded: 30 s, then the assertion fails.
            loop {
                let listed = listed_running(&router, count).await;
                if listed == count {
                    break;
                }
                assert!(
                    started.elapsed() < bound + Duration::from_secs(30),
                    "{listed} of {count} tasks listed Running by the API"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!(
                "http_cluster set-up: {count} tasks running on {WORKERS} workers ({}) in {:.1} s",
                workers
                    .iter()
                    .map(|w| w.tasks().len().to_string())
                    .collect::<Vec<_>>()
                    .join(" + "),
                started.elapsed().as_secs_f64()
            );
            (controller, workers, router, lists, wakeups)
        });
        Cluster {
            runtime,
            controller,
            workers,
            router,
            lists,
            wakeups,
        }
    }

    fn list(c: &mut Criterion, cluster: &Cluster) {
        let count = tasks();
        let mut group = c.benchmark_group("http_list_cluster");
        group.sample_size(20);
        group.bench_function("controller_list", |b| {
            b.iter(|| {
                cluster.runtime.block_on(async {
                    let list = cluster.controller.list().await.expect("a list");
                    assert_eq!(list.len(), count);
                    list
                })
            })
        });
        group.bench_function("get_v1_tasks", |b| {
            b.iter(|| get_all(&cluster.runtime, &cluster.router, count))
        });
        group.finish();
    }

    pub(super) fn benches(c: &mut Criterion) {
        let count = tasks();
        let cluster = serve(count);
        list(c, &cluster);
        let (clients, each) = clients();
        let requests = clients * each;
        let lists_before = cluster.lists.load(Ordering::SeqCst);
        let wakeups_before = cluster.wakeups.load(Ordering::SeqCst);
        let started = Instant::now();
        let (list_p50, list_p99) = concurrent_lists(&cluster.runtime, &cluster.router);
        let took = started.elapsed();
        let lists = cluster.lists.load(Ordering::SeqCst) - lists_before;
        let wakeups = cluster.wakeups.load(Ordering::SeqCst) - wakeups_before;
        println!(
            "http_cluster tasks={count} workers={WORKERS} list_p50_ms={:.2} list_p99_ms={:.2} \
             requests={requests} store_lists={lists} watch_wakeups={wakeups} run_s={:.2}",
            ms(list_p50),
            ms(list_p99),
            took.as_secs_f64()
        );
        // Nothing changed in the store meanwhile: the watch wakes (and lists the
        // store) only once its 10 s wait runs out, whatever the requests; a list
        // more than its wake-ups (one may fall just before the run) is a request's.
        let relists = usize::try_from(took.as_secs() / 10).unwrap_or(usize::MAX);
        assert!(
            lists <= 1 + wakeups.min(relists + 1),
            "{lists} store lists ({wakeups} wake-ups of the watch) for {requests} requests \
             in {took:?}: a listing read the store"
        );
        let Cluster {
            runtime,
            workers,
            router,
            ..
        } = cluster;
        drop(router);
        runtime.block_on(async {
            for worker in workers {
                worker.shutdown().await.expect("the worker shuts down");
            }
        });
    }
}

criterion_group!(http, benches);

fn main() {
    http();
    Criterion::default().configure_from_args().final_summary();
}
