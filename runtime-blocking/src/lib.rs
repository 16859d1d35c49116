//! The blocking runtime of outbox-lanes: std threads, ureq and a Store.
//!
//! This crate is filled by its own issue; for now it only re-exports the core.

pub use outbox_lanes_core as core;

pub mod http;
pub mod sign;
