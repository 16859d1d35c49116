//! What the `outbox-lanes` binary keeps to itself: `relay --on-dead-letter` commands run in a
//! process group of their own that goes at stop, without the relay's secrets in their
//! environment, their output logged as the relay's own lines; no password of a database URL,
//! no line of a bad TOML file in any message; config and key files read only when they are
//! small regular files, a key file others can read warned about.
//!
//! Real SQLite files, real recipients on 127.0.0.1. Every wait is bounded; assertions are
//! about outcomes, never durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{BIN, Db, Out, Relay, collect, eventually};
use outbox_lanes_test_support::signatures::ALICE_PRIVATE_PKCS8;
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ALICE: &str = "https://social.example/users/alice";

/// A recipient that refuses every delivery for good: each row becomes a dead letter at once.
fn refusing_recipient() -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_default("/bad", Reply::Status(422));
    r
}

/// Waits (bounded) for a file the hook writes last, and returns its text.
fn written(path: &Path) -> String {
    assert!(
        eventually(|| path.exists()),
        "the hook never wrote {}",
        path.display()
    );
    std::fs::read_to_string(path).unwrap()
}

/// Whether a process runs under `pid` (a zombie waiting for its parent's reaping does not).
fn runs(pid: i32) -> bool {
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? == "Z"))
        .unwrap_or(false);
    alive && !zombie
}

#[test]
fn hook_children_are_gone_after_the_relay_stops() {
    let db = Db::new();
    let r = refusing_recipient();
    let pidfile = db.path("pid");
    let ready = db.path("ready");
    // The command's child (another shell) starts a grandchild and waits for it.
    let cmd = format!(
        "sh -c 'sleep 600 & echo $! > {p}; mv {p} {ready}; wait'",
        p = pidfile.display(),
        ready = ready.display()
    );
    let relay = Relay::start(
        &db,
        &["--shutdown-grace", "1s", "--on-dead-letter", &cmd],
        &[],
    );
    db.enqueue("ann", &r.url("/bad"));
    let pid: i32 = written(&ready).trim().parse().unwrap();
    assert!(runs(pid));
    let (status, stderr) = relay.signal();
    let gone = eventually(|| !runs(pid));
    if !gone {
        // Not left behind by a failing test either (and it may hold the relay's stderr).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let lines = stderr.lines();
    assert!(
        gone,
        "the hook's grandchild {pid} outlived the relay:\n{}",
        lines.join("\n")
    );
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("killed with their process groups")),
        "{}",
        lines.join("\n")
    );
}

#[test]
fn hooks_do_not_inherit_the_relays_secrets() {
    let db = Db::new();
    let r = refusing_recipient();
    let env = db.path("env");
    let cmd = format!("env > {e}.tmp && mv {e}.tmp {e}", e = env.display());
    let relay = Relay::start(
        &db,
        &["--on-dead-letter", &cmd],
        &[
            ("OUTBOX_LANES_WEBHOOK_SECRET", SECRET),
            // Beneath --db, which the relay uses: still the relay's, and not the command's.
            (
                "OUTBOX_LANES_DB",
                "postgres://outbox:hunter2@127.0.0.1:1/outbox",
            ),
            ("OUTBOX_LANES_HOOK_TEST", "inherited"),
        ],
    );
    db.enqueue("ann", &r.url("/bad"));
    let seen = written(&env);
    let (status, lines) = relay.stop();
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));
    // The request was signed with the secret: the relay had it.
    assert!(r.requests("/bad")[0].header("webhook-signature").is_some());
    assert!(!seen.contains("OUTBOX_LANES_WEBHOOK_SECRET"), "{seen}");
    assert!(!seen.contains(SECRET), "{seen}");
    assert!(!seen.contains("hunter2"), "{seen}");
    assert!(seen.contains("OUTBOX_LANES_HOOK_TEST=inherited"), "{seen}");
}

