//! [`Coordinator`] on a real etcd, through `etcd-client`.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions,
    Txn as EtcdTxn, TxnOp, WatchOptions,
};

use super::coord::{
    watch_channel, BoxFuture, Compare, Coordinator, Grant, KeepAlive, KeyValue, Listing, Op, Txn,
    TxnResult, WatchEvent, WatchMessage, WatchStream,
};
use super::error::ClusterError;

/// Settings of an [`EtcdCoordinator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdOptions {
    /// The deadline of one call to one member (default 1 s); a call that misses it
    /// is tried on the next member.
    pub op_timeout: Duration,
    /// The deadline of connecting to one member (default 500 ms).
    pub connect_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            op_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_millis(500),
        }
    }
}

/// A [`Coordinator`] on an etcd cluster (v3 API; tested on etcd 3.4).
///
/// It talks to one member at a time and moves to the next one itself when a call
/// fails or misses its deadline (a client's balanced channel may keep sending to a
/// dead member). Cheap to clone: clones share the connection.
///
/// No HTTP/2 keep-alive pings are configured: with etcd, pings more often than
/// every 5 s get the connection closed; every call has its own deadline instead.
#[derive(Clone)]
pub struct EtcdCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    options: EtcdOptions,
    current: Mutex<Current>,
}

struct Current {
    index: usize,
    client: Option<Client>,
    /// When the current member last answered a call (with a value or an error of
    /// its own): a member that answered within the last call deadline is not left
    /// because one call of ours was slow.
    answered: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("endpoints", &self.inner.endpoints)
            .field("current", &self.lock().index)
            .field("options", &self.inner.options)
            .finish()
    }
}

/// Whether an error means "this member cannot serve now: try another one".
fn is_unavailable(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Aborted
        ),
        E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

