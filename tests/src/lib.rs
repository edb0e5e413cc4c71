//! Harness for witch's end-to-end tests.
//!
//! The tests in `tests/tests/*.rs` build small C programs from
//! `tests/programs/` with `gcc -O2 -g` into a scratch directory, run them
//! natively and under the real `witch` binary, and check the profile (through
//! `witch report FILE --json`) against answers known by construction.
//!
//! The `witch` binary is taken from `$WITCH_BIN`, else from the target
//! directory of the test executable (`target/<profile>/witch`, with the agent
//! `libwitch_agent.so` beside it). Build it first with `cargo build --workspace`
//! using the same profile as the tests.
//!
//! # The test programs (`tests/programs/*.c`)
//!
//! Small C programs whose answers are known by construction, built by the tests
//! with `gcc -O2 -g` and run natively and under `witch`. Source lines that the
//! tests look for carry a marker comment such as `/* @w */`; the tests find the
//! line number by searching for the exact marker text, so moving code around is
//! safe as long as the markers move with it.
//!
//! ## Why the loops look like `a[i] = c = nxt[c];`
//!
//! The sampler on machines without a memory PMU is a per-thread `task-clock`
//! timer: it interrupts the program every P nanoseconds of CPU time and decodes
//! the instruction at (or, allowing for skid, just before) the interrupted PC.
//! Four things shape these programs:
//!
//! 1. **Where the interrupt lands.** On out-of-order x86 cores the interrupted PC
//!    is almost always the instruction right *after* the one that was stalling
//!    retirement. In a plain store loop (`a[i] = v;`) that is the `cmp` after the
//!    store, so a store sampler sees almost no stores (measured with
//!    `perf record -e task-clock`: <2% of interrupts on the store). Putting a
//!    load with a serial dependency right before each store (`c = nxt[c]`, a
//!    pointer chase through a small table that stays in L1) makes the store the
//!    interrupted instruction for ~95% of interrupts. For loads (LoadCraft) the
//!    same holds: the sampled load must come right after a load it depends on
//!    (redundant_load.c chases two loads per iteration and gets about half of
//!    all interrupts on the second one).
//! 2. **Time, not counts.** The software sampler is time-proportional, so lines
//!    that the tests compare must cost the same time per access. With the chase,
//!    every statement costs one L1 load latency, whatever it stores to; measured
//!    per-line store samples for Listing 4.3 come out at 25/25/24/25%.
//! 3. **Recomputable addresses.** A watchpoint trap arrives after the access,
//!    and the engine may check the recovered instruction by recomputing its
//!    address from the registers. A watched load like `mov (%rcx,%rdx,8),%rdx`
//!    destroys its own address register, so the watched loads here are written
//!    so that gcc gives them another destination register.
//! 4. **Skid look-back.** witch's software sampler looks back a few
//!    instructions of straight-line code from the interrupted PC for an
//!    access of the craft's kind, and otherwise takes the instruction at the
//!    PC. In these loops the look-back from a store crosses only the chase
//!    load and stops at the loop head (a branch target), so both readings
//!    credit the same store. Listing 4.3's k loop has two stores in one
//!    iteration; a never-taken branch between them keeps the look-back from
//!    crediting `*q`'s time to `*p`. Checked by replaying the same perf
//!    samples through a model of the look-back: same per-line shares.
//!
//! All variables are `long` and all indices `long` so that gcc does not place a
//! sign extension between the load and the store; `volatile` keeps gcc -O2 from
//! vectorizing, turning loops into `memset`, or deleting dead stores. Where the
//! base is a pointer rather than a global array (threads_dead.c), gcc puts the
//! pointer increment between load and store; an empty `asm volatile` after the
//! store keeps the store in place. All of this was checked with gcc 12 by
//! `perf record -e task-clock -c 100000` on the built programs: 95-99% of the
//! interrupts land on the intended store (about 50% on the intended load).
//!
//! Each program prints a checksum on stdout and exits with a fixed nonzero
//! status, so the tests can check that witch leaves both untouched.
//!
//! Environment knobs:
//! - `WITCH_BIN`: path of the witch binary to test.
//! - `WITCHD_BIN`: path of the witchd daemon to test (default: beside witch).
//! - `WITCH_TESTS_KEEP=1`: keep scratch directories (they are always kept,
//!   and their path printed, when a test fails).
//! - `WITCH_TESTS_TIMEOUT`: seconds before a run is killed (default 300).

pub mod attach;
mod bins;
mod privileges;
mod process;
mod program;
mod report;
mod witch;

pub use bins::*;
pub use privileges::*;
pub use process::*;
pub use program::*;
pub use report::*;
pub use witch::*;
