//! A soak of the HTTP API (feature `http`): 200 concurrent clients for 60 s against
//! 10,000 tasks, through the router in process.
//!
//! - 150 clients list (`GET /v1/tasks`: pages, stage filters, now and then the whole
//!   list of 10,000), each checking every answer (200, the totals, each item's id);
//! - 20 clients follow `GET /v1/events`, checking that the event numbers go up by one
//!   (a gap marker, if a reader lagged, must account for every number it skips);
//! - 30 clients command their own 10 tasks each (pause and resume, `?wait=10s`), and
//!   check every answer from the unit: a 200 Paused means the task's run is gone at
//!   that moment (its live count is 0), a 200 Running that its run comes alive.
//!
//! No answer may be an error, and memory must stay flat: the heap the process holds
//! when every client has ended is at most 10% above the most it held at a quiet
//! moment of the first half (every 5 s and at half time, with no list or command in
//! flight; the event streams stay open). The heap is counted by the allocator, not
//! read from the resident set: the resident set keeps the peaks of the whole lists
//! in flight (some tens of MiB, more when a busy machine slows their readers), which
//! the allocator does not hand back, so it measured the load, not what stays.
//!
//! The duration is 60 s unless `TASKSTAGE_SOAK_SECS` asks for another; under
//! `CI=true` it is never below 60 s. Every client paces its requests (the point is a
//! long, steady load, not the most requests a second), so that the soak can run
//! beside other suites on a 2-core machine.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::http as http_common;

use std::alloc::System;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use cap::Cap;
use http_common::{call, running_probes, Live, SseReader};
use taskstage_http::{Api, Auth, LocalTasks};
use tokio::sync::RwLock;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Counts the bytes on the heap now, by every thread.
#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

/// Held (shared) by a client for each request; the sampler takes it alone, so that
/// it counts the heap with no list or command in flight.
type Quiet = Arc<RwLock<()>>;

const ADMIN: &str = "admin-token";
const READ: &str = "read-token";
const TASKS: usize = 10_000;
const LISTERS: usize = 150;
const STREAMS: usize = 20;
const COMMANDERS: usize = 30;
const TASKS_PER_COMMANDER: usize = 10;

/// The soak's duration: 60 s, or `TASKSTAGE_SOAK_SECS` (never below 60 under `CI=true`).
fn duration() -> Duration {
    const DEFAULT: u64 = 60;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let asked = std::env::var("TASKSTAGE_SOAK_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let secs = match asked {
        Some(secs) if ci && secs < DEFAULT => {
            eprintln!("soak: TASKSTAGE_SOAK_SECS={secs} is below {DEFAULT} under CI; {DEFAULT} s");
            DEFAULT
        }
        Some(secs) if secs > 0 => secs,
        _ => DEFAULT,
    };
    Duration::from_secs(secs)
}

/// The resident set of this process, in KiB, from `/proc/self/status`.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// Counts of what the clients did, for the report.
#[derive(Default)]
struct Counts {
    lists: AtomicU64,
    events: AtomicU64,
    gaps: AtomicU64,
    pauses: AtomicU64,
    resumes: AtomicU64,
}

