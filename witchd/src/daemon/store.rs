//! The bounded on-disk profile store.
//!
//! One directory; each profile is `ID.json` (the same file `witch report` reads)
//! with a small `ID.meta.json` beside it, so a restart re-indexes the store by
//! reading the small files only. Both are written atomically (temporary file,
//! fsync, rename), profile first: a crash leaves at worst a profile without
//! its meta, which the next start rebuilds from the profile.
//!
//! Limits are enforced before a write, oldest first, so the directory never
//! holds more than `max_bytes` (temporary file included) nor `max_profiles`.
//! IDs are `STARTMS-PID-CRAFT`, so sorting them sorts by start time.

use super::config::StoreConfig;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};
use witchcraft::profile::{Craft, Profile};

/// What the store knows about one profile without reading it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Meta {
    pub id: String,
    pub pid: u32,
    /// The program's path, as the profile records it.
    pub program: String,
    pub craft: Craft,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub stored_unix_ns: u64,
    /// Size of the profile file (the meta file not included).
    pub bytes: u64,
    pub waste_fraction: f64,
    pub samples: u64,
    pub traps: u64,
    pub ended_by: witchcraft::profile::EndedBy,
    /// The target exited during the session: this is its last profile.
    pub target_exited: bool,
    /// uid and gid whose callers may read it (see procfs::may_access); None: root only.
    pub owner: Option<(u32, u32)>,
    /// "schedule" (a duty-cycle session), "request" (`witch daemon profile`) or
    /// "reindex" (rebuilt from a profile whose meta was missing).
    pub origin: String,
}

impl Meta {
    /// The meta of a profile about to be stored.
    pub fn new(p: &Profile, owner: Option<(u32, u32)>, target_exited: bool, origin: &str) -> Meta {
        let c = crate::analysis::counters(p);
        Meta {
            id: String::new(),
            pid: p.pid,
            program: p.program.clone(),
            craft: p.craft,
            start_unix_ns: p.start_unix_ns,
            duration_ns: p.duration_ns,
            stored_unix_ns: 0,
            bytes: 0,
            waste_fraction: p.waste_fraction(),
            samples: c.samples,
            traps: c.traps,
            ended_by: p.ended_by,
            target_exited,
            owner,
            origin: origin.into(),
        }
    }

    /// The executable's file name.
    pub fn exe(&self) -> &str {
        self.program.rsplit('/').next().unwrap_or(&self.program)
    }
}

/// One profile in the store, as the index keeps it.
struct StoredProfile {
    meta: Meta,
    /// Profile and meta file together, as they take room in the directory.
    disk: u64,
}

/// Store contents and limits; the caller serializes access (a Mutex).
pub struct Store {
    cfg: StoreConfig,
    /// The directory, opened once: every file is made, read and removed
    /// relative to it, temporary files exclusively (see [`crate::write`]).
    dir: crate::write::Dir,
    index: BTreeMap<String, StoredProfile>,
    total: u64,
    /// Profiles removed to respect the limits, since start.
    pub evicted: u64,
    /// Profiles not stored because one alone exceeds max_bytes.
    pub rejected: u64,
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// IDs are generated here; anything else asked for is refused before it
/// reaches the file system.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !id.starts_with('-')
}

/// No profile by that ID is stored (a refusal, not an I/O failure).
#[derive(Debug)]
pub struct NotStored(pub String);

impl std::fmt::Display for NotStored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no stored profile {:?}", self.0)
    }
}

impl std::error::Error for NotStored {}

