//! The HTTP API over a cluster (features `http` and `etcd`): a `Controller` and a
//! `Worker` on the in-memory store, every answer checked against the unit.

use taskstage_harness::http as http_common;
use taskstage_harness::pass_to_store;

use std::time::Duration;

use axum::http::StatusCode;
use http_common::{call, Live, Probe};
use taskstage::Task;
use taskstage_cluster::{
    BoxFuture, ClusterError, Controller, Coordinator, DesiredStage, Grant, KeepAlive, Listing,
    MemoryCoordinator, Txn, TxnResult, WatchStream, Worker,
};
use taskstage_http::{Api, Auth};

const ADMIN: &str = "admin-token";
const READ: &str = "read-token";

/// Worker `id` under prefix `app`, its runs counted in `live`.
async fn join(store: &MemoryCoordinator, id: &str, live: &Live) -> Worker {
    let for_factory = live.clone();
    Worker::builder(store.clone(), "app", id)
        .ttl(Duration::from_secs(2))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Probe {
                live: for_factory.clone(),
                hold: None,
            }))
        })
        .await
        .expect("the worker joins")
}

/// As [`join`], but every run of the worker, once cancelled, waits for a permit of
/// `hold` before it returns, for up to its grace of 5 s (a stop bound of 10 s, in a
/// TTL of 20 s that leaves the lease kept between).
async fn join_holding(
    store: &MemoryCoordinator,
    id: &str,
    live: &Live,
    hold: &std::sync::Arc<tokio::sync::Semaphore>,
) -> Worker {
    let for_factory = live.clone();
    let hold = std::sync::Arc::clone(hold);
    Worker::builder(store.clone(), "app", id)
        .ttl(Duration::from_secs(20))
        .stop_bound(Duration::from_secs(10))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Probe {
                live: for_factory.clone(),
                hold: Some(std::sync::Arc::clone(&hold)),
            }))
        })
        .await
        .expect("the worker joins")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pause_answers_200_only_once_the_owners_run_returned() {
    let store = MemoryCoordinator::new();
    let live = Live::default();
    let worker = join(&store, "worker-1", &live).await;
    let controller = Controller::new(store, "app").expect("a controller");
    let router = Api::cluster(controller)
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();

    // Created over HTTP, then resumed until the owner reports Running.
    let body = br#"{"id":"orders","stage":"Running","spec":{"rows":10}}"#.to_vec();
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = call(&router, "POST", "/v1/tasks", Some(ADMIN), Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error_code"], "exists");
    // JSON only where JSON is parsed: a body no HTML form could send. A form's
    // (or a plain text) body is 415, and nothing is created.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", ""] {
        use tower::ServiceExt;
        let mut request = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/tasks")
            .header("authorization", format!("Bearer {ADMIN}"));
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        let request = request
            .body(axum::body::Body::from(
                br#"{"id":"formed","stage":"Running"}"#.to_vec(),
            ))
            .expect("a request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        assert_eq!(
            response.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a create sent as {content_type:?}"
        );
    }
    let (status, _) = call(&router, "GET", "/v1/tasks/formed", Some(READ), None).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a create without JSON wrote a task"
    );
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks/orders/resume?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["stage"], "Running");
    assert_eq!(answer["owner"], "worker-1");
    live.reaches(1).await;

    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks/orders/pause?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["stage"], "Paused");
    assert_eq!(
        live.now(),
        0,
        "a 200 Paused with the owner's run still alive"
    );

    // `?wait=0` writes and answers at once, 202.
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks/orders/resume?wait=0",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["stage"], "Resuming");

    // The list is the watched copy: wait on it for the owner's Running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, list) = call(
            &router,
            "GET",
            "/v1/tasks?worker=worker-1",
            Some(READ),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        if list["items"][0]["stage"] == "Running" {
            assert_eq!(list["total"], 1);
            assert_eq!(list["items"][0]["desired"], "Running");
            assert!(list["items"][0]["token"].is_i64(), "{list}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the list never showed Running: {list}"
        );
        tokio::task::yield_now().await;
    }

    let (status, workers) = call(&router, "GET", "/v1/workers", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{workers}");
    assert_eq!(workers["items"][0]["id"], "worker-1");

    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks/orders/stop?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["stage"], "Stopped");
    assert_eq!(live.now(), 0);
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks/orders/resume?wait=1s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["command"], "resume");
    assert_eq!(answer["task"], "orders");

    let (status, answer) = call(&router, "POST", "/v1/tasks/nope/pause", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, answer) = call(&router, "GET", "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    worker.shutdown().await.expect("the worker shuts down");
}

