//! witchd: watch processes for wasted memory operations, continuously.
//!
//! The daemon is one tokio runtime (current-thread: its own work is small)
//! with four parts around shared state ([`Daemon`]):
//! - [`scheduler`]: finds targets in /proc and runs each one's duty cycle;
//! - [`session`]: one attach → wait → detach → store, on a blocking thread;
//! - [`api`]: the Unix socket of `witch daemon ...`, with caller checks;
//! - [`http`]: pprof and Prometheus export on localhost.
//!
//! Everything it keeps in memory is bounded: targets (max_targets, dead ones
//! forgotten at the next scan), the store index (the store's own limits), and
//! fixed counters.

pub mod api;
pub mod args;
pub mod config;
pub mod http;
pub mod metrics;
pub mod procfs;
pub mod proto;
pub mod scheduler;
pub mod session;
pub mod slots;
pub mod store;

use anyhow::{Context, Result};
use config::DaemonConfig;
use metrics::Totals;
use scheduler::Targets;
use session::Attacher;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use store::Store;
use tokio::sync::{watch, Notify};
use witchcraft::profile::Craft;

/// One log line on stderr, timestamped (journald or a file keeps it).
pub fn log(msg: std::fmt::Arguments) {
    eprintln!("{} witchd: {msg}", humantime::format_rfc3339_seconds(SystemTime::now()));
}

macro_rules! say {
    ($($t:tt)*) => { $crate::daemon::log(format_args!($($t)*)) };
}
pub(crate) use say;

/// State shared by the daemon's tasks.
pub struct Daemon {
    pub cfg: DaemonConfig,
    pub started: Instant,
    /// Where HTTP actually listens (the config may say port 0).
    pub http_addr: std::sync::OnceLock<std::net::SocketAddr>,
    pub counters: Totals,
    // std Mutexes: never held across an await.
    pub store: Mutex<Store>,
    pub targets: Mutex<Targets>,
    attacher: Arc<dyn Attacher>,
    /// Pids with a session claimed (queued for a slot, or running): never
    /// two on one process.
    busy: Mutex<HashMap<i32, Busy>>,
    /// Signalled whenever a pid leaves `busy`.
    freed: Notify,
    /// Sessions at once (max_sessions), shared between rules and users ([`slots`]).
    slots: Mutex<slots::SessionSlots>,
    /// Signalled whenever slots are handed on.
    slots_moved: Notify,
    /// Sessions in flight (queued or running), awaited at shutdown.
    in_flight: watch::Sender<usize>,
    shutdown: watch::Sender<bool>,
}

impl Daemon {
    /// Opens the store and builds the state; logs what re-indexing found.
    pub fn new(cfg: DaemonConfig, attacher: Arc<dyn Attacher>) -> Result<Arc<Daemon>> {
        let (store, notes) = Store::open(&cfg.store)?;
        for n in notes {
            say!("{n}");
        }
        let (n, bytes) = (store.usage().1, store.usage().0);
        say!("store {}: {n} profiles, {bytes} bytes", cfg.store.dir.display());
        Ok(Arc::new(Daemon {
            slots: Mutex::new(slots::SessionSlots::new(cfg.max_sessions, !cfg.watch.is_empty(), cfg.max_user_sessions)),
            slots_moved: Notify::new(),
            cfg,
            started: Instant::now(),
            http_addr: std::sync::OnceLock::new(),
            counters: Totals::default(),
            store: Mutex::new(store),
            targets: Mutex::new(Targets::default()),
            attacher,
            busy: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            in_flight: watch::channel(0).0,
            shutdown: watch::channel(false).0,
        }))
    }

    /// Asks every task to finish: no new sessions, running ones detach now.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Resolves once shutdown has been asked for.
    pub async fn until_shutdown(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Resolves once no session is in flight.
    pub async fn until_idle(&self) {
        let mut rx = self.in_flight.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Sessions holding one of the `max_sessions` slots: attaching,
    /// profiling, detaching or storing. Never more than `max_sessions`.
    pub fn sessions_active(&self) -> usize {
        self.busy.lock().unwrap().values().filter(|p| p.running).count()
    }

    /// Sessions claimed but waiting for a free slot (more were due than
    /// `max_sessions`, or witchd is finishing others).
    pub fn sessions_waiting(&self) -> usize {
        self.busy.lock().unwrap().values().filter(|p| !p.running).count()
    }

    /// Claims `pid` for a session of `craft`; None when one is already
    /// queued or running there. It counts as waiting until [`Claim::start`].
    pub fn claim(self: &Arc<Self>, pid: i32, craft: Craft, requested: bool) -> Option<Claim> {
        let mut busy = self.busy.lock().unwrap();
        if busy.contains_key(&pid) {
            return None;
        }
        busy.insert(pid, Busy { craft, requested, running: false });
        Some(Claim { d: self.clone(), pid })
    }

    pub fn is_busy(&self, pid: i32) -> bool {
        self.busy.lock().unwrap().contains_key(&pid)
    }

    /// Waits for a session slot for `who` ([`slots`]); None when witchd is
    /// shutting down first, or `limit` passes. The slot (or the place in
    /// the queue) is given back when the [`SessionSlot`] is dropped.
    pub async fn slot(&self, who: slots::Who, limit: Option<std::time::Duration>) -> Option<SessionSlot<'_>> {
        let ticket = self.slots.lock().unwrap().wait(who);
        let slot = SessionSlot { d: self, ticket };
        let until = limit.map(|l| tokio::time::Instant::now() + l);
        loop {
            let moved = self.slots_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.slots.lock().unwrap().granted(ticket) {
                return Some(slot);
            }
            tokio::select! {
                _ = moved => {}
                _ = self.until_shutdown() => return None,
                _ = async { tokio::time::sleep_until(until?).await; Some(()) }, if until.is_some() => return None,
            }
        }
    }

    /// A request of `uid` comes in: Err(how many it has in flight) beyond
    /// `max_user_sessions`; the [`Admitted`] ends it when dropped.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Admitted, usize> {
        self.slots.lock().unwrap().admit(uid)?;
        Ok(Admitted { d: self.clone(), uid })
    }

