//! Enqueue validation shared by the stores: everything that can refuse a batch without
//! touching the database is checked here first, so a bad row refuses the batch before any
//! write (OL-4).

use std::collections::HashSet;

use outbox_lanes_core::LaneKey;

use crate::error::EnqueueError;
use crate::types::NewRow;

/// A validated row: canonical lanes, duplicates collapsed.
pub(crate) struct PreparedRow<'a> {
    pub(crate) row: &'a NewRow,
    /// The ordering key as stored ('' = none).
    pub(crate) ordering_key: &'a str,
    pub(crate) lanes: Vec<LaneKey>,
}

pub(crate) fn prepare(
    rows: &[NewRow],
    max_payload: usize,
) -> Result<Vec<PreparedRow<'_>>, EnqueueError> {
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
        if row.body.len() > max_payload {
            return Err(EnqueueError::PayloadTooLarge {
                row: row.id.clone(),
                size: row.body.len(),
                max: max_payload,
            });
        }
        let ordering_key = row.ordering_key.as_deref().unwrap_or("");
        let ok = (!ordering_key.is_empty()).then_some(ordering_key);
        let mut lanes: Vec<LaneKey> = Vec::with_capacity(row.recipients.len());
        for url in &row.recipients {
            let key = LaneKey::new(url, ok).map_err(|reason| EnqueueError::BadRecipient {
                row: row.id.clone(),
                url: url.clone(),
                reason,
            })?;
            // Two spellings of one inbox are one lane (OL-19); k is small, so a linear check.
            if !lanes.contains(&key) {
                lanes.push(key);
            }
        }
        out.push(PreparedRow {
            row,
            ordering_key,
            lanes,
        });
    }
    Ok(out)
}
