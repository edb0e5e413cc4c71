//! From a profile file to what every output shows: each process's pairs,
//! symbolized and merged at source level, with the process's counters.
//!
//! Time and memory follow the profile: every address is symbolized once per
//! process, every context-tree node costs one trie lookup ([`context`]), and
//! pairs are merged by their two context ids.

pub mod context;
pub mod interval;
pub mod objects;
pub mod pairs;
pub mod summary;

use crate::symbolize::Symbolizer;
use anyhow::Context as _;
use context::{CtxId, FrameId, Interner};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use witchcraft::profile::{Counters, Craft, Profile};

pub use pairs::SymPair;

/// Loads a profile; the error names the file and says what is wrong with it.
/// A FIFO is read once a writer has written (or closed it), and refused
/// after [`FIFO_WAIT`] without one: a FIFO nobody opens for writing held
/// `report`, `gate` and `diff` for ever.
pub fn load(path: &Path) -> anyhow::Result<Profile> {
    let named = || format!("{}", path.display());
    let r = open(path).with_context(named)?;
    Profile::read_from(r).with_context(named)
}

/// How long a FIFO given as a profile may go without a writer.
pub const FIFO_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`FIFO_WAIT`], or, for tests, `WITCH_FIFO_WAIT_MS`.
fn fifo_wait() -> std::time::Duration {
    std::env::var("WITCH_FIFO_WAIT_MS").ok().and_then(|v| v.parse().ok()).map_or(FIFO_WAIT, std::time::Duration::from_millis)
}

/// Opens a profile to read, without blocking on a FIFO that has no
/// writer; what was read to find one comes first in the reader.
fn open(path: &Path) -> anyhow::Result<impl std::io::Read> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC).open(path)?;
    let mut first = Vec::new();
    if f.metadata()?.file_type().is_fifo() {
        let wait = fifo_wait();
        let until = std::time::Instant::now() + wait;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match f.read(&mut buf) {
                Ok(n) if n > 0 => {
                    first.extend_from_slice(&buf[..n]);
                    break;
                }
                // A writer, nothing written yet: it will be read blocking.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
                // No writer: wait for one to write, or to come and go.
                Ok(_) => {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                    // SAFETY: one pollfd of ours.
                    let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
                    if r == 0 {
                        anyhow::bail!("a FIFO nobody opened for writing within {:.1} s", wait.as_secs_f64());
                    }
                    if r > 0 && p.revents & libc::POLLIN == 0 {
                        break; // a writer came and went without writing: empty
                    }
                }
            }
        }
    }
    // SAFETY: F_GETFL/F_SETFL on our own descriptor.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    Ok(std::io::Cursor::new(first).chain(f))
}

/// One process of a run, analysed.
pub struct Process<'p> {
    pub profile: &'p Profile,
    /// Merged across threads, sorted by waste (then use), descending.
    pub pairs: Vec<SymPair>,
    /// Sums over every pair of the process.
    pub total: interval::Sums,
    pub counters: Counters,
    /// Frames of each lookup address seen (for outputs that keep addresses).
    addrs: HashMap<u64, Box<[FrameId]>>,
    /// The data objects its judged accesses touched (in order of first
    /// sight; [`objects::merged`] sorts a run's); empty for profiles
    /// without objects.
    pub objects: Vec<objects::Object>,
    /// Per thread, per raw object entry: its index in `objects` (None when
    /// its pair was not kept).
    raw_objects: Vec<Vec<Option<usize>>>,
}

impl Process<'_> {
    /// (waste incl. approximate, approximate part, use).
    pub fn totals(&self) -> (f64, f64, f64) {
        self.profile.totals()
    }

    /// The object of a thread's raw object entry (`Thread::objects`).
    pub fn object_of(&self, thread: usize, entry: usize) -> Option<&objects::Object> {
        let i = (*self.raw_objects.get(thread)?.get(entry)?)?;
        self.objects.get(i)
    }

    /// The frame ids at one lookup address, innermost first (empty if never seen).
    pub fn frames_at(&self, addr: u64) -> &[FrameId] {
        self.addrs.get(&addr).map_or(&[], |f| f)
    }
}

/// Every process of the profiles read, over one set of interned frames and
/// contexts (so pairs of two profiles compare by their context ids), and the
/// symbolizer that read their modules.
#[derive(Default)]
pub struct Analysis<'p> {
    pub names: Interner,
    pub procs: Vec<Process<'p>>,
    sym: std::cell::RefCell<Symbolizer>,
}

