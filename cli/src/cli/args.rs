//! The command line (design §6): clap derive.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_lanes_core::config::RetrySchedule;
use outbox_lanes_core::policy::Recipient;
use outbox_lanes_core::{DeadReason, Timestamp};

/// Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.
#[derive(Debug, Parser)]
#[command(
    name = "outbox-lanes",
    version,
    about = "Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.",
    long_about = "Per-recipient ordered outbox delivery over HTTP: enqueue, drain, relay, inspect.\n\n\
        Runtime: tokio. Each pass is an async task; deliveries are tasks POSTing with hyper \
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

    /// Postgres only: the schema holding the tables (`migrate` creates it; so do `enqueue` and
    /// `relay` when the database has no outbox yet).
    #[arg(
        long,
        global = true,
        default_value = "outbox_lanes",
        env = "OUTBOX_LANES_PG_SCHEMA"
    )]
    pub(crate) pg_schema: String,

    /// A TOML file of settings: `flag-name = value` for any long flag of any command
    /// (`concurrency = 512`, `timeout = "10s"`, `retry-delays = ["1s", "5s"]`). A flag on the
    /// command line wins over its environment variable, which wins over the file.
    #[arg(long, global = true, env = "OUTBOX_LANES_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<std::path::PathBuf>,

    /// How long a row id an actor used stays refused by its enqueues, from the enqueue (the
    /// dedup window past delivery): `7d`, `1h`, `0s` for none. `enqueue` checks it; `relay`
    /// forgets the ids past it at each upkeep (`--upkeep-interval`, 10 minutes).
    #[arg(long, global = true, value_parser = parse_duration, default_value = "7d", env = "OUTBOX_LANES_ROW_ID_RETENTION")]
    pub(crate) row_id_retention: Duration,

    /// Keep delivered units (with their payloads) this long instead of deleting them at once:
    /// `1h`, `7d`, `0s` for none (the default). `relay` deletes the ones past it at each
    /// upkeep (`--upkeep-interval`, 10 minutes).
    #[arg(long, global = true, value_parser = parse_duration, default_value = "0s", env = "OUTBOX_LANES_ACK_RETENTION")]
    pub(crate) ack_retention: Duration,

    /// How long the delivery log keeps every attempt's outcome (start, duration, number,
    /// status, error class, the first KiB of a non-2xx answer's body), from the attempt's
    /// start: `7d` (the default, the row-id window), `1h`, `0s` turns the log off. `relay`
    /// deletes the entries past it at each upkeep (`--upkeep-interval`, 10 minutes); `rows
    /// show` and `dead-letters show` read it.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "7d", env = "OUTBOX_LANES_DELIVERY_LOG_RETENTION")]
    pub(crate) delivery_log_retention: Duration,

    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "OUTBOX_LANES_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The flags that configure delivery: `drain` and `relay` take them. Each has an
/// `OUTBOX_LANES_*` environment variable and a `--config` key of its name.
#[derive(Debug, Args)]
pub(crate) struct DeliveryFlags {
    /// HTTP timeout per attempt: `30s`, `500ms`, `2m`, or plain seconds; more than zero.
    #[arg(long, value_parser = parse_timeout, default_value = "30s", env = "OUTBOX_LANES_TIMEOUT")]
    pub(crate) timeout: Duration,

    /// After SIGINT or SIGTERM, how long attempts in flight may finish before they are handed
    /// back unanswered and the command exits 1: `10s`, `500ms`, or plain seconds.
    #[arg(long, value_parser = parse_duration, default_value = "10s", env = "OUTBOX_LANES_SHUTDOWN_GRACE")]
    pub(crate) shutdown_grace: Duration,

    /// Persisted attempts before a unit becomes a dead letter. Default 12 (the retry
    /// schedule's: 8 with `svix`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), env = "OUTBOX_LANES_MAX_ATTEMPTS")]
    pub(crate) max_attempts: Option<u32>,

    /// The failure in a row of a lane's head that stalls its lane into backoff (counted from
    /// the head's persisted attempts, so passes and restarts do not reset it). Default 4 (the
    /// retry schedule's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), env = "OUTBOX_LANES_PASS_ATTEMPTS")]
    pub(crate) pass_attempts: Option<u32>,

    /// Deliveries in flight at once in this process, and for one actor (its in-flight
    /// window). Sized for recipients 50–500 ms away; raise it for many slow recipients.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536), env = "OUTBOX_LANES_CONCURRENCY")]
    pub(crate) concurrency: u32,

    /// At most this many deliveries in flight at once to one host (default: no cap but
    /// --concurrency). Deliveries past it wait without holding up other hosts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096), env = "OUTBOX_LANES_PER_HOST_CONCURRENCY")]
    pub(crate) per_host_concurrency: Option<u32>,

    /// Places of --concurrency an actor above its fair share leaves free, so that another
    /// actor's next delivery starts at once beside a flooding one. Default: a tenth of
    /// --concurrency, kept once a second actor was seen (a process serving one actor lends it
    /// all); a number is kept from the start; 0 shares fairly without a reserve.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=65535), env = "OUTBOX_LANES_ACTOR_RESERVE")]
    pub(crate) actor_reserve: Option<u32>,

    /// Requests-per-second limits from this TOML file: `[default] per_endpoint = N`,
    /// `[actors."<actor>"] per_endpoint = N`, `[actors."<actor>".recipients."<url>"]
    /// per_second = N`, `[hosts."https://host"] per_second = N` (fractions allowed). An
    /// endpoint's attempts start at least 1/N s apart; a host's, whichever actors they come
    /// from. Read at start; a wrong entry stops drain and relay (exit 2), naming it.
    #[arg(long, env = "OUTBOX_LANES_RATE_LIMITS", value_name = "FILE")]
    pub(crate) rate_limits: Option<PathBuf>,

    /// Every endpoint (an actor's recipient) at most this many requests per second, unless
    /// --rate-limits says otherwise for it. Default: no limit.
    #[arg(long, value_parser = parse_rate, env = "OUTBOX_LANES_ENDPOINT_RATE", value_name = "PER_SECOND")]
    pub(crate) endpoint_rate: Option<f64>,

