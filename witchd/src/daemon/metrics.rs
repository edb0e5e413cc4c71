//! Daemon-wide counters, and the Prometheus text exposition format (0.0.4).
//!
//! The format is small enough to write by hand; what matters is escaping
//! label values and emitting HELP/TYPE once per family, before its samples.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How a session ended, for `witchd_sessions_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Detached, profile stored.
    Ok,
    /// The target exited during the session (its last profile is kept if it wrote one).
    TargetExited,
    /// Attach or detach failed.
    Failed,
    /// The target replaced its program (exec) during the session: the same
    /// process runs on, but the agent and what it gathered went with the old
    /// image, so there is no profile.
    TargetExec,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::TargetExited, Outcome::Failed, Outcome::TargetExec];
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::TargetExited => "target_exited",
            Outcome::Failed => "failed",
            Outcome::TargetExec => "target_exec",
        }
    }
}

/// Where an error happened, for `witchd_errors_total{kind}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Attach,
    Detach,
    Store,
    Api,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 4] = [ErrorKind::Attach, ErrorKind::Detach, ErrorKind::Store, ErrorKind::Api];
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Attach => "attach",
            ErrorKind::Detach => "detach",
            ErrorKind::Store => "store",
            ErrorKind::Api => "api",
        }
    }
}

/// The daemon's Prometheus totals: counters that only ever grow; fixed
/// size, so the daemon does not.
#[derive(Default)]
pub struct Totals {
    sessions: [AtomicU64; Outcome::ALL.len()],
    errors: [AtomicU64; 4],
    pub samples: AtomicU64,
    pub traps: AtomicU64,
    /// Estimated CPU seconds spent in the engine's handlers, as nanoseconds.
    pub overhead_ns: AtomicU64,
    pub requests: AtomicU64,
    pub denied: AtomicU64,
}

impl Totals {
    pub fn session(&self, o: Outcome) {
        self.sessions[o as usize].fetch_add(1, Relaxed);
    }
    pub fn sessions(&self, o: Outcome) -> u64 {
        self.sessions[o as usize].load(Relaxed)
    }
    pub fn error(&self, k: ErrorKind) {
        self.errors[k as usize].fetch_add(1, Relaxed);
    }
    pub fn errors(&self, k: ErrorKind) -> u64 {
        self.errors[k as usize].load(Relaxed)
    }
}

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Formats a sample value the way Prometheus reads it.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Builds an exposition: call `family` once per metric name, then `sample` for each series.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(val));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", value(v));
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, v: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], v)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// CPU time the engine cost the target during one session: the engine's own
/// `engine_ns` (handler time plus the calibrated kernel round trips) when
/// the profile has it. Older profiles lack it; for them, an estimate from the
/// round trips the agent measured at its start (`round_trips`) times the
/// traps and interrupts counted, or, in profiles older still, from this
/// repository's measurements in a VM.
pub fn overhead_ns(p: &witchcraft::profile::Profile) -> u64 {
    let c = crate::analysis::counters(p);
    if c.engine_ns > 0 {
        return c.engine_ns;
    }
    let (trap_ns, signal_ns) = p.round_trips.map_or((19_000.0, 5_400.0), |r| (r.trap_ns as f64, r.signal_ns as f64));
    let traps = c.traps + c.self_traps + c.ignored_traps;
    (traps as f64 * trap_ns + c.interrupts as f64 * signal_ns) as u64
}

