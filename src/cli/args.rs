//! Argument groups and value parsers several commands share: where to look
//! in a trace, whose allocator to follow, a memory cap, sizes with units.

use anyhow::{anyhow, Result};
use clap::Args;

use thiserror::Error;

use crate::alloc::AllocatorConfig;

/// Bad usage or bad input: exit code 2.
#[derive(Debug, Error)]
#[error("{0}")]
pub(crate) struct InputError(pub String);

/// Where to look in a trace: an event index, the peak, the first OOM or the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Event(usize),
    Peak,
    Oom,
    End,
}

impl std::str::FromStr for At {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "peak" => Ok(At::Peak),
            "oom" => Ok(At::Oom),
            "end" => Ok(At::End),
            _ => s.parse().map(At::Event).map_err(|_| format!("expected an event index, peak, oom or end, got {s:?}")),
        }
    }
}

/// `--torch VERSION`: whose caching allocator to follow.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TorchArg {
    /// The PyTorch release whose caching allocator to follow (2.11 to 2.15,
    /// e.g. 2.15 or 2.13.0); by default what the snapshot's fields say.
    #[arg(long = "torch", value_name = "VERSION", value_parser = parse_release)]
    pub(crate) release: Option<crate::alloc::Release>,
}

fn parse_release(s: &str) -> Result<crate::alloc::Release, String> {
    crate::alloc::Release::parse(s).map_err(|e| e.to_string())
}

/// PyTorch's per-process memory cap: a byte limit or a share of the device.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct MemoryCap {
    /// Per-process memory limit (PyTorch's allowed_memory_maximum): bytes,
    /// or 16GiB / 16G (powers of 1024), 16GB (powers of 1000), 1.5e10.
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity, conflicts_with = "memory_fraction")]
    pub(crate) memory_limit: Option<u64>,
    /// Per-process memory fraction of the device, as set_per_process_memory_fraction.
    #[arg(long, value_name = "F")]
    pub(crate) memory_fraction: Option<f64>,
}

impl MemoryCap {
    /// A fraction outside (0, 1] is bad input.
    pub(crate) fn check(&self) -> Result<()> {
        match self.memory_fraction {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                Err(anyhow!(InputError(format!("--memory-fraction must be in (0, 1], got {f}"))))
            }
            _ => Ok(()),
        }
    }

    /// The limit in bytes on a device of `total` bytes (a fraction of 1 is none).
    pub(crate) fn limit(&self, total: u64) -> Option<u64> {
        self.memory_limit.or(self.memory_fraction.filter(|f| *f < 1.0).map(|f| (f * total as f64) as u64))
    }
}

/// A size flag's value: bytes (`9006592819`, `1.5e10`), or with a unit:
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` are powers of 1024; `KB`,
/// `MB`, `GB`, `TB` powers of 1000 (case-insensitive, a space allowed).
/// `parse_size` for a capacity (a memory limit, a device's total, an
/// unpacked-size cap): 0 bytes holds nothing, so it is refused rather than
/// answered with every request an OOM.
pub(crate) fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?}: a capacity of 0 bytes holds nothing; give the size in bytes (e.g. 16GiB)")),
        n => Ok(n),
    }
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim().to_ascii_lowercase());
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
            "{s:?}: unknown unit {unit:?} (bytes, or K/M/G/T[iB] for powers of 1024, KB/MB/GB/TB for powers of 1000)"
        ))
        }
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 9006592819, 8GiB, 8G, 8GB, 1.5e10)"))?;
    let bytes = v * scale;
    if !bytes.is_finite() || !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("{s:?} is not a size in bytes"));
    }
    Ok(bytes.round() as u64)
}

pub(crate) fn parse_conf(s: &str) -> Result<AllocatorConfig> {
    AllocatorConfig::parse(s).map_err(|e| anyhow!(InputError(e.to_string())))
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    /// Every size flag takes units and exponents (`--memory-limit 8GB`,
    /// `8.39GiB`, `9e9`), and says what a unit it does not know is.
    #[test]
    fn sizes_take_units_and_exponents() {
        assert_eq!(parse_size("9006592819"), Ok(9_006_592_819));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("16G"), Ok(16 << 30));
        assert_eq!(parse_size("16 gb"), Ok(16_000_000_000));
        assert_eq!(parse_size("8.39GiB"), Ok((8.39 * (1u64 << 30) as f64).round() as u64));
        assert_eq!(parse_size("1.5e10"), Ok(15_000_000_000));
        assert_eq!(parse_size("9e9"), Ok(9_000_000_000));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert!(parse_size("8 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1e30").is_err());
    }
}
