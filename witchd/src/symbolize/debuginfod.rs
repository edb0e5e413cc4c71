//! Debug files from debuginfod servers, as elfutils' client fetches them
//! (the client gdb, perf and `debuginfod-find` use), sharing its cache.
//!
//! On only when `DEBUGINFOD_URLS` is set (space-separated server URLs; words
//! that are not `http://` or `https://` URLs, such as elfutils' `ima:` policy
//! words, are skipped). A module whose debug info is not on disk (no separate
//! debug file by build-id or `.gnu_debuglink`, no DWARF in the binary) is
//! asked for by build-id: `GET SERVER/buildid/<hex>/debuginfo`, each server in
//! turn until one has it (elfutils asks them all at once; one at a time keeps
//! witch to one connection, and the first server usually answers).
//!
//! The cache is elfutils' own, so a file fetched by gdb or perf is used here
//! and the other way round: `$DEBUGINFOD_CACHE_PATH`, else
//! `~/.debuginfod_client_cache` where it exists (elfutils' old default), else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`;
//! in it `<build-id>/debuginfo` is the file, and an empty `<build-id>/debuginfo`
//! a miss (every server said 404) that is not asked again for the cache's
//! `cache_miss_s` seconds (600 when the file is absent). Cleaning old entries
//! is left to elfutils' clients, which do it on their schedule
//! (`cache_clean_interval_s`).
//!
//! A server is not trusted, and neither is the network:
//! - it must connect and answer within `$DEBUGINFOD_TIMEOUT` seconds (90, as
//!   in elfutils, when unset, zero or not a number), and each read of the body
//!   too; the body must then keep coming at 100 kB per that time on average
//!   (elfutils' rule: its first 100 kB within the timeout), so a server that
//!   trickles is dropped, and `$DEBUGINFOD_MAXTIME` bounds a whole download;
//! - a body is at most `$DEBUGINFOD_MAXSIZE` bytes and never more than
//!   [`file::MAX_BYTES`] (what witch reads of any debug file); it is written to
//!   a temporary file in the cache, not kept in memory, and used only if it is
//!   an ELF file with the build-id asked for (else it is deleted);
//! - a server that could not be reached or timed out is not asked again for
//!   the cache's `cache_miss_s` seconds, so a dead server costs one timeout
//!   per run, not one per module.
//!
//! The HTTP client is `ureq` (blocking, rustls with the Mozilla roots, or the
//! system's CA bundle where there is one; `http_proxy`/`https_proxy` as curl
//! reads them). Why not samply's `wholesym`, which also fetches from
//! debuginfod: it brings reqwest and tokio's HTTP stack (about 210 crates), is
//! asynchronous, keeps its own cache layout (not the one gdb and perf share),
//! caches no misses and reads no `DEBUGINFOD_TIMEOUT`; and it opens and maps
//! the paths it is given itself (see the module doc of [`super`]). blazesym
//! has no debuginfod client. Why not elfutils' libdebuginfod through dlopen
//! (as perf does): the feature would vanish without a word where the library
//! is not installed, and its limits (size, time) are environment variables
//! witch would have to override in-process; ureq adds about a dozen crates
//! (docs/USAGE.md has the build-time measurement).

use super::elf::Elf;
use super::file;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// elfutils' default for `DEBUGINFOD_TIMEOUT`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// elfutils' default for the cache's `cache_miss_s`.
const DEFAULT_CACHE_MISS: Duration = Duration::from_secs(600);
/// What must arrive per timeout on average (elfutils: the first 100 kB).
const PROGRESS_BYTES: u64 = 100_000;

/// What this run's debuginfod lookups found: where modules' debug info
/// came from, for the report's one-line note.
#[derive(Default, Debug, Clone)]
pub struct Lookups {
    /// Build-ids whose debug file was downloaded in this run.
    pub downloaded: usize,
    /// Build-ids whose debug file was already in the cache.
    pub cached: usize,
    /// Build-ids no server had (including misses remembered by the cache).
    pub missing: usize,
    /// The first failure of each server that failed, as `URL: what happened`.
    pub failures: Vec<String>,
}

