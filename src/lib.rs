//! taskstage
#![forbid(unsafe_code)]
pub mod error;
pub mod lifecycle;
pub mod outcome;
pub mod stage;
pub mod sync;
pub mod table;
pub use error::{BuildError, Error, Refusal, RunError};
pub use outcome::{Exit, Outcome};
pub use stage::{Command, Stage};
