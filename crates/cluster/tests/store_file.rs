//! The embedded store (`SqliteCoordinator`, feature `sqlite`) beyond the contract
//! every store keeps (`store_contract.rs`): the protocol on the file across a
//! restart, two opens of one file woken by each other's writes, a lease expired
//! with no call, and every kind of bad file a typed error that writes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use taskstage::Stage;
use taskstage_cluster::{
    ClusterError, Controller, Coordinator, DesiredStage, FileProblem, Op, SqliteCoordinator,
    SqliteOptions, Txn, WatchEvent, WatchMessage, Worker, SQLITE_SCHEMA_VERSION,
};
use taskstage_harness::cluster::{counters, eventually, probes, SharedProbes};
use tokio::time::Instant;

const PREFIX: &str = "app";
const WAIT: Duration = Duration::from_secs(15);

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "taskstage-store-file-{test}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("store.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn join(store: SqliteCoordinator, id: &str, shared: &SharedProbes) -> Worker {
    Worker::builder(store, PREFIX, id)
        .ttl(Duration::from_secs(2))
        .stop_bound(Duration::from_millis(600))
        .resync(Duration::from_millis(200))
        .join(counters(id, shared))
        .await
        .expect("the worker joins")
}

fn alive(shared: &SharedProbes, task: &str) -> usize {
    probes(shared).alive.get(task).map_or(0, Vec::len)
}

fn starts(shared: &SharedProbes, task: &str) -> Vec<(String, u64)> {
    probes(shared).starts.get(task).cloned().unwrap_or_default()
}

async fn checkpoint(store: &SqliteCoordinator, task: &str) -> u64 {
    let key = format!("{PREFIX}/checkpoints/{task}/pos");
    let listing = store.list(key.clone()).await.expect("a read");
    listing
        .get(&key)
        .and_then(|kv| String::from_utf8_lossy(&kv.value).parse().ok())
        .unwrap_or(0)
}

/// The common case on one machine: a process that is controller and worker on one
/// file. A task the operator paused is still Paused after the process is gone and
/// another opens the file, and does not run; a running task runs again from its
/// last fenced checkpoint; no run overlaps another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_survives_a_restart_and_a_running_task_resumes_from_its_checkpoint() {
    let dir = TempDir::new("restart");
    let shared = SharedProbes::default();
    let last_checkpoint = {
        let store = SqliteCoordinator::open(dir.file())
            .await
            .expect("a new file");
        let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
        let worker = join(store.clone(), "w1", &shared).await;
        for task in ["kept-paused", "kept-running"] {
            controller
                .create(task, Vec::new(), DesiredStage::Running)
                .await
                .expect("created");
            controller.resume_within(task, WAIT).await.expect("running");
        }
        eventually(WAIT, "a few checkpoints of kept-running", || {
            let store = store.clone();
            async move { (checkpoint(&store, "kept-running").await >= 3).then_some(()) }
        })
        .await;
        let paused = controller
            .pause_within("kept-paused", WAIT)
            .await
            .expect("paused");
        assert_eq!(paused.stage, Stage::Paused);
        assert_eq!(alive(&shared, "kept-paused"), 0, "Paused with a run alive");
        worker.shutdown().await.expect("a clean shutdown");
        assert_eq!(alive(&shared, "kept-running"), 0);
        checkpoint(&store, "kept-running").await
    };
    let paused_starts = starts(&shared, "kept-paused").len();

    // Another process opens the file: here, the same one with nothing kept.
    let store = SqliteCoordinator::open(dir.file())
        .await
        .expect("the file again");
    let controller = Controller::new(store.clone(), PREFIX).expect("a controller");
    let status = controller.status("kept-paused").await.expect("a status");
    assert_eq!(status.desired, DesiredStage::Paused);
    let _worker = join(store.clone(), "w2", &shared).await;
    eventually(WAIT, "kept-running running again on w2", || {
        let shared = Arc::clone(&shared);
        async move {
            let starts = starts(&shared, "kept-running");
            (starts.last().is_some_and(|(w, _)| w == "w2") && alive(&shared, "kept-running") == 1)
                .then_some(starts)
        }
    })
    .await;
    let resumed_from = starts(&shared, "kept-running")
        .last()
        .map(|(_, at)| *at)
        .expect("a start");
    assert!(
        resumed_from >= last_checkpoint,
        "started from {resumed_from}, below the last acknowledged {last_checkpoint}"
    );
    // kept-paused stays as the operator left it: Paused, and no run of it started
    // since, while w2 runs the other task.
    let status = controller.status("kept-paused").await.expect("a status");
    assert_eq!(status.desired, DesiredStage::Paused);
    assert!(
        status
            .current_observed()
            .is_none_or(|o| matches!(o.stage, Stage::New | Stage::Paused)),
        "{status:?}"
    );
    assert_eq!(
        starts(&shared, "kept-paused").len(),
        paused_starts,
        "a paused task ran"
    );
    assert_eq!(alive(&shared, "kept-paused"), 0);

    // And it runs again once resumed.
    let resumed = controller
        .resume_within("kept-paused", WAIT)
        .await
        .expect("resumed");
    assert_eq!(resumed.owner.as_str(), "w2");
    assert_eq!(starts(&shared, "kept-paused").len(), paused_starts + 1);
    let violations = probes(&shared).violations.clone();
    assert!(violations.is_empty(), "runs overlapped: {violations:#?}");
}

