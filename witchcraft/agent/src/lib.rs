//! `libwitch_agent.so`: the witchcraft engine inside an unmodified program,
//! loaded with `LD_PRELOAD` at its start ([`preload`]) or into it while it
//! runs, for a session ([`attach`]). Kept apart from the engine library so
//! that the libc functions it interposes (`pthread_create`, `sigaction`,
//! `execve`, ...) never end up in the `witch` binary or in tests.
//!
//! Each piece of state has one owner: [`state::AGENT`] (the engine, the
//! flags, the notes, where the profile goes) with its thread table
//! ([`threads`]); [`attach_state::SESSION`] an attach session's;
//! [`program`] keeps the program's own signal dispositions.
//! [`handlers`] are the signal handlers; [`interpose`], [`dispositions`]
//! and [`loading`] the C library functions a preloaded agent wraps.
//!
//! The modules stand on one-way floors (a test reads the sources and fails
//! on any import circle): at the bottom what has no state of the agent's
//! ([`symbols`], [`mappings`], [`attach_state`]); then the thread table and
//! [`state`]; the handlers and the making of the engine ([`setup`]); what
//! the interposers call down into ([`loading`], [`leave`],
//! [`thread_life`]); the interposers; and on top the two modes, which
//! nothing calls up into.

#![warn(clippy::undocumented_unsafe_blocks)]

mod alloc;
pub mod attach;
mod attach_state;
mod calibrate;
mod channel;
pub mod dispositions;
mod handler_stack;
mod handlers;
mod heap;
mod imports;
pub mod interpose;
mod leave;
pub mod loading;
mod mappings;
pub mod preload;
mod program;
mod setup;
mod state;
mod symbols;
mod thread_life;
mod threads;
