//! The HTTP server of `taskstage serve`: the router over HTTP/1.1 with a bound on
//! everything a caller with no token can hold.
//!
//! - **Header read**: a request's head must arrive within [`Limits::header_read`],
//!   and a kept-alive connection waiting for its next request is closed after the
//!   same time (hyper's header-read timer runs whenever a head is awaited).
//! - **Connections**: at most [`Limits::connections`] at once. A connection beyond
//!   them first takes the place of the oldest one that is idle (no request in
//!   flight), which is closed; with none idle it is closed at once. So idle or
//!   half-open connections, which cost their holder nothing, cannot keep a request
//!   out, and the process stays below its open-file limit.
//! - **Shutdown**: no new connection; each open one ends after its request in
//!   flight, and one still open after [`Limits::drain`] (an event stream) is dropped.
//!
//! Cost: one map entry per open connection; an eviction scans the map (`O(c)` for
//! `c` open connections, at most [`Limits::connections`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The bounds of the server; [`Limits::default`] is what `serve` uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How long a request's head, or the next request on a kept-alive connection,
    /// may take to arrive.
    pub(crate) header_read: Duration,
    /// The most connections open at once.
    pub(crate) connections: usize,
    /// How long a shutdown waits for the connections still open.
    pub(crate) drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read: Duration::from_secs(10),
            connections: 128,
            drain: Duration::from_secs(2),
        }
    }
}

/// One open connection: how many of its requests are in flight, and how to close it.
struct Open {
    in_flight: Arc<AtomicUsize>,
    close: CancellationToken,
}

type Table = Arc<Mutex<BTreeMap<u64, Open>>>;