#[test]
fn hook_output_is_logged_as_json_lines() {
    let db = Db::new();
    let r = refusing_recipient();
    let done = db.path("done");
    let cmd = format!(
        "echo to-stdout; echo to-stderr >&2; head -c 10000 /dev/zero | tr '\\0' x; echo; \
         printf 'no newline at the end' >&2; touch {}",
        done.display()
    );
    let relay = Relay::start(
        &db,
        &["--on-dead-letter", &cmd],
        &[("OUTBOX_LANES_LOG_FORMAT", "json")],
    );
    db.enqueue("ann", &r.url("/bad"));
    written(&done);
    relay.wait_for_line("no newline at the end");
    let (status, lines) = relay.stop();
    let all = lines.join("\n");
    assert_eq!(status.code(), Some(0), "{all}");
    let logs: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{all}")))
        .collect();
    let said = |text: &str| -> &Value {
        logs.iter()
            .find(|v| {
                v["fields"]["line"]
                    .as_str()
                    .is_some_and(|l| l.starts_with(text))
            })
            .unwrap_or_else(|| panic!("no log of {text:?}:\n{all}"))
    };
    let out = said("to-stdout");
    assert_eq!(out["level"], "INFO", "{out}");
    assert_eq!(out["fields"]["command"], "echo", "{out}");
    assert_eq!(said("to-stderr")["level"], "WARN");
    assert_eq!(said("no newline at the end")["level"], "WARN");
    // The long line is cut: at most 4 KiB of it, and a marker.
    let long = said("xxx")["fields"]["line"].as_str().unwrap();
    let xs = long.chars().take_while(|&c| c == 'x').count();
    assert_eq!(xs, 4096, "{long}");
    assert!(long.len() < 4200 && long.contains("cut"), "{long}");
}

#[test]
fn a_failing_hook_is_named_by_its_program_only() {
    let db = Db::new();
    let r = refusing_recipient();
    let done = db.path("done");
    let cmd = format!(
        "TOKEN=t0k3n-secret sh -c 'touch {}; exit 3' --api-key=k3y-secret",
        done.display()
    );
    let relay = Relay::start(
        &db,
        &["--on-dead-letter", &cmd],
        &[("OUTBOX_LANES_LOG_FORMAT", "json")],
    );
    db.enqueue("ann", &r.url("/bad"));
    written(&done);
    relay.wait_for_line("the command failed");
    let (_, lines) = relay.stop();
    let all = lines.join("\n");
    let failed: Value = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["fields"]["message"] == "--on-dead-letter: the command failed")
        .unwrap();
    assert_eq!(failed["fields"]["command"], "sh", "{failed}");
    assert_eq!(failed["fields"]["command_len"], cmd.len(), "{failed}");
    assert!(!all.contains("t0k3n") && !all.contains("k3y"), "{all}");
}

