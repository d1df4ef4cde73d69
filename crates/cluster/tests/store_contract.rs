//! The store contract ([`Coordinator`]'s documentation), checked one promise at a
//! time on every store: the in-memory store, the SQLite file and etcd. A store the
//! protocol runs on keeps every one of these; the worker, the controller and the
//! fencer rely on nothing else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskstage_cluster::{
    Compare, Coordinator, KeepAlive, KeyValue, Listing, Op, Txn, TxnResult, WatchEvent,
    WatchMessage, WatchStream,
};
use tokio::time::Instant;

/// The longest any one step below may take.
const WITHIN: Duration = Duration::from_secs(10);

fn put(key: &str, value: &[u8]) -> Op {
    Op::Put {
        key: key.to_owned(),
        value: value.to_vec(),
        lease: None,
    }
}

fn delete(key: &str) -> Op {
    Op::Delete {
        key: key.to_owned(),
    }
}

async fn txn(store: &dyn Coordinator, when: Vec<Compare>, then: Vec<Op>) -> TxnResult {
    store
        .txn(Txn { when, then })
        .await
        .expect("the store answers")
}

async fn list(store: &dyn Coordinator, prefix: &str) -> Listing {
    store
        .list(prefix.to_owned())
        .await
        .expect("the store answers")
}

async fn get(store: &dyn Coordinator, key: &str) -> Option<KeyValue> {
    list(store, key).await.get(key).cloned()
}

/// The events of `watch` until `n` of them have come, each message's revision
/// checked to be no older than its events.
async fn events(watch: &mut WatchStream, n: usize) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + WITHIN;
    // Bounded by the deadline.
    while seen.len() < n {
        let message = tokio::time::timeout_at(deadline, next(watch))
            .await
            .unwrap_or_else(|_| panic!("{} of {n} events came: {seen:?}", seen.len()))
            .expect("the watch goes on")
            .expect("the watch has no error");
        match message {
            WatchMessage::Events { revision, events } => {
                for event in &events {
                    assert!(event.revision() <= revision, "{event:?} after {revision}");
                }
                seen.extend(events);
            }
            WatchMessage::Compacted { revision } => panic!("compacted at {revision}: {seen:?}"),
        }
    }
    seen
}

async fn next(
    watch: &mut WatchStream,
) -> Option<Result<WatchMessage, taskstage_cluster::ClusterError>> {
    std::future::poll_fn(|cx| futures_core::Stream::poll_next(watch.as_mut(), cx)).await
}

/// Every successful write moves the revision on, a failed compare or an empty
/// write moves nothing, and a listing is served at the revision of the last write.
async fn revisions_only_grow(store: &dyn Coordinator, p: &str) {
    let mut last = list(store, p).await.revision;
    for i in 0..20 {
        let key = format!("{p}k{}", i % 3);
        let wrote = txn(store, vec![], vec![put(&key, b"v")]).await;
        assert!(wrote.succeeded);
        assert!(
            wrote.revision > last,
            "write {i}: {} after {last}",
            wrote.revision
        );
        last = wrote.revision;
        let refused = txn(
            store,
            vec![Compare::Absent(key.clone())],
            vec![put(&key, b"x")],
        )
        .await;
        assert!(!refused.succeeded);
        assert_eq!(
            refused.revision, last,
            "a failed compare moved the revision"
        );
        let empty = txn(store, vec![], vec![]).await;
        assert!(empty.succeeded);
        assert_eq!(
            empty.revision, last,
            "a transaction without writes moved it"
        );
        let listing = list(store, p).await;
        assert_eq!(listing.revision, last);
        assert_eq!(listing.get(&key).map(|kv| kv.mod_revision), Some(last));
    }
}

