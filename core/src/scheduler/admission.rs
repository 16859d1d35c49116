//! Admission: discovery, claims and the admission window.
//!
//! Lanes with work wait in two queues (hungry lanes, which have nothing admitted, before lanes
//! that only refill); [`Scheduler::poll_claim`] shares the window among them breadth first.
//! [`Scheduler::handle_claimed`] admits what the store returned, in `seq` order per lane. A
//! joined unit is admitted once the reads of all its lanes reached it; if the window has no
//! room then, it waits in `complete_joined` and is admitted when a unit leaves the window.

use alloc::vec::Vec;
use core::cmp::Reverse;

use smallvec::SmallVec;

use super::types::{Admit, AdmitError, ClaimReport, LaneChunk, LaneClaim, LaneInfo};
use super::{Lane, Phase, Reached, Scheduler, Slot, Timer, Unit};
use crate::config::MAX_BACKOFF_LEVEL;
use crate::ids::{LaneId, Seq, UnitId};
use crate::time::Timestamp;

/// The most held heads one [`Scheduler::poll_claim`] hands back to make room: a bound on its
/// cost; the next call hands back more if lanes still wait.
pub(super) const MAX_HAND_BACKS: usize = 64;

impl Scheduler {
    /// The store has pending units in `lane` (discovered at pass start, or after new rows
    /// were enqueued); `info` is its persisted state. During a pass the scheduler's own view
    /// of a lane it has admitted units for wins over `info`. A lane reported here is not
    /// paused (a runtime skips paused lanes): one that
    /// [`Scheduler::handle_lane_control`] paused is open again.
    pub fn handle_lane(&mut self, lane: LaneId, info: LaneInfo, now: Timestamp) {
        self.advance_to(now);
        if self.lanes.get(lane.index()).is_none() {
            return;
        }
        self.set_pace(lane, info.pace, info.paced_until);
        let l = &mut self.lanes[lane.index()];
        l.strict = info.strict;
        l.known = true;
        // Discovery reports lanes that are not paused (any more): an operator resumed it.
        l.paused = false;
        let idle = l.queue.is_empty() && !l.in_flight && !l.stalled;
        if idle {
            l.not_before = info.not_before;
            l.level = info.level.min(MAX_BACKOFF_LEVEL);
            l.failing_since = info.failing_since;
            l.unavailable = info.unavailable;
        }
        l.more = true;
        // The store's count, less nothing yet: it counts the units admitted too.
        l.remaining = info
            .pending
            .max(u32::try_from(l.queue.len()).unwrap_or(u32::MAX));
        if let Some(t) = l.not_before.filter(|&t| t > self.now) {
            self.timers.push(Reverse((t, Timer::Lane(lane.0))));
        }
        self.queue_for_claim(lane);
        self.start_ready();
    }

