#!/usr/bin/env python3
"""The exact modes' slowdown: native, `--exact=cache` (the code cache,
every access recorded and judged), `--exact=step` (single steps under
ptrace) and witch's sampled default, side by side, for one craft (the
dead craft unless --craft says otherwise).

The ptrace mode is thousands of times slower, so it runs on the small
input only (half_dead's known answer at a small size); the code-cache mode
and the default also run the bench set's programs at their real sizes.
Each run is capped (--timeout seconds); a capped run shows as "> T".

    python3 benches/exact_speed.py                 # half_dead small, and the ci set
    python3 benches/exact_speed.py --set none      # the small input only
    python3 benches/exact_speed.py --reps 3 --timeout 600
    python3 benches/exact_speed.py --craft silent-load
    python3 benches/exact_speed.py --witch BUILD/witch   # another build (its agent beside it)
    python3 benches/exact_speed.py --judges --reps 3     # one judge against one per processor, threaded program

Needs `cargo build --release --workspace` first.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITCH = os.path.join(ROOT, "target", "release", "witch")
OUT = os.path.join(ROOT, "target", "bench")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from overhead import TUNABLES  # noqa: E402  (what witch gives the programs it runs)


def timed(cmd, env, timeout):
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=timeout)
        return time.perf_counter() - t, p.returncode
    except subprocess.TimeoutExpired:
        return None, None


def note(path, prefix, contains=""):
    try:
        p = json.load(open(path))
    except (OSError, ValueError):
        return ""
    return next((n for n in p.get("notes", []) if n.startswith(prefix) and contains in n), "")


def alternate(cmd, env, runs, timeout):
    """One round: a native run of `cmd` before each of `runs` ((name, witch
    command, environment added to `env`)) and one after the last (this VM's
    native times moved up to 60% between single runs, so a round's native
    time is the median of its own). The native runs that finished, and
    each run's seconds by name (None: over `timeout`)."""
    natives, times = [], {}
    for name, witch_cmd, extra in runs:
        natives.append(timed(cmd, env, timeout)[0])
        times[name], _ = timed(witch_cmd, dict(env, **extra), timeout)
    natives.append(timed(cmd, env, timeout)[0])
    return [x for x in natives if x is not None], times


def small_program():
    exe = os.path.join(OUT, "half_dead")
    src = os.path.join(ROOT, "tests", "programs", "half_dead.c")
    subprocess.run(["cc", "-O2", "-g", "-o", exe, src], check=True)
    return {"half_dead 256 4 (small)": [exe, "256", "4"], "half_dead 262144 20": [exe, "262144", "20"]}


def judges_table(a):
    """The code-cache exact mode with one judge against one per processor
    (WITCH_JUDGES unset), on benches/exact_threads.c at 1, 2 and 4 busy
    threads: each judge takes whole recording threads, so a program with
    several busy threads is judged on several processors."""
    exe = os.path.join(OUT, "exact_threads")
    subprocess.run(["cc", "-O2", "-g", "-pthread", "-o", exe, os.path.join(ROOT, "benches", "exact_threads.c")], check=True)
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    env.pop("WITCH_JUDGES", None)
    print(f"{a.craft} craft, exact_threads (each thread sorts, copies and sums its own array), {a.reps} round(s); "
          f"wall-time ratios to the median native run of the round (one before each witch run, one after the last), medians over the rounds.\n")
    print("| program threads | native s | one judge: x | one judge per processor: x | judges | one judge / per processor |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for threads, reps in ((1, 1200), (2, 600), (4, 300)):
            cmd = [exe, str(threads), str(reps)]
            one, many, tns, says = [], [], [], ""
            for r in range(a.reps):
                out = {mode: os.path.join(d, f"{mode}{r}.json") for mode in ("one", "many")}
                runs = [(mode, [a.witch, a.craft, "-q", "-o", out[mode], "--exact", "--"] + cmd, extra)
                        for mode, extra in (("one", {"WITCH_JUDGES": "1"}), ("many", {}))]
                natives, times = alternate(cmd, env, runs, a.timeout)
                if None in times.values():
                    sys.exit(f"benches/exact_speed.py: a run of {cmd} took over {a.timeout:.0f} s")
                n = note(out["many"], "exact from the code cache:", "the judge took")
                says = n.split("(", 1)[1].split(")", 1)[0] if "(" in n else ""
                tn = statistics.median(natives)
                tns.append(tn)
                one.append(times["one"] / tn)
                many.append(times["many"] / tn)
            o, m = statistics.median(one), statistics.median(many)
            print(f"| {threads} | {statistics.median(tns):.3f} | {o:.1f} | {m:.1f} | {says} | {o / m:.2f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="ci", help="workload set at real sizes (ci, real, more, bench; none: the small input only)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    ap.add_argument("--craft", default="dead", choices=["dead", "silent-store", "silent-load"])
    ap.add_argument("--witch", default=WITCH, help="the witch binary to measure (default: this tree's release build)")
    ap.add_argument("--only", default="", help="comma-separated program names to run (default: all)")
    ap.add_argument("--judges", action="store_true",
                    help="instead: one judge against one per processor, on a program of 1, 2 and 4 busy threads")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if a.judges:
        return judges_table(a)
    progs = small_program()
    if a.set != "none":
        progs.update(workloads.build(OUT, a.set))
    if a.only:
        keep = a.only.split(",")
        progs = {k: v for k, v in progs.items() if any(k.split()[0] == o for o in keep)}
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    print(f"{a.craft} craft, {a.reps} round(s), median wall-time ratios to the median native run of the same round (one before each witch run, one after the last; the native column: their median and range); runs capped at {a.timeout:.0f} s.\n")
    print("| program | native s | exact=cache x | exact=step x | default x | cache records | judge: ns a record, busy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for name, cmd in progs.items():
            small = "(small)" in name
            rows = {"cache": [], "step": [], "default": []}
            tns = []
            rec, judge = "", ""
            for r in range(a.reps):
                runs = [(mode, [a.witch, a.craft, "-q", "-o", os.path.join(d, f"{mode}{r}.json")] + opts + ["--"] + cmd, {})
                        for mode, opts in (("cache", ["--exact"]), ("step", ["--exact=step"]), ("default", []))
                        if mode != "step" or small]
                natives, times = alternate(cmd, env, runs, a.timeout)
                out = os.path.join(d, f"cache{r}.json")
                if times["cache"] is not None:
                    n = note(out, "exact from the code cache:", "judged")
                    rec = n.split(":", 1)[1].split(",")[0].strip() if n else ""
                    # The judge's CPU time per record, and its share of
                    # the run (near 100%: the judge set the pace).
                    j = note(out, "exact from the code cache:", "the judge took")
                    if j and "ns a record" in j and "busy" in j:
                        per = j.split("), ", 1)[1].split(" ns")[0]
                        busy = j.split("busy ", 1)[1].split(" ")[0]
                        judge = f"{per}, {busy}"
                tn = statistics.median(natives)
                tns.extend(natives)
                for mode, t in times.items():
                    rows[mode].append(None if t is None else t / tn)

            def cell(v):
                if not v:
                    return "-"
                if any(x is None for x in v):
                    return f"> {a.timeout / statistics.median(tns):.0f}"
                return f"{statistics.median(v):.1f}"

            spread = f" ({min(tns):.2f}-{max(tns):.2f})" if len(tns) > 1 else ""
            print(f"| {name} | {statistics.median(tns):.3f}{spread} | {cell(rows['cache'])} | {cell(rows['step'])} "
                  f"| {cell(rows['default'])} | {rec} | {judge} |", flush=True)


if __name__ == "__main__":
    main()