/// One request of a connection in flight, until dropped.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn table(t: &Table) -> std::sync::MutexGuard<'_, BTreeMap<u64, Open>> {
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let open: Table = Arc::default();
    let mut all = tokio::task::JoinSet::new();
    let stopping = CancellationToken::new();
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    // Bounded by `shutdown`.
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            // Reaps the connections that ended.
            Some(_) = all.join_next(), if !all.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before accept: the
                // listener is still good; try again in a moment.
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let id = next_id;
        next_id += 1;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let close = stopping.child_token();
        {
            let mut open = table(&open);
            if open.len() >= limits.connections {
                // The oldest idle connection makes room; with none idle, this one
                // is closed (dropped) at once.
                let idle = open
                    .iter()
                    .find(|(_, o)| o.in_flight.load(Ordering::SeqCst) == 0)
                    .map(|(id, _)| *id);
                match idle.and_then(|id| open.remove(&id)) {
                    Some(evicted) => evicted.close.cancel(),
                    None => continue,
                }
            }
            open.insert(
                id,
                Open {
                    in_flight: Arc::clone(&in_flight),
                    close: close.clone(),
                },
            );
        }
        let counted = Arc::clone(&in_flight);
        let service = tower::ServiceBuilder::new()
            .map_request(move |request: hyper::Request<hyper::body::Incoming>| {
                counted.fetch_add(1, Ordering::SeqCst);
                request
            })
            .map_response({
                let in_flight = Arc::clone(&in_flight);
                move |response: axum::response::Response| {
                    // Busy until the body is gone: sent whole, or dropped with the
                    // connection (an event stream counts for its whole life).
                    let busy = Busy(Arc::clone(&in_flight));
                    response.map(|body| {
                        axum::body::Body::new(http_body_util::BodyExt::map_frame(
                            body,
                            move |frame| {
                                let _ = &busy;
                                frame
                            },
                        ))
                    })
                }
            })
            .service(router.clone());
        let open_for_task = Arc::clone(&open);
        all.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .keep_alive(true);
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => drop(result),
                () = close.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            table(&open_for_task).remove(&id);
        });
    }
    drop(listener);
    stopping.cancel();
    // Bounded by the drain; what is left is dropped with the set.
    let _ = tokio::time::timeout(limits.drain, async {
        while all.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const BOUND: Duration = Duration::from_secs(10);

    /// A server on a free loopback port: `/ok` answers at once, `/hold` never (it
    /// sends one message on `entered` first: the request is in flight).
    async fn start(
        limits: Limits,
    ) -> (
        String,
        CancellationToken,
        tokio::task::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<()>,
    ) {
        let (entered, in_flight) = tokio::sync::mpsc::unbounded_channel();
        let router = Router::new()
            .route("/ok", axum::routing::get(|| async { "ok" }))
            .route(
                "/hold",
                axum::routing::get(move || {
                    let _ = entered.send(());
                    std::future::pending::<&'static str>()
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("an address").to_string();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let server = tokio::spawn(async move {
            serve(listener, router, limits, stopped.cancelled_owned())
                .await
                .expect("serve");
        });
        (addr, stop, server, in_flight)
    }

    /// Whether the server closed `stream` within `within` (a read sees the end).
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1024];
        // Bounded by `within`.
        tokio::time::timeout(within, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    async fn get(addr: &str, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut answer = String::new();
        tokio::time::timeout(BOUND, stream.read_to_string(&mut answer))
            .await
            .expect("an answer within 10 s")
            .expect("readable");
        answer
    }

    fn limits(connections: usize) -> Limits {
        Limits {
            header_read: Duration::from_millis(300),
            connections,
            drain: Duration::from_millis(500),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_that_never_ends_and_an_idle_connection_are_closed() {
        let (addr, stop, server, _) = start(limits(16)).await;
        let mut half_open = TcpStream::connect(&addr).await.expect("connect");
        half_open
            .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("send");
        let mut idle = TcpStream::connect(&addr).await.expect("connect");
        assert!(
            closed_within(&mut half_open, BOUND).await,
            "a half-open request stayed open"
        );
        assert!(
            closed_within(&mut idle, BOUND).await,
            "an idle connection stayed open"
        );
        assert!(get(&addr, "/ok").await.starts_with("HTTP/1.1 200"));
        stop.cancel();
        tokio::time::timeout(BOUND, server)
            .await
            .expect("ends")
            .expect("no panic");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_at_the_limit_make_room_and_busy_ones_are_kept() {
        let limit = 4;
        let slow_heads = Limits {
            header_read: Duration::from_secs(60),
            ..limits(limit)
        };
        let (addr, stop, server, _) = start(slow_heads).await;
        // The limit in idle connections: a request still gets in, at once.
        let mut idle = Vec::new();
        for _ in 0..limit * 3 {
            idle.push(TcpStream::connect(&addr).await.expect("connect"));
        }
        let answered = tokio::time::timeout(Duration::from_secs(1), get(&addr, "/ok")).await;
        assert!(
            answered.is_ok_and(|a| a.starts_with("HTTP/1.1 200")),
            "idle connections kept a request out"
        );
        stop.cancel();
        tokio::time::timeout(BOUND, server)
            .await
            .expect("ends")
            .expect("no panic");
        drop(idle);

        // The limit in requests being answered: none is evicted, and one more
        // connection is closed at once.
        let (addr, stop, server, mut in_flight) = start(slow_heads).await;
        let mut busy = Vec::new();
        for _ in 0..limit {
            let mut stream = TcpStream::connect(&addr).await.expect("connect");
            let request = format!("GET /hold HTTP/1.1\r\nHost: {addr}\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("send");
            // In flight before the next one connects.
            tokio::time::timeout(BOUND, in_flight.recv())
                .await
                .expect("the hold is in flight within 10 s");
            busy.push(stream);
        }
        let mut extra = TcpStream::connect(&addr).await.expect("connect");
        assert!(
            closed_within(&mut extra, BOUND).await,
            "a connection beyond the limit was kept with none idle"
        );
        for stream in &mut busy {
            assert!(
                !closed_within(stream, Duration::from_millis(50)).await,
                "a connection with a request in flight was evicted"
            );
        }
        // A shutdown ends within its drain although the holds never answer.
        let began = tokio::time::Instant::now();
        stop.cancel();
        tokio::time::timeout(BOUND, server)
            .await
            .expect("ends")
            .expect("no panic");
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "{:?}",
            began.elapsed()
        );
    }
}
