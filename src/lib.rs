//! gpumem-top: a terminal GPU memory profiler built around a faithful model of
//! PyTorch's CUDA caching allocator.
//!
//! Data flows one way: a source (trace replay, synthetic workload, live
//! monitor) drives the model (`alloc` over a `device`), whose state the
//! views draw.

pub mod alloc;
pub mod analysis;
pub mod cli;
pub mod device;
pub mod replay;
pub mod trace;