/// The whole /metrics page. Per-target series exist while the target is
/// watched, so the page's size follows the (bounded) target map.
pub fn render(d: &super::Daemon) -> String {
    let mut e = Exposition::default();
    {
        let ts = d.targets.lock().unwrap();
        type Get = fn(&super::scheduler::Last) -> f64;
        let per_craft: [(&str, &str, Get); 5] = [
            ("witchd_waste_fraction", "Waste fraction (waste/(waste+use)) of the target's latest session of this craft", |l| {
                l.waste_fraction
            }),
            ("witchd_target_samples", "Samples taken in the target's latest session of this craft", |l| l.samples as f64),
            ("witchd_target_traps", "Watchpoint traps in the target's latest session of this craft", |l| l.traps as f64),
            ("witchd_target_overhead_seconds", "Estimated CPU seconds the engine's handlers took in the latest session", |l| {
                l.overhead_ns as f64 / 1e9
            }),
            ("witchd_target_overhead_ratio", "Estimated overhead of the latest session: handler CPU seconds per second profiled", |l| {
                if l.duration_ns > 0 {
                    l.overhead_ns as f64 / l.duration_ns as f64
                } else {
                    0.0
                }
            }),
        ];
        // Series are named by executable and slot, which a restarted process
        // keeps; its pid and rule are in witchd_target_info.
        e.family("witchd_target_info", "gauge", "A watched process: its pid and rule, under the labels its series have");
        for t in ts.map.values() {
            let slot = t.label.1.to_string();
            let pid = t.proc.pid.to_string();
            let rule = d.cfg.watch.get(t.rule).map(|w| w.describe()).unwrap_or_default();
            e.sample("witchd_target_info", &[("exe", &t.label.0), ("slot", &slot), ("pid", &pid), ("rule", &rule)], 1.0);
        }
        for (name, help, get) in per_craft {
            e.family(name, "gauge", help);
            for t in ts.map.values() {
                let slot = t.label.1.to_string();
                for (craft, last) in &t.last {
                    e.sample(name, &[("exe", &t.label.0), ("slot", &slot), ("craft", craft.name())], get(last));
                }
            }
        }
        e.family("witchd_target_sessions_total", "counter", "Sessions started on the target since witchd found it");
        for t in ts.map.values() {
            e.sample("witchd_target_sessions_total", &[("exe", &t.label.0), ("slot", &t.label.1.to_string())], t.sessions as f64);
        }
        e.single("witchd_targets", "gauge", "Processes watched now", ts.map.len() as f64);
    }
    let c = &d.counters;
    e.single(
        "witchd_sessions_active",
        "gauge",
        "Sessions holding one of the max_sessions slots (attaching, profiling, detaching or storing)",
        d.sessions_active() as f64,
    );
    e.single("witchd_sessions_waiting", "gauge", "Sessions due but waiting for a free slot (max_sessions)", d.sessions_waiting() as f64);
    e.family("witchd_sessions_total", "counter", "Sessions ended, by outcome");
    for o in Outcome::ALL {
        e.sample("witchd_sessions_total", &[("outcome", o.name())], c.sessions(o) as f64);
    }
    e.family("witchd_errors_total", "counter", "Errors, by where they happened");
    for k in ErrorKind::ALL {
        e.sample("witchd_errors_total", &[("kind", k.name())], c.errors(k) as f64);
    }
    e.single("witchd_samples_total", "counter", "Samples taken over all sessions", c.samples.load(Relaxed) as f64);
    e.single("witchd_traps_total", "counter", "Watchpoint traps over all sessions", c.traps.load(Relaxed) as f64);
    e.single(
        "witchd_overhead_seconds_total",
        "counter",
        "Estimated CPU seconds spent in the engine's handlers in targets",
        c.overhead_ns.load(Relaxed) as f64 / 1e9,
    );
    e.single("witchd_requests_total", "counter", "Local API requests", c.requests.load(Relaxed) as f64);
    e.single(
        "witchd_requests_denied_total",
        "counter",
        "Local API requests refused for the caller's credentials",
        c.denied.load(Relaxed) as f64,
    );
    let (bytes, n, evicted, rejected, max) = {
        let s = d.store.lock().unwrap();
        let (b, n) = s.usage();
        (b, n, s.evicted, s.rejected, s.limits().max_bytes)
    };
    e.single("witchd_store_bytes", "gauge", "Bytes in the profile store", bytes as f64);
    e.single("witchd_store_max_bytes", "gauge", "The store's size limit", max as f64);
    e.single("witchd_store_profiles", "gauge", "Profiles in the store", n as f64);
    e.single("witchd_store_evictions_total", "counter", "Profiles removed for the size, count or age limits", evicted as f64);
    e.single("witchd_store_rejected_total", "counter", "Profiles not stored because one alone exceeds max_bytes", rejected as f64);
    e.single("witchd_uptime_seconds", "gauge", "Seconds since witchd started", d.started.elapsed().as_secs_f64());
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format() {
        let mut e = Exposition::default();
        e.family("witchd_waste_fraction", "gauge", "Waste\nfraction")
            .sample("witchd_waste_fraction", &[("pid", "12"), ("exe", "a\"b\\c\nd")], 0.25)
            .sample("witchd_waste_fraction", &[("pid", "13"), ("exe", "x")], 1.0);
        e.single("witchd_up", "gauge", "Up", 1.0);
        assert_eq!(
            e.finish(),
            "# HELP witchd_waste_fraction Waste\\nfraction\n# TYPE witchd_waste_fraction gauge\n\
             witchd_waste_fraction{pid=\"12\",exe=\"a\\\"b\\\\c\\nd\"} 0.25\n\
             witchd_waste_fraction{pid=\"13\",exe=\"x\"} 1\n\
             # HELP witchd_up Up\n# TYPE witchd_up gauge\nwitchd_up 1\n"
        );
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(1e20), "100000000000000000000");
        assert_eq!(value(3.5e-7), "0.00000035");
    }

    #[test]
    fn overhead_prefers_the_engines_own_figure() {
        let mut p = crate::daemon::store::tests_support::profile(1, 0, 0);
        p.counters.interrupts = 100;
        p.counters.traps = 7;
        // Neither engine_ns nor round trips: the repository's VM figures.
        assert_eq!(overhead_ns(&p), 7 * 19_000 + 100 * 5_400);
        // A note is prose, not data: it changes nothing.
        p.notes = vec!["measured round trips: watchpoint trap 10.0 µs, signal 2.0 µs".into()];
        assert_eq!(overhead_ns(&p), 7 * 19_000 + 100 * 5_400);
        // No engine_ns (an older profile): traps x trap + interrupts x signal.
        p.round_trips = Some(witchcraft::profile::RoundTrips { trap_ns: 10_000, signal_ns: 2_000, step_ns: 12_000 });
        assert_eq!(overhead_ns(&p), 7 * 10_000 + 100 * 2_000);
        p.counters.engine_ns = 123_456;
        assert_eq!(overhead_ns(&p), 123_456);
    }

    #[test]
    fn counters() {
        let c = Totals::default();
        c.session(Outcome::TargetExited);
        c.error(ErrorKind::Store);
        c.error(ErrorKind::Store);
        assert_eq!(c.sessions(Outcome::TargetExited), 1);
        assert_eq!(c.sessions(Outcome::Ok), 0);
        assert_eq!(c.errors(ErrorKind::Store), 2);
    }
}
