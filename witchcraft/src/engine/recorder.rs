//! The engine's recording mode: the exact mode from the code cache.
//!
//! With a record descriptor ([`crate::config::Config::record_fd`]) every
//! window runs recording copies ([`crate::x86::translate::Counted::Records`]):
//! before each memory access a copy writes an access record into this
//! thread's buffer, and the countdown, set to the room left, stops the copy
//! before an instruction whose records would not fit. The buffer is a
//! chunk of the thread's ring, memory witch maps too ([`crate::exact::ring`]):
//! the engine then publishes the chunk with a short notice on a
//! `SOCK_SEQPACKET` socket ([`crate::exact::stream`]), and witch judges
//! the records where they lie ([`crate::exact::Replay`]): the shadow memory
//! grows with the memory the program touches, so it lives in witch, not
//! here, where signal handlers may not allocate. Publishing is one `send`
//! (async-signal-safe, atomic per notice), and the thread waits before it
//! writes over a chunk witch has not judged yet, which holds the thread,
//! not the judge. The ring is made at the thread's first window (the
//! system calls that make it are async-signal-safe), and made anew in a
//! fork child, whose inherited view of its parent's ring it drops.
//!
//! Instructions the cache does not run are recorded by the engine from
//! their decoded accesses ([`crate::x86::record::of_instruction_for`]): a
//! `rep` string as ranges, a system call (no access), an instruction the
//! translator cannot copy. For the value crafts the engine reads the
//! values itself: the bytes before from memory as it records; the bytes a
//! store run natively left once the thread is back ([`RecordBuffer::complete`]).
//!
//! The buffer is counted in words (8 bytes): a record without values is
//! four, the value crafts' records are longer ([`crate::x86::record`]).

use crate::exact::ring::{Ring, CHUNK_BYTES};
use crate::exact::stream;
use crate::x86::record::{Record, RecordKind, CALL, DOWN, LEN_MASK, MAX_RECORDS, RECORD_WORDS, REP};

/// Words of records a buffer holds: a chunk of the ring, less its header.
pub const CAPACITY: usize = (CHUNK_BYTES - stream::HEADER_BYTES) / 8;

/// What the profile says about recording.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordStats {
    /// Words of records (and their values) written.
    pub words: u64,
    pub sends: u64,
}

pub struct RecordBuffer {
    /// The ring whose chunk is the buffer (None: not made yet, or it
    /// could not be).
    ring: Option<Ring>,
    /// Where records go when there is no ring (sending failed): a header,
    /// then CAPACITY words. Allocated when the thread's state is made,
    /// never in a handler; its pages are touched only then.
    scratch: Box<[u64]>,
    /// Words of records in the buffer.
    pos: usize,
    fd: i32,
    /// The process image the records come from (see `exact::stream`).
    image: u32,
    /// What the thread records (its craft's kind).
    pub kind: RecordKind,
    /// Stores the engine recorded before they ran natively, whose bytes
    /// after are read when the thread is back: (the word their bytes go
    /// to, address, bytes).
    pending: [(usize, u64, usize); MAX_RECORDS],
    npending: usize,
    /// Sending failed (witch went away): record no more.
    pub failed: bool,
    pub stats: RecordStats,
}

impl RecordBuffer {
    pub fn new(fd: i32, kind: RecordKind, image: u32) -> RecordBuffer {
        let words = stream::HEADER_BYTES / 8 + CAPACITY;
        RecordBuffer {
            ring: None,
            scratch: vec![0u64; words].into_boxed_slice(),
            pos: 0,
            fd,
            image,
            kind,
            pending: [(0, 0, 0); MAX_RECORDS],
            npending: 0,
            failed: false,
            stats: RecordStats::default(),
        }
    }

    /// The buffer: a header's words, then CAPACITY words of records.
    /// Makes the thread's ring if it has none yet. Async-signal-safe.
    fn buf(&mut self) -> &mut [u64] {
        if self.ring.is_none() && !self.failed {
            self.ring = Ring::create(self.fd, crate::sys::task::getpid(), crate::sys::task::gettid(), self.image);
            self.failed = self.ring.is_none();
        }
        let words = self.scratch.len();
        match &self.ring {
            // SAFETY: a chunk of the ring's mapping is a header and
            // CAPACITY words, the thread's own until it publishes it.
            Some(r) => unsafe { std::slice::from_raw_parts_mut(r.chunk(), words) },
            None => &mut self.scratch,
        }
    }

    /// Where the first record goes.
    fn start(&mut self) -> u64 {
        self.buf().as_ptr() as u64 + stream::HEADER_BYTES as u64
    }

    /// Where the next record goes (for the copies' record slot).
    pub fn next_ptr(&mut self) -> u64 {
        self.start() + (self.pos * 8) as u64
    }

    /// Words that still fit.
    pub fn room(&self) -> usize {
        CAPACITY - self.pos
    }

    /// The copies wrote records up to `ptr` (the record slot as they left it).
    pub fn wrote_to(&mut self, ptr: u64) {
        let start = self.start();
        if ptr >= start && ptr <= start + (CAPACITY * 8) as u64 {
            let pos = ((ptr - start) as usize) / 8;
            self.stats.words += pos.saturating_sub(self.pos) as u64;
            self.pos = pos;
        }
    }

