//! Graceful shutdown: on ctrl-c, stop a group of tasks within a deadline and print
//! what each reached, naming any task still stuck.
//!
//! ```text
//! cargo run -p taskstage-examples --example shutdown            # runs until ctrl-c
//! cargo run -p taskstage-examples --example shutdown -- 2       # or stops by itself after 2 s
//! ```
//!
//! One of the three tasks runs a unit that ignores cancellation, as a unit blocked on
//! a slow call would: the stop aborts it after half the deadline, and the report says
//! so. Exit status 0 when every task stopped, 1 otherwise.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::process::ExitCode;
use std::time::Duration;

use taskstage::Stage;
use taskstage_examples::shutdown::{shut_down, start, DEADLINE};

#[tokio::main]
async fn main() -> ExitCode {
    let after = std::env::args().nth(1).and_then(|s| s.parse::<u64>().ok());
    let group = match start() {
        Ok(group) => group,
        Err(error) => {
            eprintln!("cannot start the tasks: {error}");
            return ExitCode::FAILURE;
        }
    };
    match after {
        Some(secs) => {
            println!("running; stopping by itself in {secs} s (or on ctrl-c)");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = tokio::time::sleep(Duration::from_secs(secs)) => {}
            }
        }
        None => {
            println!("running; press ctrl-c to stop");
            if let Err(error) = tokio::signal::ctrl_c().await {
                eprintln!("cannot listen for ctrl-c: {error}");
            }
        }
    }
    println!("stopping every task within {} s", DEADLINE.as_secs());
    let report = shut_down(&group).await;
    print!("{report}");
    if report.all_reached(Stage::Stopped) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
