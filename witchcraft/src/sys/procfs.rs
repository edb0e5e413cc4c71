//! `/proc`: the one parser of `/proc/PID/maps`, the one reader of status
//! files (`/proc/PID/status`: state, tracer, seccomp, signals), the one
//! parser of `/proc/PID/stat` (state, start time, image layout), and a
//! process's threads.

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
    /// The mapped file's name, the last part of its path (a file deleted
    /// since, " (deleted)" to its path, counts); None when no file.
    pub fn file_name(&self) -> Option<&str> {
        self.is_file().then(|| self.path.trim_end_matches(" (deleted)").rsplit('/').next()).flatten()
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

/// The layout of a process's program image: start and end of its code,
/// start of its stack, start and end of its data and start of its heap
/// (fields 26-28 and 45-47 of `/proc/PID/stat`; the kernel writes zeros
/// there for a reader that may not ptrace the process). An exec (the same
/// pid and start time, a new program) lays out a new image, at new,
/// randomized addresses, so a change of layout means an exec. With address
/// randomization off, a program that execs itself again may get the same
/// layout: then only what the old image held being gone (an agent's
/// mapping, a socket it held) tells.
///
/// In the middle of an exec the fields read as zeros, then some of them
/// only, until the kernel has laid out the new image (see
/// [`Image::laid_out`]): one read in 20 to one in 6 of a process that
/// execs itself back to back, here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Image(pub [u64; 6]);

impl Image {
    /// The image of process `pid` now; None when it is gone.
    pub fn of(pid: i32) -> Option<Image> {
        Stat::read(pid).map(|s| s.image)
    }

    /// Has process `pid` laid out another image than `before` (an exec)?
    /// False when it is gone, or when `before` is unknown.
    pub fn changed(pid: i32, before: Option<Image>) -> bool {
        before.is_some_and(|b| Image::of(pid).is_some_and(|now| b.replaced_by(now)))
    }

    /// Has the kernel laid the image out, every field set? Not in the
    /// middle of an exec, nor once the process is exiting, nor for a reader
    /// that may not ptrace it.
    pub fn laid_out(self) -> bool {
        self.0.iter().all(|&v| v != 0)
    }

    /// Is `now` another program's image than this one? Not when either
    /// reads as zeros: a process that is exiting has let its memory go (the
    /// kernel writes zeros) before it shows as a zombie, and a reader that
    /// may not ptrace the process reads zeros throughout.
    pub fn replaced_by(self, now: Image) -> bool {
        now != self && now != Image::default() && self != Image::default()
    }
}

/// The fields of `/proc/PID/stat` that witch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The state letter (R, S, D, T, t, Z, ...).
    pub state: char,
    /// Start time in clock ticks since boot: with the pid, the process's
    /// identity (pids are reused).
    pub start_time: u64,
    pub image: Image,
}

impl Stat {
    /// Reads `/proc/PID/stat`; None when the process is gone or the text is
    /// not what the kernel writes.
    pub fn read(pid: i32) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Reads `/proc/self/task/TID/stat`, thread `tid` of this process.
    pub fn read_own_task(tid: i32) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?)
    }

    /// Parses a stat line. The command name may hold spaces and
    /// parentheses, so fields are counted from the last ')'.
    pub fn parse(s: &str) -> Option<Stat> {
        let rest = &s[s.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Field 3 (index 0 here) is the state; field 22 the start time.
        let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let state = f.first()?.chars().next()?;
        let start_time = field(22)?;
        // Older kernels end before field 45: those fields are then left out.
        let image = Image([26, 27, 28, 45, 46, 47].map(|n| field(n).unwrap_or(0)));
        Some(Stat { state, start_time, image })
    }
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

/// Which `/proc` status file to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    /// `/proc/self/status`: this process (the state and tracer of its main
    /// thread).
    ThisProcess,
    /// `/proc/thread-self/status`: the calling thread.
    ThisThread,
    /// `/proc/ID/status`: process `id` (its main thread), or thread `id`
    /// of any process.
    Process(i32),
    /// `/proc/PID/task/TID/status`: thread `tid` of process `pid`.
    Task(i32, i32),
    /// `/proc/self/task/TID/status`: thread `tid` of this process.
    OwnTask(i32),
}

