//! The local API: `witch daemon ...` requests over a Unix socket.
//!
//! The socket is created owner-only (or `socket_mode`), but its permissions
//! are only the first gate: every request is checked against the caller's
//! credentials from the kernel (SO_PEERCRED), with [`procfs::may_access`]:
//! root sees everything, anyone else only the processes (and profiles of
//! processes) they could ptrace themselves.

use super::config::DaemonConfig;
use super::metrics::{ErrorKind, Outcome};
use super::procfs::{self, Proc};
use super::proto::{DaemonStatus, Reply, Request, TargetStatus, MAX_REQUEST};
use super::scheduler::{options, State};
use super::session::{self, SessionPlan};
use super::{say, Daemon};
use anyhow::{bail, Context, Result};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use witchcraft::profile::Craft;

/// Connections served at once; more are told to retry.
const MAX_CONNECTIONS: usize = 64;
/// Connections served at once for one user (root excepted), so that one
/// user's idle or slow connections cannot keep everyone else out.
const MAX_PER_USER: usize = 8;
/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in flight per uid; a slot is given back when its guard drops.
#[derive(Default)]
struct PerUser(std::sync::Mutex<std::collections::HashMap<u32, usize>>);

struct UserSlot {
    users: Arc<PerUser>,
    uid: u32,
}

impl PerUser {
    fn take(self: &Arc<Self>, uid: u32) -> Option<UserSlot> {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(uid).or_insert(0);
        if uid != 0 && *n >= MAX_PER_USER {
            return None;
        }
        *n += 1;
        Some(UserSlot { users: self.clone(), uid })
    }
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let mut m = self.users.0.lock().unwrap();
        if let Some(n) = m.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.uid);
            }
        }
    }
}

/// Who is asking, as the kernel tells it.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl Caller {
    fn may(&self, owner: Option<(u32, u32)>) -> bool {
        procfs::may_access(self.uid, self.gid, owner)
    }
}

/// Binds the socket: a stale one (nobody answering) is replaced, a live one
/// means another witchd, which is an error. The socket is bound inside a
/// fresh owner-only directory beside the path, given `socket_mode` there,
/// and renamed into place, so it is never reachable with wider permissions
/// than asked, and the process-wide umask (shared by every thread of the
/// daemon) is never changed.
pub fn bind(cfg: &DaemonConfig) -> Result<UnixListener> {
    let path = &cfg.socket;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            bail!("{} exists and is not a socket; remove it or set `socket` elsewhere", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another witchd is already listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().with_context(|| format!("{} names no socket file", path.display()))?;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let private = parent.join(format!(".{}.{}.{nonce}.bind", name.to_string_lossy(), std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private).with_context(|| format!("cannot create {}", private.display()))?;
    let inner = private.join("s");
    let bound = UnixListener::bind(&inner).with_context(|| format!("cannot listen on {}", path.display())).and_then(|l| {
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(cfg.socket_mode))
            .with_context(|| format!("cannot chmod {}", path.display()))?;
        std::fs::rename(&inner, path).with_context(|| format!("cannot listen on {}", path.display()))?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Accepts connections until shutdown.
pub async fn serve(d: Arc<Daemon>, l: UnixListener) {
    let conns = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let users = Arc::new(PerUser::default());
    loop {
        let stream = tokio::select! {
            r = l.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    say!("socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = d.until_shutdown() => return,
        };
        let busy = |mut s: UnixStream, why: &'static str| {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), send(&mut s, &Reply::err(why), &[])).await;
            });
        };
        // One user's connections are bounded apart from everyone else's.
        let Some(uid) = stream.peer_cred().ok().map(|c| c.uid()) else { continue };
        let Some(user_slot) = users.take(uid) else {
            busy(stream, "witchd is busy with your other requests; try again");
            continue;
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            busy(stream, "witchd is busy; try again");
            continue;
        };
        let d = d.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _user_slot = user_slot;
            handle(d, stream).await;
        });
    }
}

async fn send(s: &mut UnixStream, reply: &Reply, body: &[u8]) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line).await?;
    s.write_all(body).await?;
    s.shutdown().await
}

async fn handle(d: Arc<Daemon>, mut s: UnixStream) {
    d.counters.requests.fetch_add(1, Relaxed);
    let caller = match s.peer_cred() {
        Ok(c) => Caller { uid: c.uid(), gid: c.gid(), pid: c.pid() },
        Err(_) => return, // no credentials, no service
    };
    let mut line = Vec::new();
    let mut r = BufReader::new(&mut s).take(MAX_REQUEST as u64);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, r.read_until(b'\n', &mut line)).await;
    let (reply, body) = match read {
        Ok(Ok(_)) => match serde_json::from_slice::<Request>(&line) {
            Ok(req) => answer(&d, caller, req).await,
            Err(e) => (Reply::err(format!("bad request: {e}")), Vec::new()),
        },
        _ => return,
    };
    if !reply.ok {
        d.counters.error(ErrorKind::Api);
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), send(&mut s, &reply, &body)).await;
}

