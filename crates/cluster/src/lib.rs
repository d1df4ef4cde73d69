//! One run of a task anywhere: a cluster of workers coordinated through a store
//! (etcd with feature `etcd`, or [`MemoryCoordinator`] in one process), with leases
//! and fencing.
//!
//! The same promise as [`taskstage`]'s, held by a cluster: **at most one run of
//! a task is alive anywhere**, and an observed stage never claims more than is true.
//!
//! - A [`Controller`] writes each task's spec and *desired* stage (Running, Paused,
//!   Stopped) and waits for the answer: [`Controller::pause`] returns only once the
//!   task's current owner reports that its local run has really returned.
//! - A [`Worker`] joins with a lease, claims unowned tasks up to its capacity (a
//!   transaction that creates the owner key only if absent), builds each from its
//!   spec through the user's factory, reconciles the local [`Handle`](taskstage::Handle)
//!   with the desired stage, and publishes the *observed* stage through a fenced
//!   transaction.
//! - Every owner write compares the owner key with the owner's [`FenceToken`]; units
//!   get a [`Fencer`] for fenced checkpoints.
//! - An owner that cannot prove its lease alive stops its runs before the store
//!   could expire the lease ([`decide::stop_at`]).
//!
//! The worker's decisions are one pure function, [`decide::decide`], fed by
//! another, [`decide::gather`], both checked by a stateright model and by property tests of the real worker on
//! [`MemoryCoordinator`]; `EtcdCoordinator` (feature `etcd`) carries them out on a real etcd. The
//! design, the keys and the safety argument (with its limits) are in
//! `docs/cluster.md`.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use taskstage_cluster::{Controller, DesiredStage, MemoryCoordinator, Worker};
//! use taskstage::{RunContext, RunError, RunExit, Task, Unit};
//!
//! struct Wait;
//!
//! impl Unit for Wait {
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         ctx.cancelled().await;
//!         Ok(RunExit::Cancelled)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // An etcd cluster in production: `EtcdCoordinator::connect(endpoints, ..)`.
//! let store = MemoryCoordinator::new();
//! let worker = Worker::builder(store.clone(), "app", "worker-1")
//!     .ttl(Duration::from_secs(2))
//!     .join(|spec| Ok(Task::builder(spec.task.as_str()).unit(Wait)))
//!     .await?;
//!
//! let controller = Controller::new(store, "app")?;
//! controller.create("orders", Vec::new(), DesiredStage::Running).await?;
//! let running = controller.resume_within("orders", Duration::from_secs(5)).await?;
//! assert_eq!(running.owner.as_str(), "worker-1");
//!
//! // Returns only once the run on worker-1 has really returned.
//! let paused = controller.pause_within("orders", Duration::from_secs(5)).await?;
//! assert_eq!(paused.stage, taskstage::Stage::Paused);
//! worker.shutdown().await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]
#![allow(
    clippy::incompatible_msrv,
    reason = "the etcd feature needs Rust 1.88 (tonic 0.14); rust-version is the default features' minimum"
)]

mod controller;
mod coord;
pub mod decide;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod fence;
mod history;
mod keys;
mod memory;
#[cfg(all(feature = "sqlite", target_os = "linux"))]
mod sqlite;
mod worker;

pub use self::controller::{
    CheckpointInfo, Controller, StatusWatch, TaskStatus, WorkerStatus, DEFAULT_COMMAND_TIMEOUT,
    MAX_SPEC_BYTES,
};
pub use self::coord::{
    watch_channel, BoxFuture, Compare, Coordinator, Grant, KeepAlive, KeyValue, Listing, Op, Txn,
    TxnResult, WatchEvent, WatchMessage, WatchStream,
};
pub use self::error::{ClusterError, FileProblem};
#[cfg(feature = "etcd")]
pub use self::etcd::{EtcdCoordinator, EtcdOptions};
pub use self::fence::{FenceToken, Fencer};
pub use self::keys::{DesiredStage, ObservedOutcome, ObservedStatus, TaskId, WorkerId, MAX_ID_LEN};
pub use self::memory::{MemoryCoordinator, MemorySnapshot};
#[cfg(all(feature = "sqlite", target_os = "linux"))]
pub use self::sqlite::{SqliteCoordinator, SqliteOptions, SQLITE_SCHEMA_VERSION};
pub use self::worker::{
    FactoryError, LeaseKeeping, OverrunPolicy, TaskSpec, Worker, WorkerBuilder, MIN_TTL,
    OVERRUN_EXIT_CODE,
};

/// The code blocks of `docs/cluster.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/cluster.md")]
struct ClusterDocDoctests;
