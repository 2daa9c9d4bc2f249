//! Allocator constants, `PYTORCH_CUDA_ALLOC_CONF` parsing and size rounding
//! (docs/design/pytorch-allocator.md §1–§4).

use thiserror::Error;

use super::release::Release;

pub(crate) const K_MIN_BLOCK_SIZE: u64 = 512;
pub(crate) const K_SMALL_SIZE: u64 = 1 << 20;
pub(crate) const K_SMALL_BUFFER: u64 = 2 << 20;
pub(crate) const K_LARGE_BUFFER: u64 = 20 << 20;
pub(crate) const K_MIN_LARGE_ALLOC: u64 = 10 << 20;
pub(crate) const K_ROUND_LARGE: u64 = 2 << 20;
pub(crate) const K_ROUNDUP_POWER2_INTERVALS: usize = 16;
/// `allocate(size >= 1 EiB)` fails at once in PyTorch.
pub(crate) const ONE_EXA_BYTES: u64 = 1 << 60;
/// `max_split_size` when unset (reported as -1).
pub(crate) const UNLIMITED: u64 = u64::MAX;

/// The keys PyTorch accepts in `PYTORCH_CUDA_ALLOC_CONF`, 2.11's first; the
/// later ones only from the release that added them (`Release::knows_key`).
pub(crate) const KNOWN_KEYS: &[&str] = &[
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
    "throw_on_cudamalloc_oom",
    "pinned_free_catch_all",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

/// How far one expandable segment may grow (`expandable_segments_reserve`,
/// 2.15): a fraction of the device's memory or a byte count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reserve {
    Fraction(f64),
    Bytes(u64),
}

impl Reserve {
    /// The reserve in bytes on a device of `total` bytes.
    pub(crate) fn bytes(self, total: u64) -> u64 {
        match self {
            Reserve::Fraction(f) => (f * total as f64) as u64,
            Reserve::Bytes(b) => b,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid allocator config {conf:?}: {reason}")]
pub struct ConfigError {
    pub(crate) conf: String,
    pub(crate) reason: String,
}

/// Parsed allocator settings, as PyTorch's `AcceleratorAllocatorConfig` +
/// `CUDAAllocatorConfig` hold them.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// The settings string this was parsed from (stored in snapshots).
    pub(crate) source: String,
    pub(crate) max_split_size: u64,
    pub(crate) max_non_split_rounding_size: u64,
    pub(crate) garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub(crate) large_segment_size: u64,
    /// Divisions per power-of-two bucket: [1MB..2MB) (and below), [2MB..4MB) … [32GB..).
    pub roundup_power2_divisions: [u64; K_ROUNDUP_POWER2_INTERVALS],
    /// `per_process_memory_fraction` from the config string (or set later by
    /// `set_per_process_memory_fraction`).
    pub(crate) per_process_memory_fraction: Option<f64>,
    pub(crate) release_lock_on_cudamalloc: bool,
    pub(crate) graph_capture_record_stream_reuse: bool,
    pub(crate) pinned_use_cuda_host_register: bool,
    pub(crate) pinned_num_register_threads: u64,
    pub(crate) pinned_use_background_threads: bool,
    pub(crate) pinned_reserve_segment_size_mb: u64,
    /// 2.12+: refuse a device allocation past the configured fraction at
    /// once, before any cache release or retry.
    pub(crate) throw_on_cudamalloc_oom: bool,
    /// 2.15+: the default reserve of each expandable segment.
    pub(crate) expandable_segments_reserve: Option<Reserve>,
    /// 2.15+: reserves for streams of a named class. Kept and shown; the
    /// model's streams have no class, so the default reserve applies.
    pub(crate) expandable_segments_reserve_by_class: Vec<(String, Reserve)>,
    pub(crate) pinned_free_catch_all: bool,
    pub(crate) pinned_max_round_threshold_mb: Option<u64>,
    pub(crate) pinned_max_cached_size_mb: Option<u64>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            source: String::new(),
            max_split_size: UNLIMITED,
            max_non_split_rounding_size: K_LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            large_segment_size: K_LARGE_BUFFER,
            roundup_power2_divisions: [0; K_ROUNDUP_POWER2_INTERVALS],
            per_process_memory_fraction: None,
            release_lock_on_cudamalloc: false,
            graph_capture_record_stream_reuse: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            throw_on_cudamalloc_oom: false,
            expandable_segments_reserve: None,
            expandable_segments_reserve_by_class: Vec::new(),
            pinned_free_catch_all: false,
            pinned_max_round_threshold_mb: None,
            pinned_max_cached_size_mb: None,
        }
    }
}