    /// Add records without values the engine made (for an instruction
    /// run outside the cache), sending first if they do not fit.
    /// Async-signal-safe.
    pub fn push(&mut self, recs: &[Record]) {
        self.complete();
        if self.room() < recs.len() * RECORD_WORDS {
            self.send();
        }
        for r in recs.iter().take(self.room() / RECORD_WORDS) {
            let at = (stream::HEADER_BYTES / 8) + self.pos;
            self.buf()[at..at + RECORD_WORDS].copy_from_slice(&r.to_words());
            self.pos += RECORD_WORDS;
            self.stats.words += RECORD_WORDS as u64;
        }
    }

    /// Add the records the engine made of an instruction it runs itself
    /// ([`crate::x86::record::of_instruction_for`] this recorder's kind),
    /// with their values if the kind has any (`rax`: the program's, for a
    /// `rep stos`). Async-signal-safe.
    pub fn push_for(&mut self, recs: &[Record], rax: u64) {
        if self.kind == RecordKind::Addresses {
            self.push(recs);
        } else {
            self.push_valued(recs, rax);
        }
    }

    /// Words the records take with their values.
    pub fn words_of(recs: &[Record]) -> usize {
        recs.iter()
            .map(|r| {
                let (b, a) = r.value_lens();
                RECORD_WORDS + b.div_ceil(8) + a.div_ceil(8)
            })
            .sum()
    }

    /// Add a value craft's records the engine made, with their values:
    /// the bytes before, read from memory now (a `rep` string's whole
    /// range); the bytes after, a `call`'s return address, a `rep stos`'s
    /// element from `rax`, and otherwise (a store about to run natively)
    /// read once the thread is back ([`RecordBuffer::complete`]). Sends first
    /// if they do not fit; records that cannot fit an empty buffer are
    /// left out (the engine cuts `rep` strings to fit). Async-signal-safe.
    pub fn push_valued(&mut self, recs: &[Record], rax: u64) {
        self.complete();
        let need = Self::words_of(recs);
        if need > CAPACITY {
            return;
        }
        if self.room() < need {
            self.send();
        }
        for r in recs {
            let at = (stream::HEADER_BYTES / 8) + self.pos;
            self.buf()[at..at + RECORD_WORDS].copy_from_slice(&r.to_words());
            let (b, a) = r.value_lens();
            let (bw, aw) = (b.div_ceil(8), a.div_ceil(8));
            let values = at + RECORD_WORDS;
            // Padding and unreadable bytes are zeroes.
            self.buf()[values..values + bw + aw].fill(0);
            if b > 0 {
                let len = r.info & LEN_MASK;
                let lo = if r.is(REP) && r.is(DOWN) { r.addr.wrapping_sub((r.extra.max(1) - 1).wrapping_mul(len)) } else { r.addr };
                crate::sys::mem::read_own(lo, self.bytes(values, b));
            }
            if a > 0 {
                let at_after = values + bw;
                if r.is(CALL) {
                    self.bytes(at_after, a).copy_from_slice(&r.extra.to_le_bytes()[..a.min(8)]);
                } else if r.is(REP) {
                    let v = rax.to_le_bytes();
                    let n = a.min(8);
                    self.bytes(at_after, a)[..n].copy_from_slice(&v[..n]);
                } else if self.npending < MAX_RECORDS {
                    self.pending[self.npending] = (at_after, r.addr, a);
                    self.npending += 1;
                }
            }
            self.pos += RECORD_WORDS + bw + aw;
            self.stats.words += (RECORD_WORDS + bw + aw) as u64;
        }
    }

    /// `n` bytes of the buffer from word `at`.
    fn bytes(&mut self, at: usize, n: usize) -> &mut [u8] {
        let words = &mut self.buf()[at..at + n.div_ceil(8)];
        // SAFETY: the words are initialised and at least `n` bytes long;
        // u8 has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, n) }
    }

    /// The thread is back from the native instructions recorded last:
    /// read the bytes their stores left. Async-signal-safe.
    pub fn complete(&mut self) {
        for k in 0..self.npending {
            let (at, addr, n) = self.pending[k];
            crate::sys::mem::read_own(addr, self.bytes(at, n));
        }
        self.npending = 0;
    }

    /// Publish the buffer's records (if any) and empty it: witch judges
    /// the chunk, and the buffer is the ring's next one (once witch has
    /// judged what it held). Async-signal-safe: one `send`, retried if a
    /// signal interrupted it, and a futex wait while the ring is full.
    pub fn send(&mut self) {
        self.complete();
        if self.pos == 0 {
            return;
        }
        let n = self.pos;
        self.pos = 0;
        let h = stream::Header { pid: crate::sys::task::getpid(), tid: crate::sys::task::gettid(), words: n as u32, image: self.image };
        let Some(ring) = self.ring.as_mut().filter(|_| !self.failed) else { return };
        if !ring.publish(self.fd, h) {
            self.failed = true;
            self.ring = None;
        }
        self.stats.sends += 1;
    }

    /// The process image the records come from, from now on (a fork
    /// child's).
    pub fn set_image(&mut self, image: u32) {
        self.image = image;
    }

    /// Forget the records (a fork child: they are the parent's), and the
    /// parent's ring (this process's view of it; the thread makes its own
    /// at its next window).
    pub fn clear(&mut self) {
        if let Some(r) = self.ring.take() {
            r.abandon();
        }
        self.failed = false;
        self.pos = 0;
        self.npending = 0;
        self.stats = RecordStats::default();
    }
}
