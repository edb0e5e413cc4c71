//! The end of a session, for `witch --pid` and witchd's sessions alike:
//! detach, then say how it ended. Each caller keeps its own reaction
//! (messages, exit codes, counters); which facts mean what, and in which
//! order they are asked, is here, once (as [`super::poll`] is for the
//! polls during a session).
//!
//! The rule, in order:
//! - the process the session was attached to is gone (it exited, or its
//!   pid now names another process), or the last poll saw it exit: it
//!   **exited**, with its profile if the agent sent one first;
//! - no profile, and the process replaced its program (exec): a poll saw
//!   the new image, or the agent is gone from the maps (an exec that kept
//!   the layout), or the image differs now: **replaced**; the agent and
//!   what it gathered went with the old program;
//! - a profile: **profiled**, saying whether the process replaced its
//!   program after the agent had sent it (the agent that saw the exec
//!   coming says so in the profile, `ended_by`);
//! - else the session **failed**, with why.

use super::{Ended, SessionFacts, Why};
use anyhow::{anyhow, Result};
use std::time::Duration;
use witchcraft::profile::Profile;
use witchcraft::sys::procfs::{Image, Stat};

/// A session running inside a target: what a poll asks of it
/// ([`SessionFacts`]), and its end. [`super::Attachment`] is the real one; witchd's
/// tests fake it.
pub trait Attached: SessionFacts + Send {
    /// The target's pid.
    fn pid(&self) -> i32;
    /// The image the agent was loaded into, as the attach found it.
    fn image(&self) -> Option<Image>;
    /// The target's start time (clock ticks since boot, `/proc/PID/stat`)
    /// as the attach found it: with the pid, its identity.
    fn start_time(&self) -> Option<u64>;
    /// Ask the agent to stop and wait (at most `timeout`) for its profile.
    fn detach(self: Box<Self>, timeout: Duration) -> Result<Ended>;
}

/// How a session ended.
#[derive(Debug)]
pub enum End {
    /// The agent's profile.
    Profiled {
        profile: Box<Profile>,
        /// The target exited during the session: this is its last profile.
        target_exited: bool,
        /// The process replaced its program (exec) during the session.
        exec: bool,
    },
    /// The target exited (or was killed) before its agent sent a profile.
    Exited,
    /// The target replaced its program (exec) and its agent, with what it
    /// gathered, went with the old one; the process runs on.
    Replaced,
    /// No profile for another reason.
    Failed(anyhow::Error),
}

/// At most this long to wait for a profile from a session whose target is
/// gone or replaced its program: what it sent has come already, or never
/// will.
pub const GONE_TIMEOUT: Duration = Duration::from_secs(2);

/// Detach `session`, which a poll ended for `why` (None: its time was up,
/// or it was interrupted), waiting at most `timeout` for the agent, and say
/// how it ended.
pub fn end(session: Box<dyn Attached>, why: Option<Why>, timeout: Duration) -> End {
    let (pid, image) = (session.pid(), session.image());
    let died = why == Some(Why::Exited);
    // An exec that kept the image's layout (address randomization off)
    // shows only as the agent missing from the maps. A poll reads them
    // (long to read) only once it saw the agent's socket closed, and the
    // session may have ended (its time up) before a poll saw that: read
    // them now, before the detach.
    let exec = why == Some(Why::Exec) || (!died && session.agent_gone());
    let start = session.start_time();
    let timeout = if died || exec { timeout.min(GONE_TIMEOUT) } else { timeout };
    // Asked after the detach, of the process as it is then.
    let replaced = || exec || Image::changed(pid, image);
    let gone = || !same_process(pid, start);
    match session.detach(timeout) {
        Err(e) => {
            if died || gone() {
                End::Exited
            } else if replaced() {
                End::Replaced
            } else {
                End::Failed(e)
            }
        }
        Ok(Ended { profile: None, target_exited }) => {
            if died || target_exited || gone() {
                End::Exited
            } else if replaced() {
                End::Replaced
            } else {
                End::Failed(anyhow!("the agent in pid {pid} ended without a profile"))
            }
        }
        Ok(Ended { profile: Some(profile), target_exited }) => {
            let target_exited = died || target_exited;
            End::Profiled { profile: Box::new(profile), target_exited, exec: !target_exited && replaced() }
        }
    }
}

