//! The store's enqueue validation and atomicity, on rows built from the fuzz input.
//!
//! The CLI's JSON line parser (`cli/src/cli/enqueue.rs`, `parse_line`) is private to the
//! `outbox-lanes` binary and cannot be reached from here without moving it, so this target
//! fuzzes what it feeds: `Store::enqueue` of an in-memory `SqliteStore` with batches of
//! `NewRow`s (ids, recipients, content types, bodies, dedup and ordering keys, joined).
//!
//! Checked against a small reference model of the store:
//! - enqueue never panics and never fails with a database error;
//! - a batch that breaks a validation rule is refused with the typed error naming the first
//!   offending row (empty id, duplicate id, no or too many recipients, payload too large,
//!   empty or bad content type, bad recipient URL); a valid batch is accepted;
//! - an accepted batch returns one `Enqueued` per row, in order, with increasing `seq`; each
//!   distinct lane (canonical recipient + ordering key) is a unit or, with a dedup key still
//!   pending for that recipient, a skipped recipient; a joined row is at most one unit;
//! - a refused batch writes nothing: the actor's pending units and lanes are as before.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::arbitrary::{Result as AResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{ActorId, LaneKey};
use outbox_lanes_store::{
    CommonOptions, EnqueueError, NewRow, ServiceStore, SqliteOptions, SqliteStore,
};

const MAX_PAYLOAD: usize = 48;
const MAX_RECIPIENTS: usize = 4;

const URLS: &[&str] = &[
    "http://a.test/inbox",
    "HTTP://A.TEST:80/inbox#frag",
    "http://a.test/x/../inbox",
    "https://a.test/inbox",
    "https://b.test:8443/in%7ebox?q=%c3%a9",
    "http://b.test.",
    "http://[::1]/",
    "http://[0:0::1]:80/",
    "http://127.0.0.1/",
    "http://127.1/",
    "http://user@a.test/",
    "ftp://a.test/",
    "a.test/inbox",
    "http://a .test/",
    "http:///inbox",
    "",
];

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/activity+json",
    "text/plain; charset=utf-8",
    "a\tb",
    "",
    "bad\r\nX-Injected: 1",
    "caf\u{e9}",
];

fn string(u: &mut Unstructured<'_>, pool: &[&str]) -> AResult<String> {
    Ok(if u.ratio(3, 4)? {
        (*u.choose(pool)?).to_string()
    } else {
        let s: &str = u.arbitrary()?;
        s.chars().take(40).collect()
    })
}

fn row(u: &mut Unstructured<'_>) -> AResult<NewRow> {
    let id = string(u, &["r1", "r2", "r3", "", " "])?;
    let n = u.int_in_range(0..=MAX_RECIPIENTS + 1)?;
    let mut recipients = Vec::with_capacity(n);
    for _ in 0..n {
        recipients.push(string(u, URLS)?);
    }
    let content_type = string(u, CONTENT_TYPES)?;
    let len = u.int_in_range(0..=MAX_PAYLOAD + 2)?;
    let body = u.bytes(len.min(u.len()))?.to_vec();
    let dedup_key = if u.ratio(1, 2)? {
        Some(string(u, &["k", "k2", ""])?)
    } else {
        None
    };
    let ordering_key = if u.ratio(1, 3)? {
        Some(string(u, &["o", "o2", ""])?)
    } else {
        None
    };
    Ok(NewRow {
        id,
        body,
        content_type,
        recipients,
        dedup_key,
        ordering_key,
        joined: u.arbitrary()?,
        headers: Vec::new(),
    })
}

/// What the model knows of one actor.
#[derive(Default)]
struct ActorModel {
    /// Ids of rows that created at least one unit.
    stored_ids: BTreeSet<String>,
    /// (dedup key, canonical recipient) with a unit pending.
    dedup: BTreeSet<(String, String)>,
    lanes: BTreeSet<LaneKey>,
    pending: u64,
}

