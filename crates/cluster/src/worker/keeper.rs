//! Where the lease is kept: the session and the guard, on a thread of their own
//! (the default) or on the runtime that joined.
//!
//! A worker's units run on the application's runtime. When they keep every one of
//! its threads busy (a unit that blocks in `run`, a machine with more runnable
//! threads than cores), any tokio task of that runtime waits: a keep-alive sent
//! from there goes out late and the lease is lost though the process is alive, and
//! a deadline timer there fires late. On its own thread, with a current-thread
//! runtime of its own and a connection of its own to the store
//! ([`Coordinator::fresh_connection`](crate::Coordinator::fresh_connection)),
//! the session and the guard need only the OS to schedule one thread. The worker's
//! other store I/O that keeps its cache fresh (the listings and watches) runs there
//! too: a worker whose runtime its units saturate still learns of a pause.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::ClusterError;

use super::LeaseKeeping;

/// The session and the guard, running where [`LeaseKeeping`] says.
pub(super) enum Keeper {
    /// On the lease thread: done when the thread's loops have ended.
    Thread(oneshot::Receiver<()>),
    /// On the joining runtime.
    Shared(JoinHandle<()>),
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Keeper::Thread(_) => "Keeper::Thread",
            Keeper::Shared(_) => "Keeper::Shared",
        })
    }
}

/// The runtime the keeper will run on, made before the loops that run there.
pub(super) struct Prepared {
    /// The lease thread's own runtime; `None` on the joining runtime.
    runtime: Option<tokio::runtime::Runtime>,
    /// Where the worker's own store I/O runs (the keep-alives, and the watches and
    /// listings that feed its cache): tasks spawned here are run by the lease
    /// thread while it runs the session and the guard.
    pub(super) handle: tokio::runtime::Handle,
}

impl Prepared {
    /// The runtime for `keeping`: a new current-thread one for the lease thread,
    /// or the joining one.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Store`] when the runtime could not be made.
    pub(super) fn new(keeping: LeaseKeeping) -> Result<Prepared, ClusterError> {
        match keeping {
            LeaseKeeping::SharedRuntime => Ok(Prepared {
                runtime: None,
                handle: tokio::runtime::Handle::current(),
            }),
            LeaseKeeping::OwnThread => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| ClusterError::Store {
                        op: "lease thread",
                        detail: format!("could not build its runtime: {e}"),
                    })?;
                let handle = runtime.handle().clone();
                Ok(Prepared {
                    runtime: Some(runtime),
                    handle,
                })
            }
        }
    }
}

impl Keeper {
    /// Starts `loops` on the prepared runtime. On a thread, the thread ends when
    /// `loops` does (each loop ends with the worker's shutdown token, the guard
    /// once the runs it watches are gone or the lease ran out).
    ///
    /// # Errors
    ///
    /// [`ClusterError::Store`] when the thread could not be started.
    pub(super) fn start<F>(
        prepared: Prepared,
        name: String,
        loops: F,
    ) -> Result<Keeper, ClusterError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match prepared.runtime {
            None => Ok(Keeper::Shared(tokio::spawn(loops))),
            Some(runtime) => {
                let (done_tx, done_rx) = oneshot::channel();
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || {
                        runtime.block_on(loops);
                        // Nobody may be waiting (a dropped worker).
                        let _ = done_tx.send(());
                    })
                    .map_err(|e| ClusterError::Store {
                        op: "lease thread",
                        detail: format!("could not start it: {e}"),
                    })?;
                Ok(Keeper::Thread(done_rx))
            }
        }
    }

    /// Waits until the session and the guard have ended.
    pub(super) async fn ended(self) {
        match self {
            Keeper::Thread(done) => {
                let _ = done.await;
            }
            Keeper::Shared(task) => {
                let _ = task.await;
            }
        }
    }
}

/// Runs `a` and `b` to completion, side by side.
pub(super) async fn both(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::join!(a, b);
}

/// A coordinator whose I/O does not depend on the joining runtime, for the lease
/// thread: the store's own fresh connection, or the same one when it has no need
/// of one.
pub(super) fn lease_coordinator(
    keeping: LeaseKeeping,
    coord: &Arc<dyn crate::Coordinator>,
) -> Arc<dyn crate::Coordinator> {
    match keeping {
        LeaseKeeping::OwnThread => coord
            .fresh_connection()
            .unwrap_or_else(|| Arc::clone(coord)),
        LeaseKeeping::SharedRuntime => Arc::clone(coord),
    }
}
