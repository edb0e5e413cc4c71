//! The record stream of the code-cache exact mode: each thread of the
//! profiled program writes its access records ([`crate::x86::record`]) a
//! chunk at a time into a ring it shares with witch ([`super::ring`]),
//! and sends a notice per chunk on one `SOCK_SEQPACKET` socket
//! (`engine::recorder`); witch reads the notices in order and judges each
//! (process, thread)'s chunks in the order that thread sent them.
//!
//! A chunk is a 16-byte header, then whole records (with their values,
//! for the value crafts):
//!
//! ```text
//!   0  pid      u32  the sending process
//!   4  tid      u32  the sending thread
//!   8  words    u32  words (8 bytes) of records that follow
//!  12  image    u32  the sending process image (see below)
//! ```
//!
//! A notice ([`Notice`]) is the chunk's header, then three words: what
//! it is, the ring's number, and the chunk's offset in the ring (or, for
//! the notice that registers a ring, which carries its memfd, the ring's
//! size).
//!
//! A process that execs runs another image under the same pid, with an
//! agent and records of its own: `image` tells them apart. It is the low
//! 32 bits of the image's engine start (`Engine::started_unix_ns`), which
//! is also its profile section's `start_unix_ns`, so the judged records of
//! each image go to its own section. (A fork child keeps its parent's
//! image number under a pid of its own.)

use super::replay::Replay;
use super::ring::Mapped;
use super::ThreadShadow;
use crate::profile::Craft;
use crate::x86::record::Record;
use std::collections::HashMap;

pub const HEADER_BYTES: usize = 16;
/// Bytes of a notice.
pub const NOTICE_BYTES: usize = HEADER_BYTES + 24;
/// The longest datagram a sender makes (a notice; more is malformed).
pub const MAX_DATAGRAM: usize = 4096;

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

/// What a datagram of the stream says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A thread's new ring, of `bytes` bytes; its memfd comes with it.
    Register { id: u64, bytes: u64 },
    /// Ring `id`'s chunk at `offset` is full (its header's `words`).
    Chunk { id: u64, offset: u64 },
    /// Ring `id` will send no more: its thread's state is gone.
    Retire { id: u64 },
}

const REGISTER: u64 = 1;
const CHUNK: u64 = 2;
const RETIRE: u64 = 3;

