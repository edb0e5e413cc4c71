//! What the controller learns about a target before and while injecting:
//! its identity and rights, its loaded objects, and the addresses of the
//! functions it will make the target call.
//!
//! Everything here may run as root against a process whose owner controls
//! the files it maps and the paths they appear under. So a mapped object
//! is opened as the exact file the target mapped
//! (`/proc/PID/map_files/START-END`, root only) rather than by its path, and
//! read as any path a target chose is ([`crate::symbolize::file`]: a regular
//! file of bounded size, opened without blocking, read with a deadline;
//! docs/SECURITY.md).

use anyhow::{anyhow, bail, Context, Result};
use std::time::Duration;
use witchcraft::sys::procfs::{self, Mapping, Of, ProcStatus};

/// Largest object file read for its symbols (libc is ~2 MB).
const MAX_OBJECT_BYTES: u64 = 512 << 20;
/// Longest wait for one object file's symbols.
const READ_DEADLINE: Duration = Duration::from_secs(10);

/// The process, as far as attaching needs it.
pub struct Target {
    /// The thread group id (a thread id given by the user resolves to it).
    pub pid: i32,
    /// Its real uid.
    pub uid: u32,
    pub maps: Vec<Mapping>,
}

/// Bytes of stack a thread whose stack pointer is `sp` and whose thread
/// pointer (`fs_base`) is `tp` may still use, if that stack is known to be
/// a C stack: the one the kernel gave the main thread (`[stack]`, which
/// grows on demand: unbounded here), or the one the C library made or was
/// given for a thread, which holds the thread's control block (where `tp`
/// points, in glibc and musl alike) at its top: `sp` is then below `tp` in
/// the same mapping, and what lies below `sp` down to the mapping's start
/// (its guard page) is free. None for any other stack: a language
/// runtime's own (Go runs goroutines on small stacks it allocates and
/// moves itself, in its heap), a coroutine's, a signal stack, or no
/// mapping at all. What lies below the stack pointer there may be another
/// stack or live data, so nothing may be written below it.
pub fn c_stack_room(maps: &[Mapping], sp: u64, tp: u64) -> Option<u64> {
    let m = maps.iter().find(|m| m.contains(sp.saturating_sub(1)))?;
    if m.path == "[stack]" {
        return Some(u64::MAX);
    }
    let anonymous = m.path.is_empty() || m.path.starts_with("[anon:");
    (m.write && anonymous && sp <= tp && m.contains(tp)).then(|| sp - m.start)
}

impl Target {
    pub fn inspect(pid: i32) -> Result<Target> {
        if pid <= 0 {
            bail!("no process with pid {pid}");
        }
        let status = ProcStatus::read(Of::Process(pid)).map_err(|e| permission(pid, e))?;
        let tgid = status.tgid.unwrap_or(pid);
        let uid = status.uid.unwrap_or(0);
        if status.zombie() {
            bail!("pid {pid} has exited (zombie)");
        }
        if tgid == std::process::id() as i32 {
            bail!("witch cannot attach to itself");
        }
        let maps = procfs::read_maps(Some(tgid)).map_err(|e| permission(tgid, e))?;
        Ok(Target { pid: tgid, uid, maps })
    }

    pub fn refresh_maps(&mut self) -> Result<()> {
        self.maps = procfs::read_maps(Some(self.pid)).map_err(|e| permission(self.pid, e))?;
        Ok(())
    }

    /// The first mapping (offset 0) of the object whose file name
    /// satisfies `pred`.
    pub fn object(&self, pred: impl Fn(&str) -> bool) -> Option<&Mapping> {
        self.maps.iter().find(|m| m.offset == 0 && m.is_file() && pred(file_name(&m.path)))
    }

    /// Refuses a 32-bit or non-x86-64 process, from the ELF header of its
    /// executable as mapped in its memory (no file is opened).
    pub fn check_x86_64(&self) -> Result<()> {
        let exe = std::fs::read_link(format!("/proc/{}/exe", self.pid)).map_err(|e| permission(self.pid, e))?;
        let exe = exe.to_string_lossy();
        let m = self.maps.iter().find(|m| m.offset == 0 && m.path == exe).or_else(|| self.maps.iter().find(|m| m.is_file()));
        let Some(m) = m else { bail!("pid {} maps no program", self.pid) };
        let mut h = [0u8; 20];
        if !read_memory(self.pid, m.start, &mut h) {
            return Err(not_permitted(self.pid));
        }
        if &h[..4] != b"\x7fELF" {
            bail!("pid {} does not run an ELF program", self.pid);
        }
        if h[4] != 2 || u16::from_le_bytes([h[18], h[19]]) != 62 {
            bail!("pid {} is a 32-bit or non-x86-64 process; witch profiles x86-64 processes only", self.pid);
        }
        Ok(())
    }

