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

The acceptance report (--accept) judges one or more sampler configurations
on the real programs (zstd, SQLite, Lua, PCRE2, simdjson, RustFFT; --set
more: libwebp, Expat, tree-sitter) against exact references:

    python3 benches/accuracy.py --set real --exact-only     # the references (minutes each, once)
    python3 benches/accuracy.py --set real --accept         # today's default sampler
    python3 benches/accuracy.py --set real --accept --witch-args "-e cpu-timer -p 1000000"
    python3 benches/accuracy.py --set real --accept --witch-args "WITCH_BURST=0"   # leading NAME=value: environment

What a real program's exact reference is (the reports say which, on their
"Exact references:" line, and --summarize keeps the two apart):

- The same command (the default): `witch CRAFT --exact=cache` of exactly
  the command the sampled runs use (the same binary and arguments, SAME_SIZES,
  and the same environment apart from witch's own settings: the leading
  NAME=value words of --witch-args that reach the program, see program_env,
  go to the exact run too), reduced by the same pair filter, with nothing
  subtracted. Both sides then see the same work, start-up included (under
  0.1% of these runs), so nothing is left to cancel; the sizes are small
  enough (about half a second natively) for the code cache's exact mode
  to make a reference in a minute or two.
- The steady state (--steady-state): the difference of two small
  `--exact=step` runs (REAL_SIZES: 1 and 2 repetitions), against sampled
  runs that repeat the work for longer (REAL_SIZES' last element). The
  subtraction is kept where start-up would dominate the exact run: where
  it has to be small, as the single-stepped mode's (thousands of times
  native) must; it also makes again the tables measured before the same
  command. The kernel workloads (--set workloads, all) keep their steady
  states and the ground-truth programs their small instances, as before.

