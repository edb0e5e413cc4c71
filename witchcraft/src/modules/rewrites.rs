//! Module code the program rewrites in place: hot-patching and
//! function-hook libraries make a module's code writable with `mprotect`,
//! write new instructions, and make it executable again, and no map change
//! shows it. The agent's `mprotect` reports each change of protection
//! here; a thread's code cache empties itself before its next window when
//! the count moved.

use super::current;
use std::sync::atomic::Ordering;

/// Bumped whenever the program may have rewritten a module's code in place
/// (an `mprotect` of it: hot patching, function hooks), which no map
/// change shows: copies made before are stale.
static CODE_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The program changed the protection of `[addr, addr + len)`: if that
/// touches a module's code, copies made of it before are stale.
pub fn protection_changed(addr: u64, len: u64) {
    // (Modules are sorted and apart: the first that ends past `addr` is the
    // only one that can begin before the range does. A JIT changes its own
    // memory's protection thousands of times a second.)
    let touches = |m: &super::ProcessMap| {
        let i = m.modules.partition_point(|x| x.end <= addr);
        m.modules.get(i).is_some_and(|x| x.start < addr.saturating_add(len))
    };
    if current().is_some_and(touches) {
        CODE_WRITES.fetch_add(1, Ordering::SeqCst);
    }
}

/// How many times the program may have rewritten module code so far (see
/// [`protection_changed`]). Async-signal-safe.
pub fn code_writes() -> u64 {
    CODE_WRITES.load(Ordering::SeqCst)
}
