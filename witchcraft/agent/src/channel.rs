//! The agent's end of an attach session's socket (the protocol is
//! `witchcraft::session`).

use std::time::Duration;
use witchcraft::session::{Decoder, Message};
use witchcraft::sys::fd as fds;
use witchcraft::sys::task::Deadline;

/// Longest a write may wait for the controller to read: a controller that
/// stopped reading must not hold up the program (its exit, say).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's end of the session socket (the controller's is witchd's
/// `inject::channel::ControllerEnd`).
pub struct AgentEnd {
    fd: i32,
    /// What `fd` refers to: a program that closes every descriptor (and
    /// reuses the numbers) ends the session, and the number is left alone.
    id: (u64, u64),
    decoder: Decoder,
    closed: bool,
}

/// What waiting for a message found.
pub enum Received {
    Message(Message),
    /// Nothing within the wait.
    Nothing,
    /// The controller's end is closed (it exited or gave up), or it spoke
    /// something else than the protocol.
    Closed,
}

impl AgentEnd {
    /// A connected pair: (the agent's end, the end for the controller).
    /// Both are placed out of the program's descriptor range, close-on-exec.
    pub fn pair() -> Option<(AgentEnd, i32)> {
        let mut sv = [-1i32; 2];
        // SAFETY: `sv` has room for the two descriptors.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) } != 0 {
            return None;
        }
        let (ours, theirs) = match (fds::place(sv[0]), fds::place(sv[1])) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                a.into_iter().chain(b).for_each(fds::close);
                return None;
            }
        };
        let tv = libc::timeval { tv_sec: SEND_TIMEOUT.as_secs() as i64, tv_usec: 0 };
        // SAFETY: `tv` is a timeval of the size given.
        unsafe {
            libc::setsockopt(
                ours,
                libc::SOL_SOCKET,
                libc::SO_SNDTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let id = fds::identity(ours).unwrap_or((0, 0));
        Some((AgentEnd { fd: ours, id, decoder: Decoder::default(), closed: false }, theirs))
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Is the descriptor still the session's socket?
    fn ours(&mut self) -> bool {
        if !self.closed && !fds::still(self.fd, self.id) {
            self.closed = true;
            self.fd = -1;
        }
        !self.closed
    }

    /// Send one message; false if the controller is gone or stopped reading.
    pub fn send(&mut self, m: &Message) -> bool {
        if !self.ours() {
            return false;
        }
        let bytes = m.encode();
        let mut done = 0;
        while done < bytes.len() {
            // SAFETY: the slice is valid for its length; MSG_NOSIGNAL: no SIGPIPE for the program.
            let n = unsafe { libc::send(self.fd, bytes[done..].as_ptr() as *const libc::c_void, bytes.len() - done, libc::MSG_NOSIGNAL) };
            if n > 0 {
                done += n as usize;
            } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            } else {
                self.closed = true;
                return false;
            }
        }
        true
    }

    /// Wait at most `wait` for the next message.
    pub fn recv(&mut self, wait: Duration) -> Received {
        let until = Deadline::after(wait);
        loop {
            match self.decoder.next_message() {
                Ok(Some(m)) => return Received::Message(m),
                Ok(None) => {}
                Err(_) => {
                    self.closed = true;
                    return Received::Closed;
                }
            }
            if !self.ours() {
                return Received::Closed;
            }
            let left = until.left();
            let mut p = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if r <= 0 {
                return Received::Nothing;
            }
            let mut buf = [0u8; 4096];
            // SAFETY: reads into `buf`, within its length.
            let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n > 0 {
                self.decoder.push(&buf[..n as usize]);
            } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            } else {
                self.closed = true;
            }
        }
    }

    /// Has the controller's end closed? (Without waiting; messages that
    /// arrived meanwhile stay queued.)
    pub fn controller_gone(&mut self) -> bool {
        if !self.ours() {
            return true;
        }
        let mut p = libc::pollfd { fd: self.fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}

impl Drop for AgentEnd {
    fn drop(&mut self) {
        if self.fd >= 0 && fds::still(self.fd, self.id) {
            fds::close(self.fd);
        }
    }
}
