//! A store that takes a worker's fences away: the control of the fault suites.
//!
//! A worker keeps "at most one live run" with two fences: it stops its runs before
//! its lease may have ended (self-fencing, from the TTL the store granted), and its
//! owner's writes carry compares on its owner key, which the store rejects once
//! another worker holds the key. The fault suites show that their history checker
//! catches what those fences prevent by running workers on an [`Unfenced`] store,
//! which lies to its worker about both, while the real store goes on as it would:
//!
//! - **the lease never ends for the worker**: a grant asks the store for the real
//!   TTL and answers the worker with the TTL it asked for (a long one, see
//!   [`BELIEVED_TTL`]); the wrapper keeps the real lease alive itself, every third of
//!   the real TTL, so the lease still ends in the store when the process is frozen
//!   or cut off, and another worker takes its tasks over; every keep-alive of the
//!   worker is answered alive;
//! - **a task once claimed stays the worker's**: the owner keys it claimed read as
//!   its own (in a listing and in a watch), whoever holds them now;
//! - **its owner's writes carry no compare**: a transaction's compares on an owner
//!   key the worker claimed are dropped, unless the transaction writes that key
//!   itself (a release, a hand-over), so that a stale owner's writes are applied.
//!
//! It knows the keys by the layout the protocol documents (`{prefix}/tasks/{task}/owner`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use taskstage_cluster::{
    BoxFuture, ClusterError, Compare, Coordinator, Grant, KeepAlive, KeyValue, Listing, Op, Txn,
    TxnResult, WatchEvent, WatchMessage, WatchStream,
};

/// The TTL an unfenced worker is built with, and believes it holds: far longer than
/// any test, so that it never stops a run for its lease's sake.
pub const BELIEVED_TTL: Duration = Duration::from_secs(3600);

/// A store wrapper that takes its worker's fences away (see the module docs).
pub struct Unfenced {
    store: Arc<dyn Coordinator>,
    state: Arc<State>,
}

struct State {
    /// The TTL the real store grants.
    real_ttl: Duration,
    /// The owner keys the worker claimed, as it wrote them.
    claimed: Mutex<HashMap<String, KeyValue>>,
}

impl State {
    fn claimed(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyValue>> {
        self.claimed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Unfenced {
    /// Wraps `store`, whose leases are granted with `real_ttl`.
    pub fn new(store: Arc<dyn Coordinator>, real_ttl: Duration) -> Self {
        Unfenced {
            store,
            state: Arc::new(State {
                real_ttl,
                claimed: Mutex::new(HashMap::new()),
            }),
        }
    }
}

fn is_owner_key(key: &str) -> bool {
    key.contains("/tasks/") && key.ends_with("/owner")
}

/// Keeps the real lease alive, a keep-alive every third of its TTL, until the store
/// says it ended (a freeze or a cut outlasted it) or the wrapper is gone.
async fn keep_real_lease(store: Arc<dyn Coordinator>, state: Weak<State>, lease: i64) {
    loop {
        let Some(every) = state.upgrade().map(|s| s.real_ttl / 3) else {
            return;
        };
        tokio::time::sleep(every).await;
        if let Ok(KeepAlive::Expired) = store.keep_alive(lease).await {
            return;
        }
    }
}

impl Coordinator for Unfenced {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move {
            let grant = self.store.grant(self.state.real_ttl).await?;
            tokio::spawn(keep_real_lease(
                Arc::clone(&self.store),
                Arc::downgrade(&self.state),
                grant.id,
            ));
            Ok(Grant { id: grant.id, ttl })
        })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            let revision = match self.store.keep_alive(lease).await {
                Ok(KeepAlive::Alive { revision, .. }) => revision,
                _ => 0,
            };
            Ok(KeepAlive::Alive {
                ttl: BELIEVED_TTL,
                revision,
            })
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            let mut listing = self.store.list(prefix.clone()).await?;
            let claimed = self.state.claimed();
            listing.kvs.retain(|kv| {
                claimed
                    .get(&kv.key)
                    .is_none_or(|ours| ours.value == kv.value)
            });
            for kv in claimed.values() {
                if kv.key.starts_with(&prefix) && listing.get(&kv.key).is_none() {
                    listing.kvs.push(kv.clone());
                }
            }
            drop(claimed);
            listing.kvs.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(listing)
        })
    }

    fn txn(&self, mut txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let written = |key: &str| {
                txn.then.iter().any(|op| match op {
                    Op::Put { key: k, .. } | Op::Delete { key: k } => k == key,
                })
            };
            let claims: Vec<(String, Vec<u8>, i64)> = txn
                .then
                .iter()
                .filter_map(|op| match op {
                    Op::Put {
                        key,
                        value,
                        lease: Some(lease),
                    } if is_owner_key(key) && txn.when.contains(&Compare::Absent(key.clone())) => {
                        Some((key.clone(), value.clone(), *lease))
                    }
                    _ => None,
                })
                .collect();
            let released: Vec<String> = txn
                .then
                .iter()
                .filter_map(|op| match op {
                    Op::Delete { key } if is_owner_key(key) => Some(key.clone()),
                    _ => None,
                })
                .collect();
            let when = {
                let claimed = self.state.claimed();
                txn.when
                    .iter()
                    .filter(|compare| {
                        let key = match compare {
                            Compare::Absent(key)
                            | Compare::CreateRevision(key, _)
                            | Compare::ModRevision(key, _)
                            | Compare::Value(key, _) => key,
                        };
                        !claimed.contains_key(key) || written(key)
                    })
                    .cloned()
                    .collect()
            };
            txn.when = when;
            let result = self.store.txn(txn).await;
            let mut claimed = self.state.claimed();
            // Given up, whether or not the store applied the delete.
            for key in released {
                claimed.remove(&key);
            }
            if let Ok(TxnResult {
                succeeded: true,
                revision,
            }) = result
            {
                for (key, value, lease) in claims {
                    claimed.insert(
                        key.clone(),
                        KeyValue {
                            key,
                            value,
                            create_revision: revision,
                            mod_revision: revision,
                            lease,
                        },
                    );
                }
            }
            result
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            let stream = self.store.watch(prefix, from).await?;
            let hiding: WatchStream = Box::pin(Hiding {
                stream,
                state: Arc::clone(&self.state),
            });
            Ok(hiding)
        })
    }

    crate::pass_to_store!(revoke, wait_change);

    fn fresh_connection(&self) -> Option<Arc<dyn Coordinator>> {
        let store = self.store.fresh_connection()?;
        Some(Arc::new(Unfenced {
            store,
            state: Arc::clone(&self.state),
        }))
    }
}

/// A watch that leaves out every change of a claimed owner key but the worker's
/// own writes of it.
struct Hiding {
    stream: WatchStream,
    state: Arc<State>,
}

impl Stream for Hiding {
    type Item = Result<WatchMessage, ClusterError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.stream.as_mut().poll_next(cx);
        let Poll::Ready(Some(Ok(WatchMessage::Events { revision, events }))) = polled else {
            return polled;
        };
        let claimed = self.state.claimed();
        let events = events
            .into_iter()
            .filter(|event| match (claimed.get(event.key()), event) {
                (None, _) => true,
                (Some(ours), WatchEvent::Put(kv)) => kv.value == ours.value,
                (Some(_), WatchEvent::Delete { .. }) => false,
            })
            .collect();
        Poll::Ready(Some(Ok(WatchMessage::Events { revision, events })))
    }
}
