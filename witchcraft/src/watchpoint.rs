//! Watchpoints: the few debug registers, as perf breakpoint events.
//!
//! Each slot keeps one event open for the thread's lifetime. Arming
//! re-targets it with one `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` ioctl (≈1 µs
//! here, against ≈3 µs for close+reopen, which is the fallback); disarming
//! disables it.

use crate::craft::Watched;
use crate::perf::{self, BpType};

/// One debug register.
#[derive(Clone, Copy, Default)]
pub struct Slot {
    pub fd: i32,
    pub armed: bool,
    pub armed_seq: u64,
    /// C_watch
    pub ctx: u32,
    /// The watched, naturally aligned piece (≤ 8 bytes) of the sampled access.
    pub addr: u64,
    pub len: u64,
    pub watched: Watched,
    /// Software sampler: the sampled instruction has not run yet, and its own
    /// access will trap first. These identify that self-trap.
    pub skip_first: bool,
    pub skip_pc: u64,
    pub skip_next: u64,
    pub skip_branch: bool,
    /// Traps the craft ignored since arming (LoadCraft: stores).
    pub ignored: u32,
}

impl Slot {
    /// Point this slot at [addr, addr+len), enabled. Async-signal-safe.
    #[allow(clippy::too_many_arguments)]
    pub fn retarget(
        &mut self,
        ty: BpType,
        addr: u64,
        len: u64,
        sigtrap: bool,
        modify: bool,
        tid: i32,
        sig_data: u64,
        parking: u64,
    ) -> bool {
        let mut a = perf::breakpoint_attr(addr, len, ty, false, sigtrap, sig_data);
        if modify && perf::modify(self.fd, &mut a) {
            return true;
        }
        perf::close(self.fd);
        match perf::open_on_self(&mut a) {
            Ok(fd) => {
                if !sigtrap {
                    perf::route_signal_to_thread(fd, perf::fallback_signal(), tid);
                }
                self.fd = fd;
                true
            }
            Err(_) => {
                // Keep the slot usable: park a fresh disabled breakpoint.
                let mut p = perf::breakpoint_attr(parking, 8, ty, true, sigtrap, sig_data);
                self.fd = perf::open_on_self(&mut p).unwrap_or(-1);
                false
            }
        }
    }

    pub fn disarm(&mut self) {
        perf::disable(self.fd);
        self.armed = false;
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
