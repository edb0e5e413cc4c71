//! Finding the PMU's memory events in sysfs.

use super::{AccessKind, PmuEvent};
use perf_event_open_sys::bindings as b;
use std::fs;
use std::path::Path;

// ---------------------------------------------------------------------------
// sysfs discovery

/// Intel PMU directories, best first: on hybrid parts the P-cores (`cpu_core`)
/// have the richer PEBS; `cpu` is the classic name.
const INTEL_PMUS: [&str; 3] = ["cpu_core", "cpu", "cpu_atom"];

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn pmu_type(dir: &Path) -> Result<u32, String> {
    let t = dir.join("type");
    read_trim(&t).and_then(|s| s.parse().ok()).ok_or_else(|| format!("cannot read {}", t.display()))
}

/// Sysfs does not say "Intel"; these format terms and `caps/pmu_name` only
/// exist on Intel core PMUs (AMD's `cpu` has event/umask/edge/inv/cmask).
fn looks_intel(dir: &Path) -> bool {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "cpu_core" || name == "cpu_atom" {
        return true;
    }
    ["ldlat", "offcore_rsp", "in_tx", "frontend", "pc", "any"].iter().any(|t| dir.join("format").join(t).exists())
        || dir.join("caps/pmu_name").exists()
}

/// Intel precise level: 2 (zero skid for PEBS via IP fix-up), lowered to what
/// `caps/max_precise` allows. 0 means PEBS is unusable (e.g. in many VMs).
fn intel_precise(dir: &Path) -> u8 {
    match read_trim(&dir.join("caps/max_precise")).and_then(|s| s.parse::<u8>().ok()) {
        Some(m) => m.min(2),
        None => 2,
    }
}

/// One `<pmu>/format/<term>` file: which attr field and which bits.
#[derive(Debug, PartialEq)]
struct TermFormat {
    field: u8, // 0 = config, 1 = config1, 2 = config2
    ranges: Vec<(u32, u32)>,
}

fn parse_format(s: &str) -> Result<TermFormat, String> {
    let (field, bits) = s.trim().split_once(':').ok_or_else(|| format!("bad format {s:?}"))?;
    let field = match field {
        "config" => 0,
        "config1" => 1,
        "config2" => 2,
        _ => return Err(format!("unsupported format field {field:?}")),
    };
    let mut ranges = Vec::new();
    for r in bits.split(',') {
        let (lo, hi) = match r.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (r, r),
        };
        let lo: u32 = lo.trim().parse().map_err(|_| format!("bad format {s:?}"))?;
        let hi: u32 = hi.trim().parse().map_err(|_| format!("bad format {s:?}"))?;
        if lo > hi || hi > 63 {
            return Err(format!("bad format {s:?}"));
        }
        ranges.push((lo, hi));
    }
    Ok(TermFormat { field, ranges })
}

/// Spread `value`'s low bits over the format's bit ranges, in order.
fn deposit(f: &TermFormat, mut value: u64) -> Option<u64> {
    let mut out = 0u64;
    for &(lo, hi) in &f.ranges {
        for bit in lo..=hi {
            out |= (value & 1) << bit;
            value >>= 1;
        }
    }
    (value == 0).then_some(out)
}

fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A PMU event's `perf_event_attr` config words (config, config1,
/// config2), accumulated from `term[=value]` lists.
#[derive(Default)]
struct ConfigWords {
    words: [u64; 3],
}

impl ConfigWords {
    /// Apply "event=0xd0,umask=0x82" style terms of PMU `dir`. A bare term is
    /// a flag (value 1) if the PMU has that format, else a named event alias.
    fn apply(&mut self, dir: &Path, terms: &str, depth: u32) -> Result<(), String> {
        for term in terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (key, val) = match term.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (term, None),
            };
            let num = |v: Option<&str>| -> Result<u64, String> {
                match v {
                    None => Ok(1),
                    Some(v) => parse_num(v).ok_or_else(|| format!("bad value in term {term:?}")),
                }
            };
            match key {
                "config" => self.words[0] = num(val)?,
                "config1" => self.words[1] = num(val)?,
                "config2" => self.words[2] = num(val)?,
                // The caller sets the period; names are cosmetic.
                "period" | "name" => {}
                _ => {
                    let fpath = dir.join("format").join(key);
                    if let Some(f) = read_trim(&fpath) {
                        let f = parse_format(&f)?;
                        let v = num(val)?;
                        let bits = deposit(&f, v).ok_or_else(|| format!("value {v:#x} too wide for term {key:?}"))?;
                        self.words[f.field as usize] |= bits;
                    } else if val.is_none() && depth == 0 {
                        let alias = dir.join("events").join(key);
                        let body = read_trim(&alias).ok_or_else(|| format!("{} has no format or event named {key:?}", dir.display()))?;
                        self.apply(dir, &body, depth + 1)?;
                    } else {
                        return Err(format!("{} has no format term {key:?}", dir.display()));
                    }
                }
            }
        }
        Ok(())
    }
}

