//! Test harness for the etcd tests: a 3-member etcd on 127.0.0.1 with random free
//! ports and temporary data directories (in /dev/shm when it exists), stopped by
//! pid (SIGTERM, then SIGKILL) when its guard drops, also when a test fails or
//! panics; and a probe unit that counts its live runs and writes fenced checkpoints.
//!
//! Each member listens for clients on the usual port and on one or more side ports,
//! one per client that a test can cut off on its own (see
//! [`EtcdCluster::side_endpoints_of`]). A member killed or frozen can be brought
//! back with the same data directory and ports ([`EtcdCluster::restart_member`],
//! [`EtcdCluster::thaw_member`]).
//!
//! When no `etcd` binary is found (on `PATH`, or at `$ETCD_BIN`), a test is skipped
//! with a line saying so, except under `CI=true`, where it fails.

pub mod firewall;
pub mod history;
pub mod overload;
pub mod process;
pub mod unfenced;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use taskstage::{RunContext, RunError, RunExit, Task, TaskBuilder, Unit};
use taskstage_cluster::{
    BoxFuture, ClusterError, Coordinator, Fencer, Grant, KeepAlive, Listing, TaskSpec, TaskStatus,
    Txn, TxnResult, WatchStream,
};

/// Any store behind one type, for a test that runs on several: the etcd cluster
/// it started, or a store file of its own.
#[derive(Clone)]
pub struct AnyStore {
    store: Arc<dyn Coordinator>,
}

impl AnyStore {
    /// `store`, behind the one type.
    pub fn new(store: impl Coordinator) -> AnyStore {
        AnyStore {
            store: Arc::new(store),
        }
    }
}

impl Coordinator for AnyStore {
    crate::pass_to_store!(grant, keep_alive, revoke, list, watch, txn, wait_change);

    fn fresh_connection(&self) -> Option<Arc<dyn Coordinator>> {
        self.store.fresh_connection()
    }
}

/// Only one etcd cluster at a time: three members per test on two cores is
/// enough load to make elections flap.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A running etcd cluster; dropping it stops every member by pid.
pub struct EtcdCluster {
    members: Vec<Member>,
    /// The test's own iptables chain, when started with
    /// [`EtcdCluster::start_partitionable`].
    firewall: Option<firewall::Firewall>,
    dir: PathBuf,
    /// The `--initial-cluster` and `--initial-cluster-token` the members started
    /// with, for [`EtcdCluster::restore_all`].
    initial: String,
    token: String,
    _turn: MutexGuard<'static, ()>,
}

struct Member {
    name: String,
    client_url: String,
    /// The side client ports, for [`EtcdCluster::cut_side`].
    side_ports: Vec<u16>,
    peer_port: u16,
    /// The user the member runs as, when partitionable: its own, so that an
    /// iptables rule can tell the connections it dials from its peers'.
    uid: Option<u32>,
    /// Its data directory.
    data: PathBuf,
    /// How to start it again: the binary, its arguments, its log file.
    binary: PathBuf,
    args: Vec<std::ffi::OsString>,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// Starts the member (again), appending to its log.
    fn spawn(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open a member's log file");
        let log_err = log.try_clone().expect("clone the log file handle");
        let mut command = Command::new(&self.binary);
        if let Some(uid) = self.uid {
            command.uid(uid);
        }
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .expect("spawn an etcd member")
    }

    fn client_port(&self) -> u16 {
        self.client_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a client URL ends with its port")
    }
}

fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ETCD_BIN") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
}

fn etcdctl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ETCDCTL_BIN") {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("etcdctl"))
                .find(|candidate| candidate.is_file())
        })
        .expect("etcdctl on PATH (apt-get install -y etcd-client), or set ETCDCTL_BIN")
}

/// Gives `dir` and everything under it to `uid`.
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), None).expect("give a member its data");
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir).expect("read a member's data directory") {
            chown_tree(&entry.expect("a directory entry").path(), uid);
        }
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 for a free port");
    listener
        .local_addr()
        .expect("the listener's address")
        .port()
}

/// Whether member at `port` answers `/health` with `"health":"true"`.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

impl EtcdCluster {
    /// Starts `n` members, or returns `None` (after saying so) when no etcd binary
    /// exists and `CI` is not `true`.
    ///
    /// # Panics
    ///
    /// If the binary is missing under `CI=true`, or the cluster is not healthy
    /// within 20 s (the members are stopped first, and their logs printed).
    pub fn start_or_skip(n: usize) -> Option<EtcdCluster> {
        EtcdCluster::start(n, false)
    }

