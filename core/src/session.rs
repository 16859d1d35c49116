//! The lifecycle of one pass and the drain-slot protocol around passes, as pure state
//! machines: every runtime executes these decisions, none makes its own.
//!
//! # A pass: [`PassSession`]
//!
//! A pass holds the actor's drain slot under a lease. The session decides, from the time and
//! the scheduler's state, when to renew the lease (every third of it), when the time slice
//! is over (nothing new starts; attempts in flight finish), when a shutdown's grace period
//! runs out, and when the pass ends. A runtime's loop:
//!
//! 1. run a round against the scheduler (execute its commands, claim, start attempts);
//! 2. [`PassSession::handle_tick`] with the scheduler's state, then drain
//!    [`PassSession::poll_action`]: [`SessionAction::RenewLease`] (renew, then
//!    [`PassSession::handle_lease_renewed`]), [`SessionAction::StopStarting`] (call
//!    [`Scheduler::handle_stop`](crate::Scheduler::handle_stop)), [`SessionAction::End`] (hand
//!    back — [`PassEnd::hands_back_in_flight`] says whether in-flight units go too — and
//!    release the slot);
//! 3. wait for an event or [`PassSession::poll_timeout`]; a failed store write is
//!    [`PassSession::handle_store_failed`], a caller gone [`PassSession::handle_cancel`],
//!    a shutdown [`PassSession::handle_shutdown`].
//!
//! The time slice is checked on every tick, whatever the round did (a round that only
//! claimed counts too).
//!
//! ```
//! use core::time::Duration;
//! use outbox_lanes_core::{PassEnd, PassSession, SessionAction, SessionConfig, StopReason, Timestamp};
//!
//! let cfg = SessionConfig {
//!     time_slice: Duration::from_secs(10),
//!     lease: Duration::from_secs(60),
//!     shutdown_grace: Duration::from_secs(5),
//! };
//! let t0 = Timestamp::from_secs(100);
//! let mut s = PassSession::new(cfg, t0);
//! // Busy: one attempt in flight, work left.
//! s.handle_tick(t0, 1, false);
//! assert_eq!(s.poll_action(), None);
//! assert_eq!(s.poll_timeout(), Some(Timestamp::from_secs(110)), "the slice ends first");
//! // The slice ends: nothing new starts.
//! s.handle_tick(Timestamp::from_secs(110), 1, false);
//! assert_eq!(s.poll_action(), Some(SessionAction::StopStarting(StopReason::TimeSlice)));
//! // The last attempt finishes: the pass yields.
//! s.handle_tick(Timestamp::from_secs(111), 0, true);
//! assert_eq!(s.poll_action(), Some(SessionAction::End(PassEnd::Yielded(StopReason::TimeSlice))));
//! assert_eq!(s.poll_action(), None);
//! ```
//!
//! # Around passes: [`DrainSession`]
//!
//! A drain holds the in-process slot ([`DrainSlots`](crate::DrainSlots)) and the store's fenced
//! slot, runs passes, and releases both, looking once more whenever someone asked meanwhile
//! (OL-12):
//!
//! | state | event | next action |
//! |---|---|---|
//! | start | — | `AcquireStoreSlot` |
//! | acquiring | `Acquired` | `RunPass` |
//! | acquiring (first) | `Held` | `ForceReleaseLocalSlot`, `Finish(Merged)` |
//! | acquiring (again) | `Held` | `ForceReleaseLocalSlot`, `Finish(Ran)` |
//! | pass ended | `Drained` | `ReleaseStoreSlot` |
//! | pass ended | `Yielded`/`GraceOver` (time slice), direct drain | `RunPass` (slot kept) |
//! | pass ended | `Yielded`/`GraceOver`, monitor drain or shutdown | `FreeStoreSlot`, `ForceReleaseLocalSlot`, `Finish(Ran { yielded: true })` |
//! | pass ended | `Cancelled` / `StoreFailed` | `FreeStoreSlot` (best effort), `ForceReleaseLocalSlot`, `Finish(Cancelled / Failed)` |
//! | releasing store slot | `LookAgain` (after `Drained`) | `RunPass` |
//! | releasing store slot | `Released` (after `Drained`) | `ReleaseLocalSlot` |
//! | releasing local slot | `LookAgain` | `AcquireStoreSlot` |
//! | releasing local slot | `Released` | `Finish(Ran { yielded: false })` |
//! | any store call | failed | `ForceReleaseLocalSlot`, `Finish(Failed)` (a cancelled drain stays `Cancelled`) |
//!
//! A drain that will not look again itself (it stops, yields, or failed) frees the store's slot
//! whatever its "look again" flag (`FreeStoreSlot`): a slot kept would hold the actor, with no
//! pass running, until its lease ran out — a stopped relay's slots would still show as held,
//! and an actor the monitor comes back for after a yield would find its own stale slot held.
//! Whoever asked meanwhile finds the actor with work and its slot free.

