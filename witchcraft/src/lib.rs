//! witchcraft: the Witch engine (Wen, Liu, Chabbi et al., "Watching for
//! Software Inefficiencies with Witch", ASPLOS'18; thesis chapter 4).
//!
//! Sample memory accesses, arm a hardware debug-register watchpoint on the
//! sampled address, and classify the next access to it. The crafts (clients)
//! live in [`craft`]; the machinery below them is in the other modules.

pub mod profile;
pub mod pmu;
pub mod probe;
pub mod perf;
pub mod cputimer;
pub mod replacement;
pub mod access;
pub mod context;
pub mod modules;
pub mod unwind;
pub mod trap;
pub mod craft;
pub mod config;
pub mod engine;
pub mod watchpoint;
pub mod exact;
