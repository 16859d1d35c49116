//! End-to-end: the blocking runtime on a real SQLite file, delivering over real HTTP to
//! recorders on 127.0.0.1 that inject faults. Tests assert orders and relations, never
//! durations.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_lanes_blocking::{
    DeadLettered, DrainOutcome, Hooks, Outbox, OutboxConfig, OutboxError, Stopped, store::NewRow,
};
use outbox_lanes_core::DeadReason;
use outbox_lanes_store::{SqliteOptions, SqliteStore, Store};
use outbox_lanes_test_support::{Completion, Recipient, Reply, Response};

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default())
        .expect("open sqlite");
    Fixture {
        _dir: dir,
        store: Arc::new(store),
    }
}

fn config() -> OutboxConfig {
    let mut c = OutboxConfig::default().allow_loopback();
    c.scheduler.retry_delays = vec![Duration::from_millis(20), Duration::from_millis(40)];
    c.scheduler.lane_backoff_base = Duration::from_secs(60);
    c.http.timeout = Duration::from_secs(2);
    c.concurrency = 8;
    c
}

fn row(id: &str, to: &[String]) -> NewRow {
    NewRow {
        id: id.to_string(),
        body: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        content_type: "application/json".to_string(),
        recipients: to.to_vec(),
        dedup_key: None,
        ordering_key: None,
        joined: false,
        headers: Vec::new(),
    }
}

fn bodies(r: &Recipient, path: &str) -> Vec<String> {
    r.bodies(path)
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf-8"))
        .collect()
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{{\"id\":\"e{i}\"}}")).collect()
}

/// Each request to `path` arrived after the previous one was answered: one in flight.
fn one_in_flight(r: &Recipient, path: &str) {
    let reqs = r.requests(path);
    for w in reqs.windows(2) {
        match w[0].completion {
            Completion::Answered { at, .. } | Completion::Unanswered { at, .. } => {
                assert!(w[1].arrived_at >= at, "two requests in flight on {path}")
            }
            Completion::Pending => panic!("a request to {path} is still pending"),
        }
    }
}

#[test]
fn ledger_fan_out_reaches_every_participant_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(202).after(Duration::from_millis(20)));
    let to = vec![r.url("/finder"), r.url("/vendor"), r.url("/slow")];
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    for i in 0..30 {
        outbox
            .enqueue("case-manager", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    let out = outbox.drain("case-manager").expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(r) if r.delivered == 90),
        "{out:?}"
    );
    for p in ["/finder", "/vendor", "/slow"] {
        assert_eq!(bodies(&r, p), ids(30), "{p} got its entries in order, once");
        one_in_flight(&r, p);
    }
    assert!(
        f.store
            .status()
            .expect("status")
            .iter()
            .all(|s| s.pending == 0)
    );
}

#[test]
fn a_hanging_recipient_does_not_delay_the_others() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/dead", Reply::Hang);
    let to = vec![r.url("/a"), r.url("/b"), r.url("/dead")];
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    for i in 0..10 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    let ob = outbox.clone();
    let drain = std::thread::spawn(move || ob.drain("actor"));
    // The healthy recipients get all ten entries while the first request to /dead is still
    // unanswered.
    assert!(r.wait_until(Duration::from_secs(20), |all| {
        all.iter()
            .filter(|q| q.path != "/dead" && q.completion.status().is_some())
            .count()
            == 20
    }));
    let dead = r.requests("/dead");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].completion.is_pending(),
        "healthy lanes finished while /dead hung"
    );
    assert_eq!(bodies(&r, "/a"), ids(10));
    assert_eq!(bodies(&r, "/b"), ids(10));
    drain.join().expect("join").expect("drain");
}

#[test]
fn a_flaky_recipient_gets_everything_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.script(
        "/flaky",
        [Reply::Status(503), Reply::Status(500), Reply::Status(503)],
    );
    let to = vec![r.url("/flaky")];
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    for i in 0..5 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    outbox.drain("actor").expect("drain");
    let got = bodies(&r, "/flaky");
    // e0 four times (three failures, then 200), then the rest once each, in order.
    let mut expected = vec![ids(1)[0].clone(); 4];
    expected.extend(ids(5).into_iter().skip(1));
    assert_eq!(got, expected);
    one_in_flight(&r, "/flaky");
}

