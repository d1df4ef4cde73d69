//! The runner: a user's pipeline under a schedule, the checks, and the shrunk report.

use std::fmt;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::time::Duration;

use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::probe::{Probe, RunId, Watch};
use super::schedule::{Action, Point, Schedule, Step};
use super::strategy::{rng, ConfigError, Schedules};
use crate::error::{BuildError, Error};
use crate::lifecycle::Change;
use crate::outcome::Outcome;
use crate::runtime::{Event, Handle, Settling, TaskBuilder};
use crate::stage::{Command, Stage};
use crate::sync::{lock, Arc, Mutex};

/// The user's side of a test: builds the task, makes configurations, checks the end.
///
/// The [`Runner`] makes one subject per schedule (so each schedule starts from a
/// fresh state, e.g. fresh databases) and builds every task of that schedule from it:
/// the first, and one more after each `restart`. A task built after a restart must
/// continue from what the units made durable, so its units are fresh values that
/// know nothing but their checkpoints.
pub trait Subject: Send + 'static {
    /// The task's configuration type (`()` for none).
    type Config: Send + Sync + 'static;

    /// Builds a task: every unit goes through [`Watch::unit`]. Not started yet: the
    /// runner starts it.
    fn task(&mut self, watch: &Watch<Self::Config>) -> TaskBuilder<Self::Config>;

    /// The configuration an `update n` step sends.
    fn update(&mut self, n: u32) -> Self::Config;

    /// Checks the end state once the last task is at its end (e.g. "the target equals
    /// the source"); `Err` says what is wrong.
    ///
    /// # Errors
    ///
    /// What the user finds wrong with the end state.
    fn check(&mut self, end: &End) -> Result<(), String> {
        let _ = end;
        Ok(())
    }
}

/// How a schedule's run ended, for [`Subject::check`].
#[derive(Debug, Clone)]
pub struct End {
    /// The last task's final stage: as the schedule implies (Finished, or Stopped
    /// when it stopped the task for good); the check runs only then.
    pub stage: Stage,
    /// What the last run of the last task returned.
    pub outcome: Option<Outcome>,
    /// How many tasks were built (1, plus one per restart).
    pub tasks: u32,
}

/// One entry of a run's timeline.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Line {
    /// A change of a task, from its [`Handle::events`] stream.
    Change {
        /// The task, counted from 1.
        task: u32,
        /// The change.
        change: Change,
    },
    /// A step of the schedule and what it did.
    Step {
        /// Its number, counted from 1.
        number: usize,
        /// The step.
        step: Step,
        /// What happened ("Paused", "skipped: ...", "refused: ...").
        result: String,
    },
    /// Something else the runner did (building a task, resuming at the end).
    Note(String),
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Change { task, change } => {
                write!(
                    f,
                    "task {task} #{:<3} {} -> {} ({})",
                    change.seq,
                    change.from,
                    change.stage,
                    change.cause.name()
                )?;
                if let Some(unit) = change.unit {
                    write!(f, ", unit {unit}")?;
                }
                write!(f, ", generation {}", change.generation)?;
                if let Some(Outcome::Failed(error)) = &change.outcome {
                    write!(f, ", failed: {error}")?;
                }
                Ok(())
            }
            Line::Step {
                number,
                step,
                result,
            } => write!(f, "step {number} `{step}`: {result}"),
            Line::Note(text) => f.write_str(text),
        }
    }
}

