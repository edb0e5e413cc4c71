//! Symbolization paths: C++ demangling, separate debug files by build-id and by
//! .gnu_debuglink, and the silent crafts' wording and approximate waste.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use witchcraft::profile::{Counters, Craft, Module, Node, Pair, Thread};

const CPP: &str = r#"namespace ns {
struct Widget {
	int v[64];
	void poke(int i, int x);
};
__attribute__((noipa)) void Widget::poke(int i, int x)
{
	v[i & 63] = x;
}
}

template <typename T> __attribute__((noipa)) T twice(const T *x)
{
	return *x * 2;
}

int main(int argc, char **)
{
	static ns::Widget w;
	w.poke(argc, argc);
	return twice<int>(&w.v[1]);
}
"#;

struct Cpp {
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
    build_id: String,
    poke: u64,
    twice: u64,
}

fn cpp(name: &str) -> Cpp {
    let dir = scratch(name);
    let src = dir.join("w.cc");
    std::fs::write(&src, CPP).unwrap();
    let bin = dir.join("w");
    sh_out(Command::new("g++").args(["-O2", "-g", "-no-pie", "-Wl,--build-id", "-o"]).arg(&bin).arg(&src));
    let sym = |mangled: &str| -> u64 {
        let nm = sh_out(Command::new("nm").arg(&bin));
        let l = nm.lines().find(|l| l.ends_with(&format!(" {mangled}"))).unwrap_or_else(|| panic!("{mangled}"));
        u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap()
    };
    let build_id = sh_out(Command::new("readelf").arg("-n").arg(&bin))
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap();
    Cpp { poke: sym("_ZN2ns6Widget4pokeEii"), twice: sym("_Z5twiceIiET_PKS0_"), dir, bin, build_id }
}

