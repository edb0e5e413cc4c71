//! `witch doctor`'s checks: each feature Witch uses, whether this
//! machine offers it (ok, degraded, missing), in one line, with advice.

use super::{open_task_clock, perf_event_paranoid, pmu_events, read_int, single_step_ns, try_open};
use crate::sys::pmu;
use crate::sys::watchpoint::{count_breakpoints, modify_attributes_supported, sigtrap_supported, KernelCaps};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Ok,
    Degraded,
    Missing,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    /// One line.
    pub detail: String,
    pub advice: Option<String>,
}

/// Names of the checks, in the order [`checks`] returns them.
pub const CHECK_PMU: &str = "pmu memory events";
pub const CHECK_TASK_CLOCK: &str = "software task-clock";
pub const CHECK_BREAKPOINTS: &str = "hardware breakpoints";
pub const CHECK_MODIFY: &str = "PERF_EVENT_IOC_MODIFY_ATTRIBUTES";
pub const CHECK_IN_PLACE: &str = "in-place re-arm (kernel patch)";
pub const CHECK_BRANCH_STACK: &str = "breakpoint branch stacks (kernel patch)";
pub const CHECK_SIGTRAP: &str = "sigtrap";
pub const CHECK_PARANOID: &str = "perf_event_paranoid";
pub const CHECK_CAPS: &str = "capabilities";
pub const CHECK_MEMLOCK: &str = "RLIMIT_MEMLOCK";
pub const CHECK_PTRACE: &str = "ptrace_scope";
pub const CHECK_STEP: &str = "software sampler";
pub const CHECK_SIGNAL_QUEUE: &str = "RLIMIT_SIGPENDING";
pub const CHECK_NAMES: [&str; 13] = [
    CHECK_PMU,
    CHECK_TASK_CLOCK,
    CHECK_BREAKPOINTS,
    CHECK_MODIFY,
    CHECK_IN_PLACE,
    CHECK_BRANCH_STACK,
    CHECK_SIGTRAP,
    CHECK_PARANOID,
    CHECK_CAPS,
    CHECK_MEMLOCK,
    CHECK_PTRACE,
    CHECK_STEP,
    CHECK_SIGNAL_QUEUE,
];

fn step_check(pmu_ok: bool) -> Check {
    let budget = crate::config::DEFAULT_OVERHEAD_PERCENT;
    let period = crate::config::DEFAULT_SOFTWARE_PERIOD_NS;
    match single_step_ns() {
        Some(ns) => {
            let steps = crate::config::DEFAULT_BURST_STEPS;
            // How many ticks' budget one burst's steps take (its picks'
            // traps take more).
            let burst_ns = steps as f64 * ns.max(1) as f64;
            let every = (burst_ns / (budget / 100.0 * period as f64)).max(1.0);
            let default = if pmu_ok { "used where the PMU event is missing" } else { "the default here (no PMU)" };
            check(
                CHECK_STEP,
                CheckStatus::Ok,
                format!(
                    "count-proportional bursts, {default}: windows of up to {window} instructions run from an in-process code cache (its cost: the next line), single steps where the cache cannot run; a step costs {:.1} µs, so with single steps alone (WITCH_WINDOW=0) a {budget}% budget at a {} ms period buys a burst of {steps} steps at most every {every:.1} ticks",
                    ns as f64 / 1e3,
                    period / 1_000_000,
                    window = crate::config::DEFAULT_WINDOW_INSTRUCTIONS,
                ),
                None,
            )
        }
        None => check(
            CHECK_STEP,
            CheckStatus::Degraded,
            "single steps do not work here: bursts would end at once".into(),
            Some("use a PMU event, or WITCH_BURST=0 for the time-proportional software sampler"),
        ),
    }
}

/// Effective capability bits from /proc/self/status.
fn cap_eff() -> Option<u64> {
    crate::sys::procfs::ProcStatus::read(crate::sys::procfs::Of::ThisProcess).ok()?.cap_eff
}
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;

fn has_cap(caps: Option<u64>, bit: u32) -> bool {
    caps.is_some_and(|c| c >> bit & 1 != 0)
}

fn check(name: &str, status: CheckStatus, detail: String, advice: Option<&str>) -> Check {
    Check { name: name.to_string(), status, detail, advice: advice.map(str::to_string) }
}

fn pmu_check() -> Check {
    let mut ok = 0;
    let mut parts = Vec::new();
    let mut first_err = None;
    for (what, ev) in pmu_events() {
        match ev.and_then(|ev| try_open(&ev).map(|p| (ev, p))) {
            Ok((ev, p)) => {
                ok += 1;
                parts.push(format!("{what}: {} (precise_ip={p})", ev.name));
            }
            Err(e) => {
                parts.push(format!("{what}: {e}"));
                first_err.get_or_insert(e);
            }
        }
    }
    let status = match ok {
        2 => CheckStatus::Ok,
        1 => CheckStatus::Degraded,
        _ => CheckStatus::Missing,
    };
    // Both usually fail for the same reason; say it once.
    let detail = if ok == 0 && parts.len() == 2 && parts[0].split_once(": ").map(|p| p.1) == parts[1].split_once(": ").map(|p| p.1) {
        first_err.unwrap_or_default()
    } else {
        parts.join("; ")
    };
    let advice = (status != CheckStatus::Ok).then_some("software task-clock sampling is used instead");
    check(CHECK_PMU, status, detail, advice)
}

