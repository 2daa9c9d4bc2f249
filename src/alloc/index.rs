//! The allocator's free-block index.
//!
//! `FreeBlocks` keeps free blocks in PyTorch's best-fit order, (size, tie,
//! ptr), where `tie` is the release's tie-break between equal sizes (0 where
//! the address alone decides, docs/design/pytorch-allocator.md "Releases"),
//! in TLSF-style bins: 64 sub-bins per power of two, a bitmap of the
//! non-empty ones, and inside each bin its blocks in order, the first inline
//! (docs/design/allocator.md, "Free-block bins"). Best fit is a bit scan
//! plus a look at the few blocks of one bin instead of a tree descent; the
//! exact order, and so PyTorch's choice among equal sizes, is kept.

use std::collections::VecDeque;

const SUB_BITS: u32 = 6;
const WORDS: usize = 64;

/// The bin of a size: `floor(log2(size))` and the next 6 bits below it.
/// Monotonic in size, so bins in index order hold sizes in ascending order.
#[inline]
fn bin_of(size: u64) -> usize {
    let fl = 63 - (size | 1 << SUB_BITS).leading_zeros();
    let sl = (size >> (fl - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    ((fl - SUB_BITS) as usize) << SUB_BITS | sl as usize
}

/// (size, tie, ptr, block index).
pub(crate) type Entry = (u64, u64, u64, u32);

/// One bin's blocks in (size, tie, ptr) order: the first kept inline, the
/// others in a deque. Most bins hold one block, so most inserts and removes
/// touch only the bins' own array, not a buffer of their own that has gone
/// cold in the cache (docs/design/allocator.md, "Free-block bins").
#[derive(Debug, Clone, Default)]
struct Bin {
    head: Option<Entry>,
    /// Those after `head`, in order; empty while `head` is `None`.
    rest: VecDeque<Entry>,
}

impl Bin {
    #[inline]
    fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    #[inline]
    fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    #[inline]
    fn front(&self) -> Option<&Entry> {
        self.head.as_ref()
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&Entry> {
        match i {
            0 => self.head.as_ref(),
            _ => self.rest.get(i - 1),
        }
    }

    #[inline]
    fn get_mut(&mut self, i: usize) -> Option<&mut Entry> {
        match i {
            0 => self.head.as_mut(),
            _ => self.rest.get_mut(i - 1),
        }
    }

    /// At the end; the caller keeps the order.
    #[inline]
    fn push_back(&mut self, e: Entry) {
        match self.head {
            None => self.head = Some(e),
            Some(_) => self.rest.push_back(e),
        }
    }

    #[inline]
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Entry> + '_ {
        self.head.iter().chain(self.rest.iter())
    }

    /// Entries `..end`.
    fn before(&self, end: usize) -> impl DoubleEndedIterator<Item = &Entry> + '_ {
        self.head.iter().take(end.min(1)).chain(self.rest.range(..end.saturating_sub(1).min(self.rest.len())))
    }

    /// Entries `start..`.
    fn after(&self, start: usize) -> impl Iterator<Item = &Entry> + '_ {
        self.head.iter().skip(start.min(1)).chain(self.rest.range(start.saturating_sub(1).min(self.rest.len())..))
    }

    /// The first entry not below (`size`, `tie`, `ptr`).
    #[inline]
    fn pos(&self, size: u64, tie: u64, ptr: u64) -> usize {
        match self.head {
            Some(h) if (h.0, h.1, h.2) < (size, tie, ptr) => {
                1 + self.rest.partition_point(|e| (e.0, e.1, e.2) < (size, tie, ptr))
            }
            _ => 0,
        }
    }

    /// The first entry whose size is at least `size`.
    #[inline]
    fn first_sized(&self, size: u64) -> Option<usize> {
        match self.head {
            Some(h) if h.0 >= size => Some(0),
            Some(_) => self.rest.iter().position(|e| e.0 >= size).map(|i| i + 1),
            None => None,
        }
    }

    #[inline]
    fn insert_at(&mut self, i: usize, e: Entry) {
        match i {
            0 => {
                if let Some(h) = self.head.replace(e) {
                    self.rest.push_front(h);
                }
            }
            _ => insert_at(&mut self.rest, i - 1, e),
        }
    }

    #[inline]
    fn remove_at(&mut self, i: usize) {
        match i {
            0 => self.head = self.rest.pop_front(),
            _ => remove_at(&mut self.rest, i - 1),
        }
    }
}

