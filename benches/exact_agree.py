#!/usr/bin/env python3
"""The two exact modes side by side on the bench set's real programs:
`witch CRAFT --exact=step` (single steps under ptrace, no agent) and
`witch CRAFT --exact` (the code cache, every access recorded and judged in
witch), on one small instance of each program (one repetition of its
driver's work: the accuracy bench's steady-state sizes), compared pair by
pair, figure by figure (waste, approximate waste, use, accesses), for the
pairs whose two contexts both lie in the program's executable, as
tests/tests/exact.rs compares them on its own small program.

Every run has address randomization off (`setarch -R`, where there is
one), so each mode gives the same profile every run. What may still
differ, and why (the report prints the pairs that do):
- the program's own behaviour where it depends on where its stack lies:
  the environment differs (the code-cache mode's program gets the agent's
  `LD_PRELOAD` and settings), so the stack starts at another address
  modulo 64, and code that picks its path by a buffer's alignment
  (`memcpy`, `memset`) makes other accesses. The bench measures this
  directly: the code-cache mode runs again with the environment padded by
  one more variable of 1, 17, 33 and 49 bytes, and a pair whose figures change among those runs
  is counted "layout-dependent"; the rest, "unexplained", is what the
  modes themselves disagree on;
- the program's own behaviour where it differs from run to run: a
  program that seeds its hash tables from `getrandom` (Rust's `HashMap`,
  in RustFFT's planner) or from the time (Lua's strings) makes other
  accesses each run, in either mode. The bench runs the code-cache mode
  twice more as it ran first, and a pair whose figures change among
  those identical runs is counted "varies run to run";
- the single steps begin at `exec`, the code cache at the program's entry
  point: a pair whose earlier access ran before it (a C++ static
  constructor's store, say) is only in the single-stepping profile;
- what the agent's wrappers run natively in the code-cache mode
  (`pthread_create`'s part in the C library) is missing there, so a later
  access to those bytes pairs with an earlier one.

    python3 benches/exact_agree.py                         # the six real programs, three crafts
    python3 benches/exact_agree.py --only zstd,fft --crafts dead
    python3 benches/exact_agree.py --show 5                # and up to 5 differing pairs per case

The ptrace mode runs thousands of times slower than native: a case takes
minutes. Needs `cargo build --release --workspace` first.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accuracy  # noqa: E402  (the real programs' sizes and builds)
import workloads  # noqa: E402

FIGURES = ["waste", "approx_waste", "use", "traps"]


def pairs_in(path, exe):
    """(watch address, trap address) -> figures, of the pairs whose two
    contexts lie in the module `exe` (addresses in its file, as
    `addr2line -e EXE` takes them)."""
    p = json.load(open(path))
    mods = [m for m in p.get("modules", []) if os.path.realpath(m.get("path", "")) == os.path.realpath(exe)]
    out = {}
    for m in mods:
        start, end, bias = m["start"], m["end"], m.get("bias", m["start"])
        for t in p.get("threads", []):
            nodes = t["nodes"]
            for pr in t.get("pairs", []):
                w, k = nodes[pr["watch"]]["pc"], nodes[pr["trap"]]["pc"]
                if start <= w < end and start <= k < end:
                    e = out.setdefault((w - bias, k - bias), [0.0] * len(FIGURES))
                    for i, key in enumerate(FIGURES):
                        e[i] += pr.get(key, 0.0) or 0.0
    return out


SETARCH = shutil.which("setarch")

# Environment paddings of the code-cache mode's extra runs (the length of
# one more variable's value): the stack moves by multiples of 16 bytes,
# through every alignment modulo 64.
PADS = [1, 17, 33, 49]
# Identical code-cache runs beside the first (the program's own run-to-run variation).
REPEATS = 2


def run(witch, craft, mode, exe, args, out, timeout, pad=0):
    t = time.perf_counter()
    cmd = [witch, craft, f"--exact={mode}", "-q", "-o", out, exe] + args
    if SETARCH:
        cmd = [SETARCH, "-R"] + cmd
    env = dict(os.environ)
    if pad:
        env["WITCH_BENCH_PAD"] = "x" * pad
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, None
    return time.perf_counter() - t, p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="real", choices=["real", "more", "bench"])
    ap.add_argument("--only", default="", help="comma-separated program names to keep")
    ap.add_argument("--crafts", default="dead,silent-store,silent-load")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    ap.add_argument("--show", type=int, default=3, metavar="N", help="differing pairs to print per case")
    ap.add_argument("--witch", default=accuracy.WITCH)
    a = ap.parse_args()
    names = [n for n in workloads.SETS[a.set] if n in accuracy.REAL_SIZES]
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    print("| program | craft | pairs (both contexts in the program) | the same | differing | of which varies run to run | "
          "layout-dependent | unexplained pairs | their bytes | step s | cache s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    shown = []
    zero = [0.0] * len(FIGURES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            exe = workloads.build_one(name, accuracy.OUT)[0][0]
            args = [accuracy.LUA_SCRIPT if x == "@lua" else x for x in accuracy.REAL_SIZES[name][1]]
            for craft in a.crafts.split(","):
                step_out, cache_out = os.path.join(tmp, f"{name}-{craft}-step.json"), os.path.join(tmp, f"{name}-{craft}-cache.json")
                ts, rs = run(a.witch, craft, "step", exe, args, step_out, a.timeout)
                tc, rc = run(a.witch, craft, "cache", exe, args, cache_out, a.timeout)
                if ts is None or tc is None or not os.path.exists(step_out) or not os.path.exists(cache_out):
                    print(f"| {name} | {craft} | (a run failed or ran over {a.timeout:.0f} s: step {rs}, cache {rc}) | | | | | | | | |")
                    continue
                s, c = pairs_in(step_out, exe), pairs_in(cache_out, exe)
                # The same mode with the stack elsewhere: which pairs move
                # with the layout alone.
                layouts = [c]
                for pad in PADS:
                    out = os.path.join(tmp, f"{name}-{craft}-cache-{pad}.json")
                    if run(a.witch, craft, "cache", exe, args, out, a.timeout, pad)[0] is not None and os.path.exists(out):
                        layouts.append(pairs_in(out, exe))
                # The same mode, the same environment: which pairs change
                # from run to run.
                repeats = [c]
                for i in range(REPEATS):
                    out = os.path.join(tmp, f"{name}-{craft}-cache-again-{i}.json")
                    if run(a.witch, craft, "cache", exe, args, out, a.timeout)[0] is not None and os.path.exists(out):
                        repeats.append(pairs_in(out, exe))
                keys = sorted(set(s).union(*layouts, *repeats))
                differ = [k for k in keys if s.get(k, zero) != c.get(k, zero)]
                varies = {k for k in keys if len({tuple(r.get(k, zero)) for r in repeats}) > 1}
                moves = {k for k in keys if len({tuple(l.get(k, zero)) for l in layouts}) > 1} - varies
                unexplained = [k for k in differ if k not in moves and k not in varies]
                n_varies = sum(1 for k in differ if k in varies)
                total = sum(v[0] + v[1] + v[2] for v in s.values()) or 1.0
                un_bytes = sum(max(abs(s.get(k, zero)[i] - c.get(k, zero)[i]) for i in range(3)) for k in unexplained)
                print(f"| {name} | {craft} | {len(keys)} | {len(keys) - len(differ)} | {len(differ)} | {n_varies} | "
                      f"{len(differ) - len(unexplained) - n_varies} | "
                      f"{len(unexplained)} | {un_bytes:.0f} of {total:.0f} ({100 * un_bytes / total:.2f}%) | {ts:.1f} | {tc:.1f} |", flush=True)
                for k in unexplained[:a.show]:
                    shown.append(f"{name} {craft} <{k[0]:#x}, {k[1]:#x}>: step {s.get(k, zero)}, cache {c.get(k, zero)}")
    if shown:
        print("\nUnexplained differing pairs (addresses in the executable, for `addr2line -e`; figures: " + ", ".join(FIGURES) + "):")
        for line in shown:
            print(line)


if __name__ == "__main__":
    main()