fn event_in(dir: &Path, pmu: &str, terms: &str, display: &str, kind: AccessKind, precise: u8) -> Result<PmuEvent, String> {
    let mut c = ConfigWords::default();
    c.apply(dir, terms, 0)?;
    Ok(PmuEvent {
        name: format!("{pmu}/{display}/"),
        pmu_type: pmu_type(dir)?,
        config: c.words[0],
        config1: c.words[1],
        config2: c.words[2],
        precise_ip: precise,
        kind,
        ibs: false,
    })
}

/// IBS op event: count dispatched ops (`cnt_ctl`) rather than cycles so that
/// samples follow instructions, and filter user mode in the kernel (`swfilt`,
/// newer kernels) so unprivileged users can open it.
fn ibs_event(dir: &Path, kind: AccessKind) -> Result<PmuEvent, String> {
    let mut terms = Vec::new();
    for t in ["cnt_ctl", "swfilt"] {
        if dir.join("format").join(t).exists() {
            terms.push(t);
        }
    }
    let terms = terms.join(",");
    let mut c = ConfigWords::default();
    c.apply(dir, &terms, 0)?;
    Ok(PmuEvent {
        name: format!("ibs_op/{terms}/"),
        pmu_type: pmu_type(dir)?,
        config: c.words[0],
        config1: c.words[1],
        config2: c.words[2],
        precise_ip: 0,
        kind,
        ibs: true,
    })
}

fn named_event(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Load => "mem-loads",
        AccessKind::Store => "mem-stores",
    }
}

/// MEM_INST_RETIRED.ALL_LOADS / ALL_STORES (MEM_UOPS_RETIRED.* on older parts).
fn intel_fallback(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Load => "event=0xd0,umask=0x81",
        AccessKind::Store => "event=0xd0,umask=0x82",
    }
}

/// Find the precise memory event for `kind` on this machine, reading sysfs
/// under `sysfs_root` (normally [`SYSFS_PMU_ROOT`]).
pub fn discover(sysfs_root: &Path, kind: AccessKind) -> Result<PmuEvent, String> {
    let mut why = Vec::new();
    for pmu in INTEL_PMUS {
        let dir = sysfs_root.join(pmu);
        if !dir.join("type").exists() {
            continue;
        }
        let named = named_event(kind);
        let has_named = dir.join("events").join(named).exists();
        let intel = has_named || looks_intel(&dir);
        if !intel {
            continue; // e.g. AMD's core PMU: no data addresses; try IBS below
        }
        let precise = intel_precise(&dir);
        if precise == 0 {
            why.push(format!("{pmu}: PEBS unavailable (caps/max_precise=0)"));
            continue;
        }
        // mem-loads on Sapphire Rapids / Alder Lake P-cores only works inside a
        // group led by mem-loads-aux; ALL_LOADS gives addresses without that.
        let needs_aux = kind == AccessKind::Load && dir.join("events/mem-loads-aux").exists();
        if has_named && !needs_aux {
            return event_in(&dir, pmu, named, named, kind, precise);
        }
        let terms = intel_fallback(kind);
        return event_in(&dir, pmu, terms, terms, kind, precise);
    }
    let ibs = sysfs_root.join("ibs_op");
    if ibs.join("type").exists() {
        return ibs_event(&ibs, kind);
    }
    if sysfs_root.join("cpu").exists() {
        why.push("cpu: core PMU without precise memory events, and no ibs_op".into());
    }
    if why.is_empty() {
        why.push(format!("no cpu, cpu_core or ibs_op PMU under {} (virtual machine without PMU passthrough?)", sysfs_root.display()));
    }
    Err(format!("no PMU: {}", why.join("; ")))
}

