//! Requests-per-second limits per endpoint and per host, read from a TOML file
//! (`--rate-limits FILE`).
//!
//! ```toml
//! # Every endpoint (an actor's recipient: a lane) at most 20 requests per second.
//! [default]
//! per_endpoint = 20
//!
//! # Each endpoint of this actor at most 10 per second; one of them at most 2.
//! [actors."shop-1"]
//! per_endpoint = 10
//! [actors."shop-1".recipients."https://hooks.shop1.example/orders"]
//! per_second = 2
//!
//! # A host, whichever actors and endpoints its requests come from.
//! [hosts."https://hooks.example"]
//! per_second = 50
//! ```
//!
//! The most specific entry wins for an endpoint (recipient, then actor, then default). A rate
//! is requests per second, fractions allowed (`0.5`: one every two seconds), its spacing
//! rounded up to whole milliseconds (so 300/s runs at 250/s, and at most 1,000/s); the limit spaces
//! a lane's attempt starts at least `1 / rate` apart (the scheduler's pacing, OL-23), and a
//! host's by the same rule in the host book, so no second of any run of seconds holds more
//! than the rate, rounded up. Recipients and hosts are written as URLs and compared in their
//! canonical form (`https://Hooks.Example:443/x` is `https://hooks.example/x`).
//!
//! # Why no serde derive here
//!
//! The file is small and its errors name the entry and the key (`actors."shop-1".per_second:
//! expected a number of requests per second above 0`); the `toml` crate's table API, already
//! used by the secrets files, gives that without a second set of types to keep in step.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use std::sync::{Arc, Mutex, PoisonError};

use outbox_lanes_core::{LaneKey, Timestamp};

/// The least time between two starts at `per_second`, in whole milliseconds rounded up (the
/// core's time is in milliseconds): never faster than asked, and at most 1,000 per second.
fn interval(per_second: f64) -> Duration {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // finite, above 0
    let ms = (1000.0 / per_second).ceil().min(u64::MAX as f64) as u64;
    Duration::from_millis(ms.max(1))
}

/// The rate limits of a process: endpoints (per actor, per recipient, by default) and hosts.
///
/// A clone shares the memory of the endpoints' last starts: the passes of one process (each
/// a new scheduler) keep an endpoint's pace across their boundaries.
#[derive(Clone, Debug, Default)]
pub struct RateLimits {
    default_endpoint: Option<Duration>,
    actors: HashMap<String, ActorRates>,
    hosts: HashMap<String, Duration>,
    /// Paced endpoints' next allowed start, by (actor, recipient), as passes started them.
    next: Arc<Mutex<HashMap<(String, String), Timestamp>>>,
}

/// Remembered starts beyond which the memory drops those already past.
const REMEMBERED: usize = 4096;

#[derive(Clone, Debug, Default, PartialEq)]
struct ActorRates {
    per_endpoint: Option<Duration>,
    recipients: HashMap<String, Duration>,
}

/// A rate-limits file that could not be used: what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatesFileError(pub String);

impl std::fmt::Display for RatesFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RatesFileError {}

impl RateLimits {
    /// No limit at all.
    pub fn none() -> Self {
        RateLimits::default()
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.default_endpoint.is_none() && self.actors.is_empty() && self.hosts.is_empty()
    }

    /// Whether a default for every endpoint is set.
    pub fn has_default_endpoint(&self) -> bool {
        self.default_endpoint.is_some()
    }

    /// Every endpoint at most `per_second` requests per second, unless a more specific
    /// entry says otherwise.
    ///
    /// # Errors
    /// `per_second` is not a number above 0.
    pub fn with_default_endpoint(mut self, per_second: f64) -> Result<Self, RatesFileError> {
        self.default_endpoint = Some(rate("default.per_endpoint", per_second)?);
        Ok(self)
    }

    /// `actor`'s endpoints at most `per_second` each.
    ///
    /// # Errors
    /// `per_second` is not a number above 0.
    pub fn with_actor(mut self, actor: &str, per_second: f64) -> Result<Self, RatesFileError> {
        let d = rate(&format!("actors.{actor:?}.per_endpoint"), per_second)?;
        self.actors
            .entry(actor.to_owned())
            .or_default()
            .per_endpoint = Some(d);
        Ok(self)
    }

    /// `actor`'s endpoint `recipient` at most `per_second`.
    ///
    /// # Errors
    /// `per_second` is not a number above 0, or `recipient` is not a URL.
    pub fn with_endpoint(
        mut self,
        actor: &str,
        recipient: &str,
        per_second: f64,
    ) -> Result<Self, RatesFileError> {
        let place = format!("actors.{actor:?}.recipients.{recipient:?}");
        let d = rate(&format!("{place}.per_second"), per_second)?;
        let key = canonical_recipient(&place, recipient)?;
        self.actors
            .entry(actor.to_owned())
            .or_default()
            .recipients
            .insert(key, d);
        Ok(self)
    }

