//! Transcripts of the host book's pacing (a per-host requests-per-second limit) in virtual
//! time: which attempts go, which wait, and when the book says to ask again. A small gate
//! below plays the runtime's part (attempts that wait queue per host and are asked about
//! again when the book's pace timer is due or when an attempt of the host ends).
#![allow(missing_docs, clippy::unwrap_used)]

use core::time::Duration;
use std::collections::{HashMap, VecDeque};

use outbox_lanes_core::host::{
    Deferral, HostAnswer, HostBook, HostConfig, HostControl, HostEnd, HostId, HostState, HostTicket,
};
use outbox_lanes_core::{DeadReason, Timestamp};

const A: &str = "https://a.example:443";
const B: &str = "https://b.example:443";

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000 + ms)
}

/// `origin` paced; a first contact of ten, so that the window is not what holds the
/// attempts back before the first answer (the pace is).
fn paced(origin: &str, interval_ms: u64) -> HostConfig {
    HostConfig {
        paces: vec![(origin.to_owned(), Duration::from_millis(interval_ms))],
        first_contact: 10,
        ..HostConfig::default()
    }
}

fn go(book: &mut HostBook, host: HostId, now: Timestamp) -> HostTicket {
    match book.handle_attempt(host, now) {
        HostAnswer::Go(t) => t,
        other => panic!("expected go, got {other:?}"),
    }
}

/// The runtime's part: per host, the attempts waiting (by number), and every start.
#[derive(Default)]
struct Gate {
    waiting: HashMap<HostId, VecDeque<u32>>,
    /// (attempt, host, when) of every attempt that went, in order.
    started: Vec<(u32, HostId, Timestamp)>,
    /// Tickets of the attempts in flight.
    in_flight: Vec<HostTicket>,
}

impl Gate {
    /// A new attempt `n` to `host` (the gate asks the book at once, as `execute` does).
    fn attempt(&mut self, book: &mut HostBook, host: HostId, n: u32, now: Timestamp) -> bool {
        match book.handle_attempt(host, now) {
            HostAnswer::Go(ticket) => {
                self.started.push((n, host, now));
                self.in_flight.push(ticket);
                true
            }
            HostAnswer::Wait => {
                self.waiting.entry(host).or_default().push_back(n);
                false
            }
            other => panic!("attempt {n}: {other:?}"),
        }
    }

    /// Asks again about `host`'s waiting attempts, in order, until one must wait again.
    fn readmit(&mut self, book: &mut HostBook, host: HostId, now: Timestamp) {
        while let Some(&n) = self.waiting.get(&host).and_then(VecDeque::front) {
            match book.handle_attempt(host, now) {
                HostAnswer::Go(ticket) => {
                    self.waiting.get_mut(&host).unwrap().pop_front();
                    self.started.push((n, host, now));
                    self.in_flight.push(ticket);
                }
                HostAnswer::Wait => return,
                other => panic!("attempt {n}: {other:?}"),
            }
        }
    }

    /// The pace timer fired at `now`.
    fn timer(&mut self, book: &mut HostBook, now: Timestamp) {
        while let Some(host) = book.poll_due(now) {
            self.readmit(book, host, now);
        }
    }

    /// Every attempt in flight answered at `now`; their hosts' waiting attempts are asked
    /// about again.
    fn answer_all(&mut self, book: &mut HostBook, now: Timestamp) {
        for ticket in std::mem::take(&mut self.in_flight) {
            book.handle_end(ticket, HostEnd::Answered, None, None, now);
            self.readmit(book, ticket.host(), now);
        }
    }

    fn waiting(&self, host: HostId) -> usize {
        self.waiting.get(&host).map_or(0, VecDeque::len)
    }

    fn starts(&self, host: HostId) -> Vec<Timestamp> {
        self.started
            .iter()
            .filter(|s| s.1 == host)
            .map(|s| s.2)
            .collect()
    }
}

#[test]
fn ten_attempts_at_once_one_goes_then_one_per_interval() {
    let mut book = HostBook::new(paced(A, 100), 1);
    let a = book.host(A);
    assert_eq!(book.pace(a), Some(Duration::from_millis(100)));
    let mut gate = Gate::default();
    let went: Vec<bool> = (0..10)
        .map(|n| gate.attempt(&mut book, a, n, t(0)))
        .collect();
    assert_eq!(
        went,
        [
            true, false, false, false, false, false, false, false, false, false
        ]
    );
    // Nothing ends: the pace alone says when the next may go.
    assert_eq!(book.poll_timeout(), Some(t(100)));
    assert_eq!(book.poll_due(t(99)), None);
    for k in 1..10u64 {
        let now = book.poll_timeout().expect("attempts wait for the pace");
        assert_eq!(now, t(100 * k));
        gate.timer(&mut book, now);
        assert_eq!(
            gate.started.len() as u64,
            k + 1,
            "one more at {k} intervals"
        );
        assert_eq!(book.poll_due(now), None, "asked once per host and deadline");
    }
    // All went, in order, 100 ms apart; nothing waits, no timer.
    let order: Vec<u32> = gate.started.iter().map(|s| s.0).collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
    assert_eq!(gate.waiting(a), 0);
    assert_eq!(book.poll_timeout(), None);
    // The window still counts them: ten in flight, the first contact's whole window.
    assert_eq!(book.load(a), (10, 10));
}

