//! What every runtime's `Outbox` shares: the store, the drain slots, the ack writer, the
//! resolver, the hooks and the executor. Its methods block; an async runtime calls them on
//! its blocking pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use outbox_lanes_core::{
    ActorId, ActorResolver, DrainAction, DrainEnd, DrainSession, DrainSlots, Release,
};
use outbox_lanes_store::{
    ActorStatus, DeadLetter, Enqueued, LaneStatus, NewRow, SpawnThread, Store, StoreError, covers,
    policy_name,
};
use tracing::{debug, info, warn};

use crate::ack::{AckWriter, AckWriterOptions};
use crate::clock::Clock;
use crate::config::OutboxConfig;
use crate::control::{DrainControl, Signal, StopRecord};
use crate::error::OutboxError;
use crate::hooks::Hooks;
use crate::hosts::HostCaps;
use crate::job::Executor;
use crate::origins::OriginGate;
use crate::pass::PassReport;
use crate::runtime::Runtime;

/// What a drain request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// This call ran the passes; their totals.
    Ran(PassReport),
    /// A pass of this actor was already running (here or in another process); it was told
    /// to look once more, and this call returned at once (OL-12).
    Merged,
}

impl std::fmt::Display for DrainOutcome {
    /// The pass report, or `merged into the pass already running`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DrainOutcome::Ran(report) => report.fmt(f),
            DrainOutcome::Merged => f.write_str("merged into the pass already running"),
        }
    }
}

/// The state every runtime's `Outbox` shares: the store, its configuration, hooks, ack writer,
/// executor and drain slots.
pub struct OutboxCore {
    store: Arc<dyn Store>,
    config: OutboxConfig,
    resolver: Box<dyn ActorResolver + Send + Sync>,
    hooks: Hooks,
    slots: Mutex<DrainSlots>,
    acks: AckWriter,
    executor: Arc<dyn Executor>,
    gate: OriginGate,
    /// The runtime's clocks, asked once at open: every time the engine reads.
    clock: Arc<dyn Clock>,
    holder: String,
    stopping: AtomicBool,
    /// Stopped at shutdown: every running pass subscribes to it.
    shutdown: Arc<DrainControl>,
    /// Notified whenever a drain slot of this process is released.
    released: Arc<Signal>,
    /// What the stop cut.
    stop_record: StopRecord,
}