    /// The lanes to read from the store now, if any. The room they ask for is reserved
    /// until [`Scheduler::handle_claimed`] (or [`Scheduler::handle_claim_failed`]).
    ///
    /// Breadth first: the window is shared by the lanes with work, each up to a depth of
    /// `max_units / lanes` (at least 1, at most `max_per_lane`), and a lane with nothing
    /// admitted (nothing it could start) is read before a lane that only refills. With 1,000
    /// lanes and a window of 4,000 units each lane gets 4, not 250 lanes 16 each (which would
    /// leave 750 recipients idle while the in-flight window has room for them). A lane
    /// refills once it is down to half its depth, and only when the room for the whole refill
    /// is free: few, larger reads, not one read per unit that leaves the window.
    ///
    /// A full window whose units include heads held while their lanes wait in backoff
    /// (stalled, or deferred by their host) does not keep lanes with work out: when lanes
    /// wait for room (hungry lanes that could be read, lanes whose next unit did not fit,
    /// joined units complete but not admitted), it hands back as many of those heads as
    /// they need, those whose wait ends last first, and returns `None`. Drain the
    /// [`Command::HandBack`](super::Command::HandBack)s (and what the room they freed
    /// admitted), then ask again. A head handed back keeps its `seq` and its lane its
    /// backoff: the lane is read again, head first, when its wait ends (OL-10, OL-11).
    /// Without this, a thousand lanes in backoff would fill a window of 1,024 and end the
    /// pass with every healthy lane still waiting.
    ///
    /// Its cost is the lanes it takes from its queues (each leaves them, read or not), not
    /// the length of the queues: with 10,000 lanes waiting and one unit of room, it looks at
    /// one or a few.
    pub fn poll_claim(&mut self, now: Timestamp) -> Option<Vec<LaneClaim>> {
        self.advance_to(now);
        if self.stopping {
            return None;
        }
        if self.window_full() {
            // Lanes that cannot be read now leave the front of the queue, as they would with
            // room (each is queued again when it can be): the lanes counted below are
            // readable.
            let max = self.config.max_per_lane;
            while let Some(&lane) = self.hungry_queue.front() {
                let l = &mut self.lanes[lane.index()];
                if Self::claimable(l, self.now, max, max).is_some() {
                    break;
                }
                l.in_claim_queue = false;
                self.hungry_queue.pop_front();
            }
            let wanted = self.room_wanted(self.now);
            if wanted > 0 {
                self.hand_back_held(wanted);
            }
            return None;
        }
        let mut room = self
            .config
            .max_units
            .saturating_sub(self.admitted + self.reserved);
        debug_assert_eq!(
            self.occupied,
            self.lanes.iter().filter(|l| !l.queue.is_empty()).count(),
            "the count of occupied lanes drifted"
        );
        // (Lanes queued as hungry may have become unclaimable since: they only make the
        // share and the depth smaller, never zero.)
        let hungry = self.hungry_queue.len();
        let depth = self.depth(hungry + self.deep_queue.len());
        let share = u32::try_from(room / hungry.max(1))
            .unwrap_or(u32::MAX)
            .max(1);
        let mut out = Vec::new();
        // Deep lanes first, each what it may take (its share; two while that is one): the
        // chain of a deep lane is what a drain waits for last, and each of them holds at
        // most its share of the window, so the others are not crowded out.
        while room > 0 {
            let Some(lane) = self.deep_queue.pop_front() else {
                break;
            };
            let l = &mut self.lanes[lane.index()];
            l.in_claim_queue = false;
            let Some(limit) = Self::claimable(l, self.now, depth, self.config.max_per_lane) else {
                continue;
            };
            let limit = limit.min(u32::try_from(room).unwrap_or(u32::MAX));
            room -= limit as usize;
            out.push(self.plan(lane, limit));
        }
        // Hungry lanes first, each its share (one unit at least) while there is room.
        while room > 0 {
            let Some(lane) = self.hungry_queue.pop_front() else {
                break;
            };
            let l = &mut self.lanes[lane.index()];
            l.in_claim_queue = false;
            let Some(limit) = Self::claimable(l, self.now, depth, self.config.max_per_lane) else {
                continue;
            };
            let limit = limit
                .min(share)
                .min(u32::try_from(room).unwrap_or(u32::MAX));
            room -= limit as usize;
            out.push(self.plan(lane, limit));
        }
        // Then the refills, in their order, each only if the room holds all of it: the first
        // that does not fit waits at the front (its lane still has work admitted).
        while room > 0 {
            let Some(&lane) = self.claim_queue.front() else {
                break;
            };
            let l = &mut self.lanes[lane.index()];
            let Some(limit) = Self::claimable(l, self.now, depth, self.config.max_per_lane) else {
                self.claim_queue.pop_front();
                l.in_claim_queue = false;
                continue;
            };
            // A lane that emptied while it waited here is hungry: it takes what there is.
            let limit = if l.queue.is_empty() {
                limit.min(u32::try_from(room).unwrap_or(u32::MAX))
            } else if limit as usize <= room {
                limit
            } else {
                break;
            };
            self.claim_queue.pop_front();
            l.in_claim_queue = false;
            room -= limit as usize;
            out.push(self.plan(lane, limit));
        }
        (!out.is_empty()).then_some(out)
    }

    /// No room for another read: the window is full by count (reads out included) or by
    /// bytes.
    #[inline]
    pub(super) fn window_full(&self) -> bool {
        self.admitted + self.reserved >= self.config.max_units
            || (self.admitted > 0 && self.admitted_bytes >= self.config.max_bytes)
    }

