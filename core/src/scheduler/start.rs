//! Starts: which ready units start now, and in which order when places are scarce.
//!
//! A unit is ready when it heads every lane it occupies. It first starts only when every lane
//! it still needs is open, idle and not blocked (OL-1). A lane with a rate limit starts its
//! next attempt no sooner than its pace after the last (OL-23): its head waits for a pace
//! timer.
//!
//! # Who gets a free place
//!
//! While the in-flight bound (`max_in_flight`) has room, ready units start in the order they
//! became ready. The bound counts the places taken: attempts in flight but those their host
//! holds back ([`Scheduler::handle_host_wait`]), which wait at the host's gate for its window
//! or pace and would otherwise keep every other host's lanes from starting. When it binds, the units that could start wait in a [`StartQueue`], and each
//! place that frees goes to the unit with the **most work left in its lanes** (a lane's units
//! the store held when the pass discovered it, less those finished since, counted when the
//! unit starts to wait: its serial chain),
//! ties in the order they came; every [`AGING`]-th place goes to the unit waiting longest
//! instead, so no unit waits more than [`AGING`] times as many places as it would first come,
//! first served. A drain's makespan is at least its deepest lane's chain; serving that lane's
//! next head first, rather than behind the heads of a thousand one-row lanes, keeps the
//! chain moving, and the one-row lanes lose at most one place in [`AGING`] to it.
//!
//! A joined unit starts as a whole: one that needs more places than are free goes first when
//! places free and nothing starts before it; one wider than the bound starts alone (OL-1).

use alloc::collections::{BinaryHeap, VecDeque};
use core::cmp::Reverse;

use smallvec::SmallVec;

use super::types::Command;
use super::{Phase, Scheduler};
use crate::ids::{LaneId, UnitId};
use crate::outcome::DeadReason;

/// Every `AGING`-th free place goes to the unit that has waited longest for one.
pub(super) const AGING: u64 = 4;

/// Units that could start but for the in-flight bound (see the module doc): a heap by
/// weight, and the same entries in the order they came. An entry is live while its unit's
/// `wait` holds its number; one taken from either side leaves its twin stale, skipped when it
/// comes up.
#[derive(Debug, Default)]
pub(super) struct StartQueue {
    /// (weight, earliest first, entry, unit slot, unit).
    heap: BinaryHeap<(u32, Reverse<u64>, u32, UnitId)>,
    /// (entry, unit slot, unit), oldest first.
    fifo: VecDeque<(u64, u32, UnitId)>,
    /// The last entry number given (entry numbers start at 1: a unit's `wait` of 0 is none).
    last: u64,
    /// Places given out from the queue.
    picks: u64,
    /// Live entries.
    pub(super) live: usize,
    /// A joined unit held up by the bound: it goes before any entry (see
    /// [`Scheduler::start_ready`]).
    first: Option<(u32, UnitId)>,
}

impl StartQueue {
    pub(super) fn is_empty(&self) -> bool {
        self.live == 0 && self.first.is_none()
    }

    pub(super) fn clear(&mut self) {
        self.heap.clear();
        self.fifo.clear();
        self.live = 0;
        self.first = None;
    }
}

impl Scheduler {
    /// Starts every unit that may start; when the in-flight bound binds, the units that could
    /// start wait in [`Scheduler::start_queue`] and take the places that free by its order.
    pub(super) fn start_ready(&mut self) {
        if self.stopping {
            return;
        }
        loop {
            let taken = self.places_taken();
            if taken >= self.config.max_in_flight && taken > 0 {
                // No place: what is ready waits by weight.
                self.queue_ready();
                return;
            }
            let next = if let Some(first) = self.start_queue.first.take() {
                Some(first)
            } else if self.start_queue.is_empty() {
                self.ready.pop_front()
            } else {
                // Places are scarce: everything ready competes for this one.
                self.queue_ready();
                self.pick_waiting()
            };
            let Some((idx, id)) = next else {
                return;
            };
            let u = &self.units[idx as usize];
            if !u.live || u.id != id {
                continue;
            }
            if !self.try_start(idx) {
                // A joined unit wider than the places free (started in part, or not at all:
                // it starts as a whole, one wider than the bound alone): it goes first when
                // places free, and nothing starts before it.
                self.start_queue.first = Some((idx, id));
                self.queue_ready();
                return;
            }
        }
    }

    /// Moves every ready unit into [`Scheduler::start_queue`].
    fn queue_ready(&mut self) {
        while let Some((idx, id)) = self.ready.pop_front() {
            let u = &self.units[idx as usize];
            if u.live && u.id == id {
                self.wait_for_place(idx);
            }
        }
    }

    /// Unit `idx` waits for a place, weighed now; a unit already waiting keeps its entry.
    fn wait_for_place(&mut self, idx: u32) {
        if self.units[idx as usize].wait != 0 {
            return;
        }
        let weight = self.weight(idx);
        let q = &mut self.start_queue;
        let u = &mut self.units[idx as usize];
        q.last += 1;
        u.wait = q.last;
        q.live += 1;
        q.fifo.push_back((q.last, idx, u.id));
        q.heap.push((weight, Reverse(q.last), idx, u.id));
    }

    /// The next waiting unit to get a place: the heaviest, or every [`AGING`]-th time the
    /// one waiting longest.
    fn pick_waiting(&mut self) -> Option<(u32, UnitId)> {
        let q = &mut self.start_queue;
        if q.live == 0 {
            // Only stale entries are left.
            q.heap.clear();
            q.fifo.clear();
            return None;
        }
        q.picks += 1;
        let oldest = q.picks % AGING == 0;
        loop {
            let (entry, idx, id) = if oldest {
                q.fifo.pop_front()?
            } else {
                let (_, Reverse(entry), idx, id) = q.heap.pop()?;
                (entry, idx, id)
            };
            let u = &mut self.units[idx as usize];
            if u.live && u.id == id && u.wait == entry {
                u.wait = 0;
                q.live -= 1;
                return Some((idx, id));
            }
        }
    }

    /// The work left in unit `idx`'s lanes that are still to start: the most of any.
    fn weight(&self, idx: u32) -> u32 {
        self.units[idx as usize]
            .slots
            .iter()
            .filter(|s| !s.phase.resolved() && s.phase != Phase::InFlight)
            .map(|s| {
                let l = &self.lanes[s.lane.index()];
                l.remaining
                    .max(u32::try_from(l.queue.len()).unwrap_or(u32::MAX))
            })
            .max()
            .unwrap_or(0)
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
        let taken = self.places_taken();
        let room = self.config.max_in_flight.saturating_sub(taken);
        let mut partial = false;
        if startable.len() > room {
            if !u.started {
                // A unit starts as a whole; one wider than the bound starts alone.
                if taken > 0 {
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
