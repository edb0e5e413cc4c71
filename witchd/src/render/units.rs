//! Numbers as people read them: magnitudes, durations, percentages.
//!
//! One convention for amounts of bytes everywhere witch shows them (the
//! report, the daemon's status, its configuration): binary prefixes, named
//! as IEC names them (1 KiB = 1024 B, MiB, GiB), which is also what pprof
//! scales bytes by, so a pprof viewer and the report show the same numbers.
//! Waste and use are estimates from samples: the report says so once, by
//! their line ("estimated bytes").

/// An amount in a profile's unit with a binary prefix: `950 B`, `12.1 KiB`,
/// `4.35 MiB`; byte·ns as `12.1 Ki byte·ns`.
pub fn amount(v: f64, unit: witchcraft::profile::ValueUnit) -> String {
    const PREFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut x = v;
    let mut i = 0;
    while x.abs() >= 1024.0 && i + 1 < PREFIXES.len() {
        x /= 1024.0;
        i += 1;
    }
    let n = if i == 0 || x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    match unit {
        witchcraft::profile::ValueUnit::Bytes => format!("{n} {}B", PREFIXES[i]),
        witchcraft::profile::ValueUnit::ByteNs if i == 0 => format!("{n} byte·ns"),
        witchcraft::profile::ValueUnit::ByteNs => format!("{n} {} byte·ns", PREFIXES[i]),
    }
}

pub fn duration(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 120.0 {
        format!("{}m{:02.0}s", (s / 60.0).floor(), s % 60.0)
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

pub fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

/// Bytes in the largest binary unit that keeps them above 1 (bytesize's IEC form).
pub fn size(b: u64) -> String {
    bytesize::ByteSize::b(b).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        use witchcraft::profile::ValueUnit::{ByteNs, Bytes};
        assert_eq!(amount(950.0, Bytes), "950 B");
        assert_eq!(amount(1023.4, Bytes), "1023 B");
        assert_eq!(amount(12_390.0, Bytes), "12.1 KiB");
        assert_eq!(amount(4_560_000.0, Bytes), "4.35 MiB");
        assert_eq!(amount(150.0 * 1024.0, Bytes), "150 KiB");
        assert_eq!(amount(12_390.0, ByteNs), "12.1 Ki byte·ns");
        assert_eq!(amount(4.87, ByteNs), "5 byte·ns");
        assert_eq!(pct(0.3421), "34.2%");
        assert_eq!(duration(1_520_000_000), "1.52 s");
        assert_eq!(duration(3_000_000), "3.0 ms");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(20 * 1024), "20.0 KiB");
        assert_eq!(size(256 << 20), "256.0 MiB");
        assert_eq!(size(5 << 40), "5.0 TiB");
    }
}

/// Text from a profile made safe for a terminal: control characters (an
/// escape sequence in a program's name or a function name could rewrite the
/// screen) are shown as escapes instead, `\e` for ESC, `\xNN` for the others.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\t') {
        return s.into();
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\t' => o.push(c),
            '\x1b' => o.push_str("\\e"),
            c if c.is_control() && (c as u32) < 0x100 => o.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => o.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => o.push(c),
        }
    }
    o.into()
}

/// A 95% interval as "lo–hi%", to one decimal.
pub fn interval(lo: f64, hi: f64) -> String {
    format!("{:.1}–{:.1}%", lo * 100.0, hi * 100.0)
}

/// What an estimate's uncertainty is, in words: "95% interval lo–hi%", or
/// "an exact count" for the exact mode's figures, which have none.
pub fn uncertainty(e: &crate::analysis::interval::Estimate) -> String {
    if e.is_exact() {
        "an exact count".into()
    } else {
        format!("95% interval {}", interval(e.lo, e.hi))
    }
}

#[cfg(test)]
mod printable_tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("plain (a.c:3)"), "plain (a.c:3)");
        assert_eq!(printable("evil\x1b[2J\x07name\n"), "evil\\e[2J\\x07name\\x0a");
        assert_eq!(printable("\u{9b}31m"), "\\x9b31m");
        assert_eq!(interval(0.25, 0.3), "25.0–30.0%");
    }
}
