//! What interrupts a thread to take a sample: the process-wide choice
//! ([`SampleSource`]) and each thread's kernel object ([`ThreadSampler`]).

use super::settings::BurstSettings;
use crate::config::{Config, SamplerChoice, DEFAULT_PMU_PERIOD, DEFAULT_SOFTWARE_PERIOD_NS, MIN_PMU_PERIOD, MIN_SOFTWARE_PERIOD_NS};
use crate::profile;
use crate::sys::perf::{self, Attr, SoftwareClock};
use crate::sys::pmu::{self, AccessKind, PmuEvent, PmuSampler};
use crate::sys::{cputimer, siginfo};

/// The signal queue (`RLIMIT_SIGPENDING`) and the perf samplers. A perf
/// sampler (a software clock or a PMU event) signals through F_SETSIG with
/// a queued real-time signal, and one the user's queue cannot hold becomes
/// SIGIO, whose default action kills the program (a 64-thread program at
/// `-p 1ms` under `ulimit -i 1` died so). A thread may have about two of
/// them pending at once: one while it waits for a CPU after its period ran
/// out, one more if its clock runs on in a long system call. A CPU-time
/// timer's signal is reserved when the timer is made (which fails, and
/// leaves the thread unprofiled, when the queue is full): it can never
/// overflow. So at most [`perf_sampler_room`] threads sample with a perf
/// event at once; past them, a software clock's threads sample with the
/// CPU-time timer (at the scheduler tick, 4 ms, if the period is shorter),
/// and a PMU's are not profiled.
pub mod queue {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Signals a thread's perf sampler may have queued at once.
    pub const PER_THREAD: u64 = 2;
    /// Left to the rest of the user's processes and to the program.
    pub const MARGIN: u64 = 16;

    /// Threads of this process sampling with a perf event now.
    static PERF_SAMPLERS: AtomicU64 = AtomicU64::new(0);

    /// Threads that may sample with a perf event under a queue of `limit`
    /// signals (None: unlimited).
    pub fn perf_sampler_room(limit: Option<u64>) -> u64 {
        limit.map_or(u64::MAX, |l| l.saturating_sub(MARGIN) / PER_THREAD)
    }

    /// Take a perf sampler's share of the queue; false if there is none.
    pub(super) fn take() -> bool {
        let room = perf_sampler_room(crate::sys::siginfo::queue_limit());
        if PERF_SAMPLERS.fetch_add(1, Ordering::AcqRel) < room {
            return true;
        }
        PERF_SAMPLERS.fetch_sub(1, Ordering::AcqRel);
        false
    }

    pub(super) fn give_back() {
        let _ = PERF_SAMPLERS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// What the queue's limit means for sampling, if it constrains it (a
    /// note for the profile and `witch doctor`).
    pub fn note(limit: Option<u64>) -> Option<String> {
        let room = perf_sampler_room(limit);
        let limit = limit?;
        (room < 1024).then(|| {
            format!(
                "the signal queue holds {limit} signals (ulimit -i): at most {room} threads sample with a perf event (task-clock, periods under 4 ms, or a PMU); \
                 past them, a task-clock's threads sample with the CPU-time timer, at the 4 ms scheduler tick if the period is shorter \
                 (a signal the queue cannot hold becomes SIGIO, which would kill the program)"
            )
        })
    }
}

/// Which sampler drives this process.
#[derive(Clone, Debug)]
pub enum SampleSource {
    /// A perf software clock (`task-clock`/`cpu-clock`): decode the
    /// interrupted instruction.
    Clock(SoftwareClock),
    /// A POSIX CPU-time timer per thread ([`cputimer`]): the same decoding,
    /// at a fraction of the kernel's cost, for periods of a tick or more.
    CpuTimer(cputimer::CpuTime),
    /// A PMU precise memory event with the data address.
    Pmu(PmuEvent),
}

impl SampleSource {
    /// The `--event` name.
    pub fn event_name(&self) -> String {
        match self {
            SampleSource::Clock(SoftwareClock::Task) => "task-clock".into(),
            SampleSource::Clock(SoftwareClock::Cpu) => "cpu-clock".into(),
            SampleSource::CpuTimer(cputimer::CpuTime::All) => "cpu-timer".into(),
            SampleSource::CpuTimer(cputimer::CpuTime::User) => "user-timer".into(),
            SampleSource::Pmu(e) => e.name.clone(),
        }
    }