    /// Allow loopback and private-range destinations (refused by default: SSRF guard), and
    /// widen the outbox's destination policy to them, for every process on the database (see
    /// `outbox-lanes destinations`). Link-local addresses and cloud metadata services
    /// (169.254.169.254, fd00:ec2::254, 100.100.100.200, 168.63.129.16, ...) stay refused.
    #[arg(long, env = "OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS")]
    pub(crate) allow_private_destinations: bool,

    /// The delays between attempts of a unit within one pass, after its 1st, 2nd, ... failure
    /// (the last repeats): comma-separated durations. Default `1s,2s,4s`.
    #[arg(long, value_parser = parse_duration, value_delimiter = ',', env = "OUTBOX_LANES_RETRY_DELAYS")]
    pub(crate) retry_delays: Vec<Duration>,

    /// Jitter applied to every retry delay and lane backoff, in percent (± that share).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100), env = "OUTBOX_LANES_JITTER_PERCENT")]
    pub(crate) jitter_percent: u32,

    /// A stalled lane's first backoff; each further stall doubles it, up to --backoff-cap.
    /// Default 30s (the retry schedule's).
    #[arg(long, value_parser = parse_duration, env = "OUTBOX_LANES_BACKOFF_BASE")]
    pub(crate) backoff_base: Option<Duration>,

    /// The longest lane backoff. Default 1h (the retry schedule's).
    #[arg(long, value_parser = parse_duration, env = "OUTBOX_LANES_BACKOFF_CAP")]
    pub(crate) backoff_cap: Option<Duration>,

    /// The longest wait a recipient's Retry-After (429, 503) is honoured for.
    #[arg(long, value_parser = parse_duration, default_value = "1h", env = "OUTBOX_LANES_RETRY_AFTER_CAP")]
    pub(crate) retry_after_cap: Duration,

    /// The backoff level from which throttled attempts (429, or 503 with Retry-After) count
    /// toward --max-attempts, so a recipient that throttles forever still dead-letters.
    #[arg(long, default_value_t = 1, env = "OUTBOX_LANES_MAX_THROTTLED_LEVEL")]
    pub(crate) max_throttled_level: u32,

    /// Dead-letter a unit (reason `expired`) that is older than this when it is due: `7d`,
    /// `12h`. Default: no limit.
    #[arg(long, value_parser = parse_duration, env = "OUTBOX_LANES_MAX_AGE")]
    pub(crate) max_age: Option<Duration>,

    /// A 410 Gone retires the whole lane: every pending unit of it is dead-lettered.
    #[arg(long, env = "OUTBOX_LANES_RETIRE_ON_GONE")]
    pub(crate) retire_on_gone: bool,

    /// A lane (an endpoint) whose attempts have failed without an answer for this long is
    /// unavailable: at its next failure every pending unit of it is dead-lettered together
    /// (reason `lane_unavailable`), and so are the units that reach it later, at each failed
    /// probe, until it answers again or an operator retries it (`lanes retry`). `off`: never.
    #[arg(long, value_parser = parse_off_duration, default_value = "7d", env = "OUTBOX_LANES_LANE_UNAVAILABLE_AFTER")]
    pub(crate) lane_unavailable_after: Off,

    /// A named retry schedule: `standard` (the default: 1 s, 2 s, 4 s in the pass, then 30 s
    /// doubling to 1 h; 12 attempts) or `svix` (attempts 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and
    /// 10 h apart; 8 attempts). --retry-delays, --pass-attempts, --backoff-base,
    /// --backoff-cap and --max-attempts, wherever they are given (command line, environment,
    /// --config file), change the schedule's values.
    #[arg(long, value_parser = parse_retry_schedule, env = "OUTBOX_LANES_RETRY_SCHEDULE")]
    pub(crate) retry_schedule: Option<RetrySchedule>,

    /// The most units one pass holds admitted (waiting or in flight), and at least four per
    /// delivery in flight (--concurrency) whatever is given here.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), env = "OUTBOX_LANES_MAX_UNITS")]
    pub(crate) max_units: u32,

    /// The most units of one lane a pass holds admitted: a deep lane reads this many ahead,
    /// and reads again once half are sent (fewer, larger reads when higher). The admission
    /// window is shared first, so a lane gets less when many lanes have work.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536), env = "OUTBOX_LANES_MAX_PER_LANE")]
    pub(crate) max_per_lane: u32,