/// Each kind of compare holds exactly when it should; when one fails, nothing is
/// written.
async fn compares_hold_exactly_when_true(store: &dyn Coordinator, p: &str) {
    let key = format!("{p}key");
    let created = txn(
        store,
        vec![Compare::Absent(key.clone())],
        vec![put(&key, b"one")],
    )
    .await;
    assert!(created.succeeded);
    let r1 = created.revision;
    let kv = get(store, &key).await.expect("written");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.value.as_slice()),
        (r1, r1, &b"one"[..])
    );

    let cases: Vec<(Compare, bool)> = vec![
        (Compare::Absent(key.clone()), false),
        (Compare::Absent(format!("{p}other")), true),
        (Compare::CreateRevision(key.clone(), r1), true),
        (Compare::CreateRevision(key.clone(), r1 + 1), false),
        (Compare::ModRevision(key.clone(), r1), true),
        (Compare::ModRevision(key.clone(), r1 - 1), false),
        (Compare::ModRevision(format!("{p}other"), 0), true),
        (Compare::Value(key.clone(), b"one".to_vec()), true),
        (Compare::Value(key.clone(), b"two".to_vec()), false),
        (Compare::Value(format!("{p}other"), Vec::new()), false),
    ];
    for (compare, holds) in cases {
        let before = list(store, p).await;
        let probe = format!("{p}probe");
        let result = txn(store, vec![compare.clone()], vec![put(&probe, b"p")]).await;
        assert_eq!(result.succeeded, holds, "{compare:?}");
        let after = list(store, p).await;
        if holds {
            assert!(after.revision > before.revision, "{compare:?}");
            txn(store, vec![], vec![delete(&probe)]).await;
        } else {
            assert_eq!(
                after, before,
                "{compare:?} failed and something was written"
            );
        }
    }

    // An update keeps the key's create revision and moves its mod revision.
    let updated = txn(
        store,
        vec![Compare::ModRevision(key.clone(), r1)],
        vec![put(&key, b"two")],
    )
    .await;
    assert!(updated.succeeded);
    let kv = get(store, &key).await.expect("still there");
    assert_eq!(
        (kv.create_revision, kv.mod_revision),
        (r1, updated.revision)
    );
    assert_eq!(kv.value, b"two");
    // Several compares: all must hold.
    let both = txn(
        store,
        vec![
            Compare::Value(key.clone(), b"two".to_vec()),
            Compare::Absent(key.clone()),
        ],
        vec![put(&key, b"three")],
    )
    .await;
    assert!(!both.succeeded);
    assert_eq!(
        get(store, &key).await.map(|kv| kv.value),
        Some(b"two".to_vec())
    );
}

/// A transaction's writes happen together, at one revision, in order; a delete of
/// an absent key is no change.
async fn a_transaction_is_atomic_at_one_revision(store: &dyn Coordinator, p: &str) {
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    txn(store, vec![], vec![put(&c, b"c")]).await;
    let from = list(store, p).await.revision + 1;
    let mut watch = store.watch(p.to_owned(), from).await.expect("a watch");
    let absent = format!("{p}absent");
    let wrote = txn(
        store,
        vec![],
        vec![put(&a, b"1"), put(&b, b"2"), delete(&c), delete(&absent)],
    )
    .await;
    assert!(wrote.succeeded);
    let listing = list(store, p).await;
    let keys: Vec<(&str, &[u8], i64)> = listing
        .kvs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_slice(), kv.mod_revision))
        .collect();
    assert_eq!(
        keys,
        [
            (a.as_str(), &b"1"[..], wrote.revision),
            (b.as_str(), &b"2"[..], wrote.revision)
        ]
    );
    let seen = events(&mut watch, 3).await;
    assert!(
        seen.iter().all(|e| e.revision() == wrote.revision),
        "{seen:?}"
    );
    let order: Vec<&str> = seen.iter().map(WatchEvent::key).collect();
    assert_eq!(order, [a.as_str(), b.as_str(), c.as_str()]);
    assert!(matches!(&seen[2], WatchEvent::Delete { .. }), "{seen:?}");
}

