//! PMU sampler backend: precise memory-access events that report the data
//! address (Intel PEBS `mem-loads`/`mem-stores`/`MEM_INST_RETIRED.*`, AMD IBS
//! op sampling), found through sysfs and read from a perf mmap ring buffer.
//!
//! Machines without such events (most VMs) make [`discover`] fail with a
//! message starting with "no PMU:"; the engine then samples with task-clock.

mod discover;
mod ring;

pub use discover::{discover, parse_event};
pub use ring::{parse_sample, OpenError, PmuRecord, PmuSampler};

use crate::sys::perf::Attr;
use perf_event_open_sys::bindings::{self as b, perf_event_attr};

/// Where the kernel lists PMUs.
pub const SYSFS_PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// Data pages of the ring (a power of two). One page is plenty because the
/// signal handler drains after every sample (`wakeup_events = 1`), and small
/// rings stay inside the free `perf_event_mlock_kb` allowance with many threads.
pub const RING_DATA_PAGES: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    Load,
    Store,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PmuEvent {
    pub name: String,
    pub pmu_type: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub precise_ip: u8,
    pub kind: AccessKind,
    /// AMD IBS op sampling: samples every op, so the kind is decoded per record.
    pub ibs: bool,
}

// ---------------------------------------------------------------------------
// perf_event_attr

/// The attribute for sampling `ev` every `period` events, with no signal of
/// its own (the caller routes it with F_SETSIG, or adds `sigtrap`).
#[allow(clippy::field_reassign_with_default)] // union fields go through Deref
pub fn attr(ev: &PmuEvent, period: u64) -> Attr {
    let mut a = perf_event_attr::default();
    a.type_ = ev.pmu_type;
    a.size = std::mem::size_of::<perf_event_attr>() as u32;
    a.config = ev.config;
    a.config1 = ev.config1;
    a.config2 = ev.config2;
    a.sample_period = if ev.ibs {
        // IBS rejects periods with the low nibble set; the minimum is 16.
        period.max(16).saturating_add(15) & !15
    } else {
        period.max(1)
    };
    a.sample_type = (b::PERF_SAMPLE_IP | b::PERF_SAMPLE_TID | b::PERF_SAMPLE_ADDR) as u64;
    if ev.ibs {
        a.sample_type |= b::PERF_SAMPLE_RAW as u64;
    }
    a.wakeup_events = 1;
    a.set_disabled(0);
    // Kernels without IBS swfilt (config2 bit 0) reject any exclude_* on
    // ibs_op with EINVAL; there we sample all modes (needs CAP_PERFMON or
    // paranoid <= 1) and parse_sample drops kernel samples.
    if !(ev.ibs && ev.config2 & 1 == 0) {
        a.set_exclude_kernel(1);
        a.set_exclude_hv(1);
    }
    a.set_precise_ip(ev.precise_ip as u64);
    Attr::from_raw(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_bits() {
        let ev = PmuEvent {
            name: "cpu/mem-stores/".into(),
            pmu_type: 4,
            config: 0x82d0,
            config1: 0,
            config2: 0,
            precise_ip: 2,
            kind: AccessKind::Store,
            ibs: false,
        };
        let a = *attr(&ev, 10007).sigtrap(0xabc).raw();
        assert_eq!(a.size as usize, std::mem::size_of::<perf_event_attr>());
        assert_eq!((a.type_, a.config, a.sample_period, a.wakeup_events), (4, 0x82d0, 10007, 1));
        assert_eq!(a.sample_type, (b::PERF_SAMPLE_IP | b::PERF_SAMPLE_TID | b::PERF_SAMPLE_ADDR) as u64);
        assert_eq!((a.exclude_kernel(), a.exclude_hv(), a.disabled(), a.precise_ip()), (1, 1, 0, 2));
        assert_eq!((a.sigtrap(), a.remove_on_exec(), a.sig_data), (1, 1, 0xabc));
        let a = *attr(&ev, 10007).raw();
        assert_eq!((a.sigtrap(), a.remove_on_exec(), a.sig_data), (0, 0, 0));
    }
}
