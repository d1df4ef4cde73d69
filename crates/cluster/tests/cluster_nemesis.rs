//! A randomized nemesis against the cluster on a real etcd (3 members on 127.0.0.1)
//! with 3 worker *processes* (this test binary started again as its ignored test
//! `worker_process`) and 20 tasks whose units write fenced checkpoints.
//!
//! Every decision comes from one seed, printed first (`nemesis seed=…`):
//! `NEMESIS_SEED` replays it, `NEMESIS_SECS` sets the length (default 60 s). A
//! fault every 1–4 s, overlapping across targets, quorum never lost on purpose (at
//! most one member out at a time, and the next member fault only once it is healthy
//! again):
//!
//! - SIGSTOP a worker for 0.5–3 TTLs, then SIGCONT;
//! - SIGKILL a worker and start a fresh one in its place, under the same id or a new
//!   one (a frozen worker may be killed: its thaw is then moot);
//! - cut a worker off from etcd for 0.5–3 TTLs: each worker talks only to its own
//!   side client port of each member, and iptables drops every packet to and from
//!   those ports (a chain of the test's own, see `cluster_support::firewall`);
//! - SIGKILL or SIGSTOP the etcd leader for 0.5–3 TTLs, then start it again with the
//!   same data directory and ports, or SIGCONT it.
//!
//! Meanwhile a controller flips random tasks between Running and Paused every
//! 100–500 ms and stops a few (at most 3). At the end every fault is healed, every
//! task not stopped is desired Running, and every task must be answered (observed
//! Running, or Stopped) within [`CONVERGENCE`] of the heal. Then the merged history,
//! with etcd's own history of the prefix replayed from revision 1, goes through the
//! checker (`cluster_support::history`, rules 1–8). A run prints its counts last
//! (`nemesis summary …`).
//!
//! The control: the same nemesis with the workers on an unfenced store
//! (`taskstage_harness::cluster::unfenced`), freezes
//! and cuts only, until the checker has caught two runs alive at once and a write
//! applied under another owner's key (or 30 s): it must fail.
//!
//! Every process the test starts is killed by pid when its guard drops, also when
//! the test fails; every iptables rule is in the test's own chain, removed by its
//! guard. Without `etcd` or a working iptables the tests say SKIPPED, except under
//! `CI=true`, where they fail.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use taskstage_harness::cluster as cluster_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::history::{
    histories, now_ns, remove_histories, Fault, History, Recorder, Replayed, Verdict,
};
use cluster_support::process::{self, Settings, Units, Values, WorkerKind, TTL};
use cluster_support::{overload, signal_pid, ChildGuard, EtcdCluster};
use taskstage::Stage;
use taskstage_cluster::{
    Controller, Coordinator, DesiredStage, EtcdCoordinator, EtcdOptions, SqliteCoordinator,
    TaskStatus, WatchEvent, WatchMessage,
};

const PREFIX: &str = "nemesis";
/// How soon after a thaw a frozen owner must have dropped its run (the fault
/// suite's allowance: the stop bound and a resync, with room for a loaded machine).
const THAW_ALLOWANCE: Duration = Duration::from_millis(1_500);
const TASKS: usize = 20;
/// Worker processes, each in a slot with side client ports of its own.
const SLOTS: usize = 3;
/// How often a unit writes its fenced checkpoint.
const WRITE_EVERY: Duration = Duration::from_millis(200);
/// The nemesis's length unless `NEMESIS_SECS` says otherwise.
const DEFAULT_SECS: u64 = 60;
/// The nemesis's length on a store file unless `NEMESIS_SECS` says otherwise.
const FILE_SECS: u64 = 30;
/// The control's length at most.
const CONTROL_SECS: u64 = 30;
/// At most this many tasks stopped by the controller.
const MAX_STOPS: usize = 3;
/// How soon after the heal every task must be answered: a lease lost in the last
/// faults expires (TTL), its worker joins again and the tasks are claimed and
/// resumed (a few 200 ms resyncs, a store call's 1 s deadline, an etcd election of
/// 0.5 s: 3 s), twice over (a member that comes back may revoke leases that expired
/// in its own view, etcd's issue 12528, costing one more round).
const CONVERGENCE: Duration = Duration::from_secs(2 * (TTL.as_secs() + 3));
/// Any one wait for the harness (a member healthy, a worker registered).
const SETUP: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- worker process

/// The worker processes: probes writing values with a unique id every
/// [`WRITE_EVERY`], room for every task.
const WORKERS: WorkerKind = WorkerKind {
    env: "TASKSTAGE_NEMESIS",
    prefix: PREFIX,
    units: Units::Probe {
        every: WRITE_EVERY,
        values: Values::Unique,
    },
    capacity: Some(TASKS),
};

/// The worker process: joins, runs probes, joins again whenever its lease is lost.
#[test]
#[ignore = "a worker process of the nemesis; it starts it with TASKSTAGE_NEMESIS_WORKER set"]
fn worker_process() {
    process::worker_process(&WORKERS);
}

// ---------------------------------------------------------------- the test side

/// The nemesis's length and seed, from the environment or fresh.
fn settings(default_secs: u64) -> (u64, u64) {
    let seed = match std::env::var("NEMESIS_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("NEMESIS_SEED={text:?} is not a u64")),
        Err(_) => fastrand::u64(..) ^ now_ns(),
    };
    let secs = match std::env::var("NEMESIS_SECS") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("NEMESIS_SECS={text:?} is not a number of seconds")),
        Err(_) => default_secs,
    };
    (seed, secs)
}