/// Free blocks of one (pool, stream) keyed by (size, tie, ptr).
#[derive(Debug)]
pub(crate) struct FreeBlocks {
    /// Bins `lo..lo + bins.len()`, each sorted by (size, tie, ptr); grown on
    /// demand to span the bins used, so a stream holding one block keeps
    /// one bin (a trace may have a stream per block). The rest of a bin
    /// is a deque, since best fit takes the lowest address among equal
    /// sizes: runs of equal free segments change at the front.
    bins: Vec<Bin>,
    lo: usize,
    words: [u64; WORDS],
    summary: u64,
}

/// A kept copy's free blocks: every entry in order, one allocation instead
/// of a bin each (docs/design/allocator.md, "Checkpoints").
#[derive(Debug, Clone)]
pub(crate) struct PackedBlocks(Box<[Entry]>);

impl PackedBlocks {
    /// The blocks again, binned.
    pub(crate) fn unpacked(&self) -> FreeBlocks {
        let mut f = FreeBlocks::default();
        for &e in self.0.iter() {
            let b = bin_of(e.0);
            // In order, so each goes at its bin's end.
            f.bin_grown(b).push_back(e);
            f.set(b);
        }
        f
    }
}

/// Cloned before every speculative malloc of a replay: most of the bins are
/// empty, so only the occupied ones are copied.
impl Clone for FreeBlocks {
    fn clone(&self) -> Self {
        let mut bins: Vec<Bin> = Vec::new();
        bins.resize_with(self.bins.len(), Bin::default);
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let b = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                bins[b - self.lo] = self.bins[b - self.lo].clone();
            }
        }
        FreeBlocks { bins, lo: self.lo, words: self.words, summary: self.summary }
    }
}

impl Default for FreeBlocks {
    fn default() -> Self {
        FreeBlocks { bins: Vec::new(), lo: 0, words: [0; WORDS], summary: 0 }
    }
}

/// Moves by swaps when the nearer end is close: inline, where the deque's own
/// insert/remove call `memmove` even for one element.
const SHORT: usize = 8;

#[inline]
fn insert_at(bin: &mut VecDeque<Entry>, i: usize, e: Entry) {
    let n = bin.len();
    if i <= SHORT.min(n - i) {
        bin.push_front(e);
        for j in 0..i {
            bin.swap(j, j + 1);
        }
    } else if n - i <= SHORT {
        bin.push_back(e);
        let mut j = n;
        while j > i {
            bin.swap(j, j - 1);
            j -= 1;
        }
    } else {
        bin.insert(i, e);
    }
}

#[inline]
fn remove_at(bin: &mut VecDeque<Entry>, i: usize) {
    let n = bin.len();
    if i <= SHORT.min(n - 1 - i) {
        let mut j = i;
        while j > 0 {
            bin.swap(j, j - 1);
            j -= 1;
        }
        bin.pop_front();
    } else if n - 1 - i <= SHORT {
        for j in i..n - 1 {
            bin.swap(j, j + 1);
        }
        bin.pop_back();
    } else {
        bin.remove(i);
    }
}

impl FreeBlocks {
    #[inline]
    fn set(&mut self, b: usize) {
        self.words[b / 64] |= 1 << (b % 64);
        self.summary |= 1 << (b / 64);
    }

    #[inline]
    fn clear(&mut self, b: usize) {
        self.words[b / 64] &= !(1 << (b % 64));
        if self.words[b / 64] == 0 {
            self.summary &= !(1 << (b / 64));
        }
    }

