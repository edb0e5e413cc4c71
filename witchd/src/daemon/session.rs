//! One profiling session: wait for a slot, attach, wait, detach, store.
//!
//! attach and detach block (ptrace, waiting for the agent's profile), so they
//! run on tokio's blocking threads; the wait in between is async so that
//! shutdown, the target exiting, or the target replacing its program (exec)
//! ends it early.
//!
//! An exec keeps the pid (and start time) but replaces the whole image: the
//! agent's thread, its state and what it gathered go with the old program,
//! and its socket closes. The process runs on, so that is not an exit: the
//! session ends as `target_exec`, and the process is profiled again later.

use super::metrics::{overhead_ns, ErrorKind, Outcome};
use super::procfs::{Image, Proc};
use super::store::Meta;
use super::{say, Claim, Daemon};
use crate::inject::{self, Attached, End, Options};
use anyhow::Result;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use witchcraft::profile::{Craft, Profile};

/// How sessions are started; the real one is [`crate::inject`], tests use fakes.
pub trait Attacher: Send + Sync + 'static {
    fn attach(&self, pid: i32, opts: &Options) -> Result<Box<dyn Attached>>;
}

pub struct RealAttacher;

impl Attacher for RealAttacher {
    fn attach(&self, pid: i32, opts: &Options) -> Result<Box<dyn Attached>> {
        Ok(Box::new(inject::attach(pid, opts)?))
    }
}

/// What was asked for.
pub struct SessionPlan {
    /// The process, as identified when the session was planned.
    pub target: Proc,
    pub opts: Options,
    pub duration: Duration,
    /// "schedule" or "request", recorded with the profile.
    pub origin: &'static str,
    /// Whose session it is, for the slots: a rule's, or a user's request.
    pub who: super::slots::Who,
}

/// How it went.
pub struct Done {
    pub outcome: Outcome,
    pub profile: Option<Profile>,
    /// The stored profile; None when there was none or the store refused it.
    pub meta: Option<Meta>,
    /// One line for the user: why there is no profile, or what else to know.
    pub note: Option<String>,
}

/// How long a requested session may wait for a slot.
pub const REQUEST_SLOT_WAIT: Duration = Duration::from_secs(60);

/// Counts a session as in flight for as long as it lives.
struct InFlight<'a>(&'a Daemon);

impl<'a> InFlight<'a> {
    fn new(d: &'a Daemon) -> Self {
        d.in_flight.send_modify(|n| *n += 1);
        InFlight(d)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.send_modify(|n| *n -= 1);
    }
}

/// The process that was planned as it is now (same pid, same start), if it is still there.
fn same_process_now(p: &Proc) -> Option<Proc> {
    Proc::read(p.pid).filter(|now| now.start_time == p.start_time && !now.is_zombie())
}

/// Is the process that was planned still there (same pid, same start)?
fn same_process(p: &Proc) -> bool {
    same_process_now(p).is_some()
}

