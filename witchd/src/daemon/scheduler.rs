//! Targets and their duty cycle.
//!
//! Every `scan_every`, /proc is matched against the watch rules: new matches
//! become targets, targets whose process is gone (or whose pid now belongs to
//! another process) are forgotten, with their metrics, and a process that
//! replaced its program (exec) becomes a fresh target. Each target gets a
//! session of `duration` every `every`, its crafts taking turns. A target
//! whose sessions fail is retried at its next turn, and its error logged only
//! when it changes, so a process witchd cannot attach to costs one log line,
//! not one per cycle.

use super::config::{Profiling, Watch};
use super::metrics::Outcome;
use super::procfs::{self, Proc};
use super::session::{self, SessionPlan};
use super::store::Meta;
use super::{say, Daemon};
use crate::inject::Options;
use rand::RngExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use witchcraft::profile::{Craft, Profile};

/// The latest session of one craft on one target, for metrics and status.
#[derive(Debug, Clone)]
pub struct Last {
    pub waste_fraction: f64,
    pub samples: u64,
    pub traps: u64,
    /// Estimated CPU time in the engine's handlers (ns).
    pub overhead_ns: u64,
    pub duration_ns: u64,
    pub id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Idle,
    /// A scheduled session is in flight: queued for a slot or running (the
    /// daemon's [`super::Busy`] of its claim says which).
    Scheduled,
    /// Its last session saw it exit; forgotten at the next scan.
    Exited,
}

/// A process a `[[watch]]` rule matched, and when its next session is due
/// (what attaching needs of a process is `inject::target::Target`).
#[derive(Debug, Clone)]
pub struct RuleTarget {
    pub proc: Proc,
    /// Index of the matching rule in the config.
    pub rule: usize,
    pub next_due: Instant,
    /// Which craft runs next (index into the rule's crafts, modulo).
    pub turn: usize,
    pub sessions: u64,
    pub state: State,
    pub last_error: Option<String>,
    /// At most one entry per craft.
    pub last: Vec<(Craft, Last)>,
    /// Its name in metrics: the executable's name when it was found, and the
    /// lowest number free among the targets of its rule with that name. A
    /// restarted process takes its predecessor's, so metric series outlive
    /// pids (which go in `witchd_target_info`).
    pub label: (String, u32),
}

/// Every target, by pid.
#[derive(Default)]
pub struct Targets {
    pub map: BTreeMap<i32, RuleTarget>,
    /// A match was left out for max_targets (logged once until it clears).
    full: bool,
    /// Slots in use, by rule and name.
    slots: std::collections::HashMap<(usize, String), std::collections::BTreeSet<u32>>,
}

impl Targets {
    /// Records a finished session's figures on its target, if it is one.
    pub fn record(&mut self, p: &Proc, craft: Craft, profile: &Profile, meta: Option<&Meta>, overhead_ns: u64) {
        let Some(t) = self.map.get_mut(&p.pid).filter(|t| t.proc.start_time == p.start_time) else { return };
        let c = crate::analysis::counters(profile);
        let last = Last {
            waste_fraction: profile.waste_fraction(),
            samples: c.samples,
            traps: c.traps,
            overhead_ns,
            duration_ns: profile.duration_ns,
            id: meta.map(|m| m.id.clone()),
        };
        match t.last.iter_mut().find(|(k, _)| *k == craft) {
            Some(slot) => slot.1 = last,
            None => t.last.push((craft, last)),
        }
    }

    pub fn mark_exited(&mut self, p: &Proc) {
        if let Some(t) = self.map.get_mut(&p.pid).filter(|t| t.proc.start_time == p.start_time) {
            t.state = State::Exited;
        }
    }