    /// As [`EtcdCluster::start_or_skip`], with an iptables chain of the test's own
    /// and each member run as a user of its own, so that
    /// [`EtcdCluster::isolate_member`] and [`EtcdCluster::cut_side_clients`] can
    /// partition it. Returns `None` (after saying so loudly) when iptables does
    /// not work here and `CI` is not `true`.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start_or_skip`]; and under `CI=true` when iptables does
    /// not work.
    pub fn start_partitionable(n: usize) -> Option<EtcdCluster> {
        EtcdCluster::start_with(n, true, 1)
    }

    /// As [`EtcdCluster::start_partitionable`], with `sides` side client ports per
    /// member: side `k` of every member is for one client that [`EtcdCluster::cut_side`]
    /// cuts off alone.
    pub fn start_partitionable_sides(n: usize, sides: usize) -> Option<EtcdCluster> {
        EtcdCluster::start_with(n, true, sides)
    }

    fn start(n: usize, partitionable: bool) -> Option<EtcdCluster> {
        EtcdCluster::start_with(n, partitionable, 1)
    }

    fn start_with(n: usize, partitionable: bool, sides: usize) -> Option<EtcdCluster> {
        assert!((1..=8).contains(&sides), "1 to 8 side ports");
        assert!(n <= 8, "at most 8 members");
        let Some(binary) = etcd_binary() else {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(
                !ci,
                "CI=true and no etcd binary was found (PATH or $ETCD_BIN): the etcd tests \
                 must not be skipped on CI. Install it: apt-get install -y etcd-server etcd-client"
            );
            eprintln!("SKIPPED: no etcd binary on PATH (install etcd-server, or set ETCD_BIN)");
            return None;
        };
        let firewall = if partitionable {
            Some(firewall::Firewall::create_or_skip()?)
        } else {
            None
        };
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // The members' data is thrown away: in memory (where /dev/shm is), a write's
        // fsync costs nothing, and the tests time the protocol rather than the disk.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("taskstage-etcd-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the cluster's temporary directory");
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            firewall,
            dir: dir.clone(),
            initial: String::new(),
            token: format!("taskstage-{stamp}"),
            _turn: turn,
        };
        let started = Instant::now();
        let mut attempt = 0;
        // Bounded: 3 attempts (see below).
        'start: loop {
            attempt += 1;
            // (client, side clients, peer) per member.
            let ports: Vec<(u16, Vec<u16>, u16)> = (0..n)
                .map(|_| {
                    (
                        free_port(),
                        (0..sides).map(|_| free_port()).collect(),
                        free_port(),
                    )
                })
                .collect();
            let initial: Vec<String> = ports
                .iter()
                .enumerate()
                .map(|(i, (_, _, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
                .collect();
            cluster.initial = initial.join(",");
            for (i, (client, sides, peer)) in ports.iter().enumerate() {
                let (client, peer) = (*client, *peer);
                let name = format!("m{i}");
                // A user of its own per member (unique to this test binary), owning its
                // data directory; the log is opened by `Member::spawn`.
                let uid = partitionable.then(|| 1_000_000 + std::process::id() * 8 + i as u32);
                let data = dir.join(&name);
                if let Some(uid) = uid {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::create_dir(&data).expect("create a member's data directory");
                    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))
                        .expect("restrict a member's data directory");
                    std::os::unix::fs::chown(&data, Some(uid), None)
                        .expect("give a member its data directory");
                }
                let mut clients = vec![format!("http://127.0.0.1:{client}")];
                clients.extend(sides.iter().map(|side| format!("http://127.0.0.1:{side}")));
                let clients = clients.join(",");
                // With its data directory in place, a member started again with these
                // arguments rejoins as itself (the initial-cluster flags are ignored).
                let args: Vec<std::ffi::OsString> = [
                    "--name",
                    &name,
                    "--data-dir",
                    &data.to_string_lossy(),
                    "--listen-client-urls",
                    &clients,
                    "--advertise-client-urls",
                    &clients,
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                    "--initial-cluster",
                    &initial.join(","),
                    "--initial-cluster-token",
                    &format!("taskstage-{stamp}"),
                    "--initial-cluster-state",
                    "new",
                    "--heartbeat-interval",
                    "50",
                    "--election-timeout",
                    "500",
                ]
                .iter()
                .map(std::ffi::OsString::from)
                .collect();
                let mut member = Member {
                    data: data.clone(),
                    log: dir.join(format!("{name}.log")),
                    name,
                    client_url: format!("http://127.0.0.1:{client}"),
                    side_ports: sides.clone(),
                    peer_port: peer,
                    uid,
                    binary: binary.clone(),
                    args,
                    child: None,
                };
                member.child = Some(member.spawn());
                cluster.members.push(member);
            }
            // Bounded: 20 s, polling every 50 ms.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if ports.iter().all(|(client, _, _)| healthy(*client)) {
                    break 'start;
                }
                // A port picked free may be taken (by any socket on the machine, an
                // outgoing connection included) before the member binds it: the
                // member exits at once. Start again with fresh ports, 3 times at most.
                let exited = cluster.members.iter_mut().any(|m| {
                    m.child
                        .as_mut()
                        .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
                });
                if exited && attempt < 3 && cluster.logs().contains("address already in use") {
                    eprintln!(
                        "etcd: a port was taken before a member bound it (attempt {attempt}); \
                         starting again with fresh ports"
                    );
                    cluster.stop_all();
                    cluster.members.clear();
                    remove_dir(&dir);
                    std::fs::create_dir_all(&dir)
                        .expect("create the cluster's temporary directory");
                    continue 'start;
                }
                if Instant::now() >= deadline {
                    let logs = cluster.logs();
                    drop(cluster);
                    panic!("the etcd cluster was not healthy within 20 s; logs:\n{logs}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        eprintln!(
            "etcd: {n} members healthy in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        Some(cluster)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Kills member `i` at once (SIGKILL), as a machine loss would.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again after [`EtcdCluster::kill_member`], with the same
    /// data directory, ports and user (nothing if it is running).
    pub fn restart_member(&mut self, i: usize) {
        if self.members[i].child.is_none() {
            let child = self.members[i].spawn();
            self.members[i].child = Some(child);
        }
    }

    /// Saves a backup of the store into `file`, as an operator does with
    /// `etcdctl snapshot save` (from the first member that answers).
    ///
    /// # Panics
    ///
    /// If no member could save it.
    pub fn snapshot_save(&self, file: &Path) {
        let mut failures = Vec::new();
        for member in &self.members {
            let output = Command::new(etcdctl_binary())
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &member.client_url, "snapshot", "save"])
                .arg(file)
                .output()
                .expect("run etcdctl snapshot save");
            if output.status.success() {
                return;
            }
            failures.push(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        panic!("etcdctl snapshot save failed on every member: {failures:?}");
    }

    /// Restores every member from the backup `file`, as an operator does: every
    /// member stopped, its data directory replaced by `etcdctl snapshot restore`
    /// (etcd 3.4: the revision goes back to the snapshot's), then every member
    /// started again with its ports. Returns once the cluster is healthy.
    ///
    /// # Panics
    ///
    /// If a restore fails, or the cluster is not healthy within 20 s.
    pub fn restore_all(&mut self, file: &Path) {
        self.stop_all();
        for member in &self.members {
            remove_dir(&member.data);
            let output = Command::new(etcdctl_binary())
                .env("ETCDCTL_API", "3")
                .arg("snapshot")
                .arg("restore")
                .arg(file)
                .args(["--name", &member.name])
                .arg("--data-dir")
                .arg(&member.data)
                .args(["--initial-cluster", &self.initial])
                .args(["--initial-cluster-token", &self.token])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{}", member.peer_port),
                ])
                .output()
                .expect("run etcdctl snapshot restore");
            assert!(
                output.status.success(),
                "etcdctl snapshot restore of {}: {}",
                member.name,
                String::from_utf8_lossy(&output.stderr)
            );
            if let Some(uid) = member.uid {
                chown_tree(&member.data, uid);
            }
        }
        for i in 0..self.members.len() {
            let child = self.members[i].spawn();
            self.members[i].child = Some(child);
        }
        // Bounded: 20 s, polling every 50 ms.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.members.iter().all(|m| healthy(m.client_port())) {
            if Instant::now() >= deadline {
                panic!(
                    "the restored etcd cluster was not healthy within 20 s; logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether member `i` runs and answers `/health` with `"health":"true"` (it is
    /// part of a quorum).
    pub fn member_healthy(&self, i: usize) -> bool {
        let member = &self.members[i];
        member.child.is_some() && healthy(member.client_port())
    }

    /// How many members there are (never none: a cluster starts with one at least).
    #[allow(clippy::len_without_is_empty, reason = "a cluster always has a member")]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Freezes member `i` (SIGSTOP): it keeps its connections open and answers
    /// nothing, as a hung machine would. The guard thaws it before stopping it.
    pub fn freeze_member(&mut self, i: usize) {
        if let Some(child) = &self.members[i].child {
            signal(child, "-STOP");
        }
    }

    /// Thaws member `i` after [`EtcdCluster::freeze_member`] (SIGCONT).
    pub fn thaw_member(&mut self, i: usize) {
        if let Some(child) = &self.members[i].child {
            signal(child, "-CONT");
        }
    }

    /// Every member's side client URL: for the one client that
    /// [`EtcdCluster::cut_side_clients`] cuts off.
    pub fn side_endpoints(&self) -> Vec<String> {
        self.side_endpoints_of(0)
    }

    /// Every member's side client URL `k`: for the one client that
    /// [`EtcdCluster::cut_side`]`(k)` cuts off.
    pub fn side_endpoints_of(&self, k: usize) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.side_ports[k]))
            .collect()
    }