/// Two opens of one file (each its own connection and its own follower of the
/// file, as two processes have): a write through one reaches a watch on the other
/// at once, woken by the kernel, not by a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_one_open_reaches_a_watch_on_another() {
    let dir = TempDir::new("two-opens");
    let one = SqliteCoordinator::open(dir.file()).await.expect("opened");
    let two = SqliteCoordinator::open(dir.file())
        .await
        .expect("opened again");
    let mut watch = two.watch("k/".to_owned(), 0).await.expect("a watch");
    let mut latencies = Vec::new();
    for i in 0..20 {
        let sent = Instant::now();
        let wrote = one
            .txn(Txn {
                when: vec![],
                then: vec![Op::Put {
                    key: format!("k/{i}"),
                    value: b"v".to_vec(),
                    lease: None,
                }],
            })
            .await
            .expect("written");
        let message = tokio::time::timeout(WAIT, next(&mut watch))
            .await
            .expect("the change arrives")
            .expect("the watch goes on")
            .expect("no error");
        latencies.push(sent.elapsed());
        let WatchMessage::Events { events, .. } = message else {
            panic!("not events: {message:?}");
        };
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].revision(), wrote.revision);
    }
    latencies.sort();
    eprintln!(
        "a change seen through another open: p50 {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    assert!(latencies[latencies.len() / 2] < Duration::from_millis(100));
}

async fn next(
    watch: &mut taskstage_cluster::WatchStream,
) -> Option<Result<WatchMessage, ClusterError>> {
    std::future::poll_fn(|cx| futures_core::Stream::poll_next(watch.as_mut(), cx)).await
}

/// A lease whose holder is gone (its store dropped, as a killed process's is) ends
/// at its TTL with no call of anyone: another open of the file deletes its keys on
/// its own, and its watchers see the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_process_gone_ends_at_its_ttl_with_no_call() {
    let dir = TempDir::new("lease");
    let other = SqliteCoordinator::open(dir.file()).await.expect("opened");
    let mut watch = other.watch("owners/".to_owned(), 0).await.expect("a watch");
    let started = Instant::now();
    let ttl = {
        let gone = SqliteCoordinator::open(dir.file()).await.expect("opened");
        let grant = gone.grant(Duration::from_secs(1)).await.expect("a lease");
        gone.txn(Txn {
            when: vec![],
            then: vec![Op::Put {
                key: "owners/t".into(),
                value: b"w".to_vec(),
                lease: Some(grant.id),
            }],
        })
        .await
        .expect("written");
        grant.ttl
    };
    // Nothing calls `other` from here: only its watch is open.
    let mut seen = Vec::new();
    // Bounded by the timeout of each message.
    while !seen.iter().any(|e| matches!(e, WatchEvent::Delete { .. })) {
        let message = tokio::time::timeout(ttl + Duration::from_secs(2), next(&mut watch))
            .await
            .expect("the delete arrives within the TTL")
            .expect("the watch goes on")
            .expect("no error");
        if let WatchMessage::Events { events, .. } = message {
            seen.extend(events);
        }
    }
    let after = started.elapsed();
    assert!(after >= ttl - Duration::from_millis(50), "{after:?}");
    assert!(after < ttl + Duration::from_secs(1), "{after:?}");
}

