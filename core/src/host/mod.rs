//! Hosts (origins: scheme, host and port of recipient URLs) as every lane and actor of a
//! process sees them: the [`HostBook`] (OL-21, OL-22, OL-23).
//!
//! One book per process, shared by every pass (the runtime keeps it behind a lock). Per host
//! it keeps:
//!
//! - **Health** (OL-21): connection-level failures in a row (refused, reset before an answer,
//!   name resolution, TLS handshake, connect timeout), counted across every lane and actor;
//!   a timeout (connected, no answer) counts too while the host has not answered in this
//!   process, and for a probe.
//!   After [`HostConfig::failures`] of them the host **backs off**: `backoff_base` doubled per
//!   failed probe, capped at `backoff_cap`, jittered (the functions lanes use:
//!   [`doubling`], [`jittered`]). Its
//!   attempts are [deferred](HostAnswer::Defer) to the next probe; one attempt per interval is
//!   the probe, and any HTTP answer reopens the host. With
//!   [`HostConfig::unavailable_after`], a host failing that long sets its units aside
//!   (`host_unavailable`).
//! - **Its share of the in-flight budget**: a window of attempts in flight, like a TCP
//!   congestion window. A host that has not answered yet in this process takes
//!   [`HostConfig::first_contact`] (3, as many as its failures in a row that back it off:
//!   a fourth attempt before its first answer could only fail or hang beside them) at once —
//!   a dead host with 200 lanes is tried by that many. Its first HTTP answer opens the window to half of
//!   [`HostConfig::max_in_flight`] (the process's concurrency); from there every answer that
//!   comes while the host uses at least half of its window adds one (so it doubles per round
//!   trip while the host keeps up), up to the whole budget; every timeout (connected, no
//!   answer) halves it, down to first contact again. So a host that answers a few attempts
//!   and then hangs holds at most half the budget, and every other host's attempts keep
//!   starting beside it; its timeouts then shrink it back to what a host never seen gets (no
//!   further: its lanes' attempts would wait for each other's timeouts, and a drain that
//!   waits for them would take a timeout per lane instead of one). A host that never
//!   answered does not keep its first contact in flight forever: its timeouts count as
//!   failures, and after [`HostConfig::failures`] of them it backs off as a dead host does. (A host that answered long enough
//!   to fill the whole budget and then hangs holds it until its timeouts: the budget is
//!   never taken back from attempts in flight.) After a connection failure, and while its
//!   signature scheme is being learned, a host takes one attempt at a time.
//! - **Its pace** (OL-23; [`HostConfig::paces`], a requests-per-second limit): the least time
//!   between two attempt starts to the host, whichever lanes and actors they come from. An
//!   attempt of a paced host goes only once `now` reaches the host's next start, which then
//!   moves one interval past the later of itself and `now` (a GCRA with no burst: no run of
//!   time holds more starts than it allows, rounded up); an attempt that comes sooner
//!   [waits](HostAnswer::Wait), holding no place. The pace is checked after the operator's
//!   control and the host's health (a held, dead-lettered or backing-off host answers as
//!   ever, and its probe is paced like any attempt) and together with the window (an
//!   attempt goes only if both let it). [`HostBook::poll_timeout`] says when the earliest
//!   paced host with waiting attempts may go again, and [`HostBook::poll_due`] names the
//!   hosts whose waiting attempts may then be asked about again: the runtime needs a timer
//!   for them, since no attempt's end may come to wake them. The book's time is in
//!   milliseconds: an interval is rounded up to whole milliseconds (at least one), so a pace
//!   never goes faster than asked.
//! - **The operator's control** ([`HostControl`]): held (its lanes are paused, and lanes that
//!   meet it later are paused for it: [`HostAnswer::Held`]) or dead-lettered
//!   ([`HostAnswer::SetAside`], reason `blocked`). It comes from the store, fenced: see
//!   [`HostBook::handle_rows`].
//! - **The signature scheme** it accepted, and the double-knock's plan for each attempt
//!   ([`knock`], OL-22).
//!
//! # Driving it
//!
//! For an attempt about to be sent, [`HostBook::handle_attempt`] answers go (with a
//! [`HostTicket`] and the knock's plan), wait (the host's window is full: ask again when one
//! of its attempts ends; or its pace: ask again when [`HostBook::poll_due`] names it, from
//! [`HostBook::poll_timeout`] on), defer, held or set aside. The attempt's end goes back with the
//! ticket ([`HostBook::handle_end`]); a ticket whose attempt was never sent gives its place
//! back ([`HostBook::handle_unsent`]). Rows read from the store come in through
//! [`HostBook::handle_rows`]; what changed is taken with [`HostBook::take_dirty`] to be
//! written, and [`HostBook::poll_event`] says what is worth a log line. Time is passed in;
//! jitter comes from a seeded [`Rng`].
//!
//! ```
//! use core::time::Duration;
//! use outbox_lanes_core::Timestamp;
//! use outbox_lanes_core::host::{HostAnswer, HostBook, HostConfig, HostEnd};
//!
//! let mut book = HostBook::new(HostConfig::default(), 7);
//! let now = Timestamp::from_secs(1_000);
//! let host = book.host("https://a.example:443");
//! let HostAnswer::Go(ticket) = book.handle_attempt(host, now) else {
//!     unreachable!("a new host takes its first attempts")
//! };
//! // … the attempt is sent; the host answers (any status) …
//! book.handle_end(ticket, HostEnd::Answered, None, None, now + Duration::from_millis(80));
//! while let Some(event) = book.poll_event() {
//!     let _ = event; // log it
//! }
//! for dirty in book.take_dirty() {
//!     let _ = (book.origin(dirty), book.state(dirty)); // write it to the store
//! }
//! ```

