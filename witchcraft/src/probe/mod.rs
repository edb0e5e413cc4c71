//! What this machine offers Witch: PMU memory events, software sampling,
//! debug registers and the perf features around them. Used to pick a sampler
//! automatically and by `witch doctor`; witch's own (the `controller`
//! feature). The breakpoint probes the agent runs too, at its start, are
//! the watchpoints' ([`crate::sys::watchpoint::debug_registers`] and the
//! two beside it).
//!
//! Probes open short-lived perf events on the calling thread and never let
//! them fire.

mod checks;

pub use checks::{
    checks, kernel_patch_checks, signal_queue_check, Check, CheckStatus, CHECK_BRANCH_STACK, CHECK_BREAKPOINTS, CHECK_CAPS, CHECK_IN_PLACE,
    CHECK_MEMLOCK, CHECK_MODIFY, CHECK_NAMES, CHECK_PARANOID, CHECK_PMU, CHECK_PTRACE, CHECK_SIGNAL_QUEUE, CHECK_SIGTRAP, CHECK_STEP,
    CHECK_TASK_CLOCK,
};

use std::path::Path;

use crate::sys::perf::{self, Attr, SoftwareClock};
use crate::sys::siginfo::{self, Origin};

use crate::sys::pmu::{self, AccessKind, PmuEvent, PmuSampler};

fn open_self(a: Attr) -> Result<i32, std::io::Error> {
    a.open(0).map_err(std::io::Error::from_raw_os_error)
}

pub fn perf_event_paranoid() -> Option<i32> {
    read_int("/proc/sys/kernel/perf_event_paranoid")
}

fn read_int(path: &str) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The precise memory events for loads and stores, as discovered in sysfs.
pub fn pmu_events() -> Vec<(String, Result<PmuEvent, String>)> {
    let root = Path::new(pmu::SYSFS_PMU_ROOT);
    vec![("loads".to_string(), pmu::discover(root, AccessKind::Load)), ("stores".to_string(), pmu::discover(root, AccessKind::Store))]
}

/// task-clock is the fallback sampler, so it must open on this thread.
pub fn software_event_ok() -> bool {
    open_task_clock().is_ok()
}

fn open_task_clock() -> Result<(), std::io::Error> {
    open_self(Attr::software_clock(SoftwareClock::Task, 1_000_000)).map(perf::close)
}

/// Open `ev` for real, lowering precise_ip on refusal as the engine would.
fn try_open(ev: &PmuEvent) -> Result<u8, String> {
    let mut ev = ev.clone();
    loop {
        match PmuSampler::open(&ev, 1_000_003) {
            Ok(mut s) => {
                s.close();
                return Ok(ev.precise_ip);
            }
            Err(e) if ev.precise_ip > 1 && e.precise_ip_refused() => ev.precise_ip -= 1,
            Err(e) => return Err(e.to_string()),
        }
    }
}

extern "C" fn on_step(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    use crate::engine::calibrate;
    let uc = uc as *mut libc::ucontext_t;
    // SAFETY: the kernel passed `info` and `uc` to this SA_SIGINFO handler;
    // only this thread runs the measurement, and the handler is installed
    // only for it.
    let (origin, efl) = unsafe { (siginfo::origin(sig, info), &mut (*uc).uc_mcontext.gregs[libc::REG_EFL as usize]) };
    match origin {
        Origin::Step => calibrate::on_step(efl),
        // The `raise` that starts the measurement.
        _ => calibrate::start_stepping(efl),
    }
}

/// What one single step costs this thread (its SIGTRAP round trip and a
/// minimal handler), in ns of CPU time: the cost of the software sampler's
/// bursts. Measured as the agent does at start-up
/// ([`crate::engine::calibrate::measure_steps`]), with a SIGTRAP handler
/// of its own installed for the measurement and restored after it (only
/// for `witch doctor`, never inside a profiled program). None if stepping
/// does not work here.
pub fn single_step_ns() -> Option<u64> {
    const STEPS: u64 = 200;
    let (ns, stepped) = step_this_thread(STEPS)?;
    (stepped >= STEPS / 2).then(|| ns / stepped)
}

