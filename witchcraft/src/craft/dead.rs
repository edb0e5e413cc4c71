//! DeadCraft (Witch §4.4): dead stores.
//!
//! Sample stores and arm a read-or-write watchpoint on the stored bytes. If
//! the next access is a store, the sampled store was dead: its bytes were
//! overwritten unread ("killed by" the trapping context). If it is a load,
//! the store was used.

use super::{credited, Craft, Verdict, Watched};
use crate::profile::Craft as Kind;
use crate::sys::perf::BpType;
use crate::x86::decode::Access;

pub struct DeadCraft;

impl Craft for DeadCraft {
    fn kind(&self) -> Kind {
        Kind::Dead
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
