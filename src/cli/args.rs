//! The command line (design §6): clap derive.

use std::net::SocketAddr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_lanes_core::DeadReason;
use outbox_lanes_core::policy::Recipient;

/// Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.
#[derive(Debug, Parser)]
#[command(
    name = "outbox-lanes",
    version,
    about = "Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.",
    long_about = "Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.\n\n\
        Runtime: tokio. Each pass is an async task; deliveries are tasks POSTing with reqwest \
        (at most --concurrency in flight, which is also one actor's in-flight window); store \
        work runs on tokio's blocking pool, batched per round."
)]
pub(crate) struct Cli {
    /// The database: a SQLite file path, or a `postgres://` URL.
    #[arg(
        long,
        global = true,
        default_value = "./outbox.db",
        env = "OUTBOX_LANES_DB"
    )]
    pub(crate) db: String,

    /// Postgres only: the schema holding the tables (created if missing).
    #[arg(
        long,
        global = true,
        default_value = "outbox_lanes",
        env = "OUTBOX_LANES_PG_SCHEMA"
    )]
    pub(crate) pg_schema: String,

    #[command(flatten)]
    pub(crate) delivery: DeliveryFlags,

    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The flags that configure delivery, common to every subcommand.
#[derive(Debug, Args)]
pub(crate) struct DeliveryFlags {
    /// HTTP timeout per attempt: `30s`, `500ms`, `2m`, or plain seconds; more than zero.
    #[arg(long, global = true, value_parser = parse_timeout, default_value = "30s")]
    pub(crate) timeout: Duration,

    /// After SIGINT or SIGTERM, how long `drain` and `relay` let attempts in flight finish
    /// before handing them back unanswered and exiting 1: `10s`, `500ms`, or plain seconds.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "10s")]
    pub(crate) shutdown_grace: Duration,

    /// Persisted attempts before a unit becomes a dead letter.
    #[arg(long, global = true, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,

    /// The failure within one pass that stalls a unit into lane backoff.
    #[arg(long, global = true, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) pass_attempts: u32,

    /// Deliveries in flight at once in this process, and for one actor (its in-flight
    /// window). Sized for recipients 50–500 ms away; raise it for many slow recipients.
    #[arg(long, global = true, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) concurrency: u32,

    /// At most this many deliveries in flight at once to one host (default: no cap but
    /// --concurrency). Deliveries past it wait without holding up other hosts.
    #[arg(long, global = true, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) per_host_concurrency: Option<u32>,

    /// Allow loopback and private-range destinations (refused by default: SSRF guard).
    /// Link-local addresses and cloud metadata services (169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200, 168.63.129.16, ...) stay refused.
    #[arg(long, global = true)]
    pub(crate) allow_private_destinations: bool,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Read JSON lines from stdin and enqueue them, all or nothing.
    #[command(
        long_about = "Read JSON lines from stdin and enqueue them, all or nothing.\n\n\
        One row per line: {\"id\": \"...\", \"to\": [\"https://...\"], \"body\": <json>, \
        \"content_type\"?: \"...\", \"dedup_key\"?: \"...\", \"ordering_key\"?: \"...\", \
        \"joined\"?: bool}. The body is any JSON value and is POSTed as its JSON text \
        (\"body\": null sends the four bytes `null`); content_type defaults to \
        application/json and must be a valid HTTP header value. Blank lines are skipped. \
        A bad line, or a line longer than --max-line-bytes, refuses the whole input: nothing \
        is enqueued, its line number and reason go to stderr, and the exit status is 2."
    )]
    Enqueue {
        /// The sending actor.
        #[arg(long)]
        actor: String,
        /// Longest input line accepted, in bytes: the largest body (1 MiB) and room for the
        /// rest of the row (ids and recipient lists).
        #[arg(long, default_value_t = DEFAULT_MAX_LINE, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
        max_line_bytes: u64,
    },
    /// Run passes until nothing is admissible, then exit.
    Drain {
        /// Drain this actor only (default: every actor with admissible work).
        #[arg(long)]
        actor: Option<String>,
    },
    /// Run the monitor until SIGINT or SIGTERM, then shut down gracefully.
    Relay(RelayArgs),
    /// Per actor: pending units, pass running, lanes in backoff, dead letters.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Per lane of an actor: depth, head age, last error, backoff.
    Lanes {
        /// The actor.
        #[arg(long)]
        actor: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List, replay or purge dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetterCommand),
}

