//! A history of a cluster run, and a checker over it.
//!
//! Every process of a test (each worker process, and the test itself) appends to
//! its own line file in the test's directory: when a run became alive and when its
//! future was dropped, every fenced write and whether it was accepted, the faults
//! injected, the stages a controller observed and each task's final state. Times
//! are `CLOCK_MONOTONIC` in nanoseconds, which every process of one machine shares,
//! so the files merge into one history. A line is written with one `write` call on
//! a file opened for appending: a process killed with SIGKILL loses nothing it
//! wrote before.
//!
//! [`History::check`] fails on:
//!
//! 1. two runs of one task alive at once;
//! 2. an accepted fenced write whose token is lower than that of a write of the
//!    same task accepted before it was sent;
//! 3. a task that ends owned by nobody while desired Running;
//! 4. an observed rest stage (New, Paused, Stopped, Finished) read while a run of
//!    the task was alive for the whole read;
//!
//! and, when the history holds a replay of etcd's own history of the prefix (the
//! `owner`, `applied`, `reported` lines and a `replayed` line, written by the test
//! from a watch from revision 1, see [`Recorder::replayed`]):
//!
//! 5. a fenced write that etcd applied (a unit's checkpoint, an owner's report) while
//!    the owner key did not hold the token and owner it was fenced on;
//! 6. a fenced write applied with a lower token than one applied at an earlier
//!    revision (tokens going back in etcd's order; rule 2 is the same in real time);
//! 7. a write its worker saw accepted that is not in etcd's history, or one it saw
//!    rejected that is;
//!
//! and, for every `converged` line (a task read observed Running by owner X with
//! token r once the cluster converged):
//!
//! 8. no run of X with token r alive at that instant.
//!
//! One allowance, the documented limit of the design: a run on a process frozen
//! (SIGSTOP) past its lease counts as ended at the freeze if its future is dropped
//! within `allowance` of the thaw (the worker fences itself as soon as it runs
//! again), or if the process is killed (or exits) before it is thawed (it never ran
//! again). A process recorded `exited` (seen gone by its parent: a worker that ended
//! itself, for one) counts as one recorded `killed`: none of its runs outlives it.
//! Such runs are counted in [`Verdict::frozen`]; their fenced writes are still
//! checked by rules 2 and 5-7. A run that keeps going after the thaw counts in full.

#![allow(dead_code)] // each includer uses a part of it

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: comparable across the processes of one
/// machine.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// The outcome of a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The store applied it.
    Accepted,
    /// The fence rejected it (the token no longer owned the task).
    Rejected,
    /// No answer: it may or may not have been applied.
    Unknown,
}

impl WriteOutcome {
    fn name(self) -> &'static str {
        match self {
            WriteOutcome::Accepted => "accepted",
            WriteOutcome::Rejected => "rejected",
            WriteOutcome::Unknown => "unknown",
        }
    }
}

/// A fault the test injected into a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP.
    Freeze,
    /// SIGCONT after a freeze.
    Thaw,
    /// SIGKILL, recorded once the process was reaped: none of its runs is alive.
    Killed,
    /// The process ended (by itself, e.g. a worker that ended itself on an overrun,
    /// or killed), recorded the instant its parent saw it gone: none of its runs is
    /// alive. Counts as [`Fault::Killed`] does.
    Exited,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Freeze => "freeze",
            Fault::Thaw => "thaw",
            Fault::Killed => "killed",
            Fault::Exited => "exited",
        }
    }

    /// Whether the process is gone from this instant on (killed or exited).
    fn is_gone(self) -> bool {
        matches!(self, Fault::Killed | Fault::Exited)
    }
}

/// A fresh directory for the histories of one test of suite `suite`
/// (`taskstage-{suite}-{pid}-{ns}` in the temporary directory), and the test's own
/// history in it.
///
/// # Panics
///
/// If the directory or the history file cannot be created.
pub fn histories(suite: &str) -> (PathBuf, Arc<Recorder>) {
    let dir = std::env::temp_dir().join(format!(
        "taskstage-{suite}-{}-{}",
        std::process::id(),
        now_ns()
    ));
    let recorder = Recorder::create(&dir, "test").expect("create the test's history");
    (dir, recorder)
}

