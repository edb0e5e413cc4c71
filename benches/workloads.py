#!/usr/bin/env python3
"""Benchmark workloads for witch: real programs built from source.

Each workload is compiled at ``-O2 -g`` (gcc or g++; cargo at opt-level 2
with full debug info for the Rust one). The large ones use C/C++ sources
bundled in crates.io crates, found in cargo's registry cache
(``$CARGO_HOME/registry/src/*/<crate>-<version>/``) and fetched with
``cargo fetch`` in a throw-away project when missing:

    zstd          zstd library (zstd-sys) + benches/workloads/zstd_driver.c:
                  compress and decompress 32 MB of generated text at level 3
    sqlite        SQLite amalgamation (libsqlite3-sys) + sqlite_driver.c:
                  200k inserts in a transaction, indexes, aggregates, a join
    lua           Lua 5.4 (lua-src) + lua_main.c running bench.lua:
                  string building, tables, closures, numeric loops
    pcre2         PCRE2 10.46 (pcre2-sys), interpreter only (no JIT) +
                  pcre2_driver.c: six log-scanning patterns over a 4 MiB log
    simdjson      simdjson 4.6 (simdjson-sys; C++) + simdjson_driver.cpp:
                  parse, walk and minify an 8 MiB document, 20 times
    fft           RustFFT 6.4 (crates.io; Rust, built by cargo at opt-level
                  2 with debug info) + fft_driver.rs: single-precision
                  low-pass filtering, forward and inverse length-3600 FFTs
    webp          libwebp 1.6 (libwebp-sys) + webp_driver.c: lossy-encode a
                  generated 256x256 picture at quality 75 and decode it, 30 times
    expat         Expat 2.1.0 (expat-sys) + expat_driver.c: stream-parse a
                  generated 4 MiB namespaced XML feed in 8 KiB chunks, 10 times
    treesitter    tree-sitter 0.27 runtime and its C grammar (tree-sitter,
                  tree-sitter-c) + treesitter_driver.c: parse 1000 generated
                  C functions, walk the tree, edit, re-parse incrementally, twice
    stencil       3D 7-point Jacobi stencil, double precision
    nbody         O(N^2) direct-summation N-body, double precision
    linear_search repeated lookups in a linked list (redundant loads)
    hash_collide  chained hash table with a byte-sum hash (long chains)
    regscan       examples/regscan.c, gcc-like repeated zeroing (dead stores)

Each prints a deterministic checksum and exits 0, in about 0.5-1.5 s natively.
C and C++ builds map the repository's path to "." (-ffile-prefix-map), Rust
ones likewise (--remap-path-prefix), so a workload's binary is the same from
any checkout of the repository (benches/accuracy.py keys cached exact
references by it). Nothing third-party is committed: sources come from
crates.io at build time.

    from workloads import build
    progs = build("target/bench", set="ci")   # {name: argv}

``set="ci"`` is a fast subset (stencil, hash_collide, lua; builds in seconds);
``set="real"`` the six real programs; ``set="more"`` three more real
programs of other kinds (webp, expat, treesitter); ``set="bench"`` both;
``set="all"`` is everything (SQLite's
amalgamation alone takes about a minute to compile). Binaries are cached: a workload is rebuilt only when one of its
sources is newer than its binary.

Run as a script, builds everything into target/bench and prints a table of
build and native run times.
"""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "workloads")
ROOT = os.path.dirname(HERE)

