//! The install: `install.sh` into a temporary prefix, then `witch dead` on
//! the bundled example from there, with the agent found in the prefix's
//! `lib/witch/`; the binaries stripped, the manual pages, completions and
//! systemd unit in place; and the "agent not found" error naming the layout.

use std::path::{Path, PathBuf};
use std::process::Command;
use witch_tests::{run_cmd, witch_bin, Run, Scratch};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn install(prefix: &Path) -> Run {
    let built = witch_bin().parent().unwrap().to_path_buf();
    let mut c = Command::new("bash");
    c.arg(repo().join("install.sh")).arg("--no-build").arg("--from").arg(&built).arg("--prefix").arg(prefix);
    let r = run_cmd(c, None);
    assert_eq!(r.code(), Some(0), "install.sh failed: {}", r.describe());
    r
}

fn has_section(file: &Path, section: &str) -> bool {
    let out = Command::new("readelf").arg("-SW").arg(file).output().expect("readelf (binutils)");
    assert!(out.status.success(), "readelf -S {}", file.display());
    String::from_utf8_lossy(&out.stdout).split_whitespace().any(|w| w == section)
}

#[test]
fn install_into_a_prefix_then_profile_from_there() {
    let s = Scratch::new("install");
    let prefix = s.join("prefix");
    install(&prefix);

    // The layout witch searches, stripped.
    let witch = prefix.join("bin/witch");
    let agent = prefix.join("lib/witch/libwitch_agent.so");
    for (installed, built) in [
        (&witch, witch_bin()),
        (&prefix.join("bin/witchd"), witch_bin().with_file_name("witchd")),
        (&agent, witch_bin().with_file_name("libwitch_agent.so")),
    ] {
        assert!(installed.is_file(), "{} not installed", installed.display());
        assert!(!has_section(installed, ".debug_info"), "{} still has its debug info", installed.display());
        let (a, b) = (std::fs::metadata(installed).unwrap().len(), std::fs::metadata(&built).unwrap().len());
        if has_section(&built, ".debug_info") {
            assert!(a < b / 2, "{} is {a} bytes, the build {b}: not stripped", installed.display());
        }
    }
    assert!(has_section(&agent, ".dynsym"), "the agent lost its dynamic symbols");

    // Manual pages, completions, the unit and the example configuration.
    for page in ["share/man/man1/witch.1", "share/man/man1/witch-dead.1", "share/man/man1/witch-report.1", "share/man/man8/witchd.8"] {
        let text = std::fs::read_to_string(prefix.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page} is not a manual page");
    }
    for (file, want) in [
        ("share/bash-completion/completions/witch", "silent-store"),
        ("share/bash-completion/completions/witchd", "--check"),
        ("share/zsh/site-functions/_witch", "--fp-precision"),
        ("share/fish/vendor_completions.d/witch.fish", "gate"),
    ] {
        let text = std::fs::read_to_string(prefix.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(want), "{file} lacks {want}");
    }
    // The README's links to the documents resolve where it is installed.
    let doc = prefix.join("share/doc/witch");
    let readme = std::fs::read_to_string(doc.join("README.md")).unwrap();
    let links: Vec<&str> = readme.split("](").skip(1).filter_map(|r| r.split(')').next()).filter(|l| !l.contains("://")).collect();
    assert!(links.len() >= 5, "the README links fewer documents than expected: {links:?}");
    for link in links {
        let file = link.split('#').next().unwrap_or(link);
        assert!(file.is_empty() || doc.join(file).is_file(), "the installed README links {link}, which is not installed");
    }
    let unit_path = prefix.join("lib/systemd/system/witchd.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    assert!(unit.contains(&format!("ExecStart={}/bin/witchd --config {}/etc/witchd.toml", prefix.display(), prefix.display())), "{unit}");
    assert!(!unit.contains("@BINDIR@") && !unit.contains("@SYSCONFDIR@"), "a placeholder is left in the unit:\n{unit}");
    for key in ["CapabilityBoundingSet=", "NoNewPrivileges=yes", "ProtectSystem=strict", "SystemCallFilter="] {
        assert!(unit.contains(key), "the unit lacks {key}");
    }
    let check = run_cmd(
        {
            let mut c = Command::new(prefix.join("bin/witchd"));
            c.arg("--config").arg(prefix.join("etc/witchd.toml")).arg("--check");
            c
        },
        None,
    );
    assert_eq!(check.code(), Some(0), "the installed configuration does not check: {}", check.describe());
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let mut c = Command::new("systemd-analyze");
        c.args(["verify", "--man=no"]).arg(&unit_path);
        let v = run_cmd(c, None);
        assert_eq!(v.code(), Some(0), "systemd-analyze verify: {}", v.describe());
    }

    // The bundled example, profiled by the installed witch.
    let exe = s.join("regscan");
    let gcc = Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&exe).arg(repo().join("examples/regscan.c")).status().expect("gcc");
    assert!(gcc.success());
    let mut c = Command::new(&witch);
    c.env_remove("WITCH_AGENT").arg("dead").arg("-o").arg(s.join("p.json")).arg(&exe).current_dir(s.path());
    let r = run_cmd(c, None);
    assert_eq!(r.code(), Some(0), "{}", r.describe());
    let report = r.stderr_str();
    let at = report.lines().position(|l| l.contains("regscan.c:28")).unwrap_or_else(|| panic!("regscan.c:28 not in the report:\n{report}"));
    assert!(at < 15, "regscan.c:28 first appears on line {}:\n{report}", at + 1);
    // The default report fits on a screen (everything else is one flag away).
    assert!(report.lines().count() <= 60, "the default report has {} lines:\n{report}", report.lines().count());
    assert!(s.join("p.json").is_file());

    // A witch without its agent says where it looked and how to install.
    let lonely = s.join("elsewhere/bin/witch");
    std::fs::create_dir_all(lonely.parent().unwrap()).unwrap();
    std::fs::copy(&witch, &lonely).unwrap();
    let mut c = Command::new(&lonely);
    c.env_remove("WITCH_AGENT").arg("dead").arg(&exe);
    let r = run_cmd(c, None);
    assert_eq!(r.code(), Some(125), "{}", r.describe());
    let err = r.stderr_str();
    assert!(err.contains("lib/witch") && err.contains("install.sh"), "the error does not name the layout: {err}");
}
