//! The HTTP API over a cluster (features `http` and `etcd`): a `Controller` and a
//! `Worker` on the in-memory store, every answer checked against the unit.

mod http_common;

use std::time::Duration;

use axum::http::StatusCode;
use http_common::{call, Live, Probe};
use taskstage::cluster::{Controller, MemoryCoordinator, Worker};
use taskstage::http::{Api, Auth};
use taskstage::Task;

const ADMIN: &str = "admin-token";
const READ: &str = "read-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pause_answers_200_only_once_the_owners_run_returned() {
    let store = MemoryCoordinator::new();
    let live = Live::default();
    let for_factory = live.clone();
    let worker = Worker::builder(store.clone(), "app", "worker-1")
        .ttl(Duration::from_secs(2))
        .join(move |spec| {
            Ok(Task::builder(spec.task.as_str()).unit(Probe {
                live: for_factory.clone(),
                hold: None,
            }))
        })
        .await
        .expect("the worker joins");
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
