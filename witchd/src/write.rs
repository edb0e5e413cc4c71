//! The one writer of files: what witch and witchd create, as root too.
//!
//! witch writes where it is told (`-o`, `--flamegraph`, `--junit`, ...),
//! and that is often a directory others may write to (`/tmp`). There, any
//! name witch makes up beside the file asked for (a temporary file, a
//! probe) may already be taken by another user's link, FIFO or file. So
//! every file is made relative to one descriptor of its directory, opened
//! once ([`Dir`]), and every name witch makes up is created exclusively and
//! without following a link (`O_CREAT|O_EXCL|O_NOFOLLOW`, with a random part
//! in the name, or with no name at all: `O_TMPFILE`). A file is written
//! whole under such a name, flushed to disk, then renamed over the name
//! asked for (`renameat`, which replaces a link rather than following it),
//! so a reader sees the old file or the new one, never a part, and a
//! failure (a full disk) leaves no empty or partial file behind.
//!
//! The name asked for is written in place only when it is a device or FIFO
//! (`-o /dev/null`, `-o /dev/stdout`), opened with `O_NOCTTY` and checked
//! afterwards to be the very file looked at. In a sticky directory anyone
//! may write to, the kernel's rule for links (`fs.protected_symlinks`) is
//! applied whatever the sysctl says, and to FIFOs and devices too: one that
//! neither witch's user nor the directory's owner owns is not followed or
//! written into, but replaced like a regular file.

