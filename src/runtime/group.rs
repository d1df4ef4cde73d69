//! Many tasks commanded as one: pause all, stop all, with one deadline and a report.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::time::Instant;

use super::events::{Event, Events};
use super::handle::{Handle, Settling};
use crate::error::Error;
use crate::stage::Stage;

/// In which order [`TaskGroup::stop_all`] stops its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StopOrder {
    /// Every stop is issued at once, and all are awaited together.
    #[default]
    AllAtOnce,
    /// One at a time, the last added first, each awaited before the next is issued:
    /// for pipelines whose downstream tasks must stop before their upstream.
    ReverseOfAddition,
}

/// A group of tasks, commanded together.
///
/// It holds a [`Handle`] of each task, so dropping the group stops every task whose
/// last handle it held, as dropping those handles would.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// # use taskstage::{RunContext, RunError, RunExit, Stage, Task, Unit};
/// use taskstage::{StopOrder, TaskGroup};
/// # struct Wait;
/// # impl Unit for Wait {
/// #     async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
/// #         ctx.cancelled().await;
/// #         Ok(RunExit::Cancelled)
/// #     }
/// # }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut group = TaskGroup::new();
/// for name in ["extract", "load"] {
///     group.add(Task::builder(name).unit(Wait).spawn().unwrap());
/// }
/// let report = group.stop_all(Duration::from_secs(5), StopOrder::ReverseOfAddition).await;
/// assert!(report.all_reached(Stage::Stopped), "{report}");
/// # }
/// ```
#[must_use = "dropping the group stops every task whose last handle it holds"]
pub struct TaskGroup<C: Send + Sync + 'static = ()> {
    tasks: Vec<Handle<C>>,
}

impl<C: Send + Sync + 'static> Default for TaskGroup<C> {
    fn default() -> Self {
        TaskGroup { tasks: Vec::new() }
    }
}

impl<C: Send + Sync + 'static> fmt::Debug for TaskGroup<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.tasks).finish()
    }
}

/// What one task of a group reached.
#[derive(Debug, Clone)]
pub struct TaskReport {
    /// The task's place in the group (the order of addition).
    pub index: usize,
    /// The task's name.
    pub name: String,
    /// The stage the command settled in, or why it did not (refused, or timed out).
    pub result: Result<Stage, Error>,
    /// Set when the task did not settle by the deadline.
    pub stuck: Option<Stuck>,
}

/// A task that had not settled by the deadline.
#[derive(Debug, Clone)]
pub struct Stuck {
    /// The task's name.
    pub task: std::sync::Arc<str>,
    /// The unit it is stuck in, as (index, name).
    pub unit: Option<(usize, std::sync::Arc<str>)>,
    /// The stage it is stuck in.
    pub stage: Stage,
    /// How long since its command was issued.
    pub waited: Duration,
}

/// What a group command reached, task by task.
#[derive(Debug, Clone)]
#[must_use = "a group command's report is where refusals and stuck tasks are told"]
pub struct GroupReport {
    /// One entry per task, in the order of addition.
    pub tasks: Vec<TaskReport>,
}

impl GroupReport {
    /// The tasks that had not settled by the deadline.
    pub fn stuck(&self) -> impl Iterator<Item = &Stuck> {
        self.tasks.iter().filter_map(|t| t.stuck.as_ref())
    }

    /// Whether every task settled in `stage`.
    pub fn all_reached(&self, stage: Stage) -> bool {
        self.tasks
            .iter()
            .all(|t| matches!(t.result, Ok(s) if s == stage))
    }
}

impl fmt::Display for GroupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for task in &self.tasks {
            match (&task.result, &task.stuck) {
                (_, Some(stuck)) => {
                    let unit = stuck.unit.as_ref().map_or("-", |(_, name)| &**name);
                    writeln!(
                        f,
                        "{}: stuck in {} (unit {unit}) for {:?}",
                        task.name, stuck.stage, stuck.waited
                    )?;
                }
                (Ok(stage), None) => writeln!(f, "{}: {stage}", task.name)?,
                (Err(error), None) => writeln!(f, "{}: {error}", task.name)?,
            }
        }
        Ok(())
    }
}