CRATES = {  # crate -> (version requirement for cargo fetch, file that must exist)
    "lua-src": ("*", "lua-5.4.*/lapi.c"),
    "libsqlite3-sys": ("*", "sqlite3/sqlite3.c"),
    "zstd-sys": ("*", "zstd/lib/zstd.h"),
    "pcre2-sys": ("*", "upstream/src/pcre2_match.c"),
    # Only a pre-release of the crate bundles simdjson 4 (its amalgamated
    # release sources); cargo's "*" never picks a pre-release.
    "simdjson-sys": ("=0.4.0-alpha.2", "vendor/simdjson/simdjson.cpp"),
    "libwebp-sys": ("*", "vendor/src/webp/encode.h"),
    "expat-sys": ("*", "expat/lib/xmlparse.c"),
    "tree-sitter": ("*", "src/lib.c"),
    "tree-sitter-c": ("*", "src/parser.c"),
}
# Rust workloads: a cargo project generated under the output directory that
# builds a driver from benches/workloads/ against a crates.io crate.
RUST = {  # name -> (driver, dependency lines, argv tail)
    "fft": ("fft_driver.rs", 'rustfft = "=6.4.1"', ["3600", "8", "3000"]),
}

SETS = {
    "ci": ["stencil", "hash_collide", "lua"],
    "all": ["zstd", "sqlite", "lua", "pcre2", "simdjson", "fft", "webp", "expat", "treesitter", "stencil", "nbody",
            "linear_search", "hash_collide", "regscan"],
    "real": ["zstd", "sqlite", "lua", "pcre2", "simdjson", "fft"],
    # Three more real programs of other kinds: an image codec, an XML
    # parser, an incremental parser generator's runtime.
    "more": ["webp", "expat", "treesitter"],
}
SETS["bench"] = SETS["real"] + SETS["more"]


def _cargo_home():
    return os.environ.get("CARGO_HOME") or os.path.join(os.path.expanduser("~"), ".cargo")


def _version_key(path, crate):
    ver = os.path.basename(path.rstrip("/"))[len(crate) + 1:]
    return [int(x) if x.isdigit() else x for x in re.split(r"[.+-]", ver)]


def _find_crate_dir(crate):
    """The newest unpacked copy of `crate` in cargo's registry, or None."""
    marker = CRATES[crate][1]
    found = []
    for d in glob.glob(os.path.join(_cargo_home(), "registry", "src", "*", crate + "-[0-9]*")):
        if glob.glob(os.path.join(d, marker)):
            found.append(d)
    if not found:
        return None
    return max(found, key=lambda d: _version_key(d, crate))


def _fetch_crates(crates, out_dir):
    """Run `cargo fetch` in a generated project depending on `crates`."""
    proj = os.path.join(out_dir, "fetch-crates")
    os.makedirs(os.path.join(proj, "src"), exist_ok=True)
    deps = "\n".join('%s = "%s"' % (c, CRATES[c][0]) for c in crates)
    with open(os.path.join(proj, "Cargo.toml"), "w") as f:
        f.write('[package]\nname = "witch-bench-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
                "publish = false\n\n[workspace]\n\n[dependencies]\n" + deps + "\n")
    with open(os.path.join(proj, "src", "main.rs"), "w") as f:
        f.write("fn main() {}\n")
    subprocess.run(["cargo", "fetch", "--manifest-path", os.path.join(proj, "Cargo.toml")], check=True)


def _crate_dirs(crates, out_dir):
    dirs = {c: _find_crate_dir(c) for c in crates}
    missing = [c for c, d in dirs.items() if d is None]
    if missing:
        _fetch_crates(missing, out_dir)
        for c in missing:
            dirs[c] = _find_crate_dir(c)
            if dirs[c] is None:
                raise RuntimeError("crate %s not found in %s after cargo fetch" % (c, _cargo_home()))
    return dirs


