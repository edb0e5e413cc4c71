#!/usr/bin/env python3
"""Accuracy of the sampled crafts against the exact reference mode.

For each ground-truth program and craft: the exact waste fraction (witch
--exact on a small instance), and the sampled one (a full-size instance) at
3 periods, as mean and standard deviation over RUNS runs; the overlap of the
top-5 pairs by source line; reservoir vs oldest replacement; 1 vs 4 debug
registers. Fractions are taken over the pairs watched at the program's
marked lines (`/* @name */`), so what a small instance can't amortize (the
loader, libc start-up, initialization loops), which the exact mode also sees,
is left out of both.

    python3 benches/accuracy.py              # markdown tables
    python3 benches/accuracy.py --runs 3     # quicker

Needs `cargo build --release --workspace` first.
"""
import argparse, json, os, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")

# (name, source, craft, marked watch lines, exact args (small), sampled args (full size))
CASES = [
    ("half_dead", "tests/programs/half_dead.c", "dead", ["@first", "@second"], ["64", "3"], []),
    ("tiny_silent", "tests/programs/tiny_silent.c", "silent-store", ["@store"], ["32", "4"], ["65536", "15000"]),
    ("tiny_silent", "tests/programs/tiny_silent.c", "silent-load", ["@load"], ["32", "4"], ["65536", "15000"]),
]


def marked_lines(src, markers):
    with open(os.path.join(ROOT, src)) as f:
        return {i + 1 for i, l in enumerate(f) if any(f"/* {m} */" in l for m in markers)}
PERIODS = ["100000", "1000000", "default"]


def build(name, src):
    exe = os.path.join(OUT, name)
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, os.path.join(ROOT, src)], check=True)
    return exe


def profile(craft, exe, args, opts, out):
    subprocess.run([WITCH, craft, "-q", "-o", out] + opts + [exe] + args,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = subprocess.run([WITCH, "report", out, "--json", "--top", "0"], capture_output=True, check=True)
    return json.loads(r.stdout)


def own(report, src, lines_at):
    """(fraction, top-5 pair lines) over pairs watched at the marked lines."""
    base = os.path.basename(src)
    w = u = 0.0
    lines = []
    for p in report["pairs"]:
        f = p["watch"]["frames"][0] if p["watch"]["frames"] else {}
        t = p["trap"]["frames"][0] if p["trap"]["frames"] else {}
        if (f.get("file") or "").endswith(base) and f.get("line") in lines_at:
            w += p["waste_bytes"]
            u += p["use_bytes"]
            if p["waste_bytes"] > 0 and len(lines) < 5:
                lines.append((f.get("line"), t.get("line")))
    return (w / (w + u) if w + u > 0 else 0.0), lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if not os.path.exists(WITCH):
        sys.exit("benches/accuracy.py: build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    print(f"Sampled vs exact waste fraction (own code), mean ± std over {a.runs} runs\n")
    print("| program | craft | exact | " + " | ".join(f"-p {p}" for p in PERIODS) + " | top-5 overlap | oldest | 1 debug reg |")
    print("|---|---|---:|" + "---:|" * len(PERIODS) + "---:|---:|---:|")
    for name, src, craft, markers, small, big in CASES:
        exe = build(name, src)
        at = marked_lines(src, markers)
        out = os.path.join(OUT, f"acc-{name}-{craft}.json")
        ex_frac, ex_top = own(profile(craft, exe, small, ["--exact"], out), src, at)
        cells, tops = [], None
        for per in PERIODS:
            opts = [] if per == "default" else ["-p", per]
            fr = []
            for _ in range(a.runs):
                f, top = own(profile(craft, exe, big, opts, out), src, at)
                fr.append(f)
                tops = tops or top
            sd = statistics.stdev(fr) if len(fr) > 1 else 0.0
            cells.append(f"{100*statistics.mean(fr):.1f} ± {100*sd:.1f}")
        overlap = len(set(ex_top) & set(tops or [])) / max(1, len(ex_top))
        old, _ = own(profile(craft, exe, big, ["-p", PERIODS[0], "--replacement", "oldest"], out), src, at)
        one, _ = own(profile(craft, exe, big, ["-p", PERIODS[0], "--debug-registers", "1"], out), src, at)
        print(f"| {name} | {craft} | {100*ex_frac:.1f} | " + " | ".join(cells)
              + f" | {100*overlap:.0f}% | {100*old:.1f} | {100*one:.1f} |")


if __name__ == "__main__":
    main()
