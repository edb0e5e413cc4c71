//! `libwitch_agent.so`: the witchcraft engine inside an unmodified program,
//! loaded with `LD_PRELOAD` at its start ([`preload`]) or into it while it
//! runs, for a session ([`attach`]). Kept apart from the engine library so
//! that the libc functions it interposes (`pthread_create`, `sigaction`,
//! `execve`, ...) never end up in the `witch` binary or in tests.
//!
//! Each piece of state has one owner: [`state::AGENT`] (the engine, the
//! flags, the notes, where the profile goes) with its thread table
//! ([`threads`]), reset by `Agent::begin` and, in a fork child,
//! `Agent::after_fork`; [`attach_state::SESSION`] an attach session's,
//! reset by `Session::begin`; [`program`] keeps the program's own signal
//! dispositions, which outlive sessions and forks as the kernel's do.
//!
//! The other process-wide `static`s are not a profile's state, and no
//! session or fork resets them:
//!
//! - a resolved symbol (a `static REAL: AtomicPtr` beside an interposer or
//!   a call on to the C library, `symbols::next`'s caches): the same
//!   definition for the process's life, in its forks too;
//! - facts of the process that hold for its life and its forks: the
//!   agent's own address ranges and the bootstrap allocations made while
//!   symbols are looked up (`heap.rs`), the pthread key whose destructor
//!   ends a thread (`thread_life::KEY`), the allocator's crash region
//!   (`alloc.rs`: once a crash handler runs, the process is ending), the
//!   import-table entries pointed at the agent, which stay so after a
//!   session (`imports.rs`);
//! - caches of what the process has mapped, checked against it before
//!   use: the loader's counts when the module map was last rebuilt and a
//!   `dlopen` not yet in it (`loading.rs`: a stale count costs one more
//!   rebuild, never a missed one), the snapshot of mappings a handler finds
//!   a stack in (`mappings.rs`: taken again before any thread is added);
//! - a measurement's own scratch, set and cleared around it, read by the
//!   handler it runs through (`calibrate.rs`; a fork child, which runs no
//!   measurement, finds it cleared);
//! - the handler-allocation check (`alloc.rs`): switched on once at start;
//!   its count is the process's, started again in a fork child by
//!   `Agent::after_fork`.
//!
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
mod code_patch;
pub mod dispositions;
mod exec_image;
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
mod program_mask;
mod program_syscall;
mod setup;
mod state;
mod symbols;
mod thread_life;
mod threads;
