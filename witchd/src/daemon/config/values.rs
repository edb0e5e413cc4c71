//! The configuration file's values: durations, sizes, modes and the
//! profiling knobs, each checked with a message that says what is wanted.

use serde::{Deserialize, Deserializer};
use std::time::Duration;
use witchcraft::profile::Craft;
use witchcraft::replacement::Policy;

pub use crate::cli::parse_duration;

/// A size in bytes: an integer, or a string with a unit, its prefix as
/// its name says (bytesize's parser): "64KiB" and "1.5 MiB" are powers of
/// 1024, "500KB" and "1G" powers of 1000.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not a size (try 65536, \"64KiB\", \"256MiB\", \"1GiB\"; kB, MB and GB are powers of 1000)");
    match s.trim().parse::<bytesize::ByteSize>() {
        Ok(v) if v.as_u64() > 0 => Ok(v.as_u64()),
        _ => Err(err()),
    }
}

/// A TOML value that may be a string or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum StrOrNum {
    Str(String),
    Int(i64),
    Float(f64),
}

pub(super) fn dur<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let v = match StrOrNum::deserialize(d)? {
        StrOrNum::Str(s) => parse_duration(&s),
        StrOrNum::Int(n) if n > 0 => Ok(Duration::from_secs(n as u64)),
        StrOrNum::Float(f) if f.is_finite() && f > 0.0 => Ok(Duration::from_secs_f64(f)),
        _ => Err("a duration must be positive (a number of seconds, or a string such as \"10s\")".into()),
    };
    v.map(Some).map_err(serde::de::Error::custom)
}

pub(super) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v = match StrOrNum::deserialize(d)? {
        StrOrNum::Str(s) => parse_size(&s),
        StrOrNum::Int(n) if n > 0 => Ok(n as u64),
        _ => Err("a size must be a positive number of bytes, or a string such as \"64MiB\"".into()),
    };
    v.map(Some).map_err(serde::de::Error::custom)
}

pub(super) fn mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    // TOML writes octal as 0o600; a string "0600" is read as octal too.
    let v = match StrOrNum::deserialize(d)? {
        StrOrNum::Str(s) => u32::from_str_radix(s.trim().trim_start_matches("0o"), 8).map_err(|_| ()),
        StrOrNum::Int(n) => u32::try_from(n).map_err(|_| ()),
        StrOrNum::Float(_) => Err(()),
    };
    match v {
        Ok(m) if m <= 0o777 && m & 0o600 == 0o600 => Ok(Some(m)),
        _ => Err(serde::de::Error::custom("socket_mode must be octal permission bits that include 0o600, e.g. 0o600 or 0o666")),
    }
}

pub(super) fn crafts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Craft>>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    if names.is_empty() {
        return Err(serde::de::Error::custom("crafts must name at least one of dead, silent-store, silent-load"));
    }
    let mut out: Vec<Craft> = Vec::new();
    for n in &names {
        let c =
            Craft::parse(n).ok_or_else(|| serde::de::Error::custom(format!("unknown craft {n:?} (dead, silent-store, silent-load)")))?;
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(Some(out))
}

pub(super) fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match u64::deserialize(d)? {
        0 => Err(serde::de::Error::custom("period must be at least 1")),
        n => Ok(Some(n)),
    }
}

pub(super) fn registers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match u32::deserialize(d)? {
        n @ 1..=4 => Ok(Some(n)),
        _ => Err(serde::de::Error::custom("debug_registers must be 1 to 4")),
    }
}

pub(super) fn replacement<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Policy>, D::Error> {
    let s = String::deserialize(d)?;
    Policy::parse(&s).map(Some).ok_or_else(|| serde::de::Error::custom("replacement must be reservoir, oldest, newest or empty-only"))
}

pub(super) fn precision<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if (0.0..1.0).contains(&v) {
        Ok(Some(v))
    } else {
        Err(serde::de::Error::custom("fp_precision must be at least 0 and below 1 (0.01 means 1%)"))
    }
}

/// `overhead`: a percentage from 0 to 100, as `--overhead` takes it (a
/// number, or a string such as "0.5%").
pub(super) fn overhead<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = match StrOrNum::deserialize(d) {
        Ok(StrOrNum::Str(s)) => witchcraft::config::parse_percent(&s),
        Ok(StrOrNum::Int(n)) => witchcraft::config::parse_percent(&n.to_string()),
        Ok(StrOrNum::Float(f)) => Some(f).filter(|f| (0.0..=100.0).contains(f)),
        Err(_) => None,
    };
    v.map(Some).ok_or_else(|| serde::de::Error::custom("overhead must be a percentage from 0 to 100 (0: no limit), such as 3 or \"0.5%\""))
}
