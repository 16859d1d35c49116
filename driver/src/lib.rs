//! The relay engine of outbox-lanes, shared by every runtime.
//!
//! Every runtime (`outbox-lanes-blocking`: std threads; `outbox-lanes-tokio`: tasks on
//! tokio, async-std or smol) runs the same engine from this crate and provides only an
//! executor ([`engine::Runtime`]) and an HTTP transport ([`Executor`]). The decisions are the
//! core's, pure and transcript-tested: the [`Scheduler`](outbox_lanes_core::Scheduler) (which
//! unit starts, retries, stalls, dead letters), the
//! [`PassSession`](outbox_lanes_core::PassSession) (lease renewal, time slice, shutdown
//! grace, when a pass ends), the [`DrainSession`](outbox_lanes_core::DrainSession) (the
//! drain slot protocol around passes) and the [`MonitorBook`](outbox_lanes_core::MonitorBook).
//! This crate executes them against a [`Store`](outbox_lanes_store::Store):
//!
//! - [`engine`]: drains, passes as tasks, the monitor and shutdown, written once over the
//!   small [`engine::Runtime`] trait (spawn, sleep, blocking calls, clock, threads);
//! - [`pass::PassCore`]: one pass, advanced in **rounds**. The engine feeds it events
//!   (completions, wake-ups, timeouts, a stop or a cancellation) — cheap, no I/O — and then
//!   runs one [`PassCore::round`](pass::PassCore::round) where blocking calls are allowed: it
//!   executes every queued command in order (attempts recorded in one batch, the dead
//!   letters of the round in one transaction, both with lane states durable before any later
//!   start), discovers and claims lane heads, fetches
//!   the payloads of every attempt it starts in one call, and returns the [`Job`]s to run;
//!   store work is batched per round, never one round trip per unit.
//! - [`Executor`]: what runs [`Job`]s (a thread pool, tasks), with [`HostCaps`] in front for
//!   per-host caps; a job reports its [`Done`] through the pass's [`Completions`] sink.
//! - The delivery policy every HTTP client shares ([`http`]), the one place that builds a
//!   request (URL, headers, signature, body: [`request`]), signing ([`sign`]) and, with the
//!   `ureq` feature, the blocking client ([`ureq_client::HttpClient`]), which like the tokio
//!   runtime's client only transmits the request it is given.
//! - What both runtimes' `Outbox` share: [`OutboxConfig`], [`Hooks`], [`OutboxError`],
//!   [`DrainControl`] and [`OutboxCore`] (store, slots, acks, resolver).
//!
//! Dependencies run runtimes → driver → store / HTTP policy → core.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ack;
mod attempt;
mod budget;
pub mod builder;
pub mod clock;
mod config;
mod control;
mod destination;
pub mod engine;
mod error;
pub mod exchange;
pub mod fmt;
mod hooks;
mod hosts;
pub mod http;
mod job;
pub mod origins;
mod outbox;
pub mod pass;
mod rates;
pub mod request;
mod runtime;
pub mod sign;
#[cfg(test)]
mod testing;
mod ticket;
#[cfg(feature = "ureq")]
pub mod ureq_client;

pub use crate::ack::{AckWriter, AckWriterOptions};
pub use crate::budget::{FairShares, Reserve};
pub use crate::builder::OutboxOptions;
pub use crate::config::{DEFAULT_CONCURRENCY, OutboxConfig};
pub use crate::control::{ControlSubscription, DrainControl, Signal, StopRecord};
pub use crate::error::OutboxError;
pub use crate::hooks::{Attempted, DeadLettered, Delivered, Hooks, LaneUnavailable, Started};
pub use crate::hosts::HostCaps;
pub use crate::http::SignatureMode;
pub use crate::http::{AttemptResult, Delivery, HttpConfig, HttpError};
pub use crate::job::{Completions, Done, Executor, HostWait, Job};
pub use crate::origins::{OriginConfig, OriginGate};
pub use crate::outbox::{DrainOutcome, OutboxCore, drain_outcome, store_released};
pub use crate::pass::PassReport;
pub use crate::rates::{RateLimits, RatesFileError};
pub use crate::request::AttemptKnock;
pub use crate::request::{Destination, Request, RequestPolicy};
pub use crate::sign::Signer;
pub use crate::ticket::{OriginTicket, host_end};
pub use outbox_lanes_core as core;
pub use outbox_lanes_store as store;
