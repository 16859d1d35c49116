//! Outcomes: what an attempt's answer does to its unit and lane.
//!
//! A 2xx resolves the recipient. A transient or throttled failure retries in the pass,
//! throttles the lane (a Retry-After longer than the ladder's step, OL-6), stalls the lane
//! (the head held in backoff, the rest handed back, OL-7) or, at the attempt limit,
//! dead-letters the unit (blocks a strict lane, OL-8); see
//! [`Scheduler::retry_stall_or_dead_letter`]. A permanent failure dead-letters it, and 410 may
//! retire the lane (OL-9). A unit whose recipients are all resolved leaves its lanes and the
//! window.

use alloc::vec::Vec;
use core::cmp::Reverse;
use core::time::Duration;

use smallvec::SmallVec;

use super::types::{Command, EventError, HoldReason};
use super::{Phase, Scheduler, Timer};
use crate::config::{MAX_BACKOFF_LEVEL, jittered};
use crate::ids::{LaneId, Seq, UnitId};
use crate::outcome::{DeadReason, MIN_DEFERRAL, Outcome};
use crate::time::Timestamp;

impl Scheduler {
    /// The outcome of the attempt started for `unit` on `lane`.
    ///
    /// # Errors
    /// [`EventError`] when no such attempt is in flight (an unknown or finished unit, a
    /// second completion); nothing changes then.
    pub fn handle_outcome(
        &mut self,
        unit: UnitId,
        lane: LaneId,
        outcome: Outcome,
        now: Timestamp,
    ) -> Result<(), EventError> {
        // The input applies to the state the runtime saw: timers that fell due meanwhile
        // fire after it, so a stale answer never lands on a restarted attempt.
        self.set_now(now);
        let (idx, s) = self.in_flight_slot(unit, lane)?;
        self.lanes[lane.index()].in_flight = false;
        self.in_flight -= 1;
        let slot = &mut self.units[idx as usize].slots[s];
        if slot.host_waits {
            slot.host_waits = false;
            self.host_waiting -= 1;
        }
        slot.phase = Phase::Idle;

        match outcome {
            Outcome::Delivered => {
                self.units[idx as usize].slots[s].phase = Phase::Served;
                self.commands.push_back(Command::Delivered { unit, lane });
                self.reopen_lane(lane);
                self.finish_if_resolved(idx);
            }
            Outcome::Throttled { retry_after } => {
                // Free below `max_throttled_level` (OL-5); from it on, a recipient that is
                // still throttling after a stall counts like a failing one, so it ends.
                if self.lanes[lane.index()].level >= self.config.max_throttled_level {
                    self.count_attempt(idx, s);
                    self.retry_stall_or_dead_letter(idx, s, retry_after, true);
                } else {
                    let attempts = self.units[idx as usize].slots[s].attempts;
                    self.commands.push_back(Command::RecordAttempt {
                        unit,
                        lane,
                        attempts,
                        counted: false,
                    });
                    self.retry_stall_or_dead_letter(idx, s, retry_after, false);
                }
            }
            Outcome::Transient { retry_after } => {
                self.count_attempt(idx, s);
                self.retry_stall_or_dead_letter(idx, s, retry_after, true);
            }
            Outcome::Permanent | Outcome::Gone => {
                self.count_attempt(idx, s);
                // The recipient answered: it is up, whatever it thinks of this unit.
                self.reopen_lane(lane);
                let gone = outcome == Outcome::Gone;
                let reason = if gone {
                    DeadReason::Gone
                } else {
                    DeadReason::Permanent
                };
                if self.dead_letter_or_block(idx, s, reason) && gone && self.config.retire_on_gone {
                    self.retire(lane, idx, DeadReason::LaneRetired);
                }
                self.finish_if_resolved(idx);
            }
            Outcome::Refused => {
                self.count_attempt(idx, s);
                self.dead_letter_or_block(idx, s, DeadReason::DestinationRefused);
                self.finish_if_resolved(idx);
            }
            Outcome::NotSent => self.not_sent(idx, s),
            Outcome::Deferred { retry_after } => self.defer(idx, s, retry_after),
            Outcome::Held => self.held_for_host(lane),
            Outcome::SetAside { reason } => {
                // Nothing was sent: no attempt to count.
                self.dead_letter_or_block(idx, s, reason);
                self.finish_if_resolved(idx);
            }
        }
        if !self.fenced.is_empty() {
            // An operator acted on a lane while this attempt was out (OL-14).
            self.settle_fenced();
        }
        self.fire_timers();
        Ok(())
    }

