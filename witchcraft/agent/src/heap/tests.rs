use super::*;

#[test]
fn a_munmap_over_witchs_memory_unmaps_only_around_it() {
    let run = |lo, hi, own: &[(u64, u64)]| {
        let mut own = own.to_vec();
        let mut calls = vec![];
        let r = unmap_around(lo, hi, &mut own, |a, n| {
            calls.push((a, a + n));
            0
        });
        (r, calls)
    };
    // Nothing of witch's inside: the call is the program's own.
    assert_eq!(run(0x1000, 0x5000, &[(0x9000, 0xa000), (0, 0)]), (None, vec![]));
    // Two spans inside (given out of order), one reaching past the end.
    let (r, calls) = run(0x1000, 0x9000, &[(0x8000, 0xb000), (0, 0), (0x3000, 0x4000)]);
    assert_eq!((r, calls), (Some(0), vec![(0x1000, 0x3000), (0x4000, 0x8000)]));
    // All of it witch's: nothing to unmap, and it succeeds.
    assert_eq!(run(0x3000, 0x4000, &[(0x2000, 0x5000)]), (Some(0), vec![]));
    // A failing part's result is the call's.
    let mut own = [(0x3000, 0x4000)];
    assert_eq!(unmap_around(0x1000, 0x6000, &mut own, |_, _| -1), Some(-1));
}
