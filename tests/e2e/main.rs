//! The slow end-to-end tests, one binary: a terminal in tmux, a real
//! Prometheus, a second account, training commands under `run`, the
//! fuzzer, and the tests that need an NVIDIA GPU (ignored without one).
#![allow(clippy::unwrap_used, reason = "tests and their helpers fail loudly on what they cannot read")]

#[path = "../common/mod.rs"]
#[allow(dead_code, reason = "the end-to-end tests use a few of the helpers the integration tests share")]
mod common;

mod cluster;
mod fuzz;
mod gpu;
mod nogpu;
mod run;
mod security;
mod tui;
