//! PMU sampler backend: precise memory-access events that report the data
//! address (Intel PEBS `mem-loads`/`mem-stores`/`MEM_INST_RETIRED.*`, AMD IBS
//! op sampling), found through sysfs and read from a perf mmap ring buffer.
//!
//! Machines without such events (most VMs) make [`discover`] fail with a
//! message starting with "no PMU:"; the engine then samples with task-clock.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys as sys;
use sys::bindings::{self as b, perf_event_attr, perf_event_mmap_page};

/// Where the kernel lists PMUs.
pub const SYSFS_PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// Data pages of the ring (a power of two). One page is plenty because the
/// signal handler drains after every sample (`wakeup_events = 1`), and small
/// rings stay inside the free `perf_event_mlock_kb` allowance with many threads.
pub const RING_DATA_PAGES: usize = 1;

/// Largest sample record `drain` will look at; it is copied to the stack.
const RECORD_BUF: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    Load,
    Store,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PmuEvent {
    pub name: String,
    pub pmu_type: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub precise_ip: u8,
    pub kind: AccessKind,
    /// AMD IBS op sampling: samples every op, so the kind is decoded per record.
    pub ibs: bool,
}

// ---------------------------------------------------------------------------
// sysfs discovery

/// Intel PMU directories, best first: on hybrid parts the P-cores (`cpu_core`)
/// have the richer PEBS; `cpu` is the classic name.
const INTEL_PMUS: [&str; 3] = ["cpu_core", "cpu", "cpu_atom"];

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn pmu_type(dir: &Path) -> Result<u32, String> {
    let t = dir.join("type");
    read_trim(&t).and_then(|s| s.parse().ok()).ok_or_else(|| format!("cannot read {}", t.display()))
}

/// Sysfs does not say "Intel"; these format terms and `caps/pmu_name` only
/// exist on Intel core PMUs (AMD's `cpu` has event/umask/edge/inv/cmask).
fn looks_intel(dir: &Path) -> bool {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "cpu_core" || name == "cpu_atom" {
        return true;
    }
    ["ldlat", "offcore_rsp", "in_tx", "frontend", "pc", "any"].iter().any(|t| dir.join("format").join(t).exists())
        || dir.join("caps/pmu_name").exists()
}

/// Intel precise level: 2 (zero skid for PEBS via IP fix-up), lowered to what
/// `caps/max_precise` allows. 0 means PEBS is unusable (e.g. in many VMs).
fn intel_precise(dir: &Path) -> u8 {
    match read_trim(&dir.join("caps/max_precise")).and_then(|s| s.parse::<u8>().ok()) {
        Some(m) => m.min(2),
        None => 2,
    }
}

/// One `<pmu>/format/<term>` file: which attr field and which bits.
#[derive(Debug, PartialEq)]
struct Format {
    field: u8, // 0 = config, 1 = config1, 2 = config2
    ranges: Vec<(u32, u32)>,
}

fn parse_format(s: &str) -> Result<Format, String> {
    let (field, bits) = s.trim().split_once(':').ok_or_else(|| format!("bad format {s:?}"))?;
    let field = match field {
        "config" => 0,
        "config1" => 1,
        "config2" => 2,
        _ => return Err(format!("unsupported format field {field:?}")),
    };
    let mut ranges = Vec::new();
    for r in bits.split(',') {
        let (lo, hi) = match r.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (r, r),
        };
        let lo: u32 = lo.trim().parse().map_err(|_| format!("bad format {s:?}"))?;
        let hi: u32 = hi.trim().parse().map_err(|_| format!("bad format {s:?}"))?;
        if lo > hi || hi > 63 {
            return Err(format!("bad format {s:?}"));
        }
        ranges.push((lo, hi));
    }
    Ok(Format { field, ranges })
}

/// Spread `value`'s low bits over the format's bit ranges, in order.
fn deposit(f: &Format, mut value: u64) -> Option<u64> {
    let mut out = 0u64;
    for &(lo, hi) in &f.ranges {
        for bit in lo..=hi {
            out |= (value & 1) << bit;
            value >>= 1;
        }
    }
    (value == 0).then_some(out)
}

fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Accumulates config words from `term[=value]` lists.
#[derive(Default)]
struct Config {
    words: [u64; 3],
}

impl Config {
    /// Apply "event=0xd0,umask=0x82" style terms of PMU `dir`. A bare term is
    /// a flag (value 1) if the PMU has that format, else a named event alias.
    fn apply(&mut self, dir: &Path, terms: &str, depth: u32) -> Result<(), String> {
        for term in terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (key, val) = match term.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (term, None),
            };
            let num = |v: Option<&str>| -> Result<u64, String> {
                match v {
                    None => Ok(1),
                    Some(v) => parse_num(v).ok_or_else(|| format!("bad value in term {term:?}")),
                }
            };
            match key {
                "config" => self.words[0] = num(val)?,
                "config1" => self.words[1] = num(val)?,
                "config2" => self.words[2] = num(val)?,
                // The caller sets the period; names are cosmetic.
                "period" | "name" => {}
                _ => {
                    let fpath = dir.join("format").join(key);
                    if let Some(f) = read_trim(&fpath) {
                        let f = parse_format(&f)?;
                        let v = num(val)?;
                        let bits = deposit(&f, v).ok_or_else(|| format!("value {v:#x} too wide for term {key:?}"))?;
                        self.words[f.field as usize] |= bits;
                    } else if val.is_none() && depth == 0 {
                        let alias = dir.join("events").join(key);
                        let body = read_trim(&alias).ok_or_else(|| format!("{} has no format or event named {key:?}", dir.display()))?;
                        self.apply(dir, &body, depth + 1)?;
                    } else {
                        return Err(format!("{} has no format term {key:?}", dir.display()));
                    }
                }
            }
        }
        Ok(())
    }
}

fn event_in(dir: &Path, pmu: &str, terms: &str, display: &str, kind: AccessKind, precise: u8) -> Result<PmuEvent, String> {
    let mut c = Config::default();
    c.apply(dir, terms, 0)?;
    Ok(PmuEvent {
        name: format!("{pmu}/{display}/"),
        pmu_type: pmu_type(dir)?,
        config: c.words[0],
        config1: c.words[1],
        config2: c.words[2],
        precise_ip: precise,
        kind,
        ibs: false,
    })
}

/// IBS op event: count dispatched ops (`cnt_ctl`) rather than cycles so that
/// samples follow instructions, and filter user mode in the kernel (`swfilt`,
/// newer kernels) so unprivileged users can open it.
fn ibs_event(dir: &Path, kind: AccessKind) -> Result<PmuEvent, String> {
    let mut terms = Vec::new();
    for t in ["cnt_ctl", "swfilt"] {
        if dir.join("format").join(t).exists() {
            terms.push(t);
        }
    }
    let terms = terms.join(",");
    let mut c = Config::default();
    c.apply(dir, &terms, 0)?;
    Ok(PmuEvent {
        name: format!("ibs_op/{terms}/"),
        pmu_type: pmu_type(dir)?,
        config: c.words[0],
        config1: c.words[1],
        config2: c.words[2],
        precise_ip: 0,
        kind,
        ibs: true,
    })
}

fn named_event(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Load => "mem-loads",
        AccessKind::Store => "mem-stores",
    }
}

/// MEM_INST_RETIRED.ALL_LOADS / ALL_STORES (MEM_UOPS_RETIRED.* on older parts).
fn intel_fallback(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Load => "event=0xd0,umask=0x81",
        AccessKind::Store => "event=0xd0,umask=0x82",
    }
}

