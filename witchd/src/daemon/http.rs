//! HTTP export for pprof consumers (Pyroscope, Parca, `go tool pprof`) and Prometheus.
//!
//! - `GET /metrics`: Prometheus text format;
//! - `GET /profiles`: the stored profiles the client may read, as JSON;
//! - `GET /pprof/ID`: one stored profile as gzipped pprof;
//! - `GET /pprof/latest?pid=P&craft=C&exe=E`: the newest one matching (all optional).
//!
//! It listens on 127.0.0.1 by default, so any local user can connect, and
//! a web page in a local browser can try to (DNS rebinding). Therefore:
//! - **Who is asking.** HTTP carries no credentials, but a client on this
//!   host connects from a socket the kernel knows the owner of
//!   ([`witchcraft::sys::sock_diag`]): that uid is the client's *user*.
//!   (Another host's client, or a connection the kernel no longer lists as
//!   established, has no user: it is known by its address alone.)
//! - **Profiles** are served as `http_profiles` says ([`ProfileAccess`]): by
//!   default only to the user whose processes they are, and all of them
//!   to root, as over the Unix socket.
//! - **Host.** A request is answered only if its `Host` names this host
//!   the way a local client does: `localhost` (or a name under it), an IP
//!   address (a loopback one, the one listened on, or any when listening
//!   on all), or a name listed in `http_hosts`; with a port, the one
//!   listened on. A rebinding page's request carries its own domain, and
//!   gets 421.
//! - **Connections.** At most [`MAX_CONNECTIONS`] are served at once (the
//!   rest, up to [`BACKLOG`], wait in the kernel's backlog, taking no
//!   descriptor of witchd's), and at most [`MAX_PER_PEER`] of one user
//!   (or, without one, one address), root's excepted: more are answered 503
//!   and closed. One that sends no request for [`IDLE_TIMEOUT`] (after it
//!   connects, or after its last answer) is closed, and every one is
//!   closed [`CONNECTION_LIFETIME`] after it was accepted, so idle or slow
//!   clients cannot take witchd's descriptors (its Unix socket needs them too).

use super::config::ProfileAccess;
use super::{metrics, say, store, Daemon};
use anyhow::{Context, Result};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use witchcraft::profile::{Craft, Profile};

/// HTTP connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// HTTP connections served at once for one user (or one address, when the
/// user is not known), root's excepted.
pub const MAX_PER_PEER: usize = 8;
/// How long a connection may go without sending a request: from its
/// accept, or from the end of its last answer (a keep-alive client
/// connects again), to the end of the request's head.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an HTTP connection lives (a scrape or a pprof download takes
/// far less).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// Connections the kernel completes and holds for witchd beyond those it
/// serves ([`MAX_CONNECTIONS`]): they wait there without a descriptor of
/// witchd's. tokio's (and the standard library's) default is 128: past
/// 64 served and 128 waiting, a client's SYN was dropped and it retried
/// after 1, 3, 7, ... s (400 clients at once took 126 s to connect).
/// The kernel caps it at `net.core.somaxconn` (4096 on current kernels).
pub const BACKLOG: u32 = 1024;

/// Who is at the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A client on this host, by the uid owning its socket.
    User(u32),
    /// A client whose user is not known: by its address.
    Address(IpAddr),
}

impl Peer {
    /// The other end of an accepted connection. (The kernel knows the
    /// socket only if it is on this host.)
    fn of(local: SocketAddr, peer: SocketAddr) -> Peer {
        match witchcraft::sys::sock_diag::tcp_peer_uid(local, peer) {
            Some(uid) => Peer::User(uid),
            None => Peer::Address(peer.ip()),
        }
    }

    /// May this client read a profile whose process's owner was `owner`?
    fn may_read(&self, access: ProfileAccess, owner: Option<(u32, u32)>) -> bool {
        match (access, *self) {
            (ProfileAccess::All, _) => true,
            (ProfileAccess::None, _) => false,
            (ProfileAccess::Owner, Peer::User(0)) => true,
            (ProfileAccess::Owner, Peer::User(uid)) => owner.is_some_and(|(o, _)| o == uid),
            (ProfileAccess::Owner, Peer::Address(_)) => false,
        }
    }
}

