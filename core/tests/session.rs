//! Transcript tests of the pass driver's decisions: [`PassSession`] (one pass: time slice,
//! lease renewal, stop, grace) and [`DrainSession`] (the slot protocol around passes). For
//! each canonical scenario, the exact sequence of actions.
#![allow(missing_docs)]

use std::time::Duration;

use outbox_lanes_core::{
    Acquire, ActorId, DrainAction, DrainEnd, DrainSession, DrainSlots, PassEnd, PassSession,
    Release, SessionAction, SessionConfig, SlotAnswer, StopReason, Timestamp,
};

use DrainAction::{
    AcquireStoreSlot, Finish, ForceReleaseLocalSlot, FreeStoreSlot, ReleaseLocalSlot,
    ReleaseStoreSlot, RunPass,
};
use SessionAction::{End, RenewLease, StopStarting};
use StopReason::{Shutdown, TimeSlice};

const T0: Timestamp = Timestamp::from_secs(1_000_000);

fn at(ms: u64) -> Timestamp {
    T0 + Duration::from_millis(ms)
}

fn secs(s: u64) -> Timestamp {
    T0 + Duration::from_secs(s)
}

fn cfg(time_slice: u64, lease: u64, shutdown_grace: u64) -> SessionConfig {
    SessionConfig {
        time_slice: Duration::from_secs(time_slice),
        lease: Duration::from_secs(lease),
        shutdown_grace: Duration::from_secs(shutdown_grace),
    }
}

fn actions(s: &mut PassSession) -> Vec<SessionAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn drain_actions(d: &mut DrainSession) -> Vec<DrainAction> {
    std::iter::from_fn(|| d.poll_action()).collect()
}

// --- PassSession ---------------------------------------------------------------------------

#[test]
fn a_pass_that_drains_ends_drained() {
    let mut s = PassSession::new(cfg(25, 30, 5), T0);
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), Some(secs(10)), "the first lease renewal");
    s.handle_tick(secs(1), 1, false);
    assert_eq!(actions(&mut s), []);
    // The attempt finished but the scheduler still has a unit to start: not drained.
    s.handle_tick(secs(2), 0, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(secs(3), 0, true);
    assert_eq!(actions(&mut s), [End(PassEnd::Drained)]);
    assert!(s.is_ended());
    assert!(!s.is_stopping());
    assert_eq!(s.poll_timeout(), None);
    assert!(!PassEnd::Drained.hands_back_in_flight());
    assert!(!PassEnd::Drained.yielded());
    // After the end every input is ignored.
    s.handle_tick(secs(40), 3, false);
    s.handle_shutdown(secs(41));
    s.handle_lease_renewed(secs(42));
    s.handle_cancel(secs(43));
    s.handle_store_failed(secs(44));
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), None);
}

/// Passes of 2 s, back to back on one slot with a 30 s lease: each starts from the renewal
/// time the previous one handed on, so the lease is renewed at 10 s, not never.
#[test]
fn back_to_back_passes_renew_the_lease_they_inherit() {
    let mut renewed = T0;
    let mut log = Vec::new();
    for pass in 0..8u64 {
        let start = secs(2 * pass);
        let mut s = PassSession::new(cfg(2, 30, 5), start).with_lease_renewed_at(renewed);
        for t in 0..=2 {
            let now = secs(2 * pass + t);
            s.handle_tick(now, 1, false);
            for a in actions(&mut s) {
                if a == RenewLease {
                    s.handle_lease_renewed(now);
                }
                log.push((2 * pass + t, a));
            }
        }
        renewed = s.lease_renewed_at();
    }
    let renewals: Vec<u64> = log
        .iter()
        .filter(|(_, a)| *a == RenewLease)
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(renewals, [10], "{log:?}");
    // A pass never moves the renewal time forward by itself starting.
    let s = PassSession::new(cfg(2, 30, 5), secs(5)).with_lease_renewed_at(secs(1));
    assert_eq!(s.lease_renewed_at(), secs(1));
    let s = PassSession::new(cfg(2, 30, 5), secs(5)).with_lease_renewed_at(secs(9));
    assert_eq!(s.lease_renewed_at(), secs(5));
}

