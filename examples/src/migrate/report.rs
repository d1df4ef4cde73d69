//! What a person sees: a progress bar per unit on a terminal (plain lines otherwise),
//! the stage timeline, and the final summary with its verification.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use taskstage::{Outcome, Stage, TaskSnapshot};
use tokio::time::Instant;

use crate::migrate::db::{Checkpoint, Digest, Writes};

/// The pipeline's units, in order.
pub const UNIT_NAMES: [&str; 3] = ["dump", "load", "sync"];

/// Where progress goes while the pipeline runs.
#[derive(Debug)]
pub struct Screen {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    /// Nothing until the summary.
    Quiet,
    /// Lines: one at each quarter of a unit's work, and the important events.
    Plain(Mutex<[u64; 3]>),
    /// A bar per unit (spinner for the sync, whose total is unknown).
    Bars {
        multi: MultiProgress,
        bars: [ProgressBar; 3],
        done: Mutex<[bool; 3]>,
    },
}

impl Screen {
    /// Bars when standard error is a terminal, plain lines otherwise; nothing when
    /// `quiet`.
    pub fn new(quiet: bool) -> Screen {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Screen::bars()
        } else {
            Mode::Plain(Mutex::new([0; 3]))
        };
        Screen { mode }
    }

    fn bars() -> Mode {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let bar_style = ProgressStyle::with_template(
            "{prefix:>4} [{bar:30.cyan/blue}] {pos:>7}/{len:7} rows  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        let spin_style =
            ProgressStyle::with_template("{prefix:>4} {spinner} {pos:>7} changes applied  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
        let bars = UNIT_NAMES.map(|name| {
            let bar = if name == "sync" {
                ProgressBar::new_spinner().with_style(spin_style.clone())
            } else {
                ProgressBar::no_length().with_style(bar_style.clone())
            };
            let bar = multi.add(bar.with_prefix(name).with_message("waiting"));
            bar.tick();
            bar
        });
        Mode::Bars {
            multi,
            bars,
            done: Mutex::new([false; 3]),
        }
    }

    /// A unit reported progress.
    pub fn progress(&self, unit: usize, done: u64, total: Option<u64>) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Plain(quarters) => {
                let Some(total) = total.filter(|t| *t > 0) else {
                    return;
                };
                let total = total.max(done);
                let quarter = done * 4 / total;
                let mut printed = lock(quarters);
                if let Some(last) = printed.get_mut(unit) {
                    if quarter > *last {
                        *last = quarter;
                        drop(printed);
                        let name = UNIT_NAMES.get(unit).copied().unwrap_or("?");
                        let what = if name == "sync" { "changes" } else { "rows" };
                        println!(
                            "{name:>5}: {:>3}%  ({} of {} {what})",
                            quarter * 25,
                            thousands(done),
                            thousands(total)
                        );
                    }
                }
            }
            Mode::Bars { bars, .. } => {
                if let Some(bar) = bars.get(unit) {
                    if let Some(total) = total {
                        bar.set_length(total.max(done));
                    }
                    bar.set_position(done);
                }
            }
        }
    }

    /// The task's state changed.
    pub fn stage(&self, snap: &TaskSnapshot) {
        let Mode::Bars { bars, done, .. } = &self.mode else {
            return;
        };
        let current = match (&snap.unit, snap.stage) {
            (_, Stage::Finished) => UNIT_NAMES.len(),
            (Some((index, _)), _) => *index,
            (None, _) => UNIT_NAMES.len(),
        };
        let mut finished = lock(done);
        for (index, bar) in bars.iter().enumerate() {
            if finished.get(index).copied().unwrap_or(true) {
                continue;
            }
            if index < current {
                if let Some(flag) = finished.get_mut(index) {
                    *flag = true;
                }
                bar.finish_with_message("done");
            } else if index == current {
                let text = match snap.stage {
                    Stage::Running if snap.generation > 0 => {
                        format!("running (run {})", snap.generation)
                    }
                    stage => stage.name().to_lowercase(),
                };
                bar.set_message(text);
            }
        }
    }

    /// A line about an event. On a terminal it is printed above the bars; in plain
    /// mode only `important` lines are printed (the rest is in the final timeline).
    pub fn note(&self, text: &str, important: bool) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Plain(_) => {
                if important {
                    println!("{text}");
                }
            }
            Mode::Bars { multi, .. } => {
                // A failed write to the terminal only loses a progress line.
                let _ = multi.println(text);
            }
        }
    }

    /// A line printed in every mode but quiet (the header, for example).
    pub fn say(&self, text: &str) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Plain(_) => println!("{text}"),
            Mode::Bars { multi, .. } => {
                let _ = multi.println(text);
            }
        }
    }

    /// Removes the bars, before the summary is printed.
    pub fn finish(&self) {
        if let Mode::Bars { multi, bars, .. } = &self.mode {
            for bar in bars {
                if !bar.is_finished() {
                    bar.abandon();
                }
            }
            let _ = multi.clear();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data behind these locks is display state: a panic elsewhere leaves it usable.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ------------------------------------------------------------------ timeline

/// One line of the timeline.
#[derive(Debug, Clone)]
pub enum Entry {
    /// The task's state, as observed.
    Stage {
        /// Time since the pipeline started.
        at: Duration,
        /// Which task (1, then 2 after the restart).
        task: usize,
        /// The run generation.
        generation: u64,
        /// The current unit, if any.
        unit: Option<usize>,
        /// The stage.
        stage: Stage,
        /// What the last run returned, for the stages at rest.
        outcome: Option<String>,
    },
    /// Something the controller did.
    Action {
        /// Time since the pipeline started.
        at: Duration,
        /// Which task it was done to.
        task: usize,
        /// What it did.
        text: String,
    },
}

impl Entry {
    fn at(&self) -> Duration {
        match self {
            Entry::Stage { at, .. } | Entry::Action { at, .. } => *at,
        }
    }
}

/// The stage changes and controller actions of a run of the program, in time order.
#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    entries: Mutex<Vec<Entry>>,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Timeline::new()
    }
}

