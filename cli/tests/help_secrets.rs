//! No secret in any help: with a database URL carrying a password, an `--on-dead-letter`
//! command carrying a token, a webhook secret and proxy credentials in the environment and in
//! a `--config` file, neither `--help` nor `-h` of any command prints one of them. The help
//! still names each variable (`[env: OUTBOX_LANES_DB]`) and is the same text as with a clean
//! environment and no file.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{BIN, Db, Out, collect};

/// Each secret, as the environment and the file hold it.
const SECRETS: [&str; 9] = [
    "S3CRET-DB",
    "T0KEN-DEAD-LETTER",
    "whsec_c2VjcmV0LWZyb20tdGhlLWVudg==",
    "S3CRET-PROXY",
    "S3CRET-SYSTEM-PROXY",
    "S3CRET-FILE-DB",
    "T0KEN-FILE-DEAD-LETTER",
    "whsec_c2VjcmV0LWZyb20tdGhlLWZpbGU=",
    "S3CRET-FILE-PROXY",
];

/// A proxy with credentials in the variables the binary never reads (`HTTPS_PROXY`, ...).
const SYSTEM_PROXY: &str = "http://proxy:S3CRET-SYSTEM-PROXY@127.0.0.1:3128";

const ENV: [(&str, &str); 12] = [
    ("OUTBOX_LANES_DB", "postgres://user:S3CRET-DB@127.0.0.1:1/x"),
    (
        "OUTBOX_LANES_ON_DEAD_LETTER",
        "curl -sf -H 'Authorization: Bearer T0KEN-DEAD-LETTER' https://alerts.example/dead",
    ),
    (
        "OUTBOX_LANES_WEBHOOK_SECRET",
        "whsec_c2VjcmV0LWZyb20tdGhlLWVudg==",
    ),
    (
        "OUTBOX_LANES_PROXY",
        "http://proxy:S3CRET-PROXY@127.0.0.1:3128",
    ),
    ("OUTBOX_LANES_SIGNING_KEYS", "/etc/outbox-lanes/keys.toml"),
    (
        "OUTBOX_LANES_WEBHOOK_SECRETS",
        "/etc/outbox-lanes/webhook-secrets.toml",
    ),
    ("HTTP_PROXY", SYSTEM_PROXY),
    ("HTTPS_PROXY", SYSTEM_PROXY),
    ("ALL_PROXY", SYSTEM_PROXY),
    ("http_proxy", SYSTEM_PROXY),
    ("https_proxy", SYSTEM_PROXY),
    ("all_proxy", SYSTEM_PROXY),
];

const FILE: &str = r#"db = "postgres://user:S3CRET-FILE-DB@127.0.0.1:1/x"
on-dead-letter = "curl -sf -H 'Authorization: Bearer T0KEN-FILE-DEAD-LETTER' https://alerts.example/dead"
webhook-secret = "whsec_c2VjcmV0LWZyb20tdGhlLWZpbGU="
proxy = "http://proxy:S3CRET-FILE-PROXY@127.0.0.1:3128"
signing-keys = "/etc/outbox-lanes/file-keys.toml"
webhook-secrets = "/etc/outbox-lanes/file-webhook-secrets.toml"
"#;

