//! Enqueue validation shared by the stores: everything that can refuse a batch without
//! touching the database is checked here first, so a bad row refuses the batch before any
//! write (OL-4).

use std::collections::HashSet;

use outbox_lanes_core::LaneKey;

use crate::error::EnqueueError;
use crate::headers::{is_header_value, validate_headers};
use crate::types::{CommonOptions, NewRow};

/// A validated row: canonical lanes, duplicates collapsed.
pub(crate) struct PreparedRow<'a> {
    pub(crate) row: &'a NewRow,
    /// The ordering key as stored ('' = none).
    pub(crate) ordering_key: &'a str,
    pub(crate) lanes: Vec<LaneKey>,
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
        for url in &row.recipients {
            let key = LaneKey::new(url, ok).map_err(|reason| EnqueueError::BadRecipient {
                row: row.id.clone(),
                url: url.clone(),
                reason,
            })?;
            lanes.push(key);
        }
        out.push(PreparedRow {
            row,
            ordering_key,
            lanes: distinct(lanes),
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