/// Connections in flight per peer; a slot is given back when its guard drops.
#[derive(Default)]
struct PerPeer(Mutex<HashMap<Peer, usize>>);

struct PeerSlot {
    peers: Arc<PerPeer>,
    peer: Peer,
}

impl PerPeer {
    fn take(self: &Arc<Self>, peer: Peer) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(peer).or_insert(0);
        if peer != Peer::User(0) && *n >= MAX_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), peer })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.peers.0.lock().unwrap();
        if let Some(n) = m.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

/// One connection, closed when its lifetime is up.
struct Timed {
    stream: TcpStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Timed {
    fn expired(&mut self, cx: &mut TaskContext<'_>) -> bool {
        std::future::Future::poll(self.deadline.as_mut(), cx).is_ready()
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection's time is up")
}

impl AsyncRead for Timed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Timed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let s = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        s.set_reuseaddr(true)?;
        s.bind(addr)?;
        s.listen(BACKLOG)
    };
    let l = listen().with_context(|| format!("cannot listen on http {addr}"))?;
    if !addr.ip().is_loopback() {
        say!("warning: http {addr} is not a loopback address; clients on other hosts have no user, so they read no profiles unless http_profiles = \"all\"");
    }
    Ok(l)
}

pub fn router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/profiles", get(profiles))
        .route("/pprof/latest", get(latest))
        .route("/pprof/{id}", get(by_id))
        .with_state(d)
}

/// Does a request's `Host` (and the authority of an absolute URI) name
/// this server as a local client would (see the module comment)? `local`:
/// the address listened on; `names`: `http_hosts`.
pub fn host_allowed(headers: &HeaderMap, uri: &Uri, local: SocketAddr, names: &[String]) -> bool {
    let hosts = headers.get_all(header::HOST).iter().map(|h| h.to_str().ok()).collect::<Vec<_>>();
    if hosts.len() > 1 || hosts.iter().any(Option::is_none) {
        return false;
    }
    let given = hosts.first().copied().flatten().into_iter().chain(uri.authority().map(|a| a.as_str()));
    given.into_iter().all(|h| authority_allowed(h, local, names))
}

fn authority_allowed(h: &str, local: SocketAddr, names: &[String]) -> bool {
    let h = h.trim();
    // [v6]:port, [v6], host:port, host.
    let (host, port) = match h.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, "")) => (v6, None),
            Some((v6, p)) => match p.strip_prefix(':') {
                Some(p) => (v6, Some(p)),
                None => return false,
            },
            None => return false,
        },
        None => match h.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        },
    };
    if port.is_some_and(|p| p.parse::<u16>() != Ok(local.port())) {
        return false;
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback() || ip == local.ip() || local.ip().is_unspecified();
    }
    names.iter().any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(&host))
}

/// A fixed short answer, written straight onto a connection that is not served.
async fn refuse(mut s: TcpStream, status: &str, why: &str) {
    let msg =
        format!("HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}\n", why.len() + 1);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = s.write_all(msg.as_bytes()).await;
        let _ = s.shutdown().await;
    })
    .await;
}

