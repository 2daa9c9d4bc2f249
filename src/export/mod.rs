//! Renderings of the same state for other programs: Prometheus text
//! exposition (SVG/PNG/text screenshots come with issue #7).

pub mod prometheus;