/// Where the secrets come from in one run of the binary.
#[derive(Clone, Copy, Debug)]
enum Source<'a> {
    /// None: a clean environment, no file.
    Clean,
    /// [`ENV`], and the file named by `OUTBOX_LANES_CONFIG`.
    EnvAndConfigVar(&'a Path),
    /// [`ENV`], and the file named by `--config` before the command.
    EnvAndConfigFlag(&'a Path),
    /// The file alone, named by `--config` (no environment).
    ConfigFlagOnly(&'a Path),
}

/// The binary with `args`, the secrets from `source`.
fn run(source: Source<'_>, args: &[String]) -> Out {
    let mut c = Command::new(BIN);
    c.env_clear();
    match source {
        Source::Clean => {
            c.args(args);
        }
        Source::EnvAndConfigVar(file) => {
            c.envs(ENV).env("OUTBOX_LANES_CONFIG", file).args(args);
        }
        Source::EnvAndConfigFlag(file) => {
            c.envs(ENV).arg("--config").arg(file).args(args);
        }
        Source::ConfigFlagOnly(file) => {
            c.arg("--config").arg(file).args(args);
        }
    }
    let child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    collect(child, "")
}

/// The subcommands a help text lists under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path (`[]`, `["relay"]`, `["lanes", "pause"]`, ...), walked from the help of
/// a clean run, so a command added later is covered without a list to update.
fn every_command() -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut queue = vec![Vec::<String>::new()];
    while let Some(command) = queue.pop() {
        let mut args = command.clone();
        args.push("--help".to_owned());
        let out = run(Source::Clean, &args);
        assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
        for sub in subcommands(&out.stdout) {
            let mut next = command.clone();
            next.push(sub);
            queue.push(next);
        }
        all.push(command);
    }
    all
}

/// Every way to ask `command` for its help: `--help`, `-h`, and `help <command>`.
fn help_asks(command: &[String]) -> Vec<Vec<String>> {
    let with = |flag: &str| {
        let mut a = command.to_vec();
        a.push(flag.to_owned());
        a
    };
    let mut help_sub = vec!["help".to_owned()];
    help_sub.extend(command.iter().cloned());
    vec![with("--help"), with("-h"), help_sub]
}

#[test]
fn no_help_prints_a_secret_from_the_environment_or_the_config_file() {
    let commands = every_command();
    let names: Vec<String> = commands.iter().map(|c| c.join(" ")).collect();
    // The walk reached the nested commands (a parser that found none would pass).
    for expected in [
        "relay",
        "status",
        "migrate",
        "hosts",
        "hosts block",
        "lanes pause",
        "dead-letters replay",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(commands.len() >= 20, "{names:?}");

    let db = Db::new();
    let file = db.path("settings.toml");
    std::fs::write(&file, FILE).unwrap();
    let asks: Vec<Vec<String>> = commands.iter().flat_map(|c| help_asks(c)).collect();

    let (mut leaks, mut changed, mut unnamed) = (Vec::new(), Vec::new(), Vec::new());
    let mut runs = 0;
    for args in &asks {
        let clean = run(Source::Clean, args);
        for source in [
            Source::EnvAndConfigVar(&file),
            Source::EnvAndConfigFlag(&file),
            Source::ConfigFlagOnly(&file),
        ] {
            let out = run(source, args);
            runs += 1;
            let text = format!("{}{}", out.stdout, out.stderr);
            for secret in SECRETS.iter().filter(|s| text.contains(**s)) {
                leaks.push(format!("{source:?} {args:?}: {secret}"));
            }
            // Nothing of the environment's or the file's values shows: the same help as
            // without them.
            if (out.code(), &out.stdout, &out.stderr)
                != (clean.code(), &clean.stdout, &clean.stderr)
            {
                changed.push(format!("{source:?} {args:?}"));
            }
        }
        // The variables are still named, without a value.
        let help = format!("{}{}", clean.stdout, clean.stderr);
        if !help.contains("[env: OUTBOX_LANES_DB]") {
            unnamed.push(format!("{args:?}: OUTBOX_LANES_DB"));
        }
        let relay = args.first().is_some_and(|a| a == "relay")
            || args
                .get(..2)
                .is_some_and(|a| a[0] == "help" && a[1] == "relay");
        if relay {
            for name in [
                "[env: OUTBOX_LANES_ON_DEAD_LETTER]",
                "[env: OUTBOX_LANES_WEBHOOK_SECRET]",
                "[env: OUTBOX_LANES_PROXY]",
                "[env: OUTBOX_LANES_SIGNING_KEYS]",
                "[env: OUTBOX_LANES_WEBHOOK_SECRETS]",
            ] {
                if !help.contains(name) {
                    unnamed.push(format!("{args:?}: {name}"));
                }
            }
        }
    }
    // Without a command, and `dead-letters` without its subcommand: the help on stderr
    // (with a variable set, clap counts it as an argument given and says only what is
    // missing, so only the secrets are looked for).
    for args in [vec![], vec!["dead-letters".to_owned()]] {
        for source in [
            Source::EnvAndConfigVar(&file),
            Source::ConfigFlagOnly(&file),
        ] {
            let out = run(source, &args);
            runs += 1;
            let text = format!("{}{}", out.stdout, out.stderr);
            assert_eq!(out.code(), Some(2), "{source:?} {args:?}: {text}");
            for secret in SECRETS.iter().filter(|s| text.contains(**s)) {
                leaks.push(format!("{source:?} {args:?}: {secret}"));
            }
        }
    }
    assert!(runs > 100, "{runs} runs");
    assert!(
        leaks.is_empty(),
        "{} secrets in the help, the first: {:#?}",
        leaks.len(),
        &leaks[..leaks.len().min(20)]
    );
    assert!(
        changed.is_empty(),
        "help that differs from a clean run's: {changed:#?}"
    );
    assert!(
        unnamed.is_empty(),
        "variables the help does not name (without a value): {unnamed:#?}"
    );
}
