//! The wall clock the driver's host decisions are given: the host book (core) reads none,
//! and the origin gate asks the [`Clock`] it was built with, so a test can run it in virtual
//! time.

use std::time::SystemTime;

use outbox_lanes_core::Timestamp;

/// A source of the wall-clock time, as the core's [`Timestamp`].
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }
}
