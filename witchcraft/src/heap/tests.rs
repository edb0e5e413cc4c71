use super::*;
use std::sync::atomic::AtomicBool;

fn site(x: u64) -> [u64; SITE_FRAMES] {
    [x; SITE_FRAMES]
}

#[test]
fn blocks_are_found_by_any_address_inside_and_removed_by_start() {
    let t = Table::new(64).unwrap();
    let a = HeapBlock::new(0x10_0000, 4096, site(1));
    let b = HeapBlock::new(0x10_1000, 100_000, site(2));
    let c = HeapBlock::new(0x7f00_0000_0000, 1 << 30, site(3));
    for x in [&a, &b, &c] {
        assert!(t.insert(x));
    }
    assert_eq!(t.find(0x10_0000), Some(a));
    assert_eq!(t.find(0x10_0fff), Some(a));
    assert_eq!(t.find(0x10_1000 + 99_999), Some(b));
    assert_eq!(t.find(0x10_1000 + 100_000), None);
    assert_eq!(t.find(0x7f00_0000_0000 + (1 << 29)), Some(c));
    assert_eq!(t.find(0xfff), None);
    assert_eq!(t.live(), 3);
    assert_eq!(t.remove(0x10_0010), None, "only a block's start frees it");
    assert_eq!(t.remove(0x10_0000), Some(a));
    assert_eq!(t.find(0x10_0010), None);
    assert_eq!(t.remove(0x10_0000), None);
    // The tombstone is reused.
    let d = HeapBlock::new(0x10_0000, 4000, site(4));
    assert!(t.insert(&d));
    assert_eq!(t.find(0x10_0f00), Some(d));
    assert_eq!(t.live(), 3);
    assert_ne!(site_hash(&site(1)), site_hash(&site(2)));
}

/// `munmap` of any range: blocks inside go, blocks reaching out keep
/// their parts outside under their site; a failed call puts them back.
#[test]
fn a_range_trims_the_blocks_it_covers_and_keeps_their_parts_outside() {
    const M: u64 = 1 << 20;
    let t = Table::new(64).unwrap();
    let big = HeapBlock::new(0x4000_0000, 4 * M, site(1));
    let small = HeapBlock::new(0x4000_0000 + 5 * M, 64 << 10, site(2));
    let other = HeapBlock::new(0x5000_0000, M, site(3));
    for b in [&big, &small, &other] {
        assert!(t.insert_mapping(b));
    }
    let mut removed = [HeapBlock::default(); 4];
    // Nothing there: nothing changes.
    assert_eq!(t.trim(0x3000_0000, 0x3000_0000 + M, &mut removed), 0);
    assert_eq!(t.live(), 3);
    // The middle of `big` and all of `small`: `big` becomes two parts.
    let (lo, hi) = (big.start + M, small.start + small.size + M);
    assert_eq!(t.trim(lo, hi, &mut removed), 2);
    let mut got = removed[..2].to_vec();
    got.sort_by_key(|b| b.start);
    assert_eq!(got, [big, small]);
    assert_eq!(t.find(big.start + M - 1), Some(HeapBlock::new(big.start, M, site(1))), "the part before");
    assert_eq!(t.find(big.start + M), None);
    assert_eq!(t.find(small.start), None);
    assert_eq!(t.find(other.start), Some(other));
    assert_eq!(t.live(), 2);
    // The second part of `big` (from `hi` on) is gone too: the range
    // reached past `big`'s end.
    assert!(hi > big.start + big.size);
    // A failed `munmap`: as before.
    t.untrim(lo, hi, &got);
    assert_eq!(t.live(), 3);
    assert_eq!(t.find(big.start + 2 * M), Some(big));
    assert_eq!(t.find(small.start + 10), Some(small));
    // A suffix of `big` and a prefix of `other`, then a hole in `big`.
    assert_eq!(t.trim(big.start + 3 * M, other.start + 4096, &mut removed), 3);
    assert_eq!(t.find(big.start + 3 * M - 1).map(|b| (b.start, b.size)), Some((big.start, 3 * M)));
    assert_eq!(t.find(other.start + 4096), Some(HeapBlock::new(other.start + 4096, M - 4096, site(3))));
    assert_eq!(t.find(other.start), None);
    assert_eq!(t.trim(big.start + M, big.start + 2 * M, &mut removed[..1]), 1);
    assert_eq!(t.find(big.start), Some(HeapBlock::new(big.start, M, site(1))));
    assert_eq!(t.find(big.start + 2 * M).map(|b| (b.start, b.size, b.hash)), Some((big.start + 2 * M, M, big.hash)));
    assert_eq!(t.find(big.start + M + 100), None);
    // The parts are freed by their starts like any block.
    assert!(t.remove(big.start).is_some() && t.remove(big.start + 2 * M).is_some());
    assert_eq!(t.live(), 1);
}

