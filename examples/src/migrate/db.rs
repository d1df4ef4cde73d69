//! The two databases: schemas, checks before the pipeline starts, the batches each
//! unit runs, the source writer's batches and the checksum that verifies the result.
//!
//! Every write to the target happens in one transaction together with the checkpoint
//! that records it, so a checkpoint never claims a row that is not there, and a row is
//! never there without its checkpoint: a run that resumes continues exactly.
//!
//! The source is opened read-only everywhere except by the writer, which runs only on
//! a source this program generated itself.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

/// How long a check before the pipeline waits on a lock before calling it locked.
pub const PREFLIGHT_BUSY: Duration = Duration::from_millis(300);
/// How long the pipeline's connections wait on a lock (the writer holds the
/// source's write lock for a few milliseconds at a time).
pub const WORK_BUSY: Duration = Duration::from_secs(5);

/// The migrated table, in both databases.
const ACCOUNTS: &str = "accounts";
/// The columns of `accounts`: name, declared type. `id` is the primary key.
const ACCOUNT_COLUMNS: [(&str, &str); 6] = [
    ("id", "INTEGER"),
    ("name", "TEXT"),
    ("email", "TEXT"),
    ("country", "TEXT"),
    ("balance_cents", "INTEGER"),
    ("updated_at", "INTEGER"),
];
const CHECKPOINT_COLUMNS: [(&str, &str); 4] = [
    ("unit", "TEXT"),
    ("position", "INTEGER"),
    ("items", "INTEGER"),
    ("done", "INTEGER"),
];
const SOURCE_RECORD_COLUMNS: [(&str, &str); 3] = [
    ("id", "INTEGER"),
    ("path", "TEXT"),
    ("snapshot_seq", "INTEGER"),
];
const CHANGE_COLUMNS: [(&str, &str); 3] = [
    ("seq", "INTEGER"),
    ("account_id", "INTEGER"),
    ("op", "TEXT"),
];

const ACCOUNTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    country TEXT NOT NULL,
    balance_cents INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);";

/// The source's change log and the triggers that fill it. Installed after the bulk
/// insert, so the log holds only the writes made while the pipeline runs.
const CHANGE_LOG: &str = "
CREATE TABLE _changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id INTEGER NOT NULL,
    op TEXT NOT NULL
);
CREATE TRIGGER accounts_logged_insert AFTER INSERT ON accounts
BEGIN INSERT INTO _changes (account_id, op) VALUES (NEW.id, 'insert'); END;
CREATE TRIGGER accounts_logged_update AFTER UPDATE ON accounts
BEGIN INSERT INTO _changes (account_id, op) VALUES (NEW.id, 'update'); END;
CREATE TRIGGER accounts_logged_delete AFTER DELETE ON accounts
BEGIN INSERT INTO _changes (account_id, op) VALUES (OLD.id, 'delete'); END;
";

/// The target's bookkeeping: one checkpoint row per unit, the source it migrates
/// from, and the staging table the dump fills and the load drains.
const TARGET_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _migration_checkpoint (
    unit TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    items INTEGER NOT NULL,
    done INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS _migration_source (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    path TEXT NOT NULL,
    snapshot_seq INTEGER
);
INSERT OR IGNORE INTO _migration_checkpoint VALUES ('dump', 0, 0, 0);
INSERT OR IGNORE INTO _migration_checkpoint VALUES ('load', 0, 0, 0);
INSERT OR IGNORE INTO _migration_checkpoint VALUES ('sync', 0, 0, 0);
";

const STAGING_TABLE: &str = "CREATE TABLE IF NOT EXISTS _staging_accounts (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    country TEXT NOT NULL,
    balance_cents INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);";

const SELECT_COLUMNS: &str = "id, name, email, country, balance_cents, updated_at";

/// Which of the two databases an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The database migrated from.
    Source,
    /// The database migrated to.
    Target,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Source => "source",
            Role::Target => "target",
        })
    }
}