    #[inline]
    pub(super) fn count_attempt(&mut self, idx: u32, s: usize) {
        let u = &mut self.units[idx as usize];
        let slot = &mut u.slots[s];
        slot.attempts = slot.attempts.saturating_add(1);
        self.commands.push_back(Command::RecordAttempt {
            unit: u.id,
            lane: slot.lane,
            attempts: slot.attempts,
            counted: true,
        });
    }

    /// An attempt that never left: retried after the in-pass delay, nothing recorded, the
    /// unit and its lane untouched otherwise.
    pub(super) fn not_sent(&mut self, idx: u32, s: usize) {
        let slot = &mut self.units[idx as usize].slots[s];
        slot.not_sent = slot.not_sent.saturating_add(1);
        let n = slot.not_sent;
        let delay = jittered(
            self.config.retry_delay(n),
            self.config.jitter_percent,
            &mut self.rng,
        );
        let at = self.now + delay;
        let u = &mut self.units[idx as usize];
        u.slots[s].phase = Phase::RetryAt(at);
        self.retry_pending += 1;
        self.timers.push(Reverse((at, Timer::Retry(idx, u.id))));
    }

    /// The attempt `attempt` of `unit` on `lane` (the number its [`Command::Start`] gave)
    /// waits at its host (`waits`: the host's window is full or its pace is not due, OL-21,
    /// OL-23), or goes after such a wait (`!waits`). While it waits it takes no place of the
    /// in-flight bound, so another ready unit may start in its place: a host that holds
    /// back its lanes' attempts (one that has not answered yet, or hangs) does not hold
    /// the places every other host's lanes wait for. When it goes it takes a place again,
    /// even above the bound for a while (the runtime's budget still bounds what is sent);
    /// nothing new starts until the places taken are below the bound.
    ///
    /// The attempt is still in flight either way: its lane stays busy (OL-1), and the pass
    /// waits for its outcome. A report about an attempt that is no longer in flight (its
    /// outcome came first), about another attempt, or that changes nothing, is ignored: the
    /// runtime may report from other threads than the one that reports outcomes.
    ///
    /// [`Command::Start`]: super::Command::Start
    pub fn handle_host_wait(
        &mut self,
        unit: UnitId,
        lane: LaneId,
        attempt: u32,
        waits: bool,
        now: Timestamp,
    ) {
        self.set_now(now);
        let Ok((idx, s)) = self.in_flight_slot(unit, lane) else {
            return;
        };
        let slot = &mut self.units[idx as usize].slots[s];
        if slot.attempts.saturating_add(1) != attempt || slot.host_waits == waits {
            return;
        }
        slot.host_waits = waits;
        if waits {
            self.host_waiting += 1;
            self.start_ready();
        } else {
            self.host_waiting -= 1;
        }
    }

    /// The unit's slab index and the slot of `lane` in it, for an attempt in flight.
    fn in_flight_slot(&self, unit: UnitId, lane: LaneId) -> Result<(u32, usize), EventError> {
        let &idx = self.index.get(&unit).ok_or(EventError::UnknownUnit(unit))?;
        let s = self.units[idx as usize]
            .slots
            .iter()
            .position(|s| s.lane == lane)
            .ok_or(EventError::UnknownLane(unit, lane))?;
        if self.units[idx as usize].slots[s].phase != Phase::InFlight {
            return Err(EventError::NotInFlight(unit, lane));
        }
        Ok((idx, s))
    }

    /// An attempt its host deferred (origin health, an operator's hold): nothing was sent, so
    /// nothing is counted and the lane's backoff level stays; the lane waits `retry_after`
    /// (at least [`MIN_DEFERRAL`]) with its `not_before` persisted, its head held and its
    /// other units handed back, as on a stall.
    pub(super) fn defer(&mut self, idx: u32, s: usize, retry_after: Duration) {
        let lane = self.units[idx as usize].slots[s].lane;
        self.throttle_lane(lane, self.now + retry_after.max(MIN_DEFERRAL));
        self.hold_stalled(idx, s);
    }