async fn lister(router: Router, n: usize, until: Instant, counts: Arc<Counts>, quiet: Quiet) {
    let mut rng = fastrand::Rng::with_seed(n as u64);
    // Bounded by `until`.
    while Instant::now() < until {
        let (uri, whole) = match rng.u8(..50) {
            0 => (format!("/v1/tasks?limit={TASKS}"), true),
            1..=5 => ("/v1/tasks?stage=Paused&limit=100".to_owned(), false),
            _ => {
                let offset = rng.usize(..TASKS);
                (format!("/v1/tasks?offset={offset}&limit=100"), false)
            }
        };
        // The answer is checked, then dropped before the pause: a client holds no
        // list between its requests.
        let request = quiet.read().await;
        let (status, list) = call(&router, "GET", &uri, Some(READ), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {list}");
        let items = list["items"].as_array().expect("items");
        if uri.contains("stage=Paused") {
            assert!(
                items.iter().all(|i| i["stage"] == "Paused"),
                "{uri}: a task not Paused"
            );
        } else {
            assert_eq!(list["total"], TASKS, "{uri}");
            let offset = list["offset"].as_u64().expect("an offset") as usize;
            let expected = if whole {
                TASKS
            } else {
                (TASKS - offset).min(100)
            };
            assert_eq!(items.len(), expected, "{uri}");
            if let Some(first) = items.first() {
                assert_eq!(first["id"], format!("t{offset:05}"), "{uri}: the order");
            }
        }
        drop(list);
        drop(request);
        counts.lists.fetch_add(1, Ordering::Relaxed);
        // Pacing: a steady load, not a flood.
        tokio::time::sleep(Duration::from_millis(2000 + rng.u64(..2000))).await;
    }
}

async fn follower(router: Router, until: Instant, counts: Arc<Counts>) {
    let mut stream = SseReader::open(&router, "/v1/events", READ, None).await;
    let mut last: Option<u64> = None;
    // Bounded by `until`: each read waits at most until it.
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let Some(event) = stream.next(left).await else {
            break;
        };
        match (event.event.as_str(), event.id) {
            ("gap", None) => {
                // A lagged reader is told where it resumes: nothing is skipped silently.
                let next = event.data["next_seq"].as_u64().expect("a gap's next_seq");
                let missed = event.data["missed"].as_u64().expect("a gap's count");
                if let Some(last) = last {
                    assert_eq!(last + 1 + missed, next, "a gap that miscounts");
                }
                last = next.checked_sub(1);
                counts.gaps.fetch_add(1, Ordering::Relaxed);
            }
            // A numbered record: a change, or a task's own journal that lagged.
            (kind, Some(id)) => {
                if let Some(last) = last {
                    assert_eq!(id, last + 1, "an event number skipped without a gap");
                }
                if kind == "change" {
                    assert!(event.data["item"]["stage"].is_string(), "{:?}", event.data);
                } else {
                    assert_eq!(kind, "gap", "{:?}", event.data);
                }
                last = Some(id);
                counts.events.fetch_add(1, Ordering::Relaxed);
            }
            (other, None) => panic!("an unnumbered {other:?} event: {:?}", event.data),
        }
    }
}

