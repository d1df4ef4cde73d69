//! The tokio runtime layer: spawns runs, awaits their exits, keeps the deadlines.
//!
//! A task is built with [`Task::builder`](crate::Task::builder) from an ordered
//! pipeline of [`Unit`]s and commanded through a [`Handle`]. Each run is a tokio task
//! that owns its unit; it hands the unit back and reports its exit to the lifecycle
//! core only after the run's future has been dropped. Cancellation reaches units
//! through a `tokio_util::sync::CancellationToken`, one per generation. No lock is
//! held across an `.await` or across user code.

mod builder;
mod events;
mod group;
mod handle;
pub(crate) mod metrics;
mod shared;
mod unit;

pub use self::builder::TaskBuilder;
pub use self::events::{Change, Event, Events};
pub use self::group::{GroupEvents, GroupReport, StopOrder, Stuck, TaskGroup, TaskReport};
pub use self::handle::{Handle, Settling, TaskObserver, TaskSnapshot, WeakHandle};
pub use self::unit::{Progress, RunContext, RunExit, Unit};

use crate::lifecycle::Transition;
use crate::stage::{Cause, Stage};

/// The latest stage change of a task, as [`Handle::subscribe`] delivers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageEvent {
    /// The stage after the change.
    pub stage: Stage,
    /// The stage before it.
    pub from: Stage,
    /// The generation after the change.
    pub generation: u64,
    /// What caused it; `None` for the initial value.
    pub cause: Option<Cause>,
    /// The lifecycle's change counter: it increases with every change.
    pub seq: u64,
}

impl StageEvent {
    pub(crate) fn initial() -> Self {
        StageEvent {
            stage: Stage::New,
            from: Stage::New,
            generation: 0,
            cause: None,
            seq: 0,
        }
    }
}

impl From<Transition> for StageEvent {
    fn from(t: Transition) -> Self {
        StageEvent {
            stage: t.to,
            from: t.from,
            generation: t.generation,
            cause: Some(t.cause.into()),
            seq: t.seq,
        }
    }
}