    /// Applies a scan: adds new matches, forgets what is gone, and starts
    /// afresh with a process that replaced its program (exec: the same pid
    /// and start time, a new image). Targets with a session in flight stay
    /// until it ends (it reports the exit or exec itself).
    ///
    /// `busy`: whether a pid's session is in flight; `lookup`: the process
    /// a pid is now, if any (only to say why a target is forgotten).
    fn update(
        &mut self,
        found: Vec<(Proc, usize)>,
        rules: &[Watch],
        max: usize,
        now: Instant,
        busy: impl Fn(i32) -> bool,
        lookup: impl Fn(i32) -> Option<Proc>,
    ) {
        // Forget what is gone first, so its metric slot is free for a successor.
        let seen: std::collections::HashSet<i32> = found.iter().map(|(p, _)| p.pid).collect();
        let mut gone = Vec::new();
        self.map.retain(|pid, t| {
            let keep = busy(*pid) || (seen.contains(pid) && t.state != State::Exited);
            if !keep && t.state != State::Exited {
                say!("{}; forgetting it", why_forgotten(&t.proc, lookup(*pid)));
            }
            if !keep {
                gone.push((t.rule, t.label.clone()));
            }
            keep
        });
        for (rule, label) in gone {
            self.free(rule, &label);
        }
        let mut left_out = 0;
        for (p, rule) in found {
            match self.map.get_mut(&p.pid) {
                Some(t) if t.proc.start_time == p.start_time && t.rule == rule && t.proc.image == p.image => {
                    t.proc.exe = p.exe; // renamed: keep the name current
                    t.proc.uids = p.uids;
                    t.proc.gids = p.gids;
                    t.proc.proc_owner = p.proc_owner;
                }
                Some(t) if busy(t.proc.pid) => {}
                existing => {
                    let old = existing.as_ref().map(|t| (t.rule, t.label.clone()));
                    // The same process with a new image: it exec'd.
                    let exec = existing
                        .filter(|t| t.proc.start_time == p.start_time && t.proc.image != p.image)
                        .map(|t| t.proc.name().to_string());
                    if old.is_none() && self.map.len() >= max {
                        left_out += 1;
                        continue;
                    }
                    if let Some((rule, label)) = old {
                        self.free(rule, &label);
                    }
                    let name = p.name().to_string();
                    let slot = self.take(rule, &name);
                    // Spread first sessions so targets found together don't attach together.
                    let every = rules[rule].profiling.every;
                    let jitter = every.min(Duration::from_secs(10)).mul_f64(rand::rng().random::<f64>() * 0.5);
                    let t = RuleTarget {
                        proc: p,
                        rule,
                        next_due: now + jitter,
                        turn: 0,
                        sessions: 0,
                        state: State::Idle,
                        last_error: None,
                        last: Vec::new(),
                        label: (name, slot),
                    };
                    match exec {
                        Some(was) => say!(
                            "pid {} ({was}) replaced its program (exec): watching it afresh as {} by rule {}",
                            t.proc.pid,
                            t.proc.name(),
                            rules[rule].describe()
                        ),
                        None => say!("watching pid {} ({}) by rule {}", t.proc.pid, t.proc.name(), rules[rule].describe()),
                    }
                    self.map.insert(t.proc.pid, t);
                }
            }
        }
        if left_out > 0 && !self.full {
            say!("max_targets ({max}) reached: {left_out} more matching processes are not watched");
        }
        self.full = left_out > 0;
    }
}

impl Targets {
    /// The lowest slot free for `name` under `rule`.
    fn take(&mut self, rule: usize, name: &str) -> u32 {
        let used = self.slots.entry((rule, name.to_string())).or_default();
        let slot = (0..).find(|n| !used.contains(n)).expect("a free slot");
        used.insert(slot);
        slot
    }

    fn free(&mut self, rule: usize, label: &(String, u32)) {
        if let Some(used) = self.slots.get_mut(&(rule, label.0.clone())) {
            used.remove(&label.1);
            if used.is_empty() {
                self.slots.remove(&(rule, label.0.clone()));
            }
        }
    }
}