    /// The most payload bytes one pass holds admitted; a larger unit is still admitted
    /// into an empty window, alone.
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..), env = "OUTBOX_LANES_MAX_BYTES")]
    pub(crate) max_bytes: u64,

    /// The drain slot's lease, renewed every third of it while a pass runs; another relay
    /// takes over an actor whose holder died after at most this long.
    #[arg(long, value_parser = parse_timeout, default_value = "30s", env = "OUTBOX_LANES_LEASE")]
    pub(crate) lease: Duration,

    /// A pass stops starting attempts after this long, while other actors wait for a pass,
    /// so busy actors cannot starve them (uncontended, after 30 slices); attempts in flight
    /// still finish or time out, and are recorded.
    #[arg(long, value_parser = parse_timeout, default_value = "10s", env = "OUTBOX_LANES_TIME_SLICE")]
    pub(crate) time_slice: Duration,

    /// The `User-Agent` header of every request (default `outbox-lanes/<version>`).
    #[arg(long, value_parser = parse_header_value, env = "OUTBOX_LANES_USER_AGENT")]
    pub(crate) user_agent: Option<String>,

    /// The name this process holds drain slots under, as `status` shows it (default:
    /// `pid<process id>-<8 hex digits>`, e.g. `pid21974-1f085e38`).
    #[arg(long, env = "OUTBOX_LANES_HOLDER")]
    pub(crate) holder: Option<String>,

    /// The seed of every pass's jitter, to replay a run (default: a fresh seed per pass,
    /// logged at DEBUG).
    #[arg(long, env = "OUTBOX_LANES_SEED")]
    pub(crate) seed: Option<u64>,

    /// Sign every request the Standard Webhooks way (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`) with this secret, `whsec_<base64>` of 24 to 64 bytes, the same
    /// for every actor; several separated by spaces or commas all sign (a rotation). Prefer
    /// the environment variable: a flag's value is visible to other users in the process
    /// list.
    #[arg(
        long,
        env = "OUTBOX_LANES_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        conflicts_with_all = ["signing_keys", "webhook_secrets"]
    )]
    pub(crate) webhook_secret: Option<String>,

    /// Sign every request the Standard Webhooks way with the secrets of its actor (or of its
    /// endpoint) from this TOML file: `[actors."<actor>"]` with `secrets = ["whsec_…"]`
    /// (several sign side by side, a rotation), and optionally
    /// `[actors."<actor>".recipients."<url>"]`. Read again when it changes, or on SIGHUP,
    /// without a restart. An actor with work but no entry stops drain and relay (exit 2).
    #[arg(
        long,
        env = "OUTBOX_LANES_WEBHOOK_SECRETS",
        value_name = "FILE",
        conflicts_with = "signing_keys"
    )]
    pub(crate) webhook_secrets: Option<PathBuf>,

    /// Sign every request with HTTP Signatures, each actor with its key (RSA or Ed25519) from
    /// this TOML file: `[actors."<actor>"]` with `key_id` and `private_key_pem` or
    /// `private_key_file`. The scheme is --signature-spec's: by default `auto` (RFC 9421
    /// first, draft-cavage over `(request-target) host date digest` as Mastodon verifies
    /// for a host that refuses it). An actor with work but no key stops drain and relay
    /// (exit 2).
    #[arg(long, env = "OUTBOX_LANES_SIGNING_KEYS", value_name = "FILE")]
    pub(crate) signing_keys: Option<PathBuf>,

    /// Which HTTP signature scheme `--signing-keys` signs with: `auto` (RFC 9421 first for a
    /// host not known yet, draft-cavage at once when it refuses with 401 or 403 — or 400
    /// while its scheme is not known — then what worked, remembered per host in the
    /// database; a 401/403 in the learned scheme tries the other once and re-learns),
    /// `rfc9421` or `cavage`.
    #[arg(long, value_enum, default_value_t = SignatureSpecArg::Auto, env = "OUTBOX_LANES_SIGNATURE_SPEC")]
    pub(crate) signature_spec: SignatureSpecArg,

    /// With `--signature-spec auto`, a 5xx answer to an RFC 9421 request is sent again with
    /// draft-cavage too. Off by default: a 5xx says the server failed, not that it refused
    /// the signature; turn it on for servers that answer a signature they do not understand
    /// with a 500.
    #[arg(long, env = "OUTBOX_LANES_SIGNATURE_FALLBACK_ON_5XX")]
    pub(crate) signature_fallback_on_5xx: bool,

    /// With `--signature-spec auto`, how long a host known to take only draft-cavage is
    /// signed so before RFC 9421 is offered to it again.
    #[arg(long, value_parser = parse_duration, default_value = "7d", env = "OUTBOX_LANES_SIGNATURE_RETRY_AFTER")]
    pub(crate) signature_retry_after: Duration,

    /// Connection-level failures in a row (refused, reset before an answer, DNS, TLS
    /// handshake, connect timeout), counted per host across every lane and actor, after
    /// which the host backs off: its lanes hold without attempts, one probe per interval, and
    /// an answer reopens them all. `0`: off (every lane on its own).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=1000), env = "OUTBOX_LANES_HOST_FAILURES")]
    pub(crate) host_failures: u32,

    /// Attempts in flight a host takes until it first answers: what a dead host gets at once
    /// before it backs off (after a connection failure, one at a time). Its first answer
    /// opens its share to half of --concurrency, each later answer widens it by one (up to
    /// --concurrency) and each timeout halves it (down to this again), so a host that hangs
    /// cannot hold every attempt in flight.
    #[arg(long, default_value_t = outbox_lanes_core::host::DEFAULT_FIRST_CONTACT, value_parser = clap::value_parser!(u32).range(1..=65536), env = "OUTBOX_LANES_HOST_FIRST_CONTACT")]
    pub(crate) host_first_contact: u32,

    /// A host's first backoff after --host-failures; each failed probe doubles it, up to
    /// --host-backoff-cap.
    #[arg(long, value_parser = parse_timeout, default_value = "10s", env = "OUTBOX_LANES_HOST_BACKOFF_BASE")]
    pub(crate) host_backoff_base: Duration,

    /// The longest backoff of a host.
    #[arg(long, value_parser = parse_timeout, default_value = "1h", env = "OUTBOX_LANES_HOST_BACKOFF_CAP")]
    pub(crate) host_backoff_cap: Duration,

    /// Dead-letter (reason `host_unavailable`) the pending units of a host that has failed at
    /// the connection level continuously for this long (its lanes' attempts wait for the
    /// host's probes meanwhile, so they never fail on their own). `off`: never.
    #[arg(long, value_parser = parse_off_duration, default_value = "7d", env = "OUTBOX_LANES_HOST_UNAVAILABLE_AFTER")]
    pub(crate) host_unavailable_after: Off,

    /// Send every delivery through this proxy: `http://host:port` (an `http://` recipient is
    /// asked of it in absolute form, an `https://` one through a `CONNECT` tunnel, TLS to the
    /// recipient inside) or `https://host:port`; credentials in its URL
    /// (`http://user:pass@host:port`, percent-encoded) go as `Proxy-Authorization: Basic`.
    /// Default: none (`HTTP_PROXY` and friends are never read). The SSRF guard cannot see
    /// through a proxy: the proxy resolves names and connects wherever they point.
    #[arg(
        long,
        env = "OUTBOX_LANES_PROXY",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) proxy: Option<String>,

    /// Bound on connecting to a recipient (DNS, TCP and TLS handshakes), within --timeout.
    #[arg(long, value_parser = parse_timeout, default_value = "10s", env = "OUTBOX_LANES_CONNECT_TIMEOUT")]
    pub(crate) connect_timeout: Duration,

    /// `drain`: no progress reports on stderr (the bar on a terminal, a line a second
    /// otherwise, a JSON event a second with --log-format json); the summary stays.
    #[arg(long, env = "OUTBOX_LANES_NO_PROGRESS")]
    pub(crate) no_progress: bool,
}

