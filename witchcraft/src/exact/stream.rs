//! The record stream of the code-cache exact mode: each thread of the
//! profiled program sends its access records ([`crate::x86::record`]) a
//! buffer at a time, as datagrams on one `SOCK_SEQPACKET` socket
//! (`engine::recording`); witch reads them and judges each (process,
//! thread)'s records in the order that thread sent them.
//!
//! A datagram is a 16-byte header, then whole records (with their values,
//! for the value crafts):
//!
//! ```text
//!   0  pid      u32  the sending process
//!   4  tid      u32  the sending thread
//!   8  words    u32  words (8 bytes) of records that follow
//!  12  image    u32  the sending process image (see below)
//! ```
//!
//! A process that execs runs another image under the same pid, with an
//! agent and records of its own: `image` tells them apart. It is the low
//! 32 bits of the image's engine start (`Engine::started_unix_ns`), which
//! is also its profile section's `start_unix_ns`, so the judged records of
//! each image go to its own section. (A fork child keeps its parent's
//! image number under a pid of its own.)

use super::replay::Replay;
use super::ThreadShadow;
use crate::profile::Craft;
use crate::x86::record::{Record, RECORD_BYTES};
use std::collections::HashMap;

pub const HEADER_BYTES: usize = 16;
/// The longest datagram a sender makes.
pub const MAX_DATAGRAM: usize = 65536;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub pid: i32,
    pub tid: i32,
    pub words: u32,
    pub image: u32,
}

impl Header {
    pub fn to_words(self) -> [u64; 2] {
        [(self.pid as u32 as u64) | (self.tid as u32 as u64) << 32, self.words as u64 | (self.image as u64) << 32]
    }

    pub fn parse(b: &[u8]) -> Option<Header> {
        let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        (b.len() >= HEADER_BYTES).then(|| Header { pid: w(0) as i32, tid: w(4) as i32, words: w(8), image: w(12) })
    }
}

/// Send one datagram (a header and its records). Async-signal-safe.
pub fn send(fd: i32, data: &[u8]) -> bool {
    crate::sys::fd::send_datagram(fd, data)
}

/// One process image's judged records: its instructions and records
/// judged, and each thread's shadow.
pub struct JudgedImage {
    pub pid: i32,
    /// The image number its records carried (see the header).
    pub image: u32,
    pub instructions: u64,
    pub records: u64,
    pub threads: Vec<(i32, ThreadShadow)>,
}

/// Witch's side: every process image's replay, by pid and image.
pub struct Judge {
    craft: Craft,
    precision: f64,
    processes: HashMap<(i32, u32), Replay>,
    /// Datagrams that were not whole records (never expected).
    pub malformed: u64,
    pub records: u64,
}

impl Judge {
    /// A judge for `craft`, floating-point values equal within `precision`.
    pub fn new(craft: Craft, precision: f64) -> Judge {
        Judge { craft, precision, processes: HashMap::new(), malformed: 0, records: 0 }
    }

    /// Judge one datagram.
    pub fn take(&mut self, d: &[u8]) {
        let Some(h) = Header::parse(d) else {
            self.malformed += 1;
            return;
        };
        let body = &d[HEADER_BYTES..];
        if body.len() != h.words as usize * 8 {
            self.malformed += 1;
        }
        let (craft, precision) = (self.craft, self.precision);
        let r = self.processes.entry((h.pid, h.image)).or_insert_with(|| Replay::new(craft, precision));
        if craft == Craft::Dead {
            let n = body.len() as u64 / RECORD_BYTES as u64;
            self.records += n;
            r.records += n;
            r.feed(h.tid, Record::parse(body));
        } else {
            let before = r.records;
            if !r.feed_valued(h.tid, body) {
                self.malformed += 1;
            }
            self.records += r.records - before;
        }
    }

    /// The process images seen, each with what was judged.
    pub fn into_processes(self) -> impl Iterator<Item = JudgedImage> {
        self.processes.into_iter().map(|((pid, image), r)| JudgedImage {
            pid,
            image,
            instructions: r.instructions,
            records: r.records,
            threads: r.into_threads().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_its_words() {
        let h = Header { pid: 4242, tid: 4343, words: 7, image: 0xdead_beef };
        let mut b = Vec::new();
        for w in h.to_words() {
            b.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(Header::parse(&b), Some(h));
    }
}