    fn firewall(&self) -> &firewall::Firewall {
        self.firewall
            .as_ref()
            .expect("a cluster started with start_partitionable")
    }

    /// Cuts every member's side client port, both ways (iptables DROP on the
    /// port as destination and as source): a client on the side endpoints is cut
    /// off from the whole cluster, while the others keep their ports. Only for a
    /// cluster started with [`EtcdCluster::start_partitionable`].
    ///
    /// # Panics
    ///
    /// If the cluster was not started so, or iptables refuses a rule.
    pub fn cut_side_clients(&mut self) {
        self.cut_side(0);
    }

    /// Cuts every member's side client port `k`, both ways, as
    /// [`EtcdCluster::cut_side_clients`] does for side 0; the other sides keep theirs.
    ///
    /// # Panics
    ///
    /// If the cluster was not started partitionable, or iptables refuses a rule.
    pub fn cut_side(&mut self, k: usize) {
        for member in &self.members {
            self.firewall().drop_port(member.side_ports[k]);
        }
    }

    /// Ends the cut of side `k` alone (removes its rules, and only them).
    ///
    /// # Panics
    ///
    /// If the cluster was not started partitionable, or iptables cannot remove them.
    pub fn heal_side(&mut self, k: usize) {
        for member in &self.members {
            self.firewall().undrop_port(member.side_ports[k]);
        }
    }

