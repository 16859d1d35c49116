//! The pass's lane table: store lanes and the scheduler's, each lane's destination (parsed
//! and checked once per pass), discovery and claims.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_lanes_core::{
    Admit, AdmitSlot, LaneChunk, LaneClaim, LaneId, LaneInfo, LaneKey, Scheduler,
};
use outbox_lanes_store::{ClaimRange, ClaimedLane, PendingLane, Store, StoreError, StoreLaneId};
use tracing::{trace, warn};

use super::{LaneTable, PassCore, UnitInfo};
use crate::http::AttemptResult;
use crate::request::Destination;

/// A lane's destination in this pass: the URL parsed once, and what its checks before
/// sending answered ([`Destination::check`]): the same for every attempt to the lane.
pub(super) struct LaneDestination {
    pub(super) to: Arc<Destination>,
    /// `Some`: nothing may be sent to it (a refused IP literal, a URL that does not parse, a
    /// host whose addresses the guard refused); every attempt comes to this.
    pub(super) unsendable: Option<AttemptResult>,
    /// For a refused host name: until when its refusal is trusted ([`REFUSAL_TRUST`]), after
    /// which the next attempt resolves it again. `None`: for the whole pass.
    pub(super) until: Option<Instant>,
}

/// How long a host name whose addresses the guard refused stays refused without being
/// resolved again: a DNS answer changes, a pass may run for hours.
pub(super) const REFUSAL_TRUST: Duration = Duration::from_secs(60);

impl LaneDestination {
    /// What every attempt to the lane comes to at `now` (monotonic), if nothing may be sent
    /// to it.
    pub(super) fn refused(&self, now: Instant) -> Option<&AttemptResult> {
        self.unsendable
            .as_ref()
            .filter(|_| self.until.is_none_or(|t| now < t))
    }
}

/// `lane`'s recipient URL: the scheduler's lane key names it ("" for a lane it does not
/// know, which no command names).
pub(super) fn recipient(sched: &Scheduler, lane: LaneId) -> &str {
    sched.lane_key(lane).map_or("", LaneKey::recipient)
}

impl PassCore {
    /// The scheduler's view of a lane's persisted state, as a discovery or a lane control
    /// read it, with its endpoint's pace and the process's memory of its last start.
    pub(super) fn lane_info(&self, s: &PendingLane) -> LaneInfo {
        let recipient = s.key.recipient();
        let pace = self
            .lanes
            .rates
            .endpoint_interval(self.actor.as_str(), recipient);
        LaneInfo {
            not_before: s.not_before,
            level: s.backoff_level,
            strict: s.strict,
            failing_since: s.failing_since,
            unavailable: s.unavailable_since.is_some(),
            pace,
            paced_until: pace
                .and_then(|_| self.lanes.rates.paced_until(self.actor.as_str(), recipient)),
            pending: u32::try_from(s.pending).unwrap_or(u32::MAX),
        }
    }

    /// An attempt of `lane` starts: a paced endpoint's next start is remembered for the
    /// passes after this one.
    pub(super) fn paced_start(&self, lane: LaneId) {
        if self.lanes.rates.is_empty() {
            return;
        }
        let recipient = self.recipient(lane);
        if let Some(pace) = self
            .lanes
            .rates
            .endpoint_interval(self.actor.as_str(), recipient)
        {
            let t = self.now();
            self.lanes
                .rates
                .started(self.actor.as_str(), recipient, t.saturating_add(pace), t);
        }
    }

    /// `lane`'s destination, parsed and checked at the lane's first attempt in this pass.
    pub(super) fn lane_destination(&mut self, lane: LaneId) -> &LaneDestination {
        let to = recipient(&self.sched, lane);
        self.lanes.lane_destination(lane, to)
    }

    /// `lane`'s recipient URL, shared by every job of the lane in this pass.
    pub(super) fn destination(&mut self, lane: LaneId) -> Arc<Destination> {
        let to = recipient(&self.sched, lane);
        self.lanes.destination(lane, to)
    }

    /// The scheduler's lane for the store's lane `id` (interned on first sight).
    pub(super) fn lane(&mut self, id: StoreLaneId, key: &outbox_lanes_core::LaneKey) -> LaneId {
        if let Some(l) = self.lanes.ids.get(&id) {
            return *l;
        }
        let l = self.sched.lane(key);
        self.lanes.ids.insert(id, l);
        if self.lanes.store_lanes.len() <= l.index() {
            self.lanes.store_lanes.resize(l.index() + 1, StoreLaneId(0));
        }
        self.lanes.store_lanes[l.index()] = id;
        l
    }

