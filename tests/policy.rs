//! The auto-resume policy against real tasks: the backoff grows 1 → 2 → 4 → 8 s across
//! dispatches and rolls back after a healthy period (tokio's paused clock, no real
//! sleeping); two tasks are independent; user-paused tasks are never resumed; a task
//! that fails again after a resume backs off further; stopped, finished and removed
//! tasks lose their policy state; invalid settings are refused; and a multi-thread
//! smoke test that waits on states only.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use taskstage::policy::{
    AutoResume, Backoff, BackoffSettings, Jitter, Key, PolicySettingsError, Setting, Standing,
    Status,
};
use taskstage::{Handle, RunContext, RunError, RunExit, Stage, Task, Unit};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The errors test units fail with; [`classify`] resumes only blips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Blip,
    Fatal,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Failure::Blip => "network blip",
            Failure::Fatal => "schema mismatch",
        })
    }
}

impl std::error::Error for Failure {}

fn classify(error: &RunError) -> bool {
    error.get_ref().downcast_ref::<Failure>() == Some(&Failure::Blip)
}

/// What a running scripted unit does when told.
#[derive(Debug, Clone, Copy)]
enum Order {
    Fail(Failure),
    Complete,
}

/// A unit whose first runs each fail at once, as scripted; later runs wait for an
/// order or for cancellation. It records when each run started and how many runs are
/// alive at once.
struct Scripted {
    script: VecDeque<Failure>,
    orders: mpsc::UnboundedReceiver<Order>,
    starts: watch::Sender<Vec<Instant>>,
    live: Arc<AtomicUsize>,
    max_live: Arc<AtomicUsize>,
}

struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Unit for Scripted {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let now = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_live.fetch_max(now, Ordering::SeqCst);
        let _live = LiveGuard(Arc::clone(&self.live));
        self.starts
            .send_modify(|starts| starts.push(Instant::now()));
        if let Some(failure) = self.script.pop_front() {
            return Err(RunError::new(failure));
        }
        tokio::select! {
            () = ctx.cancelled() => Ok(RunExit::Cancelled),
            order = self.orders.recv() => match order {
                Some(Order::Fail(failure)) => Err(RunError::new(failure)),
                Some(Order::Complete) => Ok(RunExit::Completed),
                None => {
                    ctx.cancelled().await;
                    Ok(RunExit::Cancelled)
                }
            },
        }
    }
}

/// A unit whose first run fails with a blip, and whose pre-start check before a resume
/// waits until the test opens a gate.
struct SlowCheck {
    runs: u32,
    gate: watch::Receiver<bool>,
}

impl Unit for SlowCheck {
    async fn prepare(&mut self, ctx: RunContext) -> Result<(), RunError> {
        if ctx.is_resume() {
            self.gate
                .wait_for(|open| *open)
                .await
                .map_err(|_| RunError::msg("gate dropped"))?;
        }
        Ok(())
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        self.runs += 1;
        if self.runs == 1 {
            return Err(RunError::new(Failure::Blip));
        }
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }
}

/// The test's side of a scripted unit.
struct Probe {
    starts: watch::Receiver<Vec<Instant>>,
    orders: mpsc::UnboundedSender<Order>,
    max_live: Arc<AtomicUsize>,
}

impl Probe {
    /// Waits until `n` runs have started; returns their start instants.
    async fn runs(&mut self, n: usize) -> Vec<Instant> {
        let starts = self.starts.wait_for(|starts| starts.len() >= n);
        bounded(starts, "runs to start")
            .await
            .expect("the unit is alive")
            .clone()
    }

    fn order(&self, order: Order) {
        self.orders.send(order).expect("the unit is alive");
    }
}

fn scripted_unit(script: &[Failure]) -> (Scripted, Probe) {
    let (orders_tx, orders) = mpsc::unbounded_channel();
    let (starts, starts_rx) = watch::channel(Vec::new());
    let max_live = Arc::new(AtomicUsize::new(0));
    let unit = Scripted {
        script: script.iter().copied().collect(),
        orders,
        starts,
        live: Arc::new(AtomicUsize::new(0)),
        max_live: Arc::clone(&max_live),
    };
    let probe = Probe {
        starts: starts_rx,
        orders: orders_tx,
        max_live,
    };
    (unit, probe)
}

fn scripted(name: &str, script: &[Failure]) -> (Handle, Probe) {
    let (unit, probe) = scripted_unit(script);
    let handle = Task::builder(name)
        .unit(unit)
        .spawn_paused()
        .expect("in a runtime");
    (handle, probe)
}

/// How long a test waits for a state before it fails instead of hanging: on the paused
/// clock this is virtual time, far beyond every delay a test expects.
const PATIENCE: Duration = Duration::from_secs(6 * 3600);

