use super::*;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};

/// A shell waiting in `wait4` for a `sleep`, then exiting 7, with its
/// C library's `getpid` and `usleep`.
fn waiting_shell() -> (Child, Target, u64, u64) {
    let child = Command::new("/bin/sh").args(["-c", "sleep 0.5; exit 7"]).spawn().expect("a shell runs");
    std::thread::sleep(Duration::from_millis(150));
    let target = Target::inspect(child.id() as i32).expect("the shell can be inspected");
    let libc = target.object(super::super::target::is_c_library).expect("the shell maps the C library").clone();
    let [Some(getpid), Some(usleep)] = target.symbols(&libc, &["getpid", "usleep"]).unwrap()[..] else {
        panic!("the C library has getpid and usleep")
    };
    (child, target, getpid, usleep)
}

fn restoring(target: &Target) -> (Return, Return) {
    let code = target.return_code();
    let sr = code.sigreturn.expect("the C library has a signal return");
    let store = code.store_rax.expect("the C library has a mov %rax,(%rbx); pop %rbx; ret");
    (Return::Restore(sr), Return::RestoreKeeping(sr, store))
}

#[test]
fn a_kept_result_comes_back_through_memory_and_the_thread_goes_on() {
    let (mut child, target, getpid, _) = waiting_shell();
    let (_, keeping) = restoring(&target);
    let t = Tracee::stop_safely(&target).unwrap();
    let called = t.call(getpid, &[], keeping).unwrap();
    assert_eq!(called.rax, Some(child.id() as u64));
    t.resume();
    assert_eq!(child.wait().unwrap().code(), Some(7), "the shell's wait went on");
}

/// What a controller killed during a call leaves: the kernel detaches,
/// and the thread runs on from the call.
#[test]
fn a_call_whose_controller_is_gone_puts_the_thread_back_itself() {
    for keep in [false, true] {
        let (mut child, target, _, usleep) = waiting_shell();
        let (restore, keeping) = restoring(&target);
        let t = Tracee::stop_safely(&target).unwrap();
        t.start(usleep, &[Arg::Int(20_000)], if keep { keeping } else { restore }).unwrap();
        // SAFETY: detaches our stopped tracee, as the kernel does when its tracer dies.
        assert_eq!(unsafe { libc::ptrace(libc::PTRACE_DETACH, t.tid, 0, 0) }, 0);
        let status = child.wait().unwrap();
        assert_eq!((status.code(), status.signal()), (Some(7), None), "keeping rax: {keep}");
    }
}