    /// With the window full and no read out: how many units of room lanes with work wait
    /// for now — complete joined units, lanes whose next unit did not fit, and hungry lanes
    /// that could be read (up to [`MAX_HAND_BACKS`] of these, looked at among the first few
    /// of the queue) — at most [`MAX_HAND_BACKS`].
    pub(super) fn room_wanted(&self, now: Timestamp) -> usize {
        if self.reserved > 0 {
            return 0;
        }
        let max = self.config.max_per_lane;
        let hungry = self
            .deep_queue
            .iter()
            .chain(&self.hungry_queue)
            .take(4 * MAX_HAND_BACKS)
            .filter(|l| Self::claimable(&self.lanes[l.index()], now, max, max).is_some())
            .take(MAX_HAND_BACKS)
            .count();
        (self.complete_joined.len() + self.room_waiters.len() + hungry).min(MAX_HAND_BACKS)
    }

    /// The head `lane` holds while it waits in backoff until `t`, if it may be handed back
    /// to make room: its wait still ends at `t`, after `now`; it is stalled (not blocked,
    /// paused or fenced); no recipient of the head is in flight. `Err(true)`: not now, but
    /// it may be later (another recipient of a joined head is in flight); `Err(false)`: the
    /// entry is stale.
    pub(super) fn evictable(
        &self,
        t: Timestamp,
        lane: LaneId,
        now: Timestamp,
    ) -> Result<u32, bool> {
        let l = &self.lanes[lane.index()];
        if !l.stalled || l.blocked || l.paused || l.fenced || l.not_before != Some(t) || t <= now {
            return Err(false);
        }
        let &head = l.queue.front().ok_or(false)?;
        let u = &self.units[head as usize];
        let held = u
            .slots
            .iter()
            .any(|s| s.lane == lane && s.phase == Phase::Stalled);
        if !u.live || !held || u.slots.iter().any(|s| s.phase == Phase::Blocked) {
            // (A joined head blocking a strict lane stays: that lane waits for an operator.)
            return Err(false);
        }
        if u.slots.iter().any(|s| s.phase == Phase::InFlight) {
            return Err(true);
        }
        Ok(head)
    }

    /// Hands back up to `wanted` heads held in backoff, those whose wait ends last first, in
    /// one batch (in enqueue order); returns how many.
    pub(super) fn hand_back_held(&mut self, wanted: usize) -> usize {
        let mut victims = Vec::new();
        let mut later: SmallVec<[(Timestamp, LaneId); 4]> = SmallVec::new();
        while victims.len() < wanted {
            let Some((t, lane)) = self.held.pop() else {
                break;
            };
            match self.evictable(t, lane, self.now) {
                Ok(head) => {
                    self.release_held(head);
                    victims.push(head);
                }
                Err(true) => later.push((t, lane)),
                Err(false) => {}
            }
        }
        self.held.extend(later);
        let handed = victims.len();
        if handed > 0 {
            self.hand_back(victims);
        }
        handed
    }

    /// Head `idx`, held in backoff, is about to go back: every lane it is held in is no
    /// longer stalled (it is read again, head first, when its wait ends), and each of its
    /// lanes waiting at level 0 (a throttle or a deferral) sees that wait as an earlier
    /// pass's mark from now on, as it would after a pass end: throttles of this pass that
    /// were not counted are not forgotten with the head, its next throttle stalls it (OL-7).
    fn release_held(&mut self, idx: u32) {
        let lanes: SmallVec<[(LaneId, bool); 4]> = self.units[idx as usize]
            .slots
            .iter()
            .map(|s| (s.lane, s.phase == Phase::Stalled))
            .collect();
        for (lane, held) in lanes {
            let l = &mut self.lanes[lane.index()];
            if held {
                l.stalled = false;
            }
            if l.level == 0 && l.not_before.is_some() {
                l.throttled_here = false;
            }
        }
    }

    /// Reserves `limit` units of room for a read of `lane`.
    pub(super) fn plan(&mut self, lane: LaneId, limit: u32) -> LaneClaim {
        let l = &mut self.lanes[lane.index()];
        l.planned = Some(limit);
        l.planned_from = l.next_from;
        self.reserved += limit as usize;
        LaneClaim {
            lane,
            from: l.next_from,
            limit,
        }
    }

