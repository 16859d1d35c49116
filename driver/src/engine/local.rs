//! A pass's own deliveries: the first few attempts a pass has in flight run on the pass's
//! task instead of a task each.
//!
//! One lane is one row per round trip, so what happens between two rows of it is all
//! latency. With a task per attempt, a completion went from the delivery task to the pass
//! task (a channel and a wake-up) and the next row to a new task (a spawn), each a chance for
//! the runtime to move the work to another worker thread. Here the pass polls up to
//! [`LOCAL_DELIVERIES`] of its attempts itself: their completions land in the pass's hands
//! while it polls them (no channel, no wake-up), and the next row's request is written from
//! the same task, as a plain client loop would. Past that number attempts are spawned as
//! before, so that many lanes still spread over the runtime's workers.
//!
//! How an executor takes part: it hands its delivery future to [`spawn_delivery`] instead of
//! [`Runtime::spawn`] — an async transport only: a future that blocks its thread (a blocking
//! client on a runtime that runs blocking calls in place) would hold up the pass, and on such
//! a runtime ([`Runtime::blocking_in_place`], each task owns a thread) the pass keeps none.
//! While a pass hands its jobs to the executor it *captures* (a thread-local, set only for
//! that synchronous call), and the futures spawned meanwhile become the pass's. Nothing else
//! changes for the executor: the job still reports through [`Job::finish`](crate::Job::finish),
//! and a future the pass still holds when the pass goes (its end, or its future dropped) is
//! spawned then, so an attempt in flight finishes as it would have. So the pass's future must be polled to its end or dropped (each pass is
//! a task of its own here): a pass that is neither would hold its deliveries still.
//!
//! Hand-written, not `futures-util`'s `FuturesUnordered`: the pass holds at most four, and
//! polling four on any wake-up costs less than that crate's per-future wakers.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use super::{BoxFuture, Runtime};
use crate::job::Done;

/// The most attempts a pass runs on its own task at once.
pub(crate) const LOCAL_DELIVERIES: usize = 4;

thread_local! {
    /// Set while a pass hands jobs to the executor: the futures [`spawn_delivery`] may keep.
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
    /// Set while a pass polls its own deliveries: which pass (its [`Completed`]'s address).
    static POLLING: Cell<usize> = const { Cell::new(0) };
}

struct Capture {
    room: usize,
    futures: Vec<BoxFuture<()>>,
}

/// Runs a delivery's future: on the pass that is handing out its job, if it has room, or as
/// a task of its own on `rt`.
pub fn spawn_delivery(rt: &dyn Runtime, future: BoxFuture<()>) {
    let left = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
        Some(cap) if cap.room > 0 => {
            cap.room -= 1;
            cap.futures.push(future);
            None
        }
        _ => Some(future),
    });
    if let Some(future) = left {
        rt.spawn(future);
    }
}

/// Completions of a pass's own deliveries, reported while the pass polls them.
#[derive(Default)]
pub(crate) struct Completed(Mutex<Vec<Done>>);

impl Completed {
    /// Keeps `done` if the pass owning `this` is polling its deliveries on this thread
    /// (it takes it when the poll returns); otherwise hands it back.
    pub(crate) fn keep(this: &Arc<Completed>, done: Done) -> Option<Done> {
        if POLLING.with(Cell::get) != Arc::as_ptr(this) as usize {
            return Some(done);
        }
        this.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(done);
        None
    }
}

/// The deliveries a pass runs on its own task.
pub(crate) struct Local {
    rt: Arc<dyn Runtime>,
    futures: Vec<BoxFuture<()>>,
    completed: Arc<Completed>,
}

impl Local {
    pub(crate) fn new(rt: Arc<dyn Runtime>) -> Local {
        Local {
            rt,
            futures: Vec::new(),
            completed: Arc::default(),
        }
    }

    /// Where the pass's jobs report while the pass polls them ([`Completed::keep`]).
    pub(crate) fn completed(&self) -> Arc<Completed> {
        Arc::clone(&self.completed)
    }

