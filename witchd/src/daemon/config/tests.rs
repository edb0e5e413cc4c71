use super::*;

/// Each key witchd(8) lists parses with its example, in its section; the
/// example configuration uses no key the page does not list.
#[test]
fn the_manual_lists_every_key() {
    for k in KEYS {
        let text = match k.section {
            "" => format!("{} = {}\n", k.name, k.example),
            "watch" => format!("[[watch]]\n{} = {}\n", k.name, k.example),
            s => format!("[{s}]\n{} = {}\n", k.name, k.example),
        };
        DaemonConfig::parse(&text, "t").unwrap_or_else(|e| panic!("{text}: {e}"));
        if k.section == "defaults" {
            DaemonConfig::parse(&format!("[[watch]]\nexe = \"x\"\n{} = {}\n", k.name, k.example), "t").unwrap();
        }
    }
    let example = include_str!("../../../../dist/witchd.toml");
    for l in example.lines() {
        let l = l.trim_start_matches(['#', ' ']);
        let Some((key, _)) = l.split_once(" = ") else { continue };
        if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            assert!(KEYS.iter().any(|k| k.name == key), "dist/witchd.toml uses {key}, which witchd(8) does not list");
        }
    }
}

#[test]
fn a_file_that_is_no_text_is_refused_at_once() {
    for (path, want) in [("/dev/zero", "NUL"), ("/no/such/witchd.toml", "No such file")] {
        let e = DaemonConfig::load(Path::new(path)).unwrap_err().to_string();
        assert!(e.contains(path) && e.contains(want), "{e}");
    }
}

#[test]
fn full_file() {
    let c = DaemonConfig::parse(
        r#"
socket = "/tmp/w.sock"
socket_mode = 0o666
http = "127.0.0.1:0"
scan_every = "250ms"
max_sessions = 2
[store]
dir = "/tmp/store"
max_bytes = "64KiB"
max_profiles = 3
max_age = "7d"
[defaults]
crafts = ["dead", "silent"]
every = "2s"
duration = 0.5
[[watch]]
pid = 42
[[watch]]
exe = "nginx"
cgroup = "system.slice/x.service/"
crafts = ["load"]
every = 60
duration = "1s"
period = 1000000
"#,
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.socket, PathBuf::from("/tmp/w.sock"));
    assert_eq!(c.socket_mode, 0o666);
    assert_eq!(c.http, Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(c.scan_every, Duration::from_millis(250));
    assert_eq!(c.store.max_bytes, 65536);
    assert_eq!(c.store.max_profiles, 3);
    assert_eq!(c.store.max_age, Duration::from_secs(7 * 86400));
    assert_eq!(c.watch.len(), 2);
    let (a, b) = (&c.watch[0], &c.watch[1]);
    assert_eq!(a.pid, Some(42));
    assert_eq!(a.profiling.crafts, vec![Craft::Dead, Craft::SilentStore]);
    assert_eq!(a.profiling.every, Duration::from_secs(2));
    assert_eq!(a.profiling.duration, Duration::from_millis(500));
    assert_eq!(a.profiling.replacement, Policy::Reservoir);
    assert_eq!(b.exe.as_deref(), Some("nginx"));
    assert_eq!(b.cgroup.as_deref(), Some("/system.slice/x.service"));
    assert_eq!(b.profiling.crafts, vec![Craft::SilentLoad]);
    assert_eq!(b.profiling.every, Duration::from_secs(60));
    assert_eq!(b.profiling.period, Some(1000000));
    assert_eq!(b.describe(), "exe=nginx,cgroup=/system.slice/x.service");
}

#[test]
fn defaults() {
    let c = DaemonConfig::parse("", "t.toml").unwrap();
    assert_eq!(c.http, Some("127.0.0.1:9465".parse().unwrap()));
    assert_eq!(c.socket_mode, 0o600);
    assert!(c.watch.is_empty());
    let p = c.defaults;
    assert_eq!((p.every, p.duration), (Duration::from_secs(300), Duration::from_secs(10)));
    assert!(DaemonConfig::parse("http = \"off\"", "t").unwrap().http.is_none());
}

fn err(text: &str) -> String {
    format!("{:#}", DaemonConfig::parse(text, "w.toml").unwrap_err())
}

#[test]
fn errors_say_where() {
    let e = err("socket = \"/x\"\n[defaults]\nevery = \"soon\"\n");
    assert!(e.starts_with("w.toml:3:9: "), "{e}");
    assert!(e.contains("not a duration"), "{e}");
    let e = err("[[watch]]\nexe = \"a\"\ncrafts = [\"deadd\"]\n");
    assert!(e.starts_with("w.toml:3:"), "{e}");
    assert!(e.contains("unknown craft \"deadd\""), "{e}");
    let e = err("[store]\nmax_bytez = 3\n");
    assert!(e.starts_with("w.toml:2:1: "), "{e}");
    assert!(e.contains("max_bytez"), "{e}");
    let e = err("socket_mode = 0o400\n");
    assert!(e.contains("socket_mode"), "{e}");
    assert!(err("[[watch]]\ncrafts = [\"dead\"]\n").contains("selects nothing"));
    assert!(err("[[watch]]\npid = 1\nevery = \"1s\"\nduration = \"2s\"\n").contains("longer than every"));
    assert!(err("http = \"localhost\"").contains("not an address"));
    assert!(err("[[watch]]\npid = 1\ndebug_registers = 5\n").contains("1 to 4"));
    assert!(!err("[store\n").is_empty());
}

#[test]
fn overhead_as_on_the_command_line() {
    let c = DaemonConfig::parse(
        "[defaults]\noverhead = \"1.5%\"\n[[watch]]\npid = 1\n[[watch]]\npid = 2\noverhead = 0\n[[watch]]\npid = 3\noverhead = 10\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.defaults.overhead_percent, Some(1.5));
    let budgets: Vec<_> = c.watch.iter().map(|w| w.profiling.overhead_percent).collect();
    assert_eq!(budgets, [Some(1.5), Some(0.0), Some(10.0)]);
    // Unset: the engine's default (None), as without --overhead.
    assert_eq!(DaemonConfig::parse("", "t").unwrap().defaults.overhead_percent, None);
    for bad in ["-1", "101", "\"lots\"", "\"200%\"", "nan", "inf", "true"] {
        let e = err(&format!("[[watch]]\npid = 1\noverhead = {bad}\n"));
        assert!(e.starts_with("w.toml:3:12: "), "{bad}: {e}");
        assert!(e.contains("overhead must be a percentage from 0 to 100"), "{bad}: {e}");
        assert_eq!(e.lines().count(), 1, "{bad}: {e}");
    }
    assert!(err("[defaults]\noverhead = 200\n").starts_with("w.toml:2:12: "));
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("65536"), Ok(65536));
    assert_eq!(parse_size("64KiB"), Ok(65536));
    assert_eq!(parse_size("1.5 MiB"), Ok(1572864));
    // Prefixes as their names say: 500KB is 500,000 bytes, not 512,000.
    assert_eq!(parse_size("500KB"), Ok(500_000));
    assert_eq!(parse_size("500KiB"), Ok(512_000));
    assert_eq!(parse_size("1G"), Ok(1_000_000_000));
    assert!(parse_size("lots").is_err());
    assert!(parse_size("0").is_err());
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(2 * 86400)));
    assert!(parse_duration("0s").is_err());
}
