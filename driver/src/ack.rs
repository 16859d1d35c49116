//! The group-committing ack writer (OL-16): the driver's policy for acks, over any
//! [`Store`].
//!
//! Delivery workers hand acks to one writer thread (started on the runtime's threads), which
//! commits them in batches: every `max_delay` (on the clock it is given), or as soon as
//! `max_batch` acks are waiting. Handing acks over only appends
//! to the waiting batch under a lock: the writer is woken when a batch starts, fills, or a
//! flush asks for it, not once per hand-over, so it wakes about once per `max_delay` under
//! load (a channel wake-up per round cost a context switch each). At-least-once delivery allows
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
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use outbox_lanes_core::UnitId;

use outbox_lanes_store::{
    DeliveryLogEntry, SlotToken, SpawnThread, Store, StoreError, StoreLaneId,
};

use crate::clock::Clock;

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

/// What the handles and the writer thread share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when a batch starts, fills up, a flush is asked for, or the writer closes.
    wake: Condvar,
    errors: Mutex<HashMap<SlotToken, StoreError>>,
    max_batch: usize,
}

#[derive(Default)]
struct State {
    batch: Batch,
    flushes: Vec<SyncSender<()>>,
    closed: bool,
    /// The writer thread has exited (it panicked, or it was closed).
    gone: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn errors(&self) -> MutexGuard<'_, HashMap<SlotToken, StoreError>> {
        self.errors.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hand_over(
        &self,
        token: &SlotToken,
        items: impl IntoIterator<Item = (UnitId, StoreLaneId)>,
        log: Vec<DeliveryLogEntry>,
    ) {
        let mut st = self.state();
        let was_empty = st.batch.len == 0;
        st.batch.push(token, items, log);
        if was_empty || st.batch.len >= self.max_batch {
            self.wake.notify_one();
        }
    }
}

/// One writer thread owning a batch of acks; see the module docs.
///
/// Dropping it commits what is waiting and joins the thread.
pub struct AckWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for AckWriter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AckWriter").finish_non_exhaustive()
    }
}

impl AckWriter {
    /// Starts the writer thread on `threads` (an outbox's: its runtime's), measuring
    /// [`AckWriterOptions::max_delay`] on `clock`'s monotonic time.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(
        store: Arc<dyn Store>,
        opts: AckWriterOptions,
        threads: &dyn SpawnThread,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<AckWriter> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            errors: Mutex::new(HashMap::new()),
            max_batch: opts.max_batch.max(1),
        });
        let sh = Arc::clone(&shared);
        let thread = threads.spawn_thread(
            "outbox-lanes-acks",
            Box::new(move || {
                // However the thread ends, a flush waiting for it is answered (with an
                // error) instead of hanging.
                let _gone = Gone(&sh);
                run(&*store, &sh, opts.max_delay, &*clock);
            }),
        )?;
        Ok(AckWriter {
            shared,
            thread: Some(thread),
        })
    }

    /// Hands one delivered recipient over for the next group commit. Not durable until a
    /// [`AckWriter::flush`] returns (or the next batch commits).
    pub fn ack(&self, token: &SlotToken, unit: UnitId, lane: StoreLaneId) {
        self.shared.hand_over(token, [(unit, lane)], Vec::new());
    }

    /// Hands several delivered recipients of one pass over at once.
    pub fn ack_batch(&self, token: &SlotToken, delivered: Vec<(UnitId, StoreLaneId)>) {
        if delivered.is_empty() {
            return;
        }
        self.shared.hand_over(token, delivered, Vec::new());
    }

    /// [`AckWriter::ack_batch`] with the delivery log's entries of these deliveries,
    /// committed in the same transaction ([`DriverStore::ack_logged`]).
    ///
    /// [`DriverStore::ack_logged`]: outbox_lanes_store::DriverStore::ack_logged
    pub fn ack_batch_logged(
        &self,
        token: &SlotToken,
        delivered: Vec<(UnitId, StoreLaneId)>,
        log: Vec<DeliveryLogEntry>,
    ) {
        if delivered.is_empty() {
            return;
        }
        self.shared.hand_over(token, delivered, log);
    }

    /// The first commit error of `token`'s acks so far, if any, without waiting: a pass
    /// calls it on every round, and on an error stops starting attempts at once.
    pub fn failure(&self, token: &SlotToken) -> Option<StoreError> {
        self.shared.errors().get(token).cloned()
    }

    /// Returns once every ack handed over before the call is committed.
    ///
    /// # Errors
    /// The first error met by a commit of `token`'s acks (e.g. [`StoreError::StaleToken`]:
    /// the acks of that pass were not written); other passes' errors are theirs. The error is
    /// forgotten once reported.
    pub fn flush(&self, token: &SlotToken) -> Result<(), StoreError> {
        self.wait()?;
        self.shared.errors().remove(token).map_or(Ok(()), Err)
    }

    /// Returns once every ack handed over before the call is committed, whatever came of
    /// them (a shutdown's last flush).
    ///
    /// # Errors
    /// The writer thread stopped.
    pub fn flush_all(&self) -> Result<(), StoreError> {
        self.wait()?;
        self.shared.errors().clear();
        Ok(())
    }

    fn wait(&self) -> Result<(), StoreError> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        {
            let mut st = self.shared.state();
            if st.gone || st.closed {
                return Err(StoreError::Database("ack writer thread stopped".into()));
            }
            st.flushes.push(done_tx);
            self.shared.wake.notify_one();
        }
        done_rx
            .recv()
            .map_err(|_| StoreError::Database("ack writer thread stopped".into()))
    }
}

