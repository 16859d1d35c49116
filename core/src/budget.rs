//! Fair shares of the process's in-flight budget between actors.
//!
//! A relay delivering for many actors (customers, in a webhook service) has one budget of
//! attempts in flight (`--concurrency`). Handed out first come, first served, one actor with a
//! thousand slow endpoints takes all of it, and another actor's first row waits for one of
//! the flooder's responses — seconds, or the HTTP timeout when the flooder's endpoints hang.
//! [`BudgetBook`] hands the budget out instead by two rules:
//!
//! - **Fair share**: an actor holding fewer attempts than its share (the budget divided by the
//!   actors with attempts running or waiting, and one more while a reserve is kept, rounded
//!   up) may take any free place. An actor at or above its share takes a place only while
//!   more than the reserve stays free.
//! - **The reserve** (by default a tenth of the budget) stays free for an actor that comes
//!   next, so its first attempt starts at once rather than after a flooder's response. It is
//!   kept once the book has seen a second actor (a process serving one actor lends it the
//!   whole budget), or from the start ([`BudgetBook::keep_reserve`]).
//!
//! When a place frees, it goes to the waiting actor holding the fewest places (the one that
//! waited longest among equals), so the budget drifts to equal shares as attempts end. An
//! actor's waiting items go in the order they came.
//!
//! Like the other books of the core it does no I/O and holds the caller's items (jobs) without
//! looking at them: [`BudgetBook::handle_job`] says whether an item goes now or waits,
//! [`BudgetBook::handle_end`] returns a place, and [`BudgetBook::poll_go`] hands out the
//! waiting items that may go now.

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::vec::Vec;

use crate::ids::ActorId;

/// The reserve a budget keeps by default: a tenth of it, at least one place (none for a
/// budget of one).
pub fn default_reserve(capacity: usize) -> usize {
    if capacity <= 1 {
        0
    } else {
        (capacity / 10).max(1)
    }
}

/// One actor's places and waiting items.
#[derive(Debug)]
struct Share<T> {
    running: u32,
    waiting: VecDeque<T>,
    /// Its key in [`BudgetBook::queue`] while it waits: (running, order).
    key: Option<(u32, u64)>,
}

/// The in-flight budget of a process, shared fairly between actors (see the module docs).
#[derive(Debug)]
pub struct BudgetBook<T> {
    capacity: u32,
    reserve: u32,
    in_flight: u32,
    /// Actors with places held or items waiting.
    actors: BTreeMap<ActorId, Share<T>>,
    /// Actors with items waiting, fewest places first, then the longest waiting.
    queue: BTreeSet<(u32, u64, ActorId)>,
    order: u64,
    /// The first actor seen; `None` once a second one came (the reserve is kept from then on).
    first: Option<Option<ActorId>>,
}

impl<T> BudgetBook<T> {
    /// A budget of `capacity` places (at least one) keeping `reserve` of them for an actor
    /// that comes next (at most `capacity - 1`).
    pub fn new(capacity: usize, reserve: usize) -> Self {
        let capacity = u32::try_from(capacity.max(1)).unwrap_or(u32::MAX);
        let reserve = u32::try_from(reserve).unwrap_or(u32::MAX).min(capacity - 1);
        BudgetBook {
            capacity,
            reserve,
            in_flight: 0,
            actors: BTreeMap::new(),
            queue: BTreeSet::new(),
            order: 0,
            first: Some(None),
        }
    }

    /// Keeps the reserve from the start, not only once a second actor came: the first
    /// attempt of any actor starts at once, even in a process that has served one actor
    /// until then.
    #[must_use]
    pub fn keep_reserve(mut self) -> Self {
        self.first = None;
        self
    }

    /// The places in the budget.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Places held now, by every actor.
    pub fn in_flight(&self) -> usize {
        self.in_flight as usize
    }

    /// Places `actor` holds now.
    pub fn running(&self, actor: &ActorId) -> usize {
        self.actors.get(actor).map_or(0, |s| s.running as usize)
    }

    /// Items waiting now, of every actor.
    pub fn waiting(&self) -> usize {
        self.actors.values().map(|s| s.waiting.len()).sum()
    }

    /// Whether the reserve is kept: a second actor has been seen.
    pub fn keeps_reserve(&self) -> bool {
        self.first.is_none()
    }