#[test]
fn a_postgres_password_in_the_url_is_never_printed() {
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("postgres://outbox@127.0.0.1:{port}/outbox?password=hunter2"),
        format!(
            "postgres://outbox:hunter2@127.0.0.1:{port}/outbox?sslmode=disable&password=hunter2"
        ),
        format!("postgresql://outbox@127.0.0.1:{port}/outbox?sslpassword=hunter2"),
    ] {
        for format in ["text", "json"] {
            let out = collect(
                Command::new(BIN)
                    .args(["--db", &url, "--log-format", format, "status"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
                "",
            );
            assert_eq!(out.code(), Some(2), "{url}: {}", out.stderr);
            assert!(
                out.stderr.contains("cannot open database"),
                "{}",
                out.stderr
            );
            assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
        }
    }
}

#[test]
fn a_toml_syntax_error_does_not_print_the_line() {
    let db = Db::new();
    let config = db.path("config.toml");
    std::fs::write(
        &config,
        "concurrency = 4\nwebhook-secret = \"s3cr3t\nmax-attempts = 3\n",
    )
    .unwrap();
    let out = collect(
        db.command(&["--config", config.to_str().unwrap(), "status"])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(!out.stderr.contains("s3cr3t"), "{}", out.stderr);
    assert!(
        out.stderr.contains("--config") && out.stderr.contains("line 2"),
        "{}",
        out.stderr
    );

    // A keys file: its line would be a private key.
    let keys = db.path("keys.toml");
    std::fs::write(
        &keys,
        format!("[actors.\"{ALICE}\"]\nkey_id = \"k\"\nprivate_key_pem = \"MIIEvQ-secret\n"),
    )
    .unwrap();
    let out = collect(
        db.command(&["drain", "--signing-keys", keys.to_str().unwrap()])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(!out.stderr.contains("MIIEvQ"), "{}", out.stderr);
    assert!(out.stderr.contains("line 3"), "{}", out.stderr);
}

/// Runs the binary with its address space capped (2 GB), so that a regression that reads a
/// device without end fails instead of taking the machine's memory.
fn capped(db: &Db, args: &[&str]) -> Out {
    let mut sh = Command::new("sh");
    sh.args(["-c", "ulimit -v 2000000; exec \"$@\"", "sh", BIN]);
    collect(db.with(sh, args).spawn().unwrap(), "")
}

#[test]
fn devices_are_refused_as_config_and_key_files() {
    let db = Db::new();
    let out = capped(&db, &["--config", "/dev/zero", "status"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--config /dev/zero: not a regular file"),
        "{}",
        out.stderr
    );

    let out = capped(&db, &["drain", "--signing-keys", "/dev/zero"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("/dev/zero: not a regular file"),
        "{}",
        out.stderr
    );

    let keys = db.path("keys.toml");
    std::fs::write(
        &keys,
        format!("[actors.\"{ALICE}\"]\nkey_id = \"k\"\nprivate_key_file = \"/dev/zero\"\n"),
    )
    .unwrap();
    let out = capped(&db, &["drain", "--signing-keys", keys.to_str().unwrap()]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("cannot read private_key_file /dev/zero: not a regular file"),
        "{}",
        out.stderr
    );

    // Too large a config file.
    let big = db.path("big.toml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 << 20))).unwrap();
    let out = capped(&db, &["--config", big.to_str().unwrap(), "status"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("larger than"), "{}", out.stderr);
}

#[test]
fn a_key_file_others_can_read_is_warned_about_once() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_default("/inbox", Reply::Status(200));
    let pem = db.path("alice.pem");
    std::fs::write(&pem, ALICE_PRIVATE_PKCS8).unwrap();
    let keys = db.path("keys.toml");
    // Two actors with the same key file: one warning for it.
    std::fs::write(
        &keys,
        format!(
            "[actors.\"{ALICE}\"]\nkey_id = \"{ALICE}#main-key\"\nprivate_key_file = \"alice.pem\"\n\
             [actors.\"{ALICE}/2\"]\nkey_id = \"{ALICE}#main-key\"\nprivate_key_file = \"alice.pem\"\n"
        ),
    )
    .unwrap();
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(&keys, 0o600).unwrap();
    mode(&pem, 0o644).unwrap();
    db.enqueue(ALICE, &r.url("/inbox"));
    let drain = |expect_warnings: usize| {
        let out = collect(
            db.command(&[
                "--log-format",
                "json",
                "drain",
                "--signing-keys",
                keys.to_str().unwrap(),
            ])
            .spawn()
            .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        let warnings: Vec<Value> = out
            .stderr
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| {
                v["level"] == "WARN"
                    && v["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("readable by its group or others"))
            })
            .collect();
        assert_eq!(warnings.len(), expect_warnings, "{}", out.stderr);
        warnings
    };
    let warnings = drain(1);
    assert_eq!(warnings[0]["fields"]["file"], pem.to_str().unwrap());
    assert_eq!(warnings[0]["fields"]["mode"], "644");
    mode(&pem, 0o600).unwrap();
    drain(0);
    mode(&keys, 0o640).unwrap();
    let warnings = drain(1);
    assert_eq!(warnings[0]["fields"]["file"], keys.to_str().unwrap());
    assert_eq!(r.requests("/inbox").len(), 1);
}
