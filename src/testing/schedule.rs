//! Schedules: what the kit does to a task, and when, as a short script.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// When a step of a schedule acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// After the task's units have made this many more progress reports (counted from
    /// the previous step). A report is a call of
    /// [`RunContext::report_progress`](crate::RunContext::report_progress), and every
    /// one counts. The run is held at its first `Pending` after the report, until the
    /// step's command has been issued.
    ///
    /// The kit can hold a run only where it returns `Pending`: when a unit reports
    /// twice with no `Pending` between (I/O that completed before it was awaited),
    /// both count, and a point at the first of them holds the run after the second.
    Reports(u32),
    /// At the first run of this unit in its task: the moment the pipeline switches to
    /// it (unit 0: the start of a task). The run is held before it is first polled.
    Switch(usize),
    /// While the next pre-start check runs: the check is held, with its stage
    /// Resuming, until the command has been issued.
    Check,
    /// After this long on the task's clock (tokio's paused clock under the
    /// [`Runner`](super::Runner)), counted from the previous step. Nothing is held.
    Delay(Duration),
}

/// What a step of a schedule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// [`Handle::pause`](crate::Handle::pause); the task stays paused until a later
    /// `resume` (or the end of the schedule, which resumes a paused task).
    Pause,
    /// [`Handle::resume`](crate::Handle::resume).
    Resume,
    /// [`Handle::stop`](crate::Handle::stop): for good, unless a later `restart`.
    Stop,
    /// Stops the task (if it is not already at its end), then builds a new task from
    /// the factory, with fresh units that continue from their durable checkpoints,
    /// and starts it.
    Restart,
    /// [`Handle::update`](crate::Handle::update) with the configuration the
    /// [`Subject`](super::Subject) makes from this number.
    Update(u32),
}

/// One step of a schedule: a command at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// When.
    pub at: Point,
    /// What.
    pub action: Action,
}

/// A sequence of commands placed at points of a run: what the
/// [`Runner`](super::Runner) does to a task.
///
/// Prints as a short script, one step per `;`, and parses back from it (also with
/// one step per line).
///
/// # Examples
///
/// ```
/// use taskstage::testing::{Action, Point, Schedule};
///
/// let schedule: Schedule = "after 3 reports: pause; in check: stop; after 20 ms: restart"
///     .parse()?;
/// assert_eq!(schedule.len(), 3);
/// assert_eq!(schedule.steps()[1].at, Point::Check);
/// assert_eq!(schedule.steps()[2].action, Action::Restart);
/// assert_eq!(schedule.to_string().parse::<Schedule>()?, schedule);
///
/// let bad = "after 3 reprots: pause".parse::<Schedule>().unwrap_err();
/// assert_eq!(bad.step, 1);
/// # Ok::<(), taskstage::testing::ParseError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Schedule {
    steps: Vec<Step>,
}

impl Schedule {
    /// A schedule of these steps.
    pub fn new(steps: Vec<Step>) -> Self {
        Schedule { steps }
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// How many commands the schedule issues.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the schedule issues no command (the task just runs to its end).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

impl From<Vec<Step>> for Schedule {
    fn from(steps: Vec<Step>) -> Self {
        Schedule::new(steps)
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Point::Reports(1) => f.write_str("after 1 report"),
            Point::Reports(n) => write!(f, "after {n} reports"),
            Point::Switch(unit) => write!(f, "at switch to unit {unit}"),
            Point::Check => f.write_str("in check"),
            Point::Delay(d) => write!(f, "after {} ms", d.as_millis()),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Pause => f.write_str("pause"),
            Action::Resume => f.write_str("resume"),
            Action::Stop => f.write_str("stop"),
            Action::Restart => f.write_str("restart"),
            Action::Update(n) => write!(f, "update {n}"),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.action)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{step}")?;
        }
        Ok(())
    }
}

/// Why a schedule's text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {step} (`{text}`): {problem}")]
pub struct ParseError {
    /// The step that did not parse, counted from 1.
    pub step: usize,
    /// Its text.
    pub text: String,
    /// What is wrong with it.
    pub problem: ParseProblem,
}

/// What is wrong with a step's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseProblem {
    /// No `:` between the point and the action.
    #[error("expected `<point>: <action>`")]
    MissingColon,
    /// The point is none of `after N reports`, `at switch to unit N`, `in check`,
    /// `after N ms`.
    #[error(
        "unknown point `{0}` (expected `after N reports`, `at switch to unit N`, `in check` or `after N ms`)"
    )]
    UnknownPoint(String),
    /// The action is none of `pause`, `resume`, `stop`, `restart`, `update N`.
    #[error("unknown action `{0}` (expected `pause`, `resume`, `stop`, `restart` or `update N`)")]
    UnknownAction(String),
    /// A number that is not a whole number in range.
    #[error("`{0}` is not a number in range")]
    BadNumber(String),
    /// `after 0 reports`: a point must wait for at least one report.
    #[error("a point waits for at least 1 report")]
    ZeroReports,
}