/// Runs one session on a claimed pid. Never fails: failures are outcomes,
/// counted here, with a one-line note that the caller logs or relays (the
/// scheduler logs a target's error only when it changes).
pub async fn run(d: Arc<Daemon>, claim: Claim, plan: SessionPlan) -> Done {
    let _in_flight = InFlight::new(&d);
    let pid = claim.pid();
    let craft = plan.opts.craft;
    let who = format!("pid {pid} ({})", plan.target.name());
    let done = |outcome, profile, meta, note: Option<String>| Done { outcome, profile, meta, note };

    // Wait for a slot; shutdown while waiting means the session never
    // starts. A request waits at most REQUEST_SLOT_WAIT, so its client hears
    // why rather than times out.
    let limit = matches!(plan.who, super::slots::Who::User(_)).then_some(REQUEST_SLOT_WAIT);
    let Some(_slot) = d.slot(plan.who, limit).await else {
        if d.shutting_down() {
            return done(Outcome::Failed, None, None, Some("witchd is shutting down".into()));
        }
        d.counters.session(Outcome::Failed);
        return done(
            Outcome::Failed,
            None,
            None,
            Some(format!(
                "no session slot came free within {} (max_sessions {}, of which requests may hold {}); try again later",
                humantime::format_duration(REQUEST_SLOT_WAIT),
                d.cfg.max_sessions,
                d.slots.lock().unwrap().for_requests()
            )),
        );
    };
    claim.start();
    if d.shutting_down() {
        return done(Outcome::Failed, None, None, Some("witchd is shutting down".into()));
    }
    // The process as the attach will find it (it may have exec'd since it was planned).
    let Some(before) = same_process_now(&plan.target) else {
        return exited(&d, &plan.target, craft, "before the session started");
    };

    let a = d.attacher.clone();
    let opts = plan.opts.clone();
    let attached = tokio::task::spawn_blocking(move || a.attach(pid, &opts)).await;
    let session = match attached {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            if !same_process(&plan.target) {
                return exited(&d, &plan.target, craft, "while attaching");
            }
            if Image::changed(pid, Some(before.image)) {
                return replaced(&d, &plan.target, craft, "while witchd was attaching");
            }
            let msg = format!("cannot attach to {who}: {e:#}");
            d.counters.error(ErrorKind::Attach);
            d.counters.session(Outcome::Failed);
            return done(Outcome::Failed, None, None, Some(msg));
        }
        Err(e) => {
            d.counters.error(ErrorKind::Attach);
            d.counters.session(Outcome::Failed);
            return done(Outcome::Failed, None, None, Some(format!("attach to {who} panicked: {e}")));
        }
    };

    // Profile for `duration`, unless shutdown comes first or the session
    // should end now (see inject::poll): the target goes or replaces its
    // program, or the agent ends the session by itself (a debugger took the
    // process, or it is entering a seccomp sandbox: its profile is ready,
    // and the slot would otherwise be held for the rest of the duration).
    let deadline = Instant::now() + plan.duration;
    let mut poll = inject::Poll::default();
    let mut why = None;
    loop {
        let step = (Instant::now() + Duration::from_millis(200)).min(deadline);
        tokio::select! {
            _ = tokio::time::sleep_until(step) => {}
            _ = d.until_shutdown() => break,
        }
        why = poll.why(&*session);
        if why.is_some() || Instant::now() >= deadline {
            break;
        }
    }
    // How it ended, by the rule `witch --pid` follows too (inject::end).
    let timeout = d.cfg.detach_timeout;
    let ended = tokio::task::spawn_blocking(move || inject::end(session, why, timeout)).await;
    let (profile, target_exited) = match ended {
        Ok(End::Profiled { profile, target_exited, .. }) => (*profile, target_exited),
        Ok(End::Exited) => return exited(&d, &plan.target, craft, "during the session"),
        Ok(End::Replaced) => return replaced(&d, &plan.target, craft, "during the session"),
        Ok(End::Failed(e)) => {
            d.counters.error(ErrorKind::Detach);
            d.counters.session(Outcome::Failed);
            return done(Outcome::Failed, None, None, Some(format!("cannot detach from {who}: {e:#}")));
        }
        Err(e) => {
            d.counters.error(ErrorKind::Detach);
            d.counters.session(Outcome::Failed);
            return done(Outcome::Failed, None, None, Some(format!("detach from {who} panicked: {e}")));
        }
    };

    let c = crate::analysis::counters(&profile);
    d.counters.samples.fetch_add(c.samples, std::sync::atomic::Ordering::Relaxed);
    d.counters.traps.fetch_add(c.traps, std::sync::atomic::Ordering::Relaxed);
    let overhead = overhead_ns(&profile);
    d.counters.overhead_ns.fetch_add(overhead, std::sync::atomic::Ordering::Relaxed);

    // Store it (blocking file I/O), then remember it for metrics and status.
    let meta = Meta::new(&profile, plan.target.owner(), target_exited, plan.origin);
    let d2 = d.clone();
    let stored = tokio::task::spawn_blocking(move || {
        let r = d2.store.lock().unwrap().put(&profile, meta);
        (profile, r)
    })
    .await;
    let Ok((profile, stored)) = stored else {
        d.counters.error(ErrorKind::Store);
        d.counters.session(Outcome::Failed);
        return done(Outcome::Failed, None, None, Some("storing the profile panicked".into()));
    };
    let (meta, note) = match stored {
        Ok(m) => (Some(m), None),
        Err(e) => {
            d.counters.error(ErrorKind::Store);
            say!("{who}: {e:#}");
            (None, Some(format!("{e:#}")))
        }
    };
    d.targets.lock().unwrap().record(&plan.target, craft, &profile, meta.as_ref(), overhead);

    if target_exited {
        let kept = meta.as_ref().map_or(String::new(), |m| format!("; kept its last profile, stored {}", m.id));
        let r = exited(&d, &plan.target, craft, &format!("during the session{kept}"));
        return Done { profile: Some(profile), meta, ..r };
    }
    d.counters.session(Outcome::Ok);
    say!(
        "{who}: {} {}: {} samples, {} traps, waste {:.1}%{}",
        craft.name(),
        humantime::format_duration(Duration::from_millis(profile.duration_ns / 1_000_000)),
        c.samples,
        c.traps,
        profile.waste_fraction() * 100.0,
        meta.as_ref().map_or(String::new(), |m| format!(", stored {}", m.id))
    );
    done(Outcome::Ok, Some(profile), meta, note)
}

/// The target went away: one counter, one log line, no error.
fn exited(d: &Daemon, target: &Proc, craft: Craft, when: &str) -> Done {
    let who = format!("pid {} ({})", target.pid, target.name());
    d.counters.session(Outcome::TargetExited);
    say!("{who} exited {when} ({})", craft.name());
    d.targets.lock().unwrap().mark_exited(target);
    Done { outcome: Outcome::TargetExited, profile: None, meta: None, note: Some(format!("{who} exited {when}")) }
}

/// The target replaced its program (exec): one counter, one log line, no
/// error. It is not an exit: the process runs on, and it is not marked
/// exited; the scan takes it as a fresh target (its new image).
fn replaced(d: &Daemon, target: &Proc, craft: Craft, when: &str) -> Done {
    let who = format!("pid {} ({})", target.pid, target.name());
    let now = Proc::read(target.pid).filter(|p| p.start_time == target.start_time && p.name() != target.name());
    let now = now.map_or(String::new(), |p| format!(", now {}", p.name()));
    d.counters.session(Outcome::TargetExec);
    say!("{who} replaced its program (exec{now}) {when} ({}): the agent and what it gathered went with the old program", craft.name());
    let note = format!(
        "{who} replaced its program (exec{now}) {when}: the agent and what it gathered went with the old program, so there is no profile; the process runs on"
    );
    Done { outcome: Outcome::TargetExec, profile: None, meta: None, note: Some(note) }
}
