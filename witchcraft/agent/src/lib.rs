//! `libwitch_agent.so`: the witchcraft engine inside an unmodified program,
//! loaded with `LD_PRELOAD` at its start ([`preload`]) or into it while it
//! runs, for a session ([`attach`]). Kept apart from the engine library so
//! that the libc functions it interposes (`pthread_create`, `sigaction`,
//! `execve`, ...) never end up in the `witch` binary or in tests.
//!
//! Each piece of state has one owner: [`state::AGENT`] (the engine, the
//! flags, the notes, where the profile goes) with its thread table
//! ([`threads`]); [`program`] keeps the program's own signal dispositions.
//! [`handlers`] are the signal handlers, [`interpose`] the C library
//! functions a preloaded agent wraps.

#![warn(clippy::undocumented_unsafe_blocks)]

mod alloc;
pub mod attach;
mod calibrate;
mod channel;
mod handler_stack;
mod handlers;
mod heap;
mod imports;
pub mod interpose;
pub mod preload;
mod program;
mod setup;
mod state;
mod threads;
