use super::*;

#[test]
fn an_access_survives_its_info_word() {
    let a = Access { addr: 0x1234, len: 32, read: true, write: false, float: Float::F64, elem: 8 };
    let r = Record { addr: a.addr, pc: 7, info: info(&a) | MORE, extra: 0 };
    assert_eq!(r.access(), a);
    assert!(r.is(MORE) && !r.is(CALL));
    let mut bytes = Vec::new();
    for w in r.to_words() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    assert_eq!(Record::parse(&bytes).collect::<Vec<_>>(), vec![r]);
}

#[test]
fn a_short_record_says_what_a_long_one_says() {
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    for len in [1u32, 2, 3, 8, 16, 33, 64] {
        for (float, elem) in [(Float::No, 0u8), (Float::No, 2), (Float::No, 32), (Float::F32, 4), (Float::F64, 0), (Float::F64, 8)] {
            for flags in [READ, WRITE, READ | WRITE | MORE, WRITE | BEFORE | AFTER, READ | BEFORE | MORE] {
                let a = Access { addr: 0x7fff_1234_5678, len, read: flags & READ != 0, write: flags & WRITE != 0, float, elem };
                let r = Record { addr: a.addr + len as u64, pc: 0x7fff_ffff_f000 | len as u64, info: info(&a) | flags, extra: 0 };
                let w = short_word(r.pc, r.info).expect("fits a short record");
                assert!(is_short(w));
                bytes.extend_from_slice(&r.addr.to_le_bytes());
                bytes.extend_from_slice(&w.to_le_bytes());
                want.push(r);
            }
        }
    }
    // Long records between them: a call, a length over 64, the
    // vsyscall page's pc (bit 63 set, as a short record's mark).
    let call = Record { addr: 0x7000, pc: 0x1000, info: 8 | WRITE | CALL, extra: 0x1005 };
    let wide = Record { addr: 0x7000, pc: 0x1000, info: 512 | WRITE, extra: 0 };
    let vsys = Record { addr: 0x7000, pc: 0xffff_ffff_ff60_0000, info: 8 | READ, extra: 0 };
    for r in [call, wide, vsys] {
        assert_eq!(short_word(r.pc, r.info), None);
        assert!(!is_short(r.pc));
        bytes.extend(r.to_words().iter().flat_map(|w| w.to_le_bytes()));
        want.push(r);
    }
    assert_eq!(Record::parse(&bytes).collect::<Vec<_>>(), want);
    // A record cut short is not read.
    assert_eq!(Record::parse(&bytes[..bytes.len() - 8]).count(), want.len() - 1);
    // Nor are records that are not aligned read otherwise.
    let mut odd = vec![0u8];
    odd.extend_from_slice(&bytes);
    assert_eq!(Record::parse(&odd[1..]).collect::<Vec<_>>(), want);
    assert_eq!(Record::parse(&odd[1..odd.len() - 8]).count(), want.len() - 1);
}

/// A decoder, and registers at 0x1000 with rsp, rsi and rdi set.
fn decoder() -> (crate::x86::decode::Analyzer, crate::x86::decode::Regs) {
    let mut regs = crate::x86::decode::Regs { rip: 0x1000, ..Default::default() };
    regs.gpr[1] = 5; // rcx: the rep strings below are of 5 elements
    regs.gpr[4] = 0x7000; // rsp
    regs.gpr[6] = 0x2000; // rsi
    regs.gpr[7] = 0x3000; // rdi
    (crate::x86::decode::Analyzer::new(), regs)
}

