//! The Witch engine: samples arm watchpoints, traps are judged by the
//! craft, and the result is attributed to ⟨C_watch, C_trap⟩.
//!
//! [`Engine`] is the process-wide, immutable part; [`ThreadState`] is one
//! thread's. A signal handler asks [`classify`] whether a signal is ours and
//! hands it to [`ThreadState::handle`], which runs the sample path
//! ([`sample`]) or the trap path ([`trap`]) with the time accounting
//! ([`clock`]) around it. Everything reachable from there runs in a signal
//! handler: no allocation, no locks, no stdio.
//!
//! The modules stand on one-way floors (no module uses one that uses it
//! back; `tests/tests/module_layers.rs` checks it), from the bottom:
//!
//! - the settings and the pieces with one job each: [`settings`] (how
//!   bursts and windows are sized), [`pick`], [`budget`], [`clock`],
//!   [`place`], [`pace`] (a window's time), [`resume`], [`recorder`], [`link`] (the cache's entry
//!   into the engine without a trap), [`cache`], [`calibrate`];
//! - [`sampler`], then [`process`] (the process-wide [`Engine`]);
//! - the thread's parts: [`watch`] (its debug registers), [`ledger`] (the
//!   bookkeeping core: claim, arm, snapshot, judge, attribute, free,
//!   context), [`stepping`] (the burst under way), [`window`] (the window
//!   under way);
//! - [`thread`]: [`ThreadState`], made of those parts, and its life;
//! - the paths, `ThreadState` methods that call down into the ledger and
//!   the parts, and each other only downwards (the test checks that too):
//!   [`crossing`] (into and out of the code cache), [`recording`],
//!   [`trap`], [`burst`], [`cache_exit`] (a copy's exits), [`sample`] (a
//!   tick);
//! - [`signal`]: which signal, and its handling, on top.
//!
//! This file only names the modules and what the other crates use.

pub mod budget;
pub mod burst;
pub mod cache;
mod cache_exit;
pub mod calibrate;
pub mod clock;
mod crossing;
pub mod ledger;
pub mod link;
mod pace;
mod pick;
pub mod place;
pub mod process;
pub mod recorder;
pub mod recording;
pub mod resume;
pub mod sample;
pub mod sampler;
pub mod schedule;
pub mod settings;
pub mod signal;
mod stepping;
pub mod thread;
pub mod trap;
pub mod watch;
pub mod window;

pub use place::Place;
pub use process::{Costs, Engine};
pub use sampler::{SampleSource, ThreadSampler};
pub use settings::{BurstSettings, WindowSettings};
pub use signal::{classify, clear_trap_flag, Event};
pub use thread::ThreadState;
pub use watch::MAX_SLOTS;
