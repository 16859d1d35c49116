//! A coalesced wake-up between threads and one waiting task, on `futures-channel` (no
//! executor behind it): any number of wake-ups before the task looks are one, and a
//! wake-up that comes while the task is busy is kept for its next wait.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_channel::mpsc;
use futures_core::Stream;

/// The waking side: cheap to clone, callable from any thread, never blocks.
#[derive(Clone)]
pub(crate) struct Waker {
    pending: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<()>,
}

/// The waiting side.
pub(crate) struct Woken {
    pending: Arc<AtomicBool>,
    rx: mpsc::UnboundedReceiver<()>,
}

pub(crate) fn pair() -> (Waker, Woken) {
    let (tx, rx) = mpsc::unbounded();
    let pending = Arc::new(AtomicBool::new(false));
    (
        Waker {
            pending: Arc::clone(&pending),
            tx,
        },
        Woken { pending, rx },
    )
}

impl Waker {
    pub(crate) fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            // The waiting side is gone: nobody to wake.
            let _ = self.tx.unbounded_send(());
        }
    }
}

impl Woken {
    /// Ready once a wake-up came since the last one taken. Once every waker is gone it is
    /// never ready again.
    pub(crate) fn poll_woken(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut self.rx).poll_next(cx) {
            Poll::Ready(Some(())) => {
                self.pending.store(false, Ordering::Release);
                Poll::Ready(())
            }
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }

    /// Takes a wake-up that is waiting, without waiting; whether there was one.
    pub(crate) fn take(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.poll_woken(&mut cx).is_ready()
    }
}
