//! The PMU sampler's mmap ring buffer: open, drain, parse sample records.

use super::{attr, AccessKind, PmuEvent, RING_DATA_PAGES};
use perf_event_open_sys as sys;
use std::sync::atomic::{AtomicU64, Ordering};
use sys::bindings::{self as b, perf_event_mmap_page};

/// Largest sample record `drain` will look at; it is copied to the stack.
const RECORD_BUF: usize = 1024;

// ---------------------------------------------------------------------------
// sample records

/// A sample record parsed from the ring buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PmuRecord {
    pub ip: u64,
    pub addr: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: Option<AccessKind>,
    /// Access size in bytes; 0 = unknown (decode the instruction at `ip`).
    pub len: u8,
}

/// The fields of a sample body, read in order.
struct SampleCursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> SampleCursor<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes(8).map(|s| u64::from_ne_bytes(s.try_into().unwrap()))
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes(4).map(|s| u32::from_ne_bytes(s.try_into().unwrap()))
    }
}

// IBS op register indices in the RAW payload (after the u32 caps word), in
// the order Linux reads them: IBS_OP_CTL, IBS_OP_RIP, IBS_OP_DATA, ...
const IBS_OP_RIP: usize = 1;
const IBS_OP_DATA: usize = 2;
const IBS_OP_DATA3: usize = 4;
const IBS_DC_LINADDR: usize = 5;
const IBS_RIP_INVALID: u64 = 1 << 38; // IbsOpData
const IBS_LD_OP: u64 = 1 << 0; // IbsOpData3
const IBS_ST_OP: u64 = 1 << 1;
const IBS_LIN_ADDR_VALID: u64 = 1 << 17;
const IBS_MEM_WIDTH_SHIFT: u32 = 22; // OpMemWidth, bits 22-25: 1 << (w - 1) bytes

/// Top half of the address space: kernel text/data on x86-64.
fn is_kernel(addr: u64) -> bool {
    addr >> 63 != 0
}

/// Parse one PERF_RECORD_SAMPLE body (after the 8-byte header) laid out for
/// `sample_type`, with `read_format == 0`. Intel: ip/addr/pid/tid, kind from
/// DATA_SRC when present. IBS: ip/addr/kind/len from the RAW op registers;
/// None when the op was neither load nor store, has no valid linear address,
/// or was in the kernel.
pub fn parse_sample(body: &[u8], sample_type: u64, ibs: bool) -> Option<PmuRecord> {
    let has = |bit: u32| sample_type & bit as u64 != 0;
    let mut r = SampleCursor { b: body, pos: 0 };
    let mut rec = PmuRecord::default();
    if has(b::PERF_SAMPLE_IDENTIFIER) {
        r.u64()?;
    }
    if has(b::PERF_SAMPLE_IP) {
        rec.ip = r.u64()?;
    }
    if has(b::PERF_SAMPLE_TID) {
        rec.pid = r.u32()?;
        rec.tid = r.u32()?;
    }
    if has(b::PERF_SAMPLE_TIME) {
        r.u64()?;
    }
    if has(b::PERF_SAMPLE_ADDR) {
        rec.addr = r.u64()?;
    }
    for bit in [b::PERF_SAMPLE_ID, b::PERF_SAMPLE_STREAM_ID, b::PERF_SAMPLE_CPU, b::PERF_SAMPLE_PERIOD, b::PERF_SAMPLE_READ] {
        if has(bit) {
            r.u64()?;
        }
    }
    if has(b::PERF_SAMPLE_CALLCHAIN) {
        let nr = r.u64()? as usize;
        r.bytes(nr.checked_mul(8)?)?;
    }
    let mut raw = None;
    if has(b::PERF_SAMPLE_RAW) {
        let n = r.u32()? as usize;
        raw = Some(r.bytes(n)?);
    }
    // Fields after these three have layouts that depend on other attr fields.
    if sample_type & (b::PERF_SAMPLE_BRANCH_STACK | b::PERF_SAMPLE_REGS_USER | b::PERF_SAMPLE_STACK_USER) as u64 == 0 {
        if has(b::PERF_SAMPLE_WEIGHT) || has(b::PERF_SAMPLE_WEIGHT_STRUCT) {
            r.u64()?;
        }
        if has(b::PERF_SAMPLE_DATA_SRC) {
            let op = r.u64()? & 0x1f;
            if op & b::PERF_MEM_OP_STORE as u64 != 0 {
                rec.kind = Some(AccessKind::Store);
            } else if op & b::PERF_MEM_OP_LOAD as u64 != 0 {
                rec.kind = Some(AccessKind::Load);
            }
        }
    }
    if ibs {
        // RAW = u32 IBS caps, then the op MSRs as u64s.
        let raw = raw?;
        let reg = |i: usize| -> Option<u64> {
            let o = 4 + 8 * i;
            raw.get(o..o + 8).map(|s| u64::from_ne_bytes(s.try_into().unwrap()))
        };
        let data3 = reg(IBS_OP_DATA3)?;
        rec.kind = if data3 & IBS_ST_OP != 0 {
            Some(AccessKind::Store) // also read-modify-write ops
        } else if data3 & IBS_LD_OP != 0 {
            Some(AccessKind::Load)
        } else {
            return None;
        };
        if data3 & IBS_LIN_ADDR_VALID == 0 {
            return None;
        }
        rec.addr = reg(IBS_DC_LINADDR)?;
        if reg(IBS_OP_DATA)? & IBS_RIP_INVALID == 0 {
            rec.ip = reg(IBS_OP_RIP)?;
        }
        let w = (data3 >> IBS_MEM_WIDTH_SHIFT) & 0xf;
        rec.len = if (1..=8).contains(&w) { 1u8 << (w - 1) } else { 0 };
        if is_kernel(rec.ip) || is_kernel(rec.addr) {
            return None;
        }
    }
    Some(rec)
}

