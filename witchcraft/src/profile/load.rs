//! Reading a profile file, capped in size and refused at the first byte
//! that is not JSON text, and checked ([`LoadError`]); writing one
//! atomically.

use super::{Profile, SCHEMA};
use serde::Deserialize;
use std::io::Write;
use std::path::Path;

/// The largest profile file [`Profile::load`] reads (a process's profile
/// is at most 256 MiB; a run's file merges its processes').
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why [`read_capped`] stopped.
#[derive(Debug)]
pub enum Capped {
    Io(std::io::Error),
    /// `check` refused the first bytes.
    Refused(String),
    /// More than the limit.
    TooLarge,
}

/// Everything `r` gives, up to `max` bytes; `check` sees the first bytes
/// (up to 4 KiB, or all of a shorter input) before the rest is read, so
/// an endless stream of the wrong kind fails at once.
pub fn read_capped(r: impl std::io::Read, max: u64, check: impl Fn(&[u8]) -> Result<(), String>) -> Result<Vec<u8>, Capped> {
    use std::io::Read;
    let mut r = r.take(max + 1);
    let mut data = vec![0u8; 4096];
    let mut got = 0;
    while got < data.len() {
        match r.read(&mut data[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Capped::Io(e)),
        }
    }
    data.truncate(got);
    check(&data).map_err(Capped::Refused)?;
    r.read_to_end(&mut data).map_err(Capped::Io)?;
    if data.len() as u64 > max {
        return Err(Capped::TooLarge);
    }
    Ok(data)
}

/// A reader that fails (`InvalidData`) at the first byte JSON text never
/// holds: a control character other than tab, newline and carriage
/// return (serde escapes them in strings). Random bytes fail within the
/// first few dozen, so a file of garbage that happens to begin with `{` is
/// refused at once, not read to the size limit.
struct TextOnly<R> {
    inner: R,
    offset: u64,
}

impl<R: std::io::Read> std::io::Read for TextOnly<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(i) = buf[..n].iter().position(|&c| c < 0x20 && !matches!(c, b'\t' | b'\n' | b'\r')) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("byte 0x{:02x} at offset {}: binary data, not JSON text", buf[i], self.offset + i as u64),
            ));
        }
        self.offset += n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
pub enum LoadError {
    Io(std::io::Error),
    Empty,
    Corrupt(String),
    /// Not a profile at all (binary data, an endless stream, too large).
    NotProfile(String),
    Newer(u32),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io(e) => write!(f, "cannot read profile: {e}"),
            LoadError::Empty => write!(f, "profile is empty"),
            LoadError::Corrupt(e) => write!(f, "profile is corrupt or truncated: {e}"),
            LoadError::NotProfile(e) => write!(f, "not a witch profile: {e}"),
            LoadError::Newer(v) => write!(f, "profile schema {v} is newer than this witch understands ({SCHEMA}); upgrade witch"),
        }
    }
}
impl std::error::Error for LoadError {}

impl Profile {
    pub fn from_bytes(b: &[u8]) -> Result<Profile, LoadError> {
        if b.iter().all(|c| c.is_ascii_whitespace()) {
            return Err(LoadError::Empty);
        }
        // Read the schema first so a newer file says so instead of "corrupt".
        #[derive(Deserialize)]
        struct Head {
            schema: u32,
        }
        let head: Head = serde_json::from_slice(b).map_err(|e| LoadError::Corrupt(e.to_string()))?;
        if head.schema > SCHEMA {
            return Err(LoadError::Newer(head.schema));
        }
        let p: Profile = serde_json::from_slice(b).map_err(|e| LoadError::Corrupt(e.to_string()))?;
        if p.processes.iter().any(|c| !c.processes.is_empty()) {
            return Err(LoadError::Corrupt("a process section holds processes of its own".into()));
        }
        for t in p.all().flat_map(|q| &q.threads) {
            let n = t.nodes.len() as u32;
            let pairs = || t.pairs.iter().chain(t.objects.iter().map(|o| &o.pair));
            if t.nodes.iter().any(|x| x.parent >= n) || pairs().any(|x| x.watch >= n || x.trap >= n) {
                return Err(LoadError::Corrupt(format!("thread {}: node index out of range", t.tid)));
            }
            // Amounts are sums of credits: never negative, never NaN or infinite.
            let bad = |v: f64| !(v.is_finite() && v >= 0.0);
            if let Some(x) = pairs().find(|x| {
                [x.waste, x.approx_waste, x.r#use, x.waste_sq, x.approx_waste_sq, x.use_sq].into_iter().any(bad) || !x.cluster.finite()
            }) {
                return Err(LoadError::Corrupt(format!("thread {}: a pair with waste {} and use {}", t.tid, x.waste, x.r#use)));
            }
            if !t.clusters.finite() {
                return Err(LoadError::Corrupt(format!("thread {}: cluster sums not finite and non-negative", t.tid)));
            }
        }
        Ok(p)
    }

    /// Read and check a profile. Any path may be given (a pipe from
    /// `<(...)` too), so the read is bounded: a file that does not start
    /// like JSON (`/dev/zero`, a binary) is refused at its first bytes, and
    /// one larger than [`MAX_FILE_BYTES`] at that size.
    pub fn load(path: &Path) -> Result<Profile, LoadError> {
        Self::read_from(std::fs::File::open(path).map_err(LoadError::Io)?)
    }

    /// [`Profile::load`] from a file already open (the caller chose how to
    /// open it: without blocking on a FIFO, say).
    pub fn read_from(f: impl std::io::Read) -> Result<Profile, LoadError> {
        let b =
            read_capped(TextOnly { inner: f, offset: 0 }, MAX_FILE_BYTES, |head| match head.iter().find(|c| !c.is_ascii_whitespace()) {
                Some(b'{') | None => Ok(()),
                Some(c) => Err(format!("it starts with byte 0x{c:02x}, not a JSON object")),
            })
            .map_err(|e| match e {
                Capped::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => LoadError::NotProfile(e.to_string()),
                Capped::Io(e) => LoadError::Io(e),
                Capped::Refused(why) => LoadError::NotProfile(why),
                Capped::TooLarge => LoadError::NotProfile(format!("larger than {} MiB", MAX_FILE_BYTES >> 20)),
            })?;
        Self::from_bytes(&b)
    }

    /// Write atomically: a temporary file in the same directory, then rename.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp)?;
            let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
            f.write_all(&data)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }
}
