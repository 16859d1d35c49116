//! Test recipients: real HTTP/1.1 servers on loopback that record arrival order and inject
//! faults.
//!
//! A [`Recipient`] is a small HTTP/1.1 server on a loopback address (127.0.0.1 by default),
//! written on `std::net` and threads so that it can misbehave at the socket level. Test suites
//! of both runtimes deliver to it with their real clients and then assert what arrived, in
//! which order, and what became of each request.
//!
//! - **Recording.** Every request that arrives is kept with its method, target, verbatim
//!   headers (so signatures such as Standard Webhooks' `webhook-id`, `webhook-timestamp`,
//!   `webhook-signature` and the `Idempotency-Key` can be checked), decoded body, a global
//!   arrival [`index`](Recorded::index), an [`Instant`](std::time::Instant) and its
//!   [`Completion`]. Read them with [`Recipient::requests`], [`Recipient::all_requests`],
//!   [`Recipient::bodies`], [`Recipient::count`]; wait for them with
//!   [`Recipient::wait_for`] or [`Recipient::wait_until`] (bounded waits on a condvar).
//! - **Fault injection.** Each path has a script: a queue of [`Reply`]s, one consumed per
//!   request to that path, then the path's default ([`Recipient::set_default`]), the longest
//!   matching prefix default ([`Recipient::set_prefix_default`]), the server default
//!   ([`Recipient::set_server_default`]), and finally `200` with an empty body.
//!
//! ```
//! use std::time::Duration;
//! use outbox_lanes_test_support::{Completion, Recipient, Reply, Response};
//! # use std::io::{Read as _, Write as _};
//! # fn deliver(url: &str, body: &str) -> std::io::Result<()> {
//! #     // Stands in for the client under test: one POST per connection.
//! #     let rest = url.strip_prefix("http://").expect("http url");
//! #     let (authority, path) = rest.split_at(rest.find('/').expect("path"));
//! #     let mut stream = std::net::TcpStream::connect(authority)?;
//! #     write!(stream, "POST {path} HTTP/1.1\r\nHost: {authority}\r\nIdempotency-Key: unit-7\r\n\
//! #         Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
//! #     stream.read_to_end(&mut Vec::new())?;
//! #     Ok(())
//! # }
//!
//! let recipient = Recipient::start()?;
//! recipient.script(
//!     "/inbox/a",
//!     [
//!         Reply::Status(503),
//!         Response::new(429).with_header("Retry-After", "1").into(),
//!     ],
//! );
//! let url = recipient.url("/inbox/a"); // http://127.0.0.1:PORT/inbox/a
//!
//! // ... let the client under test deliver to `url`; here, three attempts:
//! # for _ in 0..3 { deliver(&url, "{\"n\":1}")?; }
//!
//! assert!(recipient.wait_for("/inbox/a", 3, Duration::from_secs(10)));
//! let requests = recipient.requests("/inbox/a");
//! let statuses: Vec<_> = requests.iter().map(|r| r.completion.status()).collect();
//! assert_eq!(statuses, [Some(503), Some(429), Some(200)]);
//! assert!(requests.iter().all(|r| r.header("idempotency-key") == Some("unit-7")));
//! assert_eq!(recipient.bodies("/inbox/a")[2], b"{\"n\":1}");
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # What each reply does on the socket
//!
//! Every reply is applied after the whole request has been read and recorded.
//!
//! | [`Reply`] | bytes and socket calls |
//! | --- | --- |
//! | `Status(s)` | `HTTP/1.1 s Reason`, `Content-Length: 0`, empty body; the connection stays open for the next request unless the request asked to close |
//! | `Response(r)` | `r.status`, `r.headers` verbatim, `Content-Length` (unless `r` sets its own framing), `r.body` |
//! | `Redirect(s, loc)` | like `Status(s)` plus `Location: loc` |
//! | `Delay(d, inner)` | sleeps `d` (woken early by the recipient's drop, which then closes without answering), then `inner` |
//! | `SlowBody { .. }` | status line and headers with the full `Content-Length` in one write; then each chunk after sleeping `interval` |
//! | `Hang` | writes nothing; reads and discards until the client closes or the recipient is dropped, then closes |
//! | `Reset` | writes nothing; sets `SO_LINGER` to 0 (through `socket2`: `TcpStream::set_linger` is unstable) and closes, so the kernel sends RST |
//! | `CloseWithoutResponse` | writes nothing; `shutdown(Both)` (FIN), then closes |
//!
//! When the request says `Connection: close` (or is HTTP/1.0 without keep-alive), a response
//! carries `Connection: close` and the server half-closes after it. `Expect: 100-continue` is
//! answered with `100 Continue` before the body is read.
//!
//! # Limits and refusals
//!
//! - At most [`DEFAULT_MAX_CONNECTIONS`] connections are served at once (see
//!   [`Builder::max_connections`]). At the cap the server stops accepting; further
//!   connections wait in the kernel's listen backlog until a slot frees.
//! - A request body over [`DEFAULT_MAX_BODY`] (see [`Builder::max_body`]), announced by
//!   `Content-Length` or found while decoding a chunked body, is recorded with an empty body,
//!   answered `413` with `Connection: close` without consuming the script, and the rest of the
//!   body is read and dropped for a bounded time before closing, so the client can read the 413.
//! - A request head over [`MAX_HEAD`] bytes gets `431`, a malformed request `400`; both close
//!   the connection, are not recorded, and are listed by [`Recipient::protocol_errors`].
//!
//! # Shutdown
//!
//! Dropping the [`Recipient`] raises a stop flag, wakes the accept loop (by connecting to its
//! own loopback address), shuts every open connection down (which releases `Hang`s and wakes
//! `Delay`s and `SlowBody`s), and joins the accept thread once every connection thread is
//! done. Every socket also has a 200 ms read and write timeout after which its thread looks at
//! the stop flag, so no thread outlives the drop by more than that, even where shutting a
//! socket down does not wake a blocked read. Should the threads still not be done after 5 s,
//! the drop returns anyway and leaves them to finish.
//!
//! The server only ever binds loopback addresses ([`Recipient::start_on`] refuses others)
//! and never connects anywhere except to itself, to wake its accept loop.

