//! The outcome path: an attempt's result, from the executor or the round, to hooks, logs
//! and the scheduler.

use std::time::Duration;

use outbox_lanes_core::{LaneId, LaneWait, Outcome, Timestamp, UnitId};
use outbox_lanes_store::error_class;
use tracing::{debug, info, trace};

use super::lanes::REFUSAL_TRUST;
use super::{LogInfo, PassCore};
use crate::fmt::rfc3339;
use crate::hooks::{Attempted, Hooks};
use crate::http::AttemptResult;
use crate::job::Done;

impl PassCore {
    /// An attempt finished.
    pub fn handle_done(&mut self, d: Done, hooks: &Hooks, now: Timestamp) {
        let latency = self.instant().saturating_duration_since(d.started);
        self.finished(d.unit, d.lane, d.result, latency, hooks, now);
    }

    /// The result of an attempt, from the executor or (for a destination nothing may be sent
    /// to) from the round that started it: hooks, logs, and the scheduler's input.
    pub(super) fn finished(
        &mut self,
        unit: UnitId,
        lane: LaneId,
        result: AttemptResult,
        latency: Duration,
        hooks: &Hooks,
        now: Timestamp,
    ) {
        let outcome = result.outcome;
        let flight = match self.jobs.flights.get(&lane) {
            Some(f) if f.unit == unit => self.jobs.flights.remove(&lane),
            _ => None,
        };
        if let Some(f) = flight {
            if f.marked {
                self.jobs.unmarks.push(lane);
            }
            let counted = !matches!(
                outcome,
                Outcome::Held | Outcome::Deferred { .. } | Outcome::NotSent
            );
            if counted && self.pending.log_on != Some(false) {
                self.pending.log_info.insert(
                    (unit, lane),
                    LogInfo {
                        attempt: f.attempt,
                        started_at: now.saturating_sub(latency),
                        duration_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
                        status: result.status,
                        error_class: result.error.as_deref().map(|e| error_class(e).to_owned()),
                        body: result.body.clone(),
                    },
                );
            }
        }
        if crate::http::is_refusal(&result) {
            // The guard refused every address the lane's host resolved to: the lane's later
            // starts come to the same for a while, in their round and without a job each, as
            // for a refused IP literal.
            let until = self.instant() + REFUSAL_TRUST;
            if let Some(Some(d)) = self.lanes.destinations.get_mut(lane.index()) {
                if d.unsendable.is_none() || d.until.is_some() {
                    d.unsendable = Some(result.clone());
                    d.until = Some(until);
                }
            }
        }
        trace!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
            outcome = outcome.as_str(),
            retry_after_ms = outcome.retry_after().map(|d| d.as_millis() as u64),
            status = result.status,
            error = result.error.as_deref(), took_ms = latency.as_millis() as u64,
            "attempt finished");
        if let Some(hook) = &hooks.attempted {
            let queued = self.units.info.get(&unit).map_or(Duration::ZERO, |u| {
                now.saturating_sub(latency)
                    .saturating_duration_since(u.enqueued_at)
            });
            hook(&Attempted {
                actor: self.actor.clone(),
                unit,
                recipient: self.recipient(lane).to_owned(),
                outcome,
                status: result.status,
                latency,
                queued,
            });
        }
        // Kept for the attempt record or dead letter a failure may lead to; a delivery and
        // an attempt that never left need none.
        if outcome == Outcome::Held {
            // An operator holds the host: the scheduler pauses the lane in the pass, and the
            // pause is persisted for the host, so that `hosts unblock` resumes it.
            debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                error = result.error.as_deref(), "attempt held: its host is blocked by an operator");
            let origin = self.destination(lane).origin().to_string();
            self.pending
                .host_pauses
                .push((self.lanes.store_lane(lane), origin));
        } else if let Outcome::Deferred { .. } = outcome {
            // Held for its host (origin health, OL-21): the host's state is logged once, by
            // the gate; its lanes' holds are not news.
            debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                error = result.error.as_deref(), "attempt deferred: its host is not contacted now");
        } else if outcome != Outcome::NotSent && outcome != Outcome::Delivered {
            self.units.last.insert((unit, lane), result);
        }
        let before = self.sched.lane_wait(lane);
        match self.sched.handle_outcome(unit, lane, outcome, now) {
            Ok(()) => self.log_lane_wait(unit, lane, outcome, before),
            Err(e) => debug!(error = %e, "late completion ignored"),
        }
    }

    /// The INFO line of a lane whose wait `outcome` changed, as the scheduler decided it
    /// (it was `before`): it entered backoff, or its probe failed, or it was throttled —
    /// with the failure and the next attempt — or it recovered. A host's deferral is not
    /// news here: the gate logs the host's state once.
    pub(super) fn log_lane_wait(
        &self,
        unit: UnitId,
        lane: LaneId,
        outcome: Outcome,
        before: Option<LaneWait>,
    ) {
        let after = self.sched.lane_wait(lane);
        let recipient = self.recipient(lane);
        match outcome {
            Outcome::Delivered | Outcome::Permanent | Outcome::Gone => {
                if let (Some(b), None) = (before, after) {
                    let how = if outcome == Outcome::Delivered {
                        "delivered"
                    } else {
                        "the recipient answered"
                    };
                    info!(actor = %self.actor, recipient, after_level = b.level, how,
                        "lane recovered");
                }
            }
            Outcome::Throttled { .. } | Outcome::Transient { .. } => {
                let Some((level, not_before)) = after
                    .filter(|a| Some(*a) != before)
                    .and_then(|a| Some((a.level, a.not_before?)))
                else {
                    return;
                };
                let (status, error) = self
                    .units
                    .last
                    .get(&(unit, lane))
                    .map_or((None, None), |r| (r.status, r.error.as_deref()));
                let next_attempt = rfc3339(not_before);
                match (before.map(|b| b.level), level) {
                    (Some(0), 0) => debug!(actor = %self.actor, recipient, status, error,
                        next_attempt = %next_attempt, "lane still throttled"),
                    (_, 0) => info!(actor = %self.actor, recipient, status, error,
                        next_attempt = %next_attempt, "lane throttled by Retry-After"),
                    (Some(b), _) if b > 0 => info!(actor = %self.actor, recipient, level, status,
                        error, next_attempt = %next_attempt, "lane probe failed; backoff extended"),
                    _ => info!(actor = %self.actor, recipient, level, status, error,
                        next_attempt = %next_attempt, "lane entered backoff"),
                }
            }
            Outcome::Refused
            | Outcome::NotSent
            | Outcome::Deferred { .. }
            | Outcome::Held
            | Outcome::SetAside { .. } => {}
        }
    }
}
