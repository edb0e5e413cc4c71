//! HTTP export for pprof consumers (Pyroscope, Parca, `go tool pprof`) and Prometheus.
//!
//! - `GET /metrics`: Prometheus text format;
//! - `GET /profiles`: the store's index, as JSON;
//! - `GET /pprof/ID`: one stored profile as gzipped pprof;
//! - `GET /pprof/latest?pid=P&craft=C&exe=E`: the newest one matching (all optional).
//!
//! There is no per-request check here (HTTP carries no credentials), which is
//! why it listens on 127.0.0.1 by default and can be turned off (`http = "off"`).
//! So any local user can connect: at most [`MAX_CONNECTIONS`] connections
//! are served at once (the rest, up to [`BACKLOG`], wait in the kernel's
//! backlog, taking no descriptor of witchd's), and each is closed [`CONNECTION_LIFETIME`]
//! after it was accepted, so idle or slow clients cannot take witchd's
//! descriptors (its Unix socket needs them too).

use super::{metrics, say, store, Daemon};
use anyhow::{Context, Result};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// HTTP connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long an HTTP connection lives (a scrape or a pprof download takes
/// far less; a keep-alive client connects again).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// The listener with its connections capped and timed (see the module comment).
struct Capped {
    inner: TcpListener,
    permits: Arc<Semaphore>,
}

/// One capped connection: its permit goes back when it is dropped.
struct Timed {
    stream: TcpStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
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

impl axum::serve::Listener for Capped {
    type Io = Timed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Timed, SocketAddr) {
        // A permit first: past the cap, connections wait in the backlog.
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let deadline = Box::pin(tokio::time::sleep(CONNECTION_LIFETIME));
        (Timed { stream, deadline, _permit: permit }, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
use witchcraft::profile::{Craft, Profile};

/// Connections the kernel completes and holds for witchd beyond those it
/// serves ([`MAX_CONNECTIONS`]): they wait there without a descriptor of
/// witchd's. tokio's (and the standard library's) default is 128: past
/// 64 served and 128 waiting, a client's SYN was dropped and it retried
/// after 1, 3, 7, ... s (400 clients at once took 126 s to connect).
/// The kernel caps it at `net.core.somaxconn` (4096 on current kernels).
pub const BACKLOG: u32 = 1024;

pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let s = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        s.set_reuseaddr(true)?;
        s.bind(addr)?;
        s.listen(BACKLOG)
    };
    let l = listen().with_context(|| format!("cannot listen on http {addr}"))?;
    if !addr.ip().is_loopback() {
        say!("warning: http {addr} is not a loopback address; it has no access control, so anyone who reaches it reads every profile");
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

/// Serves until shutdown.
pub async fn serve(d: Arc<Daemon>, l: TcpListener) {
    let stop = d.clone();
    let l = Capped { inner: l, permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)) };
    let r = axum::serve(l, router(d)).with_graceful_shutdown(async move { stop.until_shutdown().await }).await;
    if let Err(e) = r {
        say!("http server failed: {e}");
    }
}

async fn index() -> &'static str {
    "witchd\n/metrics             Prometheus metrics\n/profiles            stored profiles (JSON)\n\
     /pprof/ID            a stored profile as gzipped pprof\n/pprof/latest?pid=P&craft=C&exe=E   the newest matching one\n"
}

async fn metrics(State(d): State<Arc<Daemon>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics::render(&d)).into_response()
}

async fn profiles(State(d): State<Arc<Daemon>>) -> Response {
    let v: Vec<store::Meta> = d.store.lock().unwrap().list().cloned().collect();
    match serde_json::to_string(&v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[derive(Deserialize)]
struct LatestQuery {
    pid: Option<u32>,
    craft: Option<String>,
    exe: Option<String>,
}

async fn latest(State(d): State<Arc<Daemon>>, Query(q): Query<LatestQuery>) -> Response {
    let craft = match q.craft.as_deref().map(|c| (c, Craft::parse(c))) {
        Some((c, None)) => return (StatusCode::BAD_REQUEST, format!("unknown craft {c:?}\n")).into_response(),
        Some((_, c)) => c,
        None => None,
    };
    let id = d.store.lock().unwrap().latest(q.pid, craft, q.exe.as_deref()).map(|m| m.id.clone());
    match id {
        Some(id) => pprof(d, id).await,
        None => (StatusCode::NOT_FOUND, "no stored profile matches\n").into_response(),
    }
}

async fn by_id(State(d): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    if !store::valid_id(&id) {
        return (StatusCode::NOT_FOUND, "no such profile\n").into_response();
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
