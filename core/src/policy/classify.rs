//! Status and transport-error classification (OL-6, OL-9).
//!
//! The default policy, [`classify`]:
//!
//! | status                          | outcome                                    |
//! |---------------------------------|--------------------------------------------|
//! | 200–299                         | [`Outcome::Delivered`]                     |
//! | 429                             | [`Outcome::Throttled`]                     |
//! | 503 with Retry-After            | [`Outcome::Throttled`]                     |
//! | 503 without, other 5xx, 408, 425 | [`Outcome::Transient`]                    |
//! | 410                             | [`Outcome::Gone`]                          |
//! | 300–399 (redirects are not followed), other 4xx | [`Outcome::Permanent`]     |
//! | 100–199, and anything below 100 or above 599 | [`Outcome::Transient`]        |
//!
//! A 1xx is never a final response, and a status outside 100–599 is not HTTP: either means
//! something between us and the recipient (a proxy, a broken server) misbehaved, and says
//! nothing about whether the recipient accepted the unit. Calling it delivered could lose
//! the unit and calling it permanent would dead-letter it on one glitch, so it is retried;
//! the attempt limit still ends a recipient that never answers properly.
//!
//! [`Classifier`] is the configurable version: per-status overrides on top of the default.

use alloc::vec::Vec;
use core::fmt;
use core::ops::RangeInclusive;
use core::time::Duration;

use crate::outcome::Outcome;

/// A transport-level failure kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportError {
    /// The request timed out.
    Timeout,
    /// Connecting (resolving the name, the TCP or TLS handshake) took longer than the connect
    /// timeout: nothing reached the recipient.
    ConnectTimeout,
    /// Connection refused.
    ConnectionRefused,
    /// Connection reset or closed mid-exchange.
    ConnectionReset,
    /// Name resolution failed.
    Dns,
    /// TLS handshake or certificate failure.
    Tls,
    /// The SSRF guard refused the destination address.
    DestinationRefused,
    /// Anything else at the transport level.
    Other,
}

impl TransportError {
    /// A stable snake_case code, for logs and the dead letter's last error.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportError::Timeout => "timeout",
            TransportError::ConnectTimeout => "connect_timeout",
            TransportError::ConnectionRefused => "connection_refused",
            TransportError::ConnectionReset => "connection_reset",
            TransportError::Dns => "dns",
            TransportError::Tls => "tls",
            TransportError::DestinationRefused => "destination_refused",
            TransportError::Other => "other",
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`Classifier`] override makes of a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatusClass {
    /// [`Outcome::Delivered`].
    Delivered,
    /// [`Outcome::Throttled`], carrying the Retry-After if any. A throttled attempt does not
    /// count toward the maximum (OL-5) until its lane has stalled
    /// ([`crate::Config::max_throttled_level`]), so use it only for statuses that mean "slow
    /// down".
    Throttled,
    /// [`Outcome::Throttled`] when the response has a Retry-After, [`Outcome::Transient`]
    /// otherwise: the default for 503.
    ThrottledIfRetryAfter,
    /// [`Outcome::Transient`], carrying the Retry-After if any.
    Transient,
    /// [`Outcome::Permanent`].
    Permanent,
    /// [`Outcome::Gone`].
    Gone,
}

impl StatusClass {
    /// The outcome of a response of this class with the given (parsed, capped) Retry-After.
    pub fn outcome(self, retry_after: Option<Duration>) -> Outcome {
        match self {
            StatusClass::Delivered => Outcome::Delivered,
            StatusClass::Throttled => Outcome::Throttled { retry_after },
            StatusClass::ThrottledIfRetryAfter => match retry_after {
                Some(_) => Outcome::Throttled { retry_after },
                None => Outcome::Transient { retry_after },
            },
            StatusClass::Transient => Outcome::Transient { retry_after },
            StatusClass::Permanent => Outcome::Permanent,
            StatusClass::Gone => Outcome::Gone,
        }
    }
}

