//! Generating schedules: a proptest strategy with sizes and weights the user sets.

use std::ops::RangeInclusive;
use std::time::Duration;

use proptest::collection::vec;
use proptest::strategy::{BoxedStrategy, Just, Strategy, Union, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::schedule::{Action, Point, Schedule, Step};

/// How schedules are drawn: how many steps, at which points, doing what, how often.
///
/// The weights say how often each kind of point and action is drawn relative to the
/// others (0 leaves it out). When a schedule fails, proptest shrinks it: it drops
/// steps, lowers report counts, delays and unit numbers, and moves each point and
/// action towards the first kind in declaration order ([`Point::Reports`],
/// [`Action::Pause`]).
///
/// # Examples
///
/// ```
/// use taskstage::testing::Schedules;
///
/// let schedules = Schedules::new()
///     .steps(1..=4)
///     .units(3)
///     .max_reports(10)
///     .restart_weight(0); // this pipeline has no durable checkpoints
/// let schedule = schedules.generate(7)?;
/// assert!((1..=4).contains(&schedule.len()));
/// assert_eq!(schedule, schedules.generate(7)?); // a seed replays its schedule
/// assert!(!schedule.to_string().contains("restart"));
/// # Ok::<(), taskstage::testing::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedules {
    steps: RangeInclusive<usize>,
    units: usize,
    max_reports: u32,
    max_delay: Duration,
    max_update: u32,
    points: [u32; 4],
    actions: [u32; 5],
}

/// A [`Schedules`] that cannot draw a schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The range of step counts is empty.
    #[error("the step range {min}..={max} is empty")]
    EmptySteps {
        /// The fewest steps asked for.
        min: usize,
        /// The most steps asked for.
        max: usize,
    },
    /// Every point has weight 0 (or the only ones left cannot occur).
    #[error("every point has weight 0")]
    NoPoints,
    /// Every action has weight 0.
    #[error("every action has weight 0")]
    NoActions,
    /// `max_reports` is 0: a report point waits for at least one report.
    #[error("max_reports must be at least 1")]
    NoReports,
    /// The pipeline has no unit.
    #[error("a pipeline has at least 1 unit")]
    NoUnits,
    /// More steps than a schedule may have.
    #[error("a schedule has at most {limit} steps, not {max}")]
    TooManySteps {
        /// The most steps asked for.
        max: usize,
        /// The most a schedule may have.
        limit: usize,
    },
    /// The weights of the points, or of the actions, add up to more than `u32::MAX`.
    #[error("the {what} weights add up to more than {}", u32::MAX)]
    WeightsOverflow {
        /// `"point"` or `"action"`.
        what: &'static str,
    },
}

/// The most steps a schedule may have: a schedule is a script a person reads, and
/// each step costs a run of the user's pipeline.
pub const MAX_STEPS: usize = 1_000;

impl Default for Schedules {
    fn default() -> Self {
        Schedules::new()
    }
}

impl Schedules {
    /// 1 to 6 steps, a one-unit pipeline, up to 8 reports and 50 ms between steps;
    /// points weighted reports 4, switch 2, check 2, delay 2; actions pause 4,
    /// resume 3, stop 1, restart 2, update 1.
    pub fn new() -> Self {
        Schedules {
            steps: 1..=6,
            units: 1,
            max_reports: 8,
            max_delay: Duration::from_millis(50),
            max_update: 3,
            points: [4, 2, 2, 2],
            actions: [4, 3, 1, 2, 1],
        }
    }

    /// How many steps a schedule has.
    pub fn steps(mut self, steps: RangeInclusive<usize>) -> Self {
        self.steps = steps;
        self
    }

    /// How many units the pipeline has: switch points name units `1..units`.
    pub fn units(mut self, units: usize) -> Self {
        self.units = units;
        self
    }

    /// The most progress reports a report point waits for.
    pub fn max_reports(mut self, reports: u32) -> Self {
        self.max_reports = reports;
        self
    }

    /// The longest delay a delay point waits.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// The largest number an `update N` action carries.
    pub fn max_update(mut self, n: u32) -> Self {
        self.max_update = n;
        self
    }

    /// How often a point is "after N reports".
    pub fn reports_weight(mut self, weight: u32) -> Self {
        self.points[0] = weight;
        self
    }

    /// How often a point is "at switch to unit N" (never for a one-unit pipeline).
    pub fn switch_weight(mut self, weight: u32) -> Self {
        self.points[1] = weight;
        self
    }