/// One worker process in its slot; its slot's side ports are its only way to etcd.
struct Slot {
    id: String,
    child: Option<ChildGuard>,
}

/// Where the fleet's keys live.
enum On {
    /// A 3-member etcd cluster the test started.
    Etcd(EtcdCluster),
    /// A store file in the histories' directory.
    File,
}

/// The cluster, the worker processes, the test's history and a controller.
struct Fleet {
    /// The etcd cluster, on etcd.
    cluster: Option<EtcdCluster>,
    /// The store file, on a file.
    file: Option<PathBuf>,
    /// The controller's store.
    store: cluster_support::AnyStore,
    dir: PathBuf,
    unfenced: bool,
    slots: Vec<Slot>,
    recorder: Arc<Recorder>,
    controller: Controller,
    next_id: usize,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Workers first (by pid), then the cluster's own guard stops the members and
        // removes the chain.
        self.slots.clear();
        remove_histories(&self.dir);
    }
}

impl Fleet {
    async fn new(on: On, unfenced: bool) -> Fleet {
        let (dir, recorder) = histories("nemesis");
        let (cluster, file, store) = match on {
            On::Etcd(cluster) => {
                let coord = EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
                    .await
                    .expect("connect to the test cluster");
                (Some(cluster), None, cluster_support::AnyStore::new(coord))
            }
            On::File => {
                // Beside the histories, which the checker reads by their extension.
                let file = dir.join("store.db");
                let coord = SqliteCoordinator::open(&file)
                    .await
                    .expect("the store file");
                (None, Some(file), cluster_support::AnyStore::new(coord))
            }
        };
        let mut fleet = Fleet {
            cluster,
            file,
            store: store.clone(),
            dir,
            unfenced,
            slots: Vec::new(),
            recorder,
            controller: Controller::new(store, PREFIX).expect("a controller"),
            next_id: SLOTS + 1,
        };
        for slot in 0..SLOTS {
            fleet.slots.push(Slot {
                id: format!("w{}", slot + 1),
                child: None,
            });
            fleet.spawn(slot);
        }
        fleet
    }

    /// Starts the worker process of `slot` under the slot's id.
    fn spawn(&mut self, slot: usize) {
        let settings = Settings {
            unfenced: Some(self.unfenced),
            ..Settings::default()
        };
        let endpoints = match (&self.cluster, &self.file) {
            (Some(cluster), _) => cluster.side_endpoints_of(slot),
            (None, Some(file)) => vec![format!("sqlite:{}", file.display())],
            (None, None) => unreachable!("a fleet is on etcd or on a file"),
        };
        let child = WORKERS.spawn(&self.slots[slot].id, &endpoints, &self.dir, settings);
        // The instant it exits, whatever the reason, is recorded: a worker that ends
        // itself on an overrun leaves no drop for its runs.
        overload::watch_exit(child.pid(), Arc::clone(&self.recorder), |_| {});
        self.slots[slot].child = Some(child);
    }

    /// Restarts, under its id, each worker process that ended itself on an overrun
    /// (a run not confirmed gone at the last instant its lease allowed: after a
    /// freeze past the lease, at the thaw), as a supervisor would; returns how many.
    ///
    /// # Panics
    ///
    /// If a worker process ended in any other way.
    fn restart_overruns(&mut self) -> usize {
        let mut restarted = 0;
        for slot in 0..self.slots.len() {
            let Some(child) = self.slots[slot].child.as_mut() else {
                continue;
            };
            let Some(status) = child.try_wait() else {
                continue;
            };
            let pid = child.pid();
            // Seen gone now, or earlier by its exit watcher: the earlier counts.
            self.recorder.fault(Fault::Exited, pid);
            assert!(
                overload::is_overrun(status),
                "worker {} (pid {pid}) exited: {status}",
                self.slots[slot].id
            );
            say(&format!(
                "nemesis: {} (pid {pid}) ended itself on an overrun; restarted",
                self.slots[slot].id
            ));
            self.spawn(slot);
            restarted += 1;
        }
        restarted
    }

    /// The etcd cluster: only etcd faults are drawn for it, and only on etcd.
    fn etcd(&mut self) -> &mut EtcdCluster {
        self.cluster
            .as_mut()
            .expect("an etcd fault is drawn only on etcd")
    }