    pub fn is_pmu(&self) -> bool {
        matches!(self, SampleSource::Pmu(_))
    }

    /// The profile's description of this sampler at `period`, with
    /// single-step bursts as `burst` says (None: none).
    pub fn to_profile(&self, period: u64, burst: Option<BurstSettings>) -> profile::SamplerSettings {
        let burst_steps = burst.map_or(0, |b| b.steps);
        use profile::{PeriodUnit, SamplerKind, ValueUnit};
        let (kind, unit) = match self {
            SampleSource::Pmu(e) if e.kind == AccessKind::Load => (SamplerKind::Pmu, PeriodUnit::Loads),
            SampleSource::Pmu(_) => (SamplerKind::Pmu, PeriodUnit::Stores),
            _ => (SamplerKind::Software, PeriodUnit::Ns),
        };
        // Bytes where samples count accesses (a PMU, the whole-run access
        // counters); byte·ns where ticks of CPU time choose them (see
        // `Engine::unit_scale`).
        let counts = kind == SamplerKind::Pmu || burst.is_some_and(|b| b.counts_accesses());
        let weight_unit = if counts { ValueUnit::Bytes } else { ValueUnit::ByteNs };
        profile::SamplerSettings {
            kind,
            event: self.event_name(),
            period,
            unit,
            weight_unit: Some(weight_unit),
            burst_steps,
            burst_picks: burst.map_or(0, |b| b.picks),
            window_instructions: burst.and_then(|b| b.window).map_or(0, |w| w.instructions),
            window_picks: burst.and_then(|b| b.window).map_or(0.0, |w| w.picks),
            window_timed: burst.and_then(|b| b.window).is_some_and(|w| w.timed),
            overhead_percent: burst.map(|b| b.budget * 100.0),
        }
    }

    /// Choose the sampler for `cfg` on this machine: the PMU event it names
    /// or the best one found, else a software sampler. Notes say why.
    pub fn choose(cfg: &Config, notes: &mut Vec<String>) -> (SampleSource, u64) {
        let (kind, period) = Self::choose_event(cfg, notes);
        if matches!(kind, SampleSource::Clock(_) | SampleSource::Pmu(_)) {
            notes.extend(queue::note(siginfo::queue_limit()));
        }
        (kind, period)
    }

