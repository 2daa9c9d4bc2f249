//! `memory_stats()` counters with PyTorch's exact key names (docs/design/pytorch-allocator.md §10),
//! with the keys each later release added (docs/design/pytorch-allocator.md, "Releases").

use std::collections::BTreeMap;

use super::release::Release;

/// One PyTorch `Stat`: `increase` raises current, peak and allocated;
/// `decrease` lowers current and raises freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub(crate) allocated: i64,
    pub(crate) freed: i64,
}

impl Stat {
    #[inline]
    pub(crate) fn increase(&mut self, n: i64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }
    #[inline]
    pub(crate) fn decrease(&mut self, n: i64) {
        self.current -= n;
        self.freed += n;
    }
}

/// Index into a `StatArray`.
pub(crate) const ALL: usize = 0;
pub(crate) const SMALL_POOL: usize = 1;
pub(crate) const LARGE_POOL: usize = 2;
pub(crate) const POOL_NAMES: [&str; 3] = ["all", "small_pool", "large_pool"];

/// The nine stat arrays, in the order of their names in `ARRAY_NAMES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Kind {
    Allocation = 0,
    Segment,
    Active,
    InactiveSplit,
    AllocatedBytes,
    ReservedBytes,
    ActiveBytes,
    InactiveSplitBytes,
    RequestedBytes,
}

const KINDS: [Kind; 9] = [
    Kind::Allocation,
    Kind::Segment,
    Kind::Active,
    Kind::InactiveSplit,
    Kind::AllocatedBytes,
    Kind::ReservedBytes,
    Kind::ActiveBytes,
    Kind::InactiveSplitBytes,
    Kind::RequestedBytes,
];

pub(crate) const ARRAY_NAMES: [&str; 9] = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
];

const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Per kind, the small and the large pool. `all` is their sum, except
    /// its peak, which is tracked on its own (it is not the sum of peaks).
    pools: [[Stat; 2]; 9],
    all_peak: [i64; 9],
    pub(crate) oversize_allocations: Stat,
    pub(crate) oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub(crate) num_device_free: i64,
    /// 2.12+: allocations `throw_on_cudamalloc_oom` refused.
    pub num_oom_rejections: i64,
    /// 2.13+: `reserved_bytes_by_private_pools`, per private pool id: all,
    /// small and large pool, each its own `Stat` as PyTorch keeps them.
    pub(crate) private_pool_reserved: BTreeMap<(u64, u64), [Stat; 3]>,
}

impl DeviceStats {
    /// One entry of a stat array: `pool` is ALL, SMALL_POOL or LARGE_POOL.
    #[inline]
    pub fn get(&self, kind: Kind, pool: usize) -> Stat {
        let [s, l] = &self.pools[kind as usize];
        match pool {
            ALL => Stat {
                current: s.current + l.current,
                peak: self.all_peak[kind as usize],
                allocated: s.allocated + l.allocated,
                freed: s.freed + l.freed,
            },
            SMALL_POOL => *s,
            _ => *l,
        }
    }
    /// Increases `all` and the pool's entry (`pool` is SMALL_POOL or LARGE_POOL).
    #[inline]
    pub(crate) fn increase(&mut self, kind: Kind, pool: usize, n: i64) {
        let k = kind as usize;
        self.pools[k][pool - 1].increase(n);
        let all = self.pools[k][0].current + self.pools[k][1].current;
        self.all_peak[k] = self.all_peak[k].max(all);
    }
    #[inline]
    pub(crate) fn decrease(&mut self, kind: Kind, pool: usize, n: i64) {
        self.pools[kind as usize][pool - 1].decrease(n);
    }
    /// Signed change: increase for n > 0, decrease for n < 0 (as PyTorch's
    /// `free_block` applies its net inactive-split change).
    #[inline]
    pub(crate) fn change(&mut self, kind: Kind, pool: usize, n: i64) {
        if n > 0 {
            self.increase(kind, pool, n)
        } else if n < 0 {
            self.decrease(kind, pool, -n)
        }
    }

    /// A private pool's reserved bytes change by `n` (`pool` is SMALL_POOL
    /// or LARGE_POOL).
    pub(crate) fn change_private_reserved(&mut self, id: (u64, u64), pool: usize, n: i64) {
        let arr = self.private_pool_reserved.entry(id).or_default();
        for i in [ALL, pool] {
            if n >= 0 {
                arr[i].increase(n);
            } else {
                arr[i].decrease(-n);
            }
        }
    }

    /// `torch.cuda.memory_stats()` as a map: `flat_for(release)` and, as
    /// PyTorch 2.11 adds, the config's `max_split_size` (-1 when unlimited).
    pub(crate) fn memory_stats(&self, conf: &super::AllocatorConfig, release: Release) -> BTreeMap<String, i64> {
        let mut m: BTreeMap<String, i64> = self.flat_for(release).into_iter().collect();
        let mss = conf.max_split_size;
        m.insert("max_split_size".into(), if mss == super::config::UNLIMITED { -1 } else { mss as i64 });
        m
    }

