//! Conversions shared by the stores.

use std::collections::BTreeMap;

use outbox_lanes_core::{ActorId, LaneKey, Timestamp};

use crate::types::{ActorStatus, LaneState, LaneSummary, SlotHolder};

pub(crate) fn timestamp_of(v: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(v).unwrap_or(0))
}

pub(crate) fn millis_of(t: Timestamp) -> i64 {
    to_i64(t.as_millis())
}

pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(crate) fn to_u32(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(if v < 0 { 0 } else { u32::MAX })
}

pub(crate) fn to_i64(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
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
/// `not_before`, backoff level, paused, pause reason, `unavailable_since`.
pub(crate) type WaitingLane = (
    String,
    String,
    String,
    Option<i64>,
    i64,
    bool,
    Option<String>,
    Option<i64>,
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
        get(map, a).pending = to_u64(n);
    }
    for (a, holder, lease) in held {
        let s = get(map, a);
        s.in_flight = true;
        s.slot = Some(SlotHolder {
            holder,
            lease_expires: timestamp_of(lease),
        });
    }
    for (a, r, k, nb, level, paused, reason, unavailable) in waiting {
        let not_before = nb.map(timestamp_of);
        let state = LaneState::with_unavailable(
            unavailable.is_some(),
            not_before,
            to_u32(level),
            paused,
            reason.as_deref(),
            now,
        );
        // An unavailable lane waits for its next probe (while that is ahead), in backoff.
        let probing = state == LaneState::Unavailable;
        let lane = LaneSummary {
            key: key_of(r, k),
            state,
            next_attempt: not_before
                .filter(|&t| state.is_waiting_for_time() || (probing && t > now)),
        };
        if state.is_waiting_for_time() || probing {
            get(map, a).lanes_in_backoff.push(lane);
        } else if state.is_waiting_for_operator() {
            get(map, a).lanes_paused.push(lane);
        }
    }
    for (a, n) in dead {
        get(map, a).dead_letters = to_u64(n);
    }
    core::mem::take(map).into_values().collect()
}

/// A row's headers as the `headers` column stores them: one `name: value` per line, LF
/// between lines (SCHEMA.md); `None` (SQL `NULL`) for none, so rows without headers store
/// nothing.
pub(crate) fn encode_headers(headers: &[(String, String)]) -> Option<String> {
    if headers.is_empty() {
        return None;
    }
    let mut s = String::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 3).sum());
    for (i, (name, value)) in headers.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(name);
        s.push_str(": ");
        s.push_str(value);
    }
    Some(s)
}

/// The inverse of [`encode_headers`], lenient for rows written with plain SQL: a CR before
/// the LF and spaces or tabs around the value are dropped, blank lines skipped. A line without
/// a colon is kept as a name with an empty value, for the delivery's header check
/// ([`validate_headers`](crate::validate_headers)) to judge rather than be dropped unseen.
pub(crate) fn decode_headers(column: Option<String>) -> Vec<(String, String)> {
    let Some(text) = column else {
        return Vec::new();
    };
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once(':') {
            Some((n, v)) => (n.trim().to_owned(), v.trim_matches([' ', '\t']).to_owned()),
            None => (l.trim().to_owned(), String::new()),
        })
        .collect()
}

/// The row-id retention in milliseconds (saturating), as the ledger compares it.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) fn window_millis(common: &crate::CommonOptions) -> i64 {
    to_i64(common.row_id_retention.as_millis())
}

/// `ol_meta.schema_version` as stored (text), read as a version.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) fn parse_version(v: &str) -> Result<u32, crate::StoreError> {
    v.trim()
        .parse()
        .map_err(|_| crate::StoreError::Database(format!("unreadable schema_version {v:?}")))
}

/// Whether `policy` lets a database whose schema is at `found` (`None`: no outbox) be used,
/// created or migrated: `Ok(true)` when DDL must run, `Ok(false)` when the schema is current.
/// `target` names the database or schema for [`StoreError::NoSchema`](crate::StoreError::NoSchema).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) fn needs_ddl(
    found: Option<u32>,
    policy: crate::SchemaPolicy,
    target: impl FnOnce() -> String,
) -> Result<bool, crate::StoreError> {
    use crate::{SCHEMA_VERSION, SchemaPolicy, StoreError};
    match found {
        Some(v) if v == SCHEMA_VERSION => Ok(false),
        Some(v) if v > SCHEMA_VERSION => Err(StoreError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        }),
        Some(v) if policy == SchemaPolicy::Migrate => {
            if v < 1 {
                return Err(StoreError::Database(format!("unknown schema_version {v}")));
            }
            Ok(true)
        }
        Some(v) => Err(StoreError::SchemaTooOld {
            found: v,
            supported: SCHEMA_VERSION,
        }),
        None if policy == SchemaPolicy::Existing => Err(StoreError::NoSchema { target: target() }),
        None => Ok(true),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_plain_sql_forms_decode() {
        let h = vec![
            ("X-Trace".to_owned(), "a: b".to_owned()),
            ("authorization".to_owned(), "Bearer t\tx".to_owned()),
        ];
        let text = encode_headers(&h).unwrap();
        assert_eq!(text, "X-Trace: a: b\nauthorization: Bearer t\tx");
        assert_eq!(decode_headers(Some(text)), h);
        assert_eq!(encode_headers(&[]), None);
        assert!(decode_headers(None).is_empty());
        assert_eq!(
            decode_headers(Some("A:1\r\n\r\nB:\t 2 \nbroken".into())),
            [("A", "1"), ("B", "2"), ("broken", "")].map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
    }
}