    /// How often a point is "in check".
    pub fn check_weight(mut self, weight: u32) -> Self {
        self.points[2] = weight;
        self
    }

    /// How often a point is "after N ms".
    pub fn delay_weight(mut self, weight: u32) -> Self {
        self.points[3] = weight;
        self
    }

    /// How often an action is `pause`.
    pub fn pause_weight(mut self, weight: u32) -> Self {
        self.actions[0] = weight;
        self
    }

    /// How often an action is `resume`.
    pub fn resume_weight(mut self, weight: u32) -> Self {
        self.actions[1] = weight;
        self
    }

    /// How often an action is `stop`.
    pub fn stop_weight(mut self, weight: u32) -> Self {
        self.actions[2] = weight;
        self
    }

    /// How often an action is `restart`.
    pub fn restart_weight(mut self, weight: u32) -> Self {
        self.actions[3] = weight;
        self
    }

    /// How often an action is `update N`.
    pub fn update_weight(mut self, weight: u32) -> Self {
        self.actions[4] = weight;
        self
    }

    /// The proptest strategy of these schedules.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when no schedule can be drawn: an empty step range, no unit,
    /// no report to wait for, or every point (or every action) weighted 0.
    pub fn strategy(&self) -> Result<BoxedStrategy<Schedule>, ConfigError> {
        let (min, max) = (*self.steps.start(), *self.steps.end());
        if min > max {
            return Err(ConfigError::EmptySteps { min, max });
        }
        if max > MAX_STEPS {
            return Err(ConfigError::TooManySteps {
                max,
                limit: MAX_STEPS,
            });
        }
        if self.units == 0 {
            return Err(ConfigError::NoUnits);
        }
        if self.max_reports == 0 {
            return Err(ConfigError::NoReports);
        }
        let max_delay = u64::try_from(self.max_delay.as_millis()).unwrap_or(u64::MAX);
        let points: Vec<(u32, BoxedStrategy<Point>)> = vec![
            (
                self.points[0],
                (1..=self.max_reports).prop_map(Point::Reports).boxed(),
            ),
            (
                // Unit 0 is switched to only at a task's start: leave it to restarts.
                if self.units > 1 { self.points[1] } else { 0 },
                (1..self.units.max(2)).prop_map(Point::Switch).boxed(),
            ),
            (self.points[2], Just(Point::Check).boxed()),
            (
                self.points[3],
                (0..=max_delay)
                    .prop_map(|ms| Point::Delay(Duration::from_millis(ms)))
                    .boxed(),
            ),
        ];
        let actions: Vec<(u32, BoxedStrategy<Action>)> = vec![
            (self.actions[0], Just(Action::Pause).boxed()),
            (self.actions[1], Just(Action::Resume).boxed()),
            (self.actions[2], Just(Action::Stop).boxed()),
            (self.actions[3], Just(Action::Restart).boxed()),
            (
                self.actions[4],
                (0..=self.max_update).prop_map(Action::Update).boxed(),
            ),
        ];
        let point = weighted(points, "point")?.ok_or(ConfigError::NoPoints)?;
        let action = weighted(actions, "action")?.ok_or(ConfigError::NoActions)?;
        let step = (point, action).prop_map(|(at, action)| Step { at, action });
        Ok(vec(step, min..=max).prop_map(Schedule::new).boxed())
    }

    /// The schedule this seed draws: the same seed and the same settings give the
    /// same schedule.
    ///
    /// # Errors
    ///
    /// As [`Schedules::strategy`].
    pub fn generate(&self, seed: u64) -> Result<Schedule, ConfigError> {
        let strategy = self.strategy()?;
        let mut runner = TestRunner::new_with_rng(Config::default(), rng(seed));
        match strategy.new_tree(&mut runner) {
            Ok(tree) => Ok(tree.current()),
            // The strategy has no filter, so drawing cannot be rejected.
            Err(reason) => unreachable!("an unfiltered strategy rejected a value: {reason}"),
        }
    }
}

/// The union of the options with a weight above 0, or `None` if there is none.
///
/// # Errors
///
/// [`ConfigError::WeightsOverflow`] if the weights add up to more than `u32::MAX`
/// (proptest's union would panic).
fn weighted<T: std::fmt::Debug + 'static>(
    options: Vec<(u32, BoxedStrategy<T>)>,
    what: &'static str,
) -> Result<Option<BoxedStrategy<T>>, ConfigError> {
    let options: Vec<_> = options.into_iter().filter(|(w, _)| *w > 0).collect();
    if options
        .iter()
        .try_fold(0u32, |sum, (w, _)| sum.checked_add(*w))
        .is_none()
    {
        return Err(ConfigError::WeightsOverflow { what });
    }
    Ok((!options.is_empty()).then(|| Union::new_weighted(options).boxed()))
}