pub mod knock;

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;

use indexmap::IndexMap;

use crate::config::{doubling, jittered};
use crate::lane::KeyedState;
use crate::outcome::DeadReason;
use crate::rng::Rng;
use crate::time::Timestamp;

pub use knock::{
    Challenge, Knock, KnockPlan, KnockReport, KnockStep, SignatureMode, SignatureSpec, Signing,
};

/// The default [`HostConfig::failures`].
pub const DEFAULT_HOST_FAILURES: u32 = 3;
/// The default [`HostConfig::backoff_base`].
pub const DEFAULT_HOST_BACKOFF: Duration = Duration::from_secs(10);
/// The default [`HostConfig::backoff_cap`].
pub const DEFAULT_HOST_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// The default [`HostConfig::spec_retry`]: 7 days.
pub const DEFAULT_SPEC_RETRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// The default [`HostConfig::knock_retry`]: 1 hour.
pub const DEFAULT_KNOCK_RETRY: Duration = Duration::from_secs(3600);
/// The default [`HostConfig::first_contact`].
pub const DEFAULT_FIRST_CONTACT: u32 = 3;

/// How hosts are judged (see the [module documentation](self)).
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Connection-level failures in a row after which a host backs off. `0` turns host
    /// health off (every lane on its own). Default 3.
    pub failures: u32,
    /// The first backoff of a host; each failed probe doubles it. Default 10 s.
    pub backoff_base: Duration,
    /// The longest backoff of a host. Default 1 h.
    pub backoff_cap: Duration,
    /// Jitter of host backoffs and deferrals, in percent. Default 20.
    pub jitter_percent: u32,
    /// Units of a host failing at the connection level for this long are set aside
    /// (`host_unavailable`): its lanes' attempts are deferred to the host's probes meanwhile,
    /// so they would never reach the lanes' own unavailable rule. Default 7 days
    /// ([`DEFAULT_LANE_UNAVAILABLE_AFTER`](crate::config::DEFAULT_LANE_UNAVAILABLE_AFTER));
    /// `None`: never.
    pub unavailable_after: Option<Duration>,
    /// The window of attempts in flight a host starts with: what a host that has not
    /// answered yet takes at once (a dead host with 200 lanes is tried by that many).
    /// Default 3 ([`DEFAULT_HOST_FAILURES`]).
    pub first_contact: u32,
    /// The largest window of a host: the process's concurrency. Default `u32::MAX`.
    pub max_in_flight: u32,
    /// How long an attempt is deferred while its host's probe is out. Default 5 s.
    pub probe_wait: Duration,
    /// What signs the attempts ([`Signing`]). Default: plain, RFC 9421 named.
    pub signing: Signing,
    /// How long a host known to take only draft-cavage is signed so before RFC 9421 is
    /// offered again. Default 7 days.
    pub spec_retry: Duration,
    /// After a host refused both schemes in one attempt, how long its attempts get no second
    /// request. Default 1 h.
    pub knock_retry: Duration,
    /// A 5xx to a request in a scheme not known for the host is read as a refusal of the
    /// signature (`--signature-fallback-on-5xx`). Default false.
    pub knock_on_5xx: bool,
    /// Paced hosts: an origin (`scheme://host:port`, as recipients' origins are written) and
    /// the least time between two attempt starts to it (`1 / rate`; rounded up to whole
    /// milliseconds, at least one). A host gets its pace when the book first meets it; a
    /// zero interval paces nothing; of two entries for one origin the later wins. Default
    /// none.
    pub paces: Vec<(String, Duration)>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            failures: DEFAULT_HOST_FAILURES,
            backoff_base: DEFAULT_HOST_BACKOFF,
            backoff_cap: DEFAULT_HOST_BACKOFF_CAP,
            jitter_percent: 20,
            unavailable_after: Some(crate::config::DEFAULT_LANE_UNAVAILABLE_AFTER),
            first_contact: DEFAULT_FIRST_CONTACT,
            max_in_flight: u32::MAX,
            probe_wait: Duration::from_secs(5),
            signing: Signing::Plain(SignatureSpec::Rfc9421),
            spec_retry: DEFAULT_SPEC_RETRY,
            knock_retry: DEFAULT_KNOCK_RETRY,
            knock_on_5xx: false,
            paces: Vec::new(),
        }
    }
}

