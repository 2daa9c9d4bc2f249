//! Metrics derived from allocator state; nothing here mutates it. Names follow
//! design §6 everywhere (screen, JSON, exports, Prometheus).

use serde::Serialize;

use crate::alloc::{BlockState, DeviceStats, Kind, SegmentInfo};

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Fragmentation {
    /// reserved − allocated, now (PyTorch's OOM message's "reserved but unallocated").
    pub reserved_unallocated_bytes: u64,
    /// Free bytes inside segments that also hold live blocks: `empty_cache` cannot release them.
    pub inactive_split_bytes: u64,
    /// 1 − largest free block / total free, now (0 when nothing is free).
    pub external_fragmentation: f64,
    /// allocated − requested, now.
    pub rounding_waste_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub free_bytes: u64,
}

/// 1 − peak allocated / peak reserved, each at its own peak (GMLake's ratio).
pub fn peak_ratio(stats: &DeviceStats) -> f64 {
    let a = stats.get(Kind::AllocatedBytes, 0).peak as f64;
    let r = stats.get(Kind::ReservedBytes, 0).peak as f64;
    if r <= 0.0 {
        0.0
    } else {
        1.0 - a / r
    }
}

pub fn fragmentation(stats: &DeviceStats, segments: &[SegmentInfo]) -> Fragmentation {
    let cur = |k| stats.get(k, 0).current.max(0) as u64;
    let (mut largest, mut free) = (0u64, 0u64);
    for b in segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Inactive) {
        largest = largest.max(b.size);
        free += b.size;
    }
    Fragmentation {
        reserved_unallocated_bytes: cur(Kind::ReservedBytes).saturating_sub(cur(Kind::AllocatedBytes)),
        inactive_split_bytes: cur(Kind::InactiveSplitBytes),
        external_fragmentation: if free == 0 { 0.0 } else { 1.0 - largest as f64 / free as f64 },
        rounding_waste_bytes: cur(Kind::AllocatedBytes).saturating_sub(cur(Kind::RequestedBytes)),
        largest_free_block_bytes: largest,
        free_bytes: free,
    }
}

/// One log2 bucket of the block-size histogram: sizes in `(lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SizeBucket {
    pub hi: u64,
    pub allocated_count: u64,
    pub allocated_bytes: u64,
    pub free_count: u64,
    pub free_bytes: u64,
}

/// Block sizes in log2 buckets (512 B up), allocated (and pending) versus free.
pub fn size_histogram(segments: &[SegmentInfo]) -> Vec<SizeBucket> {
    let mut buckets: Vec<SizeBucket> = Vec::new();
    for b in segments.iter().flat_map(|s| &s.blocks) {
        let i = (64 - (b.size.max(512) - 1).leading_zeros()).saturating_sub(9) as usize;
        if buckets.len() <= i {
            let n = buckets.len();
            buckets.extend((n..=i).map(|k| SizeBucket { hi: 512u64 << k, ..Default::default() }));
        }
        let bk = &mut buckets[i];
        if b.state == BlockState::Inactive {
            bk.free_count += 1;
            bk.free_bytes += b.size;
        } else {
            bk.allocated_count += 1;
            bk.allocated_bytes += b.size;
        }
    }
    buckets
}

/// Bytes in human units as PyTorch's `memory_summary()` prints them.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocatorConfig, CachingAllocator};
    use crate::device::Sim;

    #[test]
    fn figures_from_a_split_segment() {
        let mut a = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
        let x = a.malloc(5 << 20, 0).unwrap();
        let y = a.malloc(3 << 20, 0).unwrap();
        a.free(x).unwrap();
        let _ = y;
        // One 20 MiB segment: [5 MiB free][3 MiB alloc][12 MiB free].
        let f = fragmentation(a.stats(), &a.snapshot());
        assert_eq!(f.reserved_unallocated_bytes, 17 << 20);
        assert_eq!(f.inactive_split_bytes, 17 << 20);
        assert_eq!(f.largest_free_block_bytes, 12 << 20);
        assert_eq!(f.free_bytes, 17 << 20);
        assert!((f.external_fragmentation - (1.0 - 12.0 / 17.0)).abs() < 1e-12);
        assert_eq!(f.rounding_waste_bytes, 0);
        assert!((peak_ratio(a.stats()) - (1.0 - 8.0 / 20.0)).abs() < 1e-12);
        let h = size_histogram(&a.snapshot());
        let b3 = h.iter().find(|b| b.hi == 4 << 20).unwrap();
        assert_eq!((b3.allocated_count, b3.allocated_bytes), (1, 3 << 20));
        let b5 = h.iter().find(|b| b.hi == 8 << 20).unwrap();
        assert_eq!((b5.free_count, b5.free_bytes), (1, 5 << 20));
        assert_eq!(human_bytes(17 << 20), "17.00 MiB");
    }
}