fn is_header_value(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// The distinct lanes of a row, or the validation error the store must return.
fn expected_lanes(rows: &[NewRow]) -> Result<Vec<Vec<LaneKey>>, EnqueueError> {
    let mut ids = BTreeSet::new();
    let mut out = Vec::new();
    for (index, r) in rows.iter().enumerate() {
        let row = r.id.clone();
        if r.id.is_empty() {
            return Err(EnqueueError::EmptyRowId { index });
        }
        if !ids.insert(r.id.as_str()) {
            return Err(EnqueueError::DuplicateRowId { row });
        }
        if r.recipients.is_empty() {
            return Err(EnqueueError::NoRecipients { row });
        }
        if r.recipients.len() > MAX_RECIPIENTS {
            return Err(EnqueueError::TooManyRecipients {
                row,
                count: r.recipients.len(),
                max: MAX_RECIPIENTS,
            });
        }
        if r.body.len() > MAX_PAYLOAD {
            return Err(EnqueueError::PayloadTooLarge {
                row,
                size: r.body.len(),
                max: MAX_PAYLOAD,
            });
        }
        if r.content_type.trim().is_empty() || !is_header_value(&r.content_type) {
            return Err(EnqueueError::BadContentType {
                row,
                content_type: r.content_type.clone(),
            });
        }
        let ok = r.ordering_key.as_deref().filter(|k| !k.is_empty());
        let mut lanes: Vec<LaneKey> = Vec::new();
        for url in &r.recipients {
            let key = LaneKey::new(url, ok).map_err(|reason| EnqueueError::BadRecipient {
                row: row.clone(),
                url: url.clone(),
                reason,
            })?;
            if !lanes.contains(&key) {
                lanes.push(key);
            }
        }
        out.push(lanes);
    }
    Ok(out)
}

fn pending_of(store: &SqliteStore, actor: &ActorId) -> u64 {
    store
        .status()
        .expect("status")
        .iter()
        .find(|s| &s.actor == actor)
        .map_or(0, |s| s.pending)
}

fn lanes_of(store: &SqliteStore, actor: &ActorId) -> BTreeSet<LaneKey> {
    store
        .lanes(actor)
        .expect("lanes")
        .into_iter()
        .map(|l| l.key)
        .collect()
}

fn run(u: &mut Unstructured<'_>) -> AResult<()> {
    let store = SqliteStore::in_memory_with(SqliteOptions {
        common: CommonOptions {
            max_payload: MAX_PAYLOAD,
            max_recipients: MAX_RECIPIENTS,
            ..CommonOptions::default()
        },
        ..SqliteOptions::default()
    })
    .expect("in-memory store");
    // Some recipients of `URLS` are loopback literals, which an outbox of the default
    // (public) destination policy refuses at enqueue (OL-24, `DestinationRefused`; tested in
    // store/tests/destinations.rs). This target checks validation and atomicity, so its
    // outbox allows loopback, as one opened with `OutboxConfig::allow_loopback()` would.
    store
        .set_destination_policy(AddressPolicy::allow_loopback_only())
        .expect("destination policy");
    let actors = [ActorId::new("alice"), ActorId::new("bob")];
    let mut models: BTreeMap<usize, ActorModel> = BTreeMap::new();

    for _ in 0..u.int_in_range(1..=4)? {
        let which = usize::from(u.ratio(1, 4)?);
        let actor = &actors[which];
        let n = u.int_in_range(0..=3)?;
        let mut rows = Vec::with_capacity(n);
        for _ in 0..n {
            rows.push(row(u)?);
        }
        let model = models.entry(which).or_default();
        let before_pending = pending_of(&store, actor);
        let before_lanes = lanes_of(&store, actor);
        assert_eq!(before_pending, model.pending, "pending units drifted");
        assert_eq!(before_lanes, model.lanes, "lanes drifted");

        let expected = expected_lanes(&rows);
        let got = store.enqueue(actor, &rows);
        match (&expected, &got) {
            (Err(want), Err(e)) => assert_eq!(e, want, "wrong refusal for {rows:?}"),
            (Err(want), Ok(_)) => {
                panic!("accepted a batch that must be refused ({want}): {rows:?}")
            }
            (Ok(_), Err(EnqueueError::DuplicateRowId { row })) => assert!(
                model.stored_ids.contains(row),
                "{row:?} refused as a duplicate but never stored: {rows:?}"
            ),
            (Ok(_), Err(e)) => panic!("valid batch refused: {e} ({e:?}): {rows:?}"),
            (Ok(lanes), Ok(done)) => {
                if let Some(r) = rows.iter().find(|r| model.stored_ids.contains(&r.id)) {
                    panic!("row id {:?} accepted twice: {rows:?}", r.id);
                }
                assert_eq!(done.len(), rows.len(), "one result per row");
                let mut last_seq = None;
                for ((r, ls), e) in rows.iter().zip(lanes).zip(done) {
                    assert_eq!(e.row_id, r.id);
                    assert!(last_seq < Some(e.seq), "seq not increasing: {done:?}");
                    last_seq = Some(e.seq);
                    let mut skipped = Vec::new();
                    let mut kept = Vec::new();
                    for key in ls {
                        let rec = key.recipient().to_string();
                        match &r.dedup_key {
                            Some(dk) if model.dedup.contains(&(dk.clone(), rec.clone())) => {
                                skipped.push(rec)
                            }
                            _ => kept.push(rec),
                        }
                    }
                    assert_eq!(e.skipped, skipped, "skipped recipients of {r:?}");
                    let units = match (kept.is_empty(), r.joined) {
                        (true, _) => 0,
                        (false, true) => 1,
                        (false, false) => kept.len(),
                    };
                    assert_eq!(e.units.len(), units, "units of {r:?}: {e:?}");
                    model.pending += units as u64;
                    if units > 0 {
                        model.stored_ids.insert(r.id.clone());
                    }
                    if let Some(dk) = &r.dedup_key {
                        for rec in kept {
                            model.dedup.insert((dk.clone(), rec));
                        }
                    }
                    model.lanes.extend(ls.iter().cloned());
                }
            }
        }
        if got.is_err() {
            assert_eq!(
                pending_of(&store, actor),
                before_pending,
                "a refused batch wrote units: {got:?}"
            );
            assert_eq!(
                lanes_of(&store, actor),
                before_lanes,
                "a refused batch wrote lanes: {got:?}"
            );
        } else {
            assert_eq!(pending_of(&store, actor), model.pending, "{got:?}");
            assert_eq!(lanes_of(&store, actor), model.lanes, "{got:?}");
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