    /// Makes `lane` wait until `t` (or longer, if it waits longer already) at its level, with
    /// its throttle mark: a throttle's Retry-After or a host's deferral, persisted.
    fn throttle_lane(&mut self, lane: LaneId, t: Timestamp) {
        let l = &mut self.lanes[lane.index()];
        let t = l.not_before.map_or(t, |old| old.max(t));
        l.not_before = Some(t);
        l.throttled_here = true;
        let level = l.level;
        self.timers.push(Reverse((t, Timer::Lane(lane.0))));
        self.commands.push_back(Command::LaneBackoff {
            lane,
            not_before: t,
            level,
        });
    }

    /// A transient or throttled failure of slot `s` of unit `idx`: retry it in the pass,
    /// throttle its lane, stall the lane (OL-7) or, once its attempts are exhausted,
    /// dead-letter it (OL-8).
    ///
    /// Which one is decided from the answer, the counts and the persisted lane state only,
    /// never from the jitter (OL-6, OL-7):
    /// - a Retry-After (capped) no longer than the ladder's delay for this failure *before
    ///   jitter* — or none — is waited in the pass: the retry comes after the longer of it
    ///   and the jittered delay, so `Retry-After: 0` cannot make a tight loop, and a
    ///   `Retry-After: 1` after a first failure is a retry 1 s to 1.2 s later, every time;
    /// - a longer one throttles the lane: its `not_before` is set at once (level 0), and the
    ///   pass may end without it;
    /// - the lane stalls (the head held, level + 1) at the `pass_attempts`-th failure in a
    ///   row, at any failure in probe mode, and at an uncounted throttle of a lane still
    ///   throttled by an earlier pass (its level-0 `not_before`, which no answer has
    ///   cleared). An uncounted throttle is not in the persisted attempts, so a pass
    ///   boundary would lose it: the lane's throttle mark carries it instead (a pass that
    ///   ends on a throttle's retry leaves one, [`Scheduler::handle_pass_end`]). So at most
    ///   `pass_attempts` throttles in a row are free, whatever their Retry-After and however
    ///   the passes are sliced; then the lane is in probe mode, where they count (OL-5).
    pub(super) fn retry_stall_or_dead_letter(
        &mut self,
        idx: u32,
        s: usize,
        retry_after: Option<Duration>,
        counted: bool,
    ) {
        let lane = self.units[idx as usize].slots[s].lane;
        if counted && self.note_failure(lane) {
            // Failing for longer than allowed: everything of the lane goes, together (OL-8).
            self.lane_unavailable(idx, s, retry_after);
            return;
        }
        let probe = self.lanes[lane.index()].level > 0;
        // Only an uncounted throttle's count is lost at a pass end: its mark carries it.
        let throttled_before = !counted && self.lanes[lane.index()].throttled_before();
        let retry_after = retry_after.map(|d| d.min(self.config.retry_after_cap));
        let slot = &mut self.units[idx as usize].slots[s];
        let exhausted = counted && slot.attempts >= self.config.max_attempts;
        if !probe && !exhausted {
            slot.failures += 1;
        }
        let failures = slot.failures;
        // The ladder's delay before jitter bounds what the pass waits for (OL-6).
        let ladder = self.config.retry_delay(failures);
        let throttles_lane = retry_after.is_some_and(|ra| ra > ladder);
        let stall =
            probe || (!exhausted && (failures >= self.config.pass_attempts || throttled_before));
        let mut retry_at = None;
        if stall {
            // A failed probe, or the stall itself, puts the lane one backoff level further.
            self.extend_backoff(lane, retry_after);
        } else if let Some(ra) = retry_after.filter(|_| throttles_lane) {
            // Longer than the pass waits: the lane's not_before, at once (OL-6).
            self.throttle_lane(lane, self.now + ra);
        } else {
            // The in-pass retry: after the ladder's delay, or the Retry-After if it is longer.
            let delay = jittered(ladder, self.config.jitter_percent, &mut self.rng);
            let delay = retry_after.map_or(delay, |ra| ra.max(delay));
            retry_at = Some(self.now + delay);
        }
        if exhausted {
            if self.dead_letter_or_block(idx, s, DeadReason::Exhausted) {
                // The next unit gets a schedule of its own, not the probes this one reached.
                self.restart_lane(lane);
            }
            self.finish_if_resolved(idx);
            return;
        }
        if stall {
            self.hold_stalled(idx, s);
            return;
        }
        // Without a retry time the lane's not_before governs; its timer brings the unit back.
        if let Some(at) = retry_at {
            let u = &mut self.units[idx as usize];
            u.slots[s].phase = Phase::RetryAt(at);
            self.retry_pending += 1;
            self.timers.push(Reverse((at, Timer::Retry(idx, u.id))));
        }
    }