impl Notice {
    /// The notice as a datagram, after `h` (the chunk's header).
    pub fn datagram(self, h: Header) -> [u8; NOTICE_BYTES] {
        let (kind, id, value) = match self {
            Notice::Register { id, bytes } => (REGISTER, id, bytes),
            Notice::Chunk { id, offset } => (CHUNK, id, offset),
            Notice::Retire { id } => (RETIRE, id, 0),
        };
        let mut d = [0u8; NOTICE_BYTES];
        let [a, b] = h.to_words();
        for (i, w) in [a, b, kind, id, value].into_iter().enumerate() {
            d[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        d
    }

    pub fn parse(d: &[u8]) -> Option<(Header, Notice)> {
        if d.len() != NOTICE_BYTES {
            return None;
        }
        let h = Header::parse(d)?;
        let w = |i: usize| u64::from_le_bytes(d[HEADER_BYTES + i * 8..HEADER_BYTES + i * 8 + 8].try_into().unwrap_or_default());
        let n = match w(0) {
            REGISTER => Notice::Register { id: w(1), bytes: w(2) },
            CHUNK => Notice::Chunk { id: w(1), offset: w(2) },
            RETIRE => Notice::Retire { id: w(1) },
            _ => return None,
        };
        Some((h, n))
    }
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
    /// The threads' rings, by number.
    rings: HashMap<u64, Mapped>,
    /// Datagrams that were not whole records (never expected).
    pub malformed: u64,
    pub records: u64,
}

impl Judge {
    /// A judge for `craft`, floating-point values equal within `precision`.
    pub fn new(craft: Craft, precision: f64) -> Judge {
        Judge { craft, precision, processes: HashMap::new(), rings: HashMap::new(), malformed: 0, records: 0 }
    }

    /// Take one notice (`passed`: the descriptor that came with it): map
    /// a ring, or judge a chunk and give it back to its thread.
    pub fn take_notice(&mut self, d: &[u8], passed: Option<i32>) {
        match (Notice::parse(d), passed) {
            (Some((_, Notice::Register { id, bytes })), Some(memfd)) => match Mapped::map(memfd, bytes) {
                // (A ring of a number seen before replaces it: its
                // process exec'd, after its last chunk was judged.)
                Some(ring) => drop(self.rings.insert(id, ring)),
                None => self.malformed += 1,
            },
            (Some((h, Notice::Chunk { id, offset })), None) => {
                let Some(ring) = self.rings.remove(&id) else {
                    self.malformed += 1;
                    return;
                };
                match ring.chunk(offset, h.words) {
                    Some(chunk) => self.take(chunk),
                    None => self.malformed += 1,
                }
                ring.consumed();
                self.rings.insert(id, ring);
            }
            // Its memory goes once neither side maps it: a program that
            // starts and ends threads all the time does not pile up rings.
            (Some((_, Notice::Retire { id })), None) => {
                if self.rings.remove(&id).is_none() {
                    self.malformed += 1;
                }
            }
            (_, passed) => {
                self.malformed += 1;
                passed.into_iter().for_each(crate::sys::fd::close);
            }
        }
    }

    /// Judge one chunk.
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
            let mut n = 0u64;
            r.feed(h.tid, Record::parse(body).inspect(|_| n += 1));
            self.records += n;
            r.records += n;
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
    fn a_notice_survives_its_bytes_and_nothing_else_parses() {
        let h = Header { pid: 7, tid: 8, words: 9, image: 10 };
        for n in [Notice::Register { id: 1 << 40 | 3, bytes: 123 }, Notice::Chunk { id: 5, offset: 4096 }, Notice::Retire { id: 6 }] {
            let d = n.datagram(h);
            assert_eq!(Notice::parse(&d), Some((h, n)));
            assert_eq!(Notice::parse(&d[..NOTICE_BYTES - 1]), None);
        }
        let mut d = Notice::Chunk { id: 5, offset: 4096 }.datagram(h);
        d[HEADER_BYTES] = 9;
        assert_eq!(Notice::parse(&d), None, "an unknown kind");
    }

    /// A thread's ring, registered and filled in this process: the judge
    /// judges each chunk where it lies, in order, and the thread moves on
    /// only as chunks are judged.
    #[test]
    fn chunks_of_a_ring_are_judged_in_place_and_given_back() {
        use crate::exact::ring::{Ring, CHUNKS};
        use crate::x86::record::{info, Record, RECORD_WORDS};
        let (ours, theirs) = crate::sys::fd::seqpacket_pair().unwrap();
        let mut ring = Ring::create(theirs, 42, 43, 7).expect("a ring");
        let mut judge = Judge::new(Craft::Dead, 0.0);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut take_one = |judge: &mut Judge| {
            let (n, passed) = crate::sys::fd::recv_datagram_fd(ours, &mut buf, 1000).unwrap().unwrap();
            judge.take_notice(&buf[..n], passed);
        };
        take_one(&mut judge);
        // More chunks than the ring holds: each store at 0x1000 + 8i,
        // then (in the next chunk) a load of it.
        let access = |addr, read| crate::x86::decode::Access { addr, len: 8, read, write: !read, ..Default::default() };
        for c in 0..2 * CHUNKS as u64 {
            let words = ring.chunk();
            let recs: Vec<Record> = (0..4)
                .map(|i| {
                    let addr = 0x1000 + 8 * (c * 4 + i);
                    let read = c % 2 == 1;
                    let a = if read { access(addr - 32, true) } else { access(addr, false) };
                    Record { addr: a.addr, pc: 0x400000 + read as u64, info: info(&a), extra: 0 }
                })
                .collect();
            for (i, r) in recs.iter().enumerate() {
                for (j, w) in r.to_words().into_iter().enumerate() {
                    // SAFETY: within the chunk, after its header.
                    unsafe { words.add(HEADER_BYTES / 8 + i * RECORD_WORDS + j).write(w) };
                }
            }
            let h = Header { pid: 42, tid: 43, words: (recs.len() * RECORD_WORDS) as u32, image: 7 };
            // The judge runs on this thread: judge before the ring is full.
            std::thread::scope(|s| {
                let t = s.spawn(|| ring.publish(theirs, h));
                take_one(&mut judge);
                assert!(t.join().unwrap(), "published");
            });
        }
        assert_eq!((judge.records, judge.malformed), (8 * CHUNKS as u64, 0));
        // The thread's state goes: the judge lets its ring go.
        drop(ring);
        take_one(&mut judge);
        assert_eq!((judge.rings.len(), judge.malformed), (0, 0));
        let images: Vec<JudgedImage> = judge.into_processes().collect();
        assert_eq!((images.len(), images[0].pid, images[0].image), (1, 42, 7));
        let t = &images[0].threads[0].1;
        // Every odd chunk's four loads read back the four stores of the
        // chunk before: 32 bytes used each.
        let used: f64 = t.pairs.iter().map(|p| p.used).sum();
        assert_eq!(used, 32.0 * CHUNKS as f64);
        crate::sys::fd::close(ours);
        crate::sys::fd::close(theirs);
    }

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