async fn bounded<F: std::future::Future>(future: F, what: &str) -> F::Output {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(output) => output,
        Err(_) => panic!("gave up waiting for {what}"),
    }
}

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn no_jitter() -> BackoffSettings {
    BackoffSettings::default().with_jitter(Jitter::None)
}

fn gaps(starts: &[Instant]) -> Vec<Duration> {
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

async fn status_where(
    policy: &AutoResume,
    id: Key,
    mut predicate: impl FnMut(&Status) -> bool,
) -> Status {
    let status = policy.wait_for(id, |status| status.is_some_and(&mut predicate));
    bounded(status, "a policy status")
        .await
        .expect("the task is watched")
}

async fn paused_failed(task: &Handle, generation: u64) {
    let snap = task.wait_for(|s| s.stage == Stage::Paused && s.generation == generation);
    let snap = bounded(snap, "a failed run").await;
    assert!(
        snap.outcome.as_ref().is_some_and(|o| o.is_failed()),
        "run {generation} should have failed: {snap:?}"
    );
}

/// Waits until the task runs its `generation`-th run.
async fn running(task: &Handle, generation: u64) {
    let snap = task.wait_for(|s| s.stage == Stage::Running && s.generation == generation);
    bounded(snap, "a running task").await;
}

/// Waits until the policy has dropped the task's state.
async fn forgotten(policy: &AutoResume, id: Key) {
    let status = policy.wait_for(id, |status| status.is_none());
    assert_eq!(bounded(status, "the policy to forget a task").await, None);
}

/// Drives one task through four failures with `dispatch_once` at chosen instants, and
/// returns the scheduled delays (`until - observed`).
async fn scheduled_delays(policy: &AutoResume) -> Vec<Duration> {
    let (task, _probe) = scripted("flaky", &[Failure::Blip; 5]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");
    let mut delays = Vec::new();
    for step in 0..4u32 {
        let generation = u64::from(step) + 1;
        paused_failed(&task, generation).await;

        // The first dispatch after the failure schedules the auto-resume.
        let seen = Instant::now();
        let dispatch = policy.dispatch_once(seen).await;
        assert!(dispatch.resumed.is_empty());
        let status = policy.status(id).expect("watched");
        let Standing::BackingOff { until } = status.standing else {
            panic!("a resumable failure backs off: {status:?}");
        };
        assert!(status.standing.is_skipped());
        assert_eq!(status.next_due, Some(until));
        assert_eq!(dispatch.next_wake, Some(until));
        assert_eq!((status.step, status.auto_resumes), (step, u64::from(step)));
        assert_eq!(status.delay, secs(1 << step));
        delays.push(until - seen);

        // Just before the due instant nothing happens.
        tokio::time::advance(until - seen - Duration::from_millis(1)).await;
        let dispatch = policy.dispatch_once(Instant::now()).await;
        assert!(dispatch.resumed.is_empty(), "resumed early at step {step}");
        assert_eq!(task.snapshot().generation, generation);

        // At the due instant the task is resumed, and the step grows.
        tokio::time::advance(Duration::from_millis(1)).await;
        let dispatch = policy.dispatch_once(Instant::now()).await;
        assert_eq!(dispatch.resumed, vec![id]);
        let status = policy.status(id).expect("watched");
        assert_eq!(
            (status.step, status.auto_resumes),
            (step + 1, u64::from(step) + 1)
        );
        assert_eq!(status.next_due, None);
    }
    // Run 5 fails too, at step 4: it would wait 16 s.
    paused_failed(&task, 5).await;
    policy.dispatch_once(Instant::now()).await;
    assert_eq!(policy.status(id).expect("watched").delay, secs(16));
    delays
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_1_2_4_8_across_dispatches() {
    let policy = AutoResume::new(no_jitter(), classify);
    let delays = scheduled_delays(&policy).await;
    assert_eq!(delays, [secs(1), secs(2), secs(4), secs(8)]);
}

#[tokio::test(start_paused = true)]
async fn equal_jitter_stays_within_half_to_full_and_a_seed_repeats_it() {
    let settings = BackoffSettings::default();
    assert_eq!(settings.jitter(), Jitter::Equal);
    let first = scheduled_delays(&AutoResume::with_rng_seed(settings, classify, 7)).await;
    for (step, delay) in first.iter().enumerate() {
        let base = secs(1 << step);
        assert!(
            *delay >= base / 2 && *delay <= base,
            "step {step}: {delay:?} is outside [{:?}, {base:?}]",
            base / 2
        );
    }
    let again = scheduled_delays(&AutoResume::with_rng_seed(settings, classify, 7)).await;
    assert_eq!(first, again, "the same seed gives the same delays");
    let other = scheduled_delays(&AutoResume::with_rng_seed(settings, classify, 8)).await;
    assert_ne!(first, other, "another seed gives other delays");
}

#[tokio::test(start_paused = true)]
async fn the_driver_resumes_after_1_2_4_8_seconds() {
    let policy = AutoResume::new(no_jitter(), classify);
    let driver = tokio::spawn(policy.run());
    let (task, mut probe) = scripted("flaky", &[Failure::Blip; 4]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");

    // The paused clock jumps to each due instant as soon as everything is idle.
    let starts = probe.runs(5).await;
    assert_eq!(gaps(&starts), [secs(1), secs(2), secs(4), secs(8)]);
    running(&task, 5).await;
    let status = status_where(&policy, id, |s| {
        matches!(s.standing, Standing::Healthy { .. })
    })
    .await;
    assert_eq!((status.step, status.auto_resumes), (4, 4));
    assert_eq!(status.next_due, None);
    assert_eq!(probe.max_live.load(Ordering::SeqCst), 1);

    drop(policy);
    driver
        .await
        .expect("the driver returns once the policy is dropped");
}

#[tokio::test(start_paused = true)]
async fn one_step_is_rolled_back_per_healthy_period() {
    let settings = no_jitter()
        .with_healthy_period(secs(300))
        .expect("positive");
    let policy = AutoResume::new(settings, classify);
    tokio::spawn(policy.run());
    let (task, mut probe) = scripted("flaky", &[Failure::Blip; 2]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");

    // Two failures, two auto-resumes (after 1 s and 2 s): step 2, then healthy.
    probe.runs(3).await;
    let healthy = status_where(&policy, id, |s| {
        matches!(s.standing, Standing::Healthy { .. })
    })
    .await;
    let Standing::Healthy { since } = healthy.standing else {
        unreachable!()
    };
    assert_eq!((healthy.step, healthy.delay), (2, secs(4)));
    assert_eq!(healthy.rollback_due, Some(since + secs(300)));

    // Healthy for one period: one step back, not a reset.
    let rolled = status_where(&policy, id, |s| s.step == 1).await;
    assert_eq!(Instant::now() - since, secs(300));
    assert_eq!(rolled.delay, secs(2));
    assert_eq!(rolled.standing, Standing::Healthy { since });
    assert_eq!(rolled.rollback_due, Some(since + secs(600)));

    // A failure now waits the rolled-back delay (2 s, not 4 s) and steps up again.
    let failed_at = Instant::now();
    probe.order(Order::Fail(Failure::Blip));
    let starts = probe.runs(4).await;
    assert_eq!(starts[3] - failed_at, secs(2));
    let after = status_where(&policy, id, |s| s.auto_resumes == 3).await;
    assert_eq!(after.step, 2);

    // A new healthy streak starts with the new run; two periods take two steps.
    running(&task, 4).await;
    let streak = status_where(&policy, id, |s| {
        matches!(s.standing, Standing::Healthy { .. })
    })
    .await;
    let Standing::Healthy { since } = streak.standing else {
        unreachable!()
    };
    assert_eq!(since, starts[3]);
    let rested = status_where(&policy, id, |s| s.step == 0).await;
    assert_eq!(Instant::now() - since, secs(600));
    assert_eq!(rested.rollback_due, None);
}

#[tokio::test(start_paused = true)]
async fn a_healthy_streak_restarts_after_a_resume_and_survives_the_next_unit() {
    let settings = no_jitter()
        .with_healthy_period(secs(300))
        .expect("positive");
    let policy = AutoResume::new(settings, classify);
    let (first, first_probe) = scripted_unit(&[Failure::Blip]);
    let (second, _second_probe) = scripted_unit(&[]);
    let task = Task::builder("two-units")
        .unit(first)
        .unit(second)
        .spawn_paused()
        .expect("in a runtime");
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");

    // One auto-resume: step 1, then a healthy streak from t1.
    paused_failed(&task, 1).await;
    policy.dispatch_once(Instant::now()).await;
    tokio::time::advance(secs(1)).await;
    assert_eq!(policy.dispatch_once(Instant::now()).await.resumed, vec![id]);
    running(&task, 2).await;
    let t1 = Instant::now();
    policy.dispatch_once(t1).await;
    let status = policy.status(id).expect("watched");
    assert_eq!(
        (status.standing, status.step),
        (Standing::Healthy { since: t1 }, 1)
    );

    // It fails and the user resumes it before the policy looks again: the policy
    // never saw it at rest, but the new run of the same unit starts a new streak.
    tokio::time::advance(secs(100)).await;
    first_probe.order(Order::Fail(Failure::Blip));
    paused_failed(&task, 2).await;
    task.resume().await.expect("Paused resumes");
    running(&task, 3).await;
    let t2 = Instant::now();
    policy.dispatch_once(t2).await;
    let status = policy.status(id).expect("watched");
    assert_eq!(status.standing, Standing::Healthy { since: t2 });
    assert_eq!(status.rollback_due, Some(t2 + secs(300)));

    // The first unit completes and the second runs: the same streak goes on.
    tokio::time::advance(secs(100)).await;
    first_probe.order(Order::Complete);
    running(&task, 4).await;
    policy.dispatch_once(Instant::now()).await;
    let status = policy.status(id).expect("watched");
    assert_eq!(
        (status.standing, status.step),
        (Standing::Healthy { since: t2 }, 1)
    );

    // One period after t2 (not after t1), one step is rolled back.
    tokio::time::advance(secs(199)).await;
    policy.dispatch_once(Instant::now()).await;
    assert_eq!(policy.status(id).expect("watched").step, 1);
    tokio::time::advance(secs(1)).await;
    let dispatch = policy.dispatch_once(Instant::now()).await;
    let status = policy.status(id).expect("watched");
    assert_eq!((status.step, status.rollback_due), (0, None));
    assert_eq!(dispatch.next_wake, None);
}

#[tokio::test(start_paused = true)]
async fn a_user_resume_in_progress_cancels_the_schedule() {
    let policy = AutoResume::new(no_jitter(), classify);
    let (gate, gate_rx) = watch::channel(false);
    let task = Task::builder("slow-check")
        .unit(SlowCheck {
            runs: 0,
            gate: gate_rx,
        })
        .spawn_paused()
        .expect("in a runtime");
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");
    paused_failed(&task, 1).await;
    let failed_at = Instant::now();
    let dispatch = policy.dispatch_once(failed_at).await;
    assert_eq!(dispatch.next_wake, Some(failed_at + secs(1)));

    // The user resumes before the policy does; the pre-start check outlasts the due
    // instant.
    tokio::time::advance(Duration::from_millis(500)).await;
    task.resume().await.expect("Paused resumes");
    tokio::time::advance(secs(2)).await;
    assert_eq!(task.stage(), Stage::Resuming);
    let dispatch = policy.dispatch_once(Instant::now()).await;
    assert!(dispatch.resumed.is_empty());
    assert_eq!(
        dispatch.next_wake, None,
        "nothing is due: the failure is over"
    );
    let status = policy.status(id).expect("watched");
    assert_eq!(
        (status.standing, status.next_due),
        (Standing::Changing, None)
    );

    gate.send_replace(true);
    running(&task, 2).await;
    policy.dispatch_once(Instant::now()).await;
    let status = policy.status(id).expect("watched");
    assert!(matches!(status.standing, Standing::Healthy { .. }));
    assert_eq!((status.step, status.auto_resumes), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn two_tasks_are_independent() {
    let policy = AutoResume::new(no_jitter(), classify);
    tokio::spawn(policy.run());
    let (blocked, blocked_probe) = scripted("blocked", &[Failure::Fatal]);
    let (flaky, mut flaky_probe) = scripted("flaky", &[Failure::Blip; 4]);
    let blocked_id = policy.add(&blocked);
    let flaky_id = policy.add(&flaky);
    let started = Instant::now();
    blocked.resume().await.expect("New resumes");
    flaky.resume().await.expect("New resumes");

    // The flaky task is resumed after every failure, on its own schedule.
    let starts = flaky_probe.runs(5).await;
    assert_eq!(gaps(&starts), [secs(1), secs(2), secs(4), secs(8)]);
    let flaky_status = status_where(&policy, flaky_id, |s| s.auto_resumes == 4).await;
    assert_eq!(flaky_status.step, 4);

    // The blocked task was never resumed, and says since when it is blocked.
    assert_eq!(blocked_probe.starts.borrow().len(), 1);
    assert_eq!(blocked.snapshot().generation, 1);
    let status = policy.status(blocked_id).expect("watched");
    assert_eq!(status.standing, Standing::NotResumable { since: started });
    assert!(status.standing.is_skipped());
    assert_eq!(
        (status.step, status.auto_resumes, status.next_due),
        (0, 0, None)
    );

    // Time passing does not unblock it.
    tokio::time::sleep(secs(3600)).await;
    assert_eq!(blocked.snapshot().generation, 1);
    assert_eq!(
        policy.status(blocked_id).expect("watched").standing,
        Standing::NotResumable { since: started }
    );

    // A resume by the user that fails resumably is the policy's business again.
    blocked.resume().await.expect("Paused resumes");
    blocked_probe.order(Order::Fail(Failure::Blip));
    let resumed = status_where(&policy, blocked_id, |s| s.auto_resumes == 1).await;
    assert_eq!(resumed.step, 1);
}

#[tokio::test(start_paused = true)]
async fn user_paused_tasks_are_never_resumed() {
    let policy = AutoResume::new(no_jitter(), classify);
    tokio::spawn(policy.run());

    // A running task the user pauses.
    let (running, _running_probe) = scripted("running", &[]);
    let running_id = policy.add(&running);
    running.resume().await.expect("New resumes");
    running.wait_for_stage(|s| s == Stage::Running).await;
    assert_eq!(running.pause().await, Ok(Stage::Paused));

    // A task that failed resumably, then the user paused it before its resume was due.
    let (failed, _failed_probe) = scripted("failed", &[Failure::Blip]);
    let failed_id = policy.add(&failed);
    failed.resume().await.expect("New resumes");
    let backing_off = status_where(&policy, failed_id, |s| {
        matches!(s.standing, Standing::BackingOff { .. })
    })
    .await;
    assert!(backing_off.next_due.is_some());
    assert_eq!(failed.pause().await, Ok(Stage::Paused));
    assert!(failed.snapshot().user_paused);

    for id in [running_id, failed_id] {
        let status = status_where(&policy, id, |s| s.standing == Standing::UserPaused).await;
        assert!(status.standing.is_skipped());
        assert_eq!(status.next_due, None);
    }

    // Long past any delay, neither was resumed.
    tokio::time::sleep(secs(3600)).await;
    assert_eq!(running.snapshot().generation, 1);
    assert_eq!(failed.snapshot().generation, 1);
    for id in [running_id, failed_id] {
        let status = policy.status(id).expect("watched");
        assert_eq!(
            (status.standing, status.auto_resumes),
            (Standing::UserPaused, 0)
        );
    }

    // The user's own resume is respected, and the task is watched again.
    failed.resume().await.expect("Paused resumes");
    let healthy = status_where(&policy, failed_id, |s| {
        matches!(s.standing, Standing::Healthy { .. })
    })
    .await;
    assert_eq!((healthy.generation, healthy.auto_resumes), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_resumed_task_that_fails_again_backs_off_further() {
    let policy = AutoResume::new(no_jitter(), classify);
    tokio::spawn(policy.run());
    let (task, mut probe) = scripted("fragile", &[]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");

    let mut waited = Vec::new();
    for n in 1..=4usize {
        running(&task, n as u64).await;
        // It fails as soon as it runs again: well within the healthy period.
        let failed_at = Instant::now();
        probe.order(Order::Fail(Failure::Blip));
        let starts = probe.runs(n + 1).await;
        waited.push(starts[n] - failed_at);
        let status = status_where(&policy, id, |s| s.auto_resumes == n as u64).await;
        assert_eq!(status.step, n as u32);
    }
    assert_eq!(waited, [secs(1), secs(2), secs(4), secs(8)]);
}

#[tokio::test(start_paused = true)]
async fn stopped_finished_and_removed_tasks_lose_their_state() {
    let policy = AutoResume::new(no_jitter(), classify);
    tokio::spawn(policy.run());
    let backing_off = |s: &Status| matches!(s.standing, Standing::BackingOff { .. });

    // Stopped while backing off.
    let (stopped, _p1) = scripted("stopped", &[Failure::Blip]);
    let stopped_id = policy.add(&stopped);
    stopped.resume().await.expect("New resumes");
    status_where(&policy, stopped_id, backing_off).await;
    assert_eq!(stopped.stop().await, Ok(Stage::Stopped));
    forgotten(&policy, stopped_id).await;

    // Finished after an auto-resume.
    let (finished, p2) = scripted("finished", &[Failure::Blip]);
    let finished_id = policy.add(&finished);
    finished.resume().await.expect("New resumes");
    status_where(&policy, finished_id, |s| s.auto_resumes == 1).await;
    running(&finished, 2).await;
    p2.order(Order::Complete);
    forgotten(&policy, finished_id).await;
    assert_eq!(finished.stage(), Stage::Finished);

    // Removed while backing off: never resumed afterwards.
    let (removed, _p3) = scripted("removed", &[Failure::Blip, Failure::Blip]);
    let removed_id = policy.add(&removed);
    removed.resume().await.expect("New resumes");
    status_where(&policy, removed_id, backing_off).await;
    assert!(policy.remove(removed_id).is_some());
    assert!(policy.status(removed_id).is_none());
    assert!(policy.remove(removed_id).is_none());
    tokio::time::sleep(secs(3600)).await;
    assert_eq!(removed.snapshot().generation, 1);
    assert!(policy.is_empty());

    // Added again, it is a new key with fresh state.
    let again = policy.add(&removed);
    assert_ne!(again, removed_id);
    let status = status_where(&policy, again, backing_off).await;
    assert_eq!((status.step, status.auto_resumes), (0, 0));
    assert_eq!(policy.tasks(), vec![again]);
}

#[tokio::test(start_paused = true)]
async fn the_policy_does_not_keep_a_dropped_task_alive() {
    let policy = AutoResume::new(no_jitter(), classify);
    tokio::spawn(policy.run());
    let backing_off = |s: &Status| matches!(s.standing, Standing::BackingOff { .. });
    let (task, _probe) = scripted("dropped", &[Failure::Blip, Failure::Blip]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");
    status_where(&policy, id, backing_off).await;
    let mut events = task.subscribe();
    // The user's last handle goes: the task stops although the policy watches it.
    drop(task);
    events
        .wait_for(|e| e.stage == Stage::Stopped)
        .await
        .expect("the task reports Stopped");
    forgotten(&policy, id).await;
    assert!(policy.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_panicking_classifier_blocks_the_task() {
    let policy = AutoResume::new(no_jitter(), |_: &RunError| -> bool {
        panic!("classifier bug")
    });
    tokio::spawn(policy.run());
    let (task, _probe) = scripted("flaky", &[Failure::Blip]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");
    let status = status_where(&policy, id, |s| {
        matches!(s.standing, Standing::NotResumable { .. })
    })
    .await;
    assert_eq!(status.auto_resumes, 0);
    tokio::time::sleep(secs(3600)).await;
    assert_eq!(task.snapshot().generation, 1);
}

#[test]
fn invalid_settings_are_refused() {
    let ms = Duration::from_millis;
    assert_eq!(
        BackoffSettings::new(secs(10), secs(1), 2.0),
        Err(PolicySettingsError::MinAboveMax {
            min: secs(10),
            max: secs(1)
        })
    );
    assert_eq!(
        BackoffSettings::new(secs(1), secs(10), 0.5),
        Err(PolicySettingsError::FactorBelowOne { factor: 0.5 })
    );
    assert!(matches!(
        BackoffSettings::new(secs(1), secs(10), f64::NAN),
        Err(PolicySettingsError::FactorNotFinite { factor }) if factor.is_nan()
    ));
    assert_eq!(
        BackoffSettings::new(secs(1), secs(10), f64::INFINITY),
        Err(PolicySettingsError::FactorNotFinite {
            factor: f64::INFINITY
        })
    );
    assert_eq!(
        BackoffSettings::new(Duration::ZERO, secs(10), 2.0),
        Err(PolicySettingsError::Zero {
            setting: Setting::Min
        })
    );
    assert_eq!(
        BackoffSettings::default().with_healthy_period(Duration::ZERO),
        Err(PolicySettingsError::Zero {
            setting: Setting::HealthyPeriod
        })
    );

    // The messages name the setting and the values.
    let message =
        |r: Result<BackoffSettings, PolicySettingsError>| r.expect_err("refused").to_string();
    assert_eq!(
        message(BackoffSettings::new(ms(1500), ms(1000), 2.0)),
        "backoff minimum 1.5s is above the backoff maximum 1s"
    );
    assert_eq!(
        message(BackoffSettings::new(ms(1), ms(2), 0.9)),
        "backoff factor 0.9 is below 1"
    );
    assert_eq!(
        message(BackoffSettings::default().with_healthy_period(Duration::ZERO)),
        "healthy period is zero; it must be longer than zero"
    );

    // Edge cases that are valid: min = max, factor = 1.
    let flat = BackoffSettings::new(secs(3), secs(3), 1.0).expect("valid");
    assert_eq!(flat.delay_at(0), secs(3));
    assert_eq!(flat.delay_at(50), secs(3));
}

#[test]
fn the_defaults_are_1s_5min_factor_2_equal_jitter_5min_healthy() {
    let settings = BackoffSettings::default();
    assert_eq!(settings.min(), secs(1));
    assert_eq!(settings.max(), secs(300));
    assert_eq!(settings.factor(), 2.0);
    assert_eq!(settings.jitter(), Jitter::Equal);
    assert_eq!(settings.healthy_period(), secs(300));
    assert_eq!(
        BackoffSettings::new(secs(1), secs(300), 2.0).expect("valid"),
        settings
    );
}

#[test]
fn backoff_steps_up_to_the_cap_and_back_down() {
    let mut backoff = Backoff::new(no_jitter());
    let mut delays = Vec::new();
    for _ in 0..12 {
        delays.push(backoff.next_delay().as_secs());
    }
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    // The step stops growing at the cap, so one rollback leaves it.
    assert_eq!(backoff.step(), 9);
    assert!(backoff.rollback());
    assert_eq!(backoff.current(), secs(256));
    for _ in 0..8 {
        assert!(backoff.rollback());
    }
    assert_eq!((backoff.step(), backoff.current()), (0, secs(1)));
    assert!(!backoff.rollback(), "never below step 0");
    assert_eq!(backoff.current(), secs(1));

    // A fractional factor is computed to the nanosecond and capped too.
    let settings = BackoffSettings::new(Duration::from_millis(100), secs(1), 1.5)
        .expect("valid")
        .with_jitter(Jitter::None);
    assert_eq!(settings.delay_at(1), Duration::from_millis(150));
    assert_eq!(settings.delay_at(2), Duration::from_millis(225));
    assert_eq!(settings.delay_at(40), secs(1));
    // A huge step does not overflow.
    assert_eq!(BackoffSettings::default().delay_at(u32::MAX), secs(300));
}

#[test]
fn equal_jitter_draws_half_fixed_half_random() {
    let settings = BackoffSettings::default();
    let mut backoff = Backoff::with_seed(settings, 42);
    backoff.advance();
    backoff.advance();
    let base = backoff.current();
    assert_eq!(base, secs(4));
    let draws: Vec<Duration> = (0..1000).map(|_| backoff.delay()).collect();
    assert!(draws.iter().all(|d| *d >= base / 2 && *d <= base));
    // Spread over the random half, not stuck at one end.
    let low = draws.iter().filter(|d| **d < base * 3 / 4).count();
    assert!(
        (300..700).contains(&low),
        "{low} of 1000 draws in the lower half"
    );
    // `delay` does not step; the same seed repeats the same draws.
    assert_eq!(backoff.step(), 2);
    let mut twin = Backoff::with_seed(settings, 42);
    twin.advance();
    twin.advance();
    let twin_draws: Vec<Duration> = (0..1000).map(|_| twin.delay()).collect();
    assert_eq!(draws, twin_draws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_a_multi_thread_runtime() {
    let settings = BackoffSettings::new(Duration::from_millis(1), Duration::from_millis(8), 2.0)
        .expect("valid");
    let policy = AutoResume::new(settings, classify);
    let driver = tokio::spawn(policy.run());

    let mut flaky = Vec::new();
    for n in 0..8 {
        let (task, probe) = scripted(&format!("flaky-{n}"), &[Failure::Blip; 3]);
        let id = policy.add(&task);
        flaky.push((task, probe, id));
    }
    let (blocked, _blocked_probe) = scripted("blocked", &[Failure::Fatal]);
    let blocked_id = policy.add(&blocked);
    for (task, _, _) in &flaky {
        task.resume().await.expect("New resumes");
    }
    blocked.resume().await.expect("New resumes");

    let settle = async {
        for (task, probe, id) in &flaky {
            running(task, 4).await;
            let status = status_where(&policy, *id, |s| {
                matches!(s.standing, Standing::Healthy { .. })
            })
            .await;
            assert_eq!(status.auto_resumes, 3);
            assert_eq!(
                probe.max_live.load(Ordering::SeqCst),
                1,
                "one run at a time"
            );
        }
        status_where(&policy, blocked_id, |s| {
            matches!(s.standing, Standing::NotResumable { .. })
        })
        .await;
    };
    tokio::time::timeout(secs(30), settle)
        .await
        .expect("every task settles");
    assert_eq!(blocked.snapshot().generation, 1);

    // Stopping a task drops its state, wherever the driver runs.
    for (task, _, id) in &flaky {
        assert_eq!(task.stop().await, Ok(Stage::Stopped));
        let gone = tokio::time::timeout(secs(30), policy.wait_for(*id, |s| s.is_none()))
            .await
            .expect("the policy forgets a stopped task");
        assert_eq!(gone, None);
    }
    assert_eq!(policy.tasks(), vec![blocked_id]);
    drop(policy);
    tokio::time::timeout(secs(30), driver)
        .await
        .expect("the driver returns")
        .expect("the driver does not panic");
}

/// The classifier is asked only about a failure the user did not pause: a task the
/// user paused before the policy looked at its failure is skipped without asking,
/// and stays paused however much later the policy looks again.
#[tokio::test(start_paused = true)]
async fn a_failure_the_user_paused_first_is_never_classified_nor_resumed() {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let policy = AutoResume::new(no_jitter(), move |error: &RunError| {
        // SeqCst: read by the test after the dispatch returned.
        counter.fetch_add(1, Ordering::SeqCst);
        classify(error)
    });
    let (task, _probe) = scripted("failed", &[Failure::Blip]);
    let id = policy.add(&task);
    task.resume().await.expect("New resumes");
    paused_failed(&task, 1).await;
    assert_eq!(task.pause().await, Ok(Stage::Paused));
    assert!(task.snapshot().user_paused);

    // No driver: each look is one dispatch, the last long past any delay.
    for later in [0, 1, 3600] {
        let dispatch = policy.dispatch_once(Instant::now() + secs(later)).await;
        assert!(dispatch.resumed.is_empty(), "resumed after {later} s");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the classifier was asked");
    let status = policy.status(id).expect("watched");
    assert_eq!(
        (status.standing, status.auto_resumes),
        (Standing::UserPaused, 0)
    );
    assert_eq!(task.snapshot().generation, 1);
}

/// The delay of step n is `min × factor^n`, capped at the maximum (docs/policy.md),
/// whatever the size of `factor^n`: an integral factor is exact to the nanosecond, also
/// past what a float holds, and reaches the cap only when the product does.
#[test]
fn an_integral_factor_is_exact_until_the_product_reaches_the_cap() {
    let year = secs(365 * 24 * 3600);
    let settings = BackoffSettings::new(Duration::from_millis(1), year, 3.0).expect("valid");
    // 3^21 does not fit in a u32, but 3^21 ms (121 days) is below the cap.
    assert_eq!(settings.delay_at(21), Duration::from_millis(3u64.pow(21)));
    assert_eq!(settings.delay_at(23), year, "3^23 ms is above a year");
    // 3_000_001 ns × 3^20 is above 2^53 ns and odd: a float would round it.
    let fine = BackoffSettings::new(Duration::from_nanos(3_000_001), year, 3.0).expect("valid");
    assert_eq!(
        fine.delay_at(20),
        Duration::from_nanos(3_000_001 * 3u64.pow(20))
    );
    // A step so large that the power overflows every integer is the cap.
    assert_eq!(settings.delay_at(u32::MAX), year);
}

/// The settings read back as given, and a fractional factor whose power is infinite as
/// a float gives the cap, not a panic.
#[test]
fn settings_read_back_and_an_infinite_power_is_the_cap() {
    let settings = BackoffSettings::new(secs(2), secs(90), 3.0)
        .expect("valid")
        .with_healthy_period(secs(45))
        .expect("valid")
        .with_jitter(Jitter::None);
    assert_eq!(
        (
            settings.min(),
            settings.max(),
            settings.factor(),
            settings.healthy_period(),
            settings.jitter()
        ),
        (secs(2), secs(90), 3.0, secs(45), Jitter::None)
    );
    let fractional = BackoffSettings::new(Duration::from_millis(100), secs(1), 1.5).expect("valid");
    assert_eq!(fractional.delay_at(u32::MAX), secs(1));
    // A fractional factor's delay is counted in whole nanoseconds, not converted
    // through seconds as a float (which is off by hundreds of ns at 2^62 ns).
    let huge = Duration::from_nanos(1 << 62);
    let long = BackoffSettings::new(huge, Duration::MAX, 1.5).expect("valid");
    assert_eq!(long.delay_at(0), huge);
    // Past u64 nanoseconds (584 years) it is counted in seconds.
    let ages = secs(1 << 40);
    let longer = BackoffSettings::new(ages, Duration::MAX, 1.5).expect("valid");
    assert_eq!(longer.delay_at(0), ages);
    // A backoff keeps the settings it was made with, and a reset goes back to step 0.
    let mut backoff = Backoff::new(settings);
    assert_eq!(backoff.settings(), &settings);
    backoff.advance();
    backoff.advance();
    assert_eq!(backoff.step(), 2);
    backoff.reset();
    assert_eq!((backoff.step(), backoff.current()), (0, secs(2)));
}

/// The observer reads what the policy reads out, in the order of addition, with a
/// revision that moves on every change and stays when nothing changed; holding it
/// does not keep the driver running.
#[tokio::test(start_paused = true)]
async fn an_observer_reads_the_statuses_and_keeps_no_driver_alive() {
    let policy = AutoResume::new(no_jitter(), classify);
    let driver = tokio::spawn(policy.run());
    let observer = policy.observer();
    let (first, _probe1) = scripted("first", &[Failure::Fatal]);
    let (second, _probe2) = scripted("second", &[Failure::Blip]);
    let before = observer.revision();
    let a = policy.add(&first);
    let after_one = observer.revision();
    assert_ne!(after_one, before, "an addition moves the revision");
    let b = policy.add(&second);
    let statuses = observer.statuses();
    let names: Vec<(Key, &str)> = statuses
        .iter()
        .map(|(k, s)| (*k, s.name.as_str()))
        .collect();
    assert_eq!(names, [(a, "first"), (b, "second")]);
    assert_eq!(observer.status(a), policy.status(a));
    let still = observer.revision();
    assert_eq!(observer.revision(), still, "no change, the same revision");

    first.resume().await.expect("New resumes");
    let blocked = status_where(&policy, a, |s| {
        matches!(s.standing, Standing::NotResumable { .. })
    })
    .await;
    assert_eq!(observer.status(a), Some(blocked));
    assert_ne!(
        observer.revision(),
        still,
        "an observation moves the revision"
    );

    drop(policy.remove(b));
    assert_eq!(observer.status(b), None);
    assert_eq!(observer.statuses().len(), 1);

    drop(policy);
    tokio::time::timeout(Duration::from_secs(60), driver)
        .await
        .expect("the driver returns though an observer is held")
        .expect("the driver did not panic");
    // The last recorded state is still read.
    assert_eq!(observer.statuses().len(), 1);
}
