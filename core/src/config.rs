//! Scheduler configuration and the pure backoff functions.

use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use crate::rng::Rng;

/// The highest lane backoff level: a lane that keeps failing stays at it instead of counting
/// up without bound ([`Config::lane_backoff`] stops doubling long before it).
pub const MAX_BACKOFF_LEVEL: u32 = 64;

/// Configuration of one [`crate::Scheduler`]. The defaults are the design's.
#[derive(Clone, Debug)]
pub struct Config {
    /// Admission window: the most units admitted (waiting or in flight) at once (OL-3).
    pub max_units: usize,
    /// The most units admitted per lane at once, so one deep lane cannot fill the window.
    /// Default 64: a deep lane refills (at half) once per 32 units, not per 8 as at 16 — on
    /// one lane answering at once, 20 % less CPU per delivery and about a quarter more
    /// deliveries/s (BENCHMARKS.md); with more than 16 lanes with work the window's share
    /// (`max_units / lanes`) is the smaller bound anyway.
    pub max_per_lane: u32,
    /// The most payload bytes admitted at once. A unit larger than this on its own is still
    /// admitted when the window is otherwise empty, so it cannot wedge the pass.
    pub max_bytes: u64,
    /// The most attempts in flight at once in one pass.
    pub max_in_flight: usize,
    /// The failure in a row of a lane's head that stalls its lane (OL-7). Default 4.
    ///
    /// Counted from the head's persisted attempts, not per pass: a recipient that fails
    /// slowly reaches its lane backoff after this many failures however passes are
    /// sliced, and then costs one probe per backoff interval. Throttles count too; theirs
    /// is not in the persisted attempts, so a lane still throttled by an earlier pass (its
    /// `not_before` at level 0, not cleared by an answer since) stalls at its next throttle.
    pub pass_attempts: u32,
    /// The persisted attempt count at which a unit is dead-lettered (OL-8). Default 12.
    pub max_attempts: u32,
    /// The lane backoff level from which a throttled attempt (429, or 503 with Retry-After)
    /// counts toward [`Config::max_attempts`]. Default 1.
    ///
    /// Below it a throttled attempt is recorded but not counted (OL-5); it still counts
    /// toward [`Config::pass_attempts`], so a throttled unit stalls like any other, also
    /// across passes (OL-7: the lane's throttle mark carries the count). The level counts
    /// the lane's stalls and failed probes in a row and is persisted with the lane, so the
    /// bound holds across passes: with the default, at most `pass_attempts` throttles in a
    /// row are free whatever their Retry-After, and the probes after the stall count. A
    /// recipient that throttles for ever is then dead-lettered after `max_attempts` probes
    /// instead of being probed for ever while its lane waits. `0` counts every throttled
    /// attempt; a value above [`MAX_BACKOFF_LEVEL`] (such as `u32::MAX`) never counts one.
    pub max_throttled_level: u32,
    /// In-pass retry delays after the 1st, 2nd, 3rd… failure; the last one repeats (OL-6).
    ///
    /// Before jitter, each is also the longest Retry-After the pass waits for after that
    /// failure: one no longer is a retry in the pass after the longer of the two (the delay
    /// jittered); a longer one throttles the lane (its `not_before`, and the pass may end
    /// without it). So the choice never depends on the jitter.
    pub retry_delays: Vec<Duration>,
    /// Jitter applied to every delay, in percent: a delay `d` becomes a uniform value in
    /// `d * (1 - j/100) ..= d * (1 + j/100)`.
    pub jitter_percent: u32,
    /// The first lane backoff after a stall; doubled per level (OL-11). The level stops at
    /// [`MAX_BACKOFF_LEVEL`].
    pub lane_backoff_base: Duration,
    /// The cap of the lane backoff.
    pub lane_backoff_cap: Duration,
    /// The cap applied to any Retry-After (OL-6). Default 1 h.
    ///
    /// A Retry-After is a floor, never a shortcut: the wait after a failure is the longer of
    /// the Retry-After and the delay the scheduler would take without one (the in-pass
    /// [`Config::retry_delay`], or the lane backoff after a stall). A Retry-After of `0`, or a
    /// date that is not in the future, therefore waits the ordinary delay instead of retrying
    /// in a tight loop; one longer than [`Config::retry_delay`] before jitter throttles the
    /// lane instead of a retry in the pass.
    pub retry_after_cap: Duration,
    /// Units older than this when they are due are dead-lettered `expired` (OL-8). Off by
    /// default.
    pub max_age: Option<Duration>,
    /// A 410 Gone retires the whole lane: every pending unit of it is dead-lettered (OL-9).
    pub retire_on_gone: bool,
    /// The lane backoff of each level, when set (the last one repeats): a named retry
    /// schedule ([`RetrySchedule`]) in place of [`Config::lane_backoff_base`] doubled per
    /// level. Empty by default.
    pub backoff_schedule: Vec<Duration>,
    /// A lane whose attempts have failed without an answer for this long, counted from the
    /// first failure of the run, is **unavailable** (OL-8): at its next failure every pending
    /// unit of it is dead-lettered together as `lane_unavailable`, and so are the units that
    /// reach it later, at each failed probe, until an answer (or an operator's `lanes
    /// retry`) makes it available again. Default 7 days; `None`: never.
    pub lane_unavailable_after: Option<Duration>,
}

/// The default [`Config::lane_unavailable_after`]: 7 days (Mastodon's rule of thumb for a
/// domain; Svix disables an endpoint after 5).
pub const DEFAULT_LANE_UNAVAILABLE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// A named retry schedule (`--retry-schedule`): how long a unit is retried, and when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetrySchedule {
    /// The default: 1 s, 2 s and 4 s in the pass, then the lane backs off from 30 s doubling
    /// to 1 h; 12 attempts (about 2 h 04 min for a unit that never gets through).
    #[default]
    Standard,
    /// Svix's: attempts at 0, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h later (8 attempts,
    /// about 27 h 35 min).
    Svix,
}