/// A request's failure: one line for the user.
type Rejection = String;

fn craft_arg(c: Option<&str>) -> std::result::Result<Option<Craft>, Rejection> {
    match c {
        None => Ok(None),
        Some(s) => Craft::parse(s).map(Some).ok_or_else(|| format!("unknown craft {s:?} (dead, silent-store, silent-load)")),
    }
}

async fn answer(d: &Arc<Daemon>, caller: Caller, req: Request) -> (Reply, Vec<u8>) {
    match req {
        Request::Status => (Reply { status: Some(status(d, caller)), ..Reply::ok() }, Vec::new()),
        Request::List { pid, craft } => {
            let craft = match craft_arg(craft.as_deref()) {
                Ok(c) => c,
                Err(r) => return (Reply::err(r), Vec::new()),
            };
            let store = d.store.lock().unwrap();
            let v = store
                .list()
                .filter(|m| caller.may(m.owner))
                .filter(|m| pid.is_none_or(|p| m.pid == p) && craft.is_none_or(|c| m.craft == c))
                .cloned()
                .collect();
            (Reply { profiles: Some(v), ..Reply::ok() }, Vec::new())
        }
        Request::Fetch { id, pid, craft } => match fetch(d, caller, id, pid, craft).await {
            Ok(r) => r,
            Err(r) => (Reply::err(r), Vec::new()),
        },
        Request::Profile { pid, craft, duration_ms } => match profile(d, caller, pid, craft, duration_ms).await {
            Ok(r) => r,
            Err(r) => (Reply::err(r), Vec::new()),
        },
    }
}

async fn fetch(
    d: &Arc<Daemon>,
    caller: Caller,
    id: Option<String>,
    pid: Option<u32>,
    craft: Option<String>,
) -> std::result::Result<(Reply, Vec<u8>), Rejection> {
    let craft = craft_arg(craft.as_deref())?;
    let meta = {
        let store = d.store.lock().unwrap();
        match &id {
            Some(id) => store.get(id).filter(|m| caller.may(m.owner)).cloned(),
            None => store
                .list()
                .filter(|m| caller.may(m.owner))
                .filter(|m| pid.is_none_or(|p| m.pid == p) && craft.is_none_or(|c| m.craft == c))
                .max_by_key(|m| (m.start_unix_ns, m.stored_unix_ns))
                .cloned(),
        }
    };
    // Not found and not allowed read the same, so IDs of others' profiles don't leak.
    let Some(meta) = meta else {
        return Err(match id {
            Some(id) => format!("no stored profile {id:?} that you may read"),
            None => "no stored profile matches (that you may read)".to_string(),
        });
    };
    let d2 = d.clone();
    let id = meta.id.clone();
    let bytes = tokio::task::spawn_blocking(move || d2.store.lock().unwrap().read(&id)).await;
    match bytes {
        Ok(Ok(b)) => Ok((Reply { meta: Some(meta), body: b.len() as u64, ..Reply::ok() }, b)),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err("reading the profile failed".into()),
    }
}