#[test]
fn a_long_pass_renews_its_lease_every_third_of_it() {
    let mut s = PassSession::new(cfg(3600, 30, 5), T0);
    let mut log = Vec::new();
    // The runtime ticks every second; its renewals take 500 ms.
    let mut renewing = None;
    for t in 1..=45 {
        let now = secs(t);
        if let Some(sent) = renewing.take() {
            s.handle_lease_renewed(sent + Duration::from_millis(500));
        }
        s.handle_tick(now, 1, false);
        for a in actions(&mut s) {
            if a == RenewLease {
                renewing = Some(now);
            }
            log.push((t, a));
        }
    }
    // Renewed at 10.5 s, then due at 20.5 s (seen at the 21 s tick) …
    assert_eq!(
        log,
        [
            (10, RenewLease),
            (21, RenewLease),
            (32, RenewLease),
            (43, RenewLease)
        ]
    );
}

#[test]
fn a_renewal_is_asked_once_until_it_is_answered() {
    let mut s = PassSession::new(cfg(3600, 30, 5), T0);
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    // The store is slow: no second request while the first is outstanding.
    for t in 11..=19 {
        s.handle_tick(secs(t), 1, false);
        assert_eq!(actions(&mut s), []);
    }
    assert_eq!(
        s.poll_timeout(),
        Some(secs(3600)),
        "only the slice end is due"
    );
    s.handle_lease_renewed(secs(19));
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), Some(secs(29)));
}

