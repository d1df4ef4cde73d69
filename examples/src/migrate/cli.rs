//! Command-line options, parsed by hand into typed values with typed errors.

use std::ffi::OsString;
use std::path::PathBuf;

/// The rows a generated source holds unless `--rows` says otherwise.
pub const DEFAULT_ROWS: u64 = 200_000;
/// How many pauses the controller issues unless `--pauses` says otherwise.
pub const DEFAULT_PAUSES: u32 = 12;
/// The largest `--rows` accepted: beyond it a demonstration run stops being quick.
pub const MAX_ROWS: u64 = 50_000_000;
/// The largest `--pauses` accepted.
pub const MAX_PAUSES: u32 = 10_000;

/// The help text.
pub const USAGE: &str = "\
migrate: a dump -> load -> sync migration between two SQLite databases, run as a
taskstage task that a scripted controller pauses, resumes, stops and restarts at random
moments while a writer keeps changing the source.

USAGE:
    cargo run --release -p taskstage-examples --example migrate -- [OPTIONS]

OPTIONS:
    --source PATH   An existing source database with an `accounts` table. It is only
                    ever opened read-only: nothing writes to it, so no writer runs and
                    the sync unit applies only the change log it already holds.
                    Without --source the program generates a source in a fresh work
                    directory and runs a writer that inserts, updates and deletes its
                    rows (and a trigger-fed change log) while the pipeline runs.
    --target PATH   The target database: a new file (its directory must exist), an
                    empty database, or a target this program was migrating from the
                    same source (it continues from its checkpoints). Default: a new
                    file in the work directory.
    --rows N        Rows in the generated source (default 200000; not with --source).
    --seed N        Seed of the controller's schedule and of the generated data; the
                    same seed gives the same schedule (default: random, printed).
    --pauses N      How many pauses the controller issues (default 12).
    --quiet         Print only the final summary.
    --keep          Keep the work directory after a successful run.
    -h, --help      Print this help.

EXIT STATUS:
    0  the target equals the source (row count and checksum)
    1  the migration failed, or the target differs from the source
    2  bad arguments, or a database that cannot be used (missing directory, not a
       database, locked, incompatible schema)
";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Print the help text and exit.
    Help,
    /// Run a migration.
    Run(Options),
}

/// The options of one migration run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// An existing source database, or `None` to generate one.
    pub source: Option<PathBuf>,
    /// The target database, or `None` for a new one in the work directory.
    pub target: Option<PathBuf>,
    /// Rows in the generated source.
    pub rows: u64,
    /// The seed of the schedule and of the generated data.
    pub seed: u64,
    /// How many pauses the controller issues.
    pub pauses: u32,
    /// Print only the final summary.
    pub quiet: bool,
    /// Keep the work directory after a successful run.
    pub keep: bool,
}

impl Options {
    /// The defaults, with the given seed.
    pub fn with_seed(seed: u64) -> Self {
        Options {
            source: None,
            target: None,
            rows: DEFAULT_ROWS,
            seed,
            pauses: DEFAULT_PAUSES,
            quiet: false,
            keep: false,
        }
    }
}

/// A command line that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliError {
    /// An argument that is not one of the options.
    #[error("unknown option `{0}` (see --help)")]
    UnknownOption(String),
    /// An option that takes a value was last on the line.
    #[error("option `{0}` needs a value (see --help)")]
    MissingValue(&'static str),
    /// A value that is not a number in the accepted range.
    #[error("option `{flag}` takes a whole number from {min} to {max}, not `{value}`")]
    BadNumber {
        /// The option.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// An option given twice.
    #[error("option `{0}` was given twice")]
    Repeated(&'static str),
    /// An argument that is not valid UTF-8 where text is needed.
    #[error("argument `{0}` is not valid UTF-8")]
    NotUtf8(String),
    /// An empty path.
    #[error("option `{0}` needs a non-empty path")]
    EmptyPath(&'static str),
    /// `--rows` together with `--source`.
    #[error("`--rows` sizes a generated source, so it cannot be used with `--source`")]
    RowsWithSource,
}

/// Parses the arguments after the program name.
///
/// `default_seed` is used when `--seed` is absent (the caller draws it at random).
///
/// # Errors
///
/// A [`CliError`] naming the offending option.
pub fn parse<I>(args: I, default_seed: u64) -> Result<Invocation, CliError>
where
    I: IntoIterator<Item = OsString>,
{
    let mut options = Options::with_seed(default_seed);
    let mut seen = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            return Err(CliError::NotUtf8(arg.to_string_lossy().into_owned()));
        };
        let flag: &'static str = match text {
            "-h" | "--help" => return Ok(Invocation::Help),
            "--source" => "--source",
            "--target" => "--target",
            "--rows" => "--rows",
            "--seed" => "--seed",
            "--pauses" => "--pauses",
            "--quiet" => "--quiet",
            "--keep" => "--keep",
            other => return Err(CliError::UnknownOption(other.to_owned())),
        };
        if seen.contains(&flag) {
            return Err(CliError::Repeated(flag));
        }
        seen.push(flag);
        match flag {
            "--quiet" => options.quiet = true,
            "--keep" => options.keep = true,
            "--source" => options.source = Some(path_value(flag, args.next())?),
            "--target" => options.target = Some(path_value(flag, args.next())?),
            "--rows" => options.rows = number(flag, args.next(), 1, MAX_ROWS)?,
            "--seed" => options.seed = number(flag, args.next(), 0, u64::MAX)?,
            _ => {
                let pauses = number(flag, args.next(), 0, u64::from(MAX_PAUSES))?;
                // In range by the bound just checked.
                options.pauses = u32::try_from(pauses).unwrap_or(MAX_PAUSES);
            }
        }
    }
    if options.source.is_some() && seen.contains(&"--rows") {
        return Err(CliError::RowsWithSource);
    }
    Ok(Invocation::Run(options))
}

fn path_value(flag: &'static str, value: Option<OsString>) -> Result<PathBuf, CliError> {
    match value {
        None => Err(CliError::MissingValue(flag)),
        Some(value) if value.is_empty() => Err(CliError::EmptyPath(flag)),
        Some(value) => Ok(PathBuf::from(value)),
    }
}

pub fn number(
    flag: &'static str,
    value: Option<OsString>,
    min: u64,
    max: u64,
) -> Result<u64, CliError> {
    let value = value.ok_or(CliError::MissingValue(flag))?;
    let text = value
        .to_str()
        .ok_or_else(|| CliError::NotUtf8(value.to_string_lossy().into_owned()))?;
    let bad = || CliError::BadNumber {
        flag,
        value: text.to_owned(),
        min,
        max,
    };
    let parsed: u64 = text.replace('_', "").parse().map_err(|_| bad())?;
    if (min..=max).contains(&parsed) {
        Ok(parsed)
    } else {
        Err(bad())
    }
}