/// The stage timeline of one run: every change of every task, with the schedule's
/// steps between them.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The entries, in the order they were recorded.
    pub lines: Vec<Line>,
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// What went wrong in a run.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// Two runs (or a run and a pre-start check) were alive at once.
    #[error("two runs were live at once: {first} and {second}")]
    TwoLive {
        /// The one that was live first.
        first: RunId,
        /// The one that started while it was.
        second: RunId,
    },
    /// A pause or a stop returned a rest stage while a run was still alive.
    #[error("{command} returned {stage} while {live} was still live")]
    LiveAfterCommand {
        /// The command.
        command: Command,
        /// The stage it returned.
        stage: Stage,
        /// The run still alive.
        live: RunId,
    },
    /// A run or a check did not return within the bound after its cancellation.
    #[error("{} did not return within {bound:?} after a {command} cancelled it", describe(.live))]
    Unresponsive {
        /// The command that cancelled it.
        command: Command,
        /// The bound.
        bound: Duration,
        /// What was still alive when the bound passed.
        live: Vec<RunId>,
    },
    /// The last task did not end in the stage the schedule implies.
    #[error("the task ended in {actual}, but the schedule implies {expected}{}", failure(.outcome))]
    FinalStage {
        /// What the schedule implies.
        expected: Stage,
        /// Where it ended.
        actual: Stage,
        /// What its last run or check returned.
        outcome: Option<Outcome>,
    },
    /// The user's check of the end state failed.
    #[error("the check of the end state failed: {0}")]
    Check(String),
    /// The subject could not be made.
    #[error("the set-up failed: {0}")]
    Setup(String),
    /// A task could not be built.
    #[error("a task could not be built: {0}")]
    Build(#[from] BuildError),
    /// Fewer units went through [`Watch::unit`] than the pipeline has.
    #[error("the pipeline has {units} units, but only {watched} went through Watch::unit")]
    Unwatched {
        /// Units in the pipeline.
        units: usize,
        /// Units wrapped.
        watched: usize,
    },
    /// A command failed in a way the transition table does not allow for.
    #[error("a command failed: {0}")]
    Command(Error),
    /// The run did not end within the real-time limit (a unit that never yields to
    /// the runtime stops the paused clock, so only real time can catch it).
    #[error("the run did not end within {0:?} of real time")]
    Hung(Duration),
    /// The schedule did not end within the whole-schedule limit of the paused clock
    /// ([`Runner::schedule_limit`]): a task that never reaches its end. A pipeline
    /// whose last unit runs until it is stopped needs [`Runner::ends_with_stop`].
    #[error(
        "the schedule did not end within {0:?} of the paused clock (a last unit that runs \
         until stopped needs Runner::ends_with_stop)"
    )]
    Overran(Duration),
    /// The user's code panicked outside a unit (the crate catches a unit's panics),
    /// or the runtime could not start.
    #[error("the run could not complete: {0}")]
    Crashed(String),
}

/// "1 command", "3 commands".
fn commands(n: usize) -> String {
    if n == 1 {
        "1 command".to_owned()
    } else {
        format!("{n} commands")
    }
}

fn describe(live: &[RunId]) -> String {
    match live {
        [] => "the run".to_owned(),
        [one] => one.to_string(),
        [one, rest @ ..] => format!("{one} (and {} more)", rest.len()),
    }
}

fn failure(outcome: &Option<Outcome>) -> String {
    match outcome {
        Some(Outcome::Failed(error)) => format!(" (its last run or check failed: {error})"),
        _ => String::new(),
    }
}

/// A schedule that failed: what went wrong, and the stage timeline of that run.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The schedule.
    pub schedule: Schedule,
    /// What went wrong.
    pub violation: Violation,
    /// What happened, up to the failure.
    pub timeline: Timeline,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.violation)?;
        if self.schedule.is_empty() {
            writeln!(f, "schedule: none (the task ran on its own)")?;
        } else {
            writeln!(
                f,
                "schedule ({}): {}",
                commands(self.schedule.len()),
                self.schedule
            )?;
        }
        write!(f, "timeline:\n{}", self.timeline)
    }
}

impl std::error::Error for Failure {}

/// A schedule that passed.
#[derive(Debug, Clone)]
pub struct Passed {
    /// How it ended.
    pub end: Stage,
    /// Steps whose point never came (the task had moved past it).
    pub skipped: usize,
    /// What happened.
    pub timeline: Timeline,
}

/// What [`Runner::check`] found: the schedules all passed, or the minimal one that
/// failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Report {
    /// The schedules' settings cannot draw a schedule.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A schedule failed; this is the minimal one proptest shrank it to.
    #[error(
        "a schedule failed (seed {seed}, after {cases} passing); shrunk to {}: {}\n{failure}\
         replay: Runner::run(&\"{}\".parse()?)",
        commands(.failure.schedule.len()), .failure.schedule, .failure.schedule
    )]
    Failed {
        /// The seed of the property run: [`Runner::seed`] replays it.
        seed: u64,
        /// How many schedules passed before the first failure.
        cases: u32,
        /// The minimal failing schedule, why it failed, and its timeline.
        failure: Box<Failure>,
    },
    /// proptest gave up (it does not for these strategies, which reject nothing).
    #[error("the property run was aborted: {0}")]
    Aborted(String),
}

impl Report {
    /// The minimal failing schedule's failure, if a schedule failed.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Report::Failed { failure, .. } => Some(failure),
            Report::Config(_) | Report::Aborted(_) => None,
        }
    }
}