use core::time::Duration;

use crate::slot::Release;
use crate::time::Timestamp;

/// How many time slices a pass runs when nobody waits for a pass
/// ([`PassSession::set_slicing`] off): 30, five minutes with the default 10 s slice.
pub const UNCONTENDED_SLICES: u32 = 30;

/// The timing of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// The pass stops starting attempts after this long (OL-13).
    pub time_slice: Duration,
    /// The drain slot's lease; renewed every third of it.
    pub lease: Duration,
    /// After a shutdown, how long attempts in flight may finish (a time slice has no grace:
    /// its attempts finish or time out, OL-13).
    pub shutdown_grace: Duration,
}

/// Why a pass stopped starting attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Its time slice ran out.
    TimeSlice,
    /// A shutdown or a stop request.
    Shutdown,
}

impl StopReason {
    /// `time_slice` or `shutdown`, as logs give it.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::TimeSlice => "time_slice",
            StopReason::Shutdown => "shutdown",
        }
    }
}

impl core::fmt::Display for StopReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::fmt::Display for PassEnd {
    /// `drained`, `yielded (time_slice)`, `grace over (shutdown)`, `cancelled`,
    /// `store failed`, as logs give it.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PassEnd::Drained => f.write_str("drained"),
            PassEnd::Yielded(r) => write!(f, "yielded ({r})"),
            PassEnd::GraceOver(r) => write!(f, "grace over ({r})"),
            PassEnd::Cancelled => f.write_str("cancelled"),
            PassEnd::StoreFailed => f.write_str("store failed"),
        }
    }
}

/// How a pass ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassEnd {
    /// Nothing admissible and nothing in flight: a normal end.
    Drained,
    /// Stopped starting (slice or shutdown), and everything in flight finished.
    Yielded(StopReason),
    /// Stopped starting, but attempts were still in flight when a shutdown's grace period ran
    /// out (a time slice never ends this way: its attempts finish or time out).
    GraceOver(StopReason),
    /// The caller went away.
    Cancelled,
    /// A store call (a write, a claim, the lease) failed.
    StoreFailed,
}

impl PassEnd {
    /// Whether the units in flight are handed back too
    /// ([`Scheduler::handle_interrupt`](crate::Scheduler::handle_interrupt)) rather than only
    /// the waiting ones ([`Scheduler::handle_pass_end`](crate::Scheduler::handle_pass_end)).
    pub fn hands_back_in_flight(self) -> bool {
        matches!(
            self,
            PassEnd::GraceOver(_) | PassEnd::Cancelled | PassEnd::StoreFailed
        )
    }

    /// Whether work may be left behind by a stop (the monitor comes back for the actor).
    pub fn yielded(self) -> bool {
        matches!(self, PassEnd::Yielded(_) | PassEnd::GraceOver(_))
    }
}

/// What the runtime must do for the pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum SessionAction {
    /// Renew the drain slot's lease now, then [`PassSession::handle_lease_renewed`] (or
    /// [`PassSession::handle_store_failed`]).
    RenewLease,
    /// Call `Scheduler::handle_stop`: nothing new starts, what is in flight finishes.
    StopStarting(StopReason),
    /// The pass is over; emitted once, nothing follows it.
    End(PassEnd),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    Stopping {
        reason: StopReason,
        since: Timestamp,
    },
    Ended,
}

/// One pass's lifecycle decisions; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct PassSession {
    cfg: SessionConfig,
    started: Timestamp,
    renewed: Timestamp,
    renew_asked: bool,
    /// The latest time seen: a clock that steps back moves no deadline.
    latest: Timestamp,
    state: State,
    /// Whether the time slice applies (see [`PassSession::set_slicing`]).
    slicing: bool,
    actions: [Option<SessionAction>; 3],
}

