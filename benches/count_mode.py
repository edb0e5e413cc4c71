#!/usr/bin/env python3
"""Whole-run counting (`-e sw-stores`, `-e sw-loads`) beside native runs and
witch's default sampler, measured side by side in one run.

For each workload and craft, runs the program natively, under witch at its
defaults, and under witch with the software access counter, alternately
(REPS rounds), and reports the median wall-time ratio of each mode to the
native run of its round, the waste fraction each mode reports, and for the
counter how much of the run its windows covered (instructions in windows),
how often a system call or code the cache does not run ended a window, how
often a breakpoint took the thread back into the cache after it, and how
often it ran natively until the next tick instead (a gap).

    python3 benches/count_mode.py                  # the ci workload set, 3 rounds
    python3 benches/count_mode.py --set real --reps 5
    python3 benches/count_mode.py --period 1000003

Needs `cargo build --release --workspace` first.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from overhead import TUNABLES  # noqa: E402  (what witch gives the programs it runs)

CRAFTS = {"dead": "sw-stores", "silent-store": "sw-stores", "silent-load": "sw-loads"}


def timed(cmd, env):
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t, p.returncode


def counters(path):
    p = json.load(open(path))
    c = {}
    for proc in [p] + p.get("processes", []):
        for t in proc.get("threads", []):
            for k, v in t.get("counters", {}).items():
                if isinstance(v, (int, float)):
                    c[k] = c.get(k, 0) + v
    return p, c


def fraction(path):
    out = subprocess.run([WITCH, "report", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        return float("nan")
    j = json.loads(out.stdout)
    for k in ("waste_fraction", "fraction"):
        if k in j:
            return 100.0 * j[k]
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="ci")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--period", default="5000003", help="the counter's period, in accesses")
    ap.add_argument("--crafts", default=",".join(CRAFTS))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    progs = workloads.build(OUT, a.set)
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    print(f"Period {a.period} accesses, {a.reps} rounds; wall-time ratios to the native run of the same round (median).\n")
    print("| program | craft | default x | counter x | default waste % | counter waste % | counter windows | instructions in windows | windows cut | resumed at a breakpoint | gaps to the next tick | picks |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for name, cmd in progs.items():
            for craft in a.crafts.split(","):
                rd, rc, fd, fc, cs = [], [], [], [], []
                for r in range(a.reps):
                    tn, _ = timed(cmd, env)
                    pd, pc = os.path.join(d, f"d{r}.json"), os.path.join(d, f"c{r}.json")
                    td, _ = timed([WITCH, craft, "-q", "-o", pd, "--"] + cmd, env)
                    tc, _ = timed([WITCH, craft, "-q", "-e", CRAFTS[craft], "-p", a.period, "-o", pc, "--"] + cmd, env)
                    rd.append(td / tn)
                    rc.append(tc / tn)
                    fd.append(fraction(pd))
                    fc.append(fraction(pc))
                    cs.append(counters(pc)[1])
                c = cs[-1]
                print(f"| {name} | {craft} | {statistics.median(rd):.2f} | {statistics.median(rc):.2f} "
                      f"| {statistics.mean(fd):.1f} | {statistics.mean(fc):.1f} | {c.get('windows', 0)} "
                      f"| {c.get('window_instructions', 0):,} | {c.get('windows_cut', 0)} | {c.get('window_resumes', 0)} "
                      f"| {c.get('window_gaps', 0)} | {c.get('window_picks', 0)} |",
                      flush=True)


if __name__ == "__main__":
    main()
