//! A simulated device: a capacity, a deterministic address model and fault
//! injection. Addresses grow monotonically from a fixed base, 2 MiB aligned,
//! and are never reused, so a run is reproducible and blocks never alias.

use super::{Device, DeviceError};

/// Faults a test can inject into a `Sim`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimFault {
    /// cudaMalloc calls (1-based) that fail with out-of-memory.
    pub fail_mallocs: Vec<u64>,
    /// Page-mapping calls (1-based) that fail with out-of-memory.
    pub fail_maps: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Sim {
    name: String,
    capacity: u64,
    context: u64,
    used: u64,
    peak_used: u64,
    next_addr: u64,
    mallocs: u64,
    maps: u64,
    fault: SimFault,
    descending: bool,
}

const BASE: u64 = 0x7f00_0000_0000;
/// Where descending addresses start (below the 47-bit user space's top).
const TOP: u64 = 0x7fff_0000_0000;
const ALIGN: u64 = 2 << 20;

impl Sim {
    /// `capacity`: totalGlobalMem; `context`: bytes the CUDA context takes
    /// before the allocator gets any (about 590 MiB on an H200).
    pub fn new(name: impl Into<String>, capacity: u64, context: u64) -> Self {
        Sim {
            name: name.into(),
            capacity,
            context: context.min(capacity),
            used: 0,
            peak_used: 0,
            next_addr: BASE,
            mallocs: 0,
            maps: 0,
            fault: SimFault::default(),
            descending: false,
        }
    }

    /// The H200 the calibration traces were recorded on: 150,109,880,320 bytes,
    /// a 590 MiB context.
    pub fn h200() -> Self {
        Sim::new("simulated NVIDIA H200", 150_109_880_320, 590 << 20)
    }

    pub fn with_fault(mut self, fault: SimFault) -> Self {
        self.fault = fault;
        self
    }

    /// Bytes of segments and mapped pages now held (context excluded).
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn peak_used(&self) -> u64 {
        self.peak_used
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn mallocs(&self) -> u64 {
        self.mallocs
    }

    fn take(&mut self, size: u64) -> Result<(), DeviceError> {
        if self.used + size > self.capacity - self.context {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += size;
        self.peak_used = self.peak_used.max(self.used);
        Ok(())
    }

    fn carve(&mut self, size: u64) -> u64 {
        if self.descending {
            self.next_addr -= size.div_ceil(ALIGN) * ALIGN;
            return self.next_addr;
        }
        let a = self.next_addr;
        self.next_addr = (a + size).div_ceil(ALIGN) * ALIGN;
        a
    }

    /// New segments at ever lower addresses, as CUDA's driver hands them out
    /// on the H200 traces: best fit breaks ties between equal blocks by
    /// address, so a replay of recorded requests then reuses the blocks the
    /// real run reused (docs/user/fit.md).
    pub(crate) fn with_descending_addresses(mut self) -> Self {
        self.descending = true;
        self.next_addr = TOP;
        self
    }
}

impl Device for Sim {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn total_memory(&self) -> u64 {
        self.capacity
    }
    fn free_memory(&self, _at_event: u64) -> u64 {
        self.capacity - self.context - self.used
    }
    fn process_used(&self) -> Option<u64> {
        Some(self.context + self.used)
    }
    fn malloc(&mut self, size: u64, _at_event: u64) -> Result<u64, DeviceError> {
        self.mallocs += 1;
        if self.fault.fail_mallocs.contains(&self.mallocs) {
            return Err(DeviceError::OutOfMemory);
        }
        self.take(size)?;
        Ok(self.carve(size))
    }
    fn free(&mut self, _ptr: u64, size: u64) {
        self.used -= size.min(self.used);
    }
    fn reserve(&mut self, size: u64, page: u64, _at_event: u64) -> Result<u64, DeviceError> {
        // Reservations take address space only; align to the page size.
        self.next_addr = self.next_addr.div_ceil(page) * page;
        Ok(self.carve(size))
    }
    fn map(&mut self, _ptr: u64, size: u64, _page: u64, _at_event: u64) -> Result<(), DeviceError> {
        self.maps += 1;
        if self.fault.fail_maps.contains(&self.maps) {
            return Err(DeviceError::OutOfMemory);
        }
        self.take(size)
    }
    fn unmap(&mut self, _ptr: u64, size: u64, _page: u64) {
        self.used -= size.min(self.used);
    }
    fn release_reservation(&mut self, _base: u64, _size: u64) {}
}