#[test]
fn a_steady_backlog_goes_at_the_pace_for_a_minute_whenever_attempts_come() {
    let mut book = HostBook::new(paced(A, 100), 2);
    let a = book.host(A);
    let mut gate = Gate::default();
    let mut n = 0;
    // A backlog, and a new attempt every 7 ms besides (the execute path, between timers),
    // each answered 30 ms after it went.
    for _ in 0..50 {
        gate.attempt(&mut book, a, n, t(0));
        n += 1;
    }
    let end = t(60_000);
    let mut now = t(0);
    let mut next_arrival = t(7);
    let mut next_answer: Option<Timestamp> = Some(t(30));
    while now < end {
        let mut next = next_arrival;
        if let Some(d) = book.poll_timeout() {
            next = next.min(d);
        }
        if let Some(d) = next_answer {
            next = next.min(d);
        }
        now = next;
        if now >= end {
            break;
        }
        if now == next_arrival {
            gate.attempt(&mut book, a, n, now);
            n += 1;
            next_arrival = now + Duration::from_millis(7);
        }
        if next_answer == Some(now) {
            gate.answer_all(&mut book, now);
            next_answer = None;
        }
        gate.timer(&mut book, now);
        if next_answer.is_none() && !gate.in_flight.is_empty() {
            next_answer = Some(now + Duration::from_millis(30));
        }
    }
    let starts = gate.starts(a);
    assert!(gate.waiting(a) > 0, "the backlog lasted");
    assert!(
        (599..=601).contains(&starts.len()),
        "{} starts in 60 s at 10 per second",
        starts.len()
    );
    for w in starts.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_millis(100), "{w:?}");
    }
    // No second holds more than ten.
    for s in &starts {
        let in_second = starts
            .iter()
            .filter(|x| **x >= *s && **x < *s + Duration::from_secs(1))
            .count();
        assert!(
            in_second <= 10,
            "{in_second} starts in the second from {s:?}"
        );
    }
}

#[test]
fn an_unpaced_host_beside_a_paced_one_is_not_slowed() {
    let mut book = HostBook::new(paced(A, 100), 3);
    let a = book.host(A);
    let b = book.host(B);
    assert_eq!(book.pace(b), None);
    let mut gate = Gate::default();
    for n in 0..10 {
        gate.attempt(&mut book, a, n, t(0));
        gate.attempt(&mut book, b, 100 + n, t(0));
    }
    // B takes its first contact's window at once; A one.
    assert_eq!(gate.starts(b).len(), 10);
    assert_eq!(gate.starts(a).len(), 1);
    // B's answers come and its next attempts go at once, while A waits for its pace.
    gate.answer_all(&mut book, t(20));
    for n in 10..20 {
        assert!(gate.attempt(&mut book, b, 100 + n, t(21)));
    }
    assert!(!gate.attempt(&mut book, a, 10, t(21)));
    assert_eq!(book.poll_timeout(), Some(t(100)));
    gate.timer(&mut book, t(100));
    assert_eq!(gate.starts(a), [t(0), t(100)]);
}

#[test]
fn a_paced_host_keeps_its_window() {
    let mut book = HostBook::new(
        HostConfig {
            first_contact: 2,
            ..paced(A, 10)
        },
        4,
    );
    let a = book.host(A);
    let mut gate = Gate::default();
    assert!(gate.attempt(&mut book, a, 0, t(0)));
    // Room in the window, not the pace: waits for the pace timer.
    assert!(!gate.attempt(&mut book, a, 1, t(5)));
    assert_eq!(book.poll_timeout(), Some(t(10)));
    gate.timer(&mut book, t(10));
    assert_eq!(gate.starts(a), [t(0), t(10)]);
    // Due for its pace, but the window (2) is full: waits for an end, not for a timer.
    assert!(!gate.attempt(&mut book, a, 2, t(20)));
    assert_eq!(book.poll_timeout(), None);
    // An end lets it go.
    let first = gate.in_flight.remove(0);
    book.handle_end(first, HostEnd::Answered, None, None, t(25));
    gate.readmit(&mut book, a, t(25));
    assert_eq!(gate.starts(a), [t(0), t(10), t(25)]);
    // The end of an attempt asks about a host its pace keeps waiting: the timer keeps it,
    // once.
    assert!(!gate.attempt(&mut book, a, 3, t(28)));
    assert_eq!(book.poll_timeout(), Some(t(35)));
    gate.answer_all(&mut book, t(30));
    assert_eq!(gate.waiting(a), 1);
    assert_eq!(book.poll_timeout(), Some(t(35)));
    gate.timer(&mut book, t(35));
    assert_eq!(book.poll_timeout(), None);
    assert_eq!(gate.starts(a), [t(0), t(10), t(25), t(35)]);
}