    /// The host of `origin` (`https://host[:port]`) at most `per_second`, whichever actors
    /// its requests come from.
    ///
    /// # Errors
    /// `per_second` is not a number above 0, or `origin` is not a host.
    pub fn with_host(mut self, origin: &str, per_second: f64) -> Result<Self, RatesFileError> {
        let place = format!("hosts.{origin:?}");
        let d = rate(&format!("{place}.per_second"), per_second)?;
        let key = canonical_origin(&place, origin)?;
        self.hosts.insert(key, d);
        Ok(self)
    }

    /// The least time between two attempt starts to `actor`'s endpoint `recipient` (its
    /// canonical URL, as the store keeps it), if limited.
    pub fn endpoint_interval(&self, actor: &str, recipient: &str) -> Option<Duration> {
        let a = self.actors.get(actor);
        a.and_then(|a| a.recipients.get(recipient).copied())
            .or_else(|| a.and_then(|a| a.per_endpoint))
            .or(self.default_endpoint)
    }

    /// An attempt to `actor`'s paced endpoint `recipient` started: the next may start at
    /// `next` (in any pass of this process).
    pub fn started(&self, actor: &str, recipient: &str, next: Timestamp, now: Timestamp) {
        let mut m = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= REMEMBERED {
            m.retain(|_, t| *t > now);
        }
        m.insert((actor.to_owned(), recipient.to_owned()), next);
    }

    /// When `actor`'s endpoint `recipient` may start again, if a pass of this process
    /// started it less than its pace ago.
    pub fn paced_until(&self, actor: &str, recipient: &str) -> Option<Timestamp> {
        if self.is_empty() {
            return None;
        }
        let m = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        m.get(&(actor.to_owned(), recipient.to_owned())).copied()
    }

    /// The least time between two attempt starts to the host of `origin`
    /// (`scheme://host:port`, as [`Destination::origin`](crate::Destination::origin) has
    /// it), if limited.
    pub fn host_interval(&self, origin: &str) -> Option<Duration> {
        self.hosts.get(origin).copied()
    }

    /// The limited hosts: origin and the least time between two starts.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, Duration)> + '_ {
        self.hosts.iter().map(|(o, d)| (o.as_str(), *d))
    }

    /// Reads the file at `path`.
    ///
    /// # Errors
    /// It cannot be read, is not TOML, or an entry is wrong; the message names the path and
    /// the entry.
    pub fn load(path: &Path) -> Result<Self, RatesFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RatesFileError(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| RatesFileError(format!("{}: {e}", path.display())))
    }

    /// Parses a rate-limits file (see the module docs).
    ///
    /// # Errors
    /// Not TOML, an unknown section or key, or a rate that is not a number above 0.
    pub fn from_toml(text: &str) -> Result<Self, RatesFileError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| RatesFileError(e.message().to_owned()))?;
        let mut out = RateLimits::default();
        for (section, value) in &table {
            let toml::Value::Table(t) = value else {
                return Err(err(format!("{section}: expected a table")));
            };
            match section.as_str() {
                "default" => {
                    for (k, v) in t {
                        match k.as_str() {
                            "per_endpoint" => {
                                out =
                                    out.with_default_endpoint(number("default.per_endpoint", v)?)?;
                            }
                            _ => return Err(unknown_key("default", k, "per_endpoint")),
                        }
                    }
                }
                "actors" => {
                    for (actor, entry) in t {
                        out = actor_entry(out, actor, entry)?;
                    }
                }
                "hosts" => {
                    for (origin, entry) in t {
                        let place = format!("hosts.{origin:?}");
                        let n = only_per_second(&place, entry)?;
                        out = out.with_host(origin, n)?;
                    }
                }
                _ => {
                    return Err(err(format!(
                        "unknown section [{section}]: expected [default], [actors.\"<actor>\"] or \
                         [hosts.\"<https://host>\"]"
                    )));
                }
            }
        }
        Ok(out)
    }
}

fn actor_entry(
    mut out: RateLimits,
    actor: &str,
    entry: &toml::Value,
) -> Result<RateLimits, RatesFileError> {
    let place = format!("actors.{actor:?}");
    let toml::Value::Table(t) = entry else {
        return Err(err(format!("{place}: expected a table")));
    };
    for (k, v) in t {
        match k.as_str() {
            "per_endpoint" => {
                out = out.with_actor(actor, number(&format!("{place}.per_endpoint"), v)?)?;
            }
            "recipients" => {
                let toml::Value::Table(rs) = v else {
                    return Err(err(format!("{place}.recipients: expected a table")));
                };
                for (recipient, e) in rs {
                    let p = format!("{place}.recipients.{recipient:?}");
                    let n = only_per_second(&p, e)?;
                    out = out.with_endpoint(actor, recipient, n)?;
                }
            }
            _ => return Err(unknown_key(&place, k, "per_endpoint, recipients")),
        }
    }
    Ok(out)
}

