//! A real migration on SQLite, paused and resumed under load.
//!
//! Generates a source database (200,000 rows by default), then migrates it to a
//! target with a three-unit taskstage pipeline (dump, load, sync) while a writer keeps
//! changing the source and a scripted controller pauses, resumes, stops and restarts
//! the task at random moments. At the end it proves that the target equals the source
//! and that no two runs were ever live at once: the harm of the original race (two
//! live copies writing the same target) never happened. See `docs/migrate.md`.
//!
//! With `--workers N` (feature `etcd`) the same migration runs on a cluster of worker
//! processes under faults: see `src/migrate/cluster.rs`.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::process::ExitCode;
use std::sync::Arc;

use taskstage_examples::migrate::cli::{self, Invocation};
use taskstage_examples::migrate::report::{self, Screen};
#[cfg(feature = "file")]
use taskstage_examples::migrate::restart;
use taskstage_examples::migrate::{cluster, program};

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if cluster::wanted(&args) {
        return cluster::main(args);
    }
    #[cfg(feature = "file")]
    if args
        .first()
        .is_some_and(|a| a == restart::RESTART_FLAG || a == restart::WORKER_FLAG)
    {
        return restart::main(args);
    }
    let options = match cli::parse(args, fastrand::u64(..)) {
        Ok(Invocation::Help) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Run(options)) => options,
        Err(e) => {
            eprintln!("migrate: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("migrate: could not start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let screen = Arc::new(Screen::new(options.quiet));
    let result = runtime.block_on(program::run(&options, Arc::clone(&screen)));
    screen.finish();
    match result {
        Ok(summary) => {
            print!("{}", report::render(&summary));
            if !summary.verified() {
                return ExitCode::FAILURE;
            }
        }
        Err(e) => {
            eprintln!("migrate: {e}");
            return ExitCode::from(e.exit_code());
        }
    }
    drop(runtime);
    // Then the same migration across a kill -9, on the store file (not for a
    // source of the user's own: it generates its tables).
    #[cfg(feature = "file")]
    if options.source.is_none() {
        let options = restart::RestartOptions {
            rows: (options.rows / restart::TABLES as u64).max(restart::MIN_ROWS),
            seed: options.seed,
            quiet: options.quiet,
        };
        println!(
            "\nand now across a restart: {} tables, a worker process killed with SIGKILL in \
             the middle of a copy and started again, its pauses and checkpoints kept in one \
             store file",
            restart::TABLES
        );
        let screen = Arc::new(Screen::new(options.quiet));
        let result = restart::run_blocking(&options, &screen);
        screen.finish();
        return match result {
            Ok(summary) => {
                print!("{}", summary.render());
                if summary.verified() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("migrate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    ExitCode::SUCCESS
}
