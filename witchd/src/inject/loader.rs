//! Loading the agent without deadlocking the target on its dynamic
//! loader's lock.
//!
//! `dlopen` takes the loader's lock ([`LoaderLock`]) before anything else
//! and holds it while the constructors of what it loads run. A thread made
//! to call `dlopen` while another thread holds the lock waits for it; if
//! that other thread waits for the one made to call (a library's
//! constructor waiting for the main thread), neither would ever go on. So:
//!
//! - the agent is loaded only while nobody holds the lock: an attach waits
//!   for it ([`wait_until_free`], up to [`LOADER_WAIT`]), looks again once
//!   it has stopped the thread it will use, and refuses in one line,
//!   leaving the process as it was, if the lock stays held;
//! - a `dlopen` that still finds it held (taken in the microseconds
//!   between that look and the call) and waits for it
//!   [`super::ptrace::STUCK_PATIENCE`] is taken back ([`stuck`]): it has
//!   taken nothing yet, and what it wrote outside its stack (glibc's
//!   pointer to the call's error catcher, in the thread's TLS) is put back
//!   from a [`Snapshot`] taken before the call. The thread then goes on
//!   from where it was stopped, as if nothing had been called.
//!
//! Only glibc's lock is known (found by its layout,
//! [`super::target::find_loader_lock`]); with another C library (musl) the
//! attach goes ahead as before.

use super::target::{read_memory, LoaderLock, Target};
use anyhow::{bail, Result};
use std::ops::Range;
use std::time::{Duration, Instant};

/// How long an attach waits for the loader's lock to be free.
pub const LOADER_WAIT: Duration = Duration::from_secs(5);

/// The one line of an attach refused because the lock stayed held.
pub fn busy(pid: i32, holder: i32, waited: Duration) -> anyhow::Error {
    let who = if holder > 0 { format!("thread {holder}") } else { "a thread".to_string() };
    anyhow::anyhow!(
        "the dynamic loader of pid {pid} stayed busy for {:.1} s ({who} holds its lock: a library is being loaded and its initialization has not finished), and loading the agent then could deadlock the process; it was left as it was: attach again later",
        waited.as_secs_f64()
    )
}

/// The one line of an attach whose load was taken back ([`stuck`]).
pub fn taken_back(pid: i32, holder: i32) -> anyhow::Error {
    let who = if holder > 0 { format!("thread {holder}") } else { "another thread".to_string() };
    anyhow::anyhow!(
        "loading the agent into pid {pid} waited on the dynamic loader's lock, which {who} took meanwhile (a library is being loaded and its initialization has not finished), and could have deadlocked the process: the load was taken back and the process left as it was; attach again later"
    )
}

