//! Where a run's profile goes: checked before the program runs, written
//! once at the end, and never lost on the way.
//!
//! The agent in each process of the run writes its part (one profile per
//! process and exec'd image) into a directory made beside the output file
//! before the program starts, which also proves that directory writable. At
//! the end the parts become one profile; if that cannot be written, or witch
//! is killed first, the parts stay there with a README saying how to read
//! them (`witch report DIR`).

use crate::symbolize::file;
use crate::write;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use witchcraft::profile::{Craft, Profile};

/// The profile's destination, as asked for with `-o` or by default.
pub struct Output {
    asked: Option<PathBuf>,
    /// Where the parts go, opened once: beside the profile, or, for a device
    /// or FIFO (`-o /dev/null`), the temporary directory.
    dir: write::Dir,
    /// `asked` is a device or FIFO, written in place.
    special: bool,
}

const README: &str = "This directory holds the profiles of a run of witch that did not finish
gathering them: witch was stopped, or could not write the profile it was
asked for. Each file is one process of the run. Read them with

    witch report THIS_DIRECTORY

or gather them into one profile file with

    witch report THIS_DIRECTORY --save FILE.json
";

impl Output {
    /// Checks, before anything runs, that a profile can go where asked: a
    /// file name (not `out/`, not a directory), in a directory that exists
    /// (or onto a device or FIFO, such as `/dev/null`, written in place; the
    /// parts then wait in the temporary directory, since nobody may write in
    /// `/dev`).
    pub fn check(asked: Option<&Path>) -> Result<Output> {
        if let Some(p) = asked {
            if write::split(p).is_err() || p.is_dir() {
                bail!("-o {}: is a directory; give the profile a file name", p.display());
            }
        }
        let special = asked.and_then(|p| std::fs::metadata(p).ok()).is_some_and(|m| !m.is_file() && !m.is_dir());
        let dir = match asked.map(write::split) {
            _ if special => std::env::temp_dir(),
            Some(Ok((d, _))) => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("cannot write the profile in {}: not a directory", dir.display()),
            Err(e) => bail!("cannot write the profile in {}: {e}", dir.display()),
        }
        let dir = write::Dir::open(&dir).map_err(|e| anyhow::anyhow!("cannot write the profile in {}: {e}", dir.display()))?;
        Ok(Output { asked: asked.map(Path::to_path_buf), dir, special })
    }

    /// The profile's path: `-o`, or `witch-CRAFT-PROGRAM-PID.json` here.
    pub fn path(&self, craft: Craft, prog: &Path, pid: u32) -> PathBuf {
        self.asked.clone().unwrap_or_else(|| default_name(craft, prog, pid))
    }

