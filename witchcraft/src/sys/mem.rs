//! Reading memory through the kernel (`process_vm_readv`): it never faults
//! on an unmapped address and never trips our own user-mode watchpoints
//! (kernel accesses are excluded by `exclude_kernel`). Async-signal-safe.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_do_not_fault() {
        let v = 0x1122334455667788u64;
        let mut b = [0u8; 8];
        assert!(read_own(&v as *const u64 as u64, &mut b));
        assert_eq!(u64::from_ne_bytes(b), v);
        assert!(!read_own(8, &mut b));
    }
}