/// Find the precise memory event for `kind` on this machine, reading sysfs
/// under `sysfs_root` (normally [`SYSFS_PMU_ROOT`]).
pub fn discover(sysfs_root: &Path, kind: AccessKind) -> Result<PmuEvent, String> {
    let mut why = Vec::new();
    for pmu in INTEL_PMUS {
        let dir = sysfs_root.join(pmu);
        if !dir.join("type").exists() {
            continue;
        }
        let named = named_event(kind);
        let has_named = dir.join("events").join(named).exists();
        let intel = has_named || looks_intel(&dir);
        if !intel {
            continue; // e.g. AMD's core PMU: no data addresses; try IBS below
        }
        let precise = intel_precise(&dir);
        if precise == 0 {
            why.push(format!("{pmu}: PEBS unavailable (caps/max_precise=0)"));
            continue;
        }
        // mem-loads on Sapphire Rapids / Alder Lake P-cores only works inside a
        // group led by mem-loads-aux; ALL_LOADS gives addresses without that.
        let needs_aux = kind == AccessKind::Load && dir.join("events/mem-loads-aux").exists();
        if has_named && !needs_aux {
            return event_in(&dir, pmu, named, named, kind, precise);
        }
        let terms = intel_fallback(kind);
        return event_in(&dir, pmu, terms, terms, kind, precise);
    }
    let ibs = sysfs_root.join("ibs_op");
    if ibs.join("type").exists() {
        return ibs_event(&ibs, kind);
    }
    if sysfs_root.join("cpu").exists() {
        why.push("cpu: core PMU without precise memory events, and no ibs_op".into());
    }
    if why.is_empty() {
        why.push(format!("no cpu, cpu_core or ibs_op PMU under {} (virtual machine without PMU passthrough?)", sysfs_root.display()));
    }
    Err(format!("no PMU: {}", why.join("; ")))
}

/// Parse a user event spec like "cpu/mem-stores/", "cpu_core/event=0xd0,umask=0x82/",
/// "ibs_op//", "mem-loads", or "r82d0", optionally followed by `p`/`pp`/`ppp`
/// ("cpu/mem-stores/pp", "mem-loads:pp") to set precise_ip.
pub fn parse_event(sysfs_root: &Path, spec: &str, kind: AccessKind) -> Result<PmuEvent, String> {
    let spec = spec.trim();
    let (body, mods) = if let Some(first) = spec.find('/') {
        let last = spec.rfind('/').unwrap();
        if last == first {
            return Err(format!("event {spec:?}: missing closing '/'"));
        }
        (&spec[..=last], spec[last + 1..].trim_start_matches(':'))
    } else {
        match spec.split_once(':') {
            Some((b, m)) => (b, m),
            None => (spec, ""),
        }
    };
    let precise = if mods.is_empty() {
        None
    } else {
        let mut n = 0u8;
        for c in mods.chars() {
            match c {
                'p' => n += 1,
                'u' => {} // always user-only
                _ => return Err(format!("event {spec:?}: unsupported modifier {c:?}")),
            }
        }
        Some(n.min(3))
    };

    let mut ev = if let Some(first) = body.find('/') {
        let pmu = &body[..first];
        let terms = &body[first + 1..body.len() - 1];
        if pmu.is_empty() || pmu.contains("..") {
            return Err(format!("event {spec:?}: bad PMU name"));
        }
        let dir = sysfs_root.join(pmu);
        if !dir.join("type").exists() {
            return Err(format!("no PMU: {pmu} is not present under {}", sysfs_root.display()));
        }
        if pmu.starts_with("ibs_fetch") {
            return Err("ibs_fetch samples instruction fetches, which have no data address; use ibs_op".into());
        }
        if pmu.starts_with("ibs_op") {
            let mut c = Config::default();
            c.apply(&dir, terms, 0)?;
            PmuEvent {
                name: format!("{pmu}/{terms}/"),
                pmu_type: pmu_type(&dir)?,
                config: c.words[0],
                config1: c.words[1],
                config2: c.words[2],
                precise_ip: 0,
                kind,
                ibs: true,
            }
        } else {
            event_in(&dir, pmu, terms, terms, kind, intel_precise(&dir).max(1))?
        }
    } else if let Some(hex) = body.strip_prefix('r').filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit())) {
        let config = u64::from_str_radix(hex, 16).map_err(|_| format!("event {spec:?}: bad raw code"))?;
        PmuEvent { name: spec.to_string(), pmu_type: b::PERF_TYPE_RAW, config, config1: 0, config2: 0, precise_ip: 2, kind, ibs: false }
    } else {
        let found = INTEL_PMUS
            .iter()
            .map(|p| (p, sysfs_root.join(p)))
            .find(|(_, d)| d.join("type").exists() && d.join("events").join(body).exists());
        match found {
            Some((pmu, dir)) => event_in(&dir, pmu, body, body, kind, intel_precise(&dir).max(1))?,
            None => return Err(format!("no PMU: no PMU under {} has an event named {body:?}", sysfs_root.display())),
        }
    };
    if let Some(p) = precise {
        ev.precise_ip = p;
    }
    Ok(ev)
}