#[test]
fn gone_and_permanent_answers_are_dead_lettered_with_their_status() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/gone", Reply::Status(410));
    r.script("/picky", [Reply::Status(422)]);
    let to = vec![r.url("/gone"), r.url("/picky")];
    let (dead, hooks) = recording_dead_letters();
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .hooks(hooks)
        .open()
        .expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &to), row("e1", &to)])
        .expect("enqueue");
    outbox.drain("actor").expect("drain");
    let letters = outbox.dead_letters(Some("actor")).expect("dead letters");
    let gone: Vec<_> = letters
        .iter()
        .filter(|d| d.key.recipient().ends_with("/gone"))
        .collect();
    assert_eq!(gone.len(), 2);
    assert!(
        gone.iter()
            .all(|d| d.reason == DeadReason::Gone && d.last_status == Some(410))
    );
    let picky: Vec<_> = letters
        .iter()
        .filter(|d| d.key.recipient().ends_with("/picky"))
        .collect();
    assert_eq!(picky.len(), 1);
    assert_eq!(
        (picky[0].reason, picky[0].last_status),
        (DeadReason::Permanent, Some(422))
    );
    // The lane moved on past its dead letter.
    assert_eq!(bodies(&r, "/picky"), ids(2));
    let hooked = dead.lock().expect("lock").clone();
    assert_eq!(hooked.len(), 3);
    // The hook saw what the store kept: attempts and time included.
    for d in &letters {
        let h = hooked
            .iter()
            .find(|h| h.unit == d.unit && h.recipient == d.key.recipient())
            .expect("a hook call for every dead letter");
        assert_eq!((h.reason, h.status), (d.reason, d.last_status));
        assert_eq!(h.attempts, d.attempts);
        assert_eq!(h.at, d.dead_at);
        assert_eq!(h.id, d.id, "the hook names the dead letter the store lists");
    }
}

/// A unit that fails in one pass and expires in the next, where no attempt is made: the hook
/// reports what the dead letter keeps (the earlier pass's status and attempts), not only what
/// the dead-lettering pass saw.
#[test]
fn a_dead_letter_without_an_attempt_in_its_pass_reports_the_earlier_ones() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/down", Reply::Status(503));
    let mut c = config();
    c.scheduler.pass_attempts = 2;
    let first = Outbox::builder(Arc::clone(&f.store), c.clone())
        .open()
        .expect("outbox");
    first
        .enqueue("actor", &[row("e0", &[r.url("/down")])])
        .expect("enqueue");
    // Two failures stall the unit; its lane waits a minute.
    first.drain("actor").expect("drain");
    assert_eq!(r.requests("/down").len(), 2);
    let lane = first.lanes("actor").expect("lanes")[0].lane;
    drop(first);
    // An operator's retry makes the lane due at once; the unit is older than max_age by then.
    f.store.retry_lane_now(lane).expect("retry");
    c.scheduler.max_age = Some(Duration::from_millis(1));
    let (dead, hooks) = recording_dead_letters();
    let second = Outbox::builder(Arc::clone(&f.store), c)
        .hooks(hooks)
        .open()
        .expect("outbox");
    second.drain("actor").expect("drain");
    assert_eq!(r.requests("/down").len(), 2, "an expired unit is not sent");
    let listed = second.dead_letters(Some("actor")).expect("dead letters");
    let hooked = dead.lock().expect("lock").clone();
    assert_eq!(listed.len(), 1);
    assert_eq!(hooked.len(), 1);
    let (h, d) = (&hooked[0], &listed[0]);
    assert_eq!(h.reason, DeadReason::Expired);
    assert_eq!((h.id, h.unit, h.at), (d.id, d.unit, d.dead_at));
    assert_eq!((h.status, h.attempts), (Some(503), 2));
    assert_eq!((d.last_status, d.attempts), (Some(503), 2));
}

