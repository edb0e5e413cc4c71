//! The count-proportional software sampler (single-step bursts): it counts
//! accesses rather than time, and it never harms the program it steps.
//!
//! These run whatever sampler witch chooses: on machines without a memory
//! PMU (this project's CI) that is the burst sampler; with a PMU, which
//! counts accesses too, the share test holds as well, and the others check
//! that nothing of witch's leaks into a program that steps itself.

use witch_tests::*;

/// Bursts of up to 32 steps (the default is up to 64, within a 3% overhead
/// budget, which in a VM allows about 8): longer bursts step more of the
/// program through each of its hazards.
/// No overhead budget, so every burst takes all of them.
const BURSTS: [&str; 3] = ["env", "WITCH_BURST=32", "WITCH_OVERHEAD=0"];

/// Shares of dead bytes by watch line (cheap_costly.c's two stores).
fn shares(rep: &Report, prog: &Program) -> (f64, f64) {
    let f = &prog.file;
    let cheap = rep.watched_at(f, prog.line("@cheap")).waste;
    let costly = rep.watched_at(f, prog.line("@costly")).waste;
    let all = (cheap + costly).max(f64::MIN_POSITIVE);
    (cheap / all, costly / all)
}

/// A cheap store beside a costly one, equal in number: counts say half
/// each; time says nearly all of it is the costly one's.
#[test]
fn counts_not_time_cheap_store_beside_a_costly_one() {
    let dir = Scratch::new("burst-shares");
    let prog = Program::build("cheap_costly", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(0), "{}", native.describe());

    // witch's default settings.
    let out = dir.join("count.json");
    let run = WitchCmd::new("dead").arg("-q").out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    rep.assert_samples(60.0);
    let (cheap, costly) = shares(&rep, &prog);
    rep.note(&format!("count-proportional: cheap {cheap:.3}, costly {costly:.3}"));
    assert!((0.35..=0.65).contains(&cheap), "the two stores are equally many: cheap share {cheap:.3}\n{}", rep.dump());

    // The program does tell the two apart: the time-proportional sampler
    // (bursts off) finds nearly all the time at one of the stores.
    if raw_profile(&out)["sampler"]["kind"] == "software" {
        let out = dir.join("time.json");
        let run = WitchCmd::new("dead").wrapper(&["env", "WITCH_BURST=0"]).args(&["-q", "-p", "1000000"]).out(&out).run(&prog.exe, &[]);
        assert_same_behaviour(&native, &run);
        let rep = report(&out);
        let (cheap, _) = shares(&rep, &prog);
        rep.note(&format!("time-proportional: cheap {cheap:.3}"));
        assert!(
            !(0.2..=0.8).contains(&cheap),
            "time-proportional sampling should be lopsided here: cheap share {cheap:.3}\n{}",
            rep.dump()
        );
    }
}

/// A program that single-steps itself sees every one of its own steps and
/// never a step of witch's, through thousands of bursts.
#[test]
fn a_program_that_steps_itself_is_unharmed() {
    let dir = Scratch::new("burst-self-step");
    let prog = Program::build("self_step", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.stdout_str().trim(), "self_step 40000 0 0", "{}", native.describe());
    for craft in ["dead", "silent-load"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).wrapper(&BURSTS).args(&["-q", "-p", "200000"]).out(&out).run(&prog.exe, &[]);
        assert_same_behaviour(&native, &run);
    }
}

/// Signals (one handler leaves with siglongjmp), system calls, vDSO calls,
/// `rep` strings, threads, fork + exec and fork + _exit under thousands of
/// bursts: the same output and exit status as natively, and no trap flag
/// left behind (a leaked one would kill the program with SIGTRAP).
#[test]
fn thousands_of_bursts_leave_the_program_as_it_was() {
    let dir = Scratch::new("burst-stress");
    let prog = Program::build_with("burst_stress", dir.path(), "burst_stress", &["-pthread"]).expect("build burst_stress");
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(5), "{}", native.describe());
    let out = dir.join("stress.json");
    let run = WitchCmd::new("dead").wrapper(&BURSTS).args(&["-q", "-p", "200000"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let p = raw_profile(&out);
    if p["sampler"]["kind"] == "software" {
        let c = &p["counters"];
        let (bursts, steps) = (c["bursts"].as_u64().unwrap_or(0), c["steps"].as_u64().unwrap_or(0));
        eprintln!("[witch-tests] {bursts} bursts, {steps} steps");
        assert!(bursts >= 1000 && steps >= 10_000, "expected thousands of bursts: {bursts} bursts, {steps} steps");
    }
}
