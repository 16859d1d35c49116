//! End-to-end: the tokio runtime on a real SQLite file, delivering over real HTTP (hyper-util)
//! to recorders on loopback that inject faults. The blocking runtime's scenarios, on tokio.
//! Tests assert orders and relations, never durations.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bodies, config, fixture, ids, one_in_flight, row};
use outbox_lanes_core::DeadReason;
use outbox_lanes_test_support::{Completion, Recipient, Reply, Response};
use outbox_lanes_tokio::sign::StandardWebhooks;
use outbox_lanes_tokio::{DeadLettered, DrainOutcome, Hooks, Outbox, OutboxConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_fan_out_reaches_every_participant_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(202).after(Duration::from_millis(20)));
    let to = vec![r.url("/finder"), r.url("/vendor"), r.url("/slow")];
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    for i in 0..30 {
        outbox
            .enqueue("case-manager", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
    let out = outbox.drain("case-manager").await.expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(r) if r.delivered == 90),
        "{out:?}"
    );
    for p in ["/finder", "/vendor", "/slow"] {
        assert_eq!(bodies(&r, p), ids(30), "{p} got its entries in order, once");
        one_in_flight(&r, p);
    }
    let status = outbox.status().await.expect("status");
    assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
    // Every request carried the idempotency key and the user agent.
    for q in r.all_requests() {
        assert!(q.header("idempotency-key").is_some());
        assert!(
            q.header("user-agent")
                .is_some_and(|u| u.starts_with("outbox-lanes/"))
        );
        assert_eq!(q.header("content-type"), Some("application/json"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_recipient_does_not_delay_the_others() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/dead", Reply::Hang);
    let to = vec![r.url("/a"), r.url("/b"), r.url("/dead")];
    // The default HTTP timeout: the first request to /dead still hangs when the healthy
    // lanes are done, however slowly a loaded machine delivers them (with the fixture's 2 s
    // it timed out and was retried first on a busy machine).
    let mut config = config();
    config.http.timeout = OutboxConfig::default().http.timeout;
    let outbox = Outbox::open(Arc::clone(&f.store), config).expect("outbox");
    for i in 0..10 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
    let ob = outbox.clone();
    let drain = tokio::spawn(async move { ob.drain("actor").await });
    // The healthy recipients get all ten entries while the first request to /dead is still
    // unanswered.
    let rr = Arc::clone(&r);
    let healthy_done = tokio::task::spawn_blocking(move || {
        rr.wait_until(Duration::from_secs(20), |all| {
            all.iter()
                .filter(|q| q.path != "/dead" && q.completion.status().is_some())
                .count()
                == 20
        })
    })
    .await
    .expect("join");
    assert!(healthy_done);
    let dead = r.requests("/dead");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].completion.is_pending(),
        "healthy lanes finished while /dead hung"
    );
    assert_eq!(bodies(&r, "/a"), ids(10));
    assert_eq!(bodies(&r, "/b"), ids(10));
    // The healthy units' acks are group-committed while the pass runs: wait for them
    // (bounded); /dead's ten units stay pending.
    let mut pending = u64::MAX;
    for _ in 0..100 {
        pending = outbox
            .status()
            .await
            .expect("status")
            .iter()
            .map(|s| s.pending)
            .sum();
        if pending == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        pending, 10,
        "/dead's ten units wait, the other twenty are delivered"
    );
    // /dead's lane would wait out the timeout: the drain is cancelled instead (its pass
    // hands the unfinished unit back).
    drain.abort();
    assert!(drain.await.is_err_and(|e| e.is_cancelled()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_recipient_gets_everything_in_order() {
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
            .await
            .expect("enqueue");
    }
    outbox.drain("actor").await.expect("drain");
    // e0 four times (three failures, then 200), then the rest once each, in order.
    let mut expected = vec![ids(1)[0].clone(); 4];
    expected.extend(ids(5).into_iter().skip(1));
    assert_eq!(bodies(&r, "/flaky"), expected);
    one_in_flight(&r, "/flaky");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_and_permanent_answers_are_dead_lettered_with_their_status() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/gone", Reply::Status(410));
    r.script(
        "/picky",
        [Reply::Response(
            Response::new(422).with_body("bad\nactivity"),
        )],
    );
    let to = vec![r.url("/gone"), r.url("/picky")];
    let (dead, hooks) = recording_dead_letters();
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .hooks(hooks)
        .open()
        .expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &to), row("e1", &to)])
        .await
        .expect("enqueue");
    outbox.drain("actor").await.expect("drain");
    let letters = outbox
        .dead_letters(Some("actor"))
        .await
        .expect("dead letters");
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
    // The same error text as the blocking client: status and a sanitised excerpt.
    assert_eq!(
        picky[0].last_error.as_deref(),
        Some("status 422: bad activity")
    );
    // The lane moved on past its dead letter.
    assert_eq!(bodies(&r, "/picky"), ids(2));
    let mut hooked: Vec<_> = dead.lock().expect("lock").iter().map(|h| h.id).collect();
    hooked.sort_unstable();
    let mut listed: Vec<_> = letters.iter().map(|d| d.id).collect();
    listed.sort_unstable();
    assert_eq!(
        hooked, listed,
        "one hook call per dead letter, naming its id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_retired_by_410_calls_the_hook_for_each_of_its_units_in_order() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/gone", Reply::Status(410));
    let gone = r.url("/gone");
    let mut c = config();
    c.scheduler.retire_on_gone = true;
    let (dead, hooks) = recording_dead_letters();
    let outbox = Outbox::builder(Arc::clone(&f.store), c)
        .hooks(hooks)
        .open()
        .expect("outbox");
    let rows = (0..4)
        .map(|i| row(&format!("e{i}"), std::slice::from_ref(&gone)))
        .collect::<Vec<_>>();
    outbox.enqueue("actor", &rows).await.expect("enqueue");
    let out = outbox.drain("actor").await.expect("drain");
    assert_eq!(bodies(&r, "/gone"), ids(1));
    let letters = outbox
        .dead_letters(Some("actor"))
        .await
        .expect("dead letters");
    let hooked = dead.lock().expect("lock").clone();
    assert_eq!(
        hooked
            .iter()
            .map(|h| (h.id, h.unit, h.row_id.as_str(), h.reason))
            .collect::<Vec<_>>(),
        letters
            .iter()
            .map(|d| (d.id, d.unit, d.row_id.as_str(), d.reason))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        hooked.iter().map(|h| h.reason).collect::<Vec<_>>(),
        [
            DeadReason::Gone,
            DeadReason::LaneRetired,
            DeadReason::LaneRetired,
            DeadReason::LaneRetired
        ]
    );
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.dead_lettered == 4),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_sets_the_lanes_not_before() {
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
        .await
        .expect("enqueue");
    let out = outbox.drain("actor").await.expect("drain");
    assert!(matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 0 && rep.handed_back == 1));
    let lanes = outbox.lanes("actor").await.expect("lanes");
    assert_eq!(lanes.len(), 1);
    let nb = lanes[0].not_before.expect("not_before set by Retry-After");
    let now = outbox_lanes_core::Timestamp::from_system_time(std::time::SystemTime::now());
    assert!(
        nb > now + Duration::from_secs(60),
        "not_before is about two minutes out"
    );
    assert_eq!(lanes[0].last_status, Some(429));
    assert!(outbox.dead_letters(None).await.expect("dl").is_empty());
    assert_eq!(r.count("/busy"), 1, "not attempted again before not_before");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_drains_never_put_two_units_of_one_lane_in_flight() {
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
            tokio::spawn(async move {
                for i in 0..10 {
                    ob.enqueue("actor", &[row(&format!("t{t}-{i}"), &to)])
                        .await
                        .expect("enqueue");
                    if ob.drain("actor").await.expect("drain") == DrainOutcome::Merged {
                        merged.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.await.expect("join");
    }
    outbox.drain("actor").await.expect("final drain");
    assert_eq!(r.count("/p"), 40);
    one_in_flight(&r, "/p");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_row_waits_for_both_lanes() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/a", Reply::Status(200).after(Duration::from_millis(30)));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    outbox
        .enqueue("actor", &[row("a0", &[r.url("/a")])])
        .await
        .expect("enqueue");
    let mut joined = row("j", &[r.url("/a"), r.url("/b")]);
    joined.joined = true;
    outbox.enqueue("actor", &[joined]).await.expect("enqueue");
    outbox
        .enqueue("actor", &[row("b2", &[r.url("/b")])])
        .await
        .expect("enqueue");
    outbox.drain("actor").await.expect("drain");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_destination_is_refused_at_enqueue_and_dead_lettered_after_a_narrowing() {
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
    let refused = outbox.enqueue("actor", &rows).await.expect_err("refused");
    assert!(
        matches!(
            refused,
            outbox_lanes_tokio::OutboxError::Enqueue(
                outbox_lanes_store::EnqueueError::DestinationRefused { .. }
            )
        ),
        "{refused:?}"
    );
    // Widened (as by a process allowing loopback), enqueued, then narrowed by an operator:
    // delivery follows the policy as stored when the pass begins.
    f.store
        .widen_destination_policy(outbox_lanes_core::policy::AddressPolicy::allow_loopback_only())
        .expect("widen");
    outbox.enqueue("actor", &rows).await.expect("enqueue");
    f.store
        .set_destination_policy(outbox_lanes_core::policy::AddressPolicy::public_only())
        .expect("narrow");
    outbox.drain("actor").await.expect("drain");
    let letters = outbox
        .dead_letters(Some("actor"))
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|d| d.reason == DeadReason::DestinationRefused
                && d.last_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("destination_refused: "))),
        "{letters:?}"
    );
    assert_eq!(r.count_all(), 0, "the refused destination saw nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_followed() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/moved", Reply::Redirect(301, r.url("/elsewhere")));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    outbox
        .enqueue("actor", &[row("e0", &[r.url("/moved")])])
        .await
        .expect("enqueue");
    outbox.drain("actor").await.expect("drain");
    assert_eq!(r.count("/elsewhere"), 0);
    let letters = outbox.dead_letters(None).await.expect("dl");
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].last_status),
        (DeadReason::Permanent, Some(301))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_requests_verify_on_the_receiving_side() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.script("/hook", [Reply::Status(503)]);
    let signer = Arc::new(StandardWebhooks::from_whsec(SECRET).expect("secret"));
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .signer(signer)
        .open()
        .expect("outbox");
    outbox
        .enqueue(
            "actor",
            &[row("e0", &[r.url("/hook")]), row("e1", &[r.url("/hook")])],
        )
        .await
        .expect("enqueue");
    outbox.drain("actor").await.expect("drain");
    let receiver = StandardWebhooks::from_whsec(SECRET).expect("secret");
    let reqs = r.requests("/hook");
    assert_eq!(reqs.len(), 3, "e0 twice (503, then 200), e1 once");
    let now = std::time::SystemTime::now();
    for req in &reqs {
        let id = req.header("webhook-id").expect("webhook-id");
        let ts = req.header("webhook-timestamp").expect("webhook-timestamp");
        let sig = req.header("webhook-signature").expect("webhook-signature");
        assert_eq!(req.header("idempotency-key"), Some(id));
        receiver
            .verify(id, ts, sig, &req.body, now, Duration::from_secs(300))
            .expect("signature verifies");
        assert!(
            receiver
                .verify(id, ts, sig, b"{}", now, Duration::from_secs(300))
                .is_err()
        );
    }
    // The retry of e0 carries the same id (the unit's), signed again.
    assert_eq!(reqs[0].header("webhook-id"), reqs[1].header("webhook-id"));
    assert_ne!(reqs[1].header("webhook-id"), reqs[2].header("webhook-id"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_delivers_and_cancels_too() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(30)));
    let to = vec![r.url("/fast"), r.url("/slow")];
    let delivered = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&delivered);
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .hooks(Hooks {
            delivered: Some(Box::new(move |_| {
                seen.fetch_add(1, Ordering::Relaxed);
            })),
            ..Hooks::default()
        })
        .open()
        .expect("outbox");
    for i in 0..10 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
    // Cut the first drain once /slow has an answer; the next one delivers the rest.
    let rr = Arc::clone(&r);
    let first_answered = async move {
        let answered = tokio::task::spawn_blocking(move || {
            rr.wait_until(Duration::from_secs(20), |all| {
                all.iter()
                    .any(|q| q.path == "/slow" && q.completion.status().is_some())
            })
        })
        .await
        .expect("join");
        assert!(answered);
    };
    tokio::select! {
        out = outbox.drain("actor") => panic!("the drain finished first: {out:?}"),
        () = first_answered => {}
    }
    let again = outbox.drain("actor").await.expect("drain");
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    for p in ["/fast", "/slow"] {
        assert_eq!(common::dedup_bodies(&r, p), ids(10), "{p}");
    }
    assert!(delivered.load(Ordering::Relaxed) >= 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_and_shutdown_are_typed_errors() {
    let f = fixture();
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    let err = outbox
        .enqueue("actor", &[row("bad", &["not a url".to_string()])])
        .await
        .expect_err("refused");
    assert!(
        matches!(err, outbox_lanes_tokio::OutboxError::Enqueue(_)),
        "{err:?}"
    );
    assert!(
        outbox
            .status()
            .await
            .expect("status")
            .iter()
            .all(|s| s.pending == 0)
    );
    outbox.shutdown().await;
    let err = outbox.drain("actor").await.expect_err("shutting down");
    assert!(
        matches!(err, outbox_lanes_tokio::OutboxError::ShuttingDown),
        "{err:?}"
    );
}

/// With `tokio` alone, opening outside a tokio runtime is an error that says what to do.
#[cfg(not(any(feature = "smol", feature = "async-std")))]
#[test]
fn opening_outside_a_tokio_runtime_is_an_error() {
    let f = fixture();
    let err = Outbox::open(Arc::clone(&f.store), config()).expect_err("no runtime");
    assert!(
        matches!(err, outbox_lanes_tokio::OutboxError::Spawn(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("open_on"), "{err}");
}

/// With `smol` too, opening outside a tokio runtime (and an async-std task) opens on smol's
/// global executor: a smol program calls the same `Outbox::open` (tests/stop.rs runs one).
#[cfg(feature = "smol")]
#[test]
fn opening_outside_a_tokio_runtime_opens_on_smol() {
    let f = fixture();
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("on smol");
    assert!(format!("{outbox:?}").contains("SmolRuntime"), "{outbox:?}");
}

/// A drain runs pass after pass on one drain slot; the lease must be renewed across them, not
/// only within a pass: passes of 100 ms with a 900 ms lease (renewal due every 300 ms) never
/// reach a renewal by their own clock. Before the fix the drain failed with a stale token
/// once the lease lapsed, 900 ms in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_across_back_to_back_passes() {
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
            .await
            .expect("enqueue");
    }
    let out = outbox.drain("long").await.expect("drain");
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
