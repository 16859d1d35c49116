//! The scheduler's commands executed against the store, one at a time, in order.

use outbox_lanes_core::{Command, DeadReason, HoldReason, LaneId, Timestamp, UnitId};
use outbox_lanes_store::{
    AttemptRecord, DeadLetterRequest, SlotToken, Store, StoreError, StoreLaneId, WrittenDeadLetter,
};
use tracing::{debug, info, trace, warn};

use super::{
    INTERRUPTED, NeedsStore, PassCore, PendingDead, RESOLVED_PER_ROUND, RoundContext, Start, Units,
};
use crate::fmt::rfc3339;
use crate::hooks::{DeadLettered, Delivered, LaneUnavailable};

/// Whether executing `cmd` writes to the store.
pub(super) fn writes(cmd: &Command) -> bool {
    match cmd {
        Command::Start { .. }
        | Command::Delivered { .. }
        | Command::RecordAttempt { .. }
        | Command::Interrupted { .. }
        | Command::HandBack { .. }
        | Command::Hold {
            reason: HoldReason::Stalled,
            ..
        } => false,
        Command::Hold {
            reason: HoldReason::Blocked,
            ..
        }
        | Command::LaneBackoff { .. }
        | Command::LaneOpen { .. }
        | Command::LaneFailing { .. }
        | Command::LaneRestart { .. }
        | Command::LaneUnavailable { .. }
        | Command::DeadLetter { .. }
        | Command::RetireLane { .. } => true,
    }
}

impl PassCore {
    /// Executes every queued command in order; returns how many there were. Attempt records
    /// are batched, but written before any other write and before the round's starts leave.
    ///
    /// `inline`: the store must not be called; at the first command that needs it (or if
    /// attempt records wait) it stops, keeping that command for the next round.
    pub(super) fn execute(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        inline: bool,
    ) -> Result<usize, NeedsStore> {
        let mut n = 0;
        let mut result = Ok(());
        while let Some(cmd) = self
            .round
            .deferred
            .pop_front()
            .or_else(|| self.sched.poll_command())
        {
            if inline && writes(&cmd) {
                self.round.deferred.push_front(cmd);
                result = Err(NeedsStore);
                break;
            }
            n += 1;
            self.command(cx, cmd, starts);
        }
        if result.is_ok() {
            // Nothing about them is queued any more.
            self.forget_left_units();
        }
        if inline {
            if !self.pending.records.is_empty()
                || !self.pending.host_pauses.is_empty()
                || self.jobs.marks_due(self.clock.now())
            {
                result = Err(NeedsStore);
            }
        } else {
            self.flush_writes(cx.store, cx.hooks);
            self.flush_marks(cx.store, false);
        }
        cx.acks.ack_batch_logged(
            &self.token,
            std::mem::take(&mut self.pending.acked),
            std::mem::take(&mut self.pending.acked_log),
        );
        result.map(|()| n)
    }

    /// Executes one command the scheduler queued: one method per command.
    pub(super) fn command(&mut self, cx: RoundContext<'_>, cmd: Command, starts: &mut Vec<Start>) {
        match cmd {
            Command::Start {
                unit,
                lane,
                attempt,
            } => self.on_start(cx, unit, lane, attempt, starts),
            Command::Delivered { unit, lane } => self.on_delivered(cx, unit, lane),
            Command::RecordAttempt {
                unit,
                lane,
                attempts,
                counted,
            } => self.on_record_attempt(unit, lane, attempts, counted),
            Command::Interrupted {
                unit,
                lane,
                attempts,
            } => self.on_interrupted(unit, lane, attempts),
            Command::Hold { unit, lane, reason } => self.on_hold(cx, unit, lane, reason),
            Command::LaneBackoff {
                lane,
                not_before,
                level,
            } => self.on_lane_backoff(cx, lane, not_before, level),
            Command::LaneOpen { lane } => self.on_lane_open(cx, lane),
            Command::LaneFailing { lane, since } => self.on_lane_failing(cx, lane, since),
            Command::LaneRestart { lane } => self.on_lane_restart(cx, lane),
            Command::LaneUnavailable { lane, since } => self.on_lane_unavailable(cx, lane, since),
            Command::DeadLetter { unit, lane, reason } => self.on_dead_letter(unit, lane, reason),
            Command::RetireLane { lane, reason } => self.on_retire_lane(cx, lane, reason),
            Command::HandBack { unit } => self.on_hand_back(unit),
        }
    }

