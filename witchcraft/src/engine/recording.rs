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
use crate::sys::perf::BpType;
use crate::sys::siginfo::{TAG, TAG_RESUME};
use crate::sys::watchpoint::{Arming, Breakpoint};
use crate::x86::record::{Record, RECORD_BYTES};

/// Records a buffer holds: one datagram of 64 KiB with its header.
pub const CAPACITY: usize = (65536 - stream::HEADER_BYTES) / RECORD_BYTES;

/// What the profile says about recording.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordStats {
    pub records: u64,
    pub sends: u64,
    /// Times the thread went on natively without being recorded (code the
    /// cache does not run and the engine could not record): each a gap in
    /// the exact account.
    pub gaps: u64,
    /// Where the first gap began (a native PC).
    pub first_gap: u64,
    /// Times recording resumed at a breakpoint after native code.
    pub resumes: u64,
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
    /// The instruction breakpoint where recording resumes after native
    /// code, and how it is armed (None: it could not be opened).
    resume: Breakpoint,
    how: Option<Arming>,
    armed: bool,
}

impl Recorder {
    pub fn new(fd: i32) -> Recorder {
        let words = (stream::HEADER_BYTES + CAPACITY * RECORD_BYTES) / 8;
        Recorder {
            buf: vec![0u64; words].into_boxed_slice(),
            pos: 0,
            fd,
            failed: false,
            stats: RecordStats::default(),
            resume: Breakpoint::CLOSED,
            how: None,
            armed: false,
        }
    }

    /// Open the resume breakpoint for thread `tid` (`open_tid` 0: the
    /// calling thread), disabled. Outside signal handlers. Without
    /// `sigtrap` (Linux < 5.13) there is none, and recording resumes at
    /// the next tick.
    pub fn open_resume(&mut self, engine: &super::Engine, tid: i32, open_tid: i32) {
        if !engine.sigtrap {
            return;
        }
        let how = Arming { ty: BpType::X, sigtrap: true, modify: engine.modify, in_place: false, tid, parking: Self::parking() };
        if let Ok(bp) = Breakpoint::open_parked(&how, TAG | TAG_RESUME, open_tid) {
            self.resume = bp;
            self.how = Some(how);
        }
    }

    /// Where the disabled breakpoint points: this function's code (the
    /// agent's, which the program never runs).
    fn parking() -> u64 {
        Self::parking as *const () as u64
    }

    /// Resume recording when the thread is about to run `pc`.
    /// Async-signal-safe. False if there is no breakpoint.
    pub fn arm(&mut self, pc: u64) -> bool {
        let Some(how) = self.how else { return false };
        self.armed = self.resume.retarget(&how, TAG | TAG_RESUME, pc, 8);
        self.armed
    }

    /// The breakpoint fired (or is no longer wanted).
    pub fn disarm(&mut self) {
        if self.armed {
            self.resume.disable();
            self.armed = false;
        }
    }

    pub fn close(&mut self) {
        self.resume.close();
        self.how = None;
        self.armed = false;
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

use super::thread::ThreadState;
use super::Engine;
use crate::modules::ProcessMap;
use crate::x86::decode::{Decoded, Regs};
use crate::x86::record::{of_instruction, Transfer};
use crate::x86::translate;

impl ThreadState {
    /// The instruction at `native` decoded with the context's registers.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn decode_here(&mut self, map: &ProcessMap, native: u64, uc: *mut libc::ucontext_t) -> Option<(Decoded, Regs)> {
        // SAFETY: forwarded from the caller.
        let mut regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        regs.rip = native;
        let mut buf = [0u8; 16];
        let b = super::sample::code_bytes(map, native, &mut buf)?;
        let d = self.scratch.analyzer.decode(b, native, &regs, false)?;
        Some((d, regs))
    }

    /// Recording: a `rep` string instruction with elements to run (the
    /// context is at it, as the program left it). Its next part is
    /// recorded as ranges and run in the cache.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn record_rep(&mut self, map: &ProcessMap, own: (u64, u64), native: u64, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { &mut (*uc).uc_mcontext.gregs };
        let rcx = g[libc::REG_RCX as usize] as u64;
        let part = rcx.min(translate::MAX_REP_ELEMENTS as u64);
        // SAFETY: forwarded from the caller.
        let Some((d, _)) = (unsafe { self.decode_here(map, native, uc) }) else {
            self.note_gap_at(native);
            return self.end_window(uc, native, true);
        };
        if part > 0 {
            let (recs, n) = of_instruction(&d, Transfer::Rep(part));
            if let Some(r) = &mut self.window.rec {
                r.push(&recs[..n]);
            }
            self.window.records_in_pub();
        }
        let data = self.window.cache.data();
        data.instr_left -= 1 + (part >> translate::REP_PER_INSTRUCTION_SHIFT) as i64;
        // SAFETY: forwarded from the caller.
        unsafe { self.rep_part(map, own, native, part, false, uc) };
    }

