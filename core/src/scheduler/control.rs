//! Operator actions that reach a running pass (OL-14).
//!
//! An operator's pause, purge, skip-head or strict (and resume, retry, unstrict) changes a
//! lane in the store while a pass holds units of it in its window, read before the action.
//! [`Scheduler::handle_lane_control`] makes the scheduler forget them: every admitted unit of
//! the lane goes back to the store (a hand-back writes nothing, OL-10), the lane starts
//! nothing more of what it held, and it is read again from the store — which answers with the
//! action applied (nothing while it is paused, no purged or skipped unit). The one thing that
//! cannot go back is an attempt already in flight: the lane is *fenced* until it ends, and
//! its unit is then handed back too unless its outcome resolved it.

use alloc::vec::Vec;
use core::cmp::Reverse;

use smallvec::SmallVec;

use super::types::LaneControl;
use super::{Phase, Scheduler, Timer};
use crate::config::MAX_BACKOFF_LEVEL;
use crate::ids::{LaneId, Seq};
use crate::time::Timestamp;

impl Scheduler {
    /// An operator acted on `lane` while the pass ran; `control` is its state read from the
    /// store after the action.
    ///
    /// Every admitted unit of the lane that has no attempt in flight is handed back at once
    /// (in enqueue order, with the units that wait behind them in other lanes through a joined
    /// unit), and nothing more of the lane starts from what the pass had read: the lane is read
    /// again from the store — not at all while `control.paused`. If its head has an attempt in
    /// flight, that attempt finishes and is recorded as usual, the lane reads and starts
    /// nothing until then, and the unit is handed back after its outcome unless that resolved
    /// it. The lane's strict mode is `control`'s at once; its backoff is `control`'s once the
    /// lane holds nothing.
    ///
    /// Call it before any start that the runtime has not sent yet: an attempt the scheduler
    /// started but the runtime did not send is first reported as
    /// [`Outcome::NotSent`](crate::Outcome::NotSent), so that it is handed back too.
    pub fn handle_lane_control(&mut self, lane: LaneId, control: LaneControl, now: Timestamp) {
        // Nothing due fires before the lane is fenced: it must not start anything.
        self.set_now(now);
        if self.lanes.get(lane.index()).is_none() {
            return;
        }
        self.set_pace(lane, control.info.pace, control.info.paced_until);
        let l = &mut self.lanes[lane.index()];
        l.strict = control.info.strict;
        l.paused = control.paused;
        if l.planned.is_some() {
            // A read answered from before the action: its answer is dropped (as after a
            // hand-back) and the lane read again.
            l.planned_from = Seq(u64::MAX);
        }
        if !l.fenced {
            l.fenced = true;
            self.fenced.push(lane);
        }
        self.forget_reached(lane);
        let head = self.lanes[lane.index()].queue.front().copied();
        if let Some(head) = head {
            let flying = self.units[head as usize]
                .slots
                .iter()
                .any(|s| s.phase == Phase::InFlight);
            if flying {
                self.hand_back_behind(lane);
            } else {
                self.hand_back(Vec::from([head]));
            }
        }
        self.settle_fenced();
        let l = &mut self.lanes[lane.index()];
        if !l.fenced {
            // It holds nothing: the store's state is the lane's, a stall or a strict block of
            // the pass included (a block is a pause in the store).
            l.stalled = false;
            l.blocked = false;
            l.not_before = control.info.not_before;
            l.level = control.info.level.min(MAX_BACKOFF_LEVEL);
            l.failing_since = control.info.failing_since;
            l.unavailable = control.info.unavailable;
            l.known = true;
            if let Some(t) = l.not_before.filter(|&t| t > self.now) {
                self.timers.push(Reverse((t, Timer::Lane(lane.0))));
            }
        }
        self.lanes[lane.index()].more = control.pending;
        self.queue_for_claim(lane);
        self.fire_timers();
    }

    /// An attempt of `lane` found its host held by an operator ([`Outcome::Held`]): the lane
    /// is paused in the pass, as by the operator's pause of it, with its state otherwise as
    /// the pass knows it; the runtime persists the pause.
    ///
    /// [`Outcome::Held`]: crate::Outcome::Held
    pub(super) fn held_for_host(&mut self, lane: LaneId) {
        let l = &self.lanes[lane.index()];
        let control = LaneControl {
            info: crate::scheduler::LaneInfo {
                not_before: l.not_before,
                level: l.level,
                strict: l.strict,
                failing_since: l.failing_since,
                unavailable: l.unavailable,
                pace: l.pace,
                paced_until: l.next_start,
                pending: l.remaining,
            },
            paused: true,
            pending: true,
        };
        self.handle_lane_control(lane, control, self.now);
    }

    /// Joined units the reads of `lane` reached but that are not admitted yet were read before
    /// the action: each is forgotten, and every lane that reached it reads up to it again
    /// (fresh, so that a recipient purged meanwhile is not served).
    fn forget_reached(&mut self, lane: LaneId) {
        let stale: Vec<_> = self
            .joined
            .iter()
            .filter(|(_, r)| r.admit.slots.iter().any(|s| s.lane == lane))
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            let Some(r) = self.joined.remove(&id) else {
                continue;
            };
            for m in r.lanes {
                let ml = &mut self.lanes[m.index()];
                if ml.waiting_on == Some(id) {
                    ml.waiting_on = None;
                }
                ml.next_from = ml.next_from.min(r.admit.seq);
                ml.more = true;
                self.queue_for_claim(m);
            }
        }
    }

    /// Whether unit `idx` is about to go back for an operator's action: it occupies a fenced
    /// lane and has no attempt in flight any more.
    pub(super) fn leaves_for_fence(&self, idx: u32) -> bool {
        if self.fenced.is_empty() {
            return false;
        }
        let u = &self.units[idx as usize];
        u.live
            && u.slots.iter().all(|s| s.phase != Phase::InFlight)
            && u.slots.iter().any(|s| self.lanes[s.lane.index()].fenced)
    }

    /// Hands back the head of each fenced lane once its attempt is over (unless it left), and
    /// lifts the fence of each lane that holds nothing any more: it is read again.
    pub(super) fn settle_fenced(&mut self) {
        let mut i = 0;
        while i < self.fenced.len() {
            let lane = self.fenced[i];
            if let Some(&head) = self.lanes[lane.index()].queue.front() {
                if self.leaves_for_fence(head) {
                    let lanes: SmallVec<[LaneId; 4]> = self.units[head as usize]
                        .slots
                        .iter()
                        .map(|s| s.lane)
                        .collect();
                    self.hand_back(Vec::from([head]));
                    for m in lanes {
                        // A stall of this last attempt held it in another lane of it: that
                        // lane keeps its backoff, and probes when it ends.
                        let ml = &mut self.lanes[m.index()];
                        if ml.queue.is_empty() && ml.stalled && !ml.blocked && !ml.fenced {
                            ml.stalled = false;
                            self.queue_for_claim(m);
                        }
                    }
                }
            }
            let l = &mut self.lanes[lane.index()];
            if l.queue.is_empty() {
                // A stall of its last attempt held the head that went back: the lane keeps
                // the backoff (its next read is a probe); a strict block keeps it closed for
                // the pass, as it would have.
                l.fenced = false;
                l.stalled = l.blocked;
                self.fenced.swap_remove(i);
                self.queue_for_claim(lane);
            } else {
                i += 1;
            }
        }
    }
}
