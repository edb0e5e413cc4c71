//! The process's mappings, as a signal handler may read them: a thread
//! finds its stack from its stack pointer here (no file reads in a
//! handler), in a snapshot the control thread takes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The process's mappings, snapshot by the control thread, for a thread to
/// find its stack from its stack pointer in a handler (no file reads there).
const MAX_MAPS: usize = 8192;
static MAPS: PublishedRanges<MAX_MAPS> = PublishedRanges::new();

/// Take a new snapshot of this process's mappings (not for handlers).
pub fn snapshot_mappings() {
    let maps = witchcraft::sys::procfs::read_maps(None).unwrap_or_default();
    MAPS.publish(maps.iter().map(|m| (m.start, m.end)));
}

/// The mapping that holds `sp` in the last snapshot ((0, 0): none).
/// Async-signal-safe.
pub fn stack_of(sp: u64) -> (u64, u64) {
    MAPS.find(sp)
}

/// Address ranges one writer publishes and signal handlers read, under a
/// sequence lock: a reader that overlapped a publish sees the count change
/// and reads again, so it never pairs one snapshot's start with another's
/// end (a range that would let the unwinder read past a stack). Readers
/// never wait on the writer: a handler that interrupted the writer itself
/// (or keeps losing the race) gives up after a few tries and finds nothing.
struct PublishedRanges<const N: usize> {
    /// Odd while a publish is under way; bumped before and after one.
    seq: AtomicU64,
    len: AtomicUsize,
    ranges: [[AtomicU64; 2]; N],
}

impl<const N: usize> PublishedRanges<N> {
    const TRIES: usize = 4;

    const fn new() -> Self {
        PublishedRanges { seq: AtomicU64::new(0), len: AtomicUsize::new(0), ranges: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; N] }
    }

    /// Replace the ranges (the first `N`). One writer at a time.
    fn publish(&self, ranges: impl Iterator<Item = (u64, u64)>) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        std::sync::atomic::fence(Ordering::Release);
        let mut n = 0;
        for (i, (a, b)) in ranges.take(N).enumerate() {
            self.ranges[i][0].store(a, Ordering::Relaxed);
            self.ranges[i][1].store(b, Ordering::Relaxed);
            n = i + 1;
        }
        self.len.store(n, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// The range holding `x` in one whole snapshot ((0, 0): none, or no
    /// consistent read in a few tries). Async-signal-safe.
    fn find(&self, x: u64) -> (u64, u64) {
        for _ in 0..Self::TRIES {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let n = self.len.load(Ordering::Relaxed).min(N);
            let found = (0..n)
                .map(|i| (self.ranges[i][0].load(Ordering::Relaxed), self.ranges[i][1].load(Ordering::Relaxed)))
                .find(|&(a, b)| a <= x && x < b)
                .unwrap_or((0, 0));
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return found;
            }
        }
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Two snapshots, neither of which has a range holding `X`: one of
    /// `[i, i + 1)` below it, one of `[X + 1 + i, X + 2 + i)` above it. A
    /// reader that paired one snapshot's start of a range with the other's
    /// end would find `[i, X + 2 + i)`, around `X`: the torn read, which a
    /// reader preempted (or interrupted) between the two loads of a range
    /// makes while the writer goes on.
    #[test]
    fn a_reader_never_pairs_two_snapshots_ranges() {
        const N: usize = 4096;
        const X: u64 = 1 << 40;
        static S: PublishedRanges<N> = PublishedRanges::new();
        static STOP: AtomicBool = AtomicBool::new(false);
        let below = |i: usize| (i as u64, i as u64 + 1);
        let above = |i: usize| (X + 1 + i as u64, X + 2 + i as u64);
        S.publish((0..N).map(below));
        let writer = std::thread::spawn(move || {
            let mut flip = false;
            while !STOP.load(Ordering::Relaxed) {
                if flip {
                    S.publish((0..N).map(below));
                } else {
                    S.publish((0..N).map(above));
                }
                flip = !flip;
            }
        });
        let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let (mut reads, mut torn) = (0u64, None);
        while std::time::Instant::now() < until && torn.is_none() {
            let got = S.find(X);
            reads += 1;
            if got != (0, 0) {
                torn = Some(got);
            }
        }
        STOP.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(torn, None, "a torn range after {reads} reads");
        // And a consistent snapshot is found whole.
        S.publish((0..N).map(above));
        assert_eq!(S.find(X + 8), (X + 8, X + 9));
        assert_eq!(S.find(X), (0, 0));
    }
}