impl std::fmt::Debug for OutboxCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxCore")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl OutboxCore {
    /// Widens the outbox's destination policy to allow what the configuration's
    /// [`HttpConfig::addresses`](crate::http::HttpConfig::addresses) allows and reads it into
    /// [`HttpConfig::outbox_addresses`](crate::http::HttpConfig::outbox_addresses) (OL-24),
    /// starts the ack writer, puts the fair shares of the budget between actors
    /// ([`FairShares`](crate::FairShares)), the per-host caps (if configured) and the origin gate
    /// ([`OriginGate`], shared through the store) in front of `executor`. Build the
    /// executor's HTTP clients from `config.http` (a clone of it shares the handle), so that
    /// they allow what the outbox stores.
    ///
    /// The runtime `rt` gives the outbox its clocks ([`Runtime::clock`]) and starts its
    /// threads ([`Runtime::threads`]: the ack writer, the gate's writer and pacer, and the
    /// store's watcher, which the store is given here).
    ///
    /// # Errors
    /// The destination policy could not be read or widened
    /// ([`OutboxError::DestinationPolicy`]); a thread could not be started.
    pub fn new(
        rt: &dyn Runtime,
        store: Arc<dyn Store>,
        config: OutboxConfig,
        resolver: Box<dyn ActorResolver + Send + Sync>,
        hooks: Hooks,
        executor: Arc<dyn Executor>,
    ) -> Result<OutboxCore, OutboxError> {
        let clock = rt.clock();
        let threads = rt.threads();
        store.use_threads(Arc::clone(&threads));
        open_destination_policy(&store, &config, &*threads)?;
        let acks = AckWriter::spawn(
            Arc::clone(&store),
            // Acks are group-committed (OL-16): a crash forgets at most the last 20 ms of
            // them (those units are sent again), and a large batch writes each index page it
            // touches once for many acks. Measured on a file store (2,000 rows to 100
            // recipients, `cargo run --release -p outbox-lanes-store --example ack_batches`):
            // 10.9 µs per ack in batches of 70, 5.6 in batches of 500, 4.2 in batches of 2,000.
            AckWriterOptions {
                max_batch: 4096,
                max_delay: Duration::from_millis(20),
            },
            &*threads,
            Arc::clone(&clock),
        )
        .map_err(OutboxError::Spawn)?;
        // Innermost: a place in the budget is taken only by an attempt that goes now.
        let executor: Arc<dyn Executor> = Arc::new(crate::budget::FairShares::new(
            executor,
            config.concurrency,
            config.reserve,
        ));
        let executor: Arc<dyn Executor> = match config.per_host {
            Some(cap) => Arc::new(HostCaps::new(executor, cap)),
            None => executor,
        };
        // Outermost: an attempt its origin defers never takes a place under a host cap.
        let seed = config.seed.unwrap_or_else(crate::pass::fresh_seed);
        let gate = OriginGate::new(
            executor,
            config.host_book(),
            seed,
            Arc::clone(&clock),
            threads,
        );
        gate.share_through(Arc::clone(&store) as Arc<dyn outbox_lanes_store::DriverStore>)
            .map_err(OutboxError::Spawn)?;
        let executor: Arc<dyn Executor> = Arc::new(gate.clone());
        let holder = config.holder.clone().unwrap_or_else(default_holder);
        Ok(OutboxCore {
            store,
            config,
            resolver,
            hooks,
            slots: Mutex::new(DrainSlots::new()),
            released: Arc::default(),
            acks,
            executor,
            gate,
            clock,
            holder,
            stopping: AtomicBool::new(false),
            shutdown: Arc::new(DrainControl::default()),
            stop_record: StopRecord::default(),
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &OutboxConfig {
        &self.config
    }

    /// The hooks.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The group-committing ack writer.
    pub fn acks(&self) -> &AckWriter {
        &self.acks
    }

    /// The executor (behind the per-host caps, if any).
    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.executor
    }

    /// The origin gate: the hosts this process knows (health, signature schemes).
    pub fn hosts(&self) -> &OriginGate {
        &self.gate
    }

    /// The clocks of the runtime the outbox opened on: what the engine reads the time from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The name this process holds drain slots under.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The in-process drain slots.
    pub fn slots(&self) -> MutexGuard<'_, DrainSlots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases `actor`'s drain slot in this process ([`DrainSlots::release`]) and wakes
    /// whoever waits for passes to end.
    pub fn release_slot(&self, actor: &ActorId) -> Release {
        let r = self.slots().release(actor);
        self.released.notify();
        r
    }

    /// Releases `actor`'s drain slot whatever its state ([`DrainSlots::force_release`]) and
    /// wakes whoever waits for passes to end.
    pub fn force_release_slot(&self, actor: &ActorId) -> bool {
        let r = self.slots().force_release(actor);
        self.released.notify();
        r
    }

    /// Executes a drain session's action on this process's slots (`ReleaseLocalSlot`,
    /// `ForceReleaseLocalSlot`), the same in every runtime; any other action is not about
    /// them and does nothing here.
    pub fn local_slot_action(
        &self,
        actor: &ActorId,
        action: &DrainAction,
        session: &mut DrainSession,
    ) {
        match action {
            DrainAction::ReleaseLocalSlot => {
                let r = self.release_slot(actor);
                session.handle_local_release(r);
            }
            DrainAction::ForceReleaseLocalSlot => {
                let asked_meanwhile = self.force_release_slot(actor);
                if asked_meanwhile {
                    debug!(%actor, "a drain was asked meanwhile; the monitor comes back for it");
                }
            }
            _ => {}
        }
    }

    /// Notified whenever a drain slot of this process is released: a shutdown waits on it
    /// for the running passes to end, without polling.
    pub fn slot_released(&self) -> &Arc<Signal> {
        &self.released
    }

    /// Whether a shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Marks the outbox as shutting down: running passes stop starting attempts, new drains
    /// are refused.
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.shutdown.request_stop();
    }

    /// Stopped when the shutdown begins: a running pass subscribes to it to be woken.
    pub fn shutdown_signal(&self) -> &Arc<DrainControl> {
        &self.shutdown
    }

    /// What the stop of this outbox cut, noted as its passes and monitors end.
    pub fn stop_record(&self) -> &StopRecord {
        &self.stop_record
    }

    /// Stops at once, for a process about to exit: nothing new starts, the acks waiting are
    /// committed, and attempts in flight are not waited for (their units are delivered again
    /// later: at-least-once). Passes still running see the shutdown and hand back.
    pub fn abort(&self) {
        self.begin_shutdown();
        if let Err(e) = self.acks.flush_all() {
            warn!(error = %e, "acks not flushed; those units will be delivered again");
        }
    }

    /// After the passes ended: stops the executor — attempts still in flight are abandoned,
    /// not waited for (their passes recorded them as interrupted; their units are sent again
    /// later) — and commits the acks still waiting.
    pub fn finish_shutdown(&self) {
        self.executor.shutdown();
        if let Err(e) = self.acks.flush_all() {
            warn!(error = %e, "acks not flushed at shutdown; those units will be delivered again");
        }
    }

    /// The canonical id of an actor spelling.
    ///
    /// # Errors
    /// [`OutboxError::UnknownActor`].
    pub fn resolve(&self, actor: &str) -> Result<ActorId, OutboxError> {
        self.resolver
            .resolve(actor)
            .map_err(OutboxError::UnknownActor)
    }

    /// Enqueues rows for `actor`, all or nothing; the monitor is woken after the commit.
    ///
    /// # Errors
    /// [`OutboxError::Enqueue`] names the refused row; nothing was written.
    pub fn enqueue(&self, actor: &str, rows: &[NewRow]) -> Result<Vec<Enqueued>, OutboxError> {
        let actor = self.resolve(actor)?;
        let done = self
            .store
            .enqueue(&actor, rows)
            .map_err(OutboxError::Enqueue)?;
        debug!(%actor, rows = rows.len(), "enqueued");
        Ok(done)
    }

    /// Status of every actor.
    ///
    /// # Errors
    /// A store failure.
    pub fn status(&self) -> Result<Vec<ActorStatus>, OutboxError> {
        Ok(self.store.status()?)
    }

    /// The lanes of an actor.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn lanes(&self, actor: &str) -> Result<Vec<LaneStatus>, OutboxError> {
        let actor = self.resolve(actor)?;
        Ok(self.store.lanes(&actor)?)
    }

    /// Dead letters, of one actor or all.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn dead_letters(&self, actor: Option<&str>) -> Result<Vec<DeadLetter>, OutboxError> {
        let actor = actor.map(|a| self.resolve(a)).transpose()?;
        Ok(self.store.dead_letters(actor.as_ref())?)
    }
}

