//! Conversions shared by the stores.

use std::collections::BTreeMap;

use outbox_lanes_core::{ActorId, LaneKey, Timestamp};

use crate::types::ActorStatus;

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

pub(crate) fn assemble_status(
    map: &mut BTreeMap<String, ActorStatus>,
    pending: Vec<(String, i64)>,
    held: Vec<String>,
    backoff: Vec<(String, String, String, i64)>,
    dead: Vec<(String, i64)>,
) -> Vec<ActorStatus> {
    fn get(m: &mut BTreeMap<String, ActorStatus>, a: String) -> &mut ActorStatus {
        m.entry(a.clone()).or_insert_with(|| ActorStatus {
            actor: ActorId::new(a),
            pending: 0,
            in_flight: false,
            lanes_in_backoff: Vec::new(),
            dead_letters: 0,
        })
    }
    for (a, n) in pending {
        get(map, a).pending = u(n);
    }
    for a in held {
        get(map, a).in_flight = true;
    }
    for (a, r, k, nb) in backoff {
        get(map, a).lanes_in_backoff.push((key_of(r, k), ts(nb)));
    }
    for (a, n) in dead {
        get(map, a).dead_letters = u(n);
    }
    core::mem::take(map).into_values().collect()
}