/// A debuginfod client configured from the environment.
pub struct Client {
    servers: Vec<Server>,
    cache: PathBuf,
    timeout: Duration,
    max_time: Option<Duration>,
    max_size: u64,
    cache_miss: Duration,
    agent: ureq::Agent,
    /// Build-ids already asked about in this run, and the answer.
    asked: std::collections::HashMap<String, Option<PathBuf>>,
    pub outcome: Lookups,
}

struct Server {
    url: String,
    /// Not asked again before this instant (after a failure to reach it).
    down_until: Option<Instant>,
}

/// One server's answer to one request.
enum Answer {
    /// Downloaded to this temporary file in the cache.
    Got(PathBuf),
    /// 404: the server does not have it.
    NotFound,
    /// Anything else; `down` when the server itself could not be reached in time.
    Failed { why: String, down: bool },
}

impl Client {
    /// The client `DEBUGINFOD_URLS` and the other variables describe; None
    /// when the variable is unset or names no usable server, or there is no
    /// cache directory (no `$HOME`).
    pub fn from_env() -> Option<Client> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let servers: Vec<Server> = var("DEBUGINFOD_URLS")?
            .split_ascii_whitespace()
            .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
            .map(|w| Server { url: w.trim_end_matches('/').to_string(), down_until: None })
            .collect();
        if servers.is_empty() {
            return None;
        }
        let cache = cache_dir(var("DEBUGINFOD_CACHE_PATH"), var("HOME"), var("XDG_CACHE_HOME"))?;
        let secs = |k: &str| var(k).and_then(|v| v.trim().parse::<u64>().ok()).filter(|&s| s > 0).map(Duration::from_secs);
        let timeout = secs("DEBUGINFOD_TIMEOUT").unwrap_or(DEFAULT_TIMEOUT);
        let max_time = secs("DEBUGINFOD_MAXTIME");
        let max_size = var("DEBUGINFOD_MAXSIZE")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
            .map_or(file::MAX_BYTES, |s| s.min(file::MAX_BYTES));
        let cache_miss = std::fs::read_to_string(cache.join("cache_miss_s"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(DEFAULT_CACHE_MISS, Duration::from_secs);
        let tls = ureq::tls::TlsConfig::builder().root_certs(root_certs()).build();
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .user_agent(concat!("witch/", env!("CARGO_PKG_VERSION")))
            .timeout_resolve(Some(timeout))
            .timeout_connect(Some(timeout))
            .timeout_send_request(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_global(max_time)
            .max_redirects(8)
            .build();
        Some(Client {
            servers,
            cache,
            timeout,
            max_time,
            max_size,
            cache_miss,
            agent: config.into(),
            asked: Default::default(),
            outcome: Lookups::default(),
        })
    }

    /// The cache directory in use.
    pub fn cache(&self) -> &Path {
        &self.cache
    }

    /// The separate debug file of the build `id` (lowercase hex), from the
    /// cache or a server; None when no server has it or none could be asked.
    pub fn debuginfo(&mut self, id: &str) -> Option<(PathBuf, Elf)> {
        let id = id.to_ascii_lowercase();
        if id.len() < 2 || id.len() > 256 || !id.len().is_multiple_of(2) || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        if let Some(known) = self.asked.get(&id) {
            let path = known.clone()?;
            return read_verified(&path, &id, self.max_size).ok().map(|e| (path, e));
        }
        let got = self.lookup(&id);
        self.asked.insert(id, got.as_ref().map(|(p, _)| p.clone()));
        got
    }

    fn lookup(&mut self, id: &str) -> Option<(PathBuf, Elf)> {
        let dir = self.cache.join(id);
        let target = dir.join("debuginfo");
        // In the cache: the file, or a recent miss.
        if let Ok(m) = std::fs::metadata(&target) {
            if m.is_file() && m.len() > 0 {
                if let Ok(e) = read_verified(&target, id, self.max_size) {
                    self.outcome.cached += 1;
                    return Some((target, e));
                }
            } else if m.is_file() {
                let age = m.modified().ok().and_then(|t| SystemTime::now().duration_since(t).ok()).unwrap_or_default();
                if age <= self.cache_miss {
                    self.outcome.missing += 1;
                    return None;
                }
                let _ = std::fs::remove_file(&target);
            }
        }
        let now = Instant::now();
        let mut all_said_no = true;
        for i in 0..self.servers.len() {
            if self.servers[i].down_until.is_some_and(|t| now < t) {
                all_said_no = false;
                continue;
            }
            let url = format!("{}/buildid/{id}/debuginfo", self.servers[i].url);
            let answer = self.download(&url, &dir);
            let failed = |why: String, down: bool, me: &mut Client| {
                if down {
                    me.servers[i].down_until = Some(Instant::now() + me.cache_miss);
                }
                let server = &me.servers[i].url;
                if !me.outcome.failures.iter().any(|f| f.starts_with(&format!("{server}: "))) {
                    crate::say!("witch: warning: debuginfod server {server}: {why}; going on without it");
                    me.outcome.failures.push(format!("{server}: {why}"));
                }
            };
            match answer {
                Answer::Got(tmp) => match read_verified(&tmp, id, self.max_size) {
                    Ok(e) => {
                        if std::fs::rename(&tmp, &target).is_err() {
                            let _ = std::fs::remove_file(&tmp);
                            failed(format!("cannot keep its file in {}", dir.display()), false, self);
                            return None;
                        }
                        self.outcome.downloaded += 1;
                        return Some((target, e));
                    }
                    Err(why) => {
                        let _ = std::fs::remove_file(&tmp);
                        all_said_no = false;
                        failed(why, false, self);
                    }
                },
                Answer::NotFound => {}
                Answer::Failed { why, down } => {
                    all_said_no = false;
                    failed(why, down, self);
                }
            }
        }
        self.outcome.missing += 1;
        if all_said_no {
            // Remember the miss as elfutils does: an empty file.
            if std::fs::create_dir_all(&dir).is_ok() {
                let _ = std::fs::OpenOptions::new().write(true).create_new(true).open(&target);
            }
        }
        None
    }

    /// One GET into a temporary file beside `dir/debuginfo`.
    fn download(&self, url: &str, dir: &Path) -> Answer {
        let start = Instant::now();
        let resp = match self.agent.get(url).call() {
            Ok(r) => r,
            Err(e) => return Answer::Failed { why: transport(&e, self.timeout), down: true },
        };
        match resp.status().as_u16() {
            200 => {}
            404 => return Answer::NotFound,
            s => return Answer::Failed { why: format!("answered HTTP {s}"), down: false },
        }
        let mut body = resp.into_body();
        if body.content_length().is_some_and(|n| n > self.max_size) {
            return Answer::Failed {
                why: format!("offered {} bytes, more than the {} bytes witch takes", body.content_length().unwrap_or(0), self.max_size),
                down: false,
            };
        }
        if std::fs::create_dir_all(dir).is_err() {
            return Answer::Failed { why: format!("cannot create the cache directory {}", dir.display()), down: false };
        }
        let tmp = dir.join(format!("debuginfo.{}.{}.tmp", std::process::id(), start.elapsed().as_nanos()));
        let mut out = match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => f,
            Err(e) => return Answer::Failed { why: format!("cannot write to the cache {}: {e}", dir.display()), down: false },
        };
        // `limit` bounds what ureq reads; one byte more tells a body that was cut.
        let mut reader = body.with_config().limit(self.max_size + 1).reader();
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        let result = loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) => break Err(body_error(&e, self.timeout)),
            };
            got += n as u64;
            if got > self.max_size {
                break Err(format!("sent more than the {} bytes witch takes", self.max_size));
            }
            if let Err(e) = out.write_all(&buf[..n]) {
                break Err(format!("cannot write to the cache {}: {e}", dir.display()));
            }
            // At least 100 kB per timeout on average, the first within the first.
            let windows = start.elapsed().as_secs_f64() / self.timeout.as_secs_f64();
            if windows > 1.0 && (got as f64) < PROGRESS_BYTES as f64 * (windows - 1.0).max(1.0) {
                break Err(format!(
                    "sent {got} bytes in {:.0} s, slower than 100 kB per {} s",
                    start.elapsed().as_secs_f64(),
                    self.timeout.as_secs()
                ));
            }
            if self.max_time.is_some_and(|m| start.elapsed() > m) {
                break Err(format!("took longer than DEBUGINFOD_MAXTIME ({} s)", self.max_time.unwrap_or_default().as_secs()));
            }
        };
        match result.and_then(|()| out.sync_all().map_err(|e| format!("cannot write to the cache: {e}"))) {
            Ok(()) => Answer::Got(tmp),
            Err(why) => {
                let _ = std::fs::remove_file(&tmp);
                Answer::Failed { why, down: false }
            }
        }
    }

    /// The report's one line about debuginfod, when it was used.
    pub fn note(&self) -> Option<String> {
        let o = &self.outcome;
        if o.downloaded + o.cached == 0 && o.failures.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if o.downloaded + o.cached > 0 {
            let n = o.downloaded + o.cached;
            parts.push(format!(
                "debug info of {n} module{} came from debuginfod ({} downloaded, {} from the cache in {})",
                if n == 1 { "" } else { "s" },
                o.downloaded,
                o.cached,
                self.cache.display()
            ));
        }
        if !o.failures.is_empty() {
            parts.push(format!("debuginfod failed: {}", o.failures.join("; ")));
        }
        Some(parts.join("; "))
    }
}