/// A lease the file holds from an earlier boot of the machine has expired, whatever
/// its deadline says: no process of that boot is alive, and the machine's clock
/// started again. Its keys are gone at the first open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_an_earlier_boot_has_expired() {
    let dir = TempDir::new("boot");
    let (lease, revision) = {
        let store = SqliteCoordinator::open(dir.file()).await.expect("opened");
        let grant = store
            .grant(Duration::from_secs(3_600))
            .await
            .expect("a lease");
        let wrote = store
            .txn(Txn {
                when: vec![],
                then: vec![Op::Put {
                    key: "owners/t".into(),
                    value: b"w".to_vec(),
                    lease: Some(grant.id),
                }],
            })
            .await
            .expect("written");
        (grant.id, wrote.revision)
    };
    // As the file is after a reboot: the lease's boot is another one.
    rusqlite::Connection::open(dir.file())
        .and_then(|c| {
            c.execute(
                "UPDATE lease SET boot = 'an-earlier-boot' WHERE id = ?1",
                [lease],
            )
        })
        .expect("the lease rewritten");
    let store = SqliteCoordinator::open(dir.file())
        .await
        .expect("opened again");
    let listing = store.list("owners/".into()).await.expect("a read");
    assert!(listing.kvs.is_empty(), "{listing:?}");
    assert!(
        listing.revision > revision,
        "the delete is a revision of its own"
    );
    assert_eq!(
        store.keep_alive(lease).await.expect("an answer"),
        taskstage_cluster::KeepAlive::Expired
    );
}

/// The backup docs/cluster.md gives, taken while a writer goes on: `VACUUM INTO`
/// (what `sqlite3 FILE ".backup COPY"` also makes) is a consistent copy that opens
/// as a store, at one revision, with every key written up to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_a_writer_goes_on_opens_as_a_store_at_one_revision() {
    let dir = TempDir::new("backup");
    let store = SqliteCoordinator::open(dir.file()).await.expect("opened");
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..400u32 {
                store
                    .txn(Txn {
                        when: vec![],
                        then: vec![Op::Put {
                            key: format!("k/{i:04}"),
                            value: i.to_string().into_bytes(),
                            lease: None,
                        }],
                    })
                    .await
                    .expect("written");
            }
        })
    };
    // Once some are written, while the rest are.
    eventually(WAIT, "a hundred writes", || {
        let store = store.clone();
        async move { (store.list("k/".into()).await.ok()?.kvs.len() >= 100).then_some(()) }
    })
    .await;
    let copy = dir.0.join("backup.db");
    let path = dir.file();
    let target = copy.clone();
    tokio::task::spawn_blocking(move || {
        rusqlite::Connection::open(&path)
            .and_then(|c| c.execute("VACUUM INTO ?1", [target.to_string_lossy()]))
    })
    .await
    .expect("the backup's thread")
    .expect("the backup");
    writer.await.expect("the writer");
    let restored = SqliteCoordinator::open(&copy)
        .await
        .expect("the copy opens as a store");
    let listing = restored.list("k/".into()).await.expect("a read");
    let n = listing.kvs.len();
    assert!((100..=400).contains(&n), "{n} keys");
    // One revision: the keys are exactly the first n writes, each at its revision.
    for (i, kv) in listing.kvs.iter().enumerate() {
        assert_eq!(kv.key, format!("k/{i:04}"));
    }
    assert_eq!(
        listing.kvs.last().map(|kv| kv.mod_revision),
        Some(listing.revision)
    );
}

/// What a call acknowledged is in the file after every open of it is gone, and the
/// revision goes on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_acknowledged_is_there_after_a_reopen() {
    let dir = TempDir::new("reopen");
    let revision = {
        let store = SqliteCoordinator::open(dir.file()).await.expect("opened");
        let mut revision = 0;
        for i in 0..50 {
            revision = store
                .txn(Txn {
                    when: vec![],
                    then: vec![Op::Put {
                        key: format!("k/{i:02}"),
                        value: i.to_string().into_bytes(),
                        lease: None,
                    }],
                })
                .await
                .expect("written")
                .revision;
        }
        revision
    };
    let store = SqliteCoordinator::open(dir.file())
        .await
        .expect("opened again");
    let listing = store.list("k/".into()).await.expect("a read");
    assert_eq!(listing.revision, revision);
    assert_eq!(listing.kvs.len(), 50);
    for (i, kv) in listing.kvs.iter().enumerate() {
        assert_eq!(kv.value, i.to_string().into_bytes());
    }
    let next = store
        .txn(Txn {
            when: vec![],
            then: vec![Op::Delete { key: "k/00".into() }],
        })
        .await
        .expect("written");
    assert_eq!(next.revision, revision + 1);
    let check: String = rusqlite::Connection::open(dir.file())
        .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
        .expect("a check");
    assert_eq!(check, "ok");
}

