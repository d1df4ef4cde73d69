//! The HTTP API over one process's tasks (feature `http`): every answer checked
//! against the units themselves.

use taskstage_harness::http as http_common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use http_common::{call, Fails, Live, Probe, SseReader};
use proptest::prelude::*;
use serde_json::Value;
use taskstage::{Handle, Stage, Task, TaskGroup};
use taskstage_http::{Api, Auth, LocalTasks};

const ADMIN: &str = "admin-token";
const READ: &str = "read-token";
const WITHIN: Duration = Duration::from_secs(10);

struct Fixture {
    router: Router,
    group: TaskGroup,
    tasks: LocalTasks,
}

fn auth() -> Auth {
    Auth::tokens().admin(ADMIN).read_only(READ)
}

/// `names` running a [`Probe`] each; `held` names ignore their cancellation until
/// the returned semaphore gives a permit.
async fn fixture(
    names: &[&str],
    held: &[&str],
    capacity: Option<usize>,
) -> (Fixture, Vec<Live>, Arc<tokio::sync::Semaphore>) {
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let mut group = TaskGroup::new();
    let mut lives = Vec::new();
    for name in names {
        let live = Live::default();
        let probe = Probe {
            live: live.clone(),
            hold: held.contains(name).then(|| Arc::clone(&hold)),
        };
        let handle = Task::builder(*name).unit(probe).spawn().expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Running).await;
        group.add(handle);
        lives.push(live);
    }
    let tasks = match capacity {
        Some(c) => {
            let tasks = LocalTasks::with_event_capacity(c);
            for h in group.tasks() {
                tasks.add(h).expect("a name of its own");
            }
            tasks
        }
        None => LocalTasks::from_group(&group).expect("one task per name"),
    };
    let router = Api::local(&tasks).auth(auth()).router();
    (
        Fixture {
            router,
            group,
            tasks,
        },
        lives,
        hold,
    )
}

