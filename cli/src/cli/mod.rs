//! The `outbox-lanes` command line: parsing, dispatch and exit codes.

pub(crate) mod admin;
pub(crate) mod args;
pub(crate) mod backend;
pub(crate) mod config;
pub(crate) mod db_url;
pub(crate) mod destinations;
pub(crate) mod enqueue;
pub(crate) mod hosts;
pub(crate) mod metrics;
pub(crate) mod on_dead;
pub(crate) mod output;
pub(crate) mod progress;
pub(crate) mod rows;
pub(crate) mod signing;

use std::collections::BTreeSet;
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{ActorId, LaneKey, Timestamp};
use outbox_lanes_store::{CommonOptions, DeadLetterFilter, DeadLetterId, DeadLetterSelection};
use outbox_lanes_tokio::{
    DrainControl, DrainOutcome, OutboxConfig, OutboxError, PassReport, RateLimits, Reserve,
};
use tokio::task::JoinSet;
use tracing::{info, warn};

use args::{
    Cli, Command, DeadLetterArgs, DeadLetterCommand, DeliveryFlags, DestinationsAction,
    DestinationsArgs, HostAction, HostsArgs, LaneAction, LanesArgs, LogFormat, RelayArgs,
    SignatureSpecArg,
};
use backend::{Access, Backend, Counters, LaneOp, OpenError};
use outbox_lanes_tokio::SignatureMode;

/// A usage or input error: exit code 2.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A drain or relay stopped at once (a second signal) or whose grace ended with attempts in
/// flight: exit 1, nothing lost (what was not acknowledged is delivered again later).
#[derive(Debug)]
struct Interrupted(String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// 2 for errors in the caller's input, 1 for failures at run time (a database that is locked,
/// full or unreachable mid-way).
fn exit_code(e: &anyhow::Error) -> u8 {
    let input = e.chain().any(|c| {
        c.is::<UsageError>()
            || c.is::<enqueue::BadLine>()
            || c.downcast_ref::<OpenError>()
                .is_some_and(OpenError::is_input)
    });
    if input { 2 } else { 1 }
}

/// The error and its causes, each said once: several error types repeat their source's text
/// in their own (`enqueue failed: database error: X`) and return it as the source too.
fn message(e: &anyhow::Error) -> String {
    // A store error's text already says its cause in one line (the server's message, not the
    // driver's bare "db error"): the driver's errors below it are for programs, not repeated.
    let mut texts: Vec<String> = Vec::new();
    for c in e.chain() {
        texts.push(c.to_string());
        if c.is::<outbox_lanes_store::StoreError>() || c.is::<OpenError>() {
            break;
        }
    }
    let mut kept: Vec<&str> = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let t = t.as_str();
        // Said already by an outer error, or said again in full by an inner one.
        let said = kept.iter().any(|k| k.contains(t))
            || texts[i + 1..].iter().any(|inner| inner.contains(t));
        if !said && !t.is_empty() {
            kept.push(t);
        }
    }
    kept.join(": ")
}

/// Runs the command line; never panics on user input.
pub(crate) fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // clap prints its own usage errors and exits 2 (0 for --help and --version); asked for
    // JSON logs, a usage error is one JSON line like every other error.
    let json_asked = wants_json(&args);
    let usage_error = |text: String| -> ExitCode {
        if json_asked {
            init_logging(LogFormat::Json);
            tracing::error!(exit_code = 2, "{}", text.trim_end());
        } else {
            say(&format!("error: {text}"));
        }
        ExitCode::from(2)
    };
    let matches = match config::matches(<Cli as clap::CommandFactory>::command(), args) {
        Ok(m) => m,
        Err(config::Error::Clap(e)) if json_asked && e.use_stderr() => {
            return usage_error(clap_message(&e));
        }
        Err(config::Error::Clap(e)) => e.exit(),
        Err(config::Error::File(msg)) => return usage_error(msg),
    };
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) if json_asked && e.use_stderr() => return usage_error(clap_message(&e)),
        Err(e) => e.exit(),
    };
    // Generated from the command definition: no database, no runtime.
    match &cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            // Into memory first: clap_complete panics on a failed write (a full disk).
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "outbox-lanes", &mut script);
            return match print(&String::from_utf8_lossy(&script)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    say(&format!("error: {}", message(&e)));
                    ExitCode::from(1)
                }
            };
        }
        Command::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            return match page.render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    say(&format!("error: cannot write the man page: {e}"));
                    ExitCode::from(1)
                }
            };
        }
        _ => {}
    }
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("outbox-lanes-cli")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say(&format!("error: cannot start the tokio runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    let json = cli.log_format == LogFormat::Json;
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code(&e);
            // With JSON logs every stderr line is JSON, the last one included.
            if json {
                tracing::error!(exit_code = code, "{}", message(&e));
            } else {
                say(&format!("error: {}", message(&e)));
            }
            ExitCode::from(code)
        }
    }
}

/// Whether the command line or the environment asks for JSON logs (read before clap parses
/// them, so that a usage error can be JSON too).
fn wants_json(args: &[std::ffi::OsString]) -> bool {
    let mut asked = std::env::var("OUTBOX_LANES_LOG_FORMAT").is_ok_and(|v| v == "json");
    let mut it = args.iter().map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if a == "--log-format" {
            asked = it.next().is_some_and(|v| v == "json");
        } else if let Some(v) = a.strip_prefix("--log-format=") {
            asked = v == "json";
        }
    }
    asked
}