/// The figures of a passing property run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// How many schedules ran.
    pub cases: u32,
    /// The seed, to replay the run.
    pub seed: u64,
    /// Steps in the schedules that ran.
    pub steps: usize,
    /// Of those, the steps whose point never came (the task had moved past it): a
    /// property run where most are skipped tests little.
    pub skipped: usize,
}

type Setup<S> = dyn Fn() -> Result<S, String> + Send + Sync;

/// Runs a user's pipeline under schedules and checks what must hold.
///
/// Each run builds a fresh [`Subject`], builds its task with every unit wrapped, and
/// drives it through the schedule on a current-thread tokio runtime with the paused
/// clock, on a thread of its own. It fails on:
///
/// - two runs (or checks) of the task's units alive at once, counted by the wrapped
///   units themselves ([`Violation::TwoLive`]);
/// - a pause or a stop that returned a rest stage while a run was alive
///   ([`Violation::LiveAfterCommand`]);
/// - a run or check that did not return within the bound after its cancellation,
///   named with its unit and generation ([`Violation::Unresponsive`]);
/// - a final stage other than the schedule implies: Stopped if it stopped the task
///   for good (a `stop` that took effect, not followed by a `restart`), Finished
///   otherwise ([`Violation::FinalStage`]);
/// - the user's check of the end state ([`Violation::Check`]).
///
/// At the end of the schedule a task the schedule left paused is resumed, and the
/// runner waits for its end.
///
/// # Examples
///
/// See the [module documentation](super).
pub struct Runner<S> {
    setup: Arc<Setup<S>>,
    bound: Duration,
    time_limit: Duration,
    schedule_limit: Duration,
    ends_with_stop: bool,
    cases: u32,
    seed: Option<u64>,
    max_shrink_iters: u32,
}

