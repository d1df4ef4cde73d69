//! The cluster form of the program: `--workers N` (feature `etcd`).
//!
//! The same migration, run by N worker processes coordinated through etcd, while a
//! controller pauses and resumes it cluster-wide, kills its owner with SIGKILL
//! during the load and freezes the next owner (SIGSTOP) past its lease. The target
//! fences its writes with the owner's token. See `cluster_run.rs`; without the
//! feature, `--workers` is refused with [`ClusterCliError::NeedsEtcd`].

use std::ffi::OsString;
use std::process::ExitCode;

use crate::migrate::cli::CliError;

/// The hidden first argument of a worker process that the cluster mode starts.
pub const WORKER_FLAG: &str = "--cluster-worker";

/// The fewest workers: the script kills one owner and freezes the next, and a
/// third must take over.
pub const MIN_WORKERS: u64 = 3;
/// The most workers.
pub const MAX_WORKERS: u64 = 8;
/// The smallest `--rows` of the cluster mode (enough batches to inject faults in).
pub const MIN_ROWS: u64 = 1_000;

/// A cluster-mode command line that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterCliError {
    /// `--workers` in a build without the `etcd` feature.
    #[error(
        "`--workers` runs the migration on an etcd cluster and needs the `etcd` feature: \
         cargo run --release -p taskstage-examples --features etcd --example migrate -- --workers 3"
    )]
    #[cfg_attr(
        feature = "etcd",
        allow(dead_code, reason = "built only without the feature")
    )]
    NeedsEtcd,
    /// A bad option or value, as the single-process command line reports it.
    #[error(transparent)]
    Cli(#[from] CliError),
}

/// The options of a cluster run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Worker processes.
    pub workers: u64,
    /// Rows in the generated source.
    pub rows: u64,
    /// The seed of the generated data.
    pub seed: u64,
    /// Print only the final summary.
    pub quiet: bool,
}

/// Whether the command line asks for the cluster mode (or is a worker of it).
pub fn wanted(args: &[OsString]) -> bool {
    args.iter().any(|a| a == "--workers") || args.first().is_some_and(|a| a == WORKER_FLAG)
}

/// Parses a cluster-mode command line (`--workers N [--rows N] [--seed N] [--quiet]`).
///
/// # Errors
///
/// A [`ClusterCliError`] naming the offending option.
pub fn parse(args: &[OsString], seed: u64) -> Result<ClusterOptions, ClusterCliError> {
    let mut options = ClusterOptions {
        workers: MIN_WORKERS,
        rows: crate::migrate::cli::DEFAULT_ROWS,
        seed,
        quiet: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, min, max): (&'static str, u64, u64) = match arg.to_string_lossy().as_ref() {
            "--quiet" => {
                options.quiet = true;
                continue;
            }
            "--workers" => ("--workers", MIN_WORKERS, MAX_WORKERS),
            "--rows" => ("--rows", MIN_ROWS, crate::migrate::cli::MAX_ROWS),
            "--seed" => ("--seed", 0, u64::MAX),
            other => return Err(CliError::UnknownOption(other.to_owned()).into()),
        };
        let n = crate::migrate::cli::number(flag, args.next().cloned(), min, max)?;
        match flag {
            "--workers" => options.workers = n,
            "--rows" => options.rows = n,
            _ => options.seed = n,
        }
    }
    Ok(options)
}

/// Runs the cluster mode (or one of its workers) as the command line says.
pub fn main(args: Vec<OsString>) -> ExitCode {
    #[cfg(feature = "etcd")]
    {
        run::main(args)
    }
    #[cfg(not(feature = "etcd"))]
    {
        // A bad command line gets its own error first; a good one needs the feature.
        let error = parse(&args, 0).err().unwrap_or(ClusterCliError::NeedsEtcd);
        eprintln!("migrate: {error}");
        ExitCode::from(2)
    }
}

#[cfg(feature = "etcd")]
#[path = "cluster_run.rs"]
pub mod run;
