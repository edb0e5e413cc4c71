//! Witchcraft: the clients of the engine (Witch §4.6).
//!
//! A craft says which accesses to sample, which watchpoint to arm, and how
//! to judge the next access to the watched bytes. The engine does the rest:
//! sampling, replacement, precise PCs, contexts and proportional attribution.

pub mod dead;
pub mod load;
pub mod silent;

use crate::profile::Craft;
use crate::sys::perf::BpType;
use crate::x86::decode::{Access, Float};

/// Bytes remembered from the sampled access: all of the widest one (a
/// 512-bit vector), so the monitored element can be any of its elements.
pub const SNAPSHOT: usize = 64;

/// What the craft remembers about a watched sample.
#[derive(Clone, Copy, Debug)]
pub struct Watched {
    /// The sampled access (address, length, float kind).
    pub access: Access,
    /// The monitored element: the naturally aligned piece of at most 8
    /// bytes of the access that the debug register watches (see
    /// [`crate::sys::watchpoint::watch_range`]). Values are compared there
    /// only: it is the part no access could reach unseen before the trap.
    pub piece: (u64, u64),
    /// Bytes at `access.addr` after the sampled access (value crafts only).
    pub value: [u8; SNAPSHOT],
    pub value_len: usize,
}

impl Default for Watched {
    fn default() -> Self {
        Watched { access: Access::default(), piece: (0, 0), value: [0; SNAPSHOT], value_len: 0 }
    }
}

impl Watched {
    /// A watched access whose monitored element is its first watchable piece.
    pub fn new(access: Access) -> Watched {
        Self::with_piece(access, crate::sys::watchpoint::watch_range(access.addr, access.len))
    }