fn problem(result: Result<SqliteCoordinator, ClusterError>, path: &Path) -> FileProblem {
    match result {
        Err(ClusterError::StoreFile {
            path: named,
            problem,
        }) => {
            assert_eq!(named, path, "the error names the file");
            problem
        }
        other => panic!("not a store file error: {other:?}"),
    }
}

/// A file that is not a taskstage store (text, or another program's SQLite
/// database), one of a newer schema, and a corrupt one: each a typed error naming
/// the file, and not a byte of it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_store_of_this_schema_is_refused_and_left_as_it_was() {
    let dir = TempDir::new("bad");

    let text = dir.0.join("notes.txt");
    std::fs::write(&text, "not a database, just some text\n".repeat(200)).expect("written");
    let before = std::fs::read(&text).expect("read");
    let found = problem(SqliteCoordinator::open(&text).await, &text);
    assert!(matches!(found, FileProblem::NotAStore { .. }), "{found:?}");
    assert_eq!(std::fs::read(&text).expect("read"), before);

    let other = dir.0.join("other.db");
    rusqlite::Connection::open(&other)
        .and_then(|c| {
            c.execute_batch("CREATE TABLE orders (id INTEGER); INSERT INTO orders VALUES (1);")
        })
        .expect("another program's database");
    let before = std::fs::read(&other).expect("read");
    let found = problem(SqliteCoordinator::open(&other).await, &other);
    assert!(matches!(found, FileProblem::NotAStore { .. }), "{found:?}");
    assert_eq!(std::fs::read(&other).expect("read"), before);
    assert!(!dir.0.join("other.db-wal").exists(), "a journal was made");

    let newer = dir.0.join("newer.db");
    drop(SqliteCoordinator::open(&newer).await.expect("a new store"));
    rusqlite::Connection::open(&newer)
        .and_then(|c| {
            c.execute_batch(&format!(
                "PRAGMA user_version = {};",
                SQLITE_SCHEMA_VERSION + 1
            ))
        })
        .expect("a newer schema");
    let found = problem(SqliteCoordinator::open(&newer).await, &newer);
    assert_eq!(
        found,
        FileProblem::NewerSchema {
            found: SQLITE_SCHEMA_VERSION + 1,
            supported: SQLITE_SCHEMA_VERSION
        }
    );

    // A store whose pages past the header are overwritten.
    let corrupt = dir.0.join("corrupt.db");
    {
        let store = SqliteCoordinator::open(&corrupt)
            .await
            .expect("a new store");
        for i in 0..200 {
            store
                .txn(Txn {
                    when: vec![],
                    then: vec![Op::Put {
                        key: format!("k/{i:03}"),
                        value: vec![b'x'; 200],
                        lease: None,
                    }],
                })
                .await
                .expect("written");
        }
    }
    // Every open is gone: the journal is in the file; checkpoint it there.
    rusqlite::Connection::open(&corrupt)
        .and_then(|c| c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);"))
        .expect("checkpointed");
    let mut bytes = std::fs::read(&corrupt).expect("read");
    assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096 + 100..3 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&corrupt, &bytes).expect("written");
    let found = problem(SqliteCoordinator::open(&corrupt).await, &corrupt);
    assert!(matches!(found, FileProblem::Corrupt { .. }), "{found:?}");
    assert_eq!(
        std::fs::read(&corrupt).expect("read"),
        bytes,
        "the file changed"
    );
}

fn put_k() -> Txn {
    Txn {
        when: vec![],
        then: vec![Op::Put {
            key: "k".into(),
            value: b"v".to_vec(),
            lease: None,
        }],
    }
}

