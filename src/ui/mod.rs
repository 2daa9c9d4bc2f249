//! The interactive terminal: the event loop (`event`), and the apps that
//! turn actions into changes of their models and draw them through `view`
//! (`app`: replay and synth; `live`: the monitor). Nothing headless
//! (`--json`, `record`, `serve`, `export`) comes through here.

pub mod app;
pub mod diff;
pub mod event;
pub mod live;
pub mod ranks;
