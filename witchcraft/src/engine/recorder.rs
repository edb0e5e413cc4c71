//! The engine's recording mode: the exact mode from the code cache.
//!
//! With a record descriptor ([`crate::config::Config::record_fd`]) every
//! window runs recording copies ([`crate::x86::translate::Counted::Records`]):
//! before each memory access a copy writes an access record into this
//! thread's buffer, and the countdown, set to the room left, stops the copy
//! before an instruction whose records would not fit. The engine then sends
//! the buffer whole, as one datagram ([`crate::exact::stream`]), to witch,
//! which judges it ([`crate::exact::Replay`]): the shadow memory grows with
//! the memory the program touches, so it lives in witch, not here, where
//! signal handlers may not allocate. Sending is one `send` on a
//! `SOCK_SEQPACKET` socket: async-signal-safe, atomic per datagram (threads
//! never interleave inside one), and it blocks while witch is behind, which
//! holds the thread, not the judge.
//!
//! Instructions the cache does not run are recorded by the engine from
//! their decoded accesses ([`crate::x86::record::of_instruction`]): a
//! `rep` string as ranges, a system call (no access), an instruction the
//! translator cannot copy.

use crate::exact::stream;
use crate::x86::record::{Record, RECORD_BYTES};

/// Records a buffer holds: one datagram of 64 KiB with its header.
pub const CAPACITY: usize = (65536 - stream::HEADER_BYTES) / RECORD_BYTES;

/// What the profile says about recording.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordStats {
    pub records: u64,
    pub sends: u64,
}

pub struct Recorder {
    /// The datagram: header, then CAPACITY records. Allocated when the
    /// thread's state is made, never in a handler.
    buf: Box<[u64]>,
    /// Records in the buffer.
    pos: usize,
    fd: i32,
    /// Sending failed (witch went away): record no more.
    pub failed: bool,
    pub stats: RecordStats,
}

impl Recorder {
    pub fn new(fd: i32) -> Recorder {
        let words = (stream::HEADER_BYTES + CAPACITY * RECORD_BYTES) / 8;
        Recorder { buf: vec![0u64; words].into_boxed_slice(), pos: 0, fd, failed: false, stats: RecordStats::default() }
    }

    /// Where the first record goes.
    fn start(&self) -> u64 {
        self.buf.as_ptr() as u64 + stream::HEADER_BYTES as u64
    }

    /// Where the next record goes (for the copies' record slot).
    pub fn next_ptr(&self) -> u64 {
        self.start() + (self.pos * RECORD_BYTES) as u64
    }

    /// Records that still fit.
    pub fn room(&self) -> usize {
        CAPACITY - self.pos
    }

    /// The copies wrote records up to `ptr` (the record slot as they left it).
    pub fn wrote_to(&mut self, ptr: u64) {
        let start = self.start();
        if ptr >= start && ptr <= start + (CAPACITY * RECORD_BYTES) as u64 {
            let pos = ((ptr - start) as usize) / RECORD_BYTES;
            self.stats.records += pos.saturating_sub(self.pos) as u64;
            self.pos = pos;
        }
    }

    /// Add records the engine made (for an instruction run outside the
    /// cache), sending first if they do not fit. Async-signal-safe.
    pub fn push(&mut self, recs: &[Record]) {
        if self.room() < recs.len() {
            self.send();
        }
        for r in recs.iter().take(self.room()) {
            let at = (stream::HEADER_BYTES / 8) + self.pos * (RECORD_BYTES / 8);
            self.buf[at..at + 4].copy_from_slice(&r.to_words());
            self.pos += 1;
            self.stats.records += 1;
        }
    }

    /// Send the buffer's records (if any) and empty it. Async-signal-safe:
    /// one `send`, retried if a signal interrupted it.
    pub fn send(&mut self) {
        if self.pos == 0 {
            return;
        }
        let n = self.pos;
        self.pos = 0;
        if self.failed {
            return;
        }
        let h = stream::Header { pid: crate::sys::task::getpid(), tid: crate::sys::task::gettid(), records: n as u32 };
        self.buf[..stream::HEADER_BYTES / 8].copy_from_slice(&h.to_words());
        let bytes = stream::HEADER_BYTES + n * RECORD_BYTES;
        // SAFETY: the buffer holds `bytes` initialised bytes.
        let data = unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const u8, bytes) };
        if !stream::send(self.fd, data) {
            self.failed = true;
        }
        self.stats.sends += 1;
    }

    /// Forget the records (a fork child: they are the parent's).
    pub fn clear(&mut self) {
        self.pos = 0;
        self.stats = RecordStats::default();
    }
}
