//! The outcome path: an attempt's result, from the executor or the round, to hooks, logs
//! and the scheduler.

use std::time::{Duration, Instant};

use outbox_lanes_core::{LaneId, Outcome, Timestamp, UnitId};
use outbox_lanes_store::error_class;
use tracing::{debug, trace};

use super::lanes::REFUSAL_TRUST;
use super::{LogInfo, PassCore};
use crate::hooks::{Attempted, Hooks};
use crate::http::AttemptResult;
use crate::job::Done;

impl PassCore {
    /// An attempt finished.
    pub fn handle_done(&mut self, d: Done, hooks: &Hooks, now: Timestamp) {
        let latency = d.started.elapsed();
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
            if let Some(Some(d)) = self.lanes.destinations.get_mut(lane.index()) {
                if d.unsendable.is_none() || d.until.is_some() {
                    d.unsendable = Some(result.clone());
                    d.until = Some(Instant::now() + REFUSAL_TRUST);
                }
            }
        }
        trace!(actor = %self.actor, unit = unit.0, recipient = self.lanes.recipient(lane),
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
                recipient: self.lanes.recipient(lane).to_owned(),
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
            debug!(actor = %self.actor, unit = unit.0, recipient = self.lanes.recipient(lane),
                error = result.error.as_deref(), "attempt held: its host is blocked by an operator");
            let origin = self.lanes.destination(lane).origin().to_string();
            self.pending
                .host_pauses
                .push((self.lanes.store_lane(lane), origin));
        } else if let Outcome::Deferred { .. } = outcome {
            // Held for its host (origin health, OL-21): the host's state is logged once, by
            // the gate; its lanes' holds are not news.
            debug!(actor = %self.actor, unit = unit.0, recipient = self.lanes.recipient(lane),
                error = result.error.as_deref(), "attempt deferred: its host is not contacted now");
            self.lane_log.host_held.insert(lane);
        } else if outcome != Outcome::NotSent && outcome != Outcome::Delivered {
            self.lane_log
                .failure
                .insert(lane, (result.status, result.error.clone()));
            self.units.last.insert((unit, lane), result);
        }
        if let Err(e) = self.sched.handle_outcome(unit, lane, outcome, now) {
            debug!(error = %e, "late completion ignored");
        }
    }
}
