//! Kernel-level partitions on loopback, with iptables: a chain of the test's own
//! (`taskstage-<pid>-<n>`), jumped to from `OUTPUT` only for packets on `lo` from
//! 127.0.0.0/8 to 127.0.0.0/8, that holds DROP rules on the test's own ports only.
//! Every packet between two local processes passes `OUTPUT` once, so a rule there
//! on a port, as source and as destination, cuts both directions; a dropped packet
//! is silence, as a lost route gives, not a refusal.
//!
//! The guard removes the jump and the chain when it drops, also when a test fails
//! or panics; a chain left by a test binary that was killed (its pid gone) is
//! removed by the next one that starts.
//!
//! Without a working `iptables` (missing, not root, no netfilter) a test is skipped
//! with a loud line saying so, except under `CI=true`, where it fails.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const PREFIX: &str = "taskstage-";

/// The jump from `OUTPUT` to a chain: loopback only.
fn jump(chain: &str) -> Vec<String> {
    [
        "-o",
        "lo",
        "-s",
        "127.0.0.0/8",
        "-d",
        "127.0.0.0/8",
        "-j",
        chain,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The iptables binary: on `PATH`, else where Debian puts it (`/usr/sbin` is not
/// on every user's `PATH`).
fn binary() -> std::path::PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("iptables"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| std::path::PathBuf::from("/usr/sbin/iptables"))
}

/// Runs `iptables -w` with `args`; the error says what failed.
fn iptables(args: &[String]) -> Result<(), String> {
    let output = Command::new(binary())
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| format!("iptables could not be started: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables -w {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Removes the chains of test binaries that are gone (killed before their guard
/// could drop): `taskstage-<pid>-<n>` whose pid no longer exists.
fn remove_stale() {
    let Ok(output) = Command::new(binary()).args(["-w", "-S"]).output() else {
        return;
    };
    let rules = String::from_utf8_lossy(&output.stdout);
    let mut stale: Vec<String> = Vec::new();
    for line in rules.lines() {
        let Some(chain) = line.strip_prefix("-N ") else {
            continue;
        };
        let Some(pid) = chain
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            stale.push(chain.to_owned());
        }
    }
    for chain in stale {
        remove_chain(&chain);
    }
}

/// Removes the jump to `chain` (every copy: at most a few), then the chain.
fn remove_chain(chain: &str) {
    let mut delete = words(&["-D", "OUTPUT"]);
    delete.extend(jump(chain));
    // Bounded: a chain has one jump; a few tries cover a doubled one.
    for _ in 0..4 {
        if iptables(&delete).is_err() {
            break;
        }
    }
    let _ = iptables(&words(&["-F", chain]));
    let _ = iptables(&words(&["-X", chain]));
}

/// A chain of DROP rules of this test; dropping it removes them.
pub(crate) struct Firewall {
    chain: String,
    /// A connection mark of this chain's own, for [`Firewall::drop_dialled_by`].
    mark: u32,
}

impl Firewall {
    /// Creates the chain and its jump, or returns `None` (after saying so loudly)
    /// when iptables does not work here and `CI` is not `true`.
    ///
    /// # Panics
    ///
    /// Under `CI=true` when iptables does not work: the fault would go untested.
    pub(crate) fn create_or_skip() -> Option<Firewall> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        // Relaxed: a counter for unique names, nothing else depends on it.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let chain = format!("{PREFIX}{pid}-{n}");
        let mark = 0x7a00_0000 | ((pid & 0xf_ffff) << 4) | (n & 0xf);
        let firewall = Firewall { chain, mark };
        let mut insert = words(&["-I", "OUTPUT"]);
        insert.extend(jump(&firewall.chain));
        let made = iptables(&words(&["-N", &firewall.chain])).and_then(|()| iptables(&insert));
        match made {
            Ok(()) => Some(firewall),
            Err(error) => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                let message = format!(
                    "this test partitions etcd with iptables rules on loopback, and iptables \
                     does not work here: {error}. It needs the iptables binary (apt-get install \
                     -y iptables), root, and netfilter in the kernel."
                );
                assert!(!ci, "CI=true and the fault cannot be injected: {message}");
                eprintln!("\n!!!!!!!! SKIPPED, THE FAULT WAS NOT INJECTED: {message}\n");
                None
            }
        }
    }

    fn append(&self, rule: &[String]) {
        let mut args = words(&["-A", &self.chain]);
        args.extend_from_slice(rule);
        if let Err(error) = iptables(&args) {
            panic!("adding a partition rule: {error}");
        }
    }

    /// Drops every TCP packet to or from `port` (on 127.0.0.0/8): whatever talks
    /// through that port hears nothing, both ways.
    ///
    /// # Panics
    ///
    /// If iptables refuses the rule.
    pub(crate) fn drop_port(&self, port: u16) {
        let port = port.to_string();
        for side in ["--dport", "--sport"] {
            self.append(&words(&["-p", "tcp", side, &port, "-j", "DROP"]));
        }
    }

    /// Drops, both ways, every TCP connection that a process of user `uid` dialled
    /// to one of `ports`: the first packet it sends on one marks the connection
    /// (conntrack), and every packet of a marked connection is dropped.
    ///
    /// # Panics
    ///
    /// If iptables refuses a rule (no `owner`, `connmark` or `multiport` match).
    pub(crate) fn drop_dialled_by(&self, uid: u32, ports: &[u16]) {
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let mark = format!("{:#x}", self.mark);
        self.append(&words(&[
            "-p",
            "tcp",
            "-m",
            "owner",
            "--uid-owner",
            &uid.to_string(),
            "-m",
            "multiport",
            "--dports",
            &ports.join(","),
            "-j",
            "CONNMARK",
            "--set-mark",
            &mark,
        ]));
        self.append(&words(&["-m", "connmark", "--mark", &mark, "-j", "DROP"]));
    }

    /// Removes every rule (the chain and its jump stay until the guard drops).
    ///
    /// # Panics
    ///
    /// If iptables cannot flush the chain: the partition would not end.
    pub(crate) fn heal(&self) {
        if let Err(error) = iptables(&words(&["-F", &self.chain])) {
            panic!("healing the partition: {error}");
        }
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        remove_chain(&self.chain);
    }
}