fn tokenize(s: &str) -> Vec<String> {
    let mut toks = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                toks.push(std::mem::take(&mut buf));
            }
            toks.push(ch.to_string());
        } else if !ch.is_whitespace() {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        toks.push(buf);
    }
    toks
}

struct Parser<'a> {
    conf: &'a str,
    toks: Vec<String>,
    i: usize,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError { conf: self.conf.to_string(), reason: reason.into() }
    }
    fn next(&mut self, what: &str) -> Result<String, ConfigError> {
        let t = self.toks.get(self.i).cloned().ok_or_else(|| self.err(format!("expected {what} at end of string")))?;
        self.i += 1;
        Ok(t)
    }
    fn expect(&mut self, tok: &str) -> Result<(), ConfigError> {
        let t = self.next(&format!("'{tok}'"))?;
        if t != tok {
            return Err(self.err(format!("expected '{tok}', found '{t}'")));
        }
        Ok(())
    }
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.i).map(|s| s.as_str())
    }
    fn uint(&mut self, key: &str) -> Result<u64, ConfigError> {
        let t = self.next("a number")?;
        t.parse::<u64>().map_err(|_| self.err(format!("{key} needs a non-negative integer, got '{t}'")))
    }
    fn float(&mut self, key: &str) -> Result<f64, ConfigError> {
        let t = self.next("a number")?;
        t.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.err(format!("{key} needs a number, got '{t}'")))
    }
    /// `0.1` (a fraction of the device) or `40G` / `512M` (bytes).
    fn reserve(&mut self, key: &str) -> Result<Reserve, ConfigError> {
        let t = self.next("a fraction or a size such as 40G")?;
        let unit = match t.chars().last() {
            Some('G' | 'g') => Some(1u64 << 30),
            Some('M' | 'm') => Some(1 << 20),
            Some('K' | 'k') => Some(1 << 10),
            _ => None,
        };
        let bad = || self.err(format!("{key} needs a fraction in (0, 1] or a size such as 40G, got '{t}'"));
        match unit {
            Some(u) => {
                let v: f64 = t[..t.len() - 1].parse().map_err(|_| bad())?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad());
                }
                Ok(Reserve::Bytes((v * u as f64) as u64))
            }
            None => {
                let v: f64 = t.parse().map_err(|_| bad())?;
                if !(v > 0.0 && v <= 1.0) {
                    return Err(bad());
                }
                Ok(Reserve::Fraction(v))
            }
        }
    }
    fn boolean(&mut self, key: &str) -> Result<bool, ConfigError> {
        let t = self.next("True or False")?;
        match t.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(self.err(format!("{key} takes True or False, got '{t}'"))),
        }
    }
}

fn log2_floor(v: u64) -> u32 {
    63 - v.leading_zeros()
}

impl AllocatorConfig {
    /// Parses PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax
    /// (`key:value,key:[a:b,>:c]`) as the newest release knows it. Unknown
    /// keys and bad values are errors.
    pub fn parse(conf: &str) -> Result<Self, ConfigError> {
        Self::parse_for(conf, Release::NEWEST)
    }

