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
    fn each(cmd: clap::Command, parent: &str, out: &mut Vec<(String, clap::Command)>) {
        let name = if parent.is_empty() { cmd.get_name().to_string() } else { format!("{parent}-{}", cmd.get_name()) };
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            each(sub, &name, out);
        }
        out.push((name, cmd));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let d = crate::write::Dir::open(dir).with_context(|| format!("cannot write manual pages into {}", dir.display()))?;
    // As clap_mangen::generate_to names and renders them.
    let mut witch = command(Binary::Witch).disable_help_subcommand(true);
    witch.build();
    let mut cmds = Vec::new();
    each(witch, "", &mut cmds);
    let mut all: Vec<String> = cmds.iter().map(|(n, _)| n.clone()).collect();
    all.sort();
    let mut pages = Vec::new();
    let witchd = ("witchd".to_string(), command(Binary::Witchd));
    for (name, cmd) in cmds.into_iter().chain([witchd]) {
        let section = if name == "witchd" { "8" } else { "1" };
        let m = clap_mangen::Man::new(cmd.clone())
            .section(section)
            .source(format!("witch {}", env!("CARGO_PKG_VERSION")))
            .manual("witch manual");
        let file = m.get_filename();
        let page = man_page(&m, &cmd, &name, &all)?;
        d.write(file.as_ref(), 0o644, |w| Ok(w.write_all(page.as_bytes())?))
            .with_context(|| format!("cannot write {}", dir.join(&file).display()))?;
        pages.push(dir.join(file));
    }
    pages.sort();
    Ok(pages)
}

/// One page: clap_mangen's title, name, synopsis, description, options and
/// subcommands, then witch's own sections. The after-help's examples are
/// set as typed (no filling: a command line is never reflowed), its other
/// paragraphs as NOTES; then EXIT STATUS, FILES (for witchd, its
/// CONFIGURATION keys before them), SEE ALSO and VERSION.
fn man_page(m: &clap_mangen::Man, cmd: &clap::Command, name: &str, all: &[String]) -> Result<String> {
    use roff::{bold, roman, Roff};
    let preamble = Roff::new().render();
    let mut out = String::new();
    let mut put = |f: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| -> Result<()> {
        let mut b = Vec::new();
        f(&mut b)?;
        let s = String::from_utf8_lossy(&b).into_owned();
        let first = out.is_empty();
        out.push_str(if first { &s } else { s.strip_prefix(&preamble).unwrap_or(&s) });
        Ok(())
    };
    put(&|w| m.render_title(w))?;
    put(&|w| m.render_name_section(w))?;
    put(&|w| m.render_synopsis_section(w))?;
    put(&|w| m.render_description_section(w))?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        put(&|w| m.render_options_section(w))?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        put(&|w| m.render_subcommands_section(w))?;
    }
    let mut r = Roff::new();
    let after = cmd.get_after_long_help().or_else(|| cmd.get_after_help()).map(|s| s.to_string()).unwrap_or_default();
    let blocks: Vec<&str> = after.split("\n\n").map(str::trim_end).filter(|b| !b.trim().is_empty()).collect();
    for b in blocks.iter().filter(|b| b.starts_with("Examples:")) {
        r.control("SH", ["EXAMPLES"]).control("nf", []);
        for l in b.lines().skip(1) {
            r.text([roman(l)]);
        }
        r.control("fi", []);
    }
    let notes: Vec<&&str> = blocks.iter().filter(|b| !b.starts_with("Examples:") && !b.starts_with("Exit status:")).collect();
    if !notes.is_empty() {
        r.control("SH", ["NOTES"]);
        for (i, b) in notes.iter().enumerate() {
            if i > 0 {
                r.control("PP", []);
            }
            r.text([roman(b.split_whitespace().collect::<Vec<_>>().join(" "))]);
        }
    }
    if name == "witchd" {
        configuration(&mut r);
    }
    r.control("SH", ["EXIT STATUS"]).text([roman(exit_status(name))]);
    let files = files(name);
    if !files.is_empty() {
        r.control("SH", ["FILES"]);
        for (f, what) in files {
            r.control("TP", []).text([bold(f)]).text([roman(what)]);
        }
    }
    r.control("SH", ["SEE ALSO"]).text([roman(see_also(name, all).join(", "))]);
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    r.control("SH", ["VERSION"]).text([roman(version)]);
    let mut b = Vec::new();
    r.to_writer(&mut b)?;
    let s = String::from_utf8_lossy(&b).into_owned();
    out += s.strip_prefix(&preamble).unwrap_or(&s);
    Ok(out)
}

