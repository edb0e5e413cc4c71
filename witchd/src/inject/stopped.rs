//! A process stopped (SIGSTOP, job control) when its session ends: every
//! thread is stopped, the agent's control thread too, so the agent cannot
//! send its profile, and the whole session would be lost.
//!
//! The controller lends the agent's thread a run of its own: it takes that
//! one thread with ptrace (`PTRACE_SEIZE` of a thread in a group stop turns
//! the stop into a ptrace stop) and resumes it alone, while the program's
//! threads stay stopped. The agent sends its profile, undoes what it did
//! and its thread ends (reaped here), or, if it is still there when the
//! controller is done, it is let go (`PTRACE_DETACH`), and the kernel puts
//! it back into the group stop. Either way the process is as stopped
//! afterwards as it was, and continues when whoever stopped it says so.
//!
//! While the thread is lent, any stop it makes the controller see (a signal
//! sent to the process, a new group stop) is passed on and the thread
//! resumed: [`Lent::tend`], called while waiting for the agent.

use anyhow::{bail, Result};
use std::time::{Duration, Instant};
use witchcraft::sys::procfs;

/// The agent's thread of a stopped process, taken and running.
pub struct Lent {
    tid: i32,
    /// It ended (and was reaped): nothing to let go.
    gone: bool,
}

/// The agent's control thread in process `pid`, by its name.
fn agent_thread(pid: i32) -> Option<i32> {
    procfs::tasks(Some(pid)).into_iter().find(|t| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).is_ok_and(|c| c.trim_end() == witchcraft::session::AGENT_THREAD)
    })
}

/// How long the kernel may take to turn a group stop into a ptrace stop.
const TRAP_WAIT: Duration = Duration::from_secs(2);

/// Waits (at most `limit`) for a state change of traced thread `tid`.
fn wait(tid: i32, limit: Duration) -> Option<i32> {
    let until = Instant::now() + limit;
    loop {
        let mut st = 0;
        // SAFETY: waitpid on a thread this thread traces; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(tid, &mut st, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            return Some(st);
        }
        if r < 0 || Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Lent {
    /// Takes and resumes the agent's thread of stopped process `pid`.
    pub fn take(pid: i32) -> Result<Lent> {
        let Some(tid) = agent_thread(pid) else { bail!("its agent's thread is not there") };
        // SAFETY: plain ptrace requests on a thread of a process this
        // controller attached to (the same right).
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
            bail!("cannot take its agent's thread: {}", std::io::Error::last_os_error());
        }
        let mut lent = Lent { tid, gone: false };
        match wait(tid, TRAP_WAIT) {
            Some(st) if libc::WIFSTOPPED(st) => {}
            Some(_) => {
                lent.gone = true;
                bail!("its agent's thread ended as it was taken");
            }
            // Not stopped after all (continued meanwhile): it runs; let it be.
            None => return Ok(lent),
        }
        // SAFETY: resumes our tracee, with no signal.
        if unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, 0) } != 0 {
            bail!("cannot resume its agent's thread: {}", std::io::Error::last_os_error());
        }
        Ok(lent)
    }

    /// Reaps the thread if it ended; resumes it past any stop it made
    /// (passing on the signal that caused it). Call it while waiting.
    pub fn tend(&mut self) {
        while !self.gone {
            let Some(st) = wait(self.tid, Duration::ZERO) else { return };
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                self.gone = true;
                return;
            }
            // A group stop (PTRACE_EVENT_STOP) takes no signal; a signal stop gives its own back.
            let sig = if st >> 16 == libc::PTRACE_EVENT_STOP { 0 } else { libc::WSTOPSIG(st) };
            // SAFETY: resumes our tracee.
            unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid, 0, sig) };
        }
    }

    /// The thread ended (and was reaped).
    pub fn gone(&self) -> bool {
        self.gone
    }
}

impl Drop for Lent {
    /// Lets the thread go: stopped first (a tracee is let go only from a
    /// stop), then detached; the kernel returns it to the group stop if
    /// the process is still stopped.
    fn drop(&mut self) {
        self.tend();
        if self.gone {
            return;
        }
        // SAFETY: ptrace requests on our own tracee.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0) };
        let until = Instant::now() + TRAP_WAIT;
        while Instant::now() < until {
            match wait(self.tid, Duration::from_millis(50)) {
                Some(st) if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) => return,
                Some(st) if libc::WIFSTOPPED(st) => {
                    let sig = if st >> 16 == libc::PTRACE_EVENT_STOP { 0 } else { libc::WSTOPSIG(st) };
                    // SAFETY: detaches our tracee from a stop, passing on a signal it stopped for.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, sig) };
                    return;
                }
                _ => {}
            }
        }
        // No stop came (it may be exiting): the kernel detaches it when this thread is done with it.
        // SAFETY: as above; fails harmlessly if it is not in a stop.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0) };
    }
}
