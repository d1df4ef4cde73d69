//! What the workspace's tests and benchmarks share, so that each suite states only
//! what it checks: etcd clusters a test starts and stops by pid ([`cluster`]), worker
//! processes, the history checker and its recorder, fault injection and CPU hogs
//! (its submodules), test wrappers of a store ([`pass_to_store!`]), and, with feature
//! `http`, a unit that counts live runs and requests to a router ([`http`]).
#![forbid(unsafe_code)]
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

pub mod cluster;
#[cfg(feature = "http")]
pub mod http;
mod pass_to_store;