/// clap's error as one line of text: its message without the `error: ` prefix, the usage
/// and the help hint joined.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,postgres=warn,tokio_postgres=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(progress::LogWriter);
    // Another subscriber already set is not worth failing over.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The runtime the binary runs, as its logs name it.
const RUNTIME: &str = "tokio (passes and deliveries as tasks, hyper)";

/// The rate limits of `--rate-limits` and `--endpoint-rate`; a file that cannot be used is a
/// usage error naming the entry, before anything is delivered.
fn rate_limits(d: &DeliveryFlags) -> anyhow::Result<RateLimits> {
    let rates = match &d.rate_limits {
        Some(path) => RateLimits::load(path).map_err(|e| {
            usage(format!(
                "--rate-limits (or OUTBOX_LANES_RATE_LIMITS): {e}; nothing delivered"
            ))
        })?,
        None => RateLimits::none(),
    };
    match d.endpoint_rate {
        Some(n) if !rates.has_default_endpoint() => rates
            .with_default_endpoint(n)
            .map_err(|e| usage(format!("--endpoint-rate: {e}"))),
        Some(_) => Err(usage(
            "--endpoint-rate and the rate-limits file's [default] per_endpoint both set the \
             default: keep one",
        )),
        None => Ok(rates),
    }
}

/// The outbox configuration the delivery flags ask for.
fn config(d: &DeliveryFlags) -> OutboxConfig {
    let mut c = OutboxConfig::default();
    c.http.timeout = d.timeout;
    c.shutdown_grace = d.shutdown_grace;
    // The named schedule first; the settings given one by one change its values.
    d.retry_schedule.unwrap_or_default().apply(&mut c.scheduler);
    if let Some(n) = d.max_attempts {
        c.scheduler.max_attempts = n;
    }
    if let Some(n) = d.pass_attempts {
        c.scheduler.pass_attempts = n;
    }
    c.concurrency = d.concurrency as usize;
    c.per_host = d.per_host_concurrency.map(|n| n as usize);
    c.reserve = d
        .actor_reserve
        .map_or(Reserve::Auto, |n| Reserve::Places(n as usize));
    c.http.addresses = address_policy(d.allow_private_destinations);
    if !d.retry_delays.is_empty() {
        c.scheduler.retry_delays.clone_from(&d.retry_delays);
    }
    c.scheduler.jitter_percent = d.jitter_percent;
    if let Some(base) = d.backoff_base {
        c.scheduler.lane_backoff_base = base;
        // A base given alone doubles per level, as without a named schedule.
        c.scheduler.backoff_schedule.clear();
    }
    if let Some(cap) = d.backoff_cap {
        c.scheduler.lane_backoff_cap = cap;
        c.scheduler.backoff_schedule.clear();
    }
    c.scheduler.retry_after_cap = d.retry_after_cap;
    c.http.retry_after_cap = d.retry_after_cap;
    c.scheduler.max_throttled_level = d.max_throttled_level;
    c.scheduler.max_units = d.max_units as usize;
    c.scheduler.max_per_lane = d.max_per_lane;
    c.scheduler.max_bytes = d.max_bytes;
    c.scheduler.max_age = d.max_age;
    c.scheduler.retire_on_gone = d.retire_on_gone;
    c.scheduler.lane_unavailable_after = d.lane_unavailable_after.0;
    c.lease = d.lease;
    c.time_slice = d.time_slice;
    if let Some(ua) = &d.user_agent {
        c.http.user_agent.clone_from(ua);
    }
    c.holder.clone_from(&d.holder);
    c.seed = d.seed;
    c.http.signature = match d.signature_spec {
        SignatureSpecArg::Auto => SignatureMode::Auto,
        SignatureSpecArg::Rfc9421 => SignatureMode::Rfc9421,
        SignatureSpecArg::Cavage => SignatureMode::Cavage,
    };
    c.http.signature_fallback_on_5xx = d.signature_fallback_on_5xx;
    c.http.connect_timeout = d.connect_timeout;
    c.http.proxy.clone_from(&d.proxy);
    c.hosts.failures = d.host_failures;
    c.hosts.first_contact = d.host_first_contact;
    c.hosts.backoff_base = d.host_backoff_base;
    c.hosts.backoff_cap = d.host_backoff_cap.max(d.host_backoff_base);
    c.hosts.unavailable_after = d.host_unavailable_after.0;
    c.hosts.spec_retry = d.signature_retry_after;
    c
}

/// The destinations `--allow-private-destinations` opens (loopback and private ranges; never
/// link-local or the cloud metadata services): what `enqueue`, `drain` and `relay` widen the
/// outbox's destination policy to (OL-24), and what `drain` and `relay` deliver to.
pub(crate) fn address_policy(allow_private_destinations: bool) -> AddressPolicy {
    if allow_private_destinations {
        AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: false,
        }
    } else {
        AddressPolicy::default()
    }
}

