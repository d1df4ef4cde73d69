//! The `taskstage` command, run as a user runs it (the built binary, through
//! `std::process::Command`), against a 3-member etcd on 127.0.0.1 with worker
//! *processes*: this test binary started again as `worker_process` (an ignored test
//! that does nothing unless `TASKSTAGE_CLI_WORKER` is set), whose units write a
//! fenced checkpoint every 50 ms, or, for a task whose spec says `stubborn`, ignore
//! their cancellation.
//!
//! Checked: pause, resume and stop through the command change what the workers do
//! (a paused task's writes stop while another task's go on); `--output json` matches
//! `Controller::status` and `Controller::checkpoints`; every exit code (0, 1, 2, 3);
//! bad input changes nothing (a listing before and after); a pause that a stubborn
//! unit cannot answer times out and names the task, its owner and its stage; `watch`
//! prints the change and ends cleanly on SIGINT. Every process the test starts is
//! killed by pid when its guard drops, also when the test fails.
//!
//! Without an `etcd` binary the etcd tests say SKIPPED and pass, except under
//! `CI=true`, where they fail (see `cluster_support`).
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cluster_support::process::{self, Settings, Units, WorkerKind};
use cluster_support::{dead_endpoint, signal_pid, ChildGuard, EtcdCluster};
use serde_json::Value;
use taskstage_cluster::{Controller, EtcdCoordinator, EtcdOptions, TaskStatus};

const BIN: &str = env!("CARGO_BIN_EXE_taskstage");
const PREFIX: &str = "cli";
/// The bound of every wait of the test side.
const WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- worker process

/// The worker processes: writers, or stubborn units for a spec `stubborn`.
const WORKERS: WorkerKind = WorkerKind {
    env: "TASKSTAGE_CLI",
    prefix: PREFIX,
    units: Units::Writers,
    capacity: None,
};

/// The worker process: joins, runs the units the specs name, joins again whenever
/// its lease is lost.
#[test]
#[ignore = "a worker process of the cli tests; they start it with TASKSTAGE_CLI_WORKER set"]
fn worker_process() {
    process::worker_process(&WORKERS);
}

// ---------------------------------------------------------------- the test side

/// What one run of the command did.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// The errors printed with `--output json`, one object a line.
    fn json_errors(&self) -> Vec<Value> {
        self.stderr
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stderr line is not JSON ({e}): {l}"))
            })
            .collect()
    }
}

/// Reads a pipe to its end on a thread of its own.
fn drain(pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(pipe).read_to_string(&mut text);
        text
    })
}

/// Waits for `child` to exit, polling every 20 ms, for at most `within`.
fn wait_exit(child: &mut ChildGuard, within: Duration, what: &str) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait() {
            return status
                .code()
                .unwrap_or_else(|| panic!("{what} ended by a signal: {status:?}"));
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not end within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `taskstage --endpoints E --prefix cli ARGS` (at most 60 s; killed after).
fn taskstage_at(endpoints: &str, args: &[&str]) -> Ran {
    let mut command = Command::new(BIN);
    command
        .args(["--endpoints", endpoints, "--prefix", PREFIX])
        .args(args)
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("TASKSTAGE_PREFIX");
    run(command, args, None)
}

/// Runs `command` with `input` on its stdin (at most 60 s; killed after).
fn run(mut command: Command, args: &[&str], input: Option<&str>) -> Ran {
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start taskstage");
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        std::io::Write::write_all(&mut stdin, text.as_bytes()).expect("write to stdin");
    }
    let (stdout, stderr) = (
        drain(child.stdout.take().expect("stdout")),
        drain(child.stderr.take().expect("stderr")),
    );
    let mut child = ChildGuard::new(child);
    let code = wait_exit(&mut child, Duration::from_secs(60), "taskstage");
    let ran = Ran {
        code,
        stdout: stdout.join().expect("stdout read"),
        stderr: stderr.join().expect("stderr read"),
    };
    eprintln!(
        "$ taskstage {}\n{}{}(exit {code})",
        args.join(" "),
        ran.stdout,
        ran.stderr
    );
    ran
}

