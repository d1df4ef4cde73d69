//! A testing kit for users: your own units under random pause, resume and stop
//! schedules, with the minimal failing schedule back (feature `testing`).
//!
//! The hardest bugs in a pipeline are in its units: a checkpoint written before the
//! rows, a resume that applies a batch twice, a branch that ignores cancellation.
//! This kit runs *your* pipeline under generated [`Schedule`]s (pauses, resumes,
//! stops, restarts from checkpoints, updates, placed after N progress reports, at a
//! unit switch, while a pre-start check runs, or after a delay on tokio's paused
//! clock) and fails on what must never happen (see [`Runner`] and [`Violation`]).
//! On a failure, proptest shrinks the schedule, and the [`Report`] prints the minimal
//! one and the stage timeline of its run, as a script that
//! [parses back](std::str::FromStr) for a replay.
//!
//! - [`Schedules`]: the proptest strategy of schedules, with the sizes and weights
//!   you set; [`Schedules::generate`] draws one from a seed.
//! - [`Schedule`], [`Step`], [`Point`], [`Action`]: a schedule, printed as a script
//!   and parsed back ([`ParseError`]).
//! - [`Subject`]: your side, which builds the task with every unit passed through
//!   [`Watch::unit`] (the kit counts live runs itself, in the [`Watched`] wrapper),
//!   and checks the end state ([`End`]).
//! - [`Runner`]: runs one schedule ([`Runner::run`]: [`Passed`] or [`Failure`], with
//!   its [`Timeline`]) or a property over many ([`Runner::check`]: [`Summary`] or
//!   [`Report`]).
//!
//! The points, the actions, what fails and the kit's limits are described in
//! `docs/testing.md`.
//!
//! # Examples
//!
//! A unit that copies rows into a store that outlives its tasks, and a variant that
//! writes its checkpoint before the row and checks for cancellation in between. The
//! kit passes the first, and catches the second with a schedule of one command.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use taskstage::testing::{End, Runner, Schedules, Subject, Watch};
//! use taskstage::{RunContext, RunError, RunExit, Stage, Task, TaskBuilder, Unit};
//!
//! const ROWS: u64 = 20;
//!
//! /// What outlives a task: the rows copied, and the checkpoint (rows done).
//! #[derive(Default)]
//! struct Store {
//!     rows: Vec<u64>,
//!     checkpoint: u64,
//! }
//!
//! struct Copy {
//!     store: Arc<Mutex<Store>>,
//!     broken: bool,
//! }
//!
//! impl Unit for Copy {
//!     fn name(&self) -> &str {
//!         "copy"
//!     }
//!
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         loop {
//!             if ctx.is_cancelled() {
//!                 return Ok(RunExit::Cancelled);
//!             }
//!             let done = {
//!                 let mut store = self.store.lock().unwrap();
//!                 if store.checkpoint == ROWS {
//!                     return Ok(RunExit::Completed);
//!                 }
//!                 store.checkpoint += 1;
//!                 if !self.broken {
//!                     let row = store.checkpoint; // the row and its checkpoint together
//!                     store.rows.push(row);
//!                 }
//!                 store.checkpoint
//!             };
//!             ctx.report_progress(done, Some(ROWS));
//!             tokio::task::yield_now().await;
//!             if self.broken {
//!                 if ctx.is_cancelled() {
//!                     return Ok(RunExit::Cancelled); // the row is lost
//!                 }
//!                 self.store.lock().unwrap().rows.push(done);
//!             }
//!         }
//!     }
//! }
//!
//! /// One schedule's world: a fresh store, and tasks that continue from it.
//! struct Migration {
//!     store: Arc<Mutex<Store>>,
//!     broken: bool,
//! }
//!
//! impl Subject for Migration {
//!     type Config = ();
//!
//!     fn task(&mut self, watch: &Watch) -> TaskBuilder {
//!         let copy = Copy { store: Arc::clone(&self.store), broken: self.broken };
//!         Task::builder("copy").unit(watch.unit(copy))
//!     }
//!
//!     fn update(&mut self, _n: u32) {}
//!
//!     fn check(&mut self, end: &End) -> Result<(), String> {
//!         let store = self.store.lock().unwrap();
//!         let expected: Vec<u64> = (1..=store.checkpoint).collect();
//!         if store.rows != expected {
//!             return Err(format!("rows {:?} under checkpoint {}", store.rows, store.checkpoint));
//!         }
//!         if end.stage == Stage::Finished && store.checkpoint != ROWS {
//!             return Err(format!("finished with {} rows of {ROWS}", store.checkpoint));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let runner = |broken| {
//!     Runner::new(move || Ok::<_, String>(Migration { store: Arc::default(), broken }))
//!         .cases(32)
//!         .seed(5)
//! };
//! let schedules = Schedules::new().steps(1..=5).max_reports(15);
//!
//! // The correct unit passes every schedule.
//! let summary = runner(false).check(&schedules).map_err(|report| report.to_string())?;
//! assert_eq!(summary.cases, 32);
//!
//! // The broken one fails, and the failure is shrunk to a single command.
//! let report = runner(true).check(&schedules).unwrap_err();
//! let failure = report.failure().expect("a schedule failed");
//! assert_eq!(failure.schedule.len(), 1, "{report}");
//! assert!(report.to_string().contains("shrunk to 1 command: after"), "{report}");
//!
//! // The minimal schedule replays from its text.
//! let replay = runner(true).run(&failure.schedule.to_string().parse()?);
//! assert!(replay.is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod probe;
mod runner;
mod schedule;
mod strategy;
#[cfg(test)]
mod tests;

pub use self::probe::{RunId, Watch, Watched};
pub use self::runner::{
    End, Failure, Line, Passed, Report, Runner, Subject, Summary, Timeline, Violation,
};
pub use self::schedule::{Action, ParseError, ParseProblem, Point, Schedule, Step};
pub use self::strategy::{ConfigError, Schedules, MAX_STEPS};
