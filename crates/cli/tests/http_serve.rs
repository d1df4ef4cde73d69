//! `taskstage serve` (features `cli` and `http`): no listener beyond loopback without
//! a token, and no token in what it prints.

use std::process::Command;

#[test]
fn serve_refuses_to_listen_beyond_loopback_without_a_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_taskstage"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("TASKSTAGE_ADMIN_TOKEN")
        .env_remove("TASKSTAGE_READ_TOKEN")
        // Refused before it connects: no store is needed for this answer.
        .env("ETCD_ENDPOINTS", "http://127.0.0.1:1")
        .output()
        .expect("the command runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{stderr}"
    );
}

#[test]
fn serve_never_prints_its_token() {
    // A token, an address beyond loopback, and a store that is not there: the
    // command fails on the store, and its output never shows the token.
    let out = Command::new(env!("CARGO_BIN_EXE_taskstage"))
        .args(["serve", "--listen", "0.0.0.0:0", "--output", "json"])
        .env("TASKSTAGE_ADMIN_TOKEN", "very-secret-admin-token")
        .env("ETCD_ENDPOINTS", "http://127.0.0.1:1")
        .args(["--timeout", "1s"])
        .output()
        .expect("the command runs");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("refusing"), "a token was given: {text}");
    assert!(
        !text.contains("very-secret-admin-token"),
        "the token was printed: {text}"
    );
}
