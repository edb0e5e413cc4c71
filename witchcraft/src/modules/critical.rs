//! Restartable sequences' critical sections: code that must run from its
//! own addresses.
//!
//! A thread in a critical section (`rseq(2)`) has told the kernel, through
//! its rseq area, a descriptor: the section's first instruction, its length
//! and an abort address. When the thread is preempted, migrated or
//! signalled with its PC inside `[start, start + length)`, the kernel moves
//! the PC to the abort address, and the section starts over; with the PC
//! anywhere else, the kernel only forgets the descriptor. A copy of the
//! section run from the code cache is anywhere else: it would go on after
//! a preemption as if nothing had happened, and a per-CPU structure
//! (tcmalloc's caches, librseq's counters and lists) would lose updates.
//! So the cache never runs a section: a window ends before one, and the
//! exact mode runs it natively to its end.
//!
//! The sections are found as the debuggers and translators that know them
//! find them: librseq and tcmalloc put each descriptor (`struct rseq_cs`:
//! version and flags as two 32-bit words, then the start, the length and
//! the abort address as 64-bit words; 32 bytes aligned on 32) in a section
//! named `__rseq_cs`. A descriptor built anywhere else is not seen (the
//! usage document says so).

use object::{Object, ObjectSection, RelocationFlags};

/// One critical section, at its runtime addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Section {
    /// Its first instruction.
    pub first: u64,
    /// Past its last instruction: where a committed section comes out.
    pub past: u64,
    /// Where the kernel sends a thread it interrupted in the section.
    pub abort: u64,
}

/// The section that holds the descriptors.
const SECTION: &str = "__rseq_cs";
/// One descriptor's size and alignment.
const DESCRIPTOR: usize = 32;
/// The longest section believed (a descriptor is a few instructions).
const MOST_LEN: u64 = 1 << 16;