/// What an operator decided about a host (`outbox-lanes hosts block`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HostControl {
    /// Not blocked.
    #[default]
    Open,
    /// Blocked: nothing is sent to it; its lanes are paused for it.
    Hold,
    /// Blocked with dead letters: its units are dead-lettered as `blocked`.
    DeadLetter,
}

impl HostControl {
    /// `open`, `held` or `dead_letter`, as the CLI shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            HostControl::Open => "open",
            HostControl::Hold => "held",
            HostControl::DeadLetter => "dead_letter",
        }
    }
}

/// A host's state as relays share it through the store (`ol_hosts`, without the origin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostState {
    /// Connection-level failures in a row.
    pub failures: u32,
    /// The backoff level: 0 while the host is open.
    pub level: u32,
    /// While in backoff: when the next probe may go.
    pub not_before: Option<Timestamp>,
    /// When the failures in a row began (`None` once it answered).
    pub failing_since: Option<Timestamp>,
    /// The last connection failure.
    pub last_error: Option<String>,
    /// The operator's control (written only by operators).
    pub control: HostControl,
    /// The signature scheme the host accepted, and when that was learned.
    pub spec: Option<(SignatureSpec, Timestamp)>,
    /// When the state last changed (the clock of whoever changed it).
    pub updated_at: Timestamp,
}

impl HostState {
    /// A host nothing is known about.
    pub fn new(at: Timestamp) -> HostState {
        HostState {
            failures: 0,
            level: 0,
            not_before: None,
            failing_since: None,
            last_error: None,
            control: HostControl::Open,
            spec: None,
            updated_at: at,
        }
    }

    /// Whether the host is open (not backing off).
    pub fn open(&self) -> bool {
        self.level == 0
    }
}

/// A host of the book: its index in interning order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(u32);

impl HostId {
    /// The index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// An attempt's place under its host: given with [`HostAnswer::Go`], handed back with the
/// attempt's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct HostTicket {
    host: HostId,
    probe: bool,
    /// The double-knock's plan for the attempt.
    pub knock: KnockPlan,
}

impl HostTicket {
    /// The host.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// Whether the attempt is its host's probe.
    pub fn probe(&self) -> bool {
        self.probe
    }
}

/// Why an attempt is deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// The host backs off after connection failures in a row.
    BackingOff,
    /// The host's probe is out; its answer decides.
    ProbeOut,
}