    /// Proves the directory writable by making a file in it that no one
    /// else can have named (see [`write::Dir::probe`]); a device or FIFO:
    /// that it may be written.
    pub fn probe(&self) -> Result<()> {
        if let (true, Some(p)) = (self.special, &self.asked) {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| anyhow::anyhow!("-o {}: a NUL in the name", p.display()))?;
            // SAFETY: a NUL-terminated path; access only checks.
            if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
                bail!("cannot write the profile to {}: {}", p.display(), std::io::Error::last_os_error());
            }
            return Ok(());
        }
        self.dir.probe().map_err(|e| anyhow::anyhow!("cannot write the profile in {}: {e}", self.dir.path().display()))
    }

    /// Makes the directory this run's parts go to, beside the profile
    /// (exclusively: a name taken, by a link too, is passed over).
    pub fn parts(&self) -> Result<Parts> {
        let mut k = 0;
        loop {
            let name = match k {
                0 => format!("witch-parts-{}", std::process::id()),
                _ => format!("witch-parts-{}-{k}", std::process::id()),
            };
            match self.dir.make_dir(name.as_ref(), 0o700) {
                Ok(d) => {
                    let readme = README.replace("THIS_DIRECTORY", &d.path().display().to_string());
                    if let Err(e) = d.replace("README".as_ref(), 0o644, |w| Ok(w.write_all(readme.as_bytes())?)) {
                        // A full disk: refused before the run, leaving nothing behind.
                        let _ = std::fs::remove_dir_all(d.path());
                        bail!("cannot write the profile in {}: {e:#}", self.dir.path().display());
                    }
                    // Absolute: the processes are told to write here, and
                    // one may change its directory before it starts (`cd
                    // sub && ./app`); a relative path would put its part
                    // there, lost to the run and left behind.
                    let dir = std::path::absolute(d.path()).unwrap_or_else(|_| d.path().to_path_buf());
                    return Ok(Parts { dir });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && k < 100 => k += 1,
                Err(e) => bail!("cannot write the profile in {}: {e}", self.dir.path().display()),
            }
        }
    }

    /// Writes the run's profile to `path` ([`Output::path`]): in the
    /// directory opened at [`Output::check`], as [`save`] does.
    pub fn save(&self, p: &Profile, path: &Path) -> Result<()> {
        let name = match write::split(path) {
            Ok((_, name)) if !self.special => name,
            _ => return save(p, path),
        };
        self.dir
            .write(name, 0o666, |w| Ok(serde_json::to_writer(w, p)?))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e:#}", path.display()))
    }
}

pub fn default_name(craft: Craft, prog: &Path, pid: u32) -> PathBuf {
    let name = prog.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "program".into());
    PathBuf::from(format!("witch-{}-{}-{}.json", craft.name(), name, pid))
}

/// The directory the agents write a run's parts into.
pub struct Parts {
    pub dir: PathBuf,
}

impl Parts {
    /// The parts written so far, by start time.
    pub fn collect(&self) -> Vec<Profile> {
        read_parts(&self.dir)
    }

    /// The run has ended: the directory moves to a name of its own
    /// (`...-ended`), so that a process of the run that starts from now on
    /// (a background job outliving the program) finds no directory and
    /// writes nothing, rather than add a part after the parts were read
    /// (or after the directory went, making it again). Where it cannot be
    /// moved, it stays.
    pub fn close(self) -> Parts {
        let mut ended = self.dir.clone().into_os_string();
        ended.push("-ended");
        let ended = PathBuf::from(ended);
        match std::fs::rename(&self.dir, &ended) {
            Ok(()) => Parts { dir: ended },
            Err(_) => self,
        }
    }

    /// Removes the directory (its parts have been saved, or there were none).
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The profiles in a directory of parts, oldest first; unreadable ones are skipped.
pub fn read_parts(dir: &Path) -> Vec<Profile> {
    let mut v: Vec<Profile> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| Profile::from_bytes(&file::read_regular(&p).ok()?).ok())
        .collect();
    v.sort_by_key(|p| (p.start_unix_ns, p.pid));
    v
}

/// One run's parts as one profile: the first process (`first_pid`'s first
/// image if it left one, else the earliest part) at the top, every other
/// process and image in `processes`, in start order.
pub fn merge(mut parts: Vec<Profile>, first_pid: Option<u32>) -> Option<Profile> {
    if parts.is_empty() {
        return None;
    }
    let i = first_pid.and_then(|pid| parts.iter().position(|p| p.pid == pid)).unwrap_or(0);
    let mut run = parts.remove(i);
    for mut p in parts {
        run.processes.append(&mut p.processes);
        run.processes.push(p);
    }
    run.processes.sort_by_key(|p| (p.start_unix_ns, p.pid));
    Some(run)
}

/// Writes a profile: atomically (see [`write::file`]) onto a regular file
/// or a new name, in place onto a device or FIFO (such as /dev/null, which
/// is written to, never replaced). Leaves no temporary file behind,
/// whatever fails.
pub fn save(p: &Profile, path: &Path) -> Result<()> {
    write::file(path, |w| Ok(serde_json::to_writer(w, p)?))
}
