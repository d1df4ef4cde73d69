//! The synchronisation primitives the lifecycle core is built from.
//!
//! Under a normal build these are `std`'s; under `--cfg taskstage_loom` they are
//! `loom`'s, so that the model checker sees every lock, atomic and condition variable
//! the core touches. Every concurrent file of the crate imports its sync types from
//! here and never from `std` directly.
//!
//! This module is private; it is public only under the crate's checking cfgs, so
//! that the loom models in `loom-tests/` share the exact types the core uses.

#[cfg(not(taskstage_loom))]
pub use std::sync::{
    atomic::{AtomicU8, Ordering},
    Arc, Condvar, Mutex, MutexGuard, Weak,
};

#[cfg(taskstage_loom)]
pub use loom::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc, Condvar, Mutex, MutexGuard,
};

/// Locks `mutex`, ignoring poisoning.
///
/// The core never runs user code while holding one of its locks, so a poisoned lock
/// can only come from a bug in the core itself; the protected data is still
/// consistent at every point where a panic could unwind (each update is a single
/// assignment after all fallible work is done).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
