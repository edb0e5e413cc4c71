//! `witch completions` and `witch man`: shell completions and manual pages,
//! generated from the clap declarations of `witch` ([`crate::cli::Cli`]) and
//! `witchd` ([`crate::daemon::args::Args`]), so they never drift from the
//! options the binaries really take. `install.sh` installs both.

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Which binary a completion script is for.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Witch,
    Witchd,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: Shell,
    /// The binary to complete
    #[arg(value_enum, default_value_t = Binary::Witch)]
    pub binary: Binary,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing): witch.1, one witch-SUBCOMMAND.1
    /// per subcommand, and witchd.8
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

fn command(b: Binary) -> clap::Command {
    match b {
        Binary::Witch => crate::cli::Cli::command(),
        Binary::Witchd => crate::daemon::args::Args::command(),
    }
}

/// Prints the completion script for one shell and binary on stdout.
pub fn completions(a: &CompletionsArgs) -> Result<i32> {
    let mut cmd = command(a.binary);
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, name, &mut out);
    crate::print(&String::from_utf8_lossy(&out))?;
    Ok(0)
}

/// Writes every manual page into a directory; returns the files written.
/// Each is written as any file witch writes ([`crate::write`]): relative to
/// one descriptor of the directory, through an exclusive temporary file.
pub fn write_man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    fn each(cmd: clap::Command, out: &mut Vec<clap_mangen::Man>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            each(sub, out);
        }
        out.push(clap_mangen::Man::new(cmd));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let d = crate::write::Dir::open(dir).with_context(|| format!("cannot write manual pages into {}", dir.display()))?;
    // As clap_mangen::generate_to names and renders them.
    let mut witch = command(Binary::Witch).disable_help_subcommand(true);
    witch.build();
    let mut mans = Vec::new();
    each(witch, &mut mans);
    mans.push(clap_mangen::Man::new(command(Binary::Witchd)).section("8"));
    let mut pages = Vec::new();
    for m in mans {
        let name = m.get_filename();
        d.write(name.as_ref(), 0o644, |w| Ok(m.render(w)?)).with_context(|| format!("cannot write {}", dir.join(&name).display()))?;
        pages.push(dir.join(name));
    }
    pages.sort();
    Ok(pages)
}

/// `witch man DIR`.
pub fn man(a: &ManArgs) -> Result<i32> {
    let pages = write_man_pages(&a.dir)?;
    crate::say!("witch: wrote {} manual pages into {}", pages.len(), a.dir.display());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn man_pages_cover_every_subcommand_and_witchd() {
        let dir = std::env::temp_dir().join(format!("witch-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pages = write_man_pages(&dir).unwrap();
        let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for want in ["witch.1", "witch-dead.1", "witch-report.1", "witch-gate.1", "witch-daemon-fetch.1", "witchd.8"] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        let dead = std::fs::read_to_string(dir.join("witch-dead.1")).unwrap();
        assert!(dead.starts_with(".ie") || dead.contains(".TH"), "not roff: {}", &dead[..dead.len().min(200)]);
        assert!(dead.contains("debug\\-registers"), "an option is missing from witch-dead.1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn completions_name_the_subcommands() {
        for (shell, binary, want) in [
            (Shell::Bash, Binary::Witch, "silent-store"),
            (Shell::Zsh, Binary::Witch, "--fp-precision"),
            (Shell::Fish, Binary::Witchd, "-l check"),
        ] {
            let mut cmd = command(binary);
            let name = cmd.get_name().to_string();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, name, &mut out);
            let s = String::from_utf8(out).unwrap();
            assert!(s.contains(want), "{shell} completion for {binary:?} lacks {want}");
        }
    }
}
