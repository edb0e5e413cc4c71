//! The precise instruction behind a watchpoint trap.
//!
//! A data breakpoint traps after the access, so the signal context's PC is
//! one instruction late (Witch §4.5). Without LBR we decode forward from the
//! start of the enclosing function (symbol or `.eh_frame` FDE) to the context
//! PC, cache the result per PC, and verify that the instruction found really
//! touches the watched address using the registers after the access (with
//! known implicit updates undone). Control transfers that store or load
//! (call, ret) land elsewhere and are recognised from the stack.

use crate::modules::ProcessMap;
use crate::sys::mem::Reserved;
use crate::x86::decode::{Access, Analyzer, Decoded, Regs};

const CACHE: usize = 4096;
/// Longest forward decode, in bytes, before giving up.
const MAX_SCAN: u64 = 1 << 16;

/// Per-thread cache: context PC → start of the instruction that ends there,
/// and the decoded layout of the last few functions. Its memory is
/// reserved (`sys::mem::Reserved`): pages become memory only as PCs and
/// functions land on them.
pub struct PrecisePcCache {
    keys: Reserved<u64>,
    vals: Reserved<u64>,
    funcs: [FuncLayout; FUNCS],
    /// Each function's instruction starts and direct-branch targets, a bit
    /// per byte: `2 * WORDS` words a function (starts, then targets).
    bits: Reserved<u64>,
    next_func: usize,
}

/// Functions whose layout is kept. Decoding a large function (an
/// interpreter's dispatch loop: thousands of instructions) costs ~0.5 ms;
/// without this, every new PC in it paid that again.
const FUNCS: usize = 8;
const WORDS: usize = (MAX_SCAN / 64) as usize;

/// Which function a layout slot holds.
#[derive(Clone, Copy, Default)]
struct FuncLayout {
    start: u64,
    /// End of what decoded (0: slot unused).
    end: u64,
}

impl FuncLayout {
    /// Words of each bit set the function's bytes reach.
    fn words(&self) -> usize {
        (self.end.saturating_sub(self.start) as usize).div_ceil(64).min(WORDS)
    }
    fn bit(bits: &[u64], off: u64) -> bool {
        let i = off as usize;
        i / 64 < bits.len() && bits[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(bits: &mut [u64], off: u64) {
        let i = off as usize;
        if i / 64 < bits.len() {
            bits[i / 64] |= 1 << (i % 64);
        }
    }
}

impl Default for PrecisePcCache {
    fn default() -> Self {
        Self::try_new().expect("address space for the precise-PC cache")
    }
}

impl PrecisePcCache {
    /// The address space a cache reserves, in bytes.
    pub const RESERVED_BYTES: usize = (2 * CACHE + FUNCS * 2 * WORDS) * std::mem::size_of::<u64>();

    /// A cache, or None if its memory cannot be reserved.
    pub fn try_new() -> Option<Self> {
        Some(PrecisePcCache {
            keys: Reserved::new(CACHE)?,
            vals: Reserved::new(CACHE)?,
            funcs: [FuncLayout::default(); FUNCS],
            bits: Reserved::new(FUNCS * 2 * WORDS)?,
            next_func: 0,
        })
    }

    /// Forgets every PC and layout, keeping the memory (the cold path can
    /// then be timed without allocating).
    pub fn forget(&mut self) {
        self.keys.fill(0);
        for k in 0..FUNCS {
            self.forget_function(k);
        }
        self.next_func = 0;
    }

    /// Forget layout slot `k`, clearing only the bits its function set:
    /// the rest is zero already, and pages no function reached stay
    /// untouched (16 KiB a slot otherwise).
    fn forget_function(&mut self, k: usize) {
        let words = self.funcs[k].words();
        let (starts, targets) = self.bits[k * 2 * WORDS..(k + 1) * 2 * WORDS].split_at_mut(WORDS);
        starts[..words].fill(0);
        targets[..words].fill(0);
        self.funcs[k].end = 0;
    }

    /// Layout slot `k`'s bits: its instruction starts and branch targets.
    fn bits(&self, k: usize) -> (&[u64], &[u64]) {
        self.bits[k * 2 * WORDS..(k + 1) * 2 * WORDS].split_at(WORDS)
    }

    fn slot(pc: u64) -> usize {
        ((pc ^ (pc >> 12)) as usize) & (CACHE - 1)
    }
    fn get(&self, pc: u64) -> Option<u64> {
        let i = Self::slot(pc);
        (self.keys[i] == pc).then(|| self.vals[i])
    }
    fn put(&mut self, pc: u64, prev: u64) {
        let i = Self::slot(pc);
        self.keys[i] = pc;
        self.vals[i] = prev;
    }
}

/// Decode the function at `start` (up to `limit`) into `f`, with one
/// decoder over its bytes in place (a decoder per instruction, on a copy,
/// cost twice as much).
fn layout(map: &ProcessMap, cache: &mut PrecisePcCache, k: usize, start: u64, limit: u64) {
    cache.forget_function(k);
    let (starts, targets) = cache.bits[k * 2 * WORDS..(k + 1) * 2 * WORDS].split_at_mut(WORDS);
    let f = &mut cache.funcs[k];
    f.start = start;
    f.end = start + 1;
    let Some(m) = map.module(start) else { return };
    let stop = limit.min(start + MAX_SCAN).min(m.end);
    if crate::modules::checked_reads() && !crate::sys::mem::readable_own(start, stop - start) {
        return;
    }
    // SAFETY: [start, stop) lies inside one executable file mapping of the
    // module map (stop <= m.end), which stays mapped while its code can run
    // (see `code_at`); code is not written, so the slice may alias nothing
    // mutable. A plain read: async-signal-safe.
    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, (stop - start) as usize) };
    let mut dec = iced_x86::Decoder::with_ip(64, bytes, start, iced_x86::DecoderOptions::NONE);
    let mut i = iced_x86::Instruction::default();
    let mut ip = start;
    while dec.can_decode() {
        dec.decode_out(&mut i);
        if i.is_invalid() {
            break;
        }
        FuncLayout::set(starts, ip - start);
        if matches!(i.op0_kind(), iced_x86::OpKind::NearBranch64) {
            let t = i.near_branch64();
            if t >= start && t < stop {
                FuncLayout::set(targets, t - start);
            }
        }
        ip = i.next_ip();
    }
    f.end = ip.max(start + 1);
}

