//! The store contract on one SQLite file, shared by the processes of one machine.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::watch;
use tokio::time::Instant;

use super::coord::{
    watch_channel, BoxFuture, Compare, Coordinator, Grant, KeepAlive, KeyValue, Listing, Op, Txn,
    TxnResult, WatchEvent, WatchMessage, WatchStream,
};
use super::error::{ClusterError, FileProblem};

/// What `PRAGMA application_id` holds in a taskstage store ("tsks").
const APPLICATION_ID: i32 = 0x7473_6b73;
/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SQLITE_SCHEMA_VERSION: i32 = 1;
/// How many revisions of history the file keeps for watches; older ones are
/// compacted away as new ones are written.
const HISTORY: i64 = 100_000;
/// How many revisions one watch message carries at most.
const WATCH_WINDOW: i64 = 1_000;

const SCHEMA: &str = "
CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO meta VALUES ('revision', 1), ('compacted', 0), ('next_lease', 256);
CREATE TABLE kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX kv_lease ON kv (lease) WHERE lease <> 0;
CREATE TABLE log (
    revision INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    key TEXT NOT NULL,
    value BLOB,
    create_revision INTEGER NOT NULL,
    lease INTEGER NOT NULL,
    PRIMARY KEY (revision, seq)
) WITHOUT ROWID;
CREATE TABLE lease (
    id INTEGER PRIMARY KEY,
    ttl_ms INTEGER NOT NULL,
    boot TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
";

/// How a [`SqliteCoordinator`] uses its file.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    lock_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            lock_timeout: Duration::from_secs(1),
        }
    }
}

impl SqliteOptions {
    /// How long a call waits for another process's write to end before it fails
    /// with [`ClusterError::Unreachable`] (default 1 s): the bound of every call.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }
}

/// The store contract on one SQLite file: the processes of one machine — worker
/// processes, the application's controller, the `taskstage` command — share it, and
/// what it acknowledged survives a crash and a power loss.
///
/// - **Durable**: the file is in WAL mode with `synchronous=FULL`: a transaction
///   is on disk before its call returns.
/// - **Revisions, transactions, watches** as etcd's: every write moves one
///   revision; a transaction's compares and writes happen under SQLite's write
///   lock, so the processes' transactions are serializable; a watch replays the
///   changes since its revision from the file's history (the last 100,000
///   revisions are kept, older ones compacted).
/// - **Leases on the machine's clock**: a lease expires on `CLOCK_MONOTONIC`, the
///   clock every process of the machine reads (and the one tokio's timers use), at
///   its last keep-alive plus its TTL. The file keeps the boot it was granted in: a
///   lease of an earlier boot has expired, whatever its deadline said. Every open
///   store sleeps until the next deadline of a lease and then deletes the lease's
///   keys, so a killed worker's tasks are free within its TTL even when no one
///   writes.
/// - **Changes reach the other processes** through the file: each open store is
///   woken by the kernel (inotify) when the file's journal is written, with no
///   polling at rest.
///
/// Linux only (inotify, `CLOCK_MONOTONIC` and the boot id).
///
/// # Examples
///
/// ```
/// use taskstage_cluster::{Controller, DesiredStage, SqliteCoordinator};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("taskstage-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = SqliteCoordinator::open(dir.join("tasks.db")).await?;
/// let controller = Controller::new(store.clone(), "app")?;
/// controller.create("orders", b"{}".to_vec(), DesiredStage::Paused).await?;
/// drop((controller, store));
///
/// // Another process (or this one, later) opens the same file and finds the task.
/// let store = SqliteCoordinator::open(dir.join("tasks.db")).await?;
/// let controller = Controller::new(store, "app")?;
/// assert_eq!(controller.status("orders").await?.desired, DesiredStage::Paused);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    lock_timeout: Duration,
    /// This boot of the machine (`/proc/sys/kernel/random/boot_id`).
    boot: String,
    /// Taken only on the blocking pool, never across an `.await`.
    conn: Mutex<Connection>,
    /// Moved when the file may have changed: by this process's writes, and by the
    /// kernel's word that another process wrote the file.
    changes: Arc<watch::Sender<u64>>,
    /// Its other end is the file watcher's: dropping this ends that thread.
    _stop: OwnedFd,
    /// The file, opened for writing: its modification time is moved after every
    /// commit that others must see, and the kernel tells their followers.
    file: std::fs::File,
}

