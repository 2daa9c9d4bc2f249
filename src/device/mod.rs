//! Where segment memory comes from. The allocator asks a `Device` for whole
//! segments (cudaMalloc/cudaFree) and, for expandable segments, for address
//! reservations and page mappings (cuMemAddressReserve/cuMemCreate+cuMemMap).
//! Devices make no policy decisions.

mod cuda;
mod oracle;
mod sim;

pub use cuda::{Cuda, CudaUnavailable};
pub use oracle::Oracle;
pub use sim::{Sim, SimFault};

// The allocator defines what it needs of a device (`alloc::backing`); the
// devices here implement it (docs/design/architecture.md).
pub use crate::alloc::backing::{Device, DeviceError};

/// totalGlobalMem of the H200 the calibration traces were recorded on.
pub const DEFAULT_DEVICE_TOTAL: u64 = 150_109_880_320;
/// CUDA context size assumed by what-if runs on the simulated device.
pub const CUDA_CONTEXT_BYTES: u64 = 590 << 20;
