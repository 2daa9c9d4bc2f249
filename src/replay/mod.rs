//! Drive the allocator with a recorded trace (spec §15) and judge fidelity:
//! every event our allocator emits must equal the recorded one.

mod engine;

pub use engine::{replay_events, Divergence, ReplayObserver, ReplayOptions, ReplayResult};