impl<S> fmt::Debug for Runner<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("bound", &self.bound)
            .field("time_limit", &self.time_limit)
            .field("schedule_limit", &self.schedule_limit)
            .field("ends_with_stop", &self.ends_with_stop)
            .field("cases", &self.cases)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl<S: Subject> Runner<S> {
    /// A runner that makes each schedule's subject with `setup`.
    ///
    /// Defaults: a 5 s bound (on the paused clock) for a cancelled run to return, a
    /// 10 min limit per schedule on the paused clock (which costs little real time),
    /// a 10 s real-time limit per schedule (for a unit that never yields), the
    /// schedule's end awaited as the task's own end (not a stop), 64 schedules per
    /// [`Runner::check`], a random seed, up to 256 shrink steps.
    pub fn new<F, E>(setup: F) -> Self
    where
        F: Fn() -> Result<S, E> + Send + Sync + 'static,
        E: fmt::Display,
    {
        Runner {
            setup: Arc::new(move || setup().map_err(|e| e.to_string())),
            bound: Duration::from_secs(5),
            time_limit: Duration::from_secs(10),
            schedule_limit: Duration::from_secs(600),
            ends_with_stop: false,
            cases: 64,
            seed: None,
            max_shrink_iters: 256,
        }
    }

    /// How long a cancelled run (or check) may take to return, on the paused clock.
    pub fn bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    /// How long one schedule may take in real time before it counts as hung.
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// How long one schedule may take on the paused clock, from the set-up to the
    /// end: past it, the run fails with [`Violation::Overran`]. The clock jumps
    /// over idle time, so even a long limit costs little real time.
    pub fn schedule_limit(mut self, limit: Duration) -> Self {
        self.schedule_limit = limit;
        self
    }

    /// Ends every schedule with a stop, for a pipeline whose last unit runs until it
    /// is stopped (a sync that tails for ever): once the schedule's steps are done, a
    /// task the schedule left paused is resumed, and once it runs it is stopped; it
    /// must end Stopped. Without this, the runner waits for the task's own end
    /// (Finished), which such a pipeline never reaches.
    pub fn ends_with_stop(mut self) -> Self {
        self.ends_with_stop = true;
        self
    }

    /// How many schedules [`Runner::check`] runs.
    pub fn cases(mut self, cases: u32) -> Self {
        self.cases = cases;
        self
    }

    /// The seed [`Runner::check`] draws its schedules from (random by default; a
    /// report names the seed it used).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// How many shrink steps a failure may take.
    pub fn max_shrink_iters(mut self, iters: u32) -> Self {
        self.max_shrink_iters = iters;
        self
    }

    /// Runs the pipeline under one schedule.
    ///
    /// # Errors
    ///
    /// A [`Failure`] naming the [`Violation`], with the schedule and the timeline.
    pub fn run(&self, schedule: &Schedule) -> Result<Passed, Box<Failure>> {
        let timeline = Arc::new(Mutex::new(Vec::new()));
        let (done, result) = mpsc::channel();
        let setup = Arc::clone(&self.setup);
        let (script, lines, bound) = (schedule.clone(), Arc::clone(&timeline), self.bound);
        let (limit, ends_with_stop) = (self.schedule_limit, self.ends_with_stop);
        let spawned = std::thread::Builder::new()
            .name("taskstage-testing".to_owned())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .start_paused(true)
                        .build()
                        .map_err(|e| Violation::Crashed(format!("no runtime: {e}")))?;
                    runtime.block_on(async {
                        let case = run_case(&*setup, &script, bound, ends_with_stop, lines);
                        tokio::time::timeout(limit, case)
                            .await
                            .unwrap_or(Err(Violation::Overran(limit)))
                    })
                }));
                let outcome = outcome.unwrap_or_else(|panic| {
                    let text = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_owned());
                    Err(Violation::Crashed(format!("panicked: {text}")))
                });
                // The runner may have given up waiting (a hang): nobody to tell.
                let _ = done.send(outcome);
            });
        let outcome = match spawned {
            Err(e) => Err(Violation::Crashed(format!("no thread: {e}"))),
            // A hung run's thread is left behind: nothing can stop user code that
            // never yields.
            Ok(_) => result
                .recv_timeout(self.time_limit)
                .unwrap_or(Err(Violation::Hung(self.time_limit))),
        };
        let timeline = Timeline {
            lines: lock(&timeline).clone(),
        };
        match outcome {
            Ok((end, skipped)) => Ok(Passed {
                end,
                skipped,
                timeline,
            }),
            Err(violation) => Err(Box::new(Failure {
                schedule: schedule.clone(),
                violation,
                timeline,
            })),
        }
    }

    /// Runs the pipeline under as many schedules as [`Runner::cases`] says, drawn
    /// from `schedules`; on a failure, shrinks the schedule to a minimal one that
    /// still fails.
    ///
    /// # Errors
    ///
    /// [`Report::Failed`] with the minimal failing schedule, its violation and its
    /// timeline; [`Report::Config`] when `schedules` cannot draw a schedule.
    pub fn check(&self, schedules: &Schedules) -> Result<Summary, Report> {
        let strategy = schedules.strategy()?;
        let seed = self.seed.unwrap_or_else(|| fastrand::u64(..));
        let config = Config {
            cases: self.cases,
            failure_persistence: None,
            max_shrink_iters: self.max_shrink_iters,
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(config, rng(seed));
        let seen = Mutex::new(Seen::default());
        let result = runner.run(&strategy, |schedule| {
            // Failing fast: a schedule that hung in real time is reported as it is,
            // not shrunk (each shrink step would wait out the real-time limit again):
            // once one has hung, every other schedule counts as passing, so the
            // shrinker keeps the one that hung.
            if lock(&seen)
                .last
                .as_ref()
                .is_some_and(|f| matches!(f.violation, Violation::Hung(_)))
            {
                return Ok(());
            }
            // No lock of ours is held while a schedule runs or a failure is formatted
            // (both run the user's code).
            match self.run(&schedule) {
                Ok(passed) => {
                    let mut seen = lock(&seen);
                    seen.ran += 1;
                    seen.steps += schedule.len();
                    seen.skipped += passed.skipped;
                    Ok(())
                }
                Err(failure) => {
                    let text = failure.to_string();
                    let mut seen = lock(&seen);
                    let passing = seen.ran;
                    seen.failed_after.get_or_insert(passing);
                    seen.ran += 1;
                    seen.last = Some(failure);
                    Err(TestCaseError::fail(text))
                }
            }
        });
        let Seen {
            failed_after,
            steps,
            skipped,
            last,
            ..
        } = seen
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(()) => Ok(Summary {
                cases: self.cases,
                seed,
                steps,
                skipped,
            }),
            Err(TestError::Abort(reason)) => Err(Report::Aborted(reason.to_string())),
            Err(TestError::Fail(_, minimal)) => {
                // The last failure seen is the minimal schedule's, unless shrinking
                // ended on a step back; then run the minimal one again for its own.
                // One that hung is reported as it is: every rerun of it waits out
                // the real-time limit.
                let hung = last
                    .as_ref()
                    .is_some_and(|f| matches!(f.violation, Violation::Hung(_)));
                let failure = match last {
                    Some(failure) if failure.schedule == minimal || hung => failure,
                    other => match (self.run(&minimal), other) {
                        (Err(failure), _) => failure,
                        (Ok(_), Some(failure)) => failure,
                        (Ok(passed), None) => Box::new(Failure {
                            schedule: minimal,
                            violation: Violation::Crashed(
                                "a schedule failed once and then passed".to_owned(),
                            ),
                            timeline: passed.timeline,
                        }),
                    },
                };
                let failure = if hung {
                    failure
                } else {
                    self.drop_steps(failure)
                };
                Err(Report::Failed {
                    seed,
                    cases: failed_after.unwrap_or(0),
                    failure,
                })
            }
        }
    }
}