impl PassSession {
    /// A pass whose slot was acquired (or its lease renewed) at `now`.
    pub fn new(cfg: SessionConfig, now: Timestamp) -> Self {
        PassSession {
            cfg,
            started: now,
            renewed: now,
            renew_asked: false,
            latest: now,
            state: State::Running,
            slicing: true,
            actions: [None; 3],
        }
    }

    /// The same pass, on a slot whose lease was acquired or last renewed at `at`, before
    /// this pass began. A drain runs pass after pass on one slot and hands the time on, so
    /// the lease is renewed every third of it across passes: passes shorter than a third of
    /// the lease, back to back, would otherwise each count from their own start and never
    /// renew, and the lease would lapse under a drain that is still working.
    #[must_use]
    pub fn with_lease_renewed_at(mut self, at: Timestamp) -> Self {
        self.renewed = self.renewed.min(at);
        self
    }

    /// When the slot's lease was acquired or last renewed, as this pass knows it: what the
    /// next pass on the same slot starts from ([`PassSession::with_lease_renewed_at`]).
    pub fn lease_renewed_at(&self) -> Timestamp {
        self.renewed
    }

    fn push(&mut self, a: SessionAction) {
        if let Some(slot) = self.actions.iter_mut().find(|s| s.is_none()) {
            *slot = Some(a);
        }
    }

    /// Ends the pass. An end at once (cancel, store failure) drops what was queued before it;
    /// an end found by a tick keeps it (a stop and its end can come in one go).
    fn end(&mut self, end: PassEnd, at_once: bool) {
        if at_once {
            self.actions = [None; 3];
        }
        self.push(SessionAction::End(end));
        self.state = State::Ended;
    }

    fn seen(&mut self, now: Timestamp) -> Timestamp {
        self.latest = self.latest.max(now);
        self.latest
    }

    fn renew_at(&self) -> Timestamp {
        self.renewed + self.cfg.lease / 3
    }

    fn slice_end(&self) -> Timestamp {
        let slices = if self.slicing { 1 } else { UNCONTENDED_SLICES };
        self.started + self.cfg.time_slice * slices
    }

    fn stop(&mut self, reason: StopReason, now: Timestamp) {
        self.state = State::Stopping { reason, since: now };
        self.push(SessionAction::StopStarting(reason));
    }

    /// After every round of the runtime: `in_flight` attempts are out, and `scheduler_done`
    /// says the scheduler has nothing admissible and nothing in flight.
    pub fn handle_tick(&mut self, now: Timestamp, in_flight: usize, scheduler_done: bool) {
        let now = self.seen(now);
        match self.state {
            State::Ended => return,
            State::Running => {
                if scheduler_done && in_flight == 0 {
                    self.end(PassEnd::Drained, false);
                    return;
                }
                if now >= self.slice_end() {
                    self.stop(StopReason::TimeSlice, now);
                }
            }
            State::Stopping { .. } => {}
        }
        if let State::Stopping { reason, since } = self.state {
            if in_flight == 0 {
                self.end(PassEnd::Yielded(reason), false);
                return;
            }
            // A time slice has no grace: its attempts in flight finish or hit the HTTP
            // timeout and are recorded like any other (OL-13). Only a shutdown cuts them.
            if reason == StopReason::Shutdown && now >= since + self.cfg.shutdown_grace {
                self.end(PassEnd::GraceOver(reason), false);
                return;
            }
        }
        if !self.renew_asked && now >= self.renew_at() {
            self.renew_asked = true;
            self.push(SessionAction::RenewLease);
        }
    }

    /// Whether the time slice applies (by default it does). A slice exists so that busy
    /// actors cannot keep others from a pass; where nobody waits for one (a direct drain, or
    /// a monitor with no actor queued) stopping at every slice would only make the pass's
    /// other lanes wait for its slowest attempt in flight, so the runtime turns it off: the
    /// pass then stops after [`UNCONTENDED_SLICES`] slices, which bounds what a pass
    /// accumulates (its interned lanes) and how often its lanes wait for a hanging attempt.
    /// Turned on past the slice's end, the pass stops at the next tick. No effect once the
    /// pass stops or ends.
    pub fn set_slicing(&mut self, on: bool) {
        self.slicing = on;
    }

    /// The lease was renewed at `now`.
    pub fn handle_lease_renewed(&mut self, now: Timestamp) {
        self.renewed = self.seen(now);
        self.renew_asked = false;
    }