/// OL-24 at open: the outbox's stored destination policy widened to allow what this
/// process's configuration allows (a union, never a narrowing; no write when it does
/// already), and read into the handle the passes and HTTP clients share. On a thread of its
/// own, started on `threads` and joined: an async runtime's builder opens the outbox on an
/// executor thread, where a [`PgStore`](outbox_lanes_store::PgStore) must not be called, and
/// opening is not async, so it cannot wait for the runtime's blocking pool.
fn open_destination_policy(
    store: &Arc<dyn Store>,
    config: &OutboxConfig,
    threads: &dyn SpawnThread,
) -> Result<(), OutboxError> {
    let own = config.http.addresses;
    let (answer, widened) = std::sync::mpsc::sync_channel(1);
    let s = Arc::clone(store);
    let run = move || {
        let _ = answer.send(s.widen_destination_policy(own));
    };
    threads
        .spawn_thread("outbox-lanes-open", Box::new(run))
        .map_err(OutboxError::Spawn)?
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let change = widened
        .recv()
        .map_err(|_| {
            OutboxError::Spawn(std::io::Error::other(
                "the thread widening the destination policy ended without an answer",
            ))
        })?
        .map_err(|source| OutboxError::DestinationPolicy {
            wanted: policy_name(own),
            source,
        })?;
    config.http.outbox_addresses.set(change.after);
    let (before, after) = (policy_name(change.before), policy_name(change.after));
    if change.undid_narrowing {
        warn!(%before, %after,
            "widened the outbox's destination policy, undoing an operator's narrowing \
             (outbox-lanes destinations set): this process's configuration \
             (HttpConfig::addresses, OutboxConfig::allow_loopback or allow_private, \
             --allow-private-destinations) still asks for it; every process on this database \
             delivers to these addresses again");
    } else if change.changed() {
        info!(%before, %after,
            "widened the outbox's destination policy: every process on this database may \
             enqueue and deliver to these addresses (OL-24)");
    } else if !covers(own, change.after) {
        debug!(policy = %after, own = %policy_name(own),
            "the outbox's destination policy allows more than this process's configuration: \
             it delivers to what either allows (OL-24)");
    }
    Ok(())
}

fn default_holder() -> String {
    // The nanoseconds within the second: a name, not a time.
    let nanos = crate::clock::system_nanos() % 1_000_000_000;
    format!("pid{}-{nanos:08x}", std::process::id())
}

