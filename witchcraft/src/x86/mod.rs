//! x86-64 instructions: what memory an instruction accesses ([`decode`]),
//! and which instruction a watchpoint trap belongs to ([`precise_pc`]).

pub mod decode;
pub mod precise_pc;