/// What [`HostBook::handle_attempt`] decided for an attempt about to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum HostAnswer {
    /// Send it.
    Go(HostTicket),
    /// The host's window is full: ask again when one of its attempts ends; or the host is
    /// paced and its next start is later: ask again when [`HostBook::poll_due`] names it
    /// (from [`HostBook::poll_timeout`] on). The attempt waits without holding a worker.
    Wait,
    /// Not sent: the lane waits `wait` (nothing counted, its own backoff untouched).
    Defer {
        /// How long.
        wait: Duration,
        /// Why.
        why: Deferral,
    },
    /// Not sent: an operator holds the host; the lane is paused for it.
    Held,
    /// Not sent, never: dead-letter the unit for this recipient with `reason` (`blocked`,
    /// `host_unavailable`).
    SetAside {
        /// The dead letter's reason.
        reason: DeadReason,
    },
}

/// How an attempt ended, as its host sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostEnd {
    /// An HTTP answer, whatever its status: the host is up.
    Answered,
    /// A connection-level failure: refused, reset or closed before an answer, name
    /// resolution, TLS handshake, connect timeout.
    ConnectionFailed,
    /// Connected, but no answer within the timeout: the host may hang. Counted as a failure
    /// while the host has not answered in this process, and for a probe.
    TimedOut,
    /// Nothing the host did (not sent, a refused address, a failure on our side).
    Silent,
}

/// A change worth a log line; every one also marks its host for writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// The host backs off after `failures` connection failures in a row; next probe in
    /// `wait`.
    BackedOff {
        /// The host.
        host: HostId,
        /// Failures in a row.
        failures: u32,
        /// Until the next probe.
        wait: Duration,
    },
    /// A probe failed: the backoff is extended to `level`.
    ProbeFailed {
        /// The host.
        host: HostId,
        /// The new level.
        level: u32,
        /// Until the next probe.
        wait: Duration,
    },
    /// The host answered again after a backoff of `level`.
    Reopened {
        /// The host.
        host: HostId,
        /// The level it was at.
        level: u32,
    },
    /// The host accepted `spec`, which was not what was known.
    SchemeLearned {
        /// The host.
        host: HostId,
        /// The scheme.
        spec: SignatureSpec,
    },
    /// An attempt timed out: the host's window shrank to `window`.
    WindowShrunk {
        /// The host.
        host: HostId,
        /// The new window.
        window: u32,
    },
}

/// One host's live state.
#[derive(Debug)]
struct Host {
    shared: HostState,
    /// Changed since it was last taken for writing.
    dirty: bool,
    /// Attempts in flight (sent, not ended).
    in_flight: u32,
    /// The probe is out.
    probing: bool,
    /// The host's window (see the module documentation).
    window: u32,
    /// It answered once in this process: its window opened past first contact.
    opened: bool,
    /// When an attempt last found both schemes refused.
    knock_refused_at: Option<Timestamp>,
    /// Its pace, if it is paced.
    pace: Option<Pace>,
}

impl Host {
    /// Marks it changed, to be written: listed in `marked` (the book's) the first time.
    fn mark_dirty(&mut self, id: HostId, marked: &mut Vec<HostId>) {
        if !self.dirty {
            self.dirty = true;
            marked.push(id);
        }
    }
}

/// A paced host's spacing of attempt starts.
#[derive(Debug)]
struct Pace {
    /// The least time between two starts, in whole milliseconds.
    interval: Duration,
    /// When the next attempt may start.
    next: Timestamp,
    /// While attempts wait for the pace: the host's key in [`HostBook::paced`] (its `next`
    /// when it was put there or last moved).
    queued: Option<Timestamp>,
}

impl Pace {
    /// Whether an attempt may start `now`.
    fn due(&self, now: Timestamp) -> bool {
        now >= self.next
    }
}

/// The hosts of a process (see the [module documentation](self)).
#[derive(Debug)]
pub struct HostBook {
    cfg: HostConfig,
    hosts: IndexMap<String, Host, KeyedState>,
    rng: Rng,
    events: VecDeque<HostEvent>,
    /// The operators' host-control generation last applied ([`HostBook::handle_rows`]).
    generation: u64,
    /// The configured paces by origin, given to a host when it becomes known.
    paces: BTreeMap<String, Duration>,
    /// Paced hosts with attempts waiting for their pace, by when they may go.
    paced: BTreeSet<(Timestamp, HostId)>,
    /// The hosts marked dirty since the last [`HostBook::take_dirty`], each once per marking
    /// (one made clean again by [`HostBook::handle_rows`] may stay listed: the flag decides),
    /// so that finding and taking them does not scan every host at each attempt's end.
    marked: Vec<HostId>,
}

