//! Attached mode: the program's own calls to `prctl` and `syscall`, and to
//! `execve`, `execvpe`, `execv`, `execvp`, `fexecve`, `execl`, `execlp` and
//! `execle`, are pointed at the agent's (`interpose.rs`; the variadic
//! `execl*` at hidden C twins, `exec_variadic.c`), so that it sees a
//! seccomp sandbox or an exec coming and ends the session first (a filter
//! that kills at a system call the agent makes would kill the program; an
//! exec would take the profile with the old image). An exec the agent
//! cannot see (see below; also a call through an address the program
//! looked up with `dlsym`) still loses the session's profile.
//!
//! A preloaded agent gets these calls by symbol interposition. A library
//! loaded later by `dlopen` cannot interpose, so here the entries of the
//! modules' import tables (their GOT slots, `R_X86_64_JUMP_SLOT` and
//! `R_X86_64_GLOB_DAT`: plain and `-fno-plt` calls) are rewritten with the
//! `plthook` crate: in the program and every library it loaded, except the
//! C library (whose own calls are not a program entering a sandbox), the
//! dynamic loader, the vDSO and the agent. Modules loaded during the session
//! are hooked at the control thread's next poll. What this cannot see: a
//! system call made by a `syscall` instruction of the program's own (a
//! browser's sandbox does that), or by a module in the window between its
//! load and the next poll. The entries stay pointed at the agent after the
//! session (the library stays loaded); with no session running they call
//! the program's own definitions straight on: those its global scope binds
//! (an interposer it preloads, else the C library's).

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// The loader's count of loads when the modules were last hooked (0: never).
static HOOKED_AT: AtomicU64 = AtomicU64::new(0);

/// Point the imports the agent takes, of every module loaded since the
/// last call, at the agent's definitions. The control thread's (it allocates and opens
/// files); cheap when nothing was loaded.
pub fn hook() {
    let (adds, _) = crate::loading::link_counts();
    hook_since(&HOOKED_AT, adds, crate::interpose::resolve_for_attached, || each_module(take));
}

/// Run `take_all` unless `at` says the modules were hooked at this count
/// of loads (`adds`); `at` takes the count only once they are. What the
/// agent's definitions call on to is resolved first (`resolve`): while it
/// cannot be, nothing is taken, and the next call tries again (a count
/// recorded before the resolution succeeded would have left the modules
/// unhooked until the next load). Only the control thread calls this, one
/// session at a time.
fn hook_since(at: &AtomicU64, adds: u64, resolve: impl FnOnce() -> bool, take_all: impl FnOnce()) {
    if at.load(Ordering::Acquire) == adds {
        return;
    }
    // What the agent's definitions call on to: without it, nothing is taken.
    if !resolve() {
        return;
    }
    take_all();
    // (A module loaded meanwhile raised the count past `adds`: the next
    // call hooks it.)
    at.store(adds, Ordering::Release);
}

/// Attached, first of all (on the program's thread, in the injected call,
/// before the program runs on): the program's `munmap` goes through the
/// agent, which keeps it off the agent's own image and the libraries the
/// loader mapped with it (they may lie in a hole the program made and
/// unmaps later with the rest). The other imports wait for the session
/// ([`hook`]).
pub fn hook_munmap() {
    crate::heap::protect_own();
    if !crate::heap::resolve_for_attached() {
        return;
    }
    let Some((name, f)) = crate::heap::attached_imports().into_iter().find(|(n, _)| *n == c"munmap") else { return };
    let Ok(name) = name.to_str() else { return };
    each_module(|module| {
        // SAFETY: the agent's `munmap` entry, with the C library's
        // signature; the agent stays loaded.
        if let Ok(mut r) = unsafe { module.replace(name, f) } {
            r.discard();
        }
    });
}

/// The main program and every loaded module but the agent and those
/// [`skipped`].
fn each_module(mut f: impl FnMut(&plthook::ObjectFile)) {
    if let Ok(program) = plthook::ObjectFile::open_main_program() {
        f(&program);
    }
    let agent = crate::symbols::own_name();
    for name in crate::symbols::libraries() {
        if Some(&name) == agent.as_ref() || skipped(&name) {
            continue;
        }
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a module
        // already loaded (and takes a reference, given back below).
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a handle dlopen just gave, kept open while it is read.
        if let Ok(module) = unsafe { plthook::ObjectFile::open_by_handle(handle) } {
            f(&module);
        }
        // SAFETY: the reference taken above.
        unsafe { libc::dlclose(handle) };
    }
}

/// Rewrite `module`'s entries for the imports the agent takes, for good.
fn take(module: &plthook::ObjectFile) {
    let heap = crate::heap::attached_imports().into_iter().map(|(name, f)| (name, f, None));
    for (name, f, _) in crate::interpose::attached_imports().into_iter().chain(heap) {
        let Ok(name) = name.to_str() else { continue };
        // SAFETY: `f` is the agent's definition, with the C library's
        // signature; the agent stays loaded.
        if let Ok(mut r) = unsafe { module.replace(name, f) } {
            r.discard();
        }
    }
}

/// Modules left alone: the C library and the loader (their calls are not
/// the program's), the vDSO (no imports), and the unnamed main program
/// (taken by `open_main_program`).
fn skipped(name: &CStr) -> bool {
    let bytes = name.to_bytes();
    let base = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
    base.is_empty() || base.starts_with(b"libc.so") || base.starts_with(b"ld-linux") || base.starts_with(b"linux-vdso")
}

#[cfg(test)]
mod tests {
    use super::{hook_since, skipped};
    use std::sync::atomic::AtomicU64;

    /// A resolution that fails leaves the modules to the next call, which
    /// tries again with the same count of loads; once they are hooked, the
    /// same count hooks nothing more, and a new load hooks again.
    #[test]
    fn a_failed_resolution_is_tried_again_at_the_next_call() {
        let at = AtomicU64::new(0);
        let mut hooked = 0;
        hook_since(&at, 7, || false, || hooked += 1);
        assert_eq!(hooked, 0, "nothing is hooked without the resolution");
        hook_since(&at, 7, || true, || hooked += 1);
        assert_eq!(hooked, 1, "the next call, with the same loads, resolves and hooks");
        hook_since(&at, 7, || true, || hooked += 1);
        assert_eq!(hooked, 1, "nothing loaded since: nothing to hook");
        hook_since(&at, 8, || true, || hooked += 1);
        assert_eq!(hooked, 2, "a module loaded since is hooked");
    }

    #[test]
    fn the_c_library_the_loader_and_the_vdso_are_left_alone() {
        for name in [c"", c"/lib/x86_64-linux-gnu/libc.so.6", c"/lib64/ld-linux-x86-64.so.2", c"linux-vdso.so.1"] {
            assert!(skipped(name), "{name:?}");
        }
        for name in [c"/usr/lib/x86_64-linux-gnu/libseccomp.so.2", c"/opt/app/libcrypto.so.3", c"./libc_helpers.so"] {
            assert!(!skipped(name), "{name:?}");
        }
    }
}
