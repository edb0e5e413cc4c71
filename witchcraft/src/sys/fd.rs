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

/// Close every perf event [`own_perf`] recorded that is still there (as
/// [`close_perf`]). In a fork child of a process attached to: its copies
/// of the session's events, which would otherwise keep them open, and the
/// parent's debug registers taken, for as long as the child lives.
pub fn close_all_perf() {
    for (fd, slot) in IDS.iter().enumerate() {
        if slot.load(Ordering::Acquire) != 0 {
            close_perf(fd as i32);
        }
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
    send_message(fd, data, None)
}

/// A new anonymous shared-memory file of `bytes` bytes (`memfd_create`,
/// close-on-exec), for a mapping another process maps too. Async-signal-
/// safe. Err: the errno.
pub fn memfd(name: &std::ffi::CStr, bytes: u64) -> Result<i32, i32> {
    // SAFETY: a NUL-terminated name and flags; the system call, not the C
    // library's wrapper (which older C libraries lack).
    let fd = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), libc::MFD_CLOEXEC) } as i32;
    // SAFETY: reads this thread's errno.
    let errno = || unsafe { *libc::__errno_location() };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: sizes the file just made.
    if unsafe { libc::ftruncate(fd, bytes as libc::off_t) } != 0 {
        let e = errno();
        close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Send `data` as one datagram with descriptor `passed` attached
/// (`SCM_RIGHTS`): the receiver gets its own copy. Waits while the reader
/// is behind. Async-signal-safe (the control message is on the stack).
/// False if the socket is gone.
pub fn send_datagram_with_fd(fd: i32, data: &[u8], passed: i32) -> bool {
    send_message(fd, data, Some(passed))
}

/// Room for a control message carrying one descriptor, aligned for
/// `cmsghdr`: what both `sendmsg` and `recvmsg` below pass.
#[repr(C, align(8))]
struct CmsgSpace([u8; 64]);

/// One datagram of `data`, with descriptor `passed` attached if any; the
/// one `sendmsg` loop of both senders above. Async-signal-safe.
fn send_message(fd: i32, data: &[u8], passed: Option<i32>) -> bool {
    let mut control = CmsgSpace([0; 64]);
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(passed) = passed {
        msg.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
        // SAFETY: the control buffer holds one header and one descriptor
        // (CMSG_SPACE of an int is at most 24 bytes of its 64).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, passed);
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the call.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return true;
        }
        // SAFETY: reads this thread's errno.
        if unsafe { *libc::__errno_location() } != libc::EINTR {
            return false;
        }
    }
}

/// Has the other end of connected socket `fd` closed (or failed)? Does
/// not wait. Async-signal-safe.
pub fn peer_gone(fd: i32) -> bool {
    let mut p = libc::pollfd { fd, events: 0, revents: 0 };
    // SAFETY: one pollfd; a zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Receive one datagram into `buf`, with the descriptor it carries, if
/// any (close-on-exec; the caller owns it), waiting at most `timeout_ms`
/// for one (-1: until one comes). Ok(None): none came in time;
/// Ok(Some((0, None))): the other end is closed and nothing is left.
pub fn recv_datagram_fd(fd: i32, buf: &mut [u8], timeout_ms: i32) -> std::io::Result<Option<(usize, Option<i32>)>> {
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
        let mut control = CmsgSpace([0; 64]);
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.0.len();
        // SAFETY: `msg` points at live, writable buffers for the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                _ => return Err(e),
            }
        }
        let mut passed = None;
        // SAFETY: walks the control messages the kernel wrote into `control`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let fds = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<i32>();
                    for i in 0..fds {
                        let d = std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const i32).add(i));
                        // One descriptor is expected; any more are closed.
                        if passed.is_none() {
                            passed = Some(d);
                        } else {
                            close(d);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok(Some((n as usize, passed)));
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
