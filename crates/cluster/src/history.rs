//! Noticing a store whose history was replaced (every member restored from a
//! backup).
//!
//! etcd serves every read and transaction linearizably: an answer to a call sent
//! after another answer arrived is never at a lower revision. A store restored from
//! a snapshot without a revision bump (etcd 3.4's `snapshot restore`) breaks that:
//! its revision goes back to the snapshot's. [`Checked`] wraps a coordinator and
//! compares the revision of every answer (a listing, a transaction, a keep-alive)
//! with the highest revision seen before the call was sent; one below it means the
//! history was replaced. The worker's cache notices the other kind of restore (a
//! revision bump) by a key whose last write went back (`view.rs`).
//!
//! Cost: one atomic read before each call and one atomic max after it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::coord::{
    next_message, watch_channel, BoxFuture, Coordinator, Grant, KeepAlive, Listing, Txn, TxnResult,
    WatchMessage, WatchStream,
};
use super::error::ClusterError;

/// When and how a replaced history was noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replaced {
    /// The call (or the cache) that noticed it.
    pub(crate) op: &'static str,
    /// The highest revision seen before.
    pub(crate) seen: i64,
    /// The revision of the answer that went back.
    pub(crate) found: i64,
    /// When it was noticed, on tokio's clock.
    pub(crate) at: tokio::time::Instant,
}

impl Replaced {
    pub(crate) fn error(&self) -> ClusterError {
        ClusterError::HistoryReplaced {
            op: self.op,
            seen: self.seen,
            found: self.found,
        }
    }
}

type Hook = Box<dyn Fn(Replaced) + Send + Sync>;

/// The highest revision a user of the store has seen, and whether its history was
/// found replaced.
pub(crate) struct History {
    high: AtomicI64,
    replaced: Mutex<Option<Replaced>>,
    /// Called once, when the history is first found replaced.
    hook: OnceLock<Hook>,
    /// Whether every call fails once the history was found replaced (a worker's:
    /// nothing it cached may be trusted, and it ends), or only the call that found
    /// it (a controller's: the next command reads the new history).
    sticky: bool,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("high", &self.high())
            .field("replaced", &self.replaced())
            .field("sticky", &self.sticky)
            .finish_non_exhaustive()
    }
}

impl History {
    pub(crate) fn new(sticky: bool) -> Arc<History> {
        Arc::new(History {
            high: AtomicI64::new(0),
            replaced: Mutex::new(None),
            hook: OnceLock::new(),
            sticky,
        })
    }

    /// Sets what to do when the history is found replaced (once; later calls are
    /// ignored).
    pub(crate) fn on_replaced(&self, hook: impl Fn(Replaced) + Send + Sync + 'static) {
        let _ = self.hook.set(Box::new(hook));
    }

    /// The highest revision seen.
    pub(crate) fn high(&self) -> i64 {
        // SeqCst: one counter read and raised from several connections' tasks; its
        // order with the calls it brackets is what the check relies on.
        self.high.load(Ordering::SeqCst)
    }

    /// Records a revision the store has reached.
    pub(crate) fn saw(&self, revision: i64) {
        self.high.fetch_max(revision, Ordering::SeqCst);
    }

