//! Least privilege and trust, through the binary (issue 24): `migrate` is the only command that
//! changes a schema that exists; the read-only commands work for a user who may only read the
//! SQLite file, and for a Postgres role with SELECT only; the relay, enqueuer and reader roles
//! of `docs/privileges.md` each do what the document says, with exactly its GRANTs; the
//! idempotency keys of two databases never meet; a delivered row id enqueued again is not
//! delivered twice.
//!
//! Real SQLite files and Postgres (`OUTBOX_LANES_TEST_PG`), real HTTP recipients on 127.0.0.1.
//! Every wait is bounded; nothing asserts on a duration.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{BIN, Out, collect, eventually};
use outbox_lanes_test_support::{Recipient, Reply};

/// The roles' statements, as the operator reads them.
const PRIVILEGES_MD: &str = include_str!("../../docs/privileges.md");

/// Runs `bin` with `args` (which name the database) and `stdin`, as `user` (uid, gid) if
/// given, in a clean environment, within the common bound.
fn run_as(bin: &Path, user: Option<(u32, u32)>, args: &[&str], stdin: &str) -> Out {
    let mut c = Command::new(bin);
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("OUTBOX_LANES_TIMEOUT", "10s")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((uid, gid)) = user {
        use std::os::unix::process::CommandExt as _;
        // As root, std drops the supplementary groups too.
        c.uid(uid).gid(gid);
    }
    collect(c.spawn().unwrap(), stdin)
}

fn run(args: &[&str], stdin: &str) -> Out {
    run_as(Path::new(BIN), None, args, stdin)
}

fn ok(args: &[&str], stdin: &str) -> Out {
    let out = run(args, stdin);
    assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
    out
}

/// One JSON line per row id, each to `to`.
fn rows(ids: &[&str], to: &str) -> String {
    ids.iter()
        .map(|id| format!("{{\"id\":\"{id}\",\"to\":[\"{to}\"],\"body\":{{\"n\":\"{id}\"}}}}\n"))
        .collect()
}

fn with_db<'a>(db: &'a [String], args: &[&'a str]) -> Vec<&'a str> {
    db.iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect()
}

fn sqlite_db(path: &Path) -> Vec<String> {
    vec!["--db".into(), path.display().to_string()]
}

/// `Idempotency-Key` is `<outbox id>-<unit id>`: two databases (two services, or one created
/// again) enqueueing their first row to one receiver send different keys, and `webhook-id`
/// (Standard Webhooks) is the same key.
#[test]
fn two_databases_never_send_the_same_idempotency_key() {
    let r = Recipient::start().unwrap();
    let mut keys = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let db = sqlite_db(&dir.path().join("outbox.db"));
        ok(
            &with_db(&db, &["enqueue", "--actor", "a"]),
            &rows(&["1"], &r.url("/in")),
        );
        let out = run_as(Path::new(BIN), None, &with_db(&db, &["drain"]), "");
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        let migrate = ok(&with_db(&db, &["migrate", "--json"]), "");
        let id: serde_json::Value = serde_json::from_str(&migrate.stdout).unwrap();
        keys.push(id["outbox_id"].as_str().unwrap().to_owned());
    }
    let seen: Vec<String> = r
        .requests("/in")
        .iter()
        .map(|q| q.header("idempotency-key").unwrap().to_owned())
        .collect();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0], seen[1], "two outboxes sent the same key");
    // Each is its outbox's id and the unit id (1 in both).
    let want: Vec<String> = keys.iter().map(|k| format!("{k}-1")).collect();
    assert_eq!(seen, want);
}

