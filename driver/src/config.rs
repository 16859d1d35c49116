//! The configuration every runtime's `Outbox` takes.

use std::time::Duration;

use crate::http::HttpConfig;

/// The default [`OutboxConfig::concurrency`]: attempts in flight at once per process. Sized
/// for internet delivery, where recipients answer in 50–500 ms: at 200 ms, 256 in flight is
/// about 1,280 deliveries/s.
pub const DEFAULT_CONCURRENCY: usize = 256;

/// Configuration of an `Outbox` (either runtime).
///
/// A clone has a destination-policy handle of its own
/// ([`HttpConfig::outbox_addresses`](crate::http::HttpConfig::outbox_addresses)): two
/// outboxes opened from clones of one configuration never share what their databases store.
#[derive(Debug)]
pub struct OutboxConfig {
    /// The scheduler's configuration (window, retries, backoff). Its `max_in_flight` is
    /// replaced by [`OutboxConfig::concurrency`] and its admission window is widened to
    /// fit it: see [`OutboxConfig::pass_scheduler`].
    pub scheduler: outbox_lanes_core::Config,
    /// HTTP delivery.
    pub http: HttpConfig,
    /// Attempts in flight at once in this process, and in one pass: the blocking runtime's
    /// worker threads, the tokio runtime's delivery tasks. Default
    /// [`DEFAULT_CONCURRENCY`].
    pub concurrency: usize,
    /// At most this many attempts in flight at once to one host (`host:port`), from this
    /// process, whichever actors they come from; `None`: no cap but `concurrency`. Attempts
    /// past the cap wait in the host's queue without holding a worker ([`crate::HostCaps`]).
    pub per_host: Option<usize>,
    /// How `concurrency` is shared between actors ([`crate::FairShares`]): an actor above
    /// its fair share leaves this many places free for the others. Default
    /// [`Reserve::Auto`](crate::Reserve::Auto): a tenth, once a second actor was seen.
    pub reserve: crate::budget::Reserve,
    /// Requests-per-second limits per endpoint and per host ([`crate::RateLimits`]). Default
    /// none.
    pub rates: crate::rates::RateLimits,
    /// How hosts are judged: health, each host's share of the attempts in flight, the
    /// signature double-knock ([`outbox_lanes_core::host`], executed by [`crate::origins`]).
    /// Its `max_in_flight` is replaced by [`OutboxConfig::concurrency`], its `knock_on_5xx`
    /// by the HTTP configuration's, and its `signing` follows the signer
    /// ([`OutboxConfig::sign_with`]).
    pub hosts: crate::origins::OriginConfig,
    /// The drain slot's lease; renewed every third of it while a pass runs.
    pub lease: Duration,
    /// A pass yields after this long so busy actors cannot starve the others (OL-13).
    pub time_slice: Duration,
    /// On shutdown, how long attempts in flight may finish before they are abandoned (their
    /// units stay pending and are delivered again: at-least-once). A time slice has no grace:
    /// a pass that yields never cuts an attempt in flight (OL-13).
    pub shutdown_grace: Duration,
    /// The monitor's safety-net poll.
    pub poll_interval: Duration,
    /// Passes the monitor runs at once.
    pub max_passes: usize,
    /// How often the monitor runs the store's upkeep ([`DriverStore::upkeep`]: row ids past
    /// their dedup window, finished units past the ack retention), starting when it starts.
    ///
    /// [`DriverStore::upkeep`]: outbox_lanes_store::DriverStore::upkeep
    pub upkeep_interval: Duration,
    /// The name this process holds drain slots under (default: `pid<process id>-<8 hex
    /// digits>`, e.g. `pid21974-1f085e38`).
    pub holder: Option<String>,
    /// The seed of every pass's jitter. `None` (the default): a fresh seed per pass, logged
    /// at DEBUG with the pass, so a production run can be replayed with it.
    pub seed: Option<u64>,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            scheduler: outbox_lanes_core::Config::default(),
            http: HttpConfig::default(),
            concurrency: DEFAULT_CONCURRENCY,
            per_host: None,
            reserve: crate::budget::Reserve::Auto,
            rates: crate::rates::RateLimits::default(),
            hosts: crate::origins::OriginConfig::default(),
            lease: Duration::from_secs(30),
            time_slice: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            max_passes: 8,
            upkeep_interval: Duration::from_secs(600),
            holder: None,
            seed: None,
        }
    }
}

impl Clone for OutboxConfig {
    fn clone(&self) -> Self {
        let OutboxConfig {
            scheduler,
            http,
            concurrency,
            per_host,
            reserve,
            rates,
            hosts,
            lease,
            time_slice,
            shutdown_grace,
            poll_interval,
            max_passes,
            upkeep_interval,
            holder,
            seed,
        } = self;
        let mut http = http.clone();
        http.outbox_addresses = http.outbox_addresses.detached();
        OutboxConfig {
            scheduler: scheduler.clone(),
            http,
            concurrency: *concurrency,
            per_host: *per_host,
            reserve: *reserve,
            rates: rates.clone(),
            hosts: hosts.clone(),
            lease: *lease,
            time_slice: *time_slice,
            shutdown_grace: *shutdown_grace,
            poll_interval: *poll_interval,
            max_passes: *max_passes,
            upkeep_interval: *upkeep_interval,
            holder: holder.clone(),
            seed: *seed,
        }
    }
}

