//! The test runner's configuration (`.config/nextest.toml`) names the suites that run
//! on the real clock against servers and processes they start, so that they run one
//! test at a time among themselves: this file holds it to the suites that exist.
//!
//! - every suite of the workspace that starts an etcd cluster, worker processes or a
//!   browser (it names the harness's etcd cluster or worker-process kind, or the
//!   browser's driver) is in the
//!   `realtime` group (or, on a store file alone, `realtime-file`);
//! - every suite the group names exists.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The binaries the filters of the `realtime` groups (`realtime`, `realtime-file`)
/// name, `binary(=NAME)` each.
fn realtime_group() -> BTreeSet<String> {
    let config = std::fs::read_to_string(root().join(".config/nextest.toml"))
        .expect(".config/nextest.toml is readable");
    let lines: Vec<&str> = config.lines().map(str::trim).collect();
    let mut names = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(filter) = line.strip_prefix("filter = ") else {
            continue;
        };
        let group = lines
            .get(i + 1)
            .and_then(|l| l.strip_prefix("test-group = "))
            .unwrap_or_default();
        if !group.trim_matches('"').starts_with("realtime") {
            continue;
        }
        names.extend(
            filter
                .split("binary(=")
                .skip(1)
                .filter_map(|rest| rest.split_once(')').map(|(name, _)| name.to_owned())),
        );
    }
    names
}

/// Every integration suite of the workspace: its name and its source.
fn suites() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let dirs = [
        "tests",
        "examples/tests",
        "crates/cluster/tests",
        "crates/http/tests",
        "crates/cli/tests",
    ];
    for dir in dirs {
        let entries = std::fs::read_dir(root().join(dir)).expect("a tests directory");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default();
                let text = std::fs::read_to_string(&path).expect("a readable suite");
                found.push((name.to_owned(), text));
            }
        }
    }
    found
}

#[test]
fn every_suite_that_starts_servers_runs_in_the_realtime_group_and_the_group_names_only_suites() {
    let group = realtime_group();
    assert!(
        group.len() >= 8,
        "the group's filter was not read: {group:?}"
    );
    let suites = suites();
    let names: BTreeSet<&str> = suites.iter().map(|(name, _)| name.as_str()).collect();
    for name in &group {
        assert!(
            names.contains(name.as_str()),
            "the realtime group names {name}, which is no suite"
        );
    }
    for (name, text) in &suites {
        // The markers are written apart so that this file does not carry them.
        let starts = ["Etcd", "Worker", "chrome"]
            .iter()
            .zip(["Cluster", "Kind", "driver"])
            .any(|(a, b)| text.contains(&format!("{a}{b}")));
        if starts {
            assert!(
                group.contains(name),
                "{name} starts an etcd cluster, worker processes or a browser, and is not in \
                 .config/nextest.toml's realtime group"
            );
        }
    }
}
