//! Fair shares of the in-flight budget between actors, through the binary (driver/src/budget.rs,
//! core/src/budget.rs): a customer A flooding slow endpoints holds every place it may of
//! `--concurrency` (default 256), and another customer B's rows still go at once, from the
//! reserve A leaves free (by default a tenth of the budget, kept once the process has seen a
//! second actor; `--actor-reserve N` keeps N from the start). Before fair shares, B's rows
//! waited for one of A's responses.
//!
//! The scenario, with the relay's DEFAULT settings (only `--allow-private-destinations`, for
//! the 127.0.0.1 recipients; every `OUTBOX_LANES_*` variable of the caller's environment is
//! removed, so a developer's `OUTBOX_LANES_CONCURRENCY` cannot change the test):
//!
//! - A's endpoints are on three servers (three origins): one host gets at most 10 attempts
//!   in flight until its first answer, then half of `--concurrency`, so one origin could not
//!   fill the budget. A warm-up row per server, answered at once, opens each host's share;
//!   in the default variant one warm-up row of B makes the process see a second actor.
//! - Then every further request to A's servers is held — not answered until the test lets
//!   it go, or at the latest [`HOLD_BOUND`] after the flood began (less than the default 30 s
//!   HTTP timeout, so no attempt of A times out) — and A enqueues 450 lanes of two rows each,
//!   far more than the budget. The test waits until A holds the budget, less the reserve.
//! - B enqueues rows to its own server, which answers at once. They must all arrive while
//!   every one of A's requests is still held: the test lets A's responses go only after
//!   that (an order, read from the servers' records, never a wall-clock duration).
//! - Then every row of A arrives, in order in each lane, and the relay stops cleanly on
//!   SIGTERM.
//!
//! `OUTBOX_LANES_TEST_BIN` runs another build of the binary (see tests/common): the parent
//! commit's, which fails the default variant (it has no `--actor-reserve`, so the second
//! test fails there at once). The two tests take a few seconds each and run one at a time
//! (each holds ~230 held connections and a relay delivering for two actors).
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Db, arrived, is_2xx, row, wait_bounded};
use outbox_lanes_test_support::{Chooser, Completion, Recipient, Recorded, Reply};

const A: &str = "customer-a";
const B: &str = "customer-b";
/// The default `--concurrency`.
const BUDGET: usize = 256;
/// A's servers (origins), its lanes on each, its rows in each lane.
const A_SERVERS: usize = 3;
const A_LANES: usize = 150;
const A_DEPTH: usize = 2;
/// B's rows, in one lane.
const B_ROWS: usize = 5;
/// How far below its whole share A may still be when B's rows are enqueued: A's attempts
/// still on their way (the count of open requests is read at the servers).
const MARGIN: usize = 5;
/// A's held responses are answered at the latest this long after the flood began: under the
/// relay's default 30 s HTTP timeout, so no attempt of A times out.
const HOLD_BOUND: Duration = Duration::from_secs(25);
/// By then (after the flood began) A must hold its share...
const FILL_BOUND: Duration = Duration::from_secs(12);
/// ... and B's rows must all have arrived, or the test fails (B waited for A).
const B_BOUND: Duration = Duration::from_secs(22);

/// One test at a time: each holds a relay, its ~230 held requests and their threads.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A's responses, held until the test releases them, or until the bound passes.
#[derive(Default)]
struct Hold {
    /// Released; the bound (set when the flood begins).
    state: Mutex<(bool, Option<Instant>)>,
    cv: Condvar,
}

impl Hold {
    /// The flood begins: from now on, held responses go at the latest after [`HOLD_BOUND`].
    fn arm(&self) -> Instant {
        let now = Instant::now();
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = Some(now + HOLD_BOUND);
        now
    }

    fn release(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = true;
        self.cv.notify_all();
    }

