//! SilentCraft (Witch §4.6.1): silent stores.
//!
//! Sample stores, remember the bytes the store left, and arm a write-only
//! watchpoint, so intervening loads are disregarded. On the next store,
//! compare the overlapping bytes: unchanged (or, for floating point, within
//! the relative precision) means the store was silent.

use super::{compare, CraftRules, Verdict, Watched};
use crate::profile::Craft;
use crate::sys::perf::BpType;
use crate::x86::decode::Access;

pub struct SilentCraft {
    pub precision: f64,
}

impl CraftRules for SilentCraft {
    fn kind(&self) -> Craft {
        Craft::SilentStore
    }
    fn samples(&self, a: &Access) -> bool {
        a.write
    }
    fn watch(&self) -> BpType {
        BpType::W
    }
    fn needs_value(&self) -> bool {
        true
    }
    fn judge(&self, w: &Watched, trap: &Access, now: &[u8]) -> Verdict {
        compare(w, trap, now, self.precision)
    }
}