impl Store {
    /// Opens (creating it, owner-only) and re-indexes the store directory:
    /// temporary files are removed, missing metas rebuilt, limits applied.
    /// Returns the store and one line per thing worth logging.
    pub fn open(cfg: &StoreConfig) -> Result<(Store, Vec<String>)> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = &cfg.dir;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create store directory {}", dir.display()))?;
        // Another user's directory would let that user read, replace or
        // plant profiles (root's among them): refuse it. (Checked on the
        // descriptor every file is then made relative to.)
        let fd = crate::write::Dir::open(dir).with_context(|| format!("cannot open store directory {}", dir.display()))?;
        let owner = fd.owner().with_context(|| format!("cannot read store directory {}", dir.display()))?;
        let me = nix::unistd::geteuid().as_raw();
        if owner != me {
            bail!(
                "store directory {} belongs to uid {owner}, not to witchd's uid {me}; give witchd a directory of its own ([store] dir)",
                dir.display(),
            );
        }
        // Profiles are as private as the processes they describe.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        let mut log = Vec::new();
        let mut s = Store { cfg: cfg.clone(), dir: fd, index: BTreeMap::new(), total: 0, evicted: 0, rejected: 0 };
        let rd = std::fs::read_dir(dir).with_context(|| format!("cannot read store directory {}", dir.display()))?;
        let mut names: Vec<String> = rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        names.sort();
        for name in &names {
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = s.dir.remove(name.as_ref());
            } else if let Some(id) = name.strip_suffix(".meta.json") {
                if !matches!(s.dir.stat(format!("{id}.json").as_ref()), Ok(Some(_))) {
                    let _ = s.dir.remove(name.as_ref());
                }
            } else if let Some(id) = name.strip_suffix(".json").filter(|id| valid_id(id)) {
                match s.index_one(id) {
                    Ok(Some(note)) => log.push(note),
                    Ok(None) => {}
                    Err(e) => {
                        log.push(format!("store: removing unreadable {name}: {e:#}"));
                        let _ = s.dir.remove(name.as_ref());
                        let _ = s.dir.remove(Self::meta_name(id).as_ref());
                    }
                }
            }
        }
        let before = s.evicted;
        s.expire_at(now_ns());
        s.make_room(0);
        if s.evicted > before {
            log.push(format!("store: removed {} profiles over the limits", s.evicted - before));
        }
        Ok((s, log))
    }

    fn profile_name(id: &str) -> String {
        format!("{id}.json")
    }
    fn meta_name(id: &str) -> String {
        format!("{id}.meta.json")
    }

    /// Size and modification time of a file of the store; a link, or
    /// anything but a regular file, is not one.
    fn regular(&self, name: &str) -> std::io::Result<(u64, u64)> {
        match self.dir.stat(name.as_ref())? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                Ok((st.st_size as u64, (st.st_mtime as u64).saturating_mul(1_000_000_000) + st.st_mtime_nsec as u64))
            }
            Some(_) => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name} is not a regular file"))),
            None => Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{name} is missing"))),
        }
    }

    /// A file of the store, whole (regular files only, never through a link).
    fn read_file(&self, name: &str) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = self.dir.open_read(name.as_ref())?;
        if !f.metadata()?.is_file() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name} is not a regular file")));
        }
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    /// Writes a file of the store atomically (temporary file, fsync, rename).
    fn write_atomic(&self, name: &str, data: &[u8]) -> Result<()> {
        self.dir.replace(name.as_ref(), 0o600, |w| Ok(w.write_all(data)?))
    }

    /// Adds one existing profile file to the index, rebuilding its meta if needed.
    fn index_one(&mut self, id: &str) -> Result<Option<String>> {
        let (bytes, modified) = self.regular(&Self::profile_name(id))?;
        let meta: Option<Meta> = self.read_file(&Self::meta_name(id)).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let mut note = None;
        let meta = match meta {
            Some(m) if m.id == id && m.bytes == bytes => m,
            _ => {
                let p = Profile::from_bytes(&self.read_file(&Self::profile_name(id))?).map_err(|e| anyhow::anyhow!("{e}"))?;
                // Who may read it is not in the profile: root only.
                let exited = !p.ended_by.process_runs_on();
                let mut m = Meta::new(&p, None, exited, "reindex");
                m.id = id.into();
                m.bytes = bytes;
                m.stored_unix_ns = if modified > 0 { modified } else { now_ns() };
                self.write_atomic(&Self::meta_name(id), &serde_json::to_vec(&m)?)?;
                note = Some(format!("store: rebuilt the index entry of {id}"));
                m
            }
        };
        let disk = bytes + self.regular(&Self::meta_name(id)).map_or(0, |(n, _)| n);
        self.total += disk;
        self.index.insert(id.into(), StoredProfile { meta, disk });
        Ok(note)
    }

    /// Stores a profile; returns its meta (with its ID). Fails when the profile
    /// alone is larger than the store may hold, or on I/O errors.
    pub fn put(&mut self, p: &Profile, mut meta: Meta) -> Result<Meta> {
        let data = serde_json::to_vec(p)?;
        let base = format!("{}-{}-{}", p.start_unix_ns / 1_000_000, p.pid, p.craft.name());
        let mut id = base.clone();
        let mut k = 1;
        while self.index.contains_key(&id) || !matches!(self.dir.stat(Self::profile_name(&id).as_ref()), Ok(None)) {
            k += 1;
            id = format!("{base}-{k}");
        }
        meta.id = id.clone();
        meta.bytes = data.len() as u64;
        meta.stored_unix_ns = now_ns();
        let meta_data = serde_json::to_vec(&meta)?;
        let need = (data.len() + meta_data.len()) as u64;
        if need > self.cfg.max_bytes {
            self.rejected += 1;
            bail!("profile of pid {} ({} bytes) is larger than the store's max_bytes ({}): not stored", p.pid, need, self.cfg.max_bytes);
        }
        self.expire_at(meta.stored_unix_ns);
        self.make_room(need);
        let write = || -> Result<()> {
            self.write_atomic(&Self::profile_name(&id), &data)?;
            self.write_atomic(&Self::meta_name(&id), &meta_data)
        };
        if let Err(e) = write() {
            let _ = self.dir.remove(Self::profile_name(&id).as_ref());
            bail!("cannot write profile to store {}: {e:#}", self.cfg.dir.display());
        }
        self.total += need;
        self.index.insert(id, StoredProfile { meta: meta.clone(), disk: need });
        Ok(meta)
    }

    /// Evicts oldest-first until `need` more bytes and one more profile fit.
    fn make_room(&mut self, need: u64) {
        let extra = usize::from(need > 0);
        while !self.index.is_empty() && (self.total + need > self.cfg.max_bytes || self.index.len() + extra > self.cfg.max_profiles) {
            let id = self.index.keys().next().cloned().expect("not empty");
            self.remove(&id);
            self.evicted += 1;
        }
    }

    /// Removes profiles stored longer ago than max_age.
    pub fn expire_at(&mut self, now_ns: u64) {
        let max = self.cfg.max_age.as_nanos() as u64;
        let old: Vec<String> =
            self.index.values().filter(|e| now_ns.saturating_sub(e.meta.stored_unix_ns) > max).map(|e| e.meta.id.clone()).collect();
        for id in old {
            self.remove(&id);
            self.evicted += 1;
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.index.remove(id) {
            self.total -= e.disk;
            // Meta first: a profile without meta is rebuilt at start, not lost track of.
            let _ = self.dir.remove(Self::meta_name(id).as_ref());
            let _ = self.dir.remove(Self::profile_name(id).as_ref());
        }
    }

    pub fn get(&self, id: &str) -> Option<&Meta> {
        self.index.get(id).map(|e| &e.meta)
    }

    /// The profile file's bytes.
    pub fn read(&self, id: &str) -> Result<Vec<u8>> {
        if !valid_id(id) || !self.index.contains_key(id) {
            return Err(NotStored(id.to_string()).into());
        }
        self.read_file(&Self::profile_name(id)).with_context(|| format!("cannot read stored profile {id}"))
    }

    /// Every stored profile, oldest first.
    pub fn list(&self) -> impl Iterator<Item = &Meta> {
        self.index.values().map(|e| &e.meta)
    }

    /// The newest profile matching all the given filters, of those `may` allows.
    pub fn latest(&self, pid: Option<u32>, craft: Option<Craft>, exe: Option<&str>, may: impl Fn(&Meta) -> bool) -> Option<&Meta> {
        self.list()
            .filter(|m| may(m))
            .filter(|m| pid.is_none_or(|p| m.pid == p) && craft.is_none_or(|c| m.craft == c) && exe.is_none_or(|e| m.exe() == e))
            .max_by_key(|m| (m.start_unix_ns, m.stored_unix_ns))
    }

    /// Bytes on disk, profiles.
    pub fn usage(&self) -> (u64, usize) {
        (self.total, self.index.len())
    }

    pub fn limits(&self) -> &StoreConfig {
        &self.cfg
    }
}

