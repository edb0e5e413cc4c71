#!/usr/bin/env python3
"""Overhead of witch over native, measured side by side in one run.

For each workload, craft and sampling period, runs the program natively and
under `witch` alternately (REPS pairs), and reports the median of the pairs'
wall-time ratios, the CPU-time and peak-RSS ratios (the largest maxrss in the
process tree, which under witch is the profiled program, not the small
launcher), and the engine's own cost as the profile measures it; then per
setting the geometric mean with a bootstrap 95% interval, and the worst case.

    python3 benches/overhead.py                     # real workloads, markdown tables
    python3 benches/overhead.py --set ci --reps 1     # the fast subset
    python3 benches/overhead.py --set ground-truth    # the test programs
    python3 benches/overhead.py --startup             # the fixed cost per process (--before OTHER/witch: beside another build's)
    python3 benches/overhead.py --threads             # memory with many threads
    python3 benches/overhead.py --set ci --heap       # what tracking heap objects costs

Needs `cargo build --release --workspace` first. Workloads are compiled here
with gcc -O2 -g into target/bench/.

Native runs get the GLIBC_TUNABLES that witch sets for the programs it runs
(glibc's memset/memcpy avoid `rep stosb`/`rep movsb`, which any armed
watchpoint slows ~50x), so the ratio is witch's own cost; `--plain-native`
compares with an untouched environment instead.
"""
import argparse, math, os, resource, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402  (real programs built from crate-bundled sources)

# Ground-truth programs: name -> (source, args)
GROUND_TRUTH = {
    "dead_loop": ("tests/programs/dead_loop.c", []),
    "listing_4_3": ("tests/programs/listing_4_3.c", []),
    "silent_float": ("tests/programs/silent_float.c", []),
    "redundant_load": ("tests/programs/redundant_load.c", []),
    # 80% of its stored bytes dead, most by memset: what a memset-heavy
    # program pays (--plain-native: against glibc's own rep stosb).
    "memset_dead": ("tests/programs/memset_dead.c", ["100000"]),
    # Millions of malloc/free: what heap tracking costs (compare with
    # --witch-env WITCH_HEAP_THRESHOLD=off; docs/OBJECTS.md).
    "alloc_heavy": ("benches/alloc_heavy.c", []),
}
CRAFTS = ["dead", "silent-store", "silent-load"]


def build(name, src):
    exe = os.path.join(OUT, name)
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, os.path.join(ROOT, src), "-lpthread"], check=True)
    return exe


TUNABLES = ("glibc.cpu.x86_rep_stosb_threshold=0x7fffffffffffffff:"
            "glibc.cpu.x86_rep_movsb_threshold=0x7fffffffffffffff")


def run(cmd, env=None):
    """Wall time, CPU time (user + system, the process tree) and max RSS (KiB) of one run."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    return time.perf_counter() - t, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def engine_share(prof):
    """The engine's own measured cost (handlers, trap and signal round trips)
    as a share of the profiled threads' run time, from the profile."""
    try:
        import json
        with open(prof) as f:
            d = json.load(f)
        return d["counters"]["engine_ns"] / max(1, d["duration_ns"])
    except (OSError, ValueError, KeyError):
        return float("nan")


def bootstrap_geomean(per_workload, draws=2000, seed=1):
    """95% interval of the geomean over workloads of each one's median pair
    ratio, resampling each workload's pairs."""
    import random
    rng = random.Random(seed)
    gms = []
    for _ in range(draws):
        logs = []
        for ratios in per_workload:
            pick = [rng.choice(ratios) for _ in ratios]
            logs.append(math.log(statistics.median(pick)))
        gms.append(math.exp(sum(logs) / len(logs)))
    gms.sort()
    return gms[int(0.025 * draws)], gms[int(0.975 * draws) - 1]


# Tiny inputs of the real workloads, for --startup: runs of 10-25 ms, where
# witch's fixed cost per process dominates; and a shell running the tiny
# zstd run ten times over (a run of eleven processes: a build, a test
# suite).
STARTUP = {"sqlite": ["2000"], "lua": ["@lua", "0.01"], "zstd": ["1", "3"]}
SHELL_RUNS = 10