/// Is process `pid` the one that started at `start` (pids are reused), and
/// still running (not a zombie)? Without a start time, whether it runs.
pub fn same_process(pid: i32, start: Option<u64>) -> bool {
    super::alive(pid) && start.is_none_or(|t| Stat::read(pid).is_some_and(|s| s.start_time == t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session whose facts are set: the process is this test's own (alive,
    /// its image as read) or a reaped child's (gone).
    struct FixedSession {
        pid: i32,
        image: Option<Image>,
        gone_agent: bool,
        detached: Result<Ended, &'static str>,
    }

    impl SessionFacts for FixedSession {
        fn target_alive(&self) -> bool {
            super::super::alive(self.pid)
        }
        fn exec_seen(&self) -> bool {
            false
        }
        fn agent_ended(&self) -> bool {
            false
        }
        fn agent_closed(&self) -> bool {
            false
        }
        fn agent_gone(&self) -> bool {
            self.gone_agent
        }
    }

    impl Attached for FixedSession {
        fn pid(&self) -> i32 {
            self.pid
        }
        fn image(&self) -> Option<Image> {
            self.image
        }
        fn start_time(&self) -> Option<u64> {
            Stat::read(std::process::id() as i32).map(|s| s.start_time)
        }
        fn detach(self: Box<Self>, _: Duration) -> Result<Ended> {
            self.detached.map_err(|e| anyhow!(e))
        }
    }

    fn me(detached: Result<Ended, &'static str>) -> FixedSession {
        let pid = std::process::id() as i32;
        FixedSession { pid, image: Image::of(pid), gone_agent: false, detached }
    }

    fn profile() -> Ended {
        Ended { profile: Some(crate::daemon::store::tests_support::profile(1, 0, 0)), target_exited: false }
    }

    fn none() -> Ended {
        Ended { profile: None, target_exited: false }
    }

    fn of(f: FixedSession, why: Option<Why>) -> &'static str {
        match end(Box::new(f), why, Duration::from_secs(1)) {
            End::Profiled { target_exited: true, .. } => "profiled, exited",
            End::Profiled { exec: true, .. } => "profiled, exec",
            End::Profiled { .. } => "profiled",
            End::Exited => "exited",
            End::Replaced => "replaced",
            End::Failed(_) => "failed",
        }
    }

    #[test]
    fn each_ending_by_one_rule() {
        // A profile from a process that runs on as it was.
        assert_eq!(of(me(Ok(profile())), None), "profiled");
        // A poll saw it exit: its profile is its last.
        assert_eq!(of(me(Ok(profile())), Some(Why::Exited)), "profiled, exited");
        // A poll saw the exec, the agent's profile came first (it saw the exec coming).
        assert_eq!(of(me(Ok(profile())), Some(Why::Exec)), "profiled, exec");
        // No profile: an exec a poll saw, or one that kept the layout (the
        // agent gone from the maps, asked before the detach), or a new image
        // found only after the detach.
        assert_eq!(of(me(Ok(none())), Some(Why::Exec)), "replaced");
        assert_eq!(of(FixedSession { gone_agent: true, ..me(Ok(none())) }, None), "replaced");
        assert_eq!(of(FixedSession { image: Some(Image([1; 6])), ..me(Ok(none())) }, None), "replaced");
        // No profile, nothing changed: a failure, also when the detach failed.
        assert_eq!(of(me(Ok(none())), None), "failed");
        assert_eq!(of(me(Err("stuck")), None), "failed");
        // A detach that failed after a poll saw the exec: replaced.
        assert_eq!(of(me(Err("stuck")), Some(Why::Exec)), "replaced");
        // The agent said the process exited.
        assert_eq!(of(me(Ok(Ended { profile: None, target_exited: true })), None), "exited");
    }

    #[test]
    fn a_process_gone_or_reused_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        for detached in [Ok(none()), Err("no answer")] {
            let f = FixedSession { pid, image: None, gone_agent: false, detached };
            assert_eq!(of(f, None), "exited");
        }
        // Its pid, another process (another start time).
        assert!(!same_process(std::process::id() as i32, Some(0)));
        assert!(same_process(std::process::id() as i32, None));
    }
}