#[test]
fn the_slice_ends_with_work_left_then_the_pass_yields_when_in_flight_reaches_zero() {
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    s.handle_tick(secs(24), 2, false);
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), Some(secs(25)));
    s.handle_tick(secs(25), 2, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    assert!(s.is_stopping());
    assert_eq!(
        s.poll_timeout(),
        Some(secs(100)),
        "no grace for a slice: only the lease renewal is due"
    );
    s.handle_tick(secs(26), 1, false);
    assert_eq!(actions(&mut s), []);
    // Past where a grace would have ended: the attempt in flight is still waited for.
    s.handle_tick(secs(40), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(secs(47), 0, true);
    assert_eq!(actions(&mut s), [End(PassEnd::Yielded(TimeSlice))]);
    let end = PassEnd::Yielded(TimeSlice);
    assert!(end.yielded());
    assert!(!end.hands_back_in_flight());
}

#[test]
fn the_slice_is_checked_on_a_tick_right_after_a_claim() {
    // A deep backlog: every round of the runtime's loop only claims lane heads, nothing is in
    // flight yet. The old loop went round again after a claim without looking at the clock.
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    for ms in (0..25_000).step_by(250) {
        s.handle_tick(at(ms), 0, false);
        assert_eq!(actions(&mut s), [], "at {ms} ms");
    }
    s.handle_tick(secs(25), 0, false);
    // Nothing is in flight: the stop and the end come in one go.
    assert_eq!(
        actions(&mut s),
        [StopStarting(TimeSlice), End(PassEnd::Yielded(TimeSlice))]
    );
}

#[test]
fn a_pass_drained_at_its_slice_end_ends_drained_not_yielded() {
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    s.handle_tick(secs(30), 0, true);
    assert_eq!(actions(&mut s), [End(PassEnd::Drained)]);
}

#[test]
fn shutdown_with_a_hanging_attempt_ends_grace_over_at_exactly_the_grace() {
    let mut s = PassSession::new(cfg(60, 300, 5), T0);
    s.handle_tick(secs(1), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_shutdown(secs(3));
    assert_eq!(actions(&mut s), [StopStarting(Shutdown)]);
    assert_eq!(s.poll_timeout(), Some(secs(8)));
    s.handle_tick(secs(4), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(at(7_999), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(secs(8), 1, false);
    assert_eq!(actions(&mut s), [End(PassEnd::GraceOver(Shutdown))]);
    let end = PassEnd::GraceOver(Shutdown);
    assert!(end.hands_back_in_flight());
    assert!(end.yielded());
    // A second shutdown changes nothing.
    s.handle_shutdown(secs(9));
    assert_eq!(actions(&mut s), []);
}

#[test]
fn shutdown_during_a_slice_stop_upgrades_the_reason_and_starts_the_grace() {
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    s.handle_tick(secs(25), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    s.handle_shutdown(secs(27));
    // The scheduler already stops starting: no second StopStarting; the grace period runs
    // from the shutdown, since the slice cut nothing.
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), Some(secs(32)));
    s.handle_tick(secs(28), 0, true);
    // Shutdown, so that a direct drain does not run another pass.
    assert_eq!(actions(&mut s), [End(PassEnd::Yielded(Shutdown))]);
}

#[test]
fn shutdown_during_a_slice_stop_cuts_a_hanging_attempt_at_the_grace_from_the_shutdown() {
    let mut s = PassSession::new(cfg(10, 300, 10), T0);
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    s.handle_tick(secs(25), 1, false);
    assert_eq!(actions(&mut s), [], "the slice waits for the attempt");
    s.handle_shutdown(secs(25));
    assert_eq!(actions(&mut s), []);
    s.handle_tick(at(34_999), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(secs(35), 1, false);
    assert_eq!(actions(&mut s), [End(PassEnd::GraceOver(Shutdown))]);
}

#[test]
fn shutdown_with_nothing_in_flight_yields_at_the_next_tick() {
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    s.handle_shutdown(secs(1));
    assert_eq!(actions(&mut s), [StopStarting(Shutdown)]);
    s.handle_tick(secs(1), 0, true);
    assert_eq!(actions(&mut s), [End(PassEnd::Yielded(Shutdown))]);
}

#[test]
fn a_zero_grace_ends_with_the_shutdown_when_attempts_are_in_flight() {
    let mut s = PassSession::new(cfg(25, 300, 0), T0);
    s.handle_tick(secs(25), 3, false);
    assert_eq!(
        actions(&mut s),
        [StopStarting(TimeSlice)],
        "a slice cuts nothing, even with no grace"
    );
    s.handle_shutdown(secs(26));
    s.handle_tick(secs(26), 3, false);
    assert_eq!(actions(&mut s), [End(PassEnd::GraceOver(Shutdown))]);
}

#[test]
fn cancel_while_stopping_ends_at_once() {
    let mut s = PassSession::new(cfg(25, 300, 5), T0);
    s.handle_tick(secs(25), 2, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    s.handle_cancel(secs(26));
    assert_eq!(actions(&mut s), [End(PassEnd::Cancelled)]);
    assert!(PassEnd::Cancelled.hands_back_in_flight());
    assert!(!PassEnd::Cancelled.yielded());
    assert_eq!(s.poll_timeout(), None);
    s.handle_tick(secs(31), 2, false);
    assert_eq!(actions(&mut s), []);
}

#[test]
fn a_store_failure_mid_pass_ends_at_once_with_nothing_after() {
    let mut s = PassSession::new(cfg(25, 30, 5), T0);
    s.handle_tick(secs(10), 4, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    // The renewal failed.
    s.handle_store_failed(secs(11));
    assert_eq!(actions(&mut s), [End(PassEnd::StoreFailed)]);
    assert!(PassEnd::StoreFailed.hands_back_in_flight());
    assert!(!PassEnd::StoreFailed.yielded());
    // Neither the slice end nor the next renewal produces anything now.
    s.handle_tick(secs(20), 4, false);
    s.handle_tick(secs(25), 4, false);
    s.handle_shutdown(secs(26));
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn a_store_failure_drops_actions_not_yet_polled() {
    let mut s = PassSession::new(cfg(25, 30, 5), T0);
    s.handle_tick(secs(10), 4, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    s.handle_lease_renewed(secs(10));
    // The slice end and a renewal fall due together …
    s.handle_tick(secs(25), 4, false);
    // … and an ack fails before the runtime polled them.
    s.handle_store_failed(secs(25));
    assert_eq!(actions(&mut s), [End(PassEnd::StoreFailed)]);
}

#[test]
fn poll_timeout_is_the_next_renewal_slice_end_or_grace_end() {
    let mut s = PassSession::new(cfg(25, 30, 5), T0);
    assert_eq!(s.poll_timeout(), Some(secs(10)));
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    assert_eq!(
        s.poll_timeout(),
        Some(secs(25)),
        "renewal outstanding: the slice end"
    );
    s.handle_lease_renewed(secs(12));
    assert_eq!(s.poll_timeout(), Some(secs(22)));
    s.handle_tick(secs(22), 1, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    s.handle_lease_renewed(secs(22));
    assert_eq!(
        s.poll_timeout(),
        Some(secs(25)),
        "the slice ends before the renewal"
    );
    s.handle_tick(secs(25), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    assert_eq!(
        s.poll_timeout(),
        Some(secs(32)),
        "a slice has no grace: the renewal"
    );
    s.handle_shutdown(secs(26));
    assert_eq!(
        s.poll_timeout(),
        Some(secs(31)),
        "a shutdown's grace ends before the renewal"
    );
    s.handle_tick(secs(31), 1, false);
    assert_eq!(actions(&mut s), [End(PassEnd::GraceOver(Shutdown))]);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn with_slicing_off_the_pass_runs_uncontended_slices_then_stops_when_turned_on() {
    let mut s = PassSession::new(cfg(10, 3600, 10), T0);
    s.set_slicing(false);
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [], "nobody waits: no stop at the slice");
    let long = 10 * u64::from(outbox_lanes_core::UNCONTENDED_SLICES);
    assert_eq!(s.poll_timeout(), Some(secs(long)));
    // Another actor starts waiting: the pass stops at once, being past its slice.
    s.set_slicing(true);
    assert_eq!(s.poll_timeout(), Some(secs(10)));
    s.handle_tick(secs(120), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
}

#[test]
fn with_slicing_off_the_pass_still_stops_after_the_uncontended_slices() {
    let mut s = PassSession::new(cfg(10, 3600, 10), T0);
    s.set_slicing(false);
    let long = 10 * u64::from(outbox_lanes_core::UNCONTENDED_SLICES);
    s.handle_tick(secs(long - 1), 1, false);
    assert_eq!(actions(&mut s), []);
    s.handle_tick(secs(long), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
}

#[test]
fn the_lease_is_renewed_while_stopping() {
    let mut s = PassSession::new(cfg(5, 30, 60), T0);
    s.handle_tick(secs(5), 1, false);
    assert_eq!(actions(&mut s), [StopStarting(TimeSlice)]);
    assert_eq!(s.poll_timeout(), Some(secs(10)));
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    s.handle_lease_renewed(secs(10));
    assert_eq!(s.poll_timeout(), Some(secs(20)));
}

#[test]
fn a_clock_that_steps_back_moves_no_deadline() {
    let mut s = PassSession::new(cfg(25, 30, 5), T0);
    s.handle_tick(secs(9), 1, false);
    s.handle_tick(secs(2), 1, false);
    assert_eq!(actions(&mut s), []);
    assert_eq!(s.poll_timeout(), Some(secs(10)));
    s.handle_tick(secs(10), 1, false);
    assert_eq!(actions(&mut s), [RenewLease]);
    // A renewal reported with an earlier time counts from the latest time seen.
    s.handle_lease_renewed(secs(3));
    assert_eq!(s.poll_timeout(), Some(secs(20)));
}

// --- DrainSession --------------------------------------------------------------------------

#[test]
fn a_direct_drain_goes_on_past_a_slice_looks_again_and_stops_when_another_process_holds() {
    let actor = ActorId::new("alice");
    let mut slots = DrainSlots::new();
    assert_eq!(slots.try_acquire(&actor), Acquire::Acquired);
    let mut d = DrainSession::new(false);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    // The time slice ran out: a direct drain runs the next pass at once, still holding.
    d.handle_pass_end(PassEnd::Yielded(TimeSlice));
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::GraceOver(TimeSlice));
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
    // Another process asked meanwhile: look again, still holding the store's slot.
    d.handle_store_release(Release::LookAgain);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    // A request in this process during the next pass.
    assert_eq!(slots.try_acquire(&actor), Acquire::Merged);
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(drain_actions(&mut d), [ReleaseLocalSlot]);
    d.handle_local_release(slots.release(&actor));
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    // Another process took the store's slot in between; it was told to look again.
    d.handle_store_acquire(SlotAnswer::Held);
    assert_eq!(
        drain_actions(&mut d),
        [
            ForceReleaseLocalSlot,
            Finish(DrainEnd::Ran { yielded: false })
        ]
    );
    assert!(!slots.force_release(&actor));
    assert!(!slots.is_held(&actor));
    assert!(d.is_finished());
    // Nothing after the finish.
    d.handle_pass_end(PassEnd::Drained);
    d.handle_failed();
    assert_eq!(drain_actions(&mut d), []);
}

#[test]
fn a_drain_that_looks_again_locally_and_then_finds_nothing_finishes_ran() {
    let mut d = DrainSession::new(false);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(drain_actions(&mut d), [ReleaseLocalSlot]);
    d.handle_local_release(Release::LookAgain);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(drain_actions(&mut d), [ReleaseLocalSlot]);
    d.handle_local_release(Release::Released);
    assert_eq!(
        drain_actions(&mut d),
        [Finish(DrainEnd::Ran { yielded: false })]
    );
}

#[test]
fn a_monitor_drain_yields_at_its_slice_frees_the_store_slot_and_leaves_a_look_again_to_the_monitor()
{
    let mut d = DrainSession::new(true);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    // Not `ReleaseStoreSlot`: a look-again asked meanwhile must not keep the store's slot
    // held with no pass running (the monitor comes back for the actor and would find it
    // held until the lease ran out).
    d.handle_pass_end(PassEnd::Yielded(TimeSlice));
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(
        drain_actions(&mut d),
        [
            ForceReleaseLocalSlot,
            Finish(DrainEnd::Ran { yielded: true })
        ]
    );
}

#[test]
fn a_monitor_drain_whose_grace_ran_out_yields_too() {
    let mut d = DrainSession::new(true);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::GraceOver(TimeSlice));
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(
        drain_actions(&mut d),
        [
            ForceReleaseLocalSlot,
            Finish(DrainEnd::Ran { yielded: true })
        ]
    );
}

#[test]
fn a_direct_drain_stopped_by_shutdown_releases_and_yields() {
    for end in [PassEnd::Yielded(Shutdown), PassEnd::GraceOver(Shutdown)] {
        let mut d = DrainSession::new(false);
        let _ = drain_actions(&mut d);
        d.handle_store_acquire(SlotAnswer::Acquired);
        assert_eq!(drain_actions(&mut d), [RunPass]);
        d.handle_pass_end(end);
        assert_eq!(drain_actions(&mut d), [FreeStoreSlot], "{end:?}");
        d.handle_store_release(Release::Released);
        assert_eq!(
            drain_actions(&mut d),
            [
                ForceReleaseLocalSlot,
                Finish(DrainEnd::Ran { yielded: true })
            ],
            "{end:?}"
        );
    }
}

#[test]
fn a_store_slot_held_at_the_first_acquire_is_a_merge() {
    let actor = ActorId::new("bob");
    let mut slots = DrainSlots::new();
    assert_eq!(slots.try_acquire(&actor), Acquire::Acquired);
    let mut d = DrainSession::new(false);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_store_acquire(SlotAnswer::Held);
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Merged)]
    );
    let _asked = slots.force_release(&actor);
    assert!(!slots.is_held(&actor));
}

#[test]
fn a_store_failure_releases_best_effort_then_fails() {
    // The release fails too.
    let mut d = DrainSession::new(false);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::StoreFailed);
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
    // The release works, and even says look again: that is left to the monitor.
    let mut d = DrainSession::new(true);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::StoreFailed);
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_store_release(Release::LookAgain);
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
}

#[test]
fn a_cancelled_pass_releases_both_slots_and_finishes_cancelled() {
    let mut d = DrainSession::new(false);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_pass_end(PassEnd::Cancelled);
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_store_release(Release::Released);
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Cancelled)]
    );
    // A failed release does not turn a cancellation into a failure.
    let mut d = DrainSession::new(false);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    let _ = drain_actions(&mut d);
    d.handle_pass_end(PassEnd::Cancelled);
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Cancelled)]
    );
}

