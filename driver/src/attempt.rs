//! What one delivery attempt came to ([`AttemptResult`]) and the constructors every HTTP
//! client and every executor shares, so a dead letter reads the same whichever runtime
//! delivered: an answered status, a refused destination, a request that could not be built,
//! an attempt never sent, an I/O failure's classification.
//!
//! It sits below [`crate::http`], [`crate::destination`], [`crate::request`] and
//! [`crate::ticket`], which all answer with these results; it imports none of them.

use core::fmt;
use std::io;

use outbox_lanes_core::Outcome;
use outbox_lanes_core::policy::{Classifier, DestinationRefused, TransportError, UrlError};

/// How much of a non-2xx answer's body goes into [`AttemptResult::error`]: enough for a
/// recipient's one-line reason, not enough to fill the dead-letter table.
pub const ERROR_EXCERPT: usize = 200;
/// How much of a non-2xx answer's body the clients keep for the delivery log
/// ([`AttemptResult::body`]): 1 KiB
/// ([`LOG_BODY_EXCERPT`](outbox_lanes_store::LOG_BODY_EXCERPT)). The clients read at most
/// [`HttpConfig::max_response_body`](crate::http::HttpConfig::max_response_body) within the request's timeout and keep only this much.
pub const BODY_EXCERPT: usize = outbox_lanes_store::LOG_BODY_EXCERPT;

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptResult {
    /// The classified outcome, for the scheduler.
    pub outcome: Outcome,
    /// The HTTP status, when the recipient answered with one.
    pub status: Option<u16>,
    /// What went wrong, for logs and the dead letter's last error: `None` when delivered.
    /// Starts with a stable code: `destination_refused`, `invalid_recipient`,
    /// `invalid_request`, a [`TransportError`] code (`timeout`, `connection_reset`, …), or
    /// `status <code>` followed by the start of the answer's body.
    pub error: Option<String>,
    /// The start of a non-2xx answer's body, verbatim (lossy UTF-8, at most [`BODY_EXCERPT`]
    /// bytes, cut on a character boundary), for the delivery log; `None` for a 2xx answer or
    /// none at all.
    pub body: Option<String>,
}

/// The result of an attempt whose recipient URL does not parse (enqueue validates them, so
/// a bug or a row written by hand): permanent, nothing sent.
pub fn invalid_recipient(e: &UrlError) -> AttemptResult {
    AttemptResult {
        outcome: Outcome::Permanent,
        status: None,
        error: Some(format!("invalid_recipient: {e}")),
        body: None,
    }
}

/// The result of an attempt whose request cannot be built (`why`): permanent, since every
/// retry would build the same request; nothing sent.
pub fn invalid_request(why: impl fmt::Display) -> AttemptResult {
    AttemptResult {
        outcome: Outcome::Permanent,
        status: None,
        error: Some(format!("invalid_request: {why}")),
        body: None,
    }
}

/// The result of an attempt whose destination the SSRF guard refused.
pub fn refused_result(refused: &DestinationRefused, classifier: &Classifier) -> AttemptResult {
    AttemptResult {
        outcome: classifier.transport(TransportError::DestinationRefused),
        status: None,
        error: Some(refusal_message(refused)),
        body: None,
    }
}

/// The error of a refused destination: `destination_refused: <addr> is <class>`.
pub fn refusal_message(r: &DestinationRefused) -> String {
    format!("{REFUSAL}{} is {}", r.addr, r.class)
}

/// How [`refusal_message`] starts.
const REFUSAL: &str = "destination_refused: ";

/// Whether `result` is the SSRF guard's refusal of every address the destination resolved
/// to (its error made by [`refusal_message`]).
pub fn is_refusal(result: &AttemptResult) -> bool {
    result
        .error
        .as_deref()
        .is_some_and(|e| e.starts_with(REFUSAL))
}

/// The result of an attempt the recipient answered with `status`, classified as `outcome`;
/// `head` is the start of the answer's body (at most [`ERROR_EXCERPT`] bytes go into the
/// error, at most [`BODY_EXCERPT`] into [`AttemptResult::body`]).
/// Every HTTP client of the workspace builds its answers here, so dead letters read the
/// same whichever runtime delivered.
pub fn answered_result(outcome: Outcome, status: u16, head: &[u8]) -> AttemptResult {
    let body = (!outcome.is_delivered() && !head.is_empty()).then(|| {
        let kept = head.get(..BODY_EXCERPT).unwrap_or(head);
        let text = String::from_utf8_lossy(kept);
        outbox_lanes_store::log_excerpt(&text).to_owned()
    });
    let head = head.get(..ERROR_EXCERPT).unwrap_or(head);
    let excerpt = String::from_utf8_lossy(head)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    let error = if outcome.is_delivered() {
        None
    } else if excerpt.is_empty() {
        Some(format!("status {status}"))
    } else {
        Some(format!("status {status}: {excerpt}"))
    };
    AttemptResult {
        outcome,
        status: Some(status),
        error,
        body,
    }
}

/// How an I/O error of a delivery is classified (a rustls error carried in it is `tls`).
pub fn io_kind(e: &io::Error) -> TransportError {
    use io::ErrorKind as K;
    // rustls reports handshake and record failures through the stream as I/O errors.
    if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        return TransportError::Tls;
    }
    match e.kind() {
        K::TimedOut | K::WouldBlock => TransportError::Timeout,
        K::ConnectionRefused => TransportError::ConnectionRefused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            TransportError::ConnectionReset
        }
        _ => TransportError::Other,
    }
}

/// The result of an attempt that never reached the recipient: a failure on our side (the
/// payload could not be read, the request could not be signed, the delivery task was
/// dropped, the runtime is stopping). It is [`Outcome::NotSent`]: retried, never counted as
/// an attempt.
pub fn not_sent(why: impl fmt::Display) -> AttemptResult {
    AttemptResult {
        outcome: Outcome::NotSent,
        status: None,
        error: Some(format!("not_sent: {why}")),
        body: None,
    }
}