/// `relay`'s flags.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Serve `/metrics` (Prometheus text), `/healthz` and `/readyz` on this address:
    /// `HOST:PORT` (`127.0.0.1:9187`, `localhost:9187`, `[::1]:9187`), or `:PORT` for every
    /// IPv4 interface (0.0.0.0, as Prometheus exporters do).
    #[arg(long, env = "OUTBOX_LANES_METRICS_ADDR", value_parser = parse_metrics_addr)]
    pub(crate) metrics_addr: Option<MetricsAddr>,

    /// Run this command (with `sh -c`) for every dead letter, the dead letter as one JSON
    /// object on its stdin. Off the delivery path: a slow or failing command delays and
    /// loses no delivery; its failure is logged at WARN.
    #[arg(long, env = "OUTBOX_LANES_ON_DEAD_LETTER", value_name = "CMD")]
    pub(crate) on_dead_letter: Option<String>,

    /// At most this many `--on-dead-letter` commands run at once; dead letters past it wait
    /// in a queue (of 10,000; past that, they are logged at WARN and not passed on).
    #[arg(long, env = "OUTBOX_LANES_ON_DEAD_LETTER_CONCURRENCY", default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) on_dead_letter_concurrency: u32,
}

/// A `--metrics-addr`: what was given, and the addresses it resolved to.
#[derive(Debug, Clone)]
pub(crate) struct MetricsAddr {
    /// As given.
    pub(crate) spec: String,
    /// Tried in order; the first that binds is served.
    pub(crate) addrs: Vec<SocketAddr>,
}

/// `HOST:PORT`, `[V6]:PORT` or `:PORT` (every IPv4 interface), resolved with the system
/// resolver (`localhost` included).
fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    use std::net::ToSocketAddrs as _;
    let t = s.trim();
    let full = match t.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => t.to_owned(),
    };
    let hint = "(expected HOST:PORT, [::1]:PORT or :PORT, e.g. 127.0.0.1:9187)";
    if full
        .rsplit_once(':')
        .is_none_or(|(_, p)| p.parse::<u16>().is_err())
    {
        return Err(format!("{s:?}: no valid port {hint}"));
    }
    let addrs: Vec<SocketAddr> = full
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: {e} {hint}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{s:?}: resolves to no address {hint}"));
    }
    Ok(MetricsAddr {
        spec: s.to_owned(),
        addrs,
    })
}

/// `dead-letters` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadLetterCommand {
    /// List dead letters.
    List(DeadLetterArgs),
    /// One dead letter in full, with its payload.
    Show {
        /// The dead letter (an id from `list`).
        #[arg(long)]
        id: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back at the tail of their lanes, in their original order.
    Replay {
        #[command(flatten)]
        which: DeadLetterArgs,
        /// Print what would be replayed, and change nothing.
        #[arg(long, env = "OUTBOX_LANES_DRY_RUN", value_parser = BoolishValueParser::new())]
        dry_run: bool,
    },
    /// Delete dead letters: those selected, or every one with `--all`.
    Purge {
        #[command(flatten)]
        which: DeadLetterArgs,
        /// Print what would be purged, and change nothing.
        #[arg(long, env = "OUTBOX_LANES_DRY_RUN", value_parser = BoolishValueParser::new())]
        dry_run: bool,
        /// Purge every dead letter (required when no other selector is given). Deliberately
        /// without an environment variable: it is the confirmation.
        #[arg(long, conflicts_with_all = ["actor", "ids", "reason", "recipient", "older_than"])]
        all: bool,
    },
}

