//! x86-64 instructions: what memory an instruction accesses ([`decode`]),
//! and which instruction a watchpoint trap belongs to ([`precise_pc`], or
//! [`lbr`] from a sample's branch stack).

pub mod decode;
pub mod lbr;
pub mod precise_pc;
pub mod record;
pub mod translate;