    /// Refuse, before anything is done to it, a process that:
    /// - runs in a seccomp sandbox: its filter allows what the program
    ///   needs, and may kill it for a system call the agent makes (a filter
    ///   installed during a session is not seen: attached, nothing is
    ///   interposed; started under witch, the agent leaves before it);
    /// - another debugger or tracer holds (ptrace would be refused);
    /// - is stopped (SIGSTOP, job control): no thread of it could run the
    ///   agent's loading or its session until it is continued.
    pub fn check_free(&self) -> Result<()> {
        let pid = self.pid;
        for tid in procfs::tasks(Some(pid)) {
            let Ok(status) = ProcStatus::read(Of::Task(pid, tid)) else { continue };
            if let Some(mode @ 1..) = status.seccomp {
                bail!(
                    "pid {pid} runs in a seccomp sandbox (thread {tid}: {}), whose filter may kill it for a system call the agent makes, so witch does not attach to it; a program that sandboxes itself can be profiled up to its filter when started under witch",
                    if mode == 1 { "strict mode" } else { "a filter" }
                );
            }
            if let Some(tracer) = status.tracer() {
                let comm = std::fs::read_to_string(format!("/proc/{tracer}/comm")).map(|c| format!(" ({})", c.trim())).unwrap_or_default();
                bail!("pid {pid} is traced by pid {tracer}{comm} (thread {tid}): witch cannot attach while a debugger or tracer holds it");
            }
            if status.stopped() {
                bail!("pid {pid} is stopped (SIGSTOP or job control), so it could not run the agent: continue it first (kill -CONT {pid})");
            }
        }
        Ok(())
    }

    /// Executable ranges of the C library, the loader and the agent: a
    /// thread stopped there may hold a lock that `dlopen` or `malloc` needs.
    pub fn risky_ranges(&self) -> Vec<(u64, u64)> {
        self.maps
            .iter()
            .filter(|m| m.exec)
            .filter(|m| {
                let name = file_name(&m.path);
                ["libc", "ld-", "libpthread", "libdl", "libwitch_agent"].iter().any(|p| name.starts_with(p))
            })
            .map(|m| (m.start, m.end))
            .collect()
    }

    /// The code in the C library that injected calls return through (see
    /// [`super::ptrace`]), found by its bytes in the library's code as
    /// mapped, in one read of it:
    /// - its signal return (`__restore_rt` in glibc and musl: `mov $15,
    ///   %rax; syscall`, i.e. `rt_sigreturn`; the symbol is local, and
    ///   stripped builds have none);
    /// - a `mov %rax,(%rbx); pop %rbx; ret`, anywhere (the bytes need not
    ///   start an instruction of the library's), which a call whose result
    ///   is wanted returns through first, to keep `rax` in memory.
    pub fn return_code(&self) -> ReturnCode {
        const SIGRETURN: [&[u8]; 2] = [&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05], &[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05]];
        const STORE_RAX: &[u8] = &[0x48, 0x89, 0x03, 0x5b, 0xc3];
        const CHUNK: usize = 64 << 10;
        let mut found = ReturnCode { sigreturn: None, store_rax: None };
        let mut buf = vec![0u8; CHUNK + 16];
        for m in self.maps.iter().filter(|m| m.exec && is_c_library(file_name(&m.path))) {
            let mut at = m.start;
            while at < m.end && (found.sigreturn.is_none() || found.store_rax.is_none()) {
                let len = ((m.end - at) as usize).min(buf.len());
                if !read_memory(self.pid, at, &mut buf[..len]) {
                    break;
                }
                let find = |p: &[u8]| buf[..len].windows(p.len()).position(|w| w == p).map(|i| at + i as u64);
                if found.sigreturn.is_none() {
                    found.sigreturn =
                        SIGRETURN.iter().find_map(|p| find(p).map(|start| SigReturn { start, after: start + p.len() as u64 }));
                }
                found.store_rax = found.store_rax.or_else(|| find(STORE_RAX));
                at += CHUNK as u64;
            }
        }
        found
    }

    /// Where glibc waits for one of its own internal locks
    /// (`__lll_lock_wait_private`: malloc's arenas, stdio's, `fork`'s): the
    /// code range of that function in the target's C library, if found. A
    /// thread blocked in `futex` from there may hold another of those locks
    /// (`fork` takes every arena's in turn), which the agent's load (its
    /// `malloc`) would then wait for forever.
    pub fn private_lock_wait(&self) -> Option<(u64, u64)> {
        let libc = self.object(is_c_library)?;
        let data = read_object(self.pid, libc).ok()?;
        let (at, size) = symbol_extent(&data, libc.start, "__lll_lock_wait_private")?;
        (size > 0).then_some((at, at + size))
    }

    /// glibc's loader lock in the target ([`LoaderLock`]), where its
    /// loader (`ld-linux*`, `ld-2.*`) and the lock are found.
    pub fn loader_lock(&self) -> Option<LoaderLock> {
        let ld = self.object(|f| f.starts_with("ld-linux") || f.starts_with("ld-2."))?;
        let data = read_object(self.pid, ld).ok()?;
        let (at, size) = symbol_extent(&data, ld.start, "_rtld_global")?;
        let mut global = vec![0u8; size.min(64 << 10) as usize];
        if !read_memory(self.pid, at, &mut global) {
            return None;
        }
        find_loader_lock(&global).map(|o| LoaderLock { at: at + o })
    }

    /// Address of dynamic symbol `name` in the object mapped by `m` (its
    /// first mapping).
    pub fn symbol(&self, m: &Mapping, name: &str) -> Result<Option<u64>> {
        Ok(self.symbols(m, &[name])?[0])
    }

    /// Addresses of several dynamic symbols of one object, from one read
    /// of its file.
    pub fn symbols(&self, m: &Mapping, names: &[&str]) -> Result<Vec<Option<u64>>> {
        let data = read_object(self.pid, m)?;
        symbols_in(&data, m.start, names).map_err(|e| anyhow!("{}: {e}", m.path))
    }
}