/// Instruction bytes at `ip`, read directly when safely inside the module.
pub fn code_at<'a>(map: &ProcessMap, ip: u64, buf: &'a mut [u8; 16]) -> Option<&'a [u8]> {
    let m = map.module(ip)?;
    let n = ((m.end - ip) as usize).min(16);
    if crate::modules::checked_reads() {
        return crate::sys::mem::read_own(ip, &mut buf[..n]).then_some(&buf[..n]);
    }
    // SAFETY: [ip, ip + n) lies inside `m`, an executable file mapping
    // listed in /proc/self/maps when the map was built; on x86-64 such a
    // mapping is readable. The map is refreshed after dlopen; a module
    // unloaded since (dlclose) whose range was reused by a smaller mapping
    // would make this read fault, which is why code is only read at PCs and
    // return addresses inside a listed module. A plain copy into the
    // caller's buffer: async-signal-safe.
    unsafe { std::ptr::copy_nonoverlapping(ip as *const u8, buf.as_mut_ptr(), n) };
    Some(&buf[..n])
}

/// Cached marker: `end` is the target of a direct branch in its function.
const TARGET: u64 = 1 << 63;

/// Start of the instruction that ends exactly at `end`, by decoding forward
/// from the function start, and whether `end` is also the target of a
/// direct branch in that function (then the instruction executed before it
/// may have been that branch, not the linear predecessor).
pub fn previous_instruction(map: &ProcessMap, cache: &mut PrecisePcCache, end: u64) -> (Option<u64>, bool) {
    if let Some(p) = cache.get(end) {
        let prev = p & !TARGET;
        return ((prev != 0).then_some(prev), p & TARGET != 0);
    }
    let Some(start) = map.function_start(end.wrapping_sub(1)) else {
        return (None, false);
    };
    // Scan the whole function (up to the next known start) for branch targets.
    let limit = map.next_function_start(start).unwrap_or(u64::MAX).min(start + MAX_SCAN).max(end);
    let k = match cache.funcs.iter().position(|f| f.end != 0 && f.start == start) {
        Some(k) => k,
        None => {
            let k = cache.next_func;
            cache.next_func = (k + 1) % FUNCS;
            layout(map, cache, k, start, limit);
            k
        }
    };
    let f = cache.funcs[k];
    let (starts, targets) = cache.bits(k);
    let off = end - start;
    // `end` must be an instruction boundary (or where decoding stopped).
    let mut found = 0;
    if end <= f.end && (end == f.end || FuncLayout::bit(starts, off)) {
        found = (0..off).rev().find(|&o| FuncLayout::bit(starts, o)).map(|o| start + o).unwrap_or(0);
    }
    let target = FuncLayout::bit(targets, off);
    cache.put(end, found | if target { TARGET } else { 0 });
    ((found != 0).then_some(found), target)
}

/// What we learned about the access that trapped.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrapAccess {
    /// Address of the trapping instruction (the context PC when imprecise).
    pub pc: u64,
    pub access: Access,
    /// The instruction was found and its access verified.
    pub precise: bool,
}

