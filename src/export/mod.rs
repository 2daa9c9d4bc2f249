//! Renderings of the same state outside the terminal: pictures for
//! reports (SVG, PNG, text) and Prometheus text exposition.

pub mod http;
pub(crate) mod live;
pub mod picture;
pub mod prometheus;
pub mod replay;
pub mod text;
