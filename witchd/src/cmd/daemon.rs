//! `witch daemon ...`: talk to a running witchd over its Unix socket.
//!
//! Plain blocking I/O: one request, one reply (see [`crate::daemon::proto`]).

use crate::daemon::proto::{DaemonStatus, Reply, Request};
use crate::daemon::store::Meta;
use crate::render::units::{duration as fmt_duration, pct, size};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use witchcraft::profile::Profile;

/// Talk to the witchd daemon
#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  witch daemon status
  witch daemon list --pid 1234
  witch daemon fetch 1700000000000-1234-dead -o prof.json
  witch daemon fetch --pid 1234 --craft dead --pprof -o prof.pb.gz
  witch daemon profile --pid 1234 --craft silent-store --duration 5s --report

Exit status: 0 done, 2 error (witchd not running, permission denied, no such profile).
You may read and profile only processes you could ptrace yourself (root: all).")]
pub struct DaemonArgs {
    /// witchd's socket [default: $WITCHD_SOCKET, else /run/witchd.sock for root or when it exists, else $XDG_RUNTIME_DIR/witchd.sock]
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,

    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Action {
    /// Watched targets, sessions in flight, and store usage
    Status {
        /// Print the status as JSON
        #[arg(long)]
        json: bool,
    },
    /// Stored profiles, oldest first
    List {
        /// Only this process's profiles
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// Only this craft's profiles (dead, silent-store, silent-load)
        #[arg(long)]
        craft: Option<String>,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
    },
    /// Write a stored profile (by ID, or the newest of --pid/--craft) to a file or stdout
    Fetch {
        /// The profile's ID, as `list` shows it
        #[arg(value_name = "ID", required_unless_present_any = ["pid", "craft"])]
        id: Option<String>,
        /// The newest profile of this process
        #[arg(long, value_name = "PID", conflicts_with = "id")]
        pid: Option<u32>,
        /// The newest profile of this craft
        #[arg(long, conflicts_with = "id")]
        craft: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Profile a process now, for --duration, and write its profile (witchd stores it too)
    Profile {
        /// The process to profile
        #[arg(long, value_name = "PID")]
        pid: i32,
        /// dead, silent-store or silent-load [default: the first craft witchd's config gives it]
        #[arg(long)]
        craft: Option<String>,
        /// How long ("5s", "500ms") [default: the configured duration]
        #[arg(long, value_name = "TIME", value_parser = crate::cli::parse_duration)]
        duration: Option<Duration>,
        #[command(flatten)]
        out: OutputArgs,
    },
}

/// Where a profile goes.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Write to FILE ("-": stdout) [default: stdout, unless --report]
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write gzipped pprof instead of the profile JSON (symbolized here)
    #[arg(long)]
    pub pprof: bool,
    /// Print the text report on stdout (the profile is written only with -o)
    #[arg(long)]
    pub report: bool,
}

/// The socket the client tries when not told.
pub fn default_socket() -> PathBuf {
    let own = crate::daemon::config::default_socket();
    let system = Path::new("/run/witchd.sock");
    if std::env::var_os("WITCHD_SOCKET").is_none() && !own.exists() && system.exists() {
        return system.to_path_buf();
    }
    own
}

/// Sends one request; returns the reply and its body. Errors are one line.
pub fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<(Reply, Vec<u8>)> {
    let mut s = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            anyhow::anyhow!(
                "witchd is not running (nothing listening at {}); start it with `witchd --config FILE`, or give --socket",
                socket.display()
            )
        }
        std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "cannot connect to witchd at {}: permission denied (its socket is owner-only unless witchd's socket_mode opens it)",
            socket.display()
        ),
        _ => anyhow::anyhow!("cannot connect to witchd at {}: {e}", socket.display()),
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line).context("cannot send the request to witchd")?;
    let mut r = BufReader::new(s);
    let mut head = String::new();
    r.read_line(&mut head).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("witchd did not answer within {}", humantime::format_duration(timeout))
        }
        _ => anyhow::anyhow!("lost the connection to witchd: {e}"),
    })?;
    if head.is_empty() {
        bail!("witchd closed the connection without an answer (is it shutting down?)");
    }
    let reply: Reply = serde_json::from_str(&head).context("witchd sent a reply this witch does not understand")?;
    if !reply.ok {
        bail!("{}", reply.error.as_deref().unwrap_or("witchd refused the request"));
    }
    let mut body = vec![0; reply.body as usize];
    r.read_exact(&mut body).context("witchd's reply was cut short")?;
    Ok((reply, body))
}

