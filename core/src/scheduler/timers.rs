//! Time: the clock the inputs bring, and the timers of in-pass retries, lane backoffs and
//! paced lanes (OL-23).
//!
//! Time only moves forward (a clock that steps back is clamped). Every input that takes `now`
//! first fires the timers due by then, so the state a runtime sees is never behind its clock;
//! [`Scheduler::is_done`] only reads. Timers are a heap of deadlines; one whose state changed
//! since (a lane reopened, a unit left) is stale and skipped.

use core::cmp::Reverse;

use super::{Phase, Scheduler, Timer};
use crate::ids::LaneId;
use crate::time::Timestamp;

impl Scheduler {
    /// Time passed: fires every due timer.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.advance_to(now);
        self.start_ready();
    }

    /// The earliest deadline (an in-pass retry, a lane whose backoff ends, a paced lane that
    /// may start again) at which
    /// [`Scheduler::handle_timeout`] should be called.
    pub fn poll_timeout(&mut self) -> Option<Timestamp> {
        while let Some(&Reverse((t, timer))) = self.timers.peek() {
            if self.timer_valid(t, timer) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }

    /// Whether a live timer is due by `now`: one that [`Scheduler::handle_timeout`] would
    /// fire. After an input at `now` every due timer has fired and this is one peek at the
    /// heap; only a later `now` looks further.
    pub(super) fn timer_due(&self, now: Timestamp) -> bool {
        match self.timers.peek() {
            Some(&Reverse((t, _))) if t <= now => self
                .timers
                .iter()
                .any(|&Reverse((t, timer))| t <= now && self.timer_valid(t, timer)),
            _ => false,
        }
    }

    /// Whether `timer` at `t` still means something: the lane's backoff still ends then, or
    /// the unit is still admitted and a recipient of it still retries then.
    #[inline]
    pub(super) fn timer_valid(&self, t: Timestamp, timer: Timer) -> bool {
        match timer {
            Timer::Lane(l) => self.lanes[l as usize].not_before == Some(t),
            Timer::Retry(idx, id) => {
                let u = &self.units[idx as usize];
                u.live && u.id == id && u.slots.iter().any(|s| s.phase == Phase::RetryAt(t))
            }
            Timer::Pace(l) => {
                let l = &self.lanes[l as usize];
                l.pace_wait && l.next_start == Some(t)
            }
        }
    }

    /// Sets `lane`'s pace to `pace` and its next start to no earlier than `until` (a start
    /// of an earlier pass); a head waiting for the pace waits for the new time.
    pub(super) fn set_pace(
        &mut self,
        lane: LaneId,
        pace: Option<core::time::Duration>,
        until: Option<Timestamp>,
    ) {
        let l = &mut self.lanes[lane.index()];
        l.pace = pace;
        let next = l.next_start.max(until);
        if next != l.next_start {
            l.next_start = next;
            if l.pace_wait {
                if let Some(t) = next {
                    self.timers.push(Reverse((t, Timer::Pace(lane.0))));
                }
            }
        }
    }

    /// `lane`'s head could start but for its pace: it starts at `next_start`.
    pub(super) fn wait_for_pace(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.pace_wait {
            return;
        }
        if let Some(t) = l.next_start {
            l.pace_wait = true;
            self.paced += 1;
            self.timers.push(Reverse((t, Timer::Pace(lane.0))));
        }
    }

    /// Moves time forward (never backward) and fires due timers.
    #[inline]
    pub(super) fn advance_to(&mut self, now: Timestamp) {
        self.set_now(now);
        self.fire_timers();
    }

    /// Moves time forward, never backward (a clock that steps back is clamped).
    #[inline]
    pub(super) fn set_now(&mut self, now: Timestamp) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Fires every timer due at `self.now`, then starts what may start.
    pub(super) fn fire_timers(&mut self) {
        while let Some(&Reverse((t, timer))) = self.timers.peek() {
            if t > self.now {
                break;
            }
            self.timers.pop();
            if !self.timer_valid(t, timer) {
                continue;
            }
            match timer {
                Timer::Lane(l) => {
                    let lane = LaneId(l);
                    let ll = &mut self.lanes[l as usize];
                    if ll.level > 0 {
                        ll.not_before = None;
                    }
                    // At level 0 it stays, past: the end of a throttle is not an answer, and
                    // the lane stays throttled until one comes (OL-7), here as in the store.
                    if let Some(&head) = ll.queue.front() {
                        let u = &mut self.units[head as usize];
                        for s in u.slots.iter_mut() {
                            if s.lane == lane && s.phase == Phase::Stalled {
                                // The probe (OL-11).
                                s.phase = Phase::Idle;
                            }
                        }
                        self.ready.push_back((head, u.id));
                    }
                    self.queue_for_claim(lane);
                }
                Timer::Pace(l) => {
                    let ll = &mut self.lanes[l as usize];
                    ll.pace_wait = false;
                    self.paced -= 1;
                    if let Some(&head) = ll.queue.front() {
                        self.ready.push_back((head, self.units[head as usize].id));
                    }
                }
                Timer::Retry(idx, id) => {
                    let u = &mut self.units[idx as usize];
                    for s in u.slots.iter_mut() {
                        if s.phase == Phase::RetryAt(t) {
                            s.phase = Phase::Idle;
                            self.retry_pending -= 1;
                        }
                    }
                    self.ready.push_back((idx, id));
                }
            }
        }
        self.start_ready();
    }
}
