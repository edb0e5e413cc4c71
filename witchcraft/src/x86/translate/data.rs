//! The data page of a code cache: what the copies read and write besides
//! the program's memory. One list of its fields makes both views of it:
//! [`Data`], the page itself as the engine reads and writes it, and
//! [`DataAddrs`], the absolute address of each field, which the translator
//! aims the copies' RIP-relative operands at.

/// Defines [`Data`] and [`DataAddrs`] from one list of fields, so the two
/// cannot disagree on a field or its place.
macro_rules! data_page {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)*) => {
        /// The data page (the first page of a cache's mapping).
        #[repr(C)]
        #[derive(Default)]
        pub struct Data {
            $($(#[$doc])* pub $name: $ty,)*
        }

        /// The data page's fields as absolute addresses (within ±2 GiB of
        /// every copy, so copies address them RIP-relatively without a
        /// register).
        #[derive(Clone, Copy, Debug, Default)]
        pub struct DataAddrs {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl DataAddrs {
            /// The field addresses of a data page at `page`.
            pub fn at(page: u64) -> DataAddrs {
                DataAddrs { $($name: page + std::mem::offset_of!(Data, $name) as u64,)* }
            }
        }
    };
}

data_page! {
    /// Counted accesses until the pick: the pick is the countdown-th.
    countdown: i64,
    /// Instructions left in the window.
    instr_left: i64,
    save_rax: u64,
    save_rcx: u64,
    save_scratch: u64,
    save_flags: u64,
    /// The native target of an indirect branch, for the dispatch stub.
    target: u64,
    /// Where the dispatch stub jumps (a copy's address).
    jump: u64,
    /// The address of the dispatch table (a slot holding a pointer).
    table: u64,
    /// A partial `rep`: the instruction, and the elements it leaves for later.
    rep_native: u64,
    rep_rest: u64,
    rep_len: u64,
    /// After the part: step the next element as a pick (1), or go on (0).
    rep_pick: u64,
    /// Recording copies ([`super::Counted::Records`]): where the next
    /// access record goes, three spill slots, and the thread's FS and GS
    /// bases (for operands with a segment override).
    rec_ptr: u64,
    save_rec_a: u64,
    save_rec_b: u64,
    save_rec_c: u64,
    fs_base: u64,
    gs_base: u64,
    /// A native call ([`super::native_call`]): the stack pointer while the
    /// thread is away in the function (0: it is not).
    away_sp: u64,
    /// The link stub ([`super::emit_link`]): where it keeps the program's
    /// stack pointer, the top of the stack it switches to, and a slot
    /// holding the address of the engine's entry it calls.
    save_rsp: u64,
    link_stack: u64,
    link_entry: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each slot is its field's address: distinct, 8-byte words, in the
    /// page's order, the page's size apart at most.
    #[test]
    fn slots_are_the_fields_addresses() {
        let page = 0x7f00_0000_0000u64;
        let s = DataAddrs::at(page);
        assert_eq!(s.countdown, page);
        assert_eq!(s.instr_left, page + 8);
        assert_eq!(s.link_entry, page + std::mem::size_of::<Data>() as u64 - 8);
        let d = Data { rec_ptr: 7, ..Default::default() };
        let base = &d as *const Data as u64;
        // SAFETY: the slot is the field's offset within `d`.
        let read = unsafe { *((DataAddrs::at(base).rec_ptr) as *const u64) };
        assert_eq!(read, 7);
    }
}
