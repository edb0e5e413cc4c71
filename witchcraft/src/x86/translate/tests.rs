use super::*;
use crate::x86::record;
use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

/// Native code at `base`, everything else at fixed fake addresses.
struct Code {
    base: u64,
    bytes: Vec<u8>,
}

impl Host for Code {
    fn code(&mut self, pc: u64, out: &mut [u8]) -> usize {
        let Some(off) = pc.checked_sub(self.base).map(|o| o as usize).filter(|&o| o < self.bytes.len()) else { return 0 };
        let n = out.len().min(self.bytes.len() - off);
        out[..n].copy_from_slice(&self.bytes[off..off + n]);
        n
    }
    fn translatable(&self, pc: u64) -> bool {
        pc >= self.base && pc < self.base + 0x10000
    }
    fn resolve(&self, _: u64) -> Option<u64> {
        None
    }
}

const NATIVE: u64 = 0x5555_0000_1000;
const CACHE: u64 = 0x7f00_0000_0000;

fn slots() -> DataAddrs {
    DataAddrs::at(CACHE - 0x1000)
}

fn env(dispatch: u64) -> Env {
    Env { slots: slots(), counted: Counted::Stores, dispatch, link: 0 }
}

fn translate(code: &[u8], variant: Variant, points: bool) -> (Translator, Block, Vec<u8>) {
    let mut t = Translator::new();
    let mut host = Code { base: NATIVE, bytes: code.to_vec() };
    let mut out = vec![0u8; MAX_BLOCK_BYTES];
    let b = t.translate(&mut host, &env(CACHE - 0x800), TranslateRequest { native: NATIVE, variant, at: CACHE, points }, &mut out).unwrap();
    out.truncate(b.len as usize);
    (t, b, out)
}

/// The instructions of a copy, as (address, instruction), up to the
/// first `int3` (the records after exits are data).
fn listing(out: &[u8]) -> Vec<(u64, Instruction)> {
    let mut d = Decoder::with_ip(64, out, CACHE, DecoderOptions::NONE);
    let mut v = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.mnemonic() == Mnemonic::Int3 || i.is_invalid() {
            break;
        }
        v.push((i.ip(), i));
    }
    v
}

/// The exits of a copy: every `int3` and its record.
fn exits(out: &[u8]) -> Vec<(u64, Exit)> {
    let mut v = Vec::new();
    let mut i = 0;
    while i + 18 <= out.len() {
        if out[i] == 0xCC {
            if let Some(e) = Exit::read(out[i + 1..i + 18].try_into().unwrap()) {
                v.push((CACHE + i as u64 + 1, e));
                i += 18;
                continue;
            }
        }
        i += 1;
    }
    v
}

#[test]
fn exit_records_read_back() {
    for e in [
        Exit::Link { native: 1, patch: 2 },
        Exit::Native { native: 3 },
        Exit::End { native: 4 },
        Exit::Slow { native: 5, patch: 6 },
        Exit::Pick { native: 7 },
        Exit::Lookup,
        Exit::RepDone,
        Exit::BigRep { native: 8 },
        Exit::Stepped { native: 9 },
    ] {
        assert_eq!(Exit::read(&e.encode()), Some(e));
    }
    assert_eq!(Exit::read(&[0; 17]), None);
}

#[test]
fn a_store_loop_counts_its_stores_and_links_both_ways() {
    // mov [rdi], eax; add rdi, 4; dec ecx; jne -10 (back to the start)
    let code = [0x89, 0x07, 0x48, 0x83, 0xC7, 0x04, 0xFF, 0xC9, 0x75, 0xF6];
    let (_, b, out) = translate(&code, Variant::Fast, false);
    assert_eq!((b.insns, b.counted), (4, 1));
    let ex = exits(&out);
    assert!(ex.iter().any(|(_, e)| *e == Exit::End { native: NATIVE }));
    assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Slow { native: NATIVE, .. })));
    assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Link { native: NATIVE, .. })), "the back edge");
    assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Link { native, .. } if *native == NATIVE + 10)), "the fall-through");
    // Every Link exit's patch points at a rel32 aimed at that exit.
    for (at, e) in ex {
        if let Exit::Link { patch, .. } | Exit::Slow { patch, .. } = e {
            let off = (patch - CACHE) as usize;
            let rel = i32::from_le_bytes(out[off..off + 4].try_into().unwrap()) as i64;
            assert_eq!((patch as i64 + 4 + rel) as u64, at - 1, "{e:?}");
        }
    }
    // `add` writes every arithmetic flag before anything reads one: the
    // prologue need not save them.
    let l = listing(&out);
    assert!(!l.iter().any(|(_, i)| i.mnemonic() == Mnemonic::Lahf), "{l:?}");
    // `dec` leaves CF alone: a block starting there must save them.
    let (_, _, out) = translate(&code[6..], Variant::Fast, false);
    assert_eq!(listing(&out)[1].1.mnemonic(), Mnemonic::Lahf);
}