fn lease_not_found(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => {
            status.code() == tonic::Code::NotFound || status.message().contains("lease not found")
        }
        E::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

impl EtcdCoordinator {
    /// Connects to the first of `endpoints` (`http://host:port`) that answers.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Unreachable`] naming every endpoint's failure when none
    /// answered a status request in time; [`ClusterError::Store`] for an empty list.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is written.
    pub async fn connect<I, S>(endpoints: I, options: EtcdOptions) -> Result<Self, ClusterError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        if endpoints.is_empty() {
            return Err(ClusterError::Store {
                op: "connect",
                detail: "no endpoint given".into(),
            });
        }
        let coordinator = EtcdCoordinator {
            inner: Arc::new(Inner {
                endpoints,
                options,
                current: Mutex::new(Current {
                    index: 0,
                    client: None,
                    answered: None,
                }),
            }),
        };
        let mut failures = Vec::new();
        for index in 0..coordinator.inner.endpoints.len() {
            let endpoint = coordinator.inner.endpoints[index].clone();
            match coordinator.try_member(index).await {
                Ok(client) => {
                    let mut current = coordinator.lock();
                    current.index = index;
                    current.client = Some(client);
                    drop(current);
                    return Ok(coordinator);
                }
                Err(detail) => failures.push(format!("{endpoint}: {detail}")),
            }
        }
        Err(ClusterError::Unreachable {
            op: "connect",
            detail: failures.join("; "),
        })
    }

    /// The endpoints, in the order they are tried.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The endpoint calls go to now.
    pub fn current_endpoint(&self) -> &str {
        let index = self.lock().index;
        &self.inner.endpoints[index]
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        // Plain field writes only: a poisoned lock still holds a usable value.
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects to member `index` and checks that it answers.
    async fn try_member(&self, index: usize) -> Result<Client, String> {
        let endpoint = &self.inner.endpoints[index];
        let options =
            ConnectOptions::new().with_connect_timeout(self.inner.options.connect_timeout);
        let attempt = async {
            let mut client = Client::connect([endpoint.as_str()], Some(options)).await?;
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        match tokio::time::timeout(self.inner.options.op_timeout, attempt).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!(
                "no answer within {:?}",
                self.inner.options.op_timeout
            )),
        }
    }

    /// The client for the current member, connecting if needed.
    async fn client(&self) -> Result<(usize, Client), String> {
        let index = {
            let current = self.lock();
            if let Some(client) = &current.client {
                return Ok((current.index, client.clone()));
            }
            current.index
        };
        let client = self.try_member(index).await?;
        let mut current = self.lock();
        if current.index == index {
            current.client = Some(client.clone());
        }
        Ok((index, client))
    }

    /// Records that member `index` answered a call.
    fn answered(&self, index: usize) {
        let mut current = self.lock();
        if current.index == index {
            current.answered = Some(tokio::time::Instant::now());
        }
    }

    /// After a call to member `index` missed its deadline: moves to the next member
    /// unless that member answered another call within the last call deadline. A
    /// process too busy to read its answers in time (its runtime saturated, its
    /// threads starved) sees every member as slow; leaving each in turn would only
    /// add a connection's set-up to every call. A member that hangs answers nothing,
    /// and is left one call deadline after its last answer.
    fn timed_out(&self, index: usize) {
        if !self.answered_recently(index) {
            self.failed(index);
        }
    }

    /// Whether member `index` is the current one and answered a call within the
    /// last call deadline.
    fn answered_recently(&self, index: usize) -> bool {
        let current = self.lock();
        current.index == index
            && current
                .answered
                .is_some_and(|at| at.elapsed() < self.inner.options.op_timeout)
    }

    /// Moves to the next member after member `index` failed.
    fn failed(&self, index: usize) {
        let mut current = self.lock();
        if current.index == index {
            current.index = (index + 1) % self.inner.endpoints.len();
            current.client = None;
            // The next member gets one call deadline before a timeout may leave it
            // too: at most one move per call deadline on timeouts, however many
            // calls a busy process lets time out at once.
            current.answered = Some(tokio::time::Instant::now());
            tracing::debug!(
                failed = %self.inner.endpoints[index],
                next = %self.inner.endpoints[current.index],
                "moving to the next etcd member"
            );
        }
    }

    /// Runs `call` on the current member, moving on to the next one when it cannot
    /// serve; at most one attempt per member.
    async fn call<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        // Every member's failure, so an Unreachable names each endpoint tried.
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..self.inner.endpoints.len() {
            let (index, client) = match self.client().await {
                Ok(found) => found,
                Err(detail) => {
                    let index = self.lock().index;
                    failures.push(format!("{}: {detail}", self.inner.endpoints[index]));
                    self.failed(index);
                    continue;
                }
            };
            // A caller that gives up on this call (its own deadline, shorter than
            // ours) while the member has not answered also moves us on.
            let mut attempt = Attempt {
                coordinator: self,
                index,
                started: tokio::time::Instant::now(),
                settled: false,
            };
            let answer = tokio::time::timeout(self.inner.options.op_timeout, call(client)).await;
            attempt.settled = true;
            match answer {
                Ok(Ok(value)) => {
                    self.answered(index);
                    return Ok(value);
                }
                Ok(Err(error)) if is_unavailable(&error) => {
                    failures.push(format!("{}: {error}", self.inner.endpoints[index]));
                    self.failed(index);
                }
                Ok(Err(error)) => {
                    self.answered(index);
                    return Err(ClusterError::Store {
                        op,
                        detail: error.to_string(),
                    });
                }
                Err(_) => {
                    failures.push(format!(
                        "{}: no answer within {:?}",
                        self.inner.endpoints[index], self.inner.options.op_timeout
                    ));
                    self.timed_out(index);
                    if self.lock().index == index {
                        // Kept: the member answers others. This call is over.
                        break;
                    }
                }
            }
        }
        Err(ClusterError::Unreachable {
            op,
            detail: failures.join("; "),
        })
    }
}

/// One call to one member; dropped unsettled (the caller gave up) after waiting a
/// while, it counts as that member's failure.
struct Attempt<'a> {
    coordinator: &'a EtcdCoordinator,
    index: usize,
    started: tokio::time::Instant,
    settled: bool,
}

/// How long a member may keep a call waiting before a caller's giving up on it
/// counts against the member.
const SUSPECT_AFTER: Duration = Duration::from_millis(200);

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.settled && self.started.elapsed() >= SUSPECT_AFTER {
            self.coordinator.timed_out(self.index);
        }
    }
}

