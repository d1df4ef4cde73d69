//! Policies that act on tasks from outside: auto-resume with exponential backoff.
//!
//! A task paused by an error is often resumable: a network blip, a lock timeout, a
//! restarted peer. [`AutoResume`] watches a set of tasks and resumes those that a
//! *resumable* error paused, waiting longer after each failure:
//!
//! - **Which errors.** A classifier supplied by the user (`Fn(&RunError) -> bool`)
//!   decides. A failure it refuses is never auto-resumed; the task's status says
//!   since when it is blocked ([`Standing::NotResumable`]).
//! - **Never against the user.** A task the user paused, including a failed task that
//!   the user then paused, is never auto-resumed ([`Standing::UserPaused`]). The
//!   policy reads the lifecycle's user-paused mark, never the error's text.
//! - **Backoff.** Per task: 1 s, 2 s, 4 s … up to 5 min by default ([`Backoff`],
//!   [`BackoffSettings`]), with equal jitter (half of each delay fixed, half random).
//!   Each auto-resume steps the backoff up, so a task that fails again right after a
//!   resume waits longer; each healthy period (5 min Running by default) steps it
//!   back down by one.
//! - **Forgetting.** A task that is stopped, finished or removed loses all its policy
//!   state.
//! - **Observable.** [`AutoResume::status`] gives each task's [`Status`]: when the
//!   next auto-resume is due, and why a paused task is skipped.
//!
//! Invalid settings are refused when they are built, with a
//! [`PolicySettingsError`] naming the setting and the value.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use taskstage::policy::{AutoResume, BackoffSettings, Standing};
//! use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
//!
//! /// Its first two runs fail with a network blip; then it works until cancelled.
//! struct Flaky(u32);
//!
//! impl Unit for Flaky {
//!     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
//!         self.0 += 1;
//!         if self.0 <= 2 {
//!             return Err(RunError::new(std::io::Error::from(std::io::ErrorKind::TimedOut)));
//!         }
//!         ctx.cancelled().await;
//!         Ok(RunExit::Cancelled)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = BackoffSettings::new(Duration::from_secs(1), Duration::from_secs(60), 2.0)?
//!     .with_healthy_period(Duration::from_secs(600))?;
//! let policy = AutoResume::new(settings, |error: &RunError| {
//!     error.get_ref().downcast_ref::<std::io::Error>().is_some()
//! });
//! tokio::spawn(policy.run());
//!
//! let task = Task::builder("sync").unit(Flaky(0)).spawn_paused()?;
//! let id = policy.add(&task);
//! let started = tokio::time::Instant::now();
//! task.resume().await?;
//!
//! // Fails at 0 s, resumed at ~1 s, fails, resumed at ~2 s later: running by 3 s.
//! task.wait_for(|s| s.stage == Stage::Running && s.generation == 3).await;
//! assert!(started.elapsed() <= Duration::from_secs(3));
//! let status = policy
//!     .wait_for(id, |s| s.is_some_and(|s| matches!(s.standing, Standing::Healthy { .. })))
//!     .await
//!     .expect("watched");
//! assert_eq!((status.auto_resumes, status.step), (2, 2));
//! assert!(status.rollback_due.is_some()); // one step back after 10 healthy minutes
//! # Ok(())
//! # }
//! ```

mod auto_resume;
mod backoff;

pub use self::auto_resume::{AutoResume, AutoResumeObserver, Dispatch, Key, Standing, Status};
pub use self::backoff::{Backoff, BackoffSettings, Jitter, PolicySettingsError, Setting};
