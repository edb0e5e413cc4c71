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
//!
//! What is recorded depends on the craft ([`Kind`]): the dead craft needs
//! addresses only, and records every access; the value crafts record only
//! the accesses of their kind (stores, or loads), each followed by the
//! bytes they compare (RedSpy's and LoadSpy's definitions):
//!
//! ```text
//!   4..      before   the bytes at the address before the instruction ran
//!                     (what a load read, what a store overwrote) [`BEFORE`]
//!   ...      after    the bytes a store left [`AFTER`]
//! ```
//!
//! each `min(len, 64)` bytes padded to whole words (a `rep` string's
//! record: `before` is its range, all its elements, and `after`, on a
//! `rep stos`, the one element it stores from a register). A `call` or
//! `ret` whose stack access is not of the craft's kind still gets a
//! [`NONE`] record, so the shadow call stack hears of it.

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
/// The bytes before the access follow the record (value crafts).
pub const BEFORE: u64 = 1 << 26;
/// The bytes a store left follow them.
pub const AFTER: u64 = 1 << 27;
const ELEM_SHIFT: u32 = 32;

/// Widest value a record carries (AVX-512): wider accesses are compared on
/// their first 64 bytes, as the single-stepping mode compares them.
pub const VALUE_BYTES: usize = 64;

/// What a recording thread records: what its craft judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Every access, addresses only (the dead craft).
    Addresses,
    /// Stores, with the bytes before and after each (silent stores).
    StoreValues,
    /// Loads, with the bytes each read (redundant loads).
    LoadValues,
}

impl Kind {
    pub fn of(craft: crate::profile::Craft) -> Kind {
        match craft {
            crate::profile::Craft::Dead => Kind::Addresses,
            crate::profile::Craft::SilentStore => Kind::StoreValues,
            crate::profile::Craft::SilentLoad => Kind::LoadValues,
        }
    }

    /// Is the access recorded?
    pub fn records(self, a: &Access) -> bool {
        match self {
            Kind::Addresses => a.read || a.write,
            Kind::StoreValues => a.write,
            Kind::LoadValues => a.read,
        }
    }

    /// The value flags of a recorded access's record.
    pub fn value_flags(self) -> u64 {
        match self {
            Kind::Addresses => 0,
            Kind::StoreValues => BEFORE | AFTER,
            Kind::LoadValues => BEFORE,
        }
    }

    /// Words of the record of a recorded access of `len` bytes (not a
    /// `rep` string's).
    pub fn words(self, len: u32) -> usize {
        let v = value_words(len as usize);
        match self {
            Kind::Addresses => RECORD_WORDS,
            Kind::StoreValues => RECORD_WORDS + 2 * v,
            Kind::LoadValues => RECORD_WORDS + v,
        }
    }
}

/// Words of a record without values.
pub const RECORD_WORDS: usize = RECORD_BYTES / 8;

/// The value bytes an access of `len` bytes carries.
pub fn value_len(len: usize) -> usize {
    len.min(VALUE_BYTES)
}

/// Words of one value of an access of `len` bytes.
pub fn value_words(len: usize) -> usize {
    value_len(len).div_ceil(8)
}

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

    /// The bytes of its values: (before, after), each 0 when absent (a
    /// `rep` string's before is its whole range).
    pub fn value_lens(&self) -> (usize, usize) {
        let len = (self.info & LEN_MASK) as usize;
        let before = if !self.is(BEFORE) {
            0
        } else if self.is(REP) {
            (self.extra as usize).saturating_mul(len)
        } else {
            value_len(len)
        };
        let after = if self.is(AFTER) { value_len(len) } else { 0 };
        (before, after)
    }

    /// The records in `bytes` (whole records only), in order.
    pub fn parse(bytes: &[u8]) -> impl Iterator<Item = Record> + '_ {
        bytes.chunks_exact(RECORD_BYTES).map(|c| {
            let w = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            Record { addr: w(0), pc: w(1), info: w(2), extra: w(3) }
        })
    }
}

/// One record of a value craft's stream, with its values.
#[derive(Clone, Copy, Debug)]
pub struct Valued<'a> {
    pub record: Record,
    pub before: &'a [u8],
    pub after: &'a [u8],
}

/// The records of a value craft's stream in `bytes`, in order, each with
/// the values that follow it; None for a record cut short (the rest of a
/// malformed datagram).
pub fn parse_valued(bytes: &[u8]) -> impl Iterator<Item = Option<Valued<'_>>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let Some(r) = bytes.get(at..at + RECORD_BYTES).and_then(|c| Record::parse(c).next()) else {
            at = bytes.len();
            return Some(None);
        };
        let (b, a) = r.value_lens();
        let (bw, aw) = (b.div_ceil(8) * 8, a.div_ceil(8) * 8);
        let start = at + RECORD_BYTES;
        let Some(end) = start.checked_add(bw + aw).filter(|&e| e <= bytes.len()) else {
            at = bytes.len();
            return Some(None);
        };
        at = end;
        Some(Some(Valued { record: r, before: &bytes[start..start + b], after: &bytes[start + bw..start + bw + a] }))
    })
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

/// Most records one instruction makes: its accesses, and a [`NONE`]
/// record for a call or return whose stack access is not recorded.
pub const MAX_RECORDS: usize = MAX_ACCESSES + 1;