#[test]
fn a_lane_retired_by_410_calls_the_hook_for_each_of_its_units_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/gone", Reply::Status(410));
    let (gone, ok) = (r.url("/gone"), r.url("/ok"));
    let mut c = config();
    c.scheduler.retire_on_gone = true;
    let (dead, hooks) = recording_dead_letters();
    let outbox = Outbox::builder(Arc::clone(&f.store), c)
        .hooks(hooks)
        .open()
        .expect("outbox");
    // e1 is joined: retiring /gone dead-letters it there and it is still delivered to /ok.
    let rows = [
        row("e0", std::slice::from_ref(&gone)),
        NewRow {
            joined: true,
            ..row("e1", &[gone.clone(), ok.clone()])
        },
        row("e2", std::slice::from_ref(&gone)),
        row("e3", std::slice::from_ref(&gone)),
        row("e4", std::slice::from_ref(&gone)),
    ];
    outbox.enqueue("actor", &rows).expect("enqueue");
    let out = outbox.drain("actor").expect("drain");
    // One request to /gone: its 410 retired the lane.
    assert_eq!(bodies(&r, "/gone"), ids(1));
    assert_eq!(bodies(&r, "/ok"), [ids(2)[1].clone()]);
    let letters = outbox.dead_letters(Some("actor")).expect("dead letters");
    assert_eq!(
        letters
            .iter()
            .map(|d| d.row_id.as_str())
            .collect::<Vec<_>>(),
        ["e0", "e1", "e2", "e3", "e4"]
    );
    // One hook call per dead letter, in lane order, naming it by its id.
    let hooked = dead.lock().expect("lock").clone();
    assert_eq!(
        hooked
            .iter()
            .map(|h| (h.id, h.row_id.as_str(), h.reason))
            .collect::<Vec<_>>(),
        letters
            .iter()
            .map(|d| (d.id, d.row_id.as_str(), d.reason))
            .collect::<Vec<_>>()
    );
    assert_eq!(hooked[0].reason, DeadReason::Gone);
    assert!(
        hooked[1..]
            .iter()
            .all(|h| h.reason == DeadReason::LaneRetired)
    );
    for (h, d) in hooked.iter().zip(&letters) {
        assert_eq!(h.unit, d.unit);
        assert_eq!(h.recipient, gone);
        assert_eq!(
            (h.status, h.attempts, h.at),
            (d.last_status, d.attempts, d.dead_at)
        );
    }
    // The pass counts them all.
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.dead_lettered == 5 && rep.delivered == 1),
        "{out:?}"
    );
}

#[test]
fn a_429_with_retry_after_sets_the_lanes_not_before() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.script(
        "/busy",
        [Reply::Response(
            Response::new(429).with_header("Retry-After", "120"),
        )],
    );
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &[r.url("/busy")])])
        .expect("enqueue");
    let out = outbox.drain("actor").expect("drain");
    assert!(matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 0 && rep.handed_back == 1));
    let lanes = outbox.lanes("actor").expect("lanes");
    assert_eq!(lanes.len(), 1);
    let nb = lanes[0].not_before.expect("not_before set by Retry-After");
    let now = outbox_lanes_core::Timestamp::from_system_time(std::time::SystemTime::now());
    assert!(
        nb > now + Duration::from_secs(60),
        "not_before is about two minutes out"
    );
    assert_eq!(lanes[0].last_status, Some(429));
    // Nothing was dead-lettered and the unit is still pending.
    assert!(outbox.dead_letters(None).expect("dl").is_empty());
    assert_eq!(r.count("/busy"), 1, "not attempted again before not_before");
}

