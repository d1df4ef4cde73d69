//! Supervise long-running work under a lifecycle whose stage is never a lie.
//!
//! A **task** runs an ordered pipeline of **units** (dump → load → sync). Its
//! [`Stage`] names what is true of the work right now: [`Stage::Paused`] means the
//! last run has returned and its future has been dropped, and "still running" is a
//! stage of its own ([`Stage::Pausing`], [`Stage::Stopping`]), never hidden behind the
//! stage that was asked for. So a resume can never start a second copy of a unit
//! while the first is alive.
//!
//! ```
//! use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
//!
//! /// Copies rows until it is done or asked to stop; its checkpoint is `next`.
//! struct Copy {
//!     next: u64,
//!     rows: u64,
//! }
//!
//! impl Unit for Copy {
//!     fn name(&self) -> &str {
//!         "copy"
//!     }
//!
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         while self.next < self.rows {
//!             if ctx.is_cancelled() {
//!                 return Ok(RunExit::Cancelled);
//!             }
//!             self.next += 1; // copy one row, then advance the checkpoint
//!             ctx.report_progress(self.next, Some(self.rows));
//!             tokio::task::yield_now().await;
//!         }
//!         Ok(RunExit::Completed)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let task = Task::builder("orders").unit(Copy { next: 0, rows: 1_000_000 }).spawn()?;
//! task.wait_for_stage(|stage| stage == Stage::Running).await;
//!
//! // `pause` returns once the run has really returned: nothing of it is alive.
//! assert_eq!(task.pause().await?, Stage::Paused);
//!
//! // A resume while a run is alive is refused with a typed error; this one is not.
//! task.resume().await?;
//! assert_eq!(task.stop().await?, Stage::Stopped);
//! # Ok(())
//! # }
//! ```
//!
//! # Contents
//!
//! - **Stages and commands**: [`Stage`], [`Command`]; what the last run returned:
//!   [`Outcome`].
//! - **Running work** ([`runtime`]): the [`Unit`] trait and its [`RunContext`]
//!   ([`RunExit`]); [`Task::builder`] → [`TaskBuilder`] → [`Handle`], the cloneable
//!   async handle, whose [`TaskSnapshot`] shows the stage, the outcome and the
//!   progress; every change as a stream: [`Events`] of [`Event`].
//! - **Many tasks at once**: [`TaskGroup`] (pause, resume, stop or wait for all within
//!   one deadline, [`StopOrder`]) and its [`GroupReport`].
//! - **Typed owner** ([`typestate`]): [`Task<S>`](Task), whose type names its stage so
//!   that invalid commands do not compile.
//! - **Auto-resume** ([`policy`]): resumes tasks paused by resumable errors, with
//!   backoff.
//! - **Testing your units** (feature `testing`): the `testing` module's `Runner`
//!   drives your pipeline under generated `Schedules` and reports the minimal failing
//!   schedule.
//! - **Errors**: [`Error`] (refused or timed-out commands, naming the command and the
//!   stage) and its [`ErrorKind`] and [`Refusal`]; [`BuildError`]; [`RunError`], what
//!   a run returned (`?` converts any error into it).
//!
//! The rest of the runtime's vocabulary (weak handles, observers, the latest change
//! only, a group's merged events, commands issued now and awaited later) is in
//! [`runtime`].
//!
//! The design, the normative table and the invariants:
//! [docs/design.md](https://github.com/taskstage/taskstage/blob/main/docs/design.md);
//! the rendered table:
//! [docs/stages.md](https://github.com/taskstage/taskstage/blob/main/docs/stages.md);
//! how it is checked:
//! [docs/verification.md](https://github.com/taskstage/taskstage/blob/main/docs/verification.md).
//!
//! # Features
//!
//! - **`metrics`** (off by default): reports tasks per stage, transitions, refused
//!   commands, pause and stop latencies and auto-resumes through the
//!   [`metrics`](https://docs.rs/metrics) facade, to whatever recorder the application
//!   installs. The names and labels are listed in
//!   [docs/events.md](https://github.com/taskstage/taskstage/blob/main/docs/events.md).
//! - **`testing`** (off by default): the `testing` module, a kit to property-test
//!   your own units under generated pause, resume, stop and restart schedules: it
//!   counts live runs itself, checks every pause and stop, and shrinks a failing
//!   schedule to a minimal one with its stage timeline
//!   ([docs/testing.md](https://github.com/taskstage/taskstage/blob/main/docs/testing.md)). It pulls
//!   in `proptest` and tokio's `test-util` (the paused clock).
//!
//! # The layers above, crates of their own
//!
//! The core has no network, store or server dependency. What is built on its public
//! API lives in crates of its own, in the same repository:
//!
//! - **`taskstage-cluster`**: one run of a task anywhere in a cluster of workers
//!   coordinated through a store, with leases and fencing (its `Controller` and
//!   `Worker`; an in-memory store, and etcd with its feature `etcd`; design and safety
//!   argument in
//!   [docs/cluster.md](https://github.com/taskstage/taskstage/blob/main/docs/cluster.md)).
//! - **`taskstage-http`**: an axum `Router` with a JSON API and a status page, for one
//!   process's tasks or (feature `cluster`) a cluster, whose pause answers 200 only
//!   once the run has returned
//!   ([docs/http.md](https://github.com/taskstage/taskstage/blob/main/docs/http.md)).
//! - **`taskstage-cli`**: the `taskstage` command, which operates a cluster from the
//!   shell ([docs/cli.md](https://github.com/taskstage/taskstage/blob/main/docs/cli.md)):
//!   `cargo install taskstage-cli`.
//!
//! One cfg matters too: `--cfg taskstage_loom` builds the
//! lifecycle core and its driver against `loom`'s sync types for the model tests in
//! `loom-tests/` (only the core, the driver, the table and the shim are compiled then;
//! the tokio layers are left out).
//! It is namespaced so that building for loom changes no other crate.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod stage;

/// Declares the core's internal layers: private in every build a user makes, and
/// public only under the crate's own checking cfgs, `taskstage_loom` (the loom models
/// in `loom-tests/` drive them) and `taskstage_internals` (the core's benchmark
/// against a state word). Neither cfg is part of the API.
macro_rules! internal {
    ($($module:ident),* $(,)?) => {
        $(
            #[cfg(any(taskstage_loom, taskstage_internals))]
            pub mod $module;
            #[cfg(not(any(taskstage_loom, taskstage_internals)))]
            #[allow(unreachable_pub, reason = "public under the checking cfgs")]
            mod $module;
        )*
    };
}
internal!(lifecycle, outcome, sync, table);

#[cfg(not(taskstage_loom))]
pub mod policy;
#[cfg(all(test, not(taskstage_loom)))]
mod proptests;
#[cfg(not(taskstage_loom))]
pub mod runtime;
#[cfg(all(feature = "testing", not(taskstage_loom)))]
pub mod testing;
#[cfg(not(taskstage_loom))]
pub mod typestate;

pub use error::{BuildError, Error, ErrorCode, ErrorKind, Refusal, RunError};
pub use outcome::Outcome;
#[cfg(not(taskstage_loom))]
pub use runtime::{
    Event, Events, GroupReport, Handle, RunContext, RunExit, StopOrder, TaskBuilder, TaskGroup,
    TaskSnapshot, Unit,
};
pub use stage::{Cause, Command, Stage};
#[cfg(not(taskstage_loom))]
pub use typestate::Task;

/// The README's code blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The code blocks of `docs/testing.md`, compiled and run as doc tests.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../docs/testing.md")]
struct TestingDoctests;

/// The code blocks of `docs/events.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/events.md")]
struct EventsDoctests;
