//! The exact mode's recording paths of a thread's sampling state: what a
//! window does with the records its copies write, and the instructions the
//! cache does not copy, recorded from their decoded accesses. The buffer
//! and its channel are [`super::recorder`].

use super::ledger::code_bytes;
use super::process::Engine;
use super::thread::ThreadState;
use super::window::Plan;
use crate::modules::ProcessMap;
use crate::x86::decode::{Decoded, Regs};
use crate::x86::record::{of_instruction_for, RecordKind, Transfer};
use crate::x86::translate;

impl ThreadState {
    /// The instruction at `native` decoded with the context's registers.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn decode_here(&mut self, map: &ProcessMap, native: u64, uc: *mut libc::ucontext_t) -> Option<(Decoded, Regs)> {
        // SAFETY: forwarded from the caller.
        let mut regs = unsafe { self.ledger.regs(uc) };
        regs.rip = native;
        let d = self.ledger.decode(map, native, &regs, false)?;
        Some((d, regs))
    }

    /// Recording: a `rep` string instruction with elements to run (the
    /// context is at it, as the program left it). Its next part is
    /// recorded as ranges and run in the cache. A value craft's records
    /// carry the ranges' bytes, so its part is cut to what one datagram
    /// holds.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn record_rep(&mut self, map: &ProcessMap, own: (u64, u64), native: u64, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { &mut (*uc).uc_mcontext.gregs };
        let (rcx, rax) = (g[libc::REG_RCX as usize] as u64, g[libc::REG_RAX as usize] as u64);
        let mut part = rcx.min(translate::MAX_REP_ELEMENTS as u64);
        // SAFETY: forwarded from the caller.
        let Some((d, _)) = (unsafe { self.decode_here(map, native, uc) }) else {
            self.window.note_gap(native);
            return self.window.end(uc, native, true);
        };
        let kind = self.window.record_kind().unwrap_or(RecordKind::Addresses);
        if kind != RecordKind::Addresses {
            // Bytes of values an element adds, and the words of the records
            // without them (an element's worth of padding each).
            let (recs, n) = of_instruction_for(kind, &d, Transfer::Rep(1));
            let one = super::recorder::RecordBuffer::words_of(&recs[..n]);
            let per = recs[..n].iter().map(|r| r.value_lens().0).sum::<usize>().max(1);
            let room = super::recorder::CAPACITY.saturating_sub(one + n) * 8;
            part = part.min((room / per).max(1) as u64);
        }
        if part > 0 {
            let (recs, n) = of_instruction_for(kind, &d, Transfer::Rep(part));
            self.window.push_records(&recs[..n], rax);
            self.window.records_in();
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
        if self.run_critical_section(engine, map, uc, native) {
            return;
        }
        // SAFETY: forwarded from the caller.
        let decoded = unsafe { self.decode_here(map, native, uc) };
        // SAFETY: forwarded from the caller.
        let rax = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RAX as usize] as u64 };
        self.window.end(uc, native, true);
        let Some((d, _)) = decoded else {
            self.window.note_gap(native);
            return;
        };
        // A system call comes back after itself; a call the cache does not
        // take (into code it does not run) at its return address.
        let mut buf = [0u8; 16];
        let flow = code_bytes(map, native, &mut buf)
            .map(|b| iced_x86::Decoder::with_ip(64, b, native, iced_x86::DecoderOptions::NONE).decode())
            .map(|i| (i.flow_control(), i.mnemonic()));
        let (transfer, falls_through) = match flow {
            Some((_, iced_x86::Mnemonic::Syscall)) => (Transfer::None, true),
            // (no frame: the callee runs natively, unrecorded)
            Some((iced_x86::FlowControl::Call | iced_x86::FlowControl::IndirectCall, _)) => (Transfer::None, true),
            _ => (Transfer::None, !d.branch),
        };
        // Accesses the decoder cannot place (`xsave`'s) are left out as
        // the single-stepping mode leaves them out. A value craft's bytes
        // before are read now; those its stores leave, once the thread is
        // back (the window's next start).
        if let Some(kind) = self.window.record_kind() {
            let (recs, n) = of_instruction_for(kind, &d, transfer);
            self.window.push_records(&recs[..n], rax);
        }
        if !falls_through {
            self.window.note_gap(native);
            return;
        }
        self.resume_after(engine, d.next_ip());
    }

    /// Whole-run windows: the resume breakpoint fired; the thread is at
    /// the instruction it was set on: the cache takes it from here.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_resume(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        self.window.resume.disarm();
        // SAFETY: forwarded from the caller.
        if !unsafe { self.resume_here(engine, map, uc) } {
            // The thread goes on natively from the breakpoint's
            // instruction: the breakpoint must not stay there, or it fires
            // again at once (the flag that lets an instruction pass its
            // breakpoint does not come back through the signal's return)
            // and the thread never moves on.
            self.window.resume.stand_down();
        }
    }

    /// A window from the breakpoint's instruction; false if none began.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn resume_here(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) -> bool {
        if self.window.active() {
            return false;
        }
        let Some(settings) = engine.burst.and_then(|b| b.window) else { return false };
        if !self.window.usable() || !engine.windows_allowed() {
            return false;
        }
        // SAFETY: forwarded from the caller.
        let regs = unsafe { self.ledger.regs(uc) };
        let plan = Plan { weight: 1.0, settings, picks: 0 };
        // SAFETY: forwarded from the caller.
        if unsafe { self.begin_window(engine, map, &regs, plan, uc) } {
            self.window.note_resume();
            true
        } else {
            self.window.note_gap(regs.rip);
            false
        }
    }
}
