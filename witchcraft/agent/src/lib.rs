//! `libwitch_agent.so`: loaded with `LD_PRELOAD`, it runs the witchcraft
//! engine inside an unmodified program. Kept apart from the engine library
//! so that the libc functions it interposes (`pthread_create`, `sigaction`,
//! `execve`, ...) never end up in the `witch` binary or in tests.

mod agent;
mod attach;
mod signal;
