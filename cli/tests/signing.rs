//! Signing from the `outbox-lanes` binary: `--signing-keys` (HTTP Signatures) and
//! `--webhook-secret` (Standard Webhooks), against real HTTP recipients on 127.0.0.1 and a
//! real SQLite file (Postgres too when `OUTBOX_LANES_TEST_PG` is set). Every request is
//! checked by verifiers independent of the signer: test-support's, written from the
//! draft-cavage spec, and two we did not write, `sigh` (draft-cavage, over OpenSSL) and
//! `httpsig-hyper` (RFC 9421); the Standard Webhooks receiver's `verify`.
//!
//! Every wait is bounded; assertions are about outcomes and orders, never durations.
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_lanes::tokio::sign::StandardWebhooks;
use outbox_lanes_test_support::signatures::{
    ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PRIVATE_PKCS1, BOB_PUBLIC, CAROL_ED25519_PRIVATE,
    CAROL_ED25519_PUBLIC, P256_PRIVATE_PKCS8, verify_http_signature,
};
use outbox_lanes_test_support::{Recipient, Reply, verifiers};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
const RUN_BOUND: Duration = Duration::from_secs(120);
const ALICE: &str = "https://social.example/users/alice";
const BOB: &str = "https://social.example/users/bob";
/// An actor with an Ed25519 key.
const ERIN: &str = "https://social.example/users/erin";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A SQLite file or a fresh Postgres schema, with a directory for the keys file.
struct Db {
    dir: tempfile::TempDir,
    args: Vec<String>,
    pg: Option<(String, String)>,
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.db").display().to_string();
        Db {
            dir,
            args: vec!["--db".into(), path],
            pg: None,
        }
    }

    fn postgres() -> Option<Db> {
        let url = outbox_lanes_test_support::pg_url()?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let schema = format!("ol_sign_{}_{nanos}", std::process::id());
        Some(Db {
            dir: tempfile::tempdir().unwrap(),
            args: vec![
                "--db".into(),
                url.clone(),
                "--pg-schema".into(),
                schema.clone(),
            ],
            pg: Some((url, schema)),
        })
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.pg {
            if let Ok(mut c) = postgres::Client::connect(url, postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

struct Out {
    status: ExitStatus,
    stderr: String,
}

/// Runs the binary with `env` set (and the signing variables otherwise unset).
fn run_env(db: &Db, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Out {
    let mut c = Command::new(BIN);
    c.args(&db.args)
        .args(args)
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("RUST_LOG", "info")
        .env_remove("OUTBOX_LANES_WEBHOOK_SECRET")
        .env_remove("OUTBOX_LANES_SIGNING_KEYS")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let o = std::thread::spawn(move || {
        let _ = out.read_to_end(&mut Vec::new());
    });
    let deadline = Instant::now() + RUN_BOUND;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("outbox-lanes did not exit within {RUN_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    o.join().unwrap();
    Out {
        status,
        stderr: e.join().unwrap(),
    }
}

fn run(db: &Db, args: &[&str], stdin: &str) -> Out {
    run_env(db, args, &[], stdin)
}

fn ok(out: Out, what: &str) -> Out {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", out.stderr);
    out
}

fn enqueue(db: &Db, actor: &str, id: &str, to: &str) {
    let line = serde_json::json!({ "id": id, "to": [to], "body": { "id": id } }).to_string();
    ok(
        run(db, &["enqueue", "--actor", actor], &(line + "\n")),
        "enqueue",
    );
}

/// A keys file: alice's RSA key in a file beside it (relative path), bob's inline, erin's
/// Ed25519 key in a file (the PEM alone says it is Ed25519).
fn keys_file(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("alice.pem"), ALICE_PRIVATE_PKCS8).unwrap();
    std::fs::write(dir.join("erin.pem"), CAROL_ED25519_PRIVATE).unwrap();
    let file = dir.join("signing-keys.toml");
    std::fs::write(
        &file,
        format!(
            "[actors.\"{ALICE}\"]\nkey_id = \"{ALICE}#main-key\"\nprivate_key_file = \"alice.pem\"\n\n\
             [actors.\"{BOB}\"]\nkey_id = \"{BOB}#main-key\"\nprivate_key_pem = \"\"\"\n{BOB_PRIVATE_PKCS1}\"\"\"\n\n\
             [actors.\"{ERIN}\"]\nkey_id = \"{ERIN}#ed25519-key\"\nprivate_key_file = \"erin.pem\"\n"
        ),
    )
    .unwrap();
    file
}

fn date_secs(date: &str) -> u64 {
    httpdate::parse_http_date(date)
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn http_signatures(db: &Db) {
    let r = Recipient::start().unwrap();
    // Alice's first attempt is refused after 1.1 s, and its retry comes at least the retry
    // delay (1 s less 20 % jitter) later: the two Dates (whole seconds) differ.
    r.script(
        "/inbox/a",
        [Reply::Status(503).after(Duration::from_millis(1100))],
    );
    let keys = keys_file(db.dir.path());
    enqueue(db, ALICE, "a0", &r.url("/inbox/a"));
    enqueue(db, BOB, "b0", &r.url("/inbox/b"));
    enqueue(db, ERIN, "e0", &r.url("/inbox/e"));
    let before = SystemTime::now();
    let keys = keys.display().to_string();
    // draft-cavage as the verifier here checks it (`auto` would knock with RFC 9421 first).
    let out = ok(
        run(
            db,
            &[
                "drain",
                "--signing-keys",
                &keys,
                "--signature-spec",
                "cavage",
            ],
            "",
        ),
        "drain",
    );
    // The keys loaded are logged at start, by id and algorithm; the keys never are.
    for (actor, key_id, alg) in [
        (ALICE, format!("{ALICE}#main-key"), "rsa-v1_5-sha256"),
        (ERIN, format!("{ERIN}#ed25519-key"), "ed25519"),
    ] {
        assert!(
            out.stderr.lines().any(|l| l.contains("signing key loaded")
                && l.contains(actor)
                && l.contains(&key_id)
                && l.contains(alg)),
            "no start line for {actor}'s key:\n{}",
            out.stderr
        );
    }
    assert!(!out.stderr.contains("PRIVATE KEY"), "{}", out.stderr);
    let after = SystemTime::now();

    let a = r.requests("/inbox/a");
    assert_eq!(a.len(), 2, "alice: 503, then 200");
    let mut dates = Vec::new();
    for req in &a {
        let v = verify_http_signature(req, ALICE_PUBLIC).unwrap();
        assert_eq!(v.key_id, format!("{ALICE}#main-key"));
        let d = date_secs(&v.date);
        assert!(
            unix_secs(before) <= d && d <= unix_secs(after),
            "{}",
            v.date
        );
        dates.push(d);
        let theirs = verifiers::cavage(req, ALICE_PUBLIC).unwrap();
        assert_eq!((theirs.key_id, theirs.date), (v.key_id, v.date));
        let mut tampered = req.clone();
        tampered.body = br#"{"id":"forged"}"#.to_vec();
        assert!(verify_http_signature(&tampered, ALICE_PUBLIC).is_err());
        assert!(verifiers::cavage(&tampered, ALICE_PUBLIC).is_err());
    }
    assert!(dates[0] < dates[1], "a fresh Date on the retry: {dates:?}");
    let b = r.requests("/inbox/b");
    assert_eq!(b.len(), 1);
    assert_eq!(
        verify_http_signature(&b[0], BOB_PUBLIC).unwrap().key_id,
        format!("{BOB}#main-key")
    );
    assert!(verify_http_signature(&b[0], ALICE_PUBLIC).is_err());
    verifiers::cavage(&b[0], BOB_PUBLIC).unwrap();
    // Erin's Ed25519 key signs draft-cavage as hs2019.
    let e = r.requests("/inbox/e");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].header("signature")
            .unwrap()
            .contains("algorithm=\"hs2019\"")
    );
    let v = verifiers::cavage(&e[0], CAROL_ED25519_PUBLIC).unwrap();
    assert_eq!(v.key_id, format!("{ERIN}#ed25519-key"));
    let mut tampered = e[0].clone();
    tampered.body = br#"{"id":"forged"}"#.to_vec();
    assert!(verifiers::cavage(&tampered, CAROL_ED25519_PUBLIC).is_err());
}

/// RFC 9421 through the binary: every attempt verifies with httpsig (RSA and Ed25519), a
/// changed body does not (its Content-Digest), and a retry is signed with a fresh `created`.
fn rfc9421(db: &Db) {
    let r = Recipient::start().unwrap();
    // Alice's retry comes at least the retry delay (1 s less 20 % jitter) after her first
    // attempt is refused 1.1 s in: the two `created` (whole seconds) differ.
    r.script(
        "/inbox/a",
        [Reply::Status(503).after(Duration::from_millis(1100))],
    );
    let keys = keys_file(db.dir.path()).display().to_string();
    enqueue(db, ALICE, "a0", &r.url("/inbox/a"));
    enqueue(db, ERIN, "e0", &r.url("/inbox/e"));
    let before = unix_secs(SystemTime::now());
    ok(
        run(
            db,
            &[
                "drain",
                "--signing-keys",
                &keys,
                "--signature-spec",
                "rfc9421",
            ],
            "",
        ),
        "drain",
    );
    let after = unix_secs(SystemTime::now());
    let a = r.requests("/inbox/a");
    assert_eq!(a.len(), 2, "alice: 503, then 200");
    let mut created = Vec::new();
    for (path, public, key_id, alg) in [
        (
            "/inbox/a",
            ALICE_PUBLIC,
            format!("{ALICE}#main-key"),
            "rsa-v1_5-sha256",
        ),
        (
            "/inbox/e",
            CAROL_ED25519_PUBLIC,
            format!("{ERIN}#ed25519-key"),
            "ed25519",
        ),
    ] {
        for req in r.requests(path) {
            let v = verifiers::rfc9421(&req, public).unwrap();
            assert_eq!(
                v.components,
                ["\"@method\"", "\"@target-uri\"", "\"content-digest\""]
            );
            assert_eq!(v.keyid.as_deref(), Some(key_id.as_str()));
            assert_eq!(v.alg.as_deref(), Some(alg));
            let at = v.created.unwrap();
            assert!(before <= at && at <= after, "{at}");
            if path == "/inbox/a" {
                created.push(at);
            }
            let mut tampered = req.clone();
            tampered.body = br#"{"id":"forged"}"#.to_vec();
            let err = verifiers::rfc9421(&tampered, public).unwrap_err();
            assert!(err.contains("Content-Digest"), "{err}");
        }
    }
    assert!(
        created[0] < created[1],
        "a fresh created on the retry: {created:?}"
    );
}

#[test]
fn signature_spec_rfc9421_signs_each_attempt_with_the_actors_key() {
    rfc9421(&Db::sqlite());
}

#[test]
fn signature_spec_rfc9421_on_postgres() {
    if let Some(db) = Db::postgres() {
        rfc9421(&db);
    }
}

#[test]
fn signing_keys_sign_each_attempt_with_the_actors_key() {
    http_signatures(&Db::sqlite());
}

#[test]
fn signing_keys_on_postgres() {
    if let Some(db) = Db::postgres() {
        http_signatures(&db);
    }
}

#[test]
fn webhook_secret_from_the_environment_signs_each_attempt() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    r.script("/hook", [Reply::Status(503)]);
    enqueue(&db, "shop", "e0", &r.url("/hook"));
    ok(
        run_env(
            &db,
            &["drain"],
            &[("OUTBOX_LANES_WEBHOOK_SECRET", SECRET)],
            "",
        ),
        "drain",
    );
    let reqs = r.requests("/hook");
    assert_eq!(reqs.len(), 2, "503, then 200");
    let receiver = StandardWebhooks::from_whsec(SECRET).unwrap();
    let now = SystemTime::now();
    for req in &reqs {
        let (id, ts, sig) = (
            req.header("webhook-id").unwrap(),
            req.header("webhook-timestamp").unwrap(),
            req.header("webhook-signature").unwrap(),
        );
        assert_eq!(req.header("idempotency-key"), Some(id));
        receiver
            .verify(id, ts, sig, &req.body, now, Duration::from_secs(60))
            .unwrap();
        assert!(
            receiver
                .verify(
                    id,
                    ts,
                    sig,
                    b"{\"id\":\"forged\"}",
                    now,
                    Duration::from_secs(60)
                )
                .is_err()
        );
    }
}

/// A refused run: its arguments, its environment, and what its error must say.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, Vec<&'a str>);

#[test]
fn bad_signing_input_exits_2_before_anything_is_sent() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    enqueue(&db, ALICE, "a0", &r.url("/inbox/a"));
    enqueue(
        &db,
        "https://social.example/users/carol",
        "c0",
        &r.url("/inbox/c"),
    );
    let dir = db.dir.path();
    let keys = keys_file(dir).display().to_string();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "[actors.\"{ALICE}\"]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PUBLIC}\"\"\"\n\
             [actors.\"{BOB}\"]\nprivate_key_file = \"nowhere.pem\"\n\
             [actors.\"{ERIN}\"]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{P256_PRIVATE_PKCS8}\"\"\"\n"
        ),
    )
    .unwrap();
    let bad = bad.display().to_string();
    let missing = dir.join("missing.toml").display().to_string();
    let cases: Vec<Case<'_>> = vec![
        (
            vec!["drain", "--webhook-secret", "whsec_***"],
            vec![],
            vec!["--webhook-secret", "base64"],
        ),
        (
            vec!["relay"],
            vec![("OUTBOX_LANES_WEBHOOK_SECRET", "not base64!")],
            vec!["OUTBOX_LANES_WEBHOOK_SECRET"],
        ),
        (
            vec!["drain", "--signing-keys", &missing],
            vec![],
            vec!["cannot read the signing keys file", "missing.toml"],
        ),
        (
            vec!["drain"],
            vec![("OUTBOX_LANES_SIGNING_KEYS", &bad)],
            vec![
                "bad entries",
                "public key",
                "key_id is missing",
                "users/bob",
                "users/erin",
                "not RSA or Ed25519",
            ],
        ),
        (
            // Carol has units but no key: refused, alice's units are not sent either.
            vec!["drain", "--signing-keys", &keys],
            vec![],
            vec!["no signing key", "users/carol", "nothing delivered"],
        ),
        (
            vec!["relay", "--signing-keys", &keys],
            vec![],
            vec!["no signing key", "users/carol"],
        ),
        (
            vec!["drain", "--signing-keys", &keys, "--webhook-secret", SECRET],
            vec![],
            vec!["cannot be used with"],
        ),
    ];
    for (args, env, said) in cases {
        let out = run_env(&db, &args, &env, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        for s in said {
            assert!(
                out.stderr.contains(s),
                "{args:?}: {s:?} not in {}",
                out.stderr
            );
        }
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        assert!(!out.stderr.contains("PRIVATE KEY"), "{}", out.stderr);
    }
    // The secret is not echoed back.
    let out = run_env(
        &db,
        &["drain"],
        &[("OUTBOX_LANES_WEBHOOK_SECRET", "whsec_s3cr3t*")],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!out.stderr.contains("s3cr3t"), "{}", out.stderr);
    assert_eq!(r.count_all(), 0, "nothing was delivered");

    // Commands that do not deliver ignore the signing settings.
    ok(
        run_env(&db, &["status"], &[("OUTBOX_LANES_SIGNING_KEYS", &bad)], ""),
        "status",
    );
    // Limited to alice (--actor), only she is checked: she has a key.
    ok(
        run(
            &db,
            &["drain", "--actor", ALICE, "--signing-keys", &keys],
            "",
        ),
        "drain alice",
    );
    assert_eq!(r.count("/inbox/a"), 1);
    // The default, `auto`, signs RFC 9421 first (this recipient accepts it).
    verifiers::rfc9421(&r.requests("/inbox/a")[0], ALICE_PUBLIC).unwrap();
    assert_eq!(r.count("/inbox/c"), 0);
}