/// `enqueue`'s check of its recipients before the database is touched (a refused input
/// leaves no trace): against the policy an outbox made now would have when there is none
/// yet, else only what no policy allows — the outbox's own policy is the store's to apply
/// (OL-24), in the enqueue's transaction. Reads whether an outbox exists only when a
/// recipient is outside public space.
async fn check_destinations(cli: &Cli, batch: &enqueue::Batch, flag: bool) -> anyhow::Result<()> {
    if !batch.names_private_destinations() {
        return Ok(());
    }
    let exists = Backend::schema_version(cli.db.clone(), cli.pg_schema.clone())
        .await?
        .is_some();
    let policy = if exists {
        AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: true,
        }
    } else {
        address_policy(flag)
    };
    batch.check_destinations(&policy).map_err(|bad| {
        anyhow::Error::new(bad).context("input refused, nothing enqueued".to_owned())
    })
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Validate the input before the database is touched: a refused input leaves no trace.
    if let Command::DeadLetters(
        DeadLetterCommand::List(which)
        | DeadLetterCommand::Replay { which, .. }
        | DeadLetterCommand::Purge { which, .. },
    ) = &cli.command
    {
        which.time_range(now()).map_err(usage)?;
    }
    let batch = match &cli.command {
        Command::Enqueue {
            actor,
            max_line_bytes,
            allow_private_destinations,
        } => {
            if actor.trim().is_empty() {
                return Err(usage("--actor is empty"));
            }
            let stdin = tokio::io::BufReader::new(tokio::io::stdin());
            match enqueue::read(stdin, *max_line_bytes).await {
                Ok(batch) => {
                    check_destinations(&cli, &batch, *allow_private_destinations).await?;
                    Some(batch)
                }
                Err(enqueue::ReadError::Bad { bad, before }) => {
                    return Err(anyhow::Error::new(bad).context(format!(
                        "input refused, nothing enqueued (an input is all or nothing: \
                         the {before} valid line(s) before it were not enqueued either)"
                    )));
                }
                Err(enqueue::ReadError::Io(e)) => {
                    return Err(usage(format!("cannot read stdin: {e}; nothing enqueued")));
                }
            }
        }
        Command::Relay(RelayArgs {
            on_dead_letter: Some(cmd),
            ..
        }) if cmd.trim().is_empty() => return Err(usage("--on-dead-letter is empty")),
        // Read again when the dashboard starts; a file that cannot serve leaves no trace.
        Command::Relay(RelayArgs {
            admin_addr: Some(_),
            admin_token_file: Some(path),
            ..
        }) => {
            admin::read_token(path).map_err(usage)?;
            None
        }
        Command::DeadLetters(
            DeadLetterCommand::Purge { which, .. } | DeadLetterCommand::Replay { which, .. },
        ) if !which.selects() && !which.all => {
            let verb = match &cli.command {
                Command::DeadLetters(DeadLetterCommand::Purge { .. }) => "purge",
                _ => "replay",
            };
            return Err(usage(format!(
                "dead-letters {verb} needs a selector (--actor, --id, --reason, --recipient, \
                 --older-than, --since, --until), or --all for every dead letter"
            )));
        }
        _ => None,
    };
    // Least privilege: each command opens the store with what it needs (see `Access`). Only
    // enqueue, relay and migrate create an outbox: the others have nothing to do on an empty
    // one, and must not leave a new database behind at a mistyped path or schema; only
    // migrate changes a schema that exists.
    let access = match &cli.command {
        Command::Migrate { .. } => Access::Migrate,
        Command::Enqueue { .. } | Command::Relay(_) => Access::Create,
        Command::Status { .. }
        | Command::Lanes(LanesArgs { action: None, .. })
        | Command::Lanes(LanesArgs {
            action: Some(LaneAction::List { .. }),
            ..
        })
        | Command::DeadLetters(DeadLetterCommand::List(_))
        | Command::DeadLetters(DeadLetterCommand::Show { .. })
        | Command::Rows(_)
        | Command::Hosts(HostsArgs { action: None, .. })
        | Command::Hosts(HostsArgs {
            action: Some(HostAction::List { .. }),
            ..
        })
        | Command::Destinations(DestinationsArgs {
            action: None | Some(DestinationsAction::Show { .. }),
            ..
        }) => Access::Read,
        _ => Access::Write,
    };
    let before = match &cli.command {
        Command::Migrate { .. } | Command::Relay(_) => {
            Backend::schema_version(cli.db.clone(), cli.pg_schema.clone()).await?
        }
        _ => None,
    };
    // Only the commands that deliver take the delivery flags and sign; their secret or keys
    // are checked before the database is touched.
    let delivery = match &cli.command {
        Command::Drain { delivery, .. } | Command::Relay(RelayArgs { delivery, .. }) => {
            Some(delivery)
        }
        _ => None,
    };
    let signing = match delivery {
        Some(d) => signing::Signing::from_flags(d)?,
        None => signing::Signing::default(),
    };
    let rates = match delivery {
        Some(d) => rate_limits(d)?,
        None => RateLimits::none(),
    };
    let counters = Arc::new(Counters::default());
    let common = CommonOptions {
        row_id_retention: cli.row_id_retention,
        ack_retention: (!cli.ack_retention.is_zero()).then_some(cli.ack_retention),
        delivery_log_retention: cli.delivery_log_retention,
        ..CommonOptions::default()
    };
    if delivery.is_some_and(|d| !d.allow_private_destinations) {
        counters.warn_private_refusals();
    }
    let backend = Backend::open(
        cli.db.clone(),
        cli.pg_schema.clone(),
        access,
        common,
        {
            let mut c = delivery.map_or_else(OutboxConfig::default, config);
            if let Command::Enqueue {
                allow_private_destinations: true,
                ..
            } = &cli.command
            {
                // Opening the outbox widens its destination policy (OL-24).
                c.http.addresses = address_policy(true);
            }
            c.rates = rates;
            if let Command::Relay(r) = &cli.command {
                c.poll_interval = r.poll_interval;
                c.max_passes = r.max_passes as usize;
                c.upkeep_interval = r.upkeep_interval;
            }
            c
        },
        signing.signer.clone(),
        Arc::clone(&counters),
    )
    .await?;
    if delivery.is_some() {
        let only = match &cli.command {
            Command::Drain { actor, .. } => actor.as_deref(),
            _ => None,
        };
        if let Err(e) = signing.check_actors(&backend, only).await {
            backend.close().await;
            return Err(e);
        }
    }
    if let Command::Relay(_) = &cli.command {
        // A relay started in the wrong directory would create `./outbox.db` and idle.
        let shown = db_url::redact_db(&cli.db);
        let schema = db_url::is_postgres(&cli.db).then_some(cli.pg_schema.as_str());
        match before {
            Some(version) => info!(db = %shown, pg_schema = schema, schema_version = version,
                "relay opened the outbox"),
            None => warn!(db = %shown, pg_schema = schema,
                "relay created a new, empty outbox: if you meant an existing one, check --db \
                 (and --pg-schema)"),
        }
    }
    let style = match cli.log_format {
        LogFormat::Text => progress::Style::Text,
        LogFormat::Json => progress::Style::Json,
    };
    let report = (style, !delivery.is_some_and(|d| d.no_progress));
    let result = match cli.command {
        Command::Migrate { json } => cmd_migrate(&backend, &cli.db, before, json),
        command => dispatch(&backend, command, batch, &counters, report).await,
    };
    match &result {
        // Interrupted: the attempts in flight are not waited for (up to the HTTP timeout).
        Err(e) if e.is::<Interrupted>() => backend.close_now().await,
        _ => backend.close().await,
    }
    result
}

