//! The status page in a real browser: headless Chromium driven over WebDriver.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`, `chromium-driver`;
//! `scripts/browser-setup.sh` installs them). Without them the test prints why and
//! passes, except under `CI=true`, where it fails.

use taskstage_harness::http as http_common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use http_common::{Live, Probe};
use taskstage::{Stage, Task, TaskGroup};
use taskstage_http::{Api, Auth, LocalTasks};

const WITHIN: Duration = Duration::from_secs(20);

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// The chromedriver process (its own process group, with the browsers it starts),
/// killed by its group id when dropped: on success and on failure alike.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

async fn start_driver(chromedriver: &PathBuf) -> Driver {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver { child, port };
    // Ready once it accepts a connection: wait on that, with a deadline.
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return driver;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chromedriver did not listen on {port} within {WITHIN:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Chromium and chromedriver, or `None` (and a line saying so) when either is
/// missing; under `CI=true` a missing one fails the test.
fn browser_tools() -> Option<(PathBuf, PathBuf)> {
    let (Some(chromium), Some(chromedriver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium or chromedriver is missing (run scripts/browser-setup.sh); under CI=true this fails"
        );
        println!("skipped: chromium or chromedriver is missing (run scripts/browser-setup.sh)");
        return None;
    };
    Some((chromium, chromedriver))
}

/// A headless browser session, with `extra` arguments for Chromium.
async fn session(
    chromium: &PathBuf,
    chromedriver: &PathBuf,
    extra: &[&str],
) -> (Driver, fantoccini::Client) {
    let driver = start_driver(chromedriver).await;
    let mut args = vec![
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1100,420",
    ];
    args.extend_from_slice(extra);
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": chromium, "args": args }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session");
    (driver, client)
}

/// Waits until the page's title starts with `done`, and returns it.
async fn title_when_done(client: &fantoccini::Client) -> String {
    let deadline = tokio::time::Instant::now() + WITHIN;
    // Bounded by the deadline.
    loop {
        let title = client.title().await.unwrap_or_default();
        if title.starts_with("done") {
            return title;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page never finished; its title: {title:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The page of another origin, served beside an open API at `api`: it pauses,
/// stops (one task, and every task in bulk) and creates through `fetch` (no-cors, no preflight) and through a form
/// posted into a frame, tries to read the list, then writes what it saw into its
/// title.
fn attacker_page(api: &str) -> String {
    format!(
        r#"<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" target="sink" action="http://{api}/v1/tasks">
<input name="id" value="formed"></form>
<script>
const api = "http://{api}";
const seen = [];
const blind = (path, init) => fetch(api + path, Object.assign({{method: "POST", mode: "no-cors"}}, init))
  .then(() => seen.push("sent " + path), e => seen.push("failed " + path));
const framed = new Promise(done => {{ document.querySelector("iframe").onload = done; }});
Promise.all([
  blind("/v1/tasks/victim/pause?wait=0"),
  blind("/v1/tasks/victim/stop?wait=0"),
  blind("/v1/bulk/pause?all=true&wait=0"),
  blind("/v1/bulk/stop?all=true&wait=0"),
  blind("/v1/tasks", {{headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{id: "fetched"}})}}),
  fetch(api + "/v1/tasks").then(r => r.text()).then(t => seen.push("READ " + t), e => seen.push("unreadable")),
  framed,
  Promise.resolve().then(() => document.getElementById("f").submit()),
]).then(() => {{ document.title = "done " + seen.join(" | "); }});
</script></body></html>"#
    )
}

/// Under `Auth::open()` (no token), what a browser on the operator's machine can
/// be made to do by a page: a page of another origin sends commands (fetches and a
/// form, which a browser sends across origins without asking) and reads, and a page
/// whose own name was rebound to 127.0.0.1 (Chromium's resolver rules) reads and
/// commands as its own origin. Nothing changes and nothing is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_origin_changes_and_reads_nothing_on_an_open_server() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };
    let live = Live::default();
    let victim = Task::builder("victim")
        .unit(Probe {
            live: live.clone(),
            hold: None,
        })
        .spawn()
        .expect("spawned");
    victim.wait_for_stage(|s| s == Stage::Running).await;
    let seq = victim.snapshot().seq;
    let tasks = LocalTasks::new();
    tasks.add(&victim).expect("a name of its own");
    let router = Api::local(&tasks).auth(Auth::open()).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let api = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let page = attacker_page(&api.to_string());
    let evil = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    let evil_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let evil_addr = evil_listener.local_addr().expect("its address");
    let evil_server = tokio::spawn(async move { axum::serve(evil_listener, evil).await });

    let rule = "--host-resolver-rules=MAP rebound.test 127.0.0.1";
    let (driver, client) = session(&chromium, &chromedriver, &[rule]).await;

    // Another origin (another port of 127.0.0.1).
    client
        .goto(&format!("http://{evil_addr}/"))
        .await
        .expect("the page loads");
    let title = title_when_done(&client).await;
    assert!(
        !title.contains("READ"),
        "a page of another origin read the API: {title}"
    );

    // A rebound name: the browser takes the API for the page's own origin.
    client
        .goto(&format!("http://rebound.test:{}/ui", api.port()))
        .await
        .expect("the page loads");
    let seen = client
        .execute(
            r#"const out = [];
            return Promise.all([
              fetch("/v1/tasks").then(r => r.text().then(t => out.push(r.status + " " + t))),
              fetch("/v1/tasks/victim/pause?wait=0", {method: "POST"}).then(r => out.push("pause " + r.status)),
            ]).then(() => out.join(" | "), e => String(e));"#,
            vec![],
        )
        .await
        .expect("the script runs");
    let seen = seen.as_str().unwrap_or_default().to_owned();
    assert!(
        seen.contains("403") && !seen.contains("victim\"") && seen.contains("pause 403"),
        "under a rebound name: {seen}"
    );

    assert_eq!(
        victim.snapshot().seq,
        seq,
        "a page changed the task ({title}; {seen})"
    );
    assert_eq!(victim.stage(), Stage::Running);
    assert_eq!(live.now(), 1);
    assert_eq!(tasks.len(), 1, "a page created a task");
    client.close().await.expect("the session closes");
    drop(driver);
    server.abort();
    evil_server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_commands_and_follows_the_tasks_live() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };

    // Three tasks; beta ignores its cancellation until released, so that its
    // Pausing can be seen.
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let mut group = TaskGroup::new();
    let mut lives = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let live = Live::default();
        let probe = Probe {
            live: live.clone(),
            hold: (name == "beta").then(|| Arc::clone(&hold)),
        };
        let handle = Task::builder(name).unit(probe).spawn().expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Running).await;
        group.add(handle);
        lives.push(live);
    }
    let tasks = LocalTasks::from_group(&group).expect("one task per name");
    let router = Api::local(&tasks)
        .auth(
            Auth::tokens()
                .admin("admin-secret")
                .read_only("read-secret"),
        )
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let (driver, client) = session(&chromium, &chromedriver, &[]).await;
    let wait_for = |css: String| {
        let client = client.clone();
        async move {
            let found = client
                .wait()
                .at_most(WITHIN)
                .every(Duration::from_millis(20))
                .for_element(Locator::Css(&css))
                .await;
            match found {
                Ok(element) => element,
                Err(e) => {
                    let probe = client
                        .execute(
                            "return fetch('v1/auth', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('taskstage-token')}}).then(r => r.status + ' ' + location.href).catch(e => String(e))",
                            vec![],
                        )
                        .await;
                    let source = client.source().await.unwrap_or_default();
                    panic!("{css} never appeared ({e}); a fetch from the page: {probe:?}; the page:\n{source}")
                }
            }
        }
    };

    // The page lists the tasks.
    client
        .goto(&format!("http://{addr}/ui#token=admin-secret"))
        .await
        .expect("the page loads");
    for name in ["alpha", "beta", "gamma"] {
        wait_for(format!("tr[data-id='{name}'] span.Running")).await;
    }
    wait_for("#live:not(.off)".into()).await;

    // A click on Pause shows Pausing while the run is alive, then Paused once it
    // returned, and the unit confirms it.
    let pause = wait_for("tr[data-id='beta'] button[data-cmd='pause']".into()).await;
    pause.click().await.expect("a click");
    wait_for("tr[data-id='beta'] span.Pausing".into()).await;
    assert_eq!(
        lives[1].now(),
        1,
        "beta's run is alive while the page shows Pausing"
    );
    let shot = client.screenshot().await.expect("a screenshot");
    if std::env::var_os("SAVE_SCREENSHOT").is_some() {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/http-status-page.png");
        std::fs::write(&path, &shot).expect("the screenshot saved");
    }
    hold.add_permits(1);
    wait_for("tr[data-id='beta'] span.Paused".into()).await;
    assert_eq!(
        lives[1].now(),
        0,
        "the page shows Paused: the run has returned"
    );

    // A change made elsewhere appears without a reload.
    let gamma = group
        .tasks()
        .iter()
        .find(|h| h.name() == "gamma")
        .expect("gamma");
    assert_eq!(gamma.pause().await.ok(), Some(Stage::Paused));
    wait_for("tr[data-id='gamma'] span.Paused".into()).await;

    // A read-only token sees no button that works.
    client.goto("about:blank").await.expect("a blank page");
    client
        .goto(&format!("http://{addr}/ui#token=read-secret"))
        .await
        .expect("the page loads");
    if client
        .wait()
        .at_most(WITHIN)
        .for_element(Locator::Css("tr[data-id='alpha'] span.Running"))
        .await
        .is_err()
    {
        let source = client.source().await.unwrap_or_default();
        panic!("the read-only page never listed alpha Running:\n{source}");
    }
    let buttons = client
        .find_all(Locator::Css("td.cmds button"))
        .await
        .expect("the buttons");
    assert_eq!(buttons.len(), 9, "three buttons a task");
    for button in &buttons {
        assert!(
            !button.is_enabled().await.expect("enabled?"),
            "a read-only token has a working button"
        );
    }
    let scope = client
        .find(Locator::Css("#scope"))
        .await
        .expect("the scope")
        .text()
        .await
        .expect("its text");
    assert_eq!(scope, "scope: read");
    assert_eq!(group.tasks()[0].stage(), Stage::Running, "alpha untouched");

    client.close().await.expect("the session closes");
    drop(driver);
    server.abort();
}