    /// A graceful stop was asked: nothing new starts, and attempts in flight have the grace
    /// period to finish. While stopping for the time slice, the reason becomes `Shutdown`
    /// (the pass then ends as a shutdown's, and is not followed by another) and the grace
    /// period starts now: the slice itself never cut an attempt. A second request changes
    /// nothing.
    pub fn handle_shutdown(&mut self, now: Timestamp) {
        let now = self.seen(now);
        match self.state {
            State::Running => self.stop(StopReason::Shutdown, now),
            State::Stopping {
                reason: StopReason::TimeSlice,
                ..
            } => {
                self.state = State::Stopping {
                    reason: StopReason::Shutdown,
                    since: now,
                };
            }
            State::Stopping { .. } | State::Ended => {}
        }
    }

    /// The caller went away: the pass ends at once.
    pub fn handle_cancel(&mut self, _now: Timestamp) {
        if self.state != State::Ended {
            self.end(PassEnd::Cancelled, true);
        }
    }

    /// A store call failed: the pass ends at once, and no attempt may start after it.
    pub fn handle_store_failed(&mut self, _now: Timestamp) {
        if self.state != State::Ended {
            self.end(PassEnd::StoreFailed, true);
        }
    }

    /// The next action, in order; drain until `None` after every input.
    pub fn poll_action(&mut self) -> Option<SessionAction> {
        let first = self.actions[0].take();
        self.actions.rotate_left(1);
        first
    }

    /// When the next decision falls due without any event: the lease renewal, the end of the
    /// time slice, the end of a shutdown's grace period. `None` once ended.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let renew = (!self.renew_asked).then(|| self.renew_at());
        let own = match self.state {
            State::Ended => return None,
            State::Running => Some(self.slice_end()),
            State::Stopping {
                reason: StopReason::Shutdown,
                since,
            } => Some(since + self.cfg.shutdown_grace),
            State::Stopping {
                reason: StopReason::TimeSlice,
                ..
            } => None,
        };
        match (renew, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the pass has ended.
    pub fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    /// Whether the pass stopped starting attempts (and has not ended yet).
    pub fn is_stopping(&self) -> bool {
        matches!(self.state, State::Stopping { .. })
    }
}

/// The store's answer to a slot request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotAnswer {
    /// This drain holds the slot.
    Acquired,
    /// Another process holds it (and was told to look again).
    Held,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainEnd {
    /// Passes ran; `yielded`: the last one stopped with work left.
    Ran {
        /// The last pass stopped (slice or shutdown) with work left.
        yielded: bool,
    },
    /// Another process runs a pass of the actor; it was told to look again.
    Merged,
    /// A store call failed.
    Failed,
    /// The caller went away.
    Cancelled,
}

/// What the runtime must do for the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum DrainAction {
    /// Take the store's slot, then [`DrainSession::handle_store_acquire`] (or
    /// [`DrainSession::handle_failed`]).
    AcquireStoreSlot,
    /// Run one pass, then [`DrainSession::handle_pass_end`].
    RunPass,
    /// Release the store's slot unless "look again" was set (then the slot is kept for one
    /// more pass), then [`DrainSession::handle_store_release`] (or
    /// [`DrainSession::handle_failed`]).
    ReleaseStoreSlot,
    /// Release the store's slot whatever its "look again" flag (the drain stops, yields or
    /// failed: it will not look again itself, and a slot kept would hold the actor with no
    /// pass running until its lease ran out), then [`DrainSession::handle_store_release`]
    /// with `Released` (or [`DrainSession::handle_failed`]).
    FreeStoreSlot,
    /// `DrainSlots::release`, then [`DrainSession::handle_local_release`].
    ReleaseLocalSlot,
    /// `DrainSlots::force_release` (a look-again asked meanwhile is left to the monitor).
    ForceReleaseLocalSlot,
    /// Return to the caller.
    Finish(DrainEnd),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for the store's answer; `again`: a re-acquire after a local look-again.
    Acquiring {
        again: bool,
    },
    Running,
    /// Releasing the store's slot after a pass that ended this way.
    ReleasingStore(PassEnd),
    ReleasingLocal,
    Done,
}

/// The drain-slot protocol around passes; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct DrainSession {
    yield_at_slice: bool,
    step: Step,
    actions: [Option<DrainAction>; 2],
}

