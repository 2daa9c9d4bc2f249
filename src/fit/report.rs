//! `fit --json` as types; docs/user/json.md is the schema.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Prediction;

/// `fit --json` (docs/user/json.md). Fields in this order: `predictions` and
/// `max_batch` first.
#[derive(Serialize)]
pub(crate) struct FitJson<'a> {
    pub(crate) predictions: &'a [Prediction],
    pub(crate) max_batch: u64,
    pub(crate) max_batch_by_config: BTreeMap<&'a str, u64>,
    pub(crate) peak_at_max_batch_by_config: BTreeMap<&'a str, Option<Prediction>>,
    /// What `tune` recommends at the largest batch (a key of the
    /// maps above when it differs from the recorded setting).
    pub(crate) recommended_alloc_conf: &'a str,
    pub(crate) samples: Vec<SampleRef<'a>>,
    pub(crate) alloc_conf: &'a str,
    pub(crate) memory_limit_bytes: Option<u64>,
    pub(crate) device_total_bytes: u64,
    pub(crate) context_bytes: u64,
    pub(crate) alignment: &'a super::FitReport,
    /// Why the predictions are less certain than docs/user/fit.md
    /// measures (a self-check off by more than it should be).
    pub(crate) warnings: &'a [String],
    /// Per category at the samples' peaks, and its line; empty, with
    /// `categories_note` saying why, where the lines do not add up to
    /// the predicted peaks.
    pub(crate) categories: Vec<CategoryLine<'a>>,
    pub(crate) categories_note: Option<String>,
    /// How far the farthest batch is beyond the samples, what real runs
    /// measured at that reach, and the third sample that settles it;
    /// null within 4 times the largest sample.
    pub(crate) reach: Option<super::Reach>,
    /// Samples recorded without a GPU (`fit --no-gpu`): the device assumed,
    /// what the recorder said, what it cannot see; null from a GPU's.
    pub(crate) no_gpu: Option<NoGpuJson<'a>>,
}

/// `FitJson::no_gpu`.
#[derive(Serialize)]
pub(crate) struct NoGpuJson<'a> {
    pub(crate) assumed_device: &'a str,
    /// What the recorder did or met, and how many times.
    pub(crate) recorder_notes: BTreeMap<&'a str, u64>,
    /// Batches recorded and replayed as they are (the asked batches beyond
    /// the samples, and the tries that confirmed the largest batch).
    pub(crate) recorded_batches: &'a [u64],
    pub(crate) not_seen: &'a [&'a str],
}

/// One category's line (`FitJson::categories`).
#[derive(Serialize)]
pub(crate) struct CategoryLine<'a> {
    #[serde(flatten)]
    pub(crate) fit: &'a super::CategoryFit,
    /// The line at each predicted batch, in `predictions`' order.
    pub(crate) predicted_bytes: Vec<u64>,
}

/// A sample as given: its snapshot and batch.
#[derive(Serialize)]
pub(crate) struct SampleRef<'a> {
    pub(crate) snapshot: &'a str,
    pub(crate) batch: u64,
}