/// The dedup window past delivery: enqueueing a delivered row's id again is refused like a
/// duplicate (exit 2, nothing enqueued) and the recipient gets the row once; with
/// `--row-id-retention 0s` the id is free again at once.
#[test]
fn a_delivered_row_id_enqueued_again_is_not_delivered_twice() {
    let r = Recipient::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir.path().join("outbox.db"));
    let to = r.url("/in");
    ok(
        &with_db(&db, &["enqueue", "--actor", "a"]),
        &rows(&["r1"], &to),
    );
    ok(&with_db(&db, &["drain"]), "");
    assert_eq!(r.count("/in"), 1);
    let again = run(
        &with_db(&db, &["enqueue", "--actor", "a"]),
        &rows(&["r1"], &to),
    );
    assert_eq!(again.code(), Some(2), "{}", again.stderr);
    assert!(
        again
            .stderr
            .contains("\"r1\" is already used by this actor"),
        "{}",
        again.stderr
    );
    ok(&with_db(&db, &["drain"]), "");
    assert_eq!(r.count("/in"), 1, "delivered twice");
    // Without a window the id is the actor's to use again.
    ok(
        &with_db(
            &db,
            &["--row-id-retention", "0s", "enqueue", "--actor", "a"],
        ),
        &rows(&["r1"], &to),
    );
    ok(&with_db(&db, &["drain"]), "");
    assert_eq!(r.count("/in"), 2);
}

