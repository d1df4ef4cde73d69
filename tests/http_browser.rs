//! The status page in a real browser: headless Chromium driven over WebDriver.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium`, `chromium-driver`;
//! `scripts/browser-setup.sh` installs them). Without them the test prints why and
//! passes, except under `CI=true`, where it fails.

mod http_common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use http_common::{Live, Probe};
use taskstage::http::{Api, Auth, LocalTasks};
use taskstage::{Stage, Task, TaskGroup};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_commands_and_follows_the_tasks_live() {
    let (Some(chromium), Some(chromedriver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium or chromedriver is missing (run scripts/browser-setup.sh); under CI=true this fails"
        );
        println!("skipped: chromium or chromedriver is missing (run scripts/browser-setup.sh)");
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
    let tasks = LocalTasks::from_group(&group);
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

    let driver = start_driver(&chromedriver).await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,420"],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session");
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
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/http-status-page.png");
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
