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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402  (real programs built from crate-bundled sources)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")

# (name, source, craft, marked watch lines (None: every line of the source), exact args (small), sampled args (full size))
CASES = [
    ("half_dead", "tests/programs/half_dead.c", "dead", ["@first", "@second"], ["64", "3"], []),
    ("tiny_silent", "tests/programs/tiny_silent.c", "silent-store", ["@store"], ["32", "4"], ["65536", "15000"]),
    ("tiny_silent", "tests/programs/tiny_silent.c", "silent-load", ["@load"], ["32", "4"], ["65536", "15000"]),
]
# The kernel workloads of benches/workloads.py, all three crafts. The exact
# mode is too slow for their full runs, so both sides measure the steady
# state of one configuration: the exact fraction is the difference between
# two short runs that differ only in the repeated part (sweeps, steps,
# lookups), which cancels start-up and initialization; the sampled run
# repeats that part long enough (~1 s) for them not to matter. Pairs count
# when their watch context passes through the workload's source file (all
# of main and what it calls); pairs are named by their innermost lines there.
# name -> (exact args, exact args with more repetitions, sampled args)
WORKLOAD_SIZES = {
    # 60 sweeps let the 6^3 grid's transient die down; 8 more are two
    # periods of its driven boundary (one period, 4 sweeps, is under the 5%
    # of the run that the difference needs to be told apart).
    "stencil": (["6", "60"], ["6", "68"], ["6", "6000000"]),
    "nbody": (["12", "2"], ["12", "4"], ["12", "800000"]),
    "linear_search": (["60", "1024"], ["60", "2048"], ["60", "9000000"]),
    "hash_collide": (["100", "100"], ["100", "200"], ["100", "7000000"]),
}
WORKLOAD_CASES = [(w, f"benches/workloads/{w}.c", c, None, (lo, hi), big)
                  for w, (lo, hi, big) in WORKLOAD_SIZES.items()
                  for c in ["dead", "silent-store", "silent-load"]]
# The real programs of benches/workloads.py, built by it, measured in the
# same steady state; pairs count under their driver's main and are named by
# their innermost frames' lines. One repetition of the repeated part is
# 0.4M instructions for zstd (compress and decompress 4 KiB), 2.5M for SQLite
# (a whole session on 40 rows) and 1.5M for Lua (bench.lua at scale 0.0001),
# so the exact runs take 20 s to 3 minutes each here, the set about half an
# hour; it runs on demand (--set real), not in `all`.
# name -> (driver source, exact args, exact args with one more repetition,
# sampled args); "@lua" is benches/workloads/bench.lua.
REAL_SIZES = {
    "zstd": ("benches/workloads/zstd_driver.c", ["4k", "3", "1"], ["4k", "3", "2"], ["4k", "3", "15000"]),
    "sqlite": ("benches/workloads/sqlite_driver.c", ["40", "1"], ["40", "2"], ["40", "2000"]),
    "lua": ("benches/workloads/lua_main.c", ["@lua", "0.0001", "1"], ["@lua", "0.0001", "2"], ["@lua", "0.0001", "2500"]),
}
REAL_NAMES = {os.path.basename(v[0]) for v in REAL_SIZES.values()}
REAL_CASES = [(w, src, c, None, (lo, hi), big)
              for w, (src, lo, hi, big) in REAL_SIZES.items()
              for c in ["dead", "silent-store", "silent-load"]]


def marked_lines(src, markers):
    if markers is None:
        return None
    with open(os.path.join(ROOT, src)) as f:
        return {i + 1 for i, l in enumerate(f) if any(f"/* {m} */" in l for m in markers)}
PERIODS = ["100000", "1000000", "default"]


def build(name, src):
    exe = os.path.join(OUT, name)
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, os.path.join(ROOT, src), "-lm"], check=True)
    return exe


