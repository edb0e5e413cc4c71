//! Heap tracking leaves the program as it was: threads allocating and
//! freeing concurrently with every allocation function, `realloc` that
//! moves, `malloc_usable_size`, anonymous `mmap` grown, moved, shrunk and
//! cut by `mremap` and `munmap` (and calls of these that fail), `fork`
//! (tests/programs/heap_churn.c), and a program with its own `malloc` in
//! the executable (own_malloc.c): the same output and exit status as
//! natively, at a page's threshold, at one that tracks nearly every block,
//! and with tracking off, launched and attached.

use witch_tests::attach::attach_cmd;
use witch_tests::*;

fn same_under_witch(name: &str, args: &[&str], thresholds: &[&str]) {
    let dir = Scratch::new(&format!("heap-{name}"));
    let prog = Program::build(name, dir.path());
    let native = prog.run_native(args);
    assert!(native.code().is_some_and(|c| c >= 5), "native run:\n{}", native.describe());
    assert!(!native.stdout_str().contains("BAD") && !native.stdout_str().contains("NOT"), "native run:\n{}", native.describe());
    for th in thresholds {
        let out = dir.join(&format!("{name}-{th}.json"));
        let run = WitchCmd::new("dead").args(&["-p", "100000", "-q", "--heap-threshold", th]).out(&out).run(&prog.exe, args);
        assert_same_behaviour(&native, &run);
        assert!(out.is_file(), "no profile at {}\n{}", out.display(), run.describe());
    }
}

#[test]
fn threads_realloc_mmap_and_fork_behave_as_without_witch() {
    // 64 bytes: nearly every block of the program is tracked; off: the
    // entries call straight on.
    same_under_witch("heap_churn", &[], &["4096", "64", "off"]);
}

#[test]
fn a_program_with_its_own_malloc_is_left_unharmed() {
    same_under_witch("own_malloc", &[], &["4096", "16"]);
}

#[test]
fn an_attached_session_tracks_without_harm() {
    let dir = Scratch::new("heap-attach");
    let prog = Program::build("heap_churn", dir.path());
    let native = prog.run_native(&[]);
    let child = std::process::Command::new(&prog.exe)
        .arg("150000")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", prog.exe.display()));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let out = dir.join("attached.json");
    let run = attach_cmd(
        &witch_bin(),
        &[],
        "dead",
        child.id(),
        &["--duration", "1s", "-p", "100000", "-q", "--heap-threshold", "64", "-o", out.to_str().unwrap()],
    );
    let done = child.wait_with_output().unwrap();
    assert_eq!(run.code(), Some(0), "attach failed:\n{}", run.describe());
    assert_eq!(done.status.code(), native.code(), "the attached program's exit status");
    assert_eq!(String::from_utf8_lossy(&done.stdout), native.stdout_str(), "the attached program's output");
    assert!(out.is_file(), "no profile at {}", out.display());
}

/// A program linked without PIE that takes `malloc`'s, `free`'s,
/// `syscall`'s and `execve`'s addresses (tests/programs/no_pie_pointers.c):
/// there `dlsym(RTLD_DEFAULT)` gives the program's PLT entry, which jumps
/// through the import entry the attached agent points at itself, and the
/// agent's `malloc` called itself until the stack ran out (Debian's
/// `/usr/bin/python3` died so at its first attach). Attached twice, it
/// runs on and ends as natively.
#[test]
fn a_program_without_pie_that_takes_mallocs_address_survives_attaching() {
    let dir = Scratch::new("heap-no-pie");
    let prog = Program::build_with("no_pie_pointers", dir.path(), "no_pie_pointers", &["-no-pie", "-fno-pie"])
        .unwrap_or_else(|e| panic!("build no_pie_pointers: {e}"));
    let mut target = witch_tests::attach::Target::start(&prog.exe, &["0"], &[]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    for i in 0..2 {
        let out = dir.join(&format!("attached-{i}.json"));
        let run = attach_cmd(
            &witch_bin(),
            &[],
            "dead",
            target.pid(),
            &["--duration", "300ms", "-q", "--heap-threshold", "64", "-o", out.to_str().unwrap()],
        );
        if !target.alive() {
            panic!("attach #{i} killed the program ({}):\n{}", target.how_it_ended(), run.describe());
        }
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
    }
    let end = target.finish();
    let native = prog.run_native(&[&end.rounds.to_string()]);
    assert_eq!((end.code(), end.stdout.as_str()), (native.code(), native.stdout_str().as_ref()), "after two attaches\n{}", end.stderr);
}

/// The program's heap is the program's: witch's agent keeps its own
/// memory out of the C library's heap (and reads the first thread's stack
/// without the thread library's `malloc`), so the program's blocks land
/// where they land natively, sampled or exact. (A program that aligns its
/// tables to absolute addresses, as zstd does, laid them out differently
/// under the agent, and the two exact modes disagreed on the pairs whose
/// bytes one block left to the next.)
#[test]
fn the_programs_heap_is_laid_out_as_natively() {
    let dir = Scratch::new("heap-layout");
    let prog = Program::build("heap_layout", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(7), "native run:\n{}", native.describe());
    assert!(native.stdout_str().contains("at main: arena=0 inuse=0"), "native run:\n{}", native.describe());
    for (craft, extra) in [
        ("dead", &[][..]),
        ("silent-load", &[][..]),
        ("dead", &["--exact"][..]),
        ("silent-store", &["--exact"][..]),
        ("dead", &["--exact=step"][..]),
    ] {
        let out = dir.join(&format!("{craft}-{}.json", extra.len()));
        let run = WitchCmd::new(craft).args(&["-q"]).args(extra).out(&out).run(&prog.exe, &[]);
        assert_same_behaviour(&native, &run);
        assert!(out.is_file(), "no profile at {} ({craft} {extra:?})\n{}", out.display(), run.describe());
    }
}
