//! A worker joining a busy cluster gets its fair share by a graceful hand-over, on a
//! real etcd (3 members on 127.0.0.1) with worker *processes*: this test binary
//! started again as `worker_process` (an ignored test that does nothing unless
//! `TASKSTAGE_HANDOVER_WORKER` is set).
//!
//! Three workers run [`TASKS`] tasks whose units write a fenced checkpoint every
//! [`WRITE_EVERY`]; a fourth joins. Within [`REBALANCE`] the most tasks per worker
//! over the fewest must be at most [`BALANCE`], and:
//!
//! - every task that changed owner did so by a hand-over: its run on the old owner
//!   was dropped before the new owner's began, and the old owner's last report
//!   before its owner key went away named a stage with no run alive (Paused or New)
//!   without a failure; no worker lost its lease (each joined once), so every owner
//!   key that went away was released by its owner, not expired;
//! - no task was reported Stopped, Finished or failed, every task ends observed
//!   Running, and the desired stages are the controller's, unchanged;
//! - the history checker passes (`cluster_support::history`, rules 1–4): at most one
//!   run of a task alive at any instant, across every process.
//!
//! Every process the test starts is killed by pid when its guard drops, also when
//! the test fails; a worker process also exits when its stdin (a pipe from the test)
//! closes. Without an `etcd` binary the test says SKIPPED and passes, except under
//! `CI=true`, where it fails.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::history::{histories, remove_histories, Fault, History, Recorder};
use cluster_support::process::{self, Settings, Units, Values, WorkerKind};
use cluster_support::{per_worker, ChildGuard, EtcdCluster};
use taskstage::Stage;
use taskstage_cluster::{Controller, DesiredStage, EtcdCoordinator, EtcdOptions, TaskStatus};

const PREFIX: &str = "handover";
/// How soon after a thaw a frozen owner must drop its run (nothing is frozen here).
const THAW_ALLOWANCE: Duration = Duration::from_millis(1_500);
const TASKS: usize = 30;
/// How often a unit writes its fenced checkpoint.
const WRITE_EVERY: Duration = Duration::from_millis(200);
/// The busy workers; one more joins them.
const BUSY: usize = 3;
/// Most tasks per worker over fewest, at most, once the newcomer has its share.
const BALANCE: f64 = 1.25;
/// How soon after the newcomer's start the balance must be reached.
const REBALANCE: Duration = Duration::from_secs(30);
/// Any wait of the set-up (workers registered, every task running).
const SETUP: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- worker process

/// The worker processes: probes writing a count every [`WRITE_EVERY`], and room
/// for every task: a fair share must come from the membership, not from the
/// capacity.
const WORKERS: WorkerKind = WorkerKind {
    env: "TASKSTAGE_HANDOVER",
    prefix: PREFIX,
    units: Units::Probe {
        every: WRITE_EVERY,
        values: Values::Counted,
    },
    capacity: Some(TASKS),
};

/// The worker process: joins (again whenever its lease is lost, each join written
/// to its `.joins` file) and runs probes.
#[test]
#[ignore = "a worker process of the hand-over test; it starts it with TASKSTAGE_HANDOVER_WORKER set"]
fn worker_process() {
    process::worker_process(&WORKERS);
}

// ---------------------------------------------------------------- the test side

struct Fleet {
    cluster: EtcdCluster,
    dir: PathBuf,
    procs: Vec<(String, ChildGuard)>,
    recorder: Arc<Recorder>,
    controller: Controller,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Workers first (by pid); the cluster's own guard then stops the members.
        self.procs.clear();
        remove_histories(&self.dir);
    }
}

impl Fleet {
    fn spawn(&mut self, id: &str) {
        let endpoints = self.cluster.endpoints();
        let child = WORKERS.spawn(id, &endpoints, &self.dir, Settings::default());
        self.procs.push((id.to_owned(), child));
    }

    fn ids(&self) -> Vec<String> {
        self.procs.iter().map(|(id, _)| id.clone()).collect()
    }

