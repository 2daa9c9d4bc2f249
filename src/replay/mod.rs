//! Drive the allocator with a recorded trace (docs/design/pytorch-allocator.md §15) and judge fidelity:
//! every event our allocator emits must equal the recorded one. What-if runs
//! replay the same requests under another config.

pub(crate) mod ahead;
pub(crate) mod conditions;
mod engine;
pub mod model;
pub mod open;
pub mod pools;
pub mod report;
pub mod scrub;
pub mod session;
pub mod whatif;
pub mod wrapped;

pub(crate) use engine::Pressure;
pub use engine::{replay_events, replay_events_from, Divergence, Peak, ReplayOptions, ReplayResult, Stepper};
pub(crate) use open::open_ahead;
pub use open::{open, OpenError, OpenOptions, Opened};