    /// `actor` has an item to run: `Some(item)` — it takes a place and goes now — or `None`:
    /// it waits until [`BudgetBook::poll_go`] hands it out.
    pub fn handle_job(&mut self, actor: &ActorId, item: T) -> Option<T> {
        self.note_actor(actor);
        if !self.actors.contains_key(actor) {
            self.actors.insert(
                actor.clone(),
                Share {
                    running: 0,
                    waiting: VecDeque::new(),
                    key: None,
                },
            );
        }
        let active = self.actors.len();
        let share = &self.actors[actor];
        // Items of one actor go in order: behind its own waiting ones.
        if share.waiting.is_empty() && self.may_take(share.running, active) {
            self.in_flight += 1;
            if let Some(s) = self.actors.get_mut(actor) {
                s.running += 1;
            }
            return Some(item);
        }
        let order = self.next_order();
        let s = self.actors.get_mut(actor)?;
        s.waiting.push_back(item);
        if s.key.is_none() {
            s.key = Some((s.running, order));
            self.queue.insert((s.running, order, actor.clone()));
        }
        None
    }

    /// A place `actor` held is free again (its attempt ended, or its item was never run).
    /// Call [`BudgetBook::poll_go`] after it. An actor holding no place is ignored.
    pub fn handle_end(&mut self, actor: &ActorId) {
        let Some(s) = self.actors.get_mut(actor) else {
            return;
        };
        if s.running == 0 {
            return;
        }
        s.running -= 1;
        self.in_flight -= 1;
        if let Some((running, order)) = s.key {
            // Fewer places held: it moves up the queue, keeping its turn among equals.
            self.queue.remove(&(running, order, actor.clone()));
            s.key = Some((s.running, order));
            self.queue.insert((s.running, order, actor.clone()));
        } else if s.running == 0 {
            self.actors.remove(actor);
        }
    }

    /// The next waiting item that may go now, with its actor; it holds a place from now on.
    /// Call until `None` after every [`BudgetBook::handle_end`].
    pub fn poll_go(&mut self) -> Option<(ActorId, T)> {
        let &(running, order, ref actor) = self.queue.first()?;
        if !self.may_take(running, self.actors.len()) {
            return None;
        }
        let actor = actor.clone();
        self.queue.remove(&(running, order, actor.clone()));
        let next = self.next_order();
        let s = self.actors.get_mut(&actor)?;
        let item = s.waiting.pop_front()?;
        s.running += 1;
        self.in_flight += 1;
        if s.waiting.is_empty() {
            s.key = None;
        } else {
            // Behind the other waiting actors holding as many places.
            s.key = Some((s.running, next));
            self.queue.insert((s.running, next, actor.clone()));
        }
        Some((actor, item))
    }

    /// Every waiting item, taken out (a shutdown: they never run, and hold no place).
    pub fn take_waiting(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        self.queue.clear();
        self.actors.retain(|_, s| {
            out.extend(s.waiting.drain(..));
            s.key = None;
            s.running > 0
        });
        out
    }

    /// Whether an actor holding `running` places may take one more, with `active` actors in
    /// the book.
    fn may_take(&self, running: u32, active: usize) -> bool {
        let free = self.capacity - self.in_flight;
        if free == 0 {
            return false;
        }
        let reserve = if self.keeps_reserve() {
            self.reserve
        } else {
            0
        };
        // With a reserve, shares count the actor that comes next.
        let active = u32::try_from(active.max(1))
            .unwrap_or(u32::MAX)
            .saturating_add(u32::from(reserve > 0));
        let share = self.capacity.div_ceil(active);
        running < share || free > reserve
    }

    fn note_actor(&mut self, actor: &ActorId) {
        match &mut self.first {
            Some(first @ None) => *first = Some(actor.clone()),
            Some(Some(a)) if a != actor => self.first = None,
            _ => {}
        }
    }

    fn next_order(&mut self) -> u64 {
        self.order += 1;
        self.order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> ActorId {
        ActorId::new(s)
    }

    #[test]
    fn one_actor_gets_the_whole_budget_and_waits_in_order() {
        let mut b = BudgetBook::new(3, 1);
        assert_eq!(b.handle_job(&a("x"), 1), Some(1));
        assert_eq!(b.handle_job(&a("x"), 2), Some(2));
        assert_eq!(b.handle_job(&a("x"), 3), Some(3));
        assert_eq!(b.handle_job(&a("x"), 4), None);
        assert_eq!(b.handle_job(&a("x"), 5), None);
        assert!(!b.keeps_reserve());
        b.handle_end(&a("x"));
        assert_eq!(b.poll_go(), Some((a("x"), 4)));
        assert_eq!(b.poll_go(), None);
        b.handle_end(&a("x"));
        assert_eq!(b.poll_go(), Some((a("x"), 5)));
        assert_eq!(b.in_flight(), 3);
    }
}