/// A range too long to look at granule by granule (a 64 KiB block's
/// level, a range of a terabyte) is one pass over the table.
#[test]
fn a_huge_range_is_one_pass_over_the_table() {
    let t = Table::new(64).unwrap();
    let b = HeapBlock::new(0x7000_0000, 64 << 10, site(1));
    assert!(t.insert_mapping(&b));
    // A block of `malloc`'s at another level is not looked for.
    let m = HeapBlock::new(0x9000_0000, 1 << 30, site(2));
    assert!(t.insert(&m));
    assert_eq!(t.trim(m.start, m.start + 4096, &mut []), 0);
    assert_eq!(t.find(m.start), Some(m));
    assert_eq!(t.trim(0x1000, 1 << 40, &mut []), 2, "a pass over the table meets both");
    assert_eq!(t.live(), 0);
}

#[test]
fn a_full_run_is_counted_not_waited_on() {
    let t = Table::new(PROBES).unwrap();
    for i in 0..PROBES as u64 {
        assert!(t.insert(&HeapBlock::new(0x1000 * (i + 1), 64, site(i))));
    }
    assert!(!t.insert(&HeapBlock::new(0x100_0000, 64, site(9))));
    assert_eq!(t.overflow(), 1);
    for i in 0..PROBES as u64 {
        assert_eq!(t.find(0x1000 * (i + 1) + 8).map(|b| b.site[0]), Some(i));
    }
}

/// A writer that removes a block and puts another in its entry while a
/// reader is between the block's start and its size: the reader must
/// not take the old start with the new size, hash and site.
#[test]
fn a_block_rewritten_during_a_read_is_not_taken() {
    let t = Table::new(64).unwrap();
    let (a, b) = (HeapBlock::new(0x4000, 128, site(1)), HeapBlock::new(0x4000, 120, site(2)));
    assert!(t.insert(&a));
    let s = (0..t.cap).find(|&s| t.read(s).is_some_and(|(tag, x)| tag != 0 && x == a)).unwrap();
    let got = t.read_with(s, || {
        assert_eq!(t.remove(0x4000), Some(a));
        assert!(t.insert(&b));
    });
    assert_eq!(got, None, "a torn read");
    assert_eq!(t.read(s).map(|(_, x)| x), Some(b));
    // A writer that owns the entry (the thread a handler interrupted,
    // say) makes the reader skip it, not wait.
    t.word(s, 0).fetch_add(1, Ordering::AcqRel);
    assert_eq!(t.find(0x4010), None);
    t.word(s, 0).fetch_add(1, Ordering::AcqRel);
    assert_eq!(t.find(0x4010), Some(b));
}

/// Two writers insert and remove blocks at two addresses over and
/// over, each block's fields all made of one number (start `X + k`,
/// size, hash and site from `k`), so that a reader pairing fields of two
/// different writes sees numbers that disagree: the torn read the tags
/// prevent (without the second tag check this fails in about one run
/// in three on two busy cores; the test below makes the race certain).
#[test]
fn a_reader_never_sees_half_of_one_block_and_half_of_another() {
    const X: u64 = 1 << 32;
    static STOP: AtomicBool = AtomicBool::new(false);
    let t: &'static Table = Box::leak(Box::new(Table::new(64).unwrap()));
    let block = |k: u64| HeapBlock { start: X + 128 * (k % 2), size: 100 + k % 16, hash: k, site: site(k) };
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            std::thread::spawn(move || {
                let mut k = w;
                while !STOP.load(Ordering::Relaxed) {
                    let b = block(k);
                    if t.insert(&b) {
                        t.remove(b.start);
                    }
                    k += 2;
                }
            })
        })
        .collect();
    let until = std::time::Instant::now() + std::time::Duration::from_millis(400);
    let (mut reads, mut found, mut torn) = (0u64, 0u64, None);
    while std::time::Instant::now() < until && torn.is_none() {
        for a in [X + 8, X + 136] {
            if let Some(b) = t.find(a) {
                found += 1;
                let k = b.hash;
                if b != block(k) {
                    torn = Some(b);
                }
            }
            reads += 1;
        }
    }
    STOP.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(torn, None, "a torn block after {reads} reads");
    assert!(found > 0, "the reader found no block in {reads} reads");
}