#[test]
fn an_operator_hold_and_a_backoff_answer_before_the_pace() {
    let mut book = HostBook::new(
        HostConfig {
            failures: 1,
            jitter_percent: 0,
            ..paced(A, 60_000)
        },
        5,
    );
    let a = book.host(A);
    let first = go(&mut book, a, t(0));
    assert_eq!(book.handle_attempt(a, t(1)), HostAnswer::Wait);
    // Held by an operator: held at once, whatever the pace.
    let held = HostState {
        control: HostControl::Hold,
        ..HostState::new(t(2))
    };
    book.handle_rows(1, [(A, held)]);
    assert_eq!(book.handle_attempt(a, t(3)), HostAnswer::Held);
    let dead = HostState {
        control: HostControl::DeadLetter,
        ..HostState::new(t(4))
    };
    book.handle_rows(2, [(A, dead)]);
    assert_eq!(
        book.handle_attempt(a, t(5)),
        HostAnswer::SetAside {
            reason: DeadReason::Blocked
        }
    );
    book.handle_rows(3, [(A, HostState::new(t(6)))]);
    // A connection failure backs it off: deferred, not waiting for the pace.
    let refused = Some("connection_refused: Connection refused");
    book.handle_end(first, HostEnd::ConnectionFailed, refused, None, t(10));
    assert_eq!(
        book.handle_attempt(a, t(11)),
        HostAnswer::Defer {
            wait: Duration::from_millis(9_999),
            why: Deferral::BackingOff
        }
    );
}

#[test]
fn a_probe_is_paced() {
    let mut book = HostBook::new(
        HostConfig {
            failures: 1,
            jitter_percent: 0,
            ..paced(A, 60_000)
        },
        6,
    );
    let a = book.host(A);
    let mut gate = Gate::default();
    assert!(gate.attempt(&mut book, a, 0, t(0)));
    let first = gate.in_flight.remove(0);
    let refused = Some("connection_refused: Connection refused");
    book.handle_end(first, HostEnd::ConnectionFailed, refused, None, t(10));
    // Due for its probe at 10.01 s, but its pace says 60 s: the probe waits for the pace.
    assert!(!gate.attempt(&mut book, a, 1, t(10_010)));
    assert_eq!(book.poll_timeout(), Some(t(60_000)));
    gate.timer(&mut book, t(60_000));
    assert_eq!(gate.starts(a), [t(0), t(60_000)]);
    assert!(gate.in_flight[0].probe());
    // The probe is out: the next is deferred to its answer, as ever.
    assert!(matches!(
        book.handle_attempt(a, t(60_001)),
        HostAnswer::Defer {
            why: Deferral::ProbeOut,
            ..
        }
    ));
}

#[test]
fn paces_are_whole_milliseconds_given_to_hosts_however_they_become_known() {
    let mut book = HostBook::new(
        HostConfig {
            paces: vec![
                (A.to_owned(), Duration::from_micros(2_500)),
                (B.to_owned(), Duration::ZERO),
                ("https://c.example:443".to_owned(), Duration::from_micros(1)),
            ],
            ..HostConfig::default()
        },
        7,
    );
    // Rounded up, never faster than asked; a zero interval paces nothing.
    let a = book.host(A);
    assert_eq!(book.pace(a), Some(Duration::from_millis(3)));
    let b = book.host(B);
    assert_eq!(book.pace(b), None);
    // A host first met in the store's rows gets its pace too.
    book.handle_rows(1, [("https://c.example:443", HostState::new(t(0)))]);
    let c = book.find("https://c.example:443").unwrap();
    assert_eq!(book.pace(c), Some(Duration::from_millis(1)));
    let _ = go(&mut book, c, t(0));
    assert_eq!(book.handle_attempt(c, t(0)), HostAnswer::Wait);
    // A start while attempts wait for the pace moves their deadline with it.
    assert_eq!(book.poll_timeout(), Some(t(1)));
    let _ = go(&mut book, c, t(1));
    assert_eq!(book.poll_timeout(), Some(t(2)));
    assert_eq!(book.poll_due(t(2)), Some(c));
    assert_eq!(book.poll_timeout(), None);
    // A pace given up: an attempt that was never sent keeps its start (no faster than asked).
    let ticket = go(&mut book, a, t(0));
    book.handle_unsent(ticket);
    assert_eq!(book.handle_attempt(a, t(1)), HostAnswer::Wait);
    assert_eq!(book.poll_timeout(), Some(t(3)));
}
