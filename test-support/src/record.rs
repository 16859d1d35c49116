//! What the recipient remembers about each request.

use std::time::Instant;

/// One request as it arrived, and what became of it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Recorded {
    /// Arrival index, counted across the whole recipient from 0: a request with a smaller
    /// index was fully received before one with a larger index.
    pub index: u64,
    /// When the request was fully received (head and body). Ordered like `index`.
    pub arrived_at: Instant,
    /// The connection it came on, numbered in accept order from 0. Requests sharing a number
    /// came over one keep-alive connection.
    pub connection: u64,
    /// The method, as sent (e.g. `POST`).
    pub method: String,
    /// The request target as sent: path and query (e.g. `/inbox/a?x=1`).
    pub target: String,
    /// The path alone, without the query (e.g. `/inbox/a`).
    pub path: String,
    /// The headers verbatim: original spelling of names, original order, repeats kept.
    /// Values are trimmed of surrounding whitespace; bytes that are not UTF-8 are replaced
    /// with U+FFFD.
    pub headers: Vec<(String, String)>,
    /// The body, decoded from chunked transfer encoding if it was chunked. Empty for a request
    /// the recipient refused as too large (its completion is then `Answered { status: 413 }`).
    pub body: Vec<u8>,
    /// Trailer fields of a chunked body, verbatim like `headers`.
    pub trailers: Vec<(String, String)>,
    /// What became of the request.
    pub completion: Completion,
}

impl Recorded {
    /// The first value of the header `name`, compared case-insensitively.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of the header `name`, compared case-insensitively, in arrival order.
    #[must_use]
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The query string without its `?`, if the target has one.
    #[must_use]
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// The body as UTF-8 text, if it is valid UTF-8.
    #[must_use]
    pub fn body_text(&self) -> Option<&str> {
        core::str::from_utf8(&self.body).ok()
    }
}

/// What became of a recorded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Not finished: the reply is being delayed or trickled, or the connection is hanging.
    Pending,
    /// A response with `status` was written in full.
    ///
    /// `at` is taken, and the record updated, just before the last bytes of the response are
    /// handed to the socket. So a client that has read the whole response always sees
    /// `Answered` here, and any request it sends afterwards arrives after `at` (an ordering
    /// test can compare `arrived_at` of the next request with this `at`). If that last write
    /// fails, this becomes `Unanswered { reason: WriteFailed }`.
    Answered {
        /// The status code sent.
        status: u16,
        /// When the response was completed (see above).
        at: Instant,
    },
    /// The connection ended without a complete response.
    Unanswered {
        /// Why.
        reason: Unanswered,
        /// When the recipient gave up on it.
        at: Instant,
    },
}

impl Completion {
    /// The status code, if a response was written in full.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        match self {
            Completion::Answered { status, .. } => Some(*status),
            Completion::Pending | Completion::Unanswered { .. } => None,
        }
    }

    /// Whether the request is still being worked on.
    #[must_use]
    pub fn is_pending(&self) -> bool {
        matches!(self, Completion::Pending)
    }
}

/// Why a request got no complete response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unanswered {
    /// [`Reply::Hang`](crate::Reply::Hang): the connection ended (the client closed it or the
    /// recipient was dropped).
    Hung,
    /// [`Reply::Reset`](crate::Reply::Reset): the connection was aborted with a RST.
    Reset,
    /// [`Reply::CloseWithoutResponse`](crate::Reply::CloseWithoutResponse).
    Closed,
    /// Writing the response failed: the client went away mid-response.
    WriteFailed,
    /// The recipient was dropped while the reply was delayed or trickling.
    Shutdown,
}
