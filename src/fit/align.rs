//! Aligning two runs' requests: an order-preserving pairing of requests
//! with equal keys (call site and stream) that prefers pairs whose sizes
//! scale with the batch, so a request only one run makes (a workspace, an
//! algorithm's scratch) is skipped instead of shifting every pairing after it.

/// Pairs a smaller run's allocations (`a`: keys and sizes) with a larger
/// run's (`b`), `ratio` = larger batch / smaller batch: the best-scoring
/// order-preserving pairing of equal keys, where a pair whose sizes are
/// equal or grow by at most the batch ratio scores above one whose sizes do
/// not (the same call site asking for an unrelated size, as cuDNN's
/// algorithm-dependent workspaces do). Computed in a band around the
/// diagonal (the runs make nearly the same requests), so memory and time
/// are O(N·W).
pub(crate) fn scored(a: &[(u64, u64)], b: &[(u64, u64)], ratio: f64) -> Vec<(usize, usize)> {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return Vec::new();
    }
    // Band half-width: the length difference plus room, bounded so the
    // traceback stays under ~64 M cells.
    let w = (n.abs_diff(m) + 256).min((64 << 20) / (2 * n + 1)).max(16);
    let center = |i: usize| i * m / n;
    let lo = |i: usize| center(i).saturating_sub(w);
    let hi = |i: usize| (center(i) + w).min(m);
    let score = |x: (u64, u64), y: (u64, u64)| -> i32 {
        if x.0 != y.0 {
            return -1;
        }
        let (s, l) = (x.1 as f64, y.1 as f64);
        if x.1 == y.1 {
            4
        } else if l > s && l <= s * ratio * 1.05 + 65536.0 {
            3
        } else {
            1
        }
    };
    const NEG: i32 = i32::MIN / 2;
    let mut prev = vec![NEG; m + 1];
    let mut cur = vec![NEG; m + 1];
    // Row 0: skipping b's first j.
    for v in prev.iter_mut().take(hi(0) + 1) {
        *v = 0;
    }
    // Traceback: per row, codes for its band (0 match, 1 skip a, 2 skip b).
    let mut back: Vec<(usize, Vec<u8>)> = Vec::with_capacity(n + 1);
    back.push((0, vec![2; hi(0) + 1]));
    // The band of the row each buffer holds, to clear before reuse.
    let mut cur_band: (usize, usize) = (0, 0);
    let mut prev_band: (usize, usize) = (0, hi(0));
    for i in 1..=n {
        let (l, h) = (lo(i), hi(i));
        for v in cur[cur_band.0..=cur_band.1].iter_mut() {
            *v = NEG;
        }
        for v in cur[l.saturating_sub(1)..=h].iter_mut() {
            *v = NEG;
        }
        let mut codes = vec![1u8; h - l + 1];
        for j in l..=h {
            // Skip a[i-1]: the cell above, if the previous row reached it.
            let mut best = if j >= prev_band.0 && j <= prev_band.1 { prev[j] } else { NEG };
            let mut code = 1u8;
            if j > 0 {
                let left = if j > l { cur[j - 1] } else { NEG };
                if left > best {
                    best = left;
                    code = 2;
                }
                let diag = if j > prev_band.0 && j - 1 <= prev_band.1 { prev[j - 1] } else { NEG };
                let sc = score(a[i - 1], b[j - 1]);
                if sc > 0 && diag > NEG {
                    let d = diag + sc;
                    if d > best {
                        best = d;
                        code = 0;
                    }
                }
            }
            cur[j] = best;
            codes[j - l] = code;
        }
        back.push((l, codes));
        std::mem::swap(&mut prev, &mut cur);
        cur_band = prev_band;
        prev_band = (l, h);
    }
    // Walk back from (n, the best end in the last band).
    let (l, codes) = &back[n];
    let mut j = (*l..=*l + codes.len() - 1).max_by_key(|&j| (prev[j], j)).unwrap_or(m);
    let mut i = n;
    let mut out = Vec::new();
    while i > 0 {
        let (l, codes) = &back[i];
        if j < *l || j - l >= codes.len() {
            i -= 1;
            continue;
        }
        match codes[j - l] {
            0 => {
                out.push((i - 1, j - 1));
                i -= 1;
                j -= 1;
            }
            2 if j > 0 => j -= 1,
            _ => i -= 1,
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_pairs_prefer_sizes_that_scale_with_the_batch() {
        // One call site (key 7) asks for a workspace in the small run only;
        // the sizes after it pair by how they scale, not by position.
        let a = [(7, 100), (7, 25_000_000), (7, 200), (7, 300)];
        let b = [(7, 100), (7, 400), (7, 600)];
        assert_eq!(scored(&a, &b, 2.0), vec![(0, 0), (2, 1), (3, 2)]);
        // Different keys never pair.
        assert!(scored(&[(1, 5)], &[(2, 5)], 2.0).is_empty());
        // Scored pairs are in order in both runs and of equal keys.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let a: Vec<(u64, u64)> = (0..rnd() % 60).map(|_| (rnd() % 3, rnd() % 5 + 1)).collect();
            let b: Vec<(u64, u64)> = (0..rnd() % 60).map(|_| (rnd() % 3, rnd() % 9 + 1)).collect();
            let p = scored(&a, &b, 2.0);
            for w in p.windows(2) {
                assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1);
            }
            assert!(p.iter().all(|&(i, j)| a[i].0 == b[j].0));
        }
    }

    #[test]
    fn an_extra_request_shifts_nothing_after_it() {
        let a: Vec<(u64, u64)> = [1, 2, 3, 4, 5, 6].iter().map(|&k| (k, 10)).collect();
        let b: Vec<(u64, u64)> = [1, 2, 9, 3, 4, 5, 6].iter().map(|&k| (k, 20)).collect();
        assert_eq!(scored(&a, &b, 2.0), vec![(0, 0), (1, 1), (2, 3), (3, 4), (4, 5), (5, 6)]);
    }
}