mod http;
mod record;
mod reply;
mod server;
pub mod signatures;
#[cfg(feature = "verifiers")]
pub mod verifiers;

use core::fmt;
use core::net::{Ipv4Addr, SocketAddr};
use core::time::Duration;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

pub use record::{Completion, Recorded, Unanswered};
pub use reply::{Chooser, Reply, Response};

/// A Postgres URL (or key=value string) for a benchmark: `sslmode=disable` added unless it names
/// an `sslmode`, so a bench measures the store, not TLS (the store's default, `prefer`,
/// encrypts against a server with `ssl = on`).
pub fn pg_url_without_tls(url: &str) -> String {
    if url.contains("sslmode") {
        url.to_owned()
    } else if !url.starts_with("postgres") {
        format!("{url} sslmode=disable")
    } else if url.contains('?') {
        format!("{url}&sslmode=disable")
    } else {
        format!("{url}?sslmode=disable")
    }
}

/// The environment variable holding the Postgres test server's URL.
pub const PG_ENV: &str = "OUTBOX_LANES_TEST_PG";

/// The Postgres test server's URL, from [`PG_ENV`]; `None` when it is not set, said on stderr
/// (the caller skips its Postgres half) — unless `CI` is set: there a missing server is a
/// failure, not a green run without Postgres.
///
/// # Panics
/// `CI` is set and [`PG_ENV`] is not.
pub fn pg_url() -> Option<String> {
    let url = std::env::var(PG_ENV).ok().filter(|u| !u.is_empty());
    if url.is_none() {
        assert!(
            std::env::var_os("CI").is_none_or(|v| v.is_empty()),
            "CI is set but {PG_ENV} is not: the Postgres tests must run in CI"
        );
        eprintln!("SKIPPED: {PG_ENV} is not set; the Postgres half of this test did not run");
    }
    url
}

use server::{Config, Shared};

/// Connections served at once unless [`Builder::max_connections`] says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Largest request head (request line and header section) accepted; a larger one gets 431.
pub const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted unless [`Builder::max_body`] says otherwise: 8 MiB.
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;

/// How long the drop waits for the connection threads to finish before leaving them.
const DROP_GRACE: Duration = Duration::from_secs(5);
/// How long the drop's wake-up connection to the accept loop may take.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// A running test recipient: an HTTP/1.1 server on a loopback address.
///
/// All methods take `&self`, so one recipient can be shared between threads (for example
/// behind an `Arc`) and scripted while deliveries are running. Dropping it shuts the server
/// down (see the crate documentation).
pub struct Recipient {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

/// Configures a [`Recipient`] before it starts.
#[derive(Clone, Debug)]
pub struct Builder {
    addr: SocketAddr,
    config: Config,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            config: Config {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                max_body: DEFAULT_MAX_BODY,
            },
        }
    }
}

impl Builder {
    /// The address to bind: a loopback address such as `127.0.0.2:0` or `[::1]:0`
    /// (port 0 picks a free port). Default `127.0.0.1:0`.
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// At most this many connections are served at once (at least 1). Default
    /// [`DEFAULT_MAX_CONNECTIONS`].
    #[must_use]
    pub fn max_connections(mut self, max: usize) -> Self {
        self.config.max_connections = max.max(1);
        self
    }

    /// Request bodies larger than this are refused with 413. Default [`DEFAULT_MAX_BODY`].
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config.max_body = bytes;
        self
    }

    /// Binds the address and starts serving.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if the address is not a loopback address; otherwise the error of
    /// binding the listener or spawning the accept thread.
    pub fn start(self) -> io::Result<Recipient> {
        if !self.addr.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "test recipients bind loopback addresses only, not {}",
                    self.addr
                ),
            ));
        }
        let listener = TcpListener::bind(self.addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(self.config));
        let for_thread = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name(format!("recipient-accept-{addr}"))
            .spawn(move || server::accept_loop(listener, for_thread))?;
        Ok(Recipient {
            shared,
            addr,
            accept: Some(accept),
        })
    }
}

