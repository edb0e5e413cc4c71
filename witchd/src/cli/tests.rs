use super::*;
use clap::CommandFactory;

#[test]
fn cli_is_consistent() {
    Cli::command().debug_assert();
}

/// `--help` and the man page state the engine's period floors as they are.
#[test]
fn help_and_man_page_state_the_period_floors() {
    use witchcraft::config::{MIN_PMU_PERIOD, MIN_SOFTWARE_PERIOD_NS};
    let help = Cli::command().find_subcommand_mut("dead").unwrap().render_long_help().to_string();
    let software = format!("software periods below {0}us are raised to {0}us", MIN_SOFTWARE_PERIOD_NS / 1000);
    let pmu = format!("PMU periods below {MIN_PMU_PERIOD} events to {MIN_PMU_PERIOD}");
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&software) && flat.contains(&pmu), "{help}");
    let dir = std::env::temp_dir().join(format!("witch-man-floors-{}", std::process::id()));
    crate::cmd::generate::write_man_pages(&dir).unwrap();
    let page = std::fs::read_to_string(dir.join("witch-dead.1")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&software) && flat.contains(&pmu), "{page}");
}

#[test]
fn bounds_parse() {
    assert_eq!(parse_percent("20%").unwrap(), 20.0);
    assert_eq!(parse_percent("20").unwrap(), 20.0);
    assert_eq!(parse_percent("0.5%").unwrap(), 0.5);
    assert_eq!(parse_percent("1.5").unwrap(), 1.5);
    assert_eq!(parse_percent("0").unwrap(), 0.0);
    let e = parse_percent("0.2").unwrap_err();
    assert!(e.contains("20%") && e.contains("0.2%"), "{e}");
    assert!(parse_percent("120%").is_err());
    assert!(parse_percent("x").is_err());
    assert_eq!(parse_points("2pp").unwrap(), 2.0);
    assert_eq!(parse_points("2").unwrap(), 2.0);
    assert!(parse_points("2%").is_err());
}

#[test]
fn run_args_as_written() {
    let c = Cli::try_parse_from(["witch", "silent-load", "-p", "5000003", "./app"]).unwrap();
    let Command::SilentLoad(a) = c.command else { panic!() };
    assert_eq!(a.period, Some(Period::Count(5000003)));
    assert_eq!(a.period(), (Some(5000003), false));
    assert_eq!(a.command, vec![OsString::from("./app")]);
    let c = Cli::try_parse_from(["witch", "dead", "./app", "-p", "3", "--x"]).unwrap();
    let Command::Dead(a) = c.command else { panic!() };
    assert_eq!(a.period, None);
    assert_eq!(a.command.len(), 4);
    assert_eq!(a.replacement, Policy::Reservoir);
    let c = Cli::try_parse_from(["witch", "load", "--replacement", "empty-only", "--", "-weird"]).unwrap();
    let Command::SilentLoad(a) = c.command else { panic!() };
    assert_eq!(a.replacement, Policy::EmptyOnly);
    assert_eq!(a.command, vec![OsString::from("-weird")]);
    // Before the program, an unknown option is an error, not the program's name.
    for typo in [&["--perid", "1ms"][..], &["-x"], &["--pairz", "3"]] {
        let argv = [&["witch", "dead"][..], typo, &["./a"]].concat();
        assert_eq!(Cli::try_parse_from(argv).unwrap_err().kind(), clap::error::ErrorKind::UnknownArgument, "{typo:?}");
    }
    assert!(Cli::try_parse_from(["witch", "dead", "--debug-registers", "5", "./a"]).is_err());
    assert!(Cli::try_parse_from(["witch", "gate", "p.json"]).is_err());
    assert!(Cli::try_parse_from(["witch", "gate", "--baseline", "b", "p.json"]).is_err());
    let c = Cli::try_parse_from(["witch", "dead", "--replacement", "empty", "./a"]).unwrap();
    let Command::Dead(a) = c.command else { panic!() };
    assert_eq!(a.replacement, Policy::EmptyOnly);
}

#[test]
fn periods_and_frequencies() {
    use std::time::Duration;
    let args = |v: &[&str]| {
        let Command::Dead(a) = Cli::try_parse_from(v).unwrap().command else { panic!() };
        a.period()
    };
    assert_eq!(args(&["witch", "dead", "-p", "1ms", "./a"]), (Some(1_000_000), true));
    assert_eq!(args(&["witch", "dead", "-p", "250us", "./a"]), (Some(250_000), true));
    assert_eq!(args(&["witch", "dead", "-F", "200", "./a"]), (Some(5_000_000), true));
    assert_eq!(args(&["witch", "dead", "-p", "100000", "./a"]), (Some(100_000), false));
    assert_eq!(parse_period("0.5ms"), Ok(Period::Time(Duration::from_micros(500))));
    assert!(parse_period("0").is_err() && parse_period("soon").is_err() && parse_frequency("0").is_err());
    assert!(Cli::try_parse_from(["witch", "dead", "-p", "1ms", "-F", "200", "./a"]).is_err());
}

#[test]
fn one_duration_parser() {
    use std::time::Duration;
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(2 * 86400)));
    assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration(" 1.5 "), Ok(Duration::from_millis(1500)));
    for bad in ["0s", "0", "soon", "-1s", "", "1e300"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}
