//! A cached malloc+free pair through our allocator on the CUDA backend
//! against raw cuMemAlloc+cuMemFree, in one run. Needs a GPU:
//! `cargo bench --bench cuda` (prints "no GPU" and exits 0 without one).
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on a fixture it cannot read")]

use std::time::Instant;

use cudarc::driver::result;
use gpumem_top::alloc::{AllocatorConfig, CachingAllocator};
use gpumem_top::device::Cuda;

fn sizes() -> Vec<u64> {
    // 64 sizes from 512 B to 48 MiB, log-spaced, as the CPU pair bench.
    (0..64).map(|i| (512f64 * (48.0 * 1048576.0 / 512.0f64).powf(i as f64 / 63.0)) as u64).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let Ok(dev) = Cuda::open(0, false) else {
        println!("no GPU: nothing measured");
        return;
    };
    let name = gpumem_top::device::Device::describe(&dev);
    let sizes = sizes();
    let mut a = CachingAllocator::new(AllocatorConfig::default(), dev);
    a.set_recording(false);
    // Warm the cache: every size once, plus 1,000 other live blocks.
    let keep: Vec<_> = (0..1000).map(|i| a.malloc(sizes[i % 32], 0).unwrap()).collect();
    for &s in &sizes {
        let b = a.malloc(s, 0).unwrap();
        a.free(b).unwrap();
    }
    let mut cached = Vec::new();
    for _ in 0..7 {
        let n = 200_000;
        let t = Instant::now();
        for i in 0..n {
            let b = a.malloc(sizes[i % sizes.len()], 0).unwrap();
            a.free(b).unwrap();
        }
        cached.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    for b in keep {
        a.free(b).unwrap();
    }
    a.empty_cache();
    let mut raw = Vec::new();
    for _ in 0..7 {
        let n = 512;
        let t = Instant::now();
        for i in 0..n {
            // SAFETY: the pointer cudaMalloc returns is freed at once by the
            // same context and never dereferenced on the host.
            unsafe {
                let p = result::malloc_sync(sizes[i % sizes.len()] as usize).unwrap();
                result::free_sync(p).unwrap();
            }
        }
        raw.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    let (c, r) = (median(cached.clone()), median(raw.clone()));
    println!("{name}: cached pair through the CUDA backend {c:.1} ns (runs {cached:.1?})");
    println!(
        "{name}: raw cuMemAlloc+cuMemFree {:.2} µs (runs {:.2?} µs)",
        r / 1000.0,
        raw.iter().map(|x| x / 1000.0).collect::<Vec<_>>()
    );
    println!("ratio raw/cached: {:.0}x", r / c);
}