async fn dispatch(
    backend: &Backend,
    command: Command,
    batch: Option<enqueue::Batch>,
    counters: &Arc<Counters>,
    report: (progress::Style, bool),
) -> anyhow::Result<()> {
    // Only the long-running commands catch SIGINT and SIGTERM (to stop gracefully); the
    // others keep the default, and a transaction interrupted by a signal rolls back.
    match command {
        Command::Enqueue { actor, .. } => {
            let batch = batch.context("the input was not read")?;
            cmd_enqueue(backend, actor, batch).await
        }
        Command::Drain { actor, .. } => {
            cmd_drain(backend, actor, counters, Signals::new()?, report).await
        }
        Command::Relay(r) => cmd_relay(backend, r, counters, Signals::new()?).await,
        Command::Status { json } => {
            let s = backend.status().await?;
            let flying = rows::lanes_in_flight(backend).await?;
            if json {
                #[derive(serde::Serialize)]
                struct WithInFlight<S, F> {
                    #[serde(flatten)]
                    status: S,
                    lanes_in_flight: F,
                }
                print_json(&WithInFlight {
                    status: output::status_json(&s),
                    lanes_in_flight: rows::in_flight_json(&flying),
                })
            } else {
                let mut text = output::status_table(&s);
                text.push_str(&rows::in_flight_text(&flying));
                print(&text)
            }
        }
        Command::Lanes(args) => cmd_lanes(backend, args).await,
        Command::DeadLetters(c) => cmd_dead_letters(backend, c).await,
        Command::Rows(args::RowsCommand::Show { actor, id, json }) => {
            rows::cmd_rows_show(backend, actor, id, json).await
        }
        Command::Hosts(args) => hosts::cmd_hosts(backend, args).await,
        Command::Destinations(args) => destinations::cmd_destinations(backend, args).await,
        Command::Migrate { .. } | Command::Completions { .. } | Command::Man => Ok(()),
    }
}

/// `migrate`: the store was opened with [`Access::Migrate`], which created or upgraded the
/// schema; says which, from the version `before` it was opened.
fn cmd_migrate(backend: &Backend, db: &str, before: Option<u32>, json: bool) -> anyhow::Result<()> {
    let now = outbox_lanes_store::SCHEMA_VERSION;
    let what = match before {
        None => format!("created the outbox schema (version {now})"),
        Some(v) if v < now => format!("upgraded the outbox schema from version {v} to {now}"),
        Some(_) => format!("the outbox schema is at version {now} already"),
    };
    let shown = db_url::redact_db(db);
    info!(db = %shown, from = before, to = now, "{what}");
    if json {
        print_json(&serde_json::json!({
            "db": shown,
            "from": before,
            "schema_version": now,
            "outbox_id": backend.outbox_id(),
        }))
    } else {
        print(&format!(
            "{what}: {shown} (outbox id {})\n",
            backend.outbox_id()
        ))
    }
}

/// `lanes [list] --actor A`.
async fn cmd_list_lanes(backend: &Backend, actor: String, json: bool) -> anyhow::Result<()> {
    let lanes = backend.lanes(actor.clone()).await?;
    if lanes.is_empty() {
        known_actor(backend, &actor).await?;
    }
    if json {
        print_json(&output::lanes_json(&actor, &lanes))
    } else {
        print(&output::lanes_table(&lanes))
    }
}