    /// A counted failure on `lane`: the start of a run of failures is noted (and persisted);
    /// returns whether the run has lasted longer than
    /// [`Config::lane_unavailable_after`](crate::config::Config::lane_unavailable_after).
    fn note_failure(&mut self, lane: LaneId) -> bool {
        let now = self.now;
        let l = &mut self.lanes[lane.index()];
        let since = match l.failing_since {
            Some(since) => since,
            None => {
                l.failing_since = Some(now);
                self.commands.push_back(Command::LaneFailing {
                    lane,
                    since: Some(now),
                });
                now
            }
        };
        self.config
            .lane_unavailable_after
            .is_some_and(|after| now.saturating_duration_since(since) >= after)
    }

    /// Slot `s` of unit `idx` failed on a lane failing for longer than allowed (OL-8): the
    /// lane is marked unavailable (once per run), it backs off as after a failed probe, the
    /// unit is dead-lettered `lane_unavailable` (a strict lane blocks on it instead) and so
    /// is every other pending unit of the lane, together. Units that reach the lane later
    /// wait for its next probe: an answer makes it available again, a failure sets them
    /// aside too.
    fn lane_unavailable(&mut self, idx: u32, s: usize, retry_after: Option<Duration>) {
        let lane = self.units[idx as usize].slots[s].lane;
        let l = &mut self.lanes[lane.index()];
        if !l.unavailable {
            l.unavailable = true;
            let since = l.failing_since.unwrap_or(self.now);
            self.commands
                .push_back(Command::LaneUnavailable { lane, since });
        }
        let retry_after = retry_after.map(|d| d.min(self.config.retry_after_cap));
        self.extend_backoff(lane, retry_after);
        if self.dead_letter_or_block(idx, s, DeadReason::LaneUnavailable) {
            self.retire(lane, idx, DeadReason::LaneUnavailable);
        }
        self.finish_if_resolved(idx);
    }

    /// `lane`'s head was dead-lettered after its attempts (OL-8): the lane starts over at
    /// level 0 with no backoff, so its next unit is tried on a schedule of its own; its run
    /// of failures goes on (the unavailable rule counts from its start).
    fn restart_lane(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.level == 0 && l.not_before.is_none() {
            return;
        }
        l.level = 0;
        l.not_before = None;
        l.throttled_here = false;
        self.commands.push_back(Command::LaneRestart { lane });
        self.queue_for_claim(lane);
    }

    /// Puts `lane` in backoff one level further (up to [`MAX_BACKOFF_LEVEL`]) for the lane
    /// backoff of that level, or the Retry-After if it is longer, and persists it.
    pub(super) fn extend_backoff(&mut self, lane: LaneId, retry_after: Option<Duration>) {
        let l = &mut self.lanes[lane.index()];
        l.level = l.level.saturating_add(1).min(MAX_BACKOFF_LEVEL);
        let level = l.level;
        let backoff = jittered(
            self.config.lane_backoff(level),
            self.config.jitter_percent,
            &mut self.rng,
        );
        let delay = retry_after.map_or(backoff, |ra| ra.max(backoff));
        let t = self.now + delay;
        let l = &mut self.lanes[lane.index()];
        l.not_before = Some(t);
        self.timers.push(Reverse((t, Timer::Lane(lane.0))));
        self.commands.push_back(Command::LaneBackoff {
            lane,
            not_before: t,
            level,
        });
    }

    /// Holds a stalled unit at its lane's head and hands back the lane's other units (OL-7).
    pub(super) fn hold_stalled(&mut self, idx: u32, s: usize) {
        let u = &mut self.units[idx as usize];
        u.slots[s].phase = Phase::Stalled;
        let (unit, lane) = (u.id, u.slots[s].lane);
        let l = &mut self.lanes[lane.index()];
        l.stalled = true;
        if let Some(t) = l.not_before.filter(|&t| t > self.now) {
            // Its head may make room for lanes with work while it waits (`poll_claim`).
            self.held.push((t, lane));
        }
        self.commands.push_back(Command::Hold {
            unit,
            lane,
            reason: HoldReason::Stalled,
        });
        self.hand_back_behind(lane);
    }