    /// A lane's share of the window: `max_units` over the lanes with work (those with units
    /// admitted, and `hungry` more waiting for their first), between 1 and `max_per_lane`.
    #[inline]
    pub(super) fn depth(&self, hungry: usize) -> u32 {
        let lanes = (self.occupied + hungry).max(1);
        u32::try_from(self.config.max_units / lanes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.config.max_per_lane.max(1))
    }

    /// How many units `l` may be asked for now, up to `depth` admitted, or `None` if it must
    /// not be claimed. A deep lane (holding at least `max_per_lane` units, the most a lane
    /// ever has admitted) keeps two admitted even when its share is one: its next head is
    /// there when the one in flight is answered, instead of a store read later (its serial
    /// chain is what a drain waits for last; the cost is one unit of the window per deep
    /// lane).
    #[inline]
    pub(super) fn claimable(
        l: &Lane,
        now: Timestamp,
        depth: u32,
        max_per_lane: u32,
    ) -> Option<u32> {
        if !l.more
            || !l.known
            || l.paused
            || l.fenced
            || l.stalled
            || l.room_wait
            || l.planned.is_some()
            || l.waiting_on.is_some()
            || !l.open(now)
        {
            return None;
        }
        let queued = u32::try_from(l.queue.len()).unwrap_or(u32::MAX);
        // A lane in probe mode (backoff level above zero) gets its head only: a dead
        // recipient costs one probe per interval, not one per unit (OL-11).
        let cap = if l.level > 0 {
            1
        } else if l.remaining >= max_per_lane {
            depth.max(2).min(max_per_lane.max(1))
        } else {
            depth.max(1)
        };
        // Refill a lane once it is down to half, not one unit at a time: fewer, larger reads.
        if queued > 0 && queued * 2 > cap {
            return None;
        }
        let room = cap.saturating_sub(queued);
        (room > 0).then_some(room)
    }

    /// The store could not answer the last claim: release the room it reserved. The lanes
    /// will be asked for again.
    pub fn handle_claim_failed(&mut self, now: Timestamp) {
        self.advance_to(now);
        for i in 0..self.lanes.len() {
            if let Some(limit) = self.lanes[i].planned.take() {
                self.reserved -= limit as usize;
                self.queue_for_claim(LaneId(i as u32));
            }
        }
    }

    /// The store's answer to the last [`Scheduler::poll_claim`]: for each lane, its next
    /// pending units in `seq` order.
    ///
    /// A joined unit is admitted only once the reads of all its lanes have reached it, so it
    /// always sits behind the earlier units of every lane (OL-3); a lane whose read reached
    /// one waits there, reading nothing further, until it is admitted. Units it refuses are
    /// listed in the report, and the rest of their chunk is left; the other chunks are
    /// admitted regardless.
    pub fn handle_claimed(&mut self, chunks: Vec<LaneChunk>, now: Timestamp) -> ClaimReport {
        self.advance_to(now);
        let mut report = ClaimReport::default();
        for chunk in chunks {
            let lane = chunk.lane;
            match self
                .lanes
                .get_mut(lane.index())
                .and_then(|l| l.planned.take())
            {
                Some(limit) => self.reserved -= limit as usize,
                None => {
                    report.refused.push(AdmitError::Unclaimed(lane));
                    continue;
                }
            }
            let l = &mut self.lanes[lane.index()];
            if l.next_from < l.planned_from {
                // Units of this lane were handed back while the read was outstanding: the
                // answer starts after them. Read the lane again from its new position.
                l.more = true;
                self.queue_for_claim(lane);
                continue;
            }
            let mut consumed = true;
            for u in &chunk.units {
                if let Err(e) = self.validate(u, lane) {
                    report.refused.push(e);
                    // Reading it again would only repeat it; the lane waits for the next
                    // discovery.
                    self.lanes[lane.index()].more = false;
                    consumed = false;
                    break;
                }
                if u.slots.len() > 1 {
                    // The lane waits at the joined unit until all its lanes have reached it.
                    consumed = false;
                    match self.reach_joined(u, lane) {
                        Ok(admitted) => report.admitted += usize::from(admitted),
                        Err(e) => {
                            report.refused.push(e);
                            self.lanes[lane.index()].more = false;
                        }
                    }
                    break;
                }
                if !self.room_for(u.bytes) {
                    let l = &mut self.lanes[lane.index()];
                    l.more = true;
                    if !l.room_wait {
                        // Read it again only once a unit leaves the window.
                        l.room_wait = true;
                        self.room_waiters.push(lane);
                    }
                    consumed = false;
                    break;
                }
                self.admit(u);
                report.admitted += 1;
            }
            if consumed {
                self.lanes[lane.index()].more = !chunk.exhausted;
                self.queue_for_claim(lane);
            }
        }
        self.start_ready();
        report
    }

