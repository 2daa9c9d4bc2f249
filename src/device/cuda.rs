//! Segments in real device memory through the CUDA driver API (cudarc,
//! loaded at run time): cuMemAlloc/cuMemFree for segments, and for
//! expandable segments an address reservation whose pages are created,
//! mapped and made accessible one page at a time, as PyTorch does.

use std::collections::HashMap;

use cudarc::driver::{result, sys};

use super::{Device, DeviceError};

/// Why the CUDA backend cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    #[error("no CUDA driver library (libcuda.so) found")]
    NoDriver,
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("no CUDA device {index} (this machine has {count})")]
    NoDevice { index: usize, count: usize },
}

fn err(e: result::DriverError) -> DeviceError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceError::OutOfMemory
    } else {
        // The allocator treats any failure as out of memory; say what it was.
        eprintln!("gpumem-top: CUDA driver error: {e:?}");
        DeviceError::Other(format!("{e:?}"))
    }
}

/// "GPU-" and the 16 bytes as 8-4-4-4-12 hex digits, NVML's UUID form.
pub(crate) fn uuid_string(b: &[u8; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// One GPU's primary context, current on the thread that made it.
pub struct Cuda {
    index: usize,
    dev: sys::CUdevice,
    name: String,
    /// "GPU-xxxxxxxx-…", NVML's form: CUDA and NVML number GPUs differently.
    uuid: Option<String>,
    total: u64,
    touch: bool,
    segments: HashMap<u64, u64>,
    /// Mapped pages of expandable segments: address → (handle, size).
    pages: HashMap<u64, (sys::CUmemGenericAllocationHandle, u64)>,
    reservations: HashMap<u64, u64>,
    /// cuMemMap calls that mapped a page range (one per `map`).
    pub(crate) range_maps: u64,
    pub(crate) page_maps: u64,
}

impl Cuda {
    /// True when libcuda loads and reports at least one device.
    pub(crate) fn available() -> bool {
        Cuda::device_count().is_ok_and(|n| n > 0)
    }

    pub(crate) fn device_count() -> Result<usize, CudaUnavailable> {
        // Loading the library panics inside cudarc when it is missing: ask first.
        // SAFETY: only tries to dlopen libcuda; no CUDA state is touched.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaUnavailable::NoDriver);
        }
        result::init().map_err(|e| CudaUnavailable::Driver(format!("cuInit: {e:?}")))?;
        let n = result::device::get_count().map_err(|e| CudaUnavailable::Driver(format!("{e:?}")))?;
        Ok(n.max(0) as usize)
    }

    /// Opens device `index`, making its primary context current here.
    /// `touch`: write every new segment so the driver commits its pages.
    pub fn open(index: usize, touch: bool) -> Result<Cuda, CudaUnavailable> {
        let count = Cuda::device_count()?;
        if index >= count {
            return Err(CudaUnavailable::NoDevice { index, count });
        }
        let d = |e: result::DriverError| CudaUnavailable::Driver(format!("{e:?}"));
        let dev = result::device::get(index as i32).map_err(d)?;
        let name = result::device::get_name(dev).map_err(d)?;
        // SAFETY: `dev` is a device handle cuDeviceGet just returned.
        let total = unsafe { result::device::total_mem(dev) }.map_err(d)? as u64;
        let uuid = result::device::get_uuid(dev).ok().map(|u| uuid_string(&u.bytes.map(|b| b as u8)));
        // SAFETY: `dev` is valid; the retained primary context is released
        // in `Drop`, and made current on this thread, which makes every call below.
        unsafe {
            let ctx = result::primary_ctx::retain(dev).map_err(d)?;
            result::ctx::set_current(ctx).map_err(d)?;
        }
        Ok(Cuda {
            index,
            dev,
            name,
            uuid,
            total,
            touch,
            segments: HashMap::new(),
            pages: HashMap::new(),
            reservations: HashMap::new(),
            range_maps: 0,
            page_maps: 0,
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The GPU's UUID as NVML writes it.
    pub(crate) fn uuid(&self) -> Option<&str> {
        self.uuid.as_deref()
    }

    /// Bytes of device memory this backend holds now.
    pub(crate) fn held(&self) -> u64 {
        self.segments.values().sum::<u64>() + self.pages.values().map(|p| p.1).sum::<u64>()
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; zero is its documented default.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = self.index as i32;
        p
    }

    fn touch(&self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        if self.touch {
            // SAFETY: [ptr, ptr + size) is memory this backend allocated or
            // mapped in the current context.
            unsafe {
                sys::cuMemsetD8_v2(ptr, 0, size as usize).result().map_err(err)?;
                sys::cuCtxSynchronize().result().map_err(err)?;
            }
        }
        Ok(())
    }

    /// Returns everything still held (a safety net behind the allocator's
    /// own release on exit).
    pub(crate) fn release_everything(&mut self) {
        for (ptr, _) in std::mem::take(&mut self.segments) {
            // SAFETY: a pointer cuMemAlloc returned, taken out of the map so it is freed once.
            let _ = unsafe { result::free_sync(ptr) };
        }
        for (ptr, (h, size)) in std::mem::take(&mut self.pages) {
            // SAFETY: a page this backend mapped at `ptr` with handle `h`, unmapped and released once.
            unsafe {
                let _ = sys::cuMemUnmap(ptr, size as usize);
                let _ = sys::cuMemRelease(h);
            }
        }
        for (base, size) in std::mem::take(&mut self.reservations) {
            // SAFETY: a range cuMemAddressReserve returned, its pages unmapped above.
            let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        self.release_everything();
        // SAFETY: releases the reference `open` retained, after every allocation in it is gone.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

impl Device for Cuda {
    fn describe(&self) -> String {
        format!("{} #{}", self.name, self.index)
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn free_memory(&self, _at_event: u64) -> u64 {
        result::mem_get_info().map_or(0, |(free, _)| free as u64)
    }
    fn malloc(&mut self, size: u64, _at_event: u64) -> Result<u64, DeviceError> {
        // SAFETY: cuMemAlloc in the current context; the pointer is kept until freed.
        let ptr = unsafe { result::malloc_sync(size as usize) }.map_err(err)?;
        self.segments.insert(ptr, size);
        if let Err(e) = self.touch(ptr, size) {
            self.free(ptr, size);
            return Err(e);
        }
        Ok(ptr)
    }
    fn free(&mut self, ptr: u64, _size: u64) {
        if self.segments.remove(&ptr).is_some() {
            // SAFETY: a pointer cuMemAlloc returned, removed from the map so it is freed once.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
    fn reserve(&mut self, size: u64, page: u64, _at_event: u64) -> Result<u64, DeviceError> {
        let _ = page;
        let mut ptr: sys::CUdeviceptr = 0;
        // Alignment 0 (the granularity), as PyTorch asks: 20 MiB is not a power of two.
        // SAFETY: `ptr` is a valid out-parameter; no fixed address is asked for.
        unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, 0, 0, 0) }.result().map_err(err)?;
        self.reservations.insert(ptr, size);
        Ok(ptr)
    }
    fn map(&mut self, ptr: u64, size: u64, page: u64, _at_event: u64) -> Result<(), DeviceError> {
        let prop = self.prop();
        let mut done = Vec::new();
        let mut addr = ptr;
        while addr < ptr + size {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `h` is a valid out-parameter and `prop` a filled allocation property.
            let r = unsafe { sys::cuMemCreate(&mut h, page as usize, &prop, 0) }.result();
            if let Err(e) = r {
                // Undo the pages of this range, as PyTorch does on failure.
                for a in done {
                    self.unmap(a, page, page);
                }
                return Err(err(e));
            }
            // SAFETY: `addr` is an unmapped page inside a range this backend reserved; `h` was just created.
            unsafe { sys::cuMemMap(addr, page as usize, 0, h, 0) }.result().map_err(err)?;
            self.pages.insert(addr, (h, page));
            done.push(addr);
            self.page_maps += 1;
            addr += page;
        }
        let desc = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: [ptr, ptr + size) was mapped just above; `desc` outlives the call.
        unsafe { sys::cuMemSetAccess(ptr, size as usize, &desc, 1) }.result().map_err(err)?;
        self.range_maps += 1;
        self.touch(ptr, size)
    }
    fn unmap(&mut self, ptr: u64, size: u64, page: u64) {
        let mut addr = ptr;
        while addr < ptr + size {
            if let Some((h, sz)) = self.pages.remove(&addr) {
                // SAFETY: a page this backend mapped, removed from the map so it is unmapped once.
                unsafe {
                    let _ = sys::cuMemUnmap(addr, sz as usize);
                    let _ = sys::cuMemRelease(h);
                }
            }
            addr += page;
        }
    }
    fn release_reservation(&mut self, base: u64, size: u64) {
        if self.reservations.remove(&base).is_some() {
            // SAFETY: a range cuMemAddressReserve returned, removed from the map so it is freed once.
            let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let b: [u8; 16] =
            [0xb9, 0xdc, 0x43, 0x16, 0xbc, 0x43, 0x8b, 0xe3, 0xfa, 0x72, 0x52, 0x43, 0x7b, 0x5f, 0x57, 0x18];
        assert_eq!(super::uuid_string(&b), "GPU-b9dc4316-bc43-8be3-fa72-52437b5f5718");
    }
}
