//! Reading a file whose path came from a profile or a target.
//!
//! Whoever wrote the profile chose those paths (for witchd, the target's
//! owner does), so a read must not trust them: a FIFO blocks an open or a
//! read for ever, `/dev/zero` never ends, a file on a user's FUSE mount can
//! hang. Every such read therefore opens without blocking (`O_NONBLOCK`, so
//! a FIFO's open returns at once) and without taking a controlling terminal,
//! accepts only a regular file (checked on the open descriptor, so a path
//! swapped afterwards changes nothing), reads at most [`MAX_BYTES`], and gives
//! up after [`TIMEOUT`] (a hung file system leaves one helper thread behind,
//! blocked in the kernel, and the caller goes on without the file).

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The largest file read: larger debug files than this are not used.
pub const MAX_BYTES: u64 = 2 << 30;

/// How long one file may take to open and read.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The whole content of the regular file at `path`, within the limits above.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    read_within(path, MAX_BYTES, TIMEOUT)
}

pub fn read_within(path: &Path, max: u64, timeout: Duration) -> io::Result<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    std::thread::Builder::new().name("witch-read".into()).spawn(move || {
        let _ = tx.send(read_now(&p, max));
    })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("{} did not answer within {timeout:?}", path.display()))),
    }
}

fn read_now(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC).open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    if m.len() > max {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is larger than {max} bytes", path.display())));
    }
    let mut data = Vec::with_capacity(m.len() as usize);
    // A file that grows while it is read stops at the limit.
    f.take(max + 1).read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} grew beyond {max} bytes", path.display())));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn fifos_devices_and_large_files_are_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("witch-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        let e = read_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "a FIFO blocked for {:?}", t.elapsed());
        assert!(read_regular(Path::new("/dev/zero")).is_err());
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero-link")).unwrap();
        assert!(read_regular(&dir.join("zero-link")).unwrap_err().to_string().contains("not a regular file"));
        std::fs::write(dir.join("small"), b"hello").unwrap();
        assert_eq!(read_regular(&dir.join("small")).unwrap(), b"hello");
        assert!(read_within(&dir.join("small"), 4, TIMEOUT).is_err());
        assert!(read_regular(&dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
