//! An attach session's process-wide state, with one owner: [`SESSION`]
//! (whether a session runs and in which process, its control thread, the
//! controller's end of the socket until the controller takes it, the one
//! sender on the socket), and how a thread of the program ends the session
//! before it does what the agent cannot stay for ([`Session::leave`]).
//! Below the attached mode (`attach.rs`, which runs the session) so that
//! the interposers and the profile's delivery reach it without calling up.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;
use witchcraft::profile::EndedBy;
use witchcraft::session::Message;
use witchcraft::sys::task;

/// What a thread of the program is about to do that ends the session.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Leave {
    /// Enter a sandbox (seccomp, syscall user dispatch), as this says:
    /// its filter may kill the process for a system call the agent makes.
    Sandbox(&'static str),
    /// Replace its program (an exec): the agent, and what it gathered, go
    /// with the old image.
    Exec(&'static str),
    /// Open hardware breakpoints of its own, which need the debug
    /// registers witch holds (as a debugger does).
    Breakpoints,
}

impl Leave {
    /// The profile's `ended_by`, and the exec call that ended it.
    pub fn ended_by(self) -> (EndedBy, Option<&'static str>) {
        match self {
            Leave::Sandbox(_) => (EndedBy::Sandbox, None),
            Leave::Exec(call) => (EndedBy::Exec, Some(call)),
            Leave::Breakpoints => (EndedBy::Traced, None),
        }
    }

    /// The profile's note, `after` seconds into the session (None: before
    /// it began, so there is no profile).
    pub fn note(self, after: Option<f64>) -> String {
        let ended = match after {
            Some(s) => format!("the session ended {s:.3} s in"),
            None => "the session did not start".to_string(),
        };
        match (self, after) {
            (Leave::Sandbox(how), _) => format!(
                "{ended}: the program put itself in {how}, whose filter may kill it for a system call the agent makes; the process runs on"
            ),
            (Leave::Exec(how), Some(_)) => {
                format!("{ended}, as the process called {how} to replace its program: this profile is of the program before")
            }
            (Leave::Exec(how), None) => format!("{ended}: the process called {how} to replace its program"),
            (Leave::Breakpoints, _) => format!(
                "{ended}: the program opened a hardware breakpoint of its own (perf_event_open), which needs the debug registers; they and the signals are left to it"
            ),
        }
    }
}

/// How long a thread that ends the session ([`Session::leave`]) waits for
/// it to end (the control thread's poll, the threads' leave, the profile sent).
const LEAVE_CALL_WAIT: Duration = Duration::from_secs(3);

/// The attach session of this process (one at a time).
pub struct Session {
    /// A session runs (from `witch_session_start` to the control thread's end).
    running: AtomicBool,
    /// The process the session runs in (a fork child inherits `running`
    /// set, but not the control thread).
    pid: AtomicI32,
    /// The control thread's tid while it runs (0: none).
    control_tid: AtomicI32,
    /// A thread of the program is about to do what ends the session now
    /// (see [`Session::leave`]).
    leaving: Mutex<Option<Leave>>,
    /// The controller's end of the socket, from the session's start until
    /// the control thread closes its copy (-1: none).
    controller_end: AtomicI32,
    /// Sends on the session socket come from the control thread and, at
    /// exit, from the exiting thread: one message at a time.
    sending: Mutex<()>,
    /// The exit handler that sends a session's profile at exit: registered
    /// with the C library once per process (the library stays loaded), so
    /// never reset.
    at_exit: Once,
}

pub static SESSION: Session = Session::new();

impl Session {
    const fn new() -> Session {
        Session {
            running: AtomicBool::new(false),
            pid: AtomicI32::new(0),
            control_tid: AtomicI32::new(0),
            leaving: Mutex::new(None),
            controller_end: AtomicI32::new(-1),
            sending: Mutex::new(()),
            at_exit: Once::new(),
        }
    }

    /// Claim the process's one session: false if one runs. Everything
    /// else starts afresh here (an exec that failed after it ended an
    /// earlier session ends no other).
    pub fn begin(&self) -> bool {
        if self.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.pid.store(std::process::id() as i32, Ordering::Release);
        self.control_tid.store(0, Ordering::Release);
        self.controller_end.store(-1, Ordering::Release);
        *self.leaving.lock().unwrap_or_else(|e| e.into_inner()) = None;
        true
    }

    /// The session is over (or never started): another may begin.
    pub fn end(&self) {
        self.running.store(false, Ordering::Release);
    }

    /// In a fork child (its `pthread_atfork` handler; async-signal-safe):
    /// the child runs no session, whatever its parent ran (the control
    /// thread is not there), so one may begin in it; its copy of a
    /// controller's end not yet taken is closed.
    pub fn forget_in_fork_child(&self) {
        let end = self.controller_end.swap(-1, Ordering::AcqRel);
        if end >= 0 {
            witchcraft::sys::fd::close(end);
        }
        self.control_tid.store(0, Ordering::Release);
        self.running.store(false, Ordering::Release);
    }

    /// The calling thread is the session's control thread.
    pub fn set_control_thread(&self) {
        self.control_tid.store(task::gettid(), Ordering::Release);
    }

    pub fn controller_end(&self) -> i32 {
        self.controller_end.load(Ordering::Acquire)
    }

    pub fn set_controller_end(&self, fd: i32) {
        self.controller_end.store(fd, Ordering::Release);
    }

    /// The one sender on the session socket, held while sending.
    pub fn sending(&self) -> MutexGuard<'_, ()> {
        self.sending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register `f` to run at exit, once per process.
    pub fn at_exit(&self, f: extern "C" fn()) {
        // SAFETY: registers a plain extern "C" function.
        self.at_exit.call_once(|| unsafe {
            libc::atexit(f);
        });
    }

    /// Send `m` on the session socket `fd` (any thread but a handler; the
    /// caller checked `fd` still is the socket).
    fn send(&self, fd: i32, m: &Message) -> bool {
        let _one = self.sending();
        let bytes = m.encode();
        let mut done = 0;
        while done < bytes.len() {
            // SAFETY: the slice is valid for its length; MSG_NOSIGNAL: no SIGPIPE for the program.
            let n = unsafe { libc::send(fd, bytes[done..].as_ptr() as *const libc::c_void, bytes.len() - done, libc::MSG_NOSIGNAL) };
            if n > 0 {
                done += n as usize;
            } else if !(n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)) {
                return false;
            }
        }
        true
    }

    /// Deliver the session's profile (the process exits, or the session ends).
    pub fn send_profile(&self, fd: i32, bytes: Vec<u8>) -> std::io::Result<()> {
        if self.send(fd, &Message::Profile(bytes)) {
            Ok(())
        } else {
            Err(std::io::Error::other("the controller is gone"))
        }
    }

    /// What a thread of the program is about to do that ends the session.
    pub fn leaving(&self) -> Option<Leave> {
        *self.leaving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread of the program is about to do what ends the session
    /// (`why`): end it here, as a detach the agent chose (`ended_by` "sandbox"
    /// or "exec", a note, the profile sent, handlers given back), and return
    /// once the control thread has exited: a seccomp filter (which may go on
    /// every thread: `SECCOMP_FILTER_FLAG_TSYNC`) finds no thread of the
    /// agent's making a system call, and an exec finds the profile sent. This
    /// thread spins meanwhile. Entering a sandbox, the agent's handlers make no system call afterwards
    /// (`Agent::sandboxed`: the caller sets it when this returns true). Nothing happens without a session in this process
    /// (a fork child inherits the flag, not the session; a vfork child has a
    /// pid of its own). Not for handlers. The session is over even if the call
    /// then fails.
    pub fn leave(&self, why: Leave) -> bool {
        if !self.running.load(Ordering::Acquire) || self.pid.load(Ordering::Acquire) != std::process::id() as i32 {
            return false;
        }
        let control = self.control_tid.load(Ordering::Acquire);
        if control == task::gettid() {
            return false;
        }
        *self.leaving.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        let until = task::Deadline::after(LEAVE_CALL_WAIT);
        let mut spins = 0u32;
        while !until.passed() {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            // Whether the control thread is still there: a system call, now and then.
            if spins.is_multiple_of(4096) && !(self.running.load(Ordering::Acquire) || control != 0 && task::tgkill(control, 0)) {
                break;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Leave;

    /// A leave that comes before the session began says so, instead of
    /// "ended 0.000 s in" (and promises no profile).
    #[test]
    fn a_leave_before_the_session_says_it_did_not_start() {
        let before = Leave::Exec("execve").note(None);
        assert_eq!(before, "the session did not start: the process called execve to replace its program");
        let during = Leave::Exec("execl").note(Some(0.712));
        assert!(during.starts_with("the session ended 0.712 s in, as the process called execl"), "{during}");
        let bp = Leave::Breakpoints.note(Some(1.5));
        assert!(bp.starts_with("the session ended 1.500 s in: the program opened a hardware breakpoint"), "{bp}");
        assert_eq!(Leave::Breakpoints.ended_by(), (witchcraft::profile::EndedBy::Traced, None));
        assert!(Leave::Sandbox("a seccomp sandbox (prctl)")
            .note(None)
            .starts_with("the session did not start: the program put itself in a seccomp sandbox"));
    }
}