/// A name that holds a right-to-left override (or any character that changes how
/// the text around it is shown, or is not shown) is written out on the page, not
/// obeyed: `ev\u{202E}lave` would otherwise show as another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_direction_controls_shows_them_instead_of_obeying_them() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };
    let name = "ev\u{202E}lave\u{200B}";
    let spoof = Task::builder(name)
        .unit(Probe {
            live: Live::default(),
            hold: None,
        })
        .spawn_paused()
        .expect("spawned");
    let tasks = LocalTasks::new();
    tasks.add(&spoof).expect("a name of its own");
    let router = Api::local(&tasks)
        .auth(Auth::tokens().admin("admin-secret"))
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let (driver, client) = session(&chromium, &chromedriver, &[]).await;
    client
        .goto(&format!("http://{addr}/ui#token=admin-secret"))
        .await
        .expect("the page loads");
    let cell = client
        .wait()
        .at_most(WITHIN)
        .every(Duration::from_millis(20))
        .for_element(Locator::Css("tr[data-id] td"))
        .await
        .expect("the task's row");
    let shown = cell.text().await.expect("its text");
    assert_eq!(
        shown, "ev\\u{202E}lave\\u{200B}",
        "the name is not written out as it is: {shown:?}"
    );
    client.close().await.expect("the session closes");
    drop(driver);
    server.abort();
    drop(spoof);
}

