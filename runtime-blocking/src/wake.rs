//! Coalesced wake-ups: a burst of enqueues puts one message in a loop's channel, not one per
//! enqueue (the channels are unbounded, and a burst of 100,000 enqueues would otherwise queue
//! 100,000 messages to every running pass and to the monitor).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

/// One loop's wake-up flag: set by the first wake-up, cleared by the loop when it handles it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Coalesced(Arc<AtomicBool>);

impl Coalesced {
    /// A store wake-up: sends `msg` only if none is waiting.
    pub(crate) fn wake<M>(&self, tx: &Sender<M>, msg: impl FnOnce() -> M) {
        if !self.0.swap(true, Ordering::AcqRel) {
            let _ = tx.send(msg());
        }
    }

    /// The loop took the message: the next wake-up sends a new one. Call it before acting
    /// on the wake-up, so one that comes while the loop acts is not lost.
    pub(crate) fn taken(&self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_burst_of_wake_ups_is_one_message_until_it_is_taken() {
        let (tx, rx) = mpsc::channel();
        let c = Coalesced::default();
        for _ in 0..10_000 {
            c.wake(&tx, || 1u8);
        }
        assert_eq!(rx.try_iter().count(), 1);
        // Nothing more until the loop took it…
        c.wake(&tx, || 1u8);
        assert_eq!(rx.try_iter().count(), 0);
        // …then the next wake-up is a message again.
        c.taken();
        c.wake(&tx, || 1u8);
        c.wake(&tx, || 1u8);
        assert_eq!(rx.try_iter().count(), 1);
    }
}