/// `--signature-spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SignatureSpecArg {
    /// RFC 9421 first, draft-cavage when refused, then what worked, per host.
    Auto,
    /// RFC 9421 HTTP Message Signatures only.
    Rfc9421,
    /// draft-cavage HTTP Signatures only.
    Cavage,
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
    /// Create the outbox's schema, or upgrade it to this version's; the only command that
    /// changes a schema that exists.
    #[command(long_about = MIGRATE_ABOUT)]
    Migrate {
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Read JSON lines from stdin and enqueue them, all or nothing.
    #[command(long_about = ENQUEUE_ABOUT)]
    Enqueue {
        /// The sending actor.
        #[arg(long)]
        actor: String,
        /// Widen the outbox's destination policy to loopback and private ranges (see
        /// `outbox-lanes destinations`), so that it accepts such recipients (IP literals,
        /// `localhost`) and every process on the database delivers to them. Without it, a
        /// recipient the outbox's policy refuses is refused here, naming its line.
        #[arg(long, env = "OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS")]
        allow_private_destinations: bool,
        /// Longest input line accepted, in bytes: the largest body (the store's 1 MiB
        /// payload limit) and 4 MiB for the rest of the row (ids and recipient lists).
        #[arg(long, default_value_t = DEFAULT_MAX_LINE, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
        max_line_bytes: u64,
    },
    /// Run passes until nothing is admissible, then exit.
    Drain {
        /// Drain this actor only (default: every actor with admissible work).
        #[arg(long)]
        actor: Option<String>,
        #[command(flatten)]
        delivery: DeliveryFlags,
    },
    /// Run the monitor until SIGINT or SIGTERM, then shut down gracefully.
    Relay(RelayArgs),
    /// Per actor: pending units, the pass holding the slot, lanes not open, dead letters.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Per lane of an actor: list them (depth, head age, last error, state), or act on one.
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        long_about = "Per lane of an actor: list them (depth, head age, last error, state), \
        or act on one.\n\n\
        `lanes --actor A` lists A's lanes. The actions take effect at once in the database: a \
        relay running elsewhere sees them at its next claim (attempts it already has in flight \
        finish). A lane is named by --actor, --recipient (any spelling of the inbox URL) and, \
        if it has one, --ordering-key."
    )]
    Lanes(LanesArgs),
    /// List, replay or purge dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetterCommand),
    /// A row's delivery: per recipient, pending, in flight, delivered or dead letter, with
    /// the attempt history the delivery log keeps.
    #[command(subcommand)]
    Rows(RowsCommand),
    /// Per recipient host (origin): its connection health, lanes, pending units, last
    /// connection error, next probe and signature scheme; or an operator's action on one.
    #[command(
        args_conflicts_with_subcommands = true,
        long_about = HOSTS_ABOUT
    )]
    Hosts(HostsArgs),
    /// The outbox's destination policy: which addresses beyond public ones every process on
    /// the database may enqueue for and deliver to; or set it.
    #[command(
        args_conflicts_with_subcommands = true,
        long_about = DESTINATIONS_ABOUT
    )]
    Destinations(DestinationsArgs),
    /// Print a shell completion script to stdout (e.g. `outbox-lanes completions bash >
    /// /etc/bash_completion.d/outbox-lanes`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (e.g. `outbox-lanes man > outbox-lanes.1`).
    Man,
}

const MIGRATE_ABOUT: &str = "Create the outbox's schema, or upgrade it to this version's; the \
    only command that changes a schema that exists.\n\n\
    Run it as the schema's owner after installing a new version (relays of the old version keep \
    working against the new schema while it runs: every migration only adds). Every other \
    command runs no DDL on an outbox that exists: `enqueue`, `drain` and `relay` refuse an older \
    schema with a message naming this command, and the read-only commands (`status`, `lanes` \
    without an action, `dead-letters list|show`) need only read access: a SQLite file they may \
    only read, or a Postgres role with SELECT. On a database that has no outbox yet, `enqueue` \
    and `relay` create it (so the embedded SQLite default just works); `migrate` does too. \
    The privileges of each role are in docs/privileges.md.";

const HOSTS_ABOUT: &str = "Per recipient host (origin: scheme, host and port): its connection \
    health, lanes, pending units, last connection error, next probe and signature scheme; or an \
    operator's action on one.\n\n\
    A host whose connections keep failing (refused, reset before an answer, DNS, TLS handshake, \
    connect timeout; or no answer within --timeout from a host that has not answered since the \
    process started: --host-failures in a row, across every lane and actor) backs off: its lanes \
    hold without attempts, one probe goes per interval, and an answer reopens them all. STATE is \
    `open`, `failing` (failures in a row, below the threshold), `backoff`, `blocked` or \
    `blocked (dead letters)`. An ORIGIN is written `https://host[:port]` (or any URL on it, or a \
    bare host for https).";

const DESTINATIONS_ABOUT: &str = "The outbox's destination policy: which addresses beyond \
    public ones every process on the database may enqueue for and deliver to (`public`, \
    `loopback`, `loopback+private`); or set it.\n\n\
    The policy is stored in the database. `enqueue` refuses a recipient it refuses (an IP \
    literal or `localhost` outside it), naming the line; `drain` and `relay` deliver to what it \
    or their own --allow-private-destinations allows, reading it again at each pass. A process \
    opened with --allow-private-destinations (or a library outbox with \
    OutboxConfig::allow_loopback or allow_private) widens it; only `destinations set` narrows \
    it. After a narrowing, units already enqueued for a destination it now refuses are \
    dead-lettered `destination_refused` at their next attempt (a WARN once per lane), and a \
    process whose own setting still allows more widens it again when it next starts (at WARN). \
    Link-local addresses and cloud metadata services stay refused whatever it says.";

