//! Access records: what the recording copies of the code cache write for
//! every memory access they make (the exact mode's input), and what the
//! engine writes for an instruction it runs outside the cache.
//!
//! A record is four 64-bit words:
//!
//! ```text
//!   0  address     the access's effective address (first element's for a rep string)
//!   1  pc          the native instruction's address
//!   2  info        length, kind and flags (below)
//!   3  extra       a call's return address, a ret's target, a rep string's element count
//! ```
//!
//! An instruction with several accesses writes one record each, in the
//! order the decoder lists them, all but the last flagged [`MORE`].

use super::decode::{Access, Decoded, Float, MAX_ACCESSES};

/// Bytes of one record.
pub const RECORD_BYTES: usize = 32;

/// Bits of the info word.
pub const LEN_MASK: u64 = 0xffff;
pub const READ: u64 = 1 << 16;
pub const WRITE: u64 = 1 << 17;
/// The instruction is a `call`: extra is its return address.
pub const CALL: u64 = 1 << 18;
/// The instruction is a `ret`: extra is where it returns to.
pub const RET: u64 = 1 << 19;
/// Another record of the same instruction follows.
pub const MORE: u64 = 1 << 20;
/// A `rep` string instruction: the access is `extra` elements of `len`
/// bytes from `address`, walking down with [`DOWN`].
pub const REP: u64 = 1 << 21;
pub const DOWN: u64 = 1 << 22;
/// No access: only a call or a return (the shadow call stack's), or an
/// instruction that ran without memory accesses.
pub const NONE: u64 = 1 << 23;
const FLOAT_SHIFT: u32 = 24;
const ELEM_SHIFT: u32 = 32;

/// One record, as the words say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub addr: u64,
    pub pc: u64,
    pub info: u64,
    pub extra: u64,
}

/// The info word of an access (its kind, length and value type).
pub fn info(a: &Access) -> u64 {
    let float = match a.float {
        Float::No => 0,
        Float::F32 => 1,
        Float::F64 => 2,
    };
    (a.len as u64 & LEN_MASK)
        | if a.read { READ } else { 0 }
        | if a.write { WRITE } else { 0 }
        | float << FLOAT_SHIFT
        | (a.elem as u64) << ELEM_SHIFT
}

impl Record {
    /// The access it describes (one element of a `rep` string's).
    pub fn access(&self) -> Access {
        let float = match (self.info >> FLOAT_SHIFT) & 3 {
            1 => Float::F32,
            2 => Float::F64,
            _ => Float::No,
        };
        Access {
            addr: self.addr,
            len: (self.info & LEN_MASK) as u32,
            read: self.info & READ != 0,
            write: self.info & WRITE != 0,
            float,
            elem: (self.info >> ELEM_SHIFT) as u8,
        }
    }

    pub fn is(&self, flag: u64) -> bool {
        self.info & flag != 0
    }

    pub fn to_words(self) -> [u64; 4] {
        [self.addr, self.pc, self.info, self.extra]
    }

    pub fn from_words(w: [u64; 4]) -> Record {
        Record { addr: w[0], pc: w[1], info: w[2], extra: w[3] }
    }

    /// The records in `bytes` (whole records only), in order.
    pub fn parse(bytes: &[u8]) -> impl Iterator<Item = Record> + '_ {
        bytes.chunks_exact(RECORD_BYTES).map(|c| {
            let w = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            Record { addr: w(0), pc: w(1), info: w(2), extra: w(3) }
        })
    }
}

/// What the engine knows about an instruction it runs outside the cache
/// (stepped natively, or a `rep` string run whole) besides its accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transfer {
    #[default]
    None,
    /// A `call` returning to the address given.
    Call(u64),
    /// A `ret` to the address given (read from the stack before it runs).
    Ret(u64),
    /// A `rep` string instruction of this many elements.
    Rep(u64),
}

/// The records of an instruction decoded with the registers before it ran
/// (the records a recording copy would have written for it; a `rep`
/// string's as ranges). An instruction without accesses that calls or
/// returns gets one [`NONE`] record, so the shadow call stack hears of it.
pub fn of_instruction(d: &Decoded, t: Transfer) -> ([Record; MAX_ACCESSES], usize) {
    let mut out = [Record::default(); MAX_ACCESSES];
    let n = d.n.min(MAX_ACCESSES);
    for (k, a) in d.accesses[..n].iter().enumerate() {
        let mut info = info(a);
        let mut extra = 0;
        match t {
            Transfer::Call(next) if a.write => {
                info |= CALL;
                extra = next;
            }
            Transfer::Ret(target) if a.read => {
                info |= RET;
                extra = target;
            }
            Transfer::Rep(count) => {
                info |= REP | if d.df { DOWN } else { 0 };
                extra = count;
            }
            _ => {}
        }
        if k + 1 < n {
            info |= MORE;
        }
        out[k] = Record { addr: a.addr, pc: d.ip, info, extra };
    }
    if n == 0 {
        let (info, extra) = match t {
            Transfer::Call(next) => (NONE | CALL, next),
            Transfer::Ret(target) => (NONE | RET, target),
            _ => (NONE, 0),
        };
        out[0] = Record { addr: 0, pc: d.ip, info, extra };
        return (out, 1);
    }
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_survives_its_info_word() {
        let a = Access { addr: 0x1234, len: 32, read: true, write: false, float: Float::F64, elem: 8 };
        let r = Record { addr: a.addr, pc: 7, info: info(&a) | MORE, extra: 0 };
        assert_eq!(r.access(), a);
        assert!(r.is(MORE) && !r.is(CALL));
        let mut bytes = Vec::new();
        for w in r.to_words() {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(Record::parse(&bytes).collect::<Vec<_>>(), vec![r]);
    }

    #[test]
    fn an_instruction_run_outside_the_cache_gets_the_records_a_copy_writes() {
        use crate::x86::decode::{Analyzer, Regs};
        let mut an = Analyzer::new();
        let mut regs = Regs { rip: 0x1000, ..Default::default() };
        regs.gpr[4] = 0x7000; // rsp
        regs.gpr[6] = 0x2000; // rsi
        regs.gpr[7] = 0x3000; // rdi
        regs.df = true;
        // call rel32: the return address pushed, and the shadow stack's event.
        let d = an.decode(&[0xE8, 0, 0, 0, 0], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction(&d, Transfer::Call(0x1005));
        assert_eq!(n, 1);
        assert_eq!((r[0].addr, r[0].access().len, r[0].is(WRITE), r[0].is(CALL), r[0].extra), (0x6ff8, 8, true, true, 0x1005));
        // rep movsq walking down: two ranged records (the decoder lists the
        // write first; the judge takes an instruction's loads first).
        let d = an.decode(&[0xF3, 0x48, 0xA5], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction(&d, Transfer::Rep(5));
        assert_eq!(n, 2);
        assert!(r[..2].iter().all(|r| r.is(REP) && r.is(DOWN) && r.extra == 5 && r.access().len == 8));
        assert!(r[0].is(MORE) && !r[1].is(MORE));
        let (read, write) = if r[0].is(READ) { (r[0], r[1]) } else { (r[1], r[0]) };
        assert_eq!((read.addr, read.is(WRITE), write.addr, write.is(READ)), (0x2000, false, 0x3000, false));
        // A syscall: no access, one NONE record.
        let d = an.decode(&[0x0F, 0x05], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction(&d, Transfer::None);
        assert_eq!((n, r[0].is(NONE)), (1, true));
    }
}