/// `lanes`: a listing, or `pause|resume|retry|strict|unstrict|purge|skip-head` on one lane.
async fn cmd_lanes(backend: &Backend, args: LanesArgs) -> anyhow::Result<()> {
    let (name, lane, op) = match (args.action, args.actor) {
        (None, Some(actor)) => return cmd_list_lanes(backend, actor, args.json).await,
        (None, None) => return Err(usage("lanes: --actor is required")),
        (Some(LaneAction::List { actor, json }), _) => {
            return cmd_list_lanes(backend, actor, json).await;
        }
        (Some(LaneAction::Pause { lane, reason }), _) => {
            if reason.trim().is_empty() {
                return Err(usage("--reason is empty"));
            }
            ("pause", lane, LaneOp::Pause(reason))
        }
        (Some(LaneAction::Resume { lane }), _) => ("resume", lane, LaneOp::Resume),
        (Some(LaneAction::Retry { lane }), _) => ("retry", lane, LaneOp::Retry),
        (Some(LaneAction::Strict { lane }), _) => ("strict", lane, LaneOp::Strict(true)),
        (Some(LaneAction::Unstrict { lane }), _) => ("unstrict", lane, LaneOp::Strict(false)),
        (Some(LaneAction::Purge { lane }), _) => ("purge", lane, LaneOp::Purge),
        (Some(LaneAction::SkipHead { lane }), _) => ("skip-head", lane, LaneOp::SkipHead),
    };
    let key = LaneKey::new(&lane.recipient, lane.ordering_key.as_deref())
        .map_err(|e| usage(format!("--recipient {:?}: {e}", lane.recipient)))?;
    known_actor(backend, &lane.actor).await?;
    let done = backend.lane_op(lane.actor.clone(), key.clone(), op).await?;
    info!(
        action = name,
        actor = %lane.actor,
        recipient = key.recipient(),
        ordering_key = key.ordering_key(),
        dead_lettered = done.dead_lettered,
        "lane action done"
    );
    let listed = done.lane.as_slice();
    if lane.json {
        print_json(&serde_json::json!({
            "action": name,
            "actor": lane.actor,
            "recipient": key.recipient(),
            "ordering_key": key.ordering_key(),
            "dead_lettered": done.dead_lettered,
            "skipped_unit": done.skipped.map(|u| u.0),
            "lane": serde_json::to_value(output::lanes_json(&lane.actor, listed))?["lanes"]
                .get(0)
                .cloned(),
        }))
    } else {
        let mut text = format!("{name}: {}", output::lane_name(&key));
        match (name, done.skipped) {
            ("skip-head", Some(u)) => {
                text.push_str(&format!(": unit {} dead-lettered (reason skipped)", u.0))
            }
            ("skip-head", None) => text.push_str(": nothing pending, nothing skipped"),
            ("purge", _) => text.push_str(&format!(
                ": {} unit(s) dead-lettered (reason purged)",
                done.dead_lettered
            )),
            _ => text.push_str(": done"),
        }
        text.push('\n');
        if !listed.is_empty() {
            text.push_str(&output::lanes_table(listed));
        }
        print(&text)
    }
}

/// Refuses an `--actor` the outbox has never seen (no lanes, pending units or dead letters):
/// the same usage error (exit 2) for every command that takes one.
async fn known_actor(backend: &Backend, actor: &str) -> anyhow::Result<()> {
    if backend.knows_actor(actor.to_owned()).await? {
        Ok(())
    } else {
        Err(usage(format!(
            "unknown actor {actor:?}: no pending units, lanes or dead letters"
        )))
    }
}

/// Writes `text` and a newline to stderr. A stderr that cannot take it (a full disk, a
/// closed pipe) loses the line: `eprintln!` would panic (exit 101) instead.
pub(crate) fn say(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err
        .write_all(text.as_bytes())
        .and_then(|()| err.write_all(b"\n"))
        .and_then(|()| err.flush());
}

fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // The reader went away (`| head`): nothing left to tell it.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(v).context("cannot format JSON")?;
    text.push('\n');
    print(&text)
}

async fn cmd_enqueue(
    backend: &Backend,
    actor: String,
    batch: enqueue::Batch,
) -> anyhow::Result<()> {
    if batch.rows.is_empty() {
        info!("no rows on stdin; nothing enqueued");
        return Ok(());
    }
    let n = batch.rows.len();
    match backend.enqueue(&actor, &batch.rows).await {
        Ok(done) => {
            let mut text = String::new();
            for e in &done {
                text.push_str(&serde_json::to_string(&enqueue::output(e))?);
                text.push('\n');
            }
            info!(%actor, rows = n, "enqueued");
            // Committed already: a failed write must not read as a failed enqueue (whoever
            // runs it again would have every row refused as a duplicate).
            print(&text).with_context(|| {
                format!(
                    "the {n} row(s) are enqueued (committed), but their results could not be written"
                )
            })
        }
        Err(OutboxError::Enqueue(e)) => match batch.explain(&e) {
            Some(bad) => Err(anyhow::Error::new(bad).context("input refused, nothing enqueued")),
            None => Err(anyhow::Error::new(e).context("nothing enqueued")),
        },
        Err(e) => Err(anyhow::Error::new(e).context("nothing enqueued")),
    }
}