/// Serves until shutdown, then lets the connections in flight finish
/// their answers (the caller bounds how long that may take).
pub async fn serve(d: Arc<Daemon>, l: TcpListener) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let Ok(local) = l.local_addr() else { return };
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers = Arc::new(PerPeer::default());
    let app = router(d.clone());
    let names = Arc::new(d.cfg.http_hosts.clone());
    let mut conns = tokio::task::JoinSet::new();
    loop {
        // A permit first: past the cap, connections wait in the backlog.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = d.until_shutdown() => break,
        };
        let (stream, addr) = tokio::select! {
            r = l.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    say!("http accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = d.until_shutdown() => break,
        };
        while conns.try_join_next().is_some() {}
        let peer = Peer::of(stream.local_addr().unwrap_or(local), addr);
        let Some(slot) = peers.take(peer) else {
            let who = match peer {
                Peer::User(uid) => format!("uid {uid}"),
                Peer::Address(a) => a.to_string(),
            };
            let why = format!("witchd: {who} has {MAX_PER_PEER} connections open already");
            tokio::spawn(async move { refuse(stream, "503 Service Unavailable", &why).await });
            continue;
        };
        let (app, names, d) = (app.clone(), names.clone(), d.clone());
        conns.spawn(async move {
            let _held = (permit, slot);
            let io = TokioIo::new(Timed { stream, deadline: Box::pin(tokio::time::sleep(CONNECTION_LIFETIME)) });
            let svc = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                let app = app.clone();
                let allowed = host_allowed(req.headers(), req.uri(), local, &names);
                req.extensions_mut().insert(peer);
                async move {
                    if !allowed {
                        let why = "witchd answers only requests for this host (localhost, an IP address, or a name in http_hosts)\n";
                        return Ok::<_, std::convert::Infallible>((StatusCode::MISDIRECTED_REQUEST, why).into_response());
                    }
                    app.oneshot(req.map(axum::body::Body::new)).await
                }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new()).header_read_timeout(IDLE_TIMEOUT);
            let conn = b.serve_connection(io, svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = d.until_shutdown() => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    while conns.join_next().await.is_some() {}
}

async fn index() -> &'static str {
    "witchd\n/metrics             Prometheus metrics\n/profiles            stored profiles you may read (JSON)\n\
     /pprof/ID            a stored profile as gzipped pprof\n/pprof/latest?pid=P&craft=C&exe=E   the newest matching one\n"
}

async fn metrics(State(d): State<Arc<Daemon>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics::render(&d)).into_response()
}

/// Profiles are not served to this client (`http_profiles`).
fn not_served(access: ProfileAccess) -> Option<Response> {
    (access == ProfileAccess::None).then(|| {
        (StatusCode::FORBIDDEN, "witchd serves no profiles over HTTP (http_profiles = \"none\"); use `witch daemon fetch`\n")
            .into_response()
    })
}