/// The fields of a `/proc/.../status` file that witch reads, parsed in one
/// pass. Each is the first whitespace-separated word of its line's value,
/// from the first line with its key; None where the line is missing or its
/// value is not what the kernel writes there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStatus {
    /// `State:`'s letter: `R` running, `S` sleeping, `T` stopped (SIGSTOP,
    /// job control), `t` stopped by its tracer, `Z` zombie, ...
    pub state: Option<u8>,
    /// `Tgid:`, the process (thread group) the thread belongs to.
    pub tgid: Option<i32>,
    /// `Uid:`'s first number, the real uid.
    pub uid: Option<u32>,
    /// `TracerPid:`, 0 when nothing traces the thread.
    pub tracer_pid: Option<i32>,
    /// `Seccomp:`, 0 none, 1 strict, 2 a filter.
    pub seccomp: Option<u32>,
    /// `SigPnd:`, the signals pending for the thread (bit `n - 1` is
    /// signal `n`; the kernel writes the mask in hex).
    pub pending: Option<u64>,
    /// `ShdPnd:`, the signals pending for the whole process.
    pub shared_pending: Option<u64>,
    /// `SigBlk:`, the signals the thread blocks.
    pub blocked: Option<u64>,
    /// `CapEff:`, the thread's effective capabilities (bit `n` is
    /// capability `n`; hex).
    pub cap_eff: Option<u64>,
}

/// The longest line kept whole while a status file is read; longer ones
/// (`Groups:` of a process in many groups, CPU lists of a large machine)
/// hold no field [`ProcStatus`] reads and are skipped.
const STATUS_LINE_MAX: usize = 256;