impl HostBook {
    /// A book of no hosts; `seed` drives its jitter and its hasher.
    pub fn new(cfg: HostConfig, seed: u64) -> HostBook {
        let paces = cfg
            .paces
            .iter()
            .filter(|(_, d)| !d.is_zero())
            .map(|(o, d)| (o.clone(), whole_millis(*d)))
            .collect();
        HostBook {
            paces,
            paced: BTreeSet::new(),
            marked: Vec::new(),
            cfg,
            hosts: IndexMap::with_hasher(KeyedState::new(seed ^ 0x686f_7374)),
            rng: Rng::new(seed),
            events: VecDeque::new(),
            generation: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    /// The host of `origin` (`scheme://host:port`), known from now on.
    pub fn host(&mut self, origin: &str) -> HostId {
        if let Some(i) = self.hosts.get_index_of(origin) {
            return HostId(i as u32);
        }
        let pace = self.paces.get(origin).map(|&interval| Pace {
            interval,
            next: Timestamp::EPOCH,
            queued: None,
        });
        let (i, _) = self.hosts.insert_full(
            String::from(origin),
            Host {
                shared: HostState::new(Timestamp::EPOCH),
                dirty: false,
                in_flight: 0,
                probing: false,
                window: self
                    .cfg
                    .first_contact
                    .clamp(1, self.cfg.max_in_flight.max(1)),
                opened: false,
                knock_refused_at: None,
                pace,
            },
        );
        HostId(i as u32)
    }

    /// The host of `origin`, if known.
    pub fn find(&self, origin: &str) -> Option<HostId> {
        self.hosts.get_index_of(origin).map(|i| HostId(i as u32))
    }

    /// Every host, in the order they became known.
    pub fn hosts(&self) -> impl Iterator<Item = HostId> + '_ {
        (0..self.hosts.len()).map(|i| HostId(i as u32))
    }

    /// The origin of `host`.
    pub fn origin(&self, host: HostId) -> &str {
        self.hosts
            .get_index(host.index())
            .map_or("", |(o, _)| o.as_str())
    }

    /// The shared state of `host`.
    pub fn state(&self, host: HostId) -> &HostState {
        &self.get(host).shared
    }

    /// `host`'s attempts in flight and its window.
    pub fn load(&self, host: HostId) -> (u32, u32) {
        let h = self.get(host);
        (h.in_flight, h.window)
    }

    /// `host`'s pace (the least time between two attempt starts, in whole milliseconds), if
    /// it is paced.
    pub fn pace(&self, host: HostId) -> Option<Duration> {
        self.get(host).pace.as_ref().map(|p| p.interval)
    }

    /// When the earliest paced host with attempts waiting for its pace may go again: the
    /// runtime asks [`HostBook::poll_due`] then (no attempt's end may come before to wake
    /// them). `None`: no attempt waits for a pace.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.paced.first().map(|&(at, _)| at)
    }

    /// The next paced host whose attempts waited for its pace and may go `now`: the runtime
    /// asks [`HostBook::handle_attempt`] again for each of its waiting attempts, in order,
    /// until one must wait again (which puts the host back here, at its next start). Call it
    /// until `None`. O(log paced hosts) each.
    pub fn poll_due(&mut self, now: Timestamp) -> Option<HostId> {
        let &(at, host) = self.paced.first()?;
        if at > now {
            return None;
        }
        self.paced.pop_first();
        if let Some(p) = self.hosts[host.index()].pace.as_mut() {
            p.queued = None;
        }
        Some(host)
    }