impl Inner {
    /// Tells the other opens of the file that a commit of this one is visible: the
    /// kernel reports the file's new modification time to their followers. Written
    /// after the commit, because the journal's writes come before SQLite publishes
    /// the commit to readers: a reader woken by those would read the old state.
    fn announce(&self) {
        use rustix::fs::{futimens, Timestamps, UTIME_NOW, UTIME_OMIT};
        use rustix::time::Timespec;
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
            last_modification: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_NOW,
            },
        };
        if let Err(error) = futimens(&self.file, &times) {
            tracing::warn!(
                path = %self.path.display(),
                %error,
                "a commit could not be announced to the other opens of the store file; \
                 they learn of it at their next change"
            );
        }
    }
}

impl fmt::Debug for SqliteCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteCoordinator")
            .field("path", &self.inner.path)
            .field("lock_timeout", &self.inner.lock_timeout)
            .finish_non_exhaustive()
    }
}

/// What an open call needs to know of a failure: where, and what.
fn file_error(path: &Path, problem: FileProblem) -> ClusterError {
    ClusterError::StoreFile {
        path: path.to_owned(),
        problem,
    }
}

/// The problem an SQLite error names.
fn problem_of(error: &rusqlite::Error, lock_timeout: Duration) -> FileProblem {
    let detail = error.to_string();
    match error.sqlite_error_code() {
        Some(ErrorCode::ReadOnly) => FileProblem::ReadOnly { detail },
        Some(ErrorCode::DiskFull) => FileProblem::Full { detail },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => FileProblem::Locked {
            waited: lock_timeout,
        },
        Some(ErrorCode::DatabaseCorrupt) => FileProblem::Corrupt { detail },
        Some(ErrorCode::NotADatabase) => FileProblem::NotAStore { detail },
        _ => FileProblem::Io { detail },
    }
}

/// Milliseconds of `CLOCK_MONOTONIC`: the clock every process of the machine shares.
fn now_ms() -> i64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec.saturating_mul(1000) + now.tv_nsec / 1_000_000
}

fn boot_id() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