/// The most keys one page of a listing asks for.
const LIST_PAGE: i64 = 2_000;

/// The fewest keys a page of a listing shrinks to.
const LIST_PAGE_MIN: i64 = 8;

/// Whether a page of a listing failed in a way a smaller page may not: it missed
/// its deadline, or its answer was larger than a message may be.
fn page_too_large(error: &ClusterError) -> bool {
    match error {
        ClusterError::Unreachable { .. } => true,
        ClusterError::Store { detail, .. } => {
            detail.contains("too large") || detail.contains("larger than")
        }
        _ => false,
    }
}

/// How many watch messages may wait for the watcher.
const WATCH_BUFFER: usize = 64;

/// How often a quiet watch asks its member for a progress notice; a member that
/// sends nothing for two periods, and answers no other call meanwhile, has lost
/// the watch.
const WATCH_PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// How often a watch checks that the coordinator still talks to its member.
const WATCH_MEMBER_CHECK_EVERY: Duration = Duration::from_millis(250);

/// The first key after every key that starts with `prefix` (etcd's range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

fn convert_kv(kv: &etcd_client::KeyValue) -> Result<KeyValue, ClusterError> {
    let key = kv.key_str().map_err(|e| ClusterError::Corrupt {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        reason: e.to_string(),
    })?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    })
}

/// Forwards one etcd watch to its [`WatchStream`] until either end goes away.
///
/// Bounded by both ends: it returns when the watcher drops the stream, when the
/// member ends or cancels the watch, when the member is silent for two progress
/// periods (a hung member), or when the coordinator has moved on to another member
/// because a call to this one failed. A member cut off from the others' quorum
/// still answers progress requests from its own stale state, and sends no change:
/// its failed calls (a keep-alive needs the leader) are what tell. The watcher then
/// reads again, on the member the coordinator talks to now.
async fn forward_watch(
    coordinator: EtcdCoordinator,
    index: usize,
    stream: etcd_client::WatchStream,
    tx: tokio::sync::mpsc::Sender<Result<WatchMessage, ClusterError>>,
) {
    let (mut requests, mut responses) = stream.split();
    let mut ticker = tokio::time::interval(WATCH_PROGRESS_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut member_check = tokio::time::interval(WATCH_MEMBER_CHECK_EVERY);
    member_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = true;
    let lost = |detail: String| {
        Err(ClusterError::Unreachable {
            op: "watch",
            detail,
        })
    };
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = member_check.tick() => {
                let current = coordinator.lock().index;
                if current != index {
                    let _ = tx.send(lost(format!(
                        "{}: left for {} after a failed call",
                        coordinator.inner.endpoints[index],
                        coordinator.inner.endpoints[current]
                    ))).await;
                    return;
                }
            }
            _ = ticker.tick() => {
                // A member that answers other calls is alive: a silent watch then
                // means this process was too busy to read it, and listing again
                // would only add work.
                if !heard && !coordinator.answered_recently(index) {
                    coordinator.failed(index);
                    let _ = tx.send(lost(format!(
                        "{}: no watch progress within {:?}",
                        coordinator.inner.endpoints[index],
                        WATCH_PROGRESS_EVERY * 2
                    ))).await;
                    return;
                }
                heard = false;
                if let Err(error) = requests.request_progress().await {
                    let _ = tx.send(lost(error.to_string())).await;
                    return;
                }
            }
            message = responses.message() => {
                heard = true;
                let response = match message {
                    Ok(Some(response)) => response,
                    Ok(None) => return,
                    Err(error) => {
                        let _ = tx.send(lost(error.to_string())).await;
                        return;
                    }
                };
                if response.compact_revision() > 0 {
                    let revision = response.compact_revision();
                    let _ = tx.send(Ok(WatchMessage::Compacted { revision })).await;
                    return;
                }
                if response.canceled() {
                    let reason = response.cancel_reason().to_owned();
                    let _ = tx.send(lost(format!("cancelled: {reason}"))).await;
                    return;
                }
                let revision = response.header().map_or(0, |h| h.revision());
                let mut events = Vec::with_capacity(response.events().len());
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let converted = match convert_kv(kv) {
                        Ok(kv) => kv,
                        Err(error) => {
                            let _ = tx.send(Err(error)).await;
                            return;
                        }
                    };
                    events.push(match event.event_type() {
                        EventType::Put => WatchEvent::Put(converted),
                        EventType::Delete => WatchEvent::Delete {
                            key: converted.key,
                            revision: kv.mod_revision(),
                        },
                    });
                }
                if tx.send(Ok(WatchMessage::Events { revision, events })).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn convert_txn(txn: Txn) -> EtcdTxn {
    let compares: Vec<EtcdCompare> = txn
        .when
        .into_iter()
        .map(|c| match c {
            Compare::Absent(key) => EtcdCompare::version(key, CompareOp::Equal, 0),
            Compare::CreateRevision(key, rev) => {
                EtcdCompare::create_revision(key, CompareOp::Equal, rev)
            }
            Compare::ModRevision(key, rev) => EtcdCompare::mod_revision(key, CompareOp::Equal, rev),
            Compare::Value(key, value) => EtcdCompare::value(key, CompareOp::Equal, value),
        })
        .collect();
    let ops: Vec<TxnOp> = txn
        .then
        .into_iter()
        .map(|op| match op {
            Op::Put { key, value, lease } => {
                TxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l)))
            }
            Op::Delete { key } => TxnOp::delete(key, None),
        })
        .collect();
    EtcdTxn::new().when(compares).and_then(ops)
}