    /// The operators' host-control generation last applied.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn get(&self, host: HostId) -> &Host {
        &self.hosts[host.index()]
    }

    fn get_mut(&mut self, host: HostId) -> &mut Host {
        &mut self.hosts[host.index()]
    }

    /// An attempt to `host` is about to be sent: go, wait, defer, held or set aside (see
    /// [`HostAnswer`]). A [`HostAnswer::Go`] counts it in flight until its ticket comes back,
    /// and takes the host's pace: its next start moves one interval on. A wait for the pace
    /// puts the host under [`HostBook::poll_timeout`].
    pub fn handle_attempt(&mut self, host: HostId, now: Timestamp) -> HostAnswer {
        let cfg = &self.cfg;
        let paced = &mut self.paced;
        let h = &mut self.hosts[host.index()];
        match h.shared.control {
            HostControl::Hold => return HostAnswer::Held,
            HostControl::DeadLetter => {
                return HostAnswer::SetAside {
                    reason: DeadReason::Blocked,
                };
            }
            HostControl::Open => {}
        }
        if cfg.failures > 0 && !h.shared.open() {
            if let (Some(after), Some(since)) = (cfg.unavailable_after, h.shared.failing_since)
                && now.saturating_duration_since(since) >= after
            {
                return HostAnswer::SetAside {
                    reason: DeadReason::HostUnavailable,
                };
            }
            let due = h.shared.not_before.is_none_or(|nb| nb <= now);
            if due && !h.probing {
                // The probe is paced like any attempt.
                if wait_for_pace(h, host, paced, now) {
                    return HostAnswer::Wait;
                }
                start(h, host, paced, now);
                h.probing = true;
                h.in_flight += 1;
                let knock = plan(cfg, h, now);
                return HostAnswer::Go(HostTicket {
                    host,
                    probe: true,
                    knock,
                });
            }
            let (wait, why) = match h.shared.not_before {
                Some(nb) if nb > now => (nb.saturating_duration_since(now), Deferral::BackingOff),
                _ => (cfg.probe_wait, Deferral::ProbeOut),
            };
            // Spread apart, never earlier than due.
            let wait = jittered(wait, cfg.jitter_percent, &mut self.rng).max(wait);
            return HostAnswer::Defer { wait, why };
        }
        let knock = plan(cfg, h, now);
        // A full window waits for an attempt's end, which asks again; only a window with
        // room waits for the pace (and the timer).
        if h.in_flight < limit(cfg, h, &knock) && !wait_for_pace(h, host, paced, now) {
            start(h, host, paced, now);
            h.in_flight += 1;
            return HostAnswer::Go(HostTicket {
                host,
                probe: false,
                knock,
            });
        }
        HostAnswer::Wait
    }

    /// A ticket's attempt was never sent (the executor refused it, it was dropped unrun): its
    /// place is given back, nothing is learned.
    pub fn handle_unsent(&mut self, ticket: HostTicket) {
        let h = self.get_mut(ticket.host);
        h.in_flight = h.in_flight.saturating_sub(1);
        if ticket.probe {
            h.probing = false;
        }
    }

    /// A ticket's attempt ended: `end` (with the connection error, if it failed) and what its
    /// knock taught. Waiting attempts of the host may go now (ask again).
    pub fn handle_end(
        &mut self,
        ticket: HostTicket,
        end: HostEnd,
        error: Option<&str>,
        knock: Option<KnockReport>,
        now: Timestamp,
    ) {
        self.handle_unsent(ticket);
        let host = ticket.host;
        match end {
            HostEnd::ConnectionFailed if self.cfg.failures > 0 => {
                self.failed_in_a_row(host, ticket.probe, error, now);
            }
            HostEnd::Answered => self.answered(host, now),
            HostEnd::TimedOut => {
                let floor = self
                    .cfg
                    .first_contact
                    .clamp(1, self.cfg.max_in_flight.max(1));
                let h = self.get_mut(host);
                let window = (h.window / 2).max(floor);
                let opened = h.opened;
                if window < h.window {
                    h.window = window;
                    self.events
                        .push_back(HostEvent::WindowShrunk { host, window });
                }
                // A host that never answered in this process, or a probe, timing out: judged
                // as a dead host (a place held for a whole timeout per lane and retry, else).
                if self.cfg.failures > 0 && (!opened || ticket.probe) {
                    self.failed_in_a_row(host, ticket.probe, error, now);
                }
            }
            HostEnd::ConnectionFailed | HostEnd::Silent => {}
        }
        if let Some(report) = knock {
            self.learn(host, ticket.knock, report, now);
        }
    }

    /// A failure counted in a row: a connection failure, or a timeout of a host that has
    /// not answered (or of a probe); backs the host off at the threshold, or extends it.
    fn failed_in_a_row(&mut self, host: HostId, probe: bool, error: Option<&str>, now: Timestamp) {
        let cfg = &self.cfg;
        let h = &mut self.hosts[host.index()];
        h.mark_dirty(host, &mut self.marked);
        let s = &mut h.shared;
        s.failures = s.failures.saturating_add(1);
        s.failing_since.get_or_insert(now);
        s.last_error = error.map(String::from);
        s.updated_at = now;
        if probe || (s.open() && s.failures >= cfg.failures) {
            s.level = s.level.saturating_add(1);
            let wait = jittered(
                doubling(cfg.backoff_base, cfg.backoff_cap, s.level),
                cfg.jitter_percent,
                &mut self.rng,
            );
            s.not_before = Some(now + wait);
            self.events.push_back(if s.level == 1 {
                HostEvent::BackedOff {
                    host,
                    failures: s.failures,
                    wait,
                }
            } else {
                HostEvent::ProbeFailed {
                    host,
                    level: s.level,
                    wait,
                }
            });
        }
    }

    fn answered(&mut self, host: HostId, now: Timestamp) {
        let max = self.cfg.max_in_flight.max(1);
        let h = &mut self.hosts[host.index()];
        let s = &mut h.shared;
        let level = s.level;
        if s.failures > 0 || s.level > 0 || s.failing_since.is_some() {
            s.failures = 0;
            s.level = 0;
            s.not_before = None;
            s.failing_since = None;
            s.updated_at = now;
            h.mark_dirty(host, &mut self.marked);
            h.probing = false;
        }
        if !h.opened {
            // Its first answer: half the budget at once (a host that answers and then hangs
            // holds no more), the rest earned by answers.
            h.opened = true;
            h.window = h.window.max(max / 2);
        } else if (h.in_flight + 1).saturating_mul(2) >= h.window && h.window < max {
            // The window grows while it is used: an answer that came while at least half of
            // it was out lets one more go (doubling per round trip).
            h.window += 1;
        }
        if level > 0 {
            self.events.push_back(HostEvent::Reopened { host, level });
        }
    }

    fn learn(&mut self, host: HostId, plan: KnockPlan, report: KnockReport, now: Timestamp) {
        if self.cfg.signing != Signing::Auto {
            return;
        }
        let h = &mut self.hosts[host.index()];
        if report.refused_both {
            h.knock_refused_at = Some(now);
        }
        let Some(spec) = report.accepted else {
            return;
        };
        let known = h.shared.spec.map(|(s, _)| s);
        // A cavage host that took cavage again after an RFC 9421 trial: the trial is over
        // for another period.
        let trial_over = known == Some(SignatureSpec::Cavage)
            && spec == SignatureSpec::Cavage
            && plan.first == SignatureSpec::Rfc9421;
        if known == Some(spec) && !trial_over {
            return;
        }
        h.shared.spec = Some((spec, now));
        h.shared.updated_at = now;
        h.mark_dirty(host, &mut self.marked);
        if known != Some(spec) {
            self.events
                .push_back(HostEvent::SchemeLearned { host, spec });
        }
    }

    /// Rows read from the store: `(origin, state)` of every host with a row, read *after*
    /// the operators' host-control `generation` (read first, so the rows are at least as new).
    ///
    /// - A generation newer than the book's: an operator acted on a host since. Every row is
    ///   taken as it is — control, health and scheme — over what this process saw, so that a
    ///   `hosts retry` forgets failures and the scheme and a block or unblock holds, in every
    ///   relay, before its next start (the fence: the runtime calls this on a read of the
    ///   generation that it starts attempts on).
    /// - Otherwise (a periodic read): the operator's control is taken from a read of the
    ///   current generation only (an older read may predate an action already applied), and
    ///   health and scheme from a row written later than this process's own unwritten
    ///   change.
    pub fn handle_rows<'a>(
        &mut self,
        generation: u64,
        rows: impl IntoIterator<Item = (&'a str, HostState)>,
    ) {
        let operator = generation > self.generation;
        let current = generation >= self.generation;
        self.generation = self.generation.max(generation);
        for (origin, row) in rows {
            let id = self.host(origin);
            let h = self.get_mut(id);
            if current {
                h.shared.control = row.control;
            }
            if operator || (row.updated_at > h.shared.updated_at && !h.dirty) {
                if row.open() && (operator || !h.shared.open()) {
                    h.probing = false;
                }
                if row.spec.is_none() {
                    h.knock_refused_at = None;
                }
                let control = h.shared.control;
                h.shared = HostState { control, ..row };
                h.dirty = false;
            }
        }
    }

    /// The hosts whose shared state changed since the last call, to be written.
    pub fn take_dirty(&mut self) -> Vec<HostId> {
        let mut out = Vec::new();
        for id in core::mem::take(&mut self.marked) {
            let h = &mut self.hosts[id.index()];
            if h.dirty {
                h.dirty = false;
                out.push(id);
            }
        }
        // In the hosts' order, as a scan of every host gave them.
        out.sort_unstable();
        out
    }

    /// The write of `host` failed: it is taken again at the next [`HostBook::take_dirty`].
    pub fn mark_dirty(&mut self, host: HostId) {
        let h = &mut self.hosts[host.index()];
        h.mark_dirty(host, &mut self.marked);
    }

    /// Whether a change waits to be written.
    pub fn has_dirty(&self) -> bool {
        self.marked.iter().any(|id| self.hosts[id.index()].dirty)
    }

    /// The next change worth a log line.
    pub fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }
}

