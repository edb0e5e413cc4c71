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
