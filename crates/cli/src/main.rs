//! `taskstage`: operate a taskstage cluster on etcd from the shell (feature `cli`).
//!
//! Every command goes through the library's public [`Controller`]. Input is checked
//! before anything is written (a task id that cannot be a key, an unknown stage, a
//! task that does not exist, `--all` with no task, an unreachable store): each is a
//! typed error on one line, with an exit code of its own. See `docs/cli.md`.

#![forbid(unsafe_code)]

mod args;
mod error;
mod render;
mod serve;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use serde_json::{json, Value};
use taskstage_cluster::{
    ClusterError, Controller, DesiredStage, EtcdCoordinator, EtcdOptions, MemoryCoordinator,
    ObservedStatus, SqliteCoordinator, TaskId, TaskStatus,
};
use tokio::time::Instant;

use args::{Cli, Command, Output, Shell, Targets};
use error::{CliError, BAD_INPUT};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let output = if wants_json(&argv) {
        Output::Json
    } else {
        Output::Table
    };
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => return usage(&e, output),
    };
    if let Command::Completions { shell } = cli.command {
        let shell = match shell {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        };
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "taskstage",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("taskstage: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(errors) => {
            let mut stderr = std::io::stderr().lock();
            for error in &errors {
                let line = match cli.output {
                    Output::Table => error.line(),
                    Output::Json => error.json().to_string(),
                };
                let _ = writeln!(stderr, "{line}");
            }
            ExitCode::from(error::exit_code(&errors))
        }
    }
}

/// Whether the raw command line asks for JSON (to print a usage error as JSON).
fn wants_json(argv: &[OsString]) -> bool {
    argv.windows(2)
        .any(|w| w[0] == "--output" && w[1] == "json")
        || argv.iter().any(|a| a == "--output=json")
}

/// Prints clap's help or version as it is, and a usage error as one line.
fn usage(error: &clap::Error, output: Output) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    let rendered = error.render().to_string();
    let first = rendered
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("bad usage");
    let message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    let error = CliError::Usage { message };
    let line = match output {
        Output::Table => error.line(),
        Output::Json => error.json().to_string(),
    };
    eprintln!("{line}");
    ExitCode::from(BAD_INPUT)
}

type Outcome = Result<(), Vec<CliError>>;

async fn run(cli: &Cli) -> Outcome {
    match &cli.command {
        Command::List => list(cli).await,
        Command::Status { task } => status(cli, task).await,
        Command::Pause(targets) => act(cli, Act::Pause, targets).await,
        Command::Resume(targets) => act(cli, Act::Resume, targets).await,
        Command::Stop(targets) => act(cli, Act::Stop, targets).await,
        Command::Create {
            task,
            spec_file,
            paused,
            desired,
        } => create(cli, task, spec_file, *paused, desired.as_deref()).await,
        Command::Workers => workers(cli).await,
        Command::Drain { worker } => drain(cli, worker).await,
        Command::Watch { task } => watch(cli, task.as_deref()).await,
        Command::Serve {
            listen,
            admin_token,
            read_token,
            no_token,
        } => {
            serve(
                cli,
                *listen,
                admin_token.as_deref(),
                read_token.as_deref(),
                *no_token,
            )
            .await
        }
        Command::Completions { .. } => Ok(()), // handled before the runtime starts
    }
}

