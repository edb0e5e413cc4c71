//! The stopped thread's registers (general and vector) and memory.

use super::{Tracee, NT_X86_XSTATE, XSTATE_MAX};
use anyhow::{bail, Result};

impl Tracee {
    pub(super) fn regs(&self) -> Result<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain data.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: fills `r` from a stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.tid, 0, &mut r as *mut _) } != 0 {
            bail!("cannot read registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(r)
    }

    /// The XSAVE area (x87, SSE, AVX... state).
    pub(super) fn get_xstate(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: the kernel writes at most `iov_len` bytes into `buf` and sets `iov_len`.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, &mut iov as *mut libc::iovec) } != 0 {
            bail!("cannot read the vector registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    pub(super) fn set_xstate(&self) -> Result<()> {
        let mut buf = self.xstate.clone();
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: the kernel reads `iov_len` bytes from `buf`.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, &mut iov as *mut libc::iovec) } != 0 {
            bail!("cannot restore the vector registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub(super) fn set_regs(&self, r: &libc::user_regs_struct) -> Result<()> {
        // SAFETY: reads `r` into a stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.tid, 0, r as *const _) } != 0 {
            bail!("cannot set registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub(super) fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let local = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
        let remote = libc::iovec { iov_base: addr as *mut _, iov_len: data.len() };
        // SAFETY: `local` describes `data`; the kernel checks the remote side.
        let n = unsafe { libc::process_vm_writev(self.tid, &local, 1, &remote, 1, 0) };
        if n != data.len() as isize {
            bail!("cannot write the target's memory: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// A NUL-terminated string of the target's (at most 512 bytes).
    pub fn read_cstr(&self, addr: u64) -> String {
        if addr == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; 512];
        if !super::super::target::read_memory(self.tid, addr, &mut buf) {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// Where the call's data and frames may be: the stack below the
    /// thread's own stack pointer.
    pub fn below_stack_pointer(&self) -> std::ops::Range<u64> {
        self.saved.rsp.saturating_sub(1 << 20)..self.saved.rsp
    }

    /// The thread's pointer (`fs_base`): its control block, its static TLS below.
    pub fn thread_pointer(&self) -> u64 {
        self.saved.fs_base
    }
}
