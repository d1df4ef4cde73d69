//! loom models of the lifecycle core.
//!
//! A package of the workspace (`loom-tests/Cargo.toml`), built only with
//! `--cfg taskstage_loom` (without it this test target is an empty crate):
//!
//! ```text
//! RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
//!   cargo test --release -p taskstage-loom-tests --test loom -- --test-threads=1 --nocapture
//! ```
//!
//! `harness` holds the scripted driver and the invariant checks; `models` the models
//! themselves, each with a comment saying what it proves and under which bound;
//! `prefix` the pre-fix protocol the non-vacuity models must catch. The invariant
//! numbers are those of `docs/design.md`. `docs/verification.md` lists every model
//! with the interleavings it explores.
//!
//! Each model prints how many interleavings it explored and how long that took. With
//! `TASKSTAGE_LOOM_COVERAGE=1` it also prints every situation it went through ("pause
//! accepted in Resuming", "run report: Stopping -> Stopping", ...) and in how many
//! interleavings; the tests assert that the situations each model is about were
//! reached.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]
#![cfg(taskstage_loom)]

/// Checks a condition inside a model; on failure records the message (see
/// `harness::violated`) instead of panicking in the middle of an execution.
macro_rules! check {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            $crate::harness::violated(format!($($message)+));
        }
    };
}

mod driver;
mod harness;
mod models;
mod prefix;