/// Removes the histories in `dir` once the processes that wrote them are gone;
/// when the test is failing (the thread is panicking), keeps them and says where.
pub fn remove_histories(dir: &Path) {
    if std::thread::panicking() {
        eprintln!("the histories are kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Appends one process's history to its own file.
#[derive(Debug)]
pub struct Recorder {
    file: Mutex<File>,
    pid: u32,
}

/// Run ids are `{pid}.{n}`, `n` counting the runs of this process.
static NEXT_RUN: AtomicU64 = AtomicU64::new(1);

impl Recorder {
    /// Creates `{dir}/{name}.history` for appending.
    pub fn create(dir: &Path, name: &str) -> std::io::Result<Arc<Recorder>> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.history")))?;
        Ok(Arc::new(Recorder {
            file: Mutex::new(file),
            pid: std::process::id(),
        }))
    }

    fn line(&self, line: String) {
        // One write of a whole line; the lock only orders this process's lines and
        // is never held across an await.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }

    /// Records that a run of `task` became alive; the guard records its drop.
    pub fn alive(
        self: &Arc<Self>,
        task: &str,
        worker: &str,
        generation: u64,
        token: i64,
    ) -> RunGuard {
        // Relaxed: a counter for unique run ids within this process.
        let seq = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
        let run = format!("{}.{seq}", self.pid);
        self.line(format!(
            "alive {} {run} {task} {worker} {generation} {token}",
            now_ns()
        ));
        RunGuard {
            recorder: Arc::clone(self),
            run,
        }
    }

    /// Records a fenced write of `task` with `token`, sent at `sent`, answered now.
    pub fn write(&self, task: &str, worker: &str, token: i64, sent: u64, outcome: WriteOutcome) {
        self.line(format!(
            "write {sent} {} {task} {worker} {token} {}",
            now_ns(),
            outcome.name()
        ));
    }

    /// As [`Recorder::write`], for a write that carried the unique `id` in its value
    /// (`{pid}.{n}`), so that rule 7 can find it in etcd's history.
    pub fn write_with_id(
        &self,
        task: &str,
        worker: &str,
        token: i64,
        sent: u64,
        outcome: WriteOutcome,
        id: &str,
    ) {
        self.line(format!(
            "write {sent} {} {task} {worker} {token} {} {id}",
            now_ns(),
            outcome.name()
        ));
    }

    /// Records one entry of etcd's replayed history.
    pub fn replay(&self, entry: &Replayed) {
        self.line(entry.line());
    }

    /// At convergence, a read answered at `at` saw `task` observed Running by
    /// `worker` with token `token`.
    pub fn converged(&self, at: u64, task: &str, worker: &str, token: i64) {
        self.line(format!("converged {at} {task} {worker} {token}"));
    }

    /// Records a fault injected into process `pid`, now.
    pub fn fault(&self, fault: Fault, pid: u32) {
        self.line(format!("{} {} {pid}", fault.name(), now_ns()));
    }

    /// Records that a read sent at `sent` and answered now saw `task` in `stage`
    /// (as answered by its current owner).
    pub fn observe(&self, task: &str, stage: taskstage::Stage, sent: u64) {
        self.line(format!("observe {sent} {} {task} {stage:?}", now_ns()));
    }

    /// Records a task's final desired stage and owner.
    pub fn end(&self, task: &str, desired: &str, owner: Option<&str>) {
        self.line(format!("final {task} {desired} {}", owner.unwrap_or("-")));
    }
}

/// One entry of etcd's history of the prefix, as a test replays it (rules 5-7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// At `revision`, the task's owner key was written: created at `owner.0` with
    /// value `owner.1` (`worker@lease`); `None`: deleted.
    Owner {
        /// The revision of the write.
        revision: i64,
        /// The task.
        task: String,
        /// The key's create revision and value, or `None` when it was deleted.
        owner: Option<(i64, String)>,
    },
    /// At `revision`, a unit's checkpoint write `id`, fenced on `owner_value` and
    /// `token`, was applied.
    Applied {
        /// The revision of the write.
        revision: i64,
        /// The task.
        task: String,
        /// The owner key's value the write was fenced on.
        owner_value: String,
        /// The token it was fenced on.
        token: i64,
        /// The write's unique id.
        id: String,
    },
    /// At `revision`, an owner's report, by `owner` with token `token`, was applied.
    Reported {
        /// The revision of the write.
        revision: i64,
        /// The task.
        task: String,
        /// The reporting worker.
        owner: String,
        /// Its token.
        token: i64,
    },
    /// The history was read up to `revision`.
    Done {
        /// The last revision read.
        revision: i64,
    },
}

impl Replayed {
    /// The history line for this entry.
    pub fn line(&self) -> String {
        match self {
            Replayed::Owner {
                revision,
                task,
                owner,
            } => match owner {
                Some((create, value)) => format!("owner {revision} {task} {create} {value}"),
                None => format!("owner {revision} {task} 0 -"),
            },
            Replayed::Applied {
                revision,
                task,
                owner_value,
                token,
                id,
            } => format!("applied {revision} {task} {owner_value} {token} {id}"),
            Replayed::Reported {
                revision,
                task,
                owner,
                token,
            } => format!("reported {revision} {task} {owner} {token}"),
            Replayed::Done { revision } => format!("replayed {revision}"),
        }
    }
}

/// Records a run's drop when dropped with the run's future.
#[derive(Debug)]
pub struct RunGuard {
    recorder: Arc<Recorder>,
    run: String,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        self.recorder
            .line(format!("drop {} {}", now_ns(), self.run));
    }
}

/// A history line that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not one of the forms [`Recorder`] writes.
    #[error("{path}:{line}: not a history line: {text:?}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number (from 1).
        line: usize,
        /// The text.
        text: String,
    },
}

#[derive(Debug, Clone)]
struct Run {
    id: String,
    pid: u32,
    task: String,
    worker: String,
    token: i64,
    start: u64,
    drop: Option<u64>,
}

#[derive(Debug, Clone)]
struct FencedWrite {
    sent: u64,
    acked: u64,
    task: String,
    worker: String,
    token: i64,
    outcome: WriteOutcome,
    /// The unique id the write carried in its value, when it carried one.
    id: Option<String>,
}

/// A write of an owner key in etcd's history, as replayed: (revision, task, and
/// `Some((create revision, value))`, or `None` when it was deleted).
type OwnerKey = (i64, String, Option<(i64, String)>);

/// A fenced write in etcd's history, as replayed.
#[derive(Debug, Clone)]
struct AppliedWrite {
    revision: i64,
    task: String,
    /// The owner key's value the write was fenced on (for a report: its worker
    /// and `@`, the lease unknown).
    owner: String,
    token: i64,
    /// The write's id, for a unit's checkpoint; `None` for a report.
    id: Option<String>,
}

#[derive(Debug, Clone)]
struct Observation {
    sent: u64,
    received: u64,
    task: String,
    stage: String,
}

/// The merged history of every process of a run.
#[derive(Debug, Default, Clone)]
pub struct History {
    runs: BTreeMap<String, Run>,
    writes: Vec<FencedWrite>,
    faults: Vec<(Fault, u64, u32)>,
    observations: Vec<Observation>,
    finals: Vec<(String, String, Option<String>)>,
    /// Replay: the owner keys' writes.
    owner_keys: Vec<OwnerKey>,
    /// Replay: the fenced writes etcd applied.
    applied: Vec<AppliedWrite>,
    /// Replay: up to which revision etcd's history was read, if it was.
    replayed: Option<i64>,
    /// (instant, task, worker, token) observed Running at convergence.
    converged: Vec<(u64, String, String, i64)>,
}

/// A broken rule, with what broke it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Rule 1: two runs of one task alive at once.
    Overlap {
        /// The task.
        task: String,
        /// The runs (`pid.seq@worker`).
        runs: (String, String),
    },
    /// Rule 2: an accepted write with a token lower than one accepted before.
    StaleAccepted {
        /// The task.
        task: String,
        /// The stale write's worker and token.
        stale: (String, i64),
        /// The higher token accepted before it was sent.
        newer: i64,
    },
    /// Rule 3: desired Running at the end, owned by nobody.
    Orphaned {
        /// The task.
        task: String,
    },
    /// Rule 4: a rest stage observed while a run was alive.
    FalseRest {
        /// The task.
        task: String,
        /// The stage read.
        stage: String,
        /// The run alive for the whole read.
        run: String,
    },
    /// Rule 5: a fenced write applied while the owner key held another token.
    AppliedUnfenced {
        /// The task.
        task: String,
        /// The revision etcd applied it at.
        revision: i64,
        /// The owner value and token it was fenced on.
        fenced_on: (String, i64),
        /// The owner key then: its value and create revision, if it existed.
        owner_then: Option<(String, i64)>,
    },
    /// Rule 6: a fenced write applied with a lower token than an earlier one.
    TokenBack {
        /// The task.
        task: String,
        /// The revision of the write with the lower token.
        revision: i64,
        /// Its token.
        token: i64,
        /// The higher token applied at an earlier revision.
        after: i64,
    },
    /// Rule 7: a write seen accepted that etcd does not have.
    AcceptedMissing {
        /// The task.
        task: String,
        /// The write's id.
        id: String,
    },
    /// Rule 7: a write seen rejected that etcd applied.
    RejectedApplied {
        /// The task.
        task: String,
        /// The write's id.
        id: String,
    },
    /// Rule 8: observed Running by an owner at convergence, and no run of it alive.
    NoLiveRun {
        /// The task.
        task: String,
        /// The owner and token observed.
        owner: (String, i64),
    },
}

