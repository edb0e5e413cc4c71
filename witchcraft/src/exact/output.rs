//! What an exact profile says of itself (its sampler) and of its threads
//! (made from the judged shadows): shared by the single-step mode
//! ([`super::Exact`]) and the code-cache mode's reader ([`super::Judge`]).

use super::judge::ThreadShadow;
use crate::profile;

/// The profile's threads made from judged shadows (by thread id), and
/// their counters summed.
pub fn thread_profiles<'a>(shadows: impl Iterator<Item = (i32, &'a ThreadShadow)>) -> (Vec<profile::Thread>, profile::Counters) {
    let mut counters = profile::Counters::default();
    let mut threads: Vec<profile::Thread> = shadows
        .map(|(tid, t)| {
            let mut c = t.counters.clone();
            c.traps = t.pairs.iter().map(|p| p.traps).sum();
            let th = crate::pair::thread_profile(tid as u32, &t.tree, &t.pairs, Default::default(), c);
            counters.add(&th.counters);
            th
        })
        .collect();
    threads.sort_by_key(|t| t.tid);
    (threads, counters)
}

/// An exact profile's sampler: every access, observed by `how`.
pub fn exact_sampler(how: &str) -> profile::SamplerSettings {
    profile::SamplerSettings {
        kind: profile::SamplerKind::Exact,
        event: how.into(),
        period: 1,
        unit: profile::PeriodUnit::Accesses,
        weight_unit: Some(profile::ValueUnit::Bytes),
        burst_steps: 0,
        burst_picks: 0,
        window_instructions: 0,
        window_picks: 0.0,
        window_timed: false,
        overhead_percent: None,
    }
}