impl RetrySchedule {
    /// `standard` or `svix`.
    pub fn as_str(self) -> &'static str {
        match self {
            RetrySchedule::Standard => "standard",
            RetrySchedule::Svix => "svix",
        }
    }

    /// The schedule of a code [`RetrySchedule::as_str`] gives.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "standard" => Some(RetrySchedule::Standard),
            "svix" => Some(RetrySchedule::Svix),
            _ => None,
        }
    }

    /// Sets `cfg`'s retry delays, stall threshold, lane backoff and attempts to this
    /// schedule's (the rest of `cfg` is left as it is).
    pub fn apply(self, cfg: &mut Config) {
        let d = Config::default();
        let min = |m: u64| Duration::from_secs(m * 60);
        let hours = |h: u64| Duration::from_secs(h * 3600);
        match self {
            RetrySchedule::Standard => {
                cfg.retry_delays = d.retry_delays;
                cfg.pass_attempts = d.pass_attempts;
                cfg.lane_backoff_base = d.lane_backoff_base;
                cfg.lane_backoff_cap = d.lane_backoff_cap;
                cfg.backoff_schedule = d.backoff_schedule;
                cfg.max_attempts = d.max_attempts;
            }
            RetrySchedule::Svix => {
                // The first retry in the pass, the others as the lane's backoff levels.
                cfg.retry_delays = vec![Duration::from_secs(5)];
                cfg.pass_attempts = 2;
                cfg.backoff_schedule =
                    vec![min(5), min(30), hours(2), hours(5), hours(10), hours(10)];
                cfg.lane_backoff_base = min(5);
                cfg.lane_backoff_cap = hours(10);
                cfg.max_attempts = 8;
            }
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_units: 1024,
            max_per_lane: 64,
            max_bytes: 64 * 1024 * 1024,
            max_in_flight: 64,
            pass_attempts: 4,
            max_attempts: 12,
            max_throttled_level: 1,
            retry_delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(4),
            ],
            jitter_percent: 20,
            lane_backoff_base: Duration::from_secs(30),
            lane_backoff_cap: Duration::from_secs(3600),
            retry_after_cap: Duration::from_secs(3600),
            max_age: None,
            retire_on_gone: false,
            backoff_schedule: Vec::new(),
            lane_unavailable_after: Some(DEFAULT_LANE_UNAVAILABLE_AFTER),
        }
    }
}

impl Config {
    /// The in-pass retry delay after the `failure`-th failure (1-based), before jitter: also
    /// the longest Retry-After waited in the pass after it (OL-6).
    pub fn retry_delay(&self, failure: u32) -> Duration {
        if self.retry_delays.is_empty() {
            return Duration::ZERO;
        }
        let i = (failure.max(1) as usize - 1).min(self.retry_delays.len() - 1);
        self.retry_delays[i]
    }

    /// The lane backoff at `level` (1-based), before jitter: the schedule's, when there is
    /// one ([`Config::backoff_schedule`]), else `base * 2^(level-1)`, capped.
    pub fn lane_backoff(&self, level: u32) -> Duration {
        if let Some(last) = self.backoff_schedule.last() {
            let i = (level.max(1) as usize - 1).min(self.backoff_schedule.len() - 1);
            return self.backoff_schedule.get(i).copied().unwrap_or(*last);
        }
        doubling(self.lane_backoff_base, self.lane_backoff_cap, level)
    }
}

/// `base * 2^(level-1)` (1-based `level`; `0` counts as `1`), capped at `cap`, before
/// jitter: the backoff of a lane ([`Config::lane_backoff`]) and of a host
/// ([`crate::host::HostConfig`]).
pub fn doubling(base: Duration, cap: Duration, level: u32) -> Duration {
    let shift = level.saturating_sub(1).min(31);
    base.checked_mul(1u32 << shift).unwrap_or(cap).min(cap)
}

/// Applies `percent` jitter to `d` with `rng`: uniform in `d ± d*percent/100`.
pub fn jittered(d: Duration, percent: u32, rng: &mut Rng) -> Duration {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if percent == 0 || ms == 0 {
        return d;
    }
    let spread = ms.saturating_mul(u64::from(percent.min(100))) / 100;
    let offset = rng.below_or_eq(spread.saturating_mul(2));
    Duration::from_millis(ms.saturating_sub(spread).saturating_add(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladders() {
        let c = Config::default();
        assert_eq!(c.retry_delay(1), Duration::from_secs(1));
        assert_eq!(c.retry_delay(3), Duration::from_secs(4));
        assert_eq!(c.retry_delay(9), Duration::from_secs(4));
        assert_eq!(c.lane_backoff(1), Duration::from_secs(30));
        assert_eq!(c.lane_backoff(2), Duration::from_secs(60));
        assert_eq!(c.lane_backoff(40), Duration::from_secs(3600));
        assert_eq!(c.lane_backoff(u32::MAX), Duration::from_secs(3600));
        assert_eq!(c.lane_backoff(0), Duration::from_secs(30));
        let huge = Config {
            lane_backoff_base: Duration::MAX,
            lane_backoff_cap: Duration::MAX,
            ..Config::default()
        };
        assert_eq!(huge.lane_backoff(MAX_BACKOFF_LEVEL), Duration::MAX);
    }

    #[test]
    fn jitter_stays_in_band() {
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(10), 20, &mut rng);
            assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
        }
        assert_eq!(
            jittered(Duration::from_secs(1), 0, &mut rng),
            Duration::from_secs(1)
        );
    }
}
