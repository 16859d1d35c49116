//! What a [`Job`](crate::Job) carries from the executors in front of the one that runs it:
//! its place under its origin in the host book ([`OriginTicket`], from
//! [`OriginGate`](crate::OriginGate)) and under a per-host cap ([`HostPermit`], from
//! [`HostCaps`](crate::HostCaps)). Each gives its place back when the attempt ends or the job
//! is dropped unrun, through a small trait the gate implements, so that this module (and
//! `job.rs`, which holds them) imports neither gate: the modules' imports stay a DAG.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use outbox_lanes_core::host::{HostEnd, HostTicket, KnockPlan, KnockReport, SignatureSpec};
use outbox_lanes_core::{ActorId, Outcome};

use crate::attempt::AttemptResult;

/// Where an [`OriginTicket`] goes back: the origin gate.
pub(crate) trait TicketSink: Send + Sync {
    /// The attempt of `ticket` ended (`Some`: how, with its error and what its knock taught)
    /// or was never sent (`None`).
    fn ended(
        self: Arc<Self>,
        ticket: HostTicket,
        end: Option<(HostEnd, Option<&str>, Option<KnockReport>)>,
    );
}

/// An attempt's place under its origin ([`crate::origins`]): counted in flight by the host
/// book until the attempt ends; the HTTP client reads the double-knock's plan from it and
/// leaves what the knock taught on it.
pub struct OriginTicket {
    sink: Arc<dyn TicketSink>,
    ticket: HostTicket,
    origin: Arc<str>,
    /// The knock's report, encoded ([`encode`]); 0 while none was left.
    knocked: AtomicU8,
    done: bool,
}

impl std::fmt::Debug for OriginTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginTicket")
            .field("origin", &self.origin)
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

impl OriginTicket {
    pub(crate) fn new(sink: Arc<dyn TicketSink>, ticket: HostTicket, origin: Arc<str>) -> Self {
        OriginTicket {
            sink,
            ticket,
            origin,
            knocked: AtomicU8::new(0),
            done: false,
        }
    }

    /// The origin (`scheme://host:port`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the attempt is its origin's probe (the host backs off; its answer decides).
    pub fn probe(&self) -> bool {
        self.ticket.probe()
    }

    /// The double-knock's plan for the attempt (OL-22).
    pub fn plan(&self) -> KnockPlan {
        self.ticket.knock
    }

    /// What the attempt's knock taught, for the host book when the attempt ends.
    pub fn knocked(&self, report: KnockReport) {
        self.knocked.store(encode(report), Ordering::Relaxed);
    }

    /// The attempt ended with `result`: counted for its origin, once.
    pub(crate) fn finished(&mut self, result: &AttemptResult) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let report = decode(self.knocked.load(Ordering::Relaxed));
        Arc::clone(&self.sink).ended(
            self.ticket,
            Some((host_end(result), result.error.as_deref(), report)),
        );
    }

    /// The book's ticket, disarmed: the caller gives the place back itself.
    pub(crate) fn disarm(mut self) -> HostTicket {
        self.done = true;
        self.ticket
    }
}

impl Drop for OriginTicket {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            Arc::clone(&self.sink).ended(self.ticket, None);
        }
    }
}

/// How an attempt's result reads for its host: an HTTP answer, a connection-level failure
/// (refused, reset or closed before an answer, name resolution, TLS handshake, connect
/// timeout), no answer within the timeout, or nothing the host did.
pub fn host_end(r: &AttemptResult) -> HostEnd {
    if r.status.is_some() {
        return HostEnd::Answered;
    }
    if !matches!(r.outcome, Outcome::Transient { .. }) {
        return HostEnd::Silent;
    }
    let code = r
        .error
        .as_deref()
        .and_then(|e| e.split(':').next())
        .unwrap_or("");
    match code {
        "connection_refused" | "connection_reset" | "dns" | "tls" | "connect_timeout" => {
            HostEnd::ConnectionFailed
        }
        "timeout" => HostEnd::TimedOut,
        _ => HostEnd::Silent,
    }
}

fn spec_bits(s: Option<SignatureSpec>) -> u8 {
    match s {
        None => 0,
        Some(SignatureSpec::Rfc9421) => 1,
        Some(SignatureSpec::Cavage) => 2,
    }
}

fn spec_of(bits: u8) -> Option<SignatureSpec> {
    match bits & 3 {
        1 => Some(SignatureSpec::Rfc9421),
        2 => Some(SignatureSpec::Cavage),
        _ => None,
    }
}

/// A knock report in one byte: bit 7 set, then refused-both, the first scheme, the accepted.
fn encode(r: KnockReport) -> u8 {
    0x80 | (u8::from(r.refused_both) << 4) | (spec_bits(r.first) << 2) | spec_bits(r.accepted)
}

fn decode(b: u8) -> Option<KnockReport> {
    (b & 0x80 != 0).then(|| KnockReport {
        accepted: spec_of(b),
        first: spec_of(b >> 2),
        refused_both: b & 0x10 != 0,
    })
}

/// Where a [`Permit`] goes back: the per-host caps (keyed by host) or the fair shares of the
/// budget (keyed by actor).
pub(crate) trait PermitSink<K>: Send + Sync {
    /// The place `key` held is free.
    fn release(self: Arc<Self>, key: K);
}

/// A job's place in an executor that parks jobs past a limit ([`HostCaps`](crate::HostCaps),
/// [`FairShares`](crate::FairShares)); dropping it (the job finished, or was dropped unrun)
/// frees the place for the next parked job.
pub(crate) struct Permit<K> {
    sink: Arc<dyn PermitSink<K>>,
    key: Option<K>,
}

/// A place under a host's cap.
pub(crate) type HostPermit = Permit<String>;
/// A place in the process's in-flight budget.
pub(crate) type BudgetPermit = Permit<ActorId>;

impl<K: std::fmt::Debug> std::fmt::Debug for Permit<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<K> Permit<K> {
    pub(crate) fn new(sink: Arc<dyn PermitSink<K>>, key: K) -> Self {
        Permit {
            sink,
            key: Some(key),
        }
    }

    /// Keeps the place: dropped, the permit frees nothing (its holder passes it on).
    pub(crate) fn disarm(&mut self) {
        self.key = None;
    }
}

impl<K> Drop for Permit<K> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            Arc::clone(&self.sink).release(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knock_report_survives_its_byte() {
        for accepted in [
            None,
            Some(SignatureSpec::Rfc9421),
            Some(SignatureSpec::Cavage),
        ] {
            for first in [
                None,
                Some(SignatureSpec::Rfc9421),
                Some(SignatureSpec::Cavage),
            ] {
                for refused_both in [false, true] {
                    let r = KnockReport {
                        accepted,
                        first,
                        refused_both,
                    };
                    assert_eq!(decode(encode(r)), Some(r));
                }
            }
        }
        assert_eq!(decode(0), None);
    }
}