pub(crate) fn overlapping(d: &Decoded, addr: u64, len: u64) -> Option<Access> {
    // Prefer a load when one access reads and another writes the range:
    // the read happens first (e.g. `add [m], r`).
    let mut best: Option<Access> = None;
    for a in d.accesses() {
        if a.overlap(addr, len) > 0 {
            match best {
                Some(b) if b.read => {}
                _ => best = Some(*a),
            }
        }
    }
    best.or_else(|| if d.rep { rep_group(d, addr, len) } else { None })
}

/// Bytes of elements a `rep` string instruction may run between a data
/// breakpoint's hit and its trap: the processor reports it at the end of a
/// group of iterations, not after each. Measured here on `rep movsb` and
/// `rep stosb` of bytes: the registers at the trap were 7 to 127 bytes past
/// the watched element (155 traps, spread evenly), so groups of 128 bytes.
const REP_GROUP: u64 = 128;

/// The element of a `rep` string instruction's last group (see
/// [`REP_GROUP`]) that holds [addr, addr+len): `d`'s accesses are its last
/// element's (registers undone by one element).
fn rep_group(d: &Decoded, addr: u64, len: u64) -> Option<Access> {
    let mut best: Option<Access> = None;
    for a in d.accesses() {
        let el = u64::from(a.len.max(1));
        // The group ran down to (or, with the direction flag, up from) the last element.
        let (lo, hi) = if d.df { (a.addr, a.addr + REP_GROUP) } else { (a.addr.saturating_sub(REP_GROUP - el), a.addr + el) };
        if addr + len <= lo || addr >= hi {
            continue;
        }
        // The element holding the watched address.
        let at = lo + (addr.max(lo) - lo) / el * el;
        let e = Access { addr: at, ..*a };
        match best {
            Some(b) if b.read => {}
            _ => best = Some(e),
        }
    }
    best
}

/// Find the access behind a trap on [addr, addr+len) with registers `regs`
/// (after the access) and context PC `regs.rip`.
pub fn recover(
    map: &ProcessMap,
    cache: &mut PrecisePcCache,
    an: &mut Analyzer,
    regs: &Regs,
    addr: u64,
    len: u64,
    stack: (u64, u64),
) -> Option<TrapAccess> {
    let ctx = regs.rip;
    let mut buf = [0u8; 16];
    // 1. The instruction just before the context PC.
    if let (Some(prev), _) = previous_instruction(map, cache, ctx) {
        if let Some(bytes) = code_at(map, prev, &mut buf) {
            if let Some(d) = an.decode(bytes, prev, regs, true) {
                if let Some(a) = overlapping(&d, addr, len) {
                    return Some(TrapAccess { pc: prev, access: a, precise: true });
                }
                // An address register overwritten by the instruction itself
                // (mov rax,[rax]) can't be checked; take its access as is.
                if d.n == 1 && crate::x86::decode::clobbers_address(bytes, prev) {
                    let mut a = d.accesses[0];
                    a.addr = addr;
                    return Some(TrapAccess { pc: prev, access: a, precise: true });
                }
            }
        }
    }
    // 2. A rep string instruction traps between iterations with rip on itself.
    if let Some(bytes) = code_at(map, ctx, &mut buf) {
        if let Some(d) = an.decode(bytes, ctx, regs, true) {
            if d.rep {
                if let Some(a) = overlapping(&d, addr, len) {
                    return Some(TrapAccess { pc: ctx, access: a, precise: true });
                }
            }
        }
    }
    // 3. call: the return address was just stored at rsp.
    let sp = regs.sp();
    // SAFETY: called with sp and sp - 8, and reads only inside `stack`, the
    // thread's stack. The interrupted sp points into its mapped part; sp - 8
    // is read only when the watched range overlaps it, i.e. the program
    // accessed it when it was sampled, so the stack mapping covers it (stacks
    // do not shrink). The thread is in this handler, so its own code is not
    // writing the slot. A plain read: async-signal-safe.
    let read_stack = |a: u64| (a >= stack.0 && a + 8 <= stack.1).then(|| unsafe { std::ptr::read_volatile(a as *const u64) });
    let store_at_sp = Access { addr: sp, len: 8, read: false, write: true, float: Default::default(), elem: 0 };
    if store_at_sp.overlap(addr, len) > 0 {
        if let Some(ra) = read_stack(sp) {
            if let (Some(call), _) = previous_instruction(map, cache, ra) {
                return Some(TrapAccess { pc: call, access: store_at_sp, precise: true });
            }
        }
    }
    // 4. ret: loaded the return address at rsp-8, which now equals the PC.
    let load_below_sp = Access { addr: sp.wrapping_sub(8), len: 8, read: true, write: false, float: Default::default(), elem: 0 };
    if load_below_sp.overlap(addr, len) > 0 && read_stack(sp.wrapping_sub(8)) == Some(ctx) {
        return Some(TrapAccess { pc: ctx, access: load_below_sp, precise: false });
    }
    None
}