#[test]
fn flags_written_before_read_need_no_saving() {
    // cmp eax, 1; mov [rdi], eax; je +0
    let code = [0x83, 0xF8, 0x01, 0x89, 0x07, 0x74, 0x00];
    let (_, _, out) = translate(&code, Variant::Fast, false);
    let l = listing(&out);
    assert!(!l.iter().take(4).any(|(_, i)| i.mnemonic() == Mnemonic::Lahf), "{l:?}");
    assert_eq!(l[0].1.mnemonic(), Mnemonic::Sub);
}

#[test]
fn a_rip_relative_operand_out_of_reach_goes_through_a_spare_register() {
    // mov dword [rip+0x100], 7 (10 bytes); ret
    let code = [0xC7, 0x05, 0x00, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xC3];
    let target = NATIVE + 10 + 0x100;
    let (_, _, out) = translate(&code, Variant::Fast, false);
    let l = listing(&out);
    let k = l.iter().position(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Immediate64).expect("mov r, imm64");
    let (_, load) = l[k];
    assert_eq!(load.immediate64(), target);
    let scratch = load.op0_register();
    let (_, store) = l[k + 1];
    assert_eq!((store.memory_base(), store.memory_displacement64(), store.immediate32()), (scratch, 0, 7));
    // Saved before, restored after.
    assert_eq!(l[k - 1].1.op1_register(), scratch);
    assert_eq!(l[k + 2].1.op0_register(), scratch);
}

/// A picked instruction's copy alone (a pick taken without a trap): the
/// instruction as a block's copy has it (a RIP-relative store re-aimed at
/// the same address), then its exit to the next instruction, through the
/// link stub first; nothing counted. A call and a return end at their
/// target; a jump, a `rep` string and what the cache does not run are
/// refused, and so are recording copies, which never pick. Its points map
/// the copy back.
#[test]
fn a_picked_instruction_is_copied_alone_with_its_exit_after_it() {
    // mov dword [rip+0x100], 7 (10 bytes); ret
    let code = [0xC7, 0x05, 0x00, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xC3];
    let link = CACHE - 0x700;
    let env = Env { link, ..env(CACHE - 0x800) };
    let mut t = Translator::new();
    let mut host = Code { base: NATIVE, bytes: code.to_vec() };
    let mut out = vec![0u8; 512];
    let len = t.translate_step(&mut host, &env, NATIVE, CACHE, true, &mut out).unwrap();
    let out = &out[..len];
    let l = listing(out);
    let store = l
        .iter()
        .find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.op0_kind() == OpKind::Memory && i.op1_kind() == OpKind::Immediate32)
        .expect("the store")
        .1;
    assert_eq!(store.immediate32(), 7);
    let (a, b) = if store.is_ip_rel_memory_operand() {
        (store.ip_rel_memory_address(), NATIVE + 10 + 0x100)
    } else {
        // Out of reach of the fake cache: through a spare register.
        let k = l.iter().position(|(_, i)| i.op1_kind() == OpKind::Immediate64).expect("mov r, imm64");
        (l[k].1.immediate64(), NATIVE + 10 + 0x100)
    };
    assert_eq!(a, b, "the store's address");
    assert!(!l.iter().any(|(_, i)| i.op0_kind() == OpKind::Memory && i.memory_displacement64() == slots().countdown), "it counts nothing");
    let jmp = l.last().expect("a jump to the link stub").1;
    assert_eq!(jmp.mnemonic(), Mnemonic::Jmp);
    assert_eq!(exits(out), vec![(CACHE + len as u64 - 17, Exit::Stepped { native: NATIVE + 10 })]);
    let p = t.point_at(store.ip() + store.len() as u64, true).expect("the store's point");
    assert_eq!((p.pc, p.next), (NATIVE, NATIVE + 10));
    // A call pushes the program's return address and goes on at its
    // target; a return and an indirect call where the target slot says.
    let mut host = Code { base: NATIVE, bytes: vec![0xE8, 0x10, 0, 0, 0] };
    let mut out = vec![0u8; 512];
    let len = t.translate_step(&mut host, &env, NATIVE, CACHE, false, &mut out).unwrap();
    let ex = exits(&out[..len]);
    assert_eq!(ex.iter().map(|e| e.1).collect::<Vec<_>>(), vec![Exit::Stepped { native: NATIVE + 5 + 0x10 }]);
    let push = listing(&out[..len])[0].1;
    assert_eq!(push.mnemonic(), Mnemonic::Push);
    let lit = (push.ip_rel_memory_address() - CACHE) as usize;
    assert_eq!(u64::from_le_bytes(out[lit..lit + 8].try_into().unwrap()), NATIVE + 5, "the native return address");
    for (code, what) in [(&[0xC3][..], "ret"), (&[0xFF, 0x50, 0x08], "call [rax+8]")] {
        let mut host = Code { base: NATIVE, bytes: code.to_vec() };
        let mut out = vec![0u8; 512];
        let len = t.translate_step(&mut host, &env, NATIVE, CACHE, false, &mut out).unwrap();
        assert_eq!(exits(&out[..len]).iter().map(|e| e.1).collect::<Vec<_>>(), vec![Exit::Stepped { native: 0 }], "{what}");
    }
    // Refused: a jump, a return that pops arguments, a `rep stosb`, a
    // system call.
    for refused in [&[0xEB, 0x00][..], &[0xC2, 0x08, 0x00], &[0xF3, 0xAA], &[0x0F, 0x05]] {
        let mut host = Code { base: NATIVE, bytes: refused.to_vec() };
        let mut out = vec![0u8; 512];
        assert!(t.translate_step(&mut host, &env, NATIVE, CACHE, false, &mut out).is_err(), "{refused:x?}");
    }
    let rec = Env { counted: Counted::Records(record::RecordKind::Addresses), ..env };
    let mut host = Code { base: NATIVE, bytes: code.to_vec() };
    let mut out = vec![0u8; 512];
    assert!(t.translate_step(&mut host, &rec, NATIVE, CACHE, false, &mut out).is_err(), "a recording copy");
}

