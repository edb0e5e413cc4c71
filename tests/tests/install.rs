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
    let installed = install(&prefix);

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
    // Outside /usr and /usr/local, man does not find the pages: the unit
    // names its documents by file, so `systemd-analyze verify` passes with
    // its check of the documentation.
    assert!(unit.contains(&format!("Documentation=file:{}/share/man/man8/witchd.8", prefix.display())), "{unit}");
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let mut c = Command::new("systemd-analyze");
        c.arg("verify").arg(&unit_path);
        let v = run_cmd(c, None);
        assert_eq!(v.code(), Some(0), "systemd-analyze verify: {}", v.describe());
    } else {
        eprintln!("[witch-tests] systemd-analyze is not here: the unit is not verified");
    }
    // No systemctl advice where systemd will not find the unit.
    let said = installed.stdout_str();
    assert!(!said.contains("systemctl daemon-reload") && said.contains("bin/witchd --config"), "{said}");

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

/// Without cargo on PATH (root's PATH under sudo, a fresh machine),
/// install.sh says so in one line, and how to install a build without it.
#[test]
fn install_without_cargo_says_what_to_do() {
    let s = Scratch::new("install-no-cargo");
    // A PATH with the tools install.sh needs, and no cargo.
    let bin = s.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["dirname", "install", "objcopy"] {
        let found = witch_tests::which(tool).unwrap_or_else(|| panic!("{tool} is not on PATH"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    let mut c = Command::new("/bin/bash");
    c.arg(repo().join("install.sh")).arg("--prefix").arg(s.join("prefix")).env("PATH", &bin);
    let r = run_cmd(c, None);
    let err = r.stderr_str();
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("cargo is not on PATH") && err.contains("--no-build"), "{err}");
    assert!(!s.join("prefix").exists(), "install.sh installed something without a build");
}

/// The Debian package: built by cargo-deb from the build under test
/// (dist/deb.sh --no-build --fast), unpacked with dpkg -x, and `witch dead` run from
/// it on the bundled example, the agent found where the package puts it.
#[test]
fn the_debian_package_installs_and_profiles() {
    if !Command::new("cargo").args(["deb", "--version"]).output().is_ok_and(|o| o.status.success()) {
        eprintln!("[witch-tests] skipping: cargo-deb is not installed (`cargo install cargo-deb`; .ci/run installs it)");
        return;
    }
    let s = Scratch::new("deb");
    let target = witch_bin().parent().unwrap().parent().unwrap().to_path_buf();
    let mut c = Command::new("bash");
    c.arg(repo().join("dist/deb.sh")).args(["--no-build", "--fast"]).env("CARGO_TARGET_DIR", &target);
    let built = run_cmd(c, None);
    assert_eq!(built.code(), Some(0), "dist/deb.sh: {}", built.describe());
    let deb = PathBuf::from(built.stdout_str().lines().last().unwrap_or_default().trim());
    assert!(deb.is_file(), "no package at {}: {}", deb.display(), built.describe());
    let field = |f: &str| {
        let o = Command::new("dpkg-deb").arg("-f").arg(&deb).arg(f).output().expect("dpkg-deb");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(field("Package"), "witch");
    assert!(field("Depends").contains("libc6"), "Depends: {}", field("Depends"));

    let root = s.join("root");
    let mut c = Command::new("dpkg");
    c.arg("-x").arg(&deb).arg(&root);
    let x = run_cmd(c, None);
    assert_eq!(x.code(), Some(0), "dpkg -x: {}", x.describe());
    for f in [
        "usr/bin/witch",
        "usr/bin/witchd",
        "usr/lib/witch/libwitch_agent.so",
        "usr/share/man/man1/witch-dead.1",
        "usr/share/man/man8/witchd.8",
        "usr/share/bash-completion/completions/witch",
        "usr/lib/systemd/system/witchd.service",
        "etc/witchd.toml",
        "usr/share/doc/witch/README.md",
    ] {
        assert!(root.join(f).is_file(), "{f} is not in the package");
    }
    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/witchd.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/witchd --config /etc/witchd.toml") && unit.contains("Documentation=man:witchd(8)"), "{unit}");

    let exe = s.join("regscan");
    let gcc = Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&exe).arg(repo().join("examples/regscan.c")).status().expect("gcc");
    assert!(gcc.success());
    let mut c = Command::new(root.join("usr/bin/witch"));
    c.env_remove("WITCH_AGENT").arg("dead").arg("-o").arg(s.join("p.json")).arg(&exe).current_dir(s.path());
    let r = run_cmd(c, None);
    assert_eq!(r.code(), Some(0), "{}", r.describe());
    assert!(r.stderr_str().contains("regscan.c:28"), "{}", r.describe());
}
