//! Futexes on a word of shared memory (the exact mode's record rings,
//! mapped by the program and by witch): one side waits for the word to
//! change, the other wakes it. Not private futexes: the two sides are
//! different processes.

use std::sync::atomic::AtomicU32;

/// Wait (at most `timeout_ms`) while `word` holds `expected`; returns at
/// once if it does not, and early on a wake or a signal. Async-signal-safe.
pub fn wait(word: &AtomicU32, expected: u32, timeout_ms: u64) {
    let t = libc::timespec { tv_sec: (timeout_ms / 1000) as libc::time_t, tv_nsec: ((timeout_ms % 1000) * 1_000_000) as libc::c_long };
    // SAFETY: a futex wait on a live, aligned 32-bit word, with a relative timeout.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &t as *const libc::timespec, 0usize, 0u32) };
}

/// Wake every waiter on `word`. Async-signal-safe.
pub fn wake(word: &AtomicU32) {
    // SAFETY: a futex wake on a live, aligned 32-bit word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32) };
}
