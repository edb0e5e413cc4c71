//! witch's exit statuses.
//!
//! When witch runs a program, the program's own status is witch's status
//! (and if a signal ended it, witch dies of the same signal), so witch's own
//! failures take the codes `env` and `timeout` use, which a program rarely
//! returns:
//! - 125: witch itself failed (a usage error, an unusable `-o`, a set-up failure);
//! - 126: the program was found but cannot be profiled (not executable, a
//!   directory, statically linked, not x86-64, set-user-ID or set-group-ID
//!   to another user, or witch runs under a seccomp filter the program would
//!   inherit);
//! - 127: the program was not found.
//!
//! Every other command (`report`, `diff`, `gate`, `doctor`, `daemon`, and a
//! craft with `--pid`, which runs no program) exits 0 when it worked and 2
//! on an error (running out of memory included: [`OutOfMemory`]); `gate` exits 1 when a bound fails, and a craft with `--pid`
//! exits 3 when the process replaced its program (exec) during the session
//! or the attach, which leaves no profile (the process runs on).

/// witch failed before, or instead of, running the program.
pub const FAILED: i32 = 125;
/// The program exists but cannot be run under witch.
pub const CANNOT_RUN: i32 = 126;
/// The program was not found.
pub const NOT_FOUND: i32 = 127;
/// An error in any other command.
pub const ERROR: i32 = 2;
/// `witch gate`: a bound failed.
pub const GATE_FAILED: i32 = 1;
/// `witch CRAFT --pid`: the process replaced its program (exec) during the
/// session (or the attach); its agent and profile went with the old image.
pub const TARGET_EXEC: i32 = 3;

/// An error that says which status witch exits with.
#[derive(Debug)]
pub struct ExitError {
    pub code: i32,
    pub msg: String,
}

impl std::fmt::Display for ExitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ExitError {}

pub fn not_found(msg: impl Into<String>) -> anyhow::Error {
    ExitError { code: NOT_FOUND, msg: msg.into() }.into()
}

pub fn cannot_run(msg: impl Into<String>) -> anyhow::Error {
    ExitError { code: CANNOT_RUN, msg: msg.into() }.into()
}

/// The status for an error: its own when it carries one, else `default`.
pub fn code_of(e: &anyhow::Error, default: i32) -> i32 {
    e.chain().find_map(|c| c.downcast_ref::<ExitError>()).map_or(default, |s| s.code)
}

/// The status witch exits with when it runs out of memory: [`FAILED`] where
/// it runs a program, [`ERROR`] in every other command (`main` says which).
static OUT_OF_MEMORY_STATUS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(ERROR);

/// Sets the status of [`OutOfMemory`].
pub fn on_out_of_memory(code: i32) {
    OUT_OF_MEMORY_STATUS.store(code, std::sync::atomic::Ordering::Relaxed);
}

/// The allocator of the `witch` binary: the system's, except that running
/// out (`ulimit -v`, a profile too large for the machine) ends witch with
/// one line and its error status, not with Rust's abort (status 134 and a
/// backtrace). Nothing is allocated on the way out.
pub struct OutOfMemory;

impl OutOfMemory {
    #[cold]
    fn fail(size: usize) -> ! {
        let mut line = *b"witch: out of memory: an allocation of                      ";
        let mut digits = [0u8; 20];
        let (mut n, mut i) = (size, digits.len());
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let head = b"witch: out of memory: an allocation of ".len();
        let number = &digits[i..];
        line[head..head + number.len()].copy_from_slice(number);
        let tail = b" bytes failed (a limit on witch's memory, ulimit -v, or a profile too large for this machine)\n";
        // SAFETY: writes of our own buffers to stderr, then the exit, which
        // runs nothing of witch's (no allocation can be made now).
        unsafe {
            libc::write(2, line.as_ptr().cast(), head + number.len());
            libc::write(2, tail.as_ptr().cast(), tail.len());
            libc::_exit(OUT_OF_MEMORY_STATUS.load(std::sync::atomic::Ordering::Relaxed));
        }
    }
}

// SAFETY: every call goes to the system allocator with the same arguments;
// only a failed allocation differs, which never returns.
unsafe impl std::alloc::GlobalAlloc for OutOfMemory {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(l) };
        if p.is_null() {
            Self::fail(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc_zeroed(l) };
        if p.is_null() {
            Self::fail(l.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, l: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.realloc(ptr, l, size) };
        if p.is_null() {
            Self::fail(size);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, l: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, l) }
    }
}