    /// Blocks until released or the bound passed.
    fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let until = s.1.unwrap_or_else(|| Instant::now() + HOLD_BOUND);
            let now = Instant::now();
            if s.0 || now >= until {
                return;
            }
            s = self
                .cv
                .wait_timeout(s, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Releases the held responses when the test ends, however it ends (a failed assertion), so
/// no connection thread of the servers outlives it for long.
struct ReleaseOnDrop(Arc<Hold>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// One of A's servers: `/warm` answers at once, every other path once `hold` lets it.
fn held_server(hold: &Arc<Hold>) -> Recipient {
    let r = Recipient::start().unwrap();
    let hold = Arc::clone(hold);
    r.set_server_default(Reply::Choose(Chooser::new(move |q: &Recorded| {
        if q.path != "/warm" {
            hold.wait();
        }
        Reply::Status(200)
    })));
    r
}

/// The relay, with its default settings but `--allow-private-destinations` and `extra`, its
/// stderr read as it comes; killed if the test ends without stopping it.
struct Relay {
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(db: &Db, extra: &[&str]) -> Relay {
        let args = [&["relay", "--allow-private-destinations"], extra].concat();
        let mut c = db.command(&args);
        // Defaults: nothing of the caller's environment (OUTBOX_LANES_CONCURRENCY, ...).
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("OUTBOX_LANES_")
                && !name.starts_with("OUTBOX_LANES_TEST_")
                && name != "OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS"
            {
                c.env_remove(&name);
            }
        }
        let mut child = c.stdout(Stdio::null()).spawn().unwrap();
        let err = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                into.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Relay {
            child: Some(child),
            lines,
            reader: Some(reader),
        }
    }

    /// Whether it has not exited (a flag it does not know makes it exit at once).
    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// The last stderr lines so far (for a failure's message), and whether it exited.
    fn tail(&mut self) -> String {
        let exited = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(s))) => {
                // Its stderr is closed: every line is in.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                format!("relay exited: {s}\n")
            }
            _ => String::new(),
        };
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let from = lines.len().saturating_sub(30);
        format!(
            "{exited}relay stderr (last lines):\n{}",
            lines[from..].join("\n")
        )
    }

    /// SIGTERM, then (bounded) the exit status and every stderr line.
    fn stop(mut self) -> (ExitStatus, Vec<String>) {
        let mut child = self.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = wait_bounded(&mut child);
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        (status, lines)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `done` every 50 ms until it holds or `until` passes; whether it held.
fn poll_until(until: Instant, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A's flood rows (held by its servers) not answered yet: its open requests.
fn open(servers: &[Recipient]) -> usize {
    servers
        .iter()
        .map(|r| {
            r.all_requests()
                .iter()
                .filter(|q| q.path != "/warm" && q.completion.is_pending())
                .count()
        })
        .sum()
}

/// The earliest answer to one of A's flood requests, if any was answered.
fn first_answer(servers: &[Recipient]) -> Option<Instant> {
    servers
        .iter()
        .flat_map(Recipient::all_requests)
        .filter(|q| q.path != "/warm")
        .filter_map(|q| match q.completion {
            Completion::Answered { at, .. } => Some(at),
            _ => None,
        })
        .min()
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The scenario (see the module docs). `reserve`: the places A leaves free; `extra`: the
/// relay's flags beyond the defaults; `warm_b`: whether B has a row delivered first (the
/// process then has seen two actors: the default reserve is kept).
fn b_goes_beside_a_flood(reserve: usize, extra: &[&str], warm_b: bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let db = Db::new();
    let hold = Arc::new(Hold::default());
    let a_servers: Vec<Recipient> = (0..A_SERVERS).map(|_| held_server(&hold)).collect();
    let b_server = Recipient::start().unwrap();
    // Dropped before the servers: their held connections are let go first.
    let _release = ReleaseOnDrop(Arc::clone(&hold));

    // Warm-up: each of A's hosts answers once (its share opens to half the budget), and B
    // has a row delivered (a second actor seen: the default reserve is kept from now on).
    let warm_a: Vec<String> = (0..A_SERVERS)
        .map(|s| row(&format!("warm-a{s}"), &a_servers[s].url("/warm")))
        .collect();
    db.enqueue_lines(A, &warm_a);
    if warm_b {
        db.enqueue_lines(B, &[row("warm-b", &b_server.url("/warm"))]);
    }
    let mut relay = Relay::start(&db, extra);
    let warm_until = Instant::now() + Duration::from_secs(60);
    let warmed = poll_until(warm_until, || {
        !relay.running()
            || a_servers.iter().all(|r| arrived(r, "/warm").len() == 1)
                && (!warm_b || arrived(&b_server, "/warm").len() == 1)
    }) && relay.running();
    assert!(warmed, "the warm-up rows did not arrive\n{}", relay.tail());

    // The flood: A_LANES lanes on each server, A_DEPTH rows each, interleaved across the
    // servers (the pass admits lanes breadth first).
    let begun = hold.arm();
    let mut flood = Vec::new();
    for k in 0..A_DEPTH {
        for i in 0..A_LANES {
            for (s, r) in a_servers.iter().enumerate() {
                flood.push(row(&format!("a{s}-{i}-{k}"), &r.url(&format!("/lane-{i}"))));
            }
        }
    }
    db.enqueue_lines(A, &flood);

    // A holds the budget, less the reserve (and what is still on its way): wait for that,
    // then until the count stops moving.
    let full = BUDGET - reserve - MARGIN;
    let filled = poll_until(begun + FILL_BOUND, || open(&a_servers) >= full);
    if !filled {
        let n = open(&a_servers);
        hold.release();
        panic!(
            "A never held its share of the budget: {n} requests open (wanted at least {full})\n{}",
            relay.tail()
        );
    }
    let mut last = open(&a_servers);
    let settle_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < settle_until {
        std::thread::sleep(Duration::from_millis(300));
        let now = open(&a_servers);
        if now == last {
            break;
        }
        last = now;
    }
    let a_before_b = last;

    // B's rows, to B's own server (answering at once): they must all arrive while every one
    // of A's responses is still held.
    let b_rows: Vec<String> = ids("b", B_ROWS)
        .iter()
        .map(|id| row(id, &b_server.url("/inbox")))
        .collect();
    db.enqueue_lines(B, &b_rows);
    let b_done = poll_until(begun + B_BOUND, || {
        arrived(&b_server, "/inbox").len() >= B_ROWS
    });
    let a_at_b = open(&a_servers);
    let a_answered_before = first_answer(&a_servers);
    let b_got = arrived(&b_server, "/inbox");
    if !b_done || a_answered_before.is_some() {
        hold.release();
        let after = poll_until(Instant::now() + Duration::from_secs(20), || {
            arrived(&b_server, "/inbox").len() >= B_ROWS
        });
        panic!(
            "B's rows waited for A's responses: while A's {a_at_b} requests were held \
             ({a_before_b} when B enqueued; the budget is {BUDGET}, the reserve {reserve}), B's \
             server received {b_got:?} of {B_ROWS} rows{}; once A's responses were released, B \
             got {}\n{}",
            if a_answered_before.is_some() {
                " (and one of A's responses was released early)"
            } else {
                ""
            },
            if after {
                "all its rows"
            } else {
                "still not all its rows"
            },
            relay.tail()
        );
    }
    eprintln!(
        "A held {a_before_b} requests when B enqueued, {a_at_b} when B's {B_ROWS} rows had \
         arrived (budget {BUDGET}, reserve {reserve})"
    );
    assert_eq!(b_got, ids("b", B_ROWS), "B's rows, in order");
    // Fair shares: A never held more than the budget less the reserve.
    assert!(
        a_before_b <= BUDGET - reserve && a_at_b <= BUDGET - reserve,
        "A held {a_before_b} then {a_at_b} places: more than the budget ({BUDGET}) less the \
         reserve ({reserve})"
    );

    // The order, from the servers' records: B's last row arrived before any of A's held
    // requests was answered.
    hold.release();
    let b_last = b_server
        .requests("/inbox")
        .iter()
        .filter(|q| is_2xx(q))
        .map(|q| q.arrived_at)
        .max()
        .unwrap();
    let a_first = poll_until(Instant::now() + Duration::from_secs(30), || {
        first_answer(&a_servers).is_some()
    });
    assert!(a_first, "none of A's responses went after the release");
    assert!(
        b_last < first_answer(&a_servers).unwrap(),
        "B's last row arrived after one of A's responses"
    );

    // Every row of A arrives, in order in each lane.
    let everything = poll_until(Instant::now() + Duration::from_secs(90), || {
        a_servers
            .iter()
            .map(|r| {
                r.all_requests()
                    .iter()
                    .filter(|q| q.path != "/warm" && is_2xx(q))
                    .count()
            })
            .sum::<usize>()
            >= A_SERVERS * A_LANES * A_DEPTH
    });
    assert!(
        everything,
        "not all of A's rows arrived after the release\n{}",
        relay.tail()
    );
    for (s, r) in a_servers.iter().enumerate() {
        for i in 0..A_LANES {
            let want: Vec<String> = (0..A_DEPTH).map(|k| format!("a{s}-{i}-{k}")).collect();
            assert_eq!(
                arrived(r, &format!("/lane-{i}")),
                want,
                "server {s}, lane {i}"
            );
        }
    }

    // A clean stop.
    let (status, lines) = relay.stop();
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));
}

/// The default reserve (a tenth of the budget: 25 places), kept once B's warm-up row showed
/// the process a second actor.
#[test]
fn another_actors_rows_go_while_a_flooder_holds_the_budget_default_reserve() {
    b_goes_beside_a_flood(BUDGET / 10, &[], true);
}

/// `--actor-reserve 30`: kept from the start, so B's very first row goes at once.
#[test]
fn another_actors_first_row_goes_while_a_flooder_holds_the_budget_actor_reserve() {
    b_goes_beside_a_flood(30, &["--actor-reserve", "30"], false);
}
