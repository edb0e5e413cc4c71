//! Witch's side of the code-cache exact mode's stream: it maps each ring
//! a thread registers ([`MappedRing`]), judges each chunk where it lies as its
//! notice comes, and gives the chunk back to its thread. The threads' side
//! (the agent's) is [`super::ring::Ring`]; the notices' format,
//! [`super::stream`].

use super::judge::ThreadShadow;
use super::replay::Replay;
use super::ring::{Control, CHUNK_BYTES, CONTROL_BYTES, RING_BYTES};
use super::stream::{Header, Notice, HEADER_BYTES};
use crate::profile::Craft;
use crate::sys::{fd, futex};
use crate::x86::record::Record;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

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
    rings: HashMap<u64, MappedRing>,
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
            (Some((_, Notice::Register { id, bytes })), Some(memfd)) => match MappedRing::map(memfd, bytes) {
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

/// Witch's side: a ring a thread registered, mapped from its memfd.
pub struct MappedRing {
    base: *mut u8,
    bytes: usize,
}

// SAFETY: the mapping is witch's own; its judging thread holds it.
unsafe impl Send for MappedRing {}

impl MappedRing {
    /// Map the ring `memfd` of `bytes` bytes (closed here either way).
    pub fn map(memfd: i32, bytes: u64) -> Option<MappedRing> {
        if bytes != RING_BYTES as u64 {
            fd::close(memfd);
            return None;
        }
        // SAFETY: a new shared mapping of the descriptor, not MAP_FIXED.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), RING_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd, 0) };
        fd::close(memfd);
        (base != libc::MAP_FAILED).then_some(MappedRing { base: base as *mut u8, bytes: RING_BYTES })
    }

    /// The chunk at `offset` holding `words` words of records after its
    /// header, as the datagram it stands for. None if it does not lie in
    /// a chunk.
    pub fn chunk(&self, offset: u64, words: u32) -> Option<&[u8]> {
        let len = HEADER_BYTES + words as usize * 8;
        let offset = offset as usize;
        let slot_ok = offset >= CONTROL_BYTES && (offset - CONTROL_BYTES).is_multiple_of(CHUNK_BYTES) && offset + CHUNK_BYTES <= self.bytes;
        // SAFETY: within the mapping, which lives as long as `self`.
        (slot_ok && len <= CHUNK_BYTES).then(|| unsafe { std::slice::from_raw_parts(self.base.add(offset), len) })
    }

    /// One more chunk judged: the thread may write over it.
    pub fn consumed(&self) {
        // SAFETY: the mapping starts with the control page.
        let c = unsafe { &*(self.base as *const Control) };
        let now = c.consumed.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        // Only a thread waiting for this many is woken (ring::Ring::publish).
        if super::ring::reached(now, c.wanted.load(Ordering::SeqCst)) {
            futex::wake(&c.consumed);
        }
    }
}

impl Drop for MappedRing {
    fn drop(&mut self) {
        // SAFETY: witch's own mapping, unused from here on.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::ring::Ring;
    use crate::exact::stream::MAX_DATAGRAM;

    /// A socket pair (witch's end, the program's), and a ring of thread 43
    /// of process 42 registered with a new judge of the dead craft.
    fn registered() -> (i32, i32, Ring, Judge) {
        let (ours, theirs) = crate::sys::fd::seqpacket_pair().unwrap();
        let ring = Ring::create(theirs, 42, 43, 7).expect("a ring");
        let mut judge = Judge::new(Craft::Dead, 0.0);
        take_one(ours, &mut judge);
        (ours, theirs, ring, judge)
    }

    /// The judge takes the next notice on `ours`.
    fn take_one(ours: i32, judge: &mut Judge) {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let (n, passed) = crate::sys::fd::recv_datagram_fd(ours, &mut buf, 1000).unwrap().unwrap();
        judge.take_notice(&buf[..n], passed);
    }

    /// A thread's ring, registered and filled in this process: the judge
    /// judges each chunk where it lies, in order, and the thread moves on
    /// only as chunks are judged.
    #[test]
    fn chunks_of_a_ring_are_judged_in_place_and_given_back() {
        use crate::exact::ring::CHUNKS;
        use crate::x86::record::{info, Record, RECORD_WORDS};
        let (ours, theirs, mut ring, mut judge) = registered();
        let take_one = |judge: &mut Judge| take_one(ours, judge);
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

    /// A thread whose ring is full waits until witch has judged half of
    /// it, and witch wakes it then, not at each chunk it judges.
    #[test]
    fn a_full_ring_waits_for_half_of_it_to_be_judged() {
        use crate::exact::ring::CHUNKS;
        use std::sync::atomic::AtomicBool;
        let (ours, theirs, mut ring, mut judge) = registered();
        let take_one = |judge: &mut Judge| take_one(ours, judge);
        let h = Header { pid: 42, tid: 43, words: 0, image: 7 };
        let last_out = AtomicBool::new(false);
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                // The first CHUNKS - 1 chunks fit; the last fills the ring.
                for _ in 0..CHUNKS {
                    assert!(ring.publish(theirs, h), "published");
                }
                last_out.store(true, Ordering::SeqCst);
            });
            for judged in 1..=CHUNKS {
                // Give the thread time to look (more than its futex's
                // timeout) before each chunk is judged.
                std::thread::sleep(std::time::Duration::from_millis(30));
                take_one(&mut judge);
                if judged < CHUNKS / 2 {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    assert!(!last_out.load(Ordering::SeqCst), "the thread went on with {judged} of {CHUNKS} chunks judged");
                } else if judged == CHUNKS / 2 {
                    let t0 = std::time::Instant::now();
                    while !last_out.load(Ordering::SeqCst) {
                        assert!(t0.elapsed().as_secs() < 5, "the thread still waits with half the ring judged");
                        std::thread::yield_now();
                    }
                }
            }
            t.join().unwrap();
        });
        assert_eq!(judge.malformed, 0);
        drop(ring);
        crate::sys::fd::close(ours);
        crate::sys::fd::close(theirs);
    }

    #[test]
    fn a_waiting_threads_count_is_reached_across_the_wrap() {
        use crate::exact::ring::{reached, WAITING};
        assert!(!reached(10, 0), "nobody waits");
        assert!(!reached(3, 4 | WAITING));
        assert!(reached(4, 4 | WAITING));
        assert!(reached(5, 4 | WAITING));
        // The count wraps at 2^32; the wanted one keeps 31 bits of it.
        let want = u32::MAX - 1;
        assert!(!reached(u32::MAX - 2, want | WAITING));
        assert!(reached(u32::MAX - 1, want | WAITING));
        assert!(reached(u32::MAX, want | WAITING));
        assert!(reached(0, want | WAITING));
        assert!(reached(3, want | WAITING));
    }
}
