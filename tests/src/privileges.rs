//! Privileges: root, nobody, and what others may run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Find an executable on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// Can a user who is neither owner nor in the group reach and run `path`?
pub fn others_can_run(path: &Path) -> bool {
    let Ok(m) = path.metadata() else { return false };
    if m.permissions().mode() & 0o005 != 0o005 {
        return false;
    }
    path.ancestors().skip(1).all(|d| d.as_os_str().is_empty() || d.metadata().map(|m| m.permissions().mode() & 0o001 != 0).unwrap_or(false))
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}

/// The uid and gid of `nobody`.
pub const NOBODY: u32 = 65534;

/// Running witch as nobody: a witch binary (with its agent) that nobody can
/// run, and the wrapper that runs a command as nobody.
pub struct Nobody {
    pub witch: PathBuf,
    pub wrapper: Vec<String>,
}

impl Nobody {
    /// As root with `setpriv` only (None otherwise). witch and its agent are
    /// copied into `dir/bin` when the build tree is private. `dir` itself
    /// keeps its permissions: a test whose nobody writes there opens it up.
    pub fn setup(dir: &crate::Scratch) -> Option<Nobody> {
        let wrapper = nobody_wrapper()?;
        let mut witch = crate::witch_bin();
        let agent = crate::agent_beside(&witch);
        if !others_can_run(&witch) || agent.as_ref().is_some_and(|a| !others_can_run(a)) {
            let bin = dir.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            chmod(&bin, 0o755);
            let copy = |from: &PathBuf| {
                let to = bin.join(from.file_name().unwrap());
                std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
                chmod(&to, 0o755);
                to
            };
            if let Some(agent) = &agent {
                copy(agent);
            }
            witch = copy(&witch);
        }
        Some(Nobody { witch, wrapper })
    }
}

/// As root with setpriv: the wrapper that runs a command as nobody.
pub fn nobody_wrapper() -> Option<Vec<String>> {
    let setpriv = which("setpriv")?;
    if !is_root() {
        return None;
    }
    Some(vec![
        setpriv.to_string_lossy().into_owned(),
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        "--".into(),
    ])
}

/// A field of /proc/PID/status ("Threads:", "SigCgt:", ...), trimmed; empty if absent.
pub fn proc_status(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}
