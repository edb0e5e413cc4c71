//! Memory through the kernel: reading it with `process_vm_readv`, which
//! never faults on an unmapped address and never trips our own user-mode
//! watchpoints (kernel accesses are excluded by `exclude_kernel`;
//! async-signal-safe), and tables reserved with `mmap` ([`Reserved`]).

/// Copy `out.len()` bytes at `addr` of process `pid` into `out`; false
/// unless all of them could be read.
pub fn read(pid: i32, addr: u64, out: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: out.as_mut_ptr() as *mut libc::c_void, iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: the local iovec covers exactly `out`; the remote side is
    // checked by the kernel.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

/// The same within this process.
pub fn read_own(addr: u64, out: &mut [u8]) -> bool {
    // SAFETY: getpid has no preconditions.
    read(unsafe { libc::getpid() }, addr, out)
}

/// Can every page of [addr, addr + len) of this process be read now?
/// One kernel read of a byte per page.
pub fn readable_own(addr: u64, len: u64) -> bool {
    const PAGE: u64 = 4096;
    let mut b = [0u8; 1];
    let end = addr.saturating_add(len.max(1));
    let mut a = addr;
    while a < end {
        if !read_own(a, &mut b) {
            return false;
        }
        a = (a & !(PAGE - 1)) + PAGE;
    }
    true
}

/// Where witch's own memory goes: a region of its own, far from where the
/// kernel puts a program's mappings (downward from below the stacks) and
/// its heap (just above the executable), each mapping asked for at the next
/// free address of it (a hint; where that is taken the kernel places the
/// mapping as usual). Left to the kernel, witch's tables landed in holes
/// the program had made in its own mappings, and a program that later
/// unmapped a range spanning such a hole (correct when no other thread
/// maps memory) unmapped witch's table under a running signal handler.
const OWN_REGION: u64 = 0x3e00_0000_0000;
static OWN_NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(OWN_REGION);

/// The address to ask for a mapping of `bytes` of witch's own (a guard of
/// 64 KiB after each). Async-signal-safe.
fn own_hint(bytes: usize) -> *mut libc::c_void {
    const GAP: u64 = 64 << 10;
    let span = (bytes as u64).saturating_add(GAP + 4095) & !4095;
    OWN_NEXT.fetch_add(span, std::sync::atomic::Ordering::Relaxed) as *mut libc::c_void
}

/// Witch's region so far: where [`map_own`] has asked for its mappings
/// (a mapping the kernel had to place elsewhere is not in it).
pub fn own_region() -> (u64, u64) {
    (OWN_REGION, OWN_NEXT.load(std::sync::atomic::Ordering::Relaxed))
}

/// A private anonymous mapping of witch's own (in its region, see
/// [`OWN_REGION`]): `mmap` with `prot` and `MAP_PRIVATE | MAP_ANONYMOUS |
/// flags`. Returns `MAP_FAILED` on failure. Async-signal-safe.
/// The system call itself, not the C library's `mmap`: witch's memory is
/// none of the program's business, nor of the agent's interposers.
pub fn map_own(bytes: usize, prot: libc::c_int, flags: libc::c_int) -> *mut libc::c_void {
    map_own_fd(bytes, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags, -1)
}

/// A mapping of `bytes` of file or perf event `fd` (from its start; -1
/// with `MAP_ANONYMOUS`), of witch's own, in its region (see [`map_own`]):
/// `mmap` with `prot` and `flags`. Returns `MAP_FAILED` on failure.
/// Async-signal-safe.
pub fn map_own_fd(bytes: usize, prot: libc::c_int, flags: libc::c_int, fd: i32) -> *mut libc::c_void {
    // SAFETY: a new mapping, never MAP_FIXED (the address is a hint):
    // nothing mapped is replaced.
    mapped(unsafe { libc::syscall(libc::SYS_mmap, own_hint(bytes), bytes, prot, flags, fd as i64, 0i64) })
}

/// `bytes` of memory of witch's own mapped twice, side by side in its
/// region: executable (and readable) at the first address returned, and
/// writable (and readable) `bytes` above it, the same pages: for a process
/// that may not have memory both writable and executable
/// (`prctl(PR_SET_MDWE)` refuses such a mapping with EACCES, not a new
/// one that is executable only). Neither view is inherited by a fork
/// child (shared pages would be written by both). None on failure, with
/// errno the failing call's. Async-signal-safe.
pub fn map_own_twice(bytes: usize) -> Option<*mut libc::c_void> {
    // SAFETY: each call below is a system call on witch's own descriptor
    // and its own new reservation; MAP_FIXED only replaces pages of that
    // reservation, which nothing else uses.
    unsafe {
        let fd = libc::syscall(libc::SYS_memfd_create, c"witch-cache".as_ptr(), libc::MFD_CLOEXEC) as i32;
        if fd < 0 {
            return None;
        }
        let sized = libc::syscall(libc::SYS_ftruncate, fd, bytes as i64) == 0;
        let reserved = map_own(2 * bytes, libc::PROT_NONE, libc::MAP_NORESERVE);
        let mut ok = sized && reserved != libc::MAP_FAILED;
        for (at, prot) in [(0, libc::PROT_READ | libc::PROT_EXEC), (bytes, libc::PROT_READ | libc::PROT_WRITE)] {
            if ok {
                let want = (reserved as usize + at) as i64;
                let flags = libc::MAP_SHARED | libc::MAP_FIXED;
                let got = libc::syscall(libc::SYS_mmap, want, bytes, prot, flags, fd as i64, 0i64);
                ok = got == want && libc::syscall(libc::SYS_madvise, want, bytes, libc::MADV_DONTFORK) == 0;
            }
        }
        let errno = *libc::__errno_location();
        libc::syscall(libc::SYS_close, fd);
        if !ok && reserved != libc::MAP_FAILED {
            unmap_own(reserved, 2 * bytes);
        }
        *libc::__errno_location() = errno;
        ok.then_some(reserved)
    }
}

/// A raw `mmap`/`mremap` system call's result as a mapping: an error
/// (-4095..-1) is `MAP_FAILED`.
fn mapped(r: libc::c_long) -> *mut libc::c_void {
    if r < 0 && r > -4096 {
        libc::MAP_FAILED
    } else {
        r as *mut libc::c_void
    }
}

/// Give back `[p, p + bytes)` of witch's own memory (the system call, past
/// the agent's `munmap` interposer, which keeps a program's `munmap` off
/// witch's memory). Async-signal-safe.
///
/// # Safety
/// The range must be witch's own mapping, unused from here on.
pub unsafe fn unmap_own(p: *mut libc::c_void, bytes: usize) {
    // SAFETY: the caller's promise.
    unsafe { libc::syscall(libc::SYS_munmap, p, bytes) };
}

/// Change the protection of `[p, p + bytes)` of witch's own memory to
/// `prot` (the system call, past the agent's `mprotect` interposer, which
/// looks the C library's up on first use: not in a handler). True
/// on success. Async-signal-safe.
///
/// # Safety
/// The range must be page-aligned, inside one of witch's own mappings,
/// and nothing may use it in a way `prot` forbids.
pub unsafe fn protect_own(p: *mut u8, bytes: usize, prot: libc::c_int) -> bool {
    // SAFETY: the caller's promise.
    unsafe { libc::syscall(libc::SYS_mprotect, p, bytes, prot) == 0 }
}

/// Move and grow witch's own mapping `[old, old + old_bytes)` to `bytes`,
/// into its region. Returns `MAP_FAILED` on failure (the old mapping then
/// stays). Not for signal handlers (it may make two system calls).
///
/// # Safety
/// `[old, old + old_bytes)` must be one of witch's own mappings, and
/// nothing may use its addresses after a success.
pub unsafe fn grow_own(old: *mut libc::c_void, old_bytes: usize, bytes: usize) -> *mut libc::c_void {
    let to = map_own(bytes, libc::PROT_NONE, libc::MAP_NORESERVE);
    if to == libc::MAP_FAILED {
        return to;
    }
    // SAFETY: `to` is the placeholder just made (ours, replaced whole);
    // `old` is witch's own mapping (the caller's promise).
    let r = mapped(unsafe { libc::syscall(libc::SYS_mremap, old, old_bytes, bytes, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to) });
    if r == libc::MAP_FAILED {
        // SAFETY: the placeholder, unused.
        unsafe { unmap_own(to, bytes) };
    }
    r
}

/// Types whose all-zero bytes are a valid value (the pages of a fresh
/// [`Reserved`] are zero).
///
/// # Safety
/// All-zero bytes must be a valid value of the type.
pub unsafe trait Zeroable: Copy {}

// SAFETY: integers are valid as zero.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for u64 {}

/// `cap` values of `T` in memory of their own, mapped with `mmap` and
/// zero until written: a page becomes memory when it is first touched, so
/// a table reserved at its largest costs only what it holds. It takes
/// address space at once (what `ulimit -v` limits): making one fails
/// rather than aborting the process. Reading and writing it is plain
/// memory access (async-signal-safe); making, growing and dropping it are
/// system calls, outside signal handlers.
pub struct Reserved<T: Zeroable> {
    ptr: std::ptr::NonNull<T>,
    cap: usize,
}

// SAFETY: the memory is owned by the value, like a Box<[T]>.
unsafe impl<T: Zeroable + Send> Send for Reserved<T> {}
// SAFETY: as above; shared access only reads.
unsafe impl<T: Zeroable + Sync> Sync for Reserved<T> {}

impl<T: Zeroable> Reserved<T> {
    /// `cap` zero values, or None if the address space cannot be had.
    pub fn new(cap: usize) -> Option<Reserved<T>> {
        let bytes = cap.checked_mul(std::mem::size_of::<T>())?;
        if bytes == 0 {
            return Some(Reserved { ptr: std::ptr::NonNull::dangling(), cap });
        }
        // A fresh private anonymous mapping, owned by the value.
        let p = map_own(bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE);
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Reserved { ptr: std::ptr::NonNull::new(p as *mut T)?, cap })
    }

    /// No values, and no memory (a table that could not be had).
    pub fn empty() -> Reserved<T> {
        Reserved { ptr: std::ptr::NonNull::dangling(), cap: 0 }
    }

    pub fn len(&self) -> usize {
        self.cap
    }

    pub fn is_empty(&self) -> bool {
        self.cap == 0
    }

    /// The size of the reservation, in bytes.
    pub fn bytes(&self) -> usize {
        self.cap * std::mem::size_of::<T>()
    }

    /// Room for `cap` values, the ones so far kept (the memory may move);
    /// false if the address space cannot be had. Not for signal handlers.
    pub fn grow(&mut self, cap: usize) -> bool {
        if cap <= self.cap {
            return true;
        }
        let Some(bytes) = cap.checked_mul(std::mem::size_of::<T>()) else { return false };
        if self.bytes() == 0 {
            return Reserved::<T>::new(cap).map(|r| *self = r).is_some();
        }
        // SAFETY: our own mapping, moved (not copied) by the kernel; the
        // new pages are zero; the old addresses are not used after it.
        let p = unsafe { grow_own(self.ptr.as_ptr() as *mut libc::c_void, self.bytes(), bytes) };
        match std::ptr::NonNull::new(p as *mut T) {
            Some(ptr) if p != libc::MAP_FAILED => {
                self.ptr = ptr;
                self.cap = cap;
                true
            }
            _ => false,
        }
    }

    /// Zero the first `n` values again, giving their pages back to the
    /// system (they read as zero and cost nothing until touched again).
    pub fn clear(&mut self, n: usize) {
        let n = n.min(self.cap);
        let bytes = n * std::mem::size_of::<T>();
        let whole = bytes & !4095;
        if whole > 0 {
            // SAFETY: whole pages at the start of our own mapping; anonymous
            // private pages read as zero after MADV_DONTNEED.
            unsafe { libc::madvise(self.ptr.as_ptr() as *mut libc::c_void, whole, libc::MADV_DONTNEED) };
        }
        // SAFETY: the rest, inside the mapping, written as zero bytes (a valid T).
        unsafe { std::ptr::write_bytes((self.ptr.as_ptr() as *mut u8).add(whole), 0, bytes - whole) };
    }
}