    /// A watched access monitored through `piece` (a debug register's reach).
    pub fn with_piece(access: Access, piece: (u64, u64)) -> Watched {
        Watched { access, piece, ..Default::default() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// The watched sample was wasted, by `bytes`; `approx` for FP within precision.
    Waste { bytes: u64, approx: bool },
    /// The watched sample was used.
    Use { bytes: u64 },
    /// Not an event this craft judges; keep watching.
    Ignore,
}

/// What one craft decides (its [`Craft`] is which one): which accesses to
/// sample, which watchpoint to arm, and how to judge the access that traps.
pub trait CraftRules: Sync {
    fn kind(&self) -> Craft;
    /// Does this access of an instruction make a sample for the craft?
    fn samples(&self, a: &Access) -> bool;
    fn watch(&self) -> BpType;
    /// Whether the craft compares values (and so needs a snapshot).
    fn needs_value(&self) -> bool;
    /// Judge the access that trapped. `now` holds the current bytes at
    /// `w.access.addr` (value crafts only).
    fn judge(&self, w: &Watched, trap: &Access, now: &[u8]) -> Verdict;
    /// The piece of a sampled access a debug register watches, for a
    /// uniformly random `pick`: by default a value element (an aligned
    /// piece of up to 8 bytes, drawn by its bytes: see
    /// [`crate::sys::watchpoint::watch_piece`]), since the value crafts
    /// compare whole elements.
    fn piece(&self, a: &Access, pick: u64) -> (u64, u64) {
        crate::sys::watchpoint::watch_piece(a.addr, a.len, pick)
    }
}

pub fn for_kind(kind: Craft, fp_precision: f64) -> &'static dyn CraftRules {
    match kind {
        Craft::Dead => &dead::DeadCraft,
        Craft::SilentStore => Box::leak(Box::new(silent::SilentCraft { precision: fp_precision })),
        Craft::SilentLoad => Box::leak(Box::new(load::LoadCraft { precision: fp_precision })),
    }
}

/// Bytes of the watched access that the trapping access also touches.
pub fn overlap(w: &Access, t: &Access) -> u64 {
    w.overlap(t.addr, t.len as u64)
}

/// The bytes a trap's verdict is credited with: the sampled access's bytes,
/// in the proportion of its monitored element that the trapping access
/// touched. The monitored element stands for all of the access's elements
/// (Witch §4.6.4), and being chosen at random among them (see
/// [`crate::sys::watchpoint::watch_piece`]) it does so without favouring
/// any; for an access of one element this is the plain overlap.
pub fn credited(w: &Watched, t: &Access) -> u64 {
    let (plo, plen) = w.piece;
    if plen == 0 {
        return overlap(&w.access, t);
    }
    let touched = Access { addr: plo, len: plen as u32, ..w.access }.overlap(t.addr, t.len as u64);
    (w.access.len as u64 * touched).div_ceil(plen)
}

/// Compare the remembered and current values of the monitored element,
/// where the trapping access overlaps it. Unchanged bytes (floats: within
/// relative `precision`, RedSpy/LoadSpy's rule |new − old| ≤ p·|old|) make
/// the whole access waste, changed ones make it use, and the bytes credited
/// are [`credited`]: the paper's rule for wide accesses (Witch §4.6.4: the
/// monitored element of a SIMD instruction stands for all of its elements).
///
/// Only the monitored element is compared. Bytes of the access outside it
/// may have been stored to between the two accesses without a trap (a debug
/// register watches at most 8 bytes), so comparing them with the snapshot
/// would not say whether the trapping store changed them: a `memset` over a
/// block that something else wrote into would look silent.
pub fn compare(w: &Watched, trap: &Access, now: &[u8], precision: f64) -> Verdict {
    let base = w.access.addr;
    let (plo, phi) = (w.piece.0, w.piece.0 + w.piece.1);
    let lo = base.max(trap.addr).max(plo);
    let hi = (base + w.value_len as u64).min(trap.addr + trap.len as u64).min(phi);
    let bytes = credited(w, trap);
    if hi <= lo || now.len() < w.value_len {
        // Nothing comparable (trap outside the remembered bytes): count it used.
        return Verdict::Use { bytes };
    }
    let (s, e) = ((lo - base) as usize, (hi - base) as usize);
    if w.value[s..e] == now[s..e] {
        return Verdict::Waste { bytes, approx: false };
    }
    if precision > 0.0 && w.access.float != Float::No && w.access.float == trap.float {
        let el = if w.access.float == Float::F32 { 4 } else { 8 };
        // Compare whole elements inside the compared range, aligned to the
        // sampled access (the piece is element-aligned when the access is).
        let first = s.div_ceil(el) * el;
        let mut any = false;
        let mut i = first;
        while i + el <= e {
            if !float_within(&w.value[i..], &now[i..], el, precision) {
                return Verdict::Use { bytes };
            }
            any = true;
            i += el;
        }
        if any {
            return Verdict::Waste { bytes, approx: true };
        }
    }
    Verdict::Use { bytes }
}

/// Is the float of `el` bytes (4 or 8) at the start of `now` within
/// relative `precision` of the one at the start of `then` (RedSpy/LoadSpy's
/// |new − old| ≤ p·|old|, or equal)?
#[inline(always)]
pub fn float_within(then: &[u8], now: &[u8], el: usize, precision: f64) -> bool {
    let (a, b) = if el == 4 {
        let f = |x: &[u8]| f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64;
        (f(then), f(now))
    } else {
        let f = |x: &[u8]| f64::from_le_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]);
        (f(then), f(now))
    };
    (a - b).abs() <= precision * a.abs() || a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(addr: u64, v: &[u8], float: Float) -> Watched {
        let mut w = Watched::new(Access { addr, len: v.len() as u32, read: false, write: true, float, elem: 0 });
        w.value[..v.len()].copy_from_slice(v);
        w.value_len = v.len();
        w
    }

    #[test]
    fn exact_and_partial_overlap() {
        let w = watched(96, &[1, 2, 3, 4, 5, 6, 7, 8], Float::No);
        let t = Access { addr: 100, len: 4, read: false, write: true, float: Float::No, elem: 0 };
        let now = [9, 9, 9, 9, 5, 6, 7, 8];
        assert_eq!(compare(&w, &t, &now, 0.0), Verdict::Waste { bytes: 4, approx: false });
        let now = [1, 2, 3, 4, 5, 6, 7, 0];
        assert_eq!(compare(&w, &t, &now, 0.0), Verdict::Use { bytes: 4 });
    }

    #[test]
    fn only_the_monitored_element_is_compared() {
        // A 32-byte store watched through its first 8 bytes; a byte outside
        // them changed meanwhile (unseen) and the next store rewrote all 32.
        let mut v = [0u8; 32];
        let w = watched(0x1000, &v, Float::No);
        assert_eq!(w.piece, (0x1000, 8));
        let t = Access { addr: 0x1000, len: 32, read: false, write: true, float: Float::No, elem: 0 };
        v[16] = 7;
        assert_eq!(compare(&w, &t, &v, 0.0), Verdict::Waste { bytes: 32, approx: false });
        v[3] = 1;
        assert_eq!(compare(&w, &t, &v, 0.0), Verdict::Use { bytes: 32 });
        // A trap that touches half the element stands for half the access.
        let t = Access { addr: 0x1004, len: 4, read: false, write: true, float: Float::No, elem: 0 };
        assert_eq!(compare(&w, &t, &v, 0.0), Verdict::Waste { bytes: 16, approx: false });
    }

    #[test]
    fn floats_within_precision_are_approximate() {
        let w = watched(0, &100.0f64.to_le_bytes(), Float::F64);
        let t = Access { addr: 0, len: 8, read: false, write: true, float: Float::F64, elem: 0 };
        let near = 100.5f64.to_le_bytes();
        assert_eq!(compare(&w, &t, &near, 0.01), Verdict::Waste { bytes: 8, approx: true });
        assert_eq!(compare(&w, &t, &near, 0.0), Verdict::Use { bytes: 8 });
        let far = 102.0f64.to_le_bytes();
        assert_eq!(compare(&w, &t, &far, 0.01), Verdict::Use { bytes: 8 });
        // An integer store over float bytes compares exactly only.
        let ti = Access { float: Float::No, ..t };
        assert_eq!(compare(&w, &ti, &near, 0.01), Verdict::Use { bytes: 8 });
    }
}
