//! `/proc`: the one parser of `/proc/PID/maps`, and a process's threads.

use std::io::Read;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    /// Offset in the mapped file.
    pub offset: u64,
    pub inode: u64,
    /// The file, or a pseudo name (`[stack]`, `[vdso]`, ...), or empty.
    pub path: String,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
    /// Backed by a file (not anonymous, not a `[pseudo]` mapping).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }
}

/// Parse one line: `start-end perms offset dev inode   path`. The path is
/// everything after the inode (it may contain spaces).
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || {
        rest = rest.trim_start();
        let end = rest.find(|c: char| c.is_ascii_whitespace()).unwrap_or(rest.len());
        let (f, r) = rest.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field().as_bytes();
    let offset = field();
    let _dev = field();
    let inode = field();
    let (s, e) = range.split_once('-')?;
    if perms.len() < 4 {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path: rest.trim_start().to_string(),
    })
}

/// Every mapping in a maps text, in order; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// Longest maps text read (a process with a million mappings is ~100 MB;
/// this bounds what a hostile or broken /proc entry can make us hold).
const MAX_MAPS_BYTES: u64 = 256 << 20;

/// The text of `/proc/PID/maps` (`pid` None: this process). Not for signal
/// handlers.
pub fn read_maps_text(pid: Option<i32>) -> std::io::Result<String> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/maps"),
        None => "/proc/self/maps".to_string(),
    };
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_MAPS_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

/// The mappings of process `pid` (None: this process).
pub fn read_maps(pid: Option<i32>) -> std::io::Result<Vec<Mapping>> {
    read_maps_text(pid).map(|t| parse_maps(&t))
}

/// The mapping of this process that contains `addr`.
pub fn own_mapping_containing(addr: u64) -> Option<Mapping> {
    read_maps(None).ok()?.into_iter().find(|m| m.contains(addr))
}

/// Thread ids of process `pid` (None: this process), from `/proc/PID/task`.
pub fn tasks(pid: Option<i32>) -> Vec<i32> {
    let dir = match pid {
        Some(p) => format!("/proc/{p}/task"),
        None => "/proc/self/task".to_string(),
    };
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect()
}

/// The seccomp mode of thread `tid` of process `pid` (None: the calling
/// thread), from its status: 0 none, 1 strict, 2 a filter. None if it
/// can't be read.
pub fn seccomp_mode(task: Option<(i32, i32)>) -> Option<u32> {
    let path = match task {
        Some((pid, tid)) => format!("/proc/{pid}/task/{tid}/status"),
        None => "/proc/thread-self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_spaces_pseudo_names_and_anonymous_mappings() {
        let maps = "00400000-00452000 r-xp 00001000 08:02 173521     /usr/bin/app with space\n\
                    00652000-00653000 rw-p 00052000 08:02 173521 /usr/bin/app (deleted)\n\
                    7ffd0000-7ffd2000 r-xp 00000000 00:00 0 [vdso]\n\
                    7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
                    garbage\n";
        let v = parse_maps(maps);
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].start, v[0].end, v[0].offset, v[0].path.as_str()), (0x400000, 0x452000, 0x1000, "/usr/bin/app with space"));
        assert!(v[0].read && v[0].exec && !v[0].write && v[0].is_file());
        assert_eq!(v[1].path, "/usr/bin/app (deleted)");
        assert!(v[1].write && !v[1].exec);
        assert_eq!(v[2].path, "[vdso]");
        assert!(!v[2].is_file());
        assert_eq!(v[3].path, "");
        assert!(v[3].contains(0x7f0000000fff) && !v[3].contains(0x7f0000001000));
    }

    #[test]
    fn this_process_maps_its_own_code_and_threads() {
        let here = this_process_maps_its_own_code_and_threads as *const () as u64;
        let m = own_mapping_containing(here).expect("the test's code is mapped");
        assert!(m.exec && m.is_file());
        // SAFETY: gettid takes no arguments and cannot fail.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        assert!(tasks(None).contains(&me));
    }
}
