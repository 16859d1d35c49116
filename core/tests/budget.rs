//! Transcripts of the in-flight budget shared between actors ([`BudgetBook`]): a flooder, a
//! newcomer, places handed back.

use outbox_lanes_core::ActorId;
use outbox_lanes_core::budget::{BudgetBook, default_reserve};

fn a(s: &str) -> ActorId {
    ActorId::new(s)
}

/// Offers `n` items of `actor` numbered from `from`; returns how many went at once.
fn offer(b: &mut BudgetBook<u32>, actor: &str, from: u32, n: u32) -> u32 {
    (from..from + n)
        .filter(|&i| b.handle_job(&a(actor), i).is_some())
        .count() as u32
}

fn drain(b: &mut BudgetBook<u32>) -> Vec<(String, u32)> {
    core::iter::from_fn(|| b.poll_go())
        .map(|(actor, i)| (actor.as_str().to_owned(), i))
        .collect()
}

#[test]
fn the_default_reserve_is_a_tenth_and_at_least_one() {
    assert_eq!(default_reserve(1), 0);
    assert_eq!(default_reserve(2), 1);
    assert_eq!(default_reserve(100), 10);
    assert_eq!(default_reserve(256), 25);
}

#[test]
fn a_lone_flooder_takes_everything_until_a_second_actor_is_seen() {
    let mut b = BudgetBook::new(10, 2);
    assert_eq!(offer(&mut b, "flood", 0, 15), 10);
    assert_eq!(b.waiting(), 5);
    // The newcomer of a process that served one actor waits for the next place.
    assert_eq!(b.handle_job(&a("quiet"), 100), None);
    b.handle_end(&a("flood"));
    assert_eq!(drain(&mut b), [("quiet".to_owned(), 100)]);
    // From now on the reserve is kept: the flooder (above its share of 5) does not get the
    // last two places back.
    assert!(b.keeps_reserve());
    b.handle_end(&a("flood"));
    b.handle_end(&a("flood"));
    assert_eq!(drain(&mut b), []);
    assert_eq!(b.in_flight(), 8);
    b.handle_end(&a("flood"));
    assert_eq!(drain(&mut b), [("flood".to_owned(), 10)]);
}

#[test]
fn with_the_reserve_kept_a_newcomer_starts_at_once_beside_a_flooder() {
    let mut b = BudgetBook::new(100, default_reserve(100)).keep_reserve();
    assert_eq!(offer(&mut b, "flood", 0, 1000), 90);
    assert_eq!(b.running(&a("flood")), 90);
    // Several customers arrive while the flooder's 90 attempts hang: each first row goes.
    for c in 0..10 {
        assert_eq!(
            b.handle_job(&a(&format!("c{c}")), c),
            Some(c),
            "customer {c} waited"
        );
    }
    assert_eq!(b.in_flight(), 100);
    // The eleventh waits, and a place freed by the flooder goes to it, not to the flooder.
    assert_eq!(b.handle_job(&a("late"), 7), None);
    b.handle_end(&a("flood"));
    assert_eq!(drain(&mut b), [("late".to_owned(), 7)]);
}

#[test]
fn places_go_to_the_waiting_actor_holding_fewest_so_shares_even_out() {
    let mut b = BudgetBook::new(12, 0);
    assert_eq!(offer(&mut b, "x", 0, 100), 12);
    assert_eq!(offer(&mut b, "y", 0, 100), 0);
    assert_eq!(offer(&mut b, "z", 0, 100), 0);
    // Twelve of x's attempts end one by one: y and z take turns until each holds four.
    let mut got = Vec::new();
    for _ in 0..12 {
        b.handle_end(&a("x"));
        got.extend(drain(&mut b).into_iter().map(|(actor, _)| actor));
    }
    let count = |who: &str| got.iter().filter(|g| g.as_str() == who).count();
    assert_eq!((count("x"), count("y"), count("z")), (4, 4, 4));
    assert_eq!(b.running(&a("x")), 4);
    assert_eq!(b.running(&a("y")), 4);
    assert_eq!(b.running(&a("z")), 4);
}

#[test]
fn an_actor_below_its_share_takes_the_reserve_and_its_items_keep_their_order() {
    let mut b = BudgetBook::new(4, 1).keep_reserve();
    assert_eq!(offer(&mut b, "x", 0, 3), 3);
    // x (its share: 4 / 2 with the newcomer counted) holds 3; the last place is the reserve.
    assert_eq!(b.handle_job(&a("x"), 3), None);
    // y is below its share (2): it takes the reserve.
    assert_eq!(b.handle_job(&a("y"), 10), Some(10));
    assert_eq!(b.handle_job(&a("y"), 11), None);
    assert_eq!(b.handle_job(&a("y"), 12), None);
    // Places freed by x go to y (1 place, below x's 3), in y's order.
    b.handle_end(&a("x"));
    assert_eq!(drain(&mut b), [("y".to_owned(), 11)]);
    // Now x holds 1 and y 2: x's waiting item goes next, then y's.
    b.handle_end(&a("x"));
    assert_eq!(drain(&mut b), [("x".to_owned(), 3)]);
    b.handle_end(&a("y"));
    assert_eq!(drain(&mut b), [("y".to_owned(), 12)]);
}

#[test]
fn an_actor_gone_idle_widens_the_others_shares() {
    let mut b = BudgetBook::new(10, 2).keep_reserve();
    assert_eq!(offer(&mut b, "x", 0, 8), 8);
    // Shares are 5 each now; y is below its share and takes the two free places (the
    // reserve is for whoever is below its share).
    assert_eq!(offer(&mut b, "y", 0, 5), 2);
    assert_eq!(b.waiting(), 3);
    // Five of x's attempts end: three places go to y, up to its share; then y (at its
    // share, 2 places free = the reserve) waits.
    for _ in 0..5 {
        b.handle_end(&a("x"));
        drain(&mut b);
    }
    assert_eq!((b.running(&a("x")), b.running(&a("y"))), (3, 5));
    assert_eq!(b.waiting(), 0);
    assert_eq!(offer(&mut b, "y", 5, 1), 0);
    // x is gone: y may take all but the reserve.
    for _ in 0..3 {
        b.handle_end(&a("x"));
    }
    assert_eq!(drain(&mut b).len(), 1);
    assert_eq!(offer(&mut b, "y", 6, 10), 2);
    assert_eq!(b.running(&a("y")), 8);
}

#[test]
fn a_shutdown_takes_the_waiting_items_and_ends_free_the_places() {
    let mut b = BudgetBook::new(2, 0);
    assert_eq!(offer(&mut b, "x", 0, 5), 2);
    let mut left = b.take_waiting();
    left.sort_unstable();
    assert_eq!(left, [2, 3, 4]);
    b.handle_end(&a("x"));
    b.handle_end(&a("x"));
    b.handle_end(&a("x")); // holds none: ignored
    assert_eq!(b.in_flight(), 0);
    assert_eq!(drain(&mut b), []);
}
