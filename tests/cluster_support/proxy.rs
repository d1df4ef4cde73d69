//! A TCP proxy on 127.0.0.1 in front of each etcd member, that the test can cut:
//! a partition between one worker process and the whole etcd cluster, or, in front
//! of the members' peer ports, between one member and the others.
//!
//! While cut, connections stay open and every byte is dropped in both directions
//! (silence, as a lost route gives, not a refusal); new connections are accepted
//! and hear nothing. Healing closes every connection that lived through the cut
//! (their byte streams have holes), so clients reconnect cleanly. It listens only
//! on 127.0.0.1 ports the system picks, and forwards only to the given members.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    /// One member cut off from the others: the index of its listener, and its
    /// member id as etcd's peers name the sender (`X-Server-From`, hex).
    isolated: Mutex<Option<(usize, String)>>,
    /// Bumped by every heal: a connection older than the current epoch closes.
    epoch: AtomicU64,
    stop: AtomicBool,
}

/// The proxies of one worker process; dropping it stops them (within 100 ms).
#[derive(Debug)]
pub(crate) struct Proxy {
    endpoints: Vec<String>,
    state: Arc<State>,
}

impl State {
    /// Whether a connection to listener `to`, from the member `from` names (if
    /// known), is cut now.
    fn blocked(&self, to: usize, from: &OnceLock<String>) -> bool {
        if self.cut.load(Ordering::SeqCst) {
            return true;
        }
        let isolated = self.isolated.lock().unwrap_or_else(PoisonError::into_inner);
        isolated
            .as_ref()
            .is_some_and(|(i, id)| *i == to || from.get() == Some(id))
    }
}

impl Proxy {
    /// One listener per upstream `http://127.0.0.1:port`.
    ///
    /// # Panics
    ///
    /// If an upstream is not an `http://host:port` URL or 127.0.0.1:0 cannot be
    /// bound: both are the test's own set-up.
    pub(crate) fn start(upstreams: &[String]) -> Proxy {
        let state = Arc::new(State::default());
        let mut endpoints = Vec::new();
        for (index, upstream) in upstreams.iter().enumerate() {
            let target = upstream
                .strip_prefix("http://")
                .expect("an http:// member URL")
                .to_owned();
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
            listener
                .set_nonblocking(true)
                .expect("a non-blocking listener");
            let port = listener.local_addr().expect("the proxy's address").port();
            endpoints.push(format!("http://127.0.0.1:{port}"));
            let state = Arc::clone(&state);
            std::thread::spawn(move || accept(listener, index, target, state));
        }
        Proxy { endpoints, state }
    }

    /// The proxies' URLs, in the order of the upstreams.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// Cuts every connection, both ways.
    pub(crate) fn cut(&self) {
        // SeqCst, like every access here: a few flag reads per 100 ms.
        self.state.cut.store(true, Ordering::SeqCst);
    }

    /// In front of the members' peer ports: cuts member `index` (member id `id`,
    /// in hex) off from the others, both ways: what is sent to its port, and what
    /// it sends to theirs (its connections carry its id in `X-Server-From`).
    pub(crate) fn isolate(&self, index: usize, id: &str) {
        *self
            .state
            .isolated
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((index, id.to_owned()));
    }

    /// Ends the cut and closes every connection that lived through it.
    pub(crate) fn heal(&self) {
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
        self.state.cut.store(false, Ordering::SeqCst);
        *self
            .state
            .isolated
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
    }
}

/// Bounded by the stop flag, polled every 20 ms.
fn accept(listener: TcpListener, index: usize, target: String, state: Arc<State>) {
    while !state.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let epoch = state.epoch.load(Ordering::SeqCst);
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let sender = Arc::new(OnceLock::new());
                for (up, from, to) in [(true, &client, &upstream), (false, &upstream, &client)] {
                    let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let link = Link {
                        to: index,
                        sender: Arc::clone(&sender),
                        sniff: up,
                        epoch,
                    };
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || pump(from, to, link, state));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One direction of one proxied connection.
struct Link {
    /// The listener (member) it reached.
    to: usize,
    /// The sending member's id, from the first request's `X-Server-From` header.
    sender: Arc<OnceLock<String>>,
    /// Whether this direction carries the requests (client to member).
    sniff: bool,
    /// The epoch it was accepted in.
    epoch: u64,
}

/// The value of header `X-Server-From` in `bytes`, if there.
fn server_from(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let at = text.find("X-Server-From: ")? + "X-Server-From: ".len();
    let end = text[at..].find('\r')?;
    Some(text[at..at + end].trim().to_owned())
}

/// Copies `from` to `to` until either end closes, the proxy stops, or a heal
/// retires this connection; while cut, what is read is dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, link: Link, state: Arc<State>) {
    let epoch = link.epoch;
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if state.stop.load(Ordering::SeqCst) || state.epoch.load(Ordering::SeqCst) != epoch {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if link.sniff && link.sender.get().is_none() {
                    if let Some(id) = server_from(&buf[..n]) {
                        let _ = link.sender.set(id);
                    }
                }
                if state.blocked(link.to, &link.sender) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