    /// Waits until every worker process is a member.
    async fn registered(&self) {
        let deadline = Instant::now() + SETUP;
        // Bounded by the deadline, polling every 50 ms.
        loop {
            let members = self.controller.workers().await.unwrap_or_default();
            if self
                .ids()
                .iter()
                .all(|id| members.iter().any(|m| m.as_str() == id))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the workers did not all join within {SETUP:?}: {members:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every task's status (bounded; `None` when the read failed).
    async fn list(&self) -> Option<Vec<TaskStatus>> {
        tokio::time::timeout(Duration::from_secs(5), self.controller.list())
            .await
            .ok()?
            .ok()
    }
}

/// Whether the current owner's report answers the desired revision with Running.
fn running(status: &TaskStatus) -> bool {
    status.desired == DesiredStage::Running
        && status.answers(status.desired_revision)
        && status.current_observed().map(|o| o.stage) == Some(Stage::Running)
}

/// Most over fewest (infinite when a worker holds none).
fn balance(counts: &BTreeMap<String, usize>) -> f64 {
    let max = counts.values().copied().max().unwrap_or(0);
    let min = counts.values().copied().min().unwrap_or(0);
    if min == 0 {
        f64::INFINITY
    } else {
        max as f64 / min as f64
    }
}

/// One report of an owner in etcd's history.
#[derive(Debug, Clone)]
struct Report {
    revision: i64,
    stage: String,
    outcome: String,
    owner: String,
    token: i64,
}

/// A change of a task's owner key in etcd's history: its revision, and the key's
/// create revision and value (`None`: deleted).
type OwnerEvent = (i64, Option<(i64, String)>);

/// etcd's history of each task's owner key and reports, from revision 1 (the test
/// cluster never compacts) to the revision current when it is called: per task, in
/// revision order, `Ok(report)` or `Err(owner key change)`.
async fn replay(endpoints: &[String]) -> BTreeMap<String, Vec<Result<Report, OwnerEvent>>> {
    use etcd_client::{Client, EventType, GetOptions, WatchOptions};
    let mut client = Client::connect(endpoints, None)
        .await
        .expect("connect to etcd for the replay");
    let head = client
        .get(
            format!("{PREFIX}/"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("read etcd's current revision")
        .header()
        .map(|h| h.revision())
        .expect("a response header");
    let mut stream = client
        .watch(
            format!("{PREFIX}/"),
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .expect("watch the prefix from revision 1");
    let tasks = format!("{PREFIX}/tasks/");
    let mut history: BTreeMap<String, Vec<Result<Report, OwnerEvent>>> = BTreeMap::new();
    let mut last = 0;
    let deadline = Instant::now() + SETUP;
    // Bounded by the deadline: the history up to `head` is finite.
    while last < head {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("etcd's history read to {last} of {head} within {SETUP:?}"))
            .expect("a watch message")
            .expect("the watch open");
        assert!(
            !message.canceled(),
            "the replay watch was cancelled (compacted at {})",
            message.compact_revision()
        );
        for event in message.events() {
            let Some(kv) = event.kv() else { continue };
            let revision = kv.mod_revision();
            last = last.max(revision);
            if revision > head {
                continue;
            }
            let key = String::from_utf8_lossy(kv.key());
            let Some((task, name)) = key.strip_prefix(&tasks).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            let put = event.event_type() == EventType::Put;
            let entry = match name {
                "owner" => Err((revision, put.then(|| (kv.create_revision(), value)))),
                "observed" if put => {
                    let field = |name: &str| {
                        value
                            .lines()
                            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                            .unwrap_or("")
                            .to_owned()
                    };
                    Ok(Report {
                        revision,
                        stage: field("stage"),
                        outcome: field("outcome"),
                        owner: field("owner"),
                        token: field("owner_revision").parse().unwrap_or(0),
                    })
                }
                _ => continue,
            };
            history.entry(task.to_owned()).or_default().push(entry);
        }
    }
    // Within one revision (one transaction), a report before an owner key's change:
    // an owner may report and release in one transaction, in either order.
    for events in history.values_mut() {
        events.sort_by_key(|e| match e {
            Ok(report) => (report.revision, 0),
            Err((revision, _)) => (*revision, 1),
        });
    }
    history
}

/// A run as the processes recorded it: (start, drop, worker, token).
type RunSpan = (u64, Option<u64>, String, i64);

/// The runs of each task, from the `alive` and `drop` lines of every history file,
/// in order of start.
fn runs(dir: &Path) -> BTreeMap<String, Vec<RunSpan>> {
    let mut by_id: BTreeMap<String, (String, RunSpan)> = BTreeMap::new();
    let mut drops = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the history directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|x| x != "history") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a history file");
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match (f.first().copied(), f.len()) {
                (Some("alive"), 7) => {
                    let (Ok(start), Ok(token)) = (f[1].parse(), f[6].parse()) else {
                        continue;
                    };
                    by_id.insert(
                        f[2].to_owned(),
                        (f[3].to_owned(), (start, None, f[4].to_owned(), token)),
                    );
                }
                (Some("drop"), 3) => {
                    if let Ok(at) = f[1].parse::<u64>() {
                        drops.push((f[2].to_owned(), at));
                    }
                }
                _ => {}
            }
        }
    }
    for (id, at) in drops {
        if let Some((_, span)) = by_id.get_mut(&id) {
            span.1 = Some(at);
        }
    }
    let mut by_task: BTreeMap<String, Vec<RunSpan>> = BTreeMap::new();
    for (task, span) in by_id.into_values() {
        by_task.entry(task).or_default().push(span);
    }
    for spans in by_task.values_mut() {
        spans.sort_by_key(|s| s.0);
    }
    by_task
}

/// How many times each worker process joined, from the `.joins` files.
fn joins(dir: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read the history directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|x| x != "joins") {
            continue;
        }
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path).expect("read a joins file");
        counts.insert(name, text.lines().count());
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_worker_gets_its_share_by_graceful_hand_over() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let (dir, recorder) = histories("handover");
    let coord = EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
        .await
        .expect("connect to the test cluster");
    let mut fleet = Fleet {
        cluster,
        dir: dir.clone(),
        procs: Vec::new(),
        recorder,
        controller: Controller::new(coord, PREFIX).expect("a controller"),
    };
    for i in 1..=BUSY {
        fleet.spawn(&format!("w{i}"));
    }
    fleet.registered().await;
    let names: Vec<String> = (0..TASKS).map(|i| format!("t{i:02}")).collect();
    let mut created = BTreeMap::new();
    for task in &names {
        let revision = fleet
            .controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create a task");
        created.insert(task.clone(), revision);
    }