#[test]
fn concurrent_drains_never_put_two_units_of_one_lane_in_flight() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/p", Reply::Status(200).after(Duration::from_millis(5)));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    let to = vec![r.url("/p")];
    let merged = Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..4)
        .map(|t| {
            let ob = outbox.clone();
            let to = to.clone();
            let merged = Arc::clone(&merged);
            std::thread::spawn(move || {
                for i in 0..10 {
                    ob.enqueue("actor", &[row(&format!("t{t}-{i}"), &to)])
                        .expect("enqueue");
                    if ob.drain("actor").expect("drain") == DrainOutcome::Merged {
                        merged.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().expect("join");
    }
    outbox.drain("actor").expect("final drain");
    assert_eq!(r.count("/p"), 40);
    one_in_flight(&r, "/p");
    // Per producer, its rows arrived in the order it enqueued them.
    let got = bodies(&r, "/p");
    for t in 0..4 {
        let mine: Vec<&String> = got
            .iter()
            .filter(|b| b.contains(&format!("t{t}-")))
            .collect();
        let want: Vec<String> = (0..10)
            .map(|i| format!("{{\"id\":\"t{t}-{i}\"}}"))
            .collect();
        assert_eq!(mine, want.iter().collect::<Vec<_>>());
    }
}

#[test]
fn a_joined_row_waits_for_both_lanes() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/a", Reply::Status(200).after(Duration::from_millis(30)));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    outbox
        .enqueue("actor", &[row("a0", &[r.url("/a")])])
        .expect("enqueue");
    let mut joined = row("j", &[r.url("/a"), r.url("/b")]);
    joined.joined = true;
    outbox.enqueue("actor", &[joined]).expect("enqueue");
    outbox
        .enqueue("actor", &[row("b2", &[r.url("/b")])])
        .expect("enqueue");
    outbox.drain("actor").expect("drain");
    let all = r.all_requests();
    let pos = |path: &str, id: &str| {
        all.iter()
            .position(|q| q.path == path && q.body_text().is_some_and(|b| b.contains(id)))
            .unwrap_or_else(|| panic!("{id} reached {path}"))
    };
    // j reached /b only after a0 was done at /a, and b2 only after j at /b.
    let a0_done = match r.requests("/a")[0].completion {
        Completion::Answered { at, .. } => at,
        ref c => panic!("a0 not answered: {c:?}"),
    };
    assert!(all[pos("/b", "\"j\"")].arrived_at >= a0_done);
    assert!(pos("/b", "\"j\"") < pos("/b", "b2"));
    assert_eq!(bodies(&r, "/a").len(), 2);
}

#[test]
fn a_private_destination_is_refused_at_enqueue_and_dead_lettered_after_a_narrowing() {
    let f = fixture();
    // A recorder on another loopback address: the default policy refuses loopback.
    let r = Recipient::start_on("127.0.0.2:0".parse().expect("addr")).expect("recipient");
    let mut cfg = config();
    cfg.http.addresses = outbox_lanes_core::policy::AddressPolicy::default();
    let outbox = Outbox::open(Arc::clone(&f.store), cfg).expect("outbox");
    let url = r.url("/inbox");
    let by_name = url.replace("127.0.0.2", "localhost");
    let rows = [row("e0", &[url.clone(), by_name])];
    // The outbox's destination policy (OL-24) is public: refused at enqueue, nothing written.
    let refused = outbox.enqueue("actor", &rows).expect_err("refused");
    assert!(
        matches!(
            refused,
            OutboxError::Enqueue(outbox_lanes_store::EnqueueError::DestinationRefused { .. })
        ),
        "{refused:?}"
    );
    // Widened (as by a process allowing loopback), enqueued, then narrowed by an operator:
    // delivery follows the policy as stored when the pass begins.
    f.store
        .widen_destination_policy(outbox_lanes_core::policy::AddressPolicy::allow_loopback_only())
        .expect("widen");
    outbox.enqueue("actor", &rows).expect("enqueue");
    f.store
        .set_destination_policy(outbox_lanes_core::policy::AddressPolicy::public_only())
        .expect("narrow");
    outbox.drain("actor").expect("drain");
    let letters = outbox.dead_letters(Some("actor")).expect("dead letters");
    assert_eq!(letters.len(), 2);
    assert!(
        letters
            .iter()
            .all(|d| d.reason == DeadReason::DestinationRefused)
    );
    assert_eq!(r.count_all(), 0, "the refused destination saw nothing");
}

#[test]
fn a_redirect_is_not_followed() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/moved", Reply::Redirect(301, r.url("/elsewhere")));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &[r.url("/moved")])])
        .expect("enqueue");
    outbox.drain("actor").expect("drain");
    assert_eq!(r.count("/elsewhere"), 0);
    let letters = outbox.dead_letters(None).expect("dl");
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].last_status),
        (DeadReason::Permanent, Some(301))
    );
}

#[test]
fn shutdown_during_a_pass_hands_everything_back_and_a_later_drain_delivers_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let to = vec![r.url("/slow")];
    let mut cfg = config();
    cfg.shutdown_grace = Duration::from_secs(5);
    let outbox = Outbox::open(Arc::clone(&f.store), cfg.clone()).expect("outbox");
    for i in 0..40 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    let ob = outbox.clone();
    let drain = std::thread::spawn(move || ob.drain("actor"));
    assert!(r.wait_for("/slow", 3, Duration::from_secs(10)));
    outbox.shutdown();
    let out = drain.join().expect("join").expect("drain");
    let first = r.count("/slow");
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.yielded),
        "{out:?}"
    );
    assert!(first < 40, "shutdown stopped the pass early");
    // A new outbox over the same database delivers the rest, in order, after the first ones.
    let outbox = Outbox::open(Arc::clone(&f.store), cfg).expect("outbox");
    outbox.drain("actor").expect("drain");
    let got = bodies(&r, "/slow");
    let mut dedup = got.clone();
    dedup.dedup();
    assert_eq!(
        dedup,
        ids(40),
        "every entry in order (a resend only of the last one at most)"
    );
    one_in_flight(&r, "/slow");
}