fn number<T: FromStr>(text: &str) -> Result<T, ParseProblem> {
    text.parse()
        .map_err(|_| ParseProblem::BadNumber(text.to_owned()))
}

fn parse_point(text: &str) -> Result<Point, ParseProblem> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["in", "check"] => Ok(Point::Check),
        ["at", "switch", "to", "unit", n] => Ok(Point::Switch(number(n)?)),
        ["after", n, "report" | "reports"] => match number(n)? {
            0 => Err(ParseProblem::ZeroReports),
            n => Ok(Point::Reports(n)),
        },
        ["after", n, "ms"] => Ok(Point::Delay(Duration::from_millis(number(n)?))),
        _ => Err(ParseProblem::UnknownPoint(text.trim().to_owned())),
    }
}

fn parse_action(text: &str) -> Result<Action, ParseProblem> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["pause"] => Ok(Action::Pause),
        ["resume"] => Ok(Action::Resume),
        ["stop"] => Ok(Action::Stop),
        ["restart"] => Ok(Action::Restart),
        ["update", n] => Ok(Action::Update(number(n)?)),
        _ => Err(ParseProblem::UnknownAction(text.trim().to_owned())),
    }
}

impl FromStr for Step {
    type Err = ParseProblem;

    fn from_str(text: &str) -> Result<Step, ParseProblem> {
        let (at, action) = text.split_once(':').ok_or(ParseProblem::MissingColon)?;
        Ok(Step {
            at: parse_point(at)?,
            action: parse_action(action)?,
        })
    }
}

impl FromStr for Schedule {
    type Err = ParseError;

    /// Parses the script [`Display`](fmt::Display) prints: steps separated by `;` or
    /// by new lines; blank steps are ignored, so the empty text is the empty schedule.
    fn from_str(text: &str) -> Result<Schedule, ParseError> {
        let steps = text
            .split([';', '\n'])
            .map(str::trim)
            .filter(|step| !step.is_empty())
            .enumerate()
            .map(|(i, step)| {
                step.parse().map_err(|problem| ParseError {
                    step: i + 1,
                    text: step.to_owned(),
                    problem,
                })
            })
            .collect::<Result<Vec<Step>, ParseError>>()?;
        Ok(Schedule { steps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_step_prints_and_parses_back() {
        let schedule = Schedule::new(vec![
            Step {
                at: Point::Reports(1),
                action: Action::Pause,
            },
            Step {
                at: Point::Reports(12),
                action: Action::Resume,
            },
            Step {
                at: Point::Switch(2),
                action: Action::Stop,
            },
            Step {
                at: Point::Check,
                action: Action::Restart,
            },
            Step {
                at: Point::Delay(Duration::from_millis(35)),
                action: Action::Update(4),
            },
        ]);
        let text = schedule.to_string();
        assert_eq!(
            text,
            "after 1 report: pause; after 12 reports: resume; at switch to unit 2: stop; \
             in check: restart; after 35 ms: update 4"
        );
        assert_eq!(text.parse::<Schedule>(), Ok(schedule.clone()));
        let by_lines = text.replace("; ", "\n");
        assert_eq!(by_lines.parse::<Schedule>(), Ok(schedule));
        assert_eq!("".parse::<Schedule>(), Ok(Schedule::default()));
    }

    #[test]
    fn bad_text_gets_an_error_naming_the_step_and_the_problem() {
        let cases = [
            ("in check pause", 1, ParseProblem::MissingColon),
            (
                "in check: pause; at switch unit 1: stop",
                2,
                ParseProblem::UnknownPoint("at switch unit 1".to_owned()),
            ),
            (
                "after 2 ms: halt",
                1,
                ParseProblem::UnknownAction("halt".to_owned()),
            ),
            (
                "in check: stop; in check: stop; after -1 ms: stop",
                3,
                ParseProblem::BadNumber("-1".to_owned()),
            ),
            ("after 0 reports: pause", 1, ParseProblem::ZeroReports),
            (
                "in check: update 99999999999",
                1,
                ParseProblem::BadNumber("99999999999".to_owned()),
            ),
        ];
        for (text, step, problem) in cases {
            let error = text.parse::<Schedule>().unwrap_err();
            assert_eq!((error.step, &error.problem), (step, &problem), "{text}");
            assert!(error.to_string().starts_with(&format!("step {step} (`")));
        }
    }
}