    /// Parses the settings as `release`'s parser does: a key added after it
    /// is an error there, as PyTorch's own parser refuses it.
    #[allow(clippy::too_many_lines, reason = "the allocator port: PyTorch's parser, one arm per key as it has them")]
    pub fn parse_for(conf: &str, release: Release) -> Result<Self, ConfigError> {
        let mut c = AllocatorConfig { source: conf.to_string(), ..Default::default() };
        let mut p = Parser { conf, toks: tokenize(conf), i: 0 };
        while p.i < p.toks.len() {
            let key = p.next("a key")?;
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(p.err(format!("unrecognized key '{key}' (known keys: {})", KNOWN_KEYS.join(", "))));
            }
            if !release.knows_key(&key) {
                return Err(
                    p.err(format!("PyTorch {release} does not know the key '{key}' (a later release added it)"))
                );
            }
            p.expect(":")?;
            match key.as_str() {
                "max_split_size_mb" => {
                    let v = p.uint(&key)?;
                    if v < K_LARGE_BUFFER >> 20 {
                        return Err(
                            p.err(format!("max_split_size_mb must be at least {}, got {v}", K_LARGE_BUFFER >> 20))
                        );
                    }
                    c.max_split_size = v.checked_mul(1 << 20).ok_or_else(|| p.err("max_split_size_mb is too large"))?;
                }
                "max_non_split_rounding_mb" => {
                    let v = p.uint(&key)?;
                    if v < K_LARGE_BUFFER >> 20 {
                        return Err(p.err(format!(
                            "max_non_split_rounding_mb must be at least {}, got {v}",
                            K_LARGE_BUFFER >> 20
                        )));
                    }
                    c.max_non_split_rounding_size =
                        v.checked_mul(1 << 20).ok_or_else(|| p.err("max_non_split_rounding_mb is too large"))?;
                }
                "large_segment_size_mb" => {
                    let v = p.uint(&key)?;
                    if v <= K_MIN_LARGE_ALLOC >> 20 {
                        return Err(
                            p.err(format!("large_segment_size_mb must be > {}, got {v}", K_MIN_LARGE_ALLOC >> 20))
                        );
                    }
                    c.large_segment_size =
                        v.checked_mul(1 << 20).ok_or_else(|| p.err("large_segment_size_mb is too large"))?;
                }
                "garbage_collection_threshold" => {
                    let v = p.float(&key)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(p.err(format!("garbage_collection_threshold must be in (0, 1), got {v}")));
                    }
                    c.garbage_collection_threshold = v;
                }
                "expandable_segments" => c.expandable_segments = p.boolean(&key)?,
                "release_lock_on_cudamalloc" => c.release_lock_on_cudamalloc = p.boolean(&key)?,
                "pinned_use_cuda_host_register" => c.pinned_use_cuda_host_register = p.boolean(&key)?,
                "pinned_use_background_threads" => c.pinned_use_background_threads = p.boolean(&key)?,
                "graph_capture_record_stream_reuse" => c.graph_capture_record_stream_reuse = p.boolean(&key)?,
                "pinned_num_register_threads" => {
                    let v = p.uint(&key)?;
                    if v == 0 || !v.is_power_of_two() || v > 128 {
                        return Err(
                            p.err(format!("pinned_num_register_threads must be a power of 2 up to 128, got {v}"))
                        );
                    }
                    c.pinned_num_register_threads = v;
                }
                "pinned_reserve_segment_size_mb" => c.pinned_reserve_segment_size_mb = p.uint(&key)?,
                "per_process_memory_fraction" => {
                    let v = p.float(&key)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(p.err(format!("per_process_memory_fraction must be in [0, 1], got {v}")));
                    }
                    c.per_process_memory_fraction = Some(v);
                }
                "backend" => {
                    let v = p.next("a backend")?;
                    match v.as_str() {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(p.err("backend:cudaMallocAsync is CUDA's stream-ordered pool, which this model does not simulate; only backend:native is supported"))
                        }
                        _ => return Err(p.err(format!("backend must be native or cudaMallocAsync, got '{v}'"))),
                    }
                }
                "roundup_power2_divisions" => c.roundup_power2_divisions = parse_divisions(&mut p)?,
                "throw_on_cudamalloc_oom" => c.throw_on_cudamalloc_oom = p.boolean(&key)?,
                "pinned_free_catch_all" => c.pinned_free_catch_all = p.boolean(&key)?,
                "pinned_max_round_threshold_mb" => c.pinned_max_round_threshold_mb = Some(p.uint(&key)?),
                "pinned_max_cached_size_mb" => c.pinned_max_cached_size_mb = Some(p.uint(&key)?),
                "expandable_segments_reserve" => c.expandable_segments_reserve = Some(p.reserve(&key)?),
                "expandable_segments_reserve_by_class" => {
                    p.expect("[")?;
                    loop {
                        let class = p.next("a stream class")?;
                        p.expect(":")?;
                        let r = p.reserve(&key)?;
                        c.expandable_segments_reserve_by_class.push((class, r));
                        match p.next("',' or ']'")?.as_str() {
                            "," => continue,
                            "]" => break,
                            t => return Err(p.err(format!("expected ',' or ']' in {key}, found '{t}'"))),
                        }
                    }
                }
                _ => unreachable!("key checked against KNOWN_KEYS"),
            }
            if p.i < p.toks.len() {
                p.expect(",")?;
            }
        }
        Ok(c)
    }

    /// `max_split_size` as `memory_stats()` reports it (-1 when unlimited).
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == UNLIMITED {
            -1
        } else {
            self.max_split_size as i64
        }
    }

    #[inline]
    fn divisions_for(&self, size: u64) -> u64 {
        self.roundup_power2_divisions[Self::interval_of(size)]
    }

    /// Where the settings differ only in how they round and where they stop
    /// splitting: the bits (`rounding_bit`) of the size intervals a request
    /// of which could make them act apart. An allocator under `self` does
    /// what one under `other` does with requests none of whose sizes' bits
    /// are among them. None where the settings differ otherwise, or where
    /// both map expandable segments and their `max_split_size` differs (a
    /// segment there grows past any request).
    ///
    /// Rounding: the intervals whose division counts differ (0 and 1 alike,
    /// since `round_size` divides only by more than one). Splitting:
    /// `max_split_size` is read only of blocks and requests at least that
    /// large (docs/design/pytorch-allocator.md §6.1, §6.5), and a block is
    /// never larger than its segment, which a request of interval `i`
    /// makes at most `large_segment_size` or `2^(21+i)` bytes long (its
    /// rounded size never passes the interval's end, a multiple of 2 MiB):
    /// the intervals where that reaches the smaller `max_split_size`.
    pub(crate) fn acts_apart(&self, other: &AllocatorConfig) -> Option<u16> {
        let plain = |c: &AllocatorConfig| {
            let mut c = c.clone();
            c.source.clear();
            c.roundup_power2_divisions = [0; K_ROUNDUP_POWER2_INTERVALS];
            c.max_split_size = UNLIMITED;
            c
        };
        if plain(self) != plain(other) {
            return None;
        }
        let d = |x: u64| if x == 1 { 0 } else { x };
        let (a, b) = (&self.roundup_power2_divisions, &other.roundup_power2_divisions);
        let rounding = (0..K_ROUNDUP_POWER2_INTERVALS).filter(|&i| d(a[i]) != d(b[i])).fold(0, |m, i| m | 1 << i);
        if self.max_split_size == other.max_split_size {
            return Some(rounding);
        }
        if self.expandable_segments {
            return None;
        }
        let least = self.max_split_size.min(other.max_split_size);
        let last = K_ROUNDUP_POWER2_INTERVALS - 1;
        let reaches = |i: usize| i == last || self.large_segment_size.max(2u64 << (20 + i)) >= least;
        Some((0..K_ROUNDUP_POWER2_INTERVALS).filter(|&i| reaches(i)).fold(rounding, |m, i| m | 1 << i))
    }

    /// The bit of the interval whose division count `round_size` reads for
    /// `size`.
    #[inline]
    pub(crate) fn rounding_bit(size: u64) -> u16 {
        1 << Self::interval_of(size)
    }

    #[inline]
    fn interval_of(size: u64) -> usize {
        (log2_floor(size.max(1)) as i64 - 20).clamp(0, K_ROUNDUP_POWER2_INTERVALS as i64 - 1) as usize
    }

    /// `round_size` (docs/design/pytorch-allocator.md §3).
    #[inline]
    pub(crate) fn round_size(&self, size: u64) -> u64 {
        if size < K_MIN_BLOCK_SIZE {
            return K_MIN_BLOCK_SIZE;
        }
        let d = self.divisions_for(size);
        if d > 1 && size > K_MIN_BLOCK_SIZE * d {
            return roundup_power2_next_division(size, d);
        }
        K_MIN_BLOCK_SIZE * size.div_ceil(K_MIN_BLOCK_SIZE)
    }

    /// `get_allocation_size` (docs/design/pytorch-allocator.md §4): bytes requested from the device for a new segment.
    pub(crate) fn allocation_size(&self, rounded: u64) -> u64 {
        if rounded <= K_SMALL_SIZE {
            K_SMALL_BUFFER
        } else if rounded < K_MIN_LARGE_ALLOC {
            self.large_segment_size
        } else {
            K_ROUND_LARGE * rounded.div_ceil(K_ROUND_LARGE)
        }
    }

    /// Expandable-segment page size for a pool.
    pub(crate) fn page_size(&self, small: bool) -> u64 {
        if small {
            K_SMALL_BUFFER
        } else {
            self.large_segment_size
        }
    }
}