#[test]
fn a_cancelled_drain_hands_everything_back_and_releases_the_slot() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let to = vec![r.url("/slow"), r.url("/other")];
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    for i in 0..30 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    let control = Arc::new(outbox_lanes_blocking::DrainControl::default());
    let (ob, c) = (outbox.clone(), Arc::clone(&control));
    let drain = std::thread::spawn(move || ob.drain_with("actor", &c));
    assert!(r.wait_for("/slow", 2, Duration::from_secs(10)));
    control.request_cancel();
    let out = drain.join().expect("join");
    assert!(
        matches!(out, Err(outbox_lanes_blocking::OutboxError::Cancelled)),
        "{out:?}"
    );
    // The slot is free at once (no lease to wait out): a new drain runs a pass and
    // delivers the rest, each lane in order.
    let again = outbox.drain("actor").expect("drain");
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    for p in ["/slow", "/other"] {
        let mut got = bodies(&r, p);
        got.dedup();
        assert_eq!(got, ids(30), "{p}: every entry, in order");
    }
}

#[test]
fn the_monitor_drains_on_enqueue_and_stops_cleanly() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    let monitor = outbox.monitor().expect("monitor");
    for i in 0..5 {
        outbox
            .enqueue("a1", &[row(&format!("e{i}"), &[r.url("/one")])])
            .expect("enqueue");
        outbox
            .enqueue("a2", &[row(&format!("e{i}"), &[r.url("/two")])])
            .expect("enqueue");
    }
    assert!(r.wait_for("/one", 5, Duration::from_secs(20)));
    assert!(r.wait_for("/two", 5, Duration::from_secs(20)));
    let stopped = monitor.stop();
    assert_eq!(stopped, Stopped::default(), "nothing was cut: {stopped:?}");
    assert_eq!(bodies(&r, "/one"), ids(5));
    assert_eq!(bodies(&r, "/two"), ids(5));
    // The monitor's stop is the outbox's: it still enqueues, and refuses drains.
    outbox
        .enqueue("a1", &[row("late", &[r.url("/one")])])
        .expect("enqueue");
    assert!(
        matches!(outbox.drain("a1"), Err(OutboxError::ShuttingDown)),
        "a stopped outbox runs no pass"
    );
    assert_eq!(
        outbox.shutdown(),
        stopped,
        "stopping again answers the same at once"
    );
    // Another outbox on the store delivers the late row.
    let again = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    again.drain("a1").expect("drain");
    assert_eq!(r.count("/one"), 6);
}

#[test]
fn signed_deliveries_verify_with_the_secret() {
    use outbox_lanes_blocking::sign::StandardWebhooks;
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.script("/hook", [Reply::Status(500)]);
    let secret = b"a shared secret of the webhook".to_vec();
    let signer = Arc::new(StandardWebhooks::new(secret.clone()).expect("secret"));
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .signer(signer)
        .open()
        .expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &[r.url("/hook")])])
        .expect("enqueue");
    outbox.drain("actor").expect("drain");
    let verifier = StandardWebhooks::new(secret).expect("secret");
    let reqs = r.requests("/hook");
    // The failed attempt and the retry are each signed, with the same webhook-id (the unit
    // id, also the Idempotency-Key).
    assert_eq!(reqs.len(), 2);
    for q in &reqs {
        let id = q.header("webhook-id").expect("webhook-id");
        assert_eq!(Some(id), q.header("Idempotency-Key"));
        verifier
            .verify(
                id,
                q.header("webhook-timestamp").expect("timestamp"),
                q.header("webhook-signature").expect("signature"),
                &q.body,
                std::time::SystemTime::now(),
                Duration::from_secs(300),
            )
            .expect("the signature verifies");
    }
    let wrong = StandardWebhooks::new(b"another secret".to_vec()).expect("secret");
    let q = &reqs[1];
    assert!(
        wrong
            .verify(
                q.header("webhook-id").expect("id"),
                q.header("webhook-timestamp").expect("ts"),
                q.header("webhook-signature").expect("sig"),
                &q.body,
                std::time::SystemTime::now(),
                Duration::from_secs(300),
            )
            .is_err()
    );
}