use anyhow::{anyhow, bail, Result};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Tries at a random temporary name before giving up (each taken name
/// was planted, or left by a crash).
const NAME_TRIES: usize = 16;

fn io(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// A directory, opened once (`O_PATH`): every file witch makes in it is
/// made relative to this descriptor, so the directory cannot be swapped
/// under it between two steps.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens `path` (following links in it: the path is the caller's choice).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let path = if path.as_os_str().is_empty() { Path::new(".") } else { path };
        let fd = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(io)?;
        Ok(Dir { fd, path: path.to_path_buf() })
    }

    /// The uid owning the directory.
    pub fn owner(&self) -> io::Result<u32> {
        Ok(fstat(&self.fd).map_err(io)?.st_uid)
    }

    /// The path it was opened by, for messages and for children's paths.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside this directory, as a path (for messages, and for a
    /// process that is told where to write).
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Proves the directory writable by making a file in it and removing
    /// it: an unnamed one (`O_TMPFILE`), or, on a file system without
    /// those, an exclusively created name removed at once.
    pub fn probe(&self) -> io::Result<()> {
        match openat(&self.fd, ".", OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o600)) {
            Ok(_) => Ok(()),
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                let (name, _) = self.temporary("witch-probe", 0o600)?;
                self.remove(&name)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// A new file under a name made up here, `.STEM.witch-PID-RANDOM.tmp`,
    /// created exclusively and without following a link.
    fn temporary(&self, stem: &str, mode: u32) -> io::Result<(OsString, File)> {
        use rand::RngExt;
        let mut last = Errno::EEXIST;
        for _ in 0..NAME_TRIES {
            let name = format!(".{stem}.witch-{}-{:08x}.tmp", std::process::id(), rand::rng().random::<u32>());
            let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
            match openat(&self.fd, name.as_str(), flags, Mode::from_bits_truncate(mode)) {
                Ok(fd) => return Ok((name.into(), File::from(fd))),
                Err(Errno::EEXIST) => last = Errno::EEXIST,
                Err(e) => return Err(io(e)),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{NAME_TRIES} temporary names in a row were taken ({})", io(last))))
    }

    /// Removes `name` (a link itself, never what it points at).
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir).map_err(io)
    }

    /// Makes the directory `name`, which must not exist yet (a link of that
    /// name is not followed: it is an error, `AlreadyExists`).
    pub fn make_dir(&self, name: &OsStr, mode: u32) -> io::Result<Dir> {
        mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)).map_err(io)?;
        let fd =
            openat(&self.fd, name, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()).map_err(io)?;
        Ok(Dir { fd, path: self.path.join(name) })
    }

    /// Opens `name` to read, refusing a link.
    pub fn open_read(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        Ok(File::from(openat(&self.fd, name, flags, Mode::empty()).map_err(io)?))
    }

    /// What `name` is, without following a link; None if there is nothing.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<FileStat>> {
        match fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(s) => Ok(Some(s)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    /// Writes `name` whole, atomically: `write` fills a new temporary file,
    /// which is flushed to disk and renamed over `name`. Whatever fails, the
    /// temporary file is removed and `name` is as it was.
    pub fn replace(&self, name: &OsStr, mode: u32, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
        let stem = String::from_utf8_lossy(name.as_bytes()).chars().take(64).collect::<String>();
        let (tmp, f) = self.temporary(&stem, mode)?;
        let r = (|| -> Result<()> {
            let mut w = io::BufWriter::with_capacity(1 << 16, f);
            write(&mut w)?;
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            renameat(&self.fd, tmp.as_os_str(), &self.fd, name).map_err(io)?;
            Ok(())
        })();
        if r.is_err() {
            let _ = self.remove(&tmp);
        }
        r
    }

    /// May witch follow, or write into, a link, FIFO or device owned by
    /// `owner` here? The kernel's rule for links in sticky directories
    /// (`fs.protected_symlinks`): yes, unless the directory is sticky and
    /// writable by all, and the file is neither witch's user's nor the
    /// directory owner's.
    fn trusted(&self, owner: u32) -> io::Result<bool> {
        let d = fstat(&self.fd).map_err(io)?;
        let open_to_all = d.st_mode & libc::S_ISVTX != 0 && d.st_mode & 0o002 != 0;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        Ok(!open_to_all || owner == me || owner == d.st_uid)
    }

    /// `name`, if it is to be written in place: a device or FIFO (itself or
    /// through a trusted link), opened for writing and checked to be the
    /// file that was looked at. None: write it atomically ([`Dir::replace`]).
    fn in_place(&self, name: &OsStr) -> io::Result<Option<File>> {
        let is = |s: &FileStat, t: SFlag| SFlag::from_bits_truncate(s.st_mode & libc::S_IFMT) == t;
        let Some(here) = self.stat(name)? else { return Ok(None) };
        let (target, follow) = if is(&here, SFlag::S_IFLNK) {
            if !self.trusted(here.st_uid)? {
                return Ok(None);
            }
            match fstatat(&self.fd, name, nix::fcntl::AtFlags::empty()) {
                Ok(t) => (t, true),
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(io(e)),
            }
        } else {
            (here, false)
        };
        if is(&target, SFlag::S_IFREG) {
            return Ok(None);
        }
        if is(&target, SFlag::S_IFDIR) {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"));
        }
        if !follow && !self.trusted(target.st_uid)? {
            return Ok(None);
        }
        let mut flags = OFlag::O_WRONLY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        if !follow {
            flags |= OFlag::O_NOFOLLOW;
        }
        let f = File::from(openat(&self.fd, name, flags, Mode::empty()).map_err(io)?);
        let now = fstat(f.as_fd()).map_err(io)?;
        if (now.st_dev, now.st_ino) != (target.st_dev, target.st_ino) {
            return Err(io::Error::other("it was replaced while witch opened it"));
        }
        Ok(Some(f))
    }

    /// Writes `name` as asked for by a user: in place if it is a device or
    /// FIFO (see [`Dir::in_place`]), else atomically with `mode` (less the
    /// umask).
    pub fn write(&self, name: &OsStr, mode: u32, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
        match self.in_place(name)? {
            Some(f) => {
                let mut w = io::BufWriter::with_capacity(1 << 16, f);
                write(&mut w)?;
                w.flush()?;
                Ok(())
            }
            None => self.replace(name, mode, write),
        }
    }
}