/// `POST /v1/workers/{id}/drain`: admin only, 404 for a worker that is not a member,
/// 202 while a run of the worker has not returned, and 200 only once the worker
/// holds no task; every task then runs once, on the other worker, checked from the
/// units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_over_http_answers_200_once_the_worker_holds_nothing() {
    let store = MemoryCoordinator::new();
    // The runs alive on each worker.
    let lives = [Live::default(), Live::default()];
    // The runs of worker-1 return at once while the permits are there (the shares
    // settle by hand-overs from it), and hold on to their stop once they are gone.
    const PERMITS: usize = 1_000;
    let hold = std::sync::Arc::new(tokio::sync::Semaphore::new(PERMITS));
    let workers = vec![
        join_holding(&store, "worker-1", &lives[0], &hold).await,
        join(&store, "worker-2", &lives[1]).await,
    ];
    let controller = Controller::new(store, "app").expect("a controller");
    for i in 0..6 {
        controller
            .create(&format!("t{i}"), Vec::new(), DesiredStage::Running)
            .await
            .expect("created");
    }
    for i in 0..6 {
        controller
            .resume_within(&format!("t{i}"), Duration::from_secs(10))
            .await
            .expect("running");
    }
    // The fair shares move tasks to worker-1 if worker-2 took them all first, one
    // hand-over after another: wait on the store until each worker runs its share
    // (three of six), not merely until worker-1 holds one, or the count read below
    // races the hand-overs still under way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let on_first = loop {
        let list = controller.list().await.expect("the store answers");
        let running = |s: &taskstage_cluster::TaskStatus| {
            s.current_observed()
                .is_some_and(|o| o.stage == taskstage::Stage::Running)
        };
        let on_first = list
            .iter()
            .filter(|s| s.owner.as_ref().is_some_and(|w| w.as_str() == "worker-1"))
            .count();
        if list.iter().all(running) && on_first == 3 {
            break on_first;
        }
        let now = tokio::time::Instant::now();
        assert!(now < deadline, "the shares never settled: {list:#?}");
        let revision = list.iter().map(|s| s.revision).max().unwrap_or(0);
        controller
            .wait_tasks_change(revision, deadline - now)
            .await
            .expect("the store answers");
    };
    lives[0].reaches(on_first).await;
    lives[1].reaches(6 - on_first).await;
    let router = Api::cluster(controller.clone())
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();

    let (status, answer) = call(
        &router,
        "POST",
        "/v1/workers/worker-1/drain?wait=10s",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error_code"], "forbidden");
    for unknown in ["nobody", "a%2Fb"] {
        let uri = format!("/v1/workers/{unknown}/drain?wait=1s");
        let (status, answer) = call(&router, "POST", &uri, Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert_eq!(answer["error_code"], "unknown_worker", "{answer}");
        assert_eq!(answer["command"], "drain", "{answer}");
    }
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/workers/worker-1/drain?wait=bogus",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let statuses = controller.worker_statuses().await.expect("members");
    assert!(statuses.iter().all(|w| !w.draining), "nothing was written");

    // While worker-1's runs hold on to their stop, the drain is under way: a 202
    // after its wait, with every task still held and every run still alive.
    assert_eq!(hold.forget_permits(PERMITS), PERMITS);
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/workers/worker-1/drain?wait=1s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["tasks"], on_first, "{answer}");
    assert_eq!(lives[0].now(), on_first, "a run returned while held");

    hold.add_permits(PERMITS);
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/workers/worker-1/drain?wait=30s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["tasks"], 0, "{answer}");
    // The 200 is true: no run is alive on the worker, it holds no owner key.
    assert_eq!(
        lives[0].now(),
        0,
        "a 200 with a run alive on the drained worker"
    );
    assert_eq!(
        controller.held_by("worker-1").await.expect("a read"),
        Vec::new()
    );
    assert!(workers[0].is_draining());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Bounded by the deadline: the answers of the new owner, then its runs.
    for i in 0..6 {
        let task = format!("t{i}");
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let running = controller
            .resume_within(&task, remaining)
            .await
            .expect("the new owner runs it");
        assert_eq!(running.owner.as_str(), "worker-2");
    }
    lives[1].reaches(6).await;
    assert_eq!(lives[0].now(), 0);
    assert!(workers[0].tasks().is_empty(), "{:?}", workers[0].tasks());

    let (status, listed) = call(&router, "GET", "/v1/workers", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let shown: Vec<(String, bool)> = listed["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|w| {
                    (
                        w["id"].as_str().unwrap_or_default().to_owned(),
                        w["draining"].as_bool().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        shown,
        [
            ("worker-1".to_owned(), true),
            ("worker-2".to_owned(), false)
        ],
        "{listed}"
    );
    for worker in workers {
        worker.shutdown().await.expect("the worker shuts down");
    }
}

/// A drain whose wait runs out while a run on the drained worker ignores its
/// cancellation is 202 with the count still held, never 200; once the run returns,
/// the same drain is 200 with nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_wait_ran_out_is_202_with_the_count_still_held() {
    let store = MemoryCoordinator::new();
    let live = Live::default();
    let hold = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (for_factory, held_runs) = (live.clone(), std::sync::Arc::clone(&hold));
    let stubborn = Worker::builder(store.clone(), "app", "worker-1")
        .ttl(Duration::from_secs(2))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Probe {
                live: for_factory.clone(),
                hold: Some(std::sync::Arc::clone(&held_runs)),
            }))
        })
        .await
        .expect("the worker joins");
    let controller = Controller::new(store.clone(), "app").expect("a controller");
    controller
        .create("t", Vec::new(), DesiredStage::Running)
        .await
        .expect("created");
    let running = controller
        .resume_within("t", Duration::from_secs(10))
        .await
        .expect("running");
    assert_eq!(running.owner.as_str(), "worker-1");
    live.reaches(1).await;
    let other_live = Live::default();
    let other = join(&store, "worker-2", &other_live).await;
    let router = Api::cluster(controller.clone())
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();

    for uri in [
        "/v1/workers/worker-1/drain?wait=1s",
        "/v1/workers/worker-1/drain?wait=0s",
    ] {
        let (status, answer) = call(&router, "POST", uri, Some(ADMIN), None).await;
        assert_eq!(
            status,
            StatusCode::ACCEPTED,
            "{uri}: the run on the drained worker is still alive: {answer}"
        );
        assert_eq!(answer["tasks"], 1, "{uri}: {answer}");
        assert_eq!(answer["command"], "drain", "{answer}");
        assert_eq!(live.now(), 1, "the stubborn run is alive");
    }

    hold.add_permits(1);
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/workers/worker-1/drain?wait=30s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["tasks"], 0, "{answer}");
    assert_eq!(
        live.now(),
        0,
        "a 200 with a run alive on the drained worker"
    );
    stubborn.shutdown().await.expect("the worker shuts down");
    other.shutdown().await.expect("the worker shuts down");
}