/// A deterministic proptest RNG from a 64-bit seed.
pub(crate) fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_respect_the_sizes_and_the_weights() {
        let schedules = Schedules::new()
            .steps(2..=3)
            .units(3)
            .max_reports(5)
            .max_delay(Duration::from_millis(9))
            .check_weight(0)
            .stop_weight(0)
            .update_weight(0);
        for seed in 0..200 {
            let schedule = schedules.generate(seed).unwrap();
            assert!((2..=3).contains(&schedule.len()), "{schedule}");
            for step in schedule.steps() {
                match step.at {
                    Point::Reports(n) => assert!((1..=5).contains(&n), "{schedule}"),
                    Point::Switch(unit) => assert!((1..3).contains(&unit), "{schedule}"),
                    Point::Delay(d) => assert!(d <= Duration::from_millis(9), "{schedule}"),
                    Point::Check => panic!("a check point has weight 0: {schedule}"),
                }
                assert!(
                    !matches!(step.action, Action::Stop | Action::Update(_)),
                    "{schedule}"
                );
            }
        }
        // Different seeds draw different schedules.
        let drawn: std::collections::HashSet<_> =
            (0..50).map(|s| schedules.generate(s).unwrap()).collect();
        assert!(drawn.len() > 10, "only {} distinct schedules", drawn.len());
    }

    #[test]
    fn every_generated_schedule_replays_from_its_text() {
        let schedules = Schedules::new().steps(0..=8).units(4).max_update(9);
        for seed in 0..300 {
            let schedule = schedules.generate(seed).unwrap();
            let text = schedule.to_string();
            assert_eq!(text.parse::<Schedule>().as_ref(), Ok(&schedule), "{text}");
        }
    }

    #[test]
    fn impossible_settings_are_typed_errors() {
        #[allow(clippy::reversed_empty_ranges, reason = "the point of the test")]
        let empty = Schedules::new().steps(3..=2);
        assert_eq!(
            empty.strategy().err(),
            Some(ConfigError::EmptySteps { min: 3, max: 2 })
        );
        assert_eq!(
            Schedules::new().steps(0..=usize::MAX).strategy().err(),
            Some(ConfigError::TooManySteps {
                max: usize::MAX,
                limit: MAX_STEPS
            })
        );
        assert_eq!(
            Schedules::new()
                .pause_weight(u32::MAX)
                .resume_weight(1)
                .strategy()
                .err(),
            Some(ConfigError::WeightsOverflow { what: "action" })
        );
        let no_points = Schedules::new()
            .reports_weight(0)
            .switch_weight(5) // a one-unit pipeline has no switch
            .check_weight(0)
            .delay_weight(0);
        assert_eq!(no_points.generate(1).err(), Some(ConfigError::NoPoints));
        let no_actions = Schedules::new()
            .pause_weight(0)
            .resume_weight(0)
            .stop_weight(0)
            .restart_weight(0)
            .update_weight(0);
        assert_eq!(no_actions.generate(1).err(), Some(ConfigError::NoActions));
        assert_eq!(
            Schedules::new().units(0).generate(1).err(),
            Some(ConfigError::NoUnits)
        );
        assert_eq!(
            Schedules::new().max_reports(0).generate(1).err(),
            Some(ConfigError::NoReports)
        );
    }

    #[test]
    fn a_failing_schedule_shrinks_to_the_step_that_fails() {
        // A property that fails on any schedule with a stop in it: the minimal
        // failing schedule is that one step, with its point made as simple as it gets.
        let strategy = Schedules::new().steps(1..=8).units(3).strategy().unwrap();
        let mut runner = TestRunner::new_with_rng(
            Config {
                failure_persistence: None,
                ..Config::default()
            },
            rng(3),
        );
        let result = runner.run(&strategy, |schedule| {
            if schedule.steps().iter().any(|s| s.action == Action::Stop) {
                Err(proptest::test_runner::TestCaseError::fail("a stop"))
            } else {
                Ok(())
            }
        });
        match result {
            Err(proptest::test_runner::TestError::Fail(_, minimal)) => {
                assert_eq!(minimal.to_string(), "after 1 report: stop");
            }
            other => panic!("expected a shrunk failure, got {other:?}"),
        }
    }
}
