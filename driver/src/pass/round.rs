//! A round, blocking or inline, its steps, and the end of the pass.

use outbox_lanes_core::PassEnd;
use outbox_lanes_store::StoreError;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use tracing::{debug, warn};

use super::{ClaimOut, NeedsStore, PassCore, PassResult, RoundContext, Start};
use crate::job::Job;

/// Reads of the lane controls one round makes at most before it leaves its starts for the
/// next round (only a store slower than [`outbox_lanes_store::CONTROL_VALIDITY`] per round
/// needs more than two).
pub(super) const CONTROL_READS_PER_ROUND: usize = 4;

impl PassCore {
    /// One round (blocking); see the [module docs](super). Returns the attempts to hand to the
    /// executor, each with its payload.
    pub fn round(&mut self, cx: RoundContext<'_>) -> Vec<Job> {
        if self.pending.log_on.is_none() {
            self.pending.log_on = Some(cx.store.logs_deliveries());
        }
        let mut starts = std::mem::take(&mut self.round.pending_starts);
        if self.end.is_some() {
            return Vec::new();
        }
        self.round.resolved = 0;
        if let Some(e) = cx.acks.failure(&self.token) {
            self.store_failed("ack", e, self.now());
        }
        if self.round.first_round {
            // OL-24: the outbox's destination policy as stored now (widened by another
            // process, or narrowed by an operator, since this one opened), before the pass's
            // first start; the HTTP clients read the same handle.
            match cx.store.destination_policy() {
                Ok(p) => {
                    self.lanes.outbox_addresses.set(p);
                    self.lanes.addresses = self
                        .lanes
                        .outbox_addresses
                        .allowing(self.lanes.own_addresses);
                }
                Err(e) => self.store_failed("destination policy", e, self.now()),
            }
        }
        // The token's read of the lane controls carries no host-control generation: with a
        // host book, the first round reads both (OL-14 for hosts), so that a host action
        // that committed before this pass began reaches the book before its first start.
        if std::mem::take(&mut self.round.first_round)
            && (cx.hosts.is_some() || !self.round.control.fresh_at(self.instant()))
        {
            // The token may be an earlier pass's: what the pass discovers next is read after
            // a fresh generation, so only later actions count as changes.
            if let Err(e) = self.read_controls(cx, &mut starts, false) {
                self.store_failed("lane controls", e, self.now());
            }
        }
        if self.round.look && self.end.is_none() {
            self.round.look = false;
            if let Err(e) = self.discover(cx.store) {
                self.store_failed("discover", e, self.now());
            }
        }
        // Payloads read this round for starts whose claim did not bring them.
        let mut fetched = HashMap::new();
        let mut reads = 0;
        loop {
            // Not inline: it never stops for the store.
            let _ = self.steps(cx, &mut starts, false);
            if self.end.is_some() || starts.is_empty() {
                // Never sent: the attempts the scheduler started this round are handed back
                // with everything else by `finish`.
                return Vec::new();
            }
            if !self.round.control.fresh_at(self.instant()) {
                if reads == CONTROL_READS_PER_ROUND {
                    break;
                }
                reads += 1;
                // The last read of the lane controls is too old to start on (OL-14).
                match self.read_controls(cx, &mut starts, true) {
                    // An operator changed lanes: their starts are gone, and what the change
                    // queued (hand-backs, reads, other starts) runs first.
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(StoreError::Busy) => break,
                    Err(e) => {
                        self.store_failed("lane controls", e, self.now());
                        return Vec::new();
                    }
                }
            }
            // Starts made while the read was too old, to a destination nothing may be sent
            // to: they come to their result now, and what the scheduler makes of it (a dead
            // letter, the lane's next start) runs first. None of them becomes a job.
            if self.resolve_unsendable(cx.hooks, &mut starts) {
                continue;
            }
            self.read_payloads(cx.store, &mut starts, &mut fetched);
            if self.end.is_some() {
                return Vec::new();
            }
            if self.round.control.fresh_at(self.instant()) {
                return self.jobs(cx, &starts, &mut fetched);
            }
        }
        // The store was busy, or too slow to answer within the read's validity: the next
        // round tries again, at once (see `poll_timeout`).
        debug!(actor = %self.actor, starts = starts.len(),
            "lane controls not read in time; the starts wait for the next round");
        self.round.pending_starts.extend(starts);
        Vec::new()
    }