/// Serves the HTTP API until ctrl-c. Refuses, before it connects or binds anything,
/// to listen beyond loopback without a token. A token given is never printed; with
/// none given (and no `--no-token`), one is made for the run and printed once, in
/// the URL of the page.
async fn serve(
    cli: &Cli,
    listen: std::net::SocketAddr,
    admin: Option<&str>,
    read: Option<&str>,
    no_token: bool,
) -> Outcome {
    use taskstage_http::{Api, Auth};
    let admin = admin.filter(|t| !t.is_empty());
    let read = read.filter(|t| !t.is_empty());
    let mut made = None;
    let auth = if admin.is_none() && read.is_none() {
        if !listen.ip().is_loopback() {
            return Err(vec![CliError::Usage {
                message: format!(
                    "serve: refusing to listen on {listen} without a token: anyone who reaches it could pause and stop every task; set TASKSTAGE_ADMIN_TOKEN (or --admin-token), or listen on 127.0.0.1"
                ),
            }]);
        }
        if no_token {
            Auth::open()
        } else {
            // Any process or user of this machine can reach a loopback port: the
            // default is a token only whoever started the server is told.
            let token = made_token().map_err(|source| vec![CliError::Token { source }])?;
            let auth = Auth::tokens().admin(token.as_str());
            made = Some(token);
            auth
        }
    } else {
        let mut auth = Auth::tokens();
        if let Some(token) = admin {
            auth = auth.admin(token);
        }
        if let Some(token) = read {
            auth = auth.read_only(token);
        }
        auth
    };
    let controller = connect(cli, "serve").await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| {
            vec![CliError::Listen {
                addr: listen.to_string(),
                source,
            }]
        })?;
    let addr = listener.local_addr().map_err(|source| {
        vec![CliError::Listen {
            addr: listen.to_string(),
            source,
        }]
    })?;
    // Ctrl-c ends the open event streams too, so that the shutdown's drain is not
    // spent waiting for them.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let router = Api::cluster(controller)
        .auth(auth)
        .end_streams_on(shutdown.clone())
        .router();
    emit(
        "serve",
        &format!(
            "taskstage: serving the API of prefix {} on http://{addr}/v1/ and its status page on http://{addr}/ui ({})\n",
            cli.prefix,
            if made.is_some() { "a token made for this run is needed: open the URL below, or set TASKSTAGE_ADMIN_TOKEN to choose one" } else if admin.is_some() || read.is_some() { "bearer tokens needed" } else { "no token needed: loopback only" }
        ),
    )?;
    if let Some(token) = &made {
        emit("serve", &format!("    http://{addr}/ui#token={token}\n"))?;
    }
    serve::serve(listener, router, serve::Limits::default(), async {
        let _ = tokio::signal::ctrl_c().await;
        shutdown.cancel();
    })
    .await
    .map_err(|source| {
        vec![CliError::Listen {
            addr: addr.to_string(),
            source,
        }]
    })
}

/// Checks the prefix, then connects: an unusable prefix is bad input even when the
/// store is down.
async fn connect(cli: &Cli, command: &'static str) -> Result<Controller, Vec<CliError>> {
    let fail = |e| vec![CliError::cluster(command, None, &cli.prefix, e)];
    Controller::new(MemoryCoordinator::new(), &cli.prefix).map_err(fail)?;
    if let Some(file) = &cli.store {
        let coord = SqliteCoordinator::open(file).await.map_err(fail)?;
        return Controller::new(coord, &cli.prefix).map_err(fail);
    }
    let coord = EtcdCoordinator::connect(cli.endpoints.clone(), EtcdOptions::default())
        .await
        .map_err(fail)?;
    Controller::new(coord, &cli.prefix).map_err(fail)
}

fn task_id(command: &'static str, id: &str) -> Result<TaskId, CliError> {
    TaskId::new(id).map_err(|e| CliError::cluster(command, Some(id), "", e))
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
/// 32 random bytes from the operating system, as hex: an admin token for one run.
fn made_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn emit(command: &'static str, text: &str) -> Result<(), Vec<CliError>> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(source) => Err(vec![CliError::Output { command, source }]),
    }
}

fn emit_json(command: &'static str, value: &Value) -> Result<(), Vec<CliError>> {
    emit(command, &format!("{value}\n"))
}

async fn list(cli: &Cli) -> Outcome {
    let controller = connect(cli, "list").await?;
    let tasks = controller
        .list()
        .await
        .map_err(|e| vec![CliError::cluster("list", None, &cli.prefix, e)])?;
    match cli.output {
        Output::Json => emit_json(
            "list",
            &Value::Array(tasks.iter().map(render::task_json).collect()),
        ),
        Output::Table => {
            let rows: Vec<Vec<String>> = tasks.iter().map(render::row).collect();
            emit("list", &render::table(&render::HEADER, &rows))
        }
    }
}

async fn status(cli: &Cli, task: &str) -> Outcome {
    task_id("status", task).map_err(|e| vec![e])?;
    let controller = connect(cli, "status").await?;
    let fail = |e| vec![CliError::cluster("status", Some(task), &cli.prefix, e)];
    let status = controller.status(task).await.map_err(fail)?;
    let checkpoints = controller.checkpoints(task).await.map_err(fail)?;
    match cli.output {
        Output::Json => emit_json("status", &render::status_json(&status, &checkpoints)),
        Output::Table => emit("status", &render::detail(&status, &checkpoints)),
    }
}

/// A command that sets the desired stage and waits for the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Pause,
    Resume,
    Stop,
}

