//! The precise instruction behind a watchpoint trap from the branch stack
//! its sample carries (Witch §4.5): on a kernel with witch's breakpoint
//! branch-stack patch and a CPU with LBR, the sample names the last taken
//! branches before the access. Execution ran straight from the newest
//! branch's target to the access, so the instruction that ends at the
//! context PC is found by decoding that one basic block, not the whole
//! function. Everything here is pure and allocation-free: the caller reads
//! the record and the code.

/// One taken branch of a breakpoint sample's branch stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Branch {
    pub from: u64,
    pub to: u64,
}

/// Where the search for the trapping instruction starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lead {
    /// The newest branch landed on the context PC: the branch instruction
    /// itself made the access (`call` stores, `ret` and `jmp [m]` load).
    Branch(u64),
    /// Decode forward from this address (the newest branch's target) to the
    /// context PC.
    Block(u64),
}

/// Longest basic block decoded, in bytes; a longer distance means the stack
/// does not describe this trap.
pub const MAX_BLOCK: u64 = 4096;

/// Where the trapping instruction's search starts, from the branches
/// (newest first) of a trap with context PC `ctx`: the newest branch that
/// lands at or before `ctx`, within [`MAX_BLOCK`]. Entries that left `ctx`
/// (the exception itself, where the hardware logs it) are skipped. None: the
/// stack says nothing about this trap.
pub fn lead(branches: &[Branch], ctx: u64) -> Option<Lead> {
    let b = branches.iter().find(|b| !(b.from == ctx && b.to != ctx) && b.from != 0 && b.to != 0)?;
    if b.to == ctx {
        Some(Lead::Branch(b.from))
    } else if b.to < ctx && ctx - b.to <= MAX_BLOCK {
        Some(Lead::Block(b.to))
    } else {
        None
    }
}

/// The instruction that ends exactly at `end`, decoding `code` (the bytes
/// at `start`, reaching at least to `end`) forward from `start`. None if no
/// instruction boundary falls on `end` (the block isn't what ran).
pub fn block_predecessor(code: &[u8], start: u64, end: u64) -> Option<u64> {
    if end <= start || end - start > code.len() as u64 {
        return None;
    }
    let bytes = &code[..(end - start) as usize];
    let mut dec = iced_x86::Decoder::with_ip(64, bytes, start, iced_x86::DecoderOptions::NONE);
    let mut i = iced_x86::Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut i);
        if i.is_invalid() {
            return None;
        }
        if i.next_ip() == end {
            return Some(i.ip());
        }
    }
    None
}

/// The trapping instruction from a sample's branches (newest first) and
/// the code, read by `code(addr, buf)` (returns the bytes it could read at
/// `addr`, at most `buf.len()`): the branch itself, or the instruction
/// before `ctx` in the block. None: fall back to decoding from the
/// function start.
pub fn precise_pc(branches: &[Branch], ctx: u64, code: impl FnOnce(u64, &mut [u8]) -> usize, buf: &mut [u8]) -> Option<u64> {
    match lead(branches, ctx)? {
        Lead::Branch(from) => Some(from),
        Lead::Block(start) => {
            let want = ((ctx - start) as usize).min(buf.len());
            let n = code(start, &mut buf[..want]);
            block_predecessor(&buf[..n], start, ctx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A basic block at 0x1000, as a compiler might emit it:
    ///   0x1000 mov rax, [rdi+8]     48 8b 47 08
    ///   0x1004 add rax, 1           48 83 c0 01
    ///   0x1008 mov [rsi], rax       48 89 06
    ///   0x100b test rax, rax        48 85 c0
    ///   0x100e jne 0x1000           75 f0
    const BLOCK: [u8; 16] = [0x48, 0x8b, 0x47, 0x08, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0x06, 0x48, 0x85, 0xc0, 0x75, 0xf0];

    fn read(addr: u64, buf: &mut [u8]) -> usize {
        let off = (addr - 0x1000) as usize;
        let n = buf.len().min(BLOCK.len() - off);
        buf[..n].copy_from_slice(&BLOCK[off..off + n]);
        n
    }

    #[test]
    fn decodes_the_block_from_the_newest_branch_target() {
        // The loop's back edge landed on 0x1000; the store at 0x1008 trapped
        // with the context PC after it.
        let br = [Branch { from: 0x100e, to: 0x1000 }, Branch { from: 0x2000, to: 0x1000 }];
        let mut buf = [0u8; 64];
        assert_eq!(precise_pc(&br, 0x100b, read, &mut buf), Some(0x1008));
        // The load at the block's start.
        assert_eq!(precise_pc(&br, 0x1004, read, &mut buf), Some(0x1000));
        // A context PC inside an instruction is no boundary: fall back.
        assert_eq!(precise_pc(&br, 0x100a, read, &mut buf), None);
    }

    #[test]
    fn a_branch_that_lands_on_the_context_pc_made_the_access() {
        // `call` at 0x3000 stored the return address; the trap's PC is its target.
        let br = [Branch { from: 0x3000, to: 0x5000 }, Branch { from: 0x100e, to: 0x1000 }];
        assert_eq!(lead(&br, 0x5000), Some(Lead::Branch(0x3000)));
        let mut buf = [0u8; 16];
        assert_eq!(precise_pc(&br, 0x5000, |_, _| 0, &mut buf), Some(0x3000));
    }

    #[test]
    fn entries_that_do_not_describe_the_trap_are_skipped_or_refused() {
        // The exception itself, logged as a branch from the context PC: skipped.
        let br = [Branch { from: 0x100b, to: 0xffff_ffff_8100_0000 }, Branch { from: 0x100e, to: 0x1000 }];
        assert_eq!(lead(&br, 0x100b), Some(Lead::Block(0x1000)));
        // Newest branch after the context PC, or too far before it: no lead.
        assert_eq!(lead(&[Branch { from: 0x10, to: 0x2000 }], 0x1008), None);
        assert_eq!(lead(&[Branch { from: 0x10, to: 0x1000 }], 0x1000 + MAX_BLOCK + 1), None);
        // Empty entries (a stack the kernel could not fill).
        assert_eq!(lead(&[Branch::default()], 0x1008), None);
        assert_eq!(lead(&[], 0x1008), None);
    }

    #[test]
    fn short_or_invalid_code_falls_back() {
        let br = [Branch { from: 0x100e, to: 0x1000 }];
        let mut buf = [0u8; 64];
        // Code unreadable.
        assert_eq!(precise_pc(&br, 0x100b, |_, _| 0, &mut buf), None);
        // Invalid bytes before the context PC.
        assert_eq!(block_predecessor(&[0x0f, 0x0b, 0xff, 0xff], 0x1000, 0x1004), None);
        assert_eq!(block_predecessor(&BLOCK, 0x1000, 0x1000), None);
    }
}