/// A file another program holds locked for writing: a write waits for the lock
/// timeout and then fails with a typed error naming the file, reads and opens go
/// on, and the write succeeds once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_locked_by_another_program_is_a_typed_error_in_bounded_time() {
    let dir = TempDir::new("locked");
    let path = dir.file();
    let timeout = Duration::from_millis(300);
    let store = SqliteCoordinator::open_with(&path, SqliteOptions::default().lock_timeout(timeout))
        .await
        .expect("opened");
    let holder = rusqlite::Connection::open(&path).expect("another program's connection");
    holder
        .execute_batch("BEGIN EXCLUSIVE;")
        .expect("the lock taken");

    let started = Instant::now();
    let result = store.txn(put_k()).await;
    let took = started.elapsed();
    match result {
        Err(ClusterError::Unreachable { op, detail }) => {
            assert_eq!(op, "txn");
            assert!(detail.contains("locked"), "{detail}");
            assert!(detail.contains(&path.display().to_string()), "{detail}");
        }
        other => panic!("not unreachable: {other:?}"),
    }
    assert!(took >= timeout - Duration::from_millis(50), "{took:?}");
    assert!(took < timeout * 10, "{took:?}");

    // Reads go on beside another program's write (the file is in WAL mode), and a
    // second open, which only reads, too.
    assert_eq!(store.list("k".into()).await.expect("a read").kvs.len(), 0);
    SqliteCoordinator::open_with(&path, SqliteOptions::default().lock_timeout(timeout))
        .await
        .expect("an open beside the lock");

    holder.execute_batch("COMMIT;").expect("the lock released");
    let wrote = store
        .txn(put_k())
        .await
        .expect("written once the lock is gone");
    assert!(wrote.succeeded);
    assert_eq!(store.list("k".into()).await.expect("a read").kvs.len(), 1);
}

/// The code block after `heading` in `text` that opens with `fence`.
fn block_after<'a>(text: &'a str, heading: &str, fence: &str) -> &'a str {
    let from = text.find(heading).expect("the heading") + heading.len();
    let open = text[from..].find(fence).expect("the block") + from + fence.len();
    let close = text[open..].find("\n```\n").expect("its end") + open;
    &text[open..=close]
}

/// The README's example of the file store (not compiled there: the core crate's doc
/// tests cannot name this crate) is the one docs/cluster.md compiles and runs.
#[test]
fn the_readmes_example_of_the_file_store_is_the_one_the_docs_run() {
    let readme = include_str!("../../../README.md");
    let docs = include_str!("../../../docs/cluster.md");
    assert_eq!(
        block_after(
            readme,
            "## A pause that survives a restart",
            "```rust,ignore\n"
        ),
        block_after(docs, "**One process, one file.**", "```rust\n"),
    );
}

/// A call its caller gave up on (its deadline passed while the file was locked) is
/// not applied when the lock frees, so never after a call the same caller made
/// next: a unit's checkpoint written after a timed-out one is not overwritten by it
/// (the file's history, replayed by a watch, holds none of the calls given up on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_on_is_never_applied_after_the_next_one() {
    let dir = TempDir::new("given-up");
    let path = dir.file();
    let store = SqliteCoordinator::open_with(&path, SqliteOptions::default().lock_timeout(WAIT))
        .await
        .expect("opened");
    let put = |key: String, value: &[u8]| Txn {
        when: vec![],
        then: vec![Op::Put {
            key,
            value: value.to_vec(),
            lease: None,
        }],
    };
    const KEYS: usize = 20;
    let holder = rusqlite::Connection::open(&path).expect("another program's connection");
    holder
        .execute_batch("BEGIN EXCLUSIVE;")
        .expect("the lock taken");
    // Held up by the lock: the call that takes the connection first, and the rest
    // queued behind it.
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.txn(put("first".into(), b"1")).await })
    };
    let mut later = Vec::new();
    for i in 0..KEYS {
        let key = format!("k/{i:02}");
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            store.txn(put(key.clone(), b"old")),
        )
        .await;
        assert!(gave_up.is_err(), "a call went through a held lock");
        let store = store.clone();
        later.push(tokio::spawn(
            async move { store.txn(put(key, b"new")).await },
        ));
    }
    holder.execute_batch("COMMIT;").expect("the lock released");
    first.await.expect("joined").expect("written");
    for call in later {
        call.await.expect("joined").expect("written");
    }
    let listing = store.list("k/".into()).await.expect("a read");
    assert_eq!(listing.kvs.len(), KEYS);
    for kv in &listing.kvs {
        assert_eq!(
            kv.value, b"new",
            "{} went back to the call given up on",
            kv.key
        );
    }
    let mut watch = store.watch("k/".into(), 1).await.expect("a watch");
    let mut values = Vec::new();
    // Bounded by the timeout of each message: the history holds KEYS puts or more.
    while values.len() < KEYS {
        let message = tokio::time::timeout(WAIT, next(&mut watch))
            .await
            .expect("the history in time")
            .expect("the watch goes on")
            .expect("no error");
        if let WatchMessage::Events { events, .. } = message {
            for event in events {
                if let WatchEvent::Put(kv) = event {
                    values.push(kv.value);
                }
            }
        }
    }
    let applied = values.iter().filter(|v| v.as_slice() == b"old").count();
    assert_eq!(applied, 0, "calls given up on were applied: {values:?}");
}

