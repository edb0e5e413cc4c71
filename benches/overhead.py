#!/usr/bin/env python3
"""Overhead of witch over native, measured side by side in one run.

For each workload, craft and sampling period, runs the program natively and
under `witch` alternately (REPS times each), and reports the median wall-time
ratio and the peak-RSS ratio (the largest maxrss in the process tree, which
under witch is the profiled program, not the small launcher), with the
geometric mean and worst case.

    python3 benches/overhead.py                     # real workloads, markdown tables
    python3 benches/overhead.py --set ci --reps 1     # the fast subset
    python3 benches/overhead.py --set ground-truth    # the test programs

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--periods", default="default,500000,10000000",
                    help="comma-separated; 'default' = witch's own default; 'none' = a period longer than "
                         "any run, so no samples: the fixed cost alone (launcher, agent start-up, profile)")
    ap.add_argument("--crafts", default=",".join(CRAFTS))
    ap.add_argument("--set", default="all", choices=["ci", "all", "ground-truth"],
                    help="real workloads (benches/workloads.py: ci subset or all), or the ground-truth programs")
    ap.add_argument("--only", default="", help="comma-separated workload names to keep")
    ap.add_argument("--plain-native", action="store_true", help="native runs without witch's GLIBC_TUNABLES")
    a = ap.parse_args()
    native_env = None if a.plain_native else dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    if not os.path.exists(WITCH):
        sys.exit("benches/overhead.py: build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    if a.set == "ground-truth":
        cmds = {w: [build(w, src)] + args for w, (src, args) in GROUND_TRUTH.items()}
    else:
        cmds = workloads.build(OUT, a.set)
    if a.only:
        keep = set(a.only.split(","))
        cmds = {k: v for k, v in cmds.items() if k in keep}
    periods = a.periods.split(",")
    rows, by_setting = [], {}
    for w, argv in cmds.items():
        exe, args = argv[0], argv[1:]
        for craft in a.crafts.split(","):
            for per in periods:
                popt = {"default": [], "none": ["-p", str(10**15)]}.get(per, ["-p", per])
                prof = os.path.join(OUT, f"{w}-{craft}.json")
                nat, wit, ncpu, wcpu, nrss, wrss = [], [], [], [], [], []
                for _ in range(a.reps):
                    t, c, r = run([exe] + args, native_env); nat.append(t); ncpu.append(c); nrss.append(r)
                    t, c, r = run([WITCH, craft, "-q", "-o", prof] + popt + [exe] + args); wit.append(t); wcpu.append(c); wrss.append(r)
                med = statistics.median
                tr = med(wit) / med(nat)
                cr = med(wcpu) / med(ncpu)
                mr = med(wrss) / med(nrss)
                rows.append((w, craft, per, med(nat), med(wit), tr, cr, mr))
                by_setting.setdefault((craft, per), []).append((tr, cr, mr))
    print(f"witch overhead, median of {a.reps} alternating runs each (witch / native: wall time,"
          " CPU time of the process tree, peak RSS)\n")
    print("| workload | craft | period | native s | witch s | time × | cpu × | memory × |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for w, c, p, n, x, tr, cr, mr in rows:
        print(f"| {w} | {c} | {p} | {n:.3f} | {x:.3f} | {tr:.3f} | {cr:.3f} | {mr:.2f} |")
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    print("\n| craft | period | time × geomean | time × worst | cpu × geomean | cpu × worst | memory × geomean |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (c, p), v in by_setting.items():
        t, cpu, m = [x[0] for x in v], [x[1] for x in v], [x[2] for x in v]
        print(f"| {c} | {p} | {gm(t):.3f} | {max(t):.3f} | {gm(cpu):.3f} | {max(cpu):.3f} | {gm(m):.2f} |")


if __name__ == "__main__":
    main()