impl Violation {
    /// The rule's number (module docs).
    pub fn rule(&self) -> usize {
        match self {
            Violation::Overlap { .. } => 1,
            Violation::StaleAccepted { .. } => 2,
            Violation::Orphaned { .. } => 3,
            Violation::FalseRest { .. } => 4,
            Violation::AppliedUnfenced { .. } => 5,
            Violation::TokenBack { .. } => 6,
            Violation::AcceptedMissing { .. } | Violation::RejectedApplied { .. } => 7,
            Violation::NoLiveRun { .. } => 8,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { task, runs } => {
                write!(
                    f,
                    "two runs of {task} alive at once: {} and {}",
                    runs.0, runs.1
                )
            }
            Violation::StaleAccepted { task, stale, newer } => write!(
                f,
                "a write of {task} by {} with token {} was accepted after token {newer}",
                stale.0, stale.1
            ),
            Violation::Orphaned { task } => {
                write!(f, "{task} ends desired Running and owned by nobody")
            }
            Violation::FalseRest { task, stage, run } => {
                write!(f, "{task} was observed {stage} while run {run} was alive")
            }
            Violation::AppliedUnfenced {
                task,
                revision,
                fenced_on,
                owner_then,
            } => write!(
                f,
                "a write of {task} fenced on {} token {} was applied at revision {revision} \
                 while the owner key was {owner_then:?}",
                fenced_on.0, fenced_on.1
            ),
            Violation::TokenBack {
                task,
                revision,
                token,
                after,
            } => write!(
                f,
                "a write of {task} with token {token} was applied at revision {revision}, \
                 after one with token {after}"
            ),
            Violation::AcceptedMissing { task, id } => {
                write!(
                    f,
                    "write {id} of {task} was seen accepted and is not in etcd"
                )
            }
            Violation::RejectedApplied { task, id } => {
                write!(f, "write {id} of {task} was seen rejected and is in etcd")
            }
            Violation::NoLiveRun { task, owner } => write!(
                f,
                "{task} was observed Running by {} with token {} at convergence, and no \
                 such run was alive",
                owner.0, owner.1
            ),
        }
    }
}

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Every broken rule.
    pub violations: Vec<Violation>,
    /// Runs recorded.
    pub runs: usize,
    /// The most runs of one task alive at one instant.
    pub max_live: usize,
    /// Fenced writes accepted.
    pub accepted: usize,
    /// Fenced writes the fence rejected (all of them stale: the token no longer
    /// owned the task).
    pub rejected: usize,
    /// Runs on a frozen process counted as ended at the freeze (see the module docs).
    pub frozen: usize,
    /// Fenced writes found in etcd's replayed history (rules 5–7), if it was replayed.
    pub applied: Option<usize>,
    /// Tasks checked at convergence (rule 8).
    pub converged: usize,
}

impl Verdict {
    /// How many violations of each rule (index 0: rule 1).
    pub fn per_rule(&self) -> [usize; 8] {
        let mut counts = [0; 8];
        for v in &self.violations {
            counts[v.rule() - 1] += 1;
        }
        counts
    }
}

