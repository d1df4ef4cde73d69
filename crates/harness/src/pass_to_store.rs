//! A macro for test wrappers of a [`Coordinator`](taskstage_cluster::Coordinator):
//! shared by the cluster tests, the HTTP tests and the benchmarks.

/// The methods of [`Coordinator`] that a test wrapper hands to its `store` as they
/// are, named in any order: each wrapper writes out only what it changes.
#[macro_export]
macro_rules! pass_to_store {
    () => {};
    (grant $(, $rest:ident)*) => {
        fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
            self.store.grant(ttl)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (keep_alive $(, $rest:ident)*) => {
        fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
            self.store.keep_alive(lease)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (revoke $(, $rest:ident)*) => {
        fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
            self.store.revoke(lease)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (list $(, $rest:ident)*) => {
        fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
            self.store.list(prefix)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (watch $(, $rest:ident)*) => {
        fn watch(
            &self,
            prefix: String,
            from: i64,
        ) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
            self.store.watch(prefix, from)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (txn $(, $rest:ident)*) => {
        fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
            self.store.txn(txn)
        }
        $crate::pass_to_store!($($rest),*);
    };
    (wait_change $(, $rest:ident)*) => {
        fn wait_change(
            &self,
            prefix: String,
            after: i64,
            timeout: Duration,
        ) -> BoxFuture<'_, Result<(), ClusterError>> {
            self.store.wait_change(prefix, after, timeout)
        }
        $crate::pass_to_store!($($rest),*);
    };
}