def profile(craft, exe, args, opts, out):
    subprocess.run([WITCH, craft, "-q", "-o", out] + opts + [exe] + args,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = subprocess.run([WITCH, "report", out, "--json", "--top", "0"], capture_output=True, check=True)
    if "--exact" in opts:
        # A reference that lost pairs is no reference.
        with open(out) as f:
            lost = sum(t["counters"].get("pair_overflow", 0) + t["counters"].get("tree_overflow", 0)
                       for t in json.load(f).get("threads", []))
        if lost:
            sys.exit(f"benches/accuracy.py: the exact run of {exe} {' '.join(args)} lost {lost} pairs or contexts")
    return json.loads(r.stdout)


def pair_sums(report, src, lines_at, by_pc=False):
    """{(watch line, trap line): [waste, use]} over the pairs that count (see above).
    by_pc: keyed by the watched instruction instead ((module, offset), None).
    For a real program (an interpreter, where everything runs under one line
    of the driver), lines are the innermost frames' ("file:line")."""
    base = os.path.basename(src)
    here = lambda fr: (fr.get("file") or "").endswith(base)  # noqa: E731
    sums = {}
    for p in report["pairs"]:
        wf = [fr for fr in p["watch"]["frames"] if here(fr)]
        tf = [fr for fr in p["trap"]["frames"] if here(fr)]
        if lines_at is None:
            if not wf:
                continue
        elif not (p["watch"]["frames"] and here(p["watch"]["frames"][0]) and p["watch"]["frames"][0].get("line") in lines_at):
            continue
        if by_pc:
            f0 = p["watch"]["frames"][0]
            key = ((os.path.basename(f0.get("module") or ""), f0.get("offset")), None)
        elif REAL_NAMES & {base}:
            w0, t0 = p["watch"]["frames"][0], p["trap"]["frames"][0]
            line = lambda f: f"{os.path.basename(f.get('file') or '?')}:{f.get('line')}"  # noqa: E731
            key = (line(w0), line(t0))
        else:
            key = (wf[0].get("line"), tf[0].get("line") if tf else None)
        s = sums.setdefault(key, [0.0, 0.0])
        s[0] += p["waste_bytes"]
        s[1] += p["use_bytes"]
    return sums


def summarize(sums):
    """(fraction, top-5 pair keys by waste)."""
    w = sum(v[0] for v in sums.values())
    u = sum(v[1] for v in sums.values())
    top = [k for k, v in sorted(sums.items(), key=lambda kv: -kv[1][0]) if v[0] > 0][:5]
    return (w / (w + u) if w + u > 0 else 0.0), top


def own(report, src, lines_at):
    return summarize(pair_sums(report, src, lines_at))


def steady(lo, hi):
    """Per-pair difference hi - lo: the repeated part alone."""
    return {k: [hi.get(k, [0, 0])[0] - lo.get(k, [0, 0])[0], hi.get(k, [0, 0])[1] - lo.get(k, [0, 0])[1]]
            for k in set(lo) | set(hi)}


def by_watch_line(sums):
    """{watch line: [waste, use]}: the pairs summed over their trap lines."""
    out = {}
    for (wl, _), (w, u) in sums.items():
        s = out.setdefault(wl, [0.0, 0.0])
        s[0] += w
        s[1] += u
    return out


def bias(exact, sampled):
    """Splits a sampled-vs-exact gap in two (see the README's Accuracy section).

    Overall fraction = sum over watch sites L (lines, or instructions) of
    weight(L) x fraction(L). The
    weights are where the sampler looks (bytes watched at L, a share of all);
    the per-line fractions are what it finds there. Re-weighting the sampled
    per-line fractions by the exact weights keeps what the sampler found and
    removes where it looked: if that lands on the exact fraction, the gap was
    the sampling distribution (time- instead of count-proportional), not the
    classification. Returns (reweighted fraction, share of the exact weight on
    lines the sampler saw, [(line, sampled share / exact share)] by ratio).
    """
    ex, sa = by_watch_line(exact), by_watch_line(sampled)
    et = sum(max(0.0, sum(v)) for v in ex.values())
    st = sum(sum(v) for v in sa.values())
    if et <= 0 or st <= 0:
        return float("nan"), 0.0, []
    num = den = seen = 0.0
    ratios = []
    for line, v in ex.items():
        w = max(0.0, sum(v))
        if w <= 0:
            continue
        s = sa.get(line)
        if s and sum(s) > 0:
            num += w * s[0] / sum(s)
            den += w
            seen += w
        ratios.append((line, (sum(s) / st if s else 0.0) / (w / et)))
    ratios.sort(key=lambda r: r[1])
    return (num / den if den > 0 else float("nan")), seen / et, ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--set", default="all", choices=["all", "ground-truth", "workloads", "real"],
                    help="all = ground-truth + workloads; real (zstd, SQLite, Lua; ~30 minutes) runs only on demand")
    ap.add_argument("--only", default="", help="comma-separated program names to keep")
    ap.add_argument("--crafts", default="", help="comma-separated crafts to keep (run crafts in parallel processes to use more cores)")
    a = ap.parse_args()
    cases = {"all": CASES + WORKLOAD_CASES, "ground-truth": CASES, "workloads": WORKLOAD_CASES,
             "real": REAL_CASES}[a.set]
    if a.only:
        cases = [c for c in cases if c[0] in a.only.split(",")]
    if a.crafts:
        cases = [c for c in cases if c[2] in a.crafts.split(",")]
    if not os.path.exists(WITCH):
        sys.exit("benches/accuracy.py: build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    print(f"Sampled vs exact waste fraction (own code), mean ± std over {a.runs} runs\n")
    print("| program | craft | exact | " + " | ".join(f"-p {p}" for p in PERIODS) + " | top-5 overlap | top-3 same | oldest | 1 debug reg |")
    print("|---|---|---:|" + "---:|" * len(PERIODS) + "---:|---:|---:|---:|")
    bias_rows = []
    for name, src, craft, markers, small, big in cases:
        if name in REAL_SIZES:
            exe = workloads.build_one(name, OUT)[0][0]
            lua = lambda args: [os.path.join(ROOT, "benches/workloads/bench.lua") if x == "@lua" else x for x in args]  # noqa: E731
            small = tuple(lua(x) for x in small)
            big = lua(big)
        else:
            exe = build(name, src)
        at = marked_lines(src, markers)
        out = os.path.join(OUT, f"acc-{name}-{craft}.json")
        if isinstance(small, tuple):
            rlo = profile(craft, exe, small[0], ["--exact"], out)
            rhi = profile(craft, exe, small[1], ["--exact"], out)
            lo, hi = pair_sums(rlo, src, at), pair_sums(rhi, src, at)
            ex_sums = steady(lo, hi)
            ex_pc = steady(pair_sums(rlo, src, at, True), pair_sums(rhi, src, at, True))
            ex_frac, ex_top = summarize(ex_sums)
            d = sum(sum(v) for v in steady(lo, hi).values())
            # Too little of the repeated part to tell (or it isn't steady).
            if d < 0.05 * sum(sum(v) for v in hi.values()) or not 0.0 <= ex_frac <= 1.0:
                ex_frac = float("nan")
        else:
            rex = profile(craft, exe, small, ["--exact"], out)
            ex_sums, ex_pc = pair_sums(rex, src, at), pair_sums(rex, src, at, True)
            ex_frac, ex_top = summarize(ex_sums)
        cells, tops, pooled, pooled_pc = [], None, {}, {}
        for per in PERIODS:
            opts = [] if per == "default" else ["-p", per]
            fr = []
            for _ in range(a.runs):
                rep = profile(craft, exe, big, opts, out)
                sums = pair_sums(rep, src, at)
                f, top = summarize(sums)
                if per == PERIODS[0]:
                    for into, got in ((pooled, sums), (pooled_pc, pair_sums(rep, src, at, True))):
                        for k, v in got.items():
                            acc = into.setdefault(k, [0.0, 0.0])
                            acc[0] += v[0]
                            acc[1] += v[1]
                fr.append(f)
                tops = tops or top
            sd = statistics.stdev(fr) if len(fr) > 1 else 0.0
            cells.append(f"{100*statistics.mean(fr):.1f} ± {100*sd:.1f}")
        overlap = len(set(ex_top) & set(tops or [])) / max(1, len(ex_top)) if ex_top or tops else 1.0
        same3 = "yes" if set(ex_top[:3]) == set((tops or [])[:3]) else "no"
        old, _ = own(profile(craft, exe, big, ["-p", PERIODS[0], "--replacement", "oldest"], out), src, at)
        one, _ = own(profile(craft, exe, big, ["-p", PERIODS[0], "--debug-registers", "1"], out), src, at)
        ex_cell = "n/a" if ex_frac != ex_frac else f"{100*ex_frac:.1f}"
        print(f"| {name} | {craft} | {ex_cell} | " + " | ".join(cells)
              + f" | {100*overlap:.0f}% | {same3} | {100*old:.1f} | {100*one:.1f} |", flush=True)
        if ex_frac == ex_frac:
            rw, seen, ratios = bias(ex_sums, pooled)
            rw_pc, seen_pc, _ = bias(ex_pc, pooled_pc)
            sf, _ = summarize(pooled)
            fmt = lambda rs: ", ".join(f"{l}: {r:.2f}" for l, r in rs)  # noqa: E731
            bias_rows.append(f"| {name} | {craft} | {100*ex_frac:.1f} | {100*sf:.1f} | "
                             + ("n/a" if rw != rw else f"{100*rw:.1f}") + f" | {100*seen:.0f}% | "
                             + ("n/a" if rw_pc != rw_pc else f"{100*rw_pc:.1f}")
                             + f" | {100*seen_pc:.0f}% | {fmt(ratios[:2])} | {fmt(ratios[::-1][:2])} |")
    if bias_rows:
        print(f"\nWhere the sampler looks vs what it finds (-p {PERIODS[0]}, runs pooled). "
              "Re-weighted: the sampled per-line fractions weighted by the exact per-line bytes "
              "(by line: the watch context's innermost line in the workload's file; by instruction: "
              "the watched instruction, in any module). Ratios: a watch line's share of sampled bytes "
              "over its share of exact bytes.\n")
        print("| program | craft | exact | sampled | re-weighted by line | exact weight seen | "
              "re-weighted by instruction | exact weight seen | least sampled (line: ratio) | most sampled |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
        for r in bias_rows:
            print(r)


if __name__ == "__main__":
    main()