impl Drop for AckWriter {
    fn drop(&mut self) {
        // The thread commits what waits and exits.
        self.shared.state().closed = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Marks the writer gone when its thread ends, and drops the flushes it can no longer answer.
struct Gone<'a>(&'a Shared);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.gone = true;
        st.flushes.clear();
    }
}

/// One pass's acks waiting, and the delivery log's entries of them.
type Group = (SlotToken, Vec<(UnitId, StoreLaneId)>, Vec<DeliveryLogEntry>);

/// Acks waiting for the next commit, grouped by pass (one token clone per group, not per ack).
#[derive(Default)]
struct Batch {
    groups: Vec<Group>,
    len: usize,
}

impl Batch {
    fn push(
        &mut self,
        token: &SlotToken,
        items: impl IntoIterator<Item = (UnitId, StoreLaneId)>,
        mut log: Vec<DeliveryLogEntry>,
    ) {
        let at = match self.groups.iter().position(|(t, _, _)| t == token) {
            Some(at) => at,
            None => {
                self.groups.push((token.clone(), Vec::new(), Vec::new()));
                self.groups.len() - 1
            }
        };
        let (_, group, logs) = &mut self.groups[at];
        let before = group.len();
        group.extend(items);
        if logs.is_empty() {
            *logs = log;
        } else {
            logs.append(&mut log);
        }
        self.len += group.len() - before;
    }
}