/// elfutils' choice of cache directory.
fn cache_dir(explicit: Option<String>, home: Option<String>, xdg: Option<String>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(PathBuf::from(p));
    }
    let home = home.map(PathBuf::from);
    if let Some(old) = home.as_ref().map(|h| h.join(".debuginfod_client_cache")).filter(|p| p.is_dir()) {
        return Some(old);
    }
    match xdg {
        Some(x) => Some(PathBuf::from(x).join("debuginfod_client")),
        None => Some(home?.join(".cache").join("debuginfod_client")),
    }
}

/// The system's CA bundle (`$SSL_CERT_FILE`, or Debian's and Fedora's
/// paths), so a server with a site's own CA works as it does for curl;
/// the Mozilla roots built into witch where there is none.
fn root_certs() -> ureq::tls::RootCerts {
    let candidates = std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"].map(PathBuf::from));
    for p in candidates {
        let Ok(pem) = file::read_within(&p, 16 << 20, Duration::from_secs(5)) else { continue };
        let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return ureq::tls::RootCerts::new_with_certs(&certs);
        }
    }
    ureq::tls::RootCerts::WebPki
}

/// Reads a cached or downloaded file; Ok only for an ELF file of build `id`.
fn read_verified(path: &Path, id: &str, max: u64) -> Result<Elf, String> {
    let data = file::read_within(path, max, file::TIMEOUT).map_err(|e| format!("cannot read what it sent: {e}"))?;
    let e = Elf::parse(data).ok_or("sent a file that is not ELF")?;
    if e.build_id.as_deref() != Some(id) {
        return Err(format!("sent the debug file of another build ({})", e.build_id.as_deref().unwrap_or("no build-id")));
    }
    Ok(e)
}