fn memlock_check() -> Check {
    // SAFETY: sysconf takes no pointers.
    let ring = (1 + pmu::RING_DATA_PAGES) * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the local `rl`.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } == 0;
    // perf charges rings to perf_event_mlock_kb (per user) before RLIMIT_MEMLOCK.
    let perf_kb = read_int("/proc/sys/kernel/perf_event_mlock_kb");
    let limit = if !got {
        "unknown".to_string()
    } else if rl.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        format!("{} KiB", rl.rlim_cur / 1024)
    };
    let enough = (got && (rl.rlim_cur == libc::RLIM_INFINITY || rl.rlim_cur as usize >= ring))
        || perf_kb.is_some_and(|kb| kb as usize * 1024 >= ring);
    let detail = format!(
        "{limit}; perf_event_mlock_kb {}; each PMU ring needs {} KiB",
        perf_kb.map_or("unknown".to_string(), |k| k.to_string()),
        ring / 1024
    );
    if enough {
        check(CHECK_MEMLOCK, CheckStatus::Ok, detail, None)
    } else {
        check(CHECK_MEMLOCK, CheckStatus::Degraded, detail, Some("raise it with `ulimit -l` so PMU ring buffers can be mapped"))
    }
}

/// The signal queue's limit, and what it leaves the perf samplers (see
/// `engine::sampler::queue`).
pub fn signal_queue_check(limit: Option<u64>) -> Check {
    use crate::engine::sampler::queue;
    let Some(l) = limit else {
        return check(CHECK_SIGNAL_QUEUE, CheckStatus::Ok, "unlimited".into(), None);
    };
    let room = queue::perf_sampler_room(Some(l));
    let detail = format!(
        "{l} queued signals (the user's, all processes): task-clock sampling (periods under 4 ms) and PMU sampling for up to {room} threads at once"
    );
    match queue::note(Some(l)) {
        None => check(CHECK_SIGNAL_QUEUE, CheckStatus::Ok, detail, None),
        Some(_) => check(
            CHECK_SIGNAL_QUEUE,
            CheckStatus::Degraded,
            format!("{detail}; past them, task-clock threads sample at the 4 ms scheduler tick and PMU threads are not profiled"),
            Some("raise it with `ulimit -i`"),
        ),
    }
}

fn ptrace_check(caps: Option<u64>) -> Check {
    let Some(scope) = read_int("/proc/sys/kernel/yama/ptrace_scope") else {
        return check(CHECK_PTRACE, CheckStatus::Ok, "no Yama LSM: attach is unrestricted".into(), None);
    };
    let cap = has_cap(caps, CAP_SYS_PTRACE);
    match scope {
        0 => check(CHECK_PTRACE, CheckStatus::Ok, "0: attach to own processes allowed".into(), None),
        1 | 2 if cap => check(CHECK_PTRACE, CheckStatus::Ok, format!("{scope}: attach allowed by CAP_SYS_PTRACE"), None),
        1 => check(
            CHECK_PTRACE,
            CheckStatus::Degraded,
            "1: attach only to descendants; launching under witch works".into(),
            Some("to attach to running processes: sysctl kernel.yama.ptrace_scope=0"),
        ),
        2 => check(
            CHECK_PTRACE,
            CheckStatus::Degraded,
            "2: attach needs CAP_SYS_PTRACE; launching under witch works".into(),
            Some("to attach to running processes: run as root or sysctl kernel.yama.ptrace_scope=0"),
        ),
        _ => check(CHECK_PTRACE, CheckStatus::Missing, format!("{scope}: attach disabled until reboot; launching under witch works"), None),
    }
}

