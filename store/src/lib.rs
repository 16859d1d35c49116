//! The store of outbox-lanes: the Store trait, SQLite (embedded default) and Postgres.
//!
//! This crate is filled by its own issue; for now it only re-exports the core.

pub use outbox_lanes_core as core;