/// `d` in whole milliseconds, rounded up (the book's time is milliseconds): a pace never goes
/// faster than asked.
fn whole_millis(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX).max(1))
}

/// Whether an attempt to paced `h` must wait for its pace `now`; if so the host is put under
/// the book's pace timer (`paced`) at its next start, once.
fn wait_for_pace(
    h: &mut Host,
    host: HostId,
    paced: &mut BTreeSet<(Timestamp, HostId)>,
    now: Timestamp,
) -> bool {
    let Some(p) = h.pace.as_mut() else {
        return false;
    };
    if p.due(now) {
        return false;
    }
    if p.queued != Some(p.next) {
        if let Some(old) = p.queued {
            paced.remove(&(old, host));
        }
        paced.insert((p.next, host));
        p.queued = Some(p.next);
    }
    true
}

/// An attempt to `h` starts `now`: its pace's next start moves one interval past the later
/// of itself and `now`, and attempts waiting for the pace wait for that.
fn start(h: &mut Host, host: HostId, paced: &mut BTreeSet<(Timestamp, HostId)>, now: Timestamp) {
    let Some(p) = h.pace.as_mut() else {
        return;
    };
    p.next = p.next.max(now) + p.interval;
    if let Some(old) = p.queued {
        paced.remove(&(old, host));
        paced.insert((p.next, host));
        p.queued = Some(p.next);
    }
}