/// A cluster's list is its watched copy of the store, rebuilt once per change: a
/// change the API has observed (its event is on the stream) is in the next listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_the_stream_is_in_the_next_listing() {
    let store = MemoryCoordinator::new();
    let live = Live::default();
    let worker = join(&store, "worker-1", &live).await;
    let controller = Controller::new(store, "app").expect("a controller");
    // Within the worker's capacity (16).
    let names: Vec<String> = (0..10).map(|i| format!("t{i:02}")).collect();
    for name in &names {
        controller
            .create(name, Vec::new(), DesiredStage::Running)
            .await
            .expect("created");
    }
    let router = Api::cluster(controller.clone())
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();
    let mut stream = http_common::SseReader::open(&router, "/v1/events", READ, None).await;
    let rounds = names.iter().flat_map(|name| [(name, true), (name, false)]);
    for (round, (name, pause)) in rounds.enumerate() {
        // The stage the owner answered (a task paused before its first run answers
        // New), and the desired stage.
        let (answer, desired) = if pause {
            let answer = controller.pause_within(name, Duration::from_secs(10)).await;
            (answer.expect("paused"), "Paused")
        } else {
            let answer = controller
                .resume_within(name, Duration::from_secs(10))
                .await;
            (answer.expect("running"), "Running")
        };
        let want = answer.stage.name();
        // Bounded: every read waits at most 10 s, and the stream carries each change.
        loop {
            let event = stream
                .next(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("round {round}: {name} {want} never on the stream"));
            let item = &event.data["item"];
            if event.data["task"] == name.as_str()
                && item["stage"] == want
                && item["desired"] == desired
            {
                break;
            }
        }
        let (status, list) = call(&router, "GET", "/v1/tasks", Some(READ), None).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let item = list["items"]
            .as_array()
            .and_then(|items| items.iter().find(|i| i["id"] == name.as_str()))
            .cloned()
            .unwrap_or_default();
        assert_eq!(item["stage"], want, "round {round}: {list}");
        assert_eq!(item["desired"], desired, "round {round}: {list}");
    }
    worker.shutdown().await.expect("the worker shuts down");
}