impl Timeline {
    /// A timeline whose clock starts now.
    pub fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            entries: Mutex::new(Vec::new()),
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records an observed state of task `task`.
    pub fn stage(&self, task: usize, snap: &TaskSnapshot) {
        let outcome = if snap.stage.is_at_rest() {
            snap.outcome.as_ref().map(|o| match o {
                Outcome::Completed => "the run completed its unit".to_owned(),
                Outcome::Cancelled => "the run returned after the cancel".to_owned(),
                Outcome::Aborted => "the run was aborted".to_owned(),
                Outcome::Failed(e) => format!("failed: {e}"),
                other => other.name().to_owned(),
            })
        } else {
            None
        };
        let entry = Entry::Stage {
            at: self.elapsed(),
            task,
            generation: snap.generation,
            unit: snap.unit.as_ref().map(|(i, _)| *i),
            stage: snap.stage,
            outcome,
        };
        lock(&self.entries).push(entry);
    }

    /// Records a controller action on task `task`.
    pub fn action(&self, task: usize, text: impl Into<String>) {
        let entry = Entry::Action {
            at: self.elapsed(),
            task,
            text: text.into(),
        };
        lock(&self.entries).push(entry);
    }

    /// Every entry so far, in time order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = lock(&self.entries).clone();
        entries.sort_by_key(Entry::at);
        entries
    }
}

// ------------------------------------------------------------------ summary

/// What the controller did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pauses that reached Paused.
    pub pauses: u32,
    /// Of those, pauses issued the moment the pipeline switched units.
    pub pauses_at_switch: u32,
    /// Pauses that met a unit completing and reached Paused at the next unit.
    pub pauses_over_completion: u32,
    /// Scripted pauses (or a stop) skipped because their moment had passed (the unit
    /// completed first).
    pub skipped: u32,
    /// Resumes accepted.
    pub resumes: u32,
    /// Resumes issued before the pause returned, refused because the run was still
    /// alive: each is the moment the original bug started a second copy.
    pub early_resumes_refused: u32,
    /// Stops that reached Stopped.
    pub stops: u32,
    /// New tasks built after a stop, continuing from the checkpoints.
    pub restarts: u32,
    /// The most runs found live the instant a pause or a stop returned (must be 0:
    /// a returned pause means no run, and no batch of one, is left).
    pub live_after_pause: usize,
}

