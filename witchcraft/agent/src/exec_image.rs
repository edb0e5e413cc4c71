//! The image an `exec` of the program's is about to start: whether the
//! agent will load into it (`witchcraft::loadable`), and if not, the note
//! that the exec'ing process's profile carries, so that the report says
//! which programs of the run went unprofiled (a statically linked tool a
//! build runs, a set-user-ID helper, a child started with a cleaned
//! environment). Not for signal handlers (it reads the file's headers).

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What an exec call names the new image by.
#[derive(Clone, Copy)]
pub enum Target {
    /// A path (`execve`, `execv`).
    Path(*const libc::c_char),
    /// A file name searched for in `PATH` unless it holds a `/` (`execvp`,
    /// `execvpe`).
    Search(*const libc::c_char),
    /// An open file (`fexecve`).
    Fd(libc::c_int),
}

/// The note for an exec of `target` by process `pid` with environment
/// `envp` (null: this process's own), if the new image will run without
/// the agent.
///
/// # Safety
/// `target`'s string and `envp` (when not null) are the exec call's
/// arguments: NUL-terminated, and a null-terminated array of them.
pub unsafe fn unprofiled(target: Target, envp: *const *const libc::c_char, pid: u32) -> Option<String> {
    let (path, shown) = match target {
        // SAFETY: the caller's NUL-terminated path.
        Target::Path(p) if !p.is_null() => (path_of(unsafe { CStr::from_ptr(p) }), None),
        // SAFETY: as above.
        Target::Search(f) if !f.is_null() => (search(unsafe { CStr::from_ptr(f) })?, None),
        Target::Fd(fd) => {
            let link = PathBuf::from(format!("/proc/self/fd/{fd}"));
            let shown = std::fs::read_link(&link).ok();
            (link, shown)
        }
        _ => return None,
    };
    let env = if envp.is_null() {
        // SAFETY: the C library's environment, read on the exec'ing thread.
        unsafe { strings(environ_ptr()) }
    } else {
        // SAFETY: the caller's null-terminated array.
        unsafe { strings(envp) }
    };
    witchcraft::loadable::unprofiled_exec(pid, &path, shown.as_deref().unwrap_or(&path), env.iter().copied(), agent_name())
}

fn path_of(s: &CStr) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(s.to_bytes()))
}

/// Where `execvp` finds `file`: itself if it holds a `/`, else the first
/// executable regular file of that name in `PATH` (the C library's default
/// search path without one).
fn search(file: &CStr) -> Option<PathBuf> {
    let name = file.to_bytes();
    if name.is_empty() {
        return None;
    }
    if name.contains(&b'/') {
        return Some(path_of(file));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).map(|d| d.join(OsStr::from_bytes(name))).find(|p| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
        // SAFETY: a NUL-terminated path.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    })
}

extern "C" {
    static environ: *const *const libc::c_char;
}

fn environ_ptr() -> *const *const libc::c_char {
    // SAFETY: the C library's `environ`, read (not changed) here.
    unsafe { environ }
}

/// The entries of a null-terminated array of C strings.
///
/// # Safety
/// `v` is null or such an array, alive while the entries are used.
unsafe fn strings<'a>(v: *const *const libc::c_char) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    if v.is_null() {
        return out;
    }
    for i in 0.. {
        // SAFETY: within the array, up to its null entry.
        let p = unsafe { *v.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: a NUL-terminated entry of the array.
        out.push(unsafe { CStr::from_ptr(p) }.to_bytes());
    }
    out
}

/// The agent's own file name ("libwitch_agent.so"), as `LD_PRELOAD` names
/// the agent: the file its code was loaded from.
fn agent_name() -> &'static [u8] {
    static NAME: OnceLock<Vec<u8>> = OnceLock::new();
    NAME.get_or_init(|| {
        // SAFETY: Dl_info is pointers, for which zero is null.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr fills `info` for an address of this library's code.
        let found = unsafe { libc::dladdr(agent_name as *const libc::c_void, &mut info) } != 0 && !info.dli_fname.is_null();
        let path = if found {
            // SAFETY: the loader's NUL-terminated file name of this library.
            unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes().to_vec()
        } else {
            b"libwitch_agent.so".to_vec()
        };
        Path::new(OsStr::from_bytes(&path)).file_name().map_or(path.clone(), |n| n.as_bytes().to_vec())
    })
}
