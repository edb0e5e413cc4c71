use super::table::SETTINGS;
use super::*;

#[test]
fn settings_lines_read_like_the_environment() {
    let c = Config::from_lines(
        "WITCH_CRAFT=silent-load\nWITCH_PERIOD=1234\nWITCH_REPLACEMENT=oldest\nWITCH_DEBUG_REGISTERS=9\nWITCH_OUT_DIR=/x\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.craft, Craft::SilentLoad);
    assert_eq!(c.period, Some(1234));
    assert_eq!(c.replacement, Policy::Oldest);
    assert_eq!(c.debug_registers, 4);
    assert_eq!(c.out_dir, PathBuf::from("/x"));
    assert!(Config::from_lines("WITCH_PERIOD=5\n").unwrap().is_none());
    assert!(Config::from_lines("WITCH_CRAFT=dead\nWITCH_PERIOD=abc\n").is_err());
    assert!(Config::from_lines("WITCH_CRAFT=dead\nWITCH_HEAP_THRESHOLD=lots\n").is_err());
    let off = Config::from_lines("WITCH_CRAFT=dead\nWITCH_HEAP_THRESHOLD=off\n").unwrap().unwrap();
    assert_eq!(off.heap_threshold, Some(0));
}

#[test]
fn sizes_in_bytes() {
    for (s, n) in [("4096", 4096), ("4k", 4096), ("4KiB", 4096), ("1M", 1 << 20), ("2g", 2 << 30), ("off", 0), ("0", 0)] {
        assert_eq!(parse_bytes(s), Some(n), "{s}");
    }
    for s in ["", "k", "-1", "4x", "1.5k", "99999999999999999999"] {
        assert_eq!(parse_bytes(s), None, "{s}");
    }
}

#[test]
fn settings_are_read_back_as_they_were_built() {
    let mut c = Config::new(Craft::SilentStore);
    c.period = Some(777);
    c.sampler = SamplerChoice::Software;
    c.event = Some("task-clock".into());
    c.debug_registers = 2;
    c.replacement = Policy::Newest;
    c.fp_precision = 0.125;
    c.out_dir = PathBuf::from("/tmp/x y");
    c.no_sigtrap = true;
    c.no_modify = true;
    c.seed = Some(9);
    c.burst_steps = Some(16);
    c.burst_weight = Some(BurstWeight::PerBurst);
    c.burst_picks = Some(2);
    c.burst_pick_bytes = Some(false);
    c.burst_min_steps = Some(24);
    c.burst_after_syscall = true;
    c.window = Some(2048);
    c.window_picks = Some(1.5);
    c.no_links = true;
    c.no_cache_picks = true;
    c.timed_windows = true;
    c.overhead_percent = Some(0.5);
    c.only_pid = Some(4242);
    c.exe_names = vec!["app".into(), "helper".into()];
    c.heap_threshold = Some(65536);
    c.record_fd = Some(7);
    c.round_trips = Some(PathBuf::from("/tmp/parts/.round-trips"));
    let back = Config::from_lines(&c.to_lines()).unwrap().unwrap();
    assert_eq!(format!("{back:?}"), format!("{c:?}"));
    let map: std::collections::HashMap<_, _> = c.to_pairs().into_iter().collect();
    let env = Config::from_lookup(|k| map.get(k).cloned()).unwrap().unwrap();
    assert_eq!(format!("{env:?}"), format!("{c:?}"));
    let plain = Config::new(Craft::Dead);
    assert_eq!(format!("{:?}", Config::from_lines(&plain.to_lines()).unwrap().unwrap()), format!("{plain:?}"));
}

/// Each setting has one entry in the table, and every bad value is an
/// error that names its setting, whichever encoding it came through.
#[test]
fn every_setting_is_checked_once_and_a_bad_value_names_it() {
    let mut keys: Vec<_> = SETTINGS.iter().map(|s| s.key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), SETTINGS.len(), "a setting twice in the table");
    for (key, bad) in [
        (keys::PERIOD, "abc"),
        (keys::SAMPLER, "fast"),
        (keys::REPLACEMENT, "random"),
        (keys::FP_PRECISION, "-1"),
        (keys::SEED, "x"),
        (keys::BURST, "-3"),
        (keys::BURST_WEIGHT, "heavy"),
        (keys::BURST_PICK, "some"),
        (keys::BURST_SYSCALL, "yes"),
        (keys::WINDOW_PICKS, "100"),
        (keys::LINKS, "off"),
        (keys::CACHE_PICKS, "no"),
        (keys::WINDOW_TIME, "yes"),
        (keys::OVERHEAD, "150%"),
        (keys::ONLY_PID, "99999999999"),
        (keys::RECORD_FD, "99999999999"),
        (keys::HEAP_THRESHOLD, "lots"),
    ] {
        let e = Config::from_lines(&format!("WITCH_CRAFT=dead\n{key}={bad}\n")).unwrap_err();
        assert!(e.starts_with(key) && e.contains(bad), "{key}={bad}: {e}");
        let s = SETTINGS.iter().find(|s| s.key == key).unwrap();
        assert!(s.read_into(&mut Config::new(Craft::Dead), bad).is_err(), "{key}={bad}");
    }
    assert!(Config::from_lines("WITCH_CRAFT=nothing\n").unwrap_err().starts_with(keys::CRAFT));
    // An empty value is no value.
    let c = Config::from_lines("WITCH_CRAFT=dead\nWITCH_PERIOD=\nWITCH_LINKS=\n").unwrap().unwrap();
    assert_eq!(format!("{c:?}"), format!("{:?}", Config::new(Craft::Dead)));
}

#[test]
fn which_processes_a_run_follows() {
    let mut c = Config::new(Craft::Dead);
    assert!(c.follows(1, Some("sh")) && c.follows(2, None));
    c.only_pid = Some(7);
    assert!(c.follows(7, Some("sh")) && !c.follows(8, Some("sh")));
    c.only_pid = None;
    c.exe_names = vec!["app".into()];
    assert!(c.follows(3, Some("app")) && !c.follows(3, Some("sh")) && c.follows(3, None));
}