#[test]
fn a_rip_relative_operand_within_reach_keeps_its_form() {
    // lea rax, [rip-0x20]; jmp +0
    let code = [0x48, 0x8D, 0x05, 0xE0, 0xFF, 0xFF, 0xFF, 0xEB, 0x00];
    let mut t = Translator::new();
    let mut host = Code { base: NATIVE, bytes: code.to_vec() };
    let mut out = vec![0u8; MAX_BLOCK_BYTES];
    let near = NATIVE + 0x4000_0000;
    let b = t
        .translate(&mut host, &env(near), TranslateRequest { native: NATIVE, variant: Variant::Fast, at: near, points: false }, &mut out)
        .unwrap();
    let mut d = Decoder::with_ip(64, &out[..b.len as usize], near, DecoderOptions::NONE);
    let lea = std::iter::from_fn(|| d.can_decode().then(|| d.decode())).find(|i| i.mnemonic() == Mnemonic::Lea).unwrap();
    assert_eq!(lea.ip_rel_memory_address(), NATIVE + 7 - 0x20);
}

#[test]
fn a_call_pushes_the_native_return_address() {
    // call +0x100
    let code = [0xE8, 0x00, 0x01, 0x00, 0x00];
    let (_, b, out) = translate(&code, Variant::Fast, false);
    assert_eq!(b.counted, 1, "the push is a store");
    let l = listing(&out);
    let push = l.iter().find(|(_, i)| i.mnemonic() == Mnemonic::Push).unwrap().1;
    let lit = push.ip_rel_memory_address();
    let off = (lit - CACHE) as usize;
    assert_eq!(u64::from_le_bytes(out[off..off + 8].try_into().unwrap()), NATIVE + 5);
    assert!(exits(&out).iter().any(|(_, e)| matches!(e, Exit::Link { native, .. } if *native == NATIVE + 5 + 0x100)));
}

#[test]
fn what_cannot_run_from_the_cache_ends_the_block_before_it() {
    // mov [rdi], eax; syscall
    let (_, b, out) = translate(&[0x89, 0x07, 0x0F, 0x05], Variant::Fast, false);
    assert_eq!(b.insns, 1);
    assert!(exits(&out).iter().any(|(_, e)| *e == Exit::Native { native: NATIVE + 2 }));
    // popf first: nothing copied.
    let (_, b, out) = translate(&[0x9D, 0xC3], Variant::Fast, false);
    assert_eq!(b.insns, 0);
    assert_eq!(exits(&out), vec![(CACHE + 1, Exit::Native { native: NATIVE })]);
}

/// `xsavec` and `xrstor` (the dynamic loader's lazy binding saves and
/// restores the vector state so) are copied and counted as no access, as
/// the single-stepping exact mode judges them: the block goes on past them.
#[test]
fn state_saves_run_from_the_cache_and_count_as_no_access() {
    // xsavec [rsp+0x40]; xrstor [rsp+0x40]; mov [rdi], eax; syscall
    let code = [0x0F, 0xC7, 0x64, 0x24, 0x40, 0x0F, 0xAE, 0x6C, 0x24, 0x40, 0x89, 0x07, 0x0F, 0x05];
    let (_, b, out) = translate(&code, Variant::Fast, false);
    assert_eq!((b.insns, b.counted), (3, 1), "two state saves and a store copied, the store counted");
    let copied: Vec<Mnemonic> = listing(&out).iter().map(|(_, i)| i.mnemonic()).collect();
    assert!(copied.contains(&Mnemonic::Xsavec) && copied.contains(&Mnemonic::Xrstor), "{copied:?}");
    assert!(exits(&out).iter().any(|(_, e)| *e == Exit::Native { native: NATIVE + 12 }));
}

