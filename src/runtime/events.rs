//! The event stream: every change of a task, in order, with explicit lag.

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::shared::Shared;
pub use crate::lifecycle::{Change, Event};
use crate::sync::Arc;

/// How many changes a task keeps for its event streams, unless its builder says
/// otherwise ([`TaskBuilder::event_capacity`](crate::TaskBuilder::event_capacity)).
pub(crate) const DEFAULT_EVENT_CAPACITY: usize = 1024;

/// A stream of every change of one task. Made by [`Handle::events`](crate::Handle::events).
///
/// Reads the task's journal, which the lifecycle writes in the critical section of
/// each change, so the order is the lifecycle's and nothing is missing: consecutive
/// changes come with consecutive [`Change::seq`] numbers, and a reader that fell too
/// far behind gets [`Event::Lagged`]. Ends after the first terminal stage; a stream
/// made on a task that is already terminal ends at once.
#[must_use = "streams do nothing unless polled"]
pub struct Events<C: Send + Sync + 'static = ()> {
    shared: Arc<Shared<C>>,
    /// The last change this reader read (or skipped, after a lag).
    seen: u64,
    ended: bool,
    id: Option<u64>,
}

impl<C: Send + Sync + 'static> fmt::Debug for Events<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("seen", &self.seen)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<C: Send + Sync + 'static> Events<C> {
    pub(crate) fn new(shared: Arc<Shared<C>>, capacity: usize) -> Self {
        let (seen, ended) = shared.core().subscribe_changes(capacity);
        Events {
            shared,
            seen,
            ended,
            id: None,
        }
    }

    /// The next event, or `None` once the task's terminal stage has been read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is taken only when this completes.
    pub async fn next(&mut self) -> Option<Event> {
        poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl<C: Send + Sync + 'static> Stream for Events<C> {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        this.shared
            .core()
            .poll_change(&mut this.seen, &mut this.ended, &mut this.id, cx)
    }
}

impl<C: Send + Sync + 'static> Drop for Events<C> {
    fn drop(&mut self) {
        self.shared
            .core()
            .forget_reader(self.id.take(), self.seen, self.ended);
    }
}