/// Which processes match which rule now (first matching rule wins).
/// Why a target no scan found any more is forgotten, given the process its
/// pid is now (`now`): gone, or the same process, which exec'd into a
/// program no rule matches (or changed so that its rule no longer does).
fn why_forgotten(was: &Proc, now: Option<Proc>) -> String {
    let (pid, name) = (was.pid, was.name());
    match now {
        Some(p) if p.start_time == was.start_time && p.image != was.image => {
            format!("pid {pid} ({name}) now runs {}, which no rule matches", p.name())
        }
        Some(p) if p.start_time == was.start_time && p.state != 'Z' => format!("pid {pid} ({name}) no longer matches its rule"),
        _ => format!("pid {pid} ({name}) is gone"),
    }
}

pub fn scan(rules: &[Watch]) -> Vec<(Proc, usize)> {
    let me = std::process::id() as i32;
    let only_pids = rules.iter().all(|r| r.pid.is_some());
    let candidates: Vec<i32> = if only_pids { rules.iter().filter_map(|r| r.pid).collect() } else { procfs::pids() };
    let mut out = Vec::new();
    for pid in candidates {
        if pid == me || out.iter().any(|(p, _): &(Proc, usize)| p.pid == pid) {
            continue;
        }
        let Some(p) = Proc::read(pid) else { continue };
        // Kernel threads have no executable; zombies have nothing left to watch.
        if p.is_zombie() || p.exe.is_empty() {
            continue;
        }
        let mut cgroups = None;
        let rule = rules.iter().position(|r| {
            r.pid.is_none_or(|x| x == pid)
                && r.exe.as_deref().is_none_or(|e| p.exe_matches(e))
                && r.cgroup.as_deref().is_none_or(|c| procfs::cgroup_matches(cgroups.get_or_insert_with(|| procfs::cgroups(pid)), c))
        });
        if let Some(rule) = rule {
            out.push((p, rule));
        }
    }
    out
}

pub fn options(p: &Profiling, craft: Craft) -> Options {
    Options {
        craft,
        period: p.period,
        period_is_time: false,
        event: p.event.clone(),
        debug_registers: p.debug_registers,
        replacement: p.replacement,
        fp_precision: p.fp_precision,
        overhead_percent: p.overhead_percent,
        heap_threshold: None,
    }
}

/// The duty-cycle loop; returns at shutdown (sessions then finish on their own).
pub async fn run(d: Arc<Daemon>) {
    if d.cfg.watch.is_empty() {
        say!("no [[watch]] rules: serving requests only");
        d.until_shutdown().await;
        return;
    }
    let mut next_scan = Instant::now();
    while !d.shutting_down() {
        let now = Instant::now();
        if now >= next_scan {
            let rules = d.cfg.watch.clone();
            let found = tokio::task::spawn_blocking(move || scan(&rules)).await.unwrap_or_default();
            let d2 = d.clone();
            d.targets.lock().unwrap().update(found, &d.cfg.watch, d.cfg.max_targets, now, |p| d2.is_busy(p), Proc::read);
            next_scan = now + d.cfg.scan_every;
        }
        let mut wake = next_scan;
        let mut start = Vec::new();
        {
            let mut ts = d.targets.lock().unwrap();
            for t in ts.map.values_mut() {
                if t.state != State::Idle {
                    continue;
                }
                if t.next_due > now {
                    wake = wake.min(t.next_due);
                    continue;
                }
                let prof = &d.cfg.watch[t.rule].profiling;
                let craft = prof.crafts[t.turn % prof.crafts.len()];
                let Some(claim) = d.claim(t.proc.pid, craft, false) else {
                    // A requested session is running there; try again shortly.
                    wake = wake.min(now + Duration::from_millis(200));
                    continue;
                };
                t.turn += 1;
                t.sessions += 1;
                t.next_due = now + prof.every;
                t.state = State::Scheduled;
                let plan = SessionPlan {
                    target: t.proc.clone(),
                    opts: options(prof, craft),
                    duration: prof.duration,
                    origin: "schedule",
                    who: super::slots::Who::Rule,
                };
                start.push((claim, plan));
            }
        }
        for (claim, plan) in start {
            tokio::spawn(scheduled(d.clone(), claim, plan));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = d.until_shutdown() => {}
        }
    }
}