Exact references are cached in target/bench/exact/ (--exact-cache DIR to
use another checkout's), keyed by program, craft, arguments, the workload
binary's contents, the reduction this script applies, the exact mode
(step or cache) and the sources that make its judgements (EXACT_SOURCES,
per mode, plus the decoder crate's version), the environment given to the
program, and the version of the craft's exact semantics (EXACT_SEMANTICS:
--reuse-exact takes another build's reference only of the same version);
--recompute-exact runs them again. A reference whose run lost pairs
("tables overflowed"), did not exit 0, had malformed records or ran
natively unrecorded (the code cache's "ran natively unrecorded" note) is
refused, never cached.

Needs `cargo build --release --workspace` first.
"""
import argparse, glob, gzip, hashlib, json, os, re, shlex, statistics, subprocess, sys, time

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
    # Half the stored bytes by one `rep stosb` per round (fast strings: one
    # quick instruction, thousands of accesses), half by a loop: where time
    # and counts part most.
    ("rep_vs_loop", "benches/rep_vs_loop.c", "dead", ["@rep", "@loop"], (["4096", "3"], ["4096", "4"]), ["4096", "2000000"]),
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
# The real programs of benches/workloads.py, built by it from release sources
# at -O2 -g; pairs count under their driver's main and are named by their
# innermost frames' lines. --set real runs on demand, not in `all`. Their
# steady state (--steady-state): one repetition of the repeated part is kept
# small enough for the single-stepped exact runs to take minutes (sizes and
# timings: docs/ACCURACY.md); the sampled runs repeat it for a second or
# more. name -> (driver source, exact args, exact args with one more
# repetition, sampled args); "@lua" is benches/workloads/bench.lua. By
# default both sides run SAME_SIZES instead (below).
REAL_SIZES = {
    "zstd": ("benches/workloads/zstd_driver.c", ["4k", "3", "1"], ["4k", "3", "2"], ["4k", "3", "15000"]),
    "sqlite": ("benches/workloads/sqlite_driver.c", ["40", "1"], ["40", "2"], ["40", "2000"]),
    "lua": ("benches/workloads/lua_main.c", ["@lua", "0.0001", "1"], ["@lua", "0.0001", "2"], ["@lua", "0.0001", "2500"]),
    "pcre2": ("benches/workloads/pcre2_driver.c", ["2", "1"], ["2", "2"], ["2", "10000"]),
    "simdjson": ("benches/workloads/simdjson_driver.cpp", ["32", "1"], ["32", "2"], ["32", "8000"]),
    "fft": ("benches/workloads/fft_driver.rs", ["3600", "2", "1"], ["3600", "2", "2"], ["3600", "2", "30000"]),
    # --set more: three more real programs of other kinds. One repetition
    # (instructions by valgrind's cachegrind): a 32x32 picture encoded and
    # decoded, 2.0 M; an 8 KiB document parsed, 0.6 M; two C functions
    # parsed, walked, edited and re-parsed, 2.8 M.
    "webp": ("benches/workloads/webp_driver.c", ["32", "1"], ["32", "2"], ["32", "6000"]),
    "expat": ("benches/workloads/expat_driver.c", ["8", "1"], ["8", "2"], ["8", "15000"]),
    "treesitter": ("benches/workloads/treesitter_driver.c", ["2", "1"], ["2", "2"], ["2", "3000"]),
}
# The same command (the default for the real programs): the sampled runs and
# the exact reference run one command, these arguments, in full. Sized for
# about half a second natively, so that the code cache's exact mode (30-165
# times native by program and craft, docs/OVERHEAD.md) makes one reference in at most
# a minute or two. Native wall (user + sys) seconds, three runs each, by
# `/usr/bin/time -f "%e %U %S" target/bench/NAME ARGS` on the 2-core VM
# (load average 1.4-2.3 from other sessions; 2026-11-28):
#   zstd 4k 3 15000            0.61 0.60 0.61   (also the steady state's sampled size)
#   sqlite 40 2000             0.57 0.55 0.53   (also the steady state's sampled size)
#   lua bench.lua 0.0001 1500  0.52 0.51 0.52
#   pcre2 2 4500               0.54 0.51 0.54
#   simdjson 32 6000           0.83 0.76 0.77   (its exact mode is among the fastest, ~50x)
#   fft 3600 2 9000            0.51 0.50 0.49
#   webp 32 3000               0.48 0.59 0.51
#   expat 8 10000              0.57 0.75 0.58
#   treesitter 2 2000          0.48 0.53 0.48
# (The steady state's sampled sizes above ran 0.6-1.8 s by the same
# command that day: fft 3600 2 30000 1.65-1.76 s, pcre2 2 10000 1.07-1.25 s.)
# Start-up (the loader, run-time initialization, input generation, FFT
# planning: a one-repetition run less its repeated part, docs/ACCURACY.md's
# steady-state table) is under 0.1% of these runs' instructions, and the
# same on both sides. name -> args (the last, the repetitions).
SAME_SIZES = {
    "zstd": ["4k", "3", "15000"],
    "sqlite": ["40", "2000"],
    "lua": ["@lua", "0.0001", "1500"],
    "pcre2": ["2", "4500"],
    "simdjson": ["32", "6000"],
    "fft": ["3600", "2", "9000"],
    "webp": ["32", "3000"],
    "expat": ["8", "10000"],
    "treesitter": ["2", "2000"],
}
REAL_NAMES = {os.path.basename(v[0]) for v in REAL_SIZES.values()}
REAL_CASES = [(w, src, c, None, (lo, hi), big)
              for w, (src, lo, hi, big) in REAL_SIZES.items()
              for c in ["dead", "silent-store", "silent-load"]]
SET_CASES = {s: [c for c in REAL_CASES if c[0] in workloads.SETS[s]] for s in ("real", "more", "bench")}
LUA_SCRIPT = os.path.join(ROOT, "benches/workloads/bench.lua")

# The sources whose code makes the exact mode's judgements, per exact mode
# (a change to the code of any of them, not to its comments or layout, or to
# the decoder crate's version, keys new references of that mode). Both
# modes: the judge (the crafts' definitions, shadow memory, comparisons,
# exact/judge/), the context tree and pair table, the decoder, exact.rs and
# exact/output.rs (the profile's threads both modes make); the single
# steps' mode also exact/step.rs. The code cache's mode (`--exact=cache`)
# also: what may run in the cache (engine/cache.rs, sys/vdso.rs), the
# agent's heap entries and allocator (where the program's blocks land, and
# which allocation calls are recorded: agent/src/heap.rs, heap/, alloc.rs),
# how records are made (the recording
# copies of x86/translate/, the records of x86/record.rs, the engine's own
# records of instructions the cache does not copy, engine/recording.rs),
# buffered, taken back and published (engine/recorder.rs, engine/window.rs,
# exact/ring.rs, exact/stream.rs), where a whole-run window leaves the cache
# and comes back (engine/cache_exit.rs, engine/resume.rs), and how witch
# replays them (exact/reader.rs, exact/replay.rs, exact/string.rs) into the
# profile (witchd's cmd/exact.rs). Test files (tests.rs) are not in the build: left out.
EXACT_JUDGE = ["witchcraft/src/exact.rs", "witchcraft/src/exact/output.rs", "witchcraft/src/exact/judge/*.rs", "witchcraft/src/exact/shadow.rs",
               "witchcraft/src/x86/decode.rs", "witchcraft/src/context.rs", "witchcraft/src/craft/*.rs",
               "witchcraft/src/pair.rs", "witchcraft/src/sys/mem.rs"]
EXACT_SOURCES = {
    "step": EXACT_JUDGE + ["witchcraft/src/exact/step.rs"],
    "cache": EXACT_JUDGE + ["witchcraft/src/exact/reader.rs", "witchcraft/src/exact/replay.rs", "witchcraft/src/exact/string.rs",
                            "witchcraft/src/engine/cache.rs", "witchcraft/src/sys/vdso.rs",
                            "witchcraft/agent/src/heap.rs", "witchcraft/agent/src/heap/*.rs", "witchcraft/agent/src/heap_entry.c",
                            "witchcraft/agent/src/alloc.rs",
                            "witchcraft/src/exact/stream.rs", "witchcraft/src/exact/ring.rs",
                            "witchcraft/src/x86/record.rs", "witchcraft/src/x86/translate/*.rs",
                            "witchcraft/src/engine/recorder.rs", "witchcraft/src/engine/recording.rs",
                            "witchcraft/src/engine/window.rs", "witchcraft/src/engine/cache_exit.rs",
                            "witchcraft/src/engine/resume.rs", "witchd/src/cmd/exact.rs"],
}
# Bumped whenever pair_sums' reduction (what a cached reference stores) changes.
CACHE_FORMAT = 1
# What the exact mode's judgements of each craft mean, as a version per
# craft: bumped whenever they change on purpose. It is part of every
# reference's key, and --reuse-exact (references of another build of the
# exact mode) reuses only references of the same version, so a reference
# made under other semantics is never taken for one of these. A reference
# cached before versions existed is version 1.
# silent-store, silent-load 2: each value (a float, a scalar, a vector's
# element) judged by itself and each byte credited to its own previous
# access (RedSpy/LoadSpy component semantics); 1 judged a whole access
# against the previous access of its first byte. Dead stores are unchanged.
EXACT_SEMANTICS = {"dead": 1, "silent-store": 2, "silent-load": 2}


def marked_lines(src, markers):
    if markers is None:
        return None
    with open(os.path.join(ROOT, src)) as f:
        return {i + 1 for i, l in enumerate(f) if any(f"/* {m} */" in l for m in markers)}
PERIODS = ["100000", "1000000", "default"]


def build(name, src):
    if name in workloads.SETS["all"]:
        return workloads.build_one(name, OUT)[0][0]
    exe = os.path.join(OUT, name)
    # Path-independent, like workloads.py's builds (the exact cache keys by contents).
    subprocess.run(["gcc", f"-ffile-prefix-map={ROOT}=.", "-O2", "-g", "-o", exe, os.path.join(ROOT, src), "-lm"],
                   check=True, cwd=ROOT)
    return exe


def timed(cmd, env=None):
    """Run `cmd` (output discarded); (exit status, wall seconds, CPU seconds
    of the process tree: user and system)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - t0, ru.ru_utime + ru.ru_stime


def run_witch(craft, exe, args, opts, out, env=None, cpu=False):
    """One witch run writing the profile `out`, with `env` added to the
    environment; returns (exit status, seconds), and with `cpu` the CPU
    seconds of the process tree too."""
    nice = ["nice", "-n", "19"] if any(o.startswith("--exact") for o in opts) else []
    code, wall, used = timed(nice + [WITCH, craft, "-q", "-o", out] + opts + [exe] + args,
                             dict(os.environ, **env) if env else None)
    return (code, wall, used) if cpu else (code, wall)


def run_native(exe, args):
    """(wall, CPU) seconds of one native run of the program, in the
    environment a user runs it in (no witch, no GLIBC_TUNABLES of witch's)."""
    return timed([exe] + args)[1:]


def report_of(out):
    r = subprocess.run([WITCH, "report", out, "--json", "--top", "0"], capture_output=True, check=True)
    return json.loads(r.stdout)


def profile(craft, exe, args, opts, out):
    run_witch(craft, exe, args, opts, out)
    return report_of(out)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_FINGERPRINT = {}
AGENT = "libwitch_agent.so"  # the engine, in the program: it makes the code cache's records


def exact_fingerprint(how="step"):
    """Hash of the sources of exact mode `how` ("step" or "cache",
    EXACT_SOURCES) and the decoder crate's locked version. Refuses a list
    that names a file no longer there (the code moved: the list must follow
    it), and a witch binary older than the sources (for the code cache,
    the agent beside it too, whose engine makes the records), which would
    not be the build those sources describe."""
    if how not in _FINGERPRINT:
        files = set()
        for g in EXACT_SOURCES[how]:
            found = [f for f in glob.glob(os.path.join(ROOT, g)) if os.path.basename(f) != "tests.rs"]
            if not found:
                sys.exit(f"benches/accuracy.py: {g} (EXACT_SOURCES) matches no file; update the list to where "
                         "the exact mode's code is now")
            files.update(found)
        files = sorted(files)
        newest = max(os.stat(f).st_mtime for f in files)
        built = [WITCH] + ([os.path.join(os.path.dirname(WITCH), AGENT)] if how == "cache" else [])
        for b in built:
            if not os.path.exists(b) or os.stat(b).st_mtime < newest:
                sys.exit(f"benches/accuracy.py: {b} is missing or older than the exact mode's sources; "
                         "cargo build --release --workspace")
        # Of each file's code with comments, white space and commas left
        # out, in sorted order: reformatting (rustfmt) and moving whole files
        # leave the key alone; any change to the code changes it.
        codes = []
        for f in files:
            with open(f) as fh:
                text = re.sub(r"//[^\n]*", "", fh.read())
            codes.append(re.sub(r"[\s,]+", "", text))
        h = hashlib.sha256()
        for c in sorted(codes):
            h.update(c.encode() + b"\0")
        with open(os.path.join(ROOT, "Cargo.lock")) as fh:
            lock = fh.read()
        at = lock.find('name = "iced-x86"')
        h.update(lock[at:at + 60].encode() if at >= 0 else b"?")
        _FINGERPRINT[how] = h.hexdigest()
    return _FINGERPRINT[how]


REUSED = set()  # exact-mode builds whose references --reuse-exact used


class NotCached(Exception):
    """--cached-only and an exact reference that isn't in the cache."""


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def exact_reference(craft, exe, args, src, lines_at, a, how="step", env=None):
    """Pair sums of one exact run ({"line": ..., "pc": ..., "meta": ...}),
    from the cache or computed (and cached). Refuses a lossy run.

    how: the exact mode, "step" (`--exact=step`, single steps: the steady
    state's small runs) or "cache" (`--exact=cache`, the code cache: the
    same command as the sampled runs). env: what the sampled runs' command
    adds to the program's environment (program_env), given to the exact run
    too (the code cache's mode only)."""
    shown = ["@lua" if x == LUA_SCRIPT else x for x in args]
    run_env = dict(env or {}) if how == "cache" else {}
    key_parts = {
        "format": CACHE_FORMAT, "craft": craft, "semantics": EXACT_SEMANTICS[craft],
        "program": os.path.basename(exe), "args": shown,
        "binary": sha256_file(exe), "exact": exact_fingerprint(how), "src": os.path.basename(src),
        "lines": sorted(lines_at) if lines_at is not None else None,
        "script": sha256_file(LUA_SCRIPT) if "@lua" in shown else None,
        "env": {k: run_env.get(k, os.environ.get(k))
                for k in sorted({"GLIBC_TUNABLES", "WITCH_KEEP_REP_STRINGS"} | set(run_env))},
    }
    # A single-stepped reference's key has no mode (as before modes were
    # keyed): its cached references and --reuse-exact's keep matching.
    if how != "step":
        key_parts["mode"] = how
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:20]
    infix = "" if how == "step" else f"{how}-"
    path = os.path.join(a.exact_cache, f"{os.path.basename(exe)}-{craft}-{infix}{'_'.join(shown).replace('/', '_')}"
                                       f"-{key}.json.gz")
    if os.path.exists(path) and not a.recompute_exact:
        with gzip.open(path, "rt") as f:
            d = json.load(f)
        return {"line": {_tuplify(k): v for k, v in d["line"]}, "pc": {_tuplify(k): v for k, v in d["pc"]},
                "meta": d["meta"]}
    if a.reuse_exact and not a.recompute_exact:
        # The same reference from another build of the exact mode, when asked:
        # for a change known not to alter its judgements (say so where the
        # numbers are used); never across EXACT_SEMANTICS versions.
        for other in sorted(glob.glob(path[:-len(key) - 8] + "*.json.gz")):
            with gzip.open(other, "rt") as f:
                d = json.load(f)
            k = dict(d["meta"]["key"])
            k.setdefault("semantics", 1)
            if k.pop("exact", None) and k == {x: y for x, y in key_parts.items() if x != "exact"}:
                print(f"  exact: {craft} {os.path.basename(exe)} {' '.join(shown)}: reusing the reference of exact-mode "
                      f"build {d['meta']['key']['exact'][:12]} ({d['meta']['date']})", file=sys.stderr, flush=True)
                REUSED.add(d["meta"]["key"]["exact"][:12])
                return {"line": {_tuplify(k): v for k, v in d["line"]}, "pc": {_tuplify(k): v for k, v in d["pc"]},
                        "meta": d["meta"]}
    if a.cached_only:
        raise NotCached(f"{craft} {os.path.basename(exe)} {' '.join(shown)}")
    os.makedirs(a.exact_cache, exist_ok=True)
    out = os.path.join(OUT, f"exact-{os.getpid()}-{os.path.basename(exe)}-{craft}.json")
    print(f"  exact: {craft} {os.path.basename(exe)} {' '.join(shown)} (--exact={how}) ...", end="",
          file=sys.stderr, flush=True)
    # The single-stepped mode makes the steady state's small references (the
    # accuracy document's tables before the same command were made from
    # them); the code cache's, the same command's.
    code, secs = run_witch(craft, exe, args, [f"--exact={how}"], out, run_env)
    what = f"the exact run of {os.path.basename(exe)} {' '.join(shown)} ({craft}, --exact={how})"
    if not os.path.exists(out):
        sys.exit(f"benches/accuracy.py: {what} exited {code} without a profile: no reference")
    with open(out) as f:
        prof = json.load(f)
    procs = [prof] + prof.get("processes", [])
    lost = sum(t["counters"].get("pair_overflow", 0) + t["counters"].get("tree_overflow", 0)
               for p in procs for t in p.get("threads", []))
    if lost:
        sys.exit(f"benches/accuracy.py: {what} lost {lost} pairs or contexts (tables overflowed): no reference")
    if code != 0 or prof.get("ended_by") != "exit":
        sys.exit(f"benches/accuracy.py: {what} exited {code} ({prof.get('ended_by')}): no reference")
    notes = [n for p in procs for n in p.get("notes", [])]
    if any("malformed" in n for n in notes):
        sys.exit(f"benches/accuracy.py: {what}: {next(n for n in notes if 'malformed' in n)}: no reference")
    # The code cache's stretches the program ran natively, unrecorded until
    # the next tick (the agent's note): accesses the reference does not have.
    gaps = sum(int(m.group(1)) for n in notes for m in [re.search(r"(\d+) times the thread ran natively unrecorded", n)] if m)
    if gaps:
        sys.exit(f"benches/accuracy.py: {what} ran natively, unrecorded, {gaps} times "
                 f"({next(n for n in notes if 'natively unrecorded' in n)}): no reference")
    rep = report_of(out)
    os.unlink(out)
    instr = records = None
    for n in notes:
        # "exact reference: N instructions single-stepped"; "exact from the
        # code cache: R access records judged, of N instructions".
        m = (re.search(r"exact reference: (\d+) instructions", n)
             or re.search(r"(\d+) access records judged, of (\d+) instructions", n))
        if m:
            instr = (instr or 0) + int(m.group(m.lastindex))
            if m.lastindex == 2:
                records = (records or 0) + int(m.group(1))
    d = {"line": pair_sums(rep, src, lines_at), "pc": pair_sums(rep, src, lines_at, True),
         "meta": {"seconds": secs, "instructions": instr, "records": records,
                  "pairs": rep.get("pair_count"),
                  "total": [waste_use(rep)[0], waste_use(rep)[1]], "key": key_parts,
                  "date": time.strftime("%Y-%m-%d")}}
    tmp = path + f".tmp{os.getpid()}"
    with gzip.open(tmp, "wt") as f:
        json.dump({"line": [[k, v] for k, v in d["line"].items()], "pc": [[k, v] for k, v in d["pc"].items()],
                   "meta": d["meta"]}, f)
    os.replace(tmp, path)
    # The code cache's count is of the instructions that made records (memory
    # accesses, calls, returns), not of all the program ran.
    print(f" {secs:.0f} s, " + (f"{instr} instructions" if records is None
                                 else f"{records} access records of {instr} instructions that made records"),
          file=sys.stderr, flush=True)
    return d


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
        w, u = waste_use(p)
        s[0] += w
        s[1] += u
    return sums


def waste_use(x):
    """(waste, use) of a report or one of its pairs: `waste`/`use` in the
    report's unit (its schema 2; `unit` names it), `waste_bytes`/`use_bytes`
    before."""
    if "waste" in x:
        return x["waste"], x["use"]
    return x.get("waste_bytes"), x.get("use_bytes")


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
    """Splits a sampled-vs-exact gap in two (see docs/ACCURACY.md).

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


def at_sampled_weights(exact, sampled):
    """The exact per-line fractions weighted by where one run looked (its
    bytes watched per line): what the run would read if it judged every
    line exactly, and so the best that more judgements per line can do
    (re-weighting many cheap time samples' per-line fractions by the bursts'
    per-line counts, for one). Lines the exact run has no bytes for are
    left out."""
    ex, sa = by_watch_line(exact), by_watch_line(sampled)
    num = den = 0.0
    for line, s in sa.items():
        e = ex.get(line)
        # A line whose steady-state difference has a negative part is not
        # steady (its fraction would leave [0, 1]): left out.
        if e and e[0] >= 0 and e[1] >= 0 and sum(e) > 0 and sum(s) > 0:
            num += sum(s) * e[0] / sum(e)
            den += sum(s)
    return num / den if den > 0 else float("nan")


def per_line(title, exact, sampled, n):
    """The `n` heaviest watch lines by exact bytes: each one's share of the
    bytes and its own waste fraction, exact and sampled (runs pooled). Where
    the fractions agree and the shares don't, the sampler judged the line
    right and looked at it too often or too rarely; where the fractions
    disagree, it judged it wrong."""
    ex, sa = by_watch_line(exact), by_watch_line(sampled)
    et = sum(max(0.0, sum(v)) for v in ex.values())
    st = sum(sum(v) for v in sa.values())
    frac = lambda v: f"{100 * v[0] / sum(v):.1f}" if sum(v) > 0 else "n/a"  # noqa: E731
    rows = [f"Heaviest watch lines of {title} (shares of the bytes watched there; fractions of waste):\n",
            "| line | exact share | exact fraction | sampled share | sampled fraction |", "|---|---:|---:|---:|---:|"]
    for line in sorted(ex, key=lambda k: -max(0.0, sum(ex[k])))[:n]:
        e, s = ex[line], sa.get(line, [0.0, 0.0])
        rows.append(f"| {line} | {100 * max(0.0, sum(e)) / max(et, 1e-300):.2f}% | {frac(e)} | "
                    f"{100 * sum(s) / max(st, 1e-300):.2f}% | {frac(s)} |")
    return "\n".join(rows)


LONGER = 1  # --longer: the sampled runs' repetitions multiplied by this
STEADY = False  # --steady-state: the real programs' references are the steady state (below)


class Same:
    """The exact side of a case in the same-command mode: the sampled runs'
    own arguments, run in full from the code cache (`--exact=cache`)."""

    def __init__(self, args):
        self.args = args


def exact_mode(name, small):
    """What the exact reference of case `name` (its exact side `small`,
    as CASES has it) is, as the reports name it."""
    if name in REAL_SIZES:
        return "steady state" if STEADY else "same command"
    return "steady state" if isinstance(small, tuple) else "small instance"


def exact_modes(cases):
    """The exact modes of `cases`, in order, for a report's heading."""
    seen = []
    for name, _, _, _, small, _ in cases:
        if exact_mode(name, small) not in seen:
            seen.append(exact_mode(name, small))
    return seen


MODE_TEXT = {
    "same command": "same command (`witch CRAFT --exact=cache` of the sampled runs' own command, in full; "
                    "no subtraction)",
    "steady state": "steady state (the difference of two small `--exact=step` runs, 1 and 2 repetitions; "
                    "the sampled runs repeat the work for longer)",
    "small instance": "small instance (one `--exact=step` run of a smaller input than the sampled runs', "
                      "over the marked lines)",
}


def program_env(env):
    """Of a configuration's leading NAME=value words, those that change what
    the program itself runs, given to the same command's exact run too; not
    witch's sampler settings (WITCH_*), but WITCH_KEEP_REP_STRINGS, which
    changes the program's memset and memcpy (their GLIBC_TUNABLES)."""
    return {k: v for k, v in env.items() if not k.startswith("WITCH_") or k == "WITCH_KEEP_REP_STRINGS"}


def resolve(name, src, small, big):
    """(binary, exact side (Same(args): the sampled command itself; a list:
    one small instance; a (fewer, more repetitions) pair: the steady
    state), sampled args)."""
    if name in REAL_SIZES:
        exe = workloads.build_one(name, OUT)[0][0]
        lua = lambda args: [LUA_SCRIPT if x == "@lua" else x for x in args]  # noqa: E731
        # The last argument of a real program's driver is its repetitions.
        longer = lambda args: args[:-1] + [str(int(args[-1]) * LONGER)]  # noqa: E731
        if not STEADY:
            args = lua(longer(SAME_SIZES[name]))
            return exe, Same(args), args
        return exe, tuple(lua(x) for x in small), lua(longer(big))
    return build(name, src), small, big


def exact_case(craft, exe, src, at, small, a, env=None):
    """The exact side of one case: (fraction, top-5 pair keys, per-pair sums
    by line, by instruction, [cached run metadata]). env: what the sampled
    runs add to the program's environment (program_env), for the same
    command."""
    if isinstance(small, Same):
        rex = exact_reference(craft, exe, small.args, src, at, a, "cache", env)
        ex_frac, ex_top = summarize(rex["line"])
        return ex_frac, ex_top, rex["line"], rex["pc"], [rex["meta"]]
    if isinstance(small, tuple):
        lo = exact_reference(craft, exe, small[0], src, at, a)
        hi = exact_reference(craft, exe, small[1], src, at, a)
        ex_sums = steady(lo["line"], hi["line"])
        ex_pc = steady(lo["pc"], hi["pc"])
        ex_frac, ex_top = summarize(ex_sums)
        d = sum(sum(v) for v in ex_sums.values())
        # Too little of the repeated part to tell (or it isn't steady).
        if d < 0.05 * sum(sum(v) for v in hi["line"].values()) or not 0.0 <= ex_frac <= 1.0:
            ex_frac = float("nan")
        return ex_frac, ex_top, ex_sums, ex_pc, [lo["meta"], hi["meta"]]
    rex = exact_reference(craft, exe, small, src, at, a)
    ex_frac, ex_top = summarize(rex["line"])
    return ex_frac, ex_top, rex["line"], rex["pc"], [rex["meta"]]


def exact_only(cases, a):
    """Compute (or load) the exact references of `cases`, one at a time, and
    print what they say and what they cost."""
    print("Exact references: " + "; ".join(MODE_TEXT[m] for m in exact_modes(cases)) + ".\n")
    print("| program | craft | exact | exact mode | exact runs (instructions, seconds) | repeated part (instructions) |")
    print("|---|---|---:|---|---|---:|")
    total = 0.0
    for name, src, craft, markers, small, big in cases:
        exe, small, big = resolve(name, src, small, big)
        try:
            f, _, _, _, metas = exact_case(craft, exe, src, marked_lines(src, markers), small, a)
        except NotCached as e:
            print(f"| {name} | {craft} | not cached ({e}) | {exact_mode(name, small)} | | |", flush=True)
            continue
        count = lambda m: ("?" if m["instructions"] is None else f"{m['instructions']:,}"  # noqa: E731
                           + (" that made records" if m.get("records") is not None else ""))
        runs = ", ".join(f"{count(m)} in {m['seconds']:.0f} s (build {m['key']['exact'][:12]})" for m in metas)
        rep = (f"{metas[1]['instructions'] - metas[0]['instructions']:,}"
               if len(metas) == 2 and metas[0]["instructions"] and metas[1]["instructions"] else "")
        total += sum(m["seconds"] for m in metas)
        print(f"| {name} | {craft} | {'n/a' if f != f else f'{100*f:.1f}'} | {exact_mode(name, small)} | {runs} | "
              f"{rep} |", flush=True)
    print(f"\nExact runs of these cases: {total/3600:.2f} h of wall time when computed (under nice -n 19).")


def engine_share(path):
    """The engine's own measured cost (handlers plus the calibrated trap and
    signal round trips, counters.engine_ns) over the run's duration, and the
    sampler the run used ("software cpu-timer, period 5000000 ns")."""
    with open(path) as f:
        d = json.load(f)
    s = d.get("sampler", {})
    used = f"{s.get('kind')} {s.get('event')}, period {s.get('period')} {s.get('unit')}"
    if s.get("window_instructions"):
        used += f", code-cache windows of {s['window_instructions']} instructions"
    elif s.get("burst_steps") is not None:
        used += f", single-step bursts of {s['burst_steps']} steps" if s["burst_steps"] else ", no bursts"
    if s.get("weight_unit"):
        used += f", weights in {s['weight_unit']}"
    c = d["counters"]
    SAMPLES.append(c.get("samples", 0))
    DURATIONS.append(d["duration_ns"] / 1e9)
    if c.get("windows"):
        WINDOW_LEN.append(c.get("window_instructions", 0) / c["windows"])
    if c.get("bursts"):
        STEPS.append(c.get("steps", 0) / c["bursts"])
        BURSTS.append(c["bursts"] / max(1e-9, d["duration_ns"] / 1e9))
    # Where the engine's time goes (builds from before these counters have none).
    for part, n in (("tick_ns", "interrupts"), ("step_ns", "steps"), ("trap_ns", "traps")):
        if part in c and c.get(n):
            PART_US.setdefault(part, []).append(c[part] / c[n] / 1e3)
    return c.get("engine_ns", 0) / max(1, d["duration_ns"]), used


STEPS = []  # steps per burst of each sampled run that had bursts (the budget sizes them)
WINDOW_LEN = []  # mean instructions per code-cache window of each sampled run that had windows
SAMPLES = []  # samples of each sampled run
DURATIONS = []  # each sampled run's duration, seconds
BURSTS = []  # bursts per second of each sampled run that had bursts
PART_US = {}  # "tick_ns"/"step_ns"/"trap_ns" -> the engine's µs per tick/step/trap of each run


def accept(cases, a):
    """The acceptance report: per program x craft, the exact steady-state
    fraction against RUNS sampled runs of each --witch-args configuration."""
    for conf in a.witch_args:
        # Leading NAME=value words set witch's environment, as in a shell
        # (e.g. "WITCH_BURST=0", settings witch reads only from there).
        opts, env = shlex.split(conf), {}
        while opts and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", opts[0]):
            k, v = opts.pop(0).split("=", 1)
            env[k] = v
        shown = [f"{k}={v}" for k, v in env.items()] + ["witch", "CRAFT"] + opts
        t_all = time.monotonic()
        print(f"Sampler settings: `{' '.join(shown)}` (otherwise the defaults of this build); "
              f"{a.runs} sampled runs per case" + (f", {LONGER} times as long as by default" if LONGER > 1 else "")
              + f"; {time.strftime('%Y-%m-%d')}\n")
        # Which references the exact column holds (--summarize keeps
        # configurations of different modes apart).
        print("Exact references: " + "; ".join(MODE_TEXT[m] for m in exact_modes(cases)) + ".\n")
        print("| program | craft | exact | sampled (mean ± sd) | sampled - exact | within 3 | "
              "exact top-3 in sampled top-5 (runs) | engine share | sd / reported se | interval holds exact (runs) | "
              "window (instructions) | wall vs native | CPU vs native | engine share of CPU time |")
        print("|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
        judged, within, misses, tops_ok, sds, bias_rows, samplers, costs = 0, 0, [], 0, [], [], set(), []
        looks = []
        line_tables = []
        calibration = []
        covered = [0, 0]  # runs whose interval held the exact fraction, runs judged
        sd_ok = 0  # cases with a run-to-run sd of at most 2 points
        craft_costs = {}  # craft -> [engine share of each case]
        walls = []  # (median wall ratio, median CPU ratio, case)
        for name, src, craft, markers, small, big in cases:
            exe, small, big = resolve(name, src, small, big)
            at = marked_lines(src, markers)
            try:
                ex_frac, ex_top, ex_sums, ex_pc, _ = exact_case(craft, exe, src, at, small, a, program_env(env))
            except NotCached as e:
                print(f"| {name} | {craft} | not cached ({e}) | | | | | | | | | | |", flush=True)
                continue
            out = os.path.join(OUT, f"accept-{os.getpid()}-{name}-{craft}.json")
            holds, wins, wall_ratios, cpu_ratios, cpu_shares = 0, [], [], [], []
            fr, shares, hits, pooled, pooled_pc, ses, looked = [], [], 0, {}, {}, [], []
            need = min(2, len(ex_top[:3]))
            for _ in range(a.runs):
                # Native and witch alternate: each sampled run is one of a
                # wall-clock pair (the program's own output discarded alike).
                native_s = run_native(exe, big) if a.wall else None
                code, witch_s, witch_cpu = run_witch(craft, exe, big, opts, out, env, cpu=True)
                if native_s:
                    wall_ratios.append(witch_s / native_s[0])
                    cpu_ratios.append(witch_cpu / max(1e-9, native_s[1]))
                if not os.path.exists(out):
                    sys.exit(f"benches/accuracy.py: witch exited {code} without a profile; by hand: "
                             + " ".join(shlex.quote(x) for x in [f"{k}={v}" for k, v in env.items()]
                                        + [WITCH, craft, "-o", out] + opts + [exe] + big))
                rep = report_of(out)
                # The report's own standard error, from its 95% interval
                # (clipping at 0 and 1 aside).
                lo, hi = rep.get("waste_fraction_ci", [0.0, 0.0])
                ses.append((hi - lo) / 3.92)
                whole = rep.get("waste_fraction", 0.0)
                n_win = len(WINDOW_LEN)
                share, used = engine_share(out)
                # The engine's time over the CPU time of witch's process
                # tree (the program's threads, where the handlers run, and
                # the launcher): on a loaded machine the run's duration is
                # far longer than its CPU time.
                with open(out) as fh:
                    cpu_shares.append(json.load(fh)["counters"].get("engine_ns", 0) / 1e9 / max(1e-9, witch_cpu))
                if len(WINDOW_LEN) > n_win:
                    wins.append(WINDOW_LEN[-1])
                shares.append(share)
                samplers.add(used)
                sums = pair_sums(rep, src, at)
                f, top = summarize(sums)
                fr.append(f)
                # The report's interval is of the whole run's fraction; the
                # case's fraction is over the pairs under the driver (nearly
                # all of a run): its interval is taken as the report's,
                # moved to it.
                if ex_frac == ex_frac:
                    holds += f - (whole - lo) - 1e-9 <= ex_frac <= f + (hi - whole) + 1e-9
                looked.append(at_sampled_weights(ex_sums, sums) if ex_frac == ex_frac else float("nan"))
                hits += len(set(ex_top[:3]) & set(top[:5])) >= need
                for into, got in ((pooled, sums), (pooled_pc, pair_sums(rep, src, at, True))):
                    for k, v in got.items():
                        acc = into.setdefault(k, [0.0, 0.0])
                        acc[0] += v[0]
                        acc[1] += v[1]
            os.unlink(out)
            mean, sd = statistics.mean(fr), (statistics.stdev(fr) if len(fr) > 1 else 0.0)
            sds.append((100 * sd, f"{name} {craft}"))
            costs.append((100 * statistics.mean(shares), f"{name} {craft}"))
            craft_costs.setdefault(craft, []).append(100 * statistics.mean(shares))
            sd_ok += 100 * sd <= 2.0
            wall = statistics.median(wall_ratios) if wall_ratios else float("nan")
            cpu_x = statistics.median(cpu_ratios) if cpu_ratios else float("nan")
            if wall_ratios:
                walls.append((wall, cpu_x, f"{name} {craft}"))
            top_ok = hits * 2 > a.runs
            if ex_frac == ex_frac:
                judged += 1
                covered[0] += holds
                covered[1] += a.runs
                diff = 100 * (mean - ex_frac)
                within += abs(diff) <= 3
                misses.append((abs(diff), diff, f"{name} {craft}"))
                tops_ok += top_ok
                cells = f"{100*ex_frac:.1f} | {100*mean:.1f} ± {100*sd:.1f} | {diff:+.1f} | {'yes' if abs(diff) <= 3 else 'no'}"
                if a.lines:
                    line_tables.append(per_line(f"{name} {craft}", ex_sums, pooled, a.lines))
                lk = [x for x in looked if x == x]
                if len(lk) > 1:
                    lm, ls = statistics.mean(lk), statistics.stdev(lk)
                    row = (f"| {name} | {craft} | {100*ex_frac:.1f} | {100*mean:.1f} ± {100*sd:.1f} | {diff:+.1f} | "
                           f"{100*lm:.1f} ± {100*ls:.1f} | {100*(lm - ex_frac):+.1f} |")
                    looks.append((row, abs(diff) <= 3, abs(100 * (lm - ex_frac)) <= 3, 100 * sd, 100 * ls))
                rw, seen, ratios = bias(ex_sums, pooled)
                rw_pc, seen_pc, _ = bias(ex_pc, pooled_pc)
                fmt = lambda rs: ", ".join(f"{l}: {r:.2f}" for l, r in rs)  # noqa: E731
                bias_rows.append(f"| {name} | {craft} | {100*ex_frac:.1f} | {100*summarize(pooled)[0]:.1f} | "
                                 + ("n/a" if rw != rw else f"{100*rw:.1f}") + f" | {100*seen:.0f}% | "
                                 + ("n/a" if rw_pc != rw_pc else f"{100*rw_pc:.1f}")
                                 + f" | {100*seen_pc:.0f}% | {fmt(ratios[:2])} | {fmt(ratios[::-1][:2])} |")
            else:
                cells = f"n/a | {100*mean:.1f} ± {100*sd:.1f} | | "
            mse = statistics.mean(ses)
            calib = sd / mse if mse > 0 and len(fr) > 1 else float("nan")
            if calib == calib:
                calibration.append(calib)
            cover = f"{holds}/{a.runs}" if ex_frac == ex_frac else ""
            win = f"{statistics.mean(wins):,.0f}" if wins else "none"
            print(f"| {name} | {craft} | {cells} | {'yes' if top_ok else 'no'} ({hits}/{a.runs}) | "
                  f"{100*statistics.mean(shares):.2f}% | {calib:.2f} | {cover} | {win} | "
                  + (f"{wall:.3f}x ({min(wall_ratios):.2f}-{max(wall_ratios):.2f}) | {cpu_x:.3f}x" if wall_ratios else " | ")
                  + f" | {100*statistics.mean(cpu_shares):.2f}% |", flush=True)
        misses.sort(reverse=True)
        sds.sort(reverse=True)
        print(f"\n- Within 3 points of exact: {within} of {judged} cases"
              + (f" ({100*within/judged:.0f}%)" if judged else "") + ".")
        if misses:
            print(f"- Largest miss: {misses[0][1]:+.1f} points ({misses[0][2]}); "
                  f"{sum(m[0] > 10 for m in misses)} cases miss by more than 10 points.")
        print(f"- At least 2 of the exact top-3 pairs in the sampled top 5 (in most runs): {tops_ok} of {judged} cases"
              + (f" ({100*tops_ok/judged:.0f}%)" if judged else "") + ".")
        if sds:
            print(f"- Run-to-run standard deviation at most 2 points: {sd_ok} of {len(sds)} cases; largest "
                  f"{sds[0][0]:.1f} points ({sds[0][1]}), median {statistics.median(x[0] for x in sds):.1f}.")
        if covered[1]:
            print(f"- The run's 95% interval held the exact fraction in {covered[0]} of {covered[1]} runs "
                  f"({100*covered[0]/covered[1]:.0f}%).")
        for c, v in sorted(craft_costs.items()):
            print(f"- Engine share of CPU, {c}: mean over the runs of each case, largest {max(v):.2f}%, "
                  f"median {statistics.median(v):.2f}%.")
        if walls:
            wv = sorted(walls, reverse=True)
            print(f"- Wall-clock time over native (median of {a.runs} alternating pairs per case): median "
                  f"{statistics.median(x[0] for x in wv):.3f}x, at most 1.03x in {sum(x[0] <= 1.03 for x in wv)} of "
                  f"{len(wv)} cases, largest {wv[0][0]:.3f}x ({wv[0][2]}); CPU time of the process tree over "
                  f"native: median {statistics.median(x[1] for x in wv):.3f}x, at most 1.03x in "
                  f"{sum(x[1] <= 1.03 for x in wv)} of {len(wv)}, largest {max(x[1] for x in wv):.3f}x.")
        if calibration:
            print(f"- Run-to-run sd over the reports' mean standard error (1 when the intervals are honest): "
                  f"median {statistics.median(calibration):.2f}, geometric mean "
                  f"{statistics.geometric_mean(calibration):.2f}, {min(calibration):.2f} to {max(calibration):.2f}.")
        if costs:
            top = max(costs)
            print(f"- Largest engine share: {top[0]:.2f}% ({top[1]}).")
        modes = exact_modes(cases)
        hows = (["cache"] if "same command" in modes else []) + (["step"] if modes != ["same command"] else [])
        print(f"- Exact references: {', '.join(modes)}; exact mode "
              + ", ".join(f"--exact={h} build {exact_fingerprint(h)[:12]}" for h in hows) + " of its sources, semantics "
              + ", ".join(f"{c} {v}" for c, v in EXACT_SEMANTICS.items())
              + (f"; references reused from build {', '.join(sorted(REUSED))} (--reuse-exact)" if REUSED else "") + ".")
        print(f"- Sampler the runs used: {'; '.join(sorted(samplers))}.")
        if DURATIONS:
            print(f"- Sampled runs took {min(DURATIONS):.2f} to {max(DURATIONS):.2f} s, median {statistics.median(DURATIONS):.2f}.")
            DURATIONS.clear()
        if SAMPLES:
            print(f"- Samples per run: {min(SAMPLES)} to {max(SAMPLES)}, median {statistics.median(SAMPLES):.0f}.")
            SAMPLES.clear()
        if WINDOW_LEN:
            print(f"- Code-cache window length (mean instructions of each run): {min(WINDOW_LEN):,.0f} to "
                  f"{max(WINDOW_LEN):,.0f}, median {statistics.median(WINDOW_LEN):,.0f}, mean "
                  f"{statistics.mean(WINDOW_LEN):,.0f}.")
            WINDOW_LEN.clear()
        if STEPS:
            print(f"- Steps per burst (the budget's choice; mean of each run): {min(STEPS):.1f} to {max(STEPS):.1f}, "
                  f"median {statistics.median(STEPS):.1f}.")
            STEPS.clear()
        if BURSTS:
            print(f"- Bursts per second of run: {min(BURSTS):.0f} to {max(BURSTS):.0f}, "
                  f"median {statistics.median(BURSTS):.0f}.")
            BURSTS.clear()
        if PART_US:
            print("- The engine's cost (median over runs, µs): "
                  + ", ".join(f"{statistics.median(PART_US[k]):.1f} a {w}" for k, w in
                              (("tick_ns", "tick"), ("step_ns", "step"), ("trap_ns", "trap")) if k in PART_US) + ".")
            PART_US.clear()
        print(f"- This configuration took {(time.monotonic() - t_all)/60:.1f} minutes "
              "(sampled runs and their reports, plus any exact reference not yet cached).")
        if bias_rows:
            print("\nWhere the sampler looks vs what it finds (runs pooled). Re-weighted: the sampled per-site "
                  "fractions weighted by the exact per-site bytes (by line: the innermost frames' lines; by "
                  "instruction: the watched instruction). Ratios: a watch line's share of sampled bytes over "
                  "its share of exact bytes.\n")
            print("| program | craft | exact | sampled | re-weighted by line | exact weight seen | "
                  "re-weighted by instruction | exact weight seen | least sampled (line: ratio) | most sampled |")
            print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
            for r in bias_rows:
                print(r)
        if looks:
            print("\nWhere each run looked, judged exactly: the exact per-line fractions weighted by each run's own "
                  "bytes watched per line (mean ± sd over the runs). It is what the runs would read if every line "
                  "were judged without error, so the best any estimator that keeps the bursts' per-line weights "
                  "and judges the lines better can do (such as per-site re-weighting of cheap time samples).\n")
            print("| program | craft | exact | sampled (mean ± sd) | sampled - exact | judged exactly (mean ± sd) | "
                  "judged exactly - exact |")
            print("|---|---|---:|---:|---:|---:|---:|")
            for row in looks:
                print(row[0])
            print(f"\n- Within 3 points: {sum(r[1] for r in looks)} of {len(looks)} sampled, "
                  f"{sum(r[2] for r in looks)} of {len(looks)} judged exactly; median run-to-run sd "
                  f"{statistics.median(r[3] for r in looks):.1f} and {statistics.median(r[4] for r in looks):.1f} points.")
        for t in line_tables:
            print("\n" + t)
        print()


def gate_noise(cases, a):
    """How often `witch gate --baseline A --max-increase 2pp B` fails when A
    and B are two runs of the same program (no regression at all): each
    case runs --runs times at the defaults (or the first --witch-args), and
    every ordered pair of its runs is gated. A gate whose intervals hold
    the run-to-run noise fails such a pair rarely (its 95% interval of the
    increase must lie wholly above 2 points); "cannot tell" passes."""
    conf = a.witch_args[0]
    opts, env = shlex.split(conf), {}
    while opts and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", opts[0]):
        k, v = opts.pop(0).split("=", 1)
        env[k] = v
    shown = [f"{k}={v}" for k, v in env.items()] + ["witch", "CRAFT"] + opts
    print(f"Gate noise: `witch gate --baseline A --max-increase 2pp B` over the ordered pairs of {a.runs} runs "
          f"of the same program, `{' '.join(shown)}`; {time.strftime('%Y-%m-%d')}\n")
    print("| program | craft | sampled (mean ± sd) | largest increase between runs | pairs | FAIL | cannot tell | PASS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    totals = [0, 0, 0, 0]
    for name, src, craft, markers, small, big in cases:
        exe, small, big = resolve(name, src, small, big)
        outs, fr = [], []
        for i in range(a.runs):
            out = os.path.join(OUT, f"gate-{os.getpid()}-{name}-{craft}-{i}.json")
            code, _ = run_witch(craft, exe, big, opts, out, env)
            if not os.path.exists(out):
                sys.exit(f"benches/accuracy.py: witch exited {code} without a profile ({name} {craft})")
            outs.append(out)
            fr.append(report_of(out).get("waste_fraction", float("nan")))
        counts = [0, 0, 0]
        for i, base in enumerate(outs):
            for j, new in enumerate(outs):
                if i == j:
                    continue
                r = subprocess.run([WITCH, "gate", "--baseline", base, "--max-increase", "2pp", new],
                                   capture_output=True, text=True)
                if r.returncode == 1:
                    counts[0] += 1
                elif r.returncode == 0 and "cannot tell" in r.stdout + r.stderr:
                    counts[1] += 1
                elif r.returncode == 0:
                    counts[2] += 1
                else:
                    sys.exit(f"benches/accuracy.py: witch gate exited {r.returncode}: {r.stderr.strip()}")
        for o in outs:
            os.unlink(o)
        pairs = sum(counts)
        for k in range(3):
            totals[k + 1] += counts[k]
        totals[0] += pairs
        ok = [f for f in fr if f == f]
        spread = max(ok) - min(ok) if ok else float("nan")
        sd = statistics.stdev(ok) if len(ok) > 1 else 0.0
        print(f"| {name} | {craft} | {100*statistics.mean(ok):.1f} ± {100*sd:.1f} | {100*spread:.1f} | {pairs} | "
              f"{counts[0]} | {counts[1]} | {counts[2]} |", flush=True)
    if totals[0]:
        print(f"\nAll cases: {totals[0]} pairs, FAIL {totals[1]} ({100*totals[1]/totals[0]:.1f}%), "
              f"cannot tell {totals[2]} ({100*totals[2]/totals[0]:.1f}%), PASS {totals[3]}.")


def summarize_logs(paths):
    """The acceptance criteria over the rows of one or more --accept
    outputs (run in parts, e.g. --only while references were still being
    made), per sampler configuration (the "Sampler settings" line)."""
    confs = {}
    conf = None
    for path in paths:
        with open(path) as f:
            for line in f:
                # A configuration's rows are kept by its sampler settings
                # and the mode of its exact references (an output from
                # before modes were printed is the steady state's).
                if line.startswith("Sampler settings: `"):
                    conf = (line.split("`")[1], "steady state")
                    confs.setdefault(conf, {})
                    continue
                if line.startswith("Exact references: ") and conf is not None:
                    rest = line[len("Exact references: "):].strip()
                    modes = [m for m in MODE_TEXT if re.search(rf"(^|; ){m} \(", rest)]
                    conf = (conf[0], ", ".join(modes) or rest)
                    confs.setdefault(conf, {})
                    continue
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if conf is None or len(cells) not in (13, 14) or cells[0] in ("program", "---") or cells[2] in ("", "n/a"):
                    continue
                if cells[2].startswith("not cached"):
                    continue
                confs[conf][(cells[0], cells[1])] = cells
    for (conf, mode), rows in confs.items():
        if not rows:
            continue
        n = len(rows)
        num = lambda c: float(re.sub(r"[^0-9.+-]", "", c) or "nan")  # noqa: E731
        diffs = {k: num(r[4]) for k, r in rows.items()}
        sds = {k: num(r[3].split("±")[1]) for k, r in rows.items()}
        tops = sum(r[6].startswith("yes") for r in rows.values())
        held = [tuple(int(x) for x in r[9].split("/")) for r in rows.values() if "/" in r[9]]
        share, cpu_share = {}, {}
        for (prog, craft), r in rows.items():
            share.setdefault(craft, []).append(num(r[7]))
            if len(r) == 14:
                cpu_share.setdefault(craft, []).append(num(r[13]))
        wins = [num(r[10].replace(",", "")) for r in rows.values() if r[10] not in ("", "none")]
        walls = [(num(r[11].split("x")[0]), k) for k, r in rows.items() if r[11]]
        cpus = [(num(r[12]), k) for k, r in rows.items() if r[12]]
        within = sum(abs(d) <= 3 for d in diffs.values())
        over5 = sorted(((abs(d), d, f"{k[0]} {k[1]}") for k, d in diffs.items() if abs(d) > 5), reverse=True)
        print(f"Configuration `{conf}`, exact references: {mode}: {n} program x craft cases "
              f"({', '.join(sorted({k[0] for k in rows}))})\n")
        print("| criterion | target | result |")
        print("|---|---|---|")
        print(f"| within 3 points of exact | at least 80% of cases | {within} of {n} ({100*within/n:.0f}%) |")
        print(f"| misses over 10 points | none | {sum(abs(d) > 10 for d in diffs.values())}"
              + (f" (largest {over5[0][1]:+.1f}, {over5[0][2]})" if over5 else "") + " |")
        print(f"| mean absolute error | | {statistics.mean(abs(d) for d in diffs.values()):.1f} points |")
        print(f"| at least 2 of the exact top-3 pairs in the top 5 (most runs) | at least 80% of cases | "
              f"{tops} of {n} ({100*tops/n:.0f}%) |")
        print(f"| run-to-run sd | at most 2 points | {sum(v <= 2 for v in sds.values())} of {n} cases; median "
              f"{statistics.median(sds.values()):.1f}, largest {max(sds.values()):.1f} |")
        if held:
            h, t = sum(x for x, _ in held), sum(y for _, y in held)
            print(f"| the run's 95% interval holds the exact fraction | at least 90% of runs | {h} of {t} "
                  f"({100*h/t:.0f}%) |")
        for craft in sorted(share):
            lim = 5 if craft == "silent-load" else 3
            v = share[craft]
            print(f"| engine share of the run's duration, {craft} | | largest {max(v):.2f}%, median "
                  f"{statistics.median(v):.2f}% |")
            v = cpu_share.get(craft)
            if v:
                print(f"| engine share of CPU time, {craft} | at most {lim}% | largest {max(v):.2f}%, median "
                      f"{statistics.median(v):.2f}% ({len(v)} of {len(share[craft])} cases measured) |")
        print(f"| mean window length | at least 2,000 instructions | "
              + (f"{min(wins):,.0f} to {max(wins):,.0f} (median {statistics.median(wins):,.0f})" if wins
                 else "no windows") + " |")
        if walls:
            print(f"| wall clock over native (median of alternating pairs) | at most 1.03x | median "
                  f"{statistics.median(w for w, _ in walls):.3f}x; at most 1.03x in {sum(w <= 1.03 for w, _ in walls)} "
                  f"of {len(walls)}; largest {max(walls)[0]:.3f}x ({' '.join(max(walls)[1])}) |")
        if cpus:
            print(f"| CPU time over native (the same pairs) | | median {statistics.median(c for c, _ in cpus):.3f}x; "
                  f"at most 1.03x in {sum(c <= 1.03 for c, _ in cpus)} of {len(cpus)}; largest "
                  f"{max(cpus)[0]:.3f}x ({' '.join(max(cpus)[1])}) |")
        if over5:
            print("\nMisses over 5 points: " + ", ".join(f"{c} {d:+.1f}" for _, d, c in over5) + ".")
        print()


def main():
    global WITCH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--set", default="all", choices=["all", "ground-truth", "workloads", "real", "more", "bench"],
                    help="all = ground-truth + workloads; real (zstd, SQLite, Lua, PCRE2, simdjson, RustFFT), "
                         "more (libwebp, Expat, tree-sitter) and bench (real + more) run only on demand")
    ap.add_argument("--only", default="", help="comma-separated program names to keep")
    ap.add_argument("--crafts", default="", help="comma-separated crafts to keep")
    ap.add_argument("--accept", action="store_true",
                    help="acceptance report: exact vs --runs sampled runs of each --witch-args configuration")
    ap.add_argument("--witch-args", action="append", default=None, metavar="ARGS",
                    help='sampler options passed to witch for --accept, e.g. "-e cpu-timer -p 1000000"; leading '
                         'NAME=value words go into its environment, e.g. "WITCH_BURST=0 -p 1ms" '
                         "(repeatable; default: no options, today's default sampler)")
    ap.add_argument("--exact-only", action="store_true", help="only compute (or load) the exact references")
    ap.add_argument("--gate-noise", action="store_true",
                    help="how often `witch gate --max-increase 2pp` fails between runs of the same program "
                         "(--runs runs per case, every ordered pair gated; no exact references needed)")
    ap.add_argument("--exact-cache", default=os.path.join(OUT, "exact"), metavar="DIR",
                    help="where exact references are cached (default target/bench/exact)")
    ap.add_argument("--recompute-exact", action="store_true", help="run the exact references again")
    ap.add_argument("--reuse-exact", action="store_true",
                    help="when this build of the exact mode has no cached reference, use one from another build "
                         "(only for changes known not to alter its judgements; the report names the build used)")
    ap.add_argument("--cached-only", action="store_true",
                    help="skip the cases whose exact references are not cached (while they are being computed)")
    ap.add_argument("--witch", default=WITCH, help="the witch binary (default target/release/witch)")
    ap.add_argument("--summarize", nargs="+", metavar="LOG",
                    help="the acceptance criteria over the rows of saved --accept outputs (run in parts)")
    ap.add_argument("--no-wall", dest="wall", action="store_false",
                    help="with --accept: no native run before each sampled run (no wall-clock ratios)")
    ap.add_argument("--lines", type=int, default=0, metavar="N",
                    help="with --accept: per case, the N heaviest watch lines' shares and fractions, exact and sampled")
    ap.add_argument("--longer", type=int, default=1, metavar="N",
                    help="real programs: sampled runs repeat their work N times as often (N times as long; "
                         "the same command's exact references too, the steady state's are unchanged)")
    ap.add_argument("--steady-state", action="store_true",
                    help="real programs: exact references from the steady state of two small single-stepped "
                         "runs, sampled runs at the steady state's longer sizes (how the tables before the same "
                         "command were made); default: the same command on both sides")
    a = ap.parse_args()
    if a.summarize:
        return summarize_logs(a.summarize)
    WITCH = a.witch
    global LONGER, STEADY
    LONGER = max(1, a.longer)
    STEADY = a.steady_state
    a.witch_args = a.witch_args or [""]
    cases = {"all": CASES + WORKLOAD_CASES, "ground-truth": CASES, "workloads": WORKLOAD_CASES,
             **SET_CASES}[a.set]
    if a.only:
        cases = [c for c in cases if c[0] in a.only.split(",")]
    if a.crafts:
        cases = [c for c in cases if c[2] in a.crafts.split(",")]
    if not os.path.exists(WITCH):
        sys.exit("benches/accuracy.py: build first: cargo build --release --workspace")
    os.makedirs(OUT, exist_ok=True)
    if a.exact_only:
        return exact_only(cases, a)
    if a.gate_noise:
        return gate_noise(cases, a)
    if a.accept:
        return accept(cases, a)
    print(f"Sampled vs exact waste fraction (own code), mean ± std over {a.runs} runs\n")
    print("Exact references: " + "; ".join(MODE_TEXT[m] for m in exact_modes(cases)) + ".\n")
    print("| program | craft | exact | " + " | ".join(f"-p {p}" for p in PERIODS) + " | top-5 overlap | top-3 same | oldest | 1 debug reg |")
    print("|---|---|---:|" + "---:|" * len(PERIODS) + "---:|---:|---:|---:|")
    bias_rows = []
    for name, src, craft, markers, small, big in cases:
        exe, small, big = resolve(name, src, small, big)
        at = marked_lines(src, markers)
        out = os.path.join(OUT, f"acc-{name}-{craft}.json")
        ex_frac, ex_top, ex_sums, ex_pc, _ = exact_case(craft, exe, src, at, small, a)
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
