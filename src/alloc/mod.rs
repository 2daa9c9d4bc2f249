//! A faithful model of PyTorch's CUDA caching allocator, 2.11 to 2.15 (the
//! differences between releases are data in `release`). It knows
//! nothing of CUDA or terminals: segment memory comes through the `Device`
//! it defines (`backing`), which `crate::device` implements.

mod allocator;
pub mod backing;
pub mod config;
pub mod event;
mod index;
pub mod release;
pub mod snapshot;
pub mod stats;

pub(crate) use allocator::{reservation_size, PackedPools};
pub use allocator::{
    AllocError, BlockId, BlockView, CachingAllocator, MempoolId, OutOfMemory, PoolSlot, PoolView, Route, SeedBlock,
    SeedSegment, StatePoint,
};
pub use backing::{Device, DeviceError};
pub use config::{AllocatorConfig, ConfigError, Reserve};
pub use event::{Action, Event, Events, EventsRef};
pub use release::{BadRelease, Release, TieBreak};
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use stats::{DeviceStats, Kind, Stat};