/// One scheduled session, and what it leaves on its target.
async fn scheduled(d: Arc<Daemon>, claim: super::Claim, plan: SessionPlan) {
    let target = plan.target.clone();
    let done = session::run(d.clone(), claim, plan).await;
    let mut ts = d.targets.lock().unwrap();
    let Some(t) = ts.map.get_mut(&target.pid).filter(|t| t.proc.start_time == target.start_time) else { return };
    if t.state != State::Exited {
        t.state = State::Idle;
    }
    match (done.outcome, done.note) {
        (Outcome::Failed, Some(msg)) if !d.shutting_down() => {
            if t.last_error.as_ref() != Some(&msg) {
                say!(
                    "{msg} (retrying every {}; logged again only if this changes)",
                    humantime::format_duration(d.cfg.watch[t.rule].profiling.every)
                );
            }
            t.last_error = Some(msg);
        }
        (Outcome::Ok, _) if t.last_error.take().is_some() => {
            say!("pid {} ({}): sessions work again", t.proc.pid, t.proc.name());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: i32, start: u64) -> Proc {
        Proc {
            pid,
            start_time: start,
            exe: format!("/bin/p{pid}"),
            comm: "p".into(),
            uids: [0; 4],
            gids: [0; 4],
            proc_owner: 0,
            state: 'S',
            image: super::procfs::Image([start, 0, 0, 0, 0, 0]),
        }
    }

    fn rules() -> Vec<Watch> {
        let c = super::super::config::DaemonConfig::parse("[[watch]]\nexe = \"x\"\nevery = \"1s\"\nduration = \"0.5s\"\n", "t").unwrap();
        c.watch
    }

    /// A session's options carry the rule's settings to the agent.
    #[test]
    fn options_carry_the_rules_settings() {
        let c = super::super::config::DaemonConfig::parse("[[watch]]\nexe = \"x\"\nperiod = 200000\noverhead = \"0.5%\"\n", "t").unwrap();
        let o = options(&c.watch[0].profiling, Craft::SilentStore);
        assert_eq!((o.craft, o.period, o.overhead_percent), (Craft::SilentStore, Some(200_000), Some(0.5)));
        assert_eq!(options(&c.defaults, Craft::Dead).overhead_percent, None);
    }

    #[test]
    fn targets_come_and_go() {
        let r = rules();
        let mut ts = Targets::default();
        let now = Instant::now();
        ts.update(vec![(proc(1, 10), 0), (proc(2, 20), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!(ts.map.len(), 2);
        assert!(ts.map[&1].next_due <= now + Duration::from_millis(500));
        // pid 2 is gone, pid 1 was reused by another process.
        ts.map.get_mut(&1).unwrap().sessions = 5;
        ts.update(vec![(proc(1, 11), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!(ts.map.keys().collect::<Vec<_>>(), vec![&1]);
        assert_eq!((ts.map[&1].proc.start_time, ts.map[&1].sessions), (11, 0));
        // Metric labels outlive pids: a restarted process takes the free slot of its name.
        let mut st = Targets::default();
        let srv = |pid, start| Proc { exe: "/bin/srv".into(), ..proc(pid, start) };
        st.update(vec![(srv(4, 40), 0), (srv(5, 50), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!((st.map[&4].label.clone(), st.map[&5].label.clone()), (("srv".to_string(), 0), ("srv".to_string(), 1)));
        st.update(vec![(srv(4, 40), 0), (srv(6, 60), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!(st.map[&6].label, ("srv".to_string(), 1), "pid 6 replaces pid 5 in the metrics");
        st.update(vec![(srv(6, 60), 0), (srv(7, 70), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!(st.map[&7].label, ("srv".to_string(), 0), "and pid 7 pid 4");
        // A busy target stays while its session runs, even if gone.
        ts.update(vec![], &r, 10, now, |p| p == 1, |_| None);
        assert_eq!(ts.map.len(), 1);
        // Exited targets are forgotten at the next scan.
        let p = ts.map[&1].proc.clone();
        ts.mark_exited(&p);
        ts.update(vec![], &r, 10, now, |_| false, |_| None);
        assert!(ts.map.is_empty());
        // Bounded.
        let many: Vec<_> = (1..100).map(|i| (proc(i, 1), 0)).collect();
        ts.update(many, &r, 10, now, |_| false, |_| None);
        assert_eq!(ts.map.len(), 10);
        assert!(ts.full);
    }

    /// A target no scan finds is forgotten, and the log says why: gone, or
    /// still there running another program.
    #[test]
    fn a_forgotten_target_is_said_to_be_gone_only_when_it_is() {
        let was = Proc { exe: "/bin/srv".into(), ..proc(3, 30) };
        assert_eq!(why_forgotten(&was, None), "pid 3 (srv) is gone");
        // The pid now belongs to another process.
        assert_eq!(why_forgotten(&was, Some(proc(3, 31))), "pid 3 (srv) is gone");
        let execd = Proc { exe: "/usr/bin/sleep".into(), image: super::procfs::Image([9, 0, 0, 0, 0, 0]), ..proc(3, 30) };
        assert_eq!(why_forgotten(&was, Some(execd)), "pid 3 (srv) now runs sleep, which no rule matches");
        let setuid = Proc { uids: [1000, 0, 0, 0], ..was.clone() };
        assert_eq!(why_forgotten(&was, Some(setuid)), "pid 3 (srv) no longer matches its rule");
        let zombie = Proc { state: 'Z', ..was.clone() };
        assert_eq!(why_forgotten(&was, Some(zombie)), "pid 3 (srv) is gone");
    }

    /// An exec keeps pid and start time but lays out a new image: the
    /// process is watched afresh (the old program's figures are not the new
    /// one's), under the slot its name had, once no session is in flight.
    #[test]
    fn a_process_that_execs_is_a_fresh_target() {
        let r = rules();
        let mut ts = Targets::default();
        let now = Instant::now();
        let srv =
            |image: u64, exe: &str| Proc { exe: exe.into(), image: super::super::procfs::Image([image, 0, 0, 0, 0, 0]), ..proc(3, 30) };
        ts.update(vec![(srv(1, "/bin/srv"), 0)], &r, 10, now, |_| false, |_| None);
        ts.map.get_mut(&3).unwrap().sessions = 4;
        // Renamed, same image: the same target (a rename is no exec).
        ts.update(vec![(srv(1, "/bin/srv2"), 0)], &r, 10, now, |_| false, |_| None);
        assert_eq!((ts.map[&3].sessions, ts.map[&3].proc.exe.as_str()), (4, "/bin/srv2"));
        // A new image while a session runs: left to the session.
        ts.update(vec![(srv(2, "/bin/srv2"), 0)], &r, 10, now, |_| true, |_| None);
        assert_eq!(ts.map[&3].sessions, 4);
        // Then watched afresh, not forgotten or marked exited.
        ts.update(vec![(srv(2, "/bin/srv2"), 0)], &r, 10, now, |_| false, |_| None);
        let t = &ts.map[&3];
        assert_eq!((t.sessions, &t.state, t.proc.image.0[0], t.label.clone()), (0, &State::Idle, 2, ("srv2".to_string(), 0)));
        assert!(t.next_due <= now + Duration::from_millis(500));
    }

    #[test]
    fn scan_finds_a_child_by_pid_and_exe() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let c = super::super::config::DaemonConfig::parse(
            &format!("[[watch]]\npid = {pid}\n[[watch]]\nexe = \"sleep\"\n[[watch]]\nexe = \"no-such-exe\"\n"),
            "t",
        )
        .unwrap();
        let found = scan(&c.watch);
        assert!(found.iter().any(|(p, r)| p.pid == pid && *r == 0), "{found:?}");
        let found = scan(&c.watch[1..]);
        assert!(found.iter().any(|(p, r)| p.pid == pid && *r == 0), "{found:?}");
        assert!(scan(&c.watch[2..]).is_empty());
        let me = std::process::id() as i32;
        let own = super::super::config::DaemonConfig::parse(&format!("[[watch]]\npid = {me}\n"), "t").unwrap();
        assert!(scan(&own.watch).is_empty(), "never watches itself");
        let _ = child.kill();
        let _ = child.wait();
    }
}