/// Which dead letters, and how to print. The selectors combine (a dead letter must match
/// every one given).
#[derive(Debug, Args)]
pub(crate) struct DeadLetterArgs {
    /// This actor's only (default: every actor's).
    #[arg(long)]
    pub(crate) actor: Option<String>,
    /// These dead letters only (ids from `list`); repeatable.
    #[arg(long = "id")]
    pub(crate) ids: Vec<i64>,
    /// With this reason only: exhausted, permanent, gone, lane_retired, expired or
    /// destination_refused.
    #[arg(long, env = "OUTBOX_LANES_REASON", value_parser = parse_reason)]
    pub(crate) reason: Option<DeadReason>,
    /// For this recipient URL only (compared in its canonical form).
    #[arg(long, env = "OUTBOX_LANES_RECIPIENT", value_parser = parse_recipient)]
    pub(crate) recipient: Option<String>,
    /// Dead-lettered longer ago than this only: `7d`, `12h`, `30m`, or seconds.
    #[arg(long, env = "OUTBOX_LANES_OLDER_THAN", value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl DeadLetterArgs {
    /// Whether any selector narrows the set (without one, it is every dead letter).
    pub(crate) fn selects(&self) -> bool {
        self.actor.is_some()
            || !self.ids.is_empty()
            || self.reason.is_some()
            || self.recipient.is_some()
            || self.older_than.is_some()
    }
}

/// A dead letter's reason code.
fn parse_reason(s: &str) -> Result<DeadReason, String> {
    DeadReason::from_code(s.trim()).ok_or_else(|| {
        format!(
            "{s:?}: not a reason (exhausted, permanent, gone, lane_retired, expired, \
             destination_refused)"
        )
    })
}

/// A recipient URL, canonicalised as the store keys lanes.
fn parse_recipient(s: &str) -> Result<String, String> {
    Recipient::parse(s.trim())
        .map(|r| r.as_str().to_owned())
        .map_err(|e| format!("{s:?}: {e}"))
}

/// The default of `enqueue --max-line-bytes`: the store's default payload limit and 4 MiB for
/// the rest of the row.
pub(crate) const DEFAULT_MAX_LINE: u64 = outbox_lanes_store::DEFAULT_MAX_PAYLOAD as u64 + (4 << 20);

/// A `--timeout`: a duration above zero (a zero timeout would fail every attempt at once and
/// dead-letter every unit after its attempts, for no fault of the recipients).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: the timeout must be more than zero"));
    }
    Ok(d)
}

/// `30s`, `500ms`, `1m 30s`, or plain (possibly fractional) seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(t).map_err(|e| format!("{s:?}: {e} (try 30s, 500ms or seconds)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_timeout("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for zero in ["0", "0s", "0ms", "0.0"] {
            assert!(parse_timeout(zero).is_err(), "{zero}");
        }
    }

    #[test]
    fn metrics_addresses() {
        let v4 = |s: &str| parse_metrics_addr(s).map(|a| a.addrs);
        assert_eq!(
            v4("127.0.0.1:9187"),
            Ok(vec!["127.0.0.1:9187".parse().unwrap()])
        );
        assert_eq!(v4(":9187"), Ok(vec!["0.0.0.0:9187".parse().unwrap()]));
        assert_eq!(v4("[::1]:9187"), Ok(vec!["[::1]:9187".parse().unwrap()]));
        let local = v4("localhost:9187").unwrap();
        assert!(
            !local.is_empty()
                && local
                    .iter()
                    .all(|a| a.ip().is_loopback() && a.port() == 9187)
        );
        for bad in [
            "",
            "9187",
            ":",
            "127.0.0.1",
            "127.0.0.1:99999",
            ":x",
            "[::1]",
        ] {
            assert!(parse_metrics_addr(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reasons_and_recipients() {
        assert_eq!(parse_reason("gone"), Ok(DeadReason::Gone));
        assert!(parse_reason("late").unwrap_err().contains("lane_retired"));
        assert_eq!(
            parse_recipient("HTTP://Example.COM:80/inbox"),
            Ok("http://example.com/inbox".to_owned())
        );
        assert!(parse_recipient("example.com/inbox").is_err());
    }

    #[test]
    fn clap_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