fn parse_divisions(p: &mut Parser) -> Result<[u64; K_ROUNDUP_POWER2_INTERVALS], ConfigError> {
    let mut out = [0u64; K_ROUNDUP_POWER2_INTERVALS];
    let check_div = |p: &Parser, v: u64| -> Result<(), ConfigError> {
        if v != 0 && !v.is_power_of_two() {
            return Err(p.err(format!("roundup_power2_divisions values must be 0 or a power of 2, got {v}")));
        }
        Ok(())
    };
    if p.peek() != Some("[") {
        let v = p.uint("roundup_power2_divisions")?;
        check_div(p, v)?;
        return Ok([v; K_ROUNDUP_POWER2_INTERVALS]);
    }
    p.expect("[")?;
    let mut last: Option<usize> = None;
    loop {
        let key = p.next("a bucket size or '>'")?;
        p.expect(":")?;
        let v = p.uint("roundup_power2_divisions")?;
        check_div(p, v)?;
        if key == ">" {
            // torch >= 2.9 fills the buckets after the last listed one.
            let from = last.map(|l| l + 1).unwrap_or(0);
            for slot in out.iter_mut().skip(from) {
                *slot = v;
            }
        } else {
            let mb: u64 = key
                .parse()
                .map_err(|_| p.err(format!("roundup_power2_divisions bucket must be a size in MB, got '{key}'")))?;
            if mb == 0 || !mb.is_power_of_two() {
                return Err(p.err(format!("roundup_power2_divisions bucket must be a power of 2 in MB, got {mb}")));
            }
            let idx = (log2_floor(mb) as usize).min(K_ROUNDUP_POWER2_INTERVALS - 1);
            if last.is_none() {
                for slot in out.iter_mut().take(idx) {
                    *slot = v;
                }
            }
            out[idx] = v;
            last = Some(idx);
        }
        match p.next("',' or ']'")?.as_str() {
            "," => continue,
            "]" => break,
            t => return Err(p.err(format!("expected ',' or ']' in roundup_power2_divisions, found '{t}'"))),
        }
    }
    Ok(out)
}