/// A database that cannot be used, or an operation on it that failed. Every variant
/// names the database's role and its file.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The file's directory does not exist.
    #[error("{role} database {}: its directory {} does not exist", .path.display(), .dir.display())]
    MissingDirectory {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
        /// The directory that is missing.
        dir: PathBuf,
    },
    /// The file does not exist (and must).
    #[error("{role} database {}: no such file", .path.display())]
    MissingFile {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
    },
    /// The path names a directory.
    #[error("{role} database {}: this is a directory, not a database file", .path.display())]
    NotAFile {
        /// Source or target.
        role: Role,
        /// The path.
        path: PathBuf,
    },
    /// SQLite says the file is not a database.
    #[error("{role} database {}: the file is not a database", .path.display())]
    NotADatabase {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
    },
    /// SQLite says the database is corrupt.
    #[error("{role} database {}: the database disk image is malformed", .path.display())]
    Corrupt {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
    },
    /// Another connection holds a lock that did not go away in time.
    #[error("{role} database {}: the database is locked by another connection", .path.display())]
    Locked {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
    },
    /// The tables are not the ones a migration needs.
    #[error("{role} database {}: incompatible schema: {detail}", .path.display())]
    IncompatibleSchema {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The target holds a migration from another source.
    #[error(
        "target database {}: it holds a migration from another source ({recorded}); \
         use that source, or a new target",
        .path.display()
    )]
    OtherSource {
        /// The target file.
        path: PathBuf,
        /// The source the target records.
        recorded: String,
    },
    /// A checkpoint disagrees with the rows it describes.
    #[error("{role} database {}: checkpoint check failed: {detail}", .path.display())]
    Inconsistent {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
        /// What disagrees.
        detail: String,
    },
    /// Any other SQLite error.
    #[error("{role} database {}: {source}", .path.display())]
    Sqlite {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A file-system error around the database file.
    #[error("{role} database {}: {source}", .path.display())]
    Io {
        /// Source or target.
        role: Role,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl DbError {
    /// Sorts an SQLite error into the variants a person can act on.
    pub fn sqlite(role: Role, path: &Path, source: rusqlite::Error) -> Self {
        let path = path.to_owned();
        match source.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) => DbError::NotADatabase { role, path },
            Some(ErrorCode::DatabaseCorrupt) => DbError::Corrupt { role, path },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                DbError::Locked { role, path }
            }
            _ => DbError::Sqlite { role, path, source },
        }
    }
}

/// An open database connection that knows which database it is, for its errors.
pub struct Db {
    conn: Connection,
    role: Role,
    path: PathBuf,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("role", &self.role)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Db {
    fn open(role: Role, path: &Path, flags: OpenFlags, busy: Duration) -> Result<Db, DbError> {
        let conn =
            Connection::open_with_flags(path, flags).map_err(|e| DbError::sqlite(role, path, e))?;
        let db = Db {
            conn,
            role,
            path: path.to_owned(),
        };
        db.conn.busy_timeout(busy).map_err(db.err())?;
        Ok(db)
    }

    /// Opens the source read-only: nothing done through this connection can change it.
    pub fn source_read_only(path: &Path, busy: Duration) -> Result<Db, DbError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Db::open(Role::Source, path, flags, busy)
    }

    /// Opens a source this program generated, for its writer.
    pub fn source_writer(path: &Path) -> Result<Db, DbError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Db::open(Role::Source, path, flags, WORK_BUSY)?;
        db.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(db.err())?;
        Ok(db)
    }

    /// Opens the target, creating the file if it does not exist.
    pub fn target(path: &Path, busy: Duration) -> Result<Db, DbError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Db::open(Role::Target, path, flags, busy)?;
        db.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(db.err())?;
        Ok(db)
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> DbError + '_ {
        move |e| DbError::sqlite(self.role, &self.path, e)
    }

    fn inconsistent(&self, detail: String) -> DbError {
        DbError::Inconsistent {
            role: self.role,
            path: self.path.clone(),
            detail,
        }
    }

    fn incompatible(&self, detail: String) -> DbError {
        DbError::IncompatibleSchema {
            role: self.role,
            path: self.path.clone(),
            detail,
        }
    }
}

/// One row of `accounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    id: i64,
    name: String,
    email: String,
    country: String,
    balance_cents: i64,
    updated_at: i64,
}

impl Account {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Account> {
        Ok(Account {
            id: row.get(0)?,
            name: row.get(1)?,
            email: row.get(2)?,
            country: row.get(3)?,
            balance_cents: row.get(4)?,
            updated_at: row.get(5)?,
        })
    }
}

// ------------------------------------------------------------------ paths

/// Checks that `path` names an existing file.
///
/// # Errors
///
/// [`DbError::MissingDirectory`], [`DbError::MissingFile`] or [`DbError::NotAFile`].
pub fn check_existing_file(role: Role, path: &Path) -> Result<(), DbError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(DbError::NotAFile {
            role,
            path: path.to_owned(),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            check_directory(role, path)?;
            Err(DbError::MissingFile {
                role,
                path: path.to_owned(),
            })
        }
        Err(source) => Err(DbError::Io {
            role,
            path: path.to_owned(),
            source,
        }),
    }
}