    /// Partitions member `i` from the others, both ways, keeping its client ports
    /// open: a member in a minority of one. Dropped: every packet to or from its
    /// peer port (the connections its peers dial to it), and every connection it
    /// dials to their peer ports (told apart by its user). Only for a cluster
    /// started with [`EtcdCluster::start_partitionable`].
    ///
    /// # Panics
    ///
    /// If the cluster was not started so, or iptables refuses a rule.
    pub fn isolate_member(&mut self, i: usize) {
        let member = &self.members[i];
        let uid = member.uid.expect("a member with a user of its own");
        let others: Vec<u16> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(j, m)| (j != i).then_some(m.peer_port))
            .collect();
        self.firewall().drop_port(member.peer_port);
        self.firewall().drop_dialled_by(uid, &others);
    }

    /// The member that member `i` names as the raft leader, if it answers and
    /// names one of them.
    pub fn leader_named_by(&self, i: usize) -> Option<usize> {
        self.leader_as_said_by(|j| j == i)
    }

    /// How many members answer `/health` on their side client port.
    pub fn side_ports_answering(&self) -> usize {
        self.members
            .iter()
            .filter(|m| healthy(m.side_ports[0]))
            .count()
    }

    /// Whether member `i` answers a linearizable read (a range through etcd's JSON
    /// gateway) within 500 ms: a member cut off from a quorum cannot.
    pub fn serves_linearizable_read(&self, i: usize) -> bool {
        let Some(port) = self.members[i]
            .client_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
        else {
            return false;
        };
        // The key "probe", base64.
        post(port, "/v3/kv/range", r#"{"key":"cHJvYmU="}"#)
            .is_some_and(|r| r.starts_with("HTTP/1.0 200") && r.contains("\"header\""))
    }

    /// Ends every partition made by [`EtcdCluster::isolate_member`] or
    /// [`EtcdCluster::cut_side_clients`].
    ///
    /// # Panics
    ///
    /// If the cluster was not started so, or iptables cannot remove the rules.
    pub fn heal(&mut self) {
        self.firewall().heal();
    }

    /// The index of the member that is the raft leader, as the first member that
    /// answers says (through etcd's JSON gateway, `/v3/maintenance/status`).
    pub fn leader(&self) -> Option<usize> {
        self.leader_as_said_by(|_| true)
    }

    /// As [`EtcdCluster::leader`], without asking member `skip` (an isolated
    /// member still names the leader it last knew).
    pub fn leader_by_others(&self, skip: usize) -> Option<usize> {
        self.leader_as_said_by(|i| i != skip)
    }

    /// The leader as the first member that `ask` accepts and that answers says.
    fn leader_as_said_by(&self, ask: impl Fn(usize) -> bool) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for (i, member) in self.members.iter().enumerate() {
            let port = member.client_url.rsplit(':').next()?.parse().ok()?;
            let body = member
                .child
                .as_ref()
                .and_then(|_| post(port, "/v3/maintenance/status", "{}"));
            let field = |name: &str| body.as_deref().and_then(|b| json_field(b, name));
            ids.push(field("member_id"));
            if ask(i) {
                leader = leader.or_else(|| field("leader"));
            }
        }
        let leader = leader?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// The index of the member with this client URL.
    pub fn member_of(&self, url: &str) -> Option<usize> {
        self.members.iter().position(|m| m.client_url == url)
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for member in &self.members {
            let path = self.dir.join(format!("{}.log", member.name));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {} ---\n", member.name));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Stops every member: SIGTERM to all, up to 3 s for them to exit, then SIGKILL
    /// (the last member may hang on SIGTERM without its peers).
    fn stop_all(&mut self) {
        for member in &self.members {
            if let Some(child) = &member.child {
                signal(child, "-CONT");
                signal(child, "-TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for member in &mut self.members {
            let Some(mut child) = member.child.take() else {
                continue;
            };
            // Bounded by the shared 3 s deadline, polling every 20 ms.
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
        remove_dir(&self.dir);
    }
}

/// Sends a signal to a child by pid, through `kill(1)`.
fn signal(child: &Child, which: &str) {
    let _ = Command::new("kill")
        .args([which, &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// The string value of field `name` in a JSON text (etcd's gateway writes its
/// 64-bit numbers as strings).
fn json_field(body: &str, name: &str) -> Option<String> {
    let start = body.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = body[start..].find('"')?;
    Some(body[start..start + len].to_owned())
}

/// POSTs `body` to `path` on 127.0.0.1:`port` and returns the response, if any
/// came within 500 ms.
fn post(port: u16, path: &str, body: &str) -> Option<String> {
    let mut stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    (!response.is_empty()).then_some(response)
}

/// A child process that is killed by pid (thawed first) when dropped, also when a
/// test fails. It holds the child's stdin open: a child that calls
/// [`exit_when_stdin_closes`] goes away with its parent, however the parent ends.
pub struct ChildGuard {
    child: Child,
    _stdin: Option<ChildStdin>,
}

impl ChildGuard {
    /// Guards `child` (started with a piped stdin).
    pub fn new(mut child: Child) -> ChildGuard {
        let stdin = child.stdin.take();
        ChildGuard {
            child,
            _stdin: stdin,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's exit status, if it has exited (reaped); `None` while it runs.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // A child already reaped (by `try_wait`) is left alone: its pid may be
        // another process's by now. One not yet reaped holds its pid until `wait`.
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            signal_pid(self.child.id(), rustix::process::Signal::CONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `sig` to process `pid` (one this program started).
pub fn signal_pid(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// In a child process: exits as soon as stdin (a pipe from the parent) closes.
pub fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let mut byte = [0u8; 1];
        while let Ok(1) = std::io::stdin().read(&mut byte) {}
        std::process::exit(0);
    });
}

/// A free port on 127.0.0.1 where nothing listens.
pub fn dead_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// What the probes saw, across every worker of a test.
#[derive(Default)]
pub struct Probes {
    next_run: u64,
    /// Live runs per task (run ids).
    pub alive: HashMap<String, Vec<u64>>,
    /// The worker and the checkpoint each run started from, per task, in order.
    pub starts: HashMap<String, Vec<(String, u64)>>,
    /// The fencer of the latest run per (task, worker).
    pub fencers: HashMap<(String, String), Fencer>,
    /// Overlaps seen at a run's start.
    pub violations: Vec<String>,
    /// How many times the factory was called.
    pub built: usize,
}

/// Probes shared between the test and its workers.
pub type SharedProbes = Arc<Mutex<Probes>>;

/// Locks the probes (a panicking test thread does not poison them for the rest).
pub fn probes(shared: &SharedProbes) -> MutexGuard<'_, Probes> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

struct AliveGuard {
    probes: SharedProbes,
    task: String,
    run: u64,
}

impl Drop for AliveGuard {
    fn drop(&mut self) {
        if let Some(runs) = probes(&self.probes).alive.get_mut(&self.task) {
            runs.retain(|r| *r != self.run);
        }
    }
}

/// A unit that resumes from its fenced checkpoint `pos` and advances it every
/// 50 ms until cancelled.
pub struct Counter {
    task: String,
    worker: String,
    fencer: Fencer,
    probes: SharedProbes,
}

impl Unit for Counter {
    fn name(&self) -> &str {
        "counter"
    }

    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        // Resume from the checkpoint; bounded by the run's cancellation.
        let at: u64 = loop {
            match self.fencer.checkpoint("pos").await {
                Ok(Some(bytes)) => break String::from_utf8_lossy(&bytes).parse().unwrap_or(0),
                Ok(None) => break 0,
                Err(_) => {}
            }
            tokio::select! {
                _ = ctx.cancelled() => return Ok(RunExit::Cancelled),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        };
        let run = {
            let mut p = probes(&self.probes);
            p.next_run += 1;
            let run = p.next_run;
            let alive = p.alive.entry(self.task.clone()).or_default();
            let before = alive.clone();
            alive.push(run);
            if !before.is_empty() {
                let msg = format!("run {run} of {} started while {before:?} alive", self.task);
                p.violations.push(msg);
            }
            p.starts
                .entry(self.task.clone())
                .or_default()
                .push((self.worker.clone(), at));
            run
        };
        let _guard = AliveGuard {
            probes: Arc::clone(&self.probes),
            task: self.task.clone(),
            run,
        };
        count_from(&self.fencer, &ctx, at).await
    }
}

/// Advances the fenced checkpoint `pos` from `at` by one every 50 ms until the run
/// is cancelled; once the fence rejects a write, only waits for the cancellation.
pub async fn count_from(
    fencer: &Fencer,
    ctx: &RunContext,
    mut at: u64,
) -> Result<RunExit, RunError> {
    // Bounded by the run's cancellation.
    loop {
        tokio::select! {
            _ = ctx.cancelled() => return Ok(RunExit::Cancelled),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        match fencer
            .put_checkpoint("pos", (at + 1).to_string().into_bytes())
            .await
        {
            Ok(()) => at += 1,
            Err(ClusterError::Fenced { .. }) => {
                ctx.cancelled().await;
                return Ok(RunExit::Cancelled);
            }
            Err(_) => {}
        }
    }
}

/// A factory of [`Counter`] tasks for worker `worker`.
pub fn counters(
    worker: &str,
    shared: &SharedProbes,
) -> impl Fn(TaskSpec) -> Result<TaskBuilder, taskstage_cluster::FactoryError> + Send + Sync + 'static
{
    let worker = worker.to_owned();
    let shared = Arc::clone(shared);
    move |spec: TaskSpec| {
        let task = spec.task.as_str().to_owned();
        let mut p = probes(&shared);
        p.built += 1;
        p.fencers
            .insert((task.clone(), worker.clone()), spec.fencer.clone());
        drop(p);
        Ok(Task::builder(task.clone()).unit(Counter {
            task,
            worker: worker.clone(),
            fencer: spec.fencer,
            probes: Arc::clone(&shared),
        }))
    }
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `within`.
///
/// # Panics
///
/// With `what` in the message, when `check` never returned `Some` in time.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never happened within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tasks held per worker of `workers`, from a list's owners.
pub fn per_worker(list: &[TaskStatus], workers: &[String]) -> BTreeMap<String, usize> {
    workers
        .iter()
        .map(|w| {
            let held = list
                .iter()
                .filter(|s| s.owner.as_ref().map(|o| o.as_str()) == Some(w.as_str()))
                .count();
            (w.clone(), held)
        })
        .collect()
}

/// `inner`'s messages, each held back while `gate` holds `true`: a watch that lags
/// for as long as a test says. Ends when either side ends.
pub fn held_back(
    mut inner: taskstage_cluster::WatchStream,
    mut gate: tokio::sync::watch::Receiver<bool>,
) -> taskstage_cluster::WatchStream {
    let (tx, stream) = taskstage_cluster::watch_channel(64);
    // Bounded by the watch: it ends when either side ends.
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| inner.as_mut().poll_next(cx)).await {
            if gate.wait_for(|held| !*held).await.is_err() || tx.send(message).await.is_err() {
                return;
            }
        }
    });
    stream
}
