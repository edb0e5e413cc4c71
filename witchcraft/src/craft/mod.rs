//! Witchcraft: the clients of the engine (Witch §4.6).
//!
//! A craft says which accesses to sample, which watchpoint to arm, and how
//! to judge the next access to the watched bytes. The engine does the rest:
//! sampling, replacement, precise PCs, contexts and proportional attribution.

pub mod dead;
pub mod load;
pub mod silent;

use crate::profile::Craft as Kind;
use crate::sys::perf::BpType;
use crate::x86::decode::{Access, Float};

/// Bytes remembered from the sampled access (enough for a 256-bit vector).
pub const SNAPSHOT: usize = 32;

/// What the craft remembers about a watched sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watched {
    /// The sampled access (address, length, float kind).
    pub access: Access,
    /// Bytes at `access.addr` after the sampled access (value crafts only).
    pub value: [u8; SNAPSHOT],
    pub value_len: usize,
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

pub trait Craft: Sync {
    fn kind(&self) -> Kind;
    /// Does this access of an instruction make a sample for the craft?
    fn samples(&self, a: &Access) -> bool;
    fn watch(&self) -> BpType;
    /// Whether the craft compares values (and so needs a snapshot).
    fn needs_value(&self) -> bool;
    /// Judge the access that trapped. `now` holds the current bytes at
    /// `w.access.addr` (value crafts only).
    fn judge(&self, w: &Watched, trap: &Access, now: &[u8]) -> Verdict;
}

pub fn for_kind(kind: Kind, fp_precision: f64) -> &'static dyn Craft {
    match kind {
        Kind::Dead => &dead::DeadCraft,
        Kind::SilentStore => Box::leak(Box::new(silent::SilentCraft { precision: fp_precision })),
        Kind::SilentLoad => Box::leak(Box::new(load::LoadCraft { precision: fp_precision })),
    }
}

/// Bytes of the watched access that the trapping access also touches.
pub fn overlap(w: &Access, t: &Access) -> u64 {
    w.overlap(t.addr, t.len as u64)
}

/// Compare the overlapping bytes of the remembered and current values.
/// Exact equality is waste; floats within relative `precision` are
/// approximate waste (RedSpy/LoadSpy's rule: |new − old| ≤ p·|old|).
pub fn compare(w: &Watched, trap: &Access, now: &[u8], precision: f64) -> Verdict {
    let base = w.access.addr;
    let lo = base.max(trap.addr);
    let hi = (base + w.value_len as u64).min(trap.addr + trap.len as u64);
    let bytes = overlap(&w.access, trap);
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
        // Compare whole elements inside the overlap, aligned to the sampled access.
        let first = s.div_ceil(el) * el;
        let mut any = false;
        let mut i = first;
        while i + el <= e {
            let (a, b) = if el == 4 {
                let f = |x: &[u8]| f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64;
                (f(&w.value[i..]), f(&now[i..]))
            } else {
                let f = |x: &[u8]| f64::from_le_bytes(x[..8].try_into().unwrap());
                (f(&w.value[i..]), f(&now[i..]))
            };
            if !((a - b).abs() <= precision * a.abs() || a == b) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(addr: u64, v: &[u8], float: Float) -> Watched {
        let mut w = Watched { access: Access { addr, len: v.len() as u32, read: false, write: true, float }, ..Default::default() };
        w.value[..v.len()].copy_from_slice(v);
        w.value_len = v.len();
        w
    }

    #[test]
    fn exact_and_partial_overlap() {
        let w = watched(100, &[1, 2, 3, 4, 5, 6, 7, 8], Float::No);
        let t = Access { addr: 104, len: 4, read: false, write: true, float: Float::No };
        let now = [9, 9, 9, 9, 5, 6, 7, 8];
        assert_eq!(compare(&w, &t, &now, 0.0), Verdict::Waste { bytes: 4, approx: false });
        let now = [1, 2, 3, 4, 5, 6, 7, 0];
        assert_eq!(compare(&w, &t, &now, 0.0), Verdict::Use { bytes: 4 });
    }

    #[test]
    fn floats_within_precision_are_approximate() {
        let w = watched(0, &100.0f64.to_le_bytes(), Float::F64);
        let t = Access { addr: 0, len: 8, read: false, write: true, float: Float::F64 };
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