    /// `lane`'s read reached joined unit `u`; admits it if that was its last lane and there
    /// is room. Returns whether it was admitted.
    pub(super) fn reach_joined(&mut self, u: &Admit, lane: LaneId) -> Result<bool, AdmitError> {
        let entry = self.joined.entry(u.id).or_insert_with(|| Reached {
            admit: u.clone(),
            lanes: SmallVec::new(),
            queued: false,
        });
        if entry.admit.seq != u.seq || entry.lanes.contains(&lane) {
            return Err(AdmitError::Duplicate(u.id));
        }
        entry.lanes.push(lane);
        let complete = entry.lanes.len() == entry.admit.slots.len();
        let l = &mut self.lanes[lane.index()];
        l.waiting_on = Some(u.id);
        l.more = true;
        l.next_from = u.seq;
        if !complete {
            // Its other lanes have work: they must read up to it (a lane this pass has not
            // discovered yet waits for its discovery, which brings its persisted state).
            for s in &u.slots {
                if s.lane != lane {
                    self.lanes[s.lane.index()].more = true;
                    self.queue_for_claim(s.lane);
                }
            }
            return Ok(false);
        }
        if self.admit_joined(u.id) {
            return Ok(true);
        }
        // Complete, but the window is full: it goes in when a unit leaves.
        if let Some(r) = self.joined.get_mut(&u.id) {
            if !r.queued {
                r.queued = true;
                self.complete_joined.push_back(u.id);
            }
        }
        Ok(false)
    }

    /// A unit left the window: admits the complete joined units that fit now, in the order
    /// they became complete. It looks at those only (not at every joined unit being read);
    /// one that is no longer complete (a lane of it was handed back) leaves the queue, and is
    /// queued again if it completes again.
    pub(super) fn admit_complete_joined(&mut self) {
        for _ in 0..self.complete_joined.len() {
            if self.admitted >= self.config.max_units.max(1) {
                return;
            }
            let Some(id) = self.complete_joined.pop_front() else {
                return;
            };
            let Some(r) = self.joined.get_mut(&id) else {
                continue;
            };
            if r.lanes.len() != r.admit.slots.len() {
                r.queued = false;
                continue;
            }
            if !self.admit_joined(id) {
                // Too large for the bytes left: it keeps its place.
                self.complete_joined.push_back(id);
            }
        }
    }

    /// Admits a joined unit every lane of which has reached it, if there is room.
    pub(super) fn admit_joined(&mut self, id: UnitId) -> bool {
        let Some(r) = self.joined.get(&id) else {
            return false;
        };
        if r.lanes.len() != r.admit.slots.len() || !self.room_for(r.admit.bytes) {
            return false;
        }
        let Some(r) = self.joined.remove(&id) else {
            return false;
        };
        for s in &r.admit.slots {
            self.lanes[s.lane.index()].waiting_on = None;
        }
        self.admit(&r.admit);
        true
    }

    /// Whether one more unit of `bytes` fits the window.
    #[inline]
    pub(super) fn room_for(&self, bytes: u32) -> bool {
        self.admitted < self.config.max_units.max(1) && self.bytes_fit(bytes)
    }