// ---------------------------------------------------------------------------
// perf_event_attr

/// `perf_event_attr` for sampling `ev` every `period` events, delivering
/// SIGTRAP with `sig_data` when `sigtrap` (Linux >= 5.13; needs remove_on_exec),
/// else no signal of its own (the caller routes it with F_SETSIG).
#[allow(clippy::field_reassign_with_default)] // union fields go through Deref
pub fn attr(ev: &PmuEvent, period: u64, sigtrap: bool, sig_data: u64) -> perf_event_attr {
    let mut a = perf_event_attr::default();
    a.type_ = ev.pmu_type;
    a.size = std::mem::size_of::<perf_event_attr>() as u32;
    a.config = ev.config;
    a.config1 = ev.config1;
    a.config2 = ev.config2;
    a.sample_period = if ev.ibs {
        // IBS rejects periods with the low nibble set; the minimum is 16.
        period.max(16).saturating_add(15) & !15
    } else {
        period.max(1)
    };
    a.sample_type = (b::PERF_SAMPLE_IP | b::PERF_SAMPLE_TID | b::PERF_SAMPLE_ADDR) as u64;
    if ev.ibs {
        a.sample_type |= b::PERF_SAMPLE_RAW as u64;
    }
    a.wakeup_events = 1;
    a.set_disabled(0);
    // Kernels without IBS swfilt (config2 bit 0) reject any exclude_* on
    // ibs_op with EINVAL; there we sample all modes (needs CAP_PERFMON or
    // paranoid <= 1) and parse_sample drops kernel samples.
    if !(ev.ibs && ev.config2 & 1 == 0) {
        a.set_exclude_kernel(1);
        a.set_exclude_hv(1);
    }
    a.set_precise_ip(ev.precise_ip as u64);
    if sigtrap {
        a.set_sigtrap(1);
        a.set_remove_on_exec(1);
        a.sig_data = sig_data;
    }
    a
}

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

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
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
    let mut r = Reader { b: body, pos: 0 };
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

// The ring is owned exclusively by this value.
unsafe impl Send for PmuSampler {}