/// A process that writes without a pause (a worker claiming a thousand tasks) does
/// not shut another out: each write of the other waits at most the lock timeout,
/// and none had to fail. SQLite's own busy timeout, which sleeps up to 100 ms
/// between tries, lost the lock to the busy writer past a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_writer_beside_does_not_shut_another_out() {
    let dir = TempDir::new("busy-writer");
    let busy = SqliteCoordinator::open(dir.file()).await.expect("opened");
    let other = SqliteCoordinator::open_with(
        dir.file(),
        SqliteOptions::default().lock_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("opened again");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (busy, stop) = (busy.clone(), std::sync::Arc::clone(&stop));
            tokio::spawn(async move {
                let mut n = 0u64;
                // Bounded by the test, which stops it.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 1_000_000 {
                    let _ = busy
                        .txn(Txn {
                            when: vec![],
                            then: vec![Op::Put {
                                key: format!("busy/{w}"),
                                value: n.to_string().into_bytes(),
                                lease: None,
                            }],
                        })
                        .await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for i in 0..100 {
        let sent = Instant::now();
        other
            .txn(Txn {
                when: vec![],
                then: vec![Op::Put {
                    key: format!("other/{i:03}"),
                    value: b"v".to_vec(),
                    lease: None,
                }],
            })
            .await
            .unwrap_or_else(|e| panic!("write {i} beside the busy writer: {e}"));
        worst = worst.max(sent.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut busy_writes = 0;
    for writer in writers {
        busy_writes += writer.await.expect("joined");
    }
    eprintln!("100 writes beside {busy_writes} of a busy writer: the slowest took {worst:?}");
    assert!(
        busy_writes > 100,
        "the busy writer was not busy: {busy_writes}"
    );
}

/// A small file system of the test's own (a tmpfs of `bytes`), unmounted when
/// dropped; `None` where this process may not mount one (not root), which fails
/// under `CI=true` rather than skip.
struct SmallFs {
    dir: TempDir,
}

impl SmallFs {
    fn mount(test: &str, bytes: u64) -> Option<SmallFs> {
        let dir = TempDir::new(test);
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir.0)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(
                !ci,
                "CI=true and a tmpfs cannot be mounted: {test} must not be skipped"
            );
            eprintln!("SKIPPED: {test} needs to mount a small tmpfs (run as root)");
            return None;
        }
        Some(SmallFs { dir })
    }

    /// Remounts it with `options` (`size=…`, `ro`, `rw`).
    fn remount(&self, options: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.dir.0)
            .status()
            .expect("mount runs");
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir.0)
            .status();
    }
}

fn put(key: &str, value: Vec<u8>) -> Txn {
    Txn {
        when: vec![],
        then: vec![Op::Put {
            key: key.into(),
            value,
            lease: None,
        }],
    }
}

fn integrity(path: &Path) -> String {
    rusqlite::Connection::open(path)
        .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
        .expect("a check")
}