/// A put under a lease the store does not have is an error, and writes nothing.
async fn a_put_under_an_unknown_lease_writes_nothing(store: &dyn Coordinator, p: &str) {
    let before = list(store, p).await;
    let result = store
        .txn(Txn {
            when: vec![],
            then: vec![
                put(&format!("{p}free"), b"f"),
                Op::Put {
                    key: format!("{p}leased"),
                    value: b"l".to_vec(),
                    lease: Some(0x7e57_0001),
                },
            ],
        })
        .await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(list(store, p).await, before);
}

/// A granted lease is kept alive by its keep-alives; revoking it deletes its keys
/// at once, in one revision; a revoked lease answers Expired.
async fn a_revoked_lease_takes_its_keys_along(store: &dyn Coordinator, p: &str) {
    let grant = store.grant(Duration::from_secs(5)).await.expect("a lease");
    assert!(grant.ttl >= Duration::from_secs(5), "{grant:?}");
    let keys = [format!("{p}x"), format!("{p}y")];
    let wrote = store
        .txn(Txn {
            when: vec![],
            then: keys
                .iter()
                .map(|k| Op::Put {
                    key: k.clone(),
                    value: b"v".to_vec(),
                    lease: Some(grant.id),
                })
                .chain([put(&format!("{p}z"), b"free")])
                .collect(),
        })
        .await
        .expect("written");
    assert!(wrote.succeeded);
    assert_eq!(
        get(store, &keys[0]).await.map(|kv| kv.lease),
        Some(grant.id)
    );
    match store.keep_alive(grant.id).await.expect("an answer") {
        KeepAlive::Alive { ttl, .. } => assert!(ttl >= Duration::from_secs(5)),
        KeepAlive::Expired => panic!("a lease just granted answered Expired"),
    }
    let mut watch = store
        .watch(p.to_owned(), wrote.revision + 1)
        .await
        .expect("a watch");
    store.revoke(grant.id).await.expect("revoked");
    let listing = list(store, p).await;
    let left: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(left, [format!("{p}z")]);
    let seen = events(&mut watch, 2).await;
    assert!(
        seen.iter().all(|e| matches!(e, WatchEvent::Delete { .. })),
        "{seen:?}"
    );
    assert_eq!(seen[0].revision(), seen[1].revision(), "one revision");
    assert_eq!(
        store.keep_alive(grant.id).await.expect("an answer"),
        KeepAlive::Expired
    );
}

/// A lease that is not kept alive ends within its TTL (and a little), and its keys
/// with it.
async fn an_unrenewed_lease_expires_with_its_keys(store: &dyn Coordinator, p: &str) {
    let grant = store.grant(Duration::from_secs(1)).await.expect("a lease");
    let key = format!("{p}leased");
    let started = Instant::now();
    let wrote = store
        .txn(Txn {
            when: vec![],
            then: vec![Op::Put {
                key: key.clone(),
                value: b"v".to_vec(),
                lease: Some(grant.id),
            }],
        })
        .await
        .expect("written");
    assert!(wrote.succeeded);
    let deadline = started + grant.ttl + Duration::from_secs(3);
    // Bounded by the deadline: each turn waits for a change, or 100 ms.
    loop {
        let listing = list(store, p).await;
        if listing.get(&key).is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the key outlived its lease's TTL"
        );
        store
            .wait_change(p.to_owned(), listing.revision, Duration::from_millis(100))
            .await
            .expect("the store answers");
    }
    assert!(started.elapsed() >= grant.ttl - Duration::from_millis(50));
    assert_eq!(
        store.keep_alive(grant.id).await.expect("an answer"),
        KeepAlive::Expired
    );
}

