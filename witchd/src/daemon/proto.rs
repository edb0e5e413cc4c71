//! The local API's wire format, shared by witchd and `witch daemon`.
//!
//! One request per connection: the client sends one JSON line; the daemon
//! answers with one JSON line ([`Reply`]) and then, when `body` > 0, exactly
//! that many raw bytes (a profile file). Raw bytes keep multi-megabyte
//! profiles out of a JSON string.

use super::store::Meta;
use serde::{Deserialize, Serialize};

/// The longest request line the daemon reads.
pub const MAX_REQUEST: usize = 64 * 1024;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Status,
    /// Stored profiles, optionally of one pid or craft.
    List {
        pid: Option<u32>,
        craft: Option<String>,
    },
    /// One stored profile: by id, or the newest matching pid/craft.
    Fetch {
        id: Option<String>,
        pid: Option<u32>,
        craft: Option<String>,
    },
    /// Profile a process now and return the profile (it is stored too).
    Profile {
        pid: i32,
        craft: Option<String>,
        duration_ms: Option<u64>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Reply {
    pub ok: bool,
    /// One line, for the user, when !ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DaemonStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiles: Option<Vec<Meta>>,
    /// The profile sent as the body (fetch, profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// Things the user should know, e.g. "the target exited during the session".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Bytes that follow the reply line.
    #[serde(default)]
    pub body: u64,
}

impl Reply {
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply { ok: false, error: Some(msg.into()), ..Reply::ok() }
    }
    pub fn ok() -> Reply {
        Reply { ok: true, error: None, status: None, profiles: None, meta: None, notes: Vec::new(), body: 0 }
    }
}

/// What `witch daemon status` shows.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DaemonStatus {
    pub pid: u32,
    pub version: String,
    pub uptime_s: f64,
    pub socket: String,
    pub http: Option<String>,
    pub store_dir: String,
    pub store_bytes: u64,
    pub store_max_bytes: u64,
    pub store_profiles: usize,
    /// Sessions holding a slot (attaching, profiling, detaching, storing).
    pub sessions_active: usize,
    /// Sessions due but waiting for a slot (more were due than max_sessions).
    #[serde(default)]
    pub sessions_waiting: usize,
    /// 0 from a witchd that did not say.
    #[serde(default)]
    pub max_sessions: usize,
    pub sessions_ok: u64,
    pub sessions_target_exited: u64,
    /// Sessions ended by the target replacing its program (exec).
    #[serde(default)]
    pub sessions_target_exec: u64,
    pub sessions_failed: u64,
    pub rules: Vec<String>,
    /// Only the targets the caller may access.
    pub targets: Vec<TargetStatus>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TargetStatus {
    pub pid: i32,
    pub exe: String,
    /// The watch rule that matched it ("request" for `witch daemon profile`).
    pub rule: String,
    /// "idle", "queued <craft>" (waiting for a slot), "profiling <craft>"
    /// (either with " (requested)" for `witch daemon profile`), "exited" or
    /// "failing".
    pub state: String,
    pub sessions: u64,
    /// Seconds until the next session (negative: overdue, waiting for a slot).
    pub next_in_s: Option<f64>,
    pub last_error: Option<String>,
    /// Latest waste fraction per craft.
    pub waste: Vec<(String, f64)>,
}