// ---------------------------------------------------------------------------
// the sampler

/// An open PMU sampling event with its mmap ring buffer, for one thread.
pub struct PmuSampler {
    fd: i32,
    ring: *mut u8,
    ring_len: usize,
    /// True when `ring` came from mmap (false for test rings).
    mapped: bool,
    sample_type: u64,
    ibs: bool,
    kind: AccessKind,
    filter: Option<AccessKind>,
}

// SAFETY: the ring mapping and the fd belong to this value alone (nothing
// else holds the pointer, and `close` unmaps through `&mut self`); the kernel
// is the only other party, and it touches the shared meta page only through
// the data_head/data_tail protocol that `drain` follows with atomics. A
// mapping is process-wide, so another thread may own and drain it.
unsafe impl Send for PmuSampler {}

fn page_size() -> usize {
    // SAFETY: sysconf takes no pointers. glibc answers _SC_PAGESIZE from a
    // value the loader stored (no locks, no allocation), so `drain` may call
    // this from a signal handler.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Why a PMU event could not be opened.
#[derive(Debug, Clone)]
pub struct OpenError {
    /// The errno of `perf_event_open` or `mmap`.
    pub errno: i32,
    /// The event's precise_ip at the time.
    pub precise_ip: u8,
    message: String,
}

impl OpenError {
    /// The kernel refused the event's precise_ip level (a lower one may do).
    pub fn precise_ip_refused(&self) -> bool {
        self.precise_ip > 0 && matches!(self.errno, libc::EOPNOTSUPP | libc::EINVAL)
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<OpenError> for String {
    fn from(e: OpenError) -> String {
        e.message
    }
}

fn open_error(ev: &PmuEvent, code: i32) -> OpenError {
    let err = std::io::Error::from_raw_os_error(code);
    let what = format!("{} (type {}, config {:#x})", ev.name, ev.pmu_type, ev.config);
    let message = match code {
        libc::ENOENT | libc::ENODEV => format!("no PMU: {what} cannot be opened here: {err}"),
        libc::EOPNOTSUPP | libc::EINVAL if ev.precise_ip > 0 => {
            format!("cannot open {what} with precise_ip={}: {err}; retry with a lower precise_ip", ev.precise_ip)
        }
        libc::EOPNOTSUPP => format!("no PMU: {what} does not support sampling here: {err}"),
        libc::EACCES | libc::EPERM => {
            format!("cannot open {what}: {err}; needs kernel.perf_event_paranoid <= 2 (or <= 1 for IBS without swfilt) or CAP_PERFMON")
        }
        libc::ENOSPC | libc::EBUSY => format!("cannot open {what}: counters busy: {err}"),
        libc::E2BIG => format!("cannot open {what}: kernel too old for this perf_event_attr: {err}"),
        _ => format!("cannot open {what}: {err}"),
    };
    OpenError { errno: code, precise_ip: ev.precise_ip, message }
}

impl PmuSampler {
    /// Open `ev` on the calling thread and map a 1+[`RING_DATA_PAGES`] page ring.
    pub fn open(ev: &PmuEvent, period: u64) -> Result<PmuSampler, OpenError> {
        Self::open_on(ev, period, 0)
    }

    /// Like [`PmuSampler::open`], on thread `tid` of this process (0: the caller).
    pub fn open_on(ev: &PmuEvent, period: u64, tid: i32) -> Result<PmuSampler, OpenError> {
        let a = attr(ev, period);
        let fd = a.open(tid).map_err(|e| open_error(ev, e))?;
        let len = page_size() * (1 + RING_DATA_PAGES);
        // A fresh shared mapping of the event we just opened, in witch's
        // region (no existing memory is replaced); the result is checked
        // for MAP_FAILED before use.
        let p = crate::sys::mem::map_own_fd(len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd);
        if p == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            crate::sys::perf::close(fd);
            let message = format!("cannot map the ring buffer of {}: {err} (RLIMIT_MEMLOCK / perf_event_mlock_kb?)", ev.name);
            return Err(OpenError { errno: err.raw_os_error().unwrap_or(0), precise_ip: ev.precise_ip, message });
        }
        Ok(PmuSampler {
            fd,
            ring: p as *mut u8,
            ring_len: len,
            mapped: true,
            sample_type: a.raw().sample_type,
            ibs: ev.ibs,
            kind: ev.kind,
            filter: Some(ev.kind),
        })
    }

    /// Wrap a fake ring laid out like a perf mmap (tests only; not unmapped).
    #[cfg(test)]
    pub(crate) fn from_raw_ring(ring: *mut u8, ring_len: usize, sample_type: u64, ibs: bool, kind: AccessKind) -> PmuSampler {
        PmuSampler { fd: -1, ring, ring_len, mapped: false, sample_type, ibs, kind, filter: Some(kind) }
    }

    /// Which record kinds `drain` passes on (default: the event's kind).
    /// IBS samples loads and stores alike; `None` keeps both.
    pub fn set_kind_filter(&mut self, kind: Option<AccessKind>) {
        self.filter = kind;
    }

    /// Async-signal-safe: no allocation, locks or stdio. Calls `f` for each
    /// sample between data_tail and data_head, skipping other record types,
    /// then releases the space to the kernel. Records without a kind get the
    /// event's kind (Intel events are per-kind).
    pub fn drain(&mut self, mut f: impl FnMut(PmuRecord)) {
        if self.ring.is_null() {
            return;
        }
        let meta = self.ring as *mut perf_event_mmap_page;
        // SAFETY: ring points at ring_len bytes starting with the meta page.
        let (head, mut tail, data, size) = unsafe {
            let mut off = std::ptr::addr_of!((*meta).data_offset).read_volatile() as usize;
            let mut size = std::ptr::addr_of!((*meta).data_size).read_volatile() as usize;
            if size == 0 {
                // Kernels before 4.1 leave these 0: data follows the meta page.
                off = page_size();
                size = self.ring_len.saturating_sub(off);
            }
            if size < 8 || !size.is_power_of_two() || off.checked_add(size).filter(|&e| e <= self.ring_len).is_none() {
                return;
            }
            let head = (*(std::ptr::addr_of!((*meta).data_head) as *const AtomicU64)).load(Ordering::Acquire);
            let tail = (*(std::ptr::addr_of!((*meta).data_tail) as *const AtomicU64)).load(Ordering::Relaxed);
            (head, tail, self.ring.add(off) as *const u8, size)
        };
        let mut buf = [0u8; RECORD_BUF];
        let copy = |from: u64, out: &mut [u8]| {
            let start = (from as usize) & (size - 1);
            let first = out.len().min(size - start);
            // SAFETY: both pieces lie inside the data area.
            unsafe {
                std::ptr::copy_nonoverlapping(data.add(start), out.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
            }
        };
        while head.wrapping_sub(tail) >= 8 {
            let mut hdr = [0u8; 8];
            copy(tail, &mut hdr);
            let rtype = u32::from_ne_bytes(hdr[0..4].try_into().unwrap());
            let rsize = u16::from_ne_bytes(hdr[6..8].try_into().unwrap()) as u64;
            if rsize < 8 || rsize > head.wrapping_sub(tail) || rsize > size as u64 {
                tail = head; // corrupt: drop everything rather than loop
                break;
            }
            let body_len = rsize as usize - 8;
            if rtype == b::PERF_RECORD_SAMPLE && body_len <= buf.len() {
                copy(tail.wrapping_add(8), &mut buf[..body_len]);
                if let Some(mut rec) = parse_sample(&buf[..body_len], self.sample_type, self.ibs) {
                    if rec.kind.is_none() {
                        rec.kind = Some(self.kind);
                    }
                    if self.filter.is_none() || rec.kind == self.filter {
                        f(rec);
                    }
                }
            }
            tail = tail.wrapping_add(rsize);
        }
        // Release: our reads of the records happen before the kernel reuses them.
        // SAFETY: `meta` is the ring's first page, as for the reads above
        // (`open_on` and `from_raw_ring` hand over rings that start with
        // one, and the ring is not null). data_tail is an 8-aligned u64 the
        // kernel only reads; this thread's drain is its only writer.
        unsafe { (*(std::ptr::addr_of_mut!((*meta).data_tail) as *const AtomicU64)).store(tail, Ordering::Release) };
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// munmap + close; idempotent, so usable in a forked child and by Drop.
    pub fn close(&mut self) {
        if !self.ring.is_null() {
            if self.mapped {
                // SAFETY: `ring`/`ring_len` are exactly what `open_on` mapped,
                // not yet unmapped (the pointer is cleared right after), and
                // `&mut self` means no `drain` is reading it.
                unsafe { crate::sys::mem::unmap_own(self.ring as *mut libc::c_void, self.ring_len) };
            }
            self.ring = std::ptr::null_mut();
        }
        if self.fd >= 0 {
            crate::sys::perf::close(self.fd);
            self.fd = -1;
        }
    }
}

impl Drop for PmuSampler {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- sample records -----------------------------------------------------

    const INTEL_ST: u64 = (b::PERF_SAMPLE_IP | b::PERF_SAMPLE_TID | b::PERF_SAMPLE_ADDR) as u64;
    const IBS_ST: u64 = INTEL_ST | b::PERF_SAMPLE_RAW as u64;

    fn intel_body(ip: u64, pid: u32, tid: u32, addr: u64) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(ip.to_ne_bytes());
        v.extend(pid.to_ne_bytes());
        v.extend(tid.to_ne_bytes());
        v.extend(addr.to_ne_bytes());
        v
    }

    /// IBS sample body with the op registers Linux saves (plus BrTarget).
    fn ibs_body(sample_ip: u64, rip: u64, op_data: u64, data3: u64, lin: u64) -> Vec<u8> {
        let mut v = intel_body(sample_ip, 10, 11, 0);
        let regs = [1u64 << 18 | 1 << 17, rip, op_data, 0, data3, lin, 0x1234_5000, 0];
        let raw_len = 4 + 8 * regs.len();
        v.extend((raw_len as u32).to_ne_bytes());
        v.extend(0x3ffu32.to_ne_bytes()); // caps
        for r in regs {
            v.extend(r.to_ne_bytes());
        }
        assert_eq!(v.len() % 8, 0);
        v
    }

    #[test]
    fn parse_intel_sample() {
        let body = intel_body(0x401000, 42, 43, 0x7ffd_0000_1000);
        let r = parse_sample(&body, INTEL_ST, false).unwrap();
        assert_eq!(r, PmuRecord { ip: 0x401000, addr: 0x7ffd_0000_1000, pid: 42, tid: 43, kind: None, len: 0 });
        assert_eq!(parse_sample(&body[..20], INTEL_ST, false), None);

        // TIME and CPU interleave; DATA_SRC names the op.
        let st = INTEL_ST | (b::PERF_SAMPLE_TIME | b::PERF_SAMPLE_CPU | b::PERF_SAMPLE_WEIGHT | b::PERF_SAMPLE_DATA_SRC) as u64;
        let mut v = Vec::new();
        v.extend(0x401000u64.to_ne_bytes());
        v.extend(42u32.to_ne_bytes());
        v.extend(43u32.to_ne_bytes());
        v.extend(999u64.to_ne_bytes()); // time
        v.extend(0x5000u64.to_ne_bytes()); // addr
        v.extend(3u64.to_ne_bytes()); // cpu, res
        v.extend(17u64.to_ne_bytes()); // weight
        v.extend((b::PERF_MEM_OP_LOAD as u64).to_ne_bytes());
        let r = parse_sample(&v, st, false).unwrap();
        assert_eq!((r.ip, r.addr, r.tid, r.kind), (0x401000, 0x5000, 43, Some(AccessKind::Load)));
    }

    #[test]
    fn parse_ibs_samples() {
        let width8 = 4u64 << IBS_MEM_WIDTH_SHIFT;
        let load = ibs_body(0xdead, 0x401234, 0, IBS_LD_OP | IBS_LIN_ADDR_VALID | width8, 0x7f00_0000_0008);
        let r = parse_sample(&load, IBS_ST, true).unwrap();
        assert_eq!(r, PmuRecord { ip: 0x401234, addr: 0x7f00_0000_0008, pid: 10, tid: 11, kind: Some(AccessKind::Load), len: 8 });

        let store = ibs_body(0xdead, 0x401240, 0, IBS_ST_OP | IBS_LIN_ADDR_VALID | (3u64 << IBS_MEM_WIDTH_SHIFT), 0x7f00_0000_0010);
        let r = parse_sample(&store, IBS_ST, true).unwrap();
        assert_eq!((r.kind, r.addr, r.len), (Some(AccessKind::Store), 0x7f00_0000_0010, 4));

        let neither = ibs_body(0xdead, 0x401240, 0, IBS_LIN_ADDR_VALID, 0x7f00_0000_0010);
        assert_eq!(parse_sample(&neither, IBS_ST, true), None);

        let invalid = ibs_body(0xdead, 0x401240, 0, IBS_LD_OP, 0x7f00_0000_0010);
        assert_eq!(parse_sample(&invalid, IBS_ST, true), None);

        // IbsRipInvalid: keep the (imprecise) interrupted IP.
        let bad_rip = ibs_body(0x401300, 0, IBS_RIP_INVALID, IBS_LD_OP | IBS_LIN_ADDR_VALID, 0x7f00_0000_0020);
        assert_eq!(parse_sample(&bad_rip, IBS_ST, true).unwrap().ip, 0x401300);

        // Without the swfilt bit the kernel hands us kernel samples too.
        let kern = ibs_body(0, 0xffff_ffff_8100_0000, 0, IBS_LD_OP | IBS_LIN_ADDR_VALID, 0x7f00_0000_0020);
        assert_eq!(parse_sample(&kern, IBS_ST, true), None);

        // IBS without RAW data cannot be decoded.
        assert_eq!(parse_sample(&intel_body(1, 2, 3, 4), INTEL_ST, true), None);
    }

    // --- ring buffer ----------------------------------------------------------

    const META: usize = 4096;
    const DATA: usize = 256;

    /// Heap buffer laid out like a perf mmap: meta page, then DATA bytes.
    struct FakeRing(Vec<u64>);

    impl FakeRing {
        fn new(start: u64) -> FakeRing {
            let mut r = FakeRing(vec![0u64; (META + DATA) / 8]);
            let m = r.meta();
            m.data_offset = META as u64;
            m.data_size = DATA as u64;
            m.data_head = start;
            m.data_tail = start;
            r
        }
        fn meta(&mut self) -> &mut perf_event_mmap_page {
            // SAFETY: the Vec<u64> is 8-aligned and META (4096) bytes cover a
            // perf_event_mmap_page (plain integers, any bit pattern valid);
            // the borrow of `self` keeps the buffer alive and unaliased.
            unsafe { &mut *(self.0.as_mut_ptr() as *mut perf_event_mmap_page) }
        }
        fn ptr(&mut self) -> *mut u8 {
            self.0.as_mut_ptr() as *mut u8
        }
        /// Append a record at data_head, wrapping around the data area.
        fn push(&mut self, rtype: u32, body: &[u8]) {
            let mut rec = Vec::new();
            rec.extend(rtype.to_ne_bytes());
            rec.extend(0u16.to_ne_bytes());
            rec.extend(((body.len() + 8) as u16).to_ne_bytes());
            rec.extend(body);
            let head = self.meta().data_head;
            // SAFETY: [META, META + DATA) is inside the buffer and disjoint
            // from the meta page; `bytes` is dead before `meta()` is called again.
            let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr().add(META), DATA) };
            for (i, x) in rec.iter().enumerate() {
                bytes[(head as usize + i) % DATA] = *x;
            }
            self.meta().data_head = head + rec.len() as u64;
        }
    }

    #[test]
    fn drain_wraps_and_skips_other_records() {
        // Start near the end so the second record straddles the wrap.
        let mut ring = FakeRing::new(4 * DATA as u64 + 200);
        ring.push(b::PERF_RECORD_SAMPLE, &intel_body(0x1000, 1, 2, 0xa000));
        ring.push(b::PERF_RECORD_SAMPLE, &intel_body(0x1001, 1, 2, 0xa008)); // wraps
        ring.push(b::PERF_RECORD_LOST, &[0u8; 16]);
        ring.push(b::PERF_RECORD_SAMPLE, &intel_body(0x1002, 1, 2, 0xa010));
        let head = ring.meta().data_head;
        let mut s = PmuSampler::from_raw_ring(ring.ptr(), META + DATA, INTEL_ST, false, AccessKind::Store);
        let mut got = Vec::new();
        s.drain(|r| got.push(r));
        assert_eq!(got.iter().map(|r| (r.ip, r.addr)).collect::<Vec<_>>(), vec![(0x1000, 0xa000), (0x1001, 0xa008), (0x1002, 0xa010)]);
        assert!(got.iter().all(|r| r.kind == Some(AccessKind::Store) && r.tid == 2));
        assert_eq!(ring.meta().data_tail, head);

        // Nothing new: nothing delivered. Then a nearly full ring, wrapping again.
        s.drain(|_| panic!("no records expected"));
        for i in 0..7 {
            ring.push(b::PERF_RECORD_SAMPLE, &intel_body(0x2000 + i, 1, 2, 0xb000));
        }
        let mut n = 0;
        s.drain(|r| {
            assert_eq!(r.ip, 0x2000 + n);
            n += 1;
        });
        assert_eq!(n, 7);
        s.close();
        s.close();
    }

    #[test]
    fn drain_ibs_filters_kind() {
        let mut ring = FakeRing::new(100);
        let ld = ibs_body(0, 0x401000, 0, IBS_LD_OP | IBS_LIN_ADDR_VALID, 0x7000);
        let st = ibs_body(0, 0x401010, 0, IBS_ST_OP | IBS_LIN_ADDR_VALID, 0x7008);
        ring.push(b::PERF_RECORD_SAMPLE, &ld);
        ring.push(b::PERF_RECORD_SAMPLE, &st); // wraps (records are 96 bytes)
        let mut s = PmuSampler::from_raw_ring(ring.ptr(), META + DATA, IBS_ST, true, AccessKind::Store);
        let mut got = Vec::new();
        s.drain(|r| got.push(r));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].addr, got[0].kind), (0x7008, Some(AccessKind::Store)));

        ring.push(b::PERF_RECORD_SAMPLE, &ld);
        ring.push(b::PERF_RECORD_SAMPLE, &st);
        s.set_kind_filter(None);
        got.clear();
        s.drain(|r| got.push(r));
        assert_eq!(got.iter().map(|r| r.kind.unwrap()).collect::<Vec<_>>(), vec![AccessKind::Load, AccessKind::Store]);
    }

    #[test]
    fn drain_survives_corrupt_header() {
        let mut ring = FakeRing::new(0);
        ring.push(b::PERF_RECORD_SAMPLE, &intel_body(1, 1, 1, 1));
        // SAFETY: the data area of the fake ring, used before the ring is
        // borrowed again.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ring.ptr().add(META), DATA) };
        bytes[6] = 0; // size 0
        bytes[7] = 0;
        let head = ring.meta().data_head;
        let mut s = PmuSampler::from_raw_ring(ring.ptr(), META + DATA, INTEL_ST, false, AccessKind::Load);
        s.drain(|_| panic!("corrupt record delivered"));
        assert_eq!(ring.meta().data_tail, head);
    }

    #[test]
    fn open_fails_cleanly_without_pmu() {
        // MEM_INST_RETIRED.ALL_STORES as a raw event; this VM has no PMU.
        let ev = PmuEvent {
            name: "r82d0".into(),
            pmu_type: b::PERF_TYPE_RAW,
            config: 0x82d0,
            config1: 0,
            config2: 0,
            precise_ip: 2,
            kind: AccessKind::Store,
            ibs: false,
        };
        match PmuSampler::open(&ev, 100_003) {
            Ok(mut s) => {
                println!("PMU sampler opened (fd {})", s.fd());
                let mut n = 0;
                s.drain(|_| n += 1);
                s.close();
            }
            Err(e) => {
                println!("{e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}
