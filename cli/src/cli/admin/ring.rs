//! The overview's charts: deliveries, failures and dead letters per minute over the last
//! hour, kept in memory by this process (a relay restarted starts an empty hour).
//!
//! Fed from the relay's own counters ([`Counters`], which the delivery hooks keep): a
//! sampler reads their totals every few seconds, and every page of the overview once more,
//! and adds what they grew by since the last read to the current minute. Sixty minutes are
//! kept; older ones fall off.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use super::super::backend::Counters;

/// Attempt outcomes that count as failures in the chart: the recipient answered with a
/// failure or did not answer (`deferred`, `held`, `set_aside` and `not_sent` never left).
const FAILED: &[&str] = &["transient", "throttled", "permanent", "gone", "refused"];

/// Minutes kept.
pub(crate) const MINUTES: u64 = 60;

/// One minute's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    /// Minutes since the Unix epoch.
    pub(crate) at: u64,
    /// Recipients served.
    pub(crate) delivered: u64,
    /// Attempts that failed.
    pub(crate) failed: u64,
    /// Recipients dead-lettered.
    pub(crate) dead: u64,
}

/// The totals read from the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    delivered: u64,
    failed: u64,
    dead: u64,
}

#[derive(Debug, Default)]
struct Inner {
    last: Option<Totals>,
    minutes: VecDeque<Minute>,
}

/// The last hour, per minute.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    inner: Mutex<Inner>,
}

impl Ring {
    /// Reads `counters` and adds their growth to the minute `now_minute`.
    pub(crate) fn sample(&self, counters: &Counters, now_minute: u64) {
        let failed = {
            let d = counters.detail();
            FAILED
                .iter()
                .map(|o| d.attempts.get(o).copied().unwrap_or(0))
                .sum()
        };
        self.add(
            Totals {
                delivered: counters.delivered.load(Ordering::Relaxed),
                failed,
                dead: counters.dead_lettered.load(Ordering::Relaxed),
            },
            now_minute,
        );
    }

    fn add(&self, totals: Totals, now_minute: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // The first read only sets the base: what the process did before the dashboard
        // started is not put in one minute.
        let Some(last) = inner.last.replace(totals) else {
            return;
        };
        let grew = Totals {
            delivered: totals.delivered.saturating_sub(last.delivered),
            failed: totals.failed.saturating_sub(last.failed),
            dead: totals.dead.saturating_sub(last.dead),
        };
        if inner.minutes.back().is_none_or(|m| m.at < now_minute) {
            inner.minutes.push_back(Minute {
                at: now_minute,
                ..Minute::default()
            });
        }
        let m = inner.minutes.back_mut().expect("pushed above");
        m.delivered += grew.delivered;
        m.failed += grew.failed;
        m.dead += grew.dead;
        while inner
            .minutes
            .front()
            .is_some_and(|m| m.at + MINUTES <= now_minute)
        {
            inner.minutes.pop_front();
        }
    }

    /// The last [`MINUTES`] minutes up to `now_minute`, oldest first, a minute without
    /// counts as zeros.
    pub(crate) fn last_hour(&self, now_minute: u64) -> Vec<Minute> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (now_minute + 1 - MINUTES.min(now_minute + 1)..=now_minute)
            .map(|at| {
                inner
                    .minutes
                    .iter()
                    .find(|m| m.at == at)
                    .copied()
                    .unwrap_or(Minute {
                        at,
                        ..Minute::default()
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(delivered: u64, failed: u64, dead: u64) -> Totals {
        Totals {
            delivered,
            failed,
            dead,
        }
    }

    #[test]
    fn growth_goes_to_its_minute_and_old_minutes_fall_off() {
        let r = Ring::default();
        r.add(t(100, 5, 1), 1000); // the base only
        r.add(t(103, 5, 1), 1000);
        r.add(t(104, 7, 2), 1000);
        r.add(t(110, 7, 2), 1002);
        let h = r.last_hour(1002);
        assert_eq!(h.len(), 60);
        assert_eq!(h[0].at, 943);
        assert_eq!(
            h[57],
            Minute {
                at: 1000,
                delivered: 4,
                failed: 2,
                dead: 1
            }
        );
        assert_eq!(h[58].delivered, 0);
        assert_eq!(h[59].delivered, 6);
        // An hour later the minute 1000 is gone.
        r.add(t(111, 7, 2), 1060);
        assert!(r.last_hour(1060).iter().all(|m| m.at != 1000));
        assert_eq!(r.last_hour(1060)[59].delivered, 1);
    }

    #[test]
    fn counters_feed_it() {
        let c = Counters::default();
        let r = Ring::default();
        r.sample(&c, 1000);
        c.delivered.fetch_add(2, Ordering::Relaxed);
        c.detail().attempts.insert("transient", 3);
        c.detail().attempts.insert("deferred", 9);
        r.sample(&c, 1000);
        let last = r.last_hour(1000)[59];
        assert_eq!((last.delivered, last.failed, last.dead), (2, 3, 0));
    }
}