    fn choose_event(cfg: &Config, notes: &mut Vec<String>) -> (SampleSource, u64) {
        let kind = if cfg.craft == profile::Craft::SilentLoad { AccessKind::Load } else { AccessKind::Store };
        let sysfs = std::path::Path::new(pmu::SYSFS_PMU_ROOT);
        let counting = cfg.event.as_deref().is_some_and(|e| crate::config::COUNT_EVENTS.contains(&e));
        let software = |notes: &mut Vec<String>| {
            if counting {
                // The access counters' period is a count (the engine's
                // windows take it); the timer only starts windows again
                // after the thread left the cache.
                return (SampleSource::CpuTimer(cputimer::CpuTime::All), DEFAULT_SOFTWARE_PERIOD_NS);
            }
            let period = settle_period(false, cfg.period, notes);
            let kind = match cfg.event.as_deref() {
                Some("cpu-clock") => SampleSource::Clock(SoftwareClock::Cpu),
                Some("task-clock") => SampleSource::Clock(SoftwareClock::Task),
                Some("cpu-timer") => SampleSource::CpuTimer(cputimer::CpuTime::All),
                Some("user-timer") => SampleSource::CpuTimer(cputimer::CpuTime::User),
                // The cheap CPU-time timer where its tick resolution serves the period.
                _ if period >= cputimer::MIN_PERIOD_NS => SampleSource::CpuTimer(cputimer::CpuTime::All),
                _ => SampleSource::Clock(SoftwareClock::Task),
            };
            if matches!(kind, SampleSource::CpuTimer(_)) && period < cputimer::MIN_PERIOD_NS {
                notes.push(format!(
                    "cpu-timer fires at scheduler ticks: a {} µs period is served at the tick rate (use -e task-clock for short periods)",
                    period / 1000
                ));
            }
            (kind, period)
        };
        let is_soft = matches!(cfg.event.as_deref(), Some("task-clock") | Some("cpu-clock") | Some("cpu-timer") | Some("user-timer"));
        if cfg.sampler == SamplerChoice::Software || is_soft || counting {
            return software(notes);
        }
        let ev = match cfg.event.as_deref() {
            Some(spec) => pmu::parse_event(sysfs, spec, kind),
            None => pmu::discover(sysfs, kind),
        };
        // The PMU period's note only if the PMU is what samples.
        let mut pmu_notes = Vec::new();
        let period = settle_period(true, cfg.period, &mut pmu_notes);
        // Opening proves the event works here (VMs often export but refuse it).
        let ev = ev.and_then(|e| PmuSampler::open(&e, period).map(|mut s| s.close()).map(|_| e).map_err(String::from));
        match ev {
            Ok(e) => {
                notes.append(&mut pmu_notes);
                (SampleSource::Pmu(e), period)
            }
            Err(why) => {
                let (kind, period) = software(notes);
                // The profile's sampler names what samples instead.
                notes.push(why);
                (kind, period)
            }
        }
    }
}

/// The period a sampler runs at when `requested` (None: the default) is
/// asked of a PMU event (`pmu`, a count of events) or a software sampler
/// (ns of thread CPU time): a period under the sampler's floor is raised to
/// it, with a note saying so. The command line says so in `--help`; an
/// agent configured by hand or by the daemon goes through here too, so no
/// setting can flood the program with signals.
pub fn settle_period(pmu: bool, requested: Option<u64>, notes: &mut Vec<String>) -> u64 {
    let (default, floor) = if pmu { (DEFAULT_PMU_PERIOD, MIN_PMU_PERIOD) } else { (DEFAULT_SOFTWARE_PERIOD_NS, MIN_SOFTWARE_PERIOD_NS) };
    let period = requested.unwrap_or(default);
    if period >= floor {
        return period;
    }
    notes.push(if pmu {
        format!("a PMU period of {period} events could make the engine sample its own accesses until the signal queue overflows: raised to {floor}")
    } else {
        format!("a {period} ns software period could overflow the signal queue (SIGIO would kill the program): raised to {floor} ns")
    });
    floor
}

/// One thread's sampler: the kernel object that interrupts it.
#[derive(Default)]
pub enum ThreadSampler {
    #[default]
    None,
    /// A POSIX timer id.
    Timer(i32),
    /// A perf software clock's fd.
    Clock(i32),
    Pmu(PmuSampler),
}

impl ThreadSampler {
    /// Create `kind`'s sampler for thread `tid` of this process, stopped,
    /// signalling that thread (`open_tid` 0 when `tid` is the caller).
    pub fn open(kind: &SampleSource, period: u64, tid: i32, open_tid: i32) -> Result<ThreadSampler, String> {
        // The sampler always signals with a real-time signal, never
        // SIGTRAP: standard signals don't queue, so a sample and a trap
        // arriving together would lose one of them.
        let sig = siginfo::sampler_signal();
        let queued = matches!(kind, SampleSource::Clock(_) | SampleSource::Pmu(_));
        if queued && !queue::take() {
            return match kind {
                // The timer at the same period: at the tick if shorter.
                SampleSource::Clock(_) => ThreadSampler::open(&SampleSource::CpuTimer(cputimer::CpuTime::All), period, tid, open_tid),
                _ => Err(format!(
                    "not profiled: the signal queue (ulimit -i: {}) has no room for another thread's PMU sampler",
                    siginfo::queue_limit().unwrap_or(0)
                )),
            };
        }
        let opened = Self::open_queued(kind, period, tid, open_tid, sig);
        if queued && !matches!(opened, Ok(ThreadSampler::Clock(_) | ThreadSampler::Pmu(_))) {
            queue::give_back();
        }
        opened
    }