    /// `torch.cuda.memory_stats()` as `release` returns it, sorted by key:
    /// 2.11's 121 entries, `num_oom_rejections` from 2.12 and the private
    /// pools' reserved bytes from 2.13.
    pub(crate) fn flat_for(&self, release: Release) -> Vec<(String, i64)> {
        let mut out = self.flat();
        if release.has_oom_rejections() {
            out.push(("num_oom_rejections".into(), self.num_oom_rejections));
        }
        if release.has_private_pool_stats() {
            for (&(a, b), arr) in &self.private_pool_reserved {
                for (pi, pool) in POOL_NAMES.iter().enumerate() {
                    push_stat(&mut out, &format!("reserved_bytes_by_private_pools.{a}_{b}.{pool}"), &arr[pi]);
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// All 121 `torch.cuda.memory_stats()` entries of 2.11, sorted by key as PyTorch returns them.
    pub(crate) fn flat(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(121);
        for (kind, name) in KINDS.iter().zip(ARRAY_NAMES) {
            for (pi, pool) in POOL_NAMES.iter().enumerate() {
                push_stat(&mut out, &format!("{name}.{pool}"), &self.get(*kind, pi));
            }
        }
        push_stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        push_stat(&mut out, "oversize_segments", &self.oversize_segments);
        out.push(("num_alloc_retries".into(), self.num_alloc_retries));
        out.push(("num_ooms".into(), self.num_ooms));
        out.push(("num_sync_all_streams".into(), self.num_sync_all_streams));
        out.push(("num_device_alloc".into(), self.num_device_alloc));
        out.push(("num_device_free".into(), self.num_device_free));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// One value by its PyTorch key, e.g. `"reserved_bytes.all.peak"`.
    pub fn value(&self, key: &str) -> Option<i64> {
        match key {
            "num_alloc_retries" => return Some(self.num_alloc_retries),
            "num_ooms" => return Some(self.num_ooms),
            "num_sync_all_streams" => return Some(self.num_sync_all_streams),
            "num_device_alloc" => return Some(self.num_device_alloc),
            "num_device_free" => return Some(self.num_device_free),
            "num_oom_rejections" => return Some(self.num_oom_rejections),
            _ => {}
        }
        if let Some(rest) = key.strip_prefix("reserved_bytes_by_private_pools.") {
            let mut parts = rest.split('.');
            let (a, b) = parts.next()?.split_once('_')?;
            let arr = self.private_pool_reserved.get(&(a.parse().ok()?, b.parse().ok()?))?;
            let pool = parts.next()?;
            let pi = POOL_NAMES.iter().position(|n| *n == pool)?;
            let field = parts.next()?;
            return if parts.next().is_some() { None } else { field_value(&arr[pi], field) };
        }
        let mut parts = key.split('.');
        let name = parts.next()?;
        let (stat, field) = match name {
            "oversize_allocations" => (&self.oversize_allocations, parts.next()?),
            "oversize_segments" => (&self.oversize_segments, parts.next()?),
            _ => {
                let ai = ARRAY_NAMES.iter().position(|n| *n == name)?;
                let pool = parts.next()?;
                let pi = POOL_NAMES.iter().position(|n| *n == pool)?;
                (&self.get(KINDS[ai], pi), parts.next()?)
            }
        };
        if parts.next().is_some() {
            return None;
        }
        field_value(stat, field)
    }
}

fn field_value(s: &Stat, field: &str) -> Option<i64> {
    match field {
        "current" => Some(s.current),
        "peak" => Some(s.peak),
        "allocated" => Some(s.allocated),
        "freed" => Some(s.freed),
        _ => None,
    }
}

fn push_stat(out: &mut Vec<(String, i64)>, prefix: &str, s: &Stat) {
    for f in FIELDS {
        out.push((format!("{prefix}.{f}"), field_value(s, f).unwrap_or_default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_has_121_sorted_pytorch_keys() {
        let mut s = DeviceStats::default();
        s.increase(Kind::ReservedBytes, LARGE_POOL, 20 << 20);
        s.decrease(Kind::ReservedBytes, LARGE_POOL, 2 << 20);
        let flat = s.flat();
        assert_eq!(flat.len(), 121);
        assert!(flat.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(s.value("reserved_bytes.all.peak"), Some(20 << 20));
        assert_eq!(s.value("reserved_bytes.large_pool.current"), Some(18 << 20));
        assert_eq!(s.value("reserved_bytes.small_pool.current"), Some(0));
        assert_eq!(s.value("reserved_bytes.all.freed"), Some(2 << 20));
        assert_eq!(s.value("allocated.all.current"), None);
        for (k, v) in &flat {
            assert_eq!(s.value(k), Some(*v), "{k}");
        }
    }

    #[test]
    fn later_releases_add_their_keys() {
        let mut s = DeviceStats::default();
        s.change_private_reserved((1, 0), LARGE_POOL, 20 << 20);
        s.change_private_reserved((1, 0), LARGE_POOL, -(20 << 20));
        s.num_oom_rejections = 2;
        let r = |v: &str| Release::parse(v).unwrap();
        assert_eq!(s.flat_for(r("2.11.0")).len(), 121);
        assert_eq!(s.flat_for(r("2.12.1")).len(), 122);
        let f = s.flat_for(r("2.15.0"));
        assert_eq!(f.len(), 122 + 12);
        assert!(f.windows(2).all(|w| w[0].0 < w[1].0));
        let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|e| e.1);
        assert_eq!(get("num_oom_rejections"), Some(2));
        assert_eq!(get("reserved_bytes_by_private_pools.1_0.all.current"), Some(0));
        assert_eq!(get("reserved_bytes_by_private_pools.1_0.large_pool.peak"), Some(20 << 20));
        assert_eq!(get("reserved_bytes_by_private_pools.1_0.small_pool.allocated"), Some(0));
        assert_eq!(s.value("reserved_bytes_by_private_pools.1_0.large_pool.freed"), Some(20 << 20));
        assert_eq!(s.value("reserved_bytes_by_private_pools.2_0.all.current"), None);
        for (k, v) in &f {
            assert_eq!(s.value(k), Some(*v), "{k}");
        }
    }
}
