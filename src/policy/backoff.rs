//! Exponential backoff with equal jitter: pure, clock-free, seedable.

use std::fmt;
use std::time::Duration;

/// One of the settings of a [`BackoffSettings`], as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// The delay of the first auto-resume.
    Min,
    /// The longest delay.
    Max,
    /// What each auto-resume multiplies the delay by.
    Factor,
    /// How long a task must stay healthy before one backoff step is rolled back.
    HealthyPeriod,
}

impl Setting {
    /// The setting's name, as printed.
    pub const fn name(self) -> &'static str {
        match self {
            Setting::Min => "backoff minimum",
            Setting::Max => "backoff maximum",
            Setting::Factor => "backoff factor",
            Setting::HealthyPeriod => "healthy period",
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a set of backoff settings was refused.
///
/// Every variant names the setting and the value it was given.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicySettingsError {
    /// The minimum delay is longer than the maximum.
    #[error("backoff minimum {min:?} is above the backoff maximum {max:?}")]
    MinAboveMax {
        /// The minimum given.
        min: Duration,
        /// The maximum given.
        max: Duration,
    },
    /// The factor is below 1: the delay would shrink with every failure.
    #[error("backoff factor {factor} is below 1")]
    FactorBelowOne {
        /// The factor given.
        factor: f64,
    },
    /// The factor is not a finite number.
    #[error("backoff factor {factor} is not a finite number")]
    FactorNotFinite {
        /// The factor given.
        factor: f64,
    },
    /// A duration that must be positive is zero.
    #[error("{setting} is zero; it must be longer than zero")]
    Zero {
        /// Which setting is zero.
        setting: Setting,
    },
}

/// Whether and how a delay is randomised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// Equal jitter (the default): half of the delay is fixed, the other half is drawn
    /// uniformly, so a delay of `d` becomes a value in `[d/2, d]`. Tasks that failed
    /// together do not all come back at the same instant, and no delay is shorter
    /// than half its step.
    #[default]
    Equal,
    /// No jitter: the delay is exactly the step's delay.
    None,
}

/// Validated backoff settings for the auto-resume policy.
///
/// The defaults are those of [`BackoffSettings::default`]: 1 s minimum, 5 min maximum,
/// factor 2, equal jitter, and a 5 min healthy period after which one step is rolled
/// back.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskstage::policy::{BackoffSettings, Jitter, PolicySettingsError, Setting};
///
/// let settings = BackoffSettings::new(Duration::from_millis(200), Duration::from_secs(60), 3.0)?
///     .with_healthy_period(Duration::from_secs(120))?
///     .with_jitter(Jitter::None);
/// assert_eq!(settings.min(), Duration::from_millis(200));
///
/// let err = BackoffSettings::new(Duration::from_secs(10), Duration::from_secs(1), 2.0).unwrap_err();
/// assert_eq!(
///     err,
///     PolicySettingsError::MinAboveMax { min: Duration::from_secs(10), max: Duration::from_secs(1) }
/// );
/// assert_eq!(
///     BackoffSettings::default().with_healthy_period(Duration::ZERO).unwrap_err(),
///     PolicySettingsError::Zero { setting: Setting::HealthyPeriod }
/// );
/// # Ok::<(), PolicySettingsError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffSettings {
    min: Duration,
    max: Duration,
    factor: f64,
    healthy_period: Duration,
    jitter: Jitter,
}

impl BackoffSettings {
    /// The default delay of the first auto-resume: 1 s.
    pub const DEFAULT_MIN: Duration = Duration::from_secs(1);
    /// The default longest delay: 5 min.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(5 * 60);
    /// The default factor: each auto-resume doubles the delay.
    pub const DEFAULT_FACTOR: f64 = 2.0;
    /// The default time a task must stay healthy before one step is rolled back: 5 min.
    pub const DEFAULT_HEALTHY_PERIOD: Duration = Duration::from_secs(5 * 60);

    /// Settings with the given delays and factor, the default healthy period and
    /// equal jitter.
    ///
    /// # Errors
    ///
    /// - [`PolicySettingsError::Zero`] if `min` is zero (the delay would never grow);
    /// - [`PolicySettingsError::MinAboveMax`] if `min` is longer than `max`;
    /// - [`PolicySettingsError::FactorBelowOne`] if `factor` is below 1;
    /// - [`PolicySettingsError::FactorNotFinite`] if `factor` is NaN or infinite.
    pub fn new(min: Duration, max: Duration, factor: f64) -> Result<Self, PolicySettingsError> {
        if min.is_zero() {
            return Err(PolicySettingsError::Zero {
                setting: Setting::Min,
            });
        }
        if min > max {
            return Err(PolicySettingsError::MinAboveMax { min, max });
        }
        if !factor.is_finite() {
            return Err(PolicySettingsError::FactorNotFinite { factor });
        }
        if factor < 1.0 {
            return Err(PolicySettingsError::FactorBelowOne { factor });
        }
        Ok(BackoffSettings {
            min,
            max,
            factor,
            healthy_period: Self::DEFAULT_HEALTHY_PERIOD,
            jitter: Jitter::Equal,
        })
    }

    /// The same settings with another healthy period: how long a task must stay
    /// healthy (Running) before one backoff step is rolled back.
    ///
    /// # Errors
    ///
    /// [`PolicySettingsError::Zero`] if `period` is zero.
    pub fn with_healthy_period(mut self, period: Duration) -> Result<Self, PolicySettingsError> {
        if period.is_zero() {
            return Err(PolicySettingsError::Zero {
                setting: Setting::HealthyPeriod,
            });
        }
        self.healthy_period = period;
        Ok(self)
    }