impl SqliteCoordinator {
    /// Opens the store at `path`, making an empty one (at revision 1) when the file
    /// does not exist or is empty; with the default [`SqliteOptions`].
    ///
    /// # Errors
    ///
    /// [`ClusterError::StoreFile`] naming the path and the [`FileProblem`]: not a
    /// taskstage store, a newer schema, a read-only file or directory, a full disk,
    /// a file locked by another program past the lock timeout, a corrupt file.
    /// Nothing is written to a file that is not a taskstage store.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ClusterError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// As [`SqliteCoordinator::open`], with `options`.
    ///
    /// # Errors
    ///
    /// As [`SqliteCoordinator::open`].
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, ClusterError> {
        let path = path.as_ref().to_owned();
        let opened = {
            let path = path.clone();
            let timeout = options.lock_timeout;
            tokio::task::spawn_blocking(move || open_file(&path, timeout)).await
        };
        let conn = match opened {
            Ok(result) => result?,
            Err(join) => {
                return Err(file_error(
                    &path,
                    FileProblem::Io {
                        detail: format!("the thread that opened it failed: {join}"),
                    },
                ))
            }
        };
        let boot = boot_id().map_err(|e| {
            file_error(
                &path,
                FileProblem::Io {
                    detail: format!("the machine's boot id cannot be read: {e}"),
                },
            )
        })?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| {
                file_error(
                    &path,
                    FileProblem::Io {
                        detail: format!("the file cannot be opened for writing: {e}"),
                    },
                )
            })?;
        let changes = Arc::new(watch::channel(0u64).0);
        let stop = follow_file(&path, Arc::downgrade(&changes))?;
        let store = SqliteCoordinator {
            inner: Arc::new(Inner {
                path,
                lock_timeout: options.lock_timeout,
                boot,
                conn: Mutex::new(conn),
                changes,
                _stop: stop,
                file,
            }),
        };
        store.spawn_sweeper();
        Ok(store)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Compacts the history watches replay, up to the current revision: a watch that
    /// needs an older change ends with [`WatchMessage::Compacted`].
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`] when the file cannot be written.
    pub async fn compact(&self) -> Result<(), ClusterError> {
        self.write("compact", |tx, _| {
            let revision = meta(tx, "revision")?;
            tx.execute("DELETE FROM log WHERE revision <= ?1", [revision])?;
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE name = 'compacted'",
                [revision],
            )?;
            Ok(())
        })
        .await
    }

    /// Runs `f` on the connection on the blocking pool.
    ///
    /// `f` is told whether the caller is gone (its future dropped, at its deadline):
    /// a write checks it before it commits, under the connection's lock, and rolls
    /// back when it is. A call its caller gave up on therefore never commits after
    /// a later call of this process: without the check, a checkpoint a unit wrote
    /// after a timed-out one was overwritten by it when the blocking pool got to it.
    async fn call<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection, &Inner, &dyn Fn() -> bool) -> rusqlite::Result<T>
            + Send
            + 'static,
    ) -> Result<T, ClusterError> {
        let inner = Arc::clone(&self.inner);
        let caller = tokio_util::sync::CancellationToken::new();
        // Dropped with this future: when the caller gives up, the token says so.
        let _gone_with_the_caller = caller.clone().drop_guard();
        let joined = tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            if caller.is_cancelled() {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
                    Some("the caller gave up before the call began".into()),
                ));
            }
            f(&mut conn, &inner, &|| caller.is_cancelled())
        })
        .await;
        match joined {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(ClusterError::Unreachable {
                op,
                detail: format!(
                    "store file {}: {}",
                    self.inner.path.display(),
                    problem_of(&error, self.inner.lock_timeout)
                ),
            }),
            Err(join) => Err(ClusterError::Unreachable {
                op,
                detail: format!("the store's call failed: {join}"),
            }),
        }
    }

    /// Runs `f` in a write transaction (SQLite's write lock, taken at once), after
    /// expiring the leases that are due; tells this process's watchers when the
    /// revision moved.
    async fn write<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &Inner) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ClusterError> {
        let (value, moved) = self
            .call(op, move |conn, inner, gone| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let before = meta(&tx, "revision")?;
                let next_lease = meta(&tx, "next_lease")?;
                sweep(&tx, inner)?;
                let value = f(&tx, inner)?;
                let after = meta(&tx, "revision")?;
                if after != before {
                    compact_old(&tx, after)?;
                }
                // A new lease's deadline matters to the others' expiry as a new
                // revision does to their watches.
                let leases = meta(&tx, "next_lease")?;
                if gone() {
                    // Dropped, so rolled back: the caller counts it as unknown, and
                    // it is not applied after what that caller sends next.
                    return Err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
                        Some("the caller gave up before the commit".into()),
                    ));
                }
                tx.commit()?;
                let moved = after != before || leases != next_lease;
                if moved {
                    inner.announce();
                }
                Ok((value, moved))
            })
            .await?;
        if moved {
            self.inner.changes.send_modify(|n| *n += 1);
        }
        Ok(value)
    }

    /// The store's revision now, after expiring the leases that are due.
    async fn revision(&self, op: &'static str) -> Result<i64, ClusterError> {
        if let Some(revision) = self.read(op, |tx, _| meta(tx, "revision")).await? {
            return Ok(revision);
        }
        self.write(op, |tx, _| meta(tx, "revision")).await
    }

    /// Runs `f` in a read transaction, unless a lease is due (`None`: the caller
    /// writes, which expires it first).
    async fn read<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &Inner) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<Option<T>, ClusterError> {
        self.call(op, move |conn, inner, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            if any_due(&tx, inner)? {
                return Ok(None);
            }
            f(&tx, inner).map(Some)
        })
        .await
    }

    /// Every open store deletes the keys of a lease once it is due, even when no one
    /// writes: the task sleeps until the next deadline of a lease in the file, or
    /// until the file changes. It holds the store weakly and ends with it.
    fn spawn_sweeper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let mut changes = self.inner.changes.subscribe();
        // Bounded by the store: it ends once the store is dropped.
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                let Some(inner) = weak.upgrade() else { return };
                let store = SqliteCoordinator { inner };
                // The earliest deadline of a lease, after expiring the due ones.
                let earliest = |tx: &rusqlite::Transaction<'_>, inner: &Inner| {
                    tx.query_row(
                        "SELECT min(expires_ms) FROM lease WHERE boot = ?1",
                        [&inner.boot],
                        |row| row.get::<_, Option<i64>>(0),
                    )
                };
                // A read, unless a lease is due: then a write that expires it.
                let next = match store.read("expire leases", earliest).await {
                    Ok(Some(next)) => Ok(next),
                    Ok(None) => store.write("expire leases", earliest).await,
                    Err(error) => Err(error),
                };
                drop(store);
                let wait = match next {
                    Ok(Some(deadline)) => {
                        Duration::from_millis(u64::try_from(deadline - now_ms()).unwrap_or(0) + 1)
                    }
                    // No lease: only a change can bring one.
                    Ok(None) => Duration::MAX,
                    // The file could not be written: try again in a while.
                    Err(error) => {
                        tracing::debug!(%error, "the store file's leases could not be expired");
                        Duration::from_millis(100)
                    }
                };
                let sleep = match Instant::now().checked_add(wait) {
                    Some(at) => tokio::time::sleep_until(at),
                    None => tokio::time::sleep(Duration::from_secs(86_400)),
                };
                tokio::select! {
                    () = sleep => {}
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
    }
}

fn open_file(path: &Path, lock_timeout: Duration) -> Result<Connection, ClusterError> {
    let fail = |e: rusqlite::Error| file_error(path, problem_of(&e, lock_timeout));
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(fail)?;
    let mut conn = conn;
    wait_for_locks(&mut conn, lock_timeout).map_err(fail)?;
    // SQLite opens a file it may not write read-only, silently.
    if conn.is_readonly("main").map_err(fail)? {
        return Err(file_error(
            path,
            FileProblem::ReadOnly {
                detail: "the file is not writable".into(),
            },
        ));
    }
    // What the file is, read before anything is written to it.
    let (application_id, version, tables): (i32, i32, i64) = conn
        .query_row(
            "SELECT (SELECT application_id FROM pragma_application_id), \
                    (SELECT user_version FROM pragma_user_version), \
                    (SELECT count(*) FROM sqlite_master)",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(fail)?;
    let fresh = application_id == 0 && tables == 0;
    if !fresh && application_id != APPLICATION_ID {
        return Err(file_error(
            path,
            FileProblem::NotAStore {
                detail: format!(
                    "an SQLite database with application id {application_id:#x} and {tables} \
                     schema objects"
                ),
            },
        ));
    }
    if version > SQLITE_SCHEMA_VERSION {
        return Err(file_error(
            path,
            FileProblem::NewerSchema {
                found: version,
                supported: SQLITE_SCHEMA_VERSION,
            },
        ));
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(file_error(
            path,
            FileProblem::Io {
                detail: format!("SQLite kept journal mode {mode:?} where WAL was asked for"),
            },
        ));
    }
    conn.execute_batch("PRAGMA synchronous = FULL;")
        .map_err(fail)?;
    if fresh {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        // Another process may have made it meanwhile.
        let made: i32 = tx
            .query_row(
                "SELECT application_id FROM pragma_application_id",
                [],
                |r| r.get(0),
            )
            .map_err(fail)?;
        if made == 0 {
            tx.execute_batch(SCHEMA).map_err(fail)?;
            tx.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SQLITE_SCHEMA_VERSION};"
            ))
            .map_err(fail)?;
        }
        tx.commit().map_err(fail)?;
        return Ok(conn);
    }
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(fail)?;
    if check != "ok" {
        return Err(file_error(path, FileProblem::Corrupt { detail: check }));
    }
    Ok(conn)
}

/// How often a call that waits for another process's write tries the lock again.
const LOCK_RETRY: Duration = Duration::from_micros(250);

/// Makes a call that finds the file locked try again every [`LOCK_RETRY`] until
/// `timeout` has passed since its first try. SQLite's own busy timeout sleeps ever
/// longer between tries (up to 100 ms), and a process that writes without a pause
/// (a worker claiming a thousand tasks) then holds the lock at nearly every try of
/// the others: one creating tasks beside it waited past a second. Short tries find
/// the gaps between its transactions.
fn wait_for_locks(conn: &mut Connection, timeout: Duration) -> rusqlite::Result<()> {
    let mut first = std::time::Instant::now();
    conn.busy_handler(Some(move |tries: i32| {
        let now = std::time::Instant::now();
        if tries == 0 {
            first = now;
        }
        let waited = now.duration_since(first);
        if waited >= timeout {
            return false;
        }
        std::thread::sleep(LOCK_RETRY.min(timeout - waited));
        true
    }))
}

/// Starts the thread that moves `changes` whenever the kernel says the file or its
/// journal was written (by any process), and returns the descriptor whose drop ends
/// it.
fn follow_file(path: &Path, changes: Weak<watch::Sender<u64>>) -> Result<OwnedFd, ClusterError> {
    use rustix::fs::inotify;
    let fail = |what: &str, e: std::io::Error| {
        file_error(
            path,
            FileProblem::Io {
                detail: format!("{what}: {e}"),
            },
        )
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(OsString::from).unwrap_or_default();
    let notify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(|e| fail("inotify", e.into()))?;
    inotify::add_watch(
        &notify,
        &dir,
        // A new modification time alone is reported as a modification; the journal's
        // writes are not followed (see `Inner::announce`), only the file's.
        inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::ATTRIB
            | inotify::WatchFlags::CREATE
            | inotify::WatchFlags::MOVED_TO,
    )
    .map_err(|e| fail("watching the file's directory", e.into()))?;
    let (stop_read, stop_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| fail("pipe", e.into()))?;
    std::thread::Builder::new()
        .name("taskstage-sqlite-follow".into())
        .spawn(move || {
            use rustix::event::{poll, PollFd, PollFlags};
            let mut buffer = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            // Bounded by the store: its drop closes the pipe's other end, which
            // ends the wait below with a hang-up.
            loop {
                let mut fds = [
                    PollFd::new(&notify, PollFlags::IN),
                    PollFd::new(&stop_read, PollFlags::IN),
                ];
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => return,
                }
                if !fds[1].revents().is_empty() {
                    return;
                }
                let mut ours = false;
                let mut reader = inotify::Reader::new(&notify, &mut buffer);
                // Bounded: the descriptor is non-blocking, so the reads end once
                // the kernel's queue is empty.
                loop {
                    match reader.next() {
                        Ok(event) => {
                            let file = event.file_name().map(|f| f.to_bytes());
                            if file == Some(name.as_encoded_bytes()) {
                                ours = true;
                            }
                        }
                        Err(rustix::io::Errno::INTR) => {}
                        Err(_) => break,
                    }
                }
                if ours {
                    let Some(changes) = changes.upgrade() else {
                        return;
                    };
                    changes.send_modify(|n| *n += 1);
                }
            }
        })
        .map_err(|e| fail("starting the file's follower thread", e))?;
    Ok(stop_write)
}

fn meta(tx: &rusqlite::Transaction<'_>, name: &str) -> rusqlite::Result<i64> {
    tx.query_row("SELECT value FROM meta WHERE name = ?1", [name], |row| {
        row.get(0)
    })
}

/// Moves the revision on by one and returns it.
fn bump(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
    tx.query_row(
        "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value",
        [],
        |row| row.get(0),
    )
}

fn any_due(tx: &rusqlite::Transaction<'_>, inner: &Inner) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM lease WHERE boot <> ?1 OR expires_ms <= ?2)",
        params![inner.boot, now_ms()],
        |row| row.get(0),
    )
}

/// Expires every lease that is due: of another boot, or past its deadline.
fn sweep(tx: &rusqlite::Transaction<'_>, inner: &Inner) -> rusqlite::Result<()> {
    let due: Vec<i64> = tx
        .prepare_cached("SELECT id FROM lease WHERE boot <> ?1 OR expires_ms <= ?2")?
        .query_map(params![inner.boot, now_ms()], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in due {
        drop_lease(tx, id)?;
    }
    Ok(())
}

/// Deletes a lease and every key attached to it, in one revision (none when it
/// had no key).
fn drop_lease(tx: &rusqlite::Transaction<'_>, id: i64) -> rusqlite::Result<()> {
    if tx.execute("DELETE FROM lease WHERE id = ?1", [id])? == 0 {
        return Ok(());
    }
    let keys: Vec<String> = tx
        // `lease <> 0` lets SQLite use the partial index on the lease.
        .prepare_cached("SELECT key FROM kv WHERE lease = ?1 AND lease <> 0 ORDER BY key")?
        .query_map([id], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if keys.is_empty() {
        return Ok(());
    }
    let revision = bump(tx)?;
    for (seq, key) in keys.iter().enumerate() {
        tx.execute("DELETE FROM kv WHERE key = ?1", [key])?;
        log_delete(tx, revision, seq, key)?;
    }
    Ok(())
}

fn log_delete(
    tx: &rusqlite::Transaction<'_>,
    revision: i64,
    seq: usize,
    key: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO log (revision, seq, key, value, create_revision, lease) \
         VALUES (?1, ?2, ?3, NULL, 0, 0)",
    )?
    .execute(params![revision, seq as i64, key])?;
    Ok(())
}

/// Drops the history older than the last [`HISTORY`] revisions.
fn compact_old(tx: &rusqlite::Transaction<'_>, revision: i64) -> rusqlite::Result<()> {
    let floor = revision - HISTORY;
    if floor > meta(tx, "compacted")? {
        tx.execute("DELETE FROM log WHERE revision <= ?1", [floor])?;
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE name = 'compacted'",
            [floor],
        )?;
    }
    Ok(())
}

fn get(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<KeyValue>> {
    tx.prepare_cached("SELECT value, create_revision, mod_revision, lease FROM kv WHERE key = ?1")?
        .query_row([key], |row| {
            Ok(KeyValue {
                key: key.to_owned(),
                value: row.get(0)?,
                create_revision: row.get(1)?,
                mod_revision: row.get(2)?,
                lease: row.get(3)?,
            })
        })
        .optional()
}

fn holds(tx: &rusqlite::Transaction<'_>, compare: &Compare) -> rusqlite::Result<bool> {
    Ok(match compare {
        Compare::Absent(key) => get(tx, key)?.is_none(),
        Compare::CreateRevision(key, rev) => {
            get(tx, key)?.map(|kv| kv.create_revision) == Some(*rev)
        }
        Compare::ModRevision(key, rev) => get(tx, key)?.map_or(0, |kv| kv.mod_revision) == *rev,
        Compare::Value(key, value) => get(tx, key)?.map(|kv| kv.value).as_ref() == Some(value),
    })
}

/// Whether `key` starts with `prefix` (`?1`), in SQL. A listing also bounds the
/// key from above by the prefix and the highest code point, so that SQLite reads
/// only the prefix's range of the primary key.
const UNDER_PREFIX: &str = "substr(key, 1, length(?1)) = ?1";

/// What a watch reads from the file from revision `from` on.
enum Replay {
    Compacted(i64),
    Events {
        /// Every change up to this revision is in `events`.
        through: i64,
        events: Vec<WatchEvent>,
    },
}

fn replay(tx: &rusqlite::Transaction<'_>, prefix: &str, from: i64) -> rusqlite::Result<Replay> {
    let compacted = meta(tx, "compacted")?;
    if from <= compacted {
        return Ok(Replay::Compacted(compacted));
    }
    let head = meta(tx, "revision")?;
    let through = head.min(from.saturating_add(WATCH_WINDOW - 1));
    let sql = format!(
        "SELECT revision, key, value, create_revision, lease FROM log \
         WHERE revision >= ?2 AND revision <= ?3 AND {UNDER_PREFIX} ORDER BY revision, seq"
    );
    let events = tx
        .prepare_cached(&sql)?
        .query_map(params![prefix, from, through], |row| {
            let revision: i64 = row.get(0)?;
            let key: String = row.get(1)?;
            Ok(match row.get::<_, Option<Vec<u8>>>(2)? {
                Some(value) => WatchEvent::Put(KeyValue {
                    key,
                    value,
                    create_revision: row.get(3)?,
                    mod_revision: revision,
                    lease: row.get(4)?,
                }),
                None => WatchEvent::Delete { key, revision },
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Replay::Events { through, events })
}

/// A lease's TTL in whole milliseconds, rounded up.
fn ttl_ms(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    i64::try_from(ms).unwrap_or(i64::MAX / 4)
}

/// A store on the same file with a connection of its own, opened on its first call
/// (see [`Coordinator::fresh_connection`]).
struct OpenedOnFirstCall {
    path: PathBuf,
    options: SqliteOptions,
    store: tokio::sync::OnceCell<SqliteCoordinator>,
}

impl OpenedOnFirstCall {
    async fn store(&self) -> Result<&SqliteCoordinator, ClusterError> {
        self.store
            .get_or_try_init(|| SqliteCoordinator::open_with(&self.path, self.options.clone()))
            .await
    }
}

impl Coordinator for OpenedOnFirstCall {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move { self.store().await?.grant(ttl).await })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move { self.store().await?.keep_alive(lease).await })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move { self.store().await?.revoke(lease).await })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move { self.store().await?.list(prefix).await })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move { self.store().await?.txn(txn).await })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move { self.store().await?.watch(prefix, from).await })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.store()
                .await?
                .wait_change(prefix, after, timeout)
                .await
        })
    }
}

impl Coordinator for SqliteCoordinator {
    /// Another open of the file, with its own connection: a worker keeps its lease
    /// through it, so that a keep-alive never waits behind the process's other
    /// calls (a thousand units' checkpoints) for the one connection.
    fn fresh_connection(&self) -> Option<Arc<dyn Coordinator>> {
        Some(Arc::new(OpenedOnFirstCall {
            path: self.inner.path.clone(),
            options: SqliteOptions {
                lock_timeout: self.inner.lock_timeout,
            },
            store: tokio::sync::OnceCell::new(),
        }))
    }

    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move {
            let ms = ttl_ms(ttl);
            self.write("grant", move |tx, inner| {
                let id: i64 = tx.query_row(
                    "UPDATE meta SET value = value + 1 WHERE name = 'next_lease' RETURNING value - 1",
                    [],
                    |row| row.get(0),
                )?;
                tx.execute(
                    "INSERT INTO lease (id, ttl_ms, boot, expires_ms) VALUES (?1, ?2, ?3, ?4)",
                    params![id, ms, inner.boot, now_ms().saturating_add(ms)],
                )?;
                Ok(Grant {
                    id,
                    ttl: Duration::from_millis(ms as u64),
                })
            })
            .await
        })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            self.write("keep-alive", move |tx, _| {
                // Due leases were expired before this: one that is here is alive.
                let ttl: Option<i64> = tx
                    .query_row(
                        "UPDATE lease SET expires_ms = ?2 + ttl_ms WHERE id = ?1 RETURNING ttl_ms",
                        params![lease, now_ms()],
                        |row| row.get(0),
                    )
                    .optional()?;
                Ok(match ttl {
                    Some(ms) => KeepAlive::Alive {
                        ttl: Duration::from_millis(ms as u64),
                        revision: meta(tx, "revision")?,
                    },
                    None => KeepAlive::Expired,
                })
            })
            .await
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.write("revoke", move |tx, _| drop_lease(tx, lease))
                .await
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            let read = move |tx: &rusqlite::Transaction<'_>, _: &Inner| {
                let sql = format!(
                    "SELECT key, value, create_revision, mod_revision, lease FROM kv \
                     WHERE key >= ?1 AND key < ?1 || char(1114111) AND {UNDER_PREFIX} \
                     ORDER BY key"
                );
                let kvs = tx
                    .prepare_cached(&sql)?
                    .query_map([&prefix], |row| {
                        Ok(KeyValue {
                            key: row.get(0)?,
                            value: row.get(1)?,
                            create_revision: row.get(2)?,
                            mod_revision: row.get(3)?,
                            lease: row.get(4)?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(Listing {
                    revision: meta(tx, "revision")?,
                    kvs,
                })
            };
            let again = read.clone();
            match self.read("list", read).await? {
                Some(listing) => Ok(listing),
                None => self.write("list", again).await,
            }
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let outcome = self
                .write("txn", move |tx, _| {
                    for compare in &txn.when {
                        if !holds(tx, compare)? {
                            return Ok(Ok(TxnResult {
                                succeeded: false,
                                revision: meta(tx, "revision")?,
                            }));
                        }
                    }
                    for op in &txn.then {
                        if let Op::Put {
                            lease: Some(lease), ..
                        } = op
                        {
                            let known: bool = tx.query_row(
                                "SELECT EXISTS (SELECT 1 FROM lease WHERE id = ?1)",
                                [lease],
                                |row| row.get(0),
                            )?;
                            if !known {
                                return Ok(Err(format!("requested lease {lease:x} not found")));
                            }
                        }
                    }
                    if txn.then.is_empty() {
                        return Ok(Ok(TxnResult {
                            succeeded: true,
                            revision: meta(tx, "revision")?,
                        }));
                    }
                    let revision = bump(tx)?;
                    for (seq, op) in txn.then.into_iter().enumerate() {
                        match op {
                            Op::Put { key, value, lease } => {
                                let create_revision =
                                    get(tx, &key)?.map_or(revision, |kv| kv.create_revision);
                                let lease = lease.unwrap_or(0);
                                tx.prepare_cached(
                                    "INSERT INTO kv (key, value, create_revision, mod_revision, lease) \
                                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (key) DO UPDATE SET \
                                     value = ?2, mod_revision = ?4, lease = ?5",
                                )?
                                .execute(params![key, value, create_revision, revision, lease])?;
                                tx.prepare_cached(
                                    "INSERT INTO log (revision, seq, key, value, create_revision, lease) \
                                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                                )?
                                .execute(params![revision, seq as i64, key, value, create_revision, lease])?;
                            }
                            Op::Delete { key } => {
                                if tx.execute("DELETE FROM kv WHERE key = ?1", [&key])? > 0 {
                                    log_delete(tx, revision, seq, &key)?;
                                }
                            }
                        }
                    }
                    Ok(Ok(TxnResult {
                        succeeded: true,
                        revision,
                    }))
                })
                .await?;
            outcome.map_err(|detail| ClusterError::Store { op: "txn", detail })
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            let mut changes = self.inner.changes.subscribe();
            // From 0: from the next change on.
            let mut next = if from > 0 {
                from
            } else {
                self.revision("watch").await? + 1
            };
            let (tx, stream) = watch_channel(64);
            let store = self.clone();
            // Bounded by the watcher: it ends when the stream is dropped, the file
            // cannot be read, or the history it needs is compacted.
            tokio::spawn(async move {
                loop {
                    changes.borrow_and_update();
                    let prefix = prefix.clone();
                    let read = store
                        .call("watch", move |conn, _, _| {
                            let tx =
                                conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
                            replay(&tx, &prefix, next)
                        })
                        .await;
                    let more = match read {
                        Err(error) => {
                            let _ = tx.send(Err(error)).await;
                            return;
                        }
                        Ok(Replay::Compacted(revision)) => {
                            let _ = tx.send(Ok(WatchMessage::Compacted { revision })).await;
                            return;
                        }
                        Ok(Replay::Events { through, events }) => {
                            let moved = through >= next;
                            if !events.is_empty() {
                                let message = WatchMessage::Events {
                                    revision: through,
                                    events,
                                };
                                if tx.send(Ok(message)).await.is_err() {
                                    return;
                                }
                            }
                            let more = moved && through - next + 1 == WATCH_WINDOW;
                            next = next.max(through + 1);
                            more
                        }
                    };
                    if more {
                        continue;
                    }
                    tokio::select! {
                        () = tx.closed() => return,
                        changed = changes.changed() => if changed.is_err() { return },
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
        // A change anywhere wakes the waiter (allowed: callers re-read).
        let _ = prefix;
        let mut changes = self.inner.changes.subscribe();
        Box::pin(async move {
            let deadline = Instant::now() + timeout;
            // Bounded by the deadline.
            loop {
                changes.borrow_and_update();
                if self.revision("watch").await? > after {
                    return Ok(());
                }
                if tokio::time::timeout_at(deadline, changes.changed())
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
        })
    }
}
