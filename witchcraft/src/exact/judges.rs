//! Several judges at once. Judgements are per thread (each recording
//! thread's records are judged against its own shadow, as the crafts'
//! debug registers are per thread), so the threads of a program can be
//! judged apart: each ring's notices go to one of a few judging threads,
//! every notice of a ring to the same one, in the order they came. One
//! judge set the pace of a program with several busy threads, whose
//! threads then waited on their rings for it.
//!
//! The first judge is the calling thread itself (a one-thread program is
//! judged as before, with no hand-over); each further one is a thread of
//! its own, fed through a channel. A recording thread keeps its judge for
//! the run (by pid and tid: a thread whose tid the kernel gives again
//! goes on in the same shadow, as with one judge).

use super::reader::{Judge, JudgedImage};
use super::stream::Notice;
use crate::profile::Craft;
use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A notice, and the descriptor that came with it.
type Taken = (Vec<u8>, Option<i32>);

/// A judging thread of its own: its channel, and the thread, which gives
/// back its judge and its CPU time (ns).
type Other = (mpsc::Sender<Taken>, JoinHandle<(Judge, u64)>);

/// The judges of one recording run.
pub struct Judges {
    /// Judge 0: the caller's.
    own: Judge,
    /// Judges 1..: their channels and threads.
    others: Vec<Other>,
    /// Each ring's judge, by ring number.
    rings: HashMap<u64, usize>,
    /// Each recording thread's judge, by (pid, tid).
    threads: HashMap<(i32, i32), usize>,
    /// The judge the next new recording thread goes to.
    next: usize,
}

/// What the judges did: each judge, with its thread's CPU time (ns).
pub struct Judgements {
    pub judges: Vec<(Judge, u64)>,
}

impl Judges {
    /// `n` judges (at least one) of `craft`, floating-point values equal
    /// within `precision`. Fewer when threads cannot be started.
    pub fn new(craft: Craft, precision: f64, n: usize) -> Judges {
        let others = (1..n.max(1))
            .map_while(|i| {
                let (tx, rx) = mpsc::channel::<Taken>();
                let t = std::thread::Builder::new()
                    .name(format!("witch-judge-{i}"))
                    .spawn(move || {
                        let mut judge = Judge::new(craft, precision);
                        for (d, passed) in rx {
                            judge.take_notice(&d, passed);
                        }
                        (judge, crate::sys::task::thread_cpu_ns())
                    })
                    .ok()?;
                Some((tx, t))
            })
            .collect();
        Judges { own: Judge::new(craft, precision), others, rings: HashMap::new(), threads: HashMap::new(), next: 0 }
    }

    /// How many judges there are.
    pub fn len(&self) -> usize {
        1 + self.others.len()
    }

    /// Always false: there is at least the caller's judge.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The judge of a notice: a new ring's goes to its thread's judge (a
    /// new thread's to the next judge in turn); a chunk or the end of a
    /// ring to the ring's; anything else to the first, which counts it
    /// malformed.
    fn judge_of(&mut self, d: &[u8]) -> usize {
        match Notice::parse(d) {
            Some((h, Notice::Register { id, .. })) => {
                let n = self.len();
                let next = &mut self.next;
                let k = *self.threads.entry((h.pid, h.tid)).or_insert_with(|| {
                    let k = *next;
                    *next = (*next + 1) % n;
                    k
                });
                self.rings.insert(id, k);
                k
            }
            Some((_, Notice::Chunk { id, .. })) => self.rings.get(&id).copied().unwrap_or(0),
            Some((_, Notice::Retire { id })) => self.rings.remove(&id).unwrap_or(0),
            None => 0,
        }
    }

    /// Take one notice (`passed`: the descriptor that came with it), as
    /// [`Judge::take_notice`] does, on its ring's judge.
    pub fn take_notice(&mut self, d: &[u8], passed: Option<i32>) {
        match self.judge_of(d) {
            0 => self.own.take_notice(d, passed),
            k => {
                if let Err(mpsc::SendError((d, passed))) = self.others[k - 1].0.send((d.to_vec(), passed)) {
                    // (A judge thread that is gone, never expected: its
                    // notices are judged here, counted malformed if their
                    // ring is not this judge's.)
                    self.own.take_notice(&d, passed);
                }
            }
        }
    }

    /// Every notice is in: let the judges finish. `own_cpu_ns` is the
    /// calling thread's CPU time, judge 0's.
    pub fn finish(self, own_cpu_ns: u64) -> Judgements {
        let mut judges = vec![(self.own, own_cpu_ns)];
        for (tx, t) in self.others {
            drop(tx);
            if let Ok(j) = t.join() {
                judges.push(j);
            }
        }
        Judgements { judges }
    }
}

