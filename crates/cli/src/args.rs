//! The command line: every command, option and help text.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The default etcd endpoint, when neither `--endpoints` nor `ETCD_ENDPOINTS` is set.
pub(crate) const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

const AFTER_HELP: &str = "\
Examples:
  taskstage --endpoints http://10.0.0.1:2379,http://10.0.0.2:2379 --prefix app list
  taskstage --prefix app status orders
  taskstage --store sqlite:/var/lib/app/tasks.db --prefix app list
  taskstage --prefix app pause orders invoices --timeout 10s
  taskstage --prefix app resume --all
  taskstage --prefix app create orders --spec-file orders.json --paused
  taskstage --prefix app workers --output json
  taskstage --prefix app drain worker-1
  taskstage --prefix app watch orders
  taskstage completions bash > /etc/bash_completion.d/taskstage

Exit codes:
  0  done (every named task answered)
  1  a command was refused (a stopped task, an existing id, a race) or timed out
  2  bad usage or bad input (a task id with '/', an unknown stage, no such task,
     --all with no task); nothing was written
  3  the store (etcd, or the file of --store) could not be reached; nothing was
     written";

/// Operate a taskstage cluster on etcd, or on a store file of one machine: list,
/// pause, resume, stop and watch tasks.
///
/// Every command talks to the cluster through the same controller API as a Rust
/// program; `pause` returns only once each task's owner reports that its run has
/// really returned.
#[derive(Debug, Parser)]
#[command(name = "taskstage", version, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// The etcd endpoints, comma-separated.
    #[arg(
        long,
        global = true,
        env = "ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = DEFAULT_ENDPOINT,
        value_name = "URL,..."
    )]
    pub(crate) endpoints: Vec<String>,
    /// The store of one machine, a file (`sqlite:PATH`), in place of etcd: the
    /// file the workers and the application's controller open.
    #[arg(
        long,
        global = true,
        env = "TASKSTAGE_STORE",
        value_name = "sqlite:PATH",
        value_parser = parse_store
    )]
    pub(crate) store: Option<std::path::PathBuf>,
    /// The key prefix of the cluster (the one its workers and controllers use).
    #[arg(
        long,
        global = true,
        env = "TASKSTAGE_PREFIX",
        default_value = "taskstage"
    )]
    pub(crate) prefix: String,
    /// How long a waiting command waits for the answers, all tasks together
    /// (e.g. 500ms, 30s, 2m).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// The output format: a table for people, JSON for scripts (errors too).
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How results and errors are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Aligned columns; errors as one line on stderr.
    Table,
    /// JSON on stdout; errors as one JSON object a line on stderr.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Every task: desired and observed stage, owner, generation, outcome, and whether
    /// the observed stage answers the desired one.
    #[command(after_help = "Example:\n  taskstage --prefix app list --output json")]
    List,
    /// One task in detail, with its checkpoints' names and sizes.
    #[command(after_help = "Example:\n  taskstage --prefix app status orders")]
    Status {
        /// The task.
        task: String,
    },
    /// Pauses tasks cluster-wide; returns once every owner reports its run returned.
    #[command(
        after_help = "Examples:\n  taskstage --prefix app pause orders invoices --timeout 10s\n  \
                            taskstage --prefix app pause --all"
    )]
    Pause(Targets),
    /// Resumes tasks cluster-wide; returns once every owner reports Running.
    #[command(after_help = "Examples:\n  taskstage --prefix app resume orders\n  \
                            taskstage --prefix app resume --all")]
    Resume(Targets),
    /// Stops tasks cluster-wide (final); returns once every owner reports Stopped.
    #[command(after_help = "Examples:\n  taskstage --prefix app stop orders\n  \
                            taskstage --prefix app stop --all --timeout 1m")]
    Stop(Targets),
    /// Creates a task with its spec (the bytes the workers' factory gets).
    #[command(
        after_help = "Examples:\n  taskstage --prefix app create orders --spec-file orders.json\n  \
                      taskstage --prefix app create orders --spec-file - --paused < orders.json"
    )]
    Create {
        /// The task's id: no '/', '@' or whitespace, at most 128 bytes.
        task: String,
        /// The file holding the spec ('-': standard input).
        #[arg(long, value_name = "FILE")]
        spec_file: String,
        /// Creates the task paused (the same as `--desired Paused`).
        #[arg(long, conflicts_with = "desired")]
        paused: bool,
        /// The initial desired stage: Running (the default), Paused or Stopped.
        #[arg(long, value_name = "STAGE")]
        desired: Option<String>,
    },
    /// The workers that are members now, and how many tasks each one holds.
    #[command(after_help = "Example:\n  taskstage --prefix app workers")]
    Workers,
    /// Drains a worker for a rolling restart: it hands every task it holds over to
    /// the other workers (each run paused and returned before another starts it)
    /// and claims none, while it stays alive; returns once it holds no task.
    #[command(after_help = "Example:\n  taskstage --prefix app drain worker-1 --timeout 2m")]
    Drain {
        /// The worker's id.
        worker: String,
    },
    /// Prints a line each time a read after a change finds a task (or one task)
    /// changed, until interrupted; a state shorter than a read may get no line.
    #[command(after_help = "Examples:\n  taskstage --prefix app watch\n  \
                            taskstage --prefix app watch orders --output json")]
    Watch {
        /// Only this task.
        task: Option<String>,
    },
    /// Prints a shell completion script.
    #[command(
        after_help = "Examples:\n  taskstage completions bash > /etc/bash_completion.d/taskstage\n  \
                            taskstage completions zsh > \"${fpath[1]}/_taskstage\"\n  \
                            taskstage completions fish > ~/.config/fish/completions/taskstage.fish"
    )]
    /// Serve the HTTP API and the status page of the cluster (`/ui`), until ctrl-c.
    ///
    /// Without a token every caller is admin, so that is allowed on a loopback
    /// address only; anything else needs `--admin-token` or `--read-token` (best
    /// given through their environment variables, which `ps` does not show).
    #[command(after_help = "Examples:\n  taskstage --prefix app serve\n  \
                            TASKSTAGE_ADMIN_TOKEN=... taskstage --prefix app serve --listen 0.0.0.0:8080")]
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "IP:PORT")]
        listen: std::net::SocketAddr,
        /// A token that may read and command.
        #[arg(long, env = "TASKSTAGE_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// A token that may only read.
        #[arg(long, env = "TASKSTAGE_READ_TOKEN", hide_env_values = true)]
        read_token: Option<String>,
        /// Serve with no token at all (loopback only). Without a token and without
        /// this flag, serve makes an admin token for the run and prints the page's
        /// URL with it.
        #[arg(long, conflicts_with_all = ["admin_token", "read_token"])]
        no_token: bool,
    },
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// The tasks a pause, resume or stop acts on.
#[derive(Debug, Args)]
pub(crate) struct Targets {
    /// The tasks.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) tasks: Vec<String>,
    /// Every task under the prefix (for pause and resume: every task not stopped).
    #[arg(long)]
    pub(crate) all: bool,
}

/// The shells completions are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shell {
    /// GNU bash.
    Bash,
    /// Z shell.
    Zsh,
    /// fish.
    Fish,
}

/// Parses `500ms`, `30s`, `2m` or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 2m)"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        other => return Err(format!("unknown unit {other:?} (ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero() && *d <= Duration::from_secs(24 * 3600))
        .ok_or_else(|| format!("{text:?} is out of range (above 0, at most 24 h)"))
}

/// `sqlite:PATH`: the store file.
fn parse_store(value: &str) -> Result<std::path::PathBuf, String> {
    match value.strip_prefix("sqlite:") {
        Some(path) if !path.is_empty() => Ok(path.into()),
        _ => Err(format!(
            "{value:?} is not a store: give sqlite:PATH (a store file), or leave --store out \
             for etcd (--endpoints)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_with_their_units_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "s", "3h", "-1s", "1e9", "99999999m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