/// Wait until nobody holds `lock` in process `pid`, up to `until`; the
/// holder if it is still held then.
pub fn wait_until_free(pid: i32, lock: LoaderLock, until: Instant) -> Option<i32> {
    loop {
        let holder = lock.holder(pid)?;
        if Instant::now() >= until {
            return Some(holder);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Is thread `tid` of process `pid` waiting for `lock` (blocked in
/// `futex` on its first word), while another thread holds it? Read from
/// `/proc/PID/task/TID/syscall`: the call's number and its first argument.
pub fn stuck(pid: i32, tid: i32, lock: LoaderLock) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")) else { return false };
    let mut fields = text.split_whitespace();
    let waiting = fields.next() == Some("202")
        && fields.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()) == Some(lock.at);
    waiting && lock.holder(pid).is_some_and(|h| h != tid)
}

/// Memory a `dlopen` may write a pointer to its own stack frame into
/// before it takes the loader's lock: the static TLS of the calling thread
/// (below its thread pointer) and the writable data of the C library and
/// the loader (where another C library keeps that pointer), as they were
/// before the call.
pub struct Snapshot {
    regions: Vec<(u64, Vec<u8>)>,
}

/// How much of the static TLS below a thread pointer is kept (glibc's
/// static TLS is a few KiB).
const TLS_SPAN: u64 = 64 << 10;

impl Snapshot {
    pub fn take(target: &Target, tp: u64) -> Snapshot {
        let mut ranges = Vec::new();
        if let Some(m) = target.maps.iter().find(|m| m.write && m.contains(tp.saturating_sub(1))) {
            ranges.push(m.start.max(tp.saturating_sub(TLS_SPAN))..tp);
        }
        let mut after_object = false;
        for m in &target.maps {
            let name = m.file_name().unwrap_or("");
            let ours = super::target::is_c_library(name) || name.starts_with("ld-linux") || name.starts_with("ld-2.");
            // An object's .bss beyond its file is the anonymous mapping right after its data.
            if m.write && (ours || (after_object && m.path.is_empty())) {
                ranges.push(m.start..m.end.min(m.start + (1 << 20)));
            }
            after_object = ours;
        }
        let regions = ranges
            .into_iter()
            .filter_map(|r| {
                let mut bytes = vec![0u8; (r.end - r.start) as usize];
                read_memory(target.pid, r.start, &mut bytes).then_some((r.start, bytes))
            })
            .collect();
        Snapshot { regions }
    }

    /// Put back every word that now points into `frames` (where the
    /// call's frames were) and did not before, as it was; how many.
    pub fn put_back(&self, pid: i32, frames: Range<u64>) -> Result<usize> {
        let mut restored = 0;
        for (start, before) in &self.regions {
            let mut now = vec![0u8; before.len()];
            if !read_memory(pid, *start, &mut now) {
                bail!("cannot read the memory of pid {pid} to undo the call");
            }
            for at in (0..before.len().saturating_sub(7)).step_by(8) {
                let word = |b: &[u8]| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
                let (was, is) = (word(before), word(&now));
                if was != is && frames.contains(&is) {
                    write_memory(pid, start + at as u64, &before[at..at + 8])?;
                    restored += 1;
                }
            }
        }
        Ok(restored)
    }
}

fn write_memory(pid: i32, addr: u64, data: &[u8]) -> Result<()> {
    let local = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    let remote = libc::iovec { iov_base: addr as *mut _, iov_len: data.len() };
    // SAFETY: `local` describes `data`; the kernel checks the remote side.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n != data.len() as isize {
        bail!("cannot write the memory of pid {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::ptrace::{Arg, Return, Stuck, Tracee};
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// tests/programs/loader_lock.c and its library, built into a fresh directory.
    fn build_loader_lock() -> (PathBuf, PathBuf) {
        let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/programs");
        let dir = std::env::temp_dir().join(format!("witchd-loader-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (exe, lib) = (dir.join("loader_lock"), dir.join("libloader_lock.so"));
        for (out, src, extra) in [(&exe, "loader_lock.c", &[][..]), (&lib, "loader_lock_lib.c", &["-shared", "-fPIC"][..])] {
            let built =
                Command::new("gcc").args(["-O2", "-g", "-o"]).arg(out).arg(programs.join(src)).args(extra).arg("-lpthread").status();
            assert!(built.is_ok_and(|s| s.success()), "gcc {src}");
        }
        (exe, lib)
    }

    /// A `dlopen` made by the main thread while a library's constructor,
    /// which waits for that thread, holds the loader's lock (what an attach
    /// that found the lock free a moment before would do) is taken back:
    /// glibc's pointer to the call's error catcher is put back in the
    /// thread's TLS, the thread goes on from its `nanosleep`, and the
    /// program ends as it does unprofiled. (Without it, both threads wait
    /// for each other for good.)
    #[test]
    fn a_load_that_waits_on_the_loader_lock_is_taken_back_and_the_program_ends_as_natively() {
        let (exe, lib) = build_loader_lock();
        let started = Instant::now();
        let child = Command::new(&exe).arg(&lib).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(300));
        let target = Target::inspect(pid).unwrap();
        let lock = target.loader_lock().expect("glibc's loader lock is found");
        let holder = lock.holder(pid).expect("the constructor's thread holds the loader lock");
        assert!(holder != pid && holder > 0, "held by {holder}");
        let libc = target.object(super::super::target::is_c_library).unwrap().clone();
        let dlopen = target.symbol(&libc, "dlopen").unwrap().unwrap();
        let ret = Return::Restore(target.return_code().sigreturn.unwrap());
        let tracee = Tracee::stop_safely(&target).unwrap();
        let before = Snapshot::take(&target, tracee.thread_pointer());
        let args = [Arg::Str("libc.so.6".into()), Arg::Int(libc::RTLD_NOW as u64)];
        let called = tracee.call_unless_stuck(dlopen, &args, ret, &|tid| stuck(pid, tid, lock));
        assert!(called.as_ref().err().is_some_and(|e| e.is::<Stuck>()), "the load was not taken back");
        let put_back = before.put_back(pid, tracee.below_stack_pointer()).unwrap();
        tracee.resume();
        let out = child.wait_with_output().unwrap();
        let took = started.elapsed();
        assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (Some(0), "loaded 42\n"));
        assert!(took < Duration::from_secs(4), "the program took {took:?} (2 s unprofiled)");
        assert!(put_back >= 1, "nothing pointed to the call's frames: glibc's error catcher was not found");
        let _ = std::fs::remove_dir_all(exe.parent().unwrap());
    }
}
