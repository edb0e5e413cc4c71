#!/usr/bin/env python3
"""One instruction's cost single-stepped vs in the code cache, and a block's
translation, on this machine, side by side in one run.

    python3 benches/window_cost.py              # 5 alternating pairs per program
    python3 benches/window_cost.py --pairs 3

Two sources, one table:

- `cargo bench -p witch-benches --bench window` (benches/benches/window.rs):
  a single step's kernel round trip in a process (trap flag, SIGTRAP to a
  counting handler, sigreturn), and `CodeCache::get` translating the first
  block of each of the C library's functions (cold), per block.
- Profiles of `witch dead` on two programs, run alternately with the
  single-step bursts (`WITCH_WINDOW=0`) and with the code-cache windows
  (the default): what the engine measured itself paying per step
  (`counters.step_ns / steps`: the trap round trip plus witch's handler),
  per instruction run in the cache (`(cache_ns - link_ns - pick_ns) /
  window_instructions`: the copies' running, the program's own work
  included), per window translating blocks through the link stub
  (`link_ns / windows`, the rest of the windows' time in the cache), per exit from the cache (`exit_ns` over
  picks, window ends and translated blocks), and how many blocks a window
  translated. The programs: benches/workloads stencil (a few loops: the
  cache is warm after the first windows) and SQLite (a large code base:
  windows keep meeting code not yet translated).
- The same windows with every exit trapping (`WITCH_LINKS=0`), beside the
  default, where an exit that only asks for a copy goes through the link
  stub without a trap: windows and samples a run at the same budget, and
  the engine's time per block translated (`cache_ns + exit_ns` over
  `cache_blocks`: the translation, the way in and out, and the program's
  instructions run in the cache).
- The same windows with every pick trapping (`WITCH_CACHE_PICKS=0`: the
  exit's trap, then the picked instruction single-stepped natively),
  beside the default, where a pick goes through the link stub and its
  instruction runs from a copy of it alone: windows, picks and judged
  samples (watchpoint traps) a run at the same budget, the engine's
  time a window all told, and a pick's cost to the engine.

Needs `cargo build --release --workspace` first (and builds the bench).
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")
sys.path.insert(0, HERE)
import workloads  # noqa: E402

PROGRAMS = {"stencil": ["128", "250"], "sqlite": ["40", "1500"]}


def bench():
    r = subprocess.run(["cargo", "bench", "-q", "-p", "witch-benches", "--bench", "window"], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("cargo bench --bench window failed:\n" + r.stderr)
    got = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(.+?): ([0-9.]+) us", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got, r.stdout.strip()


def counters(exe, args, env):
    with tempfile.NamedTemporaryFile(suffix=".json", dir=OUT, delete=False) as f:
        out = f.name
    try:
        r = subprocess.run([WITCH, "dead", "-q", "-o", out, exe] + args, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env))
        if r.returncode != 0:
            sys.exit(f"witch dead {exe} exited {r.returncode}: {r.stderr.strip()}")
        with open(out) as fh:
            d = json.load(fh)
    finally:
        os.unlink(out)
    return d["counters"], d["duration_ns"]


def side_by_side(table, modes, n):
    """Rows of `table` ({program: {mode: [(figure, ...) a run]}}): each of
    the `n` figures as median (range) under each of `modes`, the last
    figure to a tenth, the others whole."""
    for name, runs in table.items():
        cells = []
        for k in range(n):
            for mode in modes:
                v = [r[k] for r in runs[mode]]
                fmt = "{:.1f}" if k == n - 1 else "{:.0f}"
                cells.append(f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})" if v else "-")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def pick_figures(c):
    """Windows, picks and watchpoint traps a run, the engine's time a
    window all told (its picks' and traps' included), and what a pick
    cost the engine, µs: taken in the cache, `pick_ns / cache_picks`;
    trapping, an exit's trap (`exit_ns / cache_exits`) and a single step
    (`step_ns / steps`)."""
    w = c.get("windows", 0)
    if c.get("cache_picks"):
        pick = c.get("pick_ns", 0) / c["cache_picks"] / 1e3
    else:
        pick = (c.get("exit_ns", 0) / max(1, c.get("cache_exits", 0)) + c.get("step_ns", 0) / max(1, c.get("steps", 0))) / 1e3
    return (w, c.get("window_picks", 0), c.get("traps", 0), c.get("engine_ns", 0) / max(1, w) / 1e3, pick)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    if not os.path.exists(WITCH):
        sys.exit("build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    t0 = time.monotonic()
    b, raw = bench()
    step_kernel = b.get("single step")
    translate = b.get("translate a block (stores, fast variant)")
    print(f"window_cost.py, {time.strftime('%Y-%m-%d')}, {a.pairs} alternating pairs per program\n")
    print("In-process (benches/benches/window.rs):\n")
    for line in raw.splitlines():
        print("    " + line)
    print("\nFrom the profiles (`witch dead`, medians over the runs):\n")
    print("| program | single-step bursts: µs a step | windows: ns an instruction running in the cache | "
          "µs a window translating at links | "
          "µs an exit that trapped (pick, end, what the link stub left) | blocks translated a window | "
          "window length (instructions) | a step / an instruction in the cache |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    all_steps, all_instr = [], []
    linked, picks = {}, {}
    for name, args in PROGRAMS.items():
        exe = workloads.build_one(name, OUT)[0][0]
        steps, instr, exits, blocks, length, links = [], [], [], [], [], []
        runs = {"links": [], "traps": []}
        picked = {"cache": [], "traps": []}
        for _ in range(a.pairs):
            c, _ = counters(exe, args, {"WITCH_WINDOW": "0"})
            if c.get("steps"):
                steps.append(c["step_ns"] / c["steps"] / 1e3)
            c, _ = counters(exe, args, {})
            if c.get("window_instructions"):
                link = min(c.get("link_ns", 0), c["cache_ns"])
                pick = min(c.get("pick_ns", 0), c["cache_ns"] - link)
                instr.append((c["cache_ns"] - link - pick) / c["window_instructions"])
                links.append(link / max(1, c["windows"]) / 1e3)
                exits.append(c["exit_ns"] / max(1, c.get("cache_exits", 0)) / 1e3)
                blocks.append(c.get("cache_blocks", 0) / max(1, c["windows"]))
                length.append(c["window_instructions"] / max(1, c["windows"]))
            for mode, env in (("links", {}), ("traps", {"WITCH_LINKS": "0"})):
                c = c if mode == "links" else counters(exe, args, env)[0]
                made = max(1, c.get("cache_blocks", 0))
                runs[mode].append((c.get("windows", 0), c.get("samples", 0),
                                   (c.get("cache_ns", 0) + c.get("exit_ns", 0)) / made / 1e3))
                if mode == "links":
                    picked["cache"].append(pick_figures(c))
            picked["traps"].append(pick_figures(counters(exe, args, {"WITCH_CACHE_PICKS": "0"})[0]))
        linked[name] = runs
        picks[name] = picked
        if not steps or not instr:
            print(f"| {name} | no {'steps' if not steps else 'windows'} in its profiles | | | | | | |")
            continue
        s, i = statistics.median(steps), statistics.median(instr)
        all_steps += steps
        all_instr += instr
        print(f"| {name} | {s:.1f} ({min(steps):.1f}-{max(steps):.1f}) | {i:.1f} ({min(instr):.1f}-{max(instr):.1f}) | "
              f"{statistics.median(links):.1f} | {statistics.median(exits):.1f} | {statistics.median(blocks):.1f} | {statistics.median(length):.0f} | "
              f"{1e3 * s / i:.0f}x |", flush=True)
    print("\nLinks through the link stub (the default) against every exit trapping (`WITCH_LINKS=0`), "
          "the same budget, medians (range):\n")
    print("| program | windows a run: links | traps | samples a run: links | traps | "
          "engine µs a block translated: links | traps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    side_by_side(linked, ("links", "traps"), 3)
    print("\nPicks taken in the cache without a trap (the default) against every pick trapping and stepped "
          "natively (`WITCH_CACHE_PICKS=0`), the same budget, medians (range):\n")
    print("| program | windows a run: in the cache | traps | picks a run: in the cache | traps | "
          "judged samples (traps) a run: in the cache | traps | engine µs a window (all told): in the cache | traps | "
          "engine µs a pick: in the cache | traps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    side_by_side(picks, ("cache", "traps"), 5)
    if all_steps and all_instr:
        s, i = statistics.median(all_steps), statistics.median(all_instr)
        print("\nRatios (medians over both programs' runs):\n")
        print(f"- a single step in witch's bursts ({s:.1f} µs) costs {1e3 * s / i:.0f} instructions in the cache "
              f"({i:.1f} ns each)")
        if step_kernel:
            print(f"- the kernel's single-step round trip alone ({step_kernel:.1f} µs) is {1e3 * step_kernel / i:.0f} "
                  "instructions in the cache")
        if translate:
            print(f"- translating a block ({translate:.1f} µs, in process) costs {1e3 * translate / i:.0f} instructions "
                  f"in the cache, {translate / s:.2f} of a burst's single step")
    print(f"\nThis run took {(time.monotonic() - t0) / 60:.1f} minutes.")


if __name__ == "__main__":
    main()
