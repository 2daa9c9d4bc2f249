//! A device that answers as the recorded one did: cudaMalloc succeeds with the
//! recorded address when the recorded run's next event is a `segment_alloc` of
//! that size, and fails (as a device out-of-memory) otherwise. That reproduces
//! real addresses, which best fit depends on, and the device-OOM retry paths,
//! without knowing the device's free memory.

use super::{Device, DeviceError};
use crate::alloc::{Action, Event, EventsRef};

#[derive(Debug, Clone)]
pub struct Oracle<'a> {
    recorded: EventsRef<'a>,
    total: u64,
    used: u64,
}

impl<'a> Oracle<'a> {
    pub fn new(recorded: EventsRef<'a>, total: u64) -> Self {
        Oracle { recorded, total, used: 0 }
    }

    /// The same device answering from `recorded` (the column it read,
    /// grown or moved).
    pub(crate) fn rebind<'b>(self, recorded: EventsRef<'b>) -> Oracle<'b> {
        Oracle { recorded, total: self.total, used: self.used }
    }

    fn at(&self, i: u64) -> Option<Event> {
        self.recorded.get(usize::try_from(i).ok()?)
    }
}

impl Device for Oracle<'_> {
    fn describe(&self) -> String {
        "recorded device".into()
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn free_memory(&self, at_event: u64) -> u64 {
        match self.at(at_event) {
            Some(e) if e.action == Action::Oom => e.addr,
            _ => self.total.saturating_sub(self.used),
        }
    }
    fn malloc(&mut self, size: u64, at_event: u64) -> Result<u64, DeviceError> {
        match self.at(at_event) {
            Some(e) if e.action == Action::SegmentAlloc && e.size == size => {
                self.used += size;
                Ok(e.addr)
            }
            _ => Err(DeviceError::OutOfMemory),
        }
    }
    fn free(&mut self, _ptr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
    }
    fn reserve(&mut self, _size: u64, _page: u64, at_event: u64) -> Result<u64, DeviceError> {
        // A new reservation is mapped from its base at once, so the recorded
        // `segment_map` that follows starts at the reservation's base.
        match self.at(at_event) {
            Some(e) if e.action == Action::SegmentMap => Ok(e.addr),
            _ => Err(DeviceError::OutOfMemory),
        }
    }
    fn map(&mut self, ptr: u64, size: u64, _page: u64, at_event: u64) -> Result<(), DeviceError> {
        match self.at(at_event) {
            Some(e) if e.action == Action::SegmentMap && e.addr == ptr && e.size == size => {
                self.used += size;
                Ok(())
            }
            _ => Err(DeviceError::OutOfMemory),
        }
    }
    fn unmap(&mut self, _ptr: u64, size: u64, _page: u64) {
        self.used = self.used.saturating_sub(size);
    }
    fn release_reservation(&mut self, _base: u64, _size: u64) {}
}
