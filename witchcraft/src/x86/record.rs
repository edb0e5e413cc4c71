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
//! Most records need no `extra` word and have an info word of few bits:
//! the code cache writes those as a *short* record of two words, the pc
//! and the info word packed into one ([`short_word`]):
//!
//! ```text
//!   0  address
//!   1  pc (bits 0-46) | info, packed (bits 48-62) | SHORT (bit 63)
//! ```
//!
//! A long record's second word is a canonical pc, whose bits 47-63 are
//! all equal, so bit 63 set with bit 47 clear says "short" unambiguously.
//! Half the bytes per access for both sides of the exact mode: the
//! program writes them, witch's judge reads them from another core.
//!
//! What is recorded depends on the craft ([`RecordKind`]): the dead craft needs
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

/// Bytes of one (long) record.
pub const RECORD_BYTES: usize = 32;

/// Bytes of a short record.
pub const SHORT_BYTES: usize = 16;

/// The short record's mark in its second word.
pub const SHORT: u64 = 1 << 63;
const PC_BITS: u32 = 47;
const PACK_SHIFT: u32 = 48;

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
pub enum RecordKind {
    /// Every access, addresses only (the dead craft).
    Addresses,
    /// Stores, with the bytes before and after each (silent stores).
    StoreValues,
    /// Loads, with the bytes each read (redundant loads).
    LoadValues,
}

impl RecordKind {
    pub fn of(craft: crate::profile::Craft) -> RecordKind {
        match craft {
            crate::profile::Craft::Dead => RecordKind::Addresses,
            crate::profile::Craft::SilentStore => RecordKind::StoreValues,
            crate::profile::Craft::SilentLoad => RecordKind::LoadValues,
        }
    }

    /// Is the access recorded?
    pub fn records(self, a: &Access) -> bool {
        match self {
            RecordKind::Addresses => a.read || a.write,
            RecordKind::StoreValues => a.write,
            RecordKind::LoadValues => a.read,
        }
    }

    /// The value flags of a recorded access's record.
    pub fn value_flags(self) -> u64 {
        match self {
            RecordKind::Addresses => 0,
            RecordKind::StoreValues => BEFORE | AFTER,
            RecordKind::LoadValues => BEFORE,
        }
    }