impl Recipient {
    /// Starts a recipient on `127.0.0.1` with a free port and the default limits.
    ///
    /// # Errors
    ///
    /// The error of binding the listener or spawning the accept thread.
    pub fn start() -> io::Result<Self> {
        Builder::default().start()
    }

    /// Starts a recipient on `addr`, a loopback address such as `127.0.0.2:0` or `[::1]:0`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `addr` is not a loopback address; otherwise the error of binding the
    /// listener or spawning the accept thread.
    pub fn start_on(addr: SocketAddr) -> io::Result<Self> {
        Builder::default().bind(addr).start()
    }

    /// A builder, to set the address and limits.
    #[must_use]
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The address the server listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of `path` on this server, e.g. `http://127.0.0.1:PORT/inbox/a` or
    /// `http://[::1]:PORT/inbox/a`. A `/` is put in front of `path` if it has none.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        let slash = if path.starts_with('/') { "" } else { "/" };
        format!("http://{}{slash}{path}", self.addr)
    }

    /// Appends replies to the script of `path`: each request to `path` takes the next one,
    /// and when the script is empty the defaults apply. A query in `path` is ignored.
    pub fn script(&self, path: &str, replies: impl IntoIterator<Item = Reply>) {
        self.shared.script(path, replies);
    }

    /// Drops what is left of the script of `path`.
    pub fn clear_script(&self, path: &str) {
        self.shared.clear_script(path);
    }

    /// The reply for requests to `path` when its script is empty.
    pub fn set_default(&self, path: &str, reply: Reply) {
        self.shared.set_default(path, reply);
    }

    /// The reply for requests to paths starting with `prefix` that have neither a script nor
    /// a default of their own; the longest matching prefix wins.
    pub fn set_prefix_default(&self, prefix: &str, reply: Reply) {
        self.shared.set_prefix_default(prefix, reply);
    }

    /// The reply for requests that nothing more specific covers (initially `Status(200)`).
    pub fn set_server_default(&self, reply: Reply) {
        self.shared.set_server_default(reply);
    }

    /// The requests to `path` in arrival order. A `path` without a query matches whatever
    /// the query; a `path` with a query matches that target exactly.
    #[must_use]
    pub fn requests(&self, path: &str) -> Vec<Recorded> {
        self.shared.with_log(|log| {
            log.iter()
                .filter(|r| server::matches(r, path))
                .cloned()
                .collect()
        })
    }

    /// Every request in arrival order.
    #[must_use]
    pub fn all_requests(&self) -> Vec<Recorded> {
        self.shared.with_log(<[Recorded]>::to_vec)
    }

    /// The bodies of the requests to `path`, in arrival order.
    #[must_use]
    pub fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        self.shared.with_log(|log| {
            log.iter()
                .filter(|r| server::matches(r, path))
                .map(|r| r.body.clone())
                .collect()
        })
    }

    /// How many requests to `path` have arrived.
    #[must_use]
    pub fn count(&self, path: &str) -> usize {
        self.shared
            .with_log(|log| log.iter().filter(|r| server::matches(r, path)).count())
    }

    /// The most requests this recipient held at once: received in full and not yet answered
    /// (or otherwise completed). A client bounding its attempts to this recipient's host keeps
    /// it at or below the bound.
    #[must_use]
    pub fn max_in_progress(&self) -> usize {
        self.shared.max_in_progress()
    }

    /// How many requests have arrived in all.
    #[must_use]
    pub fn count_all(&self) -> usize {
        self.shared.with_log(<[Recorded]>::len)
    }

    /// Waits until at least `n` requests to `path` have arrived; `false` if `timeout` passes
    /// first.
    #[must_use]
    pub fn wait_for(&self, path: &str, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |log| {
            log.iter().filter(|r| server::matches(r, path)).count() >= n
        })
    }

    /// Waits until `pred`, given every request in arrival order, holds; `false` if `timeout`
    /// passes first. `pred` is called with the log locked, whenever a request arrives or
    /// completes: keep it short, and do not call the recipient from it.
    #[must_use]
    pub fn wait_until(&self, timeout: Duration, pred: impl FnMut(&[Recorded]) -> bool) -> bool {
        self.shared.wait_until(timeout, pred)
    }

    /// Protocol and socket errors the server saw: malformed requests, oversized heads,
    /// connections ended mid-request, accept failures. Empty when every client behaved.
    #[must_use]
    pub fn protocol_errors(&self) -> Vec<String> {
        self.shared.errors()
    }
}

impl fmt::Debug for Recipient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recipient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Recipient {
    fn drop(&mut self) {
        self.shared.stop();
        // The accept thread blocks in accept(); a connection to ourselves wakes it to see the
        // stop flag. If it cannot be made, the thread is left (never joined) rather than
        // risking a drop that hangs.
        drop(TcpStream::connect_timeout(&self.addr, WAKE_TIMEOUT));
        let idle = self.shared.wait_idle(DROP_GRACE);
        if let Some(accept) = self.accept.take() {
            if idle {
                // A panic in the accept thread has already been reported on stderr.
                let _ = accept.join();
            }
        }
    }
}
