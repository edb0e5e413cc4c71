//! Where a thread lives: its stacks and segment bases, which the handlers
//! need to read its registers and to unwind it.

/// Where the thread lives: its stacks and segment bases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Place {
    pub stack: (u64, u64),
    /// The alternate signal stack the handlers run on (the agent owns it;
    /// the engine only keeps samples off it).
    pub alt_stack: (u64, u64),
    pub fs_base: u64,
    pub gs_base: u64,
}

impl Place {
    /// The calling thread's place, given its stack and alternate stack:
    /// its segment bases are read now. Only system calls, so a signal
    /// handler may call it.
    pub fn here(stack: (u64, u64), alt_stack: (u64, u64)) -> Place {
        const ARCH_GET_FS: i32 = 0x1003;
        const ARCH_GET_GS: i32 = 0x1004;
        Place { stack, alt_stack, fs_base: arch_prctl_get(ARCH_GET_FS), gs_base: arch_prctl_get(ARCH_GET_GS) }
    }
}

/// The calling thread's stack, as the thread library reports it, read
/// from `/proc/self/maps` (not for signal handlers: it reads a file and
/// allocates, from the caller's allocator). Not `pthread_getattr_np`: that
/// reads the same file through `malloc`, which puts blocks of witch's in
/// the program's heap before the program's own, and moves those (a program
/// that aligns its tables to absolute addresses then lays them out
/// differently than natively). (0, 0) if the stack is not found.
pub fn thread_stack() -> (u64, u64) {
    let here = 0u8;
    let sp = &here as *const u8 as u64;
    let Ok(maps) = crate::sys::procfs::read_maps(None) else { return (0, 0) };
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) } == 0 { limit.rlim_cur } else { libc::RLIM_INFINITY };
    stack_in(&maps, sp, limit)
}

/// The stack that holds `sp` among `maps` (sorted by address): the main
/// thread's (`[stack]`) as far down as it may grow (its size limit, and no
/// lower than the mapping below it, as the thread library reports it), any
/// other (a thread's own mapping: a fork child of a thread other than the
/// first) its mapping.
pub fn stack_in(maps: &[crate::sys::procfs::Mapping], sp: u64, limit: libc::rlim_t) -> (u64, u64) {
    let Some(i) = maps.iter().position(|m| m.contains(sp)) else { return (0, 0) };
    let m = &maps[i];
    if m.path != "[stack]" {
        return (m.start, m.end);
    }
    let below = if i > 0 { maps[i - 1].end } else { 0 };
    let lo = if limit == libc::RLIM_INFINITY { below } else { m.end.saturating_sub(limit & !4095).max(below) };
    (lo.min(m.start), m.end)
}

fn arch_prctl_get(code: i32) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: ARCH_GET_FS/GS write one u64.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut u64) };
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::procfs::Mapping;

    fn map(start: u64, end: u64, path: &str) -> Mapping {
        Mapping { start, end, read: true, write: true, exec: false, offset: 0, inode: 0, path: path.into() }
    }

    #[test]
    fn the_first_threads_stack_reaches_down_to_its_limit_or_the_mapping_below() {
        let maps = [map(0x1000, 0x2000, "/bin/x"), map(0x7f00_0000, 0x7f10_0000, ""), map(0x7fff_0000, 0x7fff_8000, "[stack]")];
        let sp = 0x7fff_4000;
        assert_eq!(stack_in(&maps, sp, 8 << 20), (0x7fff_8000 - (8 << 20), 0x7fff_8000));
        // A limit past the mapping below stops there; no limit: the same.
        assert_eq!(stack_in(&maps, sp, 4 << 30), (0x7f10_0000, 0x7fff_8000));
        assert_eq!(stack_in(&maps, sp, libc::RLIM_INFINITY), (0x7f10_0000, 0x7fff_8000));
        // Never above what is mapped already.
        assert_eq!(stack_in(&maps, sp, 4096), (0x7fff_0000, 0x7fff_8000));
        // Another thread's stack is its mapping; nothing holds 0x3000.
        assert_eq!(stack_in(&maps, 0x7f08_0000, 8 << 20), (0x7f00_0000, 0x7f10_0000));
        assert_eq!(stack_in(&maps, 0x3000, 8 << 20), (0, 0));
    }

    /// What the thread library says of a thread's stack.
    fn from_thread_library() -> (u64, u64) {
        // SAFETY: pthread_getattr_np fills `attr`, destroyed after use.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
            let mut addr: *mut libc::c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            (addr as u64, addr as u64 + size as u64)
        }
    }

    #[test]
    fn a_threads_stack_is_where_the_thread_library_says() {
        // (The test harness runs this on a thread it created.)
        let (lo, hi) = thread_stack();
        let (tlo, thi) = from_thread_library();
        let here = 0u8;
        let sp = &here as *const u8 as u64;
        assert!(lo <= sp && sp < hi, "{lo:#x}..{hi:#x} does not hold {sp:#x}");
        assert_eq!(hi, thi, "top: ours {lo:#x}..{hi:#x}, the thread library's {tlo:#x}..{thi:#x}");
        assert!(lo <= tlo + 4096 && tlo <= lo + 4096, "bottom: ours {lo:#x}..{hi:#x}, the thread library's {tlo:#x}..{thi:#x}");
    }
}
