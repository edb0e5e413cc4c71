//! LoadCraft (Witch §4.6.2): loads that re-read an unchanged value.
//!
//! Sample loads, remember the value, and arm a read-or-write watchpoint (x86
//! has no load-only one). Stores that trap are ignored and the watchpoint
//! stays armed: an intervening store that writes the value back does not
//! break the redundancy. On the next load, compare like SilentCraft.

use super::{compare, CraftRules, Verdict, Watched};
use crate::profile::Craft;
use crate::sys::perf::BpType;
use crate::x86::decode::Access;

pub struct LoadCraft {
    pub precision: f64,
}

impl CraftRules for LoadCraft {
    fn kind(&self) -> Craft {
        Craft::SilentLoad
    }
    fn samples(&self, a: &Access) -> bool {
        a.read
    }
    fn watch(&self) -> BpType {
        BpType::RW
    }
    fn needs_value(&self) -> bool {
        true
    }
    fn judge(&self, w: &Watched, trap: &Access, now: &[u8]) -> Verdict {
        if !trap.read {
            return Verdict::Ignore;
        }
        compare(w, trap, now, self.precision)
    }
}
