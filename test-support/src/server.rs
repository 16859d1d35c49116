//! The server: shared state, the accept loop and one thread per connection.

use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Instant;

use crate::MAX_HEAD;
use crate::http::{self, Framing, Head};
use crate::record::{Completion, Recorded, Unanswered};
use crate::reply::{Reply, Response};

/// How often blocked socket reads and writes wake to look at the stop flag. Dropping the
/// recipient also shuts every socket down, which wakes them at once on Linux; this bounds the
/// wait where that does not work.
const POLL: Duration = Duration::from_millis(200);
/// Largest chunk-size or trailer line accepted in a chunked body.
const MAX_LINE: usize = 8 * 1024;
/// After refusing a request whose body was not read, how long and how much of it is read
/// and thrown away before closing, so the refusal is not lost to a RST (RFC 9112 §9.6).
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024 * 1024;
/// How many protocol errors are kept.
const MAX_ERRORS: usize = 1000;

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every critical
/// section here leaves the state consistent, so a panic elsewhere must not take the
/// recipient down with it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The stop flag, with a condvar so sleeping replies wake when it is raised.
pub(crate) struct Stop {
    flag: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Stop {
    fn new() -> Self {
        Self {
            flag: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    fn trigger(&self) {
        self.flag.store(true, Ordering::Release);
        let _guard = lock(&self.lock);
        self.cv.notify_all();
    }

    /// Sleeps for `duration`; returns `false` as soon as the stop flag is raised.
    pub(crate) fn sleep(&self, duration: Duration) -> bool {
        let deadline = Instant::now().checked_add(duration);
        let mut guard = lock(&self.lock);
        loop {
            if self.is_set() {
                return false;
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if d <= now => return true,
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            guard = self
                .cv
                .wait_timeout(guard, remaining)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Limits fixed at start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    pub(crate) max_connections: usize,
    pub(crate) max_body: usize,
}

/// Everything the accept thread, the connection threads and the `Recipient` share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) stop: Stop,
    state: Mutex<State>,
    /// Notified on every new record, completion, connection end and accept-loop end.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Every recorded request; `log[i].index == i`.
    log: Vec<Recorded>,
    scripts: HashMap<String, VecDeque<Reply>>,
    defaults: HashMap<String, Reply>,
    prefix_defaults: Vec<(String, Reply)>,
    server_default: Reply,
    /// Clones of open connections, to shut them down when the recipient is dropped.
    streams: HashMap<u64, TcpStream>,
    next_connection: u64,
    active: usize,
    accept_done: bool,
    errors: Vec<String>,
    /// Requests received and not answered yet, and the most there ever were at once.
    in_progress: usize,
    max_in_progress: usize,
}

/// The key scripts and defaults are stored under: the path without query.
fn script_key(path: &str) -> &str {
    http::path_of(path)
}

/// Whether a record belongs to `key`: a key with a query matches the whole target, a key
/// without one matches the path whatever the query.
pub(crate) fn matches(record: &Recorded, key: &str) -> bool {
    if key.contains('?') {
        record.target == key
    } else {
        record.path == key
    }
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            config,
            stop: Stop::new(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    pub(crate) fn script(&self, path: &str, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state)
            .scripts
            .entry(script_key(path).to_owned())
            .or_default()
            .extend(replies);
    }

    pub(crate) fn clear_script(&self, path: &str) {
        lock(&self.state).scripts.remove(script_key(path));
    }

    pub(crate) fn set_default(&self, path: &str, reply: Reply) {
        lock(&self.state)
            .defaults
            .insert(script_key(path).to_owned(), reply);
    }

    pub(crate) fn set_prefix_default(&self, prefix: &str, reply: Reply) {
        let mut state = lock(&self.state);
        state.prefix_defaults.retain(|(p, _)| p != prefix);
        state.prefix_defaults.push((prefix.to_owned(), reply));
    }

    pub(crate) fn set_server_default(&self, reply: Reply) {
        lock(&self.state).server_default = reply;
    }

    /// Runs `f` over the log under the lock.
    pub(crate) fn with_log<R>(&self, f: impl FnOnce(&[Recorded]) -> R) -> R {
        f(&lock(&self.state).log)
    }

    pub(crate) fn max_in_progress(&self) -> usize {
        lock(&self.state).max_in_progress
    }

    /// Waits until `pred` holds over the log or `timeout` passes.
    pub(crate) fn wait_until(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&[Recorded]) -> bool,
    ) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = lock(&self.state);
        loop {
            if pred(&state.log) {
                return true;
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if d <= now => return false,
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            state = self
                .changed
                .wait_timeout(state, remaining)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    pub(crate) fn errors(&self) -> Vec<String> {
        lock(&self.state).errors.clone()
    }

    fn note_error(&self, error: String) {
        let mut state = lock(&self.state);
        if state.errors.len() < MAX_ERRORS {
            state.errors.push(error);
        }
    }

    /// Records a fully received request and takes the reply for it (none when `refused`:
    /// the recipient itself answers it). The index, the arrival instant and the script are
    /// taken under one lock, so arrival order, instants and script order agree.
    fn arrive(
        &self,
        connection: u64,
        head: Head,
        body: Vec<u8>,
        trailers: Vec<(String, String)>,
        refused: bool,
    ) -> (u64, Option<Reply>) {
        let mut state = lock(&self.state);
        let index = state.log.len() as u64;
        let reply = (!refused).then(|| state.next_reply(&head.path));
        state.log.push(Recorded {
            index,
            arrived_at: Instant::now(),
            connection,
            method: head.method,
            target: head.target,
            path: head.path,
            headers: head.headers,
            body,
            trailers,
            completion: Completion::Pending,
        });
        state.in_progress += 1;
        state.max_in_progress = state.max_in_progress.max(state.in_progress);
        drop(state);
        self.changed.notify_all();
        (index, reply)
    }

    fn complete(&self, index: u64, completion: Completion) {
        let mut state = lock(&self.state);
        if let Some(record) = usize::try_from(index)
            .ok()
            .and_then(|i| state.log.get_mut(i))
        {
            let was_pending = matches!(record.completion, Completion::Pending);
            record.completion = completion;
            if was_pending {
                state.in_progress -= 1;
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    fn answered(&self, index: u64, status: u16) {
        self.complete(
            index,
            Completion::Answered {
                status,
                at: Instant::now(),
            },
        );
    }

    fn unanswered(&self, index: u64, reason: Unanswered) {
        self.complete(
            index,
            Completion::Unanswered {
                reason,
                at: Instant::now(),
            },
        );
    }

    /// Waits for a free connection slot and takes it; `false` once stopping.
    fn acquire_slot(&self) -> bool {
        let mut state = lock(&self.state);
        loop {
            if self.stop.is_set() {
                return false;
            }
            if state.active < self.config.max_connections {
                state.active += 1;
                return true;
            }
            // The timeout is a safety net: releases and the stop both notify.
            state = self
                .changed
                .wait_timeout(state, POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn release_slot(&self) {
        let mut state = lock(&self.state);
        state.active = state.active.saturating_sub(1);
        drop(state);
        self.changed.notify_all();
    }

    fn next_connection_id(&self) -> u64 {
        let mut state = lock(&self.state);
        let id = state.next_connection;
        state.next_connection += 1;
        id
    }

    fn register(&self, id: u64, stream: TcpStream) {
        lock(&self.state).streams.insert(id, stream);
    }

    fn deregister(&self, id: u64) {
        let stream = lock(&self.state).streams.remove(&id);
        drop(stream);
    }

    fn accept_finished(&self) {
        lock(&self.state).accept_done = true;
        self.changed.notify_all();
    }

    /// Raises the stop flag and wakes everything that waits: sleeping replies, the accept
    /// loop waiting for a slot, and connections blocked on their sockets.
    pub(crate) fn stop(&self) {
        self.stop.trigger();
        let state = lock(&self.state);
        for stream in state.streams.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until the accept loop has ended and every connection thread is done, or until
    /// `timeout`; returns whether they are.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        loop {
            if state.active == 0 && state.accept_done {
                return true;
            }
            let now = Instant::now();
            if deadline <= now {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl State {
    /// The next scripted reply for `path`, else its default, else the longest matching
    /// prefix default, else the server default.
    fn next_reply(&mut self, path: &str) -> Reply {
        if let Some(reply) = self.scripts.get_mut(path).and_then(VecDeque::pop_front) {
            return reply;
        }
        if let Some(reply) = self.defaults.get(path) {
            return reply.clone();
        }
        self.prefix_defaults
            .iter()
            .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or_else(|| self.server_default.clone(), |(_, reply)| reply.clone())
    }
}

/// Accepts connections until stopped, one thread each, at most `max_connections` at once:
/// at the cap it stops accepting, and new connections wait in the kernel's backlog.
pub(crate) fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while shared.acquire_slot() {
        match listener.accept() {
            Ok((stream, _peer)) => {
                if shared.stop.is_set() {
                    shared.release_slot();
                    break;
                }
                let id = shared.next_connection_id();
                let for_thread = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name(format!("recipient-conn-{id}"))
                    .spawn(move || serve(for_thread, stream, id));
                if let Err(e) = spawned {
                    shared.release_slot();
                    shared.note_error(format!("connection {id}: cannot spawn a thread: {e}"));
                }
            }
            Err(e) => {
                shared.release_slot();
                if shared.stop.is_set() {
                    break;
                }
                shared.note_error(format!("accept: {e}"));
                // Errors such as EMFILE repeat at once; do not spin on them.
                shared.stop.sleep(Duration::from_millis(10));
            }
        }
    }
    drop(listener);
    shared.accept_finished();
}

/// What to do after a reply.
enum Flow {
    KeepAlive,
    Close,
}

/// A decoded request body and its trailer fields.
type BodyAndTrailers = (Vec<u8>, Vec<(String, String)>);

/// Why reading a request stopped.
enum ReadError {
    /// End of file, the stop flag or a socket error; `mid_request` if bytes were pending.
    Closed {
        mid_request: bool,
    },
    /// The head or a body line exceeds its limit.
    HeadTooLarge,
    /// The body exceeds `max_body`.
    BodyTooLarge,
    Malformed(String),
}

/// Releases the connection slot when the connection thread ends, however it ends.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release_slot();
    }
}

/// One connection: the socket and the bytes read but not yet parsed.
struct Conn {
    id: u64,
    stream: TcpStream,
    buf: Vec<u8>,
    shared: Arc<Shared>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The registered clone shares the socket: it must go first, or closing `stream`
        // would not close the socket (and a Reset would send no RST).
        self.shared.deregister(self.id);
    }
}

fn serve(shared: Arc<Shared>, stream: TcpStream, id: u64) {
    let _slot = Slot(Arc::clone(&shared));
    let mut conn = match Conn::new(Arc::clone(&shared), stream, id) {
        Ok(conn) => conn,
        Err(e) => {
            shared.note_error(format!("connection {id}: {e}"));
            return;
        }
    };
    while let Flow::KeepAlive = conn.exchange() {}
}

impl Conn {
    fn new(shared: Arc<Shared>, stream: TcpStream, id: u64) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(POLL))?;
        stream.set_write_timeout(Some(POLL))?;
        shared.register(id, stream.try_clone()?);
        if shared.stop.is_set() {
            // `stop` may have shut the registered streams down just before this one joined.
            let _ = stream.shutdown(Shutdown::Both);
        }
        Ok(Self {
            id,
            stream,
            buf: Vec::new(),
            shared,
        })
    }

    fn note(&self, what: impl core::fmt::Display) {
        self.shared
            .note_error(format!("connection {}: {what}", self.id));
    }

    /// Reads one request, records it and replies.
    fn exchange(&mut self) -> Flow {
        let head = match self.read_head() {
            Ok(head) => head,
            Err(e) => return self.refuse_unrecorded(e),
        };
        let framing = match head.framing() {
            Ok(framing) => framing,
            Err(msg) => return self.refuse_unrecorded(ReadError::Malformed(msg)),
        };
        let keep_alive = head.keep_alive();
        let is_head = head.method == "HEAD";
        let max_body = self.shared.config.max_body;
        if let Framing::Length(n) = framing {
            if n > max_body as u64 {
                return self.refuse_too_large(head);
            }
        }
        if head.expects_continue() && framing.has_body() {
            // A client waiting for this interim response would not send its body otherwise.
            if self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
                return Flow::Close;
            }
        }
        let (body, trailers) = match self.read_body(framing, max_body) {
            Ok(body) => body,
            Err(ReadError::BodyTooLarge) => return self.refuse_too_large(head),
            Err(e) => return self.refuse_unrecorded(e),
        };
        let (index, reply) = self.shared.arrive(self.id, head, body, trailers, false);
        let reply = reply.unwrap_or_default();
        self.perform(index, reply, keep_alive, is_head)
    }

    /// Ends the connection over a request that could not be read; answers 400 or 431 when
    /// the request was bad, nothing when the connection simply ended.
    fn refuse_unrecorded(&mut self, error: ReadError) -> Flow {
        let status = match error {
            ReadError::Closed { mid_request } => {
                // A request cut short by the recipient's own shutdown is not the client's fault.
                if mid_request && !self.shared.stop.is_set() {
                    self.note("connection ended in the middle of a request");
                }
                return Flow::Close;
            }
            ReadError::HeadTooLarge => {
                self.note("request head or body line too large");
                431
            }
            ReadError::BodyTooLarge => 413,
            ReadError::Malformed(msg) => {
                self.note(msg);
                400
            }
        };
        let bytes = http::encode(&Response::new(status), true, false);
        if self.write_all(&bytes).is_ok() {
            self.linger_close();
        }
        Flow::Close
    }

    /// Records a request whose body is over the limit (with an empty body), answers 413 and
    /// closes: the unread rest of the body makes the connection unusable.
    fn refuse_too_large(&mut self, head: Head) -> Flow {
        let (index, _) = self
            .shared
            .arrive(self.id, head, Vec::new(), Vec::new(), true);
        let bytes = http::encode(&Response::new(413), true, false);
        self.shared.answered(index, 413);
        if self.write_all(&bytes).is_ok() {
            self.linger_close();
        } else {
            self.shared.unanswered(index, Unanswered::WriteFailed);
        }
        Flow::Close
    }

    fn perform(&mut self, index: u64, reply: Reply, keep_alive: bool, is_head: bool) -> Flow {
        match reply {
            Reply::Status(status) => {
                self.respond(index, &Response::new(status), keep_alive, is_head)
            }
            Reply::Response(response) => self.respond(index, &response, keep_alive, is_head),
            Reply::Redirect(status, location) => self.respond(
                index,
                &Response::new(status).with_header("Location", location),
                keep_alive,
                is_head,
            ),
            Reply::Choose(chooser) => {
                let recorded = lock(&self.shared.state).log.get(index as usize).cloned();
                match recorded {
                    Some(r) => self.perform(index, (chooser.0)(&r), keep_alive, is_head),
                    None => self.respond(index, &Response::new(500), keep_alive, is_head),
                }
            }
            Reply::Delay(delay, inner) => {
                if self.shared.stop.sleep(delay) {
                    self.perform(index, *inner, keep_alive, is_head)
                } else {
                    self.shared.unanswered(index, Unanswered::Shutdown);
                    Flow::Close
                }
            }
            Reply::Hang => {
                self.hang();
                self.shared.unanswered(index, Unanswered::Hung);
                Flow::Close
            }
            Reply::Reset => {
                self.shared.unanswered(index, Unanswered::Reset);
                // Linger 0 makes the close that follows (when `self` drops) abortive: RST.
                if let Err(e) =
                    socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO))
                {
                    self.note(format_args!("cannot set SO_LINGER for a reset: {e}"));
                }
                Flow::Close
            }
            Reply::CloseWithoutResponse => {
                self.shared.unanswered(index, Unanswered::Closed);
                let _ = self.stream.shutdown(Shutdown::Both);
                Flow::Close
            }
            Reply::SlowBody {
                status,
                chunk,
                interval,
                chunks,
            } => self.trickle(index, status, &chunk, interval, chunks, keep_alive, is_head),
        }
    }

    /// Writes a whole response. The completion is recorded just before the write, so a
    /// client that has the response always finds it recorded.
    fn respond(
        &mut self,
        index: u64,
        response: &Response,
        keep_alive: bool,
        is_head: bool,
    ) -> Flow {
        let close = !keep_alive || http::closes(&response.headers);
        let bytes = http::encode(response, close, is_head);
        self.shared.answered(index, response.status);
        if self.write_all(&bytes).is_err() {
            self.shared.unanswered(index, Unanswered::WriteFailed);
            return Flow::Close;
        }
        self.after_response(close)
    }

    #[allow(clippy::too_many_arguments)]
    fn trickle(
        &mut self,
        index: u64,
        status: u16,
        chunk: &[u8],
        interval: Duration,
        chunks: usize,
        keep_alive: bool,
        is_head: bool,
    ) -> Flow {
        let close = !keep_alive;
        let sends_body = !is_head && !http::bodyless(status) && chunks > 0 && !chunk.is_empty();
        let head = http::encode_head(status, &[], chunk.len().saturating_mul(chunks), close);
        if !sends_body {
            self.shared.answered(index, status);
        }
        if self.write_all(&head).is_err() {
            self.shared.unanswered(index, Unanswered::WriteFailed);
            return Flow::Close;
        }
        if sends_body {
            for i in 0..chunks {
                if !self.shared.stop.sleep(interval) {
                    self.shared.unanswered(index, Unanswered::Shutdown);
                    return Flow::Close;
                }
                if i + 1 == chunks {
                    self.shared.answered(index, status);
                }
                if self.write_all(chunk).is_err() {
                    self.shared.unanswered(index, Unanswered::WriteFailed);
                    return Flow::Close;
                }
            }
        }
        self.after_response(close)
    }

    fn after_response(&mut self, close: bool) -> Flow {
        if close {
            let _ = self.stream.shutdown(Shutdown::Write);
            Flow::Close
        } else {
            Flow::KeepAlive
        }
    }

    /// Reads and discards until the client closes or the recipient stops.
    fn hang(&mut self) {
        self.buf.clear();
        while self.fill().is_ok() {
            self.buf.clear();
        }
    }

    /// Half-closes, then reads and discards what the client still sends (within bounds), so
    /// unread request bytes do not turn the close into a RST that destroys the response.
    fn linger_close(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + LINGER_TIME;
        let mut discarded = 0;
        while Instant::now() < deadline && discarded < LINGER_BYTES {
            discarded += self.buf.len();
            self.buf.clear();
            if self.fill().is_err() {
                break;
            }
        }
    }

    /// Reads more bytes into `buf`. Fails on end of file, a socket error or the stop flag.
    fn fill(&mut self) -> Result<(), ()> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if self.shared.stop.is_set() {
                return Err(());
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if retryable(&e) => {}
                Err(_) => return Err(()),
            }
        }
    }

    fn fill_or_closed(&mut self) -> Result<(), ReadError> {
        let mid_request = !self.buf.is_empty();
        self.fill().map_err(|()| ReadError::Closed { mid_request })
    }

    /// Writes everything, waking every `POLL` to look at the stop flag.
    fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.shared.stop.is_set() {
                return Err(io::Error::other("recipient stopped"));
            }
            match self.stream.write(data) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_head(&mut self) -> Result<Head, ReadError> {
        loop {
            // RFC 9112 §2.2: ignore empty lines before a request line.
            let blank = self
                .buf
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            self.buf.drain(..blank);
            if let Some((head_len, consumed)) = http::find_head_end(&self.buf) {
                if head_len > MAX_HEAD {
                    return Err(ReadError::HeadTooLarge);
                }
                let head = http::parse_head(&self.buf[..head_len]).map_err(ReadError::Malformed);
                self.buf.drain(..consumed);
                return head;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(ReadError::HeadTooLarge);
            }
            self.fill_or_closed()?;
        }
    }

    fn read_body(
        &mut self,
        framing: Framing,
        max_body: usize,
    ) -> Result<BodyAndTrailers, ReadError> {
        match framing {
            Framing::None => Ok((Vec::new(), Vec::new())),
            Framing::Length(n) => {
                let n = usize::try_from(n).map_err(|_| ReadError::BodyTooLarge)?;
                Ok((self.read_exact(n)?, Vec::new()))
            }
            Framing::Chunked => self.read_chunked(max_body),
        }
    }

    fn read_exact(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            self.fill()
                .map_err(|()| ReadError::Closed { mid_request: true })?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    fn read_line(&mut self) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(ReadError::HeadTooLarge);
            }
            self.fill()
                .map_err(|()| ReadError::Closed { mid_request: true })?;
        }
    }

    /// Decodes a chunked body (RFC 9112 §7.1), keeping its trailer fields.
    fn read_chunked(&mut self, max_body: usize) -> Result<BodyAndTrailers, ReadError> {
        let mut body = Vec::new();
        loop {
            let size = http::parse_chunk_size(&self.read_line()?).map_err(ReadError::Malformed)?;
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).map_err(|_| ReadError::BodyTooLarge)?;
            if body.len().saturating_add(size) > max_body {
                return Err(ReadError::BodyTooLarge);
            }
            body.extend(self.read_exact(size)?);
            if !self.read_line()?.is_empty() {
                return Err(ReadError::Malformed(
                    "chunk data longer than its size".to_owned(),
                ));
            }
        }
        let mut trailers = Vec::new();
        let mut trailer_bytes = 0;
        loop {
            let line = self.read_line()?;
            if line.is_empty() {
                return Ok((body, trailers));
            }
            trailer_bytes += line.len();
            if trailer_bytes > MAX_HEAD {
                return Err(ReadError::HeadTooLarge);
            }
            trailers.push(http::parse_field(&line).map_err(ReadError::Malformed)?);
        }
    }
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
