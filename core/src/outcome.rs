//! What one delivery attempt came to, as the scheduler sees it.

use core::time::Duration;

/// The classified result of one attempt to deliver a unit to one recipient.
///
/// Runtimes produce it from an HTTP status or a transport error with
/// [`crate::policy::classify()`]; the scheduler consumes it in
/// [`crate::Scheduler::handle_outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the recipient has the unit.
    Delivered,
    /// 429, or 503 with Retry-After: recorded, retried, but not counted toward the
    /// maximum attempts (OL-5) while its lane's backoff level is below
    /// [`crate::Config::max_throttled_level`] (by default: until the unit has stalled).
    Throttled {
        /// The recipient's Retry-After, already capped. When it is longer than the delay the
        /// scheduler would wait anyway it sets the lane's `not_before`; a shorter one (`0`, a
        /// date in the past) is a floor that changes nothing.
        retry_after: Option<Duration>,
    },
    /// 5xx, 408, 425, timeout, connection refused/reset, DNS or TLS error: retried after a
    /// backoff (OL-6).
    Transient {
        /// The recipient's Retry-After, already capped, as for [`Outcome::Throttled`].
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
    /// The attempt never reached the recipient: a failure on our side (the payload could not
    /// be read, the delivery task was dropped, the runtime is stopping). Retried after the
    /// in-pass delay, never counted: no attempt is recorded, the unit does not move toward a
    /// stall or a dead letter, and its lane gets no backoff.
    NotSent,
    /// Nothing was sent: the recipient's host is not contacted for now — it is backing off
    /// after connection failures its lanes share (origin health), or an operator holds it
    /// (`outbox-lanes hosts block`). The lane waits `retry_after` (at least
    /// [`MIN_DEFERRAL`]) with nothing counted or recorded and its own backoff level
    /// untouched: its head is held and its other units handed back, as on a stall, and the
    /// lane's `not_before` is persisted.
    Deferred {
        /// How long the lane waits before its head is tried again.
        retry_after: Duration,
    },
    /// Nothing was sent: an operator holds the recipient's host (`outbox-lanes hosts block`).
    /// The lane is paused in the pass as by an operator's `lanes pause` (OL-14): its units
    /// are handed back, nothing counted or recorded, and it is not read again in this pass;
    /// the runtime persists the pause for the host (`hosts unblock` resumes it).
    Held,
    /// Nothing was sent and nothing will be: the recipient's host is set aside — blocked by
    /// an operator with dead letters, or failing longer than allowed. The unit is
    /// dead-lettered for this recipient at once with `reason` (a strict lane blocks on it),
    /// without counting an attempt.
    SetAside {
        /// The dead letter's reason.
        reason: DeadReason,
    },
}

/// The shortest wait of an [`Outcome::Deferred`]: a deferral of zero would retry at once.
pub const MIN_DEFERRAL: Duration = Duration::from_millis(100);

impl Outcome {
    /// The stable snake_case name logs and metrics give the outcome (`delivered`,
    /// `throttled`, `transient`, `permanent`, `gone`, `refused`, `not_sent`, `deferred`,
    /// `held`, `set_aside`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Throttled { .. } => "throttled",
            Outcome::Transient { .. } => "transient",
            Outcome::Permanent => "permanent",
            Outcome::Gone => "gone",
            Outcome::Refused => "refused",
            Outcome::NotSent => "not_sent",
            Outcome::Deferred { .. } => "deferred",
            Outcome::Held => "held",
            Outcome::SetAside { .. } => "set_aside",
        }
    }

    /// Whether the attempt delivered the unit.
    pub fn is_delivered(&self) -> bool {
        matches!(self, Outcome::Delivered)
    }

    /// The Retry-After carried by the outcome, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Outcome::Throttled { retry_after } | Outcome::Transient { retry_after } => retry_after,
            Outcome::Delivered
            | Outcome::Permanent
            | Outcome::Gone
            | Outcome::Refused
            | Outcome::NotSent
            | Outcome::Held
            | Outcome::SetAside { .. } => None,
            Outcome::Deferred { retry_after } => Some(retry_after),
        }
    }
}

/// Why a unit (for one recipient) became a dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum DeadReason {
    /// Its persisted attempt count reached the maximum (OL-8).
    Exhausted,
    /// The recipient refused it permanently: a 4xx other than 408/425/429, or a 3xx (OL-9).
    Permanent,
    /// The recipient answered 410 Gone (OL-9).
    Gone,
    /// Its lane was retired by a 410 Gone to an earlier unit of the lane (OL-9).
    LaneRetired,
    /// It was older than the configured maximum age when it was due (OL-8).
    Expired,
    /// The SSRF guard refused its destination address (OL-4).
    DestinationRefused,
    /// An operator skipped it: the head of a (strict) lane set aside so its followers go on
    /// (`outbox-lanes lanes skip-head`).
    Skipped,
    /// An operator purged its lane: every pending unit of the lane set aside
    /// (`outbox-lanes lanes purge`).
    Purged,
    /// An operator blocked its recipient's host with dead letters (`outbox-lanes hosts block
    /// --dead-letter`).
    Blocked,
    /// Its recipient's host failed at the connection level for longer than allowed
    /// (`--host-unavailable-after`).
    HostUnavailable,
    /// Its lane (the endpoint) had been failing for longer than allowed when it was due
    /// (`--lane-unavailable-after`): every pending unit of the lane is set aside together.
    LaneUnavailable,
}

impl DeadReason {
    /// Every reason, in the order the CLI lists them.
    pub const ALL: [DeadReason; 11] = [
        DeadReason::Exhausted,
        DeadReason::Permanent,
        DeadReason::Gone,
        DeadReason::LaneRetired,
        DeadReason::Expired,
        DeadReason::DestinationRefused,
        DeadReason::Skipped,
        DeadReason::Purged,
        DeadReason::Blocked,
        DeadReason::HostUnavailable,
        DeadReason::LaneUnavailable,
    ];

    /// The stable snake_case code stored with the dead letter and shown by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Exhausted => "exhausted",
            DeadReason::Permanent => "permanent",
            DeadReason::Gone => "gone",
            DeadReason::LaneRetired => "lane_retired",
            DeadReason::Expired => "expired",
            DeadReason::DestinationRefused => "destination_refused",
            DeadReason::Skipped => "skipped",
            DeadReason::Purged => "purged",
            DeadReason::Blocked => "blocked",
            DeadReason::HostUnavailable => "host_unavailable",
            DeadReason::LaneUnavailable => "lane_unavailable",
        }
    }

    /// Parses a code produced by [`DeadReason::as_str`].
    pub fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "exhausted" => DeadReason::Exhausted,
            "permanent" => DeadReason::Permanent,
            "gone" => DeadReason::Gone,
            "lane_retired" => DeadReason::LaneRetired,
            "expired" => DeadReason::Expired,
            "destination_refused" => DeadReason::DestinationRefused,
            "skipped" => DeadReason::Skipped,
            "purged" => DeadReason::Purged,
            "blocked" => DeadReason::Blocked,
            "host_unavailable" => DeadReason::HostUnavailable,
            "lane_unavailable" => DeadReason::LaneUnavailable,
            _ => return None,
        })
    }
}

impl core::fmt::Display for DeadReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