impl Verdict {
    /// Whether every rule held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} runs, max live runs {}, {} writes accepted, {} stale writes rejected, \
             {} runs of a frozen owner ended at the freeze, {} violations",
            self.runs,
            self.max_live,
            self.accepted,
            self.rejected,
            self.frozen,
            self.violations.len()
        )?;
        if let Some(applied) = self.applied {
            write!(
                f,
                " (etcd's history replayed: {applied} fenced writes applied; {} tasks \
                 checked at convergence; per rule 1..8: {:?})",
                self.converged,
                self.per_rule()
            )?;
        }
        for v in self.violations.iter().take(10) {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

fn parse_outcome(s: &str) -> Option<WriteOutcome> {
    match s {
        "accepted" => Some(WriteOutcome::Accepted),
        "rejected" => Some(WriteOutcome::Rejected),
        "unknown" => Some(WriteOutcome::Unknown),
        _ => None,
    }
}

impl History {
    /// Reads and merges every `*.history` file in `dir`.
    pub fn load(dir: &Path) -> Result<History, HistoryError> {
        let read = |path: &Path, source| HistoryError::Read {
            path: path.to_owned(),
            source,
        };
        let mut history = History::default();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| read(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "history"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|e| read(&path, e))?;
            // Counted once: a file of a scale run holds tens of thousands of lines.
            let lines = text.lines().count();
            for (i, line) in text.lines().enumerate() {
                // A process killed mid-line leaves at most its last line cut short:
                // an empty or cut last line is not an error.
                let cut = i + 1 == lines && !text.ends_with('\n');
                if line.is_empty() || history.add(line).is_some() || cut {
                    continue;
                }
                {
                    return Err(HistoryError::Line {
                        path: path.clone(),
                        line: i + 1,
                        text: line.to_owned(),
                    });
                }
            }
        }
        Ok(history)
    }

    /// A history from lines, as [`Recorder`] writes them (for the checker's tests).
    pub fn from_lines(lines: &[&str]) -> Option<History> {
        let mut history = History::default();
        for line in lines {
            history.add(line)?;
        }
        Some(history)
    }

    fn add(&mut self, line: &str) -> Option<()> {
        let f: Vec<&str> = line.split(' ').collect();
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        match (f.first().copied()?, f.len()) {
            ("alive", 7) => {
                let id = f[2].to_owned();
                let pid = id.split('.').next()?.parse().ok()?;
                self.runs.insert(
                    id.clone(),
                    Run {
                        id,
                        pid,
                        task: f[3].to_owned(),
                        worker: f[4].to_owned(),
                        token: f[6].parse().ok()?,
                        start: n(1)?,
                        drop: None,
                    },
                );
            }
            ("drop", 3) => self.runs.get_mut(f[2])?.drop = Some(n(1)?),
            ("write", 7 | 8) => self.writes.push(FencedWrite {
                sent: n(1)?,
                acked: n(2)?,
                task: f[3].to_owned(),
                worker: f[4].to_owned(),
                token: f[5].parse().ok()?,
                outcome: parse_outcome(f[6])?,
                id: f.get(7).map(|s| (*s).to_owned()),
            }),
            ("owner", 5) => {
                let create: i64 = f[3].parse().ok()?;
                let owner = (create != 0).then(|| (create, f[4].to_owned()));
                self.owner_keys
                    .push((f[1].parse().ok()?, f[2].to_owned(), owner));
            }
            ("applied", 6) => self.applied.push(AppliedWrite {
                revision: f[1].parse().ok()?,
                task: f[2].to_owned(),
                owner: f[3].to_owned(),
                token: f[4].parse().ok()?,
                id: Some(f[5].to_owned()),
            }),
            ("reported", 5) => self.applied.push(AppliedWrite {
                revision: f[1].parse().ok()?,
                task: f[2].to_owned(),
                owner: format!("{}@", f[3]),
                token: f[4].parse().ok()?,
                id: None,
            }),
            ("replayed", 2) => self.replayed = Some(f[1].parse().ok()?),
            ("converged", 5) => {
                self.converged
                    .push((n(1)?, f[2].to_owned(), f[3].to_owned(), f[4].parse().ok()?))
            }
            (kind @ ("freeze" | "thaw" | "killed" | "exited"), 3) => {
                let fault = match kind {
                    "freeze" => Fault::Freeze,
                    "thaw" => Fault::Thaw,
                    "killed" => Fault::Killed,
                    _ => Fault::Exited,
                };
                self.faults.push((fault, n(1)?, f[2].parse().ok()?));
            }
            ("observe", 5) => self.observations.push(Observation {
                sent: n(1)?,
                received: n(2)?,
                task: f[3].to_owned(),
                stage: f[4].to_owned(),
            }),
            ("final", 4) => self.finals.push((
                f[1].to_owned(),
                f[2].to_owned(),
                (f[3] != "-").then(|| f[3].to_owned()),
            )),
            _ => return None,
        }
        Some(())
    }

    /// Adds the entries of etcd's replayed history (as [`Recorder::replay`] writes
    /// them).
    pub fn add_replay(&mut self, entries: &[Replayed]) {
        for entry in entries {
            let added = self.add(&entry.line());
            assert!(
                added.is_some(),
                "a replay line that does not parse: {entry:?}"
            );
        }
    }

    /// How many runs of process `pid` have no drop recorded, while the process is
    /// not recorded gone (killed or exited).
    /// For each task, the longest time it had no live run between the end of one
    /// of its runs (at or after `from`) and the start of the next, in ns; a task
    /// whose last run ended after `from` with none after it counts the time until
    /// `until`.
    pub fn gaps(&self, from: u64, until: u64) -> BTreeMap<String, u64> {
        let mut gaps = BTreeMap::new();
        for (task, gap, _) in self.each_gap(from, until) {
            let longest = gaps.entry(task).or_insert(0);
            *longest = (*longest).max(gap);
        }
        gaps
    }

    /// How many runs of `task` started at or after `since`.
    pub fn starts_since(&self, task: &str, since: u64) -> usize {
        self.runs
            .values()
            .filter(|r| r.task == task && r.start >= since)
            .count()
    }

    /// The id and the send instant of the last write of `task` the store
    /// acknowledged as accepted (by acknowledgement), of those that carried an id.
    pub fn last_accepted(&self, task: &str) -> Option<(&str, u64)> {
        self.writes
            .iter()
            .filter(|w| w.task == task && w.outcome == WriteOutcome::Accepted)
            .filter_map(|w| Some((w.id.as_deref()?, w.sent, w.acked)))
            .max_by_key(|(_, _, acked)| *acked)
            .map(|(id, sent, _)| (id, sent))
    }

    /// When the write that carried `id` was sent, if the history holds it.
    pub fn sent_of(&self, id: &str) -> Option<u64> {
        self.writes
            .iter()
            .find(|w| w.id.as_deref() == Some(id))
            .map(|w| w.sent)
    }

    /// When the first run of `task` started, if one did.
    pub fn first_start(&self, task: &str) -> Option<u64> {
        self.runs
            .values()
            .filter(|r| r.task == task)
            .map(|r| r.start)
            .min()
    }

    /// Every time a task had no live run, between the end of a run (at or after
    /// `from`) and the start of the next (or `until`): (task, ns, the pid of the
    /// process whose run ended).
    pub fn each_gap(&self, from: u64, until: u64) -> Vec<(String, u64, u32)> {
        let mut per_task: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
        for run in self.runs.values() {
            per_task.entry(run.task.as_str()).or_default().push(run);
        }
        let mut gaps = Vec::new();
        for (task, mut runs) in per_task {
            runs.sort_by_key(|r| r.start);
            // The latest end of any run so far, and whose: runs may overlap in the
            // records of a takeover (the checker judges that); a gap is time with
            // none alive.
            let mut alive_until: Option<(u64, u32)> = None;
            let mut some_gap = false;
            for run in &runs {
                if let Some((end, pid)) = alive_until {
                    if run.start > end && end >= from {
                        gaps.push((task.to_owned(), run.start - end, pid));
                        some_gap = true;
                    }
                }
                let end = run.drop.unwrap_or(u64::MAX);
                alive_until = match alive_until {
                    Some((e, p)) if e >= end => Some((e, p)),
                    _ => Some((end, run.pid)),
                };
            }
            match alive_until {
                Some((end, pid)) if end >= from && end < until => {
                    gaps.push((task.to_owned(), until - end, pid));
                }
                _ if !some_gap => gaps.push((task.to_owned(), 0, 0)),
                _ => {}
            }
        }
        gaps
    }

    pub fn alive_runs_of(&self, pid: u32) -> usize {
        let gone = self.faults.iter().any(|(f, _, p)| f.is_gone() && *p == pid);
        if gone {
            return 0;
        }
        self.runs
            .values()
            .filter(|r| r.pid == pid && r.drop.is_none())
            .count()
    }

    /// How many runs of process `pid` that started before `before` (ns) are still
    /// alive: the runs a fault met, whatever the process started since (a worker
    /// that joined again may be handed the same task back within milliseconds).
    pub fn alive_runs_of_started_before(&self, pid: u32, before: u64) -> usize {
        let gone = self.faults.iter().any(|(f, _, p)| f.is_gone() && *p == pid);
        if gone {
            return 0;
        }
        self.runs
            .values()
            .filter(|r| r.pid == pid && r.start < before && r.drop.is_none())
            .count()
    }

    /// How many writes by `worker` sent at or after `since` were accepted.
    pub fn accepted_writes_since(&self, worker: &str, since: u64) -> usize {
        self.writes
            .iter()
            .filter(|w| w.worker == worker && w.sent >= since)
            .filter(|w| w.outcome == WriteOutcome::Accepted)
            .count()
    }

    /// The interval a run counts as alive for rules 1 and 4, and whether it was cut
    /// short at a freeze.
    fn alive_span(&self, run: &Run, allowance: u64, horizon: u64) -> (u64, u64, bool) {
        let killed = self
            .faults
            .iter()
            .filter(|(f, t, pid)| f.is_gone() && *pid == run.pid && *t >= run.start)
            .map(|(_, t, _)| *t)
            .min();
        let end = run.drop.or(killed).unwrap_or(horizon);
        // The last freeze of its process while it was alive, and the thaw after it.
        let freeze = self
            .faults
            .iter()
            .filter(|(f, t, pid)| {
                *f == Fault::Freeze && *pid == run.pid && *t >= run.start && *t <= end
            })
            .map(|(_, t, _)| *t)
            .max();
        if let Some(frozen_at) = freeze {
            // The freeze ends at the thaw, or at a kill that came first: a process
            // killed while frozen never ran again (the kill is its prompt end).
            let thaw = self
                .faults
                .iter()
                .filter(|(f, t, pid)| {
                    (*f == Fault::Thaw || f.is_gone()) && *pid == run.pid && *t >= frozen_at
                })
                .map(|(_, t, _)| *t)
                .min();
            if thaw.is_some_and(|thawed| end <= thawed.saturating_add(allowance)) {
                return (run.start, frozen_at, true);
            }
        }
        (run.start, end, false)
    }

    /// Checks the rules (module docs) over a finished history, where a run with no
    /// drop and no kill is alive for ever; `allowance` is how soon after a thaw a
    /// frozen owner must have dropped its run.
    pub fn check(&self, allowance: Duration) -> Verdict {
        self.check_as_of(allowance, u64::MAX)
    }

    /// As [`History::check`], for a history still being written at instant `now`:
    /// a run with no drop and no kill is alive until `now`, so a run thawed less
    /// than `allowance` ago may still end in time and is not yet held against it.
    pub fn check_as_of(&self, allowance: Duration, now: u64) -> Verdict {
        let allowance = allowance.as_nanos() as u64;
        let mut verdict = Verdict {
            runs: self.runs.len(),
            ..Verdict::default()
        };
        // Rule 1, and the most runs of one task alive at once.
        let mut by_task: BTreeMap<&str, Vec<(u64, u64, &Run)>> = BTreeMap::new();
        for run in self.runs.values() {
            let (start, end, frozen) = self.alive_span(run, allowance, now);
            verdict.frozen += usize::from(frozen);
            by_task
                .entry(&run.task)
                .or_default()
                .push((start, end, run));
        }
        for (task, spans) in &mut by_task {
            spans.sort_by_key(|(start, _, _)| *start);
            let mut live: Vec<(u64, &Run)> = Vec::new();
            for (start, end, run) in spans.iter() {
                // A run that ended at the instant another began does not overlap it.
                live.retain(|(e, _)| *e > *start);
                for (_, other) in &live {
                    verdict.violations.push(Violation::Overlap {
                        task: (*task).to_owned(),
                        runs: (
                            format!("{}@{}", other.id, other.worker),
                            format!("{}@{}", run.id, run.worker),
                        ),
                    });
                }
                live.push((*end, run));
                verdict.max_live = verdict.max_live.max(live.len());
            }
        }
        // Rule 2.
        let mut accepted: BTreeMap<&str, Vec<&FencedWrite>> = BTreeMap::new();
        for w in &self.writes {
            match w.outcome {
                WriteOutcome::Accepted => {
                    verdict.accepted += 1;
                    accepted.entry(&w.task).or_default().push(w);
                }
                WriteOutcome::Rejected => verdict.rejected += 1,
                WriteOutcome::Unknown => {}
            }
        }
        for (task, writes) in &mut accepted {
            // Sorted by when each was answered, with the highest token answered so
            // far: the writes "accepted before" one was sent are a prefix.
            writes.sort_by_key(|w| w.acked);
            let mut highest = Vec::with_capacity(writes.len());
            let mut top = i64::MIN;
            for w in writes.iter() {
                top = top.max(w.token);
                highest.push(top);
            }
            for w in writes.iter() {
                let before = writes.partition_point(|v| v.acked < w.sent);
                if before > 0 && highest[before - 1] > w.token {
                    verdict.violations.push(Violation::StaleAccepted {
                        task: (*task).to_owned(),
                        stale: (w.worker.clone(), w.token),
                        newer: highest[before - 1],
                    });
                }
            }
        }
        // Rule 3.
        for (task, desired, owner) in &self.finals {
            if desired == "Running" && owner.is_none() {
                verdict
                    .violations
                    .push(Violation::Orphaned { task: task.clone() });
            }
        }
        // Rule 4.
        for o in &self.observations {
            if !matches!(o.stage.as_str(), "New" | "Paused" | "Stopped" | "Finished") {
                continue;
            }
            let during = by_task.get(o.task.as_str()).and_then(|spans| {
                spans
                    .iter()
                    .find(|(start, end, _)| *start <= o.sent && *end >= o.received)
            });
            if let Some((_, _, run)) = during {
                verdict.violations.push(Violation::FalseRest {
                    task: o.task.clone(),
                    stage: o.stage.clone(),
                    run: format!("{}@{}", run.id, run.worker),
                });
            }
        }
        if self.replayed.is_some() {
            verdict.applied = Some(self.applied.iter().filter(|a| a.id.is_some()).count());
            self.check_replay(&mut verdict);
        }
        self.check_converged(&mut verdict);
        verdict
    }

    /// Rules 5, 6 and 7, over etcd's replayed history.
    fn check_replay(&self, verdict: &mut Verdict) {
        // Rules 5 and 6: walk the owner keys and the applied writes in revision
        // order; a write is checked against the owner key as it was before its own
        // revision (a transaction's compares see the state before it).
        enum Event<'a> {
            Write(&'a AppliedWrite),
            Owner(&'a str, Option<&'a (i64, String)>),
        }
        let mut events: Vec<(i64, u8, Event<'_>)> = Vec::new();
        for a in &self.applied {
            events.push((a.revision, 0, Event::Write(a)));
        }
        for (revision, task, owner) in &self.owner_keys {
            events.push((*revision, 1, Event::Owner(task, owner.as_ref())));
        }
        events.sort_by_key(|(revision, order, _)| (*revision, *order));
        let mut owners: BTreeMap<&str, Option<&(i64, String)>> = BTreeMap::new();
        let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
        for (revision, _, event) in &events {
            match event {
                Event::Owner(task, owner) => {
                    owners.insert(task, *owner);
                }
                Event::Write(w) => {
                    let owner = owners.get(w.task.as_str()).copied().flatten();
                    let held = owner.is_some_and(|(create, value)| {
                        *create == w.token
                            && if w.owner.ends_with('@') {
                                value.starts_with(&w.owner)
                            } else {
                                *value == w.owner
                            }
                    });
                    if !held {
                        verdict.violations.push(Violation::AppliedUnfenced {
                            task: w.task.clone(),
                            revision: *revision,
                            fenced_on: (w.owner.clone(), w.token),
                            owner_then: owner.map(|(create, value)| (value.clone(), *create)),
                        });
                    }
                    let top = highest.entry(&w.task).or_insert(i64::MIN);
                    if w.token < *top {
                        verdict.violations.push(Violation::TokenBack {
                            task: w.task.clone(),
                            revision: *revision,
                            token: w.token,
                            after: *top,
                        });
                    }
                    *top = (*top).max(w.token);
                }
            }
        }
        // Rule 7.
        let in_etcd: std::collections::BTreeSet<&str> = self
            .applied
            .iter()
            .filter_map(|a| a.id.as_deref())
            .collect();
        for w in &self.writes {
            let Some(id) = &w.id else { continue };
            let found = in_etcd.contains(id.as_str());
            match w.outcome {
                WriteOutcome::Accepted if !found => {
                    verdict.violations.push(Violation::AcceptedMissing {
                        task: w.task.clone(),
                        id: id.clone(),
                    });
                }
                WriteOutcome::Rejected if found => {
                    verdict.violations.push(Violation::RejectedApplied {
                        task: w.task.clone(),
                        id: id.clone(),
                    });
                }
                _ => {}
            }
        }
    }

    /// Rule 8: at each `converged` line, a run of the observed owner with the
    /// observed token is alive (started, and neither dropped nor killed).
    fn check_converged(&self, verdict: &mut Verdict) {
        verdict.converged = self.converged.len();
        for (at, task, worker, token) in &self.converged {
            let alive = self.runs.values().any(|run| {
                let killed = self
                    .faults
                    .iter()
                    .filter(|(f, t, pid)| f.is_gone() && *pid == run.pid && *t >= run.start)
                    .map(|(_, t, _)| *t)
                    .min();
                let end = run.drop.or(killed).unwrap_or(u64::MAX);
                run.task == *task
                    && run.worker == *worker
                    && run.token == *token
                    && run.start <= *at
                    && end > *at
            });
            if !alive {
                verdict.violations.push(Violation::NoLiveRun {
                    task: task.clone(),
                    owner: (worker.clone(), *token),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Duration = Duration::ZERO;

    fn check(lines: &[&str], allowance: Duration) -> Verdict {
        History::from_lines(lines)
            .expect("the test's lines are history lines")
            .check(allowance)
    }

    #[test]
    fn a_clean_takeover_passes() {
        let v = check(
            &[
                "alive 100 7.1 t w1 1 10",
                "write 110 120 t w1 10 accepted",
                "drop 200 7.1",
                "alive 300 8.1 t w2 1 20",
                "write 150 310 t w1 10 rejected",
                "write 320 330 t w2 20 accepted",
                "drop 350 8.1",
                "observe 400 410 t Paused",
                "final t Running w2",
            ],
            NONE,
        );
        assert!(v.passed(), "{v}");
        assert_eq!((v.runs, v.max_live, v.accepted, v.rejected), (2, 1, 2, 1));
    }

    #[test]
    fn rule_1_two_runs_alive_at_once_fail() {
        let v = check(
            &[
                "alive 100 7.1 t w1 1 10",
                "alive 150 8.1 t w2 1 20",
                "drop 200 7.1",
            ],
            NONE,
        );
        assert_eq!(v.max_live, 2);
        assert!(matches!(&v.violations[..], [Violation::Overlap { task, .. }] if task == "t"));
    }

    #[test]
    fn rule_1_a_run_of_a_killed_process_ends_at_the_kill_and_no_later() {
        let killed = [
            "alive 100 7.1 t w1 1 10",
            "killed 200 7",
            "alive 300 8.1 t w2 1 20",
        ];
        assert!(check(&killed, NONE).passed());
        // Never dropped and never killed: alive to the end of the history.
        let v = check(
            &["alive 100 7.1 t w1 1 10", "alive 300 8.1 t w2 1 20"],
            NONE,
        );
        assert_eq!(v.violations.len(), 1, "{v}");
    }

    #[test]
    fn a_run_the_fault_met_is_told_from_one_started_after_it() {
        // The frozen run dropped at 200; the same process, joined again, was handed
        // the task back at 210.
        let lines = [
            "alive 100 7.1 t w1 1 10",
            "drop 200 7.1",
            "alive 210 7.2 t w1 1 20",
        ];
        let history = History::from_lines(&lines).expect("history lines");
        assert_eq!(history.alive_runs_of(7), 1, "the process has a live run");
        assert_eq!(history.alive_runs_of_started_before(7, 150), 0);
        assert_eq!(history.alive_runs_of_started_before(7, 300), 1);
    }

    #[test]
    fn rule_1_a_run_of_a_process_that_exited_ends_at_the_exit_and_no_later() {
        let exited = [
            "alive 100 7.1 t w1 1 10",
            "exited 200 7",
            "alive 300 8.1 t w2 1 20",
        ];
        let history = History::from_lines(&exited).expect("history lines");
        assert!(history.check(NONE).passed());
        assert_eq!(
            history.alive_runs_of(7),
            0,
            "a process gone has no live run"
        );
        let late = [
            "alive 100 7.1 t w1 1 10",
            "alive 300 8.1 t w2 1 20",
            "exited 400 7",
        ];
        let v = check(&late, NONE);
        assert_eq!(v.max_live, 2, "alive until its exit: {v}");
    }

    #[test]
    fn rule_1_a_frozen_owner_is_allowed_only_a_prompt_stop_after_the_thaw() {
        let lines = |drop: &'static str| {
            [
                "alive 100 7.1 t w1 1 10",
                "freeze 150 7",
                "alive 300 8.1 t w2 1 20",
                "thaw 400 7",
                drop,
            ]
        };
        let v = check(&lines("drop 450 7.1"), Duration::from_nanos(100));
        assert!(v.passed(), "{v}");
        assert_eq!(v.frozen, 1);
        let v = check(&lines("drop 600 7.1"), Duration::from_nanos(100));
        assert_eq!(v.violations.len(), 1, "a run kept past the allowance: {v}");
        assert_eq!(v.frozen, 0);
    }

    #[test]
    fn rule_1_a_frozen_owner_killed_before_its_thaw_ends_at_the_freeze() {
        // Killed while still frozen, after w2 took over: allowed, and counted.
        let v = check(
            &[
                "alive 100 7.1 t w1 1 10",
                "freeze 150 7",
                "alive 300 8.1 t w2 1 20",
                "killed 400 7",
            ],
            NONE,
        );
        assert!(v.passed(), "{v}");
        assert_eq!(v.frozen, 1);
        // The other run began before the freeze: the overlap before it still counts.
        let v = check(
            &[
                "alive 100 7.1 t w1 1 10",
                "alive 120 8.1 t w2 1 20",
                "freeze 150 7",
                "killed 400 7",
            ],
            NONE,
        );
        assert_eq!(v.violations.len(), 1, "{v}");
        // Thawed, kept going past the allowance, then killed: counts in full.
        let v = check(
            &[
                "alive 100 7.1 t w1 1 10",
                "freeze 150 7",
                "alive 300 8.1 t w2 1 20",
                "thaw 350 7",
                "killed 600 7",
            ],
            Duration::from_nanos(100),
        );
        assert_eq!((v.violations.len(), v.frozen), (1, 0), "{v}");
    }

    #[test]
    fn rule_1_as_of_now_a_run_thawed_within_the_allowance_is_not_yet_held() {
        let lines = [
            "alive 100 7.1 t w1 1 10",
            "freeze 150 7",
            "alive 300 8.1 t w2 1 20",
            "thaw 400 7",
        ];
        let history = History::from_lines(&lines).unwrap();
        let allowance = Duration::from_nanos(100);
        // 50 ns after the thaw it may still drop in time; 200 ns after, it did not.
        let v = history.check_as_of(allowance, 450);
        assert!(v.passed(), "{v}");
        assert_eq!(history.check_as_of(allowance, 600).violations.len(), 1);
        // Finished, never dropped: alive for ever.
        assert_eq!(history.check(allowance).violations.len(), 1);
    }

    #[test]
    fn rule_2_an_accepted_write_with_a_lower_token_fails() {
        let v = check(
            &[
                "write 100 110 t w2 20 accepted",
                "write 120 130 t w1 10 accepted",
            ],
            NONE,
        );
        assert!(
            matches!(&v.violations[..], [Violation::StaleAccepted { stale, newer: 20, .. }] if stale.1 == 10),
            "{v}"
        );
        // Concurrent (the lower one sent before the higher one was answered), or
        // rejected: no violation.
        let ok = check(
            &[
                "write 100 110 t w2 20 accepted",
                "write 105 130 t w1 10 accepted",
                "write 120 130 t w1 10 rejected",
                "write 120 130 u w1 10 accepted",
            ],
            NONE,
        );
        assert!(ok.passed(), "{ok}");
    }

    #[test]
    fn rule_3_a_running_task_owned_by_nobody_at_the_end_fails() {
        let v = check(&["final t Running -", "final u Paused -"], NONE);
        assert_eq!(v.violations, vec![Violation::Orphaned { task: "t".into() }]);
    }

    #[test]
    fn rule_4_a_rest_stage_read_while_a_run_is_alive_fails() {
        let run = ["alive 100 7.1 t w1 1 10", "drop 500 7.1"];
        let v = check(&[run[0], run[1], "observe 200 210 t Paused"], NONE);
        assert!(
            matches!(&v.violations[..], [Violation::FalseRest { stage, .. }] if stage == "Paused")
        );
        let v = check(&[run[0], run[1], "observe 200 210 t Stopped"], NONE);
        assert_eq!(v.violations.len(), 1);
        // Running is no claim of rest; a read that overlaps the drop may have seen
        // the state after it.
        let ok = check(
            &[
                run[0],
                run[1],
                "observe 200 210 t Running",
                "observe 490 510 t Paused",
            ],
            NONE,
        );
        assert!(ok.passed(), "{ok}");
    }

    /// A clean replay: w1 owns t with token 10 and writes twice; its lease ends;
    /// w2 takes it with token 20; w1's late write is rejected and absent.
    const CLEAN_REPLAY: [&str; 12] = [
        "alive 100 7.1 t w1 1 10",
        "owner 10 t 10 w1@a",
        "write 110 120 t w1 10 accepted 7.1",
        "applied 11 t w1@a 10 7.1",
        "reported 12 t w1 10",
        "drop 200 7.1",
        "owner 13 t 0 -",
        "owner 20 t 20 w2@b",
        "alive 300 8.1 t w2 1 20",
        "write 310 320 t w1 10 rejected 7.2",
        "write 330 340 t w2 20 accepted 8.1",
        "applied 21 t w2@b 20 8.1",
    ];

    fn with(lines: &[&str], more: &[&'static str]) -> Vec<String> {
        lines
            .iter()
            .chain(more.iter())
            .map(|s| (*s).to_owned())
            .collect()
    }

    fn check_owned(lines: &[String]) -> Verdict {
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        check(&lines, NONE)
    }

    #[test]
    fn a_clean_replay_passes_and_counts_what_it_checked() {
        let v = check_owned(&with(&CLEAN_REPLAY, &["replayed 21"]));
        assert!(v.passed(), "{v}");
        assert_eq!(v.applied, Some(2));
        // Without a replay line, rules 5-7 are not applied (and say so).
        let v = check(&CLEAN_REPLAY, NONE);
        assert_eq!(v.applied, None);
    }

    #[test]
    fn rule_5_a_write_applied_under_another_owner_key_fails() {
        // w1's late write with token 10, applied while w2's key (20) is in place.
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["applied 22 t w1@a 10 7.3", "replayed 22"],
        ));
        assert!(
            v.violations.iter().any(|x| matches!(x,
                Violation::AppliedUnfenced { revision: 22, owner_then: Some((o, 20)), .. }
                    if o == "w2@b")),
            "{v}"
        );
        // Applied while no owner key existed at all.
        let v = check_owned(&with(
            &CLEAN_REPLAY[..7],
            &["applied 14 t w1@a 10 7.3", "replayed 14"],
        ));
        assert!(
            matches!(
                &v.violations[..],
                [Violation::AppliedUnfenced {
                    owner_then: None,
                    ..
                }]
            ),
            "{v}"
        );
        // The right token under another lease of the same worker: the value differs.
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["applied 22 t w2@c 20 8.9", "replayed 22"],
        ));
        assert_eq!(v.per_rule()[4], 1, "{v}");
        // A report by an owner that does not hold the key.
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["reported 22 t w1 10", "replayed 22"],
        ));
        assert_eq!(v.per_rule()[4], 1, "{v}");
    }

    #[test]
    fn rule_6_a_token_going_back_in_revision_order_fails() {
        // Rule 6 on its own: an owner key created again with a lower create
        // revision (which etcd never does) satisfies rule 5, and the token still
        // goes back.
        let v = check(
            &[
                "owner 1 t 20 w2@b",
                "applied 2 t w2@b 20 8.1",
                "owner 3 t 10 w1@a",
                "applied 4 t w1@a 10 7.1",
                "replayed 4",
            ],
            NONE,
        );
        assert!(
            matches!(
                &v.violations[..],
                [Violation::TokenBack {
                    revision: 4,
                    token: 10,
                    after: 20,
                    ..
                }]
            ),
            "{v}"
        );
    }

    #[test]
    fn rule_7_acknowledgements_must_match_etcd() {
        // Seen accepted, not in etcd.
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["write 350 360 t w2 20 accepted 8.2", "replayed 21"],
        ));
        assert!(
            matches!(&v.violations[..], [Violation::AcceptedMissing { id, .. }] if id == "8.2"),
            "{v}"
        );
        // Seen rejected, in etcd (applied under w1's own key: rule 5 holds).
        let mut lines = with(&CLEAN_REPLAY[..6], &[]);
        lines.push("write 150 160 t w1 10 rejected 7.5".into());
        lines.push("applied 12 t w1@a 10 7.5".into());
        lines.push("replayed 12".into());
        let v = check_owned(&lines);
        assert!(
            matches!(&v.violations[..], [Violation::RejectedApplied { id, .. }] if id == "7.5"),
            "{v}"
        );
        // An unknown outcome may be either.
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["write 350 360 t w2 20 unknown 8.2", "replayed 21"],
        ));
        assert!(v.passed(), "{v}");
    }

    #[test]
    fn rule_8_observed_running_at_convergence_needs_that_run_alive() {
        // 8.1 (w2, token 20) is alive at 400: passes.
        let v = check_owned(&with(&CLEAN_REPLAY, &["converged 400 t w2 20"]));
        assert!(v.passed(), "{v}");
        assert_eq!(v.converged, 1);
        // The wrong token, the wrong worker, a dropped run, a killed process.
        for bad in [
            "converged 400 t w2 10",
            "converged 400 t w1 10",
            "converged 250 t w1 10",
        ] {
            let v = check_owned(&with(&CLEAN_REPLAY, &[bad]));
            assert!(
                matches!(&v.violations[..], [Violation::NoLiveRun { .. }]),
                "{bad}: {v}"
            );
        }
        let v = check_owned(&with(
            &CLEAN_REPLAY,
            &["killed 350 8", "converged 400 t w2 20"],
        ));
        assert_eq!(v.per_rule()[7], 1, "{v}");
        // Converged before the run started.
        let v = check_owned(&with(&CLEAN_REPLAY, &["converged 250 t w2 20"]));
        assert_eq!(v.per_rule()[7], 1, "{v}");
    }

    #[test]
    fn replayed_entries_are_history_lines() {
        let entries = [
            Replayed::Owner {
                revision: 10,
                task: "t".into(),
                owner: Some((10, "w1@a".into())),
            },
            Replayed::Applied {
                revision: 11,
                task: "t".into(),
                owner_value: "w1@a".into(),
                token: 10,
                id: "7-1".into(),
            },
            Replayed::Reported {
                revision: 12,
                task: "t".into(),
                owner: "w1".into(),
                token: 10,
            },
            Replayed::Owner {
                revision: 13,
                task: "t".into(),
                owner: None,
            },
            Replayed::Done { revision: 13 },
        ];
        let mut history = History::default();
        history.add_replay(&entries);
        let v = history.check(NONE);
        assert!(v.passed(), "{v}");
        assert_eq!(v.applied, Some(1));
        // The same entries with the report after the key's deletion: rule 5.
        let mut late = entries.to_vec();
        late.swap(2, 3);
        if let Replayed::Reported { revision, .. } = &mut late[3] {
            *revision = 14;
        }
        let mut history = History::default();
        history.add_replay(&late);
        assert_eq!(history.check(NONE).per_rule()[4], 1);
    }

    #[test]
    fn lines_that_are_not_history_are_refused() {
        assert!(History::from_lines(&["alive 1 2"]).is_none());
        assert!(History::from_lines(&["write a b t w 1 accepted"]).is_none());
        assert!(
            History::from_lines(&["drop 5 9.9"]).is_none(),
            "a drop of no run"
        );
    }

    #[test]
    fn recorded_files_merge_into_one_history() {
        let dir = std::env::temp_dir().join(format!("taskstage-history-{}", now_ns()));
        let a = Recorder::create(&dir, "a").unwrap();
        let b = Recorder::create(&dir, "b").unwrap();
        let guard = a.alive("t", "w1", 1, 10);
        a.write("t", "w1", 10, now_ns(), WriteOutcome::Accepted);
        drop(guard);
        let _alive = b.alive("t", "w2", 1, 20);
        b.end("t", "Running", Some("w2"));
        let v = History::load(&dir).unwrap().check(NONE);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(v.passed(), "{v}");
        assert_eq!((v.runs, v.accepted, v.max_live), (2, 1, 1));
    }
}
