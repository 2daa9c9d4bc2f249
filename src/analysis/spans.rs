//! Passes over a trace's events cut into spans, one per core, on scoped
//! threads: the categories read ten million events several times over, and
//! one pass after the other on one thread was half a second after the
//! decoding (docs/measurements/benchmarks.md, "Ten million events").

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// How a pass over `n` events is cut: into spans of at least `min` events,
/// at most one per core.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spans {
    min: usize,
    cores: usize,
}

impl Spans {
    /// A span of fewer events than this is not worth a thread's start
    /// (tens of microseconds; an event's work is a few nanoseconds).
    const MIN: usize = 1 << 16;

    /// One span per core this process may use.
    pub(crate) fn of_cores() -> Spans {
        Spans { min: Self::MIN, cores: std::thread::available_parallelism().map_or(1, |n| n.get()) }
    }

    /// `k` spans whatever the length: tests cut small traces as a long
    /// one is cut.
    #[cfg(test)]
    pub(crate) fn exactly(k: usize) -> Spans {
        Spans { min: 1, cores: k.max(1) }
    }

    /// How many spans `0..n` is cut into.
    pub(crate) fn count(self, n: usize) -> usize {
        self.cores.min(n / self.min.max(1)).max(1)
    }

    /// The spans of `0..n`, in order, together `0..n`.
    pub(crate) fn cut(self, n: usize) -> Vec<Range<usize>> {
        let k = self.count(n);
        (0..k).map(|j| j * n / k..(j + 1) * n / k).collect()
    }

    /// `cut`, each span's ends moved up to a multiple of `k` (or to `n`):
    /// spans of whole words, or samples, of `k` events. Some may be empty.
    pub(crate) fn cut_whole(self, n: usize, k: usize) -> Vec<Range<usize>> {
        let up = |i: usize| (i.div_ceil(k.max(1)) * k.max(1)).min(n);
        self.cut(n).into_iter().map(|r| up(r.start)..up(r.end)).collect()
    }

    /// `f` over each span of `0..n`; the results in the spans' order.
    pub(crate) fn map<R: Send>(self, n: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
        each(self.cut(n), f)
    }

    /// `f` over each span of `out`'s indices, given that span of `out` to
    /// write; the results in the spans' order.
    pub(crate) fn map_mut<T: Send, R: Send>(
        self,
        out: &mut [T],
        f: impl Fn(Range<usize>, &mut [T]) -> R + Sync,
    ) -> Vec<R> {
        let mut parts = Vec::new();
        let mut rest = out;
        for r in self.cut(rest.len()) {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            parts.push((r, part));
            rest = tail;
        }
        each(parts, |(r, part)| f(r, part))
    }
}

/// `f` over every item, on this thread and up to one more per further core,
/// each taking the next item left; the results in the items' order. A
/// thread the system will not give leaves its items to the others (this one
/// among them); a panic in one is passed on.
pub(crate) fn each<I: Send, R: Send>(items: Vec<I>, f: impl Fn(I) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let helpers = items.len().min(cores).saturating_sub(1);
    let items: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = items.get(k) else { break };
            if let Some(item) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                done.push((k, f(item)));
            }
        }
        done
    };
    let mut out: Vec<(usize, R)> = Vec::with_capacity(items.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..helpers)
            .filter_map(|_| std::thread::Builder::new().name("spans".into()).spawn_scoped(s, work).ok())
            .collect();
        out.extend(work());
        for t in threads {
            out.extend(joined(t));
        }
    });
    out.sort_unstable_by_key(|(k, _)| *k);
    out.into_iter().map(|(_, r)| r).collect()
}

/// What a scoped thread made; its panic passed on.
pub(crate) fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spans are `0..n` in order, none shorter than the least asked
    /// for, at most one per core (or as many as asked for).
    #[test]
    fn spans_cover_the_events_in_order() {
        for (sp, n, k) in [
            (Spans { min: 4, cores: 3 }, 10, 2),
            (Spans { min: 4, cores: 3 }, 100, 3),
            (Spans { min: 4, cores: 3 }, 3, 1),
            (Spans::exactly(5), 12, 5),
            (Spans::exactly(5), 0, 1),
        ] {
            let cut = sp.cut(n);
            assert_eq!(cut.len(), k, "{sp:?} of {n}");
            assert_eq!(cut.first().map(|r| r.start), Some(0));
            assert_eq!(cut.last().map(|r| r.end), Some(n));
            assert!(cut.windows(2).all(|w| w[0].end == w[1].start), "{cut:?}");
            assert!(k == 1 || cut.iter().all(|r| r.len() >= sp.min), "{cut:?}");
            // Whole words of 8: every inner end a multiple (or `n`), together `0..n`.
            let whole = sp.cut_whole(n, 8);
            assert_eq!(whole.len(), k);
            assert_eq!(whole.first().map(|r| r.start), Some(0));
            assert_eq!(whole.last().map(|r| r.end), Some(n));
            let at_whole = |i: usize| i % 8 == 0 || i == n;
            assert!(whole.windows(2).all(|w| w[0].end == w[1].start && at_whole(w[0].end)), "{whole:?}");
        }
        assert_eq!(Spans::exactly(3).cut_whole(100, 8), [0..40, 40..72, 72..100]);
    }

    /// Each span writes its own part; results come back in the spans'
    /// order, however the threads finish.
    #[test]
    fn map_mut_writes_each_span_and_keeps_order() {
        let mut out = vec![0usize; 1000];
        let firsts = Spans::exactly(7).map_mut(&mut out, |r, part| {
            // The later spans done first.
            std::thread::sleep(std::time::Duration::from_millis(10 - r.start as u64 / 150));
            for (i, x) in r.clone().zip(part) {
                *x = i * 2;
            }
            r.start
        });
        assert_eq!(out, (0..1000).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(firsts, Spans::exactly(7).cut(1000).iter().map(|r| r.start).collect::<Vec<_>>());
        assert_eq!(each((0..40).collect(), |i: u32| i * i), (0..40).map(|i| i * i).collect::<Vec<_>>());
    }

    /// A panic on another thread is the caller's, not a lost result.
    #[test]
    fn a_panic_is_passed_on() {
        let caught = std::panic::catch_unwind(|| {
            Spans::exactly(4).map(400, |r| assert!(r.start != 300, "span at 300"));
        });
        assert!(caught.is_err());
    }
}