/// A small synthetic profile, for tests here and in the daemon's.
#[cfg(test)]
pub mod tests_support {
    use witchcraft::profile::{Counters, Craft, EndedBy, Pair, PeriodUnit, Profile, SamplerKind, SamplerSettings, Thread};

    pub fn profile(pid: u32, start_ms: u64, pad: usize) -> Profile {
        Profile {
            schema: witchcraft::profile::SCHEMA,
            witch_version: "test".into(),
            craft: Craft::Dead,
            program: "/bin/prog".into(),
            args: vec!["x".repeat(pad)],
            pid,
            ppid: 1,
            start_unix_ns: start_ms * 1_000_000,
            duration_ns: 1_000_000_000,
            sampler: SamplerSettings {
                kind: SamplerKind::Software,
                event: "task-clock".into(),
                period: 1,
                unit: PeriodUnit::Ns,
                ..Default::default()
            },
            replacement: "reservoir".into(),
            debug_registers: 4,
            fp_precision: 0.01,
            kernel: "test".into(),
            ended_by: EndedBy::Detach,
            exec_call: None,
            round_trips: None,
            notes: vec![],
            counters: Counters { samples: 10, traps: 7, ..Default::default() },
            modules: vec![],
            threads: vec![Thread {
                tid: pid,
                nodes: vec![witchcraft::profile::Node { parent: 0, pc: 0, samples: 0 }],
                pairs: vec![Pair { waste: 3.0, r#use: 1.0, ..Default::default() }],
                counters: Counters::default(),
                clusters: Default::default(),
                objects: Vec::new(),
            }],
            processes: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::profile;
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;
    use witchcraft::profile::EndedBy;

    fn cfg(dir: &Path, max_bytes: u64, max_profiles: usize) -> StoreConfig {
        StoreConfig { dir: dir.into(), max_bytes, max_profiles, max_age: Duration::from_secs(3600) }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("witchd-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn dir_bytes(d: &Path) -> u64 {
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
    }

    /// A store directory that belongs to another user is refused.
    #[test]
    fn another_users_store_directory_is_refused() {
        let d = tmpdir("foreign");
        std::fs::create_dir_all(&d).unwrap();
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: cannot give the directory away; skipping");
            return;
        }
        let c = std::ffi::CString::new(d.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let e = Store::open(&cfg(&d, 1 << 20, 10)).err().expect("refused");
        assert!(format!("{e:#}").contains("belongs to uid 65534"), "{e:#}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// An index rebuilt from the profiles alone says the target exited only
    /// when its profile says so: a session a debugger ended ("traced"), or
    /// an exec the agent saw coming ("exec"), left the process running, as
    /// a detach does.
    #[test]
    fn a_rebuilt_index_knows_a_debugger_ended_session_from_an_exit() {
        let d = tmpdir("reindex-ended");
        let (mut s, _) = Store::open(&cfg(&d, 1 << 20, 10)).unwrap();
        let mut ids = Vec::new();
        let ends = [
            (EndedBy::Detach, false),
            (EndedBy::Traced, false),
            (EndedBy::Sandbox, false),
            (EndedBy::Exec, false),
            (EndedBy::Exit, true),
            (EndedBy::Signal(9), true),
        ];
        for (i, (how, exited)) in ends.into_iter().enumerate() {
            let mut p = profile(10 + i as u32, 2000, 0);
            p.ended_by = how;
            let m = s.put(&p, Meta::new(&p, None, false, "schedule")).unwrap();
            std::fs::remove_file(d.join(format!("{}.meta.json", m.id))).unwrap();
            ids.push((m.id, exited));
        }
        drop(s);
        let (s, _) = Store::open(&cfg(&d, 1 << 20, 10)).unwrap();
        for (id, exited) in ids {
            assert_eq!(s.get(&id).unwrap().target_exited, exited, "{id}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn put_get_and_reopen() {
        let d = tmpdir("reopen");
        let (mut s, log) = Store::open(&cfg(&d, 1 << 20, 10)).unwrap();
        assert!(log.is_empty());
        let p = profile(7, 1000, 0);
        let m = s.put(&p, Meta::new(&p, Some((5, 6)), false, "schedule")).unwrap();
        assert_eq!(m.id, "1000-7-dead");
        assert_eq!(m.waste_fraction, 0.75);
        assert_eq!((m.samples, m.traps), (10, 7));
        let m2 = s.put(&p, Meta::new(&p, None, true, "request")).unwrap();
        assert_eq!(m2.id, "1000-7-dead-2");
        let back = Profile::from_bytes(&s.read(&m.id).unwrap()).unwrap();
        assert_eq!(back, p);
        assert!(s.read("../etc/passwd").is_err());
        assert_eq!(s.latest(Some(7), Some(Craft::Dead), Some("prog"), |_| true).unwrap().id, m2.id);
        assert!(s.latest(Some(8), None, None, |_| true).is_none());
        let (bytes, n) = s.usage();
        assert_eq!((bytes, n), (dir_bytes(&d), 2));

        // A crash between the two writes, and a stray temporary file.
        std::fs::remove_file(d.join(format!("{}.meta.json", m2.id))).unwrap();
        std::fs::write(d.join(".junk.json.tmp"), b"x").unwrap();
        drop(s);
        let (s, log) = Store::open(&cfg(&d, 1 << 20, 10)).unwrap();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(s.usage().1, 2);
        assert_eq!(s.get(&m.id).unwrap(), &m);
        let rebuilt = s.get(&m2.id).unwrap();
        assert_eq!((rebuilt.owner, rebuilt.origin.as_str()), (None, "reindex"));
        assert!(!d.join(".junk.json.tmp").exists());
        assert_eq!(s.usage().0, dir_bytes(&d));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn limits_hold() {
        let d = tmpdir("limits");
        let one = {
            let p = profile(1, 1, 2000);
            serde_json::to_vec(&p).unwrap().len() as u64 + 600
        };
        let max = one * 3;
        let (mut s, _) = Store::open(&cfg(&d, max, 100)).unwrap();
        for i in 0..10 {
            let p = profile(i, 1000 + i as u64, 2000);
            s.put(&p, Meta::new(&p, None, false, "schedule")).unwrap();
            assert!(dir_bytes(&d) <= max, "{} > {max}", dir_bytes(&d));
            assert_eq!(s.usage().0, dir_bytes(&d));
        }
        assert!(s.evicted >= 7);
        // Oldest went first.
        assert!(s.list().all(|m| m.pid >= 7));
        // Too large alone: refused, nothing else lost.
        let big = profile(99, 5000, (max * 2) as usize);
        let n = s.usage().1;
        assert!(s.put(&big, Meta::new(&big, None, false, "schedule")).is_err());
        assert_eq!((s.usage().1, s.rejected), (n, 1));

        // Count limit, and a restart with tighter limits.
        drop(s);
        let (mut s, log) = Store::open(&cfg(&d, max, 1)).unwrap();
        assert_eq!(s.usage().1, 1);
        assert_eq!(log.len(), 1, "{log:?}");
        let p = profile(50, 9000, 10);
        s.put(&p, Meta::new(&p, None, false, "schedule")).unwrap();
        assert_eq!(s.list().map(|m| m.pid).collect::<Vec<_>>(), vec![50]);

        // Age.
        s.expire_at(now_ns() + 2 * 3600 * 1_000_000_000);
        assert_eq!(s.usage(), (0, 0));
        assert_eq!(dir_bytes(&d), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn ids() {
        assert!(valid_id("1700000000000-42-silent-store-2"));
        for bad in ["", "../x", "a.json", "-x", "a/b", &"9".repeat(65)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
