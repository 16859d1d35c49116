//! What one delivery attempt came to, as the scheduler sees it.

use core::time::Duration;

/// The classified result of one attempt to deliver a unit to one recipient.
///
/// Runtimes produce it from an HTTP status or a transport error with
/// [`crate::policy::classify`]; the scheduler consumes it in
/// [`crate::Scheduler::handle_outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the recipient has the unit.
    Delivered,
    /// 429, or 503 with Retry-After: recorded, retried, but not counted toward the
    /// maximum attempts (OL-5).
    Throttled {
        /// The recipient's Retry-After, already capped; it sets the lane's `not_before`.
        retry_after: Option<Duration>,
    },
    /// 5xx, 408, 425, timeout, connection refused/reset, DNS or TLS error: retried after a
    /// backoff (OL-6).
    Transient {
        /// The recipient's Retry-After, already capped; it sets the lane's `not_before`.
        retry_after: Option<Duration>,
    },
    /// A 4xx other than 408/425/429, or a 3xx (redirects are not followed): dead-lettered at
    /// once (OL-9).
    Permanent,
    /// 410 Gone: permanent; with [`crate::Config::retire_on_gone`] it retires the lane.
    Gone,
    /// The destination address was refused by the SSRF guard: dead letter
    /// `destination_refused` (OL-4).
    Refused,
}

impl Outcome {
    /// Whether the attempt delivered the unit.
    pub fn is_delivered(&self) -> bool {
        matches!(self, Outcome::Delivered)
    }

    /// The Retry-After carried by the outcome, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Outcome::Throttled { retry_after } | Outcome::Transient { retry_after } => retry_after,
            Outcome::Delivered | Outcome::Permanent | Outcome::Gone | Outcome::Refused => None,
        }
    }
}
