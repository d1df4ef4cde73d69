//! The migration of `examples/examples/migrate.rs`: a source and a target database on
//! SQLite, the three units that copy one to the other (dump, load, sync), the writer
//! that keeps changing the source, the scripted controller, and the report. Its tests
//! (`examples/tests/migrate*.rs`) drive these modules as the example does.

pub mod cli;
pub mod cluster;
pub mod controller;
pub mod db;
#[cfg(feature = "file")]
pub mod fenced;
pub mod live;
pub mod program;
pub mod report;
#[cfg(feature = "file")]
pub mod restart;
pub mod units;
pub mod writer;
