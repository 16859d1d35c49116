//! Standard Webhooks secrets per customer from the `outbox-lanes` binary (issue 41, items 1
//! and 5): `--webhook-secrets FILE` (a secrets file per actor and per endpoint, rotation,
//! read again without a restart) and `--webhook-secret` (one secret, or a rotation, for
//! all), with the default settings, real recipients on 127.0.0.1 and a real SQLite file.
//!
//! Every request is checked by a Standard Webhooks verifier we did not write: the Python
//! `standardwebhooks` package (PyPI; `.ci/run` installs it), run as `python3`. A request must
//! verify with its own customer's secret and fail with every other one.
//!
//! Every wait is bounded; assertions are about outcomes, never durations.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{Db, collect, eventually, row, wait_bounded};
use outbox_lanes_test_support::{Recipient, Recorded};

/// A valid secret: `whsec_` and the base64 of 32 bytes of `n`.
fn whsec(n: u8) -> String {
    format!("whsec_{}", BASE64.encode([n; 32]))
}

/// Verifies with the Python `standardwebhooks` package: for each secret, whether each
/// request verifies (its `Webhook(secret).verify(body, headers)`).
fn python_verifies(secrets: &[&str], requests: &[Recorded]) -> Vec<Vec<bool>> {
    const SCRIPT: &str = r#"
import base64, json, sys
from standardwebhooks import Webhook, WebhookVerificationError
given = json.load(sys.stdin)
out = []
for secret in given["secrets"]:
    hook = Webhook(secret)
    row = []
    for r in given["requests"]:
        try:
            hook.verify(base64.b64decode(r["body"]), r["headers"], json_parse=False)
            row.append(True)
        except WebhookVerificationError:
            row.append(False)
    out.append(row)
print(json.dumps(out))
"#;
    let input = serde_json::json!({
        "secrets": secrets,
        "requests": requests.iter().map(|q| serde_json::json!({
            "headers": q.headers.iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>(),
            "body": BASE64.encode(&q.body),
        })).collect::<Vec<_>>(),
    });
    let child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3, the verifier, cannot run: {e}"));
    let out = collect(child, &input.to_string());
    assert_eq!(
        out.code(),
        Some(0),
        "the Python standardwebhooks verifier failed (install it: python3 -m pip install \
         standardwebhooks; .ci/run does): {}",
        out.stderr
    );
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// Asserts that every request of `requests` verifies with each secret of `good` and with no
/// secret of `bad`, and carries one `webhook-signature` header with a signature per secret
/// the sender holds (`signatures`).
fn assert_signed(requests: &[Recorded], good: &[&str], bad: &[&str], signatures: usize) {
    assert!(!requests.is_empty(), "no request to check");
    for q in requests {
        let sig = q.header_all("webhook-signature");
        assert_eq!(sig.len(), 1, "{:?}", q.headers);
        assert_eq!(
            sig[0].split(' ').filter(|s| s.starts_with("v1,")).count(),
            signatures,
            "{}",
            sig[0]
        );
    }
    let all: Vec<&str> = good.iter().chain(bad).copied().collect();
    let verdicts = python_verifies(&all, requests);
    for (secret, row) in all.iter().zip(verdicts) {
        let want = good.contains(secret);
        for (q, got) in requests.iter().zip(row) {
            assert_eq!(
                got,
                want,
                "{} {}: verifies with secret {}…: {got}, expected {want}",
                q.path,
                String::from_utf8_lossy(&q.body),
                &secret[..12]
            );
        }
    }
}

/// Writes a secrets file (mode 0600).
fn write_secrets(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    // Written whole, then renamed over the file, as editors and secret volumes do: the relay
    // never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An entry for `actor` with `secrets`.
fn entry(actor: &str, secrets: &[&str]) -> String {
    let list: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
    format!("[actors.\"{actor}\"]\nsecrets = [{}]\n", list.join(", "))
}

/// Enqueues one row `id` for `actor` to `to`.
fn enqueue(db: &Db, actor: &str, id: &str, to: &str) {
    db.enqueue_lines(actor, &[row(id, to)]);
}

/// A relay with `env`, whose stderr lines are read as they come, that can be signalled.
struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl Running {
    fn start(db: &Db, env: &[(&str, &str)]) -> Running {
        let mut child = db
            .command(&["relay"])
            .env_remove("OUTBOX_LANES_WEBHOOK_SECRETS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                into.lock().unwrap().push(line);
            }
        });
        Running {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// How many stderr lines contain `text`.
    fn count(&self, text: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .count()
    }

    /// Waits (bounded) until `n` stderr lines contain `text`.
    fn wait_for(&self, text: &str, n: usize) {
        assert!(
            eventually(|| self.count(text) >= n),
            "not {n} stderr lines with {text:?}:\n{}",
            self.lines.lock().unwrap().join("\n")
        );
    }

    /// SIGTERM; the exit status and every stderr line.
    fn stop(mut self) -> (ExitStatus, Vec<String>) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = wait_bounded(&mut self.child);
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        (status, lines)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits (bounded) until `path` of `r` has had `n` requests answered 2xx.
fn wait_delivered(r: &Recipient, path: &str, n: usize) {
    assert!(
        eventually(|| common::arrived(r, path).len() >= n),
        "{path}: {} of {n} delivered",
        common::arrived(r, path).len()
    );
}

#[test]
fn two_customers_each_verify_with_their_own_secrets_and_fail_with_the_others() {
    let db = Db::new();
    let (one, two) = (Recipient::start().unwrap(), Recipient::start().unwrap());
    let (a, b, b_orders) = (whsec(1), whsec(2), whsec(3));
    let file = db.path("webhook-secrets.toml");
    write_secrets(
        &file,
        &format!(
            "{}{}[actors.\"shop-b\".recipients.\"{}\"]\nsecrets = [\"{b_orders}\"]\n",
            entry("shop-a", &[&a]),
            entry("shop-b", &[&b]),
            // Another spelling of the endpoint's URL: matched on its canonical form.
            two.url("/orders").replace("http://", "HTTP://")
        ),
    );
    for i in 0..3 {
        enqueue(&db, "shop-a", &format!("a{i}"), &one.url("/hook"));
        enqueue(&db, "shop-b", &format!("b{i}"), &two.url("/hook"));
        enqueue(&db, "shop-b", &format!("o{i}"), &two.url("/orders"));
    }
    let secrets = file.display().to_string();
    let relay = Running::start(&db, &[("OUTBOX_LANES_WEBHOOK_SECRETS", &secrets)]);
    wait_delivered(&one, "/hook", 3);
    wait_delivered(&two, "/hook", 3);
    wait_delivered(&two, "/orders", 3);
    let (status, lines) = relay.stop();
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));

    assert_signed(&one.requests("/hook"), &[&a], &[&b, &b_orders], 1);
    assert_signed(&two.requests("/hook"), &[&b], &[&a, &b_orders], 1);
    assert_signed(&two.requests("/orders"), &[&b_orders], &[&a, &b], 1);
    // No secret in the logs.
    let logs = lines.join("\n");
    for s in [&a, &b, &b_orders] {
        assert!(!logs.contains(&s[6..]), "{logs}");
    }
}

#[test]
fn rotation_and_file_changes_take_effect_without_a_restart() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    let (old, new, c) = (whsec(10), whsec(11), whsec(12));
    let file = db.path("webhook-secrets.toml");
    write_secrets(&file, &entry("shop-a", &[&old]));
    let secrets = file.display().to_string();
    let relay = Running::start(&db, &[("OUTBOX_LANES_WEBHOOK_SECRETS", &secrets)]);
    let mut sent = 0;
    let mut send = |db: &Db| {
        sent += 1;
        enqueue(db, "shop-a", &format!("a{sent}"), &r.url("/a"));
        wait_delivered(&r, "/a", sent);
        r.requests("/a").pop().unwrap()
    };
    assert_signed(&[send(&db)], &[&old], &[&new, &c], 1);

    // A customer the file does not know yet: its unit is kept, never sent unsigned.
    enqueue(&db, "shop-c", "c1", &r.url("/c"));
    relay.wait_for("request not sent: it could not be signed", 1);
    assert_eq!(r.count("/c"), 0);

    // A rotation, and shop-c added, read on SIGHUP: both of shop-a's secrets verify.
    write_secrets(
        &file,
        &format!(
            "{}{}",
            entry("shop-a", &[&old, &new]),
            entry("shop-c", &[&c])
        ),
    );
    relay.signal(nix::sys::signal::Signal::SIGHUP);
    relay.wait_for("SIGHUP: webhook secrets read again", 1);
    assert_signed(&[send(&db)], &[&old, &new], &[&c], 2);
    wait_delivered(&r, "/c", 1);
    assert_signed(&r.requests("/c"), &[&c], &[&old, &new], 1);

    // The rotation done, without a signal: once the relay has seen the change (its signer
    // looks at the file every few seconds), only the new secret verifies.
    write_secrets(
        &file,
        &format!("{}{}", entry("shop-a", &[&new]), entry("shop-c", &[&c])),
    );
    let mut seen = false;
    for _ in 0..100 {
        let q = send(&db);
        if python_verifies(&[&old], std::slice::from_ref(&q))[0][0] {
            continue;
        }
        seen = true;
        break;
    }
    assert!(seen, "the change was never seen");
    relay.wait_for(
        "the webhook secrets file changed: its secrets sign from now on",
        1,
    );
    let later: Vec<Recorded> = (0..3).map(|_| send(&db)).collect();
    assert_signed(&later, &[&new], &[&old, &c], 1);

    // A file that does not parse (a 5-byte secret) keeps the secrets before: nothing is
    // sent unsigned or with a secret dropped.
    write_secrets(&file, &entry("shop-a", &["whsec_aGVsbG8="]));
    relay.signal(nix::sys::signal::Signal::SIGHUP);
    relay.wait_for("SIGHUP: the webhook secrets file cannot be used", 1);
    assert_signed(&[send(&db)], &[&new], &[&old, &c], 1);

    let (status, lines) = relay.stop();
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));
    let logs = lines.join("\n");
    assert!(logs.contains("5 bytes long once decoded"), "{logs}");
    for s in [&old, &new, &c] {
        assert!(!logs.contains(&s[6..]), "{logs}");
    }
    assert!(!logs.contains("aGVsbG8"), "{logs}");
}

