//! The migrate example (the README's main job) at small scale, through its own code:
//! a 5,000-row migration paused, resumed, stopped and restarted under a live writer
//! ends with the target equal to the source and never more than one live run, on the
//! current-thread runtime (with tokio's paused clock) and on the multi-thread runtime.
//! Bad input (a missing directory, a file that is not a database, a locked target, an
//! incompatible schema, another source's target, bad flags) gets a typed error, and
//! the source's bytes never change.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use taskstage_examples::migrate::{cli, controller, db, live, program, report};

use cli::{CliError, Invocation, Options};
use controller::{Act, Trigger};
use db::{DbError, Role};
use program::MigrateError;
use report::{Screen, Summary};

/// A fresh directory under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "taskstage-migrate-test-{}-{name}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small(seed: u64) -> Options {
    Options {
        rows: 5_000,
        pauses: 12,
        quiet: true,
        ..Options::with_seed(seed)
    }
}

async fn run(options: &Options) -> Result<Summary, MigrateError> {
    let screen = Arc::new(Screen::new(true));
    let result = program::run(options, Arc::clone(&screen)).await;
    screen.finish();
    result
}

/// Everything a passing run must show, checked one by one so a failure says which.
fn assert_passed(summary: &Summary) {
    let text = report::render(summary);
    assert!(summary.failure.is_none(), "{text}");
    assert_eq!(summary.max_live, 1, "{text}");
    assert_eq!(summary.live_at_end, 0, "{text}");
    assert_eq!(summary.counts.live_after_pause, 0, "{text}");
    let (source, target) = (
        summary.source_digest.unwrap(),
        summary.target_digest.unwrap(),
    );
    assert_eq!(source, target, "{text}");
    assert!(summary.verified(), "{text}");
    assert!(summary.problems().is_empty(), "{text}");
    assert!(text.contains("verification: passed"), "{text}");
    for (unit, cp) in &summary.checkpoints {
        assert!(cp.done, "checkpoint {unit} is not complete\n{text}");
    }
}

/// The generated-source run: a live writer, pauses, one stop and restart.
fn assert_full_run(summary: &Summary) {
    assert_passed(summary);
    let text = report::render(summary);
    let c = summary.counts;
    assert!(c.pauses > 0, "{text}");
    assert!(
        c.pauses + c.skipped >= 12,
        "every scripted pause is done or skipped\n{text}"
    );
    assert!(c.pauses_at_switch >= 1, "{text}");
    assert_eq!(c.stops, 1, "{text}");
    assert_eq!(c.restarts, 1, "{text}");
    // Every pause that reached Paused was resumed (once: early or after the hold).
    assert_eq!(c.resumes, c.pauses, "{text}");
    assert!(
        summary.writes.total() > 0,
        "the writer wrote nothing\n{text}"
    );
    // A stop and a restart: the load ran in both tasks, the second from its checkpoint.
    assert!(summary.runs[1].runs >= 2, "{text}");
    assert!(summary.runs[1].continued >= 1, "{text}");
    // Every run entered the live counter, and the timeline saw both tasks finish/stop.
    let runs: u32 = summary.runs.iter().map(|r| r.runs).sum();
    assert_eq!(runs as usize, summary.runs_entered, "{text}");
    assert!(text.contains("task 2"), "{text}");
    assert!(text.contains("Finished"), "{text}");
    assert!(text.contains("Stopped"), "{text}");
    // The source grew by the writer's inserts and shrank by its deletes.
    let rows = summary.source_digest.unwrap().rows;
    assert_eq!(
        rows,
        5_000 + summary.writes.inserted - summary.writes.deleted,
        "{text}"
    );
    // A passing run removes its work directory.
    assert!(summary.kept_dir.is_none(), "{text}");
    assert!(!summary.source.exists(), "{text}");
}