fn cpp_profile(c: &Cpp, path: &Path) -> witchcraft::profile::Profile {
    let t = Thread {
        tid: 1,
        nodes: vec![
            Node { parent: 0, pc: 0, samples: 0 },
            Node { parent: 0, pc: c.poke, samples: 1 },
            Node { parent: 0, pc: c.twice, samples: 1 },
        ],
        pairs: vec![Pair { watch: 1, trap: 2, waste: 0.0, approx_waste: 0.0, r#use: 64.0, traps: 1, ..Default::default() }],
        counters: Counters::default(),
        clusters: Default::default(),
        objects: Vec::new(),
    };
    let m = Module { path: path.display().to_string(), build_id: Some(c.build_id.clone()), start: 0x400000, end: 0x405000, bias: 0 };
    skeleton(Craft::Dead, &c.bin.display().to_string(), vec![m], vec![t])
}

fn report_json(profile: &Path, debug_dirs: Option<&Path>) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_witch"));
    cmd.arg("report").arg(profile).arg("--json").env_remove("DEBUGINFOD_URLS");
    match debug_dirs {
        Some(d) => cmd.env("WITCH_DEBUG_DIRS", d),
        None => cmd.env_remove("WITCH_DEBUG_DIRS"),
    };
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

fn first_frames(v: &Value) -> (Value, Value) {
    (v["pairs"][0]["watch"]["frames"][0].clone(), v["pairs"][0]["trap"]["frames"][0].clone())
}

#[test]
fn cpp_names_are_demangled_with_and_without_debug_info() {
    let c = cpp("cpp-demangle");
    let v = report_json(&save_in(&c.dir, &cpp_profile(&c, &c.bin), "cpp.witch"), None);
    let (w, t) = first_frames(&v);
    assert_eq!(w["function"], "ns::Widget::poke(int, int)", "{w}");
    assert!(w["file"].as_str().unwrap().ends_with("w.cc") && w["line"].is_u64(), "{w}");
    assert!(t["function"].as_str().unwrap().contains("twice<int>"), "{t}");

    // Symbol-table fallback demangles too.
    let stripped = c.dir.join("w-stripped");
    sh_out(Command::new("objcopy").arg("--strip-debug").arg(&c.bin).arg(&stripped));
    let v = report_json(&save_in(&c.dir, &cpp_profile(&c, &stripped), "cpp-stripped.witch"), Some(&c.dir.join("none")));
    let (w, t) = first_frames(&v);
    assert_eq!(w["function"], "ns::Widget::poke(int, int)", "{w}");
    assert!(w["line"].is_null());
    assert!(t["function"].as_str().unwrap().contains("twice<int>"), "{t}");
}

#[test]
fn separate_debug_file_by_build_id_and_by_debuglink() {
    let c = cpp("cpp-debugfile");
    let debug = c.dir.join("w.debug");
    sh_out(Command::new("objcopy").arg("--only-keep-debug").arg(&c.bin).arg(&debug));
    let stripped = c.dir.join("w-stripped");
    sh_out(Command::new("objcopy").arg("--strip-debug").arg(&c.bin).arg(&stripped));

    // By build-id under a debug root.
    let root = c.dir.join("debugroot");
    let id = &c.build_id;
    let d = root.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(&debug, d.join(format!("{}.debug", &id[2..]))).unwrap();
    let prof = save_in(&c.dir, &cpp_profile(&c, &stripped), "bid.witch");
    let (w, _) = first_frames(&report_json(&prof, Some(&root)));
    assert!(w["line"].is_u64(), "debug file by build-id not used: {w}");
    let (w, _) = first_frames(&report_json(&prof, Some(&c.dir.join("none"))));
    assert!(w["line"].is_null(), "{w}");

    // A debug file under the right name but of another build is refused.
    let bad = root.join(".build-id").join("00");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(&debug, bad.join("11223344556677889900aabbccddeeff001122.debug")).unwrap();
    let mut p = cpp_profile(&c, Path::new("/nonexistent/w"));
    p.modules[0].build_id = Some("0011223344556677889900aabbccddeeff001122".into());
    let (w, _) = first_frames(&report_json(&save_in(&c.dir, &p, "badbid.witch"), Some(&root)));
    assert!(w["line"].is_null(), "{w}");
    assert_eq!(w["function"], format!("w+{:#x}", c.poke));

    // By .gnu_debuglink next to the binary.
    let linked = c.dir.join("w-linked");
    sh_out(Command::new("objcopy").arg("--strip-debug").arg(format!("--add-gnu-debuglink={}", debug.display())).arg(&c.bin).arg(&linked));
    let prof = save_in(&c.dir, &cpp_profile(&c, &linked), "link.witch");
    let (w, _) = first_frames(&report_json(&prof, Some(&c.dir.join("none"))));
    assert!(w["line"].is_u64(), "debug file by debuglink not used: {w}");
}

/// As distribution packages ship them: `strip --strip-all` (no symbol table,
/// no DWARF), the debug file elsewhere. Every place the lookup searches.
#[test]
fn fully_stripped_binary_symbolizes_to_file_and_line_from_its_debug_file() {
    let c = cpp("cpp-strip-all");
    let debug = c.dir.join("keep.debug");
    sh_out(Command::new("objcopy").arg("--only-keep-debug").arg(&c.bin).arg(&debug));
    let none = c.dir.join("none");
    let check = |bin: &Path, roots: &Path, how: &str| {
        let (w, t) = first_frames(&report_json(&save_in(&c.dir, &cpp_profile(&c, bin), &format!("{how}.witch")), Some(roots)));
        assert_eq!(w["function"], "ns::Widget::poke(int, int)", "{how}: {w}");
        assert!(w["file"].as_str().is_some_and(|f| f.ends_with("w.cc")) && w["line"].is_u64(), "{how}: no file:line: {w}");
        assert!(t["function"].as_str().unwrap().contains("twice<int>"), "{how}: {t}");
    };

    // Without its debug file a fully stripped binary has no names at all: the
    // checks below can fail.
    let bare = c.dir.join("bare/w");
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    sh_out(Command::new("objcopy").arg("--strip-all").arg(&c.bin).arg(&bare));
    let (w, _) = first_frames(&report_json(&save_in(&c.dir, &cpp_profile(&c, &bare), "bare.witch"), Some(&none)));
    assert!(w["line"].is_null() && !w["function"].as_str().unwrap().contains("poke"), "{w}");

    // By build-id: ROOT/.build-id/xx/rest.debug.
    let root = c.dir.join("root");
    let d = root.join(".build-id").join(&c.build_id[..2]);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(&debug, d.join(format!("{}.debug", &c.build_id[2..]))).unwrap();
    check(&bare, &root, "build-id");

    // By .gnu_debuglink: beside the binary, in .debug/ beside it, and under
    // ROOT/<the binary's directory>/.
    for (dir, place) in [("beside", "."), ("sub", ".debug"), ("rooted", "ROOT")] {
        let bin = c.dir.join(dir).join("w");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        let link = c.dir.join("w.debug");
        std::fs::copy(&debug, &link).unwrap();
        sh_out(Command::new("objcopy").arg("--strip-all").arg(format!("--add-gnu-debuglink={}", link.display())).arg(&c.bin).arg(&bin));
        std::fs::remove_file(&link).unwrap();
        let (target, roots) = match place {
            "ROOT" => {
                let abs = std::fs::canonicalize(bin.parent().unwrap()).unwrap();
                let r = c.dir.join(format!("root-{dir}"));
                (r.join(abs.strip_prefix("/").unwrap()).join("w.debug"), r)
            }
            sub => (bin.parent().unwrap().join(sub).join("w.debug"), none.clone()),
        };
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&debug, &target).unwrap();
        check(&bin, &roots, dir);
    }
}

#[test]
fn silent_crafts_word_pairs_and_split_approximate_waste() {
    let fx = fixture();
    for (craft, watch, trap, rel) in [
        (Craft::SilentStore, "store", "rewritten with the same value by", "SAME_VALUE_AS"),
        (Craft::SilentLoad, "load", "reloaded unchanged by", "SAME_VALUE_AS"),
    ] {
        let mut p = profile(fx, 0, BASE);
        p.craft = craft;
        // 800 exact + 100 approximate waste on init→fill; fill→fill 100 exact; use 300.
        p.threads[0].pairs[0].waste = 500.0;
        p.threads[0].pairs[0].approx_waste = 100.0;
        let path = save(&p, &format!("{}.witch", craft.name()));
        let o = witch(["report".as_ref(), path.as_os_str()]);
        assert!(o.status.success());
        let t = stdout(&o);
        assert!(t.contains(&format!("witch {}:", craft.name())), "{t}");
        assert!(t.contains(&format!("\n     {watch}\n")), "{t}");
        assert!(t.contains(&format!("\n     {trap}\n")), "{t}");
        // 900 waste of 1200: exact 800/1200, approximate 100/1200.
        assert!(t.contains("Waste fraction: 75.0%"), "{t}");
        assert!(t.contains("exact 66.7%, approximate 8.3% (floating point equal within 1.0%)"), "{t}");
        let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["craft"], craft.name());
        assert_eq!(v["waste"], 900.0);
        assert_eq!(v["approx_waste"], 100.0);
        assert_eq!(v["pairs"][0]["approx_waste"], 100.0);
        let o = witch(["report".as_ref(), path.as_os_str(), "--folded".as_ref(), "--view".as_ref(), "pairs".as_ref()]);
        assert!(stdout(&o).contains(&format!("main;init;{rel};main;fill;poke 800")), "{}", stdout(&o));
    }
}