/// `roundup_power2_next_division` (docs/design/pytorch-allocator.md §3).
pub(crate) fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << log2_floor(size);
    let step = floor >> log2_floor(divisions);
    if step == 0 {
        return floor << 1;
    }
    let r = size & !(step - 1);
    if r == size {
        size
    } else {
        r + step
    }
}

/// PyTorch's `format_size`, used in OOM messages.
pub(crate) fn format_size(size: u64) -> String {
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", size as f64 / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", size as f64 / 1048576.0)
    } else {
        format!("{:.2} GiB", size as f64 / 1073741824.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_examples_from_the_spec() {
        let c = AllocatorConfig::default();
        assert_eq!(c.round_size(1), 512);
        assert_eq!(c.round_size(512), 512);
        assert_eq!(c.round_size(513), 1024);
        assert_eq!(c.round_size(4000), 4096);
        assert_eq!(c.round_size((1 << 20) + 1), 1_049_088);
        let c4 = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c4.round_size(1_100_000), 1_310_720);
    }

    #[test]
    fn segment_sizes_from_the_spec() {
        let c = AllocatorConfig::default();
        assert_eq!(c.allocation_size(c.round_size(400)), 2 << 20);
        assert_eq!(c.allocation_size(3 << 20), 20 << 20);
        assert_eq!(c.allocation_size(c.round_size(10_475_274)), 20 << 20);
        assert_eq!(c.allocation_size(10 << 20), 10 << 20);
        assert_eq!(c.allocation_size(c.round_size(27_425_869)), 29_360_128);
        assert_eq!(c.allocation_size(30 << 20), 30 << 20);
    }

    #[test]
    fn divisions_list_fills_after_the_last_bucket() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]);
    }

    #[test]
    fn parses_combined_keys() {
        let c =
            AllocatorConfig::parse(" expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6")
                .unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(AllocatorConfig::parse("").unwrap().max_split_size_stat(), -1);
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        for bad in [
            "foo:1",
            "max_split_size_mb:10",
            "max_split_size_mb:abc",
            "expandable_segments:true",
            "garbage_collection_threshold:1.5",
            "roundup_power2_divisions:3",
            "roundup_power2_divisions:[300:2]",
            "max_split_size_mb",
            "large_segment_size_mb:10",
            "max_split_size_mb:100,,expandable_segments:True",
            "backend:cudaMallocAsync",
            "per_process_memory_fraction:2",
        ] {
            let e = AllocatorConfig::parse(bad).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn later_keys_parse_where_their_release_knows_them() {
        let conf = "throw_on_cudamalloc_oom:True,expandable_segments_reserve:40G,\
                    expandable_segments_reserve_by_class:[comm:0.05,compute:0.5],pinned_free_catch_all:True,\
                    pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:1024";
        let c = AllocatorConfig::parse(conf).unwrap();
        assert!(c.throw_on_cudamalloc_oom && c.pinned_free_catch_all);
        assert_eq!(c.expandable_segments_reserve, Some(Reserve::Bytes(40 << 30)));
        assert_eq!(
            c.expandable_segments_reserve_by_class,
            vec![("comm".to_string(), Reserve::Fraction(0.05)), ("compute".to_string(), Reserve::Fraction(0.5))]
        );
        assert_eq!((c.pinned_max_round_threshold_mb, c.pinned_max_cached_size_mb), (Some(64), Some(1024)));
        assert_eq!(Reserve::Fraction(0.1).bytes(80 << 30), 8_589_934_592);
        let r = |s: &str| Release::parse(s).unwrap();
        let e = AllocatorConfig::parse_for("throw_on_cudamalloc_oom:True", r("2.11")).unwrap_err();
        assert!(e.to_string().contains("PyTorch 2.11.0 does not know the key 'throw_on_cudamalloc_oom'"), "{e}");
        assert!(AllocatorConfig::parse_for("throw_on_cudamalloc_oom:True", r("2.12.1")).is_ok());
        assert!(AllocatorConfig::parse_for("expandable_segments_reserve:0.1", r("2.14.1")).is_err());
        for bad in
            ["expandable_segments_reserve:0", "expandable_segments_reserve:1.5", "expandable_segments_reserve:xG"]
        {
            assert!(AllocatorConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(2048), "2.00 KiB");
        assert_eq!(format_size(118 << 20), "118.00 MiB");
        assert_eq!(format_size(9_006_592_819), "8.39 GiB");
    }
}