/// The class the default policy gives a status (see the [module docs](self)).
pub fn default_class(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Delivered,
        429 => StatusClass::Throttled,
        503 => StatusClass::ThrottledIfRetryAfter,
        408 | 425 | 500..=599 => StatusClass::Transient,
        410 => StatusClass::Gone,
        300..=499 => StatusClass::Permanent,
        _ => StatusClass::Transient,
    }
}

/// Classifies an HTTP status with its (already parsed and capped) Retry-After, by the
/// default policy (see the [module docs](self)).
///
/// The Retry-After is carried only by throttled and transient outcomes.
pub fn classify(status: u16, retry_after: Option<Duration>) -> Outcome {
    default_class(status).outcome(retry_after)
}

/// One status override of a [`Classifier`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatusOverride {
    /// The statuses it applies to (inclusive; an empty range matches nothing).
    pub statuses: RangeInclusive<u16>,
    /// What those statuses mean.
    pub class: StatusClass,
}

/// Configurable status classification: the default policy plus per-status overrides.
///
/// Overrides are searched newest first, so a later, narrower override can carve an exception
/// out of an earlier, wider one. `Classifier::default()` has none and agrees with
/// [`classify`].
///
/// ```
/// use outbox_lanes_core::policy::{Classifier, StatusClass};
/// use outbox_lanes_core::Outcome;
///
/// let c = Classifier::default()
///     .with_override(404..=404, StatusClass::Transient) // a receiver that 404s while deploying
///     .with_override(500..=500, StatusClass::Permanent); // a receiver whose 500s are final
/// assert_eq!(c.status(404, None), Outcome::Transient { retry_after: None });
/// assert_eq!(c.status(500, None), Outcome::Permanent);
/// assert_eq!(c.status(502, None), Outcome::Transient { retry_after: None });
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Classifier {
    overrides: Vec<StatusOverride>,
}

impl Classifier {
    /// A classifier with no overrides (the default policy).
    pub fn new() -> Self {
        Classifier::default()
    }

    /// Adds an override (builder style); it takes precedence over earlier ones.
    #[must_use]
    pub fn with_override(mut self, statuses: RangeInclusive<u16>, class: StatusClass) -> Self {
        self.set(statuses, class);
        self
    }

    /// Adds an override; it takes precedence over earlier ones.
    pub fn set(&mut self, statuses: RangeInclusive<u16>, class: StatusClass) -> &mut Self {
        self.overrides.push(StatusOverride { statuses, class });
        self
    }

    /// The overrides, oldest first.
    pub fn overrides(&self) -> &[StatusOverride] {
        &self.overrides
    }

    /// The class this classifier gives a status.
    pub fn class_of(&self, status: u16) -> StatusClass {
        self.overrides
            .iter()
            .rev()
            .find(|o| o.statuses.contains(&status))
            .map_or_else(|| default_class(status), |o| o.class)
    }

    /// Classifies an HTTP status with its (already parsed and capped) Retry-After.
    pub fn status(&self, status: u16, retry_after: Option<Duration>) -> Outcome {
        self.class_of(status).outcome(retry_after)
    }