/// `--ack-retention` keeps a delivered unit and its payload (the library's `ack_retention`,
/// reached from the binary); without it a delivered unit is deleted at once.
#[test]
fn ack_retention_keeps_delivered_units() {
    let r = Recipient::start().unwrap();
    for (flags, kept) in [(&["--ack-retention", "1h"][..], 1), (&[][..], 0)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.db");
        let db = sqlite_db(&path);
        ok(
            &with_db(&db, &["enqueue", "--actor", "a"]),
            &rows(&["r1"], &r.url("/in")),
        );
        let drain: Vec<&str> = flags.iter().copied().chain(["drain"]).collect();
        ok(&with_db(&db, &drain), "");
        let c = rusqlite::Connection::open(&path).unwrap();
        let acked: i64 = c
            .query_row(
                "SELECT count(*) FROM ol_units WHERE acked_at IS NOT NULL AND body IS NOT NULL",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(acked, kept, "{flags:?}");
    }
    assert_eq!(r.count("/in"), 2);
}

/// `migrate` creates and upgrades; the other commands refuse an older schema, naming
/// `migrate`, and change nothing.
#[test]
fn only_migrate_upgrades_a_schema() {
    let help = ok(&["migrate", "--help"], "");
    assert!(help.stdout.contains("upgrade"), "{}", help.stdout);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.db");
    let db = sqlite_db(&path);
    let created = ok(&with_db(&db, &["migrate"]), "");
    assert!(
        created
            .stdout
            .starts_with("created the outbox schema (version 8)"),
        "{}",
        created.stdout
    );
    // Back to version 4, as an older build left it (schemas 5 to 8 only add; the extra
    // tables and columns are harmless to a version 4 reader, and gone here so the upgrade
    // has work to do).
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "DROP TABLE ol_row_ids; DROP TABLE ol_hosts; DELETE FROM ol_meta WHERE key = 'outbox_id'; \
             ALTER TABLE ol_lanes DROP COLUMN failing_since; \
             ALTER TABLE ol_lanes DROP COLUMN unavailable_since; \
             DROP TABLE ol_delivery_log; DROP INDEX ol_lanes_in_flight; \
             ALTER TABLE ol_lanes DROP COLUMN in_flight_since; \
             ALTER TABLE ol_lanes DROP COLUMN in_flight_unit; \
             UPDATE ol_meta SET value = '4' WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let r = Recipient::start().unwrap();
    for args in [
        &["enqueue", "--actor", "a"][..],
        &["drain"][..],
        &["status"][..],
    ] {
        let out = run(&with_db(&db, args), &rows(&["x"], &r.url("/in")));
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(
                "schema version 4 is older than this build's (8); run `outbox-lanes migrate`"
            ),
            "{args:?}: {}",
            out.stderr
        );
    }
    let version = |p: &Path| -> String {
        rusqlite::Connection::open(p)
            .unwrap()
            .query_row(
                "SELECT value FROM ol_meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(version(&path), "4", "a refused command changed the schema");
    let up = ok(&with_db(&db, &["migrate"]), "");
    assert!(
        up.stdout
            .starts_with("upgraded the outbox schema from version 4 to 8"),
        "{}",
        up.stdout
    );
    assert_eq!(version(&path), "8");
    let again = ok(&with_db(&db, &["migrate"]), "");
    assert!(
        again
            .stdout
            .starts_with("the outbox schema is at version 8 already"),
        "{}",
        again.stdout
    );
    ok(
        &with_db(&db, &["enqueue", "--actor", "a"]),
        &rows(&["x"], &r.url("/in")),
    );
}

/// A directory and database file that `user` may only read, with a copy of the binary it may
/// run; as root `user` is nobody (uid 65534), otherwise the files lose their write bits.
struct ReadOnlyPlace {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

impl ReadOnlyPlace {
    fn new() -> ReadOnlyPlace {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("outbox-lanes");
        std::fs::copy(BIN, &bin).unwrap();
        let root =
            std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
        ReadOnlyPlace {
            dir,
            bin,
            user: root.then_some((65534, 65534)),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("outbox.db")
    }

    /// Takes every write permission away from the user: the directory and the files in it
    /// become readable by all and writable by their owner only (as root), or by nobody.
    fn lock_down(&self) {
        let (dir_mode, file_mode) = if self.user.is_some() {
            (0o755, 0o644)
        } else {
            (0o555, 0o444)
        };
        for e in std::fs::read_dir(self.dir.path()).unwrap() {
            let e = e.unwrap();
            let mode = if e.path() == self.bin {
                0o755
            } else if e.file_type().unwrap().is_dir() {
                dir_mode
            } else {
                file_mode
            };
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(dir_mode))
            .unwrap();
    }

    fn run(&self, args: &[&str]) -> Out {
        let db = sqlite_db(&self.db());
        run_as(&self.bin, self.user, &with_db(&db, args), "")
    }
}

impl Drop for ReadOnlyPlace {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755));
    }
}

/// `status`, `lanes` and `dead-letters list|show` as a user who may only read the SQLite file
/// (and not write its directory): with no process holding the database open (no `-shm`), and
/// while a relay has it open. The commands that write refuse with the read-only error, and
/// nothing is created beside the file.
#[test]
fn inspection_works_for_a_user_who_may_only_read_the_sqlite_file() {
    let place = ReadOnlyPlace::new();
    let db = sqlite_db(&place.db());
    let r = Recipient::start().unwrap();
    r.set_default("/gone", Reply::Status(400));
    ok(
        &with_db(&db, &["enqueue", "--actor", "a"]),
        &rows(&["d"], &r.url("/gone")),
    );
    ok(&with_db(&db, &["drain"]), "");
    ok(
        &with_db(&db, &["enqueue", "--actor", "a"]),
        &rows(&["p"], &r.url("/later")),
    );
    // Paused, so that the relay below leaves it pending.
    ok(
        &with_db(
            &db,
            &[
                "lanes",
                "pause",
                "--actor",
                "a",
                "--recipient",
                &r.url("/later"),
                "--reason",
                "kept",
            ],
        ),
        "",
    );
    place.lock_down();
    let listed_before: Vec<_> = std::fs::read_dir(place.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();

    let check = |when: &str| {
        let status = place.run(&["status", "--json"]);
        assert_eq!(status.code(), Some(0), "{when}: status: {}", status.stderr);
        let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
        assert_eq!(s["actors"][0]["pending"], 1, "{when}: {}", status.stdout);
        assert_eq!(
            s["actors"][0]["dead_letters"], 1,
            "{when}: {}",
            status.stdout
        );
        let lanes = place.run(&["lanes", "--actor", "a"]);
        assert_eq!(lanes.code(), Some(0), "{when}: lanes: {}", lanes.stderr);
        assert!(lanes.stdout.contains("/later"), "{when}: {}", lanes.stdout);
        let list = place.run(&["dead-letters", "list", "--json"]);
        assert_eq!(
            list.code(),
            Some(0),
            "{when}: dead-letters list: {}",
            list.stderr
        );
        let l: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
        let id = l["dead_letters"][0]["id"].as_u64().unwrap().to_string();
        let show = place.run(&["dead-letters", "show", "--id", &id]);
        assert_eq!(
            show.code(),
            Some(0),
            "{when}: dead-letters show: {}",
            show.stderr
        );
        for write in [
            &[
                "lanes",
                "pause",
                "--actor",
                "a",
                "--recipient",
                &r.url("/later"),
                "--reason",
                "x",
            ][..],
            &["dead-letters", "purge", "--all"][..],
        ] {
            let out = place.run(write);
            assert_ne!(out.code(), Some(0), "{when}: {write:?}: {}", out.stderr);
            assert!(
                out.stderr
                    .contains(&format!("database {} is read-only", place.db().display())),
                "{when}: {write:?}: {}",
                out.stderr
            );
        }
    };
    check("no process has the database open");
    let after: Vec<_> = std::fs::read_dir(place.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(after, listed_before, "a read-only command created a file");

    // A relay (the owner) holds it open: the -wal and -shm files exist.
    let relay = Command::new(BIN)
        .args(with_db(&db, &["relay"]))
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let relay = common::Stopped(relay);
    assert!(
        eventually(|| Path::new(&format!("{}-shm", place.db().display())).exists()),
        "the relay never opened the database"
    );
    check("a relay has the database open");
    drop(relay);
}

/// The three roles of docs/privileges.md, made with exactly its statements (the schema and
/// role names replaced by this test's), dropped at the end.
struct Roles {
    url: String,
    schema: String,
    relay: String,
    enqueuer: String,
    reader: String,
}

impl Roles {
    fn new(url: &str) -> Roles {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tag = format!("{}_{nanos}", std::process::id());
        Roles {
            url: url.to_owned(),
            schema: format!("ol_priv_{tag}"),
            relay: format!("ol_relay_{tag}"),
            enqueuer: format!("ol_enq_{tag}"),
            reader: format!("ol_read_{tag}"),
        }
    }

    /// The SQL block of the document for `role` (`-- role: outbox_…`), with this test's names.
    fn statements(&self, role: &str) -> String {
        let mut blocks = PRIVILEGES_MD
            .split("```sql\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap());
        let block = blocks
            .find(|b| b.starts_with(&format!("-- role: {role}\n")))
            .unwrap_or_else(|| panic!("docs/privileges.md has no block for {role}"));
        block
            .replace("outbox_relay", &self.relay)
            .replace("outbox_enqueuer", &self.enqueuer)
            .replace("outbox_reader", &self.reader)
            .replace("outbox_lanes", &self.schema)
    }

    /// `--db` for `role` (the test server trusts every role on 127.0.0.1).
    fn db(&self, role: &str) -> Vec<String> {
        let authority = self.url.find("://").map_or(0, |i| i + 3);
        let rest = &self.url[authority..];
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        vec![
            "--db".into(),
            format!("{}{role}@{host}", &self.url[..authority]),
            "--pg-schema".into(),
            self.schema.clone(),
        ]
    }

    fn admin(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).unwrap()
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
            for role in [&self.relay, &self.enqueuer, &self.reader] {
                let _ =
                    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}"));
            }
        }
    }
}

/// Postgres: a schema a DBA made and gave to a role that may not create schemas in the
/// database (no `CREATE` on it): `migrate` as that role creates the outbox in it. (It failed
/// with "permission denied for database": `CREATE SCHEMA IF NOT EXISTS` asks for the
/// database's `CREATE` before it looks whether the schema exists.)
#[test]
fn migrate_into_a_schema_a_dba_made_needs_no_create_on_the_database() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let roles = Roles::new(&url);
    // The relay's name stands for the schema's owner here (Drop removes it).
    let owner = roles.relay.clone();
    let mut admin = roles.admin();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN; CREATE SCHEMA {} AUTHORIZATION {owner};",
            roles.schema
        ))
        .unwrap();
    let may_create: bool = admin
        .query_one(
            "SELECT has_database_privilege($1, current_database(), 'CREATE')",
            &[&owner],
        )
        .unwrap()
        .get(0);
    assert!(!may_create, "the role must not have CREATE on the database");
    let db = roles.db(&owner);
    let out = ok(&with_db(&db, &["migrate"]), "");
    assert!(out.stdout.contains("created"), "{}", out.stdout);
    let tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tableowner = $2",
            &[&roles.schema, &owner],
        )
        .unwrap()
        .get(0);
    assert!(tables > 5, "{tables} tables of {owner} in {}", roles.schema);
    // And the outbox works as that role.
    ok(&with_db(&db, &["status"]), "");
}

