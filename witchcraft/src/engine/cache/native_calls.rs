//! The cache's native calls: the entries a window calls natively and
//! goes on after (see [`translate::NativeCall`]; not a recording window),
//! and the thread's state while it is away in one.

use super::{runs_from_cache, CodeCache};
use crate::modules::ProcessMap;
use crate::x86::translate::{self, NativeCalls};

impl CodeCache {
    /// Call these entries natively from now on (see
    /// [`translate::NativeCall`]); a different list empties the cache.
    pub fn set_native_calls(&mut self, calls: NativeCalls) {
        if self.calls != calls {
            self.flush();
            self.calls = calls;
        }
    }

    /// Is `pc` an entry the cache calls natively?
    pub fn calls_natively(&self, pc: u64) -> bool {
        self.calls.find(pc).is_some()
    }

    /// May a window go on at `pc`: code the cache runs (see
    /// [`runs_from_cache`]), or an entry it calls natively.
    pub fn runs(&self, map: &ProcessMap, own: (u64, u64), pc: u64) -> bool {
        runs_from_cache(map, own, pc) || self.calls_natively(pc)
    }

    /// The stack pointer of a thread away in a native call's entry, if it
    /// is (see [`translate::away_return_slot`]).
    pub fn away_sp(&mut self) -> Option<u64> {
        if self.base.is_null() {
            return None;
        }
        let sp = self.data().away_sp;
        (sp != 0).then_some(sp)
    }

    /// The window ends, the thread going on at `native`: if it is away in
    /// a native call's entry (`native` is there, not in the cache), the
    /// entry returns natively to the program, through
    /// [`translate::witch_native_call_return`] where the cache's return
    /// address was. Async-signal-safe.
    pub fn end_away(&mut self, native: u64) {
        let Some(sp) = self.away_sp() else { return };
        if !self.is_code(native) {
            let slot = translate::away_return_slot(sp);
            // SAFETY: the entry's return slot on this thread's stack, which
            // holds the cache's return address while the entry runs; the
            // entry is not running (this thread is in a handler).
            unsafe { std::ptr::write_volatile(slot as *mut u64, translate::witch_native_call_return as *const () as u64) };
        }
        self.data().away_sp = 0;
    }
}
