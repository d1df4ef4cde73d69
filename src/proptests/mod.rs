//! The property tests of the core and the runtime, against one reference model of the
//! specification. Shared by both: the reference model, the comparison with it, and the
//! proptest configuration.

mod core;
pub(crate) mod model;
mod runtime;

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

/// What a refused command or an ignored report must leave exactly as it was, read
/// from either system under test.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Observable {
    stage: crate::Stage,
    generation: u64,
    unit: Option<usize>,
    seq: u64,
    user_paused: bool,
    outcome: String,
}

impl From<&crate::lifecycle::Snapshot> for Observable {
    fn from(s: &crate::lifecycle::Snapshot) -> Self {
        Observable {
            stage: s.stage,
            generation: s.generation,
            unit: s.unit,
            seq: s.seq,
            user_paused: s.user_paused,
            outcome: format!("{:?}", s.outcome),
        }
    }
}

impl From<&crate::TaskSnapshot> for Observable {
    fn from(s: &crate::TaskSnapshot) -> Self {
        Observable {
            stage: s.stage,
            generation: s.generation,
            unit: s.unit.as_ref().map(|(index, _)| *index),
            seq: s.seq,
            user_paused: s.user_paused,
            outcome: format!("{:?}", s.outcome),
        }
    }
}

/// Asserts that nothing observable changed between two snapshots.
pub(crate) fn assert_unchanged<'a, S>(before: &'a S, after: &'a S, what: &str)
where
    Observable: From<&'a S>,
{
    assert_eq!(
        Observable::from(after),
        Observable::from(before),
        "{what} changed the task"
    );
}
