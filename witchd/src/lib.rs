//! The `witch` command line and the `witchd` daemon, as a library both
//! binaries share.
//!
//! - [`cli`]: the command line's declaration (clap); [`cmd`]: one module per subcommand;
//! - [`agent`]: where the agent library is and what it is told;
//! - [`inject`]: attaching the agent to a running process;
//! - [`analysis`]: a profile's pairs, symbolized and merged at source level;
//! - [`symbolize`]: addresses to source frames, offline;
//! - [`render`]: every output format, behind one `Recorder` trait;
//! - [`daemon`]: the witchd daemon;
//! - [`write`]: the one writer of files, made safe where others may write.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod agent;
pub mod analysis;

pub mod cli;
pub mod cmd;
pub mod daemon;
pub mod exit;
pub mod inject;
pub mod render;
pub mod symbolize;
pub mod write;

use std::io::Write;

/// `eprintln!` that survives a stderr nobody reads any more (`witch ... 2>&1 |
/// head`): the message is lost, but witch goes on, so a run still ends with
/// the program's status and writes its profile. (`eprintln!` panics there,
/// and witch is built to abort on a panic.)
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `eprint!` with [`say!`]'s tolerance.
#[macro_export]
macro_rules! say_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($t)*);
    }};
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn print(s: &str) -> anyhow::Result<()> {
    print_with(|w| Ok(w.write_all(s.as_bytes())?))
}

/// Streams output to stdout through `f`; a reader that went away is not an error.
pub fn print_with(f: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let broken = |e: &anyhow::Error| {
        e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
                || c.downcast_ref::<serde_json::Error>().is_some_and(|e| e.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
        })
    };
    match f(&mut out).and_then(|_| Ok(out.flush()?)) {
        Err(e) if broken(&e) => Ok(()),
        r => r,
    }
}
