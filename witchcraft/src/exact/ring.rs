//! A recording thread's ring of record chunks, in memory the program and
//! witch both map: the program's copies write access records straight
//! into a chunk, and witch judges them where they lie. Only a short notice
//! crosses the socket per chunk (`exact::stream`); before, each 64 KiB
//! buffer was copied into the socket and out again, and the copying took
//! more of an exact run than the judging (Lua's dead stores: a third of
//! all CPU time in `sendto` and the program's traps around it).
//!
//! The ring is a `memfd` of [`RING_BYTES`]: a control page, then
//! [`CHUNKS`] chunks of [`CHUNK_BYTES`], each laid out as a datagram of
//! the stream was (a header, then the records). The thread fills chunk
//! `s % CHUNKS` for its `s`-th chunk; witch counts the chunks it has
//! judged in the control page's `consumed` word (a futex), and the thread
//! waits for that count before it writes over a chunk witch has not
//! judged. The thread makes its ring at its first window (often in a signal
//! handler: every call that makes it is async-signal-safe) and sends
//! witch the memfd once, with a registration notice; the thread's
//! descriptor is closed at once, its mapping kept.

use crate::sys::{fd, futex, mem};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of one chunk: a header and the records.
pub const CHUNK_BYTES: usize = 256 * 1024;
/// Chunks in a ring: how far a thread may run ahead of witch's judging.
pub const CHUNKS: u32 = 8;
/// The control page.
pub(super) const CONTROL_BYTES: usize = 4096;
/// Bytes of a ring's mapping.
pub const RING_BYTES: usize = CONTROL_BYTES + CHUNKS as usize * CHUNK_BYTES;

/// The control page's start.
#[repr(C)]
pub(super) struct Control {
    /// Chunks witch has judged (written by witch; the thread's futex).
    pub(super) consumed: AtomicU32,
    /// The count of judged chunks a waiting thread waits for, with
    /// [`WAITING`] set (0: nobody waits). Witch wakes the thread only
    /// once `consumed` reaches it, not at every chunk it judges.
    pub(super) wanted: AtomicU32,
    /// The ring's number (see [`Ring::id`]), for a check.
    id: AtomicU64,
}

/// How long a thread waits on the futex before it looks whether witch
/// is still there.
const WAIT_MS: u64 = 10;

/// The bit of [`Control::wanted`] that says a thread waits; the count it
/// waits for is in the other 31 bits.
pub(super) const WAITING: u32 = 1 << 31;

/// Whether `consumed` judged chunks reach a thread's `wanted` (as
/// [`Control::wanted`] holds it: 31 bits of a count that wraps).
pub(super) fn reached(consumed: u32, wanted: u32) -> bool {
    wanted & WAITING != 0 && consumed.wrapping_sub(wanted) & !WAITING < 1 << 30
}

/// The thread's side: its ring, mapped.
pub struct Ring {
    base: *mut u8,
    id: u64,
    /// The socket its notices go on.
    sock: i32,
    /// Chunks published so far (the one being filled is this one).
    published: u32,
}

// SAFETY: the mapping is the thread's own; the state holding it moves
// between threads only before the thread runs (or in a fork child).
unsafe impl Send for Ring {}

/// Each process's rings get numbers in the order they are made.
static NEXT: AtomicU32 = AtomicU32::new(0);

impl Ring {
    /// Make a ring and register it with witch on socket `sock` (its
    /// notice carries `pid`, `tid` and `image`). None if the memory
    /// or the socket refused; the caller records nothing then.
    /// Async-signal-safe: raw system calls, a stack control message, no
    /// allocation.
    pub fn create(sock: i32, pid: i32, tid: i32, image: u32) -> Option<Ring> {
        let memfd = fd::memfd(c"witch-records", RING_BYTES as u64).ok()?;
        let base = mem::map_own_fd(RING_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd);
        if base == libc::MAP_FAILED {
            fd::close(memfd);
            return None;
        }
        // Unique among the rings witch is sent: a pid, and a count within
        // the process (an exec'd image counts again, after every notice of
        // the image before it).
        let id = (pid as u32 as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed) as u64;
        let ring = Ring { base: base as *mut u8, id, sock, published: 0 };
        ring.control().id.store(id, Ordering::Relaxed);
        let notice =
            super::stream::Notice::Register { id, bytes: RING_BYTES as u64 }.datagram(super::stream::Header { pid, tid, words: 0, image });
        let sent = fd::send_datagram_with_fd(sock, &notice, memfd);
        fd::close(memfd);
        sent.then_some(ring)
    }