impl<C: Send + Sync + 'static> TaskGroup<C> {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a task: a [`Handle`], or a typed owner ([`Task<S>`](crate::Task),
    /// [`AnyTask`](crate::typestate::AnyTask)), whose handle the group keeps.
    pub fn add(&mut self, task: impl Into<Handle<C>>) {
        self.tasks.push(task.into());
    }

    /// How many tasks the group holds.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the group holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Takes the task at `index` (its place in the order of addition) out of the
    /// group and gives its handle back, or `None` if there is no such task. The tasks
    /// after it move up one place, as in [`Vec::remove`]. Dropping the returned
    /// handle stops the task if it was the last one.
    pub fn remove(&mut self, index: usize) -> Option<Handle<C>> {
        (index < self.tasks.len()).then(|| self.tasks.remove(index))
    }

    /// Drops every task that has ended (Stopped or Finished), and returns how many:
    /// a group is not a log, and a long-lived one should call this from time to time
    /// so that ended tasks do not pile up. The remaining tasks keep their order.
    /// Dropping an ended task's handle stops nothing.
    pub fn remove_ended(&mut self) -> usize {
        let before = self.tasks.len();
        self.tasks.retain(|task| !task.stage().is_terminal());
        before - self.tasks.len()
    }

    /// The tasks, in the order of addition.
    pub fn tasks(&self) -> &[Handle<C>] {
        &self.tasks
    }

    /// Pauses every task: issues every pause first, then waits for all of them
    /// together, until `deadline` from now at most.
    ///
    /// # Cancel safety
    ///
    /// The pauses are issued at the first poll and stand if the future is dropped.
    pub async fn pause_all(&self, deadline: Duration) -> GroupReport {
        let started = Instant::now();
        let issued: Vec<_> = self
            .tasks
            .iter()
            .map(|task| task.pause_now_within(deadline))
            .collect();
        self.settle_all(issued, started).await
    }

    /// Resumes every task, each as [`Handle::resume_within`]: a task whose pause is
    /// still settling (Pausing, e.g. after a pause that was dropped or timed out) is
    /// resumed once it settles, within `deadline` from now. Tasks in New or Paused
    /// are resumed at once; the others are refused, each with its reason.
    ///
    /// Each task's result is the stage right after its resume was accepted
    /// (Resuming or Running), or why it was not (refused, or timed out while still
    /// Pausing: named in [`GroupReport::stuck`]).
    ///
    /// # Cancel safety
    ///
    /// The resumes issued before the future is dropped stand; those still waiting
    /// for their pause to settle are not issued.
    pub async fn resume_all(&self, deadline: Duration) -> GroupReport {
        let started = Instant::now();
        let issued: Vec<_> = self
            .tasks
            .iter()
            .map(|task| {
                let task = task.clone();
                Ok(Settling::new(async move {
                    task.resume_within(deadline).await.map(|()| task.stage())
                }))
            })
            .collect();
        self.settle_all(issued, started).await
    }

    /// Waits until every task's stage satisfies `predicate`, within `deadline` from
    /// now: e.g. that every task is at rest before a shutdown goes on
    /// (`group.wait_all(Stage::is_at_rest, deadline)`).
    ///
    /// Each task's result is the stage it was seen in: the first that satisfied the
    /// predicate, or, for a task that did not reach one by the deadline, the stage it
    /// was in then, with the task named in [`GroupReport::stuck`]. It issues no
    /// command.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn wait_all<P>(&self, predicate: P, deadline: Duration) -> GroupReport
    where
        P: Fn(Stage) -> bool + Clone + Send + 'static,
    {
        let started = Instant::now();
        let end = started + deadline;
        let issued: Vec<_> = self
            .tasks
            .iter()
            .map(|task| {
                let task = task.clone();
                let predicate = predicate.clone();
                Ok(Settling::new(async move {
                    let reached = tokio::time::timeout_at(end, task.wait_for_stage(predicate));
                    Ok(match reached.await {
                        Ok(snapshot) => snapshot.stage,
                        Err(_) => task.stage(),
                    })
                }))
            })
            .collect();
        let mut report = self.settle_all(issued, started).await;
        for (entry, task) in report.tasks.iter_mut().zip(&self.tasks) {
            if matches!(entry.result, Ok(stage) if !predicate(stage)) {
                let snapshot = task.snapshot();
                entry.stuck = Some(Stuck {
                    task: snapshot.name,
                    unit: snapshot.unit,
                    stage: snapshot.stage,
                    waited: started.elapsed(),
                });
            }
        }
        report
    }

    /// Stops every task within `deadline`, in `order`. A run that ignores its
    /// cancellation is aborted halfway to the deadline (each task's share of it, in
    /// [`StopOrder::ReverseOfAddition`]).
    ///
    /// # Cancel safety
    ///
    /// The stops issued before the future is dropped stand; the escalation to abort
    /// needs the future to be polled.
    pub async fn stop_all(&self, deadline: Duration, order: StopOrder) -> GroupReport {
        let started = Instant::now();
        match order {
            StopOrder::AllAtOnce => {
                let issued: Vec<_> = self
                    .tasks
                    .iter()
                    .map(|task| task.stop_now_within(deadline / 2))
                    .collect();
                self.settle_all(issued, started).await
            }
            StopOrder::ReverseOfAddition => {
                let end = started + deadline;
                let mut results: Vec<Option<Result<Stage, Error>>> = vec![None; self.tasks.len()];
                for (index, task) in self.tasks.iter().enumerate().rev() {
                    let left = end.saturating_duration_since(Instant::now());
                    let result = match task.stop_now_within(left / 2) {
                        Ok(settling) => settling.await,
                        Err(error) => Err(error),
                    };
                    results[index] = Some(result);
                }
                self.report(results, started)
            }
        }
    }

    /// Every change of every task from now on, merged: each item names the task by
    /// its place in the group. Ends when every task's stream has ended.
    pub fn events(&self) -> GroupEvents<C> {
        GroupEvents {
            streams: self.tasks.iter().map(|t| Some(t.events())).collect(),
            next: 0,
        }
    }

    async fn settle_all(
        &self,
        issued: Vec<Result<Settling, Error>>,
        started: Instant,
    ) -> GroupReport {
        let mut waits: Vec<Option<Settling>> = Vec::with_capacity(issued.len());
        let mut results: Vec<Option<Result<Stage, Error>>> = Vec::with_capacity(issued.len());
        for command in issued {
            match command {
                Ok(settling) => {
                    waits.push(Some(settling));
                    results.push(None);
                }
                Err(error) => {
                    waits.push(None);
                    results.push(Some(Err(error)));
                }
            }
        }
        // Every wait is polled together; each ends on its own deadline.
        poll_fn(|cx| {
            let mut pending = false;
            for (wait, result) in waits.iter_mut().zip(results.iter_mut()) {
                if let Some(settling) = wait {
                    match Pin::new(settling).poll(cx) {
                        Poll::Ready(done) => {
                            *result = Some(done);
                            *wait = None;
                        }
                        Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        self.report(results, started)
    }

    fn report(&self, results: Vec<Option<Result<Stage, Error>>>, started: Instant) -> GroupReport {
        let tasks = self
            .tasks
            .iter()
            .zip(results)
            .enumerate()
            .map(|(index, (task, result))| {
                let result = result.unwrap_or_else(|| Ok(task.stage()));
                let stuck = matches!(result, Err(Error::Timeout { .. })).then(|| {
                    let snapshot = task.snapshot();
                    Stuck {
                        task: snapshot.name,
                        unit: snapshot.unit,
                        stage: snapshot.stage,
                        waited: started.elapsed(),
                    }
                });
                TaskReport {
                    index,
                    name: task.name().to_owned(),
                    result,
                    stuck,
                }
            })
            .collect();
        GroupReport { tasks }
    }
}

/// The merged event stream of a [`TaskGroup`]: `(index in the group, event)`.
#[must_use = "streams do nothing unless polled"]
pub struct GroupEvents<C: Send + Sync + 'static = ()> {
    streams: Vec<Option<Events<C>>>,
    /// Where the next poll starts, so that no task's events starve the others.
    next: usize,
}

impl<C: Send + Sync + 'static> fmt::Debug for GroupEvents<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupEvents")
            .field("open", &self.streams.iter().filter(|s| s.is_some()).count())
            .finish()
    }
}

impl<C: Send + Sync + 'static> GroupEvents<C> {
    /// The next event of any task, or `None` once every task's stream has ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is taken only when this completes.
    pub async fn next(&mut self) -> Option<(usize, Event)> {
        poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl<C: Send + Sync + 'static> Stream for GroupEvents<C> {
    type Item = (usize, Event);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<(usize, Event)>> {
        let this = self.get_mut();
        let count = this.streams.len();
        let mut open = false;
        for step in 0..count {
            let index = (this.next + step) % count;
            let Some(stream) = &mut this.streams[index] else {
                continue;
            };
            match Pin::new(stream).poll_next(cx) {
                Poll::Ready(Some(event)) => {
                    this.next = (index + 1) % count;
                    return Poll::Ready(Some((index, event)));
                }
                Poll::Ready(None) => this.streams[index] = None,
                Poll::Pending => open = true,
            }
        }
        if open {
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    }
}