/// A watch from a revision replays the changes under its prefix from that revision
/// on, in order, then follows the new ones; from 0 it starts with the next change.
async fn a_watch_replays_then_follows(store: &dyn Coordinator, p: &str) {
    let first = txn(store, vec![], vec![put(&format!("{p}1"), b"a")])
        .await
        .revision;
    txn(store, vec![], vec![put(&format!("{p}-outside"), b"b")]).await;
    let sibling = p.trim_end_matches('/').to_owned() + "x/1";
    txn(store, vec![], vec![put(&sibling, b"not under the prefix")]).await;
    txn(store, vec![], vec![delete(&format!("{p}1"))]).await;
    let mut from_first = store.watch(p.to_owned(), first).await.expect("a watch");
    let mut from_now = store.watch(p.to_owned(), 0).await.expect("a watch");
    let last = txn(store, vec![], vec![put(&format!("{p}2"), b"c")])
        .await
        .revision;

    let seen = events(&mut from_first, 4).await;
    let keys: Vec<(&str, bool)> = seen
        .iter()
        .map(|e| (e.key(), matches!(e, WatchEvent::Put(_))))
        .collect();
    let (one, outside, two) = (format!("{p}1"), format!("{p}-outside"), format!("{p}2"));
    assert_eq!(
        keys,
        [
            (one.as_str(), true),
            (outside.as_str(), true),
            (one.as_str(), false),
            (two.as_str(), true)
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].revision() < w[1].revision()));
    assert_eq!(seen[0].revision(), first);
    let now = events(&mut from_now, 1).await;
    assert_eq!((now[0].key(), now[0].revision()), (two.as_str(), last));
}

/// A wait for a change returns soon after one, and within its timeout when none
/// comes.
async fn a_wait_for_a_change_returns_on_it(store: &dyn Coordinator, p: &str) {
    let revision = list(store, p).await.revision;
    let started = Instant::now();
    let (waited, wrote) = tokio::join!(
        store.wait_change(p.to_owned(), revision, WITHIN),
        txn(store, vec![], vec![put(&format!("{p}k"), b"v")])
    );
    waited.expect("the store answers");
    assert!(wrote.succeeded);
    assert!(started.elapsed() < WITHIN / 2, "{:?}", started.elapsed());
    let revision = list(store, p).await.revision;
    let started = Instant::now();
    store
        .wait_change(p.to_owned(), revision, Duration::from_millis(300))
        .await
        .expect("the store answers");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A watch from far back replays every change since, however many: more than one
/// message's worth, none lost between them.
async fn a_watch_replays_a_long_history(store: &dyn Coordinator, p: &str) {
    const WRITES: usize = 1_200;
    let key = format!("{p}k");
    let first = txn(store, vec![], vec![put(&key, b"0")]).await.revision;
    for i in 1..WRITES {
        txn(store, vec![], vec![put(&key, i.to_string().as_bytes())]).await;
    }
    let mut watch = store.watch(p.to_owned(), first).await.expect("a watch");
    let seen = events(&mut watch, WRITES).await;
    for (i, event) in seen.iter().enumerate() {
        match event {
            WatchEvent::Put(kv) => assert_eq!(kv.value, i.to_string().into_bytes()),
            other => panic!("not a put: {other:?}"),
        }
    }
}

/// A listing holds exactly the keys under its prefix, sorted.
async fn a_listing_is_the_prefix_sorted(store: &dyn Coordinator, p: &str) {
    let names = ["m", "b", "z", "a/b", "a"];
    for name in names {
        txn(
            store,
            vec![],
            vec![put(&format!("{p}{name}"), name.as_bytes())],
        )
        .await;
    }
    let sibling = p.trim_end_matches('/').to_owned() + "0";
    txn(store, vec![], vec![put(&sibling, b"outside")]).await;
    let listing = list(store, p).await;
    let keys: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
    let mut expected: Vec<String> = names.iter().map(|n| format!("{p}{n}")).collect();
    expected.sort();
    assert_eq!(keys, expected);
    for kv in &listing.kvs {
        assert_eq!(kv.value, &kv.key.as_bytes()[p.len()..]);
    }
}

/// A watch from a compacted revision says so and ends.
async fn a_watch_of_compacted_history_ends(
    store: &dyn Coordinator,
    p: &str,
    compact: impl std::future::Future<Output = ()>,
) {
    let first = txn(store, vec![], vec![put(&format!("{p}k"), b"1")])
        .await
        .revision;
    txn(store, vec![], vec![put(&format!("{p}k"), b"2")]).await;
    compact.await;
    let mut watch = store.watch(p.to_owned(), first).await.expect("a watch");
    let message = tokio::time::timeout(WITHIN, next(&mut watch))
        .await
        .expect("an answer in time");
    match message {
        Some(Ok(WatchMessage::Compacted { revision })) => assert!(revision >= first),
        other => panic!("not a compaction: {other:?}"),
    }
    let end = tokio::time::timeout(WITHIN, next(&mut watch))
        .await
        .expect("the watch ends");
    assert!(end.is_none(), "{end:?}");
}

/// Each test under its own prefix, so that tests may share a store.
fn prefix(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("contract/{test}-{}/", N.fetch_add(1, Ordering::Relaxed))
}

/// One test per promise, on the store `$open` makes (it returns the store and what
/// keeps it alive).
macro_rules! contract {
    ($store:ident, $open:expr) => {
        mod $store {
            use super::*;

            contract!(@test $open, revisions_only_grow);
            contract!(@test $open, compares_hold_exactly_when_true);
            contract!(@test $open, a_transaction_is_atomic_at_one_revision);
            contract!(@test $open, a_put_under_an_unknown_lease_writes_nothing);
            contract!(@test $open, a_revoked_lease_takes_its_keys_along);
            contract!(@test $open, an_unrenewed_lease_expires_with_its_keys);
            contract!(@test $open, a_watch_replays_then_follows);
            contract!(@test $open, a_wait_for_a_change_returns_on_it);
            contract!(@test $open, a_listing_is_the_prefix_sorted);
            contract!(@test $open, a_watch_replays_a_long_history);
        }
    };
    (@test $open:expr, $name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (store, _keep) = $open;
            super::$name(&store, &prefix(stringify!($name))).await;
        }
    };
}