    /// Recording: the cache cannot run the instruction at `native` (a
    /// system call, an instruction it does not copy): it is recorded from
    /// its decoded accesses and runs natively; recording resumes after it
    /// ([`ThreadState::resume_after`]).
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn record_native(&mut self, engine: &Engine, map: &ProcessMap, native: u64, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let decoded = unsafe { self.decode_here(map, native, uc) };
        self.end_window(uc, native, true);
        let Some((d, _)) = decoded else {
            self.note_gap_at(native);
            return;
        };
        // A system call comes back after itself; a call the cache does not
        // take (into code it does not run) at its return address.
        let mut buf = [0u8; 16];
        let flow = super::sample::code_bytes(map, native, &mut buf)
            .map(|b| iced_x86::Decoder::with_ip(64, b, native, iced_x86::DecoderOptions::NONE).decode())
            .map(|i| (i.flow_control(), i.mnemonic()));
        let (transfer, falls_through) = match flow {
            Some((_, iced_x86::Mnemonic::Syscall)) => (Transfer::None, true),
            // (no frame: the callee runs natively, unrecorded)
            Some((iced_x86::FlowControl::Call | iced_x86::FlowControl::IndirectCall, _)) => (Transfer::None, true),
            _ => (Transfer::None, !d.branch),
        };
        // Accesses the decoder cannot place (`xsave`'s) are left out as
        // the single-stepping mode leaves them out.
        let (recs, n) = of_instruction(&d, transfer);
        if let Some(r) = &mut self.window.rec {
            r.push(&recs[..n]);
        }
        if !falls_through {
            self.note_gap_at(native);
            return;
        }
        self.resume_after(engine, d.next_ip());
    }

    /// Recording: go on natively, and back into the cache at `pc` when
    /// the thread gets there (an instruction breakpoint). Where that
    /// cannot be, the next tick takes the thread back: a gap.
    pub fn resume_after(&mut self, engine: &Engine, pc: u64) {
        let ok = crate::modules::current().is_some_and(|m| m.module(pc).is_some())
            && !(pc >= engine.own_code.0 && pc < engine.own_code.1)
            && self.window.rec.as_mut().is_some_and(|r| r.arm(pc));
        if !ok {
            self.note_gap_at(pc);
        }
    }

    /// Recording: the resume breakpoint fired; the thread is at the
    /// instruction it was set on: the cache takes it from here.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_resume(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        let Some(r) = &mut self.window.rec else { return };
        r.disarm();
        if self.window.active() {
            return;
        }
        let Some(settings) = engine.burst.and_then(|b| b.window) else { return };
        if !self.window.usable() || !engine.windows_allowed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // SAFETY: forwarded from the caller.
        let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        let plan = super::window::Plan { weight: 1.0, settings, picks: 0 };
        // SAFETY: forwarded from the caller.
        if unsafe { self.begin_window(engine, map, &regs, plan, uc) } {
            if let Some(r) = &mut self.window.rec {
                r.stats.resumes += 1;
            }
        } else {
            self.note_gap_at(regs.rip);
        }
    }

    pub(crate) fn note_gap_at(&mut self, pc: u64) {
        if let Some(r) = &mut self.window.rec {
            r.stats.gaps += 1;
            if r.stats.first_gap == 0 {
                r.stats.first_gap = pc;
            }
        }
    }
}
