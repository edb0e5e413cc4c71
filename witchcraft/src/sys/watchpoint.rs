//! The debug registers, as perf breakpoint events.
//!
//! Each of a thread's breakpoints stays open for the thread's lifetime.
//! Arming re-targets it with one `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` ioctl
//! (0.7 µs here for a disabled one, 2.9 µs for an enabled one, against
//! 6.4 µs for close+reopen, which is the fallback: `cargo bench -p
//! witch-benches`); disarming disables it.

use super::perf::{self, Attr, BpType};
use super::siginfo;

/// How a thread's breakpoints are armed: fixed for its lifetime.
#[derive(Clone, Copy, Debug)]
pub struct Arming {
    pub ty: BpType,
    /// Signal with `sigtrap` (else F_SETSIG with the sampler's signal).
    pub sigtrap: bool,
    /// Re-target with `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` (else close+reopen).
    pub modify: bool,
    /// The thread the breakpoints belong to.
    pub tid: i32,
    /// An address never accessed, where a disarmed breakpoint parks.
    pub parking: u64,
}

/// One debug register, held as an open perf breakpoint event.
#[derive(Clone, Copy, Debug)]
pub struct Breakpoint {
    fd: i32,
}

impl Default for Breakpoint {
    fn default() -> Self {
        Breakpoint::CLOSED
    }
}

impl Breakpoint {
    pub const CLOSED: Breakpoint = Breakpoint { fd: -1 };

    fn attr(how: &Arming, tag: u64, addr: u64, len: u64) -> Option<Attr> {
        let a = Attr::breakpoint(addr, len, how.ty).ok()?;
        Some(if how.sigtrap { a.sigtrap(tag) } else { a })
    }

    fn route(fd: i32, how: &Arming) {
        if !how.sigtrap {
            perf::route_signal_to_thread(fd, siginfo::sampler_signal(), how.tid);
        }
    }

    /// Take a debug register for thread `how.tid`, parked and disabled.
    /// `open_tid` is 0 when the thread opens its own, else `how.tid`.
    /// Returns the errno (ENOSPC: all taken).
    pub fn open_parked(how: &Arming, tag: u64, open_tid: i32) -> Result<Breakpoint, i32> {
        let a = Self::attr(how, tag, how.parking, 8).ok_or(libc::EINVAL)?.disabled();
        let fd = a.open(open_tid)?;
        Self::route(fd, how);
        Ok(Breakpoint { fd })
    }

    pub fn is_open(&self) -> bool {
        self.fd >= 0
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Watch `[addr, addr+len)`, enabled, on the calling thread (a
    /// watchpoint is armed from its own thread's handler). Async-signal-safe.
    /// On failure the slot stays usable, parked.
    pub fn retarget(&mut self, how: &Arming, tag: u64, addr: u64, len: u64) -> bool {
        let Some(a) = Self::attr(how, tag, addr, len) else { return false };
        if how.modify && a.modify(self.fd) {
            return true;
        }
        perf::close(self.fd);
        match a.open(0) {
            Ok(fd) => {
                Self::route(fd, how);
                self.fd = fd;
                true
            }
            Err(_) => {
                self.fd = Self::open_parked(how, tag, 0).map(|b| b.fd).unwrap_or(-1);
                false
            }
        }
    }

    /// Stop watching (the event stays open, holding its register).
    pub fn disable(&self) {
        perf::disable(self.fd);
    }

    pub fn close(&mut self) {
        perf::close(self.fd);
        self.fd = -1;
    }
}

/// Watch the first naturally aligned piece of at most 8 bytes of an access.
///
/// Debug registers watch 1, 2, 4 or 8 aligned bytes. A wider access (SIMD)
/// or an unaligned one is watched through that piece; a trap on it stands for
/// the whole access, as Witch §4.6.4 does for SIMD, and the bytes credited
/// are the overlap of the whole sampled access with the trapping one.
pub fn watch_range(addr: u64, len: u32) -> (u64, u64) {
    for l in [8u64, 4, 2, 1] {
        if l <= len as u64 && addr.is_multiple_of(l) {
            return (addr, l);
        }
    }
    (addr, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_ranges_are_aligned_and_inside_the_access() {
        assert_eq!(watch_range(0x1000, 8), (0x1000, 8));
        assert_eq!(watch_range(0x1000, 32), (0x1000, 8));
        assert_eq!(watch_range(0x1004, 8), (0x1004, 4));
        assert_eq!(watch_range(0x1002, 4), (0x1002, 2));
        assert_eq!(watch_range(0x1001, 8), (0x1001, 1));
        assert_eq!(watch_range(0x1000, 1), (0x1000, 1));
    }
}
