//! The dispatch table's lookup stub, through which indirect branches and
//! returns reach their target's copy.

use super::emit::Emitter;
use super::{DataAddrs, Error, Exit};

/// The dispatch stub, at `at`: the native target of an indirect branch
/// is in the target slot; look it up in the dispatch table (a pointer to
/// it in the table slot; `entries` of 16 bytes, native address and copy,
/// a power of two) and jump to the copy, every register and flag as the
/// program left them; on a miss, leave by an [`Exit::Lookup`] exit (through
/// the link stub at `link` first, if there is one: not 0).
pub fn emit_dispatch(slots: &DataAddrs, entries: u32, at: u64, link: u64, out: &mut [u8]) -> Result<usize, Error> {
    let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
    let s = *slots;
    e.mov_slot_reg(s.save_rax, 0);
    e.bytes(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
    e.mov_slot_reg(s.save_flags, 0);
    e.mov_slot_reg(s.save_rcx, 1);
    e.mov_reg_slot(0, s.target);
    e.bytes(&[0x48, 0x89, 0xC1]); // mov rcx, rax
    e.bytes(&[0x48, 0xC1, 0xE9, 0x0B]); // shr rcx, 11
    e.bytes(&[0x48, 0x31, 0xC1]); // xor rcx, rax
    e.bytes(&[0x81, 0xE1]); // and ecx, entries-1
    e.bytes(&(entries - 1).to_le_bytes());
    e.bytes(&[0x48, 0xC1, 0xE1, 0x04]); // shl rcx, 4
    e.modrm_slot(&[0x48, 0x03], 1, s.table); // add rcx, [table]
    e.bytes(&[0x48, 0x3B, 0x01]); // cmp rax, [rcx]
    let miss = e.jcc_rel32(0x5); // jne
    e.bytes(&[0x48, 0x8B, 0x41, 0x08]); // mov rax, [rcx+8]
    e.mov_slot_reg(s.jump, 0);
    e.mov_reg_slot(0, s.save_flags);
    e.bytes(&[0x04, 0x7F, 0x9E]); // add al, 0x7f; sahf
    e.mov_reg_slot(0, s.save_rax);
    e.mov_reg_slot(1, s.save_rcx);
    e.modrm_slot(&[0xFF], 4, s.jump); // jmp [jump]
    e.bind(miss);
    e.mov_reg_slot(0, s.save_flags);
    e.bytes(&[0x04, 0x7F, 0x9E]);
    e.mov_reg_slot(0, s.save_rax);
    e.mov_reg_slot(1, s.save_rcx);
    if link != 0 {
        e.link_prefix(link);
    }
    let rec = Exit::Lookup.encode();
    e.bytes(&[0xCC]);
    e.bytes(&rec);
    if e.full {
        return Err(Error::Full);
    }
    Ok(e.pos)
}

/// Where a native address lands in the dispatch table of `entries`.
pub fn dispatch_index(native: u64, entries: u32) -> usize {
    ((native ^ (native >> 11)) as u32 & (entries - 1)) as usize
}

/// The link stub, at `at`: an exit that asks for a copy (a link, a slow
/// variant, a dispatch miss) comes here with its `int3`'s address in the
/// jump slot, before trapping. It keeps the program's stack pointer in a
/// slot, switches to the cache's own stack (the program's is never
/// touched, not even below its red zone: it may be a small alternate
/// signal stack) and calls the engine's entry (whose address is in the
/// link-entry slot), which keeps every register and flag and either makes
/// the copy and aims the jump slot at it, or leaves the slot as it was.
/// Then back on the program's stack, it jumps where the slot says: the
/// copy, or the exit's `int3` (the trap takes the exit as before). No
/// instruction here changes the flags.
pub fn emit_link(slots: &DataAddrs, at: u64, out: &mut [u8]) -> Result<usize, Error> {
    let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
    let s = *slots;
    e.mov_slot_reg(s.save_rsp, 4); // mov [save_rsp], rsp
    e.mov_reg_slot(4, s.link_stack); // mov rsp, [link_stack]
    e.modrm_slot(&[0xFF], 2, s.link_entry); // call [link_entry]
    e.mov_reg_slot(4, s.save_rsp); // mov rsp, [save_rsp]
    e.modrm_slot(&[0xFF], 4, s.jump); // jmp [jump]
    if e.full {
        return Err(Error::Full);
    }
    Ok(e.pos)
}