    /// The same settings with another jitter.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay of the first auto-resume (before jitter).
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest delay (before jitter).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// What each auto-resume multiplies the delay by.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// How long a task must stay healthy before one step is rolled back.
    pub fn healthy_period(&self) -> Duration {
        self.healthy_period
    }

    /// How delays are randomised.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The delay of `step` before jitter: `min × factor^step`, capped at `max`.
    pub fn delay_at(&self, step: u32) -> Duration {
        // An integral factor (the usual 2) is computed exactly in integers, in u128
        // nanoseconds (a power past u32 is still below the cap when the minimum is
        // small); any other factor through floating point, rounded to the nanosecond.
        let exact = if self.factor.fract() == 0.0 && self.factor <= f64::from(u32::MAX) {
            // Lossless: the factor is integral, at least 1 and within u32 (checked
            // above and at construction).
            let factor = u128::from(self.factor as u32);
            factor
                .checked_pow(step)
                .and_then(|scale| self.min.as_nanos().checked_mul(scale))
                .filter(|nanos| *nanos < self.max.as_nanos())
                .map(nanos_to_duration_exact)
        } else {
            let nanos = self.min.as_nanos() as f64 * self.factor.powf(f64::from(step));
            (nanos.is_finite() && nanos < self.max.as_nanos() as f64)
                .then(|| nanos_to_duration(nanos.round()))
        };
        match exact {
            Some(delay) if delay < self.max => delay,
            _ => self.max,
        }
    }
}

/// A count of nanoseconds below `Duration::MAX`'s, as a duration.
fn nanos_to_duration_exact(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    // Lossless: below `Duration::MAX` the seconds fit in u64, the rest in u32.
    Duration::new(
        (nanos / NANOS_PER_SEC) as u64,
        (nanos % NANOS_PER_SEC) as u32,
    )
}

/// A finite, non-negative count of nanoseconds below `Duration::MAX`, as a duration.
fn nanos_to_duration(nanos: f64) -> Duration {
    if nanos < u64::MAX as f64 {
        // In range (checked above); `as` saturates anyway.
        Duration::from_nanos(nanos as u64)
    } else {
        Duration::from_secs_f64(nanos / 1e9)
    }
}

impl Default for BackoffSettings {
    /// 1 s minimum, 5 min maximum, factor 2, equal jitter, 5 min healthy period.
    fn default() -> Self {
        BackoffSettings {
            min: Self::DEFAULT_MIN,
            max: Self::DEFAULT_MAX,
            factor: Self::DEFAULT_FACTOR,
            healthy_period: Self::DEFAULT_HEALTHY_PERIOD,
            jitter: Jitter::Equal,
        }
    }
}

/// The backoff of one task: a step counter over [`BackoffSettings`], with the jitter
/// drawn from its own seedable random generator.
///
/// Step 0 waits [`BackoffSettings::min`]; every [`advance`](Backoff::advance) (one per
/// auto-resume) multiplies the delay by the factor, up to the maximum; every
/// [`rollback`](Backoff::rollback) (one per healthy period) divides it again. The step
/// stops growing once the delay has reached the maximum, so a rollback always shortens
/// the next delay (unless the minimum is the maximum).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use taskstage::policy::{Backoff, BackoffSettings};
///
/// let mut backoff = Backoff::with_seed(BackoffSettings::default(), 7);
/// for secs in [1, 2, 4, 8] {
///     assert_eq!(backoff.current(), Duration::from_secs(secs));
///     let delay = backoff.next_delay(); // draws the jitter, then steps up
///     assert!(delay >= Duration::from_secs(secs) / 2 && delay <= Duration::from_secs(secs));
/// }
/// backoff.rollback();
/// assert_eq!(backoff.current(), Duration::from_secs(8));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    settings: BackoffSettings,
    step: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff at step 0, with a randomly seeded jitter.
    pub fn new(settings: BackoffSettings) -> Self {
        Backoff::with_rng(settings, fastrand::Rng::new())
    }

    /// A backoff at step 0 whose jitter is drawn from a generator seeded with `seed`:
    /// the same seed gives the same delays.
    pub fn with_seed(settings: BackoffSettings, seed: u64) -> Self {
        Backoff::with_rng(settings, fastrand::Rng::with_seed(seed))
    }

    /// A backoff at step 0 whose jitter is drawn from `rng`.
    pub fn with_rng(settings: BackoffSettings, rng: fastrand::Rng) -> Self {
        Backoff {
            settings,
            step: 0,
            rng,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &BackoffSettings {
        &self.settings
    }

    /// How many steps the backoff has grown: 0 until the first advance.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// The current step's delay, before jitter.
    pub fn current(&self) -> Duration {
        self.settings.delay_at(self.step)
    }

    /// The current step's delay with the jitter applied (this draws from the
    /// generator). Does not change the step.
    pub fn delay(&mut self) -> Duration {
        let base = self.current();
        match self.settings.jitter {
            Jitter::None => base,
            Jitter::Equal => {
                let fixed = base / 2;
                let spread = base - fixed;
                // A spread beyond u64 nanoseconds (585 years) is drawn within u64.
                let spread = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
                fixed + Duration::from_nanos(self.rng.u64(0..=spread))
            }
        }
    }

    /// Steps up: the next delay is `factor` times longer, up to the maximum. Once the
    /// maximum is reached the step no longer grows.
    pub fn advance(&mut self) {
        if self.current() < self.settings.max {
            self.step += 1;
        }
    }

    /// The current delay with jitter ([`Backoff::delay`]), then one step up
    /// ([`Backoff::advance`]).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.delay();
        self.advance();
        delay
    }

    /// Steps one step back, not below step 0. Returns whether the step changed.
    pub fn rollback(&mut self) -> bool {
        if self.step == 0 {
            return false;
        }
        self.step -= 1;
        true
    }

    /// Back to step 0.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}
