//! Where the parts of a thread's code cache lie in its one mapping.

use crate::x86::translate;

/// Entries of the dispatch table (16 bytes each).
pub(super) const DISPATCH_ENTRIES: u32 = 8192;

pub(super) const PAGE: usize = 4096;
pub(super) const DATA_AT: usize = 0;
pub(super) const DISPATCH_AT: usize = PAGE;
// The data page holds the copies' slots.
const _: () = assert!(std::mem::size_of::<translate::Data>() <= DISPATCH_AT - DATA_AT);
pub(super) const INDEX_AT: usize = DISPATCH_AT + DISPATCH_ENTRIES as usize * 16;
const LINK_STACK_BYTES: usize = 64 * 1024;

/// Where the parts of a cache's mapping lie: the data page, the dispatch
/// table, the index (24 bytes an entry, at most half used), the copies'
/// records (24 bytes each, as many as index entries), the dispatch stub,
/// the link stub, the partial-`rep` area, the picked instruction's area
/// (its copy alone, for a pick taken without a trap), scratch for translating a block
/// again (for its points), the copies, then the link stack's guard page
/// and the stack (touched only as deep as the engine's link path goes: the
/// translator, the agent's lookup of the thread, the processor's extended
/// state saved on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) entries: usize,
    pub(super) code_bytes: usize,
}

impl Layout {
    /// For burst windows: a few thousand instructions at a time, where the
    /// ticks land.
    pub(super) const WINDOWS: Layout = Layout { entries: 8192, code_bytes: 768 * 1024 };
    /// For the exact mode's recording threads, which run all of a
    /// program's code from the cache, in copies several times the size of
    /// the native code: a database engine's working set emptied the
    /// windows' cache again and again, and translating took most of its
    /// run (`sqlite 40 200`: 390 times native). The mapping is reserved,
    /// not committed: a thread pays for the pages its copies touch.
    pub(super) const RECORDING: Layout = Layout { entries: 65536, code_bytes: 16 << 20 };

    /// The layout for a thread that records (the exact mode) or not.
    pub(super) fn of(recording: bool) -> Layout {
        if recording {
            Layout::RECORDING
        } else {
            Layout::WINDOWS
        }
    }

    pub(super) fn records_at(self) -> usize {
        INDEX_AT + self.entries * 24
    }
    pub(super) fn stubs_at(self) -> usize {
        self.records_at() + self.entries * 24
    }
    pub(super) fn link_at(self) -> usize {
        self.stubs_at() + 256
    }
    pub(super) fn rep_at(self) -> usize {
        self.stubs_at() + 512
    }
    pub(super) fn step_at(self) -> usize {
        self.stubs_at() + 1024
    }
    pub(super) fn scratch_at(self) -> usize {
        self.stubs_at() + 1536
    }
    pub(super) fn code_at(self) -> usize {
        self.scratch_at() + translate::MAX_BLOCK_BYTES + PAGE
    }
    pub(super) fn guard_at(self) -> usize {
        (self.code_at() + self.code_bytes).next_multiple_of(PAGE)
    }
    /// The whole mapping.
    pub(super) fn bytes(self) -> usize {
        self.guard_at() + PAGE + LINK_STACK_BYTES
    }
}
