//! The start path: payloads read for a round's starts, starts to a destination nothing may
//! be sent to resolved in the round, and the jobs handed to the executor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_core::{LaneId, Outcome, UnitId};
use outbox_lanes_store::{IN_FLIGHT_MARK_AFTER, Payload, Store, StoreError};
use tracing::debug;

use super::{Flight, PassCore, RESOLVED_PER_ROUND, RoundContext, Start};
use crate::hooks::{Hooks, Started};
use crate::http::AttemptResult;
use crate::job::Job;

impl PassCore {
    /// Reads, in one call, the payloads of this round's starts that neither their claim
    /// brought nor an earlier read of the round did. A start whose payload cannot be read is
    /// not sent (reported [`Outcome::NotSent`]: retried, never counted) and leaves `starts`.
    pub(super) fn read_payloads(
        &mut self,
        store: &dyn Store,
        starts: &mut Vec<Start>,
        fetched: &mut HashMap<UnitId, Arc<Payload>>,
    ) {
        // A joined unit starts once per member lane: its payload is read once.
        let mut missing: Vec<UnitId> = starts
            .iter()
            .filter(|s| {
                !fetched.contains_key(&s.unit)
                    && self
                        .units
                        .info
                        .get(&s.unit)
                        .is_none_or(|u| u.payload.is_none())
            })
            .map(|s| s.unit)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return;
        }
        let mut failed: HashMap<UnitId, StoreError> = HashMap::new();
        for (unit, p) in missing.iter().zip(store.payloads(&missing)) {
            match p {
                Ok(payload) => {
                    fetched.insert(*unit, Arc::new(payload));
                }
                Err(e) => {
                    failed.insert(*unit, e);
                }
            }
        }
        if failed.is_empty() {
            return;
        }
        let t = self.now();
        let mut kept = Vec::with_capacity(starts.len());
        for s in starts.drain(..) {
            let Some(e) = failed.get(&s.unit) else {
                kept.push(s);
                continue;
            };
            // Our side failed, the recipient saw nothing: retried, never counted.
            debug!(unit = %s.unit, error = %e, "payload not read; the attempt is not sent");
            if let Err(e) = self
                .sched
                .handle_outcome(s.unit, s.lane, Outcome::NotSent, t)
            {
                debug!(error = %e, "not-sent outcome ignored");
            }
            // A busy database may answer next time; any other failure (the unit is gone, the
            // database is) means the pass's view is stale: end it.
            if *e != StoreError::Busy {
                self.store_failed("payload", e.clone(), t);
            }
        }
        *starts = kept;
    }

    /// On a fresh read of the lane controls (OL-14): takes the starts whose destination
    /// nothing may be sent to out of `starts` and gives the scheduler their results, as an
    /// executor would, up to [`RESOLVED_PER_ROUND`] in the round; those past it go to the
    /// next round's starts. Returns whether any was resolved (their commands are queued).
    pub(super) fn resolve_unsendable(&mut self, hooks: &Hooks, starts: &mut Vec<Start>) -> bool {
        let at = self.instant();
        if !starts.iter().any(|s| self.lanes.is_unsendable(s.lane, at))
            || !self.round.control.fresh_at(at)
        {
            return false;
        }
        let mut resolved = false;
        let mut kept = Vec::with_capacity(starts.len());
        for s in std::mem::take(starts) {
            let unsendable = self.lane_destination(s.lane).refused(at).cloned();
            match unsendable {
                Some(result) if self.round.resolved < RESOLVED_PER_ROUND => {
                    self.round.resolved += 1;
                    resolved = true;
                    self.not_sendable(hooks, s.unit, s.lane, s.attempt, result);
                }
                // Never a job: the next round resolves it.
                Some(_) => self.round.pending_starts.push(s),
                None => kept.push(s),
            }
        }
        *starts = kept;
        resolved
    }

    /// Makes the jobs of this round's starts, each with the payload its claim brought or the
    /// round read. Called only on a fresh read of the lane controls (OL-14).
    pub(super) fn jobs(
        &mut self,
        cx: RoundContext<'_>,
        starts: &[Start],
        fetched: &mut HashMap<UnitId, Arc<Payload>>,
    ) -> Vec<Job> {
        if self.end.is_some() || starts.is_empty() {
            return Vec::new();
        }
        let hooks = cx.hooks;
        let outbox = Arc::clone(
            self.jobs
                .outbox
                .get_or_insert_with(|| Arc::from(cx.store.outbox_id())),
        );
        let mut jobs = Vec::with_capacity(starts.len());
        let t = self.now();
        // When the jobs are handed to the executor, on the monotonic clock: their latency.
        let started = self.instant();
        for s in starts {
            let cached = self.units.info.get(&s.unit).and_then(|u| u.payload.clone());
            let Some(payload) = cached.or_else(|| fetched.remove(&s.unit)) else {
                // Every start's payload was cached or read (`read_payloads`).
                debug!(unit = %s.unit, "no payload; the attempt is not sent");
                if let Err(e) =
                    self.sched
                        .handle_outcome(s.unit, s.lane, Outcome::NotSent, self.now())
                {
                    debug!(error = %e, "not-sent outcome ignored");
                }
                continue;
            };
            let destination = self.destination(s.lane);
            self.jobs.flights.insert(
                s.lane,
                Flight {
                    unit: s.unit,
                    attempt: s.attempt,
                    since: t,
                    marked: false,
                },
            );
            if self.jobs.next_sweep.is_none() {
                self.jobs.next_sweep = Some(t.saturating_add(IN_FLIGHT_MARK_AFTER));
            }
            jobs.push(Job::new(
                self.actor.clone(),
                Arc::clone(&outbox),
                s.unit,
                s.lane,
                destination,
                s.attempt,
                payload,
                started,
                Arc::clone(&self.jobs.sink),
                Arc::clone(&self.jobs.live),
            ));
        }
        if let Some(hook) = &hooks.started {
            for job in &jobs {
                hook(&Started {
                    actor: &job.actor,
                    unit: job.unit,
                    recipient: job.recipient.as_str(),
                    attempt: job.attempt,
                });
            }
        }
        jobs
    }

    /// A start of `unit` on `lane`, whose destination nothing may be sent to: it is reported
    /// to the hooks as started and finished at once, with `result`, and the result goes to
    /// the scheduler as an executor's would; no job is made.
    pub(super) fn not_sendable(
        &mut self,
        hooks: &Hooks,
        unit: UnitId,
        lane: LaneId,
        attempt: u32,
        result: AttemptResult,
    ) {
        if let Some(hook) = &hooks.started {
            hook(&Started {
                actor: &self.actor,
                unit,
                recipient: self.recipient(lane),
                attempt,
            });
        }
        let t = self.now();
        self.jobs.flights.insert(
            lane,
            Flight {
                unit,
                attempt,
                since: t,
                marked: false,
            },
        );
        self.finished(unit, lane, result, Duration::ZERO, hooks, t);
    }
}