/// Checks that `path` can name a database file: its directory exists, and it is not
/// itself a directory.
///
/// # Errors
///
/// [`DbError::MissingDirectory`] or [`DbError::NotAFile`].
pub fn check_directory(role: Role, path: &Path) -> Result<(), DbError> {
    if path.is_dir() {
        return Err(DbError::NotAFile {
            role,
            path: path.to_owned(),
        });
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => {
            Err(DbError::MissingDirectory {
                role,
                path: path.to_owned(),
                dir: dir.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

// ------------------------------------------------------------------ schemas

fn table_columns(db: &Db, table: &str) -> Result<Vec<(String, String, bool)>, DbError> {
    let mut stmt = db
        .conn
        .prepare("SELECT name, upper(type), pk FROM pragma_table_info(?1) ORDER BY cid")
        .map_err(db.err())?;
    let columns = stmt
        .query_map([table], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get::<_, i64>(2)? != 0))
        })
        .map_err(db.err())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(db.err())?;
    Ok(columns)
}

/// Checks that `table` has exactly `expected` columns, the first one its primary key.
/// Returns `false` when the table does not exist.
fn check_table(db: &Db, table: &str, expected: &[(&str, &str)]) -> Result<bool, DbError> {
    let found = table_columns(db, table)?;
    if found.is_empty() {
        return Ok(false);
    }
    let matches = found.len() == expected.len()
        && found.iter().zip(expected).enumerate().all(
            |(i, ((name, ty, pk), (want_name, want_ty)))| {
                name == want_name && ty == want_ty && *pk == (i == 0)
            },
        );
    if matches {
        return Ok(true);
    }
    let show = |cols: Vec<String>| cols.join(", ");
    let want = show(
        expected
            .iter()
            .enumerate()
            .map(|(i, (n, t))| {
                if i == 0 {
                    format!("{n} {t} PRIMARY KEY")
                } else {
                    format!("{n} {t}")
                }
            })
            .collect(),
    );
    let have = show(
        found
            .iter()
            .map(|(n, t, pk)| {
                if *pk {
                    format!("{n} {t} PRIMARY KEY")
                } else {
                    format!("{n} {t}")
                }
            })
            .collect(),
    );
    Err(db.incompatible(format!(
        "table `{table}` has columns ({have}), but a migration needs ({want})"
    )))
}

/// What the check of the source found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceInfo {
    /// Rows in `accounts`.
    pub rows: u64,
    /// Whether the source has a change log (`_changes`) for the sync unit.
    pub change_log: bool,
}

/// Checks an existing source, read-only: a database, with an `accounts` table of the
/// migrated shape.
///
/// # Errors
///
/// A [`DbError`] naming the source: missing, not a database, locked, or the wrong
/// schema.
pub fn inspect_source(path: &Path) -> Result<SourceInfo, DbError> {
    check_existing_file(Role::Source, path)?;
    let db = Db::source_read_only(path, PREFLIGHT_BUSY)?;
    if !check_table(&db, ACCOUNTS, &ACCOUNT_COLUMNS)? {
        return Err(db.incompatible("it has no `accounts` table".to_owned()));
    }
    let change_log = check_table(&db, "_changes", &CHANGE_COLUMNS)?;
    let rows = count(&db, "SELECT count(*) FROM accounts")?;
    Ok(SourceInfo { rows, change_log })
}

/// What the check of the target found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetInfo {
    /// Whether the target already held a migration from this source, which the
    /// pipeline now continues from its checkpoints.
    pub continued: bool,
}

/// Checks the target and gets it ready: creates the file if needed, checks every
/// table the migration uses, and creates the missing ones with their checkpoints.
///
/// `source_key` identifies the source; a target that records another source is
/// refused.
///
/// # Errors
///
/// A [`DbError`] naming the target: bad path, not a database, locked, a schema that
/// is not the migration's, rows it did not write, or another source.
pub fn prepare_target(path: &Path, source_key: &str) -> Result<TargetInfo, DbError> {
    check_directory(Role::Target, path)?;
    let mut db = Db::target(path, PREFLIGHT_BUSY)?;
    check_table(&db, ACCOUNTS, &ACCOUNT_COLUMNS)?;
    let has_checkpoints = check_table(&db, "_migration_checkpoint", &CHECKPOINT_COLUMNS)?;
    let has_source = check_table(&db, "_migration_source", &SOURCE_RECORD_COLUMNS)?;
    check_table(&db, "_staging_accounts", &ACCOUNT_COLUMNS)?;
    let recorded: Option<String> = if has_source {
        db.conn
            .query_row("SELECT path FROM _migration_source WHERE id = 1", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db.err())?
    } else {
        None
    };
    if let Some(recorded) = &recorded {
        if recorded != source_key {
            return Err(DbError::OtherSource {
                path: path.to_owned(),
                recorded: recorded.clone(),
            });
        }
    }
    let continued = recorded.is_some() && has_checkpoints;
    if !continued && !table_columns(&db, ACCOUNTS)?.is_empty() {
        let rows = count(&db, "SELECT count(*) FROM accounts")?;
        if rows > 0 {
            return Err(db.incompatible(format!(
                "table `accounts` already holds {rows} rows that no migration from this \
                 source wrote; use an empty target"
            )));
        }
    }
    // WAL lets the verification read while nothing writes, and keeps commits cheap.
    // Changing the journal mode takes the write lock: a locked target fails here.
    db.conn
        .pragma_update(None, "journal_mode", "WAL")
        .map_err(db.err())?;
    let tx = db
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| DbError::sqlite(Role::Target, path, e))?;
    tx.execute_batch(ACCOUNTS_TABLE)
        .and_then(|()| tx.execute_batch(TARGET_SCHEMA))
        .and_then(|()| {
            tx.execute(
                "INSERT OR IGNORE INTO _migration_source (id, path, snapshot_seq) \
                 VALUES (1, ?1, NULL)",
                [source_key],
            )
        })
        .and_then(|_| read_checkpoint(&tx, "load"))
        .and_then(|load| {
            // The load drops the staging table when it completes.
            if load.done {
                Ok(())
            } else {
                tx.execute_batch(STAGING_TABLE)
            }
        })
        .and_then(|()| tx.commit())
        .map_err(|e| DbError::sqlite(Role::Target, path, e))?;
    Ok(TargetInfo { continued })
}