impl<T: Zeroable> std::ops::Deref for Reserved<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `cap` values of mapped memory, valid as zero or as written.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }
}

impl<T: Zeroable> std::ops::DerefMut for Reserved<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, owned exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl<T: Zeroable> Drop for Reserved<T> {
    fn drop(&mut self) {
        if self.bytes() > 0 {
            // SAFETY: the mapping made by `new`, no longer referenced.
            unsafe { unmap_own(self.ptr.as_ptr() as *mut libc::c_void, self.bytes()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Code written through the upper view runs from the lower one, which
    /// cannot be written.
    #[test]
    fn memory_mapped_twice_runs_below_what_is_written_above() {
        let bytes = 1 << 16;
        let low = map_own_twice(bytes).expect("a memfd mapped twice") as *mut u8;
        let high = low.wrapping_add(bytes);
        // mov eax, 42; ret
        let code = [0xb8, 42, 0, 0, 0, 0xc3];
        // SAFETY: the upper view is writable, `bytes` long; the lower one
        // holds the same pages, executable, and nothing else runs there.
        let got = unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), high.add(100), code.len());
            let f: extern "C" fn() -> i32 = std::mem::transmute(low.add(100));
            f()
        };
        assert_eq!(got, 42);
        // The lower view is executable and not writable, the upper one
        // the reverse, the same shared pages.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let perms = |a: *mut u8| {
            let a = a as u64;
            maps.lines().find_map(|l| {
                let (range, rest) = l.split_once(' ')?;
                let (s, e) = range.split_once('-')?;
                let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
                (s <= a && a < e).then(|| rest[..4].to_string())
            })
        };
        assert_eq!(perms(low).as_deref(), Some("r-xs"), "{maps}");
        assert_eq!(perms(high).as_deref(), Some("rw-s"), "{maps}");
        // SAFETY: both views, made above, unused from here on.
        unsafe { unmap_own(low as *mut libc::c_void, 2 * bytes) };
    }

    #[test]
    fn reserved_memory_is_zero_keeps_what_is_written_and_grows() {
        let mut r = Reserved::<u64>::new(1 << 20).expect("8 MiB of address space");
        assert!(r.iter().step_by(4096).all(|&x| x == 0));
        r[5] = 7;
        r[(1 << 20) - 1] = 9;
        assert!(r.grow(1 << 21));
        assert_eq!((r[5], r[(1 << 20) - 1], r[(1 << 21) - 1]), (7, 9, 0));
        r.clear(1 << 21);
        assert_eq!((r[5], r[(1 << 20) - 1]), (0, 0));
        assert!(Reserved::<u64>::new(0).is_some_and(|e| e.is_empty()));
        assert!(Reserved::<u64>::new(usize::MAX / 4).is_none(), "far more than the address space");
    }

    #[test]
    fn reads_do_not_fault() {
        let v = 0x1122334455667788u64;
        let mut b = [0u8; 8];
        assert!(read_own(&v as *const u64 as u64, &mut b));
        assert_eq!(u64::from_ne_bytes(b), v);
        assert!(!read_own(8, &mut b));
    }
}