    /// A start: logged, resolved in the round when nothing may be sent to its destination
    /// (on a fresh read of the lane controls, OL-14), else kept for the round's jobs.
    fn on_start(
        &mut self,
        cx: RoundContext<'_>,
        unit: UnitId,
        lane: LaneId,
        attempt: u32,
        starts: &mut Vec<Start>,
    ) {
        if let Some(info) = self.units.info.get(&unit) {
            trace!(actor = %self.actor, unit = unit.0, row = %info.row_id,
                recipient = self.recipient(lane), attempt,
                queued_ms = self.now().saturating_duration_since(info.enqueued_at).as_millis() as u64,
                "started");
        }
        // A start in a lane in backoff is its probe (OL-11): one per interval. (The lane's
        // attempt is out from now on: nothing changes its wait before its outcome.)
        if let Some(w) = self.sched.lane_wait(lane) {
            if w.level > 0 {
                info!(actor = %self.actor, recipient = self.recipient(lane), unit = unit.0,
                    level = w.level, attempt, "lane probed: one attempt at its head");
            } else {
                debug!(actor = %self.actor, recipient = self.recipient(lane), unit = unit.0,
                    attempt, "throttled lane retried");
            }
        }
        // After a failure nothing starts: the unit is handed back at the end.
        if self.error.is_some() || self.end.is_some() {
            return;
        }
        // A destination nothing may be sent to (a refused IP literal) answers every
        // attempt of its lane the same, without I/O: the attempt comes to that result
        // here, and the scheduler's next decision for the lane (its next head's start,
        // say) follows in this round, so a deep refused lane is dead-lettered in few
        // rounds and transactions. Only on a fresh read of the lane controls, as a
        // send (OL-14): an operator's action on the lane comes first.
        let at = self.instant();
        let unsendable = self.lane_destination(lane).refused(at).cloned();
        if let Some(result) = unsendable {
            if self.round.resolved < RESOLVED_PER_ROUND && self.round.control.fresh_at(at) {
                self.round.resolved += 1;
                self.not_sendable(cx.hooks, unit, lane, attempt, result);
                return;
            }
        }
        self.paced_start(lane);
        starts.push(Start {
            unit,
            lane,
            attempt,
        });
    }

    /// A delivery: acked (even after a failure: an ack is harmless, a lost one is a resend),
    /// logged, reported. (A backoff or throttle it ended is cleared by the
    /// [`Command::LaneOpen`] that follows.)
    fn on_delivered(&mut self, cx: RoundContext<'_>, unit: UnitId, lane: LaneId) {
        // Acked even after a failure: an ack is harmless, a lost one is a resend.
        self.pending.acked.push((unit, self.lanes.store_lane(lane)));
        self.report.delivered += 1;
        let row = self.units.resolved(unit, lane);
        if let Some(i) = self.pending.log_info.remove(&(unit, lane)) {
            let entry = self.log_entry(unit, lane, &row, i, true);
            self.pending.acked_log.push(entry);
        }
        trace!(actor = %self.actor, unit = unit.0, %row, recipient = self.recipient(lane),
            "delivered");
        if let Some(hook) = &cx.hooks.delivered {
            hook(&Delivered {
                actor: self.actor.clone(),
                unit,
                row_id: row,
                recipient: self.recipient(lane).to_owned(),
            });
        }
    }

