//! Status and transport-error classification. PLACEHOLDER: filled by the policy work.

use crate::outcome::Outcome;
use core::time::Duration;

/// A transport-level failure kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportError {
    /// The request timed out.
    Timeout,
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

/// Configurable status classification.
#[derive(Clone, Debug, Default)]
pub struct Classifier {}

impl Classifier {
    /// Classifies an HTTP status with its (already parsed and capped) Retry-After.
    pub fn status(&self, status: u16, retry_after: Option<Duration>) -> Outcome {
        classify(status, retry_after)
    }
}

/// Classifies an HTTP status with the default policy.
pub fn classify(status: u16, retry_after: Option<Duration>) -> Outcome {
    let _ = (status, retry_after);
    Outcome::Permanent
}