async fn commander(
    router: Router,
    seed: u64,
    tasks: Vec<(String, Live)>,
    until: Instant,
    counts: Arc<Counts>,
    quiet: Quiet,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Bounded by `until`.
    while Instant::now() < until {
        let (name, live) = &tasks[rng.usize(..tasks.len())];
        let uri = format!("/v1/tasks/{name}/pause?wait=10s");
        let request = quiet.read().await;
        let (status, answer) = call(&router, "POST", &uri, Some(ADMIN), None).await;
        drop(request);
        assert_eq!(status, StatusCode::OK, "{uri}: {answer}");
        assert_eq!(answer["stage"], "Paused", "{uri}: {answer}");
        assert_eq!(live.now(), 0, "{uri}: a 200 Paused with the run alive");
        counts.pauses.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(400 + rng.u64(..400))).await;

        let uri = format!("/v1/tasks/{name}/resume?wait=10s");
        let request = quiet.read().await;
        let (status, answer) = call(&router, "POST", &uri, Some(ADMIN), None).await;
        drop(request);
        assert_eq!(status, StatusCode::OK, "{uri}: {answer}");
        assert_eq!(answer["stage"], "Running", "{uri}: {answer}");
        // Running is published once the run is launched; its code starts a moment
        // later, and never twice.
        live.reaches(1).await;
        counts.resumes.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(400 + rng.u64(..400))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_for_a_minute_get_no_error_and_memory_stays_flat() {
    let length = duration();
    let (group, lives) = running_probes(TASKS).await;
    let tasks = LocalTasks::from_group(&group).expect("one task per name");
    let router = Api::local(&tasks)
        .auth(Auth::tokens().admin(ADMIN).read_only(READ))
        .router();
    let counts = Arc::new(Counts::default());
    let quiet: Quiet = Arc::default();
    let started = Instant::now();
    let until = started + length;
    let mut clients = JoinSet::new();
    for n in 0..LISTERS {
        clients.spawn(lister(
            router.clone(),
            n,
            until,
            Arc::clone(&counts),
            Arc::clone(&quiet),
        ));
    }
    for _ in 0..STREAMS {
        clients.spawn(follower(router.clone(), until, Arc::clone(&counts)));
    }
    for c in 0..COMMANDERS {
        // Each commander owns its tasks: no two clients command one task.
        let own: Vec<(String, Live)> = (0..TASKS_PER_COMMANDER)
            .map(|k| {
                let i = (c * TASKS_PER_COMMANDER + k) * 31 % TASKS;
                (format!("t{i:05}"), lives[i].clone())
            })
            .collect();
        clients.spawn(commander(
            router.clone(),
            c as u64,
            own,
            until,
            Arc::clone(&counts),
            Arc::clone(&quiet),
        ));
    }

    // The heap at a quiet moment every 5 s in the first half and at half time (the
    // highest of them), against the heap once every client has ended. The resident
    // set is reported beside it, not judged.
    let heap_at_rest = || async {
        // Waits for the requests in flight (each at most 10 s) and holds new ones.
        let _alone = quiet.write().await;
        ALLOC.allocated() / 1024
    };
    let mut samples = Vec::new();
    let mut at = started;
    while at + Duration::from_secs(5) < started + length / 2 {
        at += Duration::from_secs(5);
        tokio::time::sleep_until(at).await;
        samples.push(heap_at_rest().await);
    }
    tokio::time::sleep_until(started + length / 2).await;
    samples.push(heap_at_rest().await);
    let first_half = samples.iter().max().copied().unwrap_or_default();
    let rss_middle = rss_kib() / 1024;
    // Bounded: every client ends at `until`, and a command waits at most 10 s more.
    while let Some(ended) = clients.join_next().await {
        if let Err(error) = ended {
            clients.abort_all();
            std::panic::resume_unwind(error.into_panic());
        }
    }
    let end = heap_at_rest().await;
    samples.push(end);
    let rss_end = rss_kib() / 1024;
    let took = started.elapsed();
    let c = &counts;
    eprintln!(
        "soak: {took:?}, {} lists, {} events ({} gaps), {} pauses, {} resumes; heap at rest {} KiB at most in the first half, {} KiB at the end (KiB every 5 s, at half time, at the end: {samples:?}); resident set {rss_middle} MiB at half time, {rss_end} MiB at the end",
        c.lists.load(Ordering::Relaxed),
        c.events.load(Ordering::Relaxed),
        c.gaps.load(Ordering::Relaxed),
        c.pauses.load(Ordering::Relaxed),
        c.resumes.load(Ordering::Relaxed),
        first_half,
        end
    );
    assert!(
        end <= first_half + first_half / 10,
        "the heap at rest grew from {first_half} KiB (the most in the first half) to {end} KiB"
    );
    assert!(
        c.pauses.load(Ordering::Relaxed) >= COMMANDERS as u64,
        "commands ran"
    );
    assert!(c.events.load(Ordering::Relaxed) > 0, "events were followed");
    let total: usize = lives.iter().map(Live::now).sum();
    assert_eq!(total, TASKS, "one run a task at the end");
}

/// Pauses and resumes every task of `group` once: four changes each.
async fn cycle_all(group: &taskstage::TaskGroup) {
    for handle in group.tasks() {
        handle.pause().await.expect("paused");
        handle.resume().await.expect("resumed");
        handle
            .wait_for_stage(|s| s == taskstage::Stage::Running)
            .await;
    }
}

/// Reads `stream` until it is at event `target` (a gap, when the reader fell
/// behind the hub's ring, says where it goes on from); `at` is where it is.
async fn read_to(stream: &mut SseReader, at: &mut u64, target: u64, within: Duration) {
    // Bounded: each read waits at most `within`, and moves `at` on.
    while *at < target {
        let event = stream
            .next(within)
            .await
            .expect("every change reaches the stream");
        *at = match event.id {
            Some(id) => id,
            None => event.data["next_seq"].as_u64().map_or(*at + 1, |n| n - 1),
        };
    }
}

/// A served task keeps none of the changes its readers have read: 1,000 served
/// tasks through 40 more changes each leave the heap within 1 MiB of where it was,
/// once the API's own reader of each task has read them all (a journal that kept
/// each task's last 1,024 changes held some MiB more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_task_keeps_no_change_its_readers_have_read() {
    const SERVED: usize = 1_000;
    const CYCLES: usize = 10;
    let (group, _lives) = running_probes(SERVED).await;
    let tasks = LocalTasks::from_group(&group).expect("one task per name");
    let router = Api::local(&tasks)
        .auth(Auth::tokens().read_only(READ))
        .router();
    let (_, listed) = call(&router, "GET", "/v1/tasks?limit=1", Some(READ), None).await;
    let start = listed["seq"].as_u64().expect("the list's event number");
    let mut stream = SseReader::open(&router, "/v1/events", READ, Some(start)).await;
    let within = Duration::from_secs(30);
    // Two cycles first: the hub's ring of 4,096 is full and every item carries an
    // outcome, so what follows can only grow by what is kept.
    let mut expected = 0;
    for _ in 0..2 {
        cycle_all(&group).await;
        expected += 4 * SERVED as u64;
    }
    let mut at = start;
    read_to(&mut stream, &mut at, start + expected, within).await;
    let before = ALLOC.allocated();
    for _ in 0..CYCLES {
        cycle_all(&group).await;
        expected += 4 * SERVED as u64;
    }
    read_to(&mut stream, &mut at, start + expected, within).await;
    let after = ALLOC.allocated();
    let grown = after.saturating_sub(before) / 1024;
    eprintln!(
        "served tasks: {SERVED} tasks, {} changes read; heap {} KiB before, {} KiB after: {grown} KiB more",
        4 * SERVED * CYCLES,
        before / 1024,
        after / 1024
    );
    assert!(
        grown < 1024,
        "the heap grew by {grown} KiB over {} changes every reader had read",
        4 * SERVED * CYCLES
    );
}

