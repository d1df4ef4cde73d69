//! The kit's own tests: each violation it reports is one it can find, and each
//! point it offers is one a schedule reaches.

use std::time::Duration;

use super::*;
use crate::sync::{lock, Arc, Mutex};
use crate::{RunContext, RunError, RunExit, Stage, Task, TaskBuilder, Unit};

/// How a test unit misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Copies its rows, checkpointing each, and returns when cancelled.
    Good,
    /// Once cancelled, never returns.
    IgnoresCancel,
    /// Fails after its third row.
    Fails,
    /// Ignores cancellation and never yields to the timer until real time passes.
    Spins,
    /// Never returns, and reports nothing.
    Forever,
}

struct Count {
    done: Arc<Mutex<u64>>,
    rows: u64,
    mode: Mode,
}

impl Unit for Count {
    fn name(&self) -> &str {
        "count"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        if self.mode == Mode::Forever {
            std::future::pending::<()>().await;
        }
        if self.mode == Mode::Spins {
            let until = std::time::Instant::now() + Duration::from_millis(1_500);
            while std::time::Instant::now() < until {
                tokio::task::yield_now().await;
            }
        }
        loop {
            if ctx.is_cancelled() {
                if self.mode == Mode::IgnoresCancel {
                    std::future::pending::<()>().await;
                }
                return Ok(RunExit::Cancelled);
            }
            let done = {
                let mut done = lock(&self.done);
                if *done == self.rows {
                    return Ok(RunExit::Completed);
                }
                *done += 1;
                *done
            };
            if self.mode == Mode::Fails && done == 3 {
                return Err(RunError::msg("row 3 is bad"));
            }
            ctx.report_progress(done, Some(self.rows));
            tokio::task::yield_now().await;
        }
    }
}

/// A unit whose pre-start check never returns.
struct HangsInCheck;

impl Unit for HangsInCheck {
    fn name(&self) -> &str {
        "hangs"
    }

    async fn prepare(&mut self, _ctx: RunContext) -> Result<(), RunError> {
        std::future::pending().await
    }

    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        Ok(RunExit::Completed)
    }
}

/// Two counting units, their counts kept across tasks.
struct Pair {
    counts: [Arc<Mutex<u64>>; 2],
    mode: Mode,
    unwatched: bool,
    check: Option<String>,
    /// Also starts a second copy of unit 0 in a task of its own: the original race.
    shadow: Option<crate::Handle>,
    shadows: bool,
    /// The shadow is a task whose pre-start check never returns.
    shadow_in_check: bool,
    /// A watched copy of unit 0, made with the first task and started by the first
    /// `update`: alive only after the pipeline came to rest.
    late: Option<Watched<Count>>,
    late_shadow: bool,
}

impl Pair {
    fn new(mode: Mode) -> Pair {
        Pair {
            counts: Default::default(),
            mode,
            unwatched: false,
            check: None,
            shadow: None,
            shadows: false,
            shadow_in_check: false,
            late: None,
            late_shadow: false,
        }
    }
}

impl Subject for Pair {
    type Config = ();

    fn task(&mut self, watch: &Watch) -> TaskBuilder {
        let unit = |i: usize, mode| Count {
            done: Arc::clone(&self.counts[i]),
            rows: 10,
            mode,
        };
        if self.shadows && self.shadow.is_none() {
            let copy = if self.shadow_in_check {
                Task::builder("shadow").unit(watch.unit(HangsInCheck))
            } else {
                Task::builder("shadow").unit(watch.unit(unit(0, Mode::Forever)))
            };
            self.shadow = copy.spawn().ok();
        }
        if self.late_shadow && self.late.is_none() && self.shadow.is_none() {
            self.late = Some(watch.unit(unit(0, Mode::Forever)));
        }
        let first = Task::builder("pair").unit(watch.unit(unit(0, Mode::Good)));
        if self.unwatched {
            first.unit(unit(1, self.mode))
        } else {
            first.unit(watch.unit(unit(1, self.mode)))
        }
    }

    fn update(&mut self, _n: u32) {
        if let Some(late) = self.late.take() {
            self.shadow = Task::builder("late").unit(late).spawn().ok();
        }
    }

    fn check(&mut self, end: &End) -> Result<(), String> {
        if let Some(problem) = &self.check {
            return Err(problem.clone());
        }
        let counts = self.counts.each_ref().map(|c| *lock(c));
        if end.stage == Stage::Finished && counts != [10, 10] {
            return Err(format!("finished with counts {counts:?}"));
        }
        Ok(())
    }
}