/// witchd(8)'s CONFIGURATION: every key of the file, by section.
fn configuration(r: &mut roff::Roff) {
    use roff::{bold, roman};
    r.control("SH", ["CONFIGURATION"]).text([roman(
        "The file given with --config is TOML. Every key is optional, and an unknown key is an error; \
         `witchd --config FILE --check` checks a file. Durations read \"30s\", \"5m\", \"7d\"; sizes \"256MiB\". \
         An example, with each key commented, is installed as share/doc/witch/witchd.toml.",
    )]);
    for (section, title) in [
        ("", "Top level"),
        ("store", "[store]: the profiles kept"),
        ("defaults", "[defaults]: how targets are profiled (each [[watch]] may set these too)"),
        ("watch", "[[watch]]: which processes to watch, one table per rule (all selectors given must match)"),
    ] {
        r.control("SS", [title]);
        for k in crate::daemon::config::KEYS.iter().filter(|k| k.section == section) {
            r.control("TP", []).text([bold(k.name), roman(format!(" = {}", k.example))]).text([roman(k.meaning)]);
        }
    }
}

/// The EXIT STATUS section of a page (see [`crate::exit`]).
fn exit_status(name: &str) -> String {
    let craft = "When witch runs a program, its status is the program's (and if a signal ended the program, witch ends by the same signal); \
                 witch's own failures take statuses a program rarely returns: 125, witch failed (a usage error such as an unknown option, an unusable -o, a set-up failure); \
                 126, the program cannot be profiled (not executable, a directory, statically linked, set-user-ID, not x86-64); 127, the program was not found. \
                 With --pid: 0 done, 2 error, 3 the process replaced its program (exec) during the session.";
    match name {
        "witch-dead" | "witch-silent-store" | "witch-silent-load" => craft.into(),
        "witch" => format!("{craft} Other commands: 0 done, 2 error; witch gate: 1 when a bound fails."),
        "witch-gate" => "0: every bound passed (or the data cannot tell); 1: a bound failed; 2: a usage or input error.".into(),
        "witchd" => "0: stopped by SIGTERM, SIGINT or SIGHUP after detaching from every target (or --check found the file good); 2: a bad configuration, or witchd could not start.".into(),
        _ => "0: done; 2: an error (a usage error, an unreadable or foreign file, witchd not reachable).".into(),
    }
}

/// The FILES section of a page: (path, what it is).
fn files(name: &str) -> Vec<(&'static str, &'static str)> {
    let agent = ("PREFIX/lib/witch/libwitch_agent.so", "The agent witch preloads into the program (or loads into a process it attaches to); looked for beside witch, then in ../lib/witch/ and ../lib/ from it; $WITCH_AGENT overrides.");
    let profile =
        ("witch-CRAFT-PROGRAM-PID.json", "The profile a run writes by default, in the current directory (-o FILE names another).");
    let parts = ("witch-parts-PID/", "The profiles of a run's processes while it runs, beside the profile; left, with a README, when the run was stopped or the profile could not be written (`witch report DIR` reads it).");
    let debug = (
        "/usr/lib/debug/.build-id/",
        "Debug info found by build-id (more directories in $WITCH_DEBUG_DIRS, colon-separated); then by the binary's .gnu_debuglink.",
    );
    let debuginfod = (
        "~/.cache/debuginfod_client/",
        "Debug files fetched from the debuginfod servers in $DEBUGINFOD_URLS, when it is set; elfutils' cache, shared with gdb and perf ($DEBUGINFOD_CACHE_PATH, else $XDG_CACHE_HOME/debuginfod_client).",
    );
    let socket = (
        "/run/witchd.sock",
        "witchd's socket when it runs as root; $XDG_RUNTIME_DIR/witchd.sock for a user's witchd ($WITCHD_SOCKET overrides).",
    );
    match name {
        "witch" | "witch-dead" | "witch-silent-store" | "witch-silent-load" => vec![profile, parts, agent, debug, debuginfod],
        "witch-report" | "witch-diff" | "witch-gate" => vec![debug, debuginfod],
        n if n.starts_with("witch-daemon") => vec![socket],
        "witchd" => vec![
            ("/etc/witchd.toml", "The configuration, by default (PREFIX/etc/witchd.toml for an install outside /usr and /usr/local)."),
            socket,
            (
                "/var/lib/witchd/",
                "The profile store when witchd runs as root ($XDG_STATE_HOME/witchd or ~/.local/state/witchd for a user).",
            ),
            ("PREFIX/lib/systemd/system/witchd.service", "The systemd unit install.sh installs."),
            agent,
        ],
        _ => vec![],
    }
}