/// The dynamic loader's lock (glibc's `_dl_load_lock`, a recursive
/// mutex), which `dlopen` takes before anything else it does, and holds
/// while it runs the constructors of what it loads. A thread made to call
/// `dlopen` while another holds it waits for it; if that other thread waits
/// for the one made to call (a constructor waiting for the main thread),
/// neither ever goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderLock {
    /// Its address in the target (the mutex's first word, the one waited on).
    pub at: u64,
}

impl LoaderLock {
    /// The thread that holds it (0: held, by a thread it does not name);
    /// None when it is free or cannot be read. (A glibc mutex: `__lock`,
    /// nonzero while held, then `__count`, then `__owner`, the holder's
    /// thread id.)
    pub fn holder(self, pid: i32) -> Option<i32> {
        let mut m = [0u8; 12];
        if !read_memory(pid, self.at, &mut m) {
            return None;
        }
        let word = |i: usize| i32::from_le_bytes(m[i..i + 4].try_into().unwrap_or_default());
        (word(0) != 0).then(|| word(8))
    }
}

/// Where `_dl_load_lock` is among the bytes of glibc's `_rtld_global`: it
/// follows the namespaces and their count (`_dl_nns`, 1 to 16), and is the
/// first of two or three recursive mutexes in a row there (the load lock,
/// the load write lock and, from glibc 2.35, the TLS lock), each 40 bytes
/// with its kind (1, recursive) at byte 16. Exactly one such place, or
/// None (a layout this does not know).
pub fn find_loader_lock(global: &[u8]) -> Option<u64> {
    const MUTEX: usize = 40;
    const KIND: usize = 16;
    let word = |at: usize| global.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    let kind = |at: usize| global.get(at + KIND..at + KIND + 4).map(|b| i32::from_le_bytes(b.try_into().unwrap_or_default()));
    let found: Vec<usize> = (0..global.len())
        .step_by(8)
        .filter(|&o| word(o).is_some_and(|n| (1..=16).contains(&n)))
        .filter(|&o| kind(o + 8) == Some(1) && kind(o + 8 + MUTEX) == Some(1))
        .map(|o| o + 8)
        .collect();
    match found[..] {
        [one] => Some(one as u64),
        _ => None,
    }
}

/// Code in the C library that injected calls return through.
#[derive(Clone, Copy, Debug)]
pub struct ReturnCode {
    pub sigreturn: Option<SigReturn>,
    /// The address of a `mov %rax,(%rbx); pop %rbx; ret`.
    pub store_rax: Option<u64>,
}

/// Code in the target that makes the `rt_sigreturn` system call.
#[derive(Clone, Copy, Debug)]
pub struct SigReturn {
    /// Its first instruction.
    pub start: u64,
    /// The address after its `syscall` (the `rip` of its system-call stop).
    pub after: u64,
}

pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or("")
}

