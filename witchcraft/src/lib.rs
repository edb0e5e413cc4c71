//! witchcraft: the Witch engine (Wen, Liu, Chabbi et al., "Watching for
//! Software Inefficiencies with Witch", ASPLOS'18; thesis chapter 4).
//!
//! Sample memory accesses, arm a hardware debug-register watchpoint on the
//! sampled address, and classify the next access to it. The crafts (clients)
//! live in [`craft`]; the machinery below them is in the other modules.

pub mod access;
pub mod config;
pub mod context;
pub mod cputimer;
pub mod craft;
pub mod engine;
pub mod exact;
pub mod modules;
pub mod perf;
pub mod pmu;
pub mod probe;
pub mod profile;
pub mod replacement;
pub mod trap;
pub mod unwind;
pub mod watchpoint;