/// Health needs no token, so it tells a caller without one only that the store is
/// unreachable: the store's own error text goes to a caller with a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_without_a_token_does_not_repeat_the_stores_error_text() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store.clone(), "app").expect("a controller");
    let router = Api::cluster(controller)
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();
    store.set_unreachable(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // Bounded by the deadline, 20 ms apart: the API notices at its next listing.
    let detailed = loop {
        let (status, answer) = call(&router, "GET", "/v1/health", Some(READ), None).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health stayed {status} with the store unreachable: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reasons = detailed["reasons"].to_string();
    let detail = reasons
        .split("store unreachable: ")
        .nth(1)
        .map(|rest| rest.trim_end_matches(['"', ']']).to_owned())
        .unwrap_or_else(|| panic!("a token's holder was not told why: {reasons}"));
    assert!(!detail.is_empty(), "{reasons}");
    for token in [None, Some("guess")] {
        let (status, answer) = call(&router, "GET", "/v1/health", token, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        let brief = answer["reasons"].to_string();
        assert!(brief.contains("store unreachable"), "{token:?}: {brief}");
        assert!(
            !brief.contains(&detail),
            "{token:?}: health repeated the store's words {detail:?}: {brief}"
        );
    }
}

/// A store that counts the listings of one prefix.
#[derive(Clone)]
struct CountedLists {
    store: MemoryCoordinator,
    prefix: &'static str,
    lists: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Coordinator for CountedLists {
    pass_to_store!(grant, keep_alive, revoke, watch, txn, wait_change);

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        if prefix.starts_with(self.prefix) {
            self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.store.list(prefix)
    }
}

/// The API follows an empty prefix from the revision of its listing, not from 0:
/// a store whose revision moved on (here by another prefix's task) does not make
/// it list the prefix again every 50 ms. At rest it lists once per change, and
/// once per re-list period (10 s).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_empty_prefix_is_followed_at_rest_not_listed_again_and_again() {
    let store = MemoryCoordinator::new();
    Controller::new(store.clone(), "other")
        .expect("a controller")
        .create("elsewhere", Vec::new(), DesiredStage::Paused)
        .await
        .expect("a task under another prefix");
    let counted = CountedLists {
        store: store.clone(),
        prefix: "app",
        lists: std::sync::Arc::default(),
    };
    let controller = Controller::new(counted.clone(), "app").expect("a controller");
    let router = Api::cluster(controller)
        .auth(Auth::tokens().admin(ADMIN))
        .router();
    let (status, answer) = call(&router, "GET", "/v1/tasks", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let before = counted.lists.load(std::sync::atomic::Ordering::SeqCst);
    // A window of the paused clock shorter than the re-list period.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = counted.lists.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(
        during <= 1,
        "the empty prefix was listed {during} times in 5 s with nothing changing under it"
    );
}

/// A spec over the store's limit (`MAX_SPEC_BYTES`), in a body the API's own limit
/// lets through, is bad input like a body over that limit: 413 `too_large`,
/// naming the command, and nothing is created. It was a 500 `internal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_over_the_stores_limit_is_413_and_creates_nothing() {
    let store = MemoryCoordinator::new();
    let controller = Controller::new(store, "app").expect("a controller");
    let router = Api::cluster(controller.clone())
        .auth(Auth::tokens().admin(ADMIN))
        .body_limit(4 << 20)
        .router();
    let spec = "x".repeat(taskstage_cluster::MAX_SPEC_BYTES + 1);
    let body = serde_json::json!({"id": "big", "stage": "Paused", "spec": spec});
    let (status, answer) = call(
        &router,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(body.to_string().into_bytes()),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(answer["error_code"], "too_large", "{answer}");
    assert_eq!(answer["command"], "create", "{answer}");
    let listed = controller.list().await.expect("the list");
    assert!(listed.is_empty(), "a task was created: {listed:?}");
}

/// A bulk pause through a cluster: one deadline for every task, each named reached
/// only once its owner reported its run returned (the unit's counter agrees), the
/// list marks them paused by an operator and counts them, and a bulk resume by ids
/// runs them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_pause_through_a_cluster_reaches_every_task_it_names() {
    let store = MemoryCoordinator::new();
    let live = Live::default();
    let _worker = join(&store, "worker-1", &live).await;
    let controller = Controller::new(store, "app").expect("a controller");
    for task in ["a", "b", "c"] {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("created");
    }
    let router = Api::cluster(controller)
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();
    live.reaches(3).await;

    let (status, body) = call(
        &router,
        "POST",
        "/v1/bulk/pause?all=true&wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["selected"], 3, "{body}");
    assert_eq!(body["reached"].as_array().map(Vec::len), Some(3), "{body}");
    assert!(
        body["reached"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| e["stage"] == "Paused"),
        "{body}"
    );
    assert_eq!(
        live.now(),
        0,
        "a bulk pause reached Paused with a run alive"
    );

    // The list catches up with the owner's reports; then every task is counted
    // Paused and marked as an operator's pause.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let (_, listed) = call(&router, "GET", "/v1/tasks", Some(READ), None).await;
        if listed["counts"]["Paused"] == 3 {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|i| i["user_paused"] == true),
        "{listed}"
    );

    let ids = br#"{"ids": ["a", "c"]}"#.to_vec();
    let (status, body) = call(
        &router,
        "POST",
        "/v1/bulk/resume?wait=10s",
        Some(ADMIN),
        Some(ids),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["reached"].as_array().map(Vec::len), Some(2), "{body}");
    live.reaches(2).await;
}