/// The records `kind` makes of an instruction decoded with the registers
/// before it ran (see [`of_instruction`]), their value flags set; the
/// values themselves are the caller's to add. The value crafts record the
/// accesses of their kind; of a `rep` string they also record what the
/// judge needs to replay its elements in order: a `rep movs`'s source
/// range with its bytes for silent stores (what each element stores),
/// and its destination range without bytes for redundant loads (an
/// overlapping copy reads what it wrote). A `rep stos`'s record carries
/// the element it stores (after). Nothing for an instruction without a
/// recorded access or a transfer.
pub fn of_instruction_for(kind: Kind, d: &Decoded, t: Transfer) -> ([Record; MAX_RECORDS], usize) {
    let mut out = [Record::default(); MAX_RECORDS];
    if kind == Kind::Addresses {
        let (recs, n) = of_instruction(d, t);
        out[..n].copy_from_slice(&recs[..n]);
        return (out, n);
    }
    let all = &d.accesses[..d.n.min(MAX_ACCESSES)];
    let mut n = 0;
    let (mut called, mut returned) = (false, false);
    if let Transfer::Rep(count) = t {
        let reads = all.iter().any(|a| a.read);
        if !all.iter().any(|a| kind.records(a)) {
            return (out, 0);
        }
        for a in all {
            let flags = match (kind, a.read, a.write) {
                (Kind::StoreValues, _, true) if !reads => BEFORE | AFTER,
                (Kind::StoreValues, _, _) => BEFORE,
                (_, true, _) => BEFORE,
                _ => 0,
            };
            let info = info(a) | flags | REP | if d.df { DOWN } else { 0 };
            out[n] = Record { addr: a.addr, pc: d.ip, info, extra: count };
            n += 1;
        }
    } else {
        for a in all.iter().filter(|a| kind.records(a)) {
            let mut info = info(a) | kind.value_flags();
            let mut extra = 0;
            match t {
                Transfer::Call(next) if a.write => {
                    info |= CALL;
                    extra = next;
                    called = true;
                }
                Transfer::Ret(target) if a.read => {
                    info |= RET;
                    extra = target;
                    returned = true;
                }
                _ => {}
            }
            out[n] = Record { addr: a.addr, pc: d.ip, info, extra };
            n += 1;
        }
        match t {
            Transfer::Call(next) if !called => {
                out[n] = Record { addr: 0, pc: d.ip, info: NONE | CALL, extra: next };
                n += 1;
            }
            Transfer::Ret(target) if !returned => {
                out[n] = Record { addr: 0, pc: d.ip, info: NONE | RET, extra: target };
                n += 1;
            }
            _ => {}
        }
    }
    for r in &mut out[..n.saturating_sub(1)] {
        r.info |= MORE;
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

    #[test]
    fn a_value_craft_records_its_kind_with_the_bytes_it_compares() {
        use crate::x86::decode::{Analyzer, Regs};
        let mut an = Analyzer::new();
        let mut regs = Regs { rip: 0x1000, ..Default::default() };
        regs.gpr[4] = 0x7000; // rsp
        regs.gpr[6] = 0x2000; // rsi
        regs.gpr[7] = 0x3000; // rdi
                              // call rel32: a store of the return address (silent stores: with
                              // both values); for redundant loads only the shadow stack's record.
        let call = an.decode(&[0xE8, 0, 0, 0, 0], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction_for(Kind::StoreValues, &call, Transfer::Call(0x1005));
        assert_eq!(n, 1);
        assert!(r[0].is(WRITE) && r[0].is(CALL) && r[0].is(BEFORE) && r[0].is(AFTER) && r[0].extra == 0x1005);
        assert_eq!(r[0].value_lens(), (8, 8));
        let (r, n) = of_instruction_for(Kind::LoadValues, &call, Transfer::Call(0x1005));
        assert_eq!((n, r[0].is(NONE), r[0].is(CALL), r[0].extra, r[0].value_lens()), (1, true, true, 0x1005, (0, 0)));
        // rep movsq of 5: both ranges for silent stores (the source's bytes
        // are what it stores); for redundant loads the source with its
        // bytes and the destination without (the replay's image).
        let movs = an.decode(&[0xF3, 0x48, 0xA5], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction_for(Kind::StoreValues, &movs, Transfer::Rep(5));
        assert_eq!(n, 2);
        assert!(r[..2].iter().all(|r| r.is(REP) && r.is(BEFORE) && !r.is(AFTER) && r.value_lens() == (40, 0)));
        assert!(r[0].is(MORE) && !r[1].is(MORE));
        let (r, n) = of_instruction_for(Kind::LoadValues, &movs, Transfer::Rep(5));
        assert_eq!(n, 2);
        let (read, write) = if r[0].is(READ) { (r[0], r[1]) } else { (r[1], r[0]) };
        assert_eq!((read.value_lens(), write.value_lens()), ((40, 0), (0, 0)));
        // rep stosq: its element stored (after); nothing for redundant loads.
        let stos = an.decode(&[0xF3, 0x48, 0xAB], 0x1000, &regs, false).unwrap();
        let (r, n) = of_instruction_for(Kind::StoreValues, &stos, Transfer::Rep(3));
        assert_eq!((n, r[0].value_lens()), (1, (24, 8)));
        assert_eq!(of_instruction_for(Kind::LoadValues, &stos, Transfer::Rep(3)).1, 0);
    }

    #[test]
    fn value_records_parse_with_their_bytes() {
        let a = Access { addr: 0x10, len: 3, read: false, write: true, ..Default::default() };
        let r = Record { addr: 0x10, pc: 1, info: info(&a) | BEFORE | AFTER, extra: 0 };
        let mut b: Vec<u8> = r.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        b.extend([1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
        let v: Vec<_> = parse_valued(&b).collect();
        assert_eq!(v.len(), 1);
        let v = v[0].unwrap();
        assert_eq!((v.record, v.before, v.after), (r, &[1u8, 2, 3][..], &[4u8, 5, 6][..]));
        assert!(parse_valued(&b[..b.len() - 1]).next().unwrap().is_none(), "cut short");
    }
}
