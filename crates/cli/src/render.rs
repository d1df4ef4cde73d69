//! How tasks are printed: a table row, a detail block, a JSON object.
//!
//! The JSON field names are stable (docs/cli.md lists them): a script may rely on
//! them; new fields may be added.

use serde_json::{json, Value};
use taskstage_cluster::{CheckpointInfo, ObservedStatus, TaskStatus, WorkerId};

/// The outcome's name and, for a failure, its text.
pub(crate) fn outcome(observed: Option<&ObservedStatus>) -> (Option<&'static str>, Option<&str>) {
    match observed.map(|o| &o.outcome) {
        None => (None, None),
        // The command line prints "none" for an owner whose run has not returned yet.
        Some(outcome) => (Some(outcome.name().unwrap_or("none")), outcome.error()),
    }
}

/// Whether the current owner's report answers the current desired stage.
pub(crate) fn answered(status: &TaskStatus) -> bool {
    status.answers(status.desired_revision)
}

/// One task as a JSON object (the fields of `list`).
pub(crate) fn task_json(status: &TaskStatus) -> Value {
    let observed = status.current_observed();
    let (outcome, failure) = outcome(observed);
    json!({
        "task": status.task.as_str(),
        "desired": status.desired.name(),
        "desired_revision": status.desired_revision,
        "observed": observed.map(|o| o.stage.name()),
        "owner": status.owner.as_ref().map(|o| o.as_str()),
        "owner_revision": status.owner_revision,
        "generation": observed.map(|o| o.generation),
        "outcome": outcome,
        "failure": failure,
        "answered": answered(status),
        "revision": status.revision,
    })
}

/// One task in detail as a JSON object (the fields of `list`, its lease, the
/// revision its report answers, and its checkpoints).
pub(crate) fn status_json(status: &TaskStatus, checkpoints: &[CheckpointInfo]) -> Value {
    let mut value = task_json(status);
    if let Value::Object(map) = &mut value {
        map.insert("owner_lease".into(), json!(status.owner_lease));
        map.insert(
            "observed_desired_revision".into(),
            json!(status.current_observed().map(|o| o.desired_revision)),
        );
        map.insert(
            "checkpoints".into(),
            Value::Array(
                checkpoints
                    .iter()
                    .map(|c| json!({"name": c.name, "size": c.size, "revision": c.revision}))
                    .collect(),
            ),
        );
    }
    value
}

/// The cells of a task's table row: TASK DESIRED OBSERVED OWNER GEN OUTCOME ANSWERED.
pub(crate) fn row(status: &TaskStatus) -> Vec<String> {
    let observed = status.current_observed();
    vec![
        status.task.to_string(),
        status.desired.name().to_owned(),
        observed.map_or("-", |o| o.stage.name()).to_owned(),
        status.owner.as_ref().map_or("-", |o| o.as_str()).to_owned(),
        observed.map_or("-".into(), |o| o.generation.to_string()),
        outcome_text(observed),
        if answered(status) { "yes" } else { "no" }.to_owned(),
    ]
}

/// The outcome as one word, or `failed: <text>`.
pub(crate) fn outcome_text(observed: Option<&ObservedStatus>) -> String {
    match outcome(observed) {
        (None, _) => "-".into(),
        (Some(name), None) => name.into(),
        (Some(name), Some(text)) => format!("{name}: {text}"),
    }
}

/// The header of the task table.
pub(crate) const HEADER: [&str; 7] = [
    "TASK", "DESIRED", "OBSERVED", "OWNER", "GEN", "OUTCOME", "ANSWERED",
];

/// Rows as aligned columns (two spaces apart, the last one unpadded).
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push('\n');
    }
    out
}

/// One task in detail, as `status` prints it.
pub(crate) fn detail(status: &TaskStatus, checkpoints: &[CheckpointInfo]) -> String {
    let observed = status.current_observed();
    let mut lines = vec![
        ("task", status.task.to_string()),
        (
            "desired",
            format!(
                "{} (revision {})",
                status.desired.name(),
                status.desired_revision
            ),
        ),
        (
            "owner",
            match (&status.owner, status.owner_revision, status.owner_lease) {
                (Some(owner), Some(token), Some(lease)) => {
                    format!("{owner} (fence token {token}, lease {lease:x})")
                }
                (Some(owner), _, _) => owner.to_string(),
                _ => "none".into(),
            },
        ),
        (
            "observed",
            observed.map_or("none".into(), |o| {
                format!(
                    "{} (generation {}, answers desired revision {})",
                    o.stage.name(),
                    o.generation,
                    o.desired_revision
                )
            }),
        ),
        ("outcome", outcome_text(observed)),
        (
            "answered",
            if answered(status) { "yes" } else { "no" }.to_owned(),
        ),
    ];
    if checkpoints.is_empty() {
        lines.push(("checkpoints", "none".into()));
    }
    for (i, c) in checkpoints.iter().enumerate() {
        let label = if i == 0 { "checkpoints" } else { "" };
        lines.push((
            label,
            format!("{} ({} bytes, revision {})", c.name, c.size, c.revision),
        ));
    }
    lines.push(("revision", status.revision.to_string()));
    let mut out = String::new();
    for (label, value) in lines {
        out.push_str(&format!("{label:<12} {value}\n"));
    }
    out
}

/// Each worker with whether it is a member and how many tasks it holds, sorted by
/// id. Counted from the tasks' owner keys, so a worker that holds tasks is listed
/// even when its membership key is not (yet, or any more) there.
pub(crate) fn holdings(members: &[WorkerId], tasks: &[TaskStatus]) -> Vec<(String, bool, usize)> {
    let mut held: std::collections::BTreeMap<&str, usize> =
        members.iter().map(|w| (w.as_str(), 0)).collect();
    for owner in tasks.iter().filter_map(|t| t.owner.as_ref()) {
        *held.entry(owner.as_str()).or_default() += 1;
    }
    held.into_iter()
        .map(|(w, n)| (w.to_owned(), members.iter().any(|m| m.as_str() == w), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskstage_cluster::{DesiredStage, TaskId};

    fn owned_by(task: &str, owner: Option<&str>) -> TaskStatus {
        TaskStatus {
            task: TaskId::new(task).unwrap(),
            desired: DesiredStage::Running,
            desired_revision: 2,
            owner: owner.map(|o| WorkerId::new(o).unwrap()),
            owner_revision: owner.map(|_| 3),
            owner_lease: owner.map(|_| 7),
            observed: None,
            revision: 4,
        }
    }

    #[test]
    fn holdings_count_owner_keys_and_show_owners_that_are_not_members() {
        let members = [WorkerId::new("w2").unwrap(), WorkerId::new("w1").unwrap()];
        let tasks = [
            owned_by("a", Some("w1")),
            owned_by("b", Some("w1")),
            owned_by("c", None),
            owned_by("d", Some("gone")),
        ];
        assert_eq!(
            holdings(&members, &tasks),
            [
                ("gone".to_owned(), false, 1),
                ("w1".to_owned(), true, 2),
                ("w2".to_owned(), true, 0),
            ]
        );
    }

    #[test]
    fn columns_align_on_the_widest_cell() {
        let rows = vec![
            vec!["a".to_owned(), "Running".to_owned()],
            vec!["long-name".to_owned(), "-".to_owned()],
        ];
        assert_eq!(
            table(&["TASK", "DESIRED"], &rows),
            "TASK       DESIRED\na          Running\nlong-name  -\n"
        );
    }
}