pub fn run(a: &DaemonArgs) -> Result<i32> {
    let socket = a.socket.clone().unwrap_or_else(default_socket);
    let quick = Duration::from_secs(60);
    match &a.action {
        Action::Status { json } => {
            let (r, _) = call(&socket, &Request::Status, quick)?;
            let st = r.status.context("witchd sent no status")?;
            if *json {
                crate::print(&format!("{}\n", serde_json::to_string_pretty(&st)?))?;
            } else {
                crate::print(&render_status(&st))?;
            }
        }
        Action::List { pid, craft, json } => {
            let (r, _) = call(&socket, &Request::List { pid: *pid, craft: craft.clone() }, quick)?;
            let v = r.profiles.unwrap_or_default();
            if *json {
                crate::print(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
            } else {
                crate::print(&render_list(&v))?;
            }
        }
        Action::Fetch { id, pid, craft, out } => {
            let req = Request::Fetch { id: id.clone(), pid: *pid, craft: craft.clone() };
            let (r, body) = call(&socket, &req, quick)?;
            write_profile(&body, out, r.meta.as_ref())?;
        }
        Action::Profile { pid, craft, duration, out } => {
            let req = Request::Profile { pid: *pid, craft: craft.clone(), duration_ms: duration.map(|d| d.as_millis() as u64) };
            // The session's length, plus the daemon's queueing and detach.
            let wait = duration.unwrap_or(Duration::from_secs(600)) + Duration::from_secs(120);
            let (r, body) = call(&socket, &req, wait)?;
            for n in &r.notes {
                crate::say!("witch daemon: {n}");
            }
            let p = write_profile(&body, out, r.meta.as_ref())?;
            let c = crate::analysis::counters(&p);
            crate::say!(
                "witch daemon: pid {} ({}): {} for {}, {} samples, waste {}{}",
                p.pid,
                p.program.rsplit('/').next().unwrap_or(&p.program),
                p.craft.name(),
                fmt_duration(p.duration_ns),
                c.samples,
                pct(p.waste_fraction()),
                r.meta.map_or(String::new(), |m| format!("; stored as {}", m.id))
            );
        }
    }
    Ok(0)
}

/// Writes a received profile as asked; returns it parsed.
fn write_profile(body: &[u8], out: &OutputArgs, meta: Option<&Meta>) -> Result<Profile> {
    let p = Profile::from_bytes(body).map_err(|e| anyhow::anyhow!("witchd sent a bad profile: {e}"))?;
    let to_stdout = match &out.output {
        Some(f) => f.as_os_str() == "-",
        None => !out.report,
    };
    let data = if out.pprof { crate::render::pprof::gzipped(&p)? } else { body.to_vec() };
    if to_stdout {
        if out.pprof && std::io::stdout().is_terminal() {
            bail!("not writing binary pprof to a terminal; give -o FILE");
        }
        let mut o = std::io::stdout().lock();
        o.write_all(&data).and_then(|_| o.flush()).or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?;
    } else if let Some(f) = &out.output {
        crate::write::bytes(f, &data)?;
        let what = if out.pprof { "pprof profile" } else { "profile" };
        crate::say!("witch daemon: wrote {what} {}{}", f.display(), meta.map_or(String::new(), |m| format!(" ({})", m.id)));
    }
    if out.report {
        crate::print(&super::report::render(&p, None, crate::render::text::PAIRS_SHOWN, false, crate::render::Format::Text, None)?)?;
    }
    Ok(p)
}

fn render_status(s: &DaemonStatus) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let up = humantime::format_duration(Duration::from_secs(s.uptime_s as u64));
    let _ = writeln!(o, "witchd {}, pid {}, up {up}; socket {}, http {}", s.version, s.pid, s.socket, s.http.as_deref().unwrap_or("off"));
    let _ = writeln!(o, "store {}: {} profiles, {} of {}", s.store_dir, s.store_profiles, size(s.store_bytes), size(s.store_max_bytes));
    let max = if s.max_sessions > 0 { format!(" (of {})", s.max_sessions) } else { String::new() };
    let _ = writeln!(
        o,
        "sessions: {} running{max}, {} queued; {} ok, {} target exited, {} target exec'd, {} failed",
        s.sessions_active, s.sessions_waiting, s.sessions_ok, s.sessions_target_exited, s.sessions_target_exec, s.sessions_failed
    );
    let _ = writeln!(o, "rules: {}", if s.rules.is_empty() { "none".into() } else { s.rules.join("; ") });
    if s.targets.is_empty() {
        let _ = writeln!(o, "no targets (that you may see)");
        return o;
    }
    let _ = writeln!(o, "\n{:<8} {:<16} {:<34} {:>8} {:>8}  LATEST WASTE", "PID", "EXE", "STATE", "SESSIONS", "NEXT");
    for t in &s.targets {
        let next = t.next_in_s.map_or("-".into(), |n| format!("{:.1}s", n.max(0.0)));
        let waste: Vec<String> = t.waste.iter().map(|(c, w)| format!("{c} {}", pct(*w))).collect();
        let _ = writeln!(o, "{:<8} {:<16} {:<34} {:>8} {:>8}  {}", t.pid, t.exe, t.state, t.sessions, next, waste.join(", "));
        if let Some(e) = &t.last_error {
            let _ = writeln!(o, "         last error: {e}");
        }
    }
    o
}