#[test]
fn enqueue_inside_the_callers_transaction_commits_or_rolls_back_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = Arc::new(
        SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default()).expect("open"),
    );
    let store: Arc<dyn Store> = sqlite.clone();
    let r = Recipient::start().expect("recipient");
    let outbox = Outbox::open(Arc::clone(&store), config()).expect("outbox");
    let actor = outbox.resolve("shop").expect("actor");
    // The business write and the outbox row share the store's transaction.
    let setup: Result<(), outbox_lanes_store::StoreError> = sqlite.with_transaction(|tx| {
        tx.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")?;
        Ok(())
    });
    setup.expect("business schema");
    // Rolled back: the order fails its own constraint, and the outbox row goes with it.
    let failed: Result<(), Box<dyn std::error::Error>> = sqlite.with_transaction(|tx| {
        let (_, _wake) = sqlite.enqueue_in(tx, &actor, &[row("order-1", &[r.url("/hook")])])?;
        tx.execute("INSERT INTO orders (id) VALUES ('o1')", [])?;
        tx.execute("INSERT INTO orders (id) VALUES ('o1')", [])?;
        Ok(())
    });
    assert!(failed.is_err());
    outbox.drain("shop").expect("drain");
    assert_eq!(r.count("/hook"), 0, "nothing was enqueued");
    // Committed: delivered.
    let ok: Result<(), Box<dyn std::error::Error>> = sqlite.with_transaction(|tx| {
        tx.execute("INSERT INTO orders (id) VALUES ('o2')", [])?;
        let (_, _wake) = sqlite.enqueue_in(tx, &actor, &[row("order-2", &[r.url("/hook")])])?;
        Ok(())
    });
    ok.expect("commit");
    outbox.drain("shop").expect("drain");
    assert_eq!(bodies(&r, "/hook"), ["{\"id\":\"order-2\"}"]);
}

#[test]
fn a_direct_drain_goes_on_past_its_time_slice_until_nothing_is_admissible() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(20)));
    let mut cfg = config();
    cfg.time_slice = Duration::from_millis(100);
    let outbox = Outbox::open(Arc::clone(&f.store), cfg).expect("outbox");
    for i in 0..20 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &[r.url("/slow")])])
            .expect("enqueue");
    }
    // Twenty 20 ms deliveries in one lane outlast several 100 ms slices; the drain still
    // returns only when everything is delivered.
    let out = outbox.drain("actor").expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 20 && !rep.yielded),
        "{out:?}"
    );
    let mut got = bodies(&r, "/slow");
    got.dedup();
    assert_eq!(got, ids(20));
}

/// A drain runs pass after pass on one drain slot; the lease must be renewed across them:
/// passes of 100 ms with a 900 ms lease (renewal due every 300 ms) never reach a renewal by
/// their own clock, and the drain failed with a stale token once the lease lapsed.
#[test]
fn the_lease_is_renewed_across_back_to_back_passes() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/a", Reply::Status(200).after(Duration::from_millis(40)));
    let to = vec![r.url("/a")];
    let mut cfg = config();
    cfg.time_slice = Duration::from_millis(100);
    cfg.lease = Duration::from_millis(900);
    let outbox = Outbox::open(Arc::clone(&f.store), cfg).expect("outbox");
    for i in 0..40 {
        outbox
            .enqueue("long", &[row(&format!("e{i}"), &to)])
            .expect("enqueue");
    }
    let out = outbox.drain("long").expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(r) if r.delivered == 40),
        "{out:?}"
    );
    assert_eq!(bodies(&r, "/a"), ids(40));
}

/// Hooks that record every dead letter the pass reports, and the record.
fn recording_dead_letters() -> (Arc<Mutex<Vec<DeadLettered>>>, Hooks) {
    let dead: Arc<Mutex<Vec<DeadLettered>>> = Arc::default();
    let seen = Arc::clone(&dead);
    let hooks = Hooks {
        dead_lettered: Some(Box::new(move |d| {
            seen.lock().expect("lock").push(d.clone());
        })),
        ..Hooks::default()
    };
    (dead, hooks)
}