/// The critical sections of a module's file loaded at `bias`, whose first
/// instruction is in `[start, end)`, sorted. The addresses are the file's, relocated as the
/// loader does (`R_X86_64_RELATIVE`'s addend, where the linker left the
/// word for the loader to fill), so nothing is read from the process.
pub(super) fn sections(file: &object::File, bias: u64, start: u64, end: u64) -> Vec<Section> {
    let Some(sect) = file.section_by_name(SECTION) else { return Vec::new() };
    let Ok(data) = sect.data() else { return Vec::new() };
    let base = sect.address();
    // Words of the section the loader relocates, by their link-time
    // address: the addend is what the word holds once loaded, before the
    // bias.
    let size = sect.size();
    let relocated: Vec<(u64, u64)> = file
        .dynamic_relocations()
        .into_iter()
        .flatten()
        .filter(|(offset, r)| {
            offset.wrapping_sub(base) < size
                && matches!(r.flags(), RelocationFlags::Elf { r_type } if r_type == object::elf::R_X86_64_RELATIVE)
        })
        .map(|(offset, r)| (offset, r.addend() as u64))
        .collect();
    let relocated = |at: u64| relocated.iter().find(|&&(o, _)| o == at).map(|&(_, a)| a);
    let word = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
    let pie = file.kind() == object::ObjectKind::Dynamic;
    let mut out = Vec::new();
    for (i, d) in data.chunks_exact(DESCRIPTOR).enumerate() {
        let version = u32::from_le_bytes(d[0..4].try_into().unwrap_or_default());
        let len = word(d, 16);
        if version != 0 || len == 0 || len > MOST_LEN {
            continue;
        }
        let at = base + (i * DESCRIPTOR) as u64;
        // A word as loaded: the loader's addend where it relocates it,
        // else what the file holds (an executable's absolute address, or
        // a word the linker filled); runtime addresses of a shared object
        // or a position-independent executable add the bias.
        let address = |o: usize| match relocated(at + o as u64).unwrap_or(word(d, o)) {
            0 => None,
            a if pie => Some(a.wrapping_add(bias)),
            a => Some(a),
        };
        let (Some(first), Some(abort)) = (address(8), address(24)) else { continue };
        if first >= start && first < end {
            out.push(Section { first, past: first + len, abort });
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl super::LoadedModule {
    /// [`super::ProcessMap::critical_section`], for `pc` in this module.
    /// Async-signal-safe.
    pub fn critical_section(&self, pc: u64) -> Option<Section> {
        if self.critical.is_empty() {
            return None;
        }
        reaching(&self.critical, pc, crate::sys::mem::read_own)
    }
}

/// The critical sections of any process's modules, sorted, from its
/// /proc/PID/maps text (the single-stepping exact mode, which must not
/// step through them).
pub fn in_process(maps: &str) -> Vec<Section> {
    let mut out: Vec<Section> = super::code_mappings(maps)
        .iter()
        .filter_map(|m| {
            let fm = super::FileMap::open(&m.path)?;
            let file = object::File::parse(fm.bytes()).ok()?;
            Some(sections(&file, super::bias_of(&file, m)?, m.start, m.end))
        })
        .flatten()
        .collect();
    out.sort_unstable();
    out
}

/// The section of `sorted` (from [`sections`]) that holds `pc`.
/// Async-signal-safe.
pub fn holding(sorted: &[Section], pc: u64) -> Option<Section> {
    let i = sorted.partition_point(|s| s.first <= pc);
    // Sections may nest or overlap in principle: look back past the
    // nearest start (at most a few).
    sorted[..i].iter().rev().take(8).find(|s| pc < s.past).copied()
}

/// How far before a section [`reaching`] looks for the code that enters
/// it (the store of the descriptor's address into the thread's rseq area,
/// a few instructions at most).
pub const LOOKAHEAD: usize = 128;

/// The section that holds `pc`, or that the code at `pc` runs into
/// without a branch within [`LOOKAHEAD`] bytes (read with `read`, which
/// fills its buffer from an address or says it could not). Code that
/// enters a section must not stop on the way either: a thread that stops
/// between storing the section's descriptor and its first instruction (a
/// trap, a signal, a ptrace stop) has the descriptor forgotten by the
/// kernel, which finds its PC outside the section, and runs the section
/// unprotected; one that stops at the first instruction has the section
/// aborted when it goes on, every time. Async-signal-safe.
pub fn reaching(sorted: &[Section], pc: u64, read: impl FnOnce(u64, &mut [u8]) -> bool) -> Option<Section> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    if let Some(s) = holding(sorted, pc) {
        return Some(s);
    }
    let s = *sorted.get(sorted.partition_point(|s| s.first <= pc))?;
    let len = (s.first - pc) as usize;
    let mut code = [0u8; LOOKAHEAD];
    if len > LOOKAHEAD || !read(pc, &mut code[..len]) {
        return None;
    }
    let mut dec = Decoder::with_ip(64, &code[..len], pc, DecoderOptions::NONE);
    while dec.can_decode() {
        let i = dec.decode();
        if i.is_invalid() || i.flow_control() != FlowControl::Next {
            return None;
        }
    }
    // Instruction by instruction, exactly to the section's first.
    (dec.ip() == s.first).then_some(s)
}

/// Most places a section leaves by that [`exits`] gives: the debug
/// registers a thread has.
pub const MOST_EXITS: usize = 4;

/// Where a thread in `s` can come out of it, from its code (`code`, the
/// bytes at `s.first`, at least up to `s.past`): past its end, its abort
/// address, and each branch target outside it. None if there are more
/// than [`MOST_EXITS`], or the code has an indirect branch or a return
/// (which could go anywhere) or cannot be decoded.
pub fn exits(s: &Section, code: &[u8]) -> Option<([u64; MOST_EXITS], usize)> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let mut out = [0u64; MOST_EXITS];
    let mut n = 0;
    let mut add = |a: u64| {
        if out[..n].contains(&a) {
            return true;
        }
        if n == MOST_EXITS {
            return false;
        }
        out[n] = a;
        n += 1;
        true
    };
    if !add(s.past) || !add(s.abort) {
        return None;
    }
    let len = (s.past - s.first) as usize;
    let mut dec = Decoder::with_ip(64, code.get(..len)?, s.first, DecoderOptions::NONE);
    while dec.can_decode() {
        let i = dec.decode();
        match i.flow_control() {
            _ if i.is_invalid() => return None,
            FlowControl::Next | FlowControl::Call => {}
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                let t = i.near_branch_target();
                if !(s.first..s.past).contains(&t) && !add(t) {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some((out, n))
}

#[cfg(test)]
mod tests {
    use super::{exits, holding, reaching, Section};

    fn sect(first: u64, past: u64) -> Section {
        Section { first, past, abort: 0x9000 }
    }

    #[test]
    fn a_pc_is_held_by_the_section_around_it_and_by_no_other() {
        let s = [sect(0x1000, 0x1010), sect(0x1008, 0x1100), sect(0x2000, 0x2004)];
        assert_eq!(holding(&s, 0xfff), None);
        assert_eq!(holding(&s, 0x1000), Some(s[0]));
        assert_eq!(holding(&s, 0x1012), Some(s[1]));
        assert_eq!(holding(&s, 0x1100), None, "the end is past the section (the post-commit address)");
        assert_eq!(holding(&s, 0x2003), Some(s[2]));
        assert_eq!(holding(&s, 0x2004), None);
        assert_eq!(holding(&[], 0x2004), None);
    }

    #[test]
    fn code_that_runs_straight_into_a_section_is_part_of_it() {
        // lea rax, [rip+0x10]; mov fs:[rbx+8], rax; then the section.
        let entry = [0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00, 0x64, 0x48, 0x89, 0x43, 0x08];
        let s = [Section { first: 0x1000 + entry.len() as u64, past: 0x1020, abort: 0x9000 }];
        let read = |at: u64, out: &mut [u8]| {
            let o = (at - 0x1000) as usize;
            out.copy_from_slice(&entry[o..o + out.len()]);
            true
        };
        assert_eq!(reaching(&s, 0x1000, read), Some(s[0]));
        assert_eq!(reaching(&s, 0x1007, read), Some(s[0]), "from the store");
        assert_eq!(reaching(&s, 0x1010, read), Some(s[0]), "inside");
        assert_eq!(reaching(&s, 0x1020, read), None, "past it");
        // Code unreadable, or not instruction by instruction to its start
        // (a nop, then a `mov eax, imm32` across the section's first byte).
        assert_eq!(reaching(&s, 0x1000, |_, _| false), None);
        let across = [Section { first: 0x1002, past: 0x1010, abort: 0x9000 }];
        assert_eq!(
            reaching(&across, 0x1000, |_, out: &mut [u8]| {
                out.copy_from_slice(&[0x90, 0xb8][..out.len()]);
                true
            }),
            None
        );
        // A branch on the way: the thread may go elsewhere.
        let jumps = [0x74, 0x02, 0x90, 0x90];
        let s2 = [Section { first: 0x2004, past: 0x2010, abort: 0x9000 }];
        let read2 = |at: u64, out: &mut [u8]| {
            let o = (at - 0x2000) as usize;
            out.copy_from_slice(&jumps[o..o + out.len()]);
            true
        };
        assert_eq!(reaching(&s2, 0x2000, read2), None);
        assert_eq!(reaching(&s2, 0x2002, read2), Some(s2[0]));
        // Too far before it.
        assert_eq!(reaching(&[Section { first: 0x3000 + 4096, ..s2[0] }], 0x3000, read2), None);
    }

    #[test]
    fn a_section_comes_out_past_its_end_at_its_abort_and_where_it_branches_out() {
        // cmp eax, 1; jne +0x20 (out); mov rcx, [rdx]; jmp -7 (in: the mov)
        // ; mov [rdx], rcx
        let code = [0x83, 0xf8, 0x01, 0x75, 0x20, 0x48, 0x8b, 0x0a, 0xeb, 0xfb, 0x48, 0x89, 0x0a];
        let s = Section { first: 0x1000, past: 0x1000 + code.len() as u64, abort: 0x9000 };
        let (e, n) = exits(&s, &code).expect("three exits");
        assert_eq!(&e[..n], &[s.past, 0x9000, 0x1005 + 0x20]);
        // A return could go anywhere.
        assert_eq!(exits(&Section { past: 0x1001, ..s }, &[0xc3]), None);
        // Five places out are more than the debug registers.
        let five = [0x74, 0x10, 0x74, 0x20, 0x74, 0x30];
        assert_eq!(exits(&Section { past: 0x1006, ..s }, &five), None);
        // The code must reach the end.
        assert_eq!(exits(&s, &code[..4]), None);
    }
}