fn render_list(v: &[Meta]) -> String {
    use std::fmt::Write as _;
    if v.is_empty() {
        return "no stored profiles (that you may read)\n".into();
    }
    let mut o =
        format!("{:<36} {:>8} {:<16} {:<12} {:>9} {:>8} {:>7}  STORED\n", "ID", "PID", "EXE", "CRAFT", "DURATION", "SAMPLES", "WASTE");
    for m in v {
        let stored = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_nanos(m.stored_unix_ns));
        let _ = writeln!(
            o,
            "{:<36} {:>8} {:<16} {:<12} {:>9} {:>8} {:>7}  {stored}{}",
            m.id,
            m.pid,
            m.exe(),
            m.craft.name(),
            fmt_duration(m.duration_ns),
            m.samples,
            pct(m.waste_fraction),
            if m.target_exited { " (target exited)" } else { "" }
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(args: &[&str]) -> DaemonArgs {
        let c = Cli::try_parse_from(args).unwrap();
        let Command::Daemon(a) = c.command else { panic!() };
        a
    }

    #[test]
    fn command_line() {
        let a = parse(&["witch", "daemon", "status"]);
        assert!(matches!(a.action, Action::Status { json: false }));
        let a = parse(&["witch", "daemon", "--socket", "/x.sock", "list", "--pid", "5"]);
        assert_eq!(a.socket, Some(PathBuf::from("/x.sock")));
        assert!(matches!(a.action, Action::List { pid: Some(5), .. }));
        let a = parse(&["witch", "daemon", "fetch", "123-4-dead", "-o", "p.json", "--socket", "/y"]);
        assert_eq!(a.socket, Some(PathBuf::from("/y")));
        let Action::Fetch { id, out, .. } = a.action else { panic!() };
        assert_eq!((id.as_deref(), out.output), (Some("123-4-dead"), Some(PathBuf::from("p.json"))));
        let a = parse(&["witch", "daemon", "profile", "--pid", "9", "--duration", "1.5s", "--craft", "dead"]);
        let Action::Profile { pid, duration, .. } = a.action else { panic!() };
        assert_eq!((pid, duration), (9, Some(Duration::from_millis(1500))));
        assert!(Cli::try_parse_from(["witch", "daemon", "fetch"]).is_err());
        assert!(Cli::try_parse_from(["witch", "daemon", "fetch", "x", "--pid", "3"]).is_err());
        assert!(Cli::try_parse_from(["witch", "daemon", "profile"]).is_err());
        assert!(Cli::try_parse_from(["witch", "daemon", "frobnicate"]).is_err());
    }

    /// A status from a witchd of before `sessions_waiting` (and the rest)
    /// still reads; one with them shows them.
    #[test]
    fn status_text() {
        let old = r#"{"pid":1,"version":"0.1.0","uptime_s":5.0,"socket":"/s","http":null,"store_dir":"/d","store_bytes":0,
            "store_max_bytes":10,"store_profiles":0,"sessions_active":1,"sessions_ok":2,"sessions_target_exited":0,
            "sessions_failed":0,"rules":[],"targets":[]}"#;
        let mut s: DaemonStatus = serde_json::from_str(old).unwrap();
        assert_eq!((s.sessions_waiting, s.max_sessions, s.sessions_target_exec), (0, 0, 0));
        assert!(render_status(&s).contains("sessions: 1 running, 0 queued; 2 ok, 0 target exited, 0 target exec'd, 0 failed"));
        s.max_sessions = 1;
        s.sessions_waiting = 1;
        s.targets = ["profiling dead", "queued silent-store (requested)"]
            .iter()
            .enumerate()
            .map(|(i, st)| crate::daemon::proto::TargetStatus {
                pid: 10 + i as i32,
                exe: "srv".into(),
                rule: "exe=srv".into(),
                state: st.to_string(),
                sessions: 1,
                next_in_s: None,
                last_error: None,
                waste: vec![],
            })
            .collect();
        let text = render_status(&s);
        assert!(text.contains("sessions: 1 running (of 1), 1 queued;"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("11 ") && l.contains("queued silent-store (requested)")), "{text}");
    }

    #[test]
    fn not_running_is_one_line() {
        let e = call(Path::new("/nonexistent/witchd.sock"), &Request::Status, Duration::from_secs(1)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.starts_with("witchd is not running"), "{msg}");
        assert!(!msg.contains('\n'));
    }
}