fn run(store: &dyn Store, shared: &Shared, max_delay: Duration, clock: &dyn Clock) {
    let mut st = shared.state();
    loop {
        // Idle: wait for the first ack, a flush, or the close.
        while st.batch.len == 0 && st.flushes.is_empty() && !st.closed {
            st = shared.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        // Gather more until the batch is full, the delay passed, or a flush or the close asks
        // for it now. The delay is the clock's: a virtual clock that stands still holds the
        // batch however long the condition variable sleeps.
        let deadline = clock.instant() + max_delay;
        while st.flushes.is_empty() && !st.closed && st.batch.len < shared.max_batch {
            let left = deadline.saturating_duration_since(clock.instant());
            if left.is_zero() {
                break;
            }
            st = shared
                .wake
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let batch = std::mem::take(&mut st.batch);
        let flushes = std::mem::take(&mut st.flushes);
        let closed = st.closed;
        drop(st);
        commit(store, batch, shared);
        for done in flushes {
            let _ = done.send(());
        }
        if closed {
            return;
        }
        st = shared.state();
    }
}

fn commit(store: &dyn Store, batch: Batch, shared: &Shared) {
    // One transaction per pass (token): a stale token refuses only its own pass's acks.
    for (token, items, log) in batch.groups {
        if items.is_empty() {
            continue;
        }
        // A busy database (a lock held past the busy timeout, a deadlock the server broke)
        // wrote nothing: retrying is safe, and an ack is idempotent anyway (its log entries
        // go with it, all or nothing).
        let mut result = store.ack_logged(&token, &items, &log);
        for _ in 0..3 {
            if result != Err(StoreError::Busy) {
                break;
            }
            result = store.ack_logged(&token, &items, &log);
        }
        if let Err(e) = result {
            shared.errors().entry(token).or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp};
    use outbox_lanes_store::{ClaimRange, NewRow, SlotAcquisition, SqliteStore};

    use super::*;
    use crate::testing::{ManualClock, NamedThreads};

    /// The actor's units pending in `store`.
    fn pending(store: &dyn Store) -> u64 {
        store.status().expect("status")[0].pending
    }

    #[test]
    fn the_group_commit_waits_for_the_clock_it_is_given_not_the_wall_clock() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().expect("store"));
        let alice = ActorId::new("alice");
        let to = "https://a.example/inbox";
        let rows: Vec<NewRow> = ["r1", "r2"]
            .iter()
            .map(|id| NewRow {
                id: (*id).into(),
                body: b"{}".to_vec(),
                content_type: "application/json".into(),
                recipients: vec![to.into()],
                ..NewRow::default()
            })
            .collect();
        store.enqueue(&alice, &rows).expect("enqueue");
        let SlotAcquisition::Acquired(token) = store
            .acquire_slot(&alice, "h", Duration::from_secs(60))
            .expect("acquire")
        else {
            panic!("the slot is free");
        };
        let key = LaneKey::new(to, None).expect("url");
        let lane = store.find_lane(&alice, &key).expect("find").expect("lane");
        let range = ClaimRange {
            lane,
            from: Seq(0),
            limit: 10,
        };
        let units: Vec<UnitId> = store.claim(&token, &[range]).expect("claim")[0]
            .units
            .iter()
            .map(|u| u.id)
            .collect();

        let clock = ManualClock::at(Timestamp::from_secs(1_700_000_000));
        let threads = NamedThreads::default();
        let max_delay = Duration::from_millis(20);
        let opts = AckWriterOptions {
            max_batch: 100,
            max_delay,
        };
        let writer =
            AckWriter::spawn(Arc::clone(&store), opts, &threads, clock.clone()).expect("spawn");
        assert_eq!(threads.names(), ["outbox-lanes-acks"]);

        writer.ack(&token, units[0], lane);
        // The wall clock runs past the delay many times; the writer's clock does not move, so
        // the batch waits.
        std::thread::sleep(max_delay * 5);
        assert_eq!(pending(&*store), 2);
        // The clock moves a little at a time: the batch is committed once it moved by the
        // delay, not before.
        let mut moved = Duration::ZERO;
        while pending(&*store) == 2 {
            assert!(
                moved < Duration::from_secs(600),
                "committed in virtual time"
            );
            clock.advance(Duration::from_millis(1));
            moved += Duration::from_millis(1);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(moved >= max_delay, "{moved:?}");
        assert_eq!(pending(&*store), 1);
        // A flush does not wait for the clock.
        writer.ack(&token, units[1], lane);
        writer.flush(&token).expect("flush");
        assert_eq!(pending(&*store), 0);
    }
}