/// What [`Runner::check`]'s property saw: schedules run, the passing ones before the
/// first failure, the steps and skipped steps of the passing ones, the last failure.
#[derive(Default)]
struct Seen {
    ran: u32,
    failed_after: Option<u32>,
    steps: usize,
    skipped: usize,
    last: Option<Box<Failure>>,
}

/// Runs a shorter candidate gets in [`Runner::drop_steps`] before its step is kept.
const DROP_ATTEMPTS: u32 = 3;

impl<S: Subject> Runner<S> {
    /// Shrinks a failure further by dropping one step at a time while it still fails.
    ///
    /// proptest's shrinking assumes a test gives the same answer each time; a
    /// schedule's run can differ (which report is the Nth depends on when the unit's
    /// I/O completes), so its search can stop at a schedule that still has a step
    /// more than needed. This pass finishes the job.
    fn drop_steps(&self, mut failure: Box<Failure>) -> Box<Failure> {
        let mut budget = self.max_shrink_iters;
        'shorter: while budget > 0 {
            for i in 0..failure.schedule.len() {
                if budget == 0 {
                    break 'shorter;
                }
                let mut steps = failure.schedule.steps().to_vec();
                steps.remove(i);
                let shorter = Schedule::new(steps);
                // A candidate that passes once may fail on the next run (see above):
                // it is given a few runs before the step is kept.
                for _ in 0..DROP_ATTEMPTS {
                    if budget == 0 {
                        break 'shorter;
                    }
                    budget -= 1;
                    if let Err(failed) = self.run(&shorter) {
                        failure = failed;
                        continue 'shorter;
                    }
                }
            }
            break;
        }
        failure
    }
}

/// Runs one schedule: the body of [`Runner::run`], on its runtime.
async fn run_case<S: Subject>(
    setup: &Setup<S>,
    schedule: &Schedule,
    bound: Duration,
    ends_with_stop: bool,
    lines: Arc<Mutex<Vec<Line>>>,
) -> Result<(Stage, usize), Violation> {
    let subject = setup().map_err(Violation::Setup)?;
    let mut driver = Driver {
        subject,
        probe: Arc::new(Probe::default()),
        lines,
        bound,
        ends_with_stop,
        task: 0,
        handle: None,
        recorders: Vec::new(),
        stopped: false,
        skipped: 0,
    };
    let result = driver.drive(schedule).await;
    driver.close().await;
    result
}

/// The controller of one run: carries out the schedule on the subject's tasks.
struct Driver<S: Subject> {
    subject: S,
    probe: Arc<Probe>,
    lines: Arc<Mutex<Vec<Line>>>,
    bound: Duration,
    /// Whether the schedule ends with a stop ([`Runner::ends_with_stop`]).
    ends_with_stop: bool,
    task: u32,
    handle: Option<Handle<S::Config>>,
    recorders: Vec<JoinHandle<()>>,
    /// Whether a `stop` took effect and no restart followed.
    stopped: bool,
    skipped: usize,
}

/// The task is somewhere only a command moves it from.
fn at_rest(stage: Stage) -> bool {
    stage.is_terminal() || stage == Stage::Paused || stage == Stage::New
}

impl<S: Subject> Driver<S> {
    fn note(&self, line: Line) {
        lock(&self.lines).push(line);
    }

    fn handle(&self) -> Result<&Handle<S::Config>, Violation> {
        self.handle
            .as_ref()
            .ok_or_else(|| Violation::Crashed("no task was built".to_owned()))
    }

