//! Sampling periods: any period witch accepts is safe for the program.

use witch_tests::*;

/// Reliability item 5: periods of a few µs made perf's software clock queue
/// real-time signals faster than they were handled, until the kernel fell
/// back to SIGIO and killed the program (exit 157, no output). Such periods
/// are now raised to the smallest safe one, which the profile says.
#[test]
fn item_5_small_periods_do_not_kill_the_program() {
    let dir = Scratch::new("period-small");
    let prog = Program::build("dead_loop", dir.path());
    let native = prog.run_native(&[]);
    for p in ["1000", "10000", "20000"] {
        let out = dir.join(&format!("p{p}.json"));
        let run = WitchCmd::new("dead").args(&["-q", "-p", p]).out(&out).run(&prog.exe, &[]);
        assert_same_behaviour(&native, &run);
        let prof = raw_profile(&out);
        if prof["sampler"]["kind"] == "software" {
            let period = prof["sampler"]["period"].as_u64().unwrap_or(0);
            assert!(period >= 100_000, "period {period} ns kept for -p {p}");
            let notes = prof["notes"].to_string();
            assert!(notes.contains("raised to 100000 ns"), "no note on the raised period: {notes}");
        }
    }
}
