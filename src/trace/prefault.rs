//! The pages of a column one thread reserved and another fills, faulted in
//! ahead of the filling by a thread with time to spare: the replay behind
//! the decoder copies every chunk of events into the first chunk's room,
//! and faulting those pages in was a seventh of that thread's time, the
//! thread that bounds a long file's replay (docs/design/trace-decoding.md,
//! "Pages faulted ahead").

/// Where a vector's room lies: its buffer's address, the bytes an element
/// takes, and the elements it has room for. Only the address is kept, not
/// a reference: the vector itself is handed to the thread that fills it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Room {
    addr: usize,
    elem: usize,
    cap: usize,
}

impl Room {
    pub(super) fn new(addr: usize, elem: usize, cap: usize) -> Room {
        Room { addr, elem, cap }
    }

    pub(super) fn of<T>(v: &Vec<T>) -> Room {
        Room::new(v.as_ptr() as usize, std::mem::size_of::<T>(), v.capacity())
    }

    /// Faults in, for writing, the pages that elements `from..to` of the
    /// room lie in (those past the room are left alone); whether the
    /// system did. Where it did not, a page is faulted in where it is first
    /// written, as before.
    pub(super) fn fault_in(&self, from: usize, to: usize) -> bool {
        let to = to.min(self.cap);
        if from >= to || self.elem == 0 {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            let page = page_size();
            let start = (self.addr + from * self.elem) & !(page - 1);
            let end = self.addr + to * self.elem;
            // SAFETY: MADV_POPULATE_WRITE (Linux 5.14) only makes the
            // range's pages present and writable, as a first write would,
            // without reading or writing a byte of them from user space:
            // a present page keeps its contents, an anonymous page not yet
            // present comes in zeroed, as it would have. So the vector's
            // owner, on whatever thread, sees the same bytes, and no Rust
            // reference is made. The start rounded down to its page may lie
            // before the buffer, in memory of another allocation: that
            // memory too keeps its contents. A range no longer mapped (the
            // vector freed), or a kernel without the advice, makes the call
            // fail, which is harmless.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        false
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Minor page faults of this thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to the struct above.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        u.ru_minflt
    }

    /// Faulted in, a room's pages take no fault when written, and what was
    /// written before is still there; without it they fault page by page.
    #[test]
    fn written_after_faulting_in_the_pages_take_no_faults_and_keep_their_bytes() {
        let n = 8 << 20; // 64 MiB of u64: its own mapping, not yet touched.
        let mut v: Vec<u64> = Vec::with_capacity(n);
        v.extend((0..1000u64).map(|i| i * 7));
        let room = Room::of(&v);
        if !room.fault_in(500, n / 2) {
            // A kernel before 5.14 has no such advice: nothing to check.
            return;
        }
        let before = minor_faults();
        v.extend((1000..n as u64 / 2).map(|i| i * 7));
        let first_half = minor_faults() - before;
        let before = minor_faults();
        v.extend((n as u64 / 2..n as u64).map(|i| i * 7));
        let second_half = minor_faults() - before;
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 7));
        assert!(first_half < 8, "{first_half} faults writing pages faulted in");
        // 8,192 pages of 4 KiB, or 16 huge ones.
        assert!(second_half >= 16, "{second_half} faults writing pages left alone");
        // Past the room, or an empty range: nothing asked of the system.
        assert!(!room.fault_in(n, n + 1000));
        assert!(!room.fault_in(10, 10));
    }
}