/// The addresses of `names` in an ELF image `data` loaded with its first
/// segment at `base`.
fn symbols_in(data: &[u8], base: u64, names: &[&str]) -> std::result::Result<Vec<Option<u64>>, object::Error> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let file = object::File::parse(data)?;
    // Shared objects are linked at 0 (their first segment's vaddr is the bias base).
    let first = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let mut found = vec![None; names.len()];
    for s in file.dynamic_symbols().filter(|s| s.is_definition()) {
        if let Some(i) = s.name().ok().and_then(|n| names.iter().position(|&want| want == n)) {
            found[i].get_or_insert(base + s.address() - first);
        }
    }
    Ok(found)
}

/// Is the program file at `path` a Go program? The Go linker gives each
/// one a `.go.buildinfo` section (Go 1.13 and later) and a
/// `.note.go.buildid` note. Read as any path a user or target names is
/// (bounded, regular files only, with a deadline).
pub fn is_go_program(path: &std::path::Path) -> bool {
    use object::Object;
    let Ok(data) = crate::symbolize::file::read_within(path, MAX_OBJECT_BYTES, READ_DEADLINE) else { return false };
    object::File::parse(&*data)
        .is_ok_and(|f| f.section_by_name(".go.buildinfo").is_some() || f.section_by_name(".note.go.buildid").is_some())
}

/// The address and size of dynamic symbol `name` in an ELF image `data`
/// loaded with its first segment at `base`.
fn symbol_extent(data: &[u8], base: u64, name: &str) -> Option<(u64, u64)> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let file = object::File::parse(data).ok()?;
    let first = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let s = file.dynamic_symbols().find(|s| s.is_definition() && s.name() == Ok(name))?;
    Some((base + s.address() - first, s.size()))
}

/// The C library (glibc's `libc.so.6` and, for older ones, `libdl`; musl's
/// `ld-musl-*`, which is its libc too): where `dlopen`, `getpid` and the
/// signal return are.
pub fn is_c_library(name: &str) -> bool {
    ["libc.so", "libc-2.", "libdl.so", "libdl-", "ld-musl"].iter().any(|p| name.starts_with(p))
}

/// The bytes of the object the target mapped at `m`: as root the very
/// file it mapped, otherwise the file at its path as the target sees it.
/// Regular files only, bounded, never blocking for long
/// ([`crate::symbolize::file`], the one reader of paths a target chose).
fn read_object(pid: i32, m: &Mapping) -> Result<Vec<u8>> {
    let exact = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let by_path = format!("/proc/{pid}/root{}", m.path);
    let path = if std::fs::symlink_metadata(&exact).is_ok() && is_root() { exact } else { by_path };
    crate::symbolize::file::read_within(std::path::Path::new(&path), MAX_OBJECT_BYTES, READ_DEADLINE)
        .with_context(|| format!("cannot read {}", m.path))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Copies target memory at `addr` into `buf`; false if it can't.
pub fn read_memory(pid: i32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut _, iov_len: buf.len() };
    // SAFETY: `local` describes `buf`, which we own; the kernel checks the remote side.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

pub fn permission(pid: i32, e: std::io::Error) -> anyhow::Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => anyhow!("no process with pid {pid}"),
        Some(libc::EACCES) | Some(libc::EPERM) => not_permitted(pid),
        _ => anyhow!("cannot inspect pid {pid}: {e}"),
    }
}

pub fn not_permitted(pid: i32) -> anyhow::Error {
    let owner = std::fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok();
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok());
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut why = match owner {
        Some(u) if u != me => format!("pid {pid} belongs to uid {u}"),
        _ => format!("ptrace of pid {pid} is refused"),
    };
    if let Some(s) = yama.filter(|&s| s > 0) {
        why.push_str(&format!(" (kernel.yama.ptrace_scope = {s}{})", if s == 1 { ": only descendants may be traced" } else { "" }));
    }
    if me == 0 {
        // Root was refused: advising root would send the user in a circle.
        let tracer = ProcStatus::read(Of::Process(pid)).ok().and_then(|s| s.tracer_pid).filter(|&t| t != 0);
        let what = match tracer {
            Some(t) => format!("pid {pid} is being traced already, by pid {t} (a debugger, or another profiler)"),
            None if yama == Some(3) => "kernel.yama.ptrace_scope = 3 forbids ptrace to everyone until reboot".into(),
            None => "a security module (SELinux, AppArmor), a sandbox or container that withholds CAP_SYS_PTRACE, or the kernel's own protection of the process refuses it".into(),
        };
        return anyhow!("not permitted to attach to pid {pid}, even as root: ptrace of pid {pid} is refused; {what}");
    }
    anyhow!("not permitted to attach to pid {pid}: {why}; run witch as the process's user with ptrace allowed, or as root (CAP_SYS_PTRACE)")
}