/// The SEE ALSO section: the pages a reader of this one goes to next.
fn see_also(name: &str, all: &[String]) -> Vec<String> {
    let page = |n: &str| if n == "witchd" { "witchd(8)".to_string() } else { format!("{n}(1)") };
    let mut v: Vec<String> = match name {
        "witch" => all.iter().filter(|n| *n != "witch").cloned().chain(["witchd".to_string()]).collect(),
        "witchd" => vec!["witch".into(), "witch-daemon".into()],
        n if n.starts_with("witch-daemon-") => vec!["witch".into(), "witch-daemon".into(), "witchd".into()],
        "witch-daemon" => vec!["witch".into(), "witchd".into()],
        "witch-dead" | "witch-silent-store" | "witch-silent-load" => {
            ["witch", "witch-dead", "witch-silent-store", "witch-silent-load", "witch-report", "witch-gate", "witch-doctor"]
                .iter()
                .filter(|n| **n != name)
                .map(|n| n.to_string())
                .collect()
        }
        _ => vec!["witch".into(), "witch-report".into(), "witch-diff".into(), "witch-gate".into()]
            .into_iter()
            .filter(|n: &String| n != name)
            .collect(),
    };
    v.retain(|n| n == "witchd" || all.contains(n));
    let mut out: Vec<String> = v.iter().map(|n| page(n)).collect();
    if matches!(name, "witch" | "witch-dead" | "witch-silent-store" | "witch-silent-load") {
        out.extend(["perf(1)".to_string(), "valgrind(1)".to_string()]);
    }
    out
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

    /// Every page has EXIT STATUS and SEE ALSO, FILES where there are files,
    /// a footer naming witch and its version; examples are set as typed
    /// (no filling); witchd(8) lists every configuration key.
    #[test]
    fn man_pages_have_the_usual_sections() {
        let dir = std::env::temp_dir().join(format!("witch-man-sections-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pages = write_man_pages(&dir).unwrap();
        let footer = format!("\"witch {}\"", env!("CARGO_PKG_VERSION"));
        for p in &pages {
            let t = std::fs::read_to_string(p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy();
            for s in [".SH \"EXIT STATUS\"", ".SH \"SEE ALSO\"", ".SH NAME", ".SH SYNOPSIS"] {
                assert!(t.contains(s), "{name} lacks {s}");
            }
            let th = t.lines().find(|l| l.starts_with(".TH")).unwrap();
            assert!(th.contains(&footer), "{name}: footer {th}");
            assert_eq!(t.matches(".ie \\n(.g").count(), 1, "{name}: the preamble repeats");
        }
        for name in ["witch.1", "witch-dead.1", "witch-report.1", "witch-daemon-fetch.1", "witchd.8"] {
            let t = std::fs::read_to_string(dir.join(name)).unwrap();
            assert!(t.contains(".SH FILES"), "{name} lacks FILES");
        }
        // Examples as typed: a no-fill block, one command per line.
        let witch = std::fs::read_to_string(dir.join("witch.1")).unwrap();
        let ex = witch.split(".SH EXAMPLES").nth(1).expect("witch.1 has EXAMPLES");
        let ex = &ex[..ex.find(".fi").expect("the examples' no-fill block ends")];
        assert!(ex.trim_start().starts_with(".nf"), "{ex}");
        assert!(ex.lines().any(|l| l.trim_start().starts_with("witch dead ./app") && l.contains("find dead stores")), "{ex}");
        assert!(witch.contains("witch\\-dead(1)") && witch.contains("witchd(8)"), "witch.1's SEE ALSO");
        let witchd = std::fs::read_to_string(dir.join("witchd.8")).unwrap();
        assert!(witchd.contains(".SH CONFIGURATION"));
        for k in crate::daemon::config::KEYS {
            let key = format!("\\fB{}\\fR", k.name);
            assert!(witchd.contains(&key), "witchd.8 does not list {}", k.name);
        }
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