    fn pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].child.as_ref().map(ChildGuard::pid)
    }

    /// SIGKILL (thawed first), reaped, recorded.
    fn kill(&mut self, slot: usize) {
        if let Some(child) = self.slots[slot].child.take() {
            let pid = child.pid();
            drop(child);
            self.recorder.fault(Fault::Killed, pid);
        }
    }

    fn freeze(&self, slot: usize) -> Option<u32> {
        let pid = self.pid(slot)?;
        signal_pid(pid, rustix::process::Signal::STOP);
        self.recorder.fault(Fault::Freeze, pid);
        Some(pid)
    }

    fn thaw(&self, pid: u32) {
        self.recorder.fault(Fault::Thaw, pid);
        signal_pid(pid, rustix::process::Signal::CONT);
    }

    /// Reads `task`'s status (bounded), recording what it observed when the current
    /// owner's report answers the current desired revision (rule 4).
    async fn status(&self, task: &str) -> Option<TaskStatus> {
        let sent = now_ns();
        let status = tokio::time::timeout(Duration::from_secs(5), self.controller.status(task))
            .await
            .ok()?
            .ok()?;
        if status.answers(status.desired_revision) {
            if let Some(observed) = status.current_observed() {
                self.recorder.observe(task, observed.stage, sent);
            }
        }
        Some(status)
    }

    /// Waits until every worker id of the slots is registered.
    async fn registered(&self) {
        let deadline = Instant::now() + SETUP;
        // Bounded by the deadline, polling every 50 ms.
        loop {
            let workers = self.controller.workers().await.unwrap_or_default();
            let all = self
                .slots
                .iter()
                .all(|s| workers.iter().any(|w| w.as_str() == s.id));
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the workers did not all join within {SETUP:?}: {workers:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every task in `tasks` is [`converged`] in one pass of reads, for
    /// at most `within`; returns each task's status with the instant its read was
    /// answered, or the tasks that were not converged.
    async fn converge(
        &self,
        tasks: &[String],
        within: Duration,
    ) -> Result<Vec<(TaskStatus, u64)>, Vec<(String, Option<TaskStatus>)>> {
        let started = Instant::now();
        // Bounded by `within`, polling every 50 ms.
        loop {
            let mut pending = Vec::new();
            let mut done = Vec::new();
            for task in tasks {
                let status = self.status(task).await;
                match status {
                    Some(status) if converged(&status) => done.push((status, now_ns())),
                    other => pending.push((task.clone(), other)),
                }
            }
            if pending.is_empty() {
                return Ok(done);
            }
            if started.elapsed() >= within {
                return Err(pending);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether a task is settled at the end: its current owner's report answers the
/// desired revision, Running with a run alive, or Stopped.
fn converged(status: &TaskStatus) -> bool {
    let stage = status.current_observed().map(|o| o.stage);
    status.answers(status.desired_revision)
        && match status.desired {
            DesiredStage::Running => stage == Some(Stage::Running),
            _ => stage == Some(Stage::Stopped),
        }
}

/// Writes a line to the process's stderr directly: libtest captures `println!` and
/// `eprintln!` of a passing test, and the seed and the counts must show in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn task_names() -> Vec<String> {
    (0..TASKS).map(|i| format!("t{i:02}")).collect()
}

/// A fault that ends later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// SIGCONT the process `pid` of `slot`.
    Thaw { slot: usize, pid: u32 },
    /// End the cut of `slot`.
    Heal { slot: usize },
    /// Start member `member` again (after a kill) or SIGCONT it (after a freeze).
    Member { member: usize, killed: bool },
}

/// The fault counts of one run.
#[derive(Debug, Default, Clone)]
struct Counts {
    freezes: usize,
    kills_same_id: usize,
    kills_new_id: usize,
    cuts: usize,
    leader_kills: usize,
    leader_freezes: usize,
    /// Draws skipped because their target was busy (a frozen worker drawn for a
    /// freeze, a cut slot for a cut, a member fault while a member is out or no
    /// leader is named).
    skipped: usize,
    /// Most faults in effect at one instant.
    max_overlap: usize,
}

impl Counts {
    fn total(&self) -> usize {
        self.freezes
            + self.kills_same_id
            + self.kills_new_id
            + self.cuts
            + self.leader_kills
            + self.leader_freezes
    }
}

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Freeze,
    Kill,
    Cut,
    Leader,
}

/// One fault as drawn: its kind, the worker slot it targets (for a worker fault),
/// how long it holds, a coin (a kill: restart under the same id; a leader fault:
/// kill rather than freeze) and the delay to the next draw.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Draw {
    kind: Kind,
    slot: usize,
    hold: Duration,
    coin: bool,
    gap: Duration,
}

/// Which faults the nemesis draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Menu {
    /// Every fault.
    All,
    /// Freezes and cuts only: the faults that fencing and self-fencing answer.
    FencingOnly,
    /// The faults of worker processes only (freezes and kills): on a store file.
    WorkersOnly,
    /// Freezes only: the control on a store file.
    FreezesOnly,
}

/// The nemesis: draws every fault from its seed, keeps what must end later.
struct Nemesis {
    rng: fastrand::Rng,
    menu: Menu,
    pending: Vec<(Instant, Pending)>,
    frozen: [bool; SLOTS],
    cut: [bool; SLOTS],
    /// A member killed or frozen, or back but not yet healthy.
    member_out: Option<usize>,
    counts: Counts,
    /// Worker processes restarted after they ended themselves on an overrun.
    restarts: usize,
}

impl Nemesis {
    fn new(seed: u64, menu: Menu) -> Nemesis {
        Nemesis {
            rng: fastrand::Rng::with_seed(seed),
            menu,
            pending: Vec::new(),
            frozen: [false; SLOTS],
            cut: [false; SLOTS],
            member_out: None,
            counts: Counts::default(),
            restarts: 0,
        }
    }

    /// The next fault's delay: 1–4 s.
    fn gap(&mut self) -> Duration {
        Duration::from_millis(self.rng.u64(1_000..=4_000))
    }

    /// Draws the next fault. Every draw takes the same values from the generator,
    /// whatever the state of the fleet, so that the sequence of draws is a function
    /// of the seed alone; [`Nemesis::inject`] skips a draw whose target is busy.
    fn draw(&mut self) -> Draw {
        // Weights: freeze 3, kill 2, cut 2, leader 2; the control: freeze and cut.
        let weights: [(Kind, u32); 4] = match self.menu {
            Menu::All => [
                (Kind::Freeze, 3),
                (Kind::Kill, 2),
                (Kind::Cut, 2),
                (Kind::Leader, 2),
            ],
            Menu::FencingOnly => [
                (Kind::Freeze, 1),
                (Kind::Kill, 0),
                (Kind::Cut, 1),
                (Kind::Leader, 0),
            ],
            Menu::FreezesOnly => [
                (Kind::Freeze, 1),
                (Kind::Kill, 0),
                (Kind::Cut, 0),
                (Kind::Leader, 0),
            ],
            Menu::WorkersOnly => [
                (Kind::Freeze, 3),
                (Kind::Kill, 3),
                (Kind::Cut, 0),
                (Kind::Leader, 0),
            ],
        };
        let total: u32 = weights.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.u32(..total);
        let mut kind = Kind::Freeze;
        for (k, w) in weights {
            if pick < w {
                kind = k;
                break;
            }
            pick -= w;
        }
        Draw {
            kind,
            slot: self.rng.usize(..SLOTS),
            // 0.5–3 TTLs.
            hold: TTL.mul_f64(0.5 + 2.5 * self.rng.f64()),
            coin: self.rng.bool(),
            gap: self.gap(),
        }
    }

    /// Injects the fault `d` (drawn by [`Nemesis::draw`]), or counts it skipped when
    /// its target is busy: a frozen worker drawn for a freeze, a cut slot for a cut,
    /// a member fault while a member is out or no leader is named.
    fn inject(&mut self, fleet: &mut Fleet, d: Draw) {
        let (slot, hold, now) = (d.slot, d.hold, Instant::now());
        match d.kind {
            Kind::Freeze => {
                if self.frozen[slot] {
                    self.counts.skipped += 1;
                    return;
                }
                if let Some(pid) = fleet.freeze(slot) {
                    self.frozen[slot] = true;
                    self.counts.freezes += 1;
                    self.pending.push((now + hold, Pending::Thaw { slot, pid }));
                    eprintln!(
                        "nemesis: freeze {} (pid {pid}) for {hold:.1?}",
                        fleet.slots[slot].id
                    );
                }
            }
            Kind::Kill => {
                // A frozen process killed: its thaw is moot.
                self.pending
                    .retain(|(_, p)| !matches!(p, Pending::Thaw { slot: s, .. } if *s == slot));
                self.frozen[slot] = false;
                let old = fleet.slots[slot].id.clone();
                fleet.kill(slot);
                if d.coin {
                    self.counts.kills_same_id += 1;
                } else {
                    fleet.slots[slot].id = format!("w{}", fleet.next_id);
                    fleet.next_id += 1;
                    self.counts.kills_new_id += 1;
                }
                fleet.spawn(slot);
                eprintln!("nemesis: kill -9 {old}, started {}", fleet.slots[slot].id);
            }
            Kind::Cut => {
                if self.cut[slot] {
                    self.counts.skipped += 1;
                    return;
                }
                fleet.etcd().cut_side(slot);
                self.cut[slot] = true;
                self.counts.cuts += 1;
                self.pending.push((now + hold, Pending::Heal { slot }));
                eprintln!(
                    "nemesis: cut slot {slot} ({}) for {hold:.1?}",
                    fleet.slots[slot].id
                );
            }
            Kind::Leader => {
                if self.member_out.is_some() {
                    self.counts.skipped += 1;
                    return;
                }
                let Some(member) = fleet.etcd().leader() else {
                    self.counts.skipped += 1;
                    return;
                };
                let killed = d.coin;
                if killed {
                    fleet.etcd().kill_member(member);
                    self.counts.leader_kills += 1;
                } else {
                    fleet.etcd().freeze_member(member);
                    self.counts.leader_freezes += 1;
                }
                self.member_out = Some(member);
                self.pending
                    .push((now + hold, Pending::Member { member, killed }));
                eprintln!(
                    "nemesis: {} the etcd leader m{member} for {hold:.1?}",
                    if killed { "kill -9" } else { "freeze" }
                );
            }
        }
        let overlap = self.frozen.iter().filter(|f| **f).count()
            + self.cut.iter().filter(|c| **c).count()
            + usize::from(self.member_out.is_some());
        self.counts.max_overlap = self.counts.max_overlap.max(overlap);
    }

    /// Ends `p`.
    fn end(&mut self, fleet: &mut Fleet, p: Pending) {
        match p {
            Pending::Thaw { slot, pid } => {
                if fleet.pid(slot) == Some(pid) {
                    fleet.thaw(pid);
                }
                self.frozen[slot] = false;
            }
            Pending::Heal { slot } => {
                fleet.etcd().heal_side(slot);
                self.cut[slot] = false;
            }
            Pending::Member { member, killed } => {
                if killed {
                    fleet.etcd().restart_member(member);
                } else {
                    fleet.etcd().thaw_member(member);
                }
            }
        }
    }

    /// Ends every fault that is due; a member back counts as in once healthy.
    fn tick(&mut self, fleet: &mut Fleet) {
        let now = Instant::now();
        let due: Vec<Pending> = self
            .pending
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, p)| *p)
            .collect();
        self.pending.retain(|(at, _)| *at > now);
        for p in due {
            self.end(fleet, p);
        }
        if let Some(member) = self.member_out {
            let back = !self
                .pending
                .iter()
                .any(|(_, p)| matches!(p, Pending::Member { .. }));
            if back && fleet.etcd().member_healthy(member) {
                self.member_out = None;
            }
        }
    }

    /// Ends every fault now, and waits for every member to be healthy.
    async fn heal_all(&mut self, fleet: &mut Fleet) {
        for (_, p) in std::mem::take(&mut self.pending) {
            self.end(fleet, p);
        }
        let deadline = Instant::now() + SETUP;
        // Bounded by the deadline, polling every 50 ms.
        while fleet
            .cluster
            .as_ref()
            .is_some_and(|c| !(0..c.len()).all(|i| c.member_healthy(i)))
        {
            assert!(
                Instant::now() < deadline,
                "the etcd members were not all healthy within {SETUP:?} of the heal"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.member_out = None;
    }

    /// The delay until the next thing to do, at most 100 ms.
    fn next_wake(&self, next_fault: Instant) -> Duration {
        let now = Instant::now();
        let mut at = next_fault;
        for (end, _) in &self.pending {
            at = at.min(*end);
        }
        at.saturating_duration_since(now)
            .min(Duration::from_millis(100))
    }
}

/// What the controller did.
#[derive(Debug, Default, Clone)]
struct Commands {
    flips: usize,
    stops: usize,
    /// Writes refused (a conflict, a stopped task) or unanswered (a fault).
    failed: usize,
}

/// The controller's side: flips random tasks between Running and Paused and stops a
/// few, every 100–500 ms, until `done`; each command and status read is bounded.
async fn commands(
    controller: Controller,
    fleet_recorder: Arc<Recorder>,
    seed: u64,
    done: Arc<AtomicBool>,
) -> Commands {
    let mut rng = fastrand::Rng::with_seed(seed);
    let names = task_names();
    let mut running = [true; TASKS];
    let mut stopped: BTreeSet<usize> = BTreeSet::new();
    let mut counts = Commands::default();
    // Bounded: 100,000 commands at most (at 100 ms each, far past any run), and
    // `done`.
    for _ in 0..100_000 {
        // Relaxed: a stop flag, nothing else depends on it.
        if done.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(100..=500))).await;
        let i = rng.usize(..TASKS);
        if stopped.contains(&i) {
            continue;
        }
        let stop = stopped.len() < MAX_STOPS && rng.u32(..100) < 2;
        let desired = if stop {
            DesiredStage::Stopped
        } else if running[i] {
            DesiredStage::Paused
        } else {
            DesiredStage::Running
        };
        let wrote = tokio::time::timeout(
            Duration::from_secs(5),
            controller.set_desired(&names[i], desired),
        )
        .await;
        match wrote {
            Ok(Ok(_)) if stop => {
                stopped.insert(i);
                counts.stops += 1;
            }
            Ok(Ok(_)) => {
                running[i] = !running[i];
                counts.flips += 1;
            }
            _ => counts.failed += 1,
        }
        // A status read of another task, for rule 4.
        let other = &names[rng.usize(..TASKS)];
        let sent = now_ns();
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_secs(5), controller.status(other)).await
        {
            if status.answers(status.desired_revision) {
                if let Some(observed) = status.current_observed() {
                    fleet_recorder.observe(other, observed.stage, sent);
                }
            }
        }
    }
    counts
}