    /// Runs `f` (which hands jobs to the executor) keeping, up to the room left, the
    /// delivery futures it spawns. On a runtime that blocks in place, it keeps none: each
    /// task owns a thread there, so there is nothing to save, and a delivery polled by the
    /// pass could block it.
    pub(crate) fn capture<R>(&mut self, f: impl FnOnce() -> R) -> R {
        if self.rt.blocking_in_place() {
            return f();
        }
        /// Puts back the capture that was there before; should `f` panic, what it captured
        /// is spawned, so no delivery is lost with the round.
        struct Restore {
            outer: Option<Capture>,
            rt: Arc<dyn Runtime>,
        }
        impl Drop for Restore {
            fn drop(&mut self) {
                if let Some(cap) = CAPTURE.with(|c| c.replace(self.outer.take())) {
                    for f in cap.futures {
                        self.rt.spawn(f);
                    }
                }
            }
        }
        let room = LOCAL_DELIVERIES.saturating_sub(self.futures.len());
        let outer = CAPTURE.with(|c| {
            c.replace(Some(Capture {
                room,
                futures: Vec::new(),
            }))
        });
        let restore = Restore {
            outer,
            rt: Arc::clone(&self.rt),
        };
        let r = f();
        let mine = CAPTURE.with(|c| c.replace(None));
        drop(restore);
        if let Some(cap) = mine {
            self.futures.extend(cap.futures);
        }
        r
    }

