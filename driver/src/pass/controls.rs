//! Operators' lane actions reaching a running pass (OL-14): the lane-control read and
//! what a changed lane does to the pass.

use std::collections::HashSet;

use outbox_lanes_core::{LaneControl, LaneId, Outcome};
use outbox_lanes_store::{ChangedLane, StoreError};
use tracing::{debug, info, trace};

use super::{PassCore, RoundContext, Start};

impl PassCore {
    /// Reads the actor's lane-control generation again (OL-14) and, with `apply`, tells the
    /// scheduler about every lane an operator changed since the last read: the starts of
    /// those lanes that were not sent yet are reported [`Outcome::NotSent`] and leave
    /// `starts`, then [`Scheduler::handle_lane_control`] hands back what the pass holds of
    /// them. A changed lane the pass never saw, not paused and with work, is discovered.
    /// Returns whether a lane the pass knew changed.
    pub(super) fn read_controls(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        apply: bool,
    ) -> Result<bool, StoreError> {
        let read = cx
            .store
            .lane_controls(&self.token, self.round.control.generation)?;
        trace!(actor = %self.actor, generation = read.read.generation, hosts = read.hosts,
            changed = read.changed.len(), "lane controls read");
        if let Some(gate) = cx.hosts
            && read.hosts > gate.generation()
        {
            // An operator acted on a host since this process's book last looked: the hosts'
            // rows, read after this read's instant, reach the book before anything starts on
            // it (a block holds, an unblock or retry opens, for lanes met later too).
            let rows = cx.store.hosts()?;
            gate.apply_rows(&rows);
        }
        self.round.control = read.read;
        if !apply || read.changed.is_empty() {
            return Ok(false);
        }
        Ok(self.apply_controls(read.changed, starts))
    }

    pub(super) fn apply_controls(
        &mut self,
        changed: Vec<ChangedLane>,
        starts: &mut Vec<Start>,
    ) -> bool {
        let t = self.now();
        let mut known = Vec::new();
        for cl in changed {
            let s = &cl.state;
            let info = self.lane_info(s);
            let Some(&lane) = self.lanes.ids.get(&s.lane) else {
                if !s.paused && cl.pending {
                    // Resumed, say: read it as a discovery would.
                    let lane = self.lane(s.lane, &s.key);
                    self.sched.handle_lane(lane, info, t);
                }
                continue;
            };
            known.push((lane, info, s.paused, cl.pending));
        }
        if known.is_empty() {
            return false;
        }
        let hit: HashSet<LaneId> = known.iter().map(|k| k.0).collect();
        let actor = &self.actor;
        let sched = &mut self.sched;
        starts.retain(|s| {
            if !hit.contains(&s.lane) {
                return true;
            }
            debug!(%actor, unit = s.unit.0, "not sent: an operator changed its lane");
            if let Err(e) = sched.handle_outcome(s.unit, s.lane, Outcome::NotSent, t) {
                debug!(error = %e, "not-sent outcome ignored");
            }
            false
        });
        for (lane, info, paused, pending) in known {
            info!(actor = %self.actor, recipient = self.recipient(lane), paused,
                strict = info.strict, pending,
                "lane changed by an operator: the pass hands back what it held of it");
            self.sched.handle_lane_control(
                lane,
                LaneControl {
                    info,
                    paused,
                    pending,
                },
                t,
            );
        }
        true
    }
}
