//! Where the binaries under test and the test programs are, and scratch directories.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// File names the preload agent has gone by, beside the witch binary.
pub const AGENT_NAMES: [&str; 2] = ["libwitch_agent.so", "libwitchcraft.so"];

/// The agent beside a witch binary, if there is one.
pub fn agent_beside(witch: &Path) -> Option<PathBuf> {
    let dir = witch.parent()?;
    AGENT_NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// The witch binary under test: `$WITCH_BIN`, else `<dir of the test exe>/../witch`
/// (test executables live in `target/<profile>/deps/`).
pub fn witch_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WITCH_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "WITCH_BIN={} does not exist", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test executable location {}", exe.display()))
        .to_path_buf();
    let witch = profile_dir.join("witch");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let how = format!(
        "run `cargo build --workspace{}` first (same profile as the tests), or set WITCH_BIN",
        if release { " --release" } else { "" }
    );
    assert!(witch.is_file(), "witch binary not found at {}: {how}", witch.display());
    assert!(
        std::env::var_os("WITCH_AGENT").is_some() || agent_beside(&witch).is_some(),
        "the preload agent ({}) is not beside {}: {how}",
        AGENT_NAMES.join(" or "),
        witch.display()
    );
    // `cargo test` builds neither the witch binary nor the agent (a
    // cdylib): after an edit they would test the code as it was.
    static FRESH: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let stale = FRESH.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
        let agent = agent_beside(&witch).filter(|_| std::env::var_os("WITCH_AGENT").is_none());
        let built_from = [(Some(witch.clone()), ["witchd/src", "witchcraft/src"]), (agent, ["witchcraft/agent/src", "witchcraft/src"])];
        built_from.into_iter().find_map(|(built, dirs)| {
            let built = built?;
            let at = std::fs::metadata(&built).ok()?.modified().ok()?;
            let (newest, src) = dirs.iter().filter_map(|d| newest_file(&root.join(d))).max()?;
            (newest > at).then(|| format!("{} is older than {}", built.display(), src.display()))
        })
    });
    if let Some(why) = stale {
        panic!("{why}: {how}");
    }
    witch
}

/// The most recently modified file under `dir`, and when.
fn newest_file(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let found = if p.is_dir() { newest_file(&p) } else { e.metadata().ok()?.modified().ok().map(|t| (t, p)) };
        newest = newest.max(found);
    }
    newest
}

/// The witchd daemon binary: `$WITCHD_BIN`, else beside the witch binary.
pub fn witchd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WITCHD_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "WITCHD_BIN={} does not exist", p.display());
        return p;
    }
    let witch = witch_bin();
    let witchd = witch.with_file_name("witchd");
    assert!(
        witchd.is_file(),
        "witchd binary not found at {}: run `cargo build --workspace` with the tests' profile, or set WITCHD_BIN",
        witchd.display()
    );
    witchd
}

/// `tests/programs/`.
pub fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("programs")
}

static SCRATCH_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A temporary directory, removed on drop unless the test failed or
/// `WITCH_TESTS_KEEP` is set.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let n = SCRATCH_SEQ.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("witch-tests-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Scratch { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("WITCH_TESTS_KEEP").is_some() {
            eprintln!("[witch-tests] keeping {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