    /// Polls every delivery the pass holds; the completions they reported go to `batch`.
    /// A delivery that panics is dropped (its job reports it was not sent), as a task of its
    /// own would have been: the pass goes on.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, batch: &mut Vec<Done>) {
        /// Puts back the pass that was polling before, however the poll ends (a delivery's
        /// drop may panic too).
        struct Restore(usize);
        impl Drop for Restore {
            fn drop(&mut self) {
                POLLING.with(|p| p.set(self.0));
            }
        }
        if !self.futures.is_empty() {
            let _restore =
                Restore(POLLING.with(|p| p.replace(Arc::as_ptr(&self.completed) as usize)));
            self.futures.retain_mut(|f| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| f.as_mut().poll(cx))) {
                    Ok(Poll::Pending) => true,
                    Ok(Poll::Ready(())) | Err(_) => false,
                }
            });
        }
        batch.append(
            &mut self
                .completed
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// Awaits `fut` while polling the pass's deliveries (a blocking round: the attempts in
    /// flight go on meanwhile).
    pub(crate) async fn drive<F: Future>(&mut self, batch: &mut Vec<Done>, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            self.poll(cx, batch);
            Pin::as_mut(&mut fut).poll(cx)
        })
        .await
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // The pass is gone (ended, or its future dropped): what is in flight finishes on
        // tasks of its own, as it would have without the pass.
        for f in self.futures.drain(..) {
            self.rt.spawn(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use outbox_lanes_core::{Config, LaneKey, Outcome, Scheduler, UnitId};

    use super::*;
    use crate::http::AttemptResult;

    /// A runtime that keeps what it is asked to spawn, to count it.
    #[derive(Default)]
    struct Kept(Mutex<Vec<BoxFuture<()>>>);

    impl std::fmt::Debug for Kept {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Kept").finish_non_exhaustive()
        }
    }

    impl Runtime for Kept {
        fn spawn(&self, future: BoxFuture<()>) {
            self.0.lock().expect("kept").push(future);
        }
        fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
            f();
        }
        fn sleep(&self, _: Duration) -> BoxFuture<()> {
            Box::pin(std::future::pending())
        }
    }

    impl Kept {
        fn spawned(&self) -> usize {
            self.0.lock().expect("kept").len()
        }
    }

    fn done(unit: u64) -> Done {
        let lane = Scheduler::new(Config::default(), 1)
            .lane(&LaneKey::new("http://127.0.0.1/inbox", None).expect("url"));
        Done {
            unit: UnitId(unit),
            lane,
            result: AttemptResult {
                outcome: Outcome::Delivered,
                status: Some(200),
                error: None,
                body: None,
            },
            started: crate::clock::Clock::instant(&crate::clock::SystemClock),
        }
    }

    /// A delivery that reports `unit` through `completed` when first polled, as a job's
    /// `finish` does through the pass's sink.
    fn reporting(completed: Arc<Completed>, unit: u64, sent: Arc<AtomicUsize>) -> BoxFuture<()> {
        Box::pin(async move {
            if let Some(d) = Completed::keep(&completed, done(unit)) {
                // Not kept: it would have gone to the channel.
                drop(d);
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    }

    fn noop_cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    #[test]
    fn a_pass_keeps_up_to_its_room_and_spawns_the_rest() {
        let rt = Arc::new(Kept::default());
        let mut local = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        local.capture(|| {
            for _ in 0..LOCAL_DELIVERIES + 2 {
                spawn_delivery(&*rt, Box::pin(std::future::pending()));
            }
        });
        assert_eq!(local.futures.len(), LOCAL_DELIVERIES);
        assert_eq!(rt.spawned(), 2);
        // No room left: the next capture keeps nothing.
        local.capture(|| spawn_delivery(&*rt, Box::pin(std::future::pending())));
        assert_eq!((local.futures.len(), rt.spawned()), (LOCAL_DELIVERIES, 3));
        // Outside a capture, every delivery is a task of its own.
        spawn_delivery(&*rt, Box::pin(std::future::pending()));
        assert_eq!(rt.spawned(), 4);
        // A pass that goes hands what it holds to the runtime: nothing in flight is dropped.
        drop(local);
        assert_eq!(rt.spawned(), 4 + LOCAL_DELIVERIES);
    }

    /// [`Kept`], on a runtime where each task owns a thread.
    #[derive(Debug, Default)]
    struct InPlace(Kept);

    impl Runtime for InPlace {
        fn spawn(&self, future: BoxFuture<()>) {
            self.0.spawn(future);
        }
        fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
            f();
        }
        fn sleep(&self, d: Duration) -> BoxFuture<()> {
            self.0.sleep(d)
        }
        fn blocking_in_place(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_pass_on_a_runtime_that_blocks_in_place_keeps_nothing() {
        let rt = Arc::new(InPlace::default());
        let mut local = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        local.capture(|| spawn_delivery(&*rt, Box::pin(std::future::pending())));
        assert_eq!((local.futures.len(), rt.0.spawned()), (0, 1));
    }

    #[test]
    fn completions_reported_while_the_pass_polls_them_go_to_its_batch() {
        let rt = Arc::new(Kept::default());
        let mut local = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        let sent = Arc::new(AtomicUsize::new(0));
        let c = local.completed();
        local.capture(|| {
            for unit in 0..3 {
                spawn_delivery(&*rt, reporting(Arc::clone(&c), unit, Arc::clone(&sent)));
            }
        });
        let mut batch = Vec::new();
        local.poll(&mut noop_cx(), &mut batch);
        let units: Vec<u64> = batch.iter().map(|d| d.unit.0).collect();
        assert_eq!(units, vec![0, 1, 2]);
        assert_eq!(
            sent.load(Ordering::SeqCst),
            0,
            "none went through the channel"
        );
        assert!(local.futures.is_empty(), "finished deliveries are dropped");
        // Reported on a task of its own (not while the pass polls): the channel.
        let mut cx = noop_cx();
        let mut spawned = reporting(Arc::clone(&c), 3, Arc::clone(&sent));
        assert!(spawned.as_mut().poll(&mut cx).is_ready());
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        // Another pass's delivery polled by this one reports to its own pass.
        let other = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        local.capture(|| {
            spawn_delivery(&*rt, reporting(other.completed(), 4, Arc::clone(&sent)));
        });
        batch.clear();
        local.poll(&mut noop_cx(), &mut batch);
        assert!(batch.is_empty());
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_panic_while_capturing_spawns_what_was_captured() {
        let rt = Arc::new(Kept::default());
        let mut local = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            local.capture(|| {
                spawn_delivery(&*rt, Box::pin(std::future::pending()));
                panic!("the executor panicked");
            })
        }));
        assert!(r.is_err());
        assert_eq!((local.futures.len(), rt.spawned()), (0, 1));
        // The capture is gone: a delivery now is a task of its own.
        spawn_delivery(&*rt, Box::pin(std::future::pending()));
        assert_eq!(rt.spawned(), 2);
    }

    #[test]
    fn a_panicking_delivery_is_dropped_and_the_pass_goes_on() {
        let rt = Arc::new(Kept::default());
        let mut local = Local::new(Arc::clone(&rt) as Arc<dyn Runtime>);
        local.capture(|| {
            spawn_delivery(&*rt, Box::pin(async { panic!("a delivery panicked") }));
            spawn_delivery(&*rt, Box::pin(std::future::pending()));
        });
        let mut batch = Vec::new();
        local.poll(&mut noop_cx(), &mut batch);
        assert_eq!(local.futures.len(), 1, "the pending delivery is kept");
    }
}
