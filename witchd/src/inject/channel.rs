//! The controller's end of a session's socket (the protocol is
//! `witchcraft::session`): taken out of the target with `pidfd_getfd`, and
//! read on a thread of its own so that every wait here has a deadline and
//! the target can never make the controller block or hold unbounded data.

use anyhow::{anyhow, bail, Result};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Mutex};
use std::time::Duration;
use witchcraft::session::{Decoder, Message};

/// Most messages a session may send (a few in practice).
const MAX_MESSAGES: usize = 64;
/// Most bytes a session may send (two profiles' worth).
const MAX_BYTES: usize = 2 * witchcraft::session::MAX_PROFILE + (1 << 20);
/// Longest a send may block (the agent reads its socket every 50 ms).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// What the reader saw.
pub enum Incoming {
    Message(Message),
    /// The agent's end closed (the session is over, or the target exited),
    /// or it sent something that is not the protocol (why).
    Closed(Option<String>),
}

/// The controller's end of the session socket (the agent's is the agent's
/// `channel::AgentEnd`).
pub struct ControllerEnd {
    sock: UnixStream,
    rx: mpsc::Receiver<Incoming>,
    /// Events read ahead by [`ControllerEnd::closed`], for [`ControllerEnd::recv`].
    early: Mutex<VecDeque<Incoming>>,
}

/// A pidfd for `pid`: it names that process, not whatever reuses the pid.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd> {
    match witchcraft::sys::task::pidfd_open(pid) {
        // SAFETY: a fresh descriptor we own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(libc::ENOSYS) => bail!("attaching needs Linux 5.6 or later (pidfd_open, pidfd_getfd)"),
        Err(e) => bail!("cannot open pid {pid}: {}", std::io::Error::from_raw_os_error(e)),
    }
}

impl ControllerEnd {
    /// Copy the target's descriptor `fd` into this process (`pidfd_getfd`,
    /// which needs the right to ptrace it) and check it is the session's
    /// socket: a Unix stream socket made by that very process.
    pub fn take(pidfd: &OwnedFd, pid: i32, fd: i32) -> Result<ControllerEnd> {
        // SAFETY: plain system call; the result is a new descriptor or -1.
        let mine = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) } as i32;
        if mine < 0 {
            bail!("cannot take the session's socket from pid {pid}: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let owned = unsafe { OwnedFd::from_raw_fd(mine) };
        check_socket(&owned, pid)?;
        let sock = UnixStream::from(owned);
        sock.set_write_timeout(Some(SEND_TIMEOUT))?;
        let reader = sock.try_clone()?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name("witch-session".into()).spawn(move || read_loop(reader, tx))?;
        Ok(ControllerEnd { sock, rx, early: Mutex::new(VecDeque::new()) })
    }

    /// Send `m`; false if the agent is gone or stopped reading.
    pub fn send(&self, m: &Message) -> bool {
        (&self.sock).write_all(&m.encode()).is_ok()
    }

    /// The next event, waiting at most `wait`.
    pub fn recv(&self, wait: Duration) -> Option<Incoming> {
        if let Some(e) = self.early.lock().unwrap().pop_front() {
            return Some(e);
        }
        match self.rx.recv_timeout(wait) {
            Ok(e) => Some(e),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Incoming::Closed(None)),
        }
    }

    /// Has the agent's end closed? Reads what came without waiting, and
    /// keeps it for [`ControllerEnd::recv`].
    pub fn closed(&self) -> bool {
        self.came(|e| matches!(e, Incoming::Closed(_)))
    }

    /// Has an event that `is` came (by now)? Reads what came without
    /// waiting, and keeps it for [`ControllerEnd::recv`].
    pub fn came(&self, is: impl Fn(&Incoming) -> bool) -> bool {
        let mut early = self.early.lock().unwrap();
        loop {
            match self.rx.try_recv() {
                Ok(e) => early.push_back(e),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if !early.iter().any(|e| matches!(e, Incoming::Closed(_))) {
                        early.push_back(Incoming::Closed(None));
                    }
                    break;
                }
            }
        }
        early.iter().any(is)
    }
}

impl Drop for ControllerEnd {
    fn drop(&mut self) {
        // Ends the reader, and tells the agent its controller is gone.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

fn check_socket(fd: &OwnedFd, pid: i32) -> Result<()> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        bail!("pid {pid} did not hand over a socket");
    }
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a ucred of the size given.
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut libc::ucred as *mut libc::c_void, &mut len)
    };
    let mut ty = 0i32;
    let mut tlen = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `ty` is an int of the size given.
    let t =
        unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TYPE, &mut ty as *mut i32 as *mut libc::c_void, &mut tlen) };
    if r != 0 || t != 0 || cred.pid != pid || ty != libc::SOCK_STREAM {
        return Err(anyhow!("pid {pid} handed over a socket that is not its session's"));
    }
    Ok(())
}

fn read_loop(mut sock: UnixStream, tx: mpsc::Sender<Incoming>) {
    let mut d = Decoder::default();
    let mut buf = vec![0u8; 64 << 10];
    let mut count = 0;
    let mut total = 0;
    loop {
        match d.next_message() {
            Ok(Some(m)) => {
                count += 1;
                if count > MAX_MESSAGES {
                    let _ = tx.send(Incoming::Closed(Some("the agent sent too many messages".into())));
                    return;
                }
                if tx.send(Incoming::Message(m)).is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                let _ = tx.send(Incoming::Closed(Some(format!("the agent broke the protocol: {e}"))));
                return;
            }
        }
        // Only what the header says is still missing (bounded per kind).
        let want = match d.wanted() {
            Ok(n) => n.min(buf.len()),
            Err(e) => {
                let _ = tx.send(Incoming::Closed(Some(format!("the agent broke the protocol: {e}"))));
                return;
            }
        };
        match sock.read(&mut buf[..want]) {
            Ok(0) => {
                let _ = tx.send(Incoming::Closed(None));
                return;
            }
            Ok(n) => {
                total += n;
                if total > MAX_BYTES {
                    let _ = tx.send(Incoming::Closed(Some("the agent sent more than a session may".into())));
                    return;
                }
                d.push(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                let _ = tx.send(Incoming::Closed(None));
                return;
            }
        }
    }
}