/// Attempts `h` may have in flight, with `knock` the plan of an attempt to it now: one while
/// its scheme is learned (the double-knock applies, the scheme is not known or a cavage host
/// is due for its RFC 9421 trial, and a second request may be tried) or after a connection
/// failure (what is in flight tells first), else its window.
fn limit(cfg: &HostConfig, h: &Host, knock: &KnockPlan) -> u32 {
    let learning = cfg.signing == Signing::Auto && !knock.known && knock.fallback.is_some();
    if learning || (cfg.failures > 0 && h.shared.failures > 0) {
        1
    } else {
        h.window.max(1)
    }
}

/// The double-knock's plan for an attempt to `h` now.
fn plan(cfg: &HostConfig, h: &Host, now: Timestamp) -> KnockPlan {
    if cfg.signing != Signing::Auto {
        return KnockPlan::unknown(cfg.signing, cfg.knock_on_5xx);
    }
    let spec = h.shared.spec;
    let knock_ok = h
        .knock_refused_at
        .is_none_or(|t| now.saturating_duration_since(t) >= cfg.knock_retry);
    let (first, fallback, known) = match spec {
        None => (
            SignatureSpec::Rfc9421,
            knock_ok.then_some(SignatureSpec::Cavage),
            false,
        ),
        // The trial of RFC 9421 on a cavage host: cavage is known to work.
        Some((SignatureSpec::Cavage, at))
            if now.saturating_duration_since(at) >= cfg.spec_retry =>
        {
            (SignatureSpec::Rfc9421, Some(SignatureSpec::Cavage), false)
        }
        Some((known, _)) => (known, knock_ok.then_some(known.other()), true),
    };
    KnockPlan {
        first,
        fallback,
        known,
        challenges: true,
        on_5xx: cfg.knock_on_5xx,
    }
}
