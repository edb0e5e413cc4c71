//! How a process's bursts and windows are sized: the settings the agent
//! makes once from the configuration, which every thread's paths read.

pub use super::pick::MAX_PICKS;

/// What a burst's pick stands for: the program time of its tick, in
/// periods, times a count of the burst's accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BurstWeight {
    /// K, the accesses the burst stepped through (over the picks). Right
    /// when every burst steps as many instructions.
    #[default]
    Accesses,
    /// K/L, accesses per instruction stepped (times the most steps a burst
    /// takes, to keep the scale of [`BurstWeight::Accesses`]): right when
    /// the budget or the code (a `syscall` ends a burst) makes bursts
    /// differ in length, since a burst twice as long does not stand for
    /// twice the program's time.
    PerStep,
    /// Experimental: 1 (each burst alike).
    PerBurst,
}

impl BurstWeight {
    pub fn parse(v: &str) -> Option<BurstWeight> {
        match v {
            "accesses" | "access" => Some(BurstWeight::Accesses),
            "step" | "per-step" => Some(BurstWeight::PerStep),
            "one" => Some(BurstWeight::PerBurst),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BurstWeight::Accesses => "accesses",
            BurstWeight::PerStep => "step",
            BurstWeight::PerBurst => "one",
        }
    }
}

/// How bursts are sized (process-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BurstSettings {
    /// Instructions stepped per burst at most.
    pub steps: u32,
    /// Accesses picked per burst (a reservoir of this size, at most
    /// [`MAX_PICKS`]): more samples for the same steps.
    pub picks: u32,
    /// What each burst's pick stands for.
    pub weight: BurstWeight,
    /// Pick accesses in proportion to their bytes (each pick then stands
    /// for B/m of the burst's B bytes), instead of each access alike (each
    /// pick stands for K/m of its K accesses).
    pub by_bytes: bool,
    /// Share of the program's CPU time the engine may spend (0: no limit);
    /// each burst takes the steps it pays for, at most `steps` (see
    /// [`super::budget`]).
    pub budget: f64,
    /// Fewest steps of a burst: ticks the budget cannot pay that many for
    /// are skipped (None: every tick begins a burst).
    pub min_steps: Option<u32>,
    /// Begin bursts at ticks right after a system call too.
    pub after_syscall: bool,
    /// Run bursts as windows from the code cache (see [`super::window`]);
    /// None: single steps.
    pub window: Option<WindowSettings>,
}

impl BurstSettings {
    /// Windows for the whole run that count every access (`-e sw-stores`,
    /// `-e sw-loads`, and the exact mode's recording): a pick's weight is
    /// the accesses it stands for, not a share of a tick's time.
    pub fn counts_accesses(&self) -> bool {
        self.window.is_some_and(|w| w.count.is_some())
    }
}

/// How windows are sized (process-wide).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowSettings {
    /// Instructions a window runs at most.
    pub instructions: u32,
    /// Most picks a window expects; the budget decides how many each gets.
    pub picks: f64,
    /// Whole-run counting (`-e sw-stores`, `-e sw-loads`): every access of
    /// the craft's kind is picked with probability 1/N, N this period, and
    /// windows follow one another for the whole run (see
    /// [`super::window::Phase::Bridge`]); None: windows at ticks, sized by
    /// the budget.
    pub count: Option<u64>,
}

impl WindowSettings {
    /// The most budget units a window takes: one of its own, one a pick.
    pub fn max_units(&self) -> u32 {
        self.picks.round().max(1.0) as u32 + 1
    }
}