mod memory_store {
    use taskstage_cluster::MemoryCoordinator;

    pub(crate) fn open() -> (MemoryCoordinator, ()) {
        (MemoryCoordinator::new(), ())
    }
}

mod file_store {
    use taskstage_cluster::SqliteCoordinator;

    /// A directory of the test's own, removed when dropped.
    pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

    impl TempDir {
        pub(crate) fn new() -> TempDir {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("taskstage-store-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(crate) async fn open() -> (SqliteCoordinator, TempDir) {
        let dir = TempDir::new();
        let store = SqliteCoordinator::open(dir.0.join("store.db"))
            .await
            .expect("a new store file");
        (store, dir)
    }
}

mod etcd_store {
    use taskstage_cluster::{EtcdCoordinator, EtcdOptions};
    use taskstage_harness::cluster::EtcdCluster;

    pub(crate) async fn open() -> (EtcdCoordinator, Option<EtcdCluster>) {
        let Some(cluster) = EtcdCluster::start_or_skip(1) else {
            panic!("no etcd: run scripts/etcd-setup.sh");
        };
        let store = EtcdCoordinator::connect(cluster.endpoints(), EtcdOptions::default())
            .await
            .expect("connected");
        (store, Some(cluster))
    }
}

contract!(memory, memory_store::open());
contract!(file, file_store::open().await);
contract!(etcd, etcd_store::open().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_watch_of_compacted_history_ends() {
    let store = taskstage_cluster::MemoryCoordinator::new();
    let compacting = store.clone();
    a_watch_of_compacted_history_ends(&store, &prefix("compacted"), async move {
        compacting.compact();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_a_watch_of_compacted_history_ends() {
    let (store, _dir) = file_store::open().await;
    a_watch_of_compacted_history_ends(&store, &prefix("compacted"), async {
        store.compact().await.expect("compacted");
    })
    .await;
}