#[test]
fn a_failed_protocol_call_force_releases_and_fails() {
    // The first acquire fails: the store's slot was never held, nothing to release there.
    let mut d = DrainSession::new(false);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
    // The release after a drained pass fails.
    let mut d = DrainSession::new(false);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    let _ = drain_actions(&mut d);
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
    // The re-acquire after a local look-again fails.
    let mut d = DrainSession::new(false);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    let _ = drain_actions(&mut d);
    d.handle_pass_end(PassEnd::Drained);
    let _ = drain_actions(&mut d);
    d.handle_store_release(Release::Released);
    let _ = drain_actions(&mut d);
    d.handle_local_release(Release::LookAgain);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
    // The release after a yield fails.
    let mut d = DrainSession::new(true);
    let _ = drain_actions(&mut d);
    d.handle_store_acquire(SlotAnswer::Acquired);
    let _ = drain_actions(&mut d);
    d.handle_pass_end(PassEnd::Yielded(TimeSlice));
    assert_eq!(drain_actions(&mut d), [FreeStoreSlot]);
    d.handle_failed();
    assert_eq!(
        drain_actions(&mut d),
        [ForceReleaseLocalSlot, Finish(DrainEnd::Failed)]
    );
}

#[test]
fn inputs_the_drain_is_not_waiting_for_are_ignored() {
    let mut d = DrainSession::new(false);
    assert_eq!(drain_actions(&mut d), [AcquireStoreSlot]);
    d.handle_pass_end(PassEnd::Drained);
    d.handle_store_release(Release::Released);
    d.handle_local_release(Release::Released);
    assert_eq!(drain_actions(&mut d), []);
    d.handle_store_acquire(SlotAnswer::Acquired);
    assert_eq!(drain_actions(&mut d), [RunPass]);
    d.handle_store_acquire(SlotAnswer::Held);
    d.handle_store_release(Release::LookAgain);
    assert_eq!(drain_actions(&mut d), []);
    assert!(!d.is_finished());
    d.handle_pass_end(PassEnd::Drained);
    assert_eq!(drain_actions(&mut d), [ReleaseStoreSlot]);
}