#[test]
fn rust_names_are_demangled_in_a_pie() {
    let dir = scratch("rust");
    let src = dir.join("demo.rs");
    std::fs::write(
        &src,
        "#[inline(never)]\nfn compute(v: &mut Vec<u64>) -> u64 {\n    v.iter_mut().for_each(|x| *x += 1);\n    v.iter().sum()\n}\nfn main() {\n    let mut v = vec![1u64; std::env::args().count()];\n    println!(\"{}\", compute(&mut v));\n}\n",
    )
    .unwrap();
    let bin = dir.join("demo");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    sh_out(Command::new(rustc).args(["-g", "-C", "opt-level=2", "--crate-name", "demo", "-o"]).arg(&bin).arg(&src));
    let nm = sh_out(Command::new("nm").arg(&bin));
    let addr = nm
        .lines()
        .find(|l| l.contains("demo7compute") || l.contains("4demo7compute"))
        .map(|l| u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap())
        .expect("compute symbol");
    // A PIE loaded at a typical base: runtime = file address + bias.
    let bias = 0x5555_5555_0000u64;
    let t = Thread {
        tid: 1,
        nodes: vec![Node { parent: 0, pc: 0, samples: 0 }, Node { parent: 0, pc: bias + addr, samples: 1 }],
        pairs: vec![Pair { watch: 1, trap: 1, waste: 8.0, approx_waste: 0.0, r#use: 0.0, traps: 1, ..Default::default() }],
        counters: Counters::default(),
        clusters: Default::default(),
        objects: Vec::new(),
    };
    let m = Module { path: bin.display().to_string(), build_id: None, start: bias, end: bias + 0x1000_0000, bias };
    let p = skeleton(Craft::Dead, &bin.display().to_string(), vec![m], vec![t]);
    let v = report_json(&save_in(&dir, &p, "rust.witch"), None);
    // Inlined std frames first, then compute itself; all demangled, hashes dropped.
    let frames = v["pairs"][0]["watch"]["frames"].as_array().unwrap().clone();
    let w = frames.last().unwrap();
    assert_eq!(w["function"], "demo::compute", "{frames:?}");
    assert_eq!(w["offset"], addr);
    assert_eq!(w["inlined"], false);
    assert!(w["file"].as_str().unwrap().ends_with("demo.rs"), "{w}");
    for f in &frames {
        let n = f["function"].as_str().unwrap();
        assert!(!n.starts_with("_ZN") && !n.starts_with("_R") && !n.contains("17h"), "{n}");
    }
}