fn runner(make: fn() -> Pair) -> Runner<Pair> {
    Runner::new(move || Ok::<_, String>(make()))
}

fn schedule(text: &str) -> Schedule {
    match text.parse() {
        Ok(schedule) => schedule,
        Err(e) => panic!("{text}: {e}"),
    }
}

fn changes(timeline: &Timeline) -> Vec<(u32, Stage, Stage, Option<usize>)> {
    timeline
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Change { task, change } => Some((*task, change.from, change.stage, change.unit)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_good_pipeline_passes_and_each_point_is_reached_where_it_says() {
    let runner = runner(|| Pair::new(Mode::Good));
    // At the switch to unit 1: the pause finds the task Running in unit 1.
    let passed = runner
        .run(&schedule("at switch to unit 1: pause"))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!((passed.end, passed.skipped), (Stage::Finished, 0));
    let path = changes(&passed.timeline);
    assert!(
        path.contains(&(1, Stage::Running, Stage::Pausing, Some(1))),
        "{}",
        passed.timeline
    );
    // In the first check: the pause finds the task Resuming.
    let passed = runner
        .run(&schedule("in check: pause"))
        .unwrap_or_else(|f| panic!("{f}"));
    let path = changes(&passed.timeline);
    assert_eq!(
        path.get(1),
        Some(&(1, Stage::Resuming, Stage::Pausing, Some(0))),
        "{}",
        passed.timeline
    );
    // After 12 reports: 10 in unit 0, the second in unit 1.
    let passed = runner
        .run(&schedule("after 12 reports: stop"))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(passed.end, Stage::Stopped, "{}", passed.timeline);
    assert!(
        path_has(&passed.timeline, Stage::Running, Stage::Stopping, Some(1)),
        "{}",
        passed.timeline
    );
    // A restart builds task 2, which continues from the counts and finishes.
    let passed = runner
        .run(&schedule(
            "after 3 reports: stop; after 5 ms: restart; after 2 reports: pause",
        ))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(passed.end, Stage::Finished, "{}", passed.timeline);
    assert!(
        changes(&passed.timeline)
            .iter()
            .any(|&(task, _, stage, _)| (task, stage) == (2, Stage::Finished)),
        "{}",
        passed.timeline
    );
    // A point after the end never comes: the step is skipped, not waited for.
    let passed = runner
        .run(&schedule("after 50 reports: pause"))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(passed.skipped, 1, "{}", passed.timeline);
}

fn path_has(timeline: &Timeline, from: Stage, to: Stage, unit: Option<usize>) -> bool {
    changes(timeline)
        .iter()
        .any(|&(_, f, t, u)| (f, t, u) == (from, to, unit))
}

#[test]
fn a_unit_that_ignores_its_cancellation_is_named_with_its_generation() {
    let runner = runner(|| Pair::new(Mode::IgnoresCancel)).bound(Duration::from_secs(2));
    let failure = runner
        .run(&schedule("after 13 reports: pause"))
        .expect_err("the pause cannot settle");
    match &failure.violation {
        Violation::Unresponsive {
            command,
            bound,
            live,
        } => {
            assert_eq!(
                (*command, *bound),
                (crate::Command::Pause, Duration::from_secs(2))
            );
            let run = live.first().expect("the run is named");
            assert_eq!(
                (run.unit, run.generation, run.check),
                (1, 2, false),
                "{failure}"
            );
        }
        other => panic!("expected Unresponsive, got {other}"),
    }
    let text = failure.to_string();
    assert!(
        text.contains("unit 1 `count` (task 1, generation 2)"),
        "{text}"
    );
    assert!(
        text.contains("schedule (1 command): after 13 reports: pause"),
        "{text}"
    );
}

#[test]
fn a_failed_unit_is_a_final_stage_the_schedule_does_not_imply() {
    let failure = runner(|| Pair::new(Mode::Fails))
        .run(&Schedule::default())
        .expect_err("the unit fails");
    match &failure.violation {
        Violation::FinalStage {
            expected, actual, ..
        } => assert_eq!((*expected, *actual), (Stage::Finished, Stage::Paused)),
        other => panic!("expected FinalStage, got {other}"),
    }
    assert!(failure.to_string().contains("row 3 is bad"), "{failure}");
}

#[test]
fn the_users_check_a_missing_wrapper_and_a_bad_setup_are_reported() {
    let failure = runner(|| Pair {
        check: Some("target differs".to_owned()),
        ..Pair::new(Mode::Good)
    })
    .run(&Schedule::default())
    .expect_err("the check fails");
    assert!(
        matches!(&failure.violation, Violation::Check(text) if text == "target differs"),
        "{failure}"
    );
    let failure = runner(|| Pair {
        unwatched: true,
        ..Pair::new(Mode::Good)
    })
    .run(&Schedule::default())
    .expect_err("a unit is not watched");
    assert!(
        matches!(
            failure.violation,
            Violation::Unwatched {
                units: 2,
                watched: 1
            }
        ),
        "{failure}"
    );
    let failure = Runner::<Pair>::new(|| Err::<Pair, _>("no disk"))
        .run(&Schedule::default())
        .expect_err("the set-up fails");
    assert!(
        matches!(&failure.violation, Violation::Setup(text) if text == "no disk"),
        "{failure}"
    );
}

#[test]
fn a_unit_that_never_yields_to_the_timer_is_caught_by_the_real_time_limit() {
    let failure = runner(|| Pair::new(Mode::Spins))
        .time_limit(Duration::from_millis(300))
        .run(&schedule("at switch to unit 1: pause"))
        .expect_err("the run hangs");
    assert!(
        matches!(failure.violation, Violation::Hung(limit) if limit == Duration::from_millis(300)),
        "{failure}"
    );
}

#[test]
fn a_property_run_shrinks_to_the_minimal_failing_schedule() {
    // Only a pause in unit 1 (after its first report) finds the ignored cancellation.
    let runner = runner(|| Pair::new(Mode::IgnoresCancel))
        .bound(Duration::from_secs(1))
        .cases(64)
        .seed(11);
    let schedules = Schedules::new()
        .steps(1..=6)
        .units(2)
        .max_reports(20)
        .restart_weight(0);
    let report = runner.check(&schedules).expect_err("a schedule fails");
    let failure = report.failure().expect("a schedule failed");
    assert!(failure.schedule.len() <= 2, "{report}");
    assert!(
        matches!(failure.violation, Violation::Unresponsive { .. }),
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains("seed 11"), "{text}");
    assert!(
        text.contains(&format!("shrunk to {}", failure.schedule.len())),
        "{text}"
    );
    // The good pipeline passes the same schedules.
    let summary = super::Runner::new(|| Ok::<_, String>(Pair::new(Mode::Good)))
        .cases(32)
        .seed(11)
        .check(&schedules)
        .unwrap_or_else(|report| panic!("{report}"));
    assert_eq!((summary.cases, summary.seed), (32, 11));
    assert!(summary.skipped < summary.steps, "{summary:?}");
}

#[test]
fn a_second_copy_of_a_unit_running_beside_the_pipeline_is_two_live_runs() {
    let failure = runner(|| Pair {
        shadows: true,
        ..Pair::new(Mode::Good)
    })
    .run(&Schedule::default())
    .expect_err("two copies of unit 0 run at once");
    match &failure.violation {
        Violation::TwoLive { first, second } => {
            // The shadow's run, and the pipeline's own check or run of unit 0.
            assert_eq!((first.unit, second.unit), (0, 0), "{failure}");
            assert!(!first.check || !second.check, "{failure}");
        }
        other => panic!("expected TwoLive, got {other}"),
    }
}

#[test]
fn a_check_alive_beside_a_run_is_two_live() {
    // The shadow task's pre-start check never returns: the kit counts a check as
    // alive as it counts a run, so the pipeline's own check or run overlaps it.
    let failure = runner(|| Pair {
        shadows: true,
        shadow_in_check: true,
        ..Pair::new(Mode::Good)
    })
    .run(&Schedule::default())
    .expect_err("the shadow's check is alive beside the pipeline");
    match &failure.violation {
        Violation::TwoLive { first, second } => {
            let shadow = [first, second]
                .into_iter()
                .find(|id| id.name == "hangs")
                .unwrap_or_else(|| panic!("the shadow's check is not named: {failure}"));
            assert!(shadow.check, "{failure}");
        }
        other => panic!("expected TwoLive, got {other}"),
    }
}

#[test]
fn a_run_alive_when_the_schedule_ends_is_caught() {
    // The pipeline is stopped; then the subject starts a watched copy of unit 0 that
    // never returns, overlapping nothing. The end-of-schedule check finds it alive.
    let failure = runner(|| Pair {
        late_shadow: true,
        ..Pair::new(Mode::Good)
    })
    .run(&schedule(
        "after 1 report: stop; after 1 ms: update 1; after 1 ms: resume",
    ))
    .expect_err("a run is alive at the end");
    match &failure.violation {
        Violation::LiveAfterCommand {
            command: crate::Command::Resume,
            stage: Stage::Stopped,
            live,
        } => assert_eq!((live.unit, live.check), (0, false), "{failure}"),
        other => panic!("expected LiveAfterCommand at the end, got {other}"),
    }
}

#[test]
fn a_pause_that_returns_while_a_run_is_alive_is_caught() {
    // The shadow copy's run never returns; the pipeline's own pause settles, and the
    // runner finds a run alive as it does.
    let failure = runner(|| Pair {
        shadows: true,
        ..Pair::new(Mode::Good)
    })
    .run(&schedule("after 1 report: pause"))
    .expect_err("the shadow is alive when the pause returns");
    assert!(
        matches!(
            failure.violation,
            Violation::LiveAfterCommand {
                command: crate::Command::Pause,
                stage: Stage::Paused,
                ..
            }
        ),
        "{failure}"
    );
}

#[test]
fn two_live_runs_are_counted_by_the_wrappers_themselves() {
    // The crate never lets this happen, so the probe is driven directly: the count
    // is the wrappers' own, from their futures' lives.
    let probe = Arc::new(super::probe::Probe::default());
    let id = |generation| RunId {
        task: 1,
        unit: 0,
        name: "count".to_owned(),
        generation,
        check: false,
    };
    let first = probe.enter(id(1));
    assert_eq!(probe.overlap(), None);
    let second = probe.enter(id(2));
    assert_eq!(probe.overlap(), Some((id(1), id(2))));
    assert_eq!(probe.live().len(), 2);
    drop((first, second));
    assert!(probe.live().is_empty());
}

/// A unit that records the configurations it was given.
struct Configured {
    seen: Arc<Mutex<Vec<u32>>>,
    done: u64,
}

impl Unit<u32> for Configured {
    async fn run(&mut self, ctx: RunContext<u32>) -> Result<RunExit, RunError> {
        while self.done < 6 {
            if ctx.is_cancelled() {
                return Ok(RunExit::Cancelled);
            }
            self.done += 1;
            ctx.report_progress(self.done, Some(6));
            tokio::task::yield_now().await;
        }
        Ok(RunExit::Completed)
    }

    fn apply_config(&mut self, config: &u32) -> Result<(), RunError> {
        lock(&self.seen).push(*config);
        Ok(())
    }
}

struct Settings {
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Subject for Settings {
    type Config = u32;

    fn task(&mut self, watch: &Watch<u32>) -> TaskBuilder<u32> {
        let unit = Configured {
            seen: Arc::clone(&self.seen),
            done: 0,
        };
        Task::builder("settings").config(0).unit(watch.unit(unit))
    }

    fn update(&mut self, n: u32) -> u32 {
        n * 10
    }
}

#[test]
fn an_update_is_refused_while_a_run_holds_the_unit_and_applied_after_a_pause() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::clone(&seen);
    let passed = Runner::new(move || {
        Ok::<_, String>(Settings {
            seen: Arc::clone(&shared),
        })
    })
    .run(&schedule(
        "after 2 reports: update 7; after 1 report: pause; after 1 ms: update 9",
    ))
    .unwrap_or_else(|f| panic!("{f}"));
    let steps: Vec<String> = passed
        .timeline
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Step { result, .. } => Some(result.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 3, "{}", passed.timeline);
    assert!(
        steps[0].starts_with("refused: update refused in stage Running"),
        "{steps:?}"
    );
    assert_eq!(steps[1], "Paused");
    assert_eq!(steps[2], "updated");
    // The unit got the configuration of `update 9` before the run that finished it.
    assert_eq!(*lock(&seen), [90], "{}", passed.timeline);
}

/// A unit that tails for ever: reports progress every 10 ms until it is cancelled.
struct Tail;

impl Unit for Tail {
    fn name(&self) -> &str {
        "tail"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        let mut seen = 0;
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(RunExit::Cancelled),
                () = tokio::time::sleep(Duration::from_millis(10)) => {
                    seen += 1;
                    ctx.report_progress(seen, None);
                }
            }
        }
    }
}

