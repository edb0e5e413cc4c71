//! What a program started from a shell inherits that witch's own runtime
//! changes before `main`, so that the program witch runs can be started
//! as it would have been: the Rust runtime opens `/dev/null` on a closed
//! standard descriptor (0, 1, 2) and sets SIGPIPE to default in a child it
//! spawns (having ignored it for itself). A constructor of witch's
//! ([`Inherited::now`], before the runtime starts) notes them; the child,
//! between fork and exec, puts them back ([`Inherited::restore`]).

/// The state witch was started in, as far as the program would see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inherited {
    /// Bit `fd` for each standard descriptor that was closed.
    pub closed_std_fds: u8,
    /// SIGPIPE was ignored (a program then gets EPIPE from a write to a
    /// closed pipe instead of dying).
    pub sigpipe_ignored: bool,
}

impl Inherited {
    /// The calling process's state now.
    pub fn now() -> Inherited {
        let mut closed = 0u8;
        for fd in 0..3 {
            // SAFETY: F_GETFD reads a descriptor's flags; a closed one fails with EBADF.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
                closed |= 1 << fd;
            }
        }
        // SAFETY: a query (no new action) of SIGPIPE's disposition into a zeroed sigaction.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
        };
        Inherited { closed_std_fds: closed, sigpipe_ignored: ignored }
    }

    /// Put it back, in a child between fork and exec: the descriptors
    /// closed, SIGPIPE ignored. Async-signal-safe (`close` and `signal`).
    pub fn restore(&self) {
        for fd in 0..3 {
            if self.closed_std_fds & (1 << fd) != 0 {
                // SAFETY: closing a standard descriptor of this (child) process.
                unsafe { libc::close(fd) };
            }
        }
        if self.sigpipe_ignored {
            // SAFETY: sets one signal's disposition.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        }
    }

    /// Anything to put back?
    pub fn changed(&self) -> bool {
        *self != Inherited::default()
    }
}
