//! What the recipient does with a request: the scriptable replies.

use core::time::Duration;

/// How the recipient answers one request, down to the socket.
///
/// Every variant is applied only after the whole request (head and body) has been read and
/// recorded, so a fault never loses the record of what arrived. See the crate documentation
/// for the exact socket-level behaviour of each variant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// Answer with this status, no extra headers and an empty body (`Content-Length: 0`).
    Status(u16),
    /// Answer with a full response: status, extra headers (e.g. `Retry-After`) and body.
    Response(Response),
    /// Wait this long, then do the inner reply. If the recipient is dropped during the wait,
    /// the connection is closed without an answer.
    Delay(Duration, Box<Reply>),
    /// Never answer: keep reading (and discarding) from the socket until the client closes it
    /// or the recipient is dropped, then close it. Later requests pipelined on the same
    /// connection are never served.
    Hang,
    /// Abort the connection: set `SO_LINGER` to 0 and close, so the kernel sends a TCP RST
    /// instead of a FIN. The client sees "connection reset".
    Reset,
    /// Close the connection gracefully (FIN in both directions) without writing a byte of
    /// response. The client sees end-of-file where the status line should be.
    CloseWithoutResponse,
    /// Send the status line and headers at once (with a `Content-Length` of
    /// `chunk.len() * chunks`), then the body as `chunks` copies of `chunk`, each written after
    /// waiting `interval`.
    SlowBody {
        /// The status code.
        status: u16,
        /// The bytes written at each tick.
        chunk: Vec<u8>,
        /// The wait before each chunk.
        interval: Duration,
        /// How many chunks the body has.
        chunks: usize,
    },
    /// Answer with this status (e.g. 301, 302, 307, 308) and a `Location` header.
    Redirect(u16, String),
    /// The reply this function chooses for the request as it was recorded (its headers and
    /// body): a recipient that answers by what it received, such as a signature verifier.
    Choose(Chooser),
}

/// The function of a [`Reply::Choose`]. Two choosers are equal only if they are the same one.
#[derive(Clone)]
pub struct Chooser(pub std::sync::Arc<dyn Fn(&crate::Recorded) -> Reply + Send + Sync>);

impl Chooser {
    /// A chooser of `f`.
    pub fn new(f: impl Fn(&crate::Recorded) -> Reply + Send + Sync + 'static) -> Chooser {
        Chooser(std::sync::Arc::new(f))
    }
}

impl core::fmt::Debug for Chooser {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Chooser(..)")
    }
}

impl PartialEq for Chooser {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Chooser {}

impl Reply {
    /// This reply, done after waiting `delay` (shorthand for [`Reply::Delay`]).
    #[must_use]
    pub fn after(self, delay: Duration) -> Reply {
        Reply::Delay(delay, Box::new(self))
    }
}

impl Default for Reply {
    /// `200 OK` with an empty body.
    fn default() -> Self {
        Reply::Status(200)
    }
}

impl From<Response> for Reply {
    fn from(response: Response) -> Self {
        Reply::Response(response)
    }
}

/// A complete response for [`Reply::Response`].
///
/// The recipient adds `Content-Length` (unless a `Content-Length` or `Transfer-Encoding`
/// header is given here, which is then sent as is, so a lying length can be scripted) and
/// `Connection: close` when it closes the connection afterwards. A `Connection: close` header
/// given here makes it close the connection after the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Extra headers, written in this order with this spelling.
    pub headers: Vec<(String, String)>,
    /// The body. Not sent for `HEAD` requests and for 1xx, 204 and 304 statuses.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with this status, no extra headers and an empty body.
    #[must_use]
    pub fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header (e.g. `Retry-After`).
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    #[must_use]
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}