fn count(db: &Db, sql: &str) -> Result<u64, DbError> {
    let n: i64 = db.conn.query_row(sql, [], |r| r.get(0)).map_err(db.err())?;
    Ok(u64::try_from(n).unwrap_or(0))
}

// ------------------------------------------------------------------ checkpoints

/// A unit's checkpoint, as stored in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Dump and load: the last `id` done. Sync: the last change-log `seq` applied.
    pub position: i64,
    /// How many rows (or changes) the unit has done in all its runs.
    pub items: u64,
    /// Whether the unit completed.
    pub done: bool,
}

/// Opens a batch's write transaction on the target (IMMEDIATE, so two writers take
/// turns instead of failing mid-batch) and reads `unit`'s checkpoint inside it: the
/// rows and the checkpoint a batch writes commit together.
fn begin_batch<'c>(
    conn: &'c mut Connection,
    path: &Path,
    unit: &str,
) -> Result<(rusqlite::Transaction<'c>, Checkpoint), DbError> {
    let target_err = |e| DbError::sqlite(Role::Target, path, e);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(target_err)?;
    let cp = read_checkpoint(&tx, unit).map_err(target_err)?;
    Ok((tx, cp))
}

fn read_checkpoint(conn: &Connection, unit: &str) -> rusqlite::Result<Checkpoint> {
    conn.query_row(
        "SELECT position, items, done FROM _migration_checkpoint WHERE unit = ?1",
        [unit],
        |r| {
            Ok(Checkpoint {
                position: r.get(0)?,
                items: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                done: r.get::<_, i64>(2)? != 0,
            })
        },
    )
}

fn write_checkpoint(conn: &Connection, unit: &str, cp: Checkpoint) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE _migration_checkpoint SET position = ?2, items = ?3, done = ?4 WHERE unit = ?1",
        params![
            unit,
            cp.position,
            i64::try_from(cp.items).unwrap_or(i64::MAX),
            i64::from(cp.done)
        ],
    )?;
    Ok(())
}

/// Reads a unit's checkpoint.
///
/// # Errors
///
/// A [`DbError`] naming the target.
pub fn checkpoint(target: &Db, unit: &str) -> Result<Checkpoint, DbError> {
    read_checkpoint(&target.conn, unit).map_err(target.err())
}

/// The pre-start check of the dump and the load: the rows the unit wrote must be
/// exactly the rows its checkpoint claims. A second copy of a run writing at the same
/// time would break this (or the primary key) at once.
///
/// # Errors
///
/// [`DbError::Inconsistent`] when the table and the checkpoint disagree.
pub fn check_checkpoint(target: &Db, unit: &str) -> Result<Checkpoint, DbError> {
    // One read transaction: the checkpoint and the count come from the same snapshot.
    let read = target.conn.unchecked_transaction().map_err(target.err())?;
    let cp = read_checkpoint(&read, unit).map_err(target.err())?;
    let table = match unit {
        "dump" if !cp.done => "_staging_accounts",
        // Once the load is complete the sync adds and removes rows: nothing to count.
        "load" if !cp.done => "accounts",
        _ => return Ok(cp),
    };
    let (rows, max_id): (i64, Option<i64>) = target
        .conn
        .query_row(
            &format!("SELECT count(*), max(id) FROM {table} WHERE id <= ?1"),
            [cp.position],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(target.err())?;
    let rows = u64::try_from(rows).unwrap_or(0);
    if rows != cp.items || max_id.unwrap_or(0) != cp.position {
        return Err(target.inconsistent(format!(
            "the {unit} checkpoint records {} rows up to id {}, but `{table}` holds {rows} \
             rows up to id {}",
            cp.items,
            cp.position,
            max_id.unwrap_or(0)
        )));
    }
    Ok(cp)
}

// ------------------------------------------------------------------ the units' batches

/// The result of one batch of the dump or the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Rows were copied; `items` is the unit's running total.
    More {
        /// Rows done in all runs so far.
        items: u64,
    },
    /// The unit is complete (now, or it already was).
    Done {
        /// Rows done in all runs.
        items: u64,
    },
}

/// Rows in the source (for the dump's progress bar).
///
/// # Errors
///
/// A [`DbError`] naming the source.
pub fn source_rows(source: &Db) -> Result<u64, DbError> {
    count(source, "SELECT count(*) FROM accounts")
}

/// Rows staged for the load (for its progress bar).
///
/// # Errors
///
/// A [`DbError`] naming the target.
pub fn staged_rows(target: &Db) -> Result<u64, DbError> {
    if table_columns(target, "_staging_accounts")?.is_empty() {
        return Ok(0);
    }
    count(target, "SELECT count(*) FROM _staging_accounts")
}

