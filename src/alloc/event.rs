//! The allocator's trace events, named as PyTorch's `device_traces` actions.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    /// 2.14+: `torch.cuda.memory._annotate_tensor`: `addr` is the block,
    /// `size` its requested size; memory does not change.
    Annotate,
}

impl Action {
    pub(crate) const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
        Action::Annotate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
        }
    }

    pub fn from_name(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }

    pub fn is_segment(self) -> bool {
        matches!(self, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One trace entry. For `oom`, `addr` holds PyTorch's `device_free`
/// (cudaMemGetInfo's free bytes) and `size` the rounded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

impl Event {
    pub fn new(action: Action, addr: u64, size: u64, stream: u64) -> Self {
        Event { action, addr, size, stream }
    }

    /// Equality as a replay judges it: `oom` entries carry the device's free
    /// bytes in `addr`, which no model of the device can reproduce.
    pub fn same_as(&self, other: &Event) -> bool {
        self.action == other.action
            && self.size == other.size
            && self.stream == other.stream
            && (self.action == Action::Oom || self.addr == other.addr)
    }
}