def _spec(name, out_dir):
    """How to build a workload: dict of sources, headers (for the cache),
    extra flags, libraries and the argv tail."""
    w = lambda f: os.path.join(SRC, f)
    if name == "zstd":
        lib = os.path.join(_crate_dirs(["zstd-sys"], out_dir)["zstd-sys"], "zstd", "lib")
        srcs = sorted(glob.glob(os.path.join(lib, "common", "*.c")) + glob.glob(os.path.join(lib, "compress", "*.c"))
                      + glob.glob(os.path.join(lib, "decompress", "*.c")))
        return dict(srcs=[w("zstd_driver.c")] + srcs, hdr_dirs=[lib] + [os.path.join(lib, d) for d in
                    ("common", "compress", "decompress")], cflags=["-I" + lib, "-DZSTD_DISABLE_ASM"],
                    libs=[], args=["32", "3"])
    if name == "sqlite":
        d = os.path.join(_crate_dirs(["libsqlite3-sys"], out_dir)["libsqlite3-sys"], "sqlite3")
        return dict(srcs=[w("sqlite_driver.c"), os.path.join(d, "sqlite3.c")], hdr_dirs=[d],
                    cflags=["-I" + d, "-DSQLITE_THREADSAFE=0", "-DSQLITE_OMIT_LOAD_EXTENSION",
                            "-DSQLITE_DEFAULT_MEMSTATUS=0", "-DSQLITE_DQS=0"],
                    libs=["-lm"], args=["200000"])
    if name == "lua":
        crate = _crate_dirs(["lua-src"], out_dir)["lua-src"]
        d = max(glob.glob(os.path.join(crate, "lua-5.4.*")), key=lambda p: _version_key(p, "lua"))
        srcs = sorted(f for f in glob.glob(os.path.join(d, "*.c"))
                      if os.path.basename(f) not in ("lua.c", "luac.c", "onelua.c"))
        return dict(srcs=[w("lua_main.c")] + srcs, hdr_dirs=[d], cflags=["-I" + d, "-DLUA_USE_LINUX"],
                    libs=["-lm", "-ldl"], args=[w("bench.lua"), "3"])
    if name == "pcre2":
        # As pcre2-sys builds it (its NON-AUTOTOOLS-BUILD recipe), but
        # without SUPPORT_JIT: the interpreter matches.
        up = os.path.join(_crate_dirs(["pcre2-sys"], out_dir)["pcre2-sys"], "upstream")
        skip = ("pcre2_jit_match.c", "pcre2_jit_misc.c", "pcre2_ucptables.c")
        srcs = sorted(f for f in glob.glob(os.path.join(up, "src", "*.c")) if os.path.basename(f) not in skip)
        return dict(srcs=[w("pcre2_driver.c")] + srcs, hdr_dirs=[os.path.join(up, "src"), os.path.join(up, "include")],
                    cflags=["-I" + os.path.join(up, "src"), "-I" + os.path.join(up, "include"),
                            "-DPCRE2_CODE_UNIT_WIDTH=8", "-DHAVE_STDLIB_H=1", "-DHAVE_MEMMOVE=1", "-DHAVE_CONFIG_H=1",
                            "-DPCRE2_STATIC=1", "-DSTDC_HEADERS=1", "-DSUPPORT_PCRE2_8=1", "-DSUPPORT_UNICODE=1"],
                    libs=[], args=["4096", "2"])
    if name == "simdjson":
        d = os.path.join(_crate_dirs(["simdjson-sys"], out_dir)["simdjson-sys"], "vendor", "simdjson")
        return dict(srcs=[w("simdjson_driver.cpp"), os.path.join(d, "simdjson.cpp")], hdr_dirs=[d],
                    cflags=["-I" + d, "-std=c++17"], libs=[], args=["8192", "20"])
    if name == "webp":
        # As libwebp-sys builds it (NDEBUG, SSE2 kernels; no threads): the
        # decoder, encoder, DSP and utility sources and SharpYUV.
        v = os.path.join(_crate_dirs(["libwebp-sys"], out_dir)["libwebp-sys"], "vendor")
        parts = [os.path.join(v, "src", d) for d in ("dec", "enc", "dsp", "utils")] + [os.path.join(v, "sharpyuv")]
        srcs = sorted(f for d in parts for f in glob.glob(os.path.join(d, "*.c")))
        return dict(srcs=[w("webp_driver.c")] + srcs, hdr_dirs=parts + [os.path.join(v, "src", "webp")],
                    cflags=["-I" + v, "-I" + os.path.join(v, "src"), "-DNDEBUG", "-DWEBP_HAVE_SSE2"],
                    libs=["-lm"], args=["256", "30"])
    if name == "expat":
        # What expat's configure script defines on Linux (expat_config.h).
        lib = os.path.join(_crate_dirs(["expat-sys"], out_dir)["expat-sys"], "expat", "lib")
        srcs = [os.path.join(lib, f) for f in ("xmlparse.c", "xmlrole.c", "xmltok.c")]
        return dict(srcs=[w("expat_driver.c")] + srcs, hdr_dirs=[lib],
                    cflags=["-I" + lib, "-DXML_NS=1", "-DXML_DTD=1", "-DXML_CONTEXT_BYTES=1024", "-DBYTEORDER=1234",
                            "-DHAVE_MEMMOVE=1", "-DHAVE_STDLIB_H=1", "-DHAVE_STRING_H=1", "-DHAVE_UNISTD_H=1"],
                    libs=[], args=["4096", "10"])
    if name == "treesitter":
        # The runtime as the tree-sitter crate builds it (its unity file
        # lib.c, C11) and the C grammar's generated parser.
        d = _crate_dirs(["tree-sitter", "tree-sitter-c"], out_dir)
        rt, gr = d["tree-sitter"], os.path.join(d["tree-sitter-c"], "src")
        return dict(srcs=[w("treesitter_driver.c"), os.path.join(rt, "src", "lib.c"), os.path.join(gr, "parser.c")],
                    hdr_dirs=[os.path.join(rt, "src"), os.path.join(rt, "include", "tree_sitter"),
                              os.path.join(gr, "tree_sitter")],
                    cflags=["-std=c11", "-I" + os.path.join(rt, "include"), "-I" + os.path.join(rt, "src"), "-I" + gr,
                            "-D_POSIX_C_SOURCE=200112L", "-D_DEFAULT_SOURCE"],
                    libs=[], args=["1000", "2"])
    simple = {
        "stencil": (w("stencil.c"), ["128", "250"]),
        "nbody": (w("nbody.c"), ["1000", "250"]),
        "linear_search": (w("linear_search.c"), ["4000", "80000"]),
        "hash_collide": (w("hash_collide.c"), ["45000", "45000"]),
        "regscan": (os.path.join(ROOT, "examples", "regscan.c"), ["4000000"]),
    }
    if name in simple:
        src, args = simple[name]
        return dict(srcs=[src], hdr_dirs=[], cflags=[], libs=["-lm"], args=args)
    raise KeyError("unknown workload %r" % name)