/// Is the process still there (and not a zombie)?
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let gone = unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    !gone && !ProcStatus::read(Of::Process(pid)).is_ok_and(|s| s.zombie())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root refused is not told to run as root; a user is.
    #[test]
    fn a_refusal_advises_what_the_caller_can_do() {
        let e = not_permitted(std::process::id() as i32).to_string();
        if is_root() {
            assert!(e.contains("even as root") && !e.contains("or as root"), "{e}");
        } else {
            assert!(e.contains("or as root"), "{e}");
        }
    }

    #[test]
    fn our_own_dlopen_is_found_in_our_libc() {
        let me = Target::inspect(std::process::id() as i32);
        assert!(me.is_err(), "attaching to oneself is refused");
        let maps = procfs::read_maps(None).unwrap();
        let t = Target { pid: std::process::id() as i32, uid: 0, maps };
        let libc = t.object(|f| f.starts_with("libc.so")).expect("libc is mapped").clone();
        let addr = t.symbol(&libc, "dlopen").unwrap().or(t.symbol(&libc, "__libc_dlopen_mode").unwrap());
        assert_eq!(addr, Some(libc::dlopen as *const () as u64));
    }

    /// Where glibc waits for its internal locks is found in our own C
    /// library, inside its code (a thread blocked there is never used).
    #[test]
    fn the_c_librarys_private_lock_wait_is_found_in_our_libc() {
        let maps = procfs::read_maps(None).unwrap();
        let t = Target { pid: std::process::id() as i32, uid: 0, maps };
        let (a, b) = t.private_lock_wait().expect("glibc exports __lll_lock_wait_private");
        assert!(a < b && b - a < 4096, "{a:#x}..{b:#x}");
        assert!(t.risky_ranges().iter().any(|&(s, e)| s <= a && b <= e), "not in the C library's code");
    }

    /// The loader lock is found in glibc's `_rtld_global` as this
    /// process maps it (free here), and nowhere in bytes without the pattern.
    #[test]
    fn the_loader_lock_is_found_in_our_own_loader() {
        let maps = procfs::read_maps(None).unwrap();
        let t = Target { pid: std::process::id() as i32, uid: 0, maps };
        let lock = t.loader_lock().expect("glibc's loader lock is found");
        assert_eq!(lock.holder(t.pid), None, "nobody holds the loader lock now");
        assert_eq!(find_loader_lock(&[0u8; 4096]), None);
        let mut two = vec![0u8; 4096];
        for at in [800usize, 2400] {
            two[at..at + 8].copy_from_slice(&1u64.to_le_bytes());
            for m in 0..2 {
                two[at + 8 + 40 * m + 16] = 1;
            }
        }
        assert_eq!(find_loader_lock(&two), None, "two candidates: none is taken");
        two[2400] = 0;
        assert_eq!(find_loader_lock(&two), Some(808));
    }

    #[test]
    fn c_stack_room_is_what_lies_above_the_mapping_start_of_a_c_stack() {
        let maps = procfs::parse_maps(
            "7f0000000000-7f0000001000 ---p 00000000 00:00 0 \n\
             7f0000001000-7f0000011000 rw-p 00000000 00:00 0 \n\
             7f0000011000-7f0000012000 r--p 00000000 00:00 0 \n\
             c000000000-c000400000 rw-p 00000000 00:00 0 \n\
             7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n",
        );
        // A thread stack of 64 KiB above its guard page, its control block at the top.
        let tp = 0x7f0000010800;
        assert_eq!(c_stack_room(&maps, 0x7f0000010000, tp), Some(60 << 10));
        assert_eq!(c_stack_room(&maps, 0x7f0000003000, tp), Some(8 << 10));
        // The main thread's stack grows, whatever its thread pointer.
        assert_eq!(c_stack_room(&maps, 0x7ffc00010000, 0x7f0000010800), Some(u64::MAX));
        // A goroutine's stack in Go's heap, on a thread whose control block
        // is on its C stack: not a C stack.
        assert_eq!(c_stack_room(&maps, 0xc000048d50, tp), None);
        // Above the control block: not the thread's stack.
        assert_eq!(c_stack_room(&maps, 0x7f0000010f00, tp), None);
        // In no mapping, in the guard page, in a read-only one.
        assert_eq!(c_stack_room(&maps, 0x6000_0000_0000, tp), None);
        assert_eq!(c_stack_room(&maps, 0x7f0000000800, tp), None);
        assert_eq!(c_stack_room(&maps, 0x7f0000011800, 0x7f0000011f00), None);
    }
}