    fn overlap(&self) -> Result<(), Violation> {
        match self.probe.overlap() {
            Some((first, second)) => Err(Violation::TwoLive { first, second }),
            None => Ok(()),
        }
    }

    async fn drive(&mut self, schedule: &Schedule) -> Result<(Stage, usize), Violation> {
        self.start().await?;
        for (i, step) in schedule.steps().iter().enumerate() {
            self.overlap()?;
            let release = match step.at {
                Point::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    None
                }
                at => match self.reach(at).await? {
                    Some(release) => Some(release),
                    None => {
                        self.skipped += 1;
                        let stage = self.handle()?.stage();
                        self.note(Line::Step {
                            number: i + 1,
                            step: *step,
                            result: format!("skipped: the point never came (the task is {stage})"),
                        });
                        continue;
                    }
                },
            };
            let result = self.act(step.action, release).await;
            self.note(Line::Step {
                number: i + 1,
                step: *step,
                result: match &result {
                    Ok(result) => result.clone(),
                    Err(_) => "failed (see above)".to_owned(),
                },
            });
            result?;
            self.overlap()?;
        }
        self.end().await
    }

    /// Builds the next task from the subject and starts it.
    async fn start(&mut self) -> Result<(), Violation> {
        self.task += 1;
        let watched = Arc::new(Mutex::new(0));
        let watch = Watch {
            probe: Arc::clone(&self.probe),
            task: self.task,
            watched: Arc::clone(&watched),
            config: PhantomData,
        };
        let handle = self.subject.task(&watch).spawn_paused()?;
        let (units, watched) = (handle.snapshot().units, *lock(&watched));
        // More may have gone through it than the pipeline holds (a unit the subject
        // runs elsewhere); fewer means one of the pipeline's is not watched.
        if watched < units {
            return Err(Violation::Unwatched { units, watched });
        }
        self.note(Line::Note(format!("task {} built", self.task)));
        let mut events = handle.events();
        let (lines, task) = (Arc::clone(&self.lines), self.task);
        self.recorders.push(tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let line = match event {
                    Event::Change(change) => Line::Change { task, change },
                    Event::Lagged { missed } => Line::Note(format!(
                        "task {task}: {missed} changes missed by the timeline"
                    )),
                };
                lock(&lines).push(line);
            }
        }));
        handle.resume().await.map_err(Violation::Command)?;
        self.handle = Some(handle);
        Ok(())
    }

    /// Waits for `at`: the release of the unit held there, or `None` if the task came
    /// to rest first (the point will not come).
    async fn reach(&self, at: Point) -> Result<Option<oneshot::Sender<()>>, Violation> {
        let handle = self.handle()?;
        let reached = self.probe.arm(at);
        // A task whose last unit runs until stopped may never reach the point (a
        // switch to a unit it has passed): with `ends_with_stop`, a point that has
        // not come within the bound, on the paused clock, is skipped.
        let gives_up = async {
            if self.ends_with_stop {
                tokio::time::sleep(self.bound).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            hit = reached => Ok(hit.ok()),
            _ = handle.wait_for_stage(at_rest) => {
                self.probe.disarm();
                Ok(None)
            }
            () = gives_up => {
                self.probe.disarm();
                Ok(None)
            }
        }
    }

    /// Carries out `action`, releasing the held unit once the command is issued.
    async fn act(
        &mut self,
        action: Action,
        release: Option<oneshot::Sender<()>>,
    ) -> Result<String, Violation> {
        let free = |release: Option<oneshot::Sender<()>>| {
            if let Some(release) = release {
                // A unit whose check was dropped meanwhile is not waiting any more.
                let _ = release.send(());
            }
        };
        let handle = self.handle()?.clone();
        // The table's own deadlines are twice the bound, so the runner sees the bound
        // pass first and can name what was still alive.
        let twice = self.bound.saturating_mul(2);
        match action {
            Action::Pause => {
                let issued = handle.pause_now_within(twice);
                free(release);
                self.settled(Command::Pause, issued).await
            }
            Action::Stop => {
                let issued = handle.stop_now_within(twice);
                free(release);
                let result = self.settled(Command::Stop, issued).await;
                self.stopped = handle.stage() == Stage::Stopped;
                result
            }
            Action::Resume => {
                let resumed = handle.resume().await;
                free(release);
                Ok(resumed.map_or_else(|e| format!("refused: {e}"), |()| "resumed".to_owned()))
            }
            Action::Update(n) => {
                let config = self.subject.update(n);
                let updated = handle.update(config).await;
                free(release);
                Ok(updated.map_or_else(|e| format!("refused: {e}"), |()| "updated".to_owned()))
            }
            Action::Restart => {
                let stopped = if handle.stage().is_terminal() {
                    free(release);
                    format!("{} already", handle.stage())
                } else {
                    let issued = handle.stop_now_within(twice);
                    free(release);
                    self.settled(Command::Stop, issued).await?
                };
                self.start().await?;
                self.stopped = false;
                Ok(format!("{stopped}; task {} started", self.task))
            }
        }
    }

    /// Waits for an issued pause or stop within the bound, and checks that nothing
    /// is alive once it reports a rest.
    async fn settled(
        &self,
        command: Command,
        issued: Result<Settling, Error>,
    ) -> Result<String, Violation> {
        let settling = match issued {
            Ok(settling) => settling,
            Err(e @ Error::Refused { .. }) => return Ok(format!("refused: {e}")),
            Err(e) => return Err(Violation::Command(e)),
        };
        let stage = match tokio::time::timeout(self.bound, settling).await {
            Ok(Ok(stage)) => stage,
            Ok(Err(e)) => return Err(Violation::Command(e)),
            Err(_) => {
                return Err(Violation::Unresponsive {
                    command,
                    bound: self.bound,
                    live: self.probe.live(),
                })
            }
        };
        if stage.is_at_rest() {
            self.nothing_live(command, stage)?;
        }
        Ok(stage.to_string())
    }

    /// A rest stage was reached (by `command`): no run or check may be alive.
    fn nothing_live(&self, command: Command, stage: Stage) -> Result<(), Violation> {
        match self.probe.live().into_iter().next() {
            Some(live) => Err(Violation::LiveAfterCommand {
                command,
                stage,
                live,
            }),
            None => Ok(()),
        }
    }

    /// After the schedule: resumes a task left paused, waits for its end, and checks
    /// the end against the schedule and the user's check.
    async fn end(&mut self) -> Result<(Stage, usize), Violation> {
        let handle = self.handle()?.clone();
        let end = loop {
            let snapshot = if self.ends_with_stop {
                handle
                    .wait_for_stage(|s| at_rest(s) || s == Stage::Running)
                    .await
            } else {
                handle.wait_for_stage(at_rest).await
            };
            if snapshot.stage == Stage::Paused && snapshot.user_paused {
                self.note(Line::Note("end of the schedule: resume".to_owned()));
                handle.resume().await.map_err(Violation::Command)?;
                continue;
            }
            if snapshot.stage == Stage::Running {
                // Only with `ends_with_stop`: the run is stopped, as its user would.
                self.note(Line::Note("end of the schedule: stop".to_owned()));
                let issued = handle.stop_now_within(self.bound.saturating_mul(2));
                self.settled(Command::Stop, issued).await?;
                self.stopped = handle.stage() == Stage::Stopped;
                continue;
            }
            break snapshot;
        };
        self.overlap()?;
        self.nothing_live(Command::Resume, end.stage)?;
        let expected = if self.stopped {
            Stage::Stopped
        } else {
            Stage::Finished
        };
        if end.stage != expected {
            return Err(Violation::FinalStage {
                expected,
                actual: end.stage,
                outcome: end.outcome,
            });
        }
        let summary = End {
            stage: end.stage,
            outcome: end.outcome,
            tasks: self.task,
        };
        self.subject.check(&summary).map_err(Violation::Check)?;
        Ok((end.stage, self.skipped))
    }

    /// Stops whatever is left (after a failure) and waits for the timeline's last
    /// entries.
    async fn close(&mut self) {
        if let Some(handle) = self.handle.take() {
            if !handle.stage().is_terminal() {
                self.note(Line::Note("after the failure: stop".to_owned()));
                // Aborts a run that ignores its cancellation; after that, nothing more
                // can be done here.
                let _ = handle.stop_within(self.bound).await;
            }
        }
        for recorder in std::mem::take(&mut self.recorders) {
            // Each ends with its task's terminal stage; one whose task never got there
            // (a stop that timed out) is left.
            if tokio::time::timeout(self.bound, &mut { recorder })
                .await
                .is_err()
            {
                break;
            }
        }
    }
}
