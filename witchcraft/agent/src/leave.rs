//! A preloaded agent leaves a process before its end because of what the
//! program is about to do: to its debugger ([`leave_to_debugger`]: it
//! asked to be traced), to its own hardware breakpoints
//! ([`leave_to_breakpoints`]) or to a seccomp sandbox ([`leave_to_sandbox`]). An
//! attached agent ends its session instead ([`crate::attach_state`]).

use crate::handlers;
use crate::state::{now_ns, AGENT};
use witchcraft::profile::EndedBy;

pub fn untraced_note(why: &str) -> String {
    format!("not profiled: {why}; its debug registers and signals are left to the debugger")
}

/// The process asked to be traced: stop profiling it, give the debug
/// registers back, and write what it gathered so far.
pub fn leave_to_debugger(why: &str) {
    AGENT.note(untraced_note(why));
    stop_profiling(EndedBy::Traced);
}

/// The program is about to open a hardware breakpoint of its own, which
/// needs a debug register of those witch holds (the open would fail with
/// ENOSPC): stop profiling it, give the debug registers back, and write
/// what it gathered so far.
pub fn leave_to_breakpoints() {
    AGENT.note(format!(
        "profiling stopped {:.3} s in: the program opened a hardware breakpoint of its own (perf_event_open), which needs the debug registers; they and the signals are left to it",
        seconds_in()
    ));
    stop_profiling(EndedBy::Traced);
}

/// The process is about to install a seccomp filter (`how`): once it is in,
/// any system call the agent makes that the filter does not expect may
/// kill the process (a sandbox's filter allows what the program needs,
/// not what a profiler needs). So profiling of this process ends here, for
/// good, before the filter goes in: what it gathered is written, every
/// event closed and the fatal signals' default actions given back. Its
/// forks inherit the filter and stay unprofiled, as do the images it execs
/// (see `init`). If the call fails, profiling stays off.
pub fn leave_to_sandbox(how: &'static str) {
    if !AGENT.set_sandboxed() {
        return;
    }
    AGENT.note(format!(
        "profiling stopped {:.3} s in: the program put itself in {how}, whose filter may kill it for a system call the agent makes; what came after, and any process it starts, is not profiled",
        seconds_in()
    ));
    stop_profiling(EndedBy::Sandbox);
    handlers::give_back_fatal_hooks();
}

/// Seconds since profiling began.
fn seconds_in() -> f64 {
    (now_ns().saturating_sub(AGENT.start_ns())) as f64 / 1e9
}

/// End profiling (`ended_by`): the profile written, every thread's events
/// closed.
fn stop_profiling(ended_by: EndedBy) {
    let mut quiesced = AGENT.finish(ended_by);
    for ts in AGENT.threads.states_quiesced(&mut quiesced) {
        ts.stop();
    }
}
