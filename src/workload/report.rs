//! `synth --json` as types; docs/user/json.md is the schema. The keys a replay
//! report shares (`stats`, `peak`, `fragmentation`, …) mean the same here.

use std::collections::BTreeMap;

use serde::Serialize;

use super::driver::{OnOom, OomRecord};
use super::SynthSpec;
use crate::analysis::{round4, Fragmentation};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SynthReport {
    /// Always null: a synthetic run has no trace.
    pub(crate) trace: Option<String>,
    /// "synthetic".
    pub(crate) format: &'static str,
    pub(crate) workload: SynthSpec,
    /// "sim" or "cuda".
    pub(crate) backend: &'static str,
    pub(crate) device: String,
    pub(crate) events: u64,
    pub(crate) requests: usize,
    pub(crate) iterations: usize,
    /// "finished", "stopped by OOM" or "interrupted".
    pub(crate) outcome: &'static str,
    pub(crate) alloc_conf: String,
    pub(crate) memory_limit_bytes: Option<u64>,
    /// "synthetic": nothing recorded to be faithful to.
    pub(crate) fidelity: &'static str,
    pub(crate) first_divergence: Option<()>,
    pub(crate) compare: Vec<()>,
    pub(crate) on_oom: OnOom,
    pub(crate) ooms: Vec<OomRecord>,
    pub(crate) stats: BTreeMap<String, i64>,
    pub(crate) peak: Option<SynthPeak>,
    /// What the memory is, as the synthetic model knows each tensor
    /// (docs/user/categories.md): bytes per category at the peak and at the end.
    pub(crate) categories: SynthCategories,
    pub(crate) fragmentation: SynthFragmentation,
    pub(crate) nvml_device: Option<NvmlDevice>,
    pub(crate) cuda_context_bytes: Option<u64>,
    pub(crate) nvml_used_bytes_at_peak: Option<u64>,
    pub(crate) reserved_bytes_at_nvml_sample: Option<u64>,
    pub(crate) device_maps: Option<DeviceMaps>,
    pub(crate) device_bytes_held_after_release: Option<u64>,
    /// What the model of this workload includes and leaves out.
    pub(crate) effects: Vec<Effect>,
    #[serde(serialize_with = "round4")]
    pub(crate) elapsed_ms: f64,
}

/// One effect on the peaks: whether this run models it, and how.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Effect {
    pub(crate) effect: &'static str,
    pub(crate) modelled: bool,
    pub(crate) how: &'static str,
}

/// The effects that bear on `spec`'s peaks (docs/user/synth.md).
pub(crate) fn effects(spec: &SynthSpec) -> Vec<Effect> {
    use super::{Checkpoint, ModelKind};
    let e = |effect, modelled, how| Effect { effect, modelled, how };
    let training = !spec.inference;
    let mut v = vec![
        e("activations", true, "every op's outputs and what autograd saves, in PyTorch's order"),
        e("cublas_workspaces", true, "32 MiB + 1 MiB at the first GEMM, 32 MiB at the first backward GEMM, kept"),
        e("loop_variables", true, "x, y, out and loss live until rebound or deleted after the optimizer step"),
    ];
    v.push(
        if matches!(spec.model, ModelKind::Gpt2 | ModelKind::Llama | ModelKind::Resnet50)
            || spec.inference && spec.model == ModelKind::Bert
        {
            e(
                "module_variables",
                true,
                "a block's local variables keep its tensors as its code does (docs/user/synth.md)",
            )
        } else {
            e(
                "module_variables",
                false,
                "a module's local variables can keep a tensor past its last use; freed at it here",
            )
        },
    );
    if training {
        v.push(e("gradients", true, "every parameter's, kept from its backward to zero_grad(set_to_none)"));
        v.push(e(
            "bias_reduction_buffers",
            true,
            "the fp32 partial sums of a Linear's bias gradient over more than 512 rows (H200)",
        ));
        v.push(e("optimizer_state", true, "SGD momentum, or AdamW's two states and its foreach temporaries"));
    }
    if spec.model == ModelKind::Resnet50 {
        v.push(e(
            "cudnn_workspaces",
            true,
            "per convolution from a table recorded on an H200 (PyTorch 2.11, cuDNN 9.19, benchmark off); other GPUs differ",
        ));
        v.push(e(
            "cudnn_benchmark",
            false,
            "torch.backends.cudnn.benchmark=True tries algorithms with other workspaces",
        ));
    }
    if spec.amp {
        v.push(e("autocast", true, "bf16 outputs, the weight-cast cache until the forward ends, fp32 ops' copies"));
    }
    if spec.accum > 1 {
        v.push(e(
            "gradient_accumulation",
            true,
            "the previous micro-batch's batch, output and loss live until rebound; gradients accumulate in place",
        ));
    }
    match spec.checkpoint {
        Checkpoint::None => {}
        Checkpoint::Layer => {
            v.push(e("checkpointing", true, "per layer, as gradient_checkpointing_enable(): the key/value cache off"))
        }
        Checkpoint::Sqrt => v.push(e("checkpointing", true, "segments of about sqrt(layers) layers")),
    }
    v.push(e("distributed", false, "DDP buckets, FSDP shards and NCCL buffers"));
    v
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SynthPeak {
    /// The allocator event at the peak.
    pub(crate) event: Option<u64>,
    /// The request (counted from the start of the run) at the peak.
    pub(crate) request: usize,
    pub(crate) allocated_bytes: u64,
    pub(crate) reserved_bytes: u64,
    /// 1-based.
    pub(crate) iteration: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SynthFragmentation {
    #[serde(serialize_with = "round4")]
    pub(crate) peak_ratio: f64,
    #[serde(flatten)]
    pub(crate) now: Fragmentation,
}

/// Which GPU NVML watched: CUDA's ordinal, its UUID and NVML's index.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NvmlDevice {
    pub(crate) cuda_index: usize,
    pub(crate) uuid: Option<String>,
    pub(crate) nvml_index: u32,
}

/// Expandable segments on the CUDA backend: address-range and page maps.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct DeviceMaps {
    pub(crate) range_maps: u64,
    pub(crate) page_maps: u64,
}

/// `synth --json`'s `categories`: the same names as `replay --json`'s, so
/// synth and replay compare category by category.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SynthCategories {
    /// "model": the synthetic model says what each tensor is.
    pub(crate) evidence: &'static str,
    pub(crate) at_peak: crate::analysis::categories::CategoryBytes,
    pub(crate) at_end: crate::analysis::categories::CategoryBytes,
}