/// A failure before the response, in a few words.
fn transport(e: &ureq::Error, timeout: Duration) -> String {
    match e {
        ureq::Error::Timeout(_) => format!("no answer within {} s (DEBUGINFOD_TIMEOUT)", timeout.as_secs()),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            format!("no answer within {} s (DEBUGINFOD_TIMEOUT)", timeout.as_secs())
        }
        ureq::Error::Io(io) => format!("unreachable ({io})"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        e => e.to_string(),
    }
}

fn body_error(e: &std::io::Error, timeout: Duration) -> String {
    match e.kind() {
        std::io::ErrorKind::TimedOut => format!("stopped sending for {} s (DEBUGINFOD_TIMEOUT)", timeout.as_secs()),
        _ => format!("the download broke off ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_directory_is_chosen_as_elfutils_chooses_it() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(cache_dir(s("/c"), s("/h"), s("/x")), Some(PathBuf::from("/c")));
        assert_eq!(cache_dir(None, s("/nonexistent-home"), s("/x")), Some(PathBuf::from("/x/debuginfod_client")));
        assert_eq!(cache_dir(None, s("/nonexistent-home"), None), Some(PathBuf::from("/nonexistent-home/.cache/debuginfod_client")));
        assert_eq!(cache_dir(None, None, None), None);
        let home = std::env::temp_dir().join(format!("witch-dbgd-home-{}", std::process::id()));
        std::fs::create_dir_all(home.join(".debuginfod_client_cache")).unwrap();
        let h = home.display().to_string();
        assert_eq!(cache_dir(None, Some(h), s("/x")), Some(home.join(".debuginfod_client_cache")));
        let _ = std::fs::remove_dir_all(&home);
    }
}
