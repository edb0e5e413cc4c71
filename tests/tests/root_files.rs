//! Files witch creates as root beside what it was asked to write, and how
//! a run ends when its profile cannot be had: each test names the way it
//! went wrong before.

use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use witch_tests::*;

/// A sysctl set for the length of a test, put back when dropped (a failed
/// assertion included).
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Sysctl {
        let old = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        std::fs::write(path, value).unwrap_or_else(|e| panic!("write {path}: {e}"));
        Sysctl { path, old }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.old.trim());
    }
}

/// The last pid handed out in this pid namespace.
fn last_pid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap()
}

/// As nobody (a forked child that drops to uid and gid 65534), makes each of
/// `links` a symbolic link to `to`. Returns how many it made.
fn plant_as_nobody(links: &[PathBuf], to: &Path) -> usize {
    let to = CString::new(to.as_os_str().as_encoded_bytes()).unwrap();
    let names: Vec<CString> = links.iter().map(|l| CString::new(l.as_os_str().as_encoded_bytes()).unwrap()).collect();
    // SAFETY: the child makes system calls only (no allocation) on what was
    // built before the fork, then _exits with how many links it made.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                libc::_exit(255);
            }
            let mut made = 0;
            for n in &names {
                made += i32::from(libc::symlink(to.as_ptr(), n.as_ptr()) == 0);
            }
            libc::_exit(i32::from(made > 0));
        }
    }
    let mut st = 0;
    unsafe { libc::waitpid(child, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 1, "nobody could not plant links (status {st:#x})");
    links.iter().filter(|l| std::fs::symlink_metadata(l).is_ok_and(|m| m.file_type().is_symlink() && m.uid() == NOBODY)).count()
}

/// `fs.protected_symlinks = 0` (a host where the kernel does not refuse to
/// follow another user's link in a sticky directory): nobody plants links
/// named as witch's temporary files would be, for the next thousand pids,
/// in a world-writable sticky directory (as /tmp is), pointing at a file
/// only root may write. Root then runs `witch dead -o DIR/prof.json` and
/// `witch dead --pid` with `-o` there. Before, witch created
/// `.NAME.witch-PID.tmp` and `.witch-probe-PID` with `O_CREAT|O_TRUNC`,
/// following the links: root's profile JSON went into the root-only file,
/// and the attach's probe truncated it to 0 bytes. The file must stay as it
/// was, and the profiles be written where asked, as regular files.
#[test]
fn root_never_writes_through_links_planted_beside_the_output() {
    if !is_root() {
        eprintln!("[witch-tests] not root: cannot plant links as another user nor set fs.protected_symlinks; skipping");
        return;
    }
    let dir = Scratch::new("planted");
    let prog = Program::build("short_run", dir.path());
    let target_exe = Program::build("attach_target", dir.path());
    let secret = dir.join("root-only");
    let content = b"only root writes this file\n";
    std::fs::write(&secret, content).unwrap();
    chmod(&secret, 0o600);
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let _unprotected = Sysctl::set("/proc/sys/fs/protected_symlinks", "0");

    let outs = ["prof.json", "attached.json"];
    let first = last_pid() + 1;
    let mut links = Vec::new();
    for pid in first..first + 1000 {
        for o in outs {
            links.push(shared.join(format!(".{o}.witch-{pid}.tmp")));
        }
        links.push(shared.join(format!(".witch-probe-{pid}")));
    }
    let planted = plant_as_nobody(&links, &secret);
    assert_eq!(planted, links.len(), "nobody planted every link");
    let unchanged = |when: &str| {
        let now = std::fs::read(&secret).unwrap();
        let shown: String = String::from_utf8_lossy(&now).chars().take(80).collect();
        assert!(now == content, "{when}: the root-only file was written through a planted link ({} bytes now: {shown:?}...)", now.len());
    };
    let regular_profile = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(m.file_type().is_file(), "{} is not a regular file: {:?}", p.display(), m.file_type());
        raw_profile(p);
    };

    let out = shared.join(outs[0]);
    let run = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&prog.exe, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    unchanged("witch dead -o");
    regular_profile(&out);

    let target = attach::Target::start(&target_exe.exe, &["0"], &[]);
    target.wait_ready(5, None);
    let out = shared.join(outs[1]);
    let run = attach::attach_cmd(&witch_bin(), &[], "dead", target.pid(), &["--duration", "1", "-q", "-o", out.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    unchanged("witch dead --pid -o");
    regular_profile(&out);
    let ended = target.finish();
    assert_eq!(ended.code(), Some(7), "{}", ended.stderr);
    // Nothing of witch's own is left beside the profiles.
    let left: Vec<String> = std::fs::read_dir(&shared)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_symlink() && !t.is_fifo()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !outs.contains(&n.as_str()))
        .collect();
    assert!(left.is_empty(), "left beside the profiles: {left:?}");
}