/// The directory and file name of a path given for a file; an error for a
/// path that names a directory (`out/`, `.`, `..`, `/`).
pub fn split(path: &Path) -> Result<(&Path, &OsStr)> {
    let bytes = path.as_os_str().as_bytes();
    let name = match path.file_name() {
        Some(n) if !bytes.ends_with(b"/") && !bytes.ends_with(b"/.") && bytes != b"." => n,
        _ => bail!("{}: names a directory; give a file name", path.display()),
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok((dir, name))
}

/// Writes the file at `path` for a user (see [`Dir::write`]): the error
/// names the path and says what failed, and nothing is left behind.
pub fn file(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let (dir, name) = split(path)?;
    let d = Dir::open(dir).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    d.write(name, 0o666, write).map_err(|e| anyhow!("cannot write {}: {e:#}", path.display()))
}

/// [`file`] with bytes.
pub fn bytes(path: &Path, data: &[u8]) -> Result<()> {
    file(path, |w| Ok(w.write_all(data)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("witch-write-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// A write that fails leaves the old file as it was and no temporary
    /// file; one that works replaces it whole.
    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        let d = scratch("fail");
        let f = d.join("out.json");
        std::fs::write(&f, "old").unwrap();
        let e = file(&f, |w| {
            w.write_all(b"half")?;
            bail!("no room")
        })
        .unwrap_err();
        assert_eq!(format!("{e:#}"), format!("cannot write {}: no room", f.display()));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "old");
        assert_eq!(names(&d), ["out.json"]);
        bytes(&f, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new");
        assert_eq!(names(&d), ["out.json"]);
        for bad in ["out/", "out/.", ".", "/"] {
            assert!(split(Path::new(bad)).is_err(), "{bad}");
        }
        Dir::open(&d).unwrap().probe().unwrap();
        assert_eq!(names(&d), ["out.json"], "the probe left nothing");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A device, or a link to one that witch's user made, is written in
    /// place (`-o /dev/null`, `-o /dev/stdout`), never replaced.
    #[test]
    fn devices_are_written_in_place() {
        let d = scratch("device");
        bytes(Path::new("/dev/null"), b"x").unwrap();
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        let link = d.join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        bytes(&link, b"x").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "our own link to a device is followed");
        let e = bytes(Path::new("/dev/full"), b"x").unwrap_err();
        assert!(format!("{e:#}").starts_with("cannot write /dev/full: "), "{e:#}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// In a sticky directory anyone may write to, another user's link,
    /// FIFO or device is replaced, never followed or written into (nor a
    /// FIFO waited on), whatever `fs.protected_symlinks` says.
    #[test]
    fn others_links_and_fifos_in_a_shared_directory_are_replaced() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: cannot make files another user owns; skipping");
            return;
        }
        let d = scratch("shared");
        let secret = d.join("secret");
        std::fs::write(&secret, "root's").unwrap();
        let shared = d.join("tmp");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let link = shared.join("link.json");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let fifo = shared.join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        std::os::unix::fs::lchown(&fifo, Some(65534), Some(65534)).unwrap();
        for p in [&link, &fifo] {
            bytes(p, b"profile").unwrap();
            let m = std::fs::symlink_metadata(p).unwrap();
            assert!(m.file_type().is_file(), "{}: {:?}", p.display(), m.file_type());
            assert_eq!(std::fs::read_to_string(p).unwrap(), "profile");
        }
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's");
        // Our own FIFO there is ours to write to: in place (a reader is waiting).
        let mine = shared.join("mine.fifo");
        let c = std::ffi::CString::new(mine.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let m2 = mine.clone();
        let reader = std::thread::spawn(move || std::fs::read_to_string(&m2).unwrap());
        bytes(&mine, b"through").unwrap();
        assert_eq!(reader.join().unwrap(), "through");
        assert!(std::fs::symlink_metadata(&mine).unwrap().file_type().is_fifo());
        let _ = std::fs::remove_dir_all(&d);
    }
}