#[test]
fn a_rep_string_is_a_block_of_its_own_counted_by_rcx() {
    // mov [rdi], eax; rep stosb
    let (_, b, _) = translate(&[0x89, 0x07, 0xF3, 0xAA], Variant::Fast, false);
    assert_eq!(b.insns, 1, "ends before the rep");
    let mut t = Translator::new();
    let mut host = Code { base: NATIVE, bytes: vec![0xF3, 0xAA, 0xC3] };
    let mut out = vec![0u8; MAX_BLOCK_BYTES];
    let b = t
        .translate(&mut host, &env(CACHE), TranslateRequest { native: NATIVE, variant: Variant::Fast, at: CACHE, points: false }, &mut out)
        .unwrap();
    assert!(b.rep);
    let l = listing(&out[..b.len as usize]);
    assert!(l.iter().any(|(_, i)| i.mnemonic() == Mnemonic::Sub && i.op1_register() == Register::RCX), "{l:?}");
    // repe cmpsb ends when the data says: native.
    let (_, b, _) = translate(&[0xF3, 0xA6], Variant::Fast, false);
    assert_eq!(b.insns, 0);
}

#[test]
fn the_slow_variant_leaves_exactly_before_each_counting_instruction() {
    // mov [rdi], eax; mov eax, [rsi]; mov [rdi+8], eax; ret
    let code = [0x89, 0x07, 0x8B, 0x06, 0x89, 0x47, 0x08, 0xC3];
    let (_, b, out) = translate(&code, Variant::Slow, false);
    assert_eq!(b.counted, 2, "two stores (ret loads)");
    let picks: Vec<u64> =
        exits(&out).iter().filter_map(|(_, e)| if let Exit::Pick { native } = e { Some(*native) } else { None }).collect();
    assert_eq!(picks, vec![NATIVE, NATIVE + 4]);
}

/// A mapping to run a recording copy in: the cache's data slots, a
/// dispatch table and stub, the copy, the native code and the record
/// buffer.
struct Rig {
    base: u64,
    table: u64,
    copy: u64,
    native: u64,
    buf: u64,
    slots: DataAddrs,
    block: Block,
}

const RIG_BYTES: usize = 1 << 16;

impl Rig {
    /// `code` translated for `kind` into a fresh mapping.
    fn new(code: &[u8], kind: record::RecordKind) -> Rig {
        // SAFETY: a new private anonymous mapping, checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RIG_BYTES,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as u64;
        let (data, table, stub, copy, native, buf) = (base, base + 0x1000, base + 0x2000, base + 0x3000, base + 0x6000, base + 0x8000);
        let slots = DataAddrs::at(data);
        let mut rig = Rig { base, table, copy, native, buf, slots, block: Block::default() };
        let mem = rig.mem();
        mem[rig.off(native)..rig.off(native) + code.len()].copy_from_slice(code);
        let fs_base: u64;
        // SAFETY: glibc's thread control block starts with its own address.
        unsafe { std::arch::asm!("mov {}, fs:[0]", out(reg) fs_base) };
        rig.put(slots.countdown, 1000);
        rig.put(slots.instr_left, 1000);
        rig.put(slots.table, table);
        rig.put(slots.rec_ptr, buf);
        rig.put(slots.fs_base, fs_base);
        // One dispatch entry: the `ret` goes back to the caller's address.
        let (o, mem) = (rig.off(stub), rig.mem());
        let n = emit_dispatch(&slots, 1, stub, 0, &mut mem[o..o + 512]).unwrap();
        assert!(n < 512);
        let mut t = Translator::new();
        let mut host = Code { base: native, bytes: code.to_vec() };
        let env = Env { slots, counted: Counted::Records(kind), dispatch: stub, link: 0 };
        let req = TranslateRequest { native, variant: Variant::Fast, at: copy, points: false };
        let (o, mem) = (rig.off(copy), rig.mem());
        rig.block = t.translate(&mut host, &env, req, &mut mem[o..o + MAX_BLOCK_BYTES]).unwrap();
        rig
    }

    fn mem(&self) -> &'static mut [u8] {
        // SAFETY: the mapping made in `new`, unmapped when the rig drops
        // (the tests use the slice only while the rig lives).
        unsafe { std::slice::from_raw_parts_mut(self.base as *mut u8, RIG_BYTES) }
    }

    fn off(&self, a: u64) -> usize {
        (a - self.base) as usize
    }

    fn put(&self, a: u64, v: u64) {
        let o = self.off(a);
        self.mem()[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn get(&self, a: u64) -> u64 {
        let o = self.off(a);
        u64::from_le_bytes(self.mem()[o..o + 8].try_into().unwrap())
    }

    /// The records the copy wrote.
    fn records(&self) -> &[u8] {
        let end = self.get(self.slots.rec_ptr);
        &self.mem()[self.off(self.buf)..self.off(end)]
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.base as *mut libc::c_void, RIG_BYTES) };
    }
}

