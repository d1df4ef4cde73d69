//! Watching the user's units: live runs counted by the kit itself, and the points
//! at which a schedule acts, held until its command has been issued.

use std::collections::HashSet;
use std::fmt;
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::pin::{pin, Pin};
use std::task::Poll;

use tokio::sync::oneshot;

use super::schedule::Point;
use crate::error::RunError;
use crate::runtime::{RunContext, RunExit, Unit};
use crate::sync::{lock, Arc, Mutex};

/// One run (or pre-start check) of one unit, as the kit names it in a failure.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId {
    /// The task, counted from 1 (a restart builds the next).
    pub task: u32,
    /// The unit's index in the pipeline.
    pub unit: usize,
    /// The unit's name.
    pub name: String,
    /// The run's generation.
    pub generation: u64,
    /// Whether it is a pre-start check rather than a run.
    pub check: bool,
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.check { "check" } else { "run" };
        write!(
            f,
            "the {what} of unit {} `{}` (task {}, generation {})",
            self.unit, self.name, self.task, self.generation
        )
    }
}

/// A point the controller waits for: held by the unit that reached it until the
/// controller has issued its command and released it.
#[derive(Debug)]
struct Armed {
    at: Point,
    /// Reports still to come, for [`Point::Reports`].
    remaining: u32,
    hit: oneshot::Sender<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct State {
    live: Vec<(u64, RunId)>,
    next: u64,
    /// The first time two were live at once.
    overlap: Option<(RunId, RunId)>,
    armed: Option<Armed>,
    /// The reports counted so far, per task: (task, reports).
    seen: Vec<(u32, u64)>,
    /// (task, unit) pairs whose first run has started.
    started: HashSet<(u32, usize)>,
}

/// What the kit knows about the runs of one schedule's tasks.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    state: Mutex<State>,
}

/// Leaves the live set when dropped: when the run's (or the check's) future is gone.
pub(crate) struct Live {
    probe: Arc<Probe>,
    key: u64,
}

impl Drop for Live {
    fn drop(&mut self) {
        lock(&self.probe.state)
            .live
            .retain(|(key, _)| *key != self.key);
    }
}

impl Probe {
    /// Counts `id` live until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>, id: RunId) -> Live {
        let mut state = lock(&self.state);
        let key = state.next;
        state.next += 1;
        if state.overlap.is_none() {
            if let Some((_, other)) = state.live.first() {
                state.overlap = Some((other.clone(), id.clone()));
            }
        }
        state.live.push((key, id));
        Live {
            probe: Arc::clone(self),
            key,
        }
    }

    /// Runs and checks alive now.
    pub(crate) fn live(&self) -> Vec<RunId> {
        lock(&self.state)
            .live
            .iter()
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// The first two runs (or checks) seen alive at once, if any.
    pub(crate) fn overlap(&self) -> Option<(RunId, RunId)> {
        lock(&self.state).overlap.clone()
    }

    /// Waits for `at`: the receiver gets the release of the unit held there.
    pub(crate) fn arm(&self, at: Point) -> oneshot::Receiver<oneshot::Sender<()>> {
        let (hit, reached) = oneshot::channel();
        let remaining = match at {
            Point::Reports(n) => n,
            _ => 0,
        };
        let replaced = lock(&self.state)
            .armed
            .replace(Armed { at, remaining, hit });
        // Dropping a hold's sender wakes its receiver: not under our lock.
        drop(replaced);
        reached
    }

    /// Gives up waiting for a point.
    pub(crate) fn disarm(&self) {
        lock(&self.state).armed = None;
    }

    /// If the armed point is `matches`, takes it and returns the hold for the unit.
    fn reach(&self, matches: impl FnOnce(&mut Armed) -> bool) -> Option<oneshot::Receiver<()>> {
        let hit = {
            let mut state = lock(&self.state);
            let reached = state.armed.as_mut().is_some_and(matches);
            if reached {
                state.armed.take().map(|a| a.hit)
            } else {
                None
            }
        }?;
        let (release, held) = oneshot::channel();
        // If the controller stopped waiting, there is nobody to hold for.
        hit.send(release).ok()?;
        Some(held)
    }

    fn first_run(&self, task: u32, unit: usize) -> bool {
        lock(&self.state).started.insert((task, unit))
    }

    /// Counts the reports `task`'s units have made since the last count (`reports`
    /// in all, from the task's progress cell); returns the hold if the armed point
    /// waits for one of them. Every report counts: two made between two polls are
    /// two, though the run is held only at the second poll.
    fn progress(&self, task: u32, reports: u64) -> Option<oneshot::Receiver<()>> {
        let new = {
            let mut state = lock(&self.state);
            let position = match state.seen.iter().position(|(t, _)| *t == task) {
                Some(position) => position,
                None => {
                    state.seen.push((task, 0));
                    state.seen.len() - 1
                }
            };
            let entry = &mut state.seen[position];
            let new = reports.saturating_sub(entry.1);
            entry.1 = reports;
            new
        };
        if new == 0 {
            return None;
        }
        let new = u32::try_from(new).unwrap_or(u32::MAX);
        self.reach(|armed| match armed.at {
            Point::Reports(_) => {
                armed.remaining = armed.remaining.saturating_sub(new);
                armed.remaining == 0
            }
            _ => false,
        })
    }
}