#[test]
fn an_instruction_run_outside_the_cache_gets_the_records_a_copy_writes() {
    let (mut an, mut regs) = decoder();
    regs.df = true;
    // call rel32: the return address pushed, and the shadow stack's event.
    let d = an.decode(&[0xE8, 0, 0, 0, 0], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction(&d, Transfer::Call(0x1005));
    assert_eq!(n, 1);
    assert_eq!((r[0].addr, r[0].access().len, r[0].is(WRITE), r[0].is(CALL), r[0].extra), (0x6ff8, 8, true, true, 0x1005));
    // rep movsq walking down: two ranged records (the decoder lists the
    // write first; the judge takes an instruction's loads first).
    let d = an.decode(&[0xF3, 0x48, 0xA5], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction(&d, Transfer::Rep(5));
    assert_eq!(n, 2);
    assert!(r[..2].iter().all(|r| r.is(REP) && r.is(DOWN) && r.extra == 5 && r.access().len == 8));
    assert!(r[0].is(MORE) && !r[1].is(MORE));
    let (read, write) = if r[0].is(READ) { (r[0], r[1]) } else { (r[1], r[0]) };
    assert_eq!((read.addr, read.is(WRITE), write.addr, write.is(READ)), (0x2000, false, 0x3000, false));
    // A syscall: no access, one NONE record.
    let d = an.decode(&[0x0F, 0x05], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction(&d, Transfer::None);
    assert_eq!((n, r[0].is(NONE)), (1, true));
}

#[test]
fn a_value_craft_records_its_kind_with_the_bytes_it_compares() {
    let (mut an, regs) = decoder();
    // call rel32: a store of the return address (silent stores: with
    // both values); for redundant loads only the shadow stack's record.
    let call = an.decode(&[0xE8, 0, 0, 0, 0], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction_for(RecordKind::StoreValues, &call, Transfer::Call(0x1005));
    assert_eq!(n, 1);
    assert!(r[0].is(WRITE) && r[0].is(CALL) && r[0].is(BEFORE) && r[0].is(AFTER) && r[0].extra == 0x1005);
    assert_eq!(r[0].value_lens(), (8, 8));
    let (r, n) = of_instruction_for(RecordKind::LoadValues, &call, Transfer::Call(0x1005));
    assert_eq!((n, r[0].is(NONE), r[0].is(CALL), r[0].extra, r[0].value_lens()), (1, true, true, 0x1005, (0, 0)));
    // rep movsq of 5: both ranges for silent stores (the source's bytes
    // are what it stores); for redundant loads the source with its
    // bytes and the destination without (the replay's image).
    let movs = an.decode(&[0xF3, 0x48, 0xA5], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction_for(RecordKind::StoreValues, &movs, Transfer::Rep(5));
    assert_eq!(n, 2);
    assert!(r[..2].iter().all(|r| r.is(REP) && r.is(BEFORE) && !r.is(AFTER) && r.value_lens() == (40, 0)));
    assert!(r[0].is(MORE) && !r[1].is(MORE));
    let (r, n) = of_instruction_for(RecordKind::LoadValues, &movs, Transfer::Rep(5));
    assert_eq!(n, 2);
    let (read, write) = if r[0].is(READ) { (r[0], r[1]) } else { (r[1], r[0]) };
    assert_eq!((read.value_lens(), write.value_lens()), ((40, 0), (0, 0)));
    // rep stosq: its element stored (after); nothing for redundant loads.
    let stos = an.decode(&[0xF3, 0x48, 0xAB], 0x1000, &regs, false).unwrap();
    let (r, n) = of_instruction_for(RecordKind::StoreValues, &stos, Transfer::Rep(3));
    assert_eq!((n, r[0].value_lens()), (1, (24, 8)));
    assert_eq!(of_instruction_for(RecordKind::LoadValues, &stos, Transfer::Rep(3)).1, 0);
}

#[test]
fn value_records_parse_with_their_bytes() {
    let a = Access { addr: 0x10, len: 3, read: false, write: true, ..Default::default() };
    let r = Record { addr: 0x10, pc: 1, info: info(&a) | BEFORE | AFTER, extra: 0 };
    let mut b: Vec<u8> = r.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
    b.extend([1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
    let v: Vec<_> = parse_valued(&b).collect();
    assert_eq!(v.len(), 1);
    let v = v[0].unwrap();
    assert_eq!((v.record, v.before, v.after), (r, &[1u8, 2, 3][..], &[4u8, 5, 6][..]));
    assert!(parse_valued(&b[..b.len() - 1]).next().unwrap().is_none(), "cut short");
}

/// A short record with its values reads as the same record written long,
/// with the same bytes, for every length and value flag a short record
/// can carry, one after another in one stream (so where each ends is
/// right too); cut anywhere, the last is not read.
#[test]
fn short_value_records_read_as_long_ones_do() {
    let (mut short, mut long, mut want) = (Vec::new(), Vec::new(), Vec::new());
    let mut fill = 0u8;
    for len in 1..=64u32 {
        for flags in [0, AFTER, BEFORE | AFTER, BEFORE] {
            for (read, write, float, elem) in [(true, false, Float::No, 0), (false, true, Float::F64, 8), (true, true, Float::F32, 4)] {
                let a = Access { addr: 0x7000 + len as u64, len, read, write, float, elem };
                let r = Record { addr: a.addr, pc: 0x40_0000 + len as u64, info: info(&a) | flags, extra: 0 };
                let Some(second) = short_word(r.pc, r.info) else { continue };
                let mut values = Vec::new();
                let mut value = |on: bool| {
                    let bytes: Vec<u8> = (0..len)
                        .map(|_| {
                            fill = fill.wrapping_add(1);
                            fill
                        })
                        .collect();
                    if on {
                        values.extend_from_slice(&bytes);
                        values.resize(values.len().div_ceil(8) * 8, 0);
                    }
                    bytes
                };
                let (b, af) = (value(flags & BEFORE != 0), value(flags & AFTER != 0));
                for w in [r.addr, second] {
                    short.extend_from_slice(&w.to_le_bytes());
                }
                for w in r.to_words() {
                    long.extend_from_slice(&w.to_le_bytes());
                }
                short.extend_from_slice(&values);
                long.extend_from_slice(&values);
                let b = if flags & BEFORE != 0 { b } else { vec![] };
                let af = if flags & AFTER != 0 { af } else { vec![] };
                want.push((r, b, af));
            }
        }
    }
    assert!(want.len() > 500, "{} records", want.len());
    for bytes in [&short, &long] {
        let got: Vec<_> =
            parse_valued(bytes).map(|v| v.expect("whole records")).map(|v| (v.record, v.before.to_vec(), v.after.to_vec())).collect();
        assert_eq!(got, want);
    }
    for cut in [1, 7, 8, 15, 16, 17] {
        let got: Vec<_> = parse_valued(&short[..short.len() - cut]).collect();
        assert_eq!(got.len(), want.len(), "cut by {cut}: every record but the last whole");
        assert!(got.last().unwrap().is_none(), "cut by {cut}: the last is cut short");
    }
}

/// A `rep` string record whose count and length say more bytes than any
/// stream holds (a stream of nonsense) is cut short, not a panic.
#[test]
fn a_string_record_of_impossible_length_is_cut_short() {
    for (count, len) in [(u64::MAX, 8u32), (u64::MAX / 8, 8), ((usize::MAX / 16) as u64, 16), (1 << 61, 8)] {
        let a = Access { addr: 0x10, len, read: true, ..Default::default() };
        let r = Record { addr: 0x10, pc: 1, info: info(&a) | REP | BEFORE | AFTER, extra: count };
        let mut b: Vec<u8> = r.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        b.extend([0u8; 64]);
        let got: Vec<_> = parse_valued(&b).collect();
        assert_eq!(got.len(), 1, "count {count}");
        assert!(got[0].is_none(), "count {count}: cut short");
    }
}
