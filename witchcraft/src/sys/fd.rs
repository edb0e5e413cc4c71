//! Descriptors opened inside a profiled program: kept out of its way, and
//! never closed unless still ours.
//!
//! A program counts on its descriptor numbers: `open` returns the lowest
//! free one, `select` takes only numbers below 1024, and a sandboxed
//! program lowers its RLIMIT_NOFILE to what it needs. Once [`reserve_top`]
//! has run (the agent calls it when it starts), every descriptor opened
//! through [`place`] moves to the top of the range the program had then
//! (at most up to [`TOP`]), close-on-exec, and one that cannot go there is
//! refused rather than taken from the numbers below. When those numbers
//! are all taken (four watchpoints a thread fill 1,024 numbers at 256
//! threads), the range grows upwards, past [`TOP`], as far as the
//! program's limit allows, up to [`TOP_GROWN`]: only a program with that
//! many threads pays for the larger descriptor table.
//!
//! A program may also close descriptors it did not open (daemons close
//! them all when they start) and reuse the numbers. [`close_perf`] closes a
//! perf event's descriptor only if it still is the event that was opened
//! there (its `PERF_EVENT_IOC_ID`), so the engine never closes a file of
//! the program's.
//!
//! Everything here is a plain system call: async-signal-safe.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// The highest descriptor numbers used: the kernel sizes a process's
/// descriptor table by its highest open number, so a program whose limit
/// is a million is not made to carry a table that size.
pub const TOP: i32 = 4096;
/// How many numbers below the top are reserved (at most half the range).
pub const SPAN: i32 = 1024;
/// How far the range grows upwards once full (the program's limit
/// allowing): room for about 3,300 threads' watchpoints, for a
/// descriptor table of 128 KiB in the kernel.
pub const TOP_GROWN: i32 = 16384;

/// Lowest number [`place`] uses; -1: descriptors stay where the kernel puts them.
static FLOOR: AtomicI32 = AtomicI32::new(-1);
static CEILING: AtomicI32 = AtomicI32::new(-1);
/// How far the range may grow (see the module comment).
static GROWN: AtomicI32 = AtomicI32::new(-1);

/// Perf event ids (plus one) by descriptor number, for [`close_perf`].
const TRACKED: usize = TOP_GROWN as usize;
static IDS: [AtomicU64; TRACKED] = [const { AtomicU64::new(0) }; TRACKED];

/// Reserve the top of the descriptor range the process has now; returns
/// the range `[floor, ceiling)`.
pub fn reserve_top() -> (i32, i32) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    let ceiling = (r.rlim_cur.min(TOP as u64)) as i32;
    let floor = ceiling - SPAN.min(ceiling / 2);
    GROWN.store((r.rlim_cur.min(TOP_GROWN as u64)) as i32, Ordering::Release);
    FLOOR.store(floor, Ordering::Release);
    CEILING.store(ceiling, Ordering::Release);
    (floor, ceiling)
}

/// The reserved range, if any.
pub fn reserved() -> Option<(i32, i32)> {
    let f = FLOOR.load(Ordering::Acquire);
    (f >= 0).then(|| (f, CEILING.load(Ordering::Acquire)))
}

/// The reserved range as far as it may grow, if any: `[floor, top)`.
pub fn reserved_grown() -> Option<(i32, i32)> {
    reserved().map(|(f, c)| (f, GROWN.load(Ordering::Acquire).max(c)))
}

/// Is `fd` in the reserved range (as far as it may grow), so witch's?
/// Async-signal-safe.
pub fn is_reserved(fd: i32) -> bool {
    reserved_grown().is_some_and(|(lo, hi)| (lo..hi).contains(&fd))
}

/// Move `fd` into the reserved range, close-on-exec. Returns the new
/// number, or the errno (and `fd` is closed) if the range is full or the
/// program's limit no longer reaches it. Without a reserved range, `fd`.
pub fn place(fd: i32) -> Result<i32, i32> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    let Some((floor, ceiling)) = reserved_grown() else { return Ok(fd) };
    if (floor..ceiling).contains(&fd) {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor we own; then the original is closed.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) };
    let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE);
    // SAFETY: `fd` is ours (just opened by the caller).
    unsafe { libc::close(fd) };
    if new < 0 {
        // EINVAL: the program's limit is now below the range.
        return Err(if err == libc::EINVAL { libc::EMFILE } else { err });
    }
    if new >= ceiling {
        // SAFETY: the duplicate just made.
        unsafe { libc::close(new) };
        return Err(libc::EMFILE);
    }
    Ok(new)
}