/// etcd's history of the prefix from revision 1 (the test clusters never compact),
/// up to the revision current when it is called: the owner keys, every checkpoint
/// write (with the owner value, token and id its value names) and every report.
async fn replay(endpoints: &[String]) -> Vec<Replayed> {
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
    let mut entries = Vec::new();
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
            let put = event.event_type() == EventType::Put;
            let key = String::from_utf8_lossy(kv.key());
            entries.extend(replayed(
                &key,
                kv.value(),
                kv.create_revision(),
                revision,
                put,
            ));
        }
    }
    entries.push(Replayed::Done { revision: head });
    entries
}

/// What the checker needs of one event of the prefix's history: an owner key put
/// or deleted, a probe's checkpoint applied, an owner's report.
fn replayed(
    key: &str,
    value: &[u8],
    create_revision: i64,
    revision: i64,
    put: bool,
) -> Option<Replayed> {
    let tasks = format!("{PREFIX}/tasks/");
    let checkpoints = format!("{PREFIX}/checkpoints/");
    // Task keys are `tasks/{task}/{name}`; checkpoints `checkpoints/{task}/{name}`.
    let (task, name) = key
        .strip_prefix(&tasks)
        .and_then(|r| r.split_once('/'))
        .or_else(|| {
            let (task, name) = key.strip_prefix(&checkpoints)?.split_once('/')?;
            (name == "pos").then_some((task, "checkpoint/pos"))
        })?;
    let task = task.to_owned();
    let value = String::from_utf8_lossy(value).into_owned();
    match name {
        "owner" => Some(Replayed::Owner {
            revision,
            task,
            owner: put.then_some((create_revision, value)),
        }),
        "checkpoint/pos" if put => {
            let parts: Vec<&str> = value.split('|').collect();
            let [owner_value, token, id] = parts[..] else {
                panic!("a checkpoint value not written by the probe: {value:?}");
            };
            Some(Replayed::Applied {
                revision,
                task,
                owner_value: owner_value.to_owned(),
                token: token.parse().expect("a token"),
                id: id.to_owned(),
            })
        }
        "observed" if put => {
            let field = |name: &str| {
                value
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            let (Some(owner), Some(token)) = (field("owner"), field("owner_revision")) else {
                panic!("an observed report without owner: {value:?}");
            };
            Some(Replayed::Reported {
                revision,
                task,
                owner,
                token: token.parse().expect("an owner revision"),
            })
        }
        _ => None,
    }
}

/// The prefix's history from revision 1, through the store's own watch (the file),
/// read in one attempt: `Err` when the store did not answer.
///
/// A worker frozen in the middle of a write holds the file's write lock until it is
/// thawed (or killed), and a read that must first expire a due lease waits for that
/// lock, so an attempt fails after the lock timeout while a worker is frozen.
async fn replay_store(store: &impl Coordinator) -> Result<Vec<Replayed>, String> {
    let head = store
        .list(format!("{PREFIX}/"))
        .await
        .map_err(|e| e.to_string())?
        .revision;
    let mut stream = store
        .watch(format!("{PREFIX}/"), 1)
        .await
        .map_err(|e| e.to_string())?;
    let mut entries = Vec::new();
    let mut last = 0;
    let deadline = Instant::now() + SETUP;
    // Bounded by the deadline: the history up to `head` is finite.
    while last < head {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = std::future::poll_fn(|cx| futures_core::Stream::poll_next(stream.as_mut(), cx));
        let message = match tokio::time::timeout(left, next).await {
            Err(_) => return Err(format!("read to {last} of {head} within {SETUP:?}")),
            Ok(None) => return Err("the watch ended".to_owned()),
            Ok(Some(Err(error))) => return Err(error.to_string()),
            Ok(Some(Ok(message))) => message,
        };
        let events = match message {
            WatchMessage::Events { revision, events } => {
                last = last.max(revision);
                events
            }
            WatchMessage::Compacted { revision } => {
                panic!("the replay watch met a compaction at {revision}")
            }
        };
        for event in events {
            entries.extend(match event {
                WatchEvent::Put(kv) => replayed(
                    &kv.key,
                    &kv.value,
                    kv.create_revision,
                    kv.mod_revision,
                    true,
                ),
                WatchEvent::Delete { key, revision } => replayed(&key, &[], 0, revision, false),
            });
        }
    }
    entries.push(Replayed::Done { revision: head });
    Ok(entries)
}

/// The fleet's history from revision 1: etcd's, or the file's (tried again within
/// [`SETUP`]: the caller has thawed every worker).
async fn replay_of(fleet: &Fleet) -> Vec<Replayed> {
    if let Some(cluster) = &fleet.cluster {
        return replay(&cluster.endpoints()).await;
    }
    let deadline = Instant::now() + SETUP;
    // Bounded by the deadline.
    loop {
        match replay_store(&fleet.store).await {
            Ok(entries) => return entries,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "the store's history could not be read within {SETUP:?}: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Starts the cluster and the fleet, creates the tasks and waits until each runs.
/// `None` when the tools are missing outside CI (said loudly by the harness).
async fn setup(on_file: bool, unfenced: bool) -> Option<(Fleet, Vec<String>)> {
    let on = if on_file {
        On::File
    } else {
        On::Etcd(EtcdCluster::start_partitionable_sides(3, SLOTS)?)
    };
    let fleet = Fleet::new(on, unfenced).await;
    fleet.registered().await;
    let names = task_names();
    for task in &names {
        fleet
            .controller
            .create(task, Vec::new(), DesiredStage::Running)
            .await
            .expect("create a task");
    }
    if let Err(pending) = fleet.converge(&names, SETUP).await {
        panic!("not every task ran within {SETUP:?} of its creation: {pending:?}");
    }
    Some((fleet, names))
}

/// The whole history so far, the store's replayed into it, checked as of now
/// (`live`: the workers still run, and may be frozen) or as finished. While the
/// workers run, `None` when the store file did not answer (a frozen worker holds
/// its write lock: the nemesis must go on to thaw it).
async fn check_now(fleet: &Fleet, live: bool) -> Option<Verdict> {
    let now = now_ns();
    let mut history = History::load(&fleet.dir).expect("read the histories");
    let replayed = match (&fleet.cluster, live) {
        (None, true) => replay_store(&fleet.store).await.ok()?,
        _ => replay_of(fleet).await,
    };
    history.add_replay(&replayed);
    Some(if live {
        history.check_as_of(THAW_ALLOWANCE, now)
    } else {
        history.check(THAW_ALLOWANCE)
    })
}

/// Runs the nemesis for `secs`; with `caught`, it checks the history every second
/// and ends once it shows rules 1 and 5 broken (the control), keeping the last
/// verdict there.
async fn run_nemesis(
    fleet: &mut Fleet,
    nemesis: &mut Nemesis,
    secs: u64,
    mut caught: Option<&mut Verdict>,
) {
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let mut next_fault = started + nemesis.gap();
    let mut next_look = started + Duration::from_secs(1);
    // Bounded by `end`, at least 10 ms per turn.
    while Instant::now() < end {
        nemesis.restarts += fleet.restart_overruns();
        nemesis.tick(fleet);
        if Instant::now() >= next_fault {
            let draw = nemesis.draw();
            nemesis.inject(fleet, draw);
            next_fault = Instant::now() + draw.gap;
        }
        if let Some(caught) = caught.as_deref_mut() {
            if Instant::now() >= next_look {
                if let Some(verdict) = check_now(fleet, true).await {
                    *caught = verdict;
                }
                let rules = caught.per_rule();
                if rules[0] > 0 && rules[4] > 0 {
                    break;
                }
                next_look = Instant::now() + Duration::from_secs(1);
            }
        }
        let wait = nemesis.next_wake(next_fault).max(Duration::from_millis(10));
        tokio::time::sleep(wait).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nemesis_finds_no_violation_and_the_cluster_converges() {
    nemesis_converges(false, DEFAULT_SECS).await;
}

/// The nemesis on a store file: worker processes frozen past their lease and killed
/// with SIGKILL (a kill lands in the middle of a write often: 20 probes write every
/// 200 ms) and started again, under the same checks, with SQLite's integrity check
/// of the file after every process is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_store_file_the_nemesis_finds_no_violation_and_the_tasks_converge() {
    nemesis_converges(true, FILE_SECS).await;
}

/// The nemesis on etcd (every fault) or on a store file (the workers' faults), then
/// the heal, convergence and the history checker over every process's history and
/// the store's own.
async fn nemesis_converges(on_file: bool, default_secs: u64) {
    let (seed, secs) = settings(default_secs);
    say(&format!(
        "nemesis seed={seed} secs={secs} on_file={on_file} (replay: NEMESIS_SEED={seed} NEMESIS_SECS={secs})"
    ));
    let Some((mut fleet, names)) = setup(on_file, false).await else {
        return;
    };
    let menu = if on_file {
        Menu::WorkersOnly
    } else {
        Menu::All
    };
    let mut nemesis = Nemesis::new(seed, menu);
    let done = Arc::new(AtomicBool::new(false));
    let controller = tokio::spawn(commands(
        fleet.controller.clone(),
        Arc::clone(&fleet.recorder),
        seed.rotate_left(32) ^ 0x5DEE_CE66_D1CE_4E5B,
        Arc::clone(&done),
    ));
    let started = Instant::now();
    run_nemesis(&mut fleet, &mut nemesis, secs, None).await;
    // Relaxed: a stop flag.
    done.store(true, Ordering::Relaxed);
    let commands = controller.await.expect("the controller's task");
    let ran = started.elapsed();

    // Heal, then every task not stopped desired Running, then convergence.
    nemesis.heal_all(&mut fleet).await;
    nemesis.restarts += fleet.restart_overruns();
    let healed = Instant::now();
    let mut stopped = Vec::new();
    for task in &names {
        let deadline = healed + CONVERGENCE;
        // Bounded by the deadline: a write may meet an election.
        loop {
            let status = fleet.status(task).await;
            if let Some(status) = status {
                if status.desired == DesiredStage::Stopped {
                    stopped.push(task.clone());
                    break;
                }
                if status.desired == DesiredStage::Running
                    || fleet
                        .controller
                        .set_desired(task, DesiredStage::Running)
                        .await
                        .is_ok()
                {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{task}: desired Running not written within {CONVERGENCE:?} of the heal"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // One bound from the heal, the writes above included.
    let left = CONVERGENCE.saturating_sub(healed.elapsed());
    let converged_in = match fleet.converge(&names, left).await {
        Ok(_) => healed.elapsed(),
        Err(pending) => panic!(
            "seed {seed}: {} tasks not converged within {CONVERGENCE:?} of the heal: {pending:#?}",
            pending.len()
        ),
    };
    // The checker forgives a thawed owner's run that ends within the allowance of
    // the thaw; ending the workers inside that window would hide a run that kept
    // going. Held (reading the status meanwhile, for rule 4) until it has passed.
    // Bounded: THAW_ALLOWANCE, polling every 50 ms.
    while healed.elapsed() < THAW_ALLOWANCE + Duration::from_millis(100) {
        let _ = fleet.status(&names[0]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What converged, read once more in one pass, into the history (rules 3 and 8).
    let finals = match fleet.converge(&names, CONVERGENCE).await {
        Ok(finals) => finals,
        Err(pending) => panic!("seed {seed}: converged, then not: {pending:#?}"),
    };
    for (status, at) in &finals {
        let task = status.task.as_str();
        if let (Some(observed), DesiredStage::Running) = (status.current_observed(), status.desired)
        {
            fleet
                .recorder
                .converged(*at, task, observed.owner.as_str(), observed.owner_revision);
        }
        fleet.recorder.end(
            task,
            status.desired.name(),
            status.owner.as_ref().map(|w| w.as_str()),
        );
    }
    for slot in 0..SLOTS {
        fleet.kill(slot);
    }
    let entries = replay_of(&fleet).await;
    let etcd = Recorder::create(&fleet.dir, "etcd").expect("the replay's history file");
    for entry in &entries {
        etcd.replay(entry);
    }
    let verdict = History::load(&fleet.dir)
        .expect("read the histories")
        .check(THAW_ALLOWANCE);
    let c = &nemesis.counts;
    let summary = format!(
        "nemesis summary seed={seed} secs={} faults={} freeze={} kill_same_id={} \
         kill_new_id={} cut={} leader_kill={} leader_freeze={} skipped={} max_overlap={} \
         flips={} stops={} commands_failed={} violations={} freeze_allowances={} runs={} \
         max_live={} writes_accepted={} writes_rejected={} applied_in_etcd={} converged_tasks={} \
         convergence_s={:.2} overrun_restarts={}",
        ran.as_secs(),
        c.total(),
        c.freezes,
        c.kills_same_id,
        c.kills_new_id,
        c.cuts,
        c.leader_kills,
        c.leader_freezes,
        c.skipped,
        c.max_overlap,
        commands.flips,
        commands.stops,
        commands.failed,
        verdict.violations.len(),
        verdict.frozen,
        verdict.runs,
        verdict.max_live,
        verdict.accepted,
        verdict.rejected,
        verdict.applied.unwrap_or(0),
        verdict.converged,
        converged_in.as_secs_f64(),
        nemesis.restarts,
    );
    say(&format!("history: {verdict}"));
    say(&summary);
    assert_sound(&verdict, seed);
    // Not vacuous: faults were injected, writes were replayed from etcd, and every
    // task desired Running was checked at convergence.
    assert!(c.total() >= 1, "no fault injected: {summary}");
    assert!(verdict.applied.is_some_and(|n| n > 0), "{summary}");
    assert_eq!(verdict.converged, TASKS - stopped.len(), "{summary}");
    assert!(verdict.runs > TASKS, "{summary}");
    if let Some(file) = fleet.file.clone() {
        let check: String = rusqlite::Connection::open(&file)
            .and_then(|c| c.query_row("PRAGMA integrity_check", [], |row| row.get(0)))
            .expect("the store file can be checked");
        assert_eq!(check, "ok", "seed {seed}: the store file after the nemesis");
    }
}

fn assert_sound(verdict: &Verdict, seed: u64) {
    assert!(
        verdict.passed(),
        "seed {seed} (replay: NEMESIS_SEED={seed}): the history checker failed: {verdict}"
    );
    assert_eq!(verdict.max_live, 1, "seed {seed}: {verdict}");
}

/// The control: unfenced workers under freezes and cuts, until the checker has
/// caught an overlap and a write applied under another owner's key (or
/// [`CONTROL_SECS`]). It must fail, with a write applied under another owner's key
/// at least.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_the_nemesis_is_caught() {
    control_is_caught(false).await;
}

/// The control on a store file: unfenced workers under freezes only (the faults
/// fencing answers there). It must fail as on etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_store_file_without_fencing_the_nemesis_is_caught() {
    control_is_caught(true).await;
}

async fn control_is_caught(on_file: bool) {
    let (seed, _) = settings(DEFAULT_SECS);
    say(&format!(
        "nemesis control seed={seed} on_file={on_file} (replay: NEMESIS_SEED={seed})"
    ));
    let Some((mut fleet, _names)) = setup(on_file, true).await else {
        return;
    };
    let menu = if on_file {
        Menu::FreezesOnly
    } else {
        Menu::FencingOnly
    };
    let mut nemesis = Nemesis::new(seed, menu);
    let started = Instant::now();
    let mut seen = Verdict::default();
    run_nemesis(&mut fleet, &mut nemesis, CONTROL_SECS, Some(&mut seen)).await;
    eprintln!("control: checked while running: {seen}");
    let took = started.elapsed();
    // The workers killed as they are, before the heal (no thaw recorded for one
    // still frozen): what a thawed worker did after its thaw ends at the kill, at
    // least the allowance after that thaw (the check as of now said so).
    for slot in 0..SLOTS {
        fleet.kill(slot);
    }
    nemesis.heal_all(&mut fleet).await;
    let verdict = check_now(&fleet, false)
        .await
        .expect("a check as finished reads the store");
    let c = &nemesis.counts;
    let rules = verdict.per_rule();
    say(&format!("history (control): {verdict}"));
    say(&format!(
        "nemesis control seed={seed} secs={:.1} faults={} freeze={} cut={} violations={} \
         per_rule={rules:?} writes_rejected={}",
        took.as_secs_f64(),
        c.total(),
        c.freezes,
        c.cuts,
        verdict.violations.len(),
        verdict.rejected,
    ));
    assert!(
        !verdict.passed(),
        "seed {seed}: unfenced workers passed the checker: {verdict}"
    );
    // Without the compares every write is applied whatever its token: rule 5 breaks in
    // every control run. Two runs alive at once (rule 1) need a drawn freeze or cut
    // that outlasts a takeover, which a seed of short faults may not draw in 30 s; it
    // is reported, not required (seen in a CI run: 8 short faults, 1,028 rule-5
    // violations, no overlap).
    assert!(
        rules[4] > 0,
        "seed {seed}: expected a write applied under another owner's key (rule 5) within \
         {CONTROL_SECS} s: {verdict}"
    );
    say(&format!(
        "control: two runs alive at once (rule 1) {} in this run",
        if rules[0] > 0 { "seen" } else { "not seen" }
    ));
    assert_eq!(
        verdict.rejected, 0,
        "an unfenced write was rejected: {verdict}"
    );
}

/// The nemesis's draws, without a cluster: what `NEMESIS_SEED` promises.
mod draws {
    use super::*;

    fn draws(seed: u64, menu: Menu, n: usize) -> Vec<Draw> {
        let mut nemesis = Nemesis::new(seed, menu);
        (0..n).map(|_| nemesis.draw()).collect()
    }

    #[test]
    fn the_same_seed_draws_the_same_faults_and_another_seed_others() {
        assert_eq!(draws(42, Menu::All, 500), draws(42, Menu::All, 500));
        assert_ne!(draws(42, Menu::All, 500), draws(43, Menu::All, 500));
    }

    #[test]
    fn draws_stay_within_the_menu_and_its_ranges() {
        let all = draws(7, Menu::All, 2_000);
        for d in &all {
            assert!(d.hold >= TTL / 2 && d.hold <= TTL * 3, "{d:?}");
            assert!(
                d.gap >= Duration::from_secs(1) && d.gap <= Duration::from_secs(4),
                "{d:?}"
            );
            assert!(d.slot < SLOTS, "{d:?}");
        }
        // Weights 3 : 2 : 2 : 2 over 2,000 draws: each kind within a wide margin of
        // its share (667 / 444 / 444 / 444).
        for (kind, share) in [
            (Kind::Freeze, 667),
            (Kind::Kill, 444),
            (Kind::Cut, 444),
            (Kind::Leader, 444),
        ] {
            let n = all.iter().filter(|d| d.kind == kind).count();
            assert!(n.abs_diff(share) < 120, "{kind:?}: {n} of 2,000 draws");
        }
        let control = draws(7, Menu::FencingOnly, 2_000);
        assert!(control
            .iter()
            .all(|d| matches!(d.kind, Kind::Freeze | Kind::Cut)));
        assert!(control.iter().any(|d| d.kind == Kind::Cut));
        assert!(control.iter().any(|d| d.kind == Kind::Freeze));
    }
}
