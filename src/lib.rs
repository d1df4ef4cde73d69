//! taskstage
#![forbid(unsafe_code)]
pub mod error;
pub mod lifecycle;
pub mod outcome;
#[cfg(not(taskstage_loom))]
pub mod policy;
#[cfg(not(taskstage_loom))]
pub mod runtime;
pub mod stage;
pub mod sync;
pub mod table;
#[cfg(not(taskstage_loom))]
pub mod typestate;
pub use error::{BuildError, Error, Refusal, RunError};
pub use outcome::{Exit, Outcome};
#[cfg(not(taskstage_loom))]
pub use runtime::{
    Handle, Progress, RunContext, RunExit, StageEvent, TaskBuilder, TaskSnapshot, Unit,
};
pub use stage::{Command, Stage};
#[cfg(not(taskstage_loom))]
pub use typestate::Task;
