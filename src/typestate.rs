//! The typestate API: a task whose type names its stage.

use crate::runtime::TaskBuilder;

/// Marker types for the stages a [`Task`] can be in.
pub mod stages {
    /// The task was created and not started.
    #[derive(Debug)]
    pub struct New;
}

/// A task owner whose type names its stage.
#[derive(Debug)]
pub struct Task<S = stages::New> {
    _stage: std::marker::PhantomData<fn() -> S>,
}

impl Task<stages::New> {
    /// Starts building a task named `name`.
    pub fn builder(name: impl Into<String>) -> TaskBuilder<()> {
        TaskBuilder::new(name)
    }
}
