//! The clocks the driver reads: the wall clock (timestamps the store keeps and other
//! processes read: leases, backoffs, attempt records) and the monotonic clock (lengths of
//! time within this process: a control read's freshness, a refusal's trust, an attempt's
//! duration). The driver reads neither directly: it asks the [`Clock`] it was given — the
//! runtime's ([`Runtime::clock`](crate::engine::Runtime::clock)) — so a test can run the
//! engine, the origin gate and a pass in virtual time. [`SystemClock`] is the only place in
//! `driver/src` that reads the system's clocks.

use std::time::{Instant, SystemTime};

use outbox_lanes_core::Timestamp;

/// A source of the wall-clock and the monotonic time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The wall-clock time now, as the core's [`Timestamp`].
    fn now(&self) -> Timestamp;

    /// The monotonic time now: only lengths of time measured on it mean anything.
    fn instant(&self) -> Instant;
}

/// The system's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// The system's wall clock as nanoseconds since the epoch (0 before it): the seed of a
/// pass's jitter and of similar per-process draws, where no virtual time is wanted.
pub(crate) fn system_nanos() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
