//! The core's own timestamp: milliseconds since the Unix epoch.
//!
//! The core never reads a clock. Every input carries `now`, and every deadline the core
//! hands out is an absolute [`Timestamp`]. Runtimes convert from their clock at the edge.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time, in milliseconds since the Unix epoch (UTC).
///
/// Millisecond resolution is what a delivery scheduler needs: HTTP dates have one-second
/// resolution and retry delays are hundreds of milliseconds at least.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);
    /// The latest representable time.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis)
    }

    /// A timestamp `secs` seconds after the Unix epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1000))
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Whole seconds since the Unix epoch.
    pub const fn as_secs(self) -> u64 {
        self.0 / 1000
    }

    /// `self + d`, saturating at [`Timestamp::MAX`].
    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// `self - d`, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_sub(ms))
    }

    /// The time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// Converts a [`std::time::SystemTime`]; times before the epoch become the epoch.
    #[cfg(feature = "std")]
    pub fn from_system_time(t: std::time::SystemTime) -> Self {
        let d = t
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Converts to a [`std::time::SystemTime`].
    #[cfg(feature = "std")]
    pub fn to_system_time(self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.0)
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    /// Saturating addition.
    fn add(self, rhs: Duration) -> Timestamp {
        self.saturating_add(rhs)
    }
}

impl Sub<Timestamp> for Timestamp {
    type Output = Duration;
    /// Saturating difference: zero when `rhs` is later.
    fn sub(self, rhs: Timestamp) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T+{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_secs(10);
        assert_eq!(
            t + Duration::from_millis(1500),
            Timestamp::from_millis(11_500)
        );
        assert_eq!(Timestamp::MAX + Duration::from_secs(1), Timestamp::MAX);
        assert_eq!(
            Timestamp::from_secs(1) - Timestamp::from_secs(5),
            Duration::ZERO
        );
        assert_eq!(t.saturating_sub(Duration::from_secs(60)), Timestamp::EPOCH);
    }
}
