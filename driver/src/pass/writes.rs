//! The pass's batched store writes: attempt records, dead letters (OL-16), host pauses and
//! in-flight marks, and the delivery log's entries.

use std::time::Duration;

use outbox_lanes_core::{DeadReason, LaneId, Timestamp, UnitId};
use outbox_lanes_store::{
    ChangedLane, DeadLetterRequest, DeliveryLogEntry, IN_FLIGHT_MARK_AFTER, Store, StoreLaneId,
};
use tracing::{debug, info, trace, warn};

use super::{Jobs, LogInfo, PassCore};
use crate::fmt::rfc3339;
use crate::hooks::Hooks;

/// How often at most a pass writes in-flight marks (a sweep).
pub(super) const MARK_SWEEP: Duration = Duration::from_secs(1);

/// What a WARN of dead letters for `reason` tells the reader to look at.
pub(super) fn refusal_hint(reason: DeadReason) -> &'static str {
    match reason {
        DeadReason::DestinationRefused => {
            "the address policy refuses the recipient's address (loopback and private \
             addresses are delivered to only when this process's configuration or the \
             outbox's destination policy admits them: OutboxConfig::allow_loopback or \
             allow_private, HttpConfig::addresses, `outbox-lanes destinations set`; link-local \
             and cloud metadata addresses never are)"
        }
        _ => "the recipient answered with a permanent error (a status the policy does not retry)",
    }
}

impl PassCore {
    /// Writes what the commands executed so far gathered: their attempt records, then their
    /// dead letters (which keep the persisted counts), each in one call.
    pub(super) fn flush_writes(&mut self, store: &dyn Store, hooks: &Hooks) {
        self.flush_records(store);
        self.flush_dead_letters(store, hooks);
        self.flush_host_pauses(store);
    }

    /// Pauses for their host the lanes whose attempts found it held by an operator.
    pub(super) fn flush_host_pauses(&mut self, store: &dyn Store) {
        if self.pending.host_pauses.is_empty() {
            return;
        }
        let mut lanes = std::mem::take(&mut self.pending.host_pauses);
        if self.error.is_some() {
            return;
        }
        lanes.sort_unstable();
        lanes.dedup();
        match store.pause_for_host(&self.token, &lanes) {
            Ok(states) => {
                let (paused, open): (Vec<ChangedLane>, Vec<ChangedLane>) =
                    states.into_iter().partition(|cl| cl.state.paused);
                for cl in &paused {
                    info!(actor = %self.actor, recipient = cl.state.key.recipient(),
                        "lane paused: its host is blocked by an operator");
                }
                // An unblock committed first: the lane is open after all, and read again.
                if !open.is_empty() {
                    let _ = self.apply_controls(open, &mut Vec::new());
                }
            }
            Err(e) => {
                let t = self.now();
                self.store_failed("host pause", e, t);
            }
        }
    }

    /// Writes the dead letters gathered so far in one transaction; once it committed, reports
    /// each (log, [`PassReport::dead_lettered`], the hook) in the order the scheduler asked
    /// for them, which is lane order within each lane. A failure writes none of them and
    /// ends the pass: nothing is reported, and their units are read again by the next pass.
    pub(super) fn flush_dead_letters(&mut self, store: &dyn Store, hooks: &Hooks) {
        if self.pending.dead.is_empty() {
            return;
        }
        let dead = std::mem::take(&mut self.pending.dead);
        if self.error.is_some() {
            return;
        }
        let reqs: Vec<DeadLetterRequest> = dead.iter().map(|d| d.req.clone()).collect();
        let written = match store.write_dead_letters(&self.token, &reqs) {
            Ok(written) => written,
            Err(e) => {
                let t = self.now();
                self.store_failed("dead letter", e, t);
                return;
            }
        };
        trace!(actor = %self.actor, dead_letters = reqs.len(), "dead letters written");
        for (p, written) in dead.into_iter().zip(written) {
            let (unit, reason) = (p.req.unit, p.req.reason);
            let Some(d) = written else {
                // Not ours to report: an operator purged the lane or skipped its head
                // while the attempt was in flight, and that made the dead letter.
                debug!(actor = %self.actor, unit = unit.0, row = %p.row,
                    recipient = self.recipient(p.lane), reason = reason.as_str(),
                    "not dead-lettered: no longer pending");
                continue;
            };
            self.report.dead_lettered += 1;
            info!(actor = %self.actor, unit = unit.0, row = %p.row,
                recipient = self.recipient(p.lane), reason = reason.as_str(),
                status = d.last_status, error = d.last_error.as_deref(), attempts = d.attempts,
                dead_letter = d.id.0, "dead-lettered");
            // A refused destination or a permanent answer dead-letters every unit of the lane
            // the same way: said at WARN once per lane and pass, so an embedder with a default
            // subscriber sees it.
            let refusal = matches!(
                reason,
                DeadReason::DestinationRefused | DeadReason::Permanent
            );
            if refusal && self.lane_log.refusals_warned.insert(p.lane) {
                warn!(actor = %self.actor, recipient = self.recipient(p.lane),
                    reason = reason.as_str(), status = d.last_status,
                    error = d.last_error.as_deref(),
                    "dead-lettering this lane's units: {}", refusal_hint(reason));
            }
            if let Some(hook) = &hooks.dead_lettered {
                hook(&self.dead_lettered(d, p.lane, reason));
            }
        }
    }