impl DrainSession {
    /// A drain that holds the in-process slot (`DrainSlots::try_acquire` said `Acquired`).
    /// `yield_at_slice`: return at the end of a time slice (the monitor's drains) instead
    /// of running the next pass at once.
    pub fn new(yield_at_slice: bool) -> Self {
        DrainSession {
            yield_at_slice,
            step: Step::Acquiring { again: false },
            actions: [Some(DrainAction::AcquireStoreSlot), None],
        }
    }

    fn set(&mut self, a: DrainAction, b: Option<DrainAction>) {
        self.actions = [Some(a), b];
    }

    fn finish(&mut self, end: DrainEnd) {
        self.step = Step::Done;
        self.set(
            DrainAction::ForceReleaseLocalSlot,
            Some(DrainAction::Finish(end)),
        );
    }

    /// The store answered [`DrainAction::AcquireStoreSlot`].
    pub fn handle_store_acquire(&mut self, a: SlotAnswer) {
        let Step::Acquiring { again } = self.step else {
            return;
        };
        match a {
            SlotAnswer::Acquired => {
                self.step = Step::Running;
                self.set(DrainAction::RunPass, None);
            }
            SlotAnswer::Held if again => self.finish(DrainEnd::Ran { yielded: false }),
            SlotAnswer::Held => self.finish(DrainEnd::Merged),
        }
    }

    /// A pass ended.
    pub fn handle_pass_end(&mut self, end: PassEnd) {
        if self.step != Step::Running {
            return;
        }
        match end {
            PassEnd::Yielded(StopReason::TimeSlice) | PassEnd::GraceOver(StopReason::TimeSlice)
                if !self.yield_at_slice =>
            {
                self.set(DrainAction::RunPass, None);
            }
            PassEnd::Drained => {
                self.step = Step::ReleasingStore(end);
                self.set(DrainAction::ReleaseStoreSlot, None);
            }
            _ => {
                self.step = Step::ReleasingStore(end);
                self.set(DrainAction::FreeStoreSlot, None);
            }
        }
    }

    /// The store answered [`DrainAction::ReleaseStoreSlot`].
    pub fn handle_store_release(&mut self, r: Release) {
        let Step::ReleasingStore(end) = self.step else {
            return;
        };
        match end {
            PassEnd::Drained => match r {
                Release::LookAgain => {
                    self.step = Step::Running;
                    self.set(DrainAction::RunPass, None);
                }
                Release::Released => {
                    self.step = Step::ReleasingLocal;
                    self.set(DrainAction::ReleaseLocalSlot, None);
                }
            },
            other => self.finish(Self::ending(other)),
        }
    }

    fn ending(end: PassEnd) -> DrainEnd {
        match end {
            PassEnd::Drained => DrainEnd::Ran { yielded: false },
            PassEnd::Yielded(_) | PassEnd::GraceOver(_) => DrainEnd::Ran { yielded: true },
            PassEnd::Cancelled => DrainEnd::Cancelled,
            PassEnd::StoreFailed => DrainEnd::Failed,
        }
    }

    /// The in-process registry answered [`DrainAction::ReleaseLocalSlot`].
    pub fn handle_local_release(&mut self, r: Release) {
        if self.step != Step::ReleasingLocal {
            return;
        }
        match r {
            Release::Released => {
                self.step = Step::Done;
                self.set(DrainAction::Finish(DrainEnd::Ran { yielded: false }), None);
            }
            Release::LookAgain => {
                self.step = Step::Acquiring { again: true };
                self.set(DrainAction::AcquireStoreSlot, None);
            }
        }
    }

    /// A store call of the protocol failed: the drain fails (a cancelled one stays
    /// cancelled); the store's slot, if held, is left to its lease.
    pub fn handle_failed(&mut self) {
        match self.step {
            Step::ReleasingStore(PassEnd::Cancelled) => self.finish(DrainEnd::Cancelled),
            Step::Done => {}
            _ => self.finish(DrainEnd::Failed),
        }
    }

    /// Whether the drain has decided to finish (its `Finish` action was queued).
    pub fn is_finished(&self) -> bool {
        self.step == Step::Done
    }

    /// The next action; drain until `None` after every input.
    pub fn poll_action(&mut self) -> Option<DrainAction> {
        let first = self.actions[0].take();
        self.actions.rotate_left(1);
        first
    }
}