    /// One round without the store, on the caller's thread (an async runtime's task): taken
    /// when the round has nothing to read or write, as a round that only turns completions
    /// into the next starts with payloads the claims brought. `None`: the round needs the
    /// store; run [`PassCore::round`] where blocking is allowed — it goes on from here
    /// (commands already taken and starts already made are kept in order).
    pub fn try_round_inline(&mut self, cx: RoundContext<'_>) -> Option<Vec<Job>> {
        if self.end.is_some() {
            return Some(Vec::new());
        }
        if self.round.look || self.round.renew_due {
            return None;
        }
        if let Some(e) = cx.acks.failure(&self.token) {
            self.store_failed("ack", e, self.now());
        }
        self.round.resolved = 0;
        let mut starts = std::mem::take(&mut self.round.pending_starts);
        let needs_store = self.steps(cx, &mut starts, true).is_err();
        if self.end.is_some() {
            return Some(Vec::new());
        }
        let at = self.instant();
        let cached = starts.iter().all(|s| {
            self.units
                .info
                .get(&s.unit)
                .is_some_and(|u| u.payload.is_some())
                && !self.lanes.is_unsendable(s.lane, at)
        });
        // Starts need a fresh read of the lane controls (OL-14), which is a store read.
        let fresh = starts.is_empty() || self.round.control.fresh_at(self.instant());
        if needs_store || !cached || !fresh {
            self.round.pending_starts = starts;
            return None;
        }
        Some(self.jobs(cx, &starts, &mut HashMap::new()))
    }

    /// The body of a round, shared by both kinds: the queued commands in order, claims, timers
    /// that fell due, the session's tick and the lease renewal, until there is nothing more
    /// to do now or the pass ended. `inline`: without the store — it stops with
    /// [`NeedsStore`] at the first claim, store write or renewal, keeping everything in order
    /// for the blocking round that goes on from there.
    pub(super) fn steps(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        inline: bool,
    ) -> Result<(), NeedsStore> {
        loop {
            self.execute(cx, starts, inline)?;
            if self.end.is_some() {
                return Ok(());
            }
            let t = self.now();
            // Timers that fell due fire first: a retry or a probe may queue starts.
            self.sched.handle_timeout(t);
            let idle = matches!(self.round.claim, ClaimOut::None);
            if let Some(claims) = idle.then(|| self.sched.poll_claim(t)).flatten() {
                let ranges = self.lanes.claim_ranges(&claims);
                if inline {
                    // The read goes out from the runtime and the round goes on: a lane
                    // refilling its window does not hold back its next attempt, nor a
                    // completion its ack, for a read of the store.
                    self.round.claim = ClaimOut::Planned(ranges);
                    continue;
                }
                let answer = cx.store.claim(&self.token, &ranges);
                self.handle_claim(answer);
                continue;
            }
            let done = self.sched.is_done(t);
            if self.execute(cx, starts, inline)? > 0 {
                continue;
            }
            self.session.handle_tick(t, self.sched.in_flight(), done);
            let stopped = self.take_session_actions(t);
            if self.round.renew_due && self.end.is_none() {
                if inline {
                    return Err(NeedsStore);
                }
                self.round.renew_due = false;
                match cx.store.renew_slot(&self.token, self.lease) {
                    Ok(()) => self.session.handle_lease_renewed(self.now()),
                    Err(e) => self.store_failed("lease renewal", e, self.now()),
                }
                let _ = self.take_session_actions(self.now());
            }
            if !stopped {
                return Ok(());
            }
        }
    }

    /// The pass is over (blocking): hands every unfinished unit back (OL-10, OL-14),
    /// executes every command still queued — acks and hooks of deliveries included — and
    /// flushes this pass's acks, so the slot is released only once they are durable.
    pub fn finish(mut self, cx: RoundContext<'_>) -> PassResult {
        let end = self.end.unwrap_or(PassEnd::Cancelled);
        // Jobs not yet sent (queued for a worker, parked under a host cap) are dropped from
        // now on: their units are handed back below.
        self.jobs.live.store(false, Ordering::SeqCst);
        let t = self.now();
        if end.hands_back_in_flight() {
            if end != PassEnd::StoreFailed {
                warn!(actor = %self.actor, %end, in_flight = self.sched.in_flight(),
                    "pass interrupted; handing every unfinished unit back");
            }
            self.sched.handle_interrupt(t);
        } else {
            self.sched.handle_pass_end(t);
        }
        let mut ignored = Vec::new();
        let _ = self.execute(cx, &mut ignored, false);
        self.flush_marks(cx.store, true);
        self.pending.log_info.clear();
        self.report.yielded = end.yielded();
        self.report.grace_over = matches!(end, PassEnd::GraceOver(_));
        let flushed = cx.acks.flush(&self.token);
        let error = match (self.error.take(), flushed) {
            (Some(e), _) | (None, Err(e)) => Some(e),
            (None, Ok(())) => None,
        };
        debug!(actor = %self.actor, %end, delivered = self.report.delivered,
            dead_lettered = self.report.dead_lettered, handed_back = self.report.handed_back,
            "pass ended");
        PassResult {
            report: self.report,
            end,
            error,
            lease_renewed: self.session.lease_renewed_at(),
        }
    }
}
