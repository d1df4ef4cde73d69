//! Shared by the property tests: the reference model, the comparison with it, and the
//! proptest configuration.
#![allow(dead_code, reason = "each test crate uses a different subset")]

pub(crate) mod model;

use proptest::test_runner::{Config, FileFailurePersistence};

/// The number of cases to run: `PROPTEST_CASES` when set, else `default`.
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A proptest configuration running `cases(default)` cases, persisting failing seeds
/// in `proptest-regressions/<file>` (relative to the package root, where cargo runs
/// tests).
pub(crate) fn config(default: u32, file: &'static str) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(file))),
        ..Config::default()
    }
}
