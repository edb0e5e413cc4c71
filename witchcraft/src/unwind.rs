//! Calling contexts at a sample or a trap, walked with framehop.
//!
//! Allocation-free: the module map is built outside the handler, the cache
//! uses `MustNotAllocateDuringUnwind`, and stack reads are bounds-checked
//! against the thread's stack so a bad frame can't fault. Modules without
//! unwind info fall back to frame pointers (framehop's own fallback rule).

use crate::modules::ProcessMap;
use crate::x86::decode::Regs;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

pub const MAX_FRAMES: usize = 128;

pub type Cache = CacheX86_64<MustNotAllocateDuringUnwind>;

pub fn new_cache() -> Box<Cache> {
    Box::new(CacheX86_64::new_in())
}

/// Lookup addresses innermost first: `leaf` itself, then each return
/// address minus one. Returns the number written.
pub fn walk(map: &ProcessMap, cache: &mut Cache, regs: &Regs, leaf: u64, stack: (u64, u64), out: &mut [u64; MAX_FRAMES]) -> usize {
    // Frames live at and above the interrupted stack pointer: reads below it
    // are a bad frame's, and for the main thread `stack` (from the thread
    // library) reaches down to the stack's rlimit, below the part mapped so
    // far, where a read would grow the stack or, in the guard gap, fault.
    let (lo, hi) = (stack.0.max(regs.sp()), stack.1);
    let mut read = |addr: u64| -> Result<u64, ()> {
        if addr >= lo && addr.checked_add(8).is_some_and(|e| e <= hi) && addr.is_multiple_of(8) {
            // SAFETY: an aligned u64 between the interrupted stack pointer
            // and the top of the thread's stack: the mapped, in-use part of
            // it (stack memory is never unmapped under a live thread). The
            // thread is in this handler, so its code is not writing there.
            // A plain read: async-signal-safe.
            Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
        } else {
            Err(())
        }
    };
    out[0] = leaf;
    let mut n = 1;
    let uregs = UnwindRegsX86_64::new(regs.rip, regs.sp(), regs.bp());
    let mut it = map.unwinder.iter_frames(regs.rip, uregs, cache, &mut read);
    // The first frame is the context PC itself; we already stored `leaf`.
    let _ = it.next();
    while n < MAX_FRAMES {
        match it.next() {
            Ok(Some(f @ FrameAddress::ReturnAddress(_))) => {
                // The agent's thread-start trampoline: the program's part
                // of the context ends below it (its frames have no unwind
                // data in the map, and aren't the program's code).
                if f.address_for_lookup() >= map.own.0 && f.address_for_lookup() < map.own.1 {
                    break;
                }
                out[n] = f.address_for_lookup();
                n += 1;
            }
            Ok(Some(FrameAddress::InstructionPointer(_))) => {}
            _ => break,
        }
    }
    n
}
