//! Enqueue validation shared by the stores: everything that can refuse a batch without
//! touching the database is checked here first, so a bad row refuses the batch before any
//! write (OL-4); then, only for a batch that names a recipient outside public space known
//! without a lookup, the outbox's destination policy (OL-24, [`check_stored_policy`]), read
//! in the enqueue's transaction.

use std::collections::HashSet;

use outbox_lanes_core::LaneKey;
use outbox_lanes_core::policy::{AddrClass, AddressPolicy, Recipient};

use crate::destinations::{WIDEST, policy_name};
use crate::error::EnqueueError;
use crate::headers::{is_header_value, validate_headers};
use crate::types::{CommonOptions, NewRow};

/// A validated row: canonical lanes, duplicates collapsed.
pub(crate) struct PreparedRow<'a> {
    pub(crate) row: &'a NewRow,
    /// The ordering key as stored ('' = none).
    pub(crate) ordering_key: &'a str,
    pub(crate) lanes: Vec<LaneKey>,
    /// The recipients (index in the row's) whose address is known without a lookup and
    /// outside public space, with its class: the outbox's destination policy judges them.
    pub(crate) guarded: Vec<(usize, AddrClass)>,
}

/// Checks a row's recipients against a destination policy as the stores' enqueue does
/// against the outbox's (OL-24), for callers that validate their input before they open a
/// store: a recipient whose address is known without a lookup (an IP literal, `localhost`)
/// and that `policy` refuses. Names resolve only at delivery, where the same policy judges
/// the addresses they resolve to.
///
/// # Errors
/// [`EnqueueError::BadRecipient`] for a recipient that is not an absolute http(s) URL;
/// [`EnqueueError::DestinationRefused`] for the first refused one.
pub fn check_destinations(row: &NewRow, policy: &AddressPolicy) -> Result<(), EnqueueError> {
    for url in &row.recipients {
        let recipient = parse_recipient(row, url)?;
        match recipient.host().known_class() {
            Some(class) if !policy.allows(class) => {
                return Err(destination_refused(row, url, class, Some(*policy)));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The refusal of `url`, of class `class`, by `policy` (`None`: no policy allows it).
fn destination_refused(
    row: &NewRow,
    url: &str,
    class: AddrClass,
    policy: Option<AddressPolicy>,
) -> EnqueueError {
    let widen = match class {
        AddrClass::Loopback => Some(
            "an outbox opened on this database with OutboxConfig::allow_loopback() (or \
             allow_private()), outbox-lanes enqueue, drain or relay with \
             --allow-private-destinations, or `outbox-lanes destinations set loopback`",
        ),
        AddrClass::Private | AddrClass::SharedCgnat | AddrClass::UniqueLocal => Some(
            "an outbox opened on this database with OutboxConfig::allow_private(), \
             outbox-lanes enqueue, drain or relay with --allow-private-destinations, or \
             `outbox-lanes destinations set private`",
        ),
        AddrClass::LinkLocal => Some(
            "an outbox opened on this database whose HttpConfig::addresses sets \
             allow_link_local (the binary never allows link-local space)",
        ),
        _ => None,
    };
    let hint = match (policy, widen) {
        (Some(p), Some(widen)) => format!(
            "this outbox's destination policy ({}) refuses (SSRF guard): delivery would \
             dead-letter it; every process on the database allows it once it is widened by {widen}",
            policy_name(p)
        ),
        _ => "delivery always refuses (SSRF guard)".to_owned(),
    };
    EnqueueError::DestinationRefused {
        row: row.id.clone(),
        recipient: url.to_owned(),
        class,
        policy,
        hint,
    }
}

/// Whether any row names a recipient the outbox's destination policy must judge.
pub(crate) fn needs_policy(rows: &[PreparedRow<'_>]) -> bool {
    rows.iter().any(|p| !p.guarded.is_empty())
}

/// Refuses a batch with a recipient the outbox's stored destination policy refuses (OL-24),
/// read in the enqueue's transaction: only when [`needs_policy`], so a batch of named hosts
/// reads nothing. Run after the enqueue's writes (the caller rolls back on a refusal): on
/// SQLite a read first would take a snapshot that a concurrent writer could make too old to
/// write from.
///
/// # Errors
/// [`EnqueueError::DestinationRefused`] for the first refused recipient; database failures.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) async fn check_stored_policy(
    db: &mut impl crate::db::AsyncDb,
    rows: &[PreparedRow<'_>],
) -> Result<(), EnqueueError> {
    if !needs_policy(rows) {
        return Ok(());
    }
    let policy = crate::destinations::read(db).await?;
    for p in rows {
        for &(i, class) in &p.guarded {
            if !policy.allows(class) {
                let url = p.row.recipients.get(i).map_or("", String::as_str);
                return Err(destination_refused(p.row, url, class, Some(policy)));
            }
        }
    }
    Ok(())
}

/// Checks a row's [`headers`](NewRow::headers) as [`ServiceStore::enqueue`](crate::ServiceStore::enqueue)
/// does, for callers that validate their input before they open a store: the rules of
/// [`validate_headers`], the same a delivery attempt applies again before anything is sent.
///
/// Checked at enqueue because a header the HTTP client refuses to send fails the unit's
/// first attempt and dead-letters it, long after the enqueue that could have said so.
///
/// # Errors
/// [`EnqueueError::BadHeader`] naming the row and the first header that is not an HTTP
/// token, has a value that is not a valid header value (or has whitespace around it),
/// repeats a name (case-insensitively), is one the client, the signer or a hop sets
/// ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS), `webhook-*`), or is past
/// [`MAX_HEADERS`](crate::MAX_HEADERS) or [`MAX_HEADER_BYTES`](crate::MAX_HEADER_BYTES).
pub fn check_headers(row: &NewRow) -> Result<(), EnqueueError> {
    validate_headers(&row.headers).map_err(|refused| EnqueueError::BadHeader {
        row: row.id.clone(),
        reason: refused.problem.to_string(),
        name: refused.name,
    })
}

pub(crate) fn prepare<'a>(
    rows: &'a [NewRow],
    opts: &CommonOptions,
) -> Result<Vec<PreparedRow<'a>>, EnqueueError> {
    let mut ids = HashSet::with_capacity(rows.len());
    let mut out = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        if row.id.is_empty() {
            return Err(EnqueueError::EmptyRowId { index });
        }
        if !ids.insert(row.id.as_str()) {
            return Err(EnqueueError::DuplicateRowId {
                row: row.id.clone(),
            });
        }
        if row.recipients.is_empty() {
            return Err(EnqueueError::NoRecipients {
                row: row.id.clone(),
            });
        }
        if row.recipients.len() > opts.max_recipients {
            return Err(EnqueueError::TooManyRecipients {
                row: row.id.clone(),
                count: row.recipients.len(),
                max: opts.max_recipients,
            });
        }
        if row.body.len() > opts.max_payload {
            return Err(EnqueueError::PayloadTooLarge {
                row: row.id.clone(),
                size: row.body.len(),
                max: opts.max_payload,
            });
        }
        if row.content_type.trim().is_empty() || !is_header_value(&row.content_type) {
            return Err(EnqueueError::BadContentType {
                row: row.id.clone(),
                content_type: row.content_type.clone(),
            });
        }
        check_headers(row)?;
        let ordering_key = row.ordering_key.as_deref().unwrap_or("");
        let ok = (!ordering_key.is_empty()).then_some(ordering_key);
        let mut lanes: Vec<LaneKey> = Vec::with_capacity(row.recipients.len());
        let mut guarded = Vec::new();
        for (i, url) in row.recipients.iter().enumerate() {
            let recipient = parse_recipient(row, url)?;
            match recipient.host().known_class() {
                None | Some(AddrClass::Public) => {}
                Some(class) if !WIDEST.allows(class) => {
                    return Err(destination_refused(row, url, class, None));
                }
                Some(class) => guarded.push((i, class)),
            }
            // `LaneKey::new`'s key, without parsing the URL twice.
            lanes.push(LaneKey::from_canonical(
                recipient.as_str().to_owned(),
                ok.map(str::to_owned),
            ));
        }
        out.push(PreparedRow {
            row,
            ordering_key,
            lanes: distinct(lanes),
            guarded,
        });
    }
    Ok(out)
}

/// Two spellings of one inbox are one lane (OL-19): keeps the first of equal keys, in
/// first-seen order, in time linear in the number of recipients (a row may have many).
fn distinct(mut lanes: Vec<LaneKey>) -> Vec<LaneKey> {
    if lanes.len() < 2 {
        return lanes;
    }
    let keep: Vec<bool> = {
        let mut seen = HashSet::with_capacity(lanes.len());
        lanes.iter().map(|k| seen.insert(k)).collect()
    };
    let mut keep = keep.into_iter();
    lanes.retain(|_| keep.next().unwrap_or(true));
    lanes
}

/// `url`, a recipient of `row`, parsed; [`EnqueueError::BadRecipient`] naming both if it is not
/// a recipient URL.
fn parse_recipient(row: &NewRow, url: &str) -> Result<Recipient, EnqueueError> {
    Recipient::parse(url).map_err(|reason| EnqueueError::BadRecipient {
        row: row.id.clone(),
        url: url.to_owned(),
        reason,
    })
}