fn perf_id(fd: i32) -> Option<u64> {
    let mut id = 0u64;
    // SAFETY: PERF_EVENT_IOC_ID writes one u64; a descriptor that is not a perf event fails.
    let r = unsafe { perf_event_open_sys::ioctls::ID(fd, &mut id) };
    (r == 0).then_some(id)
}

/// Remember perf event `fd` as ours.
pub fn own_perf(fd: i32) {
    if let (Some(slot), Some(id)) = (IDS.get(fd as usize), perf_id(fd)) {
        slot.store(id + 1, Ordering::Release);
    }
}

/// Close perf event `fd` if it still is the event [`own_perf`] recorded
/// there; a number the program closed and reused is left alone.
pub fn close_perf(fd: i32) {
    if fd < 0 {
        return;
    }
    let ours = match IDS.get(fd as usize) {
        Some(slot) => {
            let want = slot.swap(0, Ordering::AcqRel);
            want != 0 && perf_id(fd) == Some(want - 1)
        }
        // Beyond the tracked numbers (no range reserved): as the caller says.
        None => true,
    };
    if ours {
        // SAFETY: the descriptor is the event we opened.
        unsafe { libc::close(fd) };
    }
}

/// What descriptor `fd` refers to (device and inode), to tell later
/// whether the number still holds the same file.
pub fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (fd >= 0 && unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Does `fd` still refer to the file [`identity`] saw? (A program may have
/// closed the number and opened something of its own there.)
pub fn still(fd: i32, id: (u64, u64)) -> bool {
    identity(fd) == Some(id)
}

/// Close a descriptor of ours that is not a perf event (the caller knows
/// the program cannot have reused it, or accepts that it may have).
pub fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: the caller owns `fd`.
        unsafe { libc::close(fd) };
    }
}

/// A connected pair of `SOCK_SEQPACKET` sockets (datagrams kept whole and
/// in order), close-on-exec.
pub fn seqpacket_pair() -> std::io::Result<(i32, i32)> {
    let mut sv = [-1i32; 2];
    // SAFETY: `sv` has room for the two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((sv[0], sv[1]))
}

/// Keep `fd` open across exec (clear its close-on-exec flag).
pub fn inherit(fd: i32) -> bool {
    // SAFETY: fcntl on a descriptor number; fails harmlessly if it is not open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) == 0 }
}

/// Send `data` as one datagram, waiting while the reader is behind.
/// Async-signal-safe. False if the socket is gone.
pub fn send_datagram(fd: i32, data: &[u8]) -> bool {
    loop {
        // SAFETY: `data` is readable for its length.
        let r = unsafe { libc::send(fd, data.as_ptr() as *const libc::c_void, data.len(), libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return true;
        }
        // SAFETY: reads this thread's errno.
        if unsafe { *libc::__errno_location() } != libc::EINTR {
            return false;
        }
    }
}

/// Receive one datagram into `buf`, waiting at most `timeout_ms` for one
/// (-1: until one comes). Ok(None): none came in time; Ok(Some(0)): the
/// other end is closed and nothing is left.
pub fn recv_datagram(fd: i32, buf: &mut [u8], timeout_ms: i32) -> std::io::Result<Option<usize>> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one pollfd.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(None);
        }
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                _ => return Err(e),
            }
        }
        return Ok(Some(n as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::perf::{Attr, SoftwareClock};

    #[test]
    fn perf_descriptors_are_closed_only_while_still_ours() {
        let fd = Attr::software_clock(SoftwareClock::Task, 1_000_000).open(0).expect("task-clock");
        // The program closes it and reuses the number for a file of its own.
        // SAFETY: test-local descriptors.
        unsafe { libc::close(fd) };
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let reused = std::os::fd::AsRawFd::as_raw_fd(&file);
        if reused == fd {
            close_perf(fd);
            // SAFETY: F_GETFD only reads the flags.
            assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0, "close_perf closed a reused number");
        }
        drop(file);
        let fd = Attr::software_clock(SoftwareClock::Task, 1_000_000).open(0).expect("task-clock");
        close_perf(fd);
        // SAFETY: as above.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0, "close_perf left our own event open");
    }
}
