//! The vDSO: the code the kernel maps into every process for the system
//! calls that need no kernel entry (`clock_gettime`, `gettimeofday`,
//! `time`, `getcpu`). It is no file, so it is no module of the process's
//! map; the code cache still runs it (a translated call into it stays in
//! the cache, its accesses recorded like the C library's), so it is found
//! here, from the ELF header the kernel points the auxiliary vector at.

use std::sync::atomic::{AtomicU64, Ordering};

/// The vDSO's code, `[start, end)`: its loadable segment, page-rounded.
/// (0, 0) where there is none. Async-signal-safe (after the first call,
/// two atomic loads; the first reads the auxiliary vector and the header).
pub fn code() -> (u64, u64) {
    static START: AtomicU64 = AtomicU64::new(u64::MAX);
    static END: AtomicU64 = AtomicU64::new(0);
    let start = START.load(Ordering::Acquire);
    if start != u64::MAX {
        return (start, END.load(Ordering::Relaxed));
    }
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    // SAFETY: the auxiliary vector's vDSO header, mapped readable by the
    // kernel for the process's life, with its program headers after it.
    let (lo, hi) = if base == 0 { (0, 0) } else { unsafe { loaded(base as *const u8) } };
    END.store(hi, Ordering::Relaxed);
    START.store(lo, Ordering::Release);
    (lo, hi)
}

/// Does `pc` lie in the vDSO's code?
pub fn holds(pc: u64) -> bool {
    let (lo, hi) = code();
    pc >= lo && pc < hi
}

/// The address range of the loadable segment of the ELF image mapped at
/// `base` (the vDSO has one), page-rounded; (0, 0) if the header is not
/// a 64-bit ELF one or has no loadable segment.
///
/// # Safety
/// `base` must point at a readable ELF header followed, at its `e_phoff`,
/// by its readable program headers.
unsafe fn loaded(base: *const u8) -> (u64, u64) {
    const PT_LOAD: u32 = 1;
    // Unaligned reads of plain integers within the header and program
    // headers the caller vouches for.
    // SAFETY: as just said.
    let rd64 = |off: usize| unsafe { std::ptr::read_unaligned(base.add(off) as *const u64) };
    // SAFETY: as just said.
    let rd32 = |off: usize| unsafe { std::ptr::read_unaligned(base.add(off) as *const u32) };
    // SAFETY: as just said.
    let rd16 = |off: usize| unsafe { std::ptr::read_unaligned(base.add(off) as *const u16) };
    if rd32(0) != u32::from_le_bytes(*b"\x7fELF") || rd16(4) & 0xff != 2 {
        return (0, 0);
    }
    let (phoff, phentsize, phnum) = (rd64(0x20) as usize, rd16(0x36) as usize, rd16(0x38) as usize);
    if phentsize < 0x38 || phnum > 64 || phoff > 4096 {
        return (0, 0);
    }
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if rd32(ph) == PT_LOAD {
            // The image is mapped from its file offset 0 at `base`: the
            // segment's offset says where it starts.
            let (offset, memsz) = (rd64(ph + 0x08), rd64(ph + 0x28));
            let lo = base as u64 + offset;
            return (lo & !4095, (lo + memsz + 4095) & !4095);
        }
    }
    (0, 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vdso_is_found_where_the_kernel_says_it_is() {
        let maps = crate::sys::procfs::read_maps(None).unwrap();
        let Some(m) = maps.iter().find(|m| m.path == "[vdso]") else { return };
        let (lo, hi) = super::code();
        assert!(lo >= m.start && hi <= m.end && lo < hi, "{lo:#x}..{hi:#x} against [vdso] {:#x}..{:#x}", m.start, m.end);
        // SAFETY: dlsym with a NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"clock_gettime".as_ptr()) };
        assert!(!f.is_null());
        // (The C library's clock_gettime calls the vDSO's; it is not in it.)
        assert!(super::holds(lo) && !super::holds(hi) && !super::holds(f as u64));
    }
}
