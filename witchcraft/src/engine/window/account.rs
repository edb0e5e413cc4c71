//! The windows' account: what the profile counts of them, and what a
//! thread of the exact mode recorded.

use super::Window;
use crate::profile::Counters;

/// The profile's account of the windows.
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowStats {
    pub windows: u64,
    pub instructions: u64,
    pub accesses: u64,
    pub picks: u64,
    /// Windows that ended before their instructions ran out (a system
    /// call, code the cache does not run).
    pub cut: u64,
    /// Times a window's pick probability was cut to a quarter (its
    /// accesses came far faster than planned).
    pub thinned: u64,
    pub shortest: u64,
    pub longest: u64,
    /// Whole-run counting: crossings between windows to deliver signals.
    pub bridges: u64,
    /// Whole-run windows: returns into the cache at the resume breakpoint.
    pub resumes: u64,
    /// Whole-run windows: times the thread went on natively until the
    /// next tick (no breakpoint could take it back), and where first.
    pub gaps: u64,
    pub first_gap: u64,
    /// Restartable sequences' critical sections a window left for (see
    /// [`Counters::critical_sections`]).
    pub critical: u64,
}

/// What a thread of the exact mode recorded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Recorded {
    /// Words of access records (and their values) sent.
    pub words: u64,
    /// Times the thread went on natively, unrecorded, until the next tick,
    /// and where first.
    pub gaps: u64,
    pub first_gap: u64,
    /// Returns into the cache after native code.
    pub resumes: u64,
}

impl Window {
    /// Recording: what this thread recorded; None if it does not record.
    pub fn recorded(&self) -> Option<Recorded> {
        let r = self.rec.as_ref()?;
        let s = &self.stats;
        Some(Recorded { words: r.stats.words, gaps: s.gaps, first_gap: s.first_gap, resumes: s.resumes })
    }

    /// The windows' and the cache's part of the profile's counters.
    pub fn count_into(&self, counters: &mut Counters) {
        let w = &self.stats;
        counters.windows = w.windows;
        counters.window_instructions = w.instructions;
        counters.window_accesses = w.accesses;
        counters.window_picks = w.picks;
        counters.windows_cut = w.cut;
        counters.windows_thinned = w.thinned;
        counters.window_shortest = w.shortest;
        counters.window_longest = w.longest;
        counters.cache_blocks = self.cache.stats.blocks;
        counters.cache_flushes = self.cache.stats.flushes;
        counters.cache_exits = self.cache.stats.exits;
        counters.cache_lookups = self.cache.stats.lookups;
        counters.cache_links = self.cache.stats.links;
        counters.link_ns = self.cache.stats.link_ns;
        (counters.cache_picks, counters.pick_ns) = (self.cache.stats.picks, self.cache.stats.pick_ns);
        counters.window_bridges = w.bridges;
        counters.window_resumes = w.resumes;
        counters.window_gaps = w.gaps;
        counters.critical_sections = w.critical;
        let refused = self.cache.stats.refused;
        (counters.cache_refused, counters.cache_refused_wx) = ((refused != 0) as u64, (refused == libc::EACCES) as u64);
    }
}
