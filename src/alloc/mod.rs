//! A faithful model of PyTorch 2.11's CUDA caching allocator. It knows
//! nothing of CUDA or terminals: segment memory comes through the `Device`
//! it defines (`backing`), which `crate::device` implements.

mod allocator;
pub mod backing;
pub mod config;
pub mod event;
mod index;
pub mod snapshot;
pub mod stats;

pub(crate) use allocator::reservation_size;
pub use allocator::{
    AllocError, BlockId, BlockView, CachingAllocator, MempoolId, OutOfMemory, PoolSlot, PoolView, Route, SeedBlock,
    SeedSegment, StatePoint,
};
pub use backing::{Device, DeviceError};
pub use config::{AllocatorConfig, ConfigError};
pub use event::{Action, Event};
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use stats::{DeviceStats, Kind, Stat};