/// A dump that completes, then a sync that tails until it is stopped.
struct DumpThenTail {
    dumped: Arc<Mutex<u64>>,
}

impl Subject for DumpThenTail {
    type Config = ();

    fn task(&mut self, watch: &Watch) -> TaskBuilder {
        let dump = Count {
            done: Arc::clone(&self.dumped),
            rows: 10,
            mode: Mode::Good,
        };
        Task::builder("dump-then-tail")
            .unit(watch.unit(dump))
            .unit(watch.unit(Tail))
    }

    fn update(&mut self, _n: u32) {}
}

fn tailing() -> Runner<DumpThenTail> {
    Runner::new(|| {
        Ok::<_, String>(DumpThenTail {
            dumped: Arc::new(Mutex::new(0)),
        })
    })
}

#[test]
fn a_pipeline_whose_last_unit_runs_until_stopped_is_checked_with_a_stop_at_the_end() {
    let passed = tailing()
        .ends_with_stop()
        .run(&schedule("at switch to unit 1: pause; after 30 ms: resume"))
        .expect("the schedule passes");
    assert_eq!(passed.end, Stage::Stopped);
    let summary = tailing()
        .ends_with_stop()
        .cases(16)
        .seed(3)
        .check(&Schedules::new().units(2).restart_weight(0))
        .expect("every schedule passes");
    assert_eq!(summary.cases, 16);
}

