//! The group-committing ack writer (OL-16).
//!
//! Delivery workers hand acks to one writer thread, which commits them in batches: every
//! `max_delay`, or as soon as `max_batch` acks are waiting. At-least-once delivery allows
//! this: an ack lost to a crash only means a resend. Outcomes that are *not* deliveries
//! (dead letters, retired lanes) do not go through here; they are written synchronously so a
//! lane never moves past an undelivered unit before that outcome is durable.
//!
//! Errors are kept per pass (per [`SlotToken`]): a commit refused for one pass's stale token
//! is reported to that pass only, through [`AckWriter::failure`] as soon as it happens (a
//! pass checks it on every round and stops starting attempts at once) and through
//! [`AckWriter::flush`] at the pass's end.

use core::time::Duration;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use outbox_lanes_core::UnitId;

use crate::{SlotToken, Store, StoreError, StoreLaneId};

/// How the [`AckWriter`] batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckWriterOptions {
    /// Commit as soon as this many acks wait.
    pub max_batch: usize,
    /// Commit at most this long after the first waiting ack arrived.
    pub max_delay: Duration,
}

impl Default for AckWriterOptions {
    fn default() -> Self {
        AckWriterOptions {
            max_batch: 512,
            max_delay: Duration::from_millis(2),
        }
    }
}

enum Msg {
    Ack(SlotToken, UnitId, StoreLaneId),
    Batch(SlotToken, Vec<(UnitId, StoreLaneId)>),
    Flush(SyncSender<()>),
}

/// One writer thread owning a batch of acks; see the module docs.
///
/// Dropping it commits what is waiting and joins the thread.
pub struct AckWriter {
    tx: Option<Sender<Msg>>,
    errors: Arc<Errors>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for AckWriter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AckWriter").finish_non_exhaustive()
    }
}

impl AckWriter {
    /// Starts the writer thread.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(store: Arc<dyn Store>, opts: AckWriterOptions) -> std::io::Result<AckWriter> {
        let (tx, rx) = mpsc::channel();
        let errors = Arc::new(Errors::default());
        let errs = Arc::clone(&errors);
        let thread = std::thread::Builder::new()
            .name("outbox-lanes-acks".into())
            .spawn(move || run(&*store, &rx, opts, &errs))?;
        Ok(AckWriter {
            tx: Some(tx),
            errors,
            thread: Some(thread),
        })
    }

    /// Hands one delivered recipient over for the next group commit. Not durable until a
    /// [`AckWriter::flush`] returns (or the next batch commits).
    pub fn ack(&self, token: &SlotToken, unit: UnitId, lane: StoreLaneId) {
        if let Some(tx) = &self.tx {
            // The thread only exits when `tx` is dropped, so a send cannot fail while we hold it.
            let _ = tx.send(Msg::Ack(token.clone(), unit, lane));
        }
    }

    /// Hands several delivered recipients of one pass over at once (one message, one
    /// wake-up of the writer, however many acks).
    pub fn ack_batch(&self, token: &SlotToken, delivered: Vec<(UnitId, StoreLaneId)>) {
        if delivered.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Batch(token.clone(), delivered));
        }
    }

    /// The first commit error of `token`'s acks so far, if any, without waiting: a pass
    /// calls it on every round, and on an error stops starting attempts at once.
    pub fn failure(&self, token: &SlotToken) -> Option<StoreError> {
        self.errors.lock().get(token).cloned()
    }

    /// Returns once every ack handed over before the call is committed.
    ///
    /// # Errors
    /// The first error met by a commit of `token`'s acks (e.g. [`StoreError::StaleToken`]:
    /// the acks of that pass were not written); other passes' errors are theirs. The error is
    /// forgotten once reported.
    pub fn flush(&self, token: &SlotToken) -> Result<(), StoreError> {
        self.wait()?;
        self.errors.lock().remove(token).map_or(Ok(()), Err)
    }

    /// Returns once every ack handed over before the call is committed, whatever came of
    /// them (a shutdown's last flush).
    ///
    /// # Errors
    /// The writer thread stopped.
    pub fn flush_all(&self) -> Result<(), StoreError> {
        self.wait()?;
        self.errors.lock().clear();
        Ok(())
    }

    fn wait(&self) -> Result<(), StoreError> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| StoreError::Database("ack writer stopped".into()))?;
        tx.send(Msg::Flush(done_tx))
            .map_err(|_| StoreError::Database("ack writer thread stopped".into()))?;
        done_rx
            .recv()
            .map_err(|_| StoreError::Database("ack writer thread stopped".into()))
    }
}

/// Commit errors per pass, shared by the writer thread and the handle.
#[derive(Default)]
struct Errors(Mutex<HashMap<SlotToken, StoreError>>);

impl Errors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SlotToken, StoreError>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for AckWriter {
    fn drop(&mut self) {
        // Closing the channel makes the thread commit what waits and exit.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Acks waiting for the next commit, grouped by pass (one token clone per group, not per ack).
#[derive(Default)]
struct Batch {
    groups: Vec<(SlotToken, Vec<(UnitId, StoreLaneId)>)>,
    len: usize,
}

impl Batch {
    fn push(&mut self, token: SlotToken, items: impl IntoIterator<Item = (UnitId, StoreLaneId)>) {
        let at = match self.groups.iter().position(|(t, _)| *t == token) {
            Some(at) => at,
            None => {
                self.groups.push((token, Vec::new()));
                self.groups.len() - 1
            }
        };
        let group = &mut self.groups[at].1;
        let before = group.len();
        group.extend(items);
        self.len += group.len() - before;
    }

    fn add(&mut self, msg: Msg, flushes: &mut Vec<SyncSender<()>>) {
        match msg {
            Msg::Ack(t, u, l) => self.push(t, [(u, l)]),
            Msg::Batch(t, items) => self.push(t, items),
            Msg::Flush(done) => flushes.push(done),
        }
    }
}

fn run(store: &dyn Store, rx: &Receiver<Msg>, opts: AckWriterOptions, errors: &Errors) {
    let mut batch = Batch::default();
    loop {
        let msg = match rx.recv() {
            Ok(m) => m,
            Err(_) => {
                commit(store, &mut batch, errors);
                return;
            }
        };
        let mut flushes = Vec::new();
        batch.add(msg, &mut flushes);
        // Gather more until the batch is full, the delay passed, or a flush asks for it now.
        let deadline = Instant::now() + opts.max_delay;
        let mut closed = false;
        while flushes.is_empty() && batch.len < opts.max_batch {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(msg) => batch.add(msg, &mut flushes),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        commit(store, &mut batch, errors);
        for done in flushes {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}

fn commit(store: &dyn Store, batch: &mut Batch, errors: &Errors) {
    batch.len = 0;
    // One transaction per pass (token): a stale token refuses only its own pass's acks.
    for (token, items) in batch.groups.drain(..) {
        if items.is_empty() {
            continue;
        }
        // A busy database (a lock held past the busy timeout, a deadlock the server broke)
        // wrote nothing: retrying is safe, and an ack is idempotent anyway.
        let mut result = store.ack(&token, &items);
        for _ in 0..3 {
            if result != Err(StoreError::Busy) {
                break;
            }
            result = store.ack(&token, &items);
        }
        if let Err(e) = result {
            errors.lock().entry(token).or_insert(e);
        }
    }
}