/// How many runs each unit had.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitRuns {
    /// Runs in all.
    pub runs: u32,
    /// Runs that started from a checkpoint with work already done.
    pub continued: u32,
}

/// Everything the final report shows.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The source file.
    pub source: PathBuf,
    /// The target file.
    pub target: PathBuf,
    /// Rows generated, when the program generated the source.
    pub generated_rows: Option<u64>,
    /// The seed of the schedule.
    pub seed: u64,
    /// Whether the target already held part of this migration.
    pub continued_target: bool,
    /// From the start of the pipeline to its end.
    pub elapsed: Duration,
    /// The stage timeline.
    pub timeline: Vec<Entry>,
    /// What the controller did.
    pub counts: Counts,
    /// Runs per unit.
    pub runs: [UnitRuns; 3],
    /// The most runs ever live at once.
    pub max_live: usize,
    /// Runs still live after the pipeline ended (must be 0).
    pub live_at_end: usize,
    /// Runs started in all, as the live-run counter saw them.
    pub runs_entered: usize,
    /// What the writer changed in the source while the pipeline ran.
    pub writes: Writes,
    /// The source's rows and checksum at the end.
    pub source_digest: Option<Digest>,
    /// The target's rows and checksum at the end.
    pub target_digest: Option<Digest>,
    /// The target's checkpoints at the end.
    pub checkpoints: Vec<(String, Checkpoint)>,
    /// Why the pipeline did not finish, if it did not.
    pub failure: Option<String>,
    /// The work directory that was kept (or `None`: removed, or not used).
    pub kept_dir: Option<PathBuf>,
}

impl Summary {
    /// Whether everything holds: the pipeline finished, the target equals the source,
    /// and no two runs were ever live at once.
    pub fn verified(&self) -> bool {
        self.problems().is_empty()
    }

    /// The reasons verification failed, empty when it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(failure) = &self.failure {
            problems.push(format!("the pipeline did not finish: {failure}"));
        }
        match (self.source_digest, self.target_digest) {
            (Some(s), Some(t)) if s != t => problems.push(format!(
                "the target differs from the source: {} rows (checksum {:016x}) against {} \
                 rows (checksum {:016x})",
                thousands(t.rows),
                t.checksum,
                thousands(s.rows),
                s.checksum
            )),
            (Some(_), Some(_)) => {}
            _ => problems.push("the databases could not be compared".to_owned()),
        }
        if self.max_live != 1 {
            problems.push(format!(
                "at most {} runs were live at once (must be exactly 1)",
                self.max_live
            ));
        }
        if self.counts.live_after_pause != 0 {
            problems.push(format!(
                "{} runs were still live when a pause or stop returned",
                self.counts.live_after_pause
            ));
        }
        if self.live_at_end != 0 {
            problems.push(format!(
                "{} runs were still live after the pipeline ended",
                self.live_at_end
            ));
        }
        problems
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// The timeline, one line per observed stage and per controller action.
pub fn render_timeline(entries: &[Entry]) -> String {
    let mut out = String::new();
    for entry in entries {
        match entry {
            Entry::Stage {
                at,
                task,
                generation,
                unit,
                stage,
                outcome,
            } => {
                let unit = unit.and_then(|i| UNIT_NAMES.get(i).copied()).unwrap_or("-");
                let mut line = format!(
                    "  {:>8}  task {task}  run {generation:<3} {unit:<5} {:<9}",
                    seconds(*at),
                    stage.name()
                );
                if let Some(outcome) = outcome {
                    line.push(' ');
                    line.push_str(outcome);
                }
                out.push_str(line.trim_end());
                out.push('\n');
            }
            Entry::Action { at, task, text } => {
                let _ = writeln!(out, "  {:>8}  task {task}  >> {text}", seconds(*at));
            }
        }
    }
    out
}