fn handle<'a>(f: &'a Fixture, name: &str) -> &'a Handle {
    f.group
        .tasks()
        .iter()
        .find(|h| h.name() == name)
        .expect("a task of that name")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_paused_means_the_run_has_returned() {
    let (f, lives, _) = fixture(&["orders"], &[], None).await;
    // Running is published once the run is launched; its code runs a moment later.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while lives[0].now() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run is not alive before the pause"
        );
        tokio::task::yield_now().await;
    }
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/orders/pause?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stage"], "Paused");
    assert_eq!(body["outcome"]["kind"], "cancelled");
    // The unit says so too: its run's future has been dropped.
    assert_eq!(lives[0].now(), 0, "a 200 Paused with the run still alive");
    assert_eq!(handle(&f, "orders").stage(), Stage::Paused);

    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/orders/resume?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stage"], "Running");
    lives[0].reaches(1).await;

    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/orders/stop",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stage"], "Stopped");
    assert_eq!(lives[0].now(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_answers_202_pausing_and_claims_no_rest() {
    let (f, lives, hold) = fixture(&["slow"], &["slow"], None).await;
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/slow/pause?wait=100ms",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["stage"], "Pausing");
    assert_eq!(lives[0].now(), 1, "the run is still alive, as the 202 says");

    // `?wait=0` answers at once, with the truth of the moment.
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/slow/pause?wait=0",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["stage"], "Pausing");

    // Released, the run returns; a pause that waits now gets its 200.
    hold.add_permits(1);
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/slow/pause?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stage"], "Paused");
    assert_eq!(lives[0].now(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_is_409_naming_command_task_and_stage_and_changes_nothing() {
    let (f, _, _) = fixture(&["a"], &[], None).await;
    let (status, _) = call(&f.router, "POST", "/v1/tasks/a/stop", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK);
    let seq = handle(&f, "a").snapshot().seq;
    let (status, body) = call(&f.router, "POST", "/v1/tasks/a/pause", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error_code"], "refused");
    assert_eq!(body["command"], "pause");
    assert_eq!(body["task"], "a");
    assert_eq!(body["stage"], "Stopped");
    let msg = body["error_msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("pause") && msg.contains('a') && msg.contains("Stopped"),
        "{msg}"
    );
    assert_eq!(
        handle(&f, "a").snapshot().seq,
        seq,
        "a refusal changed the task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_filters_pages_and_shows_every_field() {
    let names: Vec<String> = (0..25).map(|i| format!("t{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (f, _, _) = fixture(&refs, &[], None).await;
    for name in ["t03", "t07"] {
        let (status, _) = call(
            &f.router,
            "POST",
            &format!("/v1/tasks/{name}/pause"),
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = call(&f.router, "GET", "/v1/tasks", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["total"], 25);
    let item = &body["items"][0];
    for field in [
        "id", "stage", "desired", "owner", "token", "since", "outcome", "progress",
    ] {
        assert!(item.get(field).is_some(), "no {field} in {item}");
    }
    assert_eq!(item["id"], "t00");
    assert_eq!(item["progress"]["total"], 10);

    let (_, body) = call(&f.router, "GET", "/v1/tasks?stage=Paused", Some(READ), None).await;
    assert_eq!(body["total"], 2);
    let ids: Vec<&str> = body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(ids, ["t03", "t07"]);

    let (_, body) = call(
        &f.router,
        "GET",
        "/v1/tasks?offset=20&limit=3",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(body["total"], 25);
    let ids: Vec<&str> = body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(ids, ["t20", "t21", "t22"]);

    // A local task has no owner: a worker filter matches none.
    let (_, body) = call(&f.router, "GET", "/v1/tasks?worker=w1", Some(READ), None).await;
    assert_eq!(body["total"], 0);

    let (status, body) = call(&f.router, "GET", "/v1/tasks/t03", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["stage"], "Paused");
    assert_eq!(body["unit"]["name"], "probe");
    assert_eq!(body["user_paused"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_status_in_the_error_shape() {
    let (f, _, _) = fixture(&["a"], &[], None).await;
    /// Method, URI, token, body, the status and `error_code` expected.
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<Vec<u8>>,
        StatusCode,
        &'a str,
    );
    let cases: &[Case<'_>] = &[
        (
            "GET",
            "/v1/tasks/nope",
            Some(READ),
            None,
            StatusCode::NOT_FOUND,
            "unknown_task",
        ),
        (
            "POST",
            "/v1/tasks/nope/pause",
            Some(ADMIN),
            None,
            StatusCode::NOT_FOUND,
            "unknown_task",
        ),
        (
            "POST",
            "/v1/tasks/a/pause?wait=soon",
            Some(ADMIN),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/tasks/a/pause?wait=10h",
            Some(ADMIN),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/tasks/a/pause?hurry=1",
            Some(ADMIN),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "GET",
            "/v1/tasks?stage=Sleeping",
            Some(READ),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "GET",
            "/v1/tasks?limit=x",
            Some(READ),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "GET",
            "/v1/tasks",
            None,
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "GET",
            "/v1/tasks",
            Some("guess"),
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "POST",
            "/v1/tasks/a/pause",
            None,
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "POST",
            "/v1/tasks/a/pause",
            Some(READ),
            None,
            StatusCode::FORBIDDEN,
            "forbidden",
        ),
        (
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(vec![b'x'; 100_000]),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        ),
        (
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(b"{not json".to_vec()),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(br#"{"id":"b"}"#.to_vec()),
            StatusCode::METHOD_NOT_ALLOWED,
            "not_available",
        ),
        (
            "GET",
            "/v1/workers",
            Some(READ),
            None,
            StatusCode::NOT_FOUND,
            "not_available",
        ),
        (
            "GET",
            "/v2/tasks",
            Some(READ),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "DELETE",
            "/v1/tasks/a",
            Some(ADMIN),
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        // Without a token nothing under /v1/ but health is told: not which
        // methods a route takes, nor which routes exist.
        (
            "DELETE",
            "/v1/tasks/a",
            None,
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "PUT",
            "/v1/tasks",
            None,
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "GET",
            "/v1/no-such-route",
            None,
            None,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "GET",
            "/v1/no-such-route",
            Some(READ),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "GET",
            "/v2/tasks",
            None,
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    let seq = handle(&f, "a").snapshot().seq;
    for (method, uri, token, body, status, code) in cases {
        let (got, answer) = call(&f.router, method, uri, *token, body.clone()).await;
        assert_eq!(got, *status, "{method} {uri}: {answer}");
        assert_eq!(answer["error_code"], *code, "{method} {uri}: {answer}");
        assert!(
            answer["error_msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    assert_eq!(
        handle(&f, "a").snapshot().seq,
        seq,
        "bad input changed the task"
    );
    assert_eq!(handle(&f, "a").stage(), Stage::Running);

    // Health needs no token; the scope is told to its holder.
    let (status, body) = call(&f.router, "GET", "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = call(&f.router, "GET", "/v1/auth", Some(READ), None).await;
    assert_eq!(body["scope"], "read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_naming_a_task_stuck_in_a_transition() {
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let live = Live::default();
    let handle = Task::builder("stuck")
        .unit(Probe {
            live,
            hold: Some(Arc::clone(&hold)),
        })
        .spawn()
        .expect("spawned");
    handle.wait_for_stage(|s| s == Stage::Running).await;
    let tasks = LocalTasks::new();
    tasks.add(&handle).expect("a name of its own");
    let router = Api::local(&tasks)
        .auth(auth())
        .stuck_after(Duration::from_millis(1))
        .router();
    let settling = handle.pause_now().expect("accepted");
    // Wait on the state itself: health turns 503 once the task is stuck long enough.
    let deadline = tokio::time::Instant::now() + WITHIN;
    let body = loop {
        let (status, body) = call(&router, "GET", "/v1/health", None, None).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never reported the stuck task: {body}"
        );
        tokio::task::yield_now().await;
    };
    let reasons = body["reasons"].to_string();
    assert!(reasons.contains("Pausing"), "{reasons}");
    hold.add_permits(1);
    assert_eq!(settling.await.ok(), Some(Stage::Paused));
    let (status, _) = call(&router, "GET", "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_every_change_in_order_and_resume_from_an_id() {
    let (f, _, _) = fixture(&["a", "b"], &[], None).await;
    let mut all = SseReader::open(&f.router, "/v1/events", READ, None).await;
    let mut only_b = SseReader::open(&f.router, "/v1/tasks/b/events", READ, None).await;
    for uri in [
        "/v1/tasks/a/pause",
        "/v1/tasks/b/pause",
        "/v1/tasks/a/resume?wait=10s",
    ] {
        let (status, body) = call(&f.router, "POST", uri, Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    }
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    while seen.len() < 6 {
        let event = all.next(WITHIN).await.expect("an event within 10 s");
        assert_eq!(event.event, "change", "{event:?}");
        ids.push(event.id.expect("an id"));
        seen.push((
            event.data["task"].as_str().unwrap_or("").to_owned(),
            event.data["item"]["stage"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        ));
    }
    // Consecutive ids: nothing missing, nothing reordered.
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    let a: Vec<&str> = seen
        .iter()
        .filter(|(t, _)| t == "a")
        .map(|(_, s)| s.as_str())
        .collect();
    assert_eq!(a, ["Pausing", "Paused", "Resuming", "Running"]);
    let b: Vec<&str> = seen
        .iter()
        .filter(|(t, _)| t == "b")
        .map(|(_, s)| s.as_str())
        .collect();
    assert_eq!(b, ["Pausing", "Paused"]);

    let first = only_b.next(WITHIN).await.expect("b's first event");
    let second = only_b.next(WITHIN).await.expect("b's second event");
    assert_eq!(
        (
            first.data["item"]["stage"].as_str(),
            second.data["item"]["stage"].as_str()
        ),
        (Some("Pausing"), Some("Paused"))
    );

    // Resumed after the second event: the four after it, from the third on.
    let mut resumed = SseReader::open(&f.router, "/v1/events", READ, Some(ids[1])).await;
    let event = resumed
        .next(WITHIN)
        .await
        .expect("the resumed stream's first event");
    assert_eq!(event.id, Some(ids[2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_streams_need_a_token_like_every_other_route() {
    use tower::ServiceExt;
    let (f, _, _) = fixture(&["a"], &[], None).await;
    for uri in ["/v1/events", "/v1/tasks/a/events"] {
        for token in [None, Some("guess"), Some(READ)] {
            let mut request = axum::http::Request::builder().method("GET").uri(uri);
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let request = request
                .body(axum::body::Body::empty())
                .expect("a valid request");
            // Only the head is read: an open stream's body never ends.
            let response = tokio::time::timeout(WITHIN, f.router.clone().oneshot(request))
                .await
                .expect("the head of the answer within 10 s")
                .expect("the router is infallible");
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            if token == Some(READ) {
                assert_eq!(response.status(), StatusCode::OK, "GET {uri} with a token");
                assert!(
                    content_type.starts_with("text/event-stream"),
                    "{content_type}"
                );
            } else {
                assert_eq!(
                    response.status(),
                    StatusCode::UNAUTHORIZED,
                    "GET {uri} with {token:?}: an event stream was served without a valid token"
                );
                assert!(
                    !content_type.starts_with("text/event-stream"),
                    "GET {uri} with {token:?}: {content_type}"
                );
            }
        }
    }
}

/// With no token needed (`Auth::open()`), a page of another origin on the
/// operator's machine changes nothing and reads nothing: a command carrying a
/// foreign `Origin` (a fetch, a form) is 403 `cross_origin`, and every route under
/// a rebound name (`Host` not a loopback name) is 403 `forbidden_host`. The server's
/// own page, and clients that are not browsers, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_api_lets_no_page_of_another_origin_command_or_read() {
    use tower::ServiceExt;
    let (f, lives, _) = fixture(&["a"], &[], None).await;
    // Running is published once the run is launched; its code starts a moment later.
    lives[0].reaches(1).await;
    let router = Api::local(&f.tasks).auth(Auth::open()).router();
    let seq = handle(&f, "a").snapshot().seq;
    let own = [("host", "127.0.0.1:8080")];
    /// Method, URI, the request's headers, the status and `error_code` expected.
    type Attack<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u16, &'a str);
    let attacks: &[Attack<'_>] = &[
        (
            "POST",
            "/v1/tasks/a/pause",
            vec![
                ("host", "127.0.0.1:8080"),
                ("origin", "http://evil.example"),
            ],
            403,
            "cross_origin",
        ),
        (
            "POST",
            "/v1/tasks/a/stop?wait=0",
            vec![
                ("host", "localhost:8080"),
                ("origin", "http://localhost:3000"),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            403,
            "cross_origin",
        ),
        (
            "POST",
            "/v1/tasks/a/pause",
            vec![("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            403,
            "cross_origin",
        ),
        (
            "POST",
            "/v1/tasks/a/pause",
            vec![("host", "127.0.0.1:8080"), ("origin", "null")],
            403,
            "cross_origin",
        ),
        (
            "POST",
            "/v1/tasks/a/pause",
            vec![
                ("host", "evil.example:8080"),
                ("origin", "http://evil.example:8080"),
            ],
            403,
            "forbidden_host",
        ),
        (
            "GET",
            "/v1/tasks",
            vec![("host", "evil.example:8080")],
            403,
            "forbidden_host",
        ),
        (
            "GET",
            "/v1/events",
            vec![("host", "evil.example:8080")],
            403,
            "forbidden_host",
        ),
        (
            "GET",
            "/",
            vec![("host", "evil.example:8080")],
            403,
            "forbidden_host",
        ),
    ];
    for (method, uri, headers, status, code) in attacks {
        let mut request = axum::http::Request::builder().method(*method).uri(*uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(axum::body::Body::empty())
            .expect("a valid request");
        let response = tokio::time::timeout(WITHIN, router.clone().oneshot(request))
            .await
            .expect("an answer within 10 s")
            .expect("the router is infallible");
        let got = response.status().as_u16();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("a body")
            .to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(got, *status, "{method} {uri} {headers:?}: {answer}");
        assert_eq!(answer["error_code"], *code, "{method} {uri}: {answer}");
        assert!(
            answer["items"].is_null(),
            "{method} {uri}: a foreign page read the list"
        );
    }
    assert_eq!(
        handle(&f, "a").snapshot().seq,
        seq,
        "an attack changed the task"
    );
    assert_eq!(handle(&f, "a").stage(), Stage::Running);
    assert_eq!(lives[0].now(), 1);

    // The server's own page, and a script that is no browser, are served.
    let (status, answer) = call(&router, "GET", "/v1/tasks", None, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let mut request = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/tasks/a/pause?wait=10s")
        .header("origin", "http://127.0.0.1:8080");
    for (name, value) in own {
        request = request.header(name, value);
    }
    let response = router
        .clone()
        .oneshot(request.body(axum::body::Body::empty()).expect("a request"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK, "the own page's pause");
    assert_eq!(handle(&f, "a").stage(), Stage::Paused);
    assert_eq!(lives[0].now(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_the_ring_gets_a_gap_marker_with_the_count() {
    let (f, _, _) = fixture(&["a"], &[], Some(4)).await;
    for _ in 0..3 {
        for uri in ["/v1/tasks/a/pause", "/v1/tasks/a/resume?wait=10s"] {
            let (status, _) = call(&f.router, "POST", uri, Some(ADMIN), None).await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    // 12 changes pushed (4 a cycle); wait for the last on the hub itself.
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let (_, body) = call(&f.router, "GET", "/v1/tasks", Some(READ), None).await;
        if body["seq"] == 12 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub never reached 12: {body}"
        );
        tokio::task::yield_now().await;
    }
    let mut stream = SseReader::open(&f.router, "/v1/events", READ, Some(0)).await;
    let gap = stream.next(WITHIN).await.expect("a gap");
    assert_eq!(gap.event, "gap", "{gap:?}");
    assert_eq!(gap.data["missed"], 8, "{gap:?}");
    let next = stream.next(WITHIN).await.expect("the oldest kept");
    assert_eq!(next.id, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_is_served_with_its_script_and_style_inlined() {
    let (f, _, _) = fixture(&["a"], &[], None).await;
    for path in ["/", "/ui"] {
        let response = tower::ServiceExt::oneshot(
            f.router.clone(),
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("<script>") && text.contains("v1/events"),
            "{path}: no script"
        );
        assert!(
            !text.contains("/*SCRIPT*/") && !text.contains("/*STYLE*/"),
            "{path}: placeholders left"
        );
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "{path}: loads something from elsewhere"
        );
    }
    assert_eq!(f.tasks.len(), 1);
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("v1".to_owned()),
        Just("tasks".to_owned()),
        Just("a".to_owned()),
        Just("pause".to_owned()),
        Just("resume".to_owned()),
        Just("stop".to_owned()),
        Just("events".to_owned()),
        Just("workers".to_owned()),
        Just("health".to_owned()),
        Just("%ff".to_owned()),
        Just("..".to_owned()),
        Just(String::new()),
        "[a-z0-9%._~-]{1,12}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("?wait=".to_owned()),
        Just("?wait=-1s".to_owned()),
        Just("?wait=99999999999999999999s".to_owned()),
        Just("?wait=1h".to_owned()),
        Just("?stage=%ZZ".to_owned()),
        Just("?limit=100000".to_owned()),
        Just("?since=x".to_owned()),
        "\\?[a-z=&%0-9]{0,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the path, query, body and token: an answer (never a panic), an
    /// error in the JSON shape, and an error changes nothing.
    #[test]
    fn any_request_gets_an_answer_and_an_error_changes_nothing(
        method in prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("DELETE")],
        segments in proptest::collection::vec(segment(), 0..5),
        query in query(),
        body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
        token in prop_oneof![Just(None), Just(Some(ADMIN)), Just(Some(READ)), Just(Some("nope"))],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let (f, _, _) = fixture(&["a"], &["a"], None).await;
            let seq = handle(&f, "a").snapshot().seq;
            let uri = format!("/{}{}", segments.join("/"), query);
            let Ok(uri) = uri.parse::<axum::http::Uri>() else { return Ok(()) };
            // Streams answer 200 and stay open: only their status is read.
            let streaming = uri.path().ends_with("/events") && method == "GET";
            let mut request = axum::http::Request::builder().method(method).uri(uri.clone());
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let request = request.body(body.clone().map_or_else(axum::body::Body::empty, axum::body::Body::from)).expect("request");
            let response = tower::ServiceExt::oneshot(f.router.clone(), request).await.expect("infallible");
            let status = response.status();
            if status.is_client_error() || status.is_server_error() {
                let bytes = http_body_util::BodyExt::collect(response.into_body()).await.expect("body").to_bytes();
                let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                prop_assert!(answer["error_code"].is_string(), "{method} {uri}: {status} {answer}");
                prop_assert!(answer["error_msg"].is_string(), "{method} {uri}: {status} {answer}");
                prop_assert_eq!(handle(&f, "a").snapshot().seq, seq, "{} {}: an error changed the task", method, uri);
            } else if !streaming {
                drop(response);
            }
            Ok(())
        })?;
    }
}

/// A unit that reports the progress it is told to, then waits to be cancelled.
struct Reporter(tokio::sync::watch::Receiver<u64>);

impl taskstage::Unit for Reporter {
    async fn run(
        &mut self,
        ctx: taskstage::RunContext,
    ) -> Result<taskstage::RunExit, taskstage::RunError> {
        // Ends when cancelled; each told value is reported once.
        loop {
            let done = *self.0.borrow_and_update();
            ctx.report_progress(done, Some(100));
            tokio::select! {
                () = ctx.cancelled() => return Ok(taskstage::RunExit::Cancelled),
                changed = self.0.changed() => {
                    if changed.is_err() {
                        ctx.cancelled().await;
                        return Ok(taskstage::RunExit::Cancelled);
                    }
                }
            }
        }
    }
}

/// The item of task `name` in a fresh `GET /v1/tasks`.
async fn listed(router: &Router, name: &str) -> Value {
    let (status, list) = call(router, "GET", "/v1/tasks?limit=10000", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["id"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

/// The list is served from a listing built once per change, and is as true as a
/// read of every task: a stage a command returned, and a progress a unit reported,
/// are in the next listing once they are observed, however many listings were
/// served before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_in_the_next_listing_once_observed() {
    let names: Vec<String> = (0..200).map(|i| format!("t{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (f, _lives, _hold) = fixture(&refs, &[], None).await;
    let (tell, told) = tokio::sync::watch::channel(0u64);
    let reporter = Task::builder("reporter")
        .unit(Reporter(told))
        .spawn()
        .expect("spawned");
    reporter
        .wait_for(|s| s.stage == Stage::Running && s.progress.done == 0)
        .await;
    f.tasks.add(&reporter).expect("a name of its own");

    for round in 0..20usize {
        let name = &names[round * 7 % names.len()];
        let task = handle(&f, name);
        assert_eq!(listed(&f.router, name).await["stage"], "Running");
        // Through the handle: the listing served before must not be served again.
        assert_eq!(task.pause().await, Ok(Stage::Paused));
        assert_eq!(
            listed(&f.router, name).await["stage"],
            "Paused",
            "round {round}"
        );
        // Through the API: its 200 and the next listing agree.
        let uri = format!("/v1/tasks/{name}/resume?wait=10s");
        let (status, answer) = call(&f.router, "POST", &uri, Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["stage"], "Running");
        assert_eq!(
            listed(&f.router, name).await["stage"],
            "Running",
            "round {round}"
        );

        // A progress report moves no stage and no change counter.
        let done = round as u64 + 1;
        tell.send_replace(done);
        tokio::time::timeout(WITHIN, reporter.wait_for(|s| s.progress.done == done))
            .await
            .expect("the unit reports");
        let item = listed(&f.router, "reporter").await;
        assert_eq!(item["progress"]["done"], done, "round {round}: {item}");
    }
    assert_eq!(
        reporter.stop_within(WITHIN).await,
        Ok(Stage::Stopped),
        "the reporter stops"
    );
}

/// A stage a command returned is in the next listing even while its event has not
/// reached the API: the listing cache is keyed on each task's change counter, not
/// on what the API's follower of the events wrote. The follower is spawned on a
/// runtime that never runs, so no event ever reaches the API here.
#[test]
fn a_stage_a_command_returned_is_listed_before_its_event_reaches_the_api() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Never driven: the task spawned on it (the API's follower of the events)
    // never runs.
    let idle = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a second runtime");
    runtime.block_on(async {
        let live = Live::default();
        let handle = Task::builder("orders")
            .unit(Probe {
                live: live.clone(),
                hold: None,
            })
            .spawn()
            .expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Running).await;
        let tasks = LocalTasks::new();
        {
            let _follower_runs_there = idle.enter();
            tasks.add(&handle).expect("a name of its own");
        }
        let router = Api::local(&tasks).auth(auth()).router();
        for round in 0..3 {
            assert_eq!(listed(&router, "orders").await["stage"], "Running");
            assert_eq!(handle.pause().await, Ok(Stage::Paused));
            assert_eq!(live.now(), 0, "round {round}: Paused with a run alive");
            assert_eq!(
                listed(&router, "orders").await["stage"],
                "Paused",
                "round {round}: the listing served before was served again"
            );
            assert_eq!(handle.resume().await, Ok(()));
            tokio::time::timeout(WITHIN, handle.wait_for_stage(|s| s == Stage::Running))
                .await
                .expect("running again");
        }
        assert_eq!(handle.stop_within(WITHIN).await, Ok(Stage::Stopped));
    });
}

/// Sends `GET uri` with the given `authorization` value, and answers the status
/// and the headers of the answer (its body is not read).
async fn head_of(
    router: &Router,
    uri: &str,
    authorization: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap) {
    use tower::ServiceExt;
    let mut request = axum::http::Request::builder().method("GET").uri(uri);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let request = request
        .body(axum::body::Body::empty())
        .expect("a valid request");
    let response = tokio::time::timeout(WITHIN, router.clone().oneshot(request))
        .await
        .expect("the head of the answer within 10 s")
        .expect("the router is infallible");
    (response.status(), response.headers().clone())
}

/// The auth-scheme of `Authorization` is matched without regard to case (RFC 9110
/// section 11.1, as RFC 7235 before it): `bearer`, `BEARER` and `Bearer` carry the
/// same token; another scheme, or a token alone, is refused.
#[tokio::test]
async fn the_bearer_scheme_is_matched_without_regard_to_case() {
    let (f, _, _) = fixture(&["a"], &[], None).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let (status, _) = head_of(&f.router, "/v1/tasks", Some(&format!("{scheme} {READ}"))).await;
        assert_eq!(status, StatusCode::OK, "scheme {scheme:?} was refused");
    }
    for value in [
        format!("Basic {READ}"),
        READ.to_owned(),
        format!("Bearer{READ}"),
        format!("Bearerx {READ}"),
    ] {
        let (status, _) = head_of(&f.router, "/v1/tasks", Some(&value)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{value:?} was taken");
    }
}

/// Every answer, the page's, the API's, an error's and an unknown route's, tells
/// the browser not to frame it and not to guess its type: no page of another origin
/// can put the status page under a click it does not show.
#[tokio::test]
async fn every_answer_forbids_framing_and_type_guessing() {
    let (f, _, _) = fixture(&["a"], &[], None).await;
    let admin = format!("Bearer {ADMIN}");
    for (uri, authorization) in [
        ("/ui", None),
        ("/", None),
        ("/v1/health", None),
        ("/v1/tasks", Some(admin.as_str())),
        ("/v1/tasks", None),
        ("/v1/no-such-route", None),
    ] {
        let (status, headers) = head_of(&f.router, uri, authorization).await;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(
            header("x-frame-options").as_deref(),
            Some("DENY"),
            "GET {uri} ({status})"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "GET {uri} ({status})"
        );
        let policy = header("content-security-policy").unwrap_or_default();
        assert!(
            policy.contains("frame-ancestors 'none'"),
            "GET {uri} ({status}): content-security-policy {policy:?}"
        );
    }
}

/// The API names a task by its name, so a second task of a served name is refused,
/// with the name, and changes nothing: the first stays the one every route reaches.
/// Before, both were listed, the page showed one, and the second was out of reach.
/// Once the first has ended and is removed, the name can be served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_task_of_a_served_name_is_refused_and_changes_nothing() {
    let spawn = |live: &Live| {
        Task::builder("orders")
            .unit(Probe {
                live: live.clone(),
                hold: None,
            })
            .spawn_paused()
            .expect("spawned")
    };
    let live = Live::default();
    let (first, second) = (spawn(&live), spawn(&live));
    let tasks = LocalTasks::new();
    tasks.add(&first).expect("the first of its name");
    let refused = tasks.add(&second).expect_err("a second task named orders");
    assert_eq!(refused.name, "orders");
    assert!(refused.to_string().contains("orders"), "{refused}");
    assert_eq!(tasks.len(), 1, "the refused task was served");
    let router = Api::local(&tasks).auth(auth()).router();
    let (status, body) = call(&router, "GET", "/v1/tasks", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["items"].as_array().map(Vec::len), Some(1), "{body}");
    let (status, body) = call(
        &router,
        "POST",
        "/v1/tasks/orders/resume",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        first.stage(),
        Stage::Running,
        "the route reached another task"
    );
    assert_eq!(second.stage(), Stage::New, "the refused task was commanded");

    let mut group = TaskGroup::new();
    group.add(spawn(&live));
    group.add(spawn(&live));
    let refused = LocalTasks::from_group(&group).expect_err("a group with one name twice");
    assert_eq!(refused.name, "orders");

    assert_eq!(first.stop().await.expect("stopped"), Stage::Stopped);
    assert_eq!(tasks.remove_ended(), 1);
    tasks
        .add(&second)
        .expect("the name is free once its task is removed");
    assert_eq!(tasks.len(), 1);
    second.stop().await.expect("stopped");
}

/// The list counts every task by stage whatever the filter, finds tasks by a part of
/// their name without regard to case, and marks the ones an operator paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_counts_by_stage_finds_by_name_and_marks_an_operators_pause() {
    let (f, _lives, _) = fixture(&["orders-eu", "Orders-US", "billing"], &[], None).await;
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/tasks/Orders-US/pause?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body) = call(&f.router, "GET", "/v1/tasks?q=ORDERS", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["total"], 2, "{body}");
    let ids: Vec<&str> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(ids, ["orders-eu", "Orders-US"], "{body}");
    // The counts are of every task, not of the page or the filter.
    assert_eq!(body["counts"]["Running"], 2, "{body}");
    assert_eq!(body["counts"]["Paused"], 1, "{body}");
    assert_eq!(body["counts"]["none"], 0, "{body}");

    let (_, body) = call(
        &f.router,
        "GET",
        "/v1/tasks?q=us&stage=Paused",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(body["total"], 1, "{body}");
    assert_eq!(body["items"][0]["id"], "Orders-US", "{body}");
    assert_eq!(body["items"][0]["user_paused"], true, "{body}");
    let (_, body) = call(&f.router, "GET", "/v1/tasks?q=bill", Some(READ), None).await;
    assert_eq!(body["items"][0]["user_paused"], false, "{body}");
    let (_, body) = call(&f.router, "GET", "/v1/tasks?q=nothing", Some(READ), None).await;
    assert_eq!(body["total"], 0, "{body}");
    assert_eq!(body["counts"]["Running"], 2, "{body}");
}

/// One pause of many tasks under one deadline: each task the answer names as
/// reached has no run alive; a task whose run holds on past the deadline is named
/// as settling (202); a task that refuses is named with its error and is left as
/// it was; bad requests are refused whole and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_pause_answers_for_each_task_under_one_deadline() {
    let (f, lives, hold) = fixture(&["a", "b", "held"], &["held"], None).await;
    for live in &lives {
        live.reaches(1).await;
    }
    // Nothing selected is a bad request, and so is a form's body.
    let (status, body) = call(&f.router, "POST", "/v1/bulk/pause", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["command"], "pause", "{body}");
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/bulk/halt?all=true",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/bulk/pause?all=true",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    for h in f.group.tasks() {
        assert_eq!(
            h.stage(),
            Stage::Running,
            "{}: a refused bulk changed it",
            h.name()
        );
    }

    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/bulk/pause?stage=Running&wait=300ms",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["selected"], 3, "{body}");
    let named = |list: &str| -> Vec<String> {
        body[list]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|e| e["id"].as_str().map(str::to_owned))
            .collect()
    };
    let mut reached = named("reached");
    reached.sort();
    assert_eq!(reached, ["a", "b"], "{body}");
    assert_eq!(named("settling"), ["held"], "{body}");
    assert_eq!(body["settling"][0]["stage"], "Pausing", "{body}");
    assert_eq!(lives[0].now(), 0, "a reached Paused with a's run alive");
    assert_eq!(lives[1].now(), 0, "a reached Paused with b's run alive");
    assert_eq!(
        lives[2].now(),
        1,
        "the held run is alive, as its settling says"
    );
    hold.add_permits(1);
    lives[2].reaches(0).await;

    // By ids: a resume of two paused tasks and one unknown name.
    let ids = br#"{"ids": ["a", "b", "nope"]}"#.to_vec();
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/bulk/resume?wait=10s",
        Some(ADMIN),
        Some(ids),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["reached"].as_array().map(Vec::len), Some(2), "{body}");
    assert_eq!(body["refused"][0]["id"], "nope", "{body}");
    assert_eq!(body["refused"][0]["error_code"], "unknown_task", "{body}");
    lives[0].reaches(1).await;
    lives[1].reaches(1).await;
    // A resume of a task already running is refused for it alone.
    let (status, body) = call(
        &f.router,
        "POST",
        "/v1/bulk/resume?q=a&wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["refused"][0]["id"], "a", "{body}");
    assert_eq!(body["refused"][0]["stage"], "Running", "{body}");
    assert_eq!(handle(&f, "a").stage(), Stage::Running);
}

/// Every event stream of a router ends when the token given to
/// `Api::end_streams_on` is cancelled, and one opened after it ends at once: a
/// server's graceful shutdown then ends with streams open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_end_when_the_api_is_shut_down() {
    let (f, _lives, _) = fixture(&["orders"], &[], None).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let router = Api::local(&f.tasks)
        .auth(auth())
        .end_streams_on(shutdown.clone())
        .router();
    let mut all = SseReader::open(&router, "/v1/events", READ, None).await;
    let mut one = SseReader::open(&router, "/v1/tasks/orders/events", READ, None).await;
    assert!(
        !all.ends_within(Duration::from_millis(200)).await,
        "a stream ended before the shutdown"
    );
    shutdown.cancel();
    assert!(
        all.ends_within(WITHIN).await,
        "the stream of every task did not end"
    );
    assert!(one.ends_within(WITHIN).await, "a task's stream did not end");
    let mut late = SseReader::open(&router, "/v1/events", READ, None).await;
    assert!(
        late.ends_within(WITHIN).await,
        "a stream opened after the shutdown"
    );
    // Without the token, a stream stays open.
    let mut kept = SseReader::open(&f.router, "/v1/events", READ, None).await;
    assert!(!kept.ends_within(Duration::from_millis(200)).await);
}

/// With a policy shown, three kinds of Paused read apart: one the policy retries
/// (when, at which step), one blocked until a person acts, one an operator paused;
/// a task the policy does not watch says so with `null`, a change of the policy
/// alone reaches the next list, a change event's item leaves the standing to the
/// list, and a task's detail carries its recent events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policys_standing_and_a_tasks_recent_events_are_served() {
    use taskstage::policy::{AutoResume, BackoffSettings, Standing};
    let settings = BackoffSettings::new(Duration::from_secs(60), Duration::from_secs(120), 2.0)
        .expect("valid settings");
    let policy = AutoResume::new(settings, |e: &taskstage::RunError| {
        e.to_string().contains("transient")
    });
    let _driver = tokio::spawn(policy.run());
    let tasks = LocalTasks::new();
    let mut group = TaskGroup::new();
    let mut keys = std::collections::HashMap::new();
    for (name, unit) in [
        ("flaky", "transient: timed out"),
        ("broken", "schema error"),
    ] {
        let handle = Task::builder(name)
            .unit(Fails(unit))
            .spawn()
            .expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Paused).await;
        keys.insert(name, policy.add(&handle));
        tasks.add(&handle).expect("a name of its own");
        group.add(handle);
    }
    for name in ["operated", "unwatched"] {
        let probe = Probe {
            live: Live::default(),
            hold: None,
        };
        let handle = Task::builder(name).unit(probe).spawn().expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Running).await;
        if name == "operated" {
            keys.insert(name, policy.add(&handle));
        }
        tasks.add(&handle).expect("a name of its own");
        group.add(handle);
    }
    tasks.show_policy(&policy);
    let router = Api::local(&tasks).auth(auth()).router();
    let mut stream = SseReader::open(&router, "/v1/tasks/operated/events", READ, None).await;
    let (status, body) = call(
        &router,
        "POST",
        "/v1/tasks/operated/pause?wait=10s",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let standing_of = |name: &'static str, want: fn(&Standing) -> bool| {
        let policy = policy.clone();
        let key = keys[name];
        async move {
            tokio::time::timeout(
                WITHIN,
                policy.wait_for(key, |s| s.is_some_and(|s| want(&s.standing))),
            )
            .await
            .unwrap_or_else(|_| panic!("{name}'s standing within 10 s"))
        }
    };
    standing_of("flaky", |s| matches!(s, Standing::BackingOff { .. })).await;
    standing_of("broken", |s| matches!(s, Standing::NotResumable { .. })).await;
    standing_of("operated", |s| *s == Standing::UserPaused).await;

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64;
    let (status, body) = call(&router, "GET", "/v1/tasks", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let item = |name: &str| {
        body["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["id"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} listed: {body}"))
    };
    let flaky = item("flaky");
    assert_eq!(flaky["policy"]["standing"], "backing_off", "{flaky}");
    assert_eq!(flaky["policy"]["step"], 0, "{flaky}");
    assert_eq!(flaky["policy"]["auto_resumes"], 0, "{flaky}");
    // Equal jitter: between half the first delay and the whole of it from now.
    let due = flaky["policy"]["due"].as_u64().expect("a due time");
    assert!(
        due >= now + 25_000 && due <= now + 61_000,
        "due {due} at {now}: {flaky}"
    );
    let broken = item("broken");
    assert_eq!(broken["policy"]["standing"], "blocked", "{broken}");
    assert_eq!(broken["policy"]["due"], Value::Null, "{broken}");
    let since = broken["policy"]["since"].as_u64().expect("blocked since");
    assert!(since <= now + 1_000 && since + 60_000 > now, "{broken}");
    assert_eq!(item("operated")["policy"]["standing"], "user_paused");
    assert_eq!(item("unwatched")["policy"], Value::Null);

    // The policy alone changed (no task did): the next list shows it.
    drop(policy.remove(keys["broken"]));
    let (_, body) = call(&router, "GET", "/v1/tasks?q=broken", Some(READ), None).await;
    assert_eq!(body["items"][0]["policy"], Value::Null, "{body}");

    let event = stream.next(WITHIN).await.expect("the pause's first event");
    assert_eq!(event.data["item"]["stage"], "Pausing", "{event:?}");
    assert!(event.data["item"].get("policy").is_none(), "{event:?}");

    let (status, detail) = call(&router, "GET", "/v1/tasks/operated", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["policy"]["standing"], "user_paused", "{detail}");
    let stages: Vec<&str> = detail["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["data"]["item"]["stage"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(stages, ["Pausing", "Paused"], "{detail}");
    let seqs: Vec<u64> = detail["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {detail}"
    );
    let (_, detail) = call(&router, "GET", "/v1/tasks/flaky", Some(READ), None).await;
    assert_eq!(detail["policy"]["standing"], "backing_off", "{detail}");
    assert_eq!(detail["events"], serde_json::json!([]), "{detail}");
}

/// `GET /v1/events?task=…` carries the changes of the tasks named, in order, and
/// no other's; a name is any text (a comma in it included); over 1,000 names, or
/// an unknown parameter, is a 400 in the error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_some_tasks_carries_theirs_only() {
    let (f, _, _) = fixture(&["a", "b", "c,d"], &[], None).await;
    let mut some = SseReader::open(&f.router, "/v1/events?task=a&task=c%2Cd", READ, None).await;
    for uri in [
        "/v1/tasks/a/pause",
        "/v1/tasks/b/pause",
        "/v1/tasks/c%2Cd/pause",
        "/v1/tasks/a/resume?wait=10s",
        "/v1/tasks/b/resume?wait=10s",
    ] {
        let (status, body) = call(&f.router, "POST", uri, Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    }
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let event = some.next(WITHIN).await.expect("an event within 10 s");
        seen.push(format!(
            "{}:{}",
            event.data["task"].as_str().unwrap_or(""),
            event.data["item"]["stage"].as_str().unwrap_or("")
        ));
    }
    assert_eq!(
        seen,
        [
            "a:Pausing",
            "a:Paused",
            "c,d:Pausing",
            "c,d:Paused",
            "a:Resuming",
            "a:Running"
        ]
    );
    // b's resume came last: had it been carried, it would be next.
    let (status, body) = call(&f.router, "POST", "/v1/tasks/a/pause", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let next = some.next(WITHIN).await.expect("a's next change");
    assert_eq!(next.data["task"], "a", "{next:?}");

    let many: Vec<String> = (0..1001).map(|i| format!("task=t{i}")).collect();
    let uri = format!("/v1/events?{}", many.join("&"));
    let (status, body) = call(&f.router, "GET", &uri, Some(READ), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error_msg"]
            .as_str()
            .unwrap_or("")
            .contains("at most 1000 tasks"),
        "{body}"
    );
    let (status, body) = call(
        &f.router,
        "GET",
        "/v1/events?since=1&since=2",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = call(
        &f.router,
        "GET",
        "/v1/tasks/a/events?task=b",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