/// A tab's stream carries only what the tab shows: with 10,000 busy tasks (400
/// pauses and resumes a second of tasks picked at random, about the 520 KB/s of
/// events a reported fleet sent every tab), a stream of the 100 tasks of one page
/// receives at most 50 KB/s and at most a twentieth of what the stream of every
/// task receives meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_the_tasks_a_tab_shows_carries_theirs_only() {
    const CHURNERS: u64 = 8;
    let busy = Duration::from_secs(10);
    let (group, _lives) = running_probes(TASKS).await;
    let tasks = LocalTasks::from_group(&group).expect("one task per name");
    let router = Api::local(&tasks)
        .auth(Auth::tokens().read_only(READ))
        .router();
    let shown: Vec<String> = (0..100).map(|i| format!("task=t{:05}", i * 37)).collect();
    let page = SseReader::open(
        &router,
        &format!("/v1/events?{}", shown.join("&")),
        READ,
        None,
    )
    .await;
    let every = SseReader::open(&router, "/v1/events", READ, None).await;
    let page = tokio::spawn(page.read_for(busy));
    let every = tokio::spawn(every.read_for(busy));
    let group = Arc::new(group);
    let mut churn = JoinSet::new();
    let until = Instant::now() + busy;
    for seed in 0..CHURNERS {
        let group = Arc::clone(&group);
        churn.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut cycles = 0_u64;
            // The load's pace: 50 cycles a second a churner.
            let mut pace = tokio::time::interval(Duration::from_millis(20));
            // Bounded by `until`.
            while Instant::now() < until {
                pace.tick().await;
                // Each churner its own residue: no two command one task.
                let i = rng.usize(..TASKS / CHURNERS as usize) * CHURNERS as usize + seed as usize;
                let handle = &group.tasks()[i];
                handle.pause().await.expect("paused");
                handle.resume().await.expect("resumed");
                cycles += 1;
            }
            cycles
        });
    }
    let mut cycles = 0;
    while let Some(done) = churn.join_next().await {
        cycles += done.expect("a churner");
    }
    let page = page.await.expect("the page's stream");
    let every = every.await.expect("the whole stream");
    let secs = busy.as_secs_f64();
    let (page_rate, every_rate) = (page as f64 / secs / 1000.0, every as f64 / secs / 1000.0);
    eprintln!(
        "tab stream: {cycles} pause-resume cycles of {TASKS} tasks in {secs} s; the stream of 100 shown tasks {page_rate:.1} KB/s, the stream of every task {every_rate:.1} KB/s"
    );
    assert!(
        every_rate >= 300.0,
        "the load was lighter than the reported one: {every_rate:.1} KB/s for every task"
    );
    assert!(
        page_rate <= 50.0,
        "the page's stream carried {page_rate:.1} KB/s"
    );
    assert!(
        page * 20 <= every,
        "the page's stream carried {page} bytes of the whole stream's {every}"
    );
}