    /// Dead-letters `idx` for slot `s`, or blocks the lane if it is strict. Returns whether
    /// it was dead-lettered.
    pub(super) fn dead_letter_or_block(&mut self, idx: u32, s: usize, reason: DeadReason) -> bool {
        let u = &mut self.units[idx as usize];
        let (unit, lane) = (u.id, u.slots[s].lane);
        if self.lanes[lane.index()].strict {
            u.slots[s].phase = Phase::Blocked;
            let l = &mut self.lanes[lane.index()];
            l.blocked = true;
            l.stalled = true;
            self.commands.push_back(Command::Hold {
                unit,
                lane,
                reason: HoldReason::Blocked,
            });
            self.hand_back_behind(lane);
            return false;
        }
        u.slots[s].phase = Phase::Dead;
        self.commands
            .push_back(Command::DeadLetter { unit, lane, reason });
        let l = &mut self.lanes[lane.index()];
        if l.stalled {
            // The stalled head is gone; the lane moves on (still in backoff if it is).
            l.stalled = false;
            self.queue_for_claim(lane);
        }
        true
    }

    /// 410 Gone with `retire_on_gone`, or a lane found unavailable: every pending unit of
    /// `lane` is dead-lettered by the store with `reason`; here they are dropped from the
    /// lane.
    pub(super) fn retire(&mut self, lane: LaneId, head: u32, reason: DeadReason) {
        self.commands
            .push_back(Command::RetireLane { lane, reason });
        // A joined unit this lane's read reached but that is not admitted yet lost this
        // recipient too: it must not be posted to it when it is admitted. First: a unit
        // finished below frees room, which admits complete joined units at once.
        for r in self.joined.values_mut() {
            for slot in r.admit.slots.iter_mut().filter(|s| s.lane == lane) {
                slot.served = true;
            }
        }
        let queued: Vec<u32> = self.lanes[lane.index()].queue.iter().copied().collect();
        for idx in queued {
            if idx == head {
                continue;
            }
            for slot in self.units[idx as usize].slots.iter_mut() {
                if slot.lane == lane && !slot.phase.resolved() {
                    slot.phase = Phase::Dead;
                }
            }
            self.finish_if_resolved(idx);
        }
        let l = &mut self.lanes[lane.index()];
        l.more = false;
        l.remaining = 0;
    }

    /// A recipient answered on `lane`: end its backoff, or its throttle (a `not_before` at
    /// level 0: the next throttle is a first one again, OL-7).
    pub(super) fn reopen_lane(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.failing_since.is_some() || l.unavailable {
            // The run of failures ends: the lane is available again.
            l.failing_since = None;
            l.unavailable = false;
            self.commands
                .push_back(Command::LaneFailing { lane, since: None });
        }
        let l = &mut self.lanes[lane.index()];
        if l.level > 0 || l.stalled || l.not_before.is_some() {
            l.level = 0;
            l.not_before = None;
            l.stalled = false;
            l.throttled_here = false;
            self.commands.push_back(Command::LaneOpen { lane });
            self.queue_for_claim(lane);
        }
    }

    /// Finishes unit `idx` if every recipient of it is delivered or dead-lettered.
    #[inline]
    pub(super) fn finish_if_resolved(&mut self, idx: u32) {
        let u = &self.units[idx as usize];
        if u.live && u.slots.iter().all(|s| s.phase.resolved()) {
            self.finish_unit(idx);
        }
    }

    /// Removes a finished unit: its lanes move on.
    pub(super) fn finish_unit(&mut self, idx: u32) {
        let lanes: SmallVec<[LaneId; 4]> = self.units[idx as usize]
            .slots
            .iter()
            .map(|s| s.lane)
            .collect();
        for lane in lanes {
            self.remove_from_lane(lane, idx);
            let l = &mut self.lanes[lane.index()];
            l.remaining = l.remaining.saturating_sub(1);
            if let Some(&head) = self.lanes[lane.index()].queue.front() {
                self.ready.push_back((head, self.units[head as usize].id));
            }
            self.queue_for_claim(lane);
        }
        self.leave_window(idx);
    }