    /// How the history was found replaced, if it was.
    pub(crate) fn replaced(&self) -> Option<Replaced> {
        *self.replaced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks an answer at `found`, to a call sent when `floor` was the highest
    /// revision seen.
    pub(crate) fn check(
        &self,
        op: &'static str,
        floor: i64,
        found: i64,
    ) -> Result<(), ClusterError> {
        if found <= 0 {
            // Not known: nothing to check.
            return Ok(());
        }
        if found < floor {
            return Err(self.replace(op, floor, found));
        }
        self.saw(found);
        Ok(())
    }

    /// Records that the history was found replaced (the first finding is kept) and
    /// returns the error to answer with.
    pub(crate) fn replace(&self, op: &'static str, seen: i64, found: i64) -> ClusterError {
        let replaced = Replaced {
            op,
            seen,
            found,
            at: tokio::time::Instant::now(),
        };
        let first = {
            let mut slot = self.replaced.lock().unwrap_or_else(PoisonError::into_inner);
            match *slot {
                Some(earlier) if self.sticky => return earlier.error(),
                _ => {
                    let first = slot.is_none();
                    *slot = Some(replaced);
                    first
                }
            }
        };
        if !self.sticky {
            // The next call reads the new history.
            self.high.store(found, Ordering::SeqCst);
        }
        tracing::error!(
            op,
            seen,
            found,
            "the store's revision went back: its history was replaced (restored from a backup?)"
        );
        if first {
            if let Some(hook) = self.hook.get() {
                hook(replaced);
            }
        }
        replaced.error()
    }

    /// The error every call answers once a sticky history was found replaced.
    fn refused(&self) -> Result<(), ClusterError> {
        match self.replaced() {
            Some(replaced) if self.sticky => Err(replaced.error()),
            _ => Ok(()),
        }
    }
}

/// A coordinator whose answers are checked against a [`History`].
pub(crate) struct Checked {
    store: Arc<dyn Coordinator>,
    history: Arc<History>,
}

impl Checked {
    pub(crate) fn new(store: Arc<dyn Coordinator>, history: Arc<History>) -> Checked {
        Checked { store, history }
    }
}

impl Coordinator for Checked {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        self.store.grant(ttl)
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            self.history.refused()?;
            let floor = self.history.high();
            let answer = self.store.keep_alive(lease).await?;
            if let KeepAlive::Alive { revision, .. } = answer {
                self.history.check("keep-alive", floor, revision)?;
            }
            Ok(answer)
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        self.store.revoke(lease)
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            self.history.refused()?;
            let floor = self.history.high();
            let listing = self.store.list(prefix).await?;
            self.history.check("list", floor, listing.revision)?;
            Ok(listing)
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            self.history.refused()?;
            let floor = self.history.high();
            let result = self.store.txn(txn).await?;
            self.history.check("txn", floor, result.revision)?;
            Ok(result)
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            self.history.refused()?;
            let mut inner = self.store.watch(prefix, from).await?;
            // A watch's messages may come from a member that lags behind a
            // linearizable answer: they raise what was seen, never check it.
            let (tx, stream) = watch_channel(16);
            let history = Arc::clone(&self.history);
            tokio::spawn(async move {
                // Bounded by the watch: ends when it ends or nobody listens.
                while let Some(message) = next_message(&mut inner).await {
                    if let Ok(WatchMessage::Events { revision, .. }) = &message {
                        history.saw(*revision);
                    }
                    if tx.send(message).await.is_err() {
                        return;
                    }
                }
            });
            Ok(stream)
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        self.store.wait_change(prefix, after, timeout)
    }

    fn fresh_connection(&self) -> Option<Arc<dyn Coordinator>> {
        let fresh = self.store.fresh_connection()?;
        Some(Arc::new(Checked::new(fresh, Arc::clone(&self.history))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_below_what_was_seen_is_a_replaced_history() {
        let history = History::new(true);
        assert_eq!(history.check("list", 0, 10), Ok(()));
        assert_eq!(history.high(), 10);
        assert_eq!(history.check("txn", 10, 12), Ok(()));
        assert_eq!(
            history.check("txn", 12, 12),
            Ok(()),
            "a read at the same revision"
        );
        let error = history.check("list", 12, 7);
        assert_eq!(
            error,
            Err(ClusterError::HistoryReplaced {
                op: "list",
                seen: 12,
                found: 7
            })
        );
        assert!(history.refused().is_err(), "sticky: every later call fails");
    }

    #[test]
    fn a_not_sticky_history_answers_once_then_reads_the_new_one() {
        let history = History::new(false);
        history.saw(50);
        assert!(history.check("list", 50, 20).is_err());
        assert_eq!(history.high(), 20);
        assert_eq!(history.refused(), Ok(()));
        assert_eq!(history.check("list", 20, 21), Ok(()));
    }

    #[test]
    fn the_hook_runs_once() {
        let history = History::new(true);
        let calls = Arc::new(AtomicI64::new(0));
        let counted = Arc::clone(&calls);
        history.on_replaced(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        history.saw(9);
        let _ = history.check("list", 9, 3);
        let _ = history.check("txn", 9, 4);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            history.replaced().map(|r| r.found),
            Some(3),
            "the first finding"
        );
    }
}
