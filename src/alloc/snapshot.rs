//! Segment and block listing in the schema of `torch.cuda.memory_snapshot()`.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    pub(crate) fn from_name(s: &str) -> Option<Self> {
        match s {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    /// Stale for inactive blocks, as in PyTorch.
    pub requested_size: u64,
    pub state: BlockState,
    /// The caller's context id of the live allocation (0 = none).
    #[serde(skip)]
    pub tag: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentInfo {
    pub device: i32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: &'static str,
    pub is_expandable: bool,
    /// `segment_pool_id`: (0,0) for the default pools; `None` for a private
    /// pool whose id the recording does not carry.
    pub pool: Option<(u64, u64)>,
    /// Whether the segment belongs to a private pool (CUDA graph, MemPool).
    pub private: bool,
    pub blocks: Vec<BlockInfo>,
}