/// The final report: timeline, figures, verification.
pub fn render(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stage timeline (time, task, run generation, unit, stage; `>>` marks the \
         controller's commands; every change of every task is listed):"
    );
    out.push_str(&render_timeline(&summary.timeline));
    let _ = writeln!(out);
    let _ = writeln!(out, "summary:");
    let line = |out: &mut String, key: &str, value: String| {
        let _ = writeln!(out, "  {key:<22}{value}");
    };
    line(&mut out, "source", summary.source.display().to_string());
    line(&mut out, "target", summary.target.display().to_string());
    if let Some(rows) = summary.generated_rows {
        line(&mut out, "generated rows", thousands(rows));
    }
    if summary.continued_target {
        line(
            &mut out,
            "target",
            "continued from the checkpoints of an earlier run".to_owned(),
        );
    }
    line(
        &mut out,
        "seed",
        format!(
            "{} (rerun with --seed {} for the same schedule)",
            summary.seed, summary.seed
        ),
    );
    line(&mut out, "elapsed", seconds(summary.elapsed));
    let c = &summary.counts;
    line(
        &mut out,
        "pauses",
        format!(
            "{} ({} at a unit switch, {} met a unit completing, {} skipped: the moment \
             had passed)",
            c.pauses, c.pauses_at_switch, c.pauses_over_completion, c.skipped
        ),
    );
    line(&mut out, "resumes", c.resumes.to_string());
    line(
        &mut out,
        "early resumes refused",
        format!(
            "{} (resume issued while the paused run was still returning)",
            c.early_resumes_refused
        ),
    );
    line(
        &mut out,
        "stops / restarts",
        if c.restarts > 0 {
            format!(
                "{} / {} (the new task continued from the checkpoints)",
                c.stops, c.restarts
            )
        } else {
            format!("{} / {}", c.stops, c.restarts)
        },
    );
    let runs = UNIT_NAMES
        .iter()
        .zip(summary.runs)
        .map(|(name, r)| format!("{name} {} ({} from a checkpoint)", r.runs, r.continued))
        .collect::<Vec<_>>()
        .join(", ");
    line(&mut out, "runs", runs);
    let w = summary.writes;
    line(
        &mut out,
        "source writes",
        format!(
            "{} while the pipeline ran ({} inserts, {} updates, {} deletes)",
            thousands(w.total()),
            thousands(w.inserted),
            thousands(w.updated),
            thousands(w.deleted)
        ),
    );
    for (unit, cp) in &summary.checkpoints {
        line(
            &mut out,
            &format!("checkpoint {unit}"),
            format!(
                "{} {} done, position {}{}",
                thousands(cp.items),
                if unit == "sync" { "changes" } else { "rows" },
                cp.position,
                if cp.done { ", complete" } else { "" }
            ),
        );
    }
    line(
        &mut out,
        "max live runs",
        format!(
            "{} (over {} runs; {} live when a pause or stop returned, {} at the end)",
            summary.max_live, summary.runs_entered, c.live_after_pause, summary.live_at_end
        ),
    );
    let digest = |d: Option<Digest>| match d {
        Some(d) => format!("{} rows, checksum {:016x}", thousands(d.rows), d.checksum),
        None => "not read".to_owned(),
    };
    line(&mut out, "source contents", digest(summary.source_digest));
    line(&mut out, "target contents", digest(summary.target_digest));
    if let Some(dir) = &summary.kept_dir {
        line(&mut out, "work directory kept", dir.display().to_string());
    }
    let problems = summary.problems();
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "verification: passed (target equals source; never more than one live run)"
        );
    } else {
        let _ = writeln!(out, "verification: FAILED");
        for problem in problems {
            let _ = writeln!(out, "  - {problem}");
        }
    }
    out
}