/// A test's etcd, worker processes, a controller, and a runtime to call it on.
struct Setup {
    cluster: EtcdCluster,
    workers: Vec<ChildGuard>,
    controller: Controller,
    runtime: tokio::runtime::Runtime,
    dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.workers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Setup {
    fn start(workers: &[&str]) -> Option<Setup> {
        let cluster = EtcdCluster::start_or_skip(3)?;
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let coord = runtime
            .block_on(EtcdCoordinator::connect(
                cluster.endpoints(),
                EtcdOptions::default(),
            ))
            .expect("connect to the test cluster");
        let dir = std::env::temp_dir().join(format!(
            "taskstage-cli-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("the test's directory");
        let mut setup = Setup {
            controller: Controller::new(coord, PREFIX).expect("a controller"),
            cluster,
            workers: Vec::new(),
            runtime,
            dir,
        };
        for id in workers {
            setup.spawn_worker(id);
        }
        let want: Vec<String> = workers.iter().map(|w| (*w).to_owned()).collect();
        setup.eventually("every worker a member", || {
            let mut members: Vec<String> = setup
                .runtime
                .block_on(setup.controller.workers())
                .ok()?
                .iter()
                .map(|w| w.to_string())
                .collect();
            members.sort();
            (members == want).then_some(())
        });
        Some(setup)
    }

    fn spawn_worker(&mut self, id: &str) {
        let endpoints = self.cluster.endpoints();
        let child = WORKERS.spawn(id, &endpoints, &self.dir, Settings::default());
        self.workers.push(child);
    }

    fn endpoints(&self) -> String {
        self.cluster.endpoints().join(",")
    }

    fn taskstage(&self, args: &[&str]) -> Ran {
        taskstage_at(&self.endpoints(), args)
    }

    /// A spec file holding `text`.
    fn spec(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("write a spec file");
        path.display().to_string()
    }

    fn status(&self, task: &str) -> TaskStatus {
        self.runtime
            .block_on(self.controller.status(task))
            .unwrap_or_else(|e| panic!("status of {task}: {e}"))
    }

    /// The revision of `task`'s last write of checkpoint `name`, if it has one.
    fn written_at(&self, task: &str, name: &str) -> Option<i64> {
        self.runtime
            .block_on(self.controller.checkpoints(task))
            .ok()?
            .into_iter()
            .find(|c| c.name == name)
            .map(|c| c.revision)
    }

    /// Waits until `task` has written `pos` `n` more times than at revision `since`
    /// (each write is a revision of its own, so counts revisions it was seen at).
    fn writes_after(&self, task: &str, since: Option<i64>, n: usize) -> i64 {
        let mut seen = Vec::new();
        self.eventually(&format!("{n} writes of {task}"), || {
            let at = self.written_at(task, "pos")?;
            if Some(at) > since && !seen.contains(&at) {
                seen.push(at);
            }
            (seen.len() >= n).then_some(at)
        })
    }

    /// Polls `check` every 20 ms until it returns `Some`, for at most [`WAIT`].
    fn eventually<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(value) = check() {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{what} never happened within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `list --output json` without each read's store revision (which every write
    /// of any task moves): what bad input must leave as it was.
    fn listing(&self) -> Value {
        let ran = self.taskstage(&["list", "--output", "json"]);
        assert_eq!(ran.code, 0, "{ran:?}");
        let mut listing = ran.json();
        for task in listing.as_array_mut().expect("an array") {
            task.as_object_mut().expect("an object").remove("revision");
        }
        listing
    }
}

/// Asserts that `ran` exited with `code` and that its error line says each of `words`.
fn assert_error(ran: &Ran, code: i32, words: &[&str]) {
    assert_eq!(ran.code, code, "{ran:?}");
    let line = ran.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line: {ran:?}");
    assert!(line.starts_with("taskstage: "), "{ran:?}");
    for word in words {
        assert!(line.contains(word), "{word:?} missing: {line}");
    }
}

/// The task object of `listing` named `task`.
fn entry<'a>(listing: &'a Value, task: &str) -> &'a Value {
    listing
        .as_array()
        .expect("an array")
        .iter()
        .find(|t| t["task"] == task)
        .unwrap_or_else(|| panic!("{task} not listed: {listing}"))
}

/// Asserts that a JSON task object says what `Controller::status` says.
fn assert_matches_status(json: &Value, status: &TaskStatus) {
    let observed = status.current_observed();
    assert_eq!(json["task"], status.task.as_str());
    assert_eq!(json["desired"], status.desired.name());
    assert_eq!(json["desired_revision"], status.desired_revision);
    assert_eq!(
        json["owner"].as_str(),
        status.owner.as_ref().map(|o| o.as_str())
    );
    assert_eq!(json["owner_revision"].as_i64(), status.owner_revision);
    assert_eq!(json["observed"].as_str(), observed.map(|o| o.stage.name()));
    assert_eq!(json["generation"].as_u64(), observed.map(|o| o.generation));
    assert_eq!(json["answered"], status.answers(status.desired_revision));
}

#[test]
fn the_command_drives_real_workers_and_bad_input_changes_nothing() {
    let Some(setup) = Setup::start(&["w1", "w2"]) else {
        return;
    };
    let started = Instant::now();

    // An empty cluster: an empty listing, and --all is refused.
    let ran = setup.taskstage(&["list"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        ran.stdout,
        "TASK  DESIRED  OBSERVED  OWNER  GEN  OUTCOME  ANSWERED\n"
    );
    assert_eq!(setup.listing(), Value::Array(Vec::new()));
    assert_error(
        &setup.taskstage(&["pause", "--all"]),
        2,
        &["pause --all", "no task", PREFIX],
    );
    assert_eq!(setup.listing(), Value::Array(Vec::new()));

    // Two tasks whose units write.
    let writer = setup.spec("writer.spec", "writer\n");
    for task in ["t1", "t2"] {
        let ran = setup.taskstage(&["create", task, "--spec-file", &writer]);
        assert_eq!(ran.code, 0, "{ran:?}");
        assert!(ran
            .stdout
            .starts_with(&format!("created task {task}: desired Running")));
    }
    let ran = setup.taskstage(&["resume", "t1", "t2", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout.starts_with("TASK  RESULT    STAGE    OWNER"),
        "{ran:?}"
    );
    assert_eq!(
        ran.stdout
            .lines()
            .filter(|l| l.contains("answered  Running"))
            .count(),
        2
    );
    setup.writes_after("t1", None, 3);

    // A pause through the command: t1's writes stop while t2's go on.
    let ran = setup.taskstage(&["pause", "t1", "--output", "json", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let answer = &ran.json()[0];
    assert_eq!(answer["task"], "t1");
    assert_eq!(answer["result"], "answered");
    assert_eq!(answer["stage"], "Paused");
    let paused_at = setup.written_at("t1", "pos");
    let t2_at = setup.written_at("t2", "pos");
    setup.writes_after("t2", t2_at, 10);
    assert_eq!(
        setup.written_at("t1", "pos"),
        paused_at,
        "t1 wrote while paused"
    );

    // `status` and `list` in JSON say what the controller says.
    let ran = setup.taskstage(&["status", "t1", "--output", "json"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let status = ran.json();
    assert_matches_status(&status, &setup.status("t1"));
    assert_eq!(status["observed"], "Paused");
    assert_eq!(status["outcome"], "cancelled");
    let checkpoints = setup
        .runtime
        .block_on(setup.controller.checkpoints("t1"))
        .expect("t1's checkpoints");
    let shown: Vec<(String, u64)> = status["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_owned(),
                c["size"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = checkpoints
        .iter()
        .map(|c| (c.name.clone(), c.size as u64))
        .collect();
    assert_eq!(shown, want);
    assert_eq!(want.first().map(|c| c.0.as_str()), Some("pos"));
    let ran = setup.taskstage(&["status", "t1"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("checkpoints  pos ("), "{ran:?}");

    let listing = setup.taskstage(&["list", "--output", "json"]).json();
    assert_eq!(listing.as_array().map(Vec::len), Some(2));
    for task in ["t1", "t2"] {
        assert_matches_status(entry(&listing, task), &setup.status(task));
    }

    // `workers` counts the owner keys of the tasks.
    let ran = setup.taskstage(&["workers", "--output", "json"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let workers = ran.json();
    for w in ["w1", "w2"] {
        let held = ["t1", "t2"]
            .iter()
            .filter(|t| setup.status(t).owner.is_some_and(|o| o.as_str() == w))
            .count();
        let shown = workers
            .as_array()
            .expect("an array")
            .iter()
            .find(|x| x["worker"] == w)
            .unwrap_or_else(|| panic!("{w} not shown: {workers}"));
        assert_eq!(shown["member"], true);
        assert_eq!(shown["tasks"].as_u64(), Some(held as u64), "{workers}");
    }

    // Bad input: typed errors, exit 2, nothing written.
    let before = setup.listing();
    assert_error(
        &setup.taskstage(&["pause", "t2", "a/b"]),
        2,
        &["pause", "\"a/b\"", "'/'"],
    );
    assert_error(
        &setup.taskstage(&["pause", "t2", "nosuch"]),
        2,
        &["pause", "task nosuch does not exist", "taskstage list"],
    );
    assert_error(
        &setup.taskstage(&["create", "t3", "--spec-file", &writer, "--desired", "Bogus"]),
        2,
        &[
            "create",
            "unknown stage \"Bogus\"",
            "Running, Paused, Stopped",
        ],
    );
    assert_error(
        &setup.taskstage(&["create", "t3", "--spec-file", "/nonexistent/spec"]),
        2,
        &["create t3", "/nonexistent/spec"],
    );
    assert_error(&setup.taskstage(&["status", "nosuch"]), 2, &["nosuch"]);
    assert_error(
        &setup.taskstage(&["frobnicate"]),
        2,
        &["frobnicate", "--help"],
    );
    assert_error(
        &setup.taskstage(&["pause", "t2", "--timeout", "3h"]),
        2,
        &["3h"],
    );
    let ran = setup.taskstage(&["pause", "a/b", "--output", "json"]);
    assert_eq!(ran.code, 2);
    let errors = ran.json_errors();
    assert_eq!(errors.len(), 1, "{ran:?}");
    assert_eq!(errors[0]["error_code"], "bad_request");
    assert_eq!(errors[0]["task"], "a/b");
    assert_eq!(errors[0]["exit_code"], 2);
    // An unreachable store: exit 3, nothing written.
    let dead = dead_endpoint();
    let ran = taskstage_at(&dead, &["pause", "t2"]);
    assert_error(&ran, 3, &["store unreachable", &dead, "--endpoints"]);
    let ran = taskstage_at(&dead, &["list", "--output", "json"]);
    assert_eq!(ran.code, 3);
    assert_eq!(ran.json_errors()[0]["error_code"], "unreachable");
    assert_eq!(setup.listing(), before, "bad input changed something");
    assert_eq!(setup.status("t2").desired.name(), "Running");

    // The endpoints and the prefix from the environment; a spec from stdin.
    let mut command = Command::new(BIN);
    command
        .args(["create", "t3", "--spec-file", "-", "--paused"])
        .env("ETCD_ENDPOINTS", setup.endpoints())
        .env("TASKSTAGE_PREFIX", PREFIX);
    let ran = run(
        command,
        &["create t3 (from the environment)"],
        Some("writer\n"),
    );
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        ran.stdout.split(", revision").next(),
        Some("created task t3: desired Paused, spec 7 bytes")
    );
    assert_eq!(setup.status("t3").desired.name(), "Paused");

    // A task that exists: refused, exit 1, naming it and its stage.
    assert_error(
        &setup.taskstage(&["create", "t1", "--spec-file", &writer]),
        1,
        &["task t1 already exists", "Paused"],
    );

    // `watch t1` prints its change, and SIGINT ends it with exit 0.
    let mut watch = Command::new(BIN)
        .args(["--endpoints", &setup.endpoints(), "--prefix", PREFIX])
        .args(["watch", "t1", "--output", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start taskstage watch");
    let lines = {
        let stdout = watch.stdout.take().expect("stdout");
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        receive
    };
    let mut watch = ChildGuard::new(watch);
    let next = |what: &str| -> Value {
        let line = lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("watch printed no line for {what} within {WAIT:?}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    };
    let first = next("the current state");
    assert_eq!(
        (first["task"].as_str(), first["observed"].as_str()),
        (Some("t1"), Some("Paused"))
    );

    // Resumed through the command: t1 writes again, and watch saw it running.
    let ran = setup.taskstage(&["resume", "t1", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    setup.writes_after("t1", paused_at, 3);
    let mut seen = Vec::new();
    while !seen.contains(&"Running".to_owned()) {
        let line = next("t1 running");
        assert_eq!(line["task"], "t1", "only t1 is watched");
        seen.push(line["observed"].as_str().unwrap_or("-").to_owned());
    }
    signal_pid(watch.pid(), rustix::process::Signal::INT);
    assert_eq!(wait_exit(&mut watch, WAIT, "watch after SIGINT"), 0);

    // A stop is final: the worker's run ends, and a resume is refused.
    let ran = setup.taskstage(&["stop", "t1", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("answered  Stopped"), "{ran:?}");
    let stopped_at = setup.written_at("t1", "pos");
    let t2_at = setup.written_at("t2", "pos");
    setup.writes_after("t2", t2_at, 10);
    assert_eq!(
        setup.written_at("t1", "pos"),
        stopped_at,
        "t1 wrote after its stop"
    );
    let before = setup.listing();
    assert_error(
        &setup.taskstage(&["resume", "t1", "t2"]),
        1,
        &["resume of task t1 refused", "stopped", "final"],
    );
    assert_eq!(
        setup.listing(),
        before,
        "a refused resume changed something"
    );

    // `pause --all` leaves the stopped task out, and pauses the others.
    let ran = setup.taskstage(&["pause", "--all", "--output", "json", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let answers = ran.json();
    assert_eq!(entry(&answers, "t1")["result"], "skipped");
    assert_eq!(entry(&answers, "t2")["result"], "answered");
    assert_eq!(entry(&answers, "t2")["stage"], "Paused");
    assert_eq!(entry(&answers, "t3")["result"], "answered");
    assert_eq!(setup.status("t1").desired.name(), "Stopped");

    // `stop --all` stops the others, and for the stopped one writes nothing: it is
    // answered by the stop it already had.
    let t1_stop = setup.status("t1").desired_revision;
    let ran = setup.taskstage(&["stop", "--all", "--output", "json", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let answers = ran.json();
    for task in ["t1", "t2", "t3"] {
        assert_eq!(entry(&answers, task)["result"], "answered", "{answers}");
        assert_eq!(entry(&answers, task)["stage"], "Stopped", "{answers}");
    }
    assert_eq!(
        setup.status("t1").desired_revision,
        t1_stop,
        "t1's stop rewritten"
    );
    eprintln!("the cli session took {:?}", started.elapsed());
}

#[test]
fn a_pause_that_a_stubborn_unit_cannot_answer_times_out_and_names_it() {
    let Some(mut setup) = Setup::start(&["w1"]) else {
        return;
    };
    let writer = setup.spec("writer.spec", "writer\n");
    let stubborn = setup.spec("stubborn.spec", "stubborn\n");
    for (task, spec) in [("ok", &writer), ("stuck", &stubborn)] {
        let ran = setup.taskstage(&["create", task, "--spec-file", spec]);
        assert_eq!(ran.code, 0, "{ran:?}");
    }
    let ran = setup.taskstage(&["resume", "--all", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    setup.eventually("the stubborn unit began", || {
        setup.written_at("stuck", "began")
    });

    // One deadline for both: ok answers, stuck does not, and is named with its owner
    // and the stage it is stuck in.
    let started = Instant::now();
    let ran = setup.taskstage(&["pause", "--all", "--timeout", "5s", "--output", "json"]);
    let took = started.elapsed();
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(
        took < Duration::from_secs(15),
        "one deadline of 5 s took {took:?}"
    );
    let answers = ran.json();
    assert_eq!(entry(&answers, "ok")["result"], "answered");
    assert_eq!(entry(&answers, "ok")["stage"], "Paused");
    assert_eq!(entry(&answers, "stuck")["result"], "timeout");
    let errors = ran.json_errors();
    assert_eq!(errors.len(), 1, "only the stuck task failed: {ran:?}");
    assert_eq!(errors[0]["error_code"], "timeout");
    assert_eq!(errors[0]["task"], "stuck");
    assert_eq!(errors[0]["owner"], "w1");
    assert_eq!(errors[0]["stage"], "Pausing");
    assert_eq!(errors[0]["exit_code"], 1);

    // The listing says so too: desired Paused, observed Pausing, not answered.
    let listing = setup.taskstage(&["list", "--output", "json"]).json();
    let stuck = entry(&listing, "stuck");
    assert_eq!(
        (&stuck["desired"], &stuck["observed"], &stuck["answered"]),
        (
            &Value::from("Paused"),
            &Value::from("Pausing"),
            &Value::from(false)
        )
    );
    assert_matches_status(stuck, &setup.status("stuck"));
    let ran = setup.taskstage(&["list"]);
    let row = ran
        .stdout
        .lines()
        .find(|l| l.starts_with("stuck"))
        .unwrap_or("");
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["stuck", "Paused", "Pausing", "w1", "1", "none", "no"],
        "{ran:?}"
    );

    // As a line of text: the task, its owner, its stage, and what to do.
    assert_error(
        &setup.taskstage(&["pause", "stuck", "--timeout", "1s"]),
        1,
        &[
            "pause of task stuck not answered",
            "owner w1",
            "stage Pausing",
            "taskstage stop stuck",
        ],
    );
    // A stop aborts the stuck run and is answered.
    let ran = setup.taskstage(&["stop", "--all", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        setup
            .status("stuck")
            .current_observed()
            .map(|o| o.stage.name()),
        Some("Stopped")
    );

    // A watch outlives etcd: it says on stderr that the store does not answer, goes
    // on, and still ends with exit 0 on SIGINT.
    let mut watch = Command::new(BIN)
        .args([
            "--endpoints",
            &setup.endpoints(),
            "--prefix",
            PREFIX,
            "watch",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start taskstage watch");
    let (out, err) = (
        lines_of(watch.stdout.take().expect("stdout")),
        lines_of(watch.stderr.take().expect("stderr")),
    );
    let mut watch = ChildGuard::new(watch);
    let first = out.recv_timeout(WAIT).expect("watch printed the tasks");
    assert!(first.contains("  ok  desired Stopped"), "{first}");
    for member in 0..3 {
        setup.cluster.kill_member(member);
    }
    let said = err
        .recv_timeout(WAIT)
        .expect("watch said that etcd does not answer");
    assert!(
        said.contains("watch: store unreachable") && said.ends_with("(still watching)"),
        "{said}"
    );
    assert!(watch.try_wait().is_none(), "watch ended with etcd gone");
    signal_pid(watch.pid(), rustix::process::Signal::INT);
    assert_eq!(wait_exit(&mut watch, WAIT, "watch after SIGINT"), 0);
}

/// Each line of `pipe`, sent on a channel by a thread of its own.
fn lines_of(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

#[test]
fn completions_and_help_need_no_cluster() {
    for shell in ["bash", "zsh", "fish"] {
        let ran = taskstage_at(&dead_endpoint(), &["completions", shell]);
        assert_eq!(ran.code, 0, "{ran:?}");
        for word in ["taskstage", "pause", "resume", "all", "spec-file"] {
            assert!(ran.stdout.contains(word), "{shell} completions lack {word}");
        }
    }
    assert_eq!(
        taskstage_at(&dead_endpoint(), &["completions", "tcsh"]).code,
        2
    );
    // A usage error is JSON too when JSON was asked for, in either spelling.
    for json in [&["--output", "json"][..], &["--output=json"][..]] {
        let ran = taskstage_at(&dead_endpoint(), &[&["frobnicate"][..], json].concat());
        assert_eq!(ran.code, 2, "{ran:?}");
        let errors = ran.json_errors();
        assert_eq!(errors.len(), 1, "{ran:?}");
        assert_eq!(errors[0]["error_code"], "bad_request");
        assert_eq!(errors[0]["exit_code"], 2);
        assert!(errors[0]["error_msg"]
            .as_str()
            .is_some_and(|m| m.contains("frobnicate")));
    }
    let ran = taskstage_at(&dead_endpoint(), &["--help"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("Exit codes:"), "{ran:?}");
    for command in [
        "list",
        "status",
        "pause",
        "resume",
        "stop",
        "create",
        "workers",
        "watch",
        "completions",
    ] {
        let ran = taskstage_at(&dead_endpoint(), &[command, "--help"]);
        assert_eq!(ran.code, 0, "{ran:?}");
        assert!(
            ran.stdout
                .contains(&format!("taskstage --prefix app {command}"))
                || ran.stdout.contains(&format!("taskstage {command}")),
            "no example of {command}: {}",
            ran.stdout
        );
    }
}

/// `taskstage drain`: bad input is refused on one line and writes nothing; a drain of
/// a member returns once it holds no task (every owner key of it released, each only
/// after its run returned), and the other worker runs every task.
#[test]
fn drain_returns_once_the_worker_holds_no_task_and_the_other_runs_them() {
    let Some(setup) = Setup::start(&["w1", "w2"]) else {
        return;
    };
    let writer = setup.spec("writer.spec", "writer\n");
    let tasks = ["d1", "d2", "d3", "d4"];
    for task in tasks {
        let ran = setup.taskstage(&["create", task, "--spec-file", &writer]);
        assert_eq!(ran.code, 0, "{ran:?}");
    }
    let mut args = vec!["resume"];
    args.extend(tasks);
    args.extend(["--timeout", "20s"]);
    assert_eq!(setup.taskstage(&args).code, 0);
    // The fair shares give each worker two.
    setup.eventually("each worker holds two tasks", || {
        let held = setup
            .runtime
            .block_on(setup.controller.held_by("w1"))
            .ok()?;
        (held.len() == 2).then_some(())
    });

    assert_error(
        &setup.taskstage(&["drain", "nobody"]),
        2,
        &["drain", "worker nobody is not a member", PREFIX],
    );
    assert_error(
        &setup.taskstage(&["drain", "a/b"]),
        2,
        &["drain", "invalid worker id"],
    );
    let members = setup
        .runtime
        .block_on(setup.controller.worker_statuses())
        .expect("the members");
    assert!(members.iter().all(|m| !m.draining), "{members:?}");

    let ran = setup.taskstage(&["drain", "w1", "--output", "json", "--timeout", "30s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.json()["worker"], "w1");
    assert_eq!(ran.json()["tasks"], 0);
    // True when it returned: no owner key of w1 is left.
    let held = setup
        .runtime
        .block_on(setup.controller.held_by("w1"))
        .expect("a read");
    assert_eq!(held, Vec::new());
    let ran = setup.taskstage(&["drain", "w1"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stdout, "WORKER  DRAINING  TASKS\nw1      yes       0\n");

    // w2 takes every task over and runs it (its writes go on); w1 claims nothing.
    setup.eventually("w2 runs every task", || {
        tasks
            .iter()
            .all(|task| {
                let status = setup.status(task);
                status.current_observed().is_some_and(|o| {
                    o.stage == taskstage::Stage::Running && o.owner.as_str() == "w2"
                })
            })
            .then_some(())
    });
    for task in tasks {
        let at = setup.written_at(task, "pos");
        setup.writes_after(task, at, 2);
    }
    let held = setup
        .runtime
        .block_on(setup.controller.held_by("w1"))
        .expect("a read");
    assert_eq!(held, Vec::new(), "w1 claimed again");
}

/// One HTTP/1.1 request to `addr` over a fresh connection; the status code and the
/// body (a short answer: the connection is closed after it).
fn http(addr: &str, request_line: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to serve");
    stream.set_read_timeout(Some(WAIT)).expect("a read timeout");
    let mut request = format!("{request_line} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .expect("send the request");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Starts `taskstage serve` on a free loopback port with `extra` arguments, and
/// returns it with the lines it printed up to the one naming its address.
fn start_serve(setup: &Setup, extra: &[&str]) -> (ChildGuard, String, Vec<String>) {
    start_serve_on(&["--endpoints", &setup.endpoints()], extra)
}

/// `taskstage STORE_ARGS --prefix cli serve` on a port of its own, as [`start_serve`].
fn start_serve_on(store: &[&str], extra: &[&str]) -> (ChildGuard, String, Vec<String>) {
    let mut child = Command::new(BIN)
        .args(store)
        .args(["--prefix", PREFIX])
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("TASKSTAGE_ADMIN_TOKEN")
        .env_remove("TASKSTAGE_READ_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start taskstage serve");
    let lines = lines_of(child.stdout.take().expect("stdout"));
    let child = ChildGuard::new(child);
    let first = lines
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("serve printed nothing within {WAIT:?}"));
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    let mut printed = vec![first];
    // The URL line, if any, follows at once.
    if let Ok(line) = lines.recv_timeout(Duration::from_secs(1)) {
        printed.push(line);
    }
    (child, addr, printed)
}

/// With no token given, `serve` makes one for the run and prints the page's URL
/// with it: without it every route but health is 401, with it the API answers;
/// `--no-token` serves loopback open, and still refuses a rebound name and a page
/// of another origin.
#[test]
fn serve_needs_a_token_by_default_and_prints_the_url_that_carries_it() {
    let Some(setup) = Setup::start(&[]) else {
        return;
    };
    let (mut serve, addr, printed) = start_serve(&setup, &[]);
    let url = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix(&format!("http://{addr}/ui#token=")))
        .unwrap_or_else(|| panic!("no URL with a token in {printed:?}"))
        .to_owned();
    assert!(url.len() >= 32, "a short token: {url:?}");
    let bearer = format!("Bearer {url}");
    assert_eq!(http(&addr, "GET /v1/tasks", &[]).0, 401);
    assert_eq!(
        http(&addr, "GET /v1/tasks", &[("Authorization", "Bearer guess")]).0,
        401
    );
    let (status, body) = http(&addr, "GET /v1/tasks", &[("Authorization", &bearer)]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(http(&addr, "GET /v1/health", &[]).0, 200);
    // Even with the token, a command from a page of another origin is refused.
    let (status, body) = http(
        &addr,
        "POST /v1/tasks/x/pause",
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
    );
    assert_eq!(status, 403, "{body}");
    signal_pid(serve.pid(), rustix::process::Signal::INT);
    assert_eq!(wait_exit(&mut serve, WAIT, "serve after SIGINT"), 0);

    let (mut open, addr, printed) = start_serve(&setup, &["--no-token"]);
    assert!(
        printed.iter().all(|l| !l.contains("#token=")),
        "--no-token printed a token: {printed:?}"
    );
    assert_eq!(http(&addr, "GET /v1/tasks", &[]).0, 200);
    let (status, body) = http(&addr, "GET /v1/tasks", &[("Host", "evil.example:8080")]);
    assert_eq!(status, 403, "a rebound name read an open server: {body}");
    let (status, body) = http(
        &addr,
        "POST /v1/tasks/x/pause",
        &[("Origin", "http://evil.example")],
    );
    assert_eq!(status, 403, "{body}");
    signal_pid(open.pid(), rustix::process::Signal::INT);
    assert_eq!(
        wait_exit(&mut open, WAIT, "serve --no-token after SIGINT"),
        0
    );
}

/// Runs `taskstage --store STORE --prefix cli ARGS` (at most 60 s; killed after).
fn taskstage_on_file(store: &str, args: &[&str]) -> Ran {
    let mut command = Command::new(BIN);
    command
        .args(["--store", store, "--prefix", PREFIX])
        .args(args)
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("TASKSTAGE_STORE")
        .env_remove("TASKSTAGE_PREFIX");
    run(command, args, None)
}

/// The command on the store file of one machine (`--store sqlite:PATH`), beside a
/// worker process on the same file and with no etcd: create, resume and pause
/// answer as on etcd; after the worker is killed with -9 and another started, the
/// paused task is still Paused, and a resume runs it on the new one; `serve` on the
/// file lists it and pauses it over HTTP. A `--store`
/// that is not `sqlite:PATH`, or names a file that is not a store, is bad input
/// that changes nothing.
#[test]
fn the_command_runs_on_a_store_file_beside_a_worker_process() {
    let dir = std::env::temp_dir().join(format!(
        "taskstage-cli-file-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(dir.clone());
    let store = format!("sqlite:{}", dir.join("tasks.db").display());
    let w1 = WORKERS.spawn(
        "w1",
        std::slice::from_ref(&store),
        &dir,
        Settings::default(),
    );
    let spec = dir.join("orders.json");
    std::fs::write(&spec, b"{}").expect("a spec file");
    let spec = spec.display().to_string();

    let ran = taskstage_on_file(&store, &["create", "orders", "--spec-file", &spec]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let ran = taskstage_on_file(&store, &["resume", "orders", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let ran = taskstage_on_file(&store, &["pause", "orders", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let listed = taskstage_on_file(&store, &["--output", "json", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let orders = entry(&listed.json(), "orders").clone();
    assert_eq!(orders["desired"], "Paused", "{orders}");
    assert_eq!(orders["observed"], "Paused", "{orders}");
    assert_eq!(orders["owner"], "w1", "{orders}");

    drop(w1); // SIGKILL, by pid
    let _w2 = WORKERS.spawn(
        "w2",
        std::slice::from_ref(&store),
        &dir,
        Settings::default(),
    );
    let deadline = Instant::now() + WAIT;
    // Bounded by the deadline: each turn runs the command once.
    loop {
        let workers = taskstage_on_file(&store, &["--output", "json", "workers"]);
        assert_eq!(workers.code, 0, "{workers:?}");
        let members = workers.json();
        let ids: Vec<&str> = members
            .as_array()
            .map(|a| a.iter().filter_map(|w| w["worker"].as_str()).collect())
            .unwrap_or_default();
        if ids == ["w2"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "w1 never left, or w2 never joined: {members}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = taskstage_on_file(&store, &["--output", "json", "status", "orders"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert_eq!(status.json()["desired"], "Paused", "{status:?}");
    assert_ne!(status.json()["observed"], "Running", "{status:?}");
    let ran = taskstage_on_file(&store, &["resume", "orders", "--timeout", "20s"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let status = taskstage_on_file(&store, &["--output", "json", "status", "orders"]);
    assert_eq!(status.json()["owner"], "w2", "{status:?}");
    assert_eq!(status.json()["observed"], "Running", "{status:?}");

    // `serve` on the same file: the API lists the task and commands it through the
    // file, as the command line does.
    let (mut serve, addr, _) = start_serve_on(&["--store", &store], &["--no-token"]);
    let (status, body) = http(&addr, "GET /v1/tasks", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"orders\""), "{body}");
    let (status, body) = http(&addr, "POST /v1/tasks/orders/pause", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"Paused\""), "{body}");
    let status = taskstage_on_file(&store, &["--output", "json", "status", "orders"]);
    assert_eq!(status.json()["desired"], "Paused", "{status:?}");
    assert_eq!(status.json()["observed"], "Paused", "{status:?}");
    // An event stream open at ctrl-c ends as a response ends (its last chunk), not
    // cut off by the shutdown's drain.
    let mut watching = std::net::TcpStream::connect(&addr).expect("connect to serve");
    {
        use std::io::Write;
        write!(
            watching,
            "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("a request");
    }
    watching
        .set_read_timeout(Some(WAIT))
        .expect("a read timeout");
    let mut head = [0u8; 12];
    std::io::Read::read_exact(&mut watching, &mut head).expect("the stream's answer");
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    signal_pid(serve.pid(), rustix::process::Signal::INT);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut watching, &mut rest).expect("the stream ends");
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.ends_with("\r\n0\r\n\r\n"),
        "the stream was cut off, not ended: {rest:?}"
    );
    assert_eq!(
        wait_exit(&mut serve, WAIT, "serve on the file after SIGINT"),
        0
    );

    let ran = taskstage_on_file("postgres://db/tasks", &["list"]);
    assert_eq!(ran.code, 2, "{ran:?}");
    assert!(ran.stderr.contains("sqlite:PATH"), "{ran:?}");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a store\n").expect("written");
    let ran = taskstage_on_file(&format!("sqlite:{}", text.display()), &["list"]);
    assert_error(
        &ran,
        2,
        &["list: store file", "notes.txt", "not a taskstage store"],
    );
    assert_eq!(std::fs::read(&text).expect("read"), b"not a store\n");
}
