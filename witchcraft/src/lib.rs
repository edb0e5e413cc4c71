//! witchcraft: the Witch engine (Wen, Liu, Chabbi et al., "Watching for
//! Software Inefficiencies with Witch", ASPLOS'18).
//!
//! Sample memory accesses, arm a hardware debug-register watchpoint on the
//! sampled address, and classify the next access to it. The crafts (clients)
//! live in [`craft`]; the engine that drives them in [`engine`]; below them,
//! [`x86`] decodes instructions and [`sys`] is the one home of every kernel
//! interface (perf events, signals, timers, /proc).

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod context;
pub mod craft;
pub mod engine;
pub mod exact;
pub mod heap;
pub mod loadable;
pub mod modules;
pub mod objects;
pub mod pair;
#[cfg(feature = "controller")]
pub mod probe;
pub mod profile;
pub mod replacement;
pub mod session;
pub mod sys;
pub mod unwind;
pub mod x86;