    /// Where the session claimed on `pid` is, if there is one.
    pub fn claimed(&self, pid: i32) -> Option<Busy> {
        self.busy.lock().unwrap().get(&pid).copied()
    }
}

/// A claimed session: which craft, for whom, and whether it has a slot yet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    pub craft: Craft,
    /// Asked for with `witch daemon profile` (not the schedule).
    pub requested: bool,
    /// It holds a slot (attaching, profiling, detaching, storing); false
    /// while it waits for one.
    pub running: bool,
}

/// A session slot held (or a place in the queue for one); given back on drop.
pub struct SessionSlot<'a> {
    d: &'a Daemon,
    ticket: slots::Ticket,
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        if self.d.slots.lock().unwrap().release(self.ticket) {
            self.d.slots_moved.notify_waiters();
        }
    }
}

/// A user's request counted against `max_user_sessions` until dropped.
pub struct Admitted {
    d: Arc<Daemon>,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.d.slots.lock().unwrap().done(self.uid);
    }
}

/// A pid's right to a session; released on drop, whatever happens to the task.
pub struct Claim {
    d: Arc<Daemon>,
    pid: i32,
}

impl Claim {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The session got its slot: it counts as running from now on.
    pub fn start(&self) {
        if let Some(p) = self.d.busy.lock().unwrap().get_mut(&self.pid) {
            p.running = true;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.d.busy.lock().unwrap().remove(&self.pid);
        self.d.freed.notify_waiters();
    }
}

/// Runs the daemon until SIGTERM, SIGINT or SIGHUP (which would otherwise
/// kill it without a word; it does not reload the configuration), then
/// detaches from every target and returns. Errors are start-up failures (socket, store, HTTP address).
pub fn run(cfg: DaemonConfig) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    tame_malloc();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // attach/detach/store calls; bounded so a stuck kernel call cannot pile up threads.
        .max_blocking_threads(32)
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = hup.recv() => "SIGHUP (witchd does not reload its configuration: start it again)",
            }
        };
        serve(cfg, Arc::new(session::RealAttacher), stop).await
    })
}

/// glibc gives each thread that allocates an arena of its own, keeps freed
/// memory there, and after a large buffer is freed raises its mmap threshold,
/// so later large buffers (the ELF files read at each attach, the debug info
/// read for a pprof export) stay in the heap too. A daemon whose blocking
/// threads come and go then sits at the sum of their peaks (measured: 190 MB
/// with pprof exports). Two arenas and a fixed threshold keep it near its
/// working set.
fn tame_malloc() {
    // SAFETY: mallopt sets allocator parameters under the allocator's own
    // lock; these two only change future arena and mmap choices.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// The daemon proper, until `stop` resolves (to the reason, for the log);
/// `attacher` is replaceable for tests.
pub async fn serve(cfg: DaemonConfig, attacher: Arc<dyn Attacher>, stop: impl std::future::Future<Output = &'static str>) -> Result<()> {
    let d = Daemon::new(cfg, attacher)?;
    let listener = api::bind(&d.cfg)?;
    let http = match d.cfg.http {
        Some(addr) => Some(http::bind(addr).await?),
        None => None,
    };
    if let Some(a) = http.as_ref().and_then(|l| l.local_addr().ok()) {
        let _ = d.http_addr.set(a);
    }
    say!(
        "started (pid {}): socket {}, http {}, {} watch rules",
        std::process::id(),
        d.cfg.socket.display(),
        d.http_addr.get().map_or("off".to_string(), |a| a.to_string()),
        d.cfg.watch.len()
    );
    let api_task = tokio::spawn(api::serve(d.clone(), listener));
    let http_task = http.map(|l| tokio::spawn(http::serve(d.clone(), l)));
    let sched_task = tokio::spawn(scheduler::run(d.clone()));

    let why = stop.await;
    say!("{why}: detaching from {} targets, then exiting", d.sessions_active());
    d.shut_down();
    // A second signal does not cut the detach short: an agent left armed in a
    // target would keep costing it, so the detach timeout bounds the wait instead.
    let _ = sched_task.await;
    d.until_idle().await;
    let _ = api_task.await;
    if let Some(t) = http_task {
        // Graceful, but a client that keeps a response hanging does not hold up the exit.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), t).await;
    }
    let _ = std::fs::remove_file(&d.cfg.socket);
    say!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests;