fn only_per_second(place: &str, entry: &toml::Value) -> Result<f64, RatesFileError> {
    let toml::Value::Table(t) = entry else {
        return Err(err(format!("{place}: expected a table with per_second")));
    };
    let mut n = None;
    for (k, v) in t {
        match k.as_str() {
            "per_second" => n = Some(number(&format!("{place}.per_second"), v)?),
            _ => return Err(unknown_key(place, k, "per_second")),
        }
    }
    n.ok_or_else(|| err(format!("{place}: per_second is missing")))
}

fn number(place: &str, v: &toml::Value) -> Result<f64, RatesFileError> {
    #[allow(clippy::cast_precision_loss)] // rates are small
    let n = match v {
        toml::Value::Integer(i) => *i as f64,
        toml::Value::Float(f) => *f,
        _ => f64::NAN,
    };
    if n.is_finite() && n > 0.0 {
        Ok(n)
    } else {
        let got = match v {
            toml::Value::String(s) => format!("{s:?}"),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => other.type_str().to_owned(),
        };
        Err(err(format!(
            "{place}: expected a number of requests per second above 0, got {got}"
        )))
    }
}

fn rate(place: &str, per_second: f64) -> Result<Duration, RatesFileError> {
    if per_second.is_finite() && per_second > 0.0 {
        Ok(interval(per_second))
    } else {
        Err(err(format!(
            "{place}: expected a number of requests per second above 0, got {per_second}"
        )))
    }
}

fn canonical_recipient(place: &str, url: &str) -> Result<String, RatesFileError> {
    LaneKey::new(url, None)
        .map(|k| k.recipient().to_owned())
        .map_err(|e| err(format!("{place}: not a recipient URL: {e}")))
}

fn canonical_origin(place: &str, text: &str) -> Result<String, RatesFileError> {
    let t = text.trim();
    let with_path = match t.split_once("://") {
        Some((_, rest)) if !rest.contains('/') => format!("{t}/"),
        Some(_) => t.to_owned(),
        None => {
            return Err(err(format!(
                "{place}: write the host as https://host[:port]"
            )));
        }
    };
    outbox_lanes_store::origin_of(&with_path)
        .ok_or_else(|| err(format!("{place}: not a host: write https://host[:port]")))
}

fn unknown_key(place: &str, key: &str, expected: &str) -> RatesFileError {
    err(format!(
        "{place}: unknown key {key:?} (expected {expected})"
    ))
}

fn err(s: String) -> RatesFileError {
    RatesFileError(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_entry_wins_and_urls_compare_canonically() {
        let r = RateLimits::from_toml(
            r#"
[default]
per_endpoint = 20
[actors."shop-1"]
per_endpoint = 10
[actors."shop-1".recipients."https://Hooks.Shop1.example:443/orders"]
per_second = 0.5
[hosts."https://HOOKS.example"]
per_second = 50
"#,
        )
        .unwrap();
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        assert_eq!(
            ms(r.endpoint_interval("shop-1", "https://hooks.shop1.example/orders")),
            Some(2000)
        );
        assert_eq!(
            ms(r.endpoint_interval("shop-1", "https://x.example/")),
            Some(100)
        );
        assert_eq!(
            ms(r.endpoint_interval("shop-2", "https://x.example/")),
            Some(50)
        );
        assert_eq!(ms(r.host_interval("https://hooks.example:443")), Some(20));
        assert_eq!(r.host_interval("https://other.example:443"), None);
        assert!(RateLimits::none().is_empty());
        // Whole milliseconds, rounded up: never faster than asked.
        let r = RateLimits::none().with_default_endpoint(300.0).unwrap();
        assert_eq!(ms(r.endpoint_interval("a", "https://x.example/")), Some(4));
        let r = RateLimits::none().with_default_endpoint(5000.0).unwrap();
        assert_eq!(ms(r.endpoint_interval("a", "https://x.example/")), Some(1));
    }

    #[test]
    fn a_wrong_entry_is_named() {
        for (text, want) in [
            (
                "[default]\nper_endpoint = 0",
                "default.per_endpoint: expected a number",
            ),
            (
                "[default]\nper_endpoint = \"fast\"",
                "default.per_endpoint: expected a number",
            ),
            (
                "[actors.a]\nper_second = 3",
                "actors.\"a\": unknown key \"per_second\"",
            ),
            (
                "[hosts.\"hooks.example\"]\nper_second = 3",
                "write the host as https://",
            ),
            (
                "[hosts.\"https://h.example\"]\nrate = 3",
                "unknown key \"rate\"",
            ),
            ("[hosts.\"https://h.example\"]", "per_second is missing"),
            (
                "[actors.a.recipients.\"not a url\"]\nper_second = 1",
                "not a recipient URL",
            ),
            ("[limits]\nx = 1", "unknown section [limits]"),
            ("[default", "expected"),
        ] {
            let e = RateLimits::from_toml(text).unwrap_err().0;
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