    /// Classifies a transport failure: the SSRF guard's refusal is [`Outcome::Refused`],
    /// everything else (timeouts, refused or reset connections, DNS, TLS) is transient.
    pub fn transport(&self, error: TransportError) -> Outcome {
        match error {
            TransportError::DestinationRefused => Outcome::Refused,
            TransportError::Timeout
            | TransportError::ConnectTimeout
            | TransportError::ConnectionRefused
            | TransportError::ConnectionReset
            | TransportError::Dns
            | TransportError::Tls
            | TransportError::Other => Outcome::Transient { retry_after: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RA: Option<Duration> = Some(Duration::from_secs(7));

    /// The default policy written out independently, one status at a time.
    fn reference(status: u16, retry_after: Option<Duration>) -> Outcome {
        let transient = Outcome::Transient { retry_after };
        if (200..300).contains(&status) {
            Outcome::Delivered
        } else if status == 429 {
            Outcome::Throttled { retry_after }
        } else if status == 503 {
            if retry_after.is_some() {
                Outcome::Throttled { retry_after }
            } else {
                transient
            }
        } else if status == 410 {
            Outcome::Gone
        } else if status == 408 || status == 425 || (500..600).contains(&status) {
            transient
        } else if (300..500).contains(&status) {
            Outcome::Permanent
        } else {
            // 1xx, < 100, > 599
            transient
        }
    }

    #[test]
    fn default_policy_over_every_status() {
        for status in 0..=999u16 {
            for ra in [None, RA] {
                let want = reference(status, ra);
                assert_eq!(classify(status, ra), want, "status {status} {ra:?}");
                assert_eq!(Classifier::default().status(status, ra), want, "{status}");
            }
        }
        assert_eq!(
            classify(u16::MAX, None),
            Outcome::Transient { retry_after: None }
        );
    }

    #[test]
    fn spot_checks() {
        assert_eq!(classify(200, RA), Outcome::Delivered);
        assert_eq!(classify(204, None), Outcome::Delivered);
        assert_eq!(
            classify(429, None),
            Outcome::Throttled { retry_after: None }
        );
        assert_eq!(classify(429, RA), Outcome::Throttled { retry_after: RA });
        assert_eq!(classify(503, RA), Outcome::Throttled { retry_after: RA });
        assert_eq!(
            classify(503, None),
            Outcome::Transient { retry_after: None }
        );
        assert_eq!(classify(500, RA), Outcome::Transient { retry_after: RA });
        assert_eq!(
            classify(408, None),
            Outcome::Transient { retry_after: None }
        );
        assert_eq!(
            classify(425, None),
            Outcome::Transient { retry_after: None }
        );
        assert_eq!(classify(410, RA), Outcome::Gone);
        assert_eq!(classify(301, None), Outcome::Permanent);
        assert_eq!(classify(404, RA), Outcome::Permanent);
        assert_eq!(
            classify(100, None),
            Outcome::Transient { retry_after: None }
        );
        assert_eq!(classify(0, None), Outcome::Transient { retry_after: None });
        assert_eq!(
            classify(600, None),
            Outcome::Transient { retry_after: None }
        );
    }

    #[test]
    fn overrides_apply_newest_first_and_leave_the_rest_alone() {
        let c = Classifier::new()
            .with_override(400..=499, StatusClass::Transient)
            .with_override(404..=404, StatusClass::Permanent)
            .with_override(500..=500, StatusClass::Permanent)
            .with_override(502..=502, StatusClass::ThrottledIfRetryAfter)
            .with_override(RangeInclusive::new(299, 200), StatusClass::Gone); // empty: matches nothing
        for status in 0..=999u16 {
            for ra in [None, RA] {
                let want = match status {
                    404 | 500 => Outcome::Permanent,
                    502 if ra.is_some() => Outcome::Throttled { retry_after: ra },
                    400..=499 | 502 => Outcome::Transient { retry_after: ra },
                    _ => classify(status, ra),
                };
                assert_eq!(c.status(status, ra), want, "status {status} {ra:?}");
            }
        }
        assert_eq!(c.overrides().len(), 5);
        let mut d = Classifier::new();
        d.set(200..=200, StatusClass::Permanent)
            .set(201..=201, StatusClass::Throttled);
        assert_eq!(d.status(200, None), Outcome::Permanent);
        assert_eq!(d.status(201, RA), Outcome::Throttled { retry_after: RA });
        assert_eq!(d.class_of(202), StatusClass::Delivered);
    }

    #[test]
    fn transport_errors() {
        let c = Classifier::default();
        for e in [
            TransportError::Timeout,
            TransportError::ConnectTimeout,
            TransportError::ConnectionRefused,
            TransportError::ConnectionReset,
            TransportError::Dns,
            TransportError::Tls,
            TransportError::Other,
        ] {
            assert_eq!(
                c.transport(e),
                Outcome::Transient { retry_after: None },
                "{e}"
            );
        }
        assert_eq!(
            c.transport(TransportError::DestinationRefused),
            Outcome::Refused
        );
        assert_eq!(TransportError::ConnectionReset.as_str(), "connection_reset");
    }
}
