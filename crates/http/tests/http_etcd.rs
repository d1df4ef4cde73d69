//! The HTTP API over a real etcd (a member on 127.0.0.1 that the test starts and
//! stops by pid; see `taskstage_harness::cluster`).
//!
//! Without an `etcd` binary each test says SKIPPED and passes, except under
//! `CI=true`, where it fails.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::time::{Duration, Instant};

use taskstage_cluster::{Controller, DesiredStage, EtcdCoordinator, EtcdOptions};
use taskstage_harness::cluster::EtcdCluster;
use tower::ServiceExt;

async fn connect(cluster: &EtcdCluster) -> EtcdCoordinator {
    EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
        .await
        .expect("connect to the test cluster")
}

/// On a prefix that holds no task yet, the first one created is seen at once, at
/// both layers that wait for a change: `Controller::wait_tasks_change` returns on
/// it (from revision 0: nothing listed yet), and the HTTP API's list, which follows
/// the store with that wait, shows it without waiting for its periodic re-list
/// (10 s). Before, both slept the whole period: the first task of an empty prefix
/// appeared in `GET /v1/tasks` 7.6–9.5 s after it was created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_task_of_an_empty_prefix_is_seen_at_once() {
    let Some(cluster) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    let prefix = "fresh";
    let controller = Controller::new(connect(&cluster).await, prefix).expect("a controller");
    let watcher = Controller::new(connect(&cluster).await, prefix).expect("a controller");
    let router = taskstage_http::Api::cluster(watcher.clone())
        .auth(taskstage_http::Auth::tokens().admin("admin-token"))
        .router();
    let list = || async {
        let request = axum::http::Request::builder()
            .uri("/v1/tasks")
            .header("authorization", "Bearer admin-token")
            .body(axum::body::Body::empty())
            .expect("a request");
        let answer = router.clone().oneshot(request).await.expect("an answer");
        assert_eq!(answer.status(), axum::http::StatusCode::OK);
        let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .expect("a body");
        serde_json::from_slice::<serde_json::Value>(&body).expect("JSON")
    };
    // The API has listed the empty prefix, and follows it from there.
    let first = list().await;
    assert_eq!(first["items"].as_array().map(Vec::len), Some(0), "{first}");
    let waiting = tokio::spawn({
        let watcher = watcher.clone();
        async move {
            let began = Instant::now();
            watcher
                .wait_tasks_change(0, Duration::from_secs(10))
                .await
                .expect("the wait");
            began.elapsed()
        }
    });
    // Whichever comes first, the wait's watch or the write: a wait from revision 0
    // sees every change since the store began.
    let created = Instant::now();
    controller
        .create("first", Vec::new(), DesiredStage::Paused)
        .await
        .expect("create");
    let waited = waiting.await.expect("the waiting task");
    assert!(
        waited < Duration::from_secs(3),
        "wait_tasks_change(0) returned {waited:?} after it began, not at the create"
    );
    let seen = loop {
        let listed = list().await;
        let items = listed["items"].as_array().cloned().unwrap_or_default();
        if items.iter().any(|item| item["id"] == "first") {
            break created.elapsed();
        }
        assert!(
            created.elapsed() < Duration::from_secs(3),
            "the first task is not listed {:?} after its create: {listed}",
            created.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        seen < Duration::from_secs(3),
        "listed {seen:?} after its create"
    );
}