/// A recording copy, run: every access it makes (explicit, implicit,
/// segment-relative, RIP-relative) is recorded before it happens, with
/// its address, PC and kind, and the program's registers come out as
/// natively.
#[test]
fn a_recording_copy_records_every_access_and_keeps_the_registers() {
    let code: [u8; 26] = [
        0x89, 0x07, // mov [rdi], eax
        0x53, // push rbx
        0x5B, // pop rbx
        0x48, 0x8B, 0x44, 0xCE, 0x10, // mov rax, [rsi+rcx*8+16]
        0x64, 0x48, 0x8B, 0x14, 0x25, 0x10, 0x00, 0x00, 0x00, // mov rdx, fs:[0x10]
        0x4C, 0x8B, 0x05, 0x00, 0x01, 0x00, 0x00, // mov r8, [rip+0x100]
        0xC3, // ret
    ];
    let rig = Rig::new(&code, record::RecordKind::Addresses);
    let (native, table, copy) = (rig.native, rig.table, rig.copy);
    assert_eq!(
        (rig.block.insns, rig.block.counted),
        (7, 16),
        "seven accesses in seven instructions: two words a short record, four the ret's long one"
    );
    let fs_base = rig.get(rig.slots.fs_base);
    let src = [10u64, 11, 12, 13, 14];
    let mut dst = [0u32; 2];
    let (rax, r10, r11): (u64, u64, u64);
    // SAFETY: the copy runs the code above: it writes dst[0], reads
    // src[3], the TCB and its own mapping, pushes and pops rbx, and
    // returns here through the dispatch stub (one entry, made the
    // return address); every register it changes is an output.
    unsafe {
        std::arch::asm!(
            "lea rax, [rip + 2f]",
            "mov [{tab}], rax",
            "mov [{tab} + 8], rax",
            "mov eax, 7",
            "call {copy}",
            "2:",
            tab = in(reg) table,
            copy = in(reg) copy,
            in("rdi") dst.as_mut_ptr(),
            in("rsi") src.as_ptr(),
            in("rcx") 1u64,
            out("rax") rax,
            inout("r10") 0x1010u64 => r10,
            inout("r11") 0x1111u64 => r11,
            inout("r12") 0x1212u64 => _,
            clobber_abi("C"),
        );
    }
    assert_eq!((dst[0], rax, r10, r11), (7, 13, 0x1010, 0x1111), "the program's results and registers");
    let recs: Vec<record::Record> = record::Record::parse(rig.records()).collect();
    assert_eq!(recs.len(), 7, "{recs:x?}");
    let kinds: Vec<(u64, u32, bool, bool)> =
        recs.iter().map(|r| (r.pc - native, r.access().len, r.access().read, r.access().write)).collect();
    assert_eq!(
        kinds,
        vec![
            (0, 4, false, true),
            (2, 8, false, true),
            (3, 8, true, false),
            (4, 8, true, false),
            (9, 8, true, false),
            (18, 8, true, false),
            (25, 8, true, false)
        ]
    );
    assert_eq!(recs[0].addr, dst.as_ptr() as u64);
    assert_eq!(recs[1].addr, recs[2].addr, "push and pop: the same stack slot");
    assert_eq!(recs[3].addr, &src[3] as *const u64 as u64);
    assert_eq!(recs[4].addr, fs_base + 0x10);
    assert_eq!(recs[5].addr, native + 25 + 0x100);
    assert!(recs[6].is(record::RET) && !recs[6].is(record::MORE));
    assert_eq!(recs[6].extra, rig.get(table), "a ret's record carries its target");
    assert_eq!(recs[6].addr, recs[1].addr + 8, "the return address is above where rbx was pushed");
}

