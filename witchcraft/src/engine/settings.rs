//! How a process's bursts and windows are sized: the settings the engine
//! makes once from the configuration, which every thread's paths read.

pub use super::pick::MAX_PICKS;
pub use crate::config::BurstWeight;
use crate::config::{
    Config, COUNT_EVENTS, COUNT_WINDOW_INSTRUCTIONS, DEFAULT_BURST_PICKS, DEFAULT_BURST_PICK_BYTES, DEFAULT_BURST_STEPS,
    DEFAULT_COUNT_PERIOD, DEFAULT_OVERHEAD_PERCENT, DEFAULT_WINDOW_INSTRUCTIONS, DEFAULT_WINDOW_PICKS, MIN_COUNT_PERIOD,
};

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
    /// The bursts `cfg` asks for, with a note for each setting changed on
    /// the way; None: no bursts (a PMU counts accesses itself, and
    /// `WITCH_BURST=0` asks for the time-proportional look-around).
    ///
    /// A software sampler samples accesses by count with bursts sized to
    /// the overhead budget; the software access counters (`-e sw-stores`,
    /// `-e sw-loads`) run the whole program in the code cache, and so does
    /// the exact mode's recording, whose windows never pick.
    pub fn from_config(cfg: &Config, pmu: bool, notes: &mut Vec<String>) -> Option<BurstSettings> {
        if pmu {
            return None;
        }
        let recording = cfg.record_fd.map(|_| u64::MAX >> 1);
        let count = recording.or_else(|| {
            cfg.event.as_deref().filter(|e| COUNT_EVENTS.contains(e)).map(|_| {
                let n = cfg.period.unwrap_or(DEFAULT_COUNT_PERIOD);
                if n < MIN_COUNT_PERIOD {
                    notes.push(format!("a period of {n} accesses would slow the program many times over: raised to {MIN_COUNT_PERIOD}"));
                }
                n.max(MIN_COUNT_PERIOD)
            })
        });
        if cfg.burst_steps == Some(0) && count.is_none() {
            return None;
        }
        let steps = cfg.burst_steps.unwrap_or(DEFAULT_BURST_STEPS);
        Some(BurstSettings {
            steps,
            weight: cfg.burst_weight.unwrap_or_default(),
            picks: cfg.burst_picks.unwrap_or(DEFAULT_BURST_PICKS).clamp(1, MAX_PICKS as u32),
            by_bytes: cfg.burst_pick_bytes.unwrap_or(DEFAULT_BURST_PICK_BYTES),
            budget: cfg.overhead_percent.unwrap_or(DEFAULT_OVERHEAD_PERCENT) / 100.0,
            // At the default period every burst takes all its steps and the
            // budget chooses the ticks. A period the user chose asks for a
            // burst at every tick: the budget then chooses their length (at
            // least 4 steps, past the budget if it must), as does
            // WITCH_BURST_MIN=0.
            min_steps: match (cfg.burst_min_steps, cfg.period) {
                (None, None) => Some(steps),
                (None, Some(_)) | (Some(0), _) => None,
                (Some(n), _) => Some(n),
            },
            after_syscall: cfg.burst_after_syscall,
            window: match (count, cfg.window.unwrap_or(DEFAULT_WINDOW_INSTRUCTIONS)) {
                (Some(n), _) => Some(WindowSettings {
                    instructions: COUNT_WINDOW_INSTRUCTIONS,
                    picks: DEFAULT_WINDOW_PICKS,
                    count: Some(n),
                    timed: false,
                }),
                (None, 0) => None,
                (None, n) => Some(WindowSettings {
                    instructions: n,
                    picks: cfg.window_picks.unwrap_or(DEFAULT_WINDOW_PICKS),
                    count: None,
                    timed: cfg.timed_windows,
                }),
            },
        })
    }

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
    /// Each pick's weight is divided by how long the window's copies took
    /// around it (see [`super::pace`]); never for whole-run counting,
    /// whose picks stand for a count.
    pub timed: bool,
}

impl WindowSettings {
    /// The most budget units a window takes: one of its own, one a pick.
    pub fn max_units(&self) -> u32 {
        self.picks.round().max(1.0) as u32 + 1
    }
}
