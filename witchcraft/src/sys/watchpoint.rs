//! The debug registers, as perf breakpoint events.
//!
//! Each of a thread's breakpoints stays open for the thread's lifetime.
//! Arming re-targets it with one `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` ioctl,
//! several times cheaper than close and reopen, which is the fallback
//! (`cargo bench -p witch-benches`; docs/OVERHEAD.md); disarming disables
//! it.

use super::perf::{self, Attr, BpType};
use super::siginfo;
use crate::x86::lbr::Branch;
use std::path::Path;

/// Where the breakpoint PMU lists what this kernel adds to upstream Linux
/// (the patches in the repository's `kernel-patch/`).
pub const CAPS_DIR: &str = "/sys/bus/event_source/devices/breakpoint/caps";

/// The kernel patches this kernel has, as its breakpoint PMU reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCaps {
    /// `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` re-targets an enabled breakpoint
    /// of the calling thread in place, without the disable/enable cycle.
    pub modify_in_place: bool,
    /// Breakpoint samples can carry the LBR branch stack: None without the
    /// patch, Some(false) with it but no LBR on this CPU.
    pub branch_stack: Option<bool>,
}

impl KernelCaps {
    /// Reads the caps files (not async-signal-safe: at start-up).
    pub fn read() -> KernelCaps {
        Self::read_from(Path::new(CAPS_DIR))
    }

    pub fn read_from(dir: &Path) -> KernelCaps {
        let flag = |name: &str| std::fs::read_to_string(dir.join(name)).ok().map(|s| s.trim() == "1");
        KernelCaps { modify_in_place: flag("modify_in_place").unwrap_or(false), branch_stack: flag("branch_stack") }
    }
}

/// x86 has at most 4 debug registers; 8 bounds the probe on other hardware.
pub const MAX_BREAKPOINTS: usize = 8;

/// A disabled write watchpoint on `word` of the calling thread: it still
/// takes a debug-register slot (the kernel reserves slots at creation)
/// but cannot fire during a probe.
fn probe_attr(word: &u64) -> Attr {
    Attr::breakpoint(word as *const u64 as u64, 8, BpType::W).expect("an aligned u64").disabled()
}

fn open_probe(a: Attr) -> Result<i32, std::io::Error> {
    a.open(0).map_err(std::io::Error::from_raw_os_error)
}

/// Debug registers free to this thread: open write breakpoints until the
/// kernel says ENOSPC (or anything else); 0 if breakpoints are unsupported.
pub fn debug_registers() -> usize {
    count_breakpoints().0
}