/// `destinations`: show the policy, or set it.
#[derive(Debug, Args)]
pub(crate) struct DestinationsArgs {
    /// The action (default: show the policy).
    #[command(subcommand)]
    pub(crate) action: Option<DestinationsAction>,
    /// Print JSON instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What to do to the destination policy.
#[derive(Debug, Subcommand)]
pub(crate) enum DestinationsAction {
    /// Show the policy (the default).
    Show {
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Set the policy, narrower or wider.
    Set {
        /// `public` (public addresses only), `loopback` (and loopback), `private` (and
        /// loopback and private ranges, as --allow-private-destinations).
        #[arg(value_enum)]
        policy: DestinationsArg,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
}

/// A destination policy `destinations set` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DestinationsArg {
    /// Public addresses only (the default of a new outbox).
    Public,
    /// Public and loopback addresses.
    Loopback,
    /// Public, loopback and private-range addresses (RFC 1918, shared CGNAT, IPv6 unique
    /// local).
    Private,
}

/// `hosts`: a listing, or an action on one host.
#[derive(Debug, Args)]
pub(crate) struct HostsArgs {
    /// The action (default: list the hosts).
    #[command(subcommand)]
    pub(crate) action: Option<HostAction>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What to do to one host.
#[derive(Debug, Subcommand)]
pub(crate) enum HostAction {
    /// List the hosts (the default).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Probe the host at once: its failures and backoff are forgotten and every lane to it
    /// that waits comes back now.
    Retry {
        /// The host: `https://host[:port]`.
        origin: String,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop delivering to the host (an operator's defederation): its lanes are paused, and
    /// lanes to it enqueued later are held too. Returns once no relay starts an attempt to it.
    Block {
        /// The host: `https://host[:port]`.
        origin: String,
        /// Dead-letter its pending units (reason `blocked`), and every unit enqueued for it
        /// later, instead of holding them.
        #[arg(long)]
        dead_letter: bool,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Deliver to a blocked host again: the lanes its block paused resume, in order.
    Unblock {
        /// The host: `https://host[:port]`.
        origin: String,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
    },
}

/// `lanes`: a listing, or an action on one lane.
#[derive(Debug, Args)]
pub(crate) struct LanesArgs {
    /// The action (default: list the actor's lanes).
    #[command(subcommand)]
    pub(crate) action: Option<LaneAction>,
    /// The actor whose lanes to list.
    #[arg(long, required = true)]
    pub(crate) actor: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What to do to one lane.
#[derive(Debug, Subcommand)]
pub(crate) enum LaneAction {
    /// List the actor's lanes (the default).
    List {
        /// The actor.
        #[arg(long)]
        actor: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Stop delivering to the lane: nothing of it is claimed until `resume`. Others flow.
    Pause {
        #[command(flatten)]
        lane: LaneArgs,
        /// Why (shown by `lanes` and `status`).
        #[arg(long, default_value = "paused by an operator")]
        reason: String,
    },
    /// Deliver to a paused lane again, in order, from its head.
    Resume {
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Attempt the lane's head at once: clears its backoff and a strict lane's block (an
    /// operator's pause stays: use `resume`).
    Retry {
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Strict mode: a head that would be dead-lettered blocks the lane instead, holding its
    /// followers until `retry` or `skip-head`.
    Strict {
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Leave strict mode (a blocked head stays blocked until `retry` or `skip-head`).
    Unstrict {
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Dead-letter every pending unit of the lane (reason `purged`); `dead-letters replay`
    /// puts them back. Other lanes, and other recipients of joined units, are untouched.
    Purge {
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Dead-letter the lane's head (reason `skipped`), lift a strict block and clear the
    /// backoff: its followers go on in order.
    SkipHead {
        #[command(flatten)]
        lane: LaneArgs,
    },
}

/// Names one lane.
#[derive(Debug, Args)]
pub(crate) struct LaneArgs {
    /// The actor.
    #[arg(long)]
    pub(crate) actor: String,
    /// The recipient's inbox URL (any spelling: it is canonicalised as at enqueue).
    #[arg(long)]
    pub(crate) recipient: String,
    /// The ordering key, if the lane has one.
    #[arg(long)]
    pub(crate) ordering_key: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `enqueue --help`: the line format, with an example.
const ENQUEUE_ABOUT: &str = "\
Read JSON lines from stdin and enqueue them, all or nothing.

One row per line, a JSON object:
  id            string, required: unique for the actor
  to            [string], required: recipient URLs (absolute http or https)
  body          any JSON value: with a JSON content type (application/json,
                application/*+json) it is POSTed as its JSON text (\"body\": \"hi\" sends
                the 4 bytes \"hi\" with the quotes); with any other content type a string
                is POSTed as its own text (\"hi\" sends 2 bytes), other values as JSON text
  body_base64   string: the body as base64 bytes, instead of body (exactly one of the two)
  content_type  string: default application/json (application/octet-stream with
                body_base64); a valid HTTP header value
  headers       {name: value}: extra request headers for every delivery of the row;
                Content-Type, Content-Length, Host, Idempotency-Key, User-Agent,
                Transfer-Encoding, Connection, Keep-Alive, TE, Trailer(s), Upgrade,
                Expect, Proxy-*, Date, Digest, Signature, Signature-Input and
                webhook-* are refused; at most 64 headers and 8 KiB of them
  dedup_key     string: skip recipients with a pending unit of the same key
  ordering_key  string: order per (recipient, key) instead of per recipient
  joined        bool: one unit occupying every recipient at once

Example:
  {\"id\": \"n-1\", \"to\": [\"https://example.org/hook\"], \"body\": \"hello\", \"content_type\": \"text/plain\", \"headers\": {\"Authorization\": \"Bearer t0k3n\"}}
  {\"id\": \"n-2\", \"to\": [\"https://example.org/inbox\"], \"body\": {\"type\": \"Create\"}, \"content_type\": \"application/activity+json\"}
  {\"id\": \"n-3\", \"to\": [\"https://example.org/blob\"], \"body_base64\": \"AAEC/w==\"}

Recipients the outbox's destination policy refuses without a lookup (loopback or private IP
literals, localhost: public only unless widened, see `outbox-lanes destinations`) are refused;
--allow-private-destinations widens it to loopback and private ranges first. Blank lines are
skipped. A bad line, or a line longer than --max-line-bytes, refuses the whole input:
nothing is enqueued, its line number and reason go to stderr, and the exit status is 2.";

/// `relay`'s flags.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Serve `/metrics` (Prometheus text), `/healthz` and `/readyz` on this address:
    /// `HOST:PORT` (`127.0.0.1:9187`, `localhost:9187`, `[::1]:9187`), or `:PORT` for every
    /// IPv4 interface (0.0.0.0, as Prometheus exporters do).
    #[arg(long, env = "OUTBOX_LANES_METRICS_ADDR", value_parser = parse_metrics_addr)]
    pub(crate) metrics_addr: Option<MetricsAddr>,

    /// Serve the web dashboard (overview, lanes, hosts, dead letters, and actions on them),
    /// with `/metrics`, `/healthz` and `/readyz`, on this address: `HOST:PORT`
    /// (`127.0.0.1:9188`), `[::1]:PORT`, or `:PORT` for every IPv4 interface. Off by default;
    /// meant for loopback (anyone who reaches it reads the outbox, payloads included).
    #[arg(long, env = "OUTBOX_LANES_ADMIN_ADDR", value_parser = parse_metrics_addr)]
    pub(crate) admin_addr: Option<MetricsAddr>,

    /// A file holding the dashboard's admin token (at least 16 bytes; surrounding whitespace
    /// ignored). An operator who logs in with it may act (pause a lane, block a host, replay
    /// dead letters…); without it the dashboard is read-only.
    #[arg(long, env = "OUTBOX_LANES_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub(crate) admin_token_file: Option<std::path::PathBuf>,

    /// Run this command (with `sh -c`) for every dead letter, the dead letter as one JSON
    /// object on its stdin. Off the delivery path: a slow or failing command delays and
    /// loses no delivery; its failure is logged at WARN, its output as the relay's own log
    /// lines. It runs in a process group of its own, without the relay's secrets in its
    /// environment.
    #[arg(long, env = "OUTBOX_LANES_ON_DEAD_LETTER", value_name = "CMD")]
    pub(crate) on_dead_letter: Option<String>,

    /// At most this many `--on-dead-letter` commands run at once; dead letters past it wait
    /// in a queue (of 10,000; past that, they are logged at WARN and not passed on).
    #[arg(long, env = "OUTBOX_LANES_ON_DEAD_LETTER_CONCURRENCY", default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) on_dead_letter_concurrency: u32,

    #[command(flatten)]
    pub(crate) delivery: DeliveryFlags,

    /// The relay's safety-net poll for work (wake-ups after enqueue come sooner).
    #[arg(long, value_parser = parse_timeout, default_value = "1s", env = "OUTBOX_LANES_POLL_INTERVAL")]
    pub(crate) poll_interval: Duration,

    /// Passes (actors) with work the relay runs at once; a pass that only waits on attempts
    /// in flight (a hanging recipient) is not counted.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096), env = "OUTBOX_LANES_MAX_PASSES")]
    pub(crate) max_passes: u32,

    /// How often the relay deletes what the store keeps only for a while: row ids past
    /// `--row-id-retention`, delivered units past `--ack-retention` (at start, then this often).
    #[arg(long, value_parser = parse_timeout, default_value = "10m", env = "OUTBOX_LANES_UPKEEP_INTERVAL")]
    pub(crate) upkeep_interval: Duration,
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

/// `rows` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum RowsCommand {
    /// A row's state per recipient (pending, in flight, delivered, dead letter), its
    /// attempts, last status and error, and each attempt the delivery log keeps (start,
    /// duration, status, error class, the first KiB of a non-2xx answer's body).
    Show {
        /// The row's actor.
        #[arg(long)]
        actor: String,
        /// The row id it was enqueued with.
        #[arg(long)]
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
    /// Put dead letters back at the tail of their lanes, in their original order: those
    /// selected, or every one with `--all`.
    ///
    /// A dead letter whose recipient already has it (an attempt in flight when an operator
    /// set its unit aside delivered it: its last error says so) is left out, and counted as
    /// skipped, unless `--include-delivered` is given.
    Replay {
        #[command(flatten)]
        which: DeadLetterArgs,
        /// Print what would be replayed, and change nothing.
        #[arg(long, env = "OUTBOX_LANES_DRY_RUN", value_parser = BoolishValueParser::new())]
        dry_run: bool,
        /// Replay the dead letters their recipients already have too (they get them twice).
        #[arg(long)]
        include_delivered: bool,
    },
    /// Delete dead letters: those selected, or every one with `--all`.
    Purge {
        #[command(flatten)]
        which: DeadLetterArgs,
        /// Print what would be purged, and change nothing.
        #[arg(long, env = "OUTBOX_LANES_DRY_RUN", value_parser = BoolishValueParser::new())]
        dry_run: bool,
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
    /// With this reason only.
    #[arg(long, env = "OUTBOX_LANES_REASON", value_parser = reason_parser())]
    pub(crate) reason: Option<DeadReason>,
    /// For this recipient URL only (compared in its canonical form).
    #[arg(long, env = "OUTBOX_LANES_RECIPIENT", value_parser = parse_recipient)]
    pub(crate) recipient: Option<Recipient>,
    /// Dead-lettered longer ago than this only: `7d`, `12h`, `30m`, or seconds.
    #[arg(long, env = "OUTBOX_LANES_OLDER_THAN", value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
    /// Dead-lettered at or after T only (T included). T is an RFC 3339 time
    /// (`2026-12-06T10:00:00Z`, `2026-12-06T11:00:00+01:00`, fractions of a second allowed) or
    /// a duration meaning that long ago (`90m`, `2h`, `7d`, `1h 30m`, or seconds).
    #[arg(long, env = "OUTBOX_LANES_SINCE", value_name = "T", value_parser = parse_time)]
    pub(crate) since: Option<TimeArg>,
    /// Dead-lettered before T only (T excluded); T as for --since, which must be before it.
    #[arg(long, env = "OUTBOX_LANES_UNTIL", value_name = "T", value_parser = parse_time)]
    pub(crate) until: Option<TimeArg>,
    /// Every dead letter. `replay` and `purge` act on nothing unless a selector above or this
    /// says which (for `list` it is the default). Deliberately without an environment
    /// variable: for the destructive commands it is the confirmation.
    #[arg(long, conflicts_with_all = [
        "actor", "ids", "reason", "recipient", "older_than", "since", "until",
    ])]
    pub(crate) all: bool,
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
            || self.since.is_some()
            || self.until.is_some()
    }

    /// `--since` and `--until` as times, a duration ago counted from `now`; an error (for the
    /// caller to refuse as a usage error) when both are given and `--since` is not before
    /// `--until`: that range holds no dead letter.
    pub(crate) fn time_range(
        &self,
        now: Timestamp,
    ) -> Result<(Option<Timestamp>, Option<Timestamp>), String> {
        let since = self.since.map(|t| t.at(now));
        let until = self.until.map(|t| t.at(now));
        if let (Some(s), Some(u)) = (since, until)
            && s >= u
        {
            return Err(format!(
                "--since {} is not before --until {}: the range holds no dead letter",
                super::output::time(s),
                super::output::time(u)
            ));
        }
        Ok((since, until))
    }
}

/// A time given to `--since` or `--until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeArg {
    /// This time (an RFC 3339 time).
    At(Timestamp),
    /// That long before the command runs (a duration).
    Ago(Duration),
}

impl TimeArg {
    /// The time, with a duration counted back from `now`.
    pub(crate) fn at(self, now: Timestamp) -> Timestamp {
        match self {
            TimeArg::At(t) => t,
            TimeArg::Ago(d) => now.saturating_sub(d),
        }
    }
}

/// `--since`/`--until`: an RFC 3339 time, or a duration meaning that long ago.
fn parse_time(s: &str) -> Result<TimeArg, String> {
    let t = s.trim();
    let b = t.as_bytes();
    // A date starts with its year and a dash; a duration never does.
    if b.len() > 4 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' {
        return parse_rfc3339(t).map(TimeArg::At).map_err(|e| {
            format!(
                "{s:?}: {e} (an RFC 3339 time: 2026-12-06T10:00:00Z or 2026-12-06T11:00:00+01:00)"
            )
        });
    }
    parse_duration(t).map(TimeArg::Ago).map_err(|_| {
        format!(
            "{s:?}: neither an RFC 3339 time (2026-12-06T10:00:00Z) nor a duration ago (2h, 7d)"
        )
    })
}

/// An RFC 3339 date-time: `T` (or a space) between date and time, fractions of a second,
/// `Z` or a `±hh:mm` offset; a time between two milliseconds is the later one (the dead-letter
/// times are milliseconds, so `--since` keeps exactly those at or after it, `--until` those
/// before it).
fn parse_rfc3339(t: &str) -> Result<Timestamp, String> {
    let mut u = t.to_ascii_uppercase();
    if u.len() > 10 && u.as_bytes()[10] == b' ' {
        u.replace_range(10..11, "T");
    }
    // humantime reads UTC (`Z`) only: an offset is taken off and applied here.
    let (utc, offset) = match u.len().checked_sub(6).map(|i| u.split_at(i)) {
        Some((head, off))
            if off.len() == 6
                && matches!(off.as_bytes()[0], b'+' | b'-')
                && off.as_bytes()[3] == b':' =>
        {
            let num = |r: std::ops::Range<usize>| {
                off.get(r)
                    .filter(|d| d.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|d| d.parse::<u64>().ok())
            };
            let (Some(h), Some(m)) = (num(1..3), num(4..6)) else {
                return Err("not a valid offset".into());
            };
            if h > 23 || m > 59 {
                return Err("not a valid offset".into());
            }
            let east = off.as_bytes()[0] == b'+';
            (
                format!("{head}Z"),
                (Duration::from_secs((h * 60 + m) * 60), east),
            )
        }
        _ if u.ends_with('Z') => (u.clone(), (Duration::ZERO, true)),
        _ => return Err("no time zone (end it with Z or an offset such as +01:00)".into()),
    };
    let local = humantime::parse_rfc3339(&utc).map_err(|e| e.to_string())?;
    // Local time east of UTC is ahead of it.
    let at = match offset {
        (d, true) => local.checked_sub(d),
        (d, false) => local.checked_add(d),
    }
    .ok_or("out of range")?;
    let since_epoch = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| "before 1970")?;
    let ms = since_epoch.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| "out of range".into())
}

/// A dead letter's reason code, one of [`DeadReason::ALL`]: the help and the error list
/// them all, from that one list.
fn reason_parser() -> impl clap::builder::TypedValueParser<Value = DeadReason> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(DeadReason::ALL.map(DeadReason::as_str))
        .try_map(|s| DeadReason::from_code(&s).ok_or("not a reason"))
}

/// A recipient URL, canonicalised as the store keys lanes.
fn parse_recipient(s: &str) -> Result<Recipient, String> {
    Recipient::parse(s.trim()).map_err(|e| format!("{s:?}: {e}"))
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

/// A header value: visible ASCII, spaces and tabs (RFC 9110 field-value, without obs-text).
fn parse_header_value(s: &str) -> Result<String, String> {
    if s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) && !s.trim().is_empty() {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?}: not a valid HTTP header value (visible ASCII and spaces)"
        ))
    }
}

/// A duration that may be turned off (`off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Off(pub(crate) Option<Duration>);

fn parse_off_duration(s: &str) -> Result<Off, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(Off(None));
    }
    parse_timeout(s).map(|d| Off(Some(d)))
}

fn parse_retry_schedule(s: &str) -> Result<RetrySchedule, String> {
    RetrySchedule::from_code(s.trim())
        .ok_or_else(|| format!("{s:?}: a retry schedule is `standard` or `svix`"))
}

/// Requests per second above 0, fractions allowed (`0.5`: one every two seconds).
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a rate: write requests per second above 0, e.g. 10 or 0.5"
        )),
    }
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
        assert!(parse_header_value("outbox-lanes/1 (+https://example.com)").is_ok());
        for bad in ["", " ", "a\r\nX-Injected: 1", "caf\u{e9}"] {
            assert!(parse_header_value(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for zero in ["0", "0s", "0ms", "0.0"] {
            assert!(parse_timeout(zero).is_err(), "{zero}");
        }
    }

    /// The admission window's flags reach the pass's scheduler, the floor of four units per
    /// delivery in flight included.
    #[test]
    fn admission_flags_reach_the_scheduler() {
        use clap::Parser as _;
        let scheduler = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(["outbox-lanes", "drain"].iter().chain(args)).expect("parses");
            let Command::Drain { delivery, .. } = cli.command else {
                panic!("not a drain");
            };
            crate::cli::config(&delivery).pass_scheduler()
        };
        let d = scheduler(&[]);
        assert_eq!(
            (d.max_units, d.max_per_lane, d.max_bytes),
            (1024, 64, 64 << 20)
        );
        let s = scheduler(&[
            "--max-units",
            "5000",
            "--max-per-lane",
            "8",
            "--max-bytes",
            "1000",
        ]);
        assert_eq!((s.max_units, s.max_per_lane, s.max_bytes), (5000, 8, 1000));
        let floor = scheduler(&["--max-units", "10", "--concurrency", "100"]);
        assert_eq!(floor.max_units, 400);
        for bad in [
            ["--max-per-lane", "0"],
            ["--max-units", "0"],
            ["--max-bytes", "0"],
        ] {
            let args = ["outbox-lanes", "drain"].into_iter().chain(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
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
        use clap::CommandFactory as _;
        // Every reason is accepted, and named by the help and by the error: one list.
        let cmd = Cli::command();
        let list = cmd
            .find_subcommand("dead-letters")
            .and_then(|d| d.find_subcommand("list"))
            .expect("dead-letters list");
        let reason = list
            .get_arguments()
            .find(|a| a.get_id() == "reason")
            .expect("--reason");
        let values: Vec<String> = reason
            .get_possible_values()
            .iter()
            .map(|v| v.get_name().to_owned())
            .collect();
        let all: Vec<&str> = DeadReason::ALL.map(DeadReason::as_str).to_vec();
        assert_eq!(values, all);
        for r in DeadReason::ALL {
            let parsed = Cli::try_parse_from([
                "outbox-lanes",
                "dead-letters",
                "list",
                "--reason",
                r.as_str(),
            ]);
            assert!(parsed.is_ok(), "{r}");
        }
        let err = Cli::try_parse_from(["outbox-lanes", "dead-letters", "list", "--reason", "late"])
            .expect_err("not a reason")
            .to_string();
        assert!(
            err.contains("purged") && err.contains("host_unavailable"),
            "{err}"
        );
        assert_eq!(
            parse_recipient("HTTP://Example.COM:80/inbox").map(|r| r.as_str().to_owned()),
            Ok("http://example.com/inbox".to_owned())
        );
        assert!(parse_recipient("example.com/inbox").is_err());
    }

    #[test]
    fn since_and_until_times() {
        let ten = Timestamp::from_secs(1_796_551_200); // 2026-12-06T10:00:00Z
        for same in [
            "2026-12-06T10:00:00Z",
            " 2026-12-06T10:00:00.000Z ",
            "2026-12-06t10:00:00z",
            "2026-12-06 10:00:00Z",
            "2026-12-06T10:00:00+00:00",
            "2026-12-06T11:00:00+01:00",
            "2026-12-06T05:30:00-04:30",
            "2026-12-07T00:00:00+14:00",
        ] {
            assert_eq!(parse_time(same), Ok(TimeArg::At(ten)), "{same}");
        }
        // Milliseconds, and a time between two of them is the later one.
        let at = |ms| Ok(TimeArg::At(Timestamp::from_millis(ten.as_millis() + ms)));
        assert_eq!(parse_time("2026-12-06T10:00:00.123Z"), at(123));
        assert_eq!(parse_time("2026-12-06T10:00:00.0001Z"), at(1));
        assert_eq!(parse_time("2026-12-06T11:00:00.5+01:00"), at(500));
        let ago = |secs| Ok(TimeArg::Ago(Duration::from_secs(secs)));
        assert_eq!(parse_time("2h"), ago(7_200));
        assert_eq!(parse_time("7d"), ago(7 * 86_400));
        assert_eq!(parse_time("1h 30m"), ago(5_400));
        assert_eq!(parse_time("90"), ago(90));
        for bad in [
            "",
            "soon",
            "-2h",
            "2026-12-06",
            "2026-12-06T10:00:00",
            "2026-12-06T10:00Z",
            "2026-13-06T10:00:00Z",
            "2026-12-06T10:00:00+1:00",
            "2026-12-06T10:00:00+01:60",
            "2026-12-06T10:00:00+24:00",
            "1969-12-31T23:59:59Z",
        ] {
            let err = parse_time(bad).expect_err(bad);
            assert!(err.contains("RFC 3339"), "{bad}: {err}");
        }
        assert_eq!(
            TimeArg::Ago(Duration::from_secs(60)).at(ten),
            ten.saturating_sub(Duration::from_secs(60))
        );
        assert_eq!(TimeArg::At(ten).at(Timestamp::EPOCH), ten);
    }

    #[test]
    fn since_must_be_before_until() {
        let parse = |args: &[&str]| {
            let mut all = vec!["outbox-lanes", "dead-letters", "list"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).expect("parses").command {
                Command::DeadLetters(DeadLetterCommand::List(a)) => a,
                other => panic!("{other:?}"),
            }
        };
        let now = Timestamp::from_secs(1_796_551_200);
        let hour = Duration::from_secs(3_600);
        let a = parse(&["--since", "2h", "--until", "1h"]);
        assert!(a.selects());
        assert_eq!(
            a.time_range(now),
            Ok((
                Some(now.saturating_sub(2 * hour)),
                Some(now.saturating_sub(hour))
            ))
        );
        let a = parse(&["--since", "2026-12-06T09:00:00Z"]);
        assert_eq!(
            a.time_range(now),
            Ok((Some(now.saturating_sub(hour)), None))
        );
        for (since, until) in [
            ("1h", "2h"),
            ("1h", "1h"),
            ("2026-12-06T10:00:00Z", "2026-12-06T10:00:00Z"),
            ("2026-12-06T10:00:00Z", "2h"),
        ] {
            let err = parse(&["--since", since, "--until", until])
                .time_range(now)
                .expect_err(since);
            assert!(err.starts_with("--since 2026-12-06T"), "{err}");
            assert!(err.contains("is not before --until 2026-12-06T"), "{err}");
        }
        // --all takes neither.
        assert!(
            Cli::try_parse_from([
                "outbox-lanes",
                "dead-letters",
                "purge",
                "--all",
                "--since",
                "1h"
            ])
            .is_err()
        );
    }

    #[test]
    fn clap_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