/// [`crate::engine::calibrate::measure_steps`] with a SIGTRAP handler of
/// our own for the while: the CPU time and the steps taken.
fn step_this_thread(steps: u64) -> Option<(u64, u64)> {
    // One measurement at a time in this process: the handler and the step
    // count are process-wide.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a process-wide handler swap, restored before returning;
    // witch's own process runs this from its main thread before anything
    // else handles SIGTRAP, and the lock keeps two from overlapping.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_step as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTRAP, &sa, &mut old) != 0 {
            return None;
        }
        let measured = crate::engine::calibrate::measure_steps(steps, || {
            libc::raise(libc::SIGTRAP);
        });
        // The last step clears the trap flag; a few instructions more
        // before the handler goes, in case a stalled step is still due.
        let mut spin = 0u64;
        while spin < 100 {
            spin = std::hint::black_box(spin + 1);
        }
        libc::sigaction(libc::SIGTRAP, &old, std::ptr::null_mut());
        Some(measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::watchpoint::KernelCaps;

    /// The single-step measurement `witch doctor` and the agent share takes
    /// exactly the steps asked for, each costing some CPU time, and leaves
    /// the trap flag clear (else this test process would die of SIGTRAP).
    #[test]
    fn single_steps_are_counted_exactly() {
        for steps in [1, 64, 200] {
            let (ns, stepped) = step_this_thread(steps).expect("sigaction");
            assert_eq!(stepped, steps, "{steps} steps asked");
            assert!(ns >= stepped, "{ns} ns for {stepped} steps");
        }
        let ns = single_step_ns().expect("single steps work here");
        assert!((100..10_000_000).contains(&ns), "a step costs {ns} ns");
    }

    #[test]
    fn the_software_clock_opens() {
        assert!(software_event_ok());
    }

    #[test]
    fn paranoid_is_readable() {
        let p = perf_event_paranoid();
        println!("perf_event_paranoid: {p:?}");
        assert!(p.is_some());
    }

    #[test]
    fn all_checks_present() {
        let cs = checks();
        for c in &cs {
            println!(
                "{:<34} {:<8} {}{}",
                c.name,
                format!("{:?}", c.status),
                c.detail,
                c.advice.as_ref().map(|a| format!(" [{a}]")).unwrap_or_default()
            );
            assert!(!c.detail.is_empty() && !c.detail.contains('\n'), "{c:?}");
        }
        let names: Vec<&str> = cs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, CHECK_NAMES);
        let bp = cs.iter().find(|c| c.name == CHECK_BREAKPOINTS).unwrap();
        assert!(bp.detail.ends_with("free"), "{bp:?}");
        let pmu = cs.iter().find(|c| c.name == CHECK_PMU).unwrap();
        if pmu.status != CheckStatus::Ok {
            assert_eq!(pmu.advice.as_deref(), Some("software task-clock sampling is used instead"));
        }
        let json = serde_json::to_string(&cs[0]).unwrap();
        assert!(
            json.contains("\"status\":\"ok\"") || json.contains("\"status\":\"missing\"") || json.contains("\"status\":\"degraded\""),
            "{json}"
        );
    }

    /// Item: a small signal queue (`ulimit -i 1`) let a 64-thread program
    /// at `-p 1ms` die by SIGIO; doctor says what the limit leaves.
    #[test]
    fn the_signal_queue_limit_is_reported_with_what_it_leaves() {
        let small = signal_queue_check(Some(1));
        assert_eq!(small.status, CheckStatus::Degraded, "{small:?}");
        assert!(small.detail.contains("up to 0 threads") && small.advice.is_some(), "{small:?}");
        let usual = signal_queue_check(Some(62_509));
        assert_eq!(usual.status, CheckStatus::Ok, "{usual:?}");
        assert!(usual.detail.contains("up to 31246 threads"), "{usual:?}");
        assert_eq!(signal_queue_check(None).detail, "unlimited");
    }

    #[test]
    fn kernel_patches_are_reported_each() {
        let stock = kernel_patch_checks(KernelCaps::default());
        assert!(stock[0].detail.starts_with("no (stock kernel)") && stock[1].detail.starts_with("no (stock kernel)"), "{stock:?}");
        let patched = kernel_patch_checks(KernelCaps { modify_in_place: true, branch_stack: Some(false) });
        assert!(patched[0].detail.starts_with("yes") && patched[1].detail.starts_with("patched, but this CPU has no LBR"), "{patched:?}");
        let lbr = kernel_patch_checks(KernelCaps { modify_in_place: true, branch_stack: Some(true) });
        assert!(lbr[1].detail.starts_with("yes"), "{lbr:?}");
        for c in stock.iter().chain(&patched).chain(&lbr) {
            assert_eq!(c.status, CheckStatus::Ok, "a missing optional patch is not a fault: {c:?}");
        }
        // This machine's kernel is as its caps directory says.
        let here = KernelCaps::read();
        assert_eq!(here.modify_in_place, std::path::Path::new(crate::sys::watchpoint::CAPS_DIR).join("modify_in_place").exists());
    }

    #[test]
    fn pmu_events_cover_loads_and_stores() {
        let evs = pmu_events();
        assert_eq!(evs.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["loads", "stores"]);
    }
}