/// What a [`Subject`](super::Subject) builds its task with: every unit of the
/// pipeline goes through [`Watch::unit`], so that the kit sees each run.
pub struct Watch<C: Send + Sync + 'static = ()> {
    pub(crate) probe: Arc<Probe>,
    pub(crate) task: u32,
    pub(crate) watched: Arc<Mutex<usize>>,
    pub(crate) config: PhantomData<fn() -> C>,
}

impl<C: Send + Sync + 'static> fmt::Debug for Watch<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("task", &self.task)
            .field("watched", &*lock(&self.watched))
            .finish_non_exhaustive()
    }
}

impl<C: Send + Sync + 'static> Watch<C> {
    /// The task this pipeline is for, counted from 1: a restart builds task 2, and so
    /// on.
    pub fn task(&self) -> u32 {
        self.task
    }

    /// Wraps a unit so that the kit sees its runs and checks. Add the result to the
    /// task's builder in its place.
    pub fn unit<U: Unit<C>>(&self, unit: U) -> Watched<U, C> {
        *lock(&self.watched) += 1;
        Watched {
            inner: unit,
            probe: Arc::clone(&self.probe),
            task: self.task,
            config: PhantomData,
        }
    }
}

/// A user's unit as the kit runs it: the same unit, with its runs and checks counted
/// and held at the points a schedule acts. Made by [`Watch::unit`].
pub struct Watched<U, C: Send + Sync + 'static = ()> {
    inner: U,
    probe: Arc<Probe>,
    task: u32,
    config: PhantomData<fn() -> C>,
}

impl<U, C: Send + Sync + 'static> fmt::Debug for Watched<U, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl<U, C: Send + Sync + 'static> Watched<U, C> {
    fn id(&self, name: &str, ctx: &RunContext<C>, check: bool) -> RunId {
        RunId {
            task: self.task,
            unit: ctx.unit_index(),
            name: name.to_owned(),
            generation: ctx.generation(),
            check,
        }
    }
}

/// Waits on a hold, if there is one. A controller that went away releases it.
async fn held(hold: Option<oneshot::Receiver<()>>) {
    if let Some(hold) = hold {
        let _ = hold.await;
    }
}

impl<C, U> Unit<C> for Watched<U, C>
where
    C: Send + Sync + 'static,
    U: Unit<C>,
{
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&mut self, ctx: RunContext<C>) -> Result<(), RunError> {
        let id = self.id(self.inner.name(), &ctx, true);
        let _live = self.probe.enter(id);
        let probe = Arc::clone(&self.probe);
        let mut check = pin!(self.inner.prepare(ctx));
        // Poll the check once, so that it has begun, then hold it there (with its
        // result, if it is done already) for a `Check` point.
        let first = poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx))).await;
        held(probe.reach(|armed| armed.at == Point::Check)).await;
        match first {
            Poll::Ready(result) => result,
            Poll::Pending => check.await,
        }
    }

    async fn run(&mut self, ctx: RunContext<C>) -> Result<RunExit, RunError> {
        let unit = ctx.unit_index();
        let _live = self.probe.enter(self.id(self.inner.name(), &ctx, false));
        if self.probe.first_run(self.task, unit) {
            held(self.probe.reach(|armed| armed.at == Point::Switch(unit))).await;
        }
        let (probe, task, cell) = (
            Arc::clone(&self.probe),
            self.task,
            Arc::clone(&ctx.progress),
        );
        let mut run: Pin<&mut _> = pin!(self.inner.run(ctx));
        let mut hold: Option<oneshot::Receiver<()>> = None;
        poll_fn(move |cx| loop {
            if let Some(waiting) = hold.as_mut() {
                match Pin::new(waiting).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(_) => hold = None,
                }
            }
            match run.as_mut().poll(cx) {
                Poll::Ready(result) => return Poll::Ready(result),
                Poll::Pending => {
                    // Between two polls: the reports made since the last one are points
                    // a schedule can act at.
                    hold = probe.progress(task, cell.reports());
                    if hold.is_none() {
                        return Poll::Pending;
                    }
                }
            }
        })
        .await
    }

    fn apply_config(&mut self, config: &C) -> Result<(), RunError> {
        self.inner.apply_config(config)
    }

    fn close(&mut self) {
        self.inner.close();
    }
}
