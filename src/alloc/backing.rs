//! What the caching allocator needs of a device: whole segments
//! (cudaMalloc/cudaFree) and, for expandable segments, address reservations
//! and page mappings. `crate::device` implements it (the simulated H200, a
//! recorded device, CUDA); the allocator knows nothing of them.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY: the allocator
    /// clears it and goes on to free cached memory and retry.
    #[error("out of device memory")]
    OutOfMemory,
    /// Anything else the device reported.
    #[error("device error: {0}")]
    Other(String),
}

/// The device operations the caching allocator needs. `at_event` is the
/// index the allocator's next trace event will have, so a device that plays
/// back a recorded run (`Oracle`) can answer as the recorded device did.
pub trait Device {
    /// A short description for headers and messages ("simulated H200", ...).
    fn describe(&self) -> String;
    /// `totalGlobalMem`: sizes expandable-segment reservations and memory fractions.
    fn total_memory(&self) -> u64;
    /// cudaMemGetInfo's free bytes.
    fn free_memory(&self, at_event: u64) -> u64;
    /// Memory this process holds on the device, context included, where known
    /// (the OOM message's "this process has … in use").
    fn process_used(&self) -> Option<u64> {
        None
    }
    /// cudaMalloc of a whole segment.
    fn malloc(&mut self, size: u64, at_event: u64) -> Result<u64, DeviceError>;
    /// cudaFree of a whole segment.
    fn free(&mut self, ptr: u64, size: u64);
    /// cuMemAddressReserve of an expandable segment's virtual range.
    fn reserve(&mut self, size: u64, page: u64, at_event: u64) -> Result<u64, DeviceError>;
    /// cuMemCreate + cuMemMap + cuMemSetAccess for the pages of `[ptr, ptr+size)`.
    fn map(&mut self, ptr: u64, size: u64, page: u64, at_event: u64) -> Result<(), DeviceError>;
    /// cuMemUnmap + cuMemRelease for the pages of `[ptr, ptr+size)`.
    fn unmap(&mut self, ptr: u64, size: u64, page: u64);
    /// cuMemAddressFree of a whole reservation.
    fn release_reservation(&mut self, base: u64, size: u64);
}
