//! witchd's configuration file (TOML): what to watch, how often, where to keep profiles.
//!
//! ```toml
//! socket = "/run/witchd.sock"   # Unix socket of `witch daemon ...`
//! http = "127.0.0.1:9465"       # pprof and /metrics; "off" disables it
//!
//! [store]
//! dir = "/var/lib/witchd"
//! max_bytes = "256MiB"
//! max_age = "7d"
//!
//! [defaults]                    # for every [[watch]] that does not say otherwise
//! crafts = ["dead", "silent-store"]
//! every = "5m"                  # one session per target this often...
//! duration = "10s"              # ...lasting this long
//! overhead = 3                  # the engine's share of the program's CPU time, percent (as --overhead)
//!
//! [[watch]]
//! exe = "nginx"                 # selectors (all given must match): pid, exe, cgroup
//! ```
//!
//! Unknown keys are errors, so a typo is not silently ignored; values are
//! checked while parsing so errors point at `file:line:column`.

use anyhow::{bail, Result};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use witchcraft::profile::Craft;
use witchcraft::replacement::Policy;

/// The daemon's whole configuration, defaults filled in.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    /// Permission bits of the socket; every request is checked whatever they are.
    pub socket_mode: u32,
    /// None: no HTTP listener.
    pub http: Option<SocketAddr>,
    /// Host names HTTP answers besides localhost and IP addresses
    /// (`Host: NAME[:PORT]`); see `daemon::http`.
    pub http_hosts: Vec<String>,
    /// Which stored profiles HTTP serves, and to whom.
    pub http_profiles: ProfileAccess,
    /// How often /proc is scanned for targets appearing and going away.
    pub scan_every: Duration,
    /// Sessions running at once, over all targets.
    pub max_sessions: usize,
    /// Sessions one user may have asked for (`witch daemon profile`) and not
    /// yet had answered: running or waiting for a slot.
    pub max_user_sessions: usize,
    /// Targets tracked at once; more matching processes are ignored (and logged).
    pub max_targets: usize,
    /// How long a detach may wait for the agent's profile.
    pub detach_timeout: Duration,
    /// Longest session `witch daemon profile` may ask for.
    pub max_request_duration: Duration,
    pub store: StoreConfig,
    /// `[defaults]`: also what `witch daemon profile` uses for processes no rule names.
    pub defaults: Profiling,
    pub watch: Vec<Watch>,
}

/// Which stored profiles HTTP serves (`http_profiles`). HTTP carries no
/// credentials: a client is known by the user owning its socket when it
/// connects from this host, and by its address otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileAccess {
    /// `"owner"` (the default): a profile to the user whose process it was,
    /// every profile to root; nothing to a client whose user is not known.
    /// As the Unix socket does, by uid alone (a TCP connection has no gid).
    Owner,
    /// `"all"`: every profile to anyone who can connect (for a scraper
    /// running as another user, or on another host).
    All,
    /// `"none"`: no profiles over HTTP (`/metrics` only).
    None,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub max_profiles: usize,
    pub max_age: Duration,
}

/// One `[[watch]]` rule: which processes, and how to profile them.
#[derive(Debug, Clone, PartialEq)]
pub struct Watch {
    pub pid: Option<i32>,
    /// Executable name (matched against the file name of /proc/PID/exe, or
    /// /proc/PID/comm), or a full path when it contains '/'.
    pub exe: Option<String>,
    /// cgroup path; the process's cgroup must be it or below it.
    pub cgroup: Option<String>,
    pub profiling: Profiling,
}

/// How one target is profiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Profiling {
    /// Crafts take turns: each session runs the next one in the list.
    pub crafts: Vec<Craft>,
    pub every: Duration,
    pub duration: Duration,
    pub period: Option<u64>,
    pub event: Option<String>,
    pub debug_registers: Option<u32>,
    pub replacement: Policy,
    pub fp_precision: f64,
    /// The software sampler's overhead budget, percent of the program's
    /// CPU time (0: no limit); None: the engine's default, as `--overhead`.
    pub overhead_percent: Option<f64>,
}