    /// The delivery log's entry of a finished attempt.
    pub(super) fn log_entry(
        &self,
        unit: UnitId,
        lane: LaneId,
        row: &str,
        i: LogInfo,
        delivered: bool,
    ) -> DeliveryLogEntry {
        DeliveryLogEntry {
            unit,
            lane: self.lanes.store_lane(lane),
            row_id: row.to_owned(),
            attempt: i.attempt,
            started_at: i.started_at,
            duration_ms: i.duration_ms,
            status: i.status,
            error_class: i.error_class,
            body: i.body,
            delivered,
        }
    }

    /// Writes the in-flight marks due (see [`Flight`]): clears those of attempts that ended
    /// and, at most once per [`MARK_SWEEP`], marks lanes whose attempt has been in flight for
    /// longer than [`IN_FLIGHT_MARK_AFTER`]. `all`: the pass ends, every mark is cleared.
    /// A failed write is only logged: the marks inform operators, nothing depends on them.
    pub(super) fn flush_marks(&mut self, store: &dyn Store, all: bool) {
        if all {
            let marked: Vec<LaneId> = self
                .jobs
                .flights
                .iter()
                .filter(|(_, f)| f.marked)
                .map(|(l, _)| *l)
                .collect();
            self.jobs.unmarks.extend(marked);
            self.jobs.next_sweep = None;
        }
        let t = self.now();
        let mut marks: Vec<(StoreLaneId, Option<(UnitId, Timestamp)>)> = Vec::new();
        for lane in std::mem::take(&mut self.jobs.unmarks) {
            marks.push((self.lanes.store_lane(lane), None));
        }
        if self.jobs.next_sweep.is_some_and(|at| t >= at) {
            let mut earliest: Option<Timestamp> = None;
            let mut due = Vec::new();
            for (lane, f) in &mut self.jobs.flights {
                if f.marked {
                    continue;
                }
                let at = f.since.saturating_add(IN_FLIGHT_MARK_AFTER);
                if at <= t {
                    f.marked = true;
                    due.push((*lane, f.unit, f.since));
                } else {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            for (lane, unit, since) in due {
                debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                    since = %rfc3339(since), "attempt in flight for long: lane marked");
                marks.push((self.lanes.store_lane(lane), Some((unit, since))));
            }
            self.jobs.next_sweep = earliest.map(|e| e.max(t.saturating_add(MARK_SWEEP)));
        }
        if marks.is_empty() || self.error.is_some() {
            return;
        }
        if let Err(e) = store.mark_in_flight(&self.token, &marks) {
            debug!(actor = %self.actor, error = %e, "in-flight marks not written");
        }
    }

    /// Writes the attempt records gathered so far, in one call.
    pub(super) fn flush_records(&mut self, store: &dyn Store) {
        if self.pending.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.pending.records);
        let log = std::mem::take(&mut self.pending.records_log);
        if self.error.is_some() {
            return;
        }
        if let Err(e) = store.record_attempts_logged(&self.token, &records, &log) {
            let t = self.now();
            self.store_failed("attempt record", e, t);
        }
    }
}

impl Jobs {
    /// In-flight marks are to be written or cleared at `now`.
    pub(super) fn marks_due(&self, now: Timestamp) -> bool {
        !self.unmarks.is_empty() || self.next_sweep.is_some_and(|at| now >= at)
    }
}