impl OutboxConfig {
    /// Allows loopback destinations (tests and demos on 127.0.0.1), as well as any allowed
    /// already. The outbox opened with it allows them for every process on its database
    /// (OL-24: it widens the outbox's stored destination policy).
    pub fn allow_loopback(mut self) -> Self {
        self.http.addresses.allow_loopback = true;
        self
    }

    /// Allows loopback and private-range destinations (RFC 1918, shared CGNAT, IPv6 unique
    /// local: a relay delivering to services on its own networks), as the binary's
    /// `--allow-private-destinations` does; link-local space and the cloud metadata services
    /// stay refused. The outbox opened with it allows them for every process on its
    /// database (OL-24).
    pub fn allow_private(mut self) -> Self {
        self.http.addresses.allow_loopback = true;
        self.http.addresses.allow_private = true;
        self
    }

    /// Sets how the double-knock applies ([`OriginConfig::signing`](outbox_lanes_core::host::HostConfig::signing))
    /// from the signer the outbox signs with and [`HttpConfig::signature`]; each runtime's
    /// builder calls it when it opens the outbox.
    pub fn sign_with(&mut self, signer: Option<&dyn crate::sign::Signer>) {
        let http = signer.is_some_and(crate::sign::Signer::http_signatures);
        self.hosts.signing = outbox_lanes_core::host::Signing::of(self.http.signature, http);
    }

    /// The host book's configuration: [`OutboxConfig::hosts`] with the process's
    /// concurrency as the largest window of a host, and the hosts of
    /// [`OutboxConfig::rates`] paced ([`HostConfig::paces`], after any set there: a host's
    /// rate limit wins).
    ///
    /// [`HostConfig::paces`]: outbox_lanes_core::host::HostConfig::paces
    pub fn host_book(&self) -> outbox_lanes_core::host::HostConfig {
        let mut c = self.hosts.clone();
        c.max_in_flight = u32::try_from(self.concurrency.max(1)).unwrap_or(u32::MAX);
        c.knock_on_5xx = self.http.signature_fallback_on_5xx;
        c.paces.extend(
            self.rates
                .hosts()
                .map(|(origin, interval)| (origin.to_owned(), interval)),
        );
        c
    }

    /// The scheduler configuration of one pass: the in-flight window is
    /// [`OutboxConfig::concurrency`] (so `--concurrency 1000` puts 1,000 attempts of one
    /// actor in flight), and the admission window holds at least four units per attempt in
    /// flight, so a lane that finishes finds its successor admitted.
    pub fn pass_scheduler(&self) -> outbox_lanes_core::Config {
        let mut c = self.scheduler.clone();
        let n = self.concurrency.max(1);
        c.max_in_flight = n;
        c.max_units = c.max_units.max(n.saturating_mul(4));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_has_a_destination_policy_handle_of_its_own() {
        use outbox_lanes_core::policy::AddressPolicy;
        let a = OutboxConfig::default().allow_private();
        assert!(a.http.addresses.allow_loopback && a.http.addresses.allow_private);
        assert!(!a.http.addresses.allow_link_local);
        a.http
            .outbox_addresses
            .set(AddressPolicy::allow_loopback_only());
        let b = a.clone();
        assert_eq!(b.http.outbox_addresses.get(), a.http.outbox_addresses.get());
        b.http.outbox_addresses.set(AddressPolicy::public_only());
        assert_eq!(
            a.http.outbox_addresses.get(),
            AddressPolicy::allow_loopback_only(),
            "two outboxes opened from clones share no handle"
        );
        // An HttpConfig's clone shares it: the clients an outbox builds see what it sets.
        let http = a.http.clone();
        http.outbox_addresses.set(AddressPolicy::public_only());
        assert_eq!(a.http.outbox_addresses.get(), AddressPolicy::public_only());
    }

    #[test]
    fn the_in_flight_window_follows_the_concurrency() {
        let mut c = OutboxConfig::default();
        assert_eq!(c.pass_scheduler().max_in_flight, DEFAULT_CONCURRENCY);
        c.concurrency = 1000;
        let s = c.pass_scheduler();
        assert_eq!(s.max_in_flight, 1000);
        assert_eq!(s.max_units, 4000);
        c.concurrency = 2;
        let s = c.pass_scheduler();
        assert_eq!(s.max_in_flight, 2);
        assert_eq!(s.max_units, outbox_lanes_core::Config::default().max_units);
    }
}