impl Act {
    fn name(self) -> &'static str {
        match self {
            Act::Pause => "pause",
            Act::Resume => "resume",
            Act::Stop => "stop",
        }
    }

    async fn call(
        self,
        controller: &Controller,
        task: &str,
        within: Duration,
    ) -> Result<ObservedStatus, ClusterError> {
        match self {
            Act::Pause => controller.pause_within(task, within).await,
            Act::Resume => controller.resume_within(task, within).await,
            Act::Stop => controller.stop_within(task, within).await,
        }
    }
}

/// What a pause, resume or stop does with one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Writes the desired stage and waits for the answer.
    Write,
    /// Waits for the answer to desired revision `.0`, writing nothing (a stop of a
    /// task already desired Stopped).
    Wait(i64),
    /// Leaves the task alone (a pause or resume `--all` meets a stopped task).
    Skip,
}

/// What became of one task of a pause, resume or stop.
enum Answer {
    Answered(ObservedStatus, Duration),
    Skipped,
    Failed(CliError),
}

async fn act(cli: &Cli, act: Act, targets: &Targets) -> Outcome {
    let command = act.name();
    // Every id is checked before anything is read or written.
    let mut errors = Vec::new();
    let mut named: Vec<String> = Vec::new();
    for task in &targets.tasks {
        match task_id(command, task) {
            Ok(_) if named.contains(task) => {}
            Ok(_) => named.push(task.clone()),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let controller = connect(cli, command).await?;
    // One read decides what is acted on; a refusal for any task refuses them all.
    let tasks = controller
        .list()
        .await
        .map_err(|e| vec![CliError::cluster(command, None, &cli.prefix, e)])?;
    let by_id: HashMap<&str, &TaskStatus> = tasks.iter().map(|t| (t.task.as_str(), t)).collect();
    let stopped = |t: &TaskStatus| t.desired == DesiredStage::Stopped;
    // A stop of a task already desired Stopped writes nothing: it waits for the
    // answer to the stop that was written.
    let plan = |t: &TaskStatus| match (act, stopped(t)) {
        (Act::Stop, true) => Plan::Wait(t.desired_revision),
        (_, true) => Plan::Skip,
        (_, false) => Plan::Write,
    };
    let mut chosen: Vec<(String, Plan)> = Vec::new();
    if targets.all {
        for t in &tasks {
            chosen.push((t.task.to_string(), plan(t)));
        }
        if chosen.iter().all(|(_, plan)| *plan == Plan::Skip) {
            return Err(vec![CliError::NoTasks {
                command,
                prefix: cli.prefix.clone(),
            }]);
        }
    } else {
        for task in &named {
            match by_id.get(task.as_str()) {
                None => errors.push(CliError::NoSuchTask {
                    command,
                    task: task.clone(),
                    prefix: cli.prefix.clone(),
                }),
                Some(t) if plan(t) == Plan::Skip => errors.push(CliError::Stopped {
                    command,
                    task: task.clone(),
                }),
                Some(t) => chosen.push((task.clone(), plan(t))),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
    }

    // One deadline for all: each call gets what is left of it.
    let deadline = Instant::now() + cli.timeout;
    let mut running = Vec::new();
    for (task, plan) in &chosen {
        if *plan == Plan::Skip {
            continue;
        }
        let (controller, task, plan) = (controller.clone(), task.clone(), *plan);
        running.push(tokio::spawn(async move {
            let started = Instant::now();
            let left = deadline.saturating_duration_since(started);
            let result = match plan {
                Plan::Wait(revision) => controller.wait_for_revision(&task, revision, left).await,
                _ => act.call(&controller, &task, left).await,
            };
            (result, started.elapsed())
        }));
    }
    let mut answers = Vec::new();
    let mut handles = running.into_iter();
    for (task, plan) in &chosen {
        let answer = if *plan == Plan::Skip {
            Answer::Skipped
        } else {
            match handles.next() {
                Some(handle) => match handle.await {
                    Ok((Ok(observed), took)) => Answer::Answered(observed, took),
                    Ok((Err(e), _)) => {
                        Answer::Failed(CliError::cluster(command, Some(task), &cli.prefix, e))
                    }
                    Err(e) => Answer::Failed(CliError::Internal {
                        command,
                        task: task.clone(),
                        detail: e.to_string(),
                    }),
                },
                None => Answer::Failed(CliError::Internal {
                    command,
                    task: task.clone(),
                    detail: "no call was made".into(),
                }),
            }
        };
        answers.push((task.clone(), answer));
    }

    match cli.output {
        Output::Json => {
            let objects = answers
                .iter()
                .map(|(task, answer)| act_json(command, task, answer))
                .collect();
            emit_json(command, &Value::Array(objects))?;
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = answers
                .iter()
                .map(|(task, answer)| act_row(task, answer))
                .collect();
            emit(
                command,
                &render::table(
                    &["TASK", "RESULT", "STAGE", "OWNER", "GEN", "WAITED"],
                    &rows,
                ),
            )?;
        }
    }
    let failures: Vec<CliError> = answers
        .into_iter()
        .filter_map(|(_, answer)| match answer {
            Answer::Failed(e) => Some(e),
            _ => None,
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

fn act_json(command: &str, task: &str, answer: &Answer) -> Value {
    match answer {
        Answer::Answered(o, took) => {
            let (outcome, failure) = render::outcome(Some(o));
            json!({
                "task": task, "command": command, "result": "answered",
                "stage": o.stage.name(), "owner": o.owner.as_str(),
                "generation": o.generation, "outcome": outcome, "failure": failure,
                "waited_ms": took.as_millis() as u64,
            })
        }
        Answer::Skipped => json!({
            "task": task, "command": command, "result": "skipped", "stage": null,
            "owner": null, "generation": null, "outcome": null, "failure": null,
            "waited_ms": null,
        }),
        Answer::Failed(e) => json!({
            "task": task, "command": command, "result": e.kind().as_str(), "stage": e.stage(),
            "owner": e.owner(), "generation": null, "outcome": null, "failure": null,
            "waited_ms": null,
        }),
    }
}

fn act_row(task: &str, answer: &Answer) -> Vec<String> {
    match answer {
        Answer::Answered(o, took) => vec![
            task.to_owned(),
            "answered".into(),
            o.stage.name().into(),
            o.owner.to_string(),
            o.generation.to_string(),
            format!("{} ms", took.as_millis()),
        ],
        Answer::Skipped => vec![
            task.to_owned(),
            "skipped (stopped)".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
        Answer::Failed(e) => vec![
            task.to_owned(),
            format!("FAILED: {}", e.kind()),
            e.stage().unwrap_or("-").into(),
            e.owner().unwrap_or("-").into(),
            "-".into(),
            "-".into(),
        ],
    }
}

/// Parses a desired stage, in any case.
fn desired_stage(value: &str) -> Result<DesiredStage, CliError> {
    [
        DesiredStage::Running,
        DesiredStage::Paused,
        DesiredStage::Stopped,
    ]
    .into_iter()
    .find(|d| d.name().eq_ignore_ascii_case(value))
    .ok_or_else(|| CliError::UnknownStage {
        command: "create",
        value: value.to_owned(),
    })
}

async fn create(
    cli: &Cli,
    task: &str,
    spec_file: &str,
    paused: bool,
    desired: Option<&str>,
) -> Outcome {
    task_id("create", task).map_err(|e| vec![e])?;
    let desired = match (paused, desired) {
        (true, _) => DesiredStage::Paused,
        (false, Some(value)) => desired_stage(value).map_err(|e| vec![e])?,
        (false, None) => DesiredStage::Running,
    };
    let read = if spec_file == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).map(|_| bytes)
    } else {
        std::fs::read(spec_file)
    };
    let spec = read.map_err(|source| {
        vec![CliError::SpecFile {
            task: task.to_owned(),
            path: spec_file.to_owned(),
            source,
        }]
    })?;
    let size = spec.len();
    let controller = connect(cli, "create").await?;
    let revision = match controller.create(task, spec, desired).await {
        Ok(revision) => revision,
        Err(ClusterError::TaskExists { .. }) => {
            let desired = controller
                .status(task)
                .await
                .map_or_else(|_| "unknown".to_owned(), |s| s.desired.name().to_owned());
            return Err(vec![CliError::Exists {
                task: task.to_owned(),
                desired,
            }]);
        }
        Err(e) => {
            return Err(vec![CliError::cluster(
                "create",
                Some(task),
                &cli.prefix,
                e,
            )])
        }
    };
    match cli.output {
        Output::Json => emit_json(
            "create",
            &json!({
                "task": task, "desired": desired.name(), "desired_revision": revision,
                "spec_size": size,
            }),
        ),
        Output::Table => emit(
            "create",
            &format!(
                "created task {task}: desired {desired}, spec {size} bytes, revision {revision}\n"
            ),
        ),
    }
}

/// Drains `worker` and waits (up to `--timeout`) until it holds no task.
async fn drain(cli: &Cli, worker: &str) -> Outcome {
    let controller = connect(cli, "drain").await?;
    controller
        .drain_within(worker, cli.timeout)
        .await
        .map_err(|e| vec![CliError::cluster("drain", None, &cli.prefix, e)])?;
    match cli.output {
        Output::Json => emit_json(
            "drain",
            &json!({"worker": worker, "draining": true, "tasks": 0}),
        ),
        Output::Table => emit(
            "drain",
            &render::table(
                &["WORKER", "DRAINING", "TASKS"],
                &[vec![worker.to_owned(), "yes".to_owned(), "0".to_owned()]],
            ),
        ),
    }
}

async fn workers(cli: &Cli) -> Outcome {
    let controller = connect(cli, "workers").await?;
    let fail = |e| vec![CliError::cluster("workers", None, &cli.prefix, e)];
    let members = controller.workers().await.map_err(fail)?;
    let tasks = controller.list().await.map_err(fail)?;
    let held = render::holdings(&members, &tasks);
    match cli.output {
        Output::Json => emit_json(
            "workers",
            &Value::Array(
                held.iter()
                    .map(|(w, member, n)| json!({"worker": w, "member": member, "tasks": n}))
                    .collect(),
            ),
        ),
        Output::Table => {
            let rows: Vec<Vec<String>> = held
                .iter()
                .map(|(w, member, n)| {
                    let m = if *member { "yes" } else { "no" };
                    vec![w.clone(), m.to_owned(), n.to_string()]
                })
                .collect();
            emit(
                "workers",
                &render::table(&["WORKER", "MEMBER", "TASKS"], &rows),
            )
        }
    }
}

/// What a watch compares between two reads of a task.
type Seen = (
    DesiredStage,
    i64,
    Option<String>,
    Option<i64>,
    Option<ObservedStatus>,
);

async fn watch(cli: &Cli, only: Option<&str>) -> Outcome {
    // Installed first: a ctrl-c from here on ends the watch cleanly.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    // The handler is installed on the first poll: poll once now.
    tokio::select! {
        biased;
        _ = &mut interrupted => return Ok(()),
        () = std::future::ready(()) => {}
    }
    if let Some(task) = only {
        task_id("watch", task).map_err(|e| vec![e])?;
    }
    let controller = connect(cli, "watch").await?;
    if let Some(task) = only {
        controller
            .status(task)
            .await
            .map_err(|e| vec![CliError::cluster("watch", Some(task), &cli.prefix, e)])?;
    }
    let started = Instant::now();
    let mut last: HashMap<String, Seen> = HashMap::new();
    // Ends at ctrl-c (or when stdout closes); each turn waits for a change, at most 5 s.
    loop {
        let mut revision = 0;
        match controller.list().await {
            Ok(tasks) => {
                let mut text = String::new();
                for status in &tasks {
                    revision = revision.max(status.revision);
                    if only.is_some_and(|t| t != status.task.as_str()) {
                        continue;
                    }
                    let seen: Seen = (
                        status.desired,
                        status.desired_revision,
                        status.owner.as_ref().map(|o| o.to_string()),
                        status.owner_revision,
                        status.current_observed().cloned(),
                    );
                    if last.get(status.task.as_str()) == Some(&seen) {
                        continue;
                    }
                    last.insert(status.task.to_string(), seen);
                    text.push_str(&watch_line(cli.output, started.elapsed(), status));
                }
                emit("watch", &text)?;
            }
            Err(e) => {
                let error = CliError::cluster("watch", only, &cli.prefix, e);
                let line = match cli.output {
                    Output::Table => format!("{} (still watching)", error.line()),
                    Output::Json => error.json().to_string(),
                };
                eprintln!("{line}");
            }
        }
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            _ = controller.wait_tasks_change(revision, Duration::from_secs(5)) => {}
        }
        if revision == 0 {
            // Nothing read (no task, or the store did not answer): wait before the
            // next read rather than spin.
            tokio::select! {
                _ = &mut interrupted => return Ok(()),
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }
}

fn watch_line(output: Output, elapsed: Duration, status: &TaskStatus) -> String {
    match output {
        Output::Json => {
            let mut value = render::task_json(status);
            if let Value::Object(map) = &mut value {
                map.insert("elapsed_ms".into(), json!(elapsed.as_millis() as u64));
            }
            format!("{value}\n")
        }
        Output::Table => {
            let row = render::row(status);
            format!(
                "+{:.2}s  {}  desired {}  observed {}  owner {}  gen {}  outcome {}  answered {}\n",
                elapsed.as_secs_f64(),
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                row[5],
                row[6]
            )
        }
    }
}