    /// Takes unit `idx` out of `lane`'s admitted units.
    #[inline]
    pub(super) fn remove_from_lane(&mut self, lane: LaneId, idx: u32) {
        let q = &mut self.lanes[lane.index()].queue;
        let was_empty = q.is_empty();
        if q.front() == Some(&idx) {
            q.pop_front();
        } else if let Some(p) = q.iter().position(|&i| i == idx) {
            q.remove(p);
        }
        if !was_empty && q.is_empty() {
            self.occupied -= 1;
        }
    }

    /// Unit `idx` leaves the window (finished or handed back): its room goes to the complete
    /// joined units waiting for it, then to the lanes that waited for room.
    pub(super) fn leave_window(&mut self, idx: u32) {
        let u = &mut self.units[idx as usize];
        u.live = false;
        if u.wait != 0 {
            // It waited for a place: its entry is stale now.
            u.wait = 0;
            self.start_queue.live -= 1;
        }
        for s in u.slots.iter() {
            if let Phase::RetryAt(_) = s.phase {
                self.retry_pending -= 1;
            }
        }
        self.index.remove(&u.id);
        self.admitted -= 1;
        self.admitted_bytes -= u64::from(u.bytes);
        self.free.push(idx);
        if !self.complete_joined.is_empty() {
            self.admit_complete_joined();
        }
        if !self.room_waiters.is_empty() {
            for lane in core::mem::take(&mut self.room_waiters) {
                self.lanes[lane.index()].room_wait = false;
                self.lanes[lane.index()].more = true;
                self.queue_for_claim(lane);
            }
        }
    }

    /// Hands back every unit behind `lane`'s head, and with them every unit that, through a
    /// joined unit, waits behind one of them in another lane.
    pub(super) fn hand_back_behind(&mut self, lane: LaneId) {
        let l = &self.lanes[lane.index()];
        if l.queue.len() <= 1 || self.leaves_for_fence(l.queue[0]) {
            // (A head that goes back for an operator's action takes them along, in one batch.)
            return;
        }
        let l = &mut self.lanes[lane.index()];
        let victims: Vec<u32> = l.queue.drain(1..).collect();
        self.hand_back(victims);
    }

    /// Hands back `victims` (units with no attempt in flight) and every unit behind one of
    /// them in any of its lanes; a victim still in a lane's queue leaves it from its position
    /// on.
    pub(super) fn hand_back(&mut self, mut victims: Vec<u32>) {
        let mut touched: SmallVec<[LaneId; 8]> = SmallVec::new();
        let mut i = 0;
        while i < victims.len() {
            let v = victims[i];
            i += 1;
            if !self.units[v as usize].live {
                continue;
            }
            self.units[v as usize].live = false;
            let seq = self.units[v as usize].seq;
            let lanes: SmallVec<[LaneId; 4]> = self.units[v as usize]
                .slots
                .iter()
                .map(|s| s.lane)
                .collect();
            for m in lanes {
                let ml = &mut self.lanes[m.index()];
                if let Some(p) = ml.queue.iter().position(|&x| x == v) {
                    victims.extend(ml.queue.drain(p..).skip(1));
                    if ml.queue.is_empty() {
                        self.occupied -= 1;
                    }
                }
                ml.next_from = ml.next_from.min(seq);
                ml.more = true;
                if let Some(j) = ml.waiting_on.take() {
                    // It will read up to that joined unit again, behind the units handed back.
                    if let Some(r) = self.joined.get_mut(&j) {
                        r.lanes.retain(|x| *x != m);
                    }
                }
                if !touched.contains(&m) {
                    touched.push(m);
                }
            }
        }
        let mut handed: Vec<(Seq, UnitId, u32)> = victims
            .iter()
            .map(|&v| (self.units[v as usize].seq, self.units[v as usize].id, v))
            .collect();
        handed.sort_unstable();
        handed.dedup();
        for (_, id, v) in handed {
            self.units[v as usize].live = true;
            self.leave_window(v);
            self.commands.push_back(Command::HandBack { unit: id });
        }
        // Lanes that lost units may read them again when they can.
        for m in touched {
            self.queue_for_claim(m);
        }
    }
}
