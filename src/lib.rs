//! outbox-lanes: per-recipient ordered outbox delivery.
//!
//! The facade re-exports the sans-IO core and, by feature, a runtime and a store.

pub use outbox_lanes_core as core;