async fn profiles(State(d): State<Arc<Daemon>>, peer: Option<Extension<Peer>>) -> Response {
    let access = d.cfg.http_profiles;
    if let Some(r) = not_served(access) {
        return r;
    }
    let peer = peer.map(|p| p.0);
    let v: Vec<store::Meta> =
        d.store.lock().unwrap().list().filter(|m| peer.is_some_and(|p| p.may_read(access, m.owner))).cloned().collect();
    match serde_json::to_string(&v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/pprof/latest`'s parameters, as given: checked here, so that a bad one
/// gets a line that names it, not the framework's deserialization error,
/// and a misspelt one is refused rather than ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LatestQuery {
    pid: Option<String>,
    craft: Option<String>,
    exe: Option<String>,
}

const LATEST_TAKES: &str = "/pprof/latest takes pid=PID (a process id), craft=dead|silent-store|silent-load and exe=NAME, all optional";

async fn latest(
    State(d): State<Arc<Daemon>>,
    peer: Option<Extension<Peer>>,
    q: Result<Query<LatestQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let access = d.cfg.http_profiles;
    if let Some(r) = not_served(access) {
        return r;
    }
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, format!("a parameter witchd does not know: {LATEST_TAKES}\n")).into_response();
    };
    let pid = match q.pid.as_deref().map(|p| (p, p.trim().parse::<u32>())) {
        None => None,
        Some((_, Ok(p))) if p > 0 => Some(p),
        Some((p, _)) => return (StatusCode::BAD_REQUEST, format!("pid={p:?} is not a process id: {LATEST_TAKES}\n")).into_response(),
    };
    let craft = match q.craft.as_deref().map(|c| (c, Craft::parse(c))) {
        Some((c, None)) => return (StatusCode::BAD_REQUEST, format!("unknown craft {c:?}: {LATEST_TAKES}\n")).into_response(),
        Some((_, c)) => c,
        None => None,
    };
    let peer = peer.map(|p| p.0);
    let id = d
        .store
        .lock()
        .unwrap()
        .latest(pid, craft, q.exe.as_deref(), |m| peer.is_some_and(|p| p.may_read(access, m.owner)))
        .map(|m| m.id.clone());
    match id {
        Some(id) => pprof(d, id).await,
        None => (StatusCode::NOT_FOUND, "no stored profile matches (that you may read)\n").into_response(),
    }
}

async fn by_id(State(d): State<Arc<Daemon>>, peer: Option<Extension<Peer>>, Path(id): Path<String>) -> Response {
    let access = d.cfg.http_profiles;
    if let Some(r) = not_served(access) {
        return r;
    }
    let peer = peer.map(|p| p.0);
    // Not found and not allowed read the same, so IDs of others' profiles don't leak.
    let may = store::valid_id(&id) && d.store.lock().unwrap().get(&id).is_some_and(|m| peer.is_some_and(|p| p.may_read(access, m.owner)));
    if !may {
        return (StatusCode::NOT_FOUND, "no such profile (that you may read)\n").into_response();
    }
    pprof(d, id).await
}

/// Converts a stored profile to gzipped pprof on a blocking thread
/// (symbolization reads the binaries' debug info).
async fn pprof(d: Arc<Daemon>, id: String) -> Response {
    let name = id.clone();
    let r = tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
        let bytes = d.store.lock().unwrap().read(&id)?;
        let p = Profile::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
        let gz = crate::render::pprof::gzipped(&p);
        // Symbolizing parsed every module's debug info into many small
        // allocations, now free: give the pages back rather than keep the peak.
        // SAFETY: malloc_trim only returns free pages to the kernel; it takes
        // the allocator's own locks and has no preconditions.
        unsafe { libc::malloc_trim(0) };
        gz
    })
    .await;
    match r {
        Ok(Ok(gz)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}.pb.gz\"")),
            ],
            gz,
        )
            .into_response(),
        Ok(Err(e)) if e.is::<store::NotStored>() => (StatusCode::NOT_FOUND, format!("{e:#}\n")).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "conversion failed\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_for_this_host_are_answered() {
        let local: SocketAddr = "127.0.0.1:9465".parse().unwrap();
        let names = vec!["metrics.example.org".to_string()];
        let ok = |h: &str| authority_allowed(h, local, &names);
        for h in [
            "localhost",
            "localhost:9465",
            "LOCALHOST:9465",
            "a.localhost:9465",
            "127.0.0.1:9465",
            "127.0.0.2",
            "[::1]:9465",
            "[::1]",
            "metrics.example.org:9465",
            "localhost.",
        ] {
            assert!(ok(h), "{h} refused");
        }
        for h in [
            "evil.example",
            "evil.example:9465",
            "localhost:80",
            "127.0.0.1:9466",
            "10.0.0.1:9465",
            "localhost.evil.example",
            "[::1",
            "[::1]x",
            "metrics.example.org:1",
        ] {
            assert!(!ok(h), "{h} allowed");
        }
        let any: SocketAddr = "0.0.0.0:9465".parse().unwrap();
        assert!(authority_allowed("10.0.0.1:9465", any, &[]));
        assert!(!authority_allowed("rebind.example:9465", any, &[]));
        let mut h = HeaderMap::new();
        assert!(host_allowed(&h, &"/metrics".parse().unwrap(), local, &[]), "no Host: an HTTP/1.0 client");
        assert!(!host_allowed(&h, &"http://evil.example/metrics".parse().unwrap(), local, &[]));
        h.append(header::HOST, "localhost:9465".parse().unwrap());
        assert!(host_allowed(&h, &"/metrics".parse().unwrap(), local, &[]));
        h.append(header::HOST, "evil.example".parse().unwrap());
        assert!(!host_allowed(&h, &"/metrics".parse().unwrap(), local, &[]), "two Hosts");
    }

    #[test]
    fn profiles_go_to_whom_the_configuration_says() {
        let mine = Some((1000, 1000));
        let (u, root, remote) = (Peer::User(1000), Peer::User(0), Peer::Address("10.0.0.1".parse().unwrap()));
        assert!(
            u.may_read(ProfileAccess::Owner, mine)
                && root.may_read(ProfileAccess::Owner, mine)
                && root.may_read(ProfileAccess::Owner, None)
        );
        assert!(!u.may_read(ProfileAccess::Owner, None) && !u.may_read(ProfileAccess::Owner, Some((1001, 1000))));
        assert!(!remote.may_read(ProfileAccess::Owner, mine) && remote.may_read(ProfileAccess::All, None));
        assert!(!root.may_read(ProfileAccess::None, mine));
    }
}