#[test]
fn one_secret_for_all_takes_a_rotation() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    let (old, new) = (whsec(20), whsec(21));
    enqueue(&db, "shop-a", "a0", &r.url("/a"));
    enqueue(&db, "shop-b", "b0", &r.url("/b"));
    for (i, joined) in [format!("{old} {new}"), format!("{old},{new}")]
        .iter()
        .enumerate()
    {
        let out = collect(
            db.command(&["drain"])
                .env("OUTBOX_LANES_WEBHOOK_SECRET", joined)
                .spawn()
                .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        if i == 0 {
            enqueue(&db, "shop-a", "a1", &r.url("/a"));
            enqueue(&db, "shop-b", "b1", &r.url("/b"));
        }
    }
    let all: Vec<Recorded> = ["/a", "/b"].iter().flat_map(|p| r.requests(p)).collect();
    assert_eq!(all.len(), 4);
    assert_signed(&all, &[&old, &new], &[&whsec(22)], 2);
}

/// A refused start: its arguments, its environment, and what its error must say.
type Case = (Vec<String>, Vec<(&'static str, String)>, Vec<&'static str>);

#[test]
fn a_short_or_bare_secret_is_refused_at_start_with_one_line() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    enqueue(&db, "shop-a", "a0", &r.url("/a"));
    let file = |name: &str, text: &str| -> String {
        let path: PathBuf = db.path(name);
        write_secrets(&path, text);
        path.display().to_string()
    };
    let five = "whsec_aGVsbG8=";
    let bare = whsec(30)[6..].to_owned();
    let short_file = file("short.toml", &entry("shop-a", &[five]));
    let bare_file = file("bare.toml", &entry("shop-a", &[&bare]));
    let other_file = file("other.toml", &entry("shop-b", &[&whsec(31)]));
    let config = file(
        "config.toml",
        &format!("webhook-secret = \"{}\"\n", whsec(32)),
    );
    let s = |x: &str| x.to_owned();
    let cases: Vec<Case> = vec![
        (
            vec![s("drain"), s("--webhook-secret"), s(five)],
            vec![],
            vec!["--webhook-secret", "5 bytes long", "24 to 64 bytes"],
        ),
        (
            vec![s("relay")],
            vec![("OUTBOX_LANES_WEBHOOK_SECRET", bare.clone())],
            vec![
                "OUTBOX_LANES_WEBHOOK_SECRET",
                "not written `whsec_<base64>`",
            ],
        ),
        (
            // The second secret of a rotation is checked as the first.
            vec![s("drain")],
            vec![(
                "OUTBOX_LANES_WEBHOOK_SECRET",
                format!("{} {five}", whsec(33)),
            )],
            vec!["5 bytes long"],
        ),
        (
            vec![s("relay"), s("--webhook-secrets"), short_file.clone()],
            vec![],
            vec![
                "--webhook-secrets",
                "short.toml",
                "[actors.\"shop-a\"]: secrets[0]: the webhook secret is 5 bytes long",
            ],
        ),
        (
            vec![s("drain")],
            vec![("OUTBOX_LANES_WEBHOOK_SECRETS", bare_file)],
            vec!["bare.toml", "not written `whsec_<base64>`"],
        ),
        (
            vec![s("--config"), config, s("relay")],
            vec![("OUTBOX_LANES_WEBHOOK_SECRETS", other_file.clone())],
            vec!["exclude each other"],
        ),
    ];
    for (args, env, said) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = collect(
            db.command(&args)
                .env_remove("OUTBOX_LANES_WEBHOOK_SECRETS")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .spawn()
                .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {}", out.stderr);
        assert!(lines[0].starts_with("error: "), "{}", lines[0]);
        for text in said {
            assert!(
                lines[0].contains(text),
                "{args:?}: {text:?} not in {}",
                lines[0]
            );
        }
        for secret in ["aGVsbG8", &bare[..20], &whsec(32)[6..20], &whsec(33)[6..20]] {
            assert!(!out.stderr.contains(secret), "{}", out.stderr);
        }
    }
    // Both flags on the command line: clap's own refusal (with its usage lines).
    let out = collect(
        db.command(&[
            "drain",
            "--webhook-secrets",
            &short_file,
            "--webhook-secret",
            &whsec(34),
        ])
        .spawn()
        .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.starts_with("error: ") && out.stderr.contains("cannot be used with"));
    assert!(!out.stderr.contains(&whsec(34)[6..20]), "{}", out.stderr);
    // A file without the actor that has work: refused too (after the file is read).
    let out = collect(
        db.command(&["drain", "--webhook-secrets", &other_file])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("error: no webhook secret in ")
            && out.stderr.contains("for \"shop-a\"")
            && out.stderr.contains("add [actors.\"shop-a\"]"),
        "{}",
        out.stderr
    );
    assert_eq!(r.count_all(), 0, "nothing was delivered");
    assert_eq!(db.json(&["status", "--json"])["actors"][0]["pending"], 1);
}