#[test]
fn a_pipeline_that_never_ends_fails_on_the_paused_clock_not_in_real_time() {
    let failure = tailing()
        .schedule_limit(Duration::from_secs(60))
        .time_limit(Duration::from_secs(30))
        .run(&schedule("at switch to unit 1: pause; after 30 ms: resume"))
        .expect_err("the task never finishes");
    assert!(
        matches!(failure.violation, Violation::Overran(limit) if limit == Duration::from_secs(60)),
        "{failure}"
    );
}

#[test]
fn a_schedule_that_hangs_in_real_time_is_reported_without_shrinking() {
    let setups = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&setups);
    let runner = Runner::new(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, String>(Pair::new(Mode::Spins))
    })
    .time_limit(Duration::from_millis(300))
    .cases(8)
    .seed(5);
    let report = runner
        .check(&Schedules::new().units(2).restart_weight(0))
        .expect_err("every schedule hangs");
    let Report::Failed { failure, cases, .. } = report else {
        panic!("{report}");
    };
    assert!(matches!(failure.violation, Violation::Hung(_)), "{failure}");
    assert_eq!(cases, 0, "the first schedule hung");
    assert_eq!(
        setups.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "schedules ran after one hung: each shrink step waits out the real-time limit"
    );
}

/// Reports twice per step (rows read, then rows written) and yields once: two
/// reports the kit sees at one `Pending`. Records the progress it had when it first
/// saw its cancellation.
struct ReportsTwice {
    done: Arc<Mutex<u64>>,
    cancelled_at: Arc<Mutex<Option<u64>>>,
}