/// The count, and the error that ended it (None when the cap was reached).
pub fn count_breakpoints() -> (usize, Option<std::io::Error>) {
    let slots = [0u64; MAX_BREAKPOINTS];
    let mut fds = Vec::with_capacity(MAX_BREAKPOINTS);
    let mut err = None;
    for s in &slots {
        match open_probe(probe_attr(s)) {
            Ok(fd) => fds.push(fd),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let n = fds.len();
    fds.into_iter().for_each(perf::close);
    std::hint::black_box(&slots);
    (n, err)
}

/// PERF_EVENT_IOC_MODIFY_ATTRIBUTES (Linux 4.17+) retargets a breakpoint in
/// one ioctl; without it each re-arm is a close + perf_event_open.
pub fn modify_attributes_supported() -> bool {
    let words = [0u64; 2];
    let Ok(fd) = open_probe(probe_attr(&words[0])) else {
        return false;
    };
    let ok = probe_attr(&words[1]).modify(fd);
    perf::close(fd);
    std::hint::black_box(&words);
    ok
}

/// `sigtrap` (Linux 5.13+) delivers SIGTRAP synchronously to the accessing
/// thread; without it signals are routed with F_SETSIG.
pub fn sigtrap_supported() -> bool {
    let word = 0u64;
    let ok = match open_probe(probe_attr(&word).sigtrap(1)) {
        Ok(fd) => {
            perf::close(fd);
            true
        }
        Err(_) => false,
    };
    std::hint::black_box(&word);
    ok
}

/// How a thread's breakpoints are armed: fixed for its lifetime.
#[derive(Clone, Copy, Debug)]
pub struct Arming {
    pub ty: BpType,
    /// Signal with `sigtrap` (else F_SETSIG with the sampler's signal).
    pub sigtrap: bool,
    /// Re-target with `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` (else close+reopen).
    pub modify: bool,
    /// The kernel re-targets an enabled breakpoint in place ([`KernelCaps`]):
    /// a freed breakpoint then parks enabled, so its next arming is in place
    /// too, rather than a disable now and an enable later.
    pub in_place: bool,
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

    /// Stop watching by pointing the breakpoint, still enabled, at the
    /// parking address (on a kernel that does that in place). False if
    /// that failed and the breakpoint is now disabled instead.
    /// Async-signal-safe.
    pub fn park_enabled(&mut self, how: &Arming, tag: u64) -> bool {
        if self.retarget(how, tag, how.parking, 8) {
            return true;
        }
        self.disable();
        false
    }

    pub fn close(&mut self) {
        perf::close(self.fd);
        self.fd = -1;
    }
}

/// A breakpoint sample's IP and branch stack, from its `PERF_RECORD_SAMPLE`
/// record (`PERF_SAMPLE_IP | PERF_SAMPLE_BRANCH_STACK`, as the kernel patch
/// lets a breakpoint ask for): the IP, and how many branches (newest first)
/// were copied to `out`. None if `rec` is not such a complete record.
/// Async-signal-safe.
pub fn branch_sample(rec: &[u8], out: &mut [Branch]) -> Option<(u64, usize)> {
    const PERF_RECORD_SAMPLE: u32 = 9;
    let word = |i: usize| rec.get(i..i + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
    let kind = u32::from_ne_bytes(rec.get(0..4)?.try_into().ok()?);
    let size = u16::from_ne_bytes(rec.get(6..8)?.try_into().ok()?) as usize;
    if kind != PERF_RECORD_SAMPLE || size > rec.len() {
        return None;
    }
    let ip = word(8)?;
    let nr = word(16)? as usize;
    if 24 + nr.checked_mul(24)? > size {
        return None;
    }
    let n = nr.min(out.len());
    for (k, b) in out[..n].iter_mut().enumerate() {
        *b = Branch { from: word(24 + 24 * k)?, to: word(32 + 24 * k)? };
    }
    Some((ip, n))
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

/// The piece a debug register watches for an access: one of the naturally
/// aligned pieces of at most 8 bytes that tile it, chosen in proportion to
/// its bytes (the piece holding byte `pick % len` of the access), so that
/// every byte is as likely to be watched as any other. A trap on the piece
/// stands for the whole access (Witch §4.6.4 for SIMD), credited with the
/// access's bytes in the proportion of the piece the trapping access
/// touched (`craft::credited`): with pieces drawn by their size that
/// credit is, in expectation, the bytes the trapping access touched.
///
/// An access one debug register covers (aligned, at most 8 bytes) is its
/// own piece. A vector store that is only 4-byte aligned (16 `u32`s written
/// at `p + 4·n`, as a JSON parser's structural index does) used to be
/// watched at its first 4 bytes every time, so whatever became of its
/// first element (read back) stood for all sixteen (mostly overwritten by
/// the next such store): simdjson's dead fraction there read a fraction
/// of what every access's count says (docs/ACCURACY.md, "Which bytes a
/// watchpoint covers").
pub fn watch_piece(addr: u64, len: u32, pick: u64) -> (u64, u64) {
    let len = u64::from(len.max(1));
    let x = addr + pick % len;
    for l in [8u64, 4, 2, 1] {
        // The aligned l-byte block holding x, if it lies inside the access.
        let s = x & !(l - 1);
        if s >= addr && s + l <= addr + len {
            return (s, l);
        }
    }
    (x, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_register_count() {
        let n = debug_registers();
        println!("debug registers free: {n}");
        assert!((1..=MAX_BREAKPOINTS).contains(&n), "{n}");
        // Probing leaves no slot behind.
        assert_eq!(debug_registers(), n);
    }

    #[test]
    fn breakpoint_features() {
        assert!(sigtrap_supported());
        assert!(modify_attributes_supported());
    }

    #[test]
    fn kernel_caps_are_read_from_the_breakpoint_pmu() {
        let dir = std::env::temp_dir().join(format!("witch-caps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(KernelCaps::read_from(&dir), KernelCaps { modify_in_place: false, branch_stack: None });
        std::fs::write(dir.join("modify_in_place"), "1\n").unwrap();
        std::fs::write(dir.join("branch_stack"), "0\n").unwrap();
        assert_eq!(KernelCaps::read_from(&dir), KernelCaps { modify_in_place: true, branch_stack: Some(false) });
        std::fs::write(dir.join("modify_in_place"), "0\n").unwrap();
        std::fs::write(dir.join("branch_stack"), "1\n").unwrap();
        assert_eq!(KernelCaps::read_from(&dir), KernelCaps { modify_in_place: false, branch_stack: Some(true) });
        std::fs::remove_dir_all(&dir).unwrap();
        // No kernel without the patch has the directory.
        assert_eq!(KernelCaps::read_from(Path::new("/nonexistent-witch-caps")), KernelCaps::default());
    }

    /// A synthetic breakpoint sample: header, ip, nr, then from/to/flags.
    fn record(ip: u64, branches: &[(u64, u64)], size_delta: isize) -> Vec<u8> {
        let size = 8 + 16 + 24 * branches.len();
        let mut r = Vec::new();
        r.extend(9u32.to_ne_bytes());
        r.extend(0u16.to_ne_bytes());
        r.extend(((size as isize + size_delta) as u16).to_ne_bytes());
        r.extend(ip.to_ne_bytes());
        r.extend((branches.len() as u64).to_ne_bytes());
        for &(from, to) in branches {
            r.extend(from.to_ne_bytes());
            r.extend(to.to_ne_bytes());
            r.extend(0u64.to_ne_bytes());
        }
        r
    }

    #[test]
    fn branch_samples_parse_and_bad_ones_are_refused() {
        let mut out = [Branch::default(); 4];
        let r = record(0x100b, &[(0x100e, 0x1000), (0x2000, 0x1000)], 0);
        assert_eq!(branch_sample(&r, &mut out), Some((0x100b, 2)));
        assert_eq!(out[0], Branch { from: 0x100e, to: 0x1000 });
        assert_eq!(out[1], Branch { from: 0x2000, to: 0x1000 });
        // More branches than room: the newest ones.
        let mut one = [Branch::default(); 1];
        assert_eq!(branch_sample(&r, &mut one), Some((0x100b, 1)));
        assert_eq!(one[0], Branch { from: 0x100e, to: 0x1000 });
        // An empty stack (the kernel could not take a snapshot).
        assert_eq!(branch_sample(&record(0x42, &[], 0), &mut out), Some((0x42, 0)));
        // Truncated, lying about its size, or another record type.
        assert_eq!(branch_sample(&r[..r.len() - 1], &mut out), None);
        assert_eq!(branch_sample(&record(0x100b, &[(1, 2)], -8), &mut out), None);
        let mut other = r.clone();
        other[0] = 1;
        assert_eq!(branch_sample(&other, &mut out), None);
        assert_eq!(branch_sample(&[], &mut out), None);
    }

    #[test]
    fn watch_ranges_are_aligned_and_inside_the_access() {
        assert_eq!(watch_range(0x1000, 8), (0x1000, 8));
        assert_eq!(watch_range(0x1000, 32), (0x1000, 8));
        assert_eq!(watch_range(0x1004, 8), (0x1004, 4));
        assert_eq!(watch_range(0x1002, 4), (0x1002, 2));
        assert_eq!(watch_range(0x1001, 8), (0x1001, 1));
        assert_eq!(watch_range(0x1000, 1), (0x1000, 1));
    }

    #[test]
    fn wide_accesses_are_watched_through_any_of_their_elements() {
        let seen: std::collections::BTreeSet<_> = (0..64).map(|k| watch_piece(0x1000, 32, k)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![(0x1000, 8), (0x1008, 8), (0x1010, 8), (0x1018, 8)]);
        assert_eq!(watch_piece(0x1000, 8, 5), (0x1000, 8));
        assert_eq!(watch_piece(0x1000, 4, 5), (0x1000, 4));
    }

    /// Over every pick, each byte of an access is watched equally often:
    /// the pieces tile the access, each drawn as often as it has bytes, so
    /// a 4-byte aligned vector's last elements are watched as often as its
    /// first (they were never watched).
    #[test]
    fn pieces_tile_the_access_and_are_drawn_by_their_bytes() {
        for (addr, len) in [(0x1004u64, 64u32), (0x1001, 32), (0x1004, 8), (0x1006, 16), (0x1003, 3), (0x1000, 64), (0x1000, 1)] {
            let mut watched = vec![0u64; len as usize];
            for k in 0..u64::from(len) * 8 {
                let (s, l) = watch_piece(addr, len, k);
                assert!([1, 2, 4, 8].contains(&l) && s % l == 0, "{addr:#x}+{len}: piece {s:#x}+{l} is not a debug register's");
                assert!(s >= addr && s + l <= addr + u64::from(len), "{addr:#x}+{len}: piece {s:#x}+{l} outside the access");
                for b in s..s + l {
                    watched[(b - addr) as usize] += 1;
                }
                // Each pick's piece holds the picked byte.
                let x = addr + k % u64::from(len);
                assert!(s <= x && x < s + l);
            }
            // A piece of l bytes is drawn l·8 times and each of its bytes is
            // in it each time: every byte is watched 8·l times, so the
            // credit len·touched/l is unbiased only when P(piece) = l/len,
            // which this checks: per byte, count / l is the same 8.
            for k in 0..u64::from(len) * 8 {
                let (s, l) = watch_piece(addr, len, k);
                assert_eq!(watched[(s - addr) as usize], 8 * l, "{addr:#x}+{len}: piece {s:#x}+{l}");
            }
        }
        assert_eq!(watch_piece(0x1004, 64, 0), (0x1004, 4));
        assert_eq!(watch_piece(0x1004, 64, 63), (0x1040, 4));
        assert_eq!(watch_piece(0x1004, 64, 10), (0x1008, 8));
    }
}