impl ProcStatus {
    /// Reads and parses one status file.
    ///
    /// It allocates nothing (the path and the text go through fixed buffers
    /// on the stack) and makes only the `openat`, `read` and `close` system
    /// calls, all async-signal-safe: it may run where the heap must not be
    /// touched (a fork child of a threaded program; a signal handler, which
    /// must keep `errno` itself) and under a seccomp filter that let the
    /// dynamic loader open and read a library.
    pub fn read(of: Of) -> std::io::Result<ProcStatus> {
        use std::io::Write;
        let mut path = [0u8; 64];
        let mut w = &mut path[..];
        // Formatting integers into a slice does not allocate; the zeroed
        // buffer keeps the path NUL-terminated (the longest is 41 bytes).
        match of {
            Of::ThisProcess => w.write_all(b"/proc/self/status"),
            Of::ThisThread => w.write_all(b"/proc/thread-self/status"),
            Of::Process(pid) => write!(w, "/proc/{pid}/status"),
            Of::Task(pid, tid) => write!(w, "/proc/{pid}/task/{tid}/status"),
            Of::OwnTask(tid) => write!(w, "/proc/self/task/{tid}/status"),
        }?;
        // SAFETY: `path` is NUL-terminated (written short of its end).
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut error = None;
        let status = ProcStatus::parse_from(|buf| loop {
            // SAFETY: `buf` is ours to write, `buf.len()` bytes long; `fd` is open.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Some(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                error = Some(e);
                return None;
            }
        });
        // SAFETY: our own descriptor, opened above and not used after.
        unsafe { libc::close(fd) };
        status.ok_or_else(|| error.unwrap_or_else(|| std::io::ErrorKind::Other.into()))
    }

    /// Parses a status file's text.
    pub fn parse(text: &str) -> ProcStatus {
        let mut rest = text.as_bytes();
        let status = ProcStatus::parse_from(|buf| {
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            Some(n)
        });
        status.unwrap_or_default()
    }

    /// Parses the text that `read` gives (the number of bytes it put in the
    /// buffer, 0 at the end, None on an error), line by line through a
    /// fixed buffer.
    fn parse_from(mut read: impl FnMut(&mut [u8]) -> Option<usize>) -> Option<ProcStatus> {
        let mut status = ProcStatus::default();
        let mut seen = 0u16;
        let mut buf = [0u8; STATUS_LINE_MAX];
        let mut len = 0;
        // Within a line too long for `buf`, dropped up to its end.
        let mut skipping = false;
        loop {
            let n = read(&mut buf[len..])?;
            len += n;
            let mut start = 0;
            while let Some(nl) = buf[start..len].iter().position(|&b| b == b'\n') {
                if !skipping {
                    status.take(&buf[start..start + nl], &mut seen);
                }
                skipping = false;
                start += nl + 1;
            }
            buf.copy_within(start..len, 0);
            len -= start;
            if n == 0 {
                if !skipping {
                    status.take(&buf[..len], &mut seen);
                }
                return Some(status);
            }
            if len == buf.len() {
                skipping = true;
                len = 0;
            }
        }
    }

    /// Takes the field on `line` (without its newline), unless a line with
    /// the same key came first (`seen` holds one bit a key).
    fn take(&mut self, line: &[u8], seen: &mut u16) {
        const KEYS: [&[u8]; 9] = [b"State", b"Tgid", b"Uid", b"TracerPid", b"Seccomp", b"SigPnd", b"ShdPnd", b"SigBlk", b"CapEff"];
        let Some(colon) = line.iter().position(|&b| b == b':') else { return };
        let Some(key) = KEYS.iter().position(|&k| k == &line[..colon]) else { return };
        if *seen & 1 << key != 0 {
            return;
        }
        *seen |= 1 << key;
        let value = line[colon + 1..].split(|b| b.is_ascii_whitespace()).find(|w| !w.is_empty()).unwrap_or(&[]);
        let text = std::str::from_utf8(value).ok();
        fn number<T: std::str::FromStr>(text: Option<&str>) -> Option<T> {
            text?.parse().ok()
        }
        let mask = text.and_then(|t| u64::from_str_radix(t, 16).ok());
        match key {
            0 => self.state = value.first().copied().filter(u8::is_ascii_alphabetic),
            1 => self.tgid = number(text),
            2 => self.uid = number(text),
            3 => self.tracer_pid = number(text),
            4 => self.seccomp = number(text),
            5 => self.pending = mask,
            6 => self.shared_pending = mask,
            7 => self.blocked = mask,
            _ => self.cap_eff = mask,
        }
    }

    /// Stopped by a signal (SIGSTOP, job control), not by a tracer.
    pub fn stopped(&self) -> bool {
        self.state == Some(b'T')
    }

    pub fn zombie(&self) -> bool {
        self.state == Some(b'Z')
    }

    /// The pid of the thread's tracer, if one traces it.
    pub fn tracer(&self) -> Option<i32> {
        self.tracer_pid.filter(|&t| t > 0)
    }

    /// Runs under seccomp, strict or with a filter.
    pub fn sandboxed(&self) -> bool {
        self.seccomp.is_some_and(|m| m != 0)
    }
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
    fn stat_lines_with_odd_names_and_image_fields() {
        let s = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 1000 50";
        assert_eq!(Stat::parse(s), Some(Stat { state: 'S', start_time: 987654, image: Image::default() }));
        assert_eq!(Stat::parse("garbage"), None);
        // A whole line of this kernel's (6.x): 52 fields.
        let s = "4242 (daemon exec) S 1 4242 4242 0 -1 4194304 120 0 0 0 3 1 0 0 20 0 2 0 5170 10600448 400 \
                 18446744073709551615 94649360064512 94649360066033 140725711531632 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 \
                 94649360076224 94649360076912 94649363132416 140725711536930 140725711536946 140725711536946 140725711540211 0";
        let st = Stat::parse(s).unwrap();
        assert_eq!((st.state, st.start_time), ('S', 5170));
        assert_eq!(st.image.0, [94649360064512, 94649360066033, 140725711531632, 94649360076224, 94649360076912, 94649363132416]);
    }

    #[test]
    fn this_process_has_an_image_and_maps_its_test_binary() {
        let pid = std::process::id() as i32;
        let image = Image::of(pid).expect("this process's stat is readable");
        assert_ne!(image, Image::default());
        assert!(!Image::changed(pid, Some(image)) && !Image::changed(pid, None));
        assert!(Image::changed(pid, Some(Image([1; 6]))));
        assert!(Image([1; 6]).replaced_by(Image([2; 6])) && !Image([1; 6]).replaced_by(Image([1; 6])));
        assert!(!Image([1; 6]).replaced_by(Image::default()), "an exiting process is no new image");
        assert!(!Image::default().replaced_by(Image([1; 6])), "a layout unknown before is no old image");
        assert!(!Image::changed(-1, Some(Image([1; 6]))), "a process that is gone did not exec");
        assert!(image.laid_out() && Image([1; 6]).laid_out());
        assert!(!Image::default().laid_out() && !Image([0, 0, 1, 0, 0, 0]).laid_out() && !Image([0, 0, 1, 1, 1, 1]).laid_out());
        let named = |path: &str| Mapping { path: path.into(), ..parse_line("0-1 r--p 0 0:0 0").unwrap() }.file_name().map(String::from);
        assert_eq!(named("/usr/lib/libwitch_agent.so (deleted)").as_deref(), Some("libwitch_agent.so"));
        assert_eq!(named("/bin/app with space").as_deref(), Some("app with space"));
        assert_eq!((named("[vdso]"), named("")), (None, None));
    }

    /// The head of a real status file (Linux 6.x), fields witch does not
    /// read cut short.
    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tT (stopped)\nTgid:\t4242\nNgid:\t0\nPid:\t4243\nPPid:\t1\n\
                          TracerPid:\t977\nUid:\t1000\t1001\t1002\t1003\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t64\n\
                          Groups:\t4 24 27\nVmRSS:\t    1024 kB\nSigQ:\t0/63336\nSigPnd:\t0000000000000400\n\
                          ShdPnd:\t0000000000004000\nSigBlk:\tfffffffe7ffbfeff\nCapEff:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n\
                          Seccomp_filters:\t1\nSpeculation_Store_Bypass:\tthread vulnerable\nCpus_allowed_list:\t0-1\n";

    #[test]
    fn status_fields_parse_from_a_real_status_text() {
        let s = ProcStatus::parse(STATUS);
        let want = ProcStatus {
            state: Some(b'T'),
            tgid: Some(4242),
            uid: Some(1000),
            tracer_pid: Some(977),
            seccomp: Some(2),
            pending: Some(1 << (libc::SIGSEGV - 1)),
            shared_pending: Some(1 << (libc::SIGTERM - 1)),
            blocked: Some(0xfffffffe7ffbfeff),
            cap_eff: Some(0x1ffffffffff),
        };
        assert_eq!(s, want);
        assert!(s.stopped() && !s.zombie() && s.sandboxed());
        assert_eq!(s.tracer(), Some(977));
        let running = ProcStatus::parse("State:\tR (running)\nTracerPid:\t0\nSeccomp:\t0\n");
        assert!(!running.stopped() && !running.sandboxed());
        assert_eq!(running.tracer(), None);
        // Stopped by its tracer is not stopped by a signal.
        assert!(!ProcStatus::parse("State:\tt (tracing stop)\n").stopped());
        assert!(ProcStatus::parse("State:\tZ (zombie)\n").zombie());
    }

    #[test]
    fn status_fields_that_are_missing_or_garbage_are_none() {
        assert_eq!(ProcStatus::parse(""), ProcStatus::default());
        assert_eq!(ProcStatus::parse("Name:\tx\nPid:\t1\n"), ProcStatus::default());
        // A kernel without seccomp writes no Seccomp line.
        let s = ProcStatus::parse("State:\tS (sleeping)\nTgid:\t7\nUid:\t0\t0\t0\t0\nTracerPid:\t0\n");
        assert_eq!((s.state, s.tgid, s.uid, s.tracer_pid, s.seccomp), (Some(b'S'), Some(7), Some(0), Some(0), None));
        let garbage = "State:\t\nTgid:\tseven\nUid:\t-1\nTracerPid:\t12x\nSeccomp:  \nSigPnd:\t0x1\nShdPnd:\tg\n\
                       SigBlk:\t1ffffffffffffffff\n:\nno colon\nState\n\0\u{fffd}:\n";
        assert_eq!(ProcStatus::parse(garbage), ProcStatus::default());
        assert_eq!(ProcStatus::parse("State:\t? (what)\n").state, None);
        // Out of range for its type.
        assert_eq!(ProcStatus::parse("Tgid:\t99999999999\nSeccomp:\t4294967296\n"), ProcStatus::default());
        // A negative tracer is no tracer; the first of repeated keys counts,
        // garbage or not; a key must match whole; the last line needs no newline.
        let s = ProcStatus::parse("TracerPid:\t-3\nSeccomp:\tx\nSeccomp:\t2\nSeccomp_filters:\t1\nState:\tR\nTgid:\t5");
        assert_eq!((s.tracer(), s.seccomp, s.state, s.tgid), (None, None, Some(b'R'), Some(5)));
        // Not UTF-8: the line is garbage, the others count.
        let mut bytes = b"Tgid:\t\xff1\nUid:\t3\n".to_vec();
        let s = ProcStatus::parse_from(|buf| {
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            bytes.drain(..n);
            Some(n)
        });
        assert_eq!(s.map(|s| (s.tgid, s.uid)), Some((None, Some(3))));
        // A read error is no status.
        assert_eq!(ProcStatus::parse_from(|_| None), None);
    }

    /// Feeds `text` `chunk` bytes a read.
    fn parse_in_chunks(text: &str, chunk: usize) -> Option<ProcStatus> {
        let mut rest = text.as_bytes();
        ProcStatus::parse_from(|buf| {
            let n = rest.len().min(buf.len()).min(chunk);
            buf[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            Some(n)
        })
    }

    #[test]
    fn status_lines_longer_than_the_buffer_are_skipped_in_reads_of_any_size() {
        // A process in thousands of groups: its Groups line is 60 KB long.
        let groups: String = (0..10_000).map(|g| format!("{g} ")).collect();
        let long = STATUS.replace("Groups:\t4 24 27", &format!("Groups:\t{groups}"));
        // The longest line kept (its newline fills the buffer) and the
        // shortest skipped, which must not be read as its key's value.
        let longest = format!("Tgid:{}31", " ".repeat(STATUS_LINE_MAX - 8));
        let skipped = format!("Uid:{}5", " ".repeat(STATUS_LINE_MAX - 5));
        assert_eq!((longest.len() + 1, skipped.len()), (STATUS_LINE_MAX, STATUS_LINE_MAX));
        // Its tail, past what the buffer held, is no line of its own.
        let tail = format!("Name:\t{}Seccomp:\t1", "x".repeat(STATUS_LINE_MAX - 6));
        let edges = format!("{longest}\n{skipped}\n{tail}\nState:\tR\n{skipped}");
        for chunk in [1, 2, 7, 255, 256, 257, 4096, usize::MAX] {
            assert_eq!(parse_in_chunks(STATUS, chunk), Some(ProcStatus::parse(STATUS)), "chunk {chunk}");
            assert_eq!(parse_in_chunks(&long, chunk), Some(ProcStatus::parse(STATUS)), "chunk {chunk}");
            let s = parse_in_chunks(&edges, chunk).unwrap();
            assert_eq!((s.tgid, s.uid, s.seccomp, s.state), (Some(31), None, None, Some(b'R')), "chunk {chunk}");
        }
    }

    /// Counts this thread's allocations (the test binary's allocator).
    struct Counting;
    thread_local! {
        static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    // SAFETY: forwards to the system allocator; the count is a plain
    // thread-local cell with no destructor.
    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
            std::alloc::System.alloc(l)
        }
        unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
            std::alloc::System.dealloc(p, l)
        }
    }
    #[global_allocator]
    static COUNTING: Counting = Counting;

    #[test]
    fn status_files_of_this_process_read_without_allocating() {
        let pid = std::process::id() as i32;
        // SAFETY: gettid takes no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        // The process's files say its main thread's state, which may be
        // waiting for the tests; this thread's say it runs.
        let process = [Of::ThisProcess, Of::Process(pid)];
        let thread = [Of::ThisThread, Of::Task(pid, tid), Of::Process(tid), Of::OwnTask(tid)];
        let before = ALLOCATIONS.with(|a| a.get());
        let process = process.map(|of| ProcStatus::read(of).expect("this process's status is readable"));
        let thread = thread.map(|of| ProcStatus::read(of).expect("this thread's status is readable"));
        let gone = [Of::Process(-1), Of::Process(i32::MAX), Of::Task(pid, i32::MAX)].map(|of| ProcStatus::read(of).map_err(|e| e.kind()));
        let allocated = ALLOCATIONS.with(|a| a.get()) - before;
        assert_eq!(allocated, 0, "reading status files allocated");
        for s in process.into_iter().chain(thread) {
            assert_eq!(s.tgid, Some(pid));
            assert!(s.state.is_some() && s.uid.is_some() && s.tracer_pid.is_some() && s.blocked.is_some());
        }
        assert_eq!(thread.map(|s| s.state), [Some(b'R'); 4]);
        assert_eq!(gone, [Err(std::io::ErrorKind::NotFound); 3]);
        // The reader and `std`'s agree on the thread's seccomp mode.
        let text = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert_eq!(ProcStatus::read(Of::ThisThread).unwrap().seccomp, ProcStatus::parse(&text).seccomp);
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
