//! The async runtime of outbox-lanes: tokio (async-std/smol by feature), reqwest and a Store.
//!
//! This crate is filled by its own issue; for now it only re-exports the core.

pub use outbox_lanes_core as core;