    /// Words of the record of a recorded access of `len` bytes (not a
    /// `rep` string's).
    pub fn words(self, len: u32) -> usize {
        let v = value_words(len as usize);
        match self {
            RecordKind::Addresses => RECORD_WORDS,
            RecordKind::StoreValues => RECORD_WORDS + 2 * v,
            RecordKind::LoadValues => RECORD_WORDS + v,
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

/// The (float, element) pairs a short record can say, by their index.
const SHORT_TYPES: [(u64, u64); 11] = [(0, 0), (0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (0, 32), (1, 0), (1, 4), (2, 0), (2, 8)];
/// The same, as the bits of an info word (16 entries: an index of four
/// bits reads no further; the last five are never written).
const SHORT_TYPE_BITS: [u64; 16] = {
    let mut t = [0u64; 16];
    let mut i = 0;
    while i < SHORT_TYPES.len() {
        t[i] = SHORT_TYPES[i].0 << FLOAT_SHIFT | SHORT_TYPES[i].1 << ELEM_SHIFT;
        i += 1;
    }
    t
};
/// A short record's packed info (15 bits): length - 1 (bits 0-5), READ and
/// WRITE (6, 7), MORE (8), BEFORE and AFTER (9, 10), the type's index (11-14).
const PACKED_TYPE_SHIFT: u32 = 11;
/// The packed info's length - 1, and where its BEFORE and AFTER bits are.
const PACKED_LEN: u64 = 63;
const PACKED_VALUES_SHIFT: u32 = 9;

/// The second word of the short record of an access at `pc` with info
/// word `info`; None if it needs a long one (an `extra` word, a length
/// over 64 bytes, a pc outside the lower half of the address space).
pub fn short_word(pc: u64, info: u64) -> Option<u64> {
    let len = info & LEN_MASK;
    if pc >> PC_BITS != 0 || !(1..=64).contains(&len) {
        return None;
    }
    let kept = LEN_MASK | READ | WRITE | MORE | BEFORE | AFTER | 3 << FLOAT_SHIFT | 0xff << ELEM_SHIFT;
    if info & !kept != 0 {
        return None;
    }
    let ty = ((info >> FLOAT_SHIFT) & 3, info >> ELEM_SHIFT);
    let t = SHORT_TYPES.iter().position(|&x| x == ty)? as u64;
    let code = (len - 1) | (info >> 16 & 3) << 6 | (info >> 20 & 1) << 8 | (info >> 26 & 3) << PACKED_VALUES_SHIFT | t << PACKED_TYPE_SHIFT;
    Some(SHORT | code << PACK_SHIFT | pc)
}

const _: () = assert!(READ == 1 << 16 && WRITE == 1 << 17 && MORE == 1 << 20 && BEFORE == 1 << 26 && AFTER == 1 << 27);

/// Is `word`, a record's second word, a short record's?
#[inline]
pub fn is_short(word: u64) -> bool {
    word & SHORT != 0 && word & (1 << PC_BITS) == 0
}

/// The pc and info word of a short record's second word.
#[inline]
pub fn unpack_short(word: u64) -> (u64, u64) {
    let code = word >> PACK_SHIFT;
    let info = ((code & PACKED_LEN) + 1)
        | (code >> 6 & 3) << 16
        | (code >> 8 & 1) << 20
        | (code >> PACKED_VALUES_SHIFT & 3) << 26
        | SHORT_TYPE_BITS[(code >> PACKED_TYPE_SHIFT & 15) as usize];
    (word & ((1 << PC_BITS) - 1), info)
}

impl Record {
    /// The record at the start of `bytes`, and its bytes (16 or 32); None
    /// if `bytes` holds no whole record.
    #[inline]
    pub fn read(bytes: &[u8]) -> Option<(Record, usize)> {
        let w = |i: usize| bytes.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        let (addr, second) = (w(0)?, w(1)?);
        if is_short(second) {
            let (pc, info) = unpack_short(second);
            return Some((Record { addr, pc, info, extra: 0 }, SHORT_BYTES));
        }
        Some((Record { addr, pc: second, info: w(2)?, extra: w(3)? }, RECORD_BYTES))
    }

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

    /// The records in `bytes` (short and long; whole records only), in
    /// order.
    pub fn parse(bytes: &[u8]) -> impl Iterator<Item = Record> + '_ {
        // SAFETY: any eight bytes are a u64; align_to only reinterprets.
        let (head, words, _) = unsafe { bytes.align_to::<u64>() };
        // Aligned (a ring's chunk, always): word by word; else byte by byte.
        let (words, bytes) = if head.is_empty() { (words, &[][..]) } else { (&[][..], bytes) };
        let mut at = 0;
        std::iter::from_fn(move || {
            if words.is_empty() {
                let (r, n) = Record::read(bytes.get(at..)?)?;
                at += n;
                return Some(r);
            }
            let (addr, second) = (u64::from_le(*words.get(at)?), u64::from_le(*words.get(at + 1)?));
            if is_short(second) {
                let (pc, info) = unpack_short(second);
                at += 2;
                return Some(Record { addr, pc, info, extra: 0 });
            }
            let w = words.get(at + 2..at + 4)?;
            at += 4;
            Some(Record { addr, pc: second, info: u64::from_le(w[0]), extra: u64::from_le(w[1]) })
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
        if let Some((v, next)) = short_valued(bytes, at) {
            at = next;
            return Some(Some(v));
        }
        let Some((v, next)) = long_valued(bytes, at) else {
            at = bytes.len();
            return Some(None);
        };
        at = next;
        Some(Some(v))
    })
}

/// The record at `at` in `bytes` (of either form) with its values, and
/// where the next record starts; None if it is cut short, or says its
/// values are longer than any stream (a `rep` string's count of
/// nonsense: the arithmetic is checked, so that is not a panic).
fn long_valued(bytes: &[u8], at: usize) -> Option<(Valued<'_>, usize)> {
    let (r, header) = Record::read(bytes.get(at..)?)?;
    let (b, a) = r.value_lens();
    let (bw, aw) = (b.checked_next_multiple_of(8)?, a.checked_next_multiple_of(8)?);
    let start = at + header;
    let end = start.checked_add(bw)?.checked_add(aw)?;
    if end > bytes.len() {
        return None;
    }
    Some((Valued { record: r, before: &bytes[start..start + b], after: &bytes[start + bw..start + bw + a] }, end))
}

/// The short record at `at` in `bytes` with its values, and where the
/// next record starts; None for a long record or one cut short (for the
/// general path). Where the next record starts is worked out from the
/// packed word alone, in few steps: the next record's loads wait for it.
#[inline(always)]
fn short_valued(bytes: &[u8], at: usize) -> Option<(Valued<'_>, usize)> {
    let b = bytes.get(at..at + SHORT_BYTES)?;
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let (addr, second) = (word(0), word(8));
    if !is_short(second) {
        return None;
    }
    // The length (1 to 64: a short record's values are whole) padded to
    // words, and the packed BEFORE and AFTER bits.
    let code = second >> PACK_SHIFT;
    let len = (code & PACKED_LEN) as usize + 1;
    let padded = (len + 7) & !7;
    let start = at + SHORT_BYTES;
    let before_end = start + if code >> PACKED_VALUES_SHIFT & 1 != 0 { padded } else { 0 };
    let end = before_end + if code >> (PACKED_VALUES_SHIFT + 1) & 1 != 0 { padded } else { 0 };
    if end > bytes.len() {
        return None;
    }
    let (pc, info) = unpack_short(second);
    let before = if info & BEFORE != 0 { &bytes[start..start + len] } else { &bytes[start..start] };
    let after = if info & AFTER != 0 { &bytes[before_end..before_end + len] } else { &bytes[start..start] };
    Some((Valued { record: Record { addr, pc, info, extra: 0 }, before, after }, end))
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
pub fn of_instruction_for(kind: RecordKind, d: &Decoded, t: Transfer) -> ([Record; MAX_RECORDS], usize) {
    let mut out = [Record::default(); MAX_RECORDS];
    if kind == RecordKind::Addresses {
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
                (RecordKind::StoreValues, _, true) if !reads => BEFORE | AFTER,
                (RecordKind::StoreValues, _, _) => BEFORE,
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
mod tests;
