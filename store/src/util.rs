//! Conversions shared by the stores.

use std::collections::BTreeMap;

use outbox_lanes_core::{ActorId, LaneKey, Timestamp};

use crate::types::{ActorStatus, LaneState, LaneSummary, SlotHolder};

pub(crate) fn ts(v: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(v).unwrap_or(0))
}

pub(crate) fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(crate) fn u32_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(if v < 0 { 0 } else { u32::MAX })
}

pub(crate) fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn status_of(v: Option<i64>) -> Option<u16> {
    v.and_then(|s| u16::try_from(s).ok())
}

pub(crate) fn key_of(recipient: String, ordering_key: String) -> LaneKey {
    LaneKey::from_canonical(
        recipient,
        (!ordering_key.is_empty()).then_some(ordering_key),
    )
}

/// One lane that is not open, as the status queries read it: actor, recipient, ordering key,
/// `not_before`, backoff level, paused, pause reason.
pub(crate) type WaitingLane = (
    String,
    String,
    String,
    Option<i64>,
    i64,
    bool,
    Option<String>,
);

pub(crate) fn assemble_status(
    map: &mut BTreeMap<String, ActorStatus>,
    pending: Vec<(String, i64)>,
    held: Vec<(String, String, i64)>,
    waiting: Vec<WaitingLane>,
    dead: Vec<(String, i64)>,
    now: Timestamp,
) -> Vec<ActorStatus> {
    fn get(m: &mut BTreeMap<String, ActorStatus>, a: String) -> &mut ActorStatus {
        m.entry(a.clone()).or_insert_with(|| ActorStatus {
            actor: ActorId::new(a),
            pending: 0,
            in_flight: false,
            slot: None,
            lanes_in_backoff: Vec::new(),
            lanes_paused: Vec::new(),
            dead_letters: 0,
        })
    }
    for (a, n) in pending {
        get(map, a).pending = u(n);
    }
    for (a, holder, lease) in held {
        let s = get(map, a);
        s.in_flight = true;
        s.slot = Some(SlotHolder {
            holder,
            lease_expires: ts(lease),
        });
    }
    for (a, r, k, nb, level, paused, reason) in waiting {
        let not_before = nb.map(ts);
        let state = LaneState::of(not_before, u32_of(level), paused, reason.as_deref(), now);
        let lane = LaneSummary {
            key: key_of(r, k),
            state,
            next_attempt: not_before.filter(|_| state.is_waiting_for_time()),
        };
        if state.is_waiting_for_time() {
            get(map, a).lanes_in_backoff.push(lane);
        } else if state.is_waiting_for_operator() {
            get(map, a).lanes_paused.push(lane);
        }
    }
    for (a, n) in dead {
        get(map, a).dead_letters = u(n);
    }
    core::mem::take(map).into_values().collect()
}