def startup(reps, before=None):
    """Median wall time of tiny runs: native, witch with no sample (the fixed
    cost: launcher, agent start-up and calibration, profile), witch default;
    with `before` (another build's witch), its run with no sample beside
    this build's, alternating."""
    med = statistics.median
    print(f"witch's fixed cost per process, median of {reps} runs of each (ms)\n")
    cols = ["workload", "native", "witch, no samples", "witch, default", "fixed cost"]
    if before:
        cols += ["before: witch, no samples", "before: fixed cost"]
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * (len(cols) - 1))
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    cmds = {}
    for w, args in STARTUP.items():
        argv = workloads.build_one(w, OUT)[0]
        cmds[w] = [argv[0]] + [os.path.join(ROOT, "benches/workloads/bench.lua") if x == "@lua" else x for x in args]
    zstd = " ".join(cmds["zstd"])
    cmds[f"sh: zstd x{SHELL_RUNS}"] = ["sh", "-c", f"for i in $(seq {SHELL_RUNS}); do {zstd}; done"]
    # The tiny zstd run again, each run after 2 s without any (the first
    # per-thread perf event on an idle machine pays the kernel's enabling of
    # its scheduler hooks; a second after the last one closes, it is off).
    cmds["zstd, after 2 s idle"] = cmds["zstd"]
    for w, argv in cmds.items():
        prof = os.path.join(OUT, f"startup-{w.split(':')[0].split(',')[0]}.json")
        idle = "idle" in w
        n, z, d, b = [], [], [], []
        for _ in range(reps):
            time.sleep(2 if idle else 0)
            n.append(run(argv, env)[0])
            time.sleep(2 if idle else 0)
            z.append(run([WITCH, "dead", "-q", "-o", prof, "-p", str(10**15)] + argv)[0])
            time.sleep(2 if idle else 0)
            d.append(run([WITCH, "dead", "-q", "-o", prof] + argv)[0])
            if before:
                time.sleep(2 if idle else 0)
                b.append(run([before, "dead", "-q", "-o", prof, "-p", str(10**15)] + argv)[0])
        row = [w, f"{1e3*med(n):.1f}", f"{1e3*med(z):.1f}", f"{1e3*med(d):.1f}", f"{1e3*(med(z)-med(n)):.1f}"]
        if before:
            row += [f"{1e3*med(b):.1f}", f"{1e3*(med(b)-med(n)):.1f}"]
        print("| " + " | ".join(row) + " |")


# Many threads alive at once (tests/programs/many_threads.c: each stores
# into an array of its own, then all wait until every one is alive), for
# --threads: THREADS and ROUNDS.
THREADS = [(64, 2000), (250, 2000), (2000, 200)]