    /// A failed attempt: its record, batched with the others of this execution.
    fn on_record_attempt(&mut self, unit: UnitId, lane: LaneId, attempts: u32, counted: bool) {
        // The detail stays in `last` for a dead letter that may follow.
        let (status, error) = self
            .units
            .last
            .get(&(unit, lane))
            .map_or((None, None), |r| (r.status, r.error.clone()));
        debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
            attempts, counted, status, error = error.as_deref(), "attempt failed");
        if let Some(i) = self.pending.log_info.remove(&(unit, lane)) {
            let row = self
                .units
                .info
                .get(&unit)
                .map_or_else(String::new, |u| u.row_id.clone());
            let entry = self.log_entry(unit, lane, &row, i, false);
            self.pending.records_log.push(entry);
        }
        self.pending.records.push(AttemptRecord {
            unit,
            lane: self.lanes.store_lane(lane),
            attempts,
            status,
            error,
            at: self.now(),
        });
    }

    /// An attempt cut off in flight: recorded with [`INTERRUPTED`], not counted.
    fn on_interrupted(&mut self, unit: UnitId, lane: LaneId, attempts: u32) {
        info!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
            attempts, "attempt interrupted in flight; the unit will be sent again");
        self.report.interrupted += 1;
        self.pending.records.push(AttemptRecord {
            unit,
            lane: self.lanes.store_lane(lane),
            attempts,
            status: None,
            error: Some(INTERRUPTED.to_owned()),
            at: self.now(),
        });
    }

    /// A unit held: a stalled one waits for the lane's next attempt, a strict lane's blocked
    /// head is written as blocked.
    fn on_hold(&mut self, cx: RoundContext<'_>, unit: UnitId, lane: LaneId, reason: HoldReason) {
        match reason {
            HoldReason::Stalled => {
                debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                "stalled: held until the lane's next attempt");
            }
            HoldReason::Blocked => {
                warn!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                "strict lane blocked on its head until an operator acts");
                self.write(
                    cx,
                    "block lane",
                    |s, t, l| s.block_lane(t, l, "its head failed for good"),
                    lane,
                );
            }
        }
    }

    /// A lane entering or staying in backoff, or throttled: written. (Its INFO line came
    /// with the outcome that decided it, [`PassCore::log_lane_wait`]; a pass that ends while
    /// a throttle's retry waits leaves the throttle's mark here, at DEBUG.)
    fn on_lane_backoff(
        &mut self,
        cx: RoundContext<'_>,
        lane: LaneId,
        not_before: Timestamp,
        level: u32,
    ) {
        debug!(actor = %self.actor, recipient = self.recipient(lane), level,
            next_attempt = %rfc3339(not_before), "lane waits: its next attempt written");
        self.write(
            cx,
            "lane state",
            |s, t, l| s.set_lane_state(t, l, Some(not_before), level),
            lane,
        );
    }

    /// A lane that answered again: written. (Its recovery's INFO line came with the
    /// outcome, [`PassCore::log_lane_wait`].)
    fn on_lane_open(&mut self, cx: RoundContext<'_>, lane: LaneId) {
        debug!(actor = %self.actor, recipient = self.recipient(lane), "lane open");
        self.write(
            cx,
            "lane state",
            |s, t, l| s.set_lane_state(t, l, None, 0),
            lane,
        );
    }

    /// A lane's run of failures: written.
    fn on_lane_failing(&mut self, cx: RoundContext<'_>, lane: LaneId, since: Option<Timestamp>) {
        debug!(actor = %self.actor, recipient = self.recipient(lane),
            since = since.map(rfc3339), "lane's run of failures");
        self.write(
            cx,
            "lane state",
            |s, t, l| s.set_lane_failing(t, l, since),
            lane,
        );
    }

    /// A lane whose head was dead-lettered after its attempts starts over (OL-8).
    fn on_lane_restart(&mut self, cx: RoundContext<'_>, lane: LaneId) {
        // Its head was dead-lettered after its attempts: the next unit gets a
        // schedule of its own (OL-8).
        debug!(actor = %self.actor, recipient = self.recipient(lane),
            "lane starts over after its head's last attempt");
        self.write(
            cx,
            "lane state",
            |s, t, l| s.set_lane_state(t, l, None, 0),
            lane,
        );
    }

    /// A lane failing for longer than allowed: written, logged at WARN, reported.
    fn on_lane_unavailable(&mut self, cx: RoundContext<'_>, lane: LaneId, since: Timestamp) {
        let at = self.now();
        warn!(actor = %self.actor, recipient = self.recipient(lane),
            failing_since = %rfc3339(since),
            "lane unavailable: failing for longer than allowed; its units are \
             dead-lettered together (lane_unavailable) until it answers again");
        self.write(
            cx,
            "lane state",
            |s, t, l| s.set_lane_unavailable(t, l, at),
            lane,
        );
        if self.error.is_none()
            && let Some(hook) = &cx.hooks.lane_unavailable
        {
            hook(&LaneUnavailable {
                actor: self.actor.clone(),
                recipient: self.recipient(lane).to_owned(),
                failing_since: since,
                at,
            });
        }
    }

    /// A dead letter, gathered for this execution's batch (OL-16).
    fn on_dead_letter(&mut self, unit: UnitId, lane: LaneId, reason: DeadReason) {
        let last = self.units.last.remove(&(unit, lane));
        let (status, error) = last.map_or((None, None), |r| (r.status, r.error));
        if self.error.is_some() {
            return;
        }
        // Written with the other dead letters of this execution, at its end
        // (`flush_dead_letters`): before any later write, and before the round sends
        // anything, so that no later unit of the lane is sent before this outcome is
        // durable (OL-16).
        let row = self.units.resolved(unit, lane);
        let req = DeadLetterRequest {
            unit,
            lane: self.lanes.store_lane(lane),
            reason,
            status,
            error,
            at: self.now(),
        };
        self.pending.dead.push(PendingDead { req, lane, row });
    }

    /// A lane whose pending units are dead-lettered together (410 Gone, or unavailable):
    /// written at once, after what was gathered before it; reported.
    fn on_retire_lane(&mut self, cx: RoundContext<'_>, lane: LaneId, reason: DeadReason) {
        if self.error.is_some() {
            return;
        }
        self.flush_writes(cx.store, cx.hooks);
        if self.error.is_some() {
            return;
        }
        let t = self.now();
        let retired =
            match cx
                .store
                .retire_lane(&self.token, self.lanes.store_lane(lane), t, reason)
            {
                Ok(retired) => retired,
                Err(e) => {
                    self.store_failed("retire lane", e, t);
                    return;
                }
            };
        let units = retired.len() as u64;
        self.report.dead_lettered += units;
        // One INFO line for the lane, not one per unit: a retired lane can be deep.
        if reason == DeadReason::LaneRetired {
            info!(actor = %self.actor, recipient = self.recipient(lane), units,
                "lane retired (410 Gone)");
        } else if units > 0 {
            info!(actor = %self.actor, recipient = self.recipient(lane), units,
                reason = reason.as_str(), "the lane's pending units dead-lettered together");
        }
        for d in retired {
            // Admitted units of the lane are resolved (the scheduler dropped them).
            self.units.resolved(d.unit, lane);
            debug!(actor = %self.actor, unit = d.unit.0, row = %d.row_id,
                recipient = self.recipient(lane), reason = reason.as_str(),
                status = d.last_status, error = d.last_error.as_deref(),
                dead_letter = d.id.0, "dead-lettered");
            if let Some(hook) = &cx.hooks.dead_lettered {
                hook(&self.dead_lettered(d, lane, reason));
            }
        }
    }

    /// A unit handed back: forgotten.
    fn on_hand_back(&mut self, unit: UnitId) {
        self.units.info.remove(&unit);
        self.report.handed_back += 1;
        trace!(actor = %self.actor, unit = unit.0, "handed back");
    }

    /// What the dead-letter hook is told of a dead letter the store wrote for `lane`.
    pub(super) fn dead_lettered(
        &self,
        d: WrittenDeadLetter,
        lane: LaneId,
        reason: DeadReason,
    ) -> DeadLettered {
        DeadLettered {
            id: d.id,
            actor: self.actor.clone(),
            unit: d.unit,
            row_id: d.row_id,
            recipient: self.recipient(lane).to_owned(),
            reason,
            status: d.last_status,
            error: d.last_error,
            attempts: d.attempts,
            at: d.dead_at,
        }
    }

    /// One fenced write about `lane`, after the attempt records and dead letters gathered
    /// before it.
    pub(super) fn write(
        &mut self,
        cx: RoundContext<'_>,
        what: &str,
        f: impl FnOnce(&dyn Store, &SlotToken, StoreLaneId) -> Result<(), StoreError>,
        lane: LaneId,
    ) {
        if self.error.is_some() {
            return;
        }
        self.flush_writes(cx.store, cx.hooks);
        if self.error.is_some() {
            return;
        }
        if let Err(e) = f(cx.store, &self.token, self.lanes.store_lane(lane)) {
            let t = self.now();
            self.store_failed(what, e, t);
        }
    }

    /// Forgets the units the commands executed so far resolved a recipient of and that the
    /// scheduler no longer holds ([`Scheduler::unit_open`](outbox_lanes_core::Scheduler::unit_open)):
    /// called once no command is queued, so none about them can still come.
    fn forget_left_units(&mut self) {
        for unit in std::mem::take(&mut self.units.resolved) {
            if self.sched.unit_open(unit).is_none() {
                self.units.info.remove(&unit);
            }
        }
    }
}

impl Units {
    /// One recipient of `unit` is resolved: its row id. The unit is forgotten once the
    /// scheduler no longer holds it ([`PassCore::forget_left_units`]).
    pub(super) fn resolved(&mut self, unit: UnitId, lane: LaneId) -> String {
        self.last.remove(&(unit, lane));
        let Some(info) = self.info.get(&unit) else {
            return String::new();
        };
        self.resolved.push(unit);
        info.row_id.clone()
    }
}