/// Parse a user event spec like "cpu/mem-stores/", "cpu_core/event=0xd0,umask=0x82/",
/// "ibs_op//", "mem-loads", or "r82d0", optionally followed by `p`/`pp`/`ppp`
/// ("cpu/mem-stores/pp", "mem-loads:pp") to set precise_ip.
pub fn parse_event(sysfs_root: &Path, spec: &str, kind: AccessKind) -> Result<PmuEvent, String> {
    let spec = spec.trim();
    let (body, mods) = if let Some(first) = spec.find('/') {
        let last = spec.rfind('/').unwrap();
        if last == first {
            return Err(format!("event {spec:?}: missing closing '/'"));
        }
        (&spec[..=last], spec[last + 1..].trim_start_matches(':'))
    } else {
        match spec.split_once(':') {
            Some((b, m)) => (b, m),
            None => (spec, ""),
        }
    };
    let precise = if mods.is_empty() {
        None
    } else {
        let mut n = 0u8;
        for c in mods.chars() {
            match c {
                'p' => n += 1,
                'u' => {} // always user-only
                _ => return Err(format!("event {spec:?}: unsupported modifier {c:?}")),
            }
        }
        Some(n.min(3))
    };

    let mut ev = if let Some(first) = body.find('/') {
        let pmu = &body[..first];
        let terms = &body[first + 1..body.len() - 1];
        if pmu.is_empty() || pmu.contains("..") {
            return Err(format!("event {spec:?}: bad PMU name"));
        }
        let dir = sysfs_root.join(pmu);
        if !dir.join("type").exists() {
            return Err(format!("no PMU: {pmu} is not present under {}", sysfs_root.display()));
        }
        if pmu.starts_with("ibs_fetch") {
            return Err("ibs_fetch samples instruction fetches, which have no data address; use ibs_op".into());
        }
        if pmu.starts_with("ibs_op") {
            let mut c = ConfigWords::default();
            c.apply(&dir, terms, 0)?;
            PmuEvent {
                name: format!("{pmu}/{terms}/"),
                pmu_type: pmu_type(&dir)?,
                config: c.words[0],
                config1: c.words[1],
                config2: c.words[2],
                precise_ip: 0,
                kind,
                ibs: true,
            }
        } else {
            event_in(&dir, pmu, terms, terms, kind, intel_precise(&dir).max(1))?
        }
    } else if let Some(hex) = body.strip_prefix('r').filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit())) {
        let config = u64::from_str_radix(hex, 16).map_err(|_| format!("event {spec:?}: bad raw code"))?;
        PmuEvent { name: spec.to_string(), pmu_type: b::PERF_TYPE_RAW, config, config1: 0, config2: 0, precise_ip: 2, kind, ibs: false }
    } else {
        let found = INTEL_PMUS
            .iter()
            .map(|p| (p, sysfs_root.join(p)))
            .find(|(_, d)| d.join("type").exists() && d.join("events").join(body).exists());
        match found {
            Some((pmu, dir)) => event_in(&dir, pmu, body, body, kind, intel_precise(&dir).max(1))?,
            None => return Err(format!("no PMU: no PMU under {} has an event named {body:?}", sysfs_root.display())),
        }
    };
    if let Some(p) = precise {
        ev.precise_ip = p;
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::pmu::{attr, SYSFS_PMU_ROOT};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A throwaway sysfs tree; removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str) -> FakeSysfs {
            static N: AtomicUsize = AtomicUsize::new(0);
            let d = std::env::temp_dir().join(format!("witch-pmu-{}-{}-{}", std::process::id(), tag, N.fetch_add(1, Ordering::Relaxed)));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            FakeSysfs(d)
        }
        fn pmu(&self, name: &str, ty: u32, formats: &[(&str, &str)], events: &[(&str, &str)], caps: &[(&str, &str)]) -> &Self {
            let d = self.0.join(name);
            for (sub, list) in [("format", formats), ("events", events), ("caps", caps)] {
                if !list.is_empty() {
                    fs::create_dir_all(d.join(sub)).unwrap();
                }
                for (k, v) in list {
                    fs::write(d.join(sub).join(k), format!("{v}\n")).unwrap();
                }
            }
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("type"), format!("{ty}\n")).unwrap();
            self
        }
        fn vm_basics(&self) -> &Self {
            self.pmu("software", 1, &[], &[], &[]).pmu("tracepoint", 2, &[], &[], &[]).pmu("breakpoint", 5, &[], &[], &[]).pmu(
                "msr",
                9,
                &[("event", "config:0-63")],
                &[],
                &[],
            )
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const INTEL_FORMATS: &[(&str, &str)] = &[
        ("event", "config:0-7"),
        ("umask", "config:8-15"),
        ("edge", "config:18"),
        ("any", "config:21"),
        ("inv", "config:23"),
        ("cmask", "config:24-31"),
        ("ldlat", "config1:0-15"),
        ("offcore_rsp", "config1:0-63"),
    ];

    fn intel_classic() -> FakeSysfs {
        let s = FakeSysfs::new("intel");
        s.vm_basics().pmu(
            "cpu",
            4,
            INTEL_FORMATS,
            &[("mem-loads", "event=0xcd,umask=0x1,ldlat=3"), ("mem-stores", "event=0xd0,umask=0x82")],
            &[("max_precise", "3"), ("pmu_name", "skylake")],
        );
        s
    }

    #[test]
    fn format_ranges_and_deposit() {
        let f = parse_format("config:0-7,32-35").unwrap();
        assert_eq!(f, TermFormat { field: 0, ranges: vec![(0, 7), (32, 35)] });
        assert_eq!(deposit(&f, 0x1d0), Some(0x1_0000_00d0));
        assert_eq!(deposit(&f, 0x1000), None);
        let f = parse_format("config1:0-15").unwrap();
        assert_eq!((f.field, deposit(&f, 3)), (1, Some(3)));
        assert_eq!(parse_format("config2:0").unwrap().ranges, vec![(0, 0)]);
        assert!(parse_format("config:7-3").is_err());
        assert!(parse_format("config:0-64").is_err());
    }

    #[test]
    fn discover_intel_classic() {
        let s = intel_classic();
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.pmu_type, st.config, st.config1, st.precise_ip, st.ibs), (4, 0x82d0, 0, 2, false));
        assert_eq!(st.name, "cpu/mem-stores/");
        assert_eq!(st.kind, AccessKind::Store);
        let ld = discover(&s.0, AccessKind::Load).unwrap();
        assert_eq!((ld.config, ld.config1, ld.kind), (0x01cd, 3, AccessKind::Load));
    }

    #[test]
    fn discover_intel_without_named_events_falls_back() {
        let s = FakeSysfs::new("intel-old");
        s.vm_basics().pmu("cpu", 4, INTEL_FORMATS, &[], &[]);
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.config, st.precise_ip), (0x82d0, 2));
        assert_eq!(discover(&s.0, AccessKind::Load).unwrap().config, 0x81d0);
    }

    #[test]
    fn discover_intel_hybrid_prefers_cpu_core() {
        let s = FakeSysfs::new("hybrid");
        s.vm_basics()
            .pmu(
                "cpu_atom",
                10,
                INTEL_FORMATS,
                &[("mem-loads", "event=0xd0,umask=0x5,ldlat=3"), ("mem-stores", "event=0xd0,umask=0x6")],
                &[("max_precise", "3")],
            )
            .pmu(
                "cpu_core",
                4,
                INTEL_FORMATS,
                &[
                    ("mem-loads", "event=0xcd,umask=0x01,ldlat=3"),
                    ("mem-loads-aux", "event=0x03,umask=0x82"),
                    ("mem-stores", "event=0xcd,umask=0x02"),
                ],
                &[("max_precise", "3"), ("pmu_name", "alderlake_hybrid")],
            );
        let st = discover(&s.0, AccessKind::Store).unwrap();
        assert_eq!((st.pmu_type, st.config, st.name.as_str()), (4, 0x02cd, "cpu_core/mem-stores/"));
        // mem-loads would need the mem-loads-aux group leader: use ALL_LOADS.
        let ld = discover(&s.0, AccessKind::Load).unwrap();
        assert_eq!((ld.pmu_type, ld.config, ld.config1), (4, 0x81d0, 0));
    }

    #[test]
    fn discover_amd_ibs() {
        let s = FakeSysfs::new("amd");
        s.vm_basics()
            .pmu(
                "cpu",
                4,
                &[
                    ("event", "config:0-7,32-35"),
                    ("umask", "config:8-15"),
                    ("edge", "config:18"),
                    ("inv", "config:23"),
                    ("cmask", "config:24-31"),
                ],
                &[],
                &[("max_precise", "2")],
            )
            .pmu("ibs_fetch", 10, &[("rand_en", "config:57")], &[], &[])
            .pmu("ibs_op", 11, &[("cnt_ctl", "config:19"), ("swfilt", "config2:0")], &[], &[]);
        let ev = discover(&s.0, AccessKind::Store).unwrap();
        assert!(ev.ibs);
        assert_eq!((ev.pmu_type, ev.config, ev.config2, ev.precise_ip), (11, 1 << 19, 1, 0));
        assert_eq!(ev.kind, AccessKind::Store);
        let a = *attr(&ev, 100).sigtrap(7).raw();
        assert_eq!(a.sample_period, 112);
        assert_eq!(a.exclude_kernel(), 1);
        assert_ne!(a.sample_type & b::PERF_SAMPLE_RAW as u64, 0);

        // Older kernel: no swfilt term, so no exclude_* bits (they'd be EINVAL).
        let s2 = FakeSysfs::new("amd-old");
        s2.vm_basics().pmu("ibs_op", 11, &[("cnt_ctl", "config:19")], &[], &[]);
        let ev = discover(&s2.0, AccessKind::Load).unwrap();
        assert_eq!((ev.config, ev.config2), (1 << 19, 0));
        assert_eq!(attr(&ev, 0x10000).raw().exclude_kernel(), 0);
    }

    #[test]
    fn discover_vm_has_no_pmu() {
        let s = FakeSysfs::new("vm");
        s.vm_basics();
        let e = discover(&s.0, AccessKind::Store).unwrap_err();
        assert!(e.starts_with("no PMU:"), "{e}");
        // A PMU passed through without PEBS cannot give addresses either.
        s.pmu("cpu", 4, INTEL_FORMATS, &[], &[("max_precise", "0"), ("pmu_name", "skylake")]);
        let e = discover(&s.0, AccessKind::Load).unwrap_err();
        assert!(e.starts_with("no PMU:") && e.contains("max_precise=0"), "{e}");
    }

    #[test]
    fn discover_on_this_machine_does_not_panic() {
        for k in [AccessKind::Load, AccessKind::Store] {
            println!("{k:?}: {:?}", discover(Path::new(SYSFS_PMU_ROOT), k));
        }
    }

    #[test]
    fn parse_event_specs() {
        let s = intel_classic();
        s.pmu("ibs_op", 11, &[("cnt_ctl", "config:19")], &[], &[]);
        let e = parse_event(&s.0, "cpu/mem-stores/", AccessKind::Store).unwrap();
        assert_eq!((e.pmu_type, e.config, e.precise_ip), (4, 0x82d0, 2));
        let e = parse_event(&s.0, "cpu/event=0xd0,umask=0x81/ppp", AccessKind::Load).unwrap();
        assert_eq!((e.config, e.precise_ip), (0x81d0, 3));
        let e = parse_event(&s.0, "mem-loads", AccessKind::Load).unwrap();
        assert_eq!((e.config, e.config1, e.name.as_str()), (0x01cd, 3, "cpu/mem-loads/"));
        let e = parse_event(&s.0, "mem-loads:p", AccessKind::Load).unwrap();
        assert_eq!(e.precise_ip, 1);
        let e = parse_event(&s.0, "ibs_op//", AccessKind::Load).unwrap();
        assert!(e.ibs);
        assert_eq!((e.pmu_type, e.config), (11, 0));
        let e = parse_event(&s.0, "ibs_op/cnt_ctl/", AccessKind::Load).unwrap();
        assert_eq!(e.config, 1 << 19);
        let e = parse_event(&s.0, "r82d0", AccessKind::Store).unwrap();
        assert_eq!((e.pmu_type, e.config), (b::PERF_TYPE_RAW, 0x82d0));
        assert!(parse_event(&s.0, "cpu/bogus=1/", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/umask=0x1ff/", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/mem-stores", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "cpu/mem-stores/x", AccessKind::Load).is_err());
        assert!(parse_event(&s.0, "nope/event=1/", AccessKind::Load).unwrap_err().starts_with("no PMU"));
        assert!(parse_event(&s.0, "mem-nothing", AccessKind::Load).is_err());
    }
}
