//! The integration tests, one binary: a module per area. The slow
//! end-to-end tests (a terminal in tmux, a real Prometheus, a second
//! account, training commands under `run`, the fuzzer, the GPU) are the
//! `e2e` binary, which `.ci/run` runs as its own step.
#![allow(clippy::unwrap_used, reason = "tests and their helpers fail loudly on what they cannot read")]

#[path = "../common/mod.rs"]
mod common;

mod categories;
mod conditions;
mod diff;
mod docs;
mod export;
mod field;
mod fit;
mod hostile;
mod live;
mod nogpu;
mod pools;
mod properties;
mod ranks;
mod readme;
mod releases;
mod replay;
mod screens;
mod synth;
mod tune;
mod vectors;
mod wrapped;
