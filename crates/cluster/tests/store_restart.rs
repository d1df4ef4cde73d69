//! A pause that survives a restart, on the store file of one machine: a worker
//! *process* (this test binary again, as its ignored test `worker_process`) runs
//! every task, an operator has paused some of them, and the process is killed with
//! -9 at seeded moments and started again each time. After each restart: the paused
//! tasks are still Paused and none of them ran meanwhile; every other task runs
//! again, and the store holds each one's last acknowledged checkpoint (or a later
//! one); no two runs of a task ever overlap; SQLite's integrity check passes.
//!
//! The sizes are the environment's (`TASKSTAGE_RESTART_TASKS`, 100 unless set, a
//! fifth of them paused; `TASKSTAGE_RESTART_KILLS`, 5; `TASKSTAGE_RESTART_SEED`,
//! random and printed): docs/cluster.md gives the figures of a run at 1,000 tasks
//! and 20 kills.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use taskstage::Stage;
use taskstage_cluster::{Controller, Coordinator, DesiredStage, SqliteCoordinator, TaskStatus};
use taskstage_harness::cluster::history::{histories, now_ns, remove_histories, Fault, History};
use taskstage_harness::cluster::process::{self, Settings, Units, Values, WorkerKind, TTL};

const PREFIX: &str = "restart";
/// The bound of every wait.
const WAIT: Duration = Duration::from_secs(60);

/// Probes that write a checkpoint carrying an id of its own every 100 ms.
const WORKERS: WorkerKind = WorkerKind {
    env: "TASKSTAGE_RESTART",
    prefix: PREFIX,
    units: Units::Probe {
        every: Duration::from_millis(100),
        values: Values::Unique,
    },
    capacity: None,
};

/// The worker process.
#[test]
#[ignore = "a worker process of the restart test; it starts it with TASKSTAGE_RESTART_WORKER set"]
fn worker_process() {
    process::worker_process(&WORKERS);
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Removes the run's directory when the test ends (kept when it fails).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_histories(&self.0);
    }
}

/// Whether `status` is answered Running by its current owner.
fn running(status: &TaskStatus) -> bool {
    status.answers(status.desired_revision)
        && status.current_observed().map(|o| o.stage) == Some(Stage::Running)
}

/// Waits until every task of `tasks` is answered Running by a current owner whose
/// token is not the one `before` holds for it (the killed process keeps its owner
/// keys, and its last reports stand, until its lease ends).
async fn all_running(
    controller: &Controller,
    tasks: &[String],
    before: &HashMap<String, i64>,
    what: &str,
) -> Duration {
    let started = tokio::time::Instant::now();
    let deadline = started + WAIT;
    // Bounded by the deadline: each turn waits for a change of the tasks.
    loop {
        let (revision, list) = controller.list_with_revision().await.expect("a listing");
        let waiting = tasks
            .iter()
            .filter(|t| {
                !list.iter().any(|s| {
                    s.task.as_str() == t.as_str()
                        && running(s)
                        && s.owner_revision != before.get(t.as_str()).copied()
                })
            })
            .count();
        if waiting == 0 {
            return started.elapsed();
        }
        let now = tokio::time::Instant::now();
        assert!(
            now < deadline,
            "{what}: {waiting} tasks not running after {WAIT:?}"
        );
        let _ = controller
            .wait_tasks_change(revision, (deadline - now).min(Duration::from_millis(500)))
            .await;
    }
}