impl Watch {
    /// The rule as one would write it, for logs and status.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.pid {
            parts.push(format!("pid={p}"));
        }
        if let Some(e) = &self.exe {
            parts.push(format!("exe={e}"));
        }
        if let Some(c) = &self.cgroup {
            parts.push(format!("cgroup={c}"));
        }
        parts.join(",")
    }
}

/// One key of the file, as witchd(8) lists it.
pub struct Key {
    /// "" (top level), "store", "defaults", or "watch" (only in `[[watch]]`).
    pub section: &'static str,
    pub name: &'static str,
    /// A value as written in the file (TOML); tests parse each.
    pub example: &'static str,
    /// What it sets, and its default.
    pub meaning: &'static str,
}

/// Every key the file takes, for the manual page (a test checks that each
/// parses, and that the example configuration uses no other).
pub const KEYS: &[Key] = &[
    Key { section: "", name: "socket", example: "\"/run/witchd.sock\"", meaning: "The Unix socket `witch daemon` connects to. Default: /run/witchd.sock for root, else $XDG_RUNTIME_DIR/witchd.sock ($WITCHD_SOCKET overrides both)." },
    Key { section: "", name: "socket_mode", example: "0o600", meaning: "Permission bits of the socket; 0o666 lets every user connect, and each request is still checked against the caller's user. Default: 0o600." },
    Key { section: "", name: "http", example: "\"127.0.0.1:9465\"", meaning: "Address and port of the HTTP listener (pprof profiles, Prometheus /metrics), or \"off\". Default: 127.0.0.1:9465." },
    Key { section: "", name: "http_profiles", example: "\"owner\"", meaning: "Which stored profiles HTTP serves: \"owner\" (each user their own processes', root all), \"all\" or \"none\" (/metrics only). Default: \"owner\"." },
    Key { section: "", name: "http_hosts", example: "[\"witch.example.org\"]", meaning: "Host names HTTP answers (the Host: header) besides localhost and IP addresses. Default: none." },
    Key { section: "", name: "scan_every", example: "\"5s\"", meaning: "How often /proc is scanned for targets appearing and going away. Default: 5s." },
    Key { section: "", name: "max_sessions", example: "4", meaning: "Sessions running at once, over all targets. Default: 4." },
    Key { section: "", name: "max_user_sessions", example: "2", meaning: "`witch daemon profile` requests one user may have running or queued. Default: 2." },
    Key { section: "", name: "max_targets", example: "256", meaning: "Targets tracked at once; more matching processes are ignored (and logged). Default: 256." },
    Key { section: "", name: "detach_timeout", example: "\"10s\"", meaning: "How long a detach waits for the agent's profile. Default: 10s." },
    Key { section: "", name: "max_request_duration", example: "\"10m\"", meaning: "The longest session `witch daemon profile` may ask for. Default: 10m." },
    Key { section: "store", name: "dir", example: "\"/var/lib/witchd\"", meaning: "Where profiles are kept. Default: /var/lib/witchd for root, else $XDG_STATE_HOME/witchd or ~/.local/state/witchd." },
    Key { section: "store", name: "max_bytes", example: "\"256MiB\"", meaning: "The store's size limit; the oldest profiles go first. Default: 256MiB." },
    Key { section: "store", name: "max_profiles", example: "1000", meaning: "Profiles kept at most. Default: 1000." },
    Key { section: "store", name: "max_age", example: "\"7d\"", meaning: "Profiles older than this are removed. Default: 7d." },
    Key { section: "defaults", name: "crafts", example: "[\"dead\", \"silent-store\"]", meaning: "The crafts sessions run, taking turns (dead, silent-store, silent-load). Default: [\"dead\"]." },
    Key { section: "defaults", name: "every", example: "\"5m\"", meaning: "A session per target this often. Default: 5m." },
    Key { section: "defaults", name: "duration", example: "\"10s\"", meaning: "How long each session lasts (at most every). Default: 10s." },
    Key { section: "defaults", name: "period", example: "5000003", meaning: "Sampling period, as witch's -p (a count in the event's units). Default: the engine's." },
    Key { section: "defaults", name: "event", example: "\"cpu-timer\"", meaning: "Sampling event, as witch's -e. Default: the engine's choice." },
    Key { section: "defaults", name: "debug_registers", example: "4", meaning: "Debug registers to use, 1 to 4. Default: all free." },
    Key { section: "defaults", name: "replacement", example: "\"reservoir\"", meaning: "Which watchpoint a new sample replaces, as witch's --replacement. Default: reservoir." },
    Key { section: "defaults", name: "fp_precision", example: "0.01", meaning: "Relative precision within which floating-point values count as equal, as witch's --fp-precision. Default: 0.01." },
    Key { section: "defaults", name: "overhead", example: "3", meaning: "The software sampler's overhead budget, percent of the program's CPU time, as witch's --overhead. Default: 3." },
    Key { section: "watch", name: "pid", example: "1234", meaning: "Select this process." },
    Key { section: "watch", name: "exe", example: "\"nginx\"", meaning: "Select processes running this executable: the file name of /proc/PID/exe, or a full path." },
    Key { section: "watch", name: "cgroup", example: "\"/system.slice/db.service\"", meaning: "Select processes in this cgroup or below it." },
];

