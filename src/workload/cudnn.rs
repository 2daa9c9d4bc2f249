//! cuDNN's convolution workspaces, as measured: with `torch.backends.cudnn`
//! at its defaults (benchmark off) cuDNN's heuristics pick each
//! convolution's algorithm, and PyTorch allocates that algorithm's
//! workspace around the kernel and frees it at once. The sizes follow no
//! formula we can write down (they change with the algorithm picked), so
//! they come from a table recorded on an H200 for every convolution of
//! ResNet-50 at batches 1–512 (`cudnn_h200.json`, made by
//! `measurements/calibration/cudnn_workspaces.py`); docs/user/synth.md.

use std::collections::HashMap;
use std::sync::OnceLock;

/// A convolution as cuDNN sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Conv {
    pub(crate) cin: u64,
    pub(crate) cout: u64,
    pub(crate) kernel: u64,
    pub(crate) stride: u64,
    pub(crate) padding: u64,
    /// Input height and width.
    pub(crate) size: u64,
}

/// The workspaces of one convolution's forward and backward (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Workspaces {
    pub(crate) forward: u64,
    /// Taken after the input's gradient is allocated.
    pub(crate) backward_data: u64,
    /// Taken after the weight's gradient is allocated.
    pub(crate) backward_filter: u64,
}

#[derive(serde::Deserialize)]
struct Table {
    /// "cin,cout,kernel,stride,padding,size" → dtype → [batch, forward, data, filter] rows.
    convs: HashMap<String, HashMap<String, Vec<[u64; 4]>>>,
}

/// The table as measured (also what `fit --no-gpu`'s recorder looks up).
pub(crate) const TABLE_JSON: &str = include_str!("cudnn_h200.json");

fn table() -> Option<&'static Table> {
    static T: OnceLock<Option<Table>> = OnceLock::new();
    T.get_or_init(|| serde_json::from_str(TABLE_JSON).ok()).as_ref()
}

/// The workspaces of `c` at `batch` in bf16 or fp32, where the table has
/// the convolution: between two recorded batches each size is interpolated
/// linearly (a workspace present at only one of them is taken from the
/// nearer), past the largest it grows in proportion to the batch.
pub(crate) fn workspaces(c: Conv, bf16: bool, batch: u64) -> Option<Workspaces> {
    let key = format!("{},{},{},{},{},{}", c.cin, c.cout, c.kernel, c.stride, c.padding, c.size);
    let rows = table()?.convs.get(&key)?.get(if bf16 { "bf16" } else { "fp32" })?;
    let at = |r: &[u64; 4]| Workspaces { forward: r[1], backward_data: r[2], backward_filter: r[3] };
    let hi = rows.iter().position(|r| r[0] >= batch);
    let (lo, hi) = match hi {
        Some(0) => return rows.first().map(at),
        Some(i) => (&rows[i - 1], &rows[i]),
        None => {
            let last = rows.last()?;
            let scale = |v: u64| (v as u128 * batch as u128 / last[0].max(1) as u128) as u64;
            let w = at(last);
            return Some(Workspaces {
                forward: scale(w.forward),
                backward_data: scale(w.backward_data),
                backward_filter: scale(w.backward_filter),
            });
        }
    };
    if hi[0] == batch {
        return Some(at(hi));
    }
    let f = (batch - lo[0]) as f64 / (hi[0] - lo[0]) as f64;
    let mix = |a: u64, b: u64| match (a, b) {
        (0, _) | (_, 0) => {
            if f < 0.5 {
                a
            } else {
                b
            }
        }
        _ => (a as f64 + (b as f64 - a as f64) * f).round() as u64,
    };
    Some(Workspaces {
        forward: mix(lo[1], hi[1]),
        backward_data: mix(lo[2], hi[2]),
        backward_filter: mix(lo[3], hi[3]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONV1: Conv = Conv { cin: 3, cout: 64, kernel: 7, stride: 2, padding: 3, size: 224 };

    #[test]
    fn recorded_batches_are_read_and_others_interpolated() {
        // ResNet-50's first convolution at batch 64 in fp32: the forward
        // workspace the shared trace's first step allocates (event 340).
        let w = workspaces(CONV1, false, 64).unwrap();
        assert_eq!(w.forward, 244_093_712);
        assert_eq!(w.backward_data, 0, "the images take no gradient");
        let (a, b) = (workspaces(CONV1, false, 48).unwrap(), workspaces(CONV1, false, 64).unwrap());
        let mid = workspaces(CONV1, false, 56).unwrap();
        assert_eq!(mid.forward, (a.forward + b.forward).div_ceil(2));
        // Past batch 512: in proportion.
        let big = workspaces(CONV1, false, 1024).unwrap();
        assert_eq!(big.forward, workspaces(CONV1, false, 512).unwrap().forward * 2);
        // A convolution the table does not have.
        assert_eq!(workspaces(Conv { cin: 5, ..CONV1 }, false, 64), None);
    }
}