async fn cmd_drain(
    backend: &Backend,
    actor: Option<String>,
    counters: &Arc<Counters>,
    signals: Signals,
    (style, show_progress): (progress::Style, bool),
) -> anyhow::Result<()> {
    // Without --actor, what is left is counted over every actor (lanes in backoff included).
    if let Some(a) = &actor {
        known_actor(backend, a).await?;
    }
    let scope = actor.as_ref().map(|a| vec![a.clone()]);
    let actors: Vec<String> = match actor {
        Some(a) => vec![a],
        None => backend
            .actors_ready()
            .await?
            .into_iter()
            .map(|a: ActorId| a.as_str().to_owned())
            .collect(),
    };
    let control = Arc::new(DrainControl::default());
    info!(
        runtime = RUNTIME,
        concurrency = backend.concurrency(),
        actors = actors.len(),
        "draining"
    );
    let progress = show_progress.then(|| {
        progress::Progress::start(
            backend.clone(),
            scope.clone(),
            Arc::clone(counters),
            Duration::from_secs(1),
            style,
        )
    });
    let stopper = {
        let control = Arc::clone(&control);
        let mut signals = signals;
        tokio::spawn(async move {
            let name = signals.wait().await;
            warn!(
                signal = name,
                "stopping the drain: attempts in flight finish, the rest is handed back \
                 (a second signal stops at once)"
            );
            control.request_stop();
            let name = signals.wait().await;
            warn!(
                signal = name,
                "stopping at once: everything is handed back, answers still in flight are \
                 ignored (those units are delivered again)"
            );
            control.request_cancel();
            // Cancelled passes hand back and release their slots within milliseconds, and
            // the drain returns its error (exit 1). Should it not within 5 s, exit anyway:
            // what was not acknowledged is delivered again later.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let why = format!("{name} again: exiting without waiting for attempts in flight");
            match style {
                progress::Style::Json => tracing::error!(exit_code = 1, "{why}"),
                progress::Style::Text => say(&format!("error: {why}")),
            }
            std::process::exit(1);
        })
    };
    // One task per actor: distinct actors drain concurrently, each runs its passes in turn.
    let mut tasks = JoinSet::new();
    for actor in actors.iter().cloned() {
        let backend = backend.clone();
        let control = Arc::clone(&control);
        tasks.spawn(async move {
            let mut total = PassReport::default();
            loop {
                match backend.drain(actor.clone(), Arc::clone(&control)).await {
                    Ok(DrainOutcome::Ran(r)) => {
                        total.delivered += r.delivered;
                        total.dead_lettered += r.dead_lettered;
                        total.handed_back = r.handed_back;
                        total.grace_over |= r.grace_over;
                        total.interrupted += r.interrupted;
                        // A pass yields at its time slice: run the next one, unless stopping.
                        if !r.yielded || control.stop.load(std::sync::atomic::Ordering::SeqCst) {
                            return Ok::<_, anyhow::Error>((actor, Some(total)));
                        }
                    }
                    Ok(DrainOutcome::Merged) => return Ok((actor, None)),
                    Err(e) if control.is_cancelled() => {
                        // The second signal cancelled the pass: not a failure of the store.
                        tracing::debug!(%actor, error = %e, "drain cancelled");
                        return Ok((actor, Some(total)));
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e).context(format!("draining {actor:?}")));
                    }
                }
            }
        });
    }
    let mut failure = None;
    let mut done = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(outcome)) => done.push(outcome),
            Ok(Err(e)) => {
                // Stop the others gracefully; their units are handed back.
                control
                    .stop
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                failure.get_or_insert(e);
            }
            Err(e) => {
                control
                    .stop
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                failure.get_or_insert(anyhow::anyhow!("a drain task failed: {e}"));
            }
        }
    }
    // The stopper stays: a second signal during the close still exits at once.
    drop(stopper);
    // Logged once the progress bar is gone, so no line is drawn over it.
    if let Some(p) = progress {
        p.finish().await;
    }
    let mut total = PassReport::default();
    for (actor, report) in done {
        match report {
            Some(r) => {
                total.delivered += r.delivered;
                total.dead_lettered += r.dead_lettered;
                total.handed_back += r.handed_back;
                total.grace_over |= r.grace_over;
                total.interrupted += r.interrupted;
                info!(%actor, delivered = r.delivered, dead_lettered = r.dead_lettered,
                    handed_back = r.handed_back, "drained");
            }
            None => info!(%actor,
                "a pass of this actor is running in another process; it was told to look again"),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if control.is_cancelled() {
        // A cancelled pass returns no report: the delivery hooks counted what it delivered.
        let delivered = counters
            .delivered
            .load(std::sync::atomic::Ordering::SeqCst)
            .max(total.delivered);
        return Err(Interrupted(format!(
            "stopped at once by a second signal: {delivered} delivered; every unit not \
             acknowledged was handed back and is delivered again by the next drain"
        ))
        .into());
    }
    if total.grace_over {
        return Err(Interrupted(format!(
            "stopped by a signal, but the shutdown grace ended with {} in flight: {} \
             delivered; those attempts were handed back unanswered and are delivered again by \
             the next drain",
            attempts_cut(total.interrupted),
            total.delivered
        ))
        .into());
    }
    let left = progress::left(backend, scope.as_deref()).await?;
    let stopped = control.stop.load(std::sync::atomic::Ordering::SeqCst);
    progress::summary(
        style,
        stopped,
        actors.len(),
        total.delivered,
        total.dead_lettered,
        left,
    );
    Ok(())
}

async fn cmd_relay(
    backend: &Backend,
    r: RelayArgs,
    counters: &Arc<Counters>,
    signals: Signals,
) -> anyhow::Result<()> {
    let server = match &r.metrics_addr {
        Some(addr) => Some(
            admin::serve_probes(addr, backend.clone(), Arc::clone(counters))
                .await
                .map_err(|e| usage(format!("--metrics-addr {}: {e}", addr.spec)))?,
        ),
        None => None,
    };
    if r.admin_addr.is_none() && r.admin_token_file.is_some() {
        warn!("--admin-token-file is ignored without --admin-addr (no dashboard is served)");
    }
    let dashboard = match &r.admin_addr {
        Some(addr) => {
            let token = match &r.admin_token_file {
                Some(path) => Some(admin::read_token(path).map_err(usage)?),
                None => None,
            };
            Some(
                admin::serve_admin(addr, backend.clone(), Arc::clone(counters), token)
                    .await
                    .map_err(|e| usage(format!("--admin-addr {}: {e}", addr.spec)))?,
            )
        }
        None => None,
    };
    let hook = r.on_dead_letter.map(|cmd| {
        let (sink, runner) = on_dead::start(cmd, r.on_dead_letter_concurrency as usize);
        // Set once, before any pass of this process runs.
        let _ = counters.on_dead_letter.set(sink);
        runner
    });
    let mut relay = backend.start_monitor().await?;
    info!(
        runtime = RUNTIME,
        concurrency = backend.concurrency(),
        "relay running; SIGINT or SIGTERM stops it"
    );
    let mut signals = signals;
    // The monitor stops by itself only when the database file is removed or replaced: this
    // process then exits 1 (a supervisor starts a relay on the file now at the path; kept
    // running, it would serve a file nobody sees, and an unready process is not restarted).
    let lost = tokio::select! {
        name = signals.wait() => {
            info!(
                signal = name,
                "stopping: attempts in flight finish, the rest is handed back (a second signal exits at once)"
            );
            None
        }
        e = relay.ended() => Some(e),
    };
    let interrupted = tokio::select! {
        stopped = relay.stop() => stopped.grace_over.then(|| {
            format!(
                "stopped by a signal, but the shutdown grace ended with {} in flight: they were \
                 handed back unanswered and are delivered again by the next relay",
                attempts_cut(stopped.interrupted)
            )
        }),
        // Nothing is lost: the acks waiting are committed on the way out, and units not
        // acknowledged are taken over at once by the next relay (this one's holder lock goes
        // with the process) and delivered again (at-least-once).
        name = signals.wait() => Some(format!(
            "{name} again: stopped at once, without waiting for attempts in flight; their \
             units are delivered again by the next relay"
        )),
    };
    for server in [server, dashboard].into_iter().flatten() {
        server.abort();
        // Its clone of the backend goes with it, before the backend is closed.
        let _ = server.await;
    }
    if let Some(hook) = hook {
        // No pass runs any more: the commands queued run now, within the grace (none after
        // a second signal).
        let grace = if interrupted.is_some() {
            Duration::ZERO
        } else {
            backend.shutdown_grace()
        };
        hook.finish(grace).await;
    }
    if let Some(e) = lost {
        return Err(anyhow::Error::new(e).context("relay stopped"));
    }
    if let Some(why) = interrupted {
        return Err(Interrupted(why).into());
    }
    info!("relay stopped");
    Ok(())
}

async fn cmd_dead_letters(backend: &Backend, c: DeadLetterCommand) -> anyhow::Result<()> {
    enum Op {
        List,
        Replay,
        Purge,
    }
    let (op, a, dry_run, include_delivered): (Op, DeadLetterArgs, bool, bool) = match c {
        DeadLetterCommand::List(a) => (Op::List, a, false, true),
        DeadLetterCommand::Show { id, json } => {
            return cmd_dead_letter_show(backend, id, json).await;
        }
        DeadLetterCommand::Replay {
            which,
            dry_run,
            include_delivered,
        } => (Op::Replay, which, dry_run, include_delivered),
        DeadLetterCommand::Purge { which, dry_run, .. } => (Op::Purge, which, dry_run, true),
    };
    let now = now();
    let (since, until) = a.time_range(now).map_err(usage)?;
    if let Some(actor) = &a.actor {
        known_actor(backend, actor).await?;
    }
    // The database selects by actor, recipient, reason and dead-letter time; a replay or purge
    // then acts on exactly the ids listed (what a dry run prints), never on a dead letter
    // that arrived since; one replayed or purged meanwhile by someone else is skipped.
    let filter = DeadLetterFilter {
        actor: a.actor.as_deref().map(ActorId::new),
        recipient: a.recipient.clone(),
        reason: a.reason,
        since,
        until,
    };
    let mut listed = backend
        .select_dead_letters(DeadLetterSelection::Matching(filter))
        .await?;
    if !a.ids.is_empty() {
        // Every id given must be a dead letter (of the actor given), whether or not the other
        // selectors keep it.
        let ids = a.ids.iter().map(|&i| DeadLetterId(i)).collect();
        let known: BTreeSet<i64> = backend
            .select_dead_letters(DeadLetterSelection::Ids(ids))
            .await?
            .iter()
            .filter(|d| a.actor.as_deref().is_none_or(|x| d.actor.as_str() == x))
            .map(|d| d.id.0)
            .collect();
        if let Some(missing) = a.ids.iter().find(|i| !known.contains(i)) {
            return Err(usage(format!(
                "no dead letter with id {missing}{}",
                a.actor
                    .as_deref()
                    .map(|x| format!(" for actor {x:?}"))
                    .unwrap_or_default()
            )));
        }
        listed.retain(|d| a.ids.contains(&d.id.0));
    }
    // --older-than is counted here, from the same `now` as a duration ago in the range.
    if let Some(age) = a.older_than {
        listed.retain(|d| now.saturating_duration_since(d.dead_at) >= age);
    }
    // A replay leaves out what the recipients already have, unless asked (list and purge
    // keep them).
    let skipped = if include_delivered {
        0
    } else {
        leave_out_delivered(&mut listed)
    };
    let selection = vec![DeadLetterSelection::Ids(
        listed.iter().map(|d| DeadLetterId(d.id.0)).collect(),
    )];
    match op {
        Op::List => {
            if a.json {
                print_json(&output::dead_json(&listed))
            } else {
                print(&output::dead_table(&listed))
            }
        }
        Op::Replay | Op::Purge if dry_run => {
            let verb = if matches!(op, Op::Replay) {
                "replay"
            } else {
                "purge"
            };
            if a.json {
                print_json(&output::dead_dry_run_json(
                    matches!(op, Op::Replay).then_some(skipped),
                    &listed,
                ))
            } else {
                print(&format!(
                    "dry run: would {verb} {} dead letter(s); nothing changed\n{}{}",
                    listed.len(),
                    output::skipped_delivered_text(skipped),
                    if listed.is_empty() {
                        String::new()
                    } else {
                        output::dead_table(&listed)
                    }
                ))
            }
        }
        Op::Replay => {
            let units = if listed.is_empty() {
                Vec::new()
            } else {
                backend.replay(selection).await?
            };
            if a.json {
                print_json(&serde_json::json!({
                    "replayed": units.len(),
                    "units": units.iter().map(|u| u.0).collect::<Vec<_>>(),
                    "skipped_delivered": skipped,
                }))
            } else {
                print(&format!(
                    "replayed {} dead letter(s) to the tail of their lanes; `drain` or a relay delivers them\n{}",
                    units.len(),
                    output::skipped_delivered_text(skipped)
                ))
            }
        }
        Op::Purge => {
            let n = if listed.is_empty() {
                0
            } else {
                backend.purge(selection).await?
            };
            if a.json {
                print_json(&serde_json::json!({ "purged": n }))
            } else {
                print(&format!("purged {n} dead letter(s)\n"))
            }
        }
    }
}

/// Leaves out of a replay's selection the dead letters whose recipients already have them
/// (`dead-letters replay`, the dashboard's preview); how many it left out.
pub(crate) fn leave_out_delivered(selected: &mut Vec<outbox_lanes_store::DeadLetter>) -> usize {
    let before = selected.len();
    selected.retain(|d| !d.delivered_after_set_aside());
    before - selected.len()
}

/// The attempts a stop cut off, as its message says them: `2 attempt(s)`, or `attempts` when
/// the count is not known (a pass still writing its hand-back when the stop gave up on it).
fn attempts_cut(n: u64) -> String {
    if n == 0 {
        "attempts".to_owned()
    } else {
        format!("{n} attempt(s)")
    }
}

/// The system clock, as the store's times.
fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// `dead-letters show --id N`: the dead letter and its payload.
async fn cmd_dead_letter_show(backend: &Backend, id: i64, json: bool) -> anyhow::Result<()> {
    let missing = || usage(format!("no dead letter with id {id}"));
    let Some(d) = backend
        .dead_letters(None)
        .await?
        .into_iter()
        .find(|d| d.id.0 == id)
    else {
        return Err(missing());
    };
    let payload = match backend.dead_letter_payload(DeadLetterId(id)).await {
        Ok(p) => p,
        // Replayed or purged since it was listed.
        Err(e)
            if e.downcast_ref::<outbox_lanes_store::StoreError>()
                .is_some_and(|e| matches!(e, outbox_lanes_store::StoreError::NotFound { .. })) =>
        {
            return Err(missing());
        }
        Err(e) => return Err(e),
    };
    let history = rows::dead_letter_history(backend, &d).await?;
    if json {
        #[derive(serde::Serialize)]
        struct WithHistory<S, H> {
            #[serde(flatten)]
            show: S,
            attempt_history: H,
        }
        print_json(&WithHistory {
            show: output::dead_show_json(&d, &payload),
            attempt_history: rows::history_json(&history),
        })
    } else {
        let mut text = output::dead_show_text(&d, &payload);
        text.push_str("\nattempt history (delivery log)\n");
        text.push_str(&rows::history_text(&history));
        print(&text)
    }
}

/// SIGINT and SIGTERM, registered before any work starts.
pub(crate) struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for the first signal; returns its name.
    async fn wait(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}
