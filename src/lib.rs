//! gpumem-top: a terminal GPU memory profiler built around a faithful model of
//! PyTorch's CUDA caching allocator.
//!
//! Data flows one way: a source (trace replay, synthetic workload, live
//! monitor) drives the model (`alloc` over a `device`), whose state the
//! views draw.
//!
//! ```
//! use gpumem_top::alloc::{AllocatorConfig, CachingAllocator, Kind};
//! use gpumem_top::device::Sim;
//!
//! let conf = AllocatorConfig::parse("expandable_segments:True").unwrap();
//! let mut a = CachingAllocator::new(conf, Sim::h200());
//! let x = a.malloc(3 << 20, 0).unwrap();
//! // A 3 MiB request maps one 20 MiB page of the large pool's segment.
//! assert_eq!(a.stats().get(Kind::ReservedBytes, 0).current, 20 << 20);
//! assert_eq!(a.stats().get(Kind::AllocatedBytes, 0).current, 3 << 20);
//! a.free(x).unwrap();
//! a.empty_cache();
//! assert_eq!(a.stats().get(Kind::ReservedBytes, 0).current, 0);
//! ```

pub mod alloc;
pub mod analysis;
pub mod cli;
pub mod device;
pub mod export;
pub mod fit;
pub mod keys;
pub mod launch;
pub mod monitor;
pub mod private;
pub mod replay;
pub mod timeline;
pub mod trace;
pub mod tune;
pub mod ui;
pub mod view;
pub mod workload;
