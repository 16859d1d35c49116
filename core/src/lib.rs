//! The sans-IO core of outbox-lanes.
//!
//! No I/O, no clock, no threads: inputs are `handle_*` methods that take `now`, outputs are
//! drained with `poll_*` until `None`. Runtimes (`outbox-lanes-blocking`,
//! `outbox-lanes-tokio`) add locks, threads or tasks, storage and HTTP.
//!
//! - [`Scheduler`]: one actor's pass — admission of lane heads, one unit in flight per lane,
//!   the retry ladder, stalls, lane backoff, dead letters and hand-back.
//! - [`DrainSlots`]: at most one pass per actor in a process, without waiting.
//! - [`MonitorBook`]: which actors to drain after a wake-up or a poll tick, when the upkeep
//!   is due, and how a stop proceeds (passes asked once, the grace).
//! - [`PassSession`] and [`DrainSession`]: one pass's lifecycle (lease renewal, time slice,
//!   shutdown grace, its end) and the drain-slot protocol around passes.
//! - [`budget::BudgetBook`]: the in-flight budget of a process shared fairly between actors.
//! - [`host::HostBook`]: the hosts of a process — health, each host's share of the in-flight
//!   budget, the operator's blocks and the signature double-knock.
//! - [`policy`]: status classification, Retry-After, recipient URLs, the SSRF address policy.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![no_std]
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod budget;
pub mod config;
pub mod host;
pub mod ids;
pub mod lane;
pub mod monitor;
pub mod outcome;
pub mod policy;
pub mod rng;
pub mod scheduler;
pub mod session;
pub mod slot;
pub mod time;

pub use config::Config;
pub use ids::{ActorId, LaneId, Seq, UnitId};
pub use lane::{LaneKey, LaneTable};
pub use monitor::{MonitorAction, MonitorBook, MonitorStop, TimeoutReason, Wake};
pub use outcome::{DeadReason, MIN_DEFERRAL, Outcome};
pub use scheduler::{
    Admit, AdmitError, AdmitSlot, ClaimReport, Command, EventError, HoldReason, LaneChunk,
    LaneClaim, LaneControl, LaneInfo, LaneWait, Scheduler,
};
pub use session::{
    DrainAction, DrainEnd, DrainSession, PassEnd, PassSession, SessionAction, SessionConfig,
    SlotAnswer, StopReason, UNCONTENDED_SLICES,
};
pub use slot::{
    Acquire, ActorResolver, AliasResolver, DrainSlots, IdentityResolver, Release, UnknownActor,
};
pub use time::Timestamp;