    /// Tells the scheduler about lanes that got new units since the last look.
    pub(super) fn discover(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        let (infos, watermark) = store.lanes_with_work(&self.token, self.round.watermark)?;
        self.round.watermark = self.round.watermark.max(watermark);
        let t = self.now();
        for info in infos {
            if info.paused {
                continue;
            }
            let lane = self.lane(info.lane, &info.key);
            let lane_info = self.lane_info(&info);
            self.sched.handle_lane(lane, lane_info, t);
        }
        Ok(())
    }

    /// Hands the store's answer to a claim to the scheduler.
    pub(super) fn admit_claimed(&mut self, answer: Vec<ClaimedLane>) {
        let claims = answer.len();
        let mut chunks = Vec::with_capacity(answer.len());
        for cl in answer {
            let cl: ClaimedLane = cl;
            // Only lanes this pass asked for come back.
            let Some(lane) = self.lanes.ids.get(&cl.lane).copied() else {
                continue;
            };
            let mut units = Vec::with_capacity(cl.units.len());
            for u in cl.units {
                let slots = u
                    .slots
                    .iter()
                    .map(|s| {
                        let lane = self.lane(s.lane, &s.key);
                        AdmitSlot {
                            lane,
                            attempts: s.attempts,
                            served: s.served,
                        }
                    })
                    .collect();
                let info = self.units.info.entry(u.id).or_insert(UnitInfo {
                    row_id: u.row_id,
                    enqueued_at: u.enqueued_at,
                    payload: None,
                });
                if info.payload.is_none() {
                    info.payload = u.payload.map(Arc::new);
                }
                units.push(Admit {
                    id: u.id,
                    seq: u.seq,
                    bytes: u.bytes,
                    enqueued_at: u.enqueued_at,
                    slots,
                });
            }
            chunks.push(LaneChunk {
                lane,
                units,
                exhausted: cl.exhausted,
            });
        }
        let read: usize = chunks.iter().map(|c| c.units.len()).sum();
        let t = self.now();
        let report = self.sched.handle_claimed(chunks, t);
        trace!(actor = %self.actor, lanes = claims, read, admitted = report.admitted, "claimed");
        for e in report.refused {
            warn!(actor = %self.actor, error = %e, "store answer refused by the scheduler");
        }
    }
}

impl LaneTable {
    pub(super) fn store_lane(&self, lane: LaneId) -> StoreLaneId {
        self.store_lanes
            .get(lane.index())
            .copied()
            .unwrap_or(StoreLaneId(0))
    }

    /// Whether nothing may be sent to `lane`'s destination ([`Destination::check`]) at `now`
    /// (monotonic), as checked when the lane's first start in this pass was executed.
    pub(super) fn is_unsendable(&self, lane: LaneId, now: Instant) -> bool {
        self.destinations
            .get(lane.index())
            .and_then(Option::as_ref)
            .is_some_and(|d| d.refused(now).is_some())
    }

    /// `lane`'s recipient URL (`recipient`), parsed and checked at the lane's first attempt
    /// in this pass.
    pub(super) fn lane_destination(&mut self, lane: LaneId, recipient: &str) -> &LaneDestination {
        let i = lane.index();
        if self.destinations.len() <= i {
            self.destinations.resize_with(i + 1, || None);
        }
        if self.destinations[i].is_none() {
            let to = Arc::new(Destination::parse(recipient));
            let unsendable = to.check(&self.addresses, &self.classifier).err();
            self.destinations[i] = Some(LaneDestination {
                to,
                unsendable,
                until: None,
            });
        }
        self.destinations[i]
            .as_ref()
            .expect("the lane's destination was just set")
    }

    /// `lane`'s recipient URL (`recipient`), shared by every job of the lane in this pass.
    pub(super) fn destination(&mut self, lane: LaneId, recipient: &str) -> Arc<Destination> {
        Arc::clone(&self.lane_destination(lane, recipient).to)
    }

    /// The store's form of the scheduler's claims.
    pub(super) fn claim_ranges(&self, claims: &[LaneClaim]) -> Vec<ClaimRange> {
        claims
            .iter()
            .map(|c| ClaimRange {
                lane: self.store_lane(c.lane),
                from: c.from,
                limit: c.limit,
            })
            .collect()
    }
}