/// Postgres: `migrate` as the owner, then the document's GRANTs; the reader runs the
/// inspection commands and nothing else, the enqueuer enqueues and cannot drain, the relay
/// drains and acts on lanes. No role but the owner runs DDL (a current schema needs none).
#[test]
fn each_postgres_role_does_what_docs_privileges_says() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let roles = Roles::new(&url);
    let owner = {
        let mut d = vec!["--db".to_owned(), url.clone()];
        d.extend(["--pg-schema".to_owned(), roles.schema.clone()]);
        d
    };
    ok(&with_db(&owner, &["migrate"]), "");
    let mut admin = roles.admin();
    for role in ["outbox_relay", "outbox_enqueuer", "outbox_reader"] {
        admin
            .batch_execute(&roles.statements(role))
            .unwrap_or_else(|e| panic!("{role}'s statements: {e}"));
    }
    let r = Recipient::start().unwrap();
    r.set_default("/gone", Reply::Status(400));
    let (relay, enqueuer, reader) = (
        roles.db(&roles.relay),
        roles.db(&roles.enqueuer),
        roles.db(&roles.reader),
    );

    // The enqueuer may not widen the outbox's destination policy (OL-24: it writes no
    // `ol_meta`); the relay role does, once.
    let refused = run(
        &with_db(&enqueuer, &["enqueue", "--actor", "a"]),
        &rows(&["d", "e"], &r.url("/gone")),
    );
    assert_eq!(refused.code(), Some(1), "{}", refused.stderr);
    for said in [
        "widen",
        "permission denied",
        "outbox-lanes destinations set",
    ] {
        assert!(
            refused.stderr.contains(said),
            "{said:?}: {}",
            refused.stderr
        );
    }
    ok(&with_db(&relay, &["destinations", "set", "private"]), "");
    // The enqueuer enqueues; it may not drain (no slot, no ack).
    ok(
        &with_db(&enqueuer, &["enqueue", "--actor", "a"]),
        &rows(&["d", "e"], &r.url("/gone")),
    );
    ok(
        &with_db(&enqueuer, &["enqueue", "--actor", "a"]),
        &rows(&["p"], &r.url("/in")),
    );
    let drain = run(&with_db(&enqueuer, &["drain"]), "");
    assert_ne!(drain.code(), Some(0), "{}", drain.stderr);
    assert!(
        drain.stderr.contains("permission denied"),
        "{}",
        drain.stderr
    );
    assert_eq!(r.count_all(), 0);

    // The relay drains: the row is delivered, the 400s are dead letters.
    ok(&with_db(&relay, &["drain"]), "");
    assert_eq!(r.count("/in"), 1);
    ok(
        &with_db(
            &relay,
            &[
                "lanes",
                "pause",
                "--actor",
                "a",
                "--recipient",
                &r.url("/in"),
                "--reason",
                "x",
            ],
        ),
        "",
    );
    ok(
        &with_db(
            &relay,
            &[
                "lanes",
                "resume",
                "--actor",
                "a",
                "--recipient",
                &r.url("/in"),
            ],
        ),
        "",
    );

    // The reader reads everything, writes nothing.
    let status = ok(&with_db(&reader, &["status", "--json"]), "");
    let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(s["actors"][0]["dead_letters"], 2, "{}", status.stdout);
    ok(&with_db(&reader, &["lanes", "--actor", "a"]), "");
    let list = ok(&with_db(&reader, &["dead-letters", "list", "--json"]), "");
    let l: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let id = l["dead_letters"][0]["id"].as_u64().unwrap().to_string();
    ok(
        &with_db(&reader, &["dead-letters", "show", "--id", &id]),
        "",
    );
    let policy = ok(&with_db(&reader, &["destinations"]), "");
    assert!(
        policy.stdout.contains("loopback+private"),
        "{}",
        policy.stdout
    );
    for write in [
        &["enqueue", "--actor", "a"][..],
        &["dead-letters", "purge", "--all"][..],
        &["destinations", "set", "public"][..],
        &[
            "lanes",
            "pause",
            "--actor",
            "a",
            "--recipient",
            &r.url("/in"),
            "--reason",
            "x",
        ][..],
    ] {
        let out = run(&with_db(&reader, write), &rows(&["q"], &r.url("/in")));
        assert_ne!(out.code(), Some(0), "{write:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("permission denied"),
            "{write:?}: {}",
            out.stderr
        );
    }
    // Nothing the reader tried was written.
    let pending: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.ol_units WHERE state = 0",
                roles.schema
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pending, 0);
}