/// Fails the test, naming it, if it has not finished within a minute (real time: these
/// run the migration on SQLite files). A failure condition, not synchronisation: a
/// state that never comes fails the test instead of hanging the suite.
async fn within<F: std::future::Future<Output = ()>>(test: &str, body: F) {
    if tokio::time::timeout(std::time::Duration::from_secs(60), body)
        .await
        .is_err()
    {
        panic!("{test}: a state it waits for never came within 60 s");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_small_migration_passes_on_the_current_thread_runtime() {
    within(
        "a_small_migration_passes_on_the_current_thread_runtime",
        async move {
            let summary = run(&small(7)).await.expect("the migration starts");
            assert_full_run(&summary);
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_migration_passes_on_the_multi_thread_runtime() {
    within(
        "a_small_migration_passes_on_the_multi_thread_runtime",
        async move {
            let summary = run(&small(1_234)).await.expect("the migration starts");
            assert_full_run(&summary);
        },
    )
    .await
}

#[test]
fn the_live_run_counter_sees_an_overlap_and_a_batch_outliving_its_run() {
    let runs = Arc::new(live::LiveRuns::default());
    let first = runs.enter();
    let batch = first.clone(); // a blocking batch the first run started
    drop(first);
    assert_eq!(runs.now(), 1, "the batch keeps the first run live");
    let second = runs.enter();
    assert_eq!(runs.max(), 2, "two live copies must be counted as two");
    drop(batch);
    drop(second);
    assert_eq!((runs.now(), runs.max(), runs.entered()), (0, 2, 2));
}

#[test]
fn the_same_seed_gives_the_same_script() {
    let script = controller::plan(99, 12);
    assert_eq!(script, controller::plan(99, 12));
    assert_ne!(script, controller::plan(100, 12));
    let pauses = script
        .iter()
        .filter(|a| matches!(a.act, Act::Pause { .. }))
        .count();
    assert_eq!(pauses, 12);
    let switches: Vec<_> = script
        .iter()
        .filter_map(|a| match a.trigger {
            Trigger::Switch { into } => Some(into),
            _ => None,
        })
        .collect();
    assert_eq!(switches, [1, 2], "one pause at each unit switch");
    let stops = script
        .iter()
        .filter(|a| a.act == Act::StopAndRestart)
        .count();
    assert_eq!(stops, 1);
    // No pauses: only the stop and restart remains.
    assert_eq!(controller::plan(99, 0).len(), 1);
}

// ------------------------------------------------------------------ existing files

fn generate(path: &Path, rows: u64) {
    db::generate_source(path, rows, 3).expect("generate a source");
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read the file")
}

fn existing(source: &Path, target: &Path) -> Options {
    Options {
        source: Some(source.to_owned()),
        target: Some(target.to_owned()),
        pauses: 4,
        quiet: true,
        ..Options::with_seed(11)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_source_is_only_read_and_a_finished_target_continues() {
    within(
        "an_existing_source_is_only_read_and_a_finished_target_continues",
        async move {
            let dir = Scratch::new("existing");
            let (source, target) = (dir.path("source.db"), dir.path("target.db"));
            generate(&source, 3_000);
            let before = bytes(&source);

            let summary = run(&existing(&source, &target)).await.expect("starts");
            assert_passed(&summary);
            assert_eq!(
                summary.writes.total(),
                0,
                "no writer on a source it did not create"
            );
            assert_eq!(summary.target_digest.unwrap().rows, 3_000);
            assert!(!summary.continued_target);
            assert_eq!(bytes(&source), before, "the source changed");

            // Again, on the same target: every unit finds its checkpoint complete.
            let again = run(&existing(&source, &target)).await.expect("starts");
            assert_passed(&again);
            assert!(again.continued_target);
            assert_eq!(again.target_digest, summary.target_digest);
            assert_eq!(bytes(&source), before, "the source changed");
        },
    )
    .await
}

/// Runs a migration of an existing `source` that must be refused, and checks that the
/// source's bytes are exactly as before.
async fn refused_leaving_source(source: &Path, target: &Path) -> DbError {
    let before = bytes(source);
    let err = refused(&existing(source, target)).await;
    assert_eq!(bytes(source), before, "the source changed");
    err
}

async fn refused(options: &Options) -> DbError {
    match run(options).await {
        Ok(summary) => panic!("expected an error, got\n{}", report::render(&summary)),
        Err(MigrateError::Db(e)) => e,
        Err(e) => panic!("expected a database error, got {e}"),
    }
}

#[tokio::test]
async fn a_target_in_a_missing_directory_is_refused() {
    within("a_target_in_a_missing_directory_is_refused", async move {
    let dir = Scratch::new("missing-dir");
    let source = dir.path("source.db");
    generate(&source, 200);
    let target = dir.path("no/such/dir/target.db");
    let err = refused_leaving_source(&source, &target).await;
    // Also with a generated source: refused before the source is generated.
    let generated = Options {
        target: Some(target.clone()),
        ..small(1)
    };
    let early = refused(&generated).await;
    assert!(
        matches!(
            &early,
            DbError::MissingDirectory {
                role: Role::Target,
                ..
            }
        ),
        "{early:?}"
    );
    assert!(
        matches!(&err, DbError::MissingDirectory { role: Role::Target, path, .. } if *path == target),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(err.to_string().contains("target database"), "{err}");
}).await
}

#[tokio::test]
async fn a_missing_source_file_is_refused() {
    within("a_missing_source_file_is_refused", async move {
        let dir = Scratch::new("missing-source");
        let source = dir.path("nothing-here.db");
        let err = refused(&existing(&source, &dir.path("target.db"))).await;
        assert!(
            matches!(
                &err,
                DbError::MissingFile {
                    role: Role::Source,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!source.exists(), "a missing source must not be created");
    })
    .await
}

#[tokio::test]
async fn files_that_are_not_databases_are_refused_and_left_alone() {
    within("files_that_are_not_databases_are_refused_and_left_alone", async move {
    let dir = Scratch::new("not-a-db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 13) as u8).collect();

    // A corrupt source.
    let source = dir.path("source.db");
    std::fs::write(&source, &garbage).unwrap();
    let err = refused(&existing(&source, &dir.path("target.db"))).await;
    assert!(
        matches!(
            &err,
            DbError::NotADatabase {
                role: Role::Source,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a database"), "{err}");
    assert_eq!(bytes(&source), garbage, "the source changed");

    // A corrupt target, with a good source.
    let good = dir.path("good.db");
    generate(&good, 200);
    let target = dir.path("target.db");
    std::fs::write(&target, &garbage).unwrap();
    let err = refused_leaving_source(&good, &target).await;
    assert!(
        matches!(&err, DbError::NotADatabase { role: Role::Target, path } if *path == target),
        "{err:?}"
    );
    assert_eq!(bytes(&target), garbage, "the corrupt target was written to");
}).await
}

#[tokio::test]
async fn a_locked_target_is_refused() {
    within("a_locked_target_is_refused", async move {
        let dir = Scratch::new("locked");
        let source = dir.path("source.db");
        generate(&source, 200);
        let target = dir.path("target.db");
        let holder = rusqlite::Connection::open(&target).unwrap();
        holder
            .execute_batch(
                "CREATE TABLE unrelated (x); BEGIN EXCLUSIVE; INSERT INTO unrelated VALUES (1);",
            )
            .unwrap();
        let err = refused_leaving_source(&source, &target).await;
        assert!(
            matches!(
                &err,
                DbError::Locked {
                    role: Role::Target,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("locked"), "{err}");
        holder.execute_batch("ROLLBACK").unwrap();
    })
    .await
}

#[tokio::test]
async fn a_locked_source_is_refused_and_left_alone() {
    within("a_locked_source_is_refused_and_left_alone", async move {
        let dir = Scratch::new("locked-source");
        let source = dir.path("source.db");
        generate(&source, 200);
        // In rollback-journal mode an exclusive lock keeps readers out too.
        let holder = rusqlite::Connection::open(&source).unwrap();
        let mode: String = holder
            .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete");
        holder
            .execute_batch("BEGIN EXCLUSIVE; UPDATE accounts SET name = name WHERE id = 1;")
            .unwrap();
        let err = refused_leaving_source(&source, &dir.path("target.db")).await;
        assert!(
            matches!(
                &err,
                DbError::Locked {
                    role: Role::Source,
                    ..
                }
            ),
            "{err:?}"
        );
        holder.execute_batch("ROLLBACK").unwrap();
    })
    .await
}

#[tokio::test]
async fn a_target_with_an_incompatible_schema_is_refused() {
    within(
        "a_target_with_an_incompatible_schema_is_refused",
        async move {
            let dir = Scratch::new("schema");
            let source = dir.path("source.db");
            generate(&source, 200);

            // A different `accounts` table.
            let target = dir.path("target.db");
            rusqlite::Connection::open(&target)
                .unwrap()
                .execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
                .unwrap();
            let err = refused_leaving_source(&source, &target).await;
            assert!(
                matches!(&err, DbError::IncompatibleSchema { role: Role::Target, detail, .. }
            if detail.contains("accounts") && detail.contains("balance_cents")),
                "{err:?}"
            );

            // The right table, but holding rows no migration wrote.
            let filled = dir.path("filled.db");
            let conn = rusqlite::Connection::open(&filled).unwrap();
            conn.execute_batch(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
             country TEXT NOT NULL, balance_cents INTEGER NOT NULL, updated_at INTEGER NOT NULL);
         INSERT INTO accounts VALUES (1, 'x', 'x@example.org', 'SE', 0, 0);",
    )
    .unwrap();
            drop(conn);
            let err = refused_leaving_source(&source, &filled).await;
            assert!(
                matches!(&err, DbError::IncompatibleSchema { role: Role::Target, detail, .. }
            if detail.contains("1 rows")),
                "{err:?}"
            );
        },
    )
    .await
}

#[tokio::test]
async fn a_source_without_the_migrated_table_is_refused() {
    within(
        "a_source_without_the_migrated_table_is_refused",
        async move {
            let dir = Scratch::new("source-schema");
            let source = dir.path("source.db");
            rusqlite::Connection::open(&source)
                .unwrap()
                .execute_batch("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
                .unwrap();
            let err = refused_leaving_source(&source, &dir.path("target.db")).await;
            assert!(
                matches!(
                    &err,
                    DbError::IncompatibleSchema {
                        role: Role::Source,
                        ..
                    }
                ),
                "{err:?}"
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_from_another_source_is_refused() {
    within("a_target_from_another_source_is_refused", async move {
        let dir = Scratch::new("other-source");
        let (a, b, target) = (dir.path("a.db"), dir.path("b.db"), dir.path("target.db"));
        generate(&a, 300);
        generate(&b, 300);
        assert_passed(&run(&existing(&a, &target)).await.expect("starts"));
        let err = refused_leaving_source(&b, &target).await;
        assert!(matches!(&err, DbError::OtherSource { .. }), "{err:?}");
        assert!(err.to_string().contains("another source"), "{err}");
    })
    .await
}

#[test]
fn every_input_error_exits_with_status_2() {
    let err = MigrateError::Db(DbError::NotADatabase {
        role: Role::Source,
        path: PathBuf::from("x.db"),
    });
    assert_eq!(err.exit_code(), 2);
}

// ------------------------------------------------------------------ the data design

/// Defence in depth, apart from the lifecycle: each batch reads its checkpoint inside
/// its own write transaction, so even two loaders at once (what the original race
/// produced) take turns on the write lock and never insert a row twice.
#[test]
fn two_loaders_at_once_take_turns_and_never_write_a_row_twice() {
    let dir = Scratch::new("two-loaders");
    let (source, target) = (dir.path("source.db"), dir.path("target.db"));
    generate(&source, 4_000);
    let key = source.display().to_string();
    db::prepare_target(&target, &key).unwrap();
    let mut src = db::Db::source_read_only(&source, db::WORK_BUSY).unwrap();
    let mut dst = db::Db::target(&target, db::WORK_BUSY).unwrap();
    while let db::Step::More { .. } = db::dump_batch(&mut src, &mut dst, true, 500).unwrap() {}
    drop(dst);

    let loaders: Vec<_> = (0..2)
        .map(|_| {
            let target = target.clone();
            std::thread::spawn(move || {
                let mut db = db::Db::target(&target, db::WORK_BUSY).unwrap();
                let mut batches = 0;
                while let db::Step::More { .. } = db::load_batch(&mut db, 100).unwrap() {
                    batches += 1;
                }
                batches
            })
        })
        .collect();
    let batches: u32 = loaders.into_iter().map(|l| l.join().unwrap()).sum();
    assert_eq!(
        batches, 40,
        "4,000 rows in batches of 100, each written once"
    );

    let dst = db::Db::target(&target, db::WORK_BUSY).unwrap();
    let load = db::check_checkpoint(&dst, "load").unwrap();
    assert!(load.done);
    assert_eq!(load.items, 4_000);
    let src = db::Db::source_read_only(&source, db::WORK_BUSY).unwrap();
    assert_eq!(db::digest(&dst).unwrap(), db::digest(&src).unwrap());
}

// ------------------------------------------------------------------ the command line

fn parse(args: &[&str]) -> Result<Invocation, CliError> {
    cli::parse(args.iter().map(OsString::from), 5)
}

#[test]
fn flags_parse_into_options() {
    let Ok(Invocation::Run(options)) = parse(&[
        "--source", "s.db", "--target", "t.db", "--seed", "9", "--pauses", "3", "--quiet", "--keep",
    ]) else {
        panic!("should parse");
    };
    assert_eq!(options.source, Some(PathBuf::from("s.db")));
    assert_eq!(options.target, Some(PathBuf::from("t.db")));
    assert_eq!((options.seed, options.pauses), (9, 3));
    assert!(options.quiet && options.keep);
    assert_eq!(options.rows, cli::DEFAULT_ROWS);

    let Ok(Invocation::Run(defaults)) = parse(&[]) else {
        panic!("no arguments is a run");
    };
    assert_eq!(
        defaults,
        Options::with_seed(5),
        "the default seed is the caller's"
    );
    assert_eq!(
        parse(&["--rows", "1_000"]).map(|i| match i {
            Invocation::Run(o) => o.rows,
            Invocation::Help => 0,
        }),
        Ok(1_000)
    );
    assert_eq!(parse(&["--quiet", "-h"]), Ok(Invocation::Help));
    for option in [
        "--source", "--target", "--rows", "--seed", "--pauses", "--quiet", "--keep",
    ] {
        assert!(
            cli::USAGE.contains(option),
            "--help does not mention {option}"
        );
    }
}

#[test]
fn bad_flags_get_typed_errors() {
    assert_eq!(
        parse(&["--rowz", "5"]),
        Err(CliError::UnknownOption("--rowz".into()))
    );
    assert_eq!(parse(&["--seed"]), Err(CliError::MissingValue("--seed")));
    assert!(matches!(
        parse(&["--rows", "many"]),
        Err(CliError::BadNumber { flag: "--rows", .. })
    ));
    assert!(matches!(
        parse(&["--rows", "0"]),
        Err(CliError::BadNumber {
            flag: "--rows",
            min: 1,
            ..
        })
    ));
    assert!(matches!(
        parse(&["--pauses", "-1"]),
        Err(CliError::BadNumber {
            flag: "--pauses",
            ..
        })
    ));
    assert_eq!(
        parse(&["--quiet", "--quiet"]),
        Err(CliError::Repeated("--quiet"))
    );
    assert_eq!(
        parse(&["--target", ""]),
        Err(CliError::EmptyPath("--target"))
    );
    assert_eq!(
        parse(&["--source", "s.db", "--rows", "10"]),
        Err(CliError::RowsWithSource)
    );
    let message = parse(&["--rows", "many"]).unwrap_err().to_string();
    assert!(
        message.contains("--rows") && message.contains("many"),
        "{message}"
    );
}