    fn control(&self) -> &Control {
        // SAFETY: the mapping starts with the control page, zeroed by the
        // kernel, and lives as long as `self`.
        unsafe { &*(self.base as *const Control) }
    }

    /// The chunk being filled: its header's words, then the records'.
    pub fn chunk(&self) -> *mut u64 {
        let slot = (self.published % CHUNKS) as usize;
        // SAFETY: within the mapping.
        unsafe { self.base.add(CONTROL_BYTES + slot * CHUNK_BYTES) as *mut u64 }
    }

    /// Tell witch the chunk being filled holds `header.words` words of
    /// records (the header is written into it here), and move on to the
    /// next chunk once witch has judged what was there. False if witch is
    /// gone. Async-signal-safe.
    pub fn publish(&mut self, sock: i32, header: super::stream::Header) -> bool {
        let chunk = self.chunk();
        let [a, b] = header.to_words();
        // SAFETY: the chunk's first two words are its header.
        unsafe {
            chunk.write(a);
            chunk.add(1).write(b);
        }
        let offset = chunk as u64 - self.base as u64;
        let notice = super::stream::Notice::Chunk { id: self.id, offset }.datagram(header);
        if !fd::send_datagram(sock, &notice) {
            return false;
        }
        self.published = self.published.wrapping_add(1);
        // The next chunk's last records must be judged before it is written.
        let control = self.control();
        if self.published.wrapping_sub(control.consumed.load(Ordering::Acquire)) < CHUNKS {
            return true;
        }
        // The ring is full: witch judges slower than this thread records.
        // Wait until half of it is free, not one chunk, so that witch
        // wakes the thread once every few chunks rather than at each (a
        // wake and a switch per chunk of 256 KiB took a few percent of
        // the judge's time).
        let want = self.published.wrapping_sub(CHUNKS / 2);
        control.wanted.store(want | WAITING, Ordering::SeqCst);
        let free = loop {
            // (SeqCst with witch's side: either witch sees `wanted` after
            // its count, or this load sees the count.)
            let consumed = control.consumed.load(Ordering::SeqCst);
            if reached(consumed, want | WAITING) {
                break true;
            }
            futex::wait(&control.consumed, consumed, WAIT_MS);
            if fd::peer_gone(sock) {
                break false;
            }
        };
        control.wanted.store(0, Ordering::Relaxed);
        free
    }
}

impl Ring {
    /// Drop this process's view of the ring without a word to witch: a
    /// fork child's copy of its parent's (the ring stays the parent's).
    pub fn abandon(self) {
        // SAFETY: this process's mapping, unused from here on.
        unsafe { mem::unmap_own(self.base as *mut libc::c_void, RING_BYTES) };
        std::mem::forget(self);
    }
}

impl Drop for Ring {
    /// The thread's state goes: witch lets the ring go too, after its
    /// last chunk (a notice, best effort).
    fn drop(&mut self) {
        let h = super::stream::Header { pid: crate::sys::task::getpid(), tid: 0, words: 0, image: 0 };
        fd::send_datagram(self.sock, &super::stream::Notice::Retire { id: self.id }.datagram(h));
        // SAFETY: the ring's own mapping, unused from here on (witch keeps
        // its own mapping of the memory until the notice).
        unsafe { mem::unmap_own(self.base as *mut libc::c_void, RING_BYTES) };
    }
}
