//! Which PyTorch release's caching allocator a model follows, and what that
//! release's rules are (docs/design/pytorch-allocator.md, "Releases"). The model is
//! one allocator; the differences between releases are the data here.

use std::fmt;

use thiserror::Error;

/// A PyTorch release, as `torch.__version__` writes it (a local part such as
/// `+cu130` and pre-release tags are dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("not a PyTorch release: {0:?} (expected MAJOR.MINOR, e.g. 2.15 or 2.13.0)")]
pub struct BadRelease(pub String);

/// How best fit chooses among free blocks of equal size on one stream, and so
/// also the order cached segments are released in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreak {
    /// The lowest address (2.11 and earlier).
    Address,
    /// The oldest `Block` object: a new segment's block or the allocated
    /// front of a split takes a fresh number; a split's remainder and a merge
    /// keep theirs (2.12).
    BlockAge,
    /// The oldest segment (the order segments were obtained from the device),
    /// then the address (2.13 and later).
    SegmentAge,
}

impl Release {
    /// The release the model was first made exact for.
    pub const V2_11: Release = Release { major: 2, minor: 11, patch: 0 };
    /// The newest release the model knows.
    pub const NEWEST: Release = Release { major: 2, minor: 15, patch: 0 };
    /// The releases whose rules differ, one per behaviour, oldest first: a
    /// trace that cannot say which made it is tried under each.
    pub const DISTINCT: [Release; 3] =
        [Release::V2_11, Release { major: 2, minor: 12, patch: 0 }, Release { major: 2, minor: 13, patch: 0 }];

    pub fn parse(s: &str) -> Result<Release, BadRelease> {
        let bad = || BadRelease(s.to_string());
        let core = s.trim().split('+').next().unwrap_or_default();
        let mut parts = core.split('.');
        let mut num = |required: bool| -> Result<u16, BadRelease> {
            match parts.next() {
                None if !required => Ok(0),
                None => Err(bad()),
                // "0a0", "1rc1": the digits before a pre-release tag.
                Some(p) => {
                    let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().map_err(|_| bad())
                }
            }
        };
        let major = num(true)?;
        let minor = num(true)?;
        let patch = num(false)?;
        if major != 2 {
            return Err(bad());
        }
        Ok(Release { major, minor, patch })
    }

    fn at_least(self, minor: u16) -> bool {
        (self.major, self.minor) >= (2, minor)
    }

    pub fn tie_break(self) -> TieBreak {
        if self.at_least(13) {
            TieBreak::SegmentAge
        } else if self.at_least(12) {
            TieBreak::BlockAge
        } else {
            TieBreak::Address
        }
    }

    /// Whether allocating into a private pool outside a real capture
    /// (`use_mem_pool`, NCCL pools, cudagraph-trees warm-up) behaves as a
    /// capture: no `empty_cache` of the default pools, no OOM retry, frees
    /// with stream uses deferred, no event processing at malloc. 2.13 gave
    /// captures their own scope.
    pub fn pool_scope_is_capture(self) -> bool {
        !self.at_least(13)
    }

    /// Whether the memory-fraction limit is `round(fraction × total)`
    /// (2.13+) rather than truncated.
    pub fn rounds_fraction(self) -> bool {
        self.at_least(13)
    }

    /// `num_oom_rejections` and `throw_on_cudamalloc_oom` (2.12+).
    pub fn has_oom_rejections(self) -> bool {
        self.at_least(12)
    }

    /// `reserved_bytes_by_private_pools.<a>_<b>.*` (2.13+).
    pub fn has_private_pool_stats(self) -> bool {
        self.at_least(13)
    }

    /// `allocateWithAddress` (2.13+).
    pub fn has_exact_address(self) -> bool {
        self.at_least(13)
    }

    /// Whether the OOM message leaves out the advice to turn expandable
    /// segments on when they are (2.14+).
    pub fn omits_expandable_advice(self) -> bool {
        self.at_least(14)
    }

    /// The `annotate` trace action (2.14+).
    pub fn has_annotations(self) -> bool {
        self.at_least(14)
    }

    /// `expandable_segments_reserve` (2.15+).
    pub fn has_expandable_reserve(self) -> bool {
        self.at_least(15)
    }

    /// Whether this release's `PYTORCH_CUDA_ALLOC_CONF` parser knows `key`
    /// (a key it does not know is an error there).
    pub fn knows_key(self, key: &str) -> bool {
        match key {
            "throw_on_cudamalloc_oom" | "pinned_free_catch_all" => self.at_least(12),
            "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => self.at_least(13),
            "expandable_segments_reserve" | "expandable_segments_reserve_by_class" => self.at_least(15),
            _ => true,
        }
    }
}

impl Default for Release {
    fn default() -> Self {
        Release::V2_11
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Release {
    type Err = BadRelease;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Release::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_torch_version_writes() {
        assert_eq!(Release::parse("2.11.0+cu130").unwrap(), Release::V2_11);
        assert_eq!(Release::parse("2.15").unwrap(), Release { major: 2, minor: 15, patch: 0 });
        assert_eq!(Release::parse("2.16.0a0+git1234").unwrap(), Release { major: 2, minor: 16, patch: 0 });
        assert_eq!(Release::parse(" 2.12.1 ").unwrap(), Release { major: 2, minor: 12, patch: 1 });
        for bad in ["", "2", "two.ten", "1.13.0", "3.0", "2.x"] {
            assert!(Release::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rules_change_where_the_releases_did() {
        let r = |s: &str| Release::parse(s).unwrap();
        assert_eq!(r("2.10.0").tie_break(), TieBreak::Address);
        assert_eq!(r("2.11.0").tie_break(), TieBreak::Address);
        assert_eq!(r("2.12.1").tie_break(), TieBreak::BlockAge);
        assert_eq!(r("2.13.0").tie_break(), TieBreak::SegmentAge);
        assert_eq!(r("2.15.0").tie_break(), TieBreak::SegmentAge);
        assert!(r("2.12.1").pool_scope_is_capture() && !r("2.13.0").pool_scope_is_capture());
        assert!(!r("2.12.1").rounds_fraction() && r("2.14.1").rounds_fraction());
        assert!(!r("2.11.0").knows_key("throw_on_cudamalloc_oom") && r("2.12.0").knows_key("throw_on_cudamalloc_oom"));
        assert!(
            !r("2.14.1").knows_key("expandable_segments_reserve")
                && r("2.15.0").knows_key("expandable_segments_reserve")
        );
        assert!(r("2.11.0").knows_key("max_split_size_mb"));
    }
}