/// A check of the rows a page shows, by their task ids.
type RowCheck = Box<dyn Fn(&[String]) -> bool + Send + Sync>;

/// The console an operator works in: the view's filter in the URL, the count of
/// every stage equal to the API's, a task found by a part of its name within a
/// second, a bulk pause of a stage answered within its deadline with the tasks still
/// settling named (and the units agree), and buttons that follow the stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_counts_finds_by_name_and_pauses_a_stage_in_bulk() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let held = ["job-03", "job-17"];
    let mut group = TaskGroup::new();
    let mut lives = Vec::new();
    for i in 0..30 {
        let name = format!("job-{i:02}");
        let live = Live::default();
        let probe = Probe {
            live: live.clone(),
            hold: held.contains(&name.as_str()).then(|| Arc::clone(&hold)),
        };
        let handle = Task::builder(name.as_str())
            .unit(probe)
            .spawn()
            .expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Running).await;
        group.add(handle);
        lives.push((name, live));
    }
    for (_, live) in &lives {
        live.reaches(1).await;
    }
    let tasks = LocalTasks::from_group(&group).expect("one task per name");
    let router = Api::local(&tasks)
        .auth(Auth::tokens().admin("admin-secret"))
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let served = router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, served).await });

    let (driver, client) = session(&chromium, &chromedriver, &[]).await;
    let rows =
        || async {
            client
            .execute(
                "return Array.from(document.querySelectorAll('#rows tr')).map(r => r.dataset.id)",
                vec![],
            )
            .await
            .expect("the rows")
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect::<Vec<_>>())
            .unwrap_or_default()
        };
    let until = |what: &'static str, check: RowCheck| {
        let rows = &rows;
        async move {
            let deadline = tokio::time::Instant::now() + WITHIN;
            // Bounded by the deadline.
            loop {
                let now = rows().await;
                if check(&now) {
                    return now;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: the page shows {now:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // The view comes from the URL, and the token leaves it.
    client
        .goto(&format!(
            "http://{addr}/ui#token=admin-secret&stage=Running"
        ))
        .await
        .expect("the page loads");
    until("30 Running tasks listed", Box::new(|r| r.len() == 30)).await;
    let url = client.current_url().await.expect("the URL");
    assert_eq!(url.fragment(), Some("stage=Running"), "{url}");

    // Every stage's count is the API's.
    let (_, listed) =
        http_common::call(&router, "GET", "/v1/tasks", Some("admin-secret"), None).await;
    let shown = client
        .execute(
            "return Object.fromEntries(Array.from(document.querySelectorAll('#stages a')).map(a => [a.dataset.stage || 'all', (a.querySelector('.count') || {}).textContent]))",
            vec![],
        )
        .await
        .expect("the counts");
    for stage in Stage::ALL {
        let api = listed["counts"][stage.name()].as_u64().expect("a count");
        assert_eq!(
            shown[stage.name()].as_str(),
            Some(format!("({api})").as_str()),
            "{stage:?}: the page {shown} against the API {}",
            listed["counts"]
        );
    }
    assert_eq!(shown["all"].as_str(), Some("(30)"), "{shown}");

    // A task found by a part of its name, whatever the case, within a second.
    let search = client
        .find(Locator::Css("#search"))
        .await
        .expect("the search box");
    let typed = std::time::Instant::now();
    search.send_keys("JOB-2").await.expect("typed");
    let found = until(
        "the tasks named job-2…",
        Box::new(|r| r.len() == 10 && r.iter().all(|id| id.starts_with("job-2"))),
    )
    .await;
    let took = typed.elapsed();
    assert!(took < Duration::from_secs(1), "found {found:?} in {took:?}");
    let url = client.current_url().await.expect("the URL");
    assert_eq!(url.fragment(), Some("stage=Running&q=JOB-2"), "{url}");
    search.clear().await.expect("cleared");
    client
        .execute(
            "document.getElementById('search').dispatchEvent(new Event('input'))",
            vec![],
        )
        .await
        .expect("an input event");
    until("every Running task again", Box::new(|r| r.len() == 30)).await;

    // A bulk pause of the Running stage: answered within its 5 s deadline, with the
    // two held tasks named as still settling; every task reported reached has no
    // run alive, the held ones still have theirs.
    let asked = std::time::Instant::now();
    client
        .find(Locator::Css("#bulk-pause"))
        .await
        .expect("the bulk pause")
        .click()
        .await
        .expect("a click");
    let deadline = tokio::time::Instant::now() + WITHIN;
    let report = loop {
        let text = client
            .find(Locator::Css("#bulk-report"))
            .await
            .expect("the report")
            .text()
            .await
            .unwrap_or_default();
        if text.contains("reached") {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no report: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let answered = asked.elapsed();
    assert!(
        answered < Duration::from_secs(8),
        "answered in {answered:?}"
    );
    assert!(
        report.starts_with("pause: 28 of 30 reached; still settling: "),
        "{report}"
    );
    for name in held {
        assert!(report.contains(name), "{name} not named: {report}");
    }
    for (name, live) in &lives {
        let alive = live.now();
        if held.contains(&name.as_str()) {
            assert_eq!(alive, 1, "{name}: named settling, its run is alive");
        } else {
            assert_eq!(alive, 0, "{name}: reached Paused with its run alive");
        }
    }
    // The view keeps only what is in its filter: the paused tasks left it.
    until(
        "only the held tasks in the Running view",
        Box::new(move |r| r.iter().all(|id| held.contains(&id.as_str()))),
    )
    .await;
    hold.add_permits(2);

    // Buttons follow the stage: a Paused task can be resumed or stopped, not paused.
    client.goto("about:blank").await.expect("a blank page");
    client
        .goto(&format!("http://{addr}/ui#stage=Paused&q=job-00"))
        .await
        .expect("the page loads");
    until("job-00 Paused", Box::new(|r| r == ["job-00"])).await;
    for (cmd, enabled) in [("pause", false), ("resume", true), ("stop", true)] {
        let button = client
            .find(Locator::Css(&format!(
                "tr[data-id='job-00'] button[data-cmd='{cmd}']"
            )))
            .await
            .expect("a button");
        assert_eq!(
            button.is_enabled().await.expect("enabled?"),
            enabled,
            "{cmd} on a Paused task"
        );
    }
    let by = client
        .find(Locator::Css("tr[data-id='job-00'] .by"))
        .await
        .expect("the operator's mark")
        .text()
        .await
        .expect("its text");
    assert_eq!(by, "by an operator");

    client.close().await.expect("the session closes");
    drop(driver);
    server.abort();
}

/// Polls `script` in the page until it returns something truthy, within [`WITHIN`].
async fn until_true(client: &fantoccini::Client, what: &str, script: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WITHIN;
    // Bounded by the deadline.
    loop {
        let value = client
            .execute(script, vec![])
            .await
            .expect("the script runs");
        let truthy = !matches!(
            value,
            serde_json::Value::Null | serde_json::Value::Bool(false)
        ) && value != serde_json::json!("")
            && value != serde_json::json!([]);
        if truthy {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the page shows {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three kinds of Paused read apart on the page (a retry with its time and
/// attempt, blocked until a person acts, an operator's pause), and a task's own
/// view, opened from its name and kept in the URL, shows its detail and its recent
/// events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_tells_the_policys_standing_and_opens_a_task_with_its_events() {
    use http_common::Fails;
    use taskstage::policy::{AutoResume, BackoffSettings, Standing};
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };
    let settings = BackoffSettings::new(Duration::from_secs(60), Duration::from_secs(120), 2.0)
        .expect("valid settings");
    let policy = AutoResume::new(settings, |e: &taskstage::RunError| {
        e.to_string().contains("transient")
    });
    let _driver_task = tokio::spawn(policy.run());
    let tasks = LocalTasks::new();
    let mut group = TaskGroup::new();
    let mut keys = Vec::new();
    for (name, error) in [
        ("flaky", "transient: timed out"),
        ("broken", "schema error"),
    ] {
        let handle = Task::builder(name)
            .unit(Fails(error))
            .spawn()
            .expect("spawned");
        handle.wait_for_stage(|s| s == Stage::Paused).await;
        keys.push(policy.add(&handle));
        tasks.add(&handle).expect("a name of its own");
        group.add(handle);
    }
    let operated = Task::builder("operated")
        .unit(Probe {
            live: Live::default(),
            hold: None,
        })
        .spawn()
        .expect("spawned");
    operated.wait_for_stage(|s| s == Stage::Running).await;
    keys.push(policy.add(&operated));
    tasks.add(&operated).expect("a name of its own");
    tasks.show_policy(&policy);
    operated.pause().await.expect("paused");
    for (key, want) in keys.iter().zip([
        (|s: &Standing| matches!(s, Standing::BackingOff { .. })) as fn(&Standing) -> bool,
        |s| matches!(s, Standing::NotResumable { .. }),
        |s| *s == Standing::UserPaused,
    ]) {
        tokio::time::timeout(
            WITHIN,
            policy.wait_for(*key, |s| s.is_some_and(|s| want(&s.standing))),
        )
        .await
        .expect("the policy's standing within the deadline");
    }
    // Every URI the page asks for, to see what its stream follows.
    let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let record = Arc::clone(&asked);
    let router = Api::local(&tasks)
        .auth(Auth::tokens().admin("admin-secret"))
        .router()
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                record
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(request.uri().to_string());
                next.run(request)
            },
        ));
    // The tasks the page's last event stream follows.
    let followed = || {
        let asked = asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = asked.iter().rev().find(|u| u.starts_with("/v1/events"))?;
        let mut names: Vec<String> = last
            .split_once('?')
            .map_or("", |(_, q)| q)
            .split('&')
            .filter_map(|p| p.strip_prefix("task="))
            .map(str::to_owned)
            .collect();
        names.sort();
        Some(names)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let (driver, client) = session(&chromium, &chromedriver, &[]).await;
    client
        .goto(&format!("http://{addr}/ui#token=admin-secret"))
        .await
        .expect("the page loads");
    let stage_of = "return Object.fromEntries(Array.from(document.querySelectorAll('#rows tr')).map(r => [r.dataset.id, r.querySelector('td.stage').textContent]))";
    let shown = until_true(
        &client,
        "three rows",
        &format!("const s = (function () {{ {stage_of} }})(); return Object.keys(s).length === 3 ? s : null"),
    )
    .await;
    let flaky = shown["flaky"].as_str().unwrap_or("");
    assert!(
        flaky.starts_with("Pausedretrying in ") && flaky.ends_with("s, attempt 1"),
        "{shown}"
    );
    let seconds: u64 = flaky
        .trim_start_matches("Pausedretrying in ")
        .trim_end_matches("s, attempt 1")
        .parse()
        .expect("seconds");
    assert!((25..=60).contains(&seconds), "{shown}");
    assert_eq!(shown["broken"], "Pausedblocked: needs a person", "{shown}");
    assert_eq!(shown["operated"], "Pausedby an operator", "{shown}");
    // The page's stream follows the three shown, by name.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while followed().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page opened no stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        followed(),
        Some(vec![
            "broken".to_owned(),
            "flaky".to_owned(),
            "operated".to_owned()
        ])
    );

    // The task's own view, from its name, in the URL.
    client
        .find(Locator::Css("tr[data-id='operated'] a.open"))
        .await
        .expect("the name's link")
        .click()
        .await
        .expect("clicked");
    let events = "return document.getElementById('task').hidden ? null : Array.from(document.querySelectorAll('#task-events tr')).map(r => r.children[1].textContent)";
    let changes = until_true(&client, "the task's events", events).await;
    assert_eq!(
        changes,
        serde_json::json!(["Running → Pausing", "Pausing → Paused"]),
        "the task's view"
    );
    let url = client.current_url().await.expect("the URL");
    assert_eq!(url.fragment(), Some("task=operated"), "{url}");
    client.refresh().await.expect("reloaded");
    let again = until_true(&client, "the task's events after a reload", events).await;
    assert_eq!(again, changes);
    let fields = "return Object.fromEntries(Array.from(document.querySelectorAll('#task-fields dd')).map(d => [d.dataset.field, d.textContent]))";
    let fields = client.execute(fields, vec![]).await.expect("the fields");
    assert_eq!(fields["stage"], "Paused (by an operator)", "{fields}");
    assert_eq!(fields["generation"], "1", "{fields}");
    assert_eq!(fields["policy"], "user_paused, 0 auto-resumes", "{fields}");
    client
        .find(Locator::Id("task-close"))
        .await
        .expect("the close button")
        .click()
        .await
        .expect("clicked");
    until_true(
        &client,
        "the task's view closed",
        "return document.getElementById('task').hidden && location.hash === ''",
    )
    .await;
    // Another view, another stream: only the task it shows.
    client
        .goto(&format!("http://{addr}/ui#q=fla"))
        .await
        .expect("the page loads");
    let deadline = tokio::time::Instant::now() + WITHIN;
    while followed() != Some(vec!["flaky".to_owned()]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream of the view #q=fla follows {:?}",
            followed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.close().await.expect("the session closes");
    drop(driver);
    server.abort();
    drop((group, operated));
}
