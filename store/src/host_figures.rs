//! Per-host figures from the delivery log (issue 39): attempts, outcomes, success rate and
//! latency percentiles per origin over a recent window, as `hosts --json` shows them
//! ([`ServiceStore::host_figures`](crate::ServiceStore::host_figures)).

use std::collections::BTreeMap;

use outbox_lanes_core::Timestamp;

/// At most this many entries of the delivery log, the most recent (by id: ids grow with
/// time), are read for [`ServiceStore::host_figures`](crate::ServiceStore::host_figures),
/// all hosts together: the read walks the primary key backwards and stops there, however
/// large the log is. When the window holds more, the figures cover the most recent 100,000
/// attempts and [`HostFigures::since`] says from when.
pub const HOST_FIGURES_MAX_ENTRIES: usize = 100_000;

/// At most this many durations per origin, the most recent, make its latency percentiles.
pub const HOST_FIGURES_LATENCY_SAMPLE: usize = 10_000;

/// Latency percentiles of one host's attempts, in milliseconds (nearest rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyPercentiles {
    /// The median.
    pub p50: u64,
    /// The 95th percentile.
    pub p95: u64,
    /// The 99th percentile.
    pub p99: u64,
}

impl LatencyPercentiles {
    /// The percentiles of `durations` (any order); `None` when empty.
    pub fn of(durations: &mut [u64]) -> Option<LatencyPercentiles> {
        if durations.is_empty() {
            return None;
        }
        durations.sort_unstable();
        let n = durations.len();
        let rank = |p: usize| {
            // Nearest rank: the smallest value with at least p % of the sample at or below it.
            let i = (p * n).div_ceil(100).clamp(1, n) - 1;
            durations.get(i).copied().unwrap_or(0)
        };
        Some(LatencyPercentiles {
            p50: rank(50),
            p95: rank(95),
            p99: rank(99),
        })
    }
}

/// One host's figures over the delivery log's recent entries
/// ([`ServiceStore::host_figures`](crate::ServiceStore::host_figures)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFigures {
    /// The origin (`scheme://host:port`, as [`origin_of`](crate::origin_of) gives it).
    pub origin: String,
    /// From when the figures count: the `since` asked for, or later when more than
    /// [`HOST_FIGURES_MAX_ENTRIES`] entries were in the window.
    pub since: Timestamp,
    /// Attempts logged.
    pub attempts: u64,
    /// Attempts that delivered.
    pub delivered: u64,
    /// Attempts per outcome: the status class (`2xx`, `4xx`, `5xx`…) when the host answered,
    /// else the error's class (`timeout`, `connection_refused`…).
    pub outcomes: BTreeMap<String, u64>,
    /// Latency percentiles over at most [`HOST_FIGURES_LATENCY_SAMPLE`] of the most recent
    /// attempts' durations; `None` without an attempt.
    pub latency_ms: Option<LatencyPercentiles>,
}

impl HostFigures {
    /// Delivered attempts over all attempts (0.0 to 1.0); `None` without an attempt.
    pub fn success_rate(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        (self.attempts > 0).then(|| self.delivered as f64 / self.attempts as f64)
    }
}

/// The outcome class of an entry: `2xx`… for a status class (the status's hundreds, as the
/// SQL groups them), else its error class.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "sqlx")),
    allow(dead_code)
)]
pub(crate) fn outcome_class(status_class: Option<i64>, error_class: Option<&str>) -> String {
    match status_class {
        Some(c) => format!("{c}xx"),
        None => error_class.unwrap_or("unknown").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(LatencyPercentiles::of(&mut []), None);
        let p = LatencyPercentiles::of(&mut [7]).unwrap();
        assert_eq!((p.p50, p.p95, p.p99), (7, 7, 7));
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let p = LatencyPercentiles::of(&mut v).unwrap();
        assert_eq!((p.p50, p.p95, p.p99), (50, 95, 99));
        let p = LatencyPercentiles::of(&mut [10, 20, 30, 40]).unwrap();
        assert_eq!((p.p50, p.p95, p.p99), (20, 40, 40));
    }

    #[test]
    fn outcomes_are_status_classes_or_error_classes() {
        assert_eq!(outcome_class(Some(2), None), "2xx");
        assert_eq!(outcome_class(Some(5), Some("status 503")), "5xx");
        assert_eq!(outcome_class(None, Some("timeout")), "timeout");
        assert_eq!(outcome_class(None, None), "unknown");
    }
}