impl Unit for ReportsTwice {
    fn name(&self) -> &str {
        "twice"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        loop {
            let done = *lock(&self.done);
            if ctx.is_cancelled() {
                lock(&self.cancelled_at).get_or_insert(done);
                return Ok(RunExit::Cancelled);
            }
            if done == 10 {
                return Ok(RunExit::Completed);
            }
            ctx.report_progress(done + 1, Some(10));
            ctx.report_progress(done + 2, Some(10));
            *lock(&self.done) = done + 2;
            tokio::task::yield_now().await;
        }
    }
}

struct Twice {
    done: Arc<Mutex<u64>>,
    cancelled_at: Arc<Mutex<Option<u64>>>,
}

impl Subject for Twice {
    type Config = ();

    fn task(&mut self, watch: &Watch) -> TaskBuilder {
        Task::builder("twice").unit(watch.unit(ReportsTwice {
            done: Arc::clone(&self.done),
            cancelled_at: Arc::clone(&self.cancelled_at),
        }))
    }

    fn update(&mut self, _n: u32) {}

    fn check(&mut self, _end: &End) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn every_report_counts_even_two_with_no_pending_between_them() {
    let cancelled_at = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&cancelled_at);
    let runner = Runner::new(move || {
        Ok::<_, String>(Twice {
            done: Arc::new(Mutex::new(0)),
            cancelled_at: Arc::clone(&seen),
        })
    });
    // Reports 1 and 2 come before the first `Pending`, 3 and 4 before the second:
    // the fourth report is counted there, so the pause finds 4 rows done.
    let passed = runner
        .run(&schedule("after 4 reports: pause"))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!((passed.end, passed.skipped), (Stage::Finished, 0));
    assert_eq!(*lock(&cancelled_at), Some(4), "{}", passed.timeline);
    // Three reports are counted at the second `Pending` too: the run is held at the
    // first one after the third report, with 4 done.
    *lock(&cancelled_at) = None;
    let passed = runner
        .run(&schedule("after 3 reports: pause"))
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(*lock(&cancelled_at), Some(4), "{}", passed.timeline);
}