// ---------------------------------------------------------------------------
// The file as written
// ---------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    socket: Option<PathBuf>,
    #[serde(default, deserialize_with = "mode")]
    socket_mode: Option<u32>,
    http: Option<String>,
    http_hosts: Option<Vec<String>>,
    http_profiles: Option<String>,
    #[serde(default, deserialize_with = "dur")]
    scan_every: Option<Duration>,
    max_sessions: Option<usize>,
    max_user_sessions: Option<usize>,
    max_targets: Option<usize>,
    #[serde(default, deserialize_with = "dur")]
    detach_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    max_request_duration: Option<Duration>,
    #[serde(default)]
    store: StoreFile,
    #[serde(default)]
    defaults: ProfilingFile,
    #[serde(default)]
    watch: Vec<WatchFile>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "size")]
    max_bytes: Option<u64>,
    max_profiles: Option<usize>,
    #[serde(default, deserialize_with = "dur")]
    max_age: Option<Duration>,
}

/// Profiling knobs, shared by `[defaults]` and each `[[watch]]`.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct ProfilingFile {
    #[serde(default, deserialize_with = "crafts")]
    crafts: Option<Vec<Craft>>,
    #[serde(default, deserialize_with = "dur")]
    every: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    duration: Option<Duration>,
    #[serde(default, deserialize_with = "positive")]
    period: Option<u64>,
    event: Option<String>,
    #[serde(default, deserialize_with = "registers")]
    debug_registers: Option<u32>,
    #[serde(default, deserialize_with = "replacement")]
    replacement: Option<Policy>,
    #[serde(default, deserialize_with = "precision")]
    fp_precision: Option<f64>,
    #[serde(default, deserialize_with = "overhead")]
    overhead: Option<f64>,
}

// serde's `flatten` cannot be combined with deny_unknown_fields, so a watch
// rule repeats the profiling keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchFile {
    pid: Option<i32>,
    exe: Option<String>,
    cgroup: Option<String>,
    #[serde(default, deserialize_with = "crafts")]
    crafts: Option<Vec<Craft>>,
    #[serde(default, deserialize_with = "dur")]
    every: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    duration: Option<Duration>,
    #[serde(default, deserialize_with = "positive")]
    period: Option<u64>,
    event: Option<String>,
    #[serde(default, deserialize_with = "registers")]
    debug_registers: Option<u32>,
    #[serde(default, deserialize_with = "replacement")]
    replacement: Option<Policy>,
    #[serde(default, deserialize_with = "precision")]
    fp_precision: Option<f64>,
    #[serde(default, deserialize_with = "overhead")]
    overhead: Option<f64>,
}