    /// Whether `seq` may be appended to `lane`'s admitted units.
    #[inline]
    pub(super) fn in_order(&self, lane: LaneId, seq: Seq) -> bool {
        let l = &self.lanes[lane.index()];
        seq >= l.next_from
            && l.queue
                .back()
                .is_none_or(|&back| self.units[back as usize].seq < seq)
    }

    /// Whether unit `idx` heads every lane it occupies.
    #[inline]
    pub(super) fn heads_all(&self, idx: u32) -> bool {
        self.units[idx as usize]
            .slots
            .iter()
            .all(|s| self.lanes[s.lane.index()].queue.front() == Some(&idx))
    }

    /// Checks unit `u` read from `lane` before it is admitted.
    pub(super) fn validate(&self, u: &Admit, lane: LaneId) -> Result<(), AdmitError> {
        if u.slots.is_empty() {
            return Err(AdmitError::NoLane(u.id));
        }
        if self.index.contains_key(&u.id) {
            return Err(AdmitError::Duplicate(u.id));
        }
        if !u.slots.iter().any(|s| s.lane == lane) {
            return Err(AdmitError::NotInLane(u.id));
        }
        for (i, s) in u.slots.iter().enumerate() {
            if s.lane.index() >= self.lanes.len() || u.slots[..i].iter().any(|o| o.lane == s.lane) {
                return Err(AdmitError::NoLane(u.id));
            }
        }
        if !self.in_order(lane, u.seq) {
            return Err(AdmitError::OutOfOrder(u.id));
        }
        Ok(())
    }

    /// Whether `bytes` more fit `max_bytes` (a lone unit always fits).
    #[inline]
    pub(super) fn bytes_fit(&self, bytes: u32) -> bool {
        self.admitted == 0 || self.admitted_bytes + u64::from(bytes) <= self.config.max_bytes
    }

    /// Puts `u` in the window, at the back of each of its lanes; ready if it heads them all.
    pub(super) fn admit(&mut self, u: &Admit) {
        if u.slots.iter().all(|s| s.served) {
            // Nothing left to deliver (its last recipients were resolved while it waited to
            // be admitted): the store finished it with its last recipient.
            for s in &u.slots {
                self.queue_for_claim(s.lane);
            }
            return;
        }
        let unit = Unit {
            id: u.id,
            seq: u.seq,
            bytes: u.bytes,
            enqueued_at: u.enqueued_at,
            slots: u
                .slots
                .iter()
                .map(|s| Slot {
                    lane: s.lane,
                    attempts: s.attempts,
                    // The lane's consecutive failures are its head's persisted attempts:
                    // a head changes only when it is resolved, so a yield, a new pass or a
                    // restart does not reset the way to a stall (OL-7).
                    failures: s.attempts,
                    not_sent: 0,
                    phase: if s.served { Phase::Served } else { Phase::Idle },
                    host_waits: false,
                })
                .collect(),
            started: false,
            live: true,
            wait: 0,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.units[i as usize] = unit;
                i
            }
            None => {
                self.units.push(unit);
                u32::try_from(self.units.len() - 1).expect("fewer than 2^32 admitted units")
            }
        };
        self.index.insert(u.id, idx);
        self.admitted += 1;
        self.admitted_bytes += u64::from(u.bytes);
        for s in &u.slots {
            let l = &mut self.lanes[s.lane.index()];
            if l.queue.is_empty() {
                self.occupied += 1;
            }
            l.queue.push_back(idx);
            l.next_from = Seq(u.seq.0.saturating_add(1)).max(l.next_from);
            if u.slots.len() > 1 {
                // A joined unit's lanes waited at it; they may read on.
                self.queue_for_claim(s.lane);
            }
        }
        if self.heads_all(idx) {
            self.ready.push_back((idx, u.id));
        }
    }

    /// Puts `lane` in the claim queue if it may have units to read.
    #[inline]
    pub(super) fn queue_for_claim(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.more && !l.in_claim_queue && !l.stalled && l.planned.is_none() {
            l.in_claim_queue = true;
            if l.remaining >= self.config.max_per_lane && l.level == 0 {
                self.deep_queue.push_back(lane);
            } else if l.queue.is_empty() {
                self.hungry_queue.push_back(lane);
            } else {
                self.claim_queue.push_back(lane);
            }
        }
    }
}