impl Coordinator for EtcdCoordinator {
    /// The same endpoints and options, not connected yet: the first call connects
    /// from the runtime that makes it, so the connection's tasks run there.
    fn fresh_connection(&self) -> Option<Arc<dyn Coordinator>> {
        Some(Arc::new(EtcdCoordinator {
            inner: Arc::new(Inner {
                endpoints: self.inner.endpoints.clone(),
                options: self.inner.options,
                current: Mutex::new(Current {
                    index: self.lock().index,
                    client: None,
                    answered: None,
                }),
            }),
        }))
    }

    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, ClusterError>> {
        Box::pin(async move {
            let secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1) as i64;
            let response = self
                .call("lease grant", |mut c| async move {
                    c.lease_grant(secs, None).await
                })
                .await?;
            if !response.error().is_empty() || response.ttl() <= 0 {
                return Err(ClusterError::Store {
                    op: "lease grant",
                    detail: response.error().to_owned(),
                });
            }
            let granted = Duration::from_secs(response.ttl().unsigned_abs());
            Ok(Grant {
                id: response.id(),
                ttl: granted,
            })
        })
    }

    fn keep_alive(&self, lease: i64) -> BoxFuture<'_, Result<KeepAlive, ClusterError>> {
        Box::pin(async move {
            // The client's keep-alive sends one request and checks that its answer
            // has TTL > 0, but keeps the answer to itself; a second request on the
            // same stream gives the TTL the store answered with, which is the one the
            // lease deadline may trust (never a locally remembered one).
            let ttl = self
                .call("keep-alive", |mut c| async move {
                    let (mut keeper, mut answers) = match c.lease_keep_alive(lease).await {
                        Ok(opened) => opened,
                        Err(error) if lease_not_found(&error) => return Ok(None),
                        Err(error) => return Err(error),
                    };
                    keeper.keep_alive().await?;
                    match answers.message().await? {
                        Some(answer) if answer.ttl() > 0 => Ok(Some((
                            answer.ttl(),
                            answer.header().map_or(0, |h| h.revision()),
                        ))),
                        // TTL ≤ 0: the lease expired between the two requests.
                        Some(_) => Ok(None),
                        None => Err(etcd_client::Error::LeaseKeepAliveError(
                            "the keep-alive stream closed without an answer".to_owned(),
                        )),
                    }
                })
                .await?;
            Ok(match ttl {
                Some((secs, revision)) => KeepAlive::Alive {
                    ttl: Duration::from_secs(secs.unsigned_abs()),
                    revision,
                },
                None => KeepAlive::Expired,
            })
        })
    }

    fn revoke(&self, lease: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            self.call("lease revoke", |mut c| async move {
                match c.lease_revoke(lease).await {
                    Ok(_) => Ok(()),
                    Err(error) if lease_not_found(&error) => Ok(()),
                    Err(error) => Err(error),
                }
            })
            .await
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Listing, ClusterError>> {
        Box::pin(async move {
            // Paged: at most LIST_PAGE keys a request, every page read at the first
            // page's revision, so the listing is one consistent read however large.
            // A page that misses its deadline (a busy process decodes it too slowly)
            // or is larger than a message may be is asked again a quarter as large,
            // down to LIST_PAGE_MIN keys.
            let end = prefix_end(prefix.as_bytes());
            let mut from = prefix.clone().into_bytes();
            let mut revision = 0;
            let mut kvs = Vec::new();
            let mut page = LIST_PAGE;
            // Bounded: each page moves `from` past the last key read, and each retry
            // of a page shrinks it, down to LIST_PAGE_MIN.
            loop {
                let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let answer = self
                    .call("list", |mut c| {
                        let (from, options) = (from.clone(), options.clone());
                        async move { c.get(from, Some(options)).await }
                    })
                    .await;
                let response = match answer {
                    Ok(response) => response,
                    Err(error) if page > LIST_PAGE_MIN && page_too_large(&error) => {
                        page = (page / 4).max(LIST_PAGE_MIN);
                        tracing::debug!(%prefix, page, %error, "listing in smaller pages");
                        continue;
                    }
                    Err(error) => return Err(error),
                };
                if revision == 0 {
                    revision = response.header().map_or(0, |h| h.revision());
                }
                for kv in response.kvs() {
                    kvs.push(convert_kv(kv)?);
                }
                match response.kvs().last() {
                    Some(last) if response.more() => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => break,
                }
            }
            Ok(Listing { revision, kvs })
        })
    }

    fn watch(&self, prefix: String, from: i64) -> BoxFuture<'_, Result<WatchStream, ClusterError>> {
        Box::pin(async move {
            let mut options = WatchOptions::new().with_prefix();
            if from > 0 {
                options = options.with_start_revision(from);
            }
            let stream = self
                .call("watch", |mut c| {
                    let prefix = prefix.clone();
                    let options = options.clone();
                    async move { c.watch(prefix, Some(options)).await }
                })
                .await?;
            // The member the call succeeded on (moved on only after a failure).
            let index = self.lock().index;
            let (tx, rx) = watch_channel(WATCH_BUFFER);
            tokio::spawn(forward_watch(self.clone(), index, stream, tx));
            Ok(rx)
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, ClusterError>> {
        Box::pin(async move {
            let response = self
                .call("txn", |mut c| {
                    let txn = convert_txn(txn.clone());
                    async move { c.txn(txn).await }
                })
                .await?;
            Ok(TxnResult {
                succeeded: response.succeeded(),
                revision: response.header().map_or(0, |h| h.revision()),
            })
        })
    }

    fn wait_change(
        &self,
        prefix: String,
        after: i64,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            // From revision 0 (nothing read yet) the watch starts at the store's
            // first revision: every change since, or a compaction notice, ends the
            // wait at once, as the documented early return allows.
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(after.max(0) + 1);
            let mut stream = self
                .call("watch", |mut c| {
                    let prefix = prefix.clone();
                    let options = options.clone();
                    async move { c.watch(prefix, Some(options)).await }
                })
                .await?;
            // Bounded by the deadline: each message either ends the wait or is the
            // watch's creation notice.
            loop {
                match tokio::time::timeout_at(deadline, stream.message()).await {
                    Err(_) => return Ok(()),
                    Ok(Ok(Some(response))) => {
                        if !response.events().is_empty() || response.canceled() {
                            return Ok(());
                        }
                    }
                    Ok(Ok(None)) => return Ok(()),
                    Ok(Err(error)) => {
                        return Err(ClusterError::Unreachable {
                            op: "watch",
                            detail: error.to_string(),
                        })
                    }
                }
            }
        })
    }
}