    // Three busy workers: every task running, each worker holding some.
    let busy = fleet.ids();
    let deadline = Instant::now() + SETUP;
    // Bounded by the deadline, polling every 100 ms.
    let before = loop {
        let list = fleet.list().await.unwrap_or_default();
        let counts = per_worker(&list, &busy);
        if list.len() == TASKS && list.iter().all(running) && counts.values().all(|c| *c > 0) {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "three busy workers within {SETUP:?}: {} of {TASKS} tasks running, per worker {counts:?}",
            list.iter().filter(|s| running(s)).count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let owners_before: BTreeMap<String, Option<String>> = before
        .iter()
        .map(|s| {
            (
                s.task.as_str().to_owned(),
                s.owner.as_ref().map(|w| w.as_str().to_owned()),
            )
        })
        .collect();
    eprintln!(
        "before the join: per worker {:?}",
        per_worker(&before, &busy)
    );
    // Let them write a while under load.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A fourth worker joins.
    fleet.spawn(&format!("w{}", BUSY + 1));
    let joined = Instant::now();
    let all = fleet.ids();
    let mut reached = None;
    let mut last = Vec::new();
    // Bounded by REBALANCE, polling every 100 ms.
    while joined.elapsed() < REBALANCE {
        if let Some(list) = fleet.list().await {
            let b = balance(&per_worker(&list, &all));
            let done = b <= BALANCE && list.len() == TASKS && list.iter().all(running);
            last = list;
            if done {
                reached = Some(joined.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counts = per_worker(&last, &all);
    eprintln!(
        "after the join: per worker {counts:?}, balance {:.2}, reached {reached:?}",
        balance(&counts)
    );

    // Every task ends observed Running (a hand-over may still be under way: up to
    // SETUP for them to settle); the end is recorded for rule 3.
    let settle = Instant::now() + SETUP;
    // Bounded by `settle`, polling every 100 ms.
    let end = loop {
        let list = fleet.list().await.unwrap_or_default();
        if (list.len() == TASKS && list.iter().all(running)) || Instant::now() >= settle {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(end.len(), TASKS, "every task read at the end: {end:?}");
    for status in &end {
        fleet.recorder.end(
            status.task.as_str(),
            status.desired.name(),
            status.owner.as_ref().map(|w| w.as_str()),
        );
    }
    let ids: Vec<(String, u32)> = fleet
        .procs
        .iter()
        .map(|(id, child)| (id.clone(), child.pid()))
        .collect();
    fleet.procs.clear();
    for (_, pid) in &ids {
        fleet.recorder.fault(Fault::Killed, *pid);
    }
    let verdict = History::load(&dir)
        .expect("read the histories")
        .check(THAW_ALLOWANCE);
    let reports = replay(&fleet.cluster.endpoints()).await;
    let spans = runs(&dir);
    let joined_count = joins(&dir);

    let mut problems = Vec::new();
    if reached.is_none() {
        problems.push(format!(
            "balance {:.2} (per worker {counts:?}) is above {BALANCE} {REBALANCE:?} after a \
             fourth worker joined three busy ones",
            balance(&counts)
        ));
    }
    if !verdict.passed() || verdict.max_live != 1 {
        problems.push(format!("the history checker: {verdict}"));
    }
    for (name, count) in &joined_count {
        if *count != 1 {
            problems.push(format!(
                "{name} joined {count} times: a lease was lost, so an owner key may have \
                 expired rather than been handed over"
            ));
        }
    }
    if joined_count.len() != BUSY + 1 {
        problems.push(format!("joins recorded: {joined_count:?}"));
    }
    for status in &end {
        let task = status.task.as_str();
        if !running(status) {
            problems.push(format!(
                "{task} is not observed Running at the end: {status:?}"
            ));
        }
        if created.get(task) != Some(&status.desired_revision) {
            problems.push(format!(
                "{task}'s desired stage changed (revision {} at creation, {} at the end): a \
                 hand-over must not go through the controller's desired stage",
                created.get(task).copied().unwrap_or(0),
                status.desired_revision
            ));
        }
    }
    let mut moved = 0;
    for task in &names {
        let now = end
            .iter()
            .find(|s| s.task.as_str() == task)
            .and_then(|s| s.owner.as_ref().map(|w| w.as_str().to_owned()));
        if owners_before.get(task).cloned().flatten() != now {
            moved += 1;
        }
        // The runs: each dropped before the next began.
        let spans = spans.get(task).cloned().unwrap_or_default();
        for pair in spans.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            if prev.1.is_none_or(|dropped| dropped > next.0) {
                problems.push(format!(
                    "{task}: the run of {} (token {}) was not dropped before {}'s run (token \
                     {}) began",
                    prev.2, prev.3, next.2, next.3
                ));
            }
        }
        // The reports and owner keys in etcd's order.
        let events = reports.get(task).cloned().unwrap_or_default();
        let mut last_report: Option<&Report> = None;
        let mut owner: Option<(i64, String)> = None;
        for event in &events {
            match event {
                Ok(report) => {
                    if matches!(report.stage.as_str(), "Stopped" | "Finished")
                        || report.outcome.starts_with("failed")
                    {
                        problems.push(format!(
                            "{task} was reported {} (outcome {}) by {} at revision {}",
                            report.stage, report.outcome, report.owner, report.revision
                        ));
                    }
                    last_report = Some(report);
                }
                Err((_, Some(key))) => owner = Some(key.clone()),
                Err((revision, None)) => {
                    // The owner key went away: its owner's last report must say that
                    // no run was alive.
                    let Some((token, value)) = owner.take() else {
                        continue;
                    };
                    let worker = value.split('@').next().unwrap_or("").to_owned();
                    let handed = last_report.is_some_and(|r| {
                        r.owner == worker
                            && r.token == token
                            && matches!(r.stage.as_str(), "Paused" | "New")
                            && !r.outcome.starts_with("failed")
                    });
                    if !handed {
                        problems.push(format!(
                            "{task}: {worker}'s owner key (token {token}) went away at revision \
                             {revision} after its last report {last_report:?}: not a hand-over \
                             (the run paused and reported before the release)"
                        ));
                    }
                }
            }
        }
    }
    eprintln!("hand-over: {moved} tasks moved; the history: {verdict}; rebalanced in {reached:?}");
    assert!(
        problems.is_empty(),
        "{} problems:\n  - {}",
        problems.len(),
        problems.join("\n  - ")
    );
    assert!(moved > 0, "no task moved, yet the balance was reached");
}