    fn open_queued(kind: &SampleSource, period: u64, tid: i32, open_tid: i32, sig: i32) -> Result<ThreadSampler, String> {
        let s = match kind {
            SampleSource::CpuTimer(which) => {
                let id = cputimer::create(tid, *which, sig, siginfo::TAG | siginfo::TAG_SAMPLER).map_err(|e| {
                    let why = std::io::Error::from_raw_os_error(e);
                    if e == libc::EAGAIN {
                        // Each POSIX timer reserves a queued signal.
                        format!("cannot create the CPU-time sampler: {why} (the signal queue limit, `ulimit -i`, is reached; raise it)")
                    } else {
                        format!("cannot create the CPU-time sampler: {why}")
                    }
                })?;
                return Ok(ThreadSampler::Timer(id));
            }
            SampleSource::Clock(clock) => ThreadSampler::Clock(
                Attr::software_clock(*clock, period)
                    .open(open_tid)
                    .map_err(|e| format!("cannot open the software sampler: {}", std::io::Error::from_raw_os_error(e)))?,
            ),
            SampleSource::Pmu(ev) => ThreadSampler::Pmu(PmuSampler::open_on(ev, period, open_tid)?),
        };
        let fd = s.fd().unwrap_or(-1);
        if !perf::route_signal_to_thread(fd, sig, tid) {
            let mut s = s;
            s.close();
            return Err("cannot route sampler signals to the thread (fcntl F_SETSIG)".into());
        }
        Ok(s)
    }

    pub fn is_some(&self) -> bool {
        !matches!(self, ThreadSampler::None)
    }

    /// A PMU sampler, whose records name the sampled accesses?
    pub fn is_pmu(&self) -> bool {
        matches!(self, ThreadSampler::Pmu(_))
    }

    /// A PMU sampler: hand each record its ring holds to `f`, and free
    /// the room. Async-signal-safe.
    pub fn drain_pmu(&mut self, f: impl FnMut(pmu::PmuRecord)) {
        if let ThreadSampler::Pmu(p) = self {
            p.drain(f);
        }
    }

    /// The perf event's fd, for samplers that have one.
    pub fn fd(&self) -> Option<i32> {
        match self {
            ThreadSampler::Clock(fd) => Some(*fd),
            ThreadSampler::Pmu(p) => Some(p.fd()),
            _ => None,
        }
    }

    /// Start interrupting every `period`. Async-signal-safe.
    pub fn resume(&self, period: u64) {
        match self {
            ThreadSampler::Timer(id) => {
                cputimer::set(*id, period);
            }
            ThreadSampler::Clock(fd) => {
                perf::enable(*fd);
            }
            ThreadSampler::Pmu(p) => {
                perf::enable(p.fd());
            }
            ThreadSampler::None => {}
        }
    }

    /// Like [`ThreadSampler::resume`], but a CPU-time timer fires the first time
    /// as soon as the thread has run at all (at its next tick): an attached
    /// agent sets a thread up at its first sample. Async-signal-safe.
    pub fn resume_soon(&self, period: u64) {
        match self {
            ThreadSampler::Timer(id) => {
                cputimer::set_first(*id, 1, period);
            }
            other => other.resume(period),
        }
    }

    /// As [`ThreadSampler::pause`], returning the CPU time (ns) a CPU-time
    /// timer had left until its next tick, for [`ThreadSampler::resume_after`]
    /// (0 for the others: a perf event keeps its own count). Async-signal-safe.
    pub fn pause_left(&self) -> u64 {
        match self {
            ThreadSampler::Timer(id) => cputimer::stop_left(*id),
            other => {
                other.pause();
                0
            }
        }
    }