async fn profile(
    d: &Arc<Daemon>,
    caller: Caller,
    pid: i32,
    craft: Option<String>,
    duration_ms: Option<u64>,
) -> std::result::Result<(Reply, Vec<u8>), Rejection> {
    let craft = craft_arg(craft.as_deref())?;
    let target = match Proc::read(pid) {
        Some(p) if pid > 0 && !p.is_zombie() => p,
        _ => return Err(format!("no process {pid}")),
    };
    if !caller.may(target.owner()) {
        d.counters.denied.fetch_add(1, Relaxed);
        say!("denied: uid {} asked to profile pid {pid} ({}), which it may not ptrace", caller.uid, target.name());
        return Err(format!(
            "permission denied: uid {} may not profile pid {pid} (only its owner, with matching real/effective/saved ids and not setuid or undumpable, or root)",
            caller.uid
        ));
    }
    if pid as u32 == std::process::id() {
        return Err("witchd does not profile itself".into());
    }
    // A watched process keeps its rule's knobs; others get [defaults].
    let prof = {
        let ts = d.targets.lock().unwrap();
        match ts.map.get(&pid).filter(|t| t.proc.start_time == target.start_time) {
            Some(t) => d.cfg.watch[t.rule].profiling.clone(),
            None => d.cfg.defaults.clone(),
        }
    };
    let craft = craft.unwrap_or(prof.crafts[0]);
    let duration = duration_ms.map_or(prof.duration, Duration::from_millis);
    if duration.is_zero() || duration > d.cfg.max_request_duration {
        return Err(format!(
            "duration must be above 0 and at most {} (max_request_duration)",
            humantime::format_duration(d.cfg.max_request_duration)
        ));
    }

    // Counted against the caller's max_user_sessions until answered.
    let _admitted = d.admit(caller.uid).map_err(|n| {
        format!(
            "you have {n} session{} running or queued already (max_user_sessions {}); try again when {} ends",
            if n == 1 { "" } else { "s" },
            d.cfg.max_user_sessions,
            if n == 1 { "it" } else { "one" }
        )
    })?;
    // One session per process: wait for a running one to finish.
    let longest = d.cfg.watch.iter().map(|w| w.profiling.duration).max().unwrap_or_default().max(d.cfg.defaults.duration);
    let wait_until = tokio::time::Instant::now() + longest + d.cfg.detach_timeout + Duration::from_secs(5);
    let claim = loop {
        let freed = d.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if let Some(c) = d.claim(pid, craft, true) {
            break c;
        }
        tokio::select! {
            _ = freed => {}
            _ = tokio::time::sleep_until(wait_until) => return Err(format!("pid {pid} is busy with another session; try again later")),
            _ = d.until_shutdown() => return Err("witchd is shutting down".into()),
        }
    };
    say!(
        "uid {} asked for a {} {} session on pid {pid} ({})",
        caller.uid,
        humantime::format_duration(duration),
        craft.name(),
        target.name()
    );
    let plan = SessionPlan {
        target: target.clone(),
        opts: options(&prof, craft),
        duration,
        origin: "request",
        who: super::slots::Who::User(caller.uid),
    };
    let done = session::run(d.clone(), claim, plan).await;
    let Some(p) = done.profile else {
        let msg = done.note.unwrap_or_else(|| "no profile".into());
        if done.outcome == Outcome::Failed {
            say!("request from uid {}: {msg}", caller.uid);
        }
        return Err(msg);
    };
    let body = serde_json::to_vec(&p).map_err(|e| e.to_string())?;
    let notes = done.note.into_iter().collect();
    Ok((Reply { meta: done.meta, notes, body: body.len() as u64, ..Reply::ok() }, body))
}

/// What the caller may see of the daemon's state.
pub fn status(d: &Daemon, caller: Caller) -> DaemonStatus {
    let (store_bytes, store_profiles) = d.store.lock().unwrap().usage();
    let now = tokio::time::Instant::now();
    let targets = {
        let ts = d.targets.lock().unwrap();
        ts.map
            .values()
            .filter(|t| caller.may(t.proc.owner()))
            .map(|t| TargetStatus {
                pid: t.proc.pid,
                exe: t.proc.name().to_string(),
                rule: d.cfg.watch[t.rule].describe(),
                state: match (d.claimed(t.proc.pid), &t.state) {
                    (Some(p), _) => {
                        let doing = if p.running { "profiling" } else { "queued" };
                        format!("{doing} {}{}", p.craft.name(), if p.requested { " (requested)" } else { "" })
                    }
                    (None, State::Exited) => "exited".into(),
                    (None, _) if t.last_error.is_some() => "failing".into(),
                    (None, _) => "idle".into(),
                },
                sessions: t.sessions,
                next_in_s: (t.state == State::Idle).then(|| {
                    if t.next_due >= now {
                        t.next_due.duration_since(now).as_secs_f64()
                    } else {
                        -now.duration_since(t.next_due).as_secs_f64()
                    }
                }),
                last_error: t.last_error.clone(),
                waste: t.last.iter().map(|(c, l)| (c.name().to_string(), l.waste_fraction)).collect(),
            })
            .collect()
    };
    let c = &d.counters;
    DaemonStatus {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: d.started.elapsed().as_secs_f64(),
        socket: d.cfg.socket.display().to_string(),
        http: d.http_addr.get().map(|a| a.to_string()),
        store_dir: d.cfg.store.dir.display().to_string(),
        store_bytes,
        store_max_bytes: d.cfg.store.max_bytes,
        store_profiles,
        sessions_active: d.sessions_active(),
        sessions_waiting: d.sessions_waiting(),
        max_sessions: d.cfg.max_sessions,
        sessions_ok: c.sessions(Outcome::Ok),
        sessions_target_exited: c.sessions(Outcome::TargetExited),
        sessions_target_exec: c.sessions(Outcome::TargetExec),
        sessions_failed: c.sessions(Outcome::Failed),
        rules: d.cfg.watch.iter().map(|w| w.describe()).collect(),
        targets,
    }
}
