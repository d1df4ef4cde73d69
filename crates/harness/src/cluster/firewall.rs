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

/// Runs `iptables -w 5` with `args` (waiting at most 5 s for the xtables lock); the
/// error says what failed.
fn iptables(args: &[String]) -> Result<(), String> {
    let output = Command::new(binary())
        .args(["-w", "5"])
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
pub struct Firewall {
    chain: String,
}

impl Firewall {
    /// Creates the chain and its jump, or returns `None` (after saying so loudly)
    /// when iptables does not work here and `CI` is not `true`.
    ///
    /// # Panics
    ///
    /// Under `CI=true` when iptables does not work: the fault would go untested.
    pub fn create_or_skip() -> Option<Firewall> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        // Relaxed: a counter for unique names, nothing else depends on it.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let chain = format!("{PREFIX}{pid}-{n}");
        let firewall = Firewall { chain };
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
    pub fn drop_port(&self, port: u16) {
        let port = port.to_string();
        for side in ["--dport", "--sport"] {
            self.append(&words(&["-p", "tcp", side, &port, "-j", "DROP"]));
        }
    }

    /// Removes the rules [`Firewall::drop_port`] added for `port`, and only them.
    ///
    /// # Panics
    ///
    /// If iptables cannot remove them: the cut would not end.
    pub fn undrop_port(&self, port: u16) {
        let port = port.to_string();
        for side in ["--dport", "--sport"] {
            let mut args = words(&["-D", &self.chain]);
            args.extend(words(&["-p", "tcp", side, &port, "-j", "DROP"]));
            if let Err(error) = iptables(&args) {
                panic!("removing a partition rule: {error}");
            }
        }
    }

    /// Drops, both ways, every TCP connection that a process of user `uid` dials
    /// or has dialled to one of `ports`: what it sends there (matched by its user,
    /// which also keeps any new connection from opening), and what comes back on
    /// the connections it had open (their local ports, read from `/proc/net/tcp`
    /// once the first rule is in, so that none can open in between).
    ///
    /// # Panics
    ///
    /// If iptables refuses a rule (no `owner` or `multiport` match), or
    /// `/proc/net/tcp` cannot be read.
    pub fn drop_dialled_by(&self, uid: u32, ports: &[u16]) {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
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
            &list.join(","),
            "-j",
            "DROP",
        ]));
        let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
        for (local, remote) in dialled(&table, uid, ports) {
            let (remote, local) = (remote.to_string(), local.to_string());
            self.append(&words(&[
                "-p", "tcp", "--sport", &remote, "--dport", &local, "-j", "DROP",
            ]));
        }
    }

    /// Removes every rule (the chain and its jump stay until the guard drops).
    ///
    /// # Panics
    ///
    /// If iptables cannot flush the chain: the partition would not end.
    pub fn heal(&self) {
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

/// The (local, remote) ports of the TCP sockets of user `uid` in `table` (the text
/// of `/proc/net/tcp`) between two 127.0.0.0/8 addresses whose remote port is one
/// of `ports`.
fn dialled(table: &str, uid: u32, ports: &[u16]) -> Vec<(u16, u16)> {
    // "0100007F:1F90": the address in hex, in memory order (127 last), and the port.
    let loopback_port = |field: &str| {
        let (address, port) = field.split_once(':')?;
        let port = u16::from_str_radix(port, 16).ok()?;
        (address.len() == 8 && address.ends_with("7F")).then_some(port)
    };
    let mut found = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote), Some(owner)) =
            (fields.get(1), fields.get(2), fields.get(7))
        else {
            continue;
        };
        if owner.parse::<u32>().ok() != Some(uid) {
            continue;
        }
        if let (Some(local), Some(remote)) = (loopback_port(local), loopback_port(remote)) {
            if ports.contains(&remote) {
                found.push((local, remote));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::dialled;

    #[test]
    fn the_connections_a_user_dialled_to_the_given_ports_are_found() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9C40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0
   1: 0100007F:A000 0100007F:9C41 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0
   2: 0100007F:A001 0100007F:9C42 01 00000000:00000000 00:00000000 00000000  1001        0 3 1 0
   3: 0100007F:A002 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 4 1 0
   4: 0200000A:A003 0100007F:9C41 01 00000000:00000000 00:00000000 00000000  1000        0 5 1 0
";
        // 0x9C41 = 40001, 0x9C42 = 40002, 0xA000 = 40960.
        assert_eq!(dialled(table, 1000, &[40001, 40002]), vec![(40960, 40001)]);
        assert_eq!(dialled(table, 1001, &[40001, 40002]), vec![(40961, 40002)]);
        assert!(dialled(table, 1002, &[40001, 40002]).is_empty());
    }
}