/// The value crafts' recording copies, run: a silent-store copy records
/// the stores only, each with the bytes before and after it (a vector
/// store's sixteen, a read-modify-write that changes nothing, the stack
/// slot a `push` overwrites), and a `ret` as a record without an access;
/// a redundant-load copy records the loads only, each with the bytes it
/// read (a `ret` its return address). The registers come out as natively.
#[test]
fn value_recording_copies_record_the_bytes_their_craft_compares() {
    let code: [u8; 22] = [
        0x89, 0x07, // mov [rdi], eax
        0x83, 0x47, 0x04, 0x00, // add dword [rdi+4], 0
        0x0F, 0x11, 0x47, 0x08, // movups [rdi+8], xmm0
        0x41, 0x51, // push r9
        0x41, 0x59, // pop r9
        0x48, 0x8B, 0x46, 0x10, // mov rax, [rsi+16]
        0x66, 0x8B, 0x16, // mov dx, [rsi]
        0xC3, // ret
    ];
    for kind in [record::RecordKind::StoreValues, record::RecordKind::LoadValues] {
        let rig = Rig::new(&code, kind);
        let (native, table, copy) = (rig.native, rig.table, rig.copy);
        let src = [0x0102_0304_0506_0708u64, 11, 12];
        let mut dst = [0u32, 5, 1, 2, 3, 4];
        let vector = [21u32, 22, 23, 24];
        let (rax, rdx, r8, r9, r10, r11): (u64, u64, u64, u64, u64, u64);
        // SAFETY: as in the test above; the copy writes dst, reads src,
        // pushes and pops rbx and returns here.
        unsafe {
            std::arch::asm!(
                "movups xmm0, [{v}]",
                "lea rax, [rip + 2f]",
                "mov [{tab}], rax",
                "mov [{tab} + 8], rax",
                "mov eax, 7",
                "mov edx, 0",
                "call {copy}",
                "2:",
                v = in(reg) vector.as_ptr(),
                tab = in(reg) table,
                copy = in(reg) copy,
                in("rdi") dst.as_mut_ptr(),
                in("rsi") src.as_ptr(),
                out("rax") rax,
                out("rdx") rdx,
                inout("r8") 0x0808u64 => r8,
                inout("r9") 0x4242u64 => r9,
                inout("r10") 0x1010u64 => r10,
                inout("r11") 0x1111u64 => r11,
                clobber_abi("C"),
            );
        }
        assert_eq!(dst, [7, 5, 21, 22, 23, 24], "{kind:?}: the program's stores");
        assert_eq!((rax, rdx, r8, r9, r10, r11), (12, 0x0708, 0x0808, 0x4242, 0x1010, 0x1111), "{kind:?}: the registers");
        let recs: Vec<_> = record::parse_valued(rig.records()).map(|v| v.expect("whole records")).collect();
        let header = |r: &record::Record| if record::short_word(r.pc, r.info).is_some() { 2 } else { 4 };
        let words: usize = recs.iter().map(|v| header(&v.record) + v.before.len().div_ceil(8) + v.after.len().div_ceil(8)).sum();
        assert_eq!(rig.block.counted as usize, words, "{kind:?}: the copies count the words they write");
        assert_eq!(rig.records().len(), words * 8, "{kind:?}: and write no other");
        assert!(recs.iter().filter(|v| header(&v.record) == 2).count() >= 3, "{kind:?}: most records are short");
        let seen: Vec<(u64, u32, Vec<u8>, Vec<u8>)> =
            recs.iter().map(|v| (v.record.pc - native, v.record.access().len, v.before.to_vec(), v.after.to_vec())).collect();
        let le = |v: u64, n: usize| v.to_le_bytes()[..n].to_vec();
        let ret_to = rig.get(table);
        let bytes16 = |w: [u32; 4]| w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        if kind == record::RecordKind::StoreValues {
            assert_eq!(seen.len(), 5, "{seen:x?}");
            assert_eq!(seen[0], (0, 4, le(0, 4), le(7, 4)), "mov [rdi], eax");
            assert_eq!(seen[1], (2, 4, le(5, 4), le(5, 4)), "add [rdi+4], 0: silent");
            assert_eq!(seen[2], (6, 16, bytes16([1, 2, 3, 4]), bytes16(vector)), "movups");
            assert_eq!((seen[3].0, seen[3].1, &seen[3].3), (10, 8, &le(0x4242, 8)), "push r9");
            let r = recs[4].record;
            assert!(r.is(record::NONE) && r.is(record::RET) && !r.is(record::MORE) && r.extra == ret_to, "ret: {r:x?}");
        } else {
            assert_eq!(seen.len(), 5, "{seen:x?}");
            assert_eq!(seen[0], (2, 4, le(5, 4), vec![]), "add [rdi+4], 0 reads");
            assert_eq!(seen[1], (12, 8, le(0x4242, 8), vec![]), "pop r9");
            assert_eq!(seen[2], (14, 8, le(12, 8), vec![]), "mov rax, [rsi+16]");
            assert_eq!(seen[3], (18, 2, le(0x0708, 2), vec![]), "mov dx, [rsi]");
            assert_eq!(seen[4], (21, 8, le(ret_to, 8), vec![]), "ret reads its return address");
            assert!(recs[4].record.is(record::RET) && recs[4].record.extra == ret_to);
        }
    }
}

#[test]
fn points_map_a_copy_back_to_the_native_instruction() {
    // mov [rdi], eax; mov dword [rip+0x100], 7; call [rax]
    let code = [0x89, 0x07, 0xC7, 0x05, 0x00, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xFF, 0x10];
    let (t, _, out) = translate(&code, Variant::Fast, true);
    let l = listing(&out);
    // The store to [rdi]: its copy ends where a trap would report.
    let st = l.iter().find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.memory_base() == Register::RDI).unwrap();
    let p = t.point_at(st.0 + st.1.len() as u64, true).unwrap();
    assert_eq!((p.pc, p.before, p.next, p.spilled.first()), (NATIVE, false, NATIVE + 2, None));
    // The rewritten RIP-relative store: its spare register is in a slot.
    let rw = l
        .iter()
        .find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Immediate32 && i.memory_displacement64() == 0)
        .unwrap();
    let p = t.point_at(rw.0 + rw.1.len() as u64, true).unwrap();
    assert_eq!(p.pc, NATIVE + 2);
    assert_eq!(p.spilled.first().map(|s| s.1), Some(slots().save_scratch));
    // The indirect call's load of its target: before the call, rax spilled.
    let ld = l
        .iter()
        .find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.memory_base() == Register::RAX && i.op0_register() == Register::RAX)
        .unwrap();
    let p = t.point_at(ld.0 + ld.1.len() as u64, true).unwrap();
    assert_eq!((p.pc, p.before, p.spilled.first()), (NATIVE + 12, true, Some((0, slots().save_rax))));
    // A fault anywhere inside the copied store maps to it.
    assert_eq!(t.point_at(st.0, false).map(|p| p.pc), Some(NATIVE));
}