/// Whether this kernel has each of witch's kernel patches (`kernel-patch/`),
/// as its breakpoint PMU reports them. Stock kernels work as they always
/// have, so their absence is not a fault.
pub fn kernel_patch_checks(k: KernelCaps) -> [Check; 2] {
    let in_place = if k.modify_in_place {
        check(CHECK_IN_PLACE, CheckStatus::Ok, "yes: enabled watchpoints are re-targeted in place, and witch uses it".into(), None)
    } else {
        check(
            CHECK_IN_PLACE,
            CheckStatus::Ok,
            "no (stock kernel): each re-arm of an enabled watchpoint disables and re-enables it through the perf core".into(),
            Some("optional: witch's kernel-patch/ makes it several times faster"),
        )
    };
    let branch_stack = match k.branch_stack {
        Some(true) => check(CHECK_BRANCH_STACK, CheckStatus::Ok, "yes: breakpoint samples can carry the LBR branch stack".into(), None),
        Some(false) => check(
            CHECK_BRANCH_STACK,
            CheckStatus::Ok,
            "patched, but this CPU has no LBR: trap PCs are found by decoding from the function start".into(),
            None,
        ),
        None => check(
            CHECK_BRANCH_STACK,
            CheckStatus::Ok,
            "no (stock kernel): trap PCs are found by decoding from the function start".into(),
            Some("optional: witch's kernel-patch/ lets CPUs with LBR name the last branch before the access"),
        ),
    };
    [in_place, branch_stack]
}

/// Everything Witch cares about on this machine, one line each.
pub fn checks() -> Vec<Check> {
    let caps = cap_eff();
    let perfmon = has_cap(caps, CAP_PERFMON) || has_cap(caps, CAP_SYS_ADMIN);
    let pmu = pmu_check();
    let pmu_ok = pmu.status != CheckStatus::Missing;
    let mut out = vec![pmu];

    out.push(match open_task_clock() {
        Ok(()) => check(CHECK_TASK_CLOCK, CheckStatus::Ok, "task-clock sampling opens on this thread".into(), None),
        Err(e) => check(
            CHECK_TASK_CLOCK,
            CheckStatus::Missing,
            format!("cannot open task-clock: {e}"),
            Some("check kernel.perf_event_paranoid and seccomp/container policies for perf_event_open"),
        ),
    });

    let (n, bp_err) = count_breakpoints();
    out.push(match n {
        0 => check(
            CHECK_BREAKPOINTS,
            CheckStatus::Missing,
            format!("no hardware breakpoint could be opened: {}", bp_err.map_or(String::new(), |e| e.to_string())),
            Some("Witch needs debug registers; VMs must expose them and containers must allow perf_event_open"),
        ),
        1..=3 => check(
            CHECK_BREAKPOINTS,
            CheckStatus::Degraded,
            format!("{n} free"),
            Some("fewer watchpoints at once: another tool (debugger?) may hold debug registers"),
        ),
        _ => check(CHECK_BREAKPOINTS, CheckStatus::Ok, format!("{n} free"), None),
    });

    out.push(if modify_attributes_supported() {
        check(CHECK_MODIFY, CheckStatus::Ok, "breakpoints are re-targeted with one ioctl".into(), None)
    } else {
        check(
            CHECK_MODIFY,
            CheckStatus::Degraded,
            "not supported: watchpoints are re-armed by close + reopen (slower)".into(),
            Some("Linux >= 4.17 re-arms in one ioctl"),
        )
    });

    out.extend(kernel_patch_checks(KernelCaps::read()));

    out.push(if sigtrap_supported() {
        check(CHECK_SIGTRAP, CheckStatus::Ok, "synchronous SIGTRAP with sig_data".into(), None)
    } else {
        check(
            CHECK_SIGTRAP,
            CheckStatus::Degraded,
            "not supported: signals are routed with F_SETSIG".into(),
            Some("Linux >= 5.13 delivers watchpoint traps synchronously"),
        )
    });

    out.push(match perf_event_paranoid() {
        None => check(
            CHECK_PARANOID,
            CheckStatus::Missing,
            "/proc/sys/kernel/perf_event_paranoid is missing: no perf events in this kernel?".into(),
            Some("use a kernel built with CONFIG_PERF_EVENTS and CONFIG_HAVE_HW_BREAKPOINT"),
        ),
        Some(p) if p <= 2 => check(CHECK_PARANOID, CheckStatus::Ok, format!("{p}: user-space measurement allowed"), None),
        Some(p) if perfmon => check(CHECK_PARANOID, CheckStatus::Ok, format!("{p}: bypassed by CAP_PERFMON/CAP_SYS_ADMIN"), None),
        Some(p) => check(
            CHECK_PARANOID,
            CheckStatus::Missing,
            format!("{p}: unprivileged perf events are disabled"),
            Some("sysctl kernel.perf_event_paranoid=2"),
        ),
    });

    let yn = |bit| if has_cap(caps, bit) { "yes" } else { "no" };
    out.push(check(
        CHECK_CAPS,
        CheckStatus::Ok,
        match caps {
            Some(_) => {
                format!("CAP_PERFMON {}, CAP_SYS_ADMIN {} (not needed: Witch measures user space only)", yn(CAP_PERFMON), yn(CAP_SYS_ADMIN))
            }
            None => "unknown (no CapEff in /proc/self/status); not needed for user-space measurement".into(),
        },
        None,
    ));

    out.push(memlock_check());
    out.push(ptrace_check(caps));
    out.push(step_check(pmu_ok));
    out.push(signal_queue_check(crate::sys::siginfo::queue_limit()));
    out
}
