//! Retry-After parsing. PLACEHOLDER: filled by the policy work.

use crate::time::Timestamp;
use core::time::Duration;

/// Parses a Retry-After header value (delta-seconds or HTTP-date) relative to `now`,
/// capped at `cap`.
pub fn parse_retry_after(value: &str, now: Timestamp, cap: Duration) -> Option<Duration> {
    let _ = (value, now, cap);
    None
}
