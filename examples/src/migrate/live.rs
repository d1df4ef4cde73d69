//! Counting live runs: the measurement behind "the maximum number of live runs ever
//! observed must be 1".
//!
//! A run enters the counter as its first act and holds a [`LiveRun`] token; every
//! blocking database batch it starts holds a clone of the token. The count goes down
//! only when the last clone is dropped, so a run counts as live until its future *and*
//! any batch it started on the blocking pool are gone: exactly the "live copy that can
//! still write" the original race produced two of.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The number of live runs now, and the most ever seen at once.
#[derive(Debug, Default)]
pub struct LiveRuns {
    now: AtomicUsize,
    max: AtomicUsize,
    entered: AtomicUsize,
}

impl LiveRuns {
    /// Marks a run live until the returned token (and all its clones) are dropped.
    pub fn enter(self: &Arc<Self>) -> LiveRun {
        // SeqCst: the count is a measurement read by other threads; one total order of
        // every enter and leave makes "the maximum ever seen" a well-defined number.
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
        LiveRun {
            _token: Arc::new(Token {
                runs: Arc::clone(self),
            }),
        }
    }

    /// Live runs now.
    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    /// The most runs ever live at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// How many runs entered in all.
    pub fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

/// Held by a run, and cloned into each blocking batch it starts.
#[derive(Debug, Clone)]
pub struct LiveRun {
    _token: Arc<Token>,
}

#[derive(Debug)]
struct Token {
    runs: Arc<LiveRuns>,
}

impl Drop for Token {
    fn drop(&mut self) {
        // SeqCst: see `LiveRuns::enter`.
        self.runs.now.fetch_sub(1, Ordering::SeqCst);
    }
}