    /// As [`ThreadSampler::resume`], the first tick after `left` ns (0: a
    /// whole period), so that pausing and resuming often does not put the
    /// next tick off for ever. Async-signal-safe.
    pub fn resume_after(&self, left: u64, period: u64) {
        match self {
            ThreadSampler::Timer(id) if left > 0 => {
                cputimer::set_first(*id, left.min(period), period);
            }
            other => other.resume(period),
        }
    }

    /// Stop interrupting, keeping the kernel object. Async-signal-safe.
    pub fn pause(&self) {
        match self {
            ThreadSampler::Timer(id) => {
                cputimer::set(*id, 0);
            }
            ThreadSampler::Clock(fd) => {
                perf::disable(*fd);
            }
            ThreadSampler::Pmu(p) => {
                perf::disable(p.fd());
            }
            ThreadSampler::None => {}
        }
    }

    pub fn close(&mut self) {
        match std::mem::take(self) {
            ThreadSampler::Timer(id) => cputimer::delete(id),
            ThreadSampler::Clock(fd) => {
                perf::close(fd);
                queue::give_back();
            }
            ThreadSampler::Pmu(mut p) => {
                p.close();
                queue::give_back();
            }
            ThreadSampler::None => {}
        }
    }

    /// In a fork child: POSIX timers are not inherited (the parent's id
    /// means nothing here); the inherited fds are closed.
    pub fn close_after_fork(&mut self) {
        if let ThreadSampler::Timer(_) = self {
            *self = ThreadSampler::None;
        }
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmu_periods_under_the_floor_are_raised_with_a_note() {
        for p in [1, 16, 10_007, MIN_PMU_PERIOD - 1] {
            let mut notes = Vec::new();
            assert_eq!(settle_period(true, Some(p), &mut notes), MIN_PMU_PERIOD, "-p {p}");
            assert_eq!(notes.len(), 1, "{notes:?}");
            assert!(notes[0].contains(&format!("PMU period of {p} events")) && notes[0].contains("raised to 100003"), "{notes:?}");
        }
        for (p, want) in [(Some(MIN_PMU_PERIOD), MIN_PMU_PERIOD), (Some(1_000_003), 1_000_003), (None, DEFAULT_PMU_PERIOD)] {
            let mut notes = Vec::new();
            assert_eq!(settle_period(true, p, &mut notes), want);
            assert!(notes.is_empty(), "{notes:?}");
        }
    }

    #[test]
    fn software_periods_keep_their_own_floor() {
        let mut notes = Vec::new();
        // A count that is fine for a PMU is 1 µs for a software sampler.
        assert_eq!(settle_period(false, Some(1_000), &mut notes), MIN_SOFTWARE_PERIOD_NS);
        assert!(notes[0].contains("raised to 100000 ns"), "{notes:?}");
        notes.clear();
        // 100 µs is far under the PMU floor as a count, but a safe time.
        assert_eq!(settle_period(false, Some(MIN_SOFTWARE_PERIOD_NS), &mut notes), MIN_SOFTWARE_PERIOD_NS);
        assert_eq!(settle_period(false, None, &mut notes), DEFAULT_SOFTWARE_PERIOD_NS);
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn a_pmu_that_fails_to_open_leaves_no_pmu_period_note() {
        // No PMU here (or an event this machine refuses): the software
        // sampler takes over, and only its own period note may appear.
        let mut cfg = Config::new(profile::Craft::Dead);
        cfg.sampler = SamplerChoice::Pmu;
        cfg.event = Some("cpu/no-such-event-here/".into());
        cfg.period = Some(200_000);
        let mut notes = Vec::new();
        let (kind, period) = SampleSource::choose(&cfg, &mut notes);
        assert!(!kind.is_pmu());
        assert_eq!(period, 200_000);
        assert!(notes.iter().all(|n| !n.contains("PMU period")), "{notes:?}");
    }
}