/// A disk that fills up under the store: the write that does not fit fails with an
/// error naming the file and the full disk, every write acknowledged before is
/// there with its value, reads go on, writes succeed again once there is room, and
/// the file passes SQLite's integrity check. A file that cannot even be created on
/// a full disk is a typed error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_write_that_does_not_fit_and_loses_nothing_acknowledged() {
    let Some(fs) = SmallFs::mount("full", 1 << 20) else {
        return;
    };
    let path = fs.dir.file();
    let store = SqliteCoordinator::open(&path).await.expect("opened");
    let mut acknowledged = Vec::new();
    let mut failure = None;
    // Bounded: 1 MiB holds far fewer than 1,000 values of 4 KiB.
    for i in 0..1_000 {
        let key = format!("k{i:04}");
        match store.txn(put(&key, vec![b'x'; 4096])).await {
            Ok(result) => {
                assert!(result.succeeded);
                acknowledged.push((key, result.revision));
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    let failure = failure.expect("the disk filled up within 1,000 writes");
    match &failure {
        ClusterError::Unreachable { op, detail } => {
            assert_eq!(*op, "txn");
            assert!(detail.contains("the disk is full"), "{detail}");
            assert!(detail.contains(&path.display().to_string()), "{detail}");
        }
        other => panic!("not the full disk: {other:?}"),
    }
    assert!(
        acknowledged.len() > 10,
        "{} writes fitted",
        acknowledged.len()
    );

    let check = |store: SqliteCoordinator, acknowledged: Vec<(String, i64)>| async move {
        let listing = store.list("k".into()).await.expect("a read on a full disk");
        for (key, revision) in &acknowledged {
            let kv = listing.get(key).unwrap_or_else(|| panic!("{key} was lost"));
            assert_eq!(kv.mod_revision, *revision, "{key}");
            assert_eq!(kv.value, vec![b'x'; 4096], "{key}");
        }
        store
    };
    let store = check(store, acknowledged.clone()).await;

    // A second file on the full disk cannot be made: a typed error naming it.
    let other = fs.dir.0.join("other.db");
    let refused = SqliteCoordinator::open(&other).await;
    assert!(
        matches!(
            problem(refused, &other),
            FileProblem::Full { .. } | FileProblem::Io { .. }
        ),
        "a new file on a full disk"
    );

    fs.remount("size=8m");
    let wrote = store
        .txn(put("after", b"room again".to_vec()))
        .await
        .expect("a write once there is room");
    assert!(wrote.succeeded);
    let store = check(store, acknowledged).await;
    drop(store);
    assert_eq!(integrity(&path), "ok");
}

/// A store on a file system that is read-only (the directory and the file), and a
/// read-only file in a directory that may be written: opening either is a typed
/// error naming the file, which is left byte for byte as it was, with every write
/// acknowledged before in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_file_or_directory_is_a_typed_error_and_the_file_is_left_as_it_was() {
    let Some(fs) = SmallFs::mount("read-only", 8 << 20) else {
        return;
    };
    let path = fs.dir.file();
    let store = SqliteCoordinator::open(&path).await.expect("opened");
    let first = store.txn(put("k", b"v".to_vec())).await.expect("a write");

    drop(store);
    // Linux refuses to remount a file system read-only while a file on it is open
    // for writing, so the store is closed first.
    let remounted = eventually(WAIT, "the file system remounted read-only", || async {
        std::process::Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&fs.dir.0)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            .then_some(())
    });
    remounted.await;
    // Immutable: a WAL file on a read-only file system has no shared memory file.
    let reader = rusqlite::Connection::open_with_flags(
        format!("file:{}?immutable=1", path.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .expect("a reader");
    let revision: i64 = reader
        .query_row("SELECT mod_revision FROM kv WHERE key = 'k'", [], |r| {
            r.get(0)
        })
        .expect("the acknowledged write");
    assert_eq!(revision, first.revision);
    drop(reader);
    let before = std::fs::read(&path).expect("the file");
    let refused = SqliteCoordinator::open(&path).await;
    assert!(
        matches!(problem(refused, &path), FileProblem::ReadOnly { .. }),
        "an open on a read-only file system"
    );
    assert_eq!(
        std::fs::read(&path).expect("the file"),
        before,
        "the file changed"
    );

    // A read-only file (a read-only bind mount over it) in a writable directory.
    fs.remount("rw");
    let bind = |args: &[&str]| {
        let status = std::process::Command::new("mount")
            .args(args)
            .arg(&path)
            .arg(&path)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mount {args:?}");
    };
    // The journal files of the last open are gone once it closed; keep only the file.
    bind(&["--bind"]);
    let unbind = scopeguard(&path);
    bind(&["-o", "remount,bind,ro"]);
    let before = std::fs::read(&path).expect("the file");
    let refused = SqliteCoordinator::open(&path).await;
    assert!(
        matches!(problem(refused, &path), FileProblem::ReadOnly { .. }),
        "an open of a read-only file"
    );
    assert_eq!(
        std::fs::read(&path).expect("the file"),
        before,
        "the file changed"
    );
    drop(unbind);
    assert_eq!(integrity(&path), "ok");
}

/// Unmounts the bind mount over `path` when dropped.
fn scopeguard(path: &Path) -> impl Drop + '_ {
    struct Unbind<'a>(&'a Path);
    impl Drop for Unbind<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    Unbind(path)
}
