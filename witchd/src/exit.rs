//! witch's exit statuses.
//!
//! When witch runs a program, the program's own status is witch's status
//! (and if a signal ended it, witch dies of the same signal), so witch's own
//! failures take the codes `env` and `timeout` use, which a program rarely
//! returns:
//! - 125: witch itself failed (a usage error, an unusable `-o`, a set-up failure);
//! - 126: the program was found but cannot be profiled (not executable,
//!   statically linked, not x86-64, or witch runs under a seccomp filter
//!   the program would inherit);
//! - 127: the program was not found.
//!
//! Every other command (`report`, `diff`, `gate`, `doctor`, `daemon`, and a
//! craft with `--pid`, which runs no program) exits 0 when it worked and 2
//! on an error; `gate` exits 1 when a bound fails, and a craft with `--pid`
//! exits 3 when the process replaced its program (exec) during the session
//! or the attach, which leaves no profile (the process runs on).

/// witch failed before, or instead of, running the program.
pub const FAILED: i32 = 125;
/// The program exists but cannot be run under witch.
pub const CANNOT_RUN: i32 = 126;
/// The program was not found.
pub const NOT_FOUND: i32 = 127;
/// An error in any other command.
pub const ERROR: i32 = 2;
/// `witch gate`: a bound failed.
pub const GATE_FAILED: i32 = 1;
/// `witch CRAFT --pid`: the process replaced its program (exec) during the
/// session (or the attach); its agent and profile went with the old image.
pub const TARGET_EXEC: i32 = 3;

/// An error that says which status witch exits with.
#[derive(Debug)]
pub struct Status {
    pub code: i32,
    pub msg: String,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Status {}

pub fn not_found(msg: impl Into<String>) -> anyhow::Error {
    Status { code: NOT_FOUND, msg: msg.into() }.into()
}

pub fn cannot_run(msg: impl Into<String>) -> anyhow::Error {
    Status { code: CANNOT_RUN, msg: msg.into() }.into()
}

/// The status for an error: its own when it carries one, else `default`.
pub fn code_of(e: &anyhow::Error, default: i32) -> i32 {
    e.chain().find_map(|c| c.downcast_ref::<Status>()).map_or(default, |s| s.code)
}
