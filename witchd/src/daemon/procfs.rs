//! What witchd reads about processes from /proc: identity, owner, cgroup.
//!
//! A pid alone is not an identity (pids are reused), so a process is known by
//! its pid and its start time (field 22 of /proc/PID/stat).

use std::path::Path;

/// One process as seen in /proc.
#[derive(Debug, Clone, PartialEq)]
pub struct Proc {
    pub pid: i32,
    /// Start time in clock ticks since boot: with the pid, the process's identity.
    pub start_time: u64,
    /// Executable path, " (deleted)" stripped; empty when unreadable (kernel threads).
    pub exe: String,
    /// /proc/PID/comm (at most 15 bytes).
    pub comm: String,
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    /// Owner of /proc/PID: the kernel makes it root when the process is not
    /// dumpable (setuid, setgid, or prctl(PR_SET_DUMPABLE, 0)).
    pub proc_owner: u32,
    /// The process state letter (R, S, D, T, t, Z, ...).
    pub state: char,
    /// Where its program image lies (see [`Image`]): what an exec changes
    /// while the pid and start time stay.
    pub image: Image,
}

/// Where a program image lies; the one reader of /proc/PID/stat is
/// witchcraft's, shared with `witch --pid`.
pub use witchcraft::sys::procfs::Image;
use witchcraft::sys::procfs::Stat;

impl Proc {
    /// Reads /proc/PID; None when the process is gone or unreadable.
    pub fn read(pid: i32) -> Option<Proc> {
        Self::read_in(Path::new("/proc"), pid)
    }

    fn read_in(root: &Path, pid: i32) -> Option<Proc> {
        use std::os::unix::fs::MetadataExt;
        let dir = root.join(pid.to_string());
        let Stat { state, start_time, image } = Stat::parse(&std::fs::read_to_string(dir.join("stat")).ok()?)?;
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        let uids = ids(&status, "Uid:")?;
        let gids = ids(&status, "Gid:")?;
        let proc_owner = std::fs::metadata(&dir).ok()?.uid();
        let exe =
            std::fs::read_link(dir.join("exe")).map(|p| p.to_string_lossy().trim_end_matches(" (deleted)").to_string()).unwrap_or_default();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim_end().to_string();
        Some(Proc { pid, start_time, exe, comm, uids, gids, proc_owner, state, image })
    }

    /// The name shown in logs, metrics and listings: the executable's file name.
    pub fn name(&self) -> &str {
        match self.exe.rsplit('/').next() {
            Some(n) if !n.is_empty() => n,
            _ => &self.comm,
        }
    }

    /// Does `exe` (a file name, or a path when it contains '/') name this process?
    pub fn exe_matches(&self, exe: &str) -> bool {
        if exe.contains('/') {
            return self.exe == exe;
        }
        // comm is cut to 15 bytes; compare it only when the executable is unreadable.
        self.name() == exe || (self.exe.is_empty() && exe.starts_with(&self.comm) && self.comm.len() == 15)
    }

    /// The uid and gid that own this process in the ptrace sense, if plain:
    /// real, effective and saved ids all equal, and dumpable. A setuid-ish
    /// process has no plain owner: only root may profile it or read its profiles.
    pub fn owner(&self) -> Option<(u32, u32)> {
        let [u, ..] = self.uids;
        let [g, ..] = self.gids;
        let plain = self.uids[..3].iter().all(|&x| x == u) && self.gids[..3].iter().all(|&x| x == g);
        (plain && self.proc_owner == u).then_some((u, g))
    }

    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// May a caller with these credentials profile this process (and read its
/// profiles)? root may do anything; anyone else only their own plain processes.
/// This is ptrace's rule without capabilities, minus Yama: simpler, and never
/// more permissive than what the caller could do with `witch dead --pid`.
pub fn may_access(caller_uid: u32, caller_gid: u32, owner: Option<(u32, u32)>) -> bool {
    caller_uid == 0 || owner == Some((caller_uid, caller_gid))
}

fn ids(status: &str, key: &str) -> Option<[u32; 4]> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let v: Vec<u32> = line[key.len()..].split_whitespace().filter_map(|x| x.parse().ok()).collect();
    v.try_into().ok()
}

/// Every pid in /proc (processes, not threads).
pub fn pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The cgroup paths of a process (one line per hierarchy; cgroup v2 has one).
pub fn cgroups(pid: i32) -> Vec<String> {
    parse_cgroups(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default())
}

fn parse_cgroups(s: &str) -> Vec<String> {
    s.lines().filter_map(|l| l.splitn(3, ':').nth(2)).map(str::to_string).collect()
}

/// Is `path` the cgroup `want` or below it?
pub fn cgroup_matches(paths: &[String], want: &str) -> bool {
    paths.iter().any(|p| want == "/" || p == want || (p.starts_with(want) && p.as_bytes().get(want.len()) == Some(&b'/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process() {
        let me = Proc::read(std::process::id() as i32).expect("own /proc entry");
        assert!(me.start_time > 0);
        assert!(!me.exe.is_empty());
        // SAFETY: getuid and getgid cannot fail and have no preconditions.
        let (u, g) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!(me.uids[0], u);
        assert_eq!(me.owner(), Some((u, g)));
        assert!(me.exe_matches(me.name()));
        assert!(me.exe_matches(&me.exe.clone()));
        assert!(!me.exe_matches("surely-not-this-name"));
        assert!(!me.is_zombie());
        assert!(pids().contains(&me.pid));
        assert!(!cgroups(me.pid).is_empty());
    }

    #[test]
    fn owners() {
        let mut p = Proc {
            pid: 1,
            start_time: 1,
            exe: "/bin/x".into(),
            comm: "x".into(),
            uids: [1000; 4],
            gids: [100; 4],
            proc_owner: 1000,
            state: 'S',
            image: Image::default(),
        };
        assert_eq!(p.owner(), Some((1000, 100)));
        assert!(may_access(1000, 100, p.owner()));
        assert!(!may_access(1001, 100, p.owner()));
        assert!(!may_access(1000, 101, p.owner()));
        assert!(may_access(0, 0, p.owner()));
        p.uids[1] = 0; // setuid root
        assert_eq!(p.owner(), None);
        assert!(!may_access(1000, 100, p.owner()));
        assert!(may_access(0, 0, None));
        p.uids[1] = 1000;
        p.proc_owner = 0; // not dumpable
        assert_eq!(p.owner(), None);
    }

    #[test]
    fn cgroup_paths() {
        let v1 = "12:pids:/user.slice\n0::/system.slice/nginx.service\n";
        let paths = parse_cgroups(v1);
        assert_eq!(paths, vec!["/user.slice", "/system.slice/nginx.service"]);
        assert!(cgroup_matches(&paths, "/system.slice"));
        assert!(cgroup_matches(&paths, "/system.slice/nginx.service"));
        assert!(!cgroup_matches(&paths, "/system.slice/nginx"));
        assert!(cgroup_matches(&paths, "/"));
    }
}
