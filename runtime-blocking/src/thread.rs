//! The blocking runtime's executor: the engine's [`Runtime`] over std threads.
//!
//! Each task owns a thread and runs to completion on it ([`block_on`]): a drain runs on the
//! caller's thread, the monitor and each of its passes on a thread of their own (as many as
//! passes run), so blocking store calls run in place ([`Runtime::blocking_in_place`]).
//! Timers need no timer thread: a sleep polled on a [`block_on`] thread records its
//! deadline, and the thread parks until the earliest one (or an unpark by a waker).
//!
//! Why hand-written rather than a crate: the engine needs one thread per task, wakers that
//! unpark it, and sleeps that shorten its park — a few dozen lines; `pollster` has no timers,
//! and `futures-timer` adds a global timer thread for what a park timeout does here.

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use outbox_lanes_driver::engine::{BoxFuture, Runtime};
use tracing::warn;

thread_local! {
    /// The earliest deadline of the sleeps polled on this thread since it last parked.
    static NEXT_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// std threads: a thread per task, blocking calls in place; the library's long-lived threads
/// (ack writer, host writer, the store's watcher) are std threads too ([`Runtime::threads`]'
/// default).
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRuntime;

impl Runtime for ThreadRuntime {
    fn spawn(&self, future: BoxFuture<()>) {
        let spawned = thread::Builder::new()
            .name("outbox-lanes-task".into())
            .spawn(move || block_on(future));
        if let Err(e) = spawned {
            // The future was dropped unrun: what it owned reports itself (a monitor's pass
            // reports "done" as it is dropped).
            warn!(error = %e, "cannot start a thread for a task");
        }
    }

    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
        if let Err(e) = thread::Builder::new()
            .name("outbox-lanes-blocking".into())
            .spawn(f)
        {
            warn!(error = %e, "cannot start a thread for blocking work");
        }
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(Sleep {
            deadline: Instant::now() + duration,
        })
    }

    fn blocking_in_place(&self) -> bool {
        true
    }
}

/// Completes at its deadline; only on a [`block_on`] thread (it shortens that thread's park).
struct Sleep {
    deadline: Instant,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        NEXT_DEADLINE.with(|d| {
            d.set(Some(
                d.get().map_or(self.deadline, |t| t.min(self.deadline)),
            ));
        });
        Poll::Pending
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread: polls it, then parks until a waker unparks
/// the thread or the earliest sleep of [`ThreadRuntime`] polled meanwhile is due.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        NEXT_DEADLINE.with(|d| d.set(None));
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        match NEXT_DEADLINE.with(Cell::take) {
            Some(t) => thread::park_timeout(t.saturating_duration_since(Instant::now())),
            None => thread::park(),
        }
    }
}