impl<'p> Analysis<'p> {
    /// One run's analysis.
    pub fn of(run: &'p Profile) -> Analysis<'p> {
        let mut a = Analysis::default();
        a.add(run);
        a
    }

    /// Adds every process of a run; returns their indices in `procs`.
    pub fn add(&mut self, run: &'p Profile) -> Range<usize> {
        let start = self.procs.len();
        let sym = self.sym.get_mut();
        for p in run.all() {
            let proc = pairs::analyse(p, sym, &mut self.names);
            self.procs.push(proc);
        }
        start..self.procs.len()
    }

    /// The offset in its file at which a module's mapping starts; None without the file.
    pub fn file_offset(&self, m: &witchcraft::profile::Module) -> Option<u64> {
        self.sym.borrow_mut().file_offset(m)
    }

    /// The process a run is named after: the one with the most samples
    /// (the first of equals; the only one of a single-process profile). A
    /// program started through a wrapper (`env`, a version manager's shim,
    /// a shell script) is the program, not the wrapper, in every output.
    pub fn main(&self) -> &Process<'p> {
        &self.procs[self.main_index()]
    }

    /// The index of [`Analysis::main`] in `procs`.
    pub fn main_index(&self) -> usize {
        let mut best = 0;
        for (i, p) in self.procs.iter().enumerate() {
            if p.counters.samples > self.procs[best].counters.samples {
                best = i;
            }
        }
        best
    }

    /// Sums over every process.
    pub fn total(&self) -> interval::Sums {
        let mut s = interval::Sums::default();
        for p in &self.procs {
            s.add(&p.total);
        }
        s
    }

    /// The engine counters summed over every process.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for p in &self.procs {
            c.add(&p.counters);
        }
        c
    }

    /// What the reader should know about where symbols came from (one line
    /// when debuginfod was used or failed; none otherwise).
    pub fn symbol_notes(&self) -> Vec<String> {
        self.sym.borrow().debuginfod_note().into_iter().collect()
    }

    /// The programs the run's other processes exec'd that ran unprofiled
    /// (each noted in its exec'ing process's profile, `witchcraft::loadable`):
    /// what the run left out. The main process's own are in its notes.
    pub fn unprofiled_notes(&self) -> Vec<String> {
        let main = self.main_index();
        let others = self.procs.iter().enumerate().filter(|&(i, _)| i != main);
        others.flat_map(|(_, p)| p.profile.notes.iter().filter(|n| n.contains(witchcraft::loadable::UNPROFILED)).cloned()).collect()
    }

    /// Frames of a context, innermost first.
    pub fn frames(&self, ctx: CtxId) -> impl Iterator<Item = &crate::symbolize::Frame> + '_ {
        self.names.frames(ctx)
    }
}

/// Sums over every raw pair of every process of a run, without symbolizing anything.
pub fn run_sums(run: &Profile) -> interval::Sums {
    let exhaustive = run.sampler.kind.is_exhaustive();
    let mut s = interval::Sums::default().counted(exhaustive);
    for t in run.all().flat_map(|p| &p.threads) {
        s.run.add(&t.clusters);
        for pair in &t.pairs {
            s.add(&interval::Sums::of_pair(pair).counted(exhaustive));
        }
    }
    s
}

/// The figures of a run cannot be computed: its waste and use, summed over
/// its pairs, are past what a number holds. (Each figure in a profile is
/// checked when it is read; their sums can be checked only here.)
#[derive(Debug)]
pub struct NotComputable(pub String);

impl std::fmt::Display for NotComputable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "its waste fraction cannot be computed: {}", self.0)
    }
}

impl std::error::Error for NotComputable {}

/// Refuses a run whose sums are not finite numbers ([`NotComputable`]):
/// no report, gate or diff is made of it.
pub fn computable(run: &Profile) -> Result<(), NotComputable> {
    let s = run_sums(run);
    if s.finite() {
        return Ok(());
    }
    Err(NotComputable(format!(
        "its pairs' waste and use sum to {:e} and {:e} (their squares to {:e} and {:e}), beyond what a number holds; no run of witch's has such figures",
        s.waste, s.r#use, s.waste_sq, s.use_sq
    )))
}

/// Threads a process's profile covers: those the agent profiled, or, in a
/// profile from before they were counted, those it lists (the ones with
/// samples).
pub fn threads(p: &Profile) -> usize {
    (p.counters.threads as usize).max(p.threads.len())
}

/// The process counters; summed from threads when the engine left the totals empty.
pub fn counters(p: &Profile) -> Counters {
    if p.counters != Counters::default() {
        return p.counters.clone();
    }
    let mut c = Counters::default();
    for t in &p.threads {
        c.add(&t.counters);
    }
    c
}

pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// How each craft names the two contexts of a pair and its waste.
pub struct Words {
    pub watch: &'static str,
    pub trap: &'static str,
    /// Adjective for wasted bytes: "dead", "silent", "redundant".
    pub waste: &'static str,
    /// What was observed: "store" or "load".
    pub access: &'static str,
}

pub fn words(c: Craft) -> Words {
    match c {
        Craft::Dead => Words { watch: "dead store at", trap: "killed by", waste: "dead", access: "store" },
        Craft::SilentStore => Words { watch: "store", trap: "rewritten with the same value by", waste: "silent", access: "store" },
        Craft::SilentLoad => Words { watch: "load", trap: "reloaded unchanged by", waste: "redundant", access: "load" },
    }
}