// --- both together -------------------------------------------------------------------------

/// A direct drain of a pass that would run 70 s with an attempt always in flight: the slice
/// ends at 25 s and stops starting, but cuts nothing (OL-13): the pass waits for the
/// attempts in flight, yields when the last one is answered, and the next pass drains.
#[test]
fn a_direct_drain_runs_slices_back_to_back_until_drained() {
    let c = cfg(25, 30, 5);
    let mut d = DrainSession::new(false);
    let mut now = T0;
    let mut log: Vec<String> = Vec::new();
    let work_ends = secs(70);
    let end = loop {
        let Some(a) = d.poll_action() else {
            panic!("the drain stalled");
        };
        log.push(format!("{a:?}"));
        match a {
            AcquireStoreSlot => d.handle_store_acquire(SlotAnswer::Acquired),
            RunPass => {
                let mut s = PassSession::new(c, now);
                let pass_end = 'pass: loop {
                    now = now + Duration::from_secs(1);
                    s.handle_tick(now, usize::from(now < work_ends), now >= work_ends);
                    while let Some(sa) = s.poll_action() {
                        match sa {
                            RenewLease => s.handle_lease_renewed(now),
                            StopStarting(_) => {}
                            End(e) => break 'pass e,
                        }
                    }
                };
                log.push(format!("{pass_end:?} at {:?}", now - T0));
                d.handle_pass_end(pass_end);
            }
            ReleaseStoreSlot | FreeStoreSlot => d.handle_store_release(Release::Released),
            ReleaseLocalSlot => d.handle_local_release(Release::Released),
            ForceReleaseLocalSlot => {}
            Finish(e) => break e,
        }
    };
    assert_eq!(end, DrainEnd::Ran { yielded: false });
    assert_eq!(
        log,
        [
            "AcquireStoreSlot",
            "RunPass",
            "Yielded(TimeSlice) at 70s",
            "RunPass",
            "Drained at 71s",
            "ReleaseStoreSlot",
            "ReleaseLocalSlot",
            "Finish(Ran { yielded: false })",
        ]
    );
}