def many_threads(reps):
    """Peak memory and address space of many threads, natively and under
    `witch dead` (median of REPS runs each), as the program reads them when
    all its threads are alive."""
    import json
    exe = build("many_threads", "tests/programs/many_threads.c")
    prof = os.path.join(OUT, "many-threads.json")
    med = statistics.median

    def peak(cmd):
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        w = p.stderr.split()
        return int(w[w.index("peak_rss_kib") + 1]), int(w[w.index("peak_vm_kib") + 1])

    print(f"many threads, median of {reps} runs each: peak RSS and address space when all are alive (MiB)\n")
    print("| threads | native RSS | witch RSS | memory × | more per thread (KiB) | threads profiled | native address space | witch address space |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, rounds in THREADS:
        argv = [exe, str(n), str(rounds)]
        nat = [peak(argv) for _ in range(reps)]
        wit = [peak([WITCH, "dead", "-q", "-o", prof] + argv) for _ in range(reps)]
        with open(prof) as f:
            failed = json.load(f)["counters"].get("threads_failed", 0)
        nr, wr = med(r for r, _ in nat), med(r for r, _ in wit)
        nv, wv = med(v for _, v in nat), med(v for _, v in wit)
        print(f"| {n} | {nr / 1024:.1f} | {wr / 1024:.1f} | {wr / nr:.2f} | {(wr - nr) / n:.0f} | {n - failed} | {nv / 1024:.0f} | {wv / 1024:.0f} |")


def heap_cost(cmds, reps, craft, native_env, witch_env, thresholds):
    """What tracking heap objects costs: per workload, REPS rounds of a
    native run, `witch CRAFT` with heap tracking off and at each of
    THRESHOLDS ('default': witch's own), all in a rotating order (so no
    setting always runs first, after the build, or next to another's cache
    state); the median over rounds of each setting's ratio to the round's
    native run, of CPU time (user + system of the process tree: less
    sensitive than wall time to what the shared machine's other work takes
    away) and of wall time, and the ratio of peak RSS with tracking to
    without. The CPU time with tracking over that without, round by round,
    is the cost itself; its interval is a bootstrap of the median over
    rounds."""
    med = statistics.median
    tracked = [(t, [] if t == "default" else ["--heap-threshold", t]) for t in thresholds]
    settings = [("native", None), ("off", ["--heap-threshold", "off"])] + tracked
    print(f"heap tracking's cost, `witch {craft}` at the default period, {reps} rounds of native, tracking off and "
          f"tracking at {', '.join(thresholds)} (rotating order): median over rounds of the ratio to the round's "
          "native run\n")
    ts = [t for t, _ in tracked]
    cols = (["workload", "native cpu s", "cpu × off"] + [f"cpu × {t}" for t in ts]
            + [f"cpu {t} / off (95% interval)" for t in ts] + ["wall × off"] + [f"wall × {t}" for t in ts]
            + [f"peak RSS {t} / off" for t in ts])
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * (len(cols) - 1))
    for w, argv in cmds.items():
        got = {k: [] for k, _ in settings}
        for r in range(reps):
            k0 = r % len(settings)
            for k, opt in settings[k0:] + settings[:k0]:
                if opt is None:
                    got[k].append(run(argv, native_env))
                else:
                    prof = os.path.join(OUT, f"{w}-heap-{k}.json")
                    got[k].append(run([WITCH, craft, "-q", "-o", prof] + opt + argv, witch_env))
        ratio = lambda k, i: med(x[i] / n[i] for x, n in zip(got[k], got["native"]))  # noqa: E731
        cells = [w, f"{med(x[1] for x in got['native']):.2f}", f"{ratio('off', 1):.3f}"]
        cells += [f"{ratio(t, 1):.3f}" for t in ts]
        for t in ts:
            rel = [d[1] / o[1] for d, o in zip(got[t], got["off"])]
            lo, hi = bootstrap_geomean([rel])
            cells.append(f"{med(rel):.3f} ({lo:.3f}–{hi:.3f})")
        cells += [f"{ratio('off', 0):.3f}"] + [f"{ratio(t, 0):.3f}" for t in ts]
        cells += [f"{med(x[2] for x in got[t]) / med(x[2] for x in got['off']):.3f}" for t in ts]
        print("| " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--startup", action="store_true", help="only the fixed cost per process, on tiny runs")
    ap.add_argument("--before", metavar="WITCH",
                    help="with --startup: another build's witch, its fixed cost beside this build's")
    ap.add_argument("--threads", action="store_true", help="only memory with many threads")
    ap.add_argument("--heap", action="store_true",
                    help="only what heap tracking costs: native, tracking off, default threshold side by side "
                         "(the first of --crafts, the default period)")
    ap.add_argument("--heap-thresholds", default="default", metavar="LIST",
                    help="with --heap: the thresholds to compare with tracking off (comma-separated; 'default' is "
                         "witch's own, 4k, 64, ...)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--periods", default="default,1000000,20000000",
                    help="comma-separated; 'default' = witch's own default; 'none' = a period longer than "
                         "any run, so no samples: the fixed cost alone (launcher, agent start-up, profile)")
    ap.add_argument("--crafts", default=",".join(CRAFTS))
    ap.add_argument("--set", default="all", choices=["ci", "real", "all", "ground-truth"],
                    help="real workloads (benches/workloads.py: ci subset, real, or all), or the ground-truth programs")
    ap.add_argument("--only", default="", help="comma-separated workload names to keep")
    ap.add_argument("--plain-native", action="store_true", help="native runs without witch's GLIBC_TUNABLES")
    ap.add_argument("--witch-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in witch's environment (repeatable), e.g. WITCH_BURST=0 for the time-proportional "
                         "software sampler")
    a = ap.parse_args()
    witch_env = dict(os.environ, **dict(e.split("=", 1) for e in a.witch_env)) if a.witch_env else None
    native_env = None if a.plain_native else dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    if not os.path.exists(WITCH):
        sys.exit("benches/overhead.py: build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    if a.startup:
        return startup(max(a.reps, 15), a.before)
    if a.threads:
        return many_threads(min(a.reps, 3))
    if a.set == "ground-truth":
        cmds = {w: [build(w, src)] + args for w, (src, args) in GROUND_TRUTH.items()}
    else:
        cmds = workloads.build(OUT, a.set)
    if a.only:
        keep = set(a.only.split(","))
        cmds = {k: v for k, v in cmds.items() if k in keep}
    if a.heap:
        return heap_cost(cmds, a.reps, a.crafts.split(",")[0], native_env, witch_env, a.heap_thresholds.split(","))
    periods = a.periods.split(",")
    rows, by_setting = [], {}
    for w, argv in cmds.items():
        exe, args = argv[0], argv[1:]
        for craft in a.crafts.split(","):
            for per in periods:
                popt = {"default": [], "none": ["-p", str(10**15)]}.get(per, ["-p", per])
                prof = os.path.join(OUT, f"{w}-{craft}.json")
                nat, wit, ncpu, wcpu, nrss, wrss, eng = [], [], [], [], [], [], []
                # Alternating pairs: this VM's speed drifts by up to ±10% between
                # runs, and a pair's two runs see about the same machine.
                for _ in range(a.reps):
                    t, c, r = run([exe] + args, native_env); nat.append(t); ncpu.append(c); nrss.append(r)
                    t, c, r = run([WITCH, craft, "-q", "-o", prof] + popt + [exe] + args, witch_env); wit.append(t); wcpu.append(c); wrss.append(r)
                    eng.append(engine_share(prof))
                med = statistics.median
                pairs = [x / n for x, n in zip(wit, nat)]
                tr = med(pairs)
                cr = med([x / n for x, n in zip(wcpu, ncpu)])
                mr = med(wrss) / med(nrss)
                en = med(eng)
                rows.append((w, craft, per, med(nat), med(wit), tr, cr, mr, en))
                by_setting.setdefault((craft, per), []).append((tr, cr, mr, en, pairs))
    print(f"witch overhead, {a.reps} alternating native/witch pairs each: median pair ratio (witch / native) of wall time\n"
          "and of the process tree's CPU time, peak RSS, and the engine's own measured cost (handlers and the\n"
          "kernel's trap and signal paths, from the profile) as a share of the run"
          + (f"; witch's environment: {' '.join(a.witch_env)}" if a.witch_env else "") + "\n")
    print("| workload | craft | period | native s | witch s | time × | cpu × | memory × | engine % |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for w, c, p, n, x, tr, cr, mr, en in rows:
        print(f"| {w} | {c} | {p} | {n:.3f} | {x:.3f} | {tr:.3f} | {cr:.3f} | {mr:.2f} | {100*en:.2f} |")
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    print("\n| craft | period | time × geomean (95% interval) | time × worst | cpu × geomean | memory × geomean | memory × worst | engine % mean |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (c, p), v in by_setting.items():
        t, cpu, m, en = [x[0] for x in v], [x[1] for x in v], [x[2] for x in v], [x[3] for x in v]
        lo, hi = bootstrap_geomean([x[4] for x in v])
        ens = [e for e in en if e == e]
        print(f"| {c} | {p} | {gm(t):.3f} ({lo:.3f}–{hi:.3f}) | {max(t):.3f} | {gm(cpu):.3f} | {gm(m):.2f} | {max(m):.2f} | "
              f"{100*statistics.mean(ens) if ens else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
