//! Starts: which ready units start now.
//!
//! A unit is ready when it heads every lane it occupies. It first starts only when every lane
//! it still needs is open, idle and not blocked (OL-1), and as a whole: a unit wider than
//! `max_in_flight` starts alone. Units held up by the in-flight bound go first next time. A
//! lane with a rate limit starts its next attempt no sooner than its pace after the last
//! (OL-23): its head waits for a pace timer.

use smallvec::SmallVec;

use super::types::Command;
use super::{Phase, Scheduler};
use crate::ids::LaneId;
use crate::outcome::DeadReason;

impl Scheduler {
    /// Starts every unit that may start, units held up by the in-flight bound first.
    pub(super) fn start_ready(&mut self) {
        if self.stopping {
            return;
        }
        while self.in_flight < self.config.max_in_flight || self.in_flight == 0 {
            let Some((idx, id)) = self
                .capacity_wait
                .pop_front()
                .or_else(|| self.ready.pop_front())
            else {
                break;
            };
            let u = &self.units[idx as usize];
            if !u.live || u.id != id {
                continue;
            }
            if !self.try_start(idx) {
                self.capacity_wait.push_front((idx, id));
                break;
            }
        }
    }

    /// Starts what it can of unit `idx`; returns false if it was held up by the in-flight
    /// bound only.
    pub(super) fn try_start(&mut self, idx: u32) -> bool {
        let now = self.now;
        if !self.heads_all(idx) {
            return true;
        }
        let u = &self.units[idx as usize];
        let mut startable: SmallVec<[usize; 4]> = SmallVec::new();
        let mut paced: SmallVec<[LaneId; 1]> = SmallVec::new();
        let mut held_up = false;
        for (i, s) in u.slots.iter().enumerate() {
            let l = &self.lanes[s.lane.index()];
            let due = match s.phase {
                Phase::Idle => true,
                Phase::RetryAt(t) => t <= now,
                Phase::InFlight | Phase::Stalled | Phase::Blocked | Phase::Served | Phase::Dead => {
                    false
                }
            };
            let lane_ok = l.open(now) && !l.in_flight && !l.blocked && !l.paused && !l.fenced;
            // OL-23: a rate-limited lane starts no sooner than its pace allows.
            let on_pace = l.next_start.is_none_or(|t| t <= now);
            if due && lane_ok && on_pace {
                startable.push(i);
                continue;
            }
            if due && lane_ok {
                paced.push(s.lane);
            }
            if !u.started && !s.phase.resolved() {
                // OL-1: a unit first starts only when every lane it still needs is ready.
                held_up = true;
            }
        }
        for lane in paced {
            self.wait_for_pace(lane);
        }
        if held_up {
            return true;
        }
        if startable.is_empty() {
            return true;
        }
        let u = &self.units[idx as usize];
        if !u.started {
            if let Some(max_age) = self.config.max_age {
                if now.saturating_duration_since(u.enqueued_at) > max_age {
                    for i in startable {
                        self.dead_letter_or_block(idx, i, DeadReason::Expired);
                    }
                    self.finish_if_resolved(idx);
                    return true;
                }
            }
        }
        let room = self.config.max_in_flight.saturating_sub(self.in_flight);
        let mut partial = false;
        if startable.len() > room {
            if !u.started {
                // A unit starts as a whole; one wider than the bound starts alone.
                if self.in_flight > 0 {
                    return false;
                }
            } else {
                if room == 0 {
                    return false;
                }
                startable.truncate(room);
                partial = true;
            }
        }
        let u = &mut self.units[idx as usize];
        u.started = true;
        let id = u.id;
        for i in startable {
            let slot = &mut u.slots[i];
            if let Phase::RetryAt(_) = slot.phase {
                self.retry_pending -= 1;
            }
            slot.phase = Phase::InFlight;
            let l = &mut self.lanes[slot.lane.index()];
            l.in_flight = true;
            if let Some(pace) = l.pace {
                l.next_start = Some(now.saturating_add(pace));
            }
            self.in_flight += 1;
            self.commands.push_back(Command::Start {
                unit: id,
                lane: slot.lane,
                attempt: slot.attempts.saturating_add(1),
            });
        }
        !partial
    }
}