/// Where the link test's hook aims the jump slot, how often it ran, and
/// the program's rax, rdi, r12 and flags as the hook saw them.
static LINK_TEST: [std::sync::atomic::AtomicU64; 7] = [const { std::sync::atomic::AtomicU64::new(0) }; 7];

/// The link test's hook: changes every register a C function may (and,
/// with AVX, the vector registers' upper halves, as `vzeroupper` in the C
/// library's `memcpy` would), then aims the jump slot at the landing.
extern "C" fn link_test_hook(saved: *const crate::engine::link::Saved) {
    use std::sync::atomic::Ordering::SeqCst;
    // SAFETY: the entry passes the registers it saved on the link stack.
    let r = unsafe { *saved };
    for (i, v) in [r.rax, r.rdi, r.r12, r.flags].into_iter().enumerate() {
        LINK_TEST[3 + i].store(v, SeqCst);
    }
    // SAFETY: changes only registers the C convention lets a callee change.
    unsafe {
        std::arch::asm!(
            "mov rax, -1", "mov rcx, -1", "mov rdx, -1", "mov rsi, -1", "mov rdi, -1",
            "mov r8, -1", "mov r9, -1", "mov r10, -1", "mov r11, -1", "pxor xmm0, xmm0", "xor eax, eax",
            out("rax") _, out("rcx") _, out("rdx") _, out("rsi") _, out("rdi") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("xmm0") _,
        );
        if std::arch::is_x86_feature_detected!("avx") {
            std::arch::asm!("vzeroall", clobber_abi("C"));
        }
    }
    // SAFETY: the test's mapping holds the jump slot at this address.
    unsafe { *(LINK_TEST[0].load(SeqCst) as *mut u64) = LINK_TEST[1].load(SeqCst) };
    LINK_TEST[2].fetch_add(1, SeqCst);
}