/// One batch of the dump: the next `batch` source rows (by id) into the staging
/// table, with the checkpoint, in one target transaction.
///
/// The first batch also records the change-log position *before* it reads a row: the
/// sync replays every change after it, so a row that changes while the dump reads is
/// corrected later, never lost.
///
/// # Errors
///
/// A [`DbError`] naming the database that failed; nothing of the batch is kept then.
pub fn dump_batch(
    source: &mut Db,
    target: &mut Db,
    change_log: bool,
    batch: usize,
) -> Result<Step, DbError> {
    let target_err = |e| DbError::sqlite(Role::Target, &target.path, e);
    let (tx, cp) = begin_batch(&mut target.conn, &target.path, "dump")?;
    if cp.done {
        return Ok(Step::Done { items: cp.items });
    }
    let needs_snapshot: bool = tx
        .query_row(
            "SELECT snapshot_seq IS NULL FROM _migration_source WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .map_err(target_err)?;
    let source_err = |e| DbError::sqlite(Role::Source, &source.path, e);
    let (snapshot, rows) = {
        // One read transaction: the change-log position is read before the rows.
        let read = source.conn.transaction().map_err(source_err)?;
        let snapshot = if needs_snapshot {
            Some(if change_log {
                read.query_row("SELECT coalesce(max(seq), 0) FROM _changes", [], |r| {
                    r.get::<_, i64>(0)
                })
                .map_err(source_err)?
            } else {
                0
            })
        } else {
            None
        };
        let rows = {
            let mut stmt = read
                .prepare_cached(&format!(
                    "SELECT {SELECT_COLUMNS} FROM accounts WHERE id > ?1 ORDER BY id LIMIT ?2"
                ))
                .map_err(source_err)?;
            let rows = stmt
                .query_map(params![cp.position, batch_limit(batch)], Account::from_row)
                .map_err(source_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(source_err)?;
            rows
        };
        read.commit().map_err(source_err)?;
        (snapshot, rows)
    };
    if let Some(seq) = snapshot {
        tx.execute(
            "UPDATE _migration_source SET snapshot_seq = ?1 WHERE id = 1",
            [seq],
        )
        .map_err(target_err)?;
    }
    let Some(last) = rows.last().map(|r| r.id) else {
        write_checkpoint(&tx, "dump", Checkpoint { done: true, ..cp }).map_err(target_err)?;
        tx.commit().map_err(target_err)?;
        return Ok(Step::Done { items: cp.items });
    };
    {
        let mut insert = tx
            .prepare_cached(&format!(
                "INSERT INTO _staging_accounts ({SELECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ))
            .map_err(target_err)?;
        for a in &rows {
            insert
                .execute(params![
                    a.id,
                    a.name,
                    a.email,
                    a.country,
                    a.balance_cents,
                    a.updated_at
                ])
                .map_err(target_err)?;
        }
    }
    let items = cp.items + rows.len() as u64;
    write_checkpoint(
        &tx,
        "dump",
        Checkpoint {
            position: last,
            items,
            done: false,
        },
    )
    .map_err(target_err)?;
    tx.commit().map_err(target_err)?;
    Ok(Step::More { items })
}

/// One batch of the load: the next `batch` staged rows (by id) into `accounts`, with
/// the checkpoint, in one transaction. The plain `INSERT` makes any row written twice
/// a primary-key error instead of a silent duplicate.
///
/// When nothing is left, the load is marked complete and the staging table dropped,
/// in the same transaction.
///
/// # Errors
///
/// A [`DbError`] naming the target; nothing of the batch is kept then.
pub fn load_batch(target: &mut Db, batch: usize) -> Result<Step, DbError> {
    let target_err = |e| DbError::sqlite(Role::Target, &target.path, e);
    let (tx, cp) = begin_batch(&mut target.conn, &target.path, "load")?;
    if cp.done {
        return Ok(Step::Done { items: cp.items });
    }
    let limit = batch_limit(batch);
    let (n, last): (i64, Option<i64>) = tx
        .query_row(
            "SELECT count(*), max(id) FROM \
             (SELECT id FROM _staging_accounts WHERE id > ?1 ORDER BY id LIMIT ?2)",
            params![cp.position, limit],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(target_err)?;
    let Some(last) = last else {
        write_checkpoint(&tx, "load", Checkpoint { done: true, ..cp }).map_err(target_err)?;
        tx.execute_batch("DROP TABLE _staging_accounts")
            .map_err(target_err)?;
        tx.commit().map_err(target_err)?;
        return Ok(Step::Done { items: cp.items });
    };
    tx.execute(
        &format!(
            "INSERT INTO accounts ({SELECT_COLUMNS}) SELECT {SELECT_COLUMNS} \
             FROM _staging_accounts WHERE id > ?1 ORDER BY id LIMIT ?2"
        ),
        params![cp.position, limit],
    )
    .map_err(target_err)?;
    let items = cp.items + u64::try_from(n).unwrap_or(0);
    write_checkpoint(
        &tx,
        "load",
        Checkpoint {
            position: last,
            items,
            done: false,
        },
    )
    .map_err(target_err)?;
    tx.commit().map_err(target_err)?;
    Ok(Step::More { items })
}

/// The result of one batch of the sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStep {
    /// `applied` changes were applied (0: the target is caught up for now); `items`
    /// is the running total.
    Applied {
        /// Changes applied by this batch.
        applied: u64,
        /// Changes applied in all runs so far.
        items: u64,
    },
    /// The sync already completed.
    Done {
        /// Changes applied in all runs.
        items: u64,
    },
}

/// One batch of the sync: the next `batch` change-log entries after the checkpoint.
/// Each entry is applied by copying the row's *current* state from the source (or
/// deleting it when it is gone), so applying an entry twice, or an entry whose change
/// the dump already saw, gives the same result.
///
/// # Errors
///
/// A [`DbError`] naming the database that failed; nothing of the batch is kept then.
pub fn sync_batch(
    source: &mut Db,
    target: &mut Db,
    change_log: bool,
    batch: usize,
) -> Result<SyncStep, DbError> {
    let target_err = |e| DbError::sqlite(Role::Target, &target.path, e);
    let source_err = |e| DbError::sqlite(Role::Source, &source.path, e);
    let (tx, cp) = begin_batch(&mut target.conn, &target.path, "sync")?;
    if cp.done {
        return Ok(SyncStep::Done { items: cp.items });
    }
    let snapshot: Option<i64> = tx
        .query_row(
            "SELECT snapshot_seq FROM _migration_source WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .map_err(target_err)?;
    let Some(snapshot) = snapshot else {
        return Err(DbError::Inconsistent {
            role: Role::Target,
            path: target.path.clone(),
            detail: "the sync started before the dump recorded its change-log position".to_owned(),
        });
    };
    if !change_log {
        return Ok(SyncStep::Applied {
            applied: 0,
            items: cp.items,
        });
    }
    let from = cp.position.max(snapshot);
    let (changes, rows) = {
        let read = source.conn.transaction().map_err(source_err)?;
        let changes: Vec<(i64, i64)> = {
            let mut stmt = read
                .prepare_cached(
                    "SELECT seq, account_id FROM _changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )
                .map_err(source_err)?;
            let changes = stmt
                .query_map(params![from, batch_limit(batch)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(source_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(source_err)?;
            changes
        };
        let mut ids: Vec<i64> = changes.iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut rows = Vec::with_capacity(ids.len());
        {
            let mut stmt = read
                .prepare_cached(&format!(
                    "SELECT {SELECT_COLUMNS} FROM accounts WHERE id = ?1"
                ))
                .map_err(source_err)?;
            for id in ids {
                let row = stmt
                    .query_row([id], Account::from_row)
                    .optional()
                    .map_err(source_err)?;
                rows.push((id, row));
            }
        }
        read.commit().map_err(source_err)?;
        (changes, rows)
    };
    let Some(&(last, _)) = changes.last() else {
        return Ok(SyncStep::Applied {
            applied: 0,
            items: cp.items,
        });
    };
    {
        let mut upsert = tx
            .prepare_cached(&format!(
                "INSERT INTO accounts ({SELECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (id) DO UPDATE SET name = excluded.name, email = excluded.email, \
                 country = excluded.country, balance_cents = excluded.balance_cents, \
                 updated_at = excluded.updated_at"
            ))
            .map_err(target_err)?;
        let mut delete = tx
            .prepare_cached("DELETE FROM accounts WHERE id = ?1")
            .map_err(target_err)?;
        for (id, row) in &rows {
            match row {
                Some(a) => upsert.execute(params![
                    a.id,
                    a.name,
                    a.email,
                    a.country,
                    a.balance_cents,
                    a.updated_at
                ]),
                None => delete.execute([id]),
            }
            .map_err(target_err)?;
        }
    }
    let applied = changes.len() as u64;
    let items = cp.items + applied;
    write_checkpoint(
        &tx,
        "sync",
        Checkpoint {
            position: last,
            items,
            done: false,
        },
    )
    .map_err(target_err)?;
    tx.commit().map_err(target_err)?;
    Ok(SyncStep::Applied { applied, items })
}

/// Marks the sync complete: called once a batch found nothing left after the writer
/// had stopped.
///
/// # Errors
///
/// A [`DbError`] naming the target.
pub fn finish_sync(target: &mut Db) -> Result<u64, DbError> {
    let target_err = |e| DbError::sqlite(Role::Target, &target.path, e);
    let (tx, cp) = begin_batch(&mut target.conn, &target.path, "sync")?;
    write_checkpoint(&tx, "sync", Checkpoint { done: true, ..cp }).map_err(target_err)?;
    tx.commit().map_err(target_err)?;
    Ok(cp.items)
}

fn batch_limit(batch: usize) -> i64 {
    i64::try_from(batch).unwrap_or(i64::MAX)
}

// ------------------------------------------------------------------ the generated source

const FIRST_NAMES: [&str; 16] = [
    "Ada", "Alan", "Barbara", "Claude", "Donald", "Edsger", "Frances", "Grace", "John", "Ken",
    "Leslie", "Margaret", "Niklaus", "Radia", "Tony", "Yukihiro",
];
const LAST_NAMES: [&str; 16] = [
    "Allen", "Backus", "Dijkstra", "Hamilton", "Hopper", "Kay", "Knuth", "Lamport", "Liskov",
    "Lovelace", "McCarthy", "Perlman", "Ritchie", "Shannon", "Thompson", "Wirth",
];
const COUNTRIES: [&str; 12] = [
    "AR", "BR", "CA", "CN", "DE", "FR", "IN", "JP", "KE", "NZ", "SE", "US",
];
/// 2024-01-01T00:00:00Z: the generated rows' timestamps start here.
const EPOCH: i64 = 1_704_067_200;

fn fake_account(rng: &mut fastrand::Rng, id: i64) -> (String, String, &'static str, i64) {
    let first = FIRST_NAMES[rng.usize(..FIRST_NAMES.len())];
    let last = LAST_NAMES[rng.usize(..LAST_NAMES.len())];
    let name = format!("{first} {last}");
    let email = format!(
        "{}.{}{id}@example.org",
        first.to_lowercase(),
        last.to_lowercase()
    );
    let country = COUNTRIES[rng.usize(..COUNTRIES.len())];
    let balance = rng.i64(-50_000..5_000_000);
    (name, email, country, balance)
}

/// Creates a source database at `path` (which must not exist) with `rows` accounts,
/// then installs the change log and its triggers.
///
/// # Errors
///
/// A [`DbError`] naming the source.
pub fn generate_source(path: &Path, rows: u64, seed: u64) -> Result<(), DbError> {
    check_directory(Role::Source, path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut db = Db::open(Role::Source, path, flags, WORK_BUSY)?;
    db.conn
        .pragma_update(None, "journal_mode", "WAL")
        .map_err(db.err())?;
    let source_err = |e| DbError::sqlite(Role::Source, path, e);
    let tx = db.conn.transaction().map_err(source_err)?;
    tx.execute_batch(ACCOUNTS_TABLE).map_err(source_err)?;
    {
        let mut insert = tx
            .prepare(&format!(
                "INSERT INTO accounts ({SELECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ))
            .map_err(source_err)?;
        let mut rng = fastrand::Rng::with_seed(seed);
        let rows = i64::try_from(rows).unwrap_or(i64::MAX);
        for id in 1..=rows {
            let (name, email, country, balance) = fake_account(&mut rng, id);
            insert
                .execute(params![id, name, email, country, balance, EPOCH + id * 7])
                .map_err(source_err)?;
        }
    }
    tx.execute_batch(CHANGE_LOG).map_err(source_err)?;
    tx.commit().map_err(source_err)?;
    Ok(())
}

/// What the writer changed in one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    /// Rows inserted.
    pub inserted: u64,
    /// Rows updated.
    pub updated: u64,
    /// Rows deleted (attempts on an id already gone change nothing).
    pub deleted: u64,
}

impl Writes {
    /// The total.
    pub fn total(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }

    /// Adds another batch's writes.
    pub fn add(&mut self, other: Writes) {
        self.inserted += other.inserted;
        self.updated += other.updated;
        self.deleted += other.deleted;
    }
}

/// One batch of the writer: `ops` random inserts, updates and deletes in one source
/// transaction. The triggers log each one. `max_id` is the highest id so far.
///
/// # Errors
///
/// A [`DbError`] naming the source.
pub fn write_batch(
    source: &mut Db,
    rng: &mut fastrand::Rng,
    ops: usize,
    max_id: &mut i64,
    clock: i64,
) -> Result<Writes, DbError> {
    let source_err = |e| DbError::sqlite(Role::Source, &source.path, e);
    let tx = source
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(source_err)?;
    let mut writes = Writes::default();
    for _ in 0..ops {
        let roll = rng.u8(0..100);
        let id = rng.i64(1..=(*max_id).max(1));
        if roll < 70 {
            let changed = tx
                .execute(
                    "UPDATE accounts SET balance_cents = balance_cents + ?2, updated_at = ?3 \
                     WHERE id = ?1",
                    params![id, rng.i64(-10_000..10_000), EPOCH + clock],
                )
                .map_err(source_err)?;
            writes.updated += changed as u64;
        } else if roll < 90 {
            let new_id = *max_id + 1;
            let (name, email, country, balance) = fake_account(rng, new_id);
            tx.execute(
                &format!("INSERT INTO accounts ({SELECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                params![new_id, name, email, country, balance, EPOCH + clock],
            )
            .map_err(source_err)?;
            *max_id = new_id;
            writes.inserted += 1;
        } else {
            let changed = tx
                .execute("DELETE FROM accounts WHERE id = ?1", [id])
                .map_err(source_err)?;
            writes.deleted += changed as u64;
        }
    }
    tx.commit().map_err(source_err)?;
    Ok(writes)
}

/// The highest id in the source.
///
/// # Errors
///
/// A [`DbError`] naming the source.
pub fn max_id(source: &Db) -> Result<i64, DbError> {
    source
        .conn
        .query_row("SELECT coalesce(max(id), 0) FROM accounts", [], |r| {
            r.get(0)
        })
        .map_err(source.err())
}

// ------------------------------------------------------------------ verification

/// A table's row count and order-independent-of-storage checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    /// Rows in the table.
    pub rows: u64,
    /// FNV-1a (64 bit) over every row, in id order, every field length-prefixed.
    pub checksum: u64,
}

struct Fnv(u64);

impl Fnv {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Fnv::PRIME);
        }
    }

    fn int(&mut self, v: i64) {
        self.bytes(&v.to_le_bytes());
    }

    fn text(&mut self, s: &str) {
        self.bytes(&(s.len() as u64).to_le_bytes());
        self.bytes(s.as_bytes());
    }
}

/// The digest of `accounts`.
///
/// # Errors
///
/// A [`DbError`] naming the database.
pub fn digest(db: &Db) -> Result<Digest, DbError> {
    let mut stmt = db
        .conn
        .prepare(&format!(
            "SELECT {SELECT_COLUMNS} FROM accounts ORDER BY id"
        ))
        .map_err(db.err())?;
    let mut rows = stmt.query([]).map_err(db.err())?;
    let mut fnv = Fnv(Fnv::OFFSET);
    let mut count = 0u64;
    while let Some(row) = rows.next().map_err(db.err())? {
        let a = Account::from_row(row).map_err(db.err())?;
        fnv.int(a.id);
        fnv.text(&a.name);
        fnv.text(&a.email);
        fnv.text(&a.country);
        fnv.int(a.balance_cents);
        fnv.int(a.updated_at);
        count += 1;
    }
    Ok(Digest {
        rows: count,
        checksum: fnv.0,
    })
}

/// The target's checkpoints, for the summary: (unit, checkpoint).
///
/// # Errors
///
/// A [`DbError`] naming the target.
pub fn checkpoints(target: &Db) -> Result<Vec<(String, Checkpoint)>, DbError> {
    let mut stmt = target
        .conn
        .prepare("SELECT unit FROM _migration_checkpoint ORDER BY rowid")
        .map_err(target.err())?;
    let units = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(target.err())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(target.err())?;
    units
        .into_iter()
        .map(|unit| {
            let cp = checkpoint(target, &unit)?;
            Ok((unit, cp))
        })
        .collect()
}

// ------------------------------------------------------------------ fencing

/// The message of a write refused by [`fence_writes`].
#[allow(
    dead_code,
    reason = "the cluster mode's (feature etcd); other includers of this file do not fence"
)]
const FENCED: &str = "fenced: a newer owner has written";

/// Fences every checkpoint write made through `target` with `token` (the cluster
/// mode's fence token): the target keeps the highest token that wrote, in the same
/// transaction as the batch's rows (every batch that writes rows writes its
/// checkpoint), and a batch with a lower token fails and leaves nothing behind.
///
/// The check is a temporary trigger of this connection only, so connections made
/// without a token (the single-process program) are not affected.
///
/// # Errors
///
/// A [`DbError`] naming the target.
#[allow(
    dead_code,
    reason = "the cluster mode's (feature etcd); other includers of this file do not fence"
)]
pub fn fence_writes(target: &Db, token: i64) -> Result<(), DbError> {
    target
        .conn
        .execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS _migration_fence (
                 id INTEGER PRIMARY KEY CHECK (id = 1), token INTEGER NOT NULL);
             INSERT OR IGNORE INTO _migration_fence (id, token) VALUES (1, 0);
             DROP TRIGGER IF EXISTS temp._migration_fence_check;
             CREATE TEMP TRIGGER _migration_fence_check
             BEFORE UPDATE ON main._migration_checkpoint
             BEGIN
                 SELECT RAISE(ABORT, '{FENCED}')
                 FROM main._migration_fence WHERE token > {token};
                 UPDATE main._migration_fence SET token = {token} WHERE token < {token};
             END;"
        ))
        .map_err(target.err())
}

/// Whether `error` is a write refused by [`fence_writes`].
#[allow(
    dead_code,
    reason = "the cluster mode's (feature etcd); other includers of this file do not fence"
)]
pub fn is_fenced(error: &DbError) -> bool {
    matches!(error, DbError::Sqlite { source, .. } if source.to_string().contains(FENCED))
}

/// Whether `error` is the target being locked by another writer (worth a retry).
#[allow(
    dead_code,
    reason = "the cluster mode's (feature etcd); other includers of this file do not fence"
)]
pub fn is_locked(error: &DbError) -> bool {
    matches!(error, DbError::Locked { .. })
}

/// The highest token that wrote to the target (0 before any fenced write).
///
/// # Errors
///
/// A [`DbError`] naming the target.
#[allow(
    dead_code,
    reason = "the cluster mode's (feature etcd); other includers of this file do not fence"
)]
pub fn fence_token(target: &Db) -> Result<i64, DbError> {
    target
        .conn
        .query_row("SELECT token FROM _migration_fence WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map(Option::unwrap_or_default)
        .map_err(target.err())
}