/// The id the checkpoint of `task` carries in the store now, if it has one.
async fn stored_id(store: &SqliteCoordinator, task: &str) -> Option<String> {
    let key = format!("{PREFIX}/checkpoints/{task}/pos");
    let listing = store.list(key.clone()).await.expect("a read");
    let value = String::from_utf8_lossy(&listing.get(&key)?.value).into_owned();
    value.rsplit('|').next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_tasks_stay_paused_and_the_rest_resume_across_kills_of_the_worker() {
    let count = env_or("TASKSTAGE_RESTART_TASKS", 100) as usize;
    let kills = env_or("TASKSTAGE_RESTART_KILLS", 5);
    let seed = env_or("TASKSTAGE_RESTART_SEED", fastrand::u64(..));
    eprintln!(
        "restart: {count} tasks, {} paused, {kills} kills, seed {seed}",
        count / 5
    );
    let mut rng = fastrand::Rng::with_seed(seed);

    let (dir, recorder) = histories("restart");
    let _cleanup = Cleanup(dir.clone());
    let file = dir.join("store.db");
    let store = SqliteCoordinator::open(&file).await.expect("a store file");
    let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
    let endpoints = vec![format!("sqlite:{}", file.display())];
    let settings = Settings {
        capacity: Some(count),
        ..Settings::default()
    };
    let mut worker = WORKERS.spawn("w1", &endpoints, &dir, settings);

    let tasks: Vec<String> = (0..count).map(|i| format!("t{i:04}")).collect();
    for task in &tasks {
        controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("created");
    }
    let took = all_running(&controller, &tasks, &HashMap::new(), "the start").await;
    eprintln!("restart: {count} tasks running {took:?} after their creation");
    let (paused, others) = tasks.split_at(count / 5);
    for task in paused {
        let answer = controller.pause_within(task, WAIT).await.expect("paused");
        let status = controller.status(task).await.expect("a status");
        assert_eq!(answer.stage, Stage::Paused, "{task}: {answer:?} {status:?}");
    }
    let paused_at = now_ns();

    let mut back = Vec::new();
    for round in 0..kills {
        // The seeded moment: somewhere in the middle of the units' writes.
        tokio::time::sleep(Duration::from_millis(rng.u64(100..1_500))).await;
        let tokens: HashMap<String, i64> = controller
            .list()
            .await
            .expect("a listing")
            .into_iter()
            .filter_map(|s| Some((s.task.as_str().to_owned(), s.owner_revision?)))
            .collect();
        let pid = worker.pid();
        drop(worker); // SIGKILL, by pid, reaped
        recorder.fault(Fault::Killed, pid);

        // Nothing acknowledged is lost: the store holds each task's last accepted
        // write, or one sent after it (applied, its answer cut by the kill).
        let history = History::load(&dir).expect("the histories");
        for task in others {
            let Some((last, sent)) = history.last_accepted(task) else {
                continue;
            };
            let stored = stored_id(&store, task).await;
            let kept = stored.as_deref() == Some(last)
                || stored
                    .as_deref()
                    .is_some_and(|id| history.sent_of(id).is_none_or(|s| s >= sent));
            assert!(
                kept,
                "round {round}, seed {seed}: {task}'s acknowledged write {last} is not in the \
                 store, which holds {stored:?}"
            );
        }

        worker = WORKERS.spawn("w1", &endpoints, &dir, settings);
        let took = all_running(&controller, others, &tokens, &format!("round {round}")).await;
        back.push(took);
        let history = History::load(&dir).expect("the histories");
        for task in paused {
            let status = controller.status(task).await.expect("a status");
            assert_eq!(
                status.desired,
                DesiredStage::Paused,
                "round {round}: {task}"
            );
            assert_eq!(
                history.starts_since(task, paused_at),
                0,
                "round {round}, seed {seed}: the paused {task} ran"
            );
        }
    }
    back.sort();
    eprintln!(
        "restart: the running tasks ran again under a new token within {:?} (median {:?}) of \
         the new process's start, TTL {TTL:?}",
        back.last(),
        back.get(back.len() / 2)
    );

    let pid = worker.pid();
    drop(worker);
    recorder.fault(Fault::Killed, pid);
    let verdict = History::load(&dir)
        .expect("the histories")
        .check(Duration::from_millis(1_500));
    eprintln!("history: {verdict}");
    assert!(verdict.violations.is_empty(), "seed {seed}: {verdict}");
    assert_eq!(verdict.max_live, 1, "seed {seed}: {verdict}");
    drop(store);
    let check: String = rusqlite::Connection::open(&file)
        .and_then(|c| c.query_row("PRAGMA integrity_check", [], |row| row.get(0)))
        .expect("the store file can be checked");
    assert_eq!(check, "ok");
}
