//! DeadCraft (Witch §4.4): dead stores.
//!
//! Sample stores and arm a read-or-write watchpoint on the stored bytes. If
//! the next access is a store, the sampled store was dead: its bytes were
//! overwritten unread ("killed by" the trapping context). If it is a load,
//! the store was used.
//!
//! The watchpoint covers one byte of the store, drawn uniformly, and its
//! verdict stands for all of the store's bytes. That is DeadSpy's byte-level
//! definition, sampled: each byte of a store is dead or used by its own
//! next access. Watching all of an aligned piece of up to 8 bytes, as the
//! paper does, lets the first access to *any* of them decide for the rest:
//! a 64-byte vector store of 16 indexes of which the next such store
//! overwrites the last 12 and a load reads the first 4 is 75% dead by its
//! bytes, but whichever of the two came first to a watched 8-byte piece
//! decided it all (and its untouched bytes were never judged).

use super::{credited, CraftRules, Verdict, Watched};
use crate::profile::Craft;
use crate::sys::perf::BpType;
use crate::x86::decode::Access;

pub struct DeadCraft;

impl CraftRules for DeadCraft {
    fn kind(&self) -> Craft {
        Craft::Dead
    }
    fn samples(&self, a: &Access) -> bool {
        a.write
    }
    fn watch(&self) -> BpType {
        BpType::RW
    }
    fn needs_value(&self) -> bool {
        false
    }
    fn piece(&self, a: &Access, pick: u64) -> (u64, u64) {
        (a.addr + pick % u64::from(a.len.max(1)), 1)
    }
    fn judge(&self, w: &Watched, trap: &Access, _now: &[u8]) -> Verdict {
        let bytes = credited(w, trap);
        if trap.read {
            // A load (or the load half of a read-modify-write) came first.
            Verdict::Use { bytes }
        } else {
            Verdict::Waste { bytes, approx: false }
        }
    }
}
