//! The interactive terminal: the event loop (`event`), and the apps that
//! turn actions into changes of their models and draw them through `view`
//! (`app`: replay and synth; `live`: the monitor, `recording`: a recording
//! of it, both over `watch`, with the job screen in `job`). Nothing headless
//! (`--json`, `record`, `serve`, `export`) comes through here.

pub mod app;
pub mod diff;
pub mod event;
mod job;
pub mod live;
pub mod ranks;
pub mod recording;
pub mod watch;