impl Judgements {
    /// Datagrams that were not whole records, over all judges.
    pub fn malformed(&self) -> u64 {
        self.judges.iter().map(|(j, _)| j.malformed).sum()
    }

    /// Records judged, over all judges.
    pub fn records(&self) -> u64 {
        self.judges.iter().map(|(j, _)| j.records).sum()
    }

    /// The judges' CPU time (ns): all of them, and the busiest one's.
    pub fn cpu_ns(&self) -> (u64, u64) {
        (self.judges.iter().map(|(_, c)| c).sum(), self.judges.iter().map(|(_, c)| *c).max().unwrap_or(0))
    }

    /// The process images seen, each with what every judge judged of it
    /// (a process's threads may have been judged by several).
    pub fn into_processes(self) -> Vec<JudgedImage> {
        let mut images: Vec<JudgedImage> = Vec::new();
        for (judge, _) in self.judges {
            for j in judge.into_processes() {
                match images.iter_mut().find(|i| (i.pid, i.image) == (j.pid, j.image)) {
                    Some(i) => {
                        i.instructions += j.instructions;
                        i.records += j.records;
                        i.threads.extend(j.threads);
                    }
                    None => images.push(j),
                }
            }
        }
        images
    }
}

/// The judges a run gets by default: one per processor, at most 8 (a
/// judge is one thread's work; the program's threads need processors too,
/// and wait on their rings when the judges are behind).
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::ring::Ring;
    use crate::exact::stream::{Header, HEADER_BYTES, MAX_DATAGRAM};
    use crate::x86::record::{info, Record, RECORD_WORDS};

    /// Three recording threads of one process, two judges: every chunk is
    /// judged by its thread's judge (each thread's stores and loads pair up
    /// within the thread), and the process's image comes out once, with
    /// all three threads.
    #[test]
    fn each_threads_records_go_to_one_judge_and_come_out_together() {
        let (ours, theirs) = crate::sys::fd::seqpacket_pair().unwrap();
        let mut judges = Judges::new(Craft::Dead, 0.0, 2);
        assert_eq!(judges.len(), 2);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut take_one = |judges: &mut Judges| {
            let (n, passed) = crate::sys::fd::recv_datagram_fd(ours, &mut buf, 1000).unwrap().unwrap();
            judges.take_notice(&buf[..n], passed);
        };
        let tids = [43, 44, 45];
        let mut rings: Vec<Ring> = tids.iter().map(|&tid| Ring::create(theirs, 42, tid, 7).expect("a ring")).collect();
        for _ in &tids {
            take_one(&mut judges);
        }
        // Each thread: 4 stores to its own 32 bytes, then 4 loads of them
        // (the same addresses in every thread: judged apart, each thread's
        // loads use its own stores).
        let access = |addr, read| crate::x86::decode::Access { addr, len: 8, read, write: !read, ..Default::default() };
        for round in 0..2 {
            for (ring, &tid) in rings.iter_mut().zip(&tids) {
                let words = ring.chunk();
                let recs: Vec<Record> = (0..4)
                    .map(|i| {
                        let a = access(0x1000 + 8 * i, round == 1);
                        Record { addr: a.addr, pc: 0x400000 + round, info: info(&a), extra: 0 }
                    })
                    .collect();
                for (i, r) in recs.iter().enumerate() {
                    for (j, w) in r.to_words().into_iter().enumerate() {
                        // SAFETY: within the chunk, after its header.
                        unsafe { words.add(HEADER_BYTES / 8 + i * RECORD_WORDS + j).write(w) };
                    }
                }
                let h = Header { pid: 42, tid, words: (recs.len() * RECORD_WORDS) as u32, image: 7 };
                assert!(ring.publish(theirs, h), "published");
                take_one(&mut judges);
            }
        }
        for ring in rings {
            drop(ring);
            take_one(&mut judges);
        }
        let judged = judges.finish(0);
        assert_eq!((judged.judges.len(), judged.malformed(), judged.records()), (2, 0, 24));
        // Both judges judged some of it, each a whole thread's.
        assert!(judged.judges.iter().all(|(j, _)| j.records > 0 && j.records % 8 == 0), "records per judge");
        let images = judged.into_processes();
        assert_eq!(images.len(), 1, "one process image");
        let mut seen: Vec<i32> = images[0].threads.iter().map(|(t, _)| *t).collect();
        seen.sort();
        assert_eq!(seen, tids);
        assert_eq!(images[0].records, 24);
        for (tid, t) in &images[0].threads {
            let used: f64 = t.pairs.iter().map(|p| p.used).sum();
            assert_eq!(used, 32.0, "thread {tid}: its loads used its own stores");
        }
        crate::sys::fd::close(ours);
        crate::sys::fd::close(theirs);
    }
}