def _mtime(p):
    try:
        return os.stat(p).st_mtime
    except FileNotFoundError:
        return None


def _cc(args, cxx=False):
    # Run from the repository with its path mapped to ".", so a workload's
    # binary (and its debug info) is the same from any checkout: accuracy.py
    # keys its cached exact references by the binary's contents.
    cmd = ["g++" if cxx else "gcc", "-ffile-prefix-map=%s=." % ROOT] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), r.stderr))


def _build_rust(name, out_dir):
    """Build a RUST workload with cargo (opt-level 2, full debug info: the
    -O2 -g of the C ones); returns (argv, build seconds, rebuilt?)."""
    driver, deps, args = RUST[name]
    proj = os.path.join(out_dir, "rust-" + name)
    os.makedirs(proj, exist_ok=True)
    manifest = ('[package]\nname = "witch-bench-%s"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
                '[workspace]\n\n[[bin]]\nname = "%s"\npath = "%s"\n\n[dependencies]\n%s\n\n'
                '[profile.release]\nopt-level = 2\ndebug = 2\n' % (name, name, os.path.join(SRC, driver), deps))
    path = os.path.join(proj, "Cargo.toml")
    if not os.path.exists(path) or open(path).read() != manifest:
        with open(path, "w") as f:
            f.write(manifest)
    exe = os.path.join(out_dir, name)
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(proj, "target"),
               RUSTFLAGS="--remap-path-prefix=%s=." % ROOT)
    t0 = time.monotonic()
    built = os.path.join(proj, "target", "release", name)
    before = _mtime(built)
    r = subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", path], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("cargo build of %s failed:\n%s" % (name, r.stderr))
    rebuilt = _mtime(built) != before or _mtime(exe) is None
    if rebuilt:
        shutil.copy2(built, exe)
    return [exe] + args, time.monotonic() - t0, rebuilt