/// A copy whose branch target is not in the cache yet, run: its exit goes
/// through the link stub into the engine's entry (`engine::link`), whose
/// hook (the test's) sees the program's registers (callee-saved ones
/// included), runs Rust code that changes every register it may and
/// clears the vector registers, and aims the jump slot at a landing that
/// returns here. The program's registers, flags and vector state come back
/// as it left them, and no trap was needed.
#[test]
fn a_link_through_the_engines_entry_keeps_registers_flags_and_vectors() {
    use std::sync::atomic::Ordering::SeqCst;
    const MAP: usize = 1 << 16;
    // SAFETY: a new private anonymous mapping, checked for failure.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MAP,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let base = base as u64;
    let (data, stub, landing, copy, native) = (base, base + 0x1000, base + 0x1800, base + 0x3000, base + 0x6000);
    // mov [rdi], eax; jmp +0x100 (a block not translated)
    let code: [u8; 7] = [0x89, 0x07, 0xE9, 0x00, 0x01, 0x00, 0x00];
    // SAFETY: the mapping made above.
    let mem = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, MAP) };
    let off = |a: u64| (a - base) as usize;
    mem[off(native)..off(native) + code.len()].copy_from_slice(&code);
    mem[off(landing)] = 0xC3; // ret
    let slots = DataAddrs::at(data);
    let put = |mem: &mut [u8], a: u64, v: u64| mem[off(a)..off(a) + 8].copy_from_slice(&v.to_le_bytes());
    assert!(crate::engine::link::set_hook(link_test_hook), "XSAVE on this machine");
    put(mem, slots.countdown, 1000);
    put(mem, slots.instr_left, 1000);
    put(mem, slots.link_stack, base + MAP as u64 - 64);
    put(mem, slots.link_entry, crate::engine::link::entry());
    LINK_TEST[0].store(slots.jump, SeqCst);
    LINK_TEST[1].store(landing, SeqCst);
    let n = emit_link(&slots, stub, &mut mem[off(stub)..off(stub) + 256]).unwrap();
    assert!(n < 256);
    let mut t = Translator::new();
    let mut host = Code { base: native, bytes: code.to_vec() };
    let env = Env { slots, counted: Counted::Stores, dispatch: stub + 0x400, link: stub };
    let req = TranslateRequest { native, variant: Variant::Fast, at: copy, points: false };
    let b = t.translate(&mut host, &env, req, &mut mem[off(copy)..off(copy) + MAX_BLOCK_BYTES]).unwrap();
    let listed = exits(&mem[off(copy)..off(copy) + b.len as usize]);
    assert!(listed.iter().any(|(_, e)| matches!(e, Exit::Link { native: n, .. } if *n == native + 7 + 0x100)), "{listed:?}");
    let avx = std::arch::is_x86_feature_detected!("avx");
    let mut dst = [0u32; 1];
    let mut vec = [0u64; 4];
    let (rax, rcx, rdx, rsi, r8, r9, r10, r11): (u64, u64, u64, u64, u64, u64, u64, u64);
    let cf: u8;
    // SAFETY: the copy stores eax at dst[0] and leaves through the link
    // stub to the landing, which returns here; every register it could
    // change is an output or clobbered.
    unsafe {
        std::arch::asm!(
            "pcmpeqd xmm0, xmm0",
            "test {avx:e}, {avx:e}",
            "jz 3f",
            "vpcmpeqd ymm0, ymm0, ymm0",
            "3:",
            "stc",
            "call {copy}",
            "setc bl",
            "test {avx:e}, {avx:e}",
            "jz 4f",
            "vmovdqu [{vec}], ymm0",
            "jmp 5f",
            "4:",
            "movdqu [{vec}], xmm0",
            "5:",
            avx = in(reg) avx as u32,
            copy = in(reg) copy,
            vec = in(reg) vec.as_mut_ptr(),
            out("bl") cf,
            in("rdi") dst.as_mut_ptr(),
            inout("rax") 7u64 => rax,
            inout("rcx") 0x0c0cu64 => rcx,
            inout("rdx") 0x0d0du64 => rdx,
            inout("rsi") 0x0505u64 => rsi,
            inout("r8") 0x0808u64 => r8,
            inout("r9") 0x0909u64 => r9,
            inout("r10") 0x1010u64 => r10,
            inout("r11") 0x1111u64 => r11,
            inout("r12") 0x1212u64 => _,
            clobber_abi("C"),
        );
    }
    crate::engine::link::clear_hook();
    assert_eq!(LINK_TEST[2].load(SeqCst), 1, "the hook ran once");
    assert_eq!(dst[0], 7, "the copy ran");
    assert_eq!((rax, rcx, rdx, rsi, r8, r9, r10, r11), (7, 0x0c0c, 0x0d0d, 0x0505, 0x0808, 0x0909, 0x1010, 0x1111), "registers");
    assert_eq!(cf, 1, "the carry flag");
    let seen: Vec<u64> = LINK_TEST[3..].iter().map(|v| v.load(SeqCst)).collect();
    assert_eq!(&seen[..3], &[7, dst.as_ptr() as u64, 0x1212], "the registers the hook saw: rax, rdi, r12");
    assert_eq!(seen[3] & 1, 1, "the carry flag the hook saw");
    let lanes = if avx { 4 } else { 2 };
    assert!(vec[..lanes].iter().all(|&v| v == u64::MAX), "the vector register: {vec:x?}");
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(base as *mut libc::c_void, MAP) };
}

/// A value craft's recording code for wide stores is long: a run of 32
/// 64-byte stores is cut into blocks that each fit a copy's room (one that
/// did not would flush the cache and leave the window, every time).
#[test]
fn wide_value_records_end_a_block_before_it_outgrows_its_room() {
    let mut code = Vec::new();
    let mut enc = iced_x86::Encoder::new(64);
    for k in 0..32 {
        let store = Instruction::with2(
            iced_x86::Code::EVEX_Vmovdqu64_zmmm512_k1z_zmm,
            iced_x86::MemoryOperand::with_base_displ(Register::RDI, 64 * k),
            Register::ZMM0,
        )
        .unwrap();
        enc.encode(&store, NATIVE + code.len() as u64).unwrap();
        code.extend(enc.take_buffer());
    }
    code.push(0xC3);
    for kind in [record::RecordKind::StoreValues, record::RecordKind::LoadValues, record::RecordKind::Addresses] {
        for variant in [Variant::Fast, Variant::Slow] {
            let mut t = Translator::new();
            let mut host = Code { base: NATIVE, bytes: code.clone() };
            let mut out = vec![0u8; MAX_BLOCK_BYTES];
            let env = Env { slots: slots(), counted: Counted::Records(kind), dispatch: CACHE - 0x800, link: 0 };
            let b = t.translate(&mut host, &env, TranslateRequest { native: NATIVE, variant, at: CACHE, points: false }, &mut out);
            let b = b.unwrap_or_else(|e| panic!("{kind:?} {variant:?}: {e:?}"));
            assert!(b.insns >= 8, "{kind:?} {variant:?}: {} instructions", b.insns);
            if kind == record::RecordKind::StoreValues {
                assert!(b.insns < 32, "cut: {} instructions in {} bytes", b.insns, b.len);
            }
        }
    }
}
