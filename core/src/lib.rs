//! The sans-IO core of outbox-lanes.
//!
//! No I/O, no clock, no threads: inputs are `handle_*` methods that take `now`, outputs are
//! drained with `poll_*` until `None`. Runtimes (`outbox-lanes-blocking`,
//! `outbox-lanes-tokio`) add locks, threads or tasks, storage and HTTP.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod ids;
pub mod lane;
pub mod outcome;
pub mod policy;
pub mod rng;
pub mod time;

pub use ids::{ActorId, LaneId, Seq, UnitId};
pub use lane::{LaneKey, LaneTable};
pub use outcome::{DeadReason, Outcome};
pub use time::Timestamp;