def build_one(name, out_dir):
    """Build one workload; returns (argv, build seconds, rebuilt?)."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if name in RUST:
        return _build_rust(name, out_dir)
    spec = _spec(name, out_dir)
    exe = os.path.join(out_dir, name)
    argv = [exe] + spec["args"]
    cxx = any(s.endswith(".cpp") for s in spec["srcs"])
    base = ["-O2", "-g"] + spec["cflags"]
    # A change of flags or compiler rebuilds too, not only newer sources.
    stamp_text = " ".join(["g++" if cxx else "gcc", "-ffile-prefix-map=%s=." % ROOT] + base + spec["libs"]) + "\n"
    stamp = exe + ".flags"
    same_flags = os.path.exists(stamp) and open(stamp).read() == stamp_text
    inputs = list(spec["srcs"])
    for d in spec["hdr_dirs"]:
        inputs += glob.glob(os.path.join(d, "*.h"))
    exe_time = _mtime(exe)
    newest = max(os.stat(p).st_mtime for p in inputs)
    hdr_newest = max([os.stat(p).st_mtime for p in inputs[len(spec["srcs"]):]] or [0])
    if exe_time is not None and exe_time > newest and same_flags:
        return argv, 0.0, False
    t0 = time.monotonic()
    if len(spec["srcs"]) == 1:
        _cc(base + ["-o", exe] + spec["srcs"] + spec["libs"], cxx)
    else:
        obj_dir = os.path.join(out_dir, "obj", name)
        os.makedirs(obj_dir, exist_ok=True)
        objs, jobs = [], []
        for src in spec["srcs"]:
            obj = os.path.join(obj_dir, os.path.splitext(os.path.basename(src))[0] + ".o")
            objs.append(obj)
            ot = _mtime(obj)
            if ot is None or ot <= max(os.stat(src).st_mtime, hdr_newest) or not same_flags:
                jobs.append(base + ["-c", "-o", obj, src])
        # the biggest translation units first, so they overlap with the rest
        jobs.sort(key=lambda a: -os.stat(a[-1]).st_size)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for f in [pool.submit(_cc, j, j[-1].endswith(".cpp")) for j in jobs]:
                f.result()
        _cc(["-o", exe] + objs + spec["libs"], cxx)
    with open(stamp, "w") as f:
        f.write(stamp_text)
    return argv, time.monotonic() - t0, True


def build(out_dir: str, set: str = "ci") -> dict[str, list[str]]:
    """Build the workloads of `set` ("ci", "real" or "all") into out_dir; {name: argv}."""
    if set not in SETS:
        raise ValueError("unknown set %r (have %s)" % (set, ", ".join(SETS)))
    return {name: build_one(name, out_dir)[0] for name in SETS[set]}


def main():
    out_dir = os.path.join(ROOT, "target", "bench")
    names = SETS["all"] if len(sys.argv) < 2 else SETS.get(sys.argv[1], sys.argv[1:])
    rows, failed = [], False
    for name in names:
        argv, secs, rebuilt = build_one(name, out_dir)
        t0 = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True)
        run = time.monotonic() - t0
        out = r.stdout.strip().splitlines()
        if r.returncode != 0:
            failed = True
            print("%s exited %d: %s" % (name, r.returncode, r.stderr.strip()), file=sys.stderr)
        rows.append((name, "%.1f" % secs if rebuilt else "cached", "%.2f" % run, r.returncode,
                     (out[0] if out else "")[:70]))
    print("| workload | build s | native run s | exit | output (first line) |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| %s | %s | %s | %d | `%s` |" % row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