fn page_size() -> usize {
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn open_error(ev: &PmuEvent, err: std::io::Error) -> String {
    let code = err.raw_os_error().unwrap_or(0);
    let what = format!("{} (type {}, config {:#x})", ev.name, ev.pmu_type, ev.config);
    match code {
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
    }
}

impl PmuSampler {
    /// Open `ev` on the calling thread and map a 1+[`RING_DATA_PAGES`] page ring.
    pub fn open(ev: &PmuEvent, period: u64, sigtrap: bool, sig_data: u64) -> Result<PmuSampler, String> {
        Self::open_on(ev, period, sigtrap, sig_data, 0)
    }

    /// Like [`PmuSampler::open`], on thread `tid` of this process (0: the caller).
    pub fn open_on(ev: &PmuEvent, period: u64, sigtrap: bool, sig_data: u64, tid: i32) -> Result<PmuSampler, String> {
        let mut a = attr(ev, period, sigtrap, sig_data);
        let fd = unsafe { sys::perf_event_open(&mut a, tid, -1, -1, b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong) };
        if fd < 0 {
            return Err(open_error(ev, std::io::Error::last_os_error()));
        }
        let len = page_size() * (1 + RING_DATA_PAGES);
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            unsafe { libc::close(fd) };
            return Err(format!("cannot map the ring buffer of {}: {err} (RLIMIT_MEMLOCK / perf_event_mlock_kb?)", ev.name));
        }
        Ok(PmuSampler {
            fd,
            ring: p as *mut u8,
            ring_len: len,
            mapped: true,
            sample_type: a.sample_type,
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
        unsafe { (*(std::ptr::addr_of_mut!((*meta).data_tail) as *const AtomicU64)).store(tail, Ordering::Release) };
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// munmap + close; idempotent, so usable in a forked child and by Drop.
    pub fn close(&mut self) {
        if !self.ring.is_null() {
            if self.mapped {
                unsafe { libc::munmap(self.ring as *mut libc::c_void, self.ring_len) };
            }
            self.ring = std::ptr::null_mut();
        }
        if self.fd >= 0 {
            unsafe { libc::close(self.fd) };
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
    use std::path::PathBuf;
    use std::sync::atomic::AtomicUsize;

    /// A throwaway sysfs tree; removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str) -> FakeSysfs {
            static N: AtomicUsize = AtomicUsize::new(0);
            let d = std::env::temp_dir().join(format!("witch-pmu-{}-{}-{}", std::process::id(), tag, N.fetch_add(1, Ordering::Relaxed)));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            FakeSysfs(d)
        }
        fn pmu(&self, name: &str, ty: u32, formats: &[(&str, &str)], events: &[(&str, &str)], caps: &[(&str, &str)]) -> &Self {
            let d = self.0.join(name);
            for (sub, list) in [("format", formats), ("events", events), ("caps", caps)] {
                if !list.is_empty() {
                    fs::create_dir_all(d.join(sub)).unwrap();
                }
                for (k, v) in list {
                    fs::write(d.join(sub).join(k), format!("{v}\n")).unwrap();
                }
            }
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("type"), format!("{ty}\n")).unwrap();
            self
        }
        fn vm_basics(&self) -> &Self {
            self.pmu("software", 1, &[], &[], &[]).pmu("tracepoint", 2, &[], &[], &[]).pmu("breakpoint", 5, &[], &[], &[]).pmu(
                "msr",
                9,
                &[("event", "config:0-63")],
                &[],
                &[],
            )
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const INTEL_FORMATS: &[(&str, &str)] = &[
        ("event", "config:0-7"),
        ("umask", "config:8-15"),
        ("edge", "config:18"),
        ("any", "config:21"),
        ("inv", "config:23"),
        ("cmask", "config:24-31"),
        ("ldlat", "config1:0-15"),
        ("offcore_rsp", "config1:0-63"),
    ];

    fn intel_classic() -> FakeSysfs {
        let s = FakeSysfs::new("intel");
        s.vm_basics().pmu(
            "cpu",
            4,
            INTEL_FORMATS,
            &[("mem-loads", "event=0xcd,umask=0x1,ldlat=3"), ("mem-stores", "event=0xd0,umask=0x82")],
            &[("max_precise", "3"), ("pmu_name", "skylake")],
        );
        s
    }

    #[test]
    fn format_ranges_and_deposit() {
        let f = parse_format("config:0-7,32-35").unwrap();
        assert_eq!(f, Format { field: 0, ranges: vec![(0, 7), (32, 35)] });
        assert_eq!(deposit(&f, 0x1d0), Some(0x1_0000_00d0));
        assert_eq!(deposit(&f, 0x1000), None);
        let f = parse_format("config1:0-15").unwrap();
        assert_eq!((f.field, deposit(&f, 3)), (1, Some(3)));
        assert_eq!(parse_format("config2:0").unwrap().ranges, vec![(0, 0)]);
        assert!(parse_format("config:7-3").is_err());
        assert!(parse_format("config:0-64").is_err());
    }

    #[test]
    fn discover_intel_classic() {
        let s = intel_classic();
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.pmu_type, st.config, st.config1, st.precise_ip, st.ibs), (4, 0x82d0, 0, 2, false));
        assert_eq!(st.name, "cpu/mem-stores/");
        assert_eq!(st.kind, AccessKind::Store);
        let ld = discover(&s.0, AccessKind::Load).unwrap();
        assert_eq!((ld.config, ld.config1, ld.kind), (0x01cd, 3, AccessKind::Load));
    }

    #[test]
    fn discover_intel_without_named_events_falls_back() {
        let s = FakeSysfs::new("intel-old");
        s.vm_basics().pmu("cpu", 4, INTEL_FORMATS, &[], &[]);
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.config, st.precise_ip), (0x82d0, 2));
        assert_eq!(discover(&s.0, AccessKind::Load).unwrap().config, 0x81d0);
    }

    #[test]
    fn discover_intel_hybrid_prefers_cpu_core() {
        let s = FakeSysfs::new("hybrid");
        s.vm_basics()
            .pmu(
                "cpu_atom",
                10,
                INTEL_FORMATS,
                &[("mem-loads", "event=0xd0,umask=0x5,ldlat=3"), ("mem-stores", "event=0xd0,umask=0x6")],
                &[("max_precise", "3")],
            )
            .pmu(
                "cpu_core",
                4,
                INTEL_FORMATS,
                &[
                    ("mem-loads", "event=0xcd,umask=0x01,ldlat=3"),
                    ("mem-loads-aux", "event=0x03,umask=0x82"),
                    ("mem-stores", "event=0xcd,umask=0x02"),
                ],
                &[("max_precise", "3"), ("pmu_name", "alderlake_hybrid")],
            );
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.pmu_type, st.config, st.name.as_str()), (4, 0x02cd, "cpu_core/mem-stores/"));
        // mem-loads would need the mem-loads-aux group leader: use ALL_LOADS.
        let ld = discover(&s.0, AccessKind::Load).unwrap();
        assert_eq!((ld.pmu_type, ld.config, ld.config1), (4, 0x81d0, 0));
    }

    #[test]
    fn discover_amd_ibs() {
        let s = FakeSysfs::new("amd");
        s.vm_basics()
            .pmu(
                "cpu",
                4,
                &[
                    ("event", "config:0-7,32-35"),
                    ("umask", "config:8-15"),
                    ("edge", "config:18"),
                    ("inv", "config:23"),
                    ("cmask", "config:24-31"),
                ],
                &[],
                &[("max_precise", "2")],
            )
            .pmu("ibs_fetch", 10, &[("rand_en", "config:57")], &[], &[])
            .pmu("ibs_op", 11, &[("cnt_ctl", "config:19"), ("swfilt", "config2:0")], &[], &[]);
        let ev = discover(&s.0, AccessKind::Store).unwrap();
        assert!(ev.ibs);
        assert_eq!((ev.pmu_type, ev.config, ev.config2, ev.precise_ip), (11, 1 << 19, 1, 0));
        assert_eq!(ev.kind, AccessKind::Store);
        let a = attr(&ev, 100, true, 7);
        assert_eq!(a.sample_period, 112);
        assert_eq!(a.exclude_kernel(), 1);
        assert_ne!(a.sample_type & b::PERF_SAMPLE_RAW as u64, 0);

        // Older kernel: no swfilt term, so no exclude_* bits (they'd be EINVAL).
        let s2 = FakeSysfs::new("amd-old");
        s2.vm_basics().pmu("ibs_op", 11, &[("cnt_ctl", "config:19")], &[], &[]);
        let ev = discover(&s2.0, AccessKind::Load).unwrap();
        assert_eq!((ev.config, ev.config2), (1 << 19, 0));
        assert_eq!(attr(&ev, 0x10000, false, 0).exclude_kernel(), 0);
    }

    #[test]
    fn discover_vm_has_no_pmu() {
        let s = FakeSysfs::new("vm");
        s.vm_basics();
        let e = discover(&s.0, AccessKind::Store).unwrap_err();
        assert!(e.starts_with("no PMU:"), "{e}");
        // A PMU passed through without PEBS cannot give addresses either.
        s.pmu("cpu", 4, INTEL_FORMATS, &[], &[("max_precise", "0"), ("pmu_name", "skylake")]);
        let e = discover(&s.0, AccessKind::Load).unwrap_err();
        assert!(e.starts_with("no PMU:") && e.contains("max_precise=0"), "{e}");
    }

    #[test]
    fn discover_on_this_machine_does_not_panic() {
        for k in [AccessKind::Load, AccessKind::Store] {
            println!("{k:?}: {:?}", discover(Path::new(SYSFS_PMU_ROOT), k));
        }
    }

    #[test]
    fn parse_event_specs() {
        let s = intel_classic();
        s.pmu("ibs_op", 11, &[("cnt_ctl", "config:19")], &[], &[]);
        let e = parse_event(&s.0, "cpu/mem-stores/", AccessKind::Store).unwrap();
        assert_eq!((e.pmu_type, e.config, e.precise_ip), (4, 0x82d0, 2));
        let e = parse_event(&s.0, "cpu/event=0xd0,umask=0x81/ppp", AccessKind::Load).unwrap();
        assert_eq!((e.config, e.precise_ip), (0x81d0, 3));
        let e = parse_event(&s.0, "mem-loads", AccessKind::Load).unwrap();
        assert_eq!((e.config, e.config1, e.name.as_str()), (0x01cd, 3, "cpu/mem-loads/"));
        let e = parse_event(&s.0, "mem-loads:p", AccessKind::Load).unwrap();
        assert_eq!(e.precise_ip, 1);
        let e = parse_event(&s.0, "ibs_op//", AccessKind::Load).unwrap();
        assert!(e.ibs);
        assert_eq!((e.pmu_type, e.config), (11, 0));
        let e = parse_event(&s.0, "ibs_op/cnt_ctl/", AccessKind::Load).unwrap();
        assert_eq!(e.config, 1 << 19);
        let e = parse_event(&s.0, "r82d0", AccessKind::Store).unwrap();
        assert_eq!((e.pmu_type, e.config), (b::PERF_TYPE_RAW, 0x82d0));
        assert!(parse_event(&s.0, "cpu/bogus=1/", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/umask=0x1ff/", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/mem-stores", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/mem-stores/x", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "nope/event=1/", AccessKind::Load).unwrap_err().starts_with("no PMU"));
        assert!(parse_event(&s.0, "mem-nothing", AccessKind::Load).is_err());
    }

    #[test]
    fn attr_bits() {
        let ev = PmuEvent {
            name: "cpu/mem-stores/".into(),
            pmu_type: 4,
            config: 0x82d0,
            config1: 0,
            config2: 0,
            precise_ip: 2,
            kind: AccessKind::Store,
            ibs: false,
        };
        let a = attr(&ev, 10007, true, 0xabc);
        assert_eq!(a.size as usize, std::mem::size_of::<perf_event_attr>());
        assert_eq!((a.type_, a.config, a.sample_period, a.wakeup_events), (4, 0x82d0, 10007, 1));
        assert_eq!(a.sample_type, (b::PERF_SAMPLE_IP | b::PERF_SAMPLE_TID | b::PERF_SAMPLE_ADDR) as u64);
        assert_eq!((a.exclude_kernel(), a.exclude_hv(), a.disabled(), a.precise_ip()), (1, 1, 0, 2));
        assert_eq!((a.sigtrap(), a.remove_on_exec(), a.sig_data), (1, 1, 0xabc));
        let a = attr(&ev, 10007, false, 0xabc);
        assert_eq!((a.sigtrap(), a.remove_on_exec(), a.sig_data), (0, 0, 0));
    }

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
        match PmuSampler::open(&ev, 100_003, true, 1) {
            Ok(mut s) => {
                println!("PMU sampler opened (fd {})", s.fd());
                let mut n = 0;
                s.drain(|_| n += 1);
                s.close();
            }
            Err(e) => {
                println!("{e}");
                assert!(!e.is_empty());
            }
        }
    }
}
