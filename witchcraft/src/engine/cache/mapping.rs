//! Making a thread's code cache's memory: one mapping, writable and
//! executable, or where the process forbids that, the same pages mapped
//! twice (see [`mem::map_own_twice`]); its stubs; giving it back.

use super::layout::{DISPATCH_AT, DISPATCH_ENTRIES, PAGE};
use super::CodeCache;
use crate::sys::mem;
use crate::x86::translate;

impl CodeCache {
    /// Map the cache and emit its stubs. False if it cannot be (then
    /// never tried again). Async-signal-safe.
    pub(super) fn make_mapping(&mut self) -> bool {
        // A new private anonymous mapping in witch's own region;
        // checked for failure. Where writable code is refused (EACCES),
        // the same pages twice, an executable view and a writable one.
        let bytes = self.layout.bytes();
        let mut p = mem::map_own(bytes, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC, libc::MAP_NORESERVE);
        let mut refused = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM);
        if p == libc::MAP_FAILED && refused == libc::EACCES {
            match mem::map_own_twice(bytes) {
                Some(twice) => (p, self.view) = (twice, bytes),
                None => refused = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM),
            }
        }
        if p == libc::MAP_FAILED {
            self.failed = true;
            self.stats.refused = refused;
            return false;
        }
        self.stats.twice = self.view != 0;
        self.base = p as *mut u8;
        let slots = self.slots();
        self.data().table = self.waddr(DISPATCH_AT);
        // The link stub, if the engine's entry is there and the guard
        // page below its stack could be made.
        let entry = crate::engine::link::entry();
        // SAFETY: the guard page is inside the mapping, which nothing uses yet.
        let guarded = entry != 0 && unsafe { mem::protect_own(self.w(self.layout.guard_at()), PAGE, libc::PROT_NONE) };
        self.link = if guarded { self.addr(self.layout.link_at()) } else { 0 };
        let at = self.addr(self.layout.stubs_at());
        // SAFETY: the stub area is STUBS_AT..REP_AT of the mapping.
        let out = unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.stubs_at()), self.layout.link_at() - self.layout.stubs_at()) };
        let mut made = translate::emit_dispatch(&slots, DISPATCH_ENTRIES, at, self.link, out).is_ok();
        if self.link != 0 {
            // SAFETY: as above, LINK_AT..REP_AT.
            let out =
                unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.link_at()), self.layout.rep_at() - self.layout.link_at()) };
            made &= translate::emit_link(&slots, self.link, out).is_ok();
            // 16-byte aligned, as a call expects; the top 64 bytes unused.
            let top = (self.waddr(self.layout.bytes()) - 64) & !15;
            let d = self.data();
            d.link_stack = top;
            d.link_entry = entry;
        }
        if !made {
            self.release();
            self.failed = true;
            return false;
        }
        true
    }

    /// Give the mapping back (thread exit, fork child's reset).
    pub fn release(&mut self) {
        if !self.base.is_null() {
            // SAFETY: the mapping `ready` made (both views, if twice); no
            // copy runs now (the caller's thread is in a handler or done
            // with windows).
            unsafe { mem::unmap_own(self.base as *mut libc::c_void, self.view + self.layout.bytes()) };
        }
        self.forget();
    }

    /// In a fork child: forget every copy; a cache mapped twice, which the
    /// child did not inherit ([`mem::map_own_twice`]), is forgotten
    /// whole (the child maps its own at its next window).
    pub fn forget_after_fork(&mut self) {
        if self.view == 0 {
            return self.flush();
        }
        self.forget();
    }

    /// No mapping, no copy.
    fn forget(&mut self) {
        self.base = std::ptr::null_mut();
        self.view = 0;
        self.code_pos = 0;
        self.records = 0;
        self.indexed = 0;
        self.link = 0;
    }

    /// Where offset `off` of the cache is, for the engine to write it and
    /// for the copies to keep their data there: the one mapping, or the
    /// writable view of a cache mapped twice.
    pub(super) fn w(&self, off: usize) -> *mut u8 {
        self.base.wrapping_add(self.view + off)
    }

    pub(super) fn waddr(&self, off: usize) -> u64 {
        self.w(off) as u64
    }
}