/// Feeds the store's answer to a drain-slot release into `session` (a failed release leaves
/// the slot to its lease, or to the liveness check of the next holder).
pub fn store_released(
    session: &mut DrainSession,
    actor: &ActorId,
    answer: Result<outbox_lanes_store::SlotRelease, StoreError>,
) {
    match answer {
        Ok(outbox_lanes_store::SlotRelease::Released) => {
            session.handle_store_release(Release::Released)
        }
        Ok(outbox_lanes_store::SlotRelease::LookAgain) => {
            session.handle_store_release(Release::LookAgain);
        }
        Err(e) => {
            debug!(%actor, error = %e, "slot release failed; its lease expires");
            session.handle_failed();
        }
    }
}

/// What a drain returns once its session finished with `end`, in every runtime.
///
/// # Errors
/// [`OutboxError::Cancelled`], or the first store failure (`otherwise` when none was kept).
pub fn drain_outcome(
    end: DrainEnd,
    mut total: PassReport,
    error: Option<StoreError>,
    otherwise: impl FnOnce() -> OutboxError,
) -> Result<DrainOutcome, OutboxError> {
    match end {
        DrainEnd::Ran { yielded } => {
            total.yielded = yielded;
            Ok(DrainOutcome::Ran(total))
        }
        DrainEnd::Merged => Ok(DrainOutcome::Merged),
        DrainEnd::Cancelled => Err(OutboxError::Cancelled),
        DrainEnd::Failed => Err(error.map_or_else(otherwise, OutboxError::Store)),
    }
}

#[cfg(test)]
mod tests {
    use outbox_lanes_core::{IdentityResolver, Timestamp};
    use outbox_lanes_store::{SqliteOptions, SqliteStore};

    use super::*;
    use crate::runtime::BoxFuture;
    use crate::testing::{Held, ManualClock, NamedThreads};

    /// A runtime that only gives its clock and its threads: opening an outbox asks nothing
    /// else of it.
    #[derive(Debug)]
    struct Given {
        clock: Arc<ManualClock>,
        threads: Arc<NamedThreads>,
    }

    impl Runtime for Given {
        fn spawn(&self, _: BoxFuture<()>) {
            unreachable!("opening spawns no task")
        }
        fn spawn_blocking(&self, _: Box<dyn FnOnce() + Send + 'static>) {
            unreachable!("opening runs nothing on the blocking pool")
        }
        fn sleep(&self, _: Duration) -> BoxFuture<()> {
            unreachable!("opening does not sleep")
        }
        fn clock(&self) -> Arc<dyn Clock> {
            Arc::clone(&self.clock) as Arc<dyn Clock>
        }
        fn threads(&self) -> Arc<dyn SpawnThread> {
            Arc::clone(&self.threads) as Arc<dyn SpawnThread>
        }
    }

    #[test]
    fn an_outbox_starts_every_thread_on_its_runtime_and_reads_the_runtime_s_clock() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("outbox.db");
        let store = SqliteStore::open(&path, SqliteOptions::default()).expect("store");
        let rt = Given {
            clock: ManualClock::at(Timestamp::from_secs(1_700_000_000)),
            threads: Arc::default(),
        };
        // A paced host: the gate starts its pacer too.
        let config = OutboxConfig {
            rates: crate::RateLimits::none()
                .with_host("https://hooks.example", 10.0)
                .expect("rate"),
            ..OutboxConfig::default()
        };
        let core = OutboxCore::new(
            &rt,
            Arc::new(store),
            config,
            Box::new(IdentityResolver),
            Hooks::default(),
            Arc::new(Held::default()),
        )
        .expect("open");
        assert_eq!(
            rt.threads.names(),
            [
                "outbox-lanes-open",
                "outbox-lanes-acks",
                "outbox-lanes-pacer",
                "outbox-lanes-hosts"
            ]
        );
        // The store was given the runtime's threads: its watcher starts on them.
        core.store().watch().expect("watch");
        assert_eq!(
            rt.threads.names().last().map(String::as_str),
            Some("outbox-lanes-sqlite-watch")
        );
        // The engine's time is the runtime's.
        assert_eq!(core.clock().now(), Timestamp::from_secs(1_700_000_000));
        rt.clock.advance(Duration::from_secs(5));
        assert_eq!(core.clock().now(), Timestamp::from_secs(1_700_000_005));
        core.finish_shutdown();
    }
}
