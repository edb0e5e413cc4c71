//! The kernel interfaces the engine uses, each in one place: perf events
//! (breakpoints, software clocks, PMU samplers), POSIX CPU-time timers,
//! signal information, /proc, a traced thread's debug registers, shared-memory futexes, what a launched program
//! inherits, and (for witchd) the owners of local TCP connections. Raw constants and system calls live here
//! behind small named functions; the engine above speaks in their terms.

pub mod cputimer;
pub mod fd;
pub mod fpu;
pub mod futex;
pub mod inherited;
pub mod mem;
pub mod perf;
pub mod pmu;
pub mod procfs;
#[cfg(feature = "controller")]
pub mod ptrace;
pub mod siginfo;
pub mod sock_diag;
pub mod task;
pub mod vdso;
pub mod watchpoint;