    /// The first non-empty bin after `b`.
    #[inline]
    fn next_bin(&self, b: usize) -> Option<usize> {
        let (w, bit) = (b / 64, b % 64);
        let rest = if bit == 63 { 0 } else { self.words[w] & (!0u64 << (bit + 1)) };
        if rest != 0 {
            return Some(w * 64 + rest.trailing_zeros() as usize);
        }
        let later = if w == 63 { 0 } else { self.summary & (!0u64 << (w + 1)) };
        if later == 0 {
            return None;
        }
        let w = later.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The last non-empty bin before `b`.
    fn prev_bin(&self, b: usize) -> Option<usize> {
        let (w, bit) = (b / 64, b % 64);
        let rest = self.words[w] & ((1u64 << bit) - 1);
        if rest != 0 {
            return Some(w * 64 + 63 - rest.leading_zeros() as usize);
        }
        let earlier = self.summary & ((1u64 << w) - 1);
        if earlier == 0 {
            return None;
        }
        let w = 63 - earlier.leading_zeros() as usize;
        Some(w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }

    fn bins_after(&self, b: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cur = b;
        std::iter::from_fn(move || {
            let n = self.next_bin(cur)?;
            cur = n;
            Some(n)
        })
    }

    fn bins_before(&self, b: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cur = b;
        std::iter::from_fn(move || {
            let n = self.prev_bin(cur)?;
            cur = n;
            Some(n)
        })
    }

    #[inline]
    fn bin(&self, b: usize) -> Option<&Bin> {
        b.checked_sub(self.lo).and_then(|i| self.bins.get(i))
    }

    /// Bin `b`, the span of bins grown to take it.
    fn bin_grown(&mut self, b: usize) -> &mut Bin {
        if self.bins.is_empty() {
            self.lo = b;
        } else if b < self.lo {
            let mut grown = Vec::with_capacity(self.bins.len() + self.lo - b);
            grown.resize_with(self.lo - b, Bin::default);
            grown.append(&mut self.bins);
            self.bins = grown;
            self.lo = b;
        }
        if b - self.lo >= self.bins.len() {
            self.bins.resize_with(b - self.lo + 1, Bin::default);
        }
        &mut self.bins[b - self.lo]
    }

    /// Every entry in order, for keeping (`PackedBlocks::unpacked`).
    pub(crate) fn packed(&self) -> PackedBlocks {
        PackedBlocks(self.iter().collect())
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.summary == 0
    }

    /// Free blocks held.
    pub(crate) fn len(&self) -> usize {
        self.bins.iter().map(Bin::len).sum()
    }

    pub(crate) fn insert(&mut self, size: u64, tie: u64, ptr: u64, v: u32) {
        let b = bin_of(size);
        let bin = self.bin_grown(b);
        if bin.is_empty() {
            // Most bins hold nothing or one block.
            bin.push_back((size, tie, ptr, v));
            self.set(b);
            return;
        }
        let i = bin.pos(size, tie, ptr);
        match bin.get_mut(i) {
            Some(e) if (e.0, e.1, e.2) == (size, tie, ptr) => e.3 = v,
            _ => bin.insert_at(i, (size, tie, ptr, v)),
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, size: u64, tie: u64, ptr: u64) -> Option<u32> {
        let b = bin_of(size);
        let bin = b.checked_sub(self.lo).and_then(|i| self.bins.get_mut(i))?;
        let i = bin.pos(size, tie, ptr);
        let e = *bin.get(i).filter(|e| (e.0, e.1, e.2) == (size, tie, ptr))?;
        bin.remove_at(i);
        if bin.is_empty() {
            self.clear(b);
        }
        Some(e.3)
    }

    /// The first block with (size, tie, ptr) >= (`size`, 0, 0): PyTorch's lower_bound.
    #[inline]
    pub(crate) fn first_from(&self, size: u64) -> Option<Entry> {
        let b = bin_of(size);
        if let Some(bin) = self.bin(b) {
            if let Some(e) = bin.first_sized(size).and_then(|i| bin.get(i)) {
                return Some(*e);
            }
        }
        self.next_bin(b).and_then(|n| self.bins[n - self.lo].front().copied())
    }

    /// Removes and returns the first block with (size, tie, ptr) >= (`size`, 0, 0)
    /// if `accept` takes it; the lookup is done once for both.
    #[inline]
    pub(crate) fn take_first_from(&mut self, size: u64, accept: impl FnOnce(&Entry) -> bool) -> Option<Entry> {
        let mut b = bin_of(size);
        let mut i = match self.bin(b) {
            Some(bin) => bin.first_sized(size),
            None => None,
        };
        if i.is_none() {
            b = self.next_bin(b)?;
            i = Some(0);
        }
        let i = i?;
        let bin = &mut self.bins[b - self.lo];
        let e = *bin.get(i)?;
        if !accept(&e) {
            return None;
        }
        bin.remove_at(i);
        if bin.is_empty() {
            self.clear(b);
        }
        Some(e)
    }

    /// Blocks with (size, tie, ptr) >= (`size`, 0, 0), ascending.
    pub(crate) fn range_from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let b = bin_of(size);
        let first = self.bin(b).into_iter().flat_map(move |bin| bin.after(bin.pos(size, 0, 0)));
        first.chain(self.bins_after(b).flat_map(|n| self.bins[n - self.lo].iter())).copied()
    }

    /// Blocks with (size, tie, ptr) < (`size`, 0, 0), descending.
    pub(crate) fn range_below_rev(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let b = bin_of(size);
        let first = self.bin(b).into_iter().flat_map(move |bin| bin.before(bin.pos(size, 0, 0)).rev());
        first.chain(self.bins_before(b).flat_map(|n| self.bins[n - self.lo].iter().rev())).copied()
    }

    /// All blocks, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        let first = self.bin(0).into_iter().flat_map(|b| b.iter());
        first.chain(self.bins_after(0).flat_map(|n| self.bins[n - self.lo].iter())).copied()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|e| e.3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, .. ProptestConfig::default() })]

        /// `FreeBlocks` keeps exactly BTreeMap's (size, tie, ptr) order,
        /// sizes spanning 512 B to 1 TiB with many collisions in one bin, and
        /// ties that disagree with addresses; packed and unpacked again (as
        /// a checkpoint keeps them) every 37 operations, it goes on the same.
        #[test]
        fn free_blocks_match_btreemap(ops in prop::collection::vec((0u8..10, 0u32..40, 0u64..50, 9u32..41), 0..600)) {
            let mut ours = FreeBlocks::default();
            let mut model: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
            for (i, (kind, mant, ptr, exp)) in ops.into_iter().enumerate() {
                if i % 37 == 36 {
                    ours = ours.packed().unpacked();
                }
                let size = (1u64 << exp) + mant as u64 * 512;
                let tie = (ptr * 7) % 5;
                let ptr = ptr * 512;
                match kind {
                    0..=4 => {
                        model.insert((size, tie, ptr), i as u32);
                        ours.insert(size, tie, ptr, i as u32);
                    }
                    5..=7 => prop_assert_eq!(ours.remove(size, tie, ptr), model.remove(&(size, tie, ptr))),
                    _ => {
                        let a: Vec<_> = ours.range_from(size).collect();
                        let b: Vec<_> = model.range((size, 0, 0)..).map(|(k, v)| (k.0, k.1, k.2, *v)).collect();
                        prop_assert_eq!(a.first().copied(), ours.first_from(size));
                        if kind == 9 {
                            let took = ours.take_first_from(size, |e| e.2 % 1024 == 0);
                            let want = a.first().copied().filter(|e| e.2 % 1024 == 0);
                            prop_assert_eq!(took, want);
                            if let Some(e) = want {
                                model.remove(&(e.0, e.1, e.2));
                            }
                        }
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = ours.range_below_rev(size).collect();
                        let b: Vec<_> = model.range(..(size, 0, 0)).rev().map(|(k, v)| (k.0, k.1, k.2, *v)).collect();
                        prop_assert_eq!(a, b);
                    }
                }
            }
            let a: Vec<_> = ours.iter().collect();
            let b: Vec<_> = model.iter().map(|(k, v)| (k.0, k.1, k.2, *v)).collect();
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn bins_are_monotonic_in_size() {
        let mut last = 0;
        for s in (512u64..(1 << 24)).step_by(512).chain((24..63).map(|e| 1u64 << e)) {
            let b = bin_of(s);
            assert!(b >= last && b < WORDS * 64, "{s}");
            last = b;
        }
        assert!(bin_of(u64::MAX) < WORDS * 64);
    }
}