impl WatchFile {
    fn profiling(&self) -> ProfilingFile {
        ProfilingFile {
            crafts: self.crafts.clone(),
            every: self.every,
            duration: self.duration,
            period: self.period,
            event: self.event.clone(),
            debug_registers: self.debug_registers,
            replacement: self.replacement,
            fp_precision: self.fp_precision,
            overhead: self.overhead,
        }
    }
}

mod values;
use values::{crafts, dur, mode, overhead, positive, precision, registers, replacement, size};
pub use values::{parse_duration, parse_size};

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

/// Where things go when the file does not say: system paths for root, the
/// user's runtime and state directories otherwise.
pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os("WITCHD_SOCKET") {
        return PathBuf::from(p);
    }
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from("/run/witchd.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("witchd.sock"),
        _ => PathBuf::from(format!("/tmp/witchd-{uid}.sock")),
    }
}

fn default_store_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/witchd");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("witchd");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/witchd"),
        None => PathBuf::from(format!("/tmp/witchd-{}-store", nix::unistd::geteuid())),
    }
}

/// Line and column (1-based) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl DaemonConfig {
    /// Reads and checks a configuration file; errors read `FILE:LINE:COL: what`.
    pub fn load(path: &Path) -> Result<DaemonConfig> {
        use witchcraft::profile::{read_capped, Capped};
        const MAX: u64 = 1 << 20;
        let fail = |why: String| anyhow::anyhow!("cannot read config {}: {why}", path.display());
        let f = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        // A NUL byte is no TOML: `/dev/zero` or a binary fails at once.
        let bytes = read_capped(f, MAX, |head| if head.contains(&0) { Err("a NUL byte: not a text file".into()) } else { Ok(()) })
            .map_err(|e| match e {
                Capped::Io(e) => fail(e.to_string()),
                Capped::Refused(why) => fail(why),
                Capped::TooLarge => fail(format!("larger than {} KiB", MAX >> 10)),
            })?;
        let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses configuration text; `name` is the file name used in errors.
    pub fn parse(text: &str, name: &str) -> Result<DaemonConfig> {
        let file: File = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().replace('\n', "; ");
            match e.span() {
                Some(span) => {
                    let (l, c) = line_col(text, span.start);
                    anyhow::anyhow!("{name}:{l}:{c}: {msg}")
                }
                None => anyhow::anyhow!("{name}: {msg}"),
            }
        })?;
        Self::from_file(file).map_err(|e| anyhow::anyhow!("{name}: {e}"))
    }

    fn from_file(f: File) -> Result<DaemonConfig> {
        let http = match f.http.as_deref().map(str::trim) {
            None => Some(SocketAddr::from(([127, 0, 0, 1], 9465))),
            Some("off" | "") => None,
            Some(s) => Some(
                s.parse::<SocketAddr>()
                    .map_err(|_| anyhow::anyhow!("http = {s:?} is not an address:port (e.g. \"127.0.0.1:9465\"), or \"off\""))?,
            ),
        };
        let http_profiles = match f.http_profiles.as_deref().map(str::trim) {
            None | Some("owner") => ProfileAccess::Owner,
            Some("all") => ProfileAccess::All,
            Some("none") => ProfileAccess::None,
            Some(s) => {
                bail!("http_profiles = {s:?}: give \"owner\" (each user their own processes' profiles, root all), \"all\" or \"none\"")
            }
        };
        let http_hosts = f.http_hosts.unwrap_or_default();
        if let Some(h) = http_hosts.iter().find(|h| h.trim().is_empty() || h.contains([':', '/', ' ', '[', ']'])) {
            bail!("http_hosts: {h:?} is not a host name (give names only, without a port)");
        }
        let defaults = merge(&ProfilingFile::default(), &f.defaults);
        check_profiling(&defaults, "[defaults]")?;
        let mut watch = Vec::new();
        for (i, w) in f.watch.iter().enumerate() {
            let what = format!("[[watch]] #{}", i + 1);
            if w.pid.is_none() && w.exe.is_none() && w.cgroup.is_none() {
                bail!("{what} selects nothing: give pid, exe or cgroup");
            }
            if let Some(p) = w.pid.filter(|&p| p <= 0) {
                bail!("{what}: pid {p} is not a process id");
            }
            if w.exe.as_deref().is_some_and(|e| e.trim().is_empty()) {
                bail!("{what}: exe is empty");
            }
            let cgroup = w.cgroup.as_deref().map(|c| {
                let c = c.trim().trim_end_matches('/');
                if c.starts_with('/') {
                    c.to_string()
                } else {
                    format!("/{c}")
                }
            });
            let profiling = merge(&f.defaults, &w.profiling());
            check_profiling(&profiling, &what)?;
            watch.push(Watch { pid: w.pid, exe: w.exe.clone(), cgroup, profiling });
        }
        let max_sessions = f.max_sessions.unwrap_or(4);
        if max_sessions == 0 {
            bail!("max_sessions must be at least 1");
        }
        let max_user_sessions = f.max_user_sessions.unwrap_or(2);
        if max_user_sessions == 0 {
            bail!("max_user_sessions must be at least 1");
        }
        let max_targets = f.max_targets.unwrap_or(256);
        if max_targets == 0 {
            bail!("max_targets must be at least 1");
        }
        Ok(DaemonConfig {
            socket: f.socket.unwrap_or_else(default_socket),
            socket_mode: f.socket_mode.unwrap_or(0o600),
            http,
            http_hosts,
            http_profiles,
            scan_every: f.scan_every.unwrap_or(Duration::from_secs(5)),
            max_sessions,
            max_user_sessions,
            max_targets,
            detach_timeout: f.detach_timeout.unwrap_or(Duration::from_secs(10)),
            max_request_duration: f.max_request_duration.unwrap_or(Duration::from_secs(600)),
            store: StoreConfig {
                dir: f.store.dir.unwrap_or_else(default_store_dir),
                max_bytes: f.store.max_bytes.unwrap_or(256 << 20),
                max_profiles: f.store.max_profiles.unwrap_or(1000).max(1),
                max_age: f.store.max_age.unwrap_or(Duration::from_secs(7 * 86400)),
            },
            defaults,
            watch,
        })
    }
}

/// A watch rule's settings over the defaults, over the built-in defaults.
fn merge(base: &ProfilingFile, over: &ProfilingFile) -> Profiling {
    Profiling {
        crafts: over.crafts.clone().or_else(|| base.crafts.clone()).unwrap_or_else(|| vec![Craft::Dead]),
        every: over.every.or(base.every).unwrap_or(Duration::from_secs(300)),
        duration: over.duration.or(base.duration).unwrap_or(Duration::from_secs(10)),
        period: over.period.or(base.period),
        event: over.event.clone().or_else(|| base.event.clone()),
        debug_registers: over.debug_registers.or(base.debug_registers),
        replacement: over.replacement.or(base.replacement).unwrap_or(Policy::Reservoir),
        fp_precision: over.fp_precision.or(base.fp_precision).unwrap_or(0.01),
        overhead_percent: over.overhead.or(base.overhead),
    }
}

fn check_profiling(p: &Profiling, what: &str) -> Result<()> {
    if p.duration > p.every {
        bail!(
            "{what}: duration {} is longer than every {} (a target would never rest)",
            humantime::format_duration(p.duration),
            humantime::format_duration(p.every)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
