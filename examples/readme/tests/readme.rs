//! The README's Rust snippets are the files in `examples/`, character for character; the
//! transactional ones run here against a real SQLite file and a real Postgres
//! (`OUTBOX_LANES_TEST_PG`). The examples themselves compile with `#![deny(warnings)]`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use outbox_lanes::blocking::Stopped;
use outbox_lanes::core::ActorId;
use outbox_lanes::store::{DriverStore, Notifier, ServiceStore, Subscription};

// Each example's `main` works on a fixed database; the tests call `post_note` on their own.
#[allow(dead_code)]
#[path = "../examples/tx_sqlite.rs"]
pub mod tx_sqlite;

#[allow(dead_code)]
#[path = "../examples/tx_postgres.rs"]
pub mod tx_postgres;

#[allow(dead_code)]
#[path = "../examples/signing.rs"]
pub mod signing;

#[allow(dead_code)]
#[path = "../examples/quickstart_blocking.rs"]
pub mod quickstart_blocking;

#[allow(dead_code)]
#[path = "../examples/quickstart_tokio.rs"]
pub mod quickstart_tokio;

#[allow(dead_code)]
#[path = "../examples/quickstart_smol.rs"]
pub mod quickstart_smol;

#[allow(dead_code)]
#[path = "../examples/quickstart_async_std.rs"]
pub mod quickstart_async_std;

const README: &str = include_str!("../../../README.md");
const GUIDE: &str = include_str!("../../../docs/library-guide.md");

/// The library guide's whole programs, by the path its marker names them with.
const GUIDE_EXAMPLES: [(&str, &str); 3] = [
    (
        "examples/readme/examples/signing.rs",
        include_str!("../examples/signing.rs"),
    ),
    (
        "examples/readme/examples/quickstart_smol.rs",
        include_str!("../examples/quickstart_smol.rs"),
    ),
    (
        "examples/readme/examples/quickstart_async_std.rs",
        include_str!("../examples/quickstart_async_std.rs"),
    ),
];

/// The library guide's whole programs that are packages of their own (compiled by CI's
/// `clippy -D warnings` with the workspace lints), each with the most lines it may have.
const GUIDE_PROGRAMS: [(&str, &str, usize); 1] = [(
    "examples/sqlx-activitypub/src/main.rs",
    include_str!("../../sqlx-activitypub/src/main.rs"),
    40,
)];

/// Every example, by the path the README's marker names it with.
const EXAMPLES: [(&str, &str); 4] = [
    (
        "examples/readme/examples/quickstart_tokio.rs",
        include_str!("../examples/quickstart_tokio.rs"),
    ),
    (
        "examples/readme/examples/quickstart_blocking.rs",
        include_str!("../examples/quickstart_blocking.rs"),
    ),
    (
        "examples/readme/examples/tx_sqlite.rs",
        include_str!("../examples/tx_sqlite.rs"),
    ),
    (
        "examples/readme/examples/tx_postgres.rs",
        include_str!("../examples/tx_postgres.rs"),
    ),
];

/// The README's `rust` blocks, each with the file its `<!-- example: PATH -->` line names.
fn readme_blocks() -> Vec<(String, String)> {
    blocks_of(README)
}

/// The `rust` blocks of `doc`, each with the file its `<!-- example: PATH -->` line names.
fn blocks_of(doc: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(path) = line
            .strip_prefix("<!-- example: ")
            .and_then(|l| l.strip_suffix(" -->"))
        else {
            continue;
        };
        assert_eq!(
            lines.next(),
            Some("```rust"),
            "README.md: the line after the marker of {path} opens a rust block"
        );
        let mut text = String::new();
        for l in lines.by_ref().take_while(|l| *l != "```") {
            text.push_str(l);
            text.push('\n');
        }
        blocks.push((path.to_owned(), text));
    }
    blocks
}

#[test]
fn the_readme_snippets_are_the_examples() {
    let blocks = readme_blocks();
    for (path, text) in EXAMPLES {
        let shown: Vec<_> = blocks.iter().filter(|(p, _)| p == path).collect();
        assert_eq!(shown.len(), 1, "README.md shows {path} once");
        assert!(
            shown[0].1 == text,
            "README.md's block of {path} differs from the file: copy the file into README.md"
        );
    }
    assert_eq!(
        blocks.len(),
        EXAMPLES.len(),
        "README.md marks an unknown example"
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/ is readable")
        .map(|e| e.expect("a directory entry").file_name())
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        EXAMPLES.len() + GUIDE_EXAMPLES.len(),
        "every example is in README.md or the library guide: {files:?}"
    );
    for (_, text) in EXAMPLES {
        assert!(text.contains("\n#![deny(warnings)]\n"), "{text}");
        assert!(
            text.lines().count() <= 36,
            "a README snippet stays short:\n{text}"
        );
    }
}

#[test]
fn the_library_guides_programs_are_the_examples() {
    let blocks = blocks_of(GUIDE);
    for (path, text) in GUIDE_EXAMPLES {
        let shown: Vec<_> = blocks.iter().filter(|(p, _)| p == path).collect();
        assert_eq!(shown.len(), 1, "the library guide shows {path} once");
        assert!(
            shown[0].1 == text,
            "the library guide's block of {path} differs from the file: copy the file into it"
        );
        assert!(text.contains("\n#![deny(warnings)]\n"), "{text}");
    }
    for (path, text, most) in GUIDE_PROGRAMS {
        let shown: Vec<_> = blocks.iter().filter(|(p, _)| p == path).collect();
        assert_eq!(shown.len(), 1, "the library guide shows {path} once");
        assert!(
            shown[0].1 == text,
            "the library guide's block of {path} differs from the file: copy the file into it"
        );
        let lines = text.lines().count();
        assert!(lines <= most, "{path} has {lines} lines, more than {most}");
    }
    assert_eq!(
        blocks.len(),
        GUIDE_EXAMPLES.len() + GUIDE_PROGRAMS.len(),
        "the library guide marks an unknown example"
    );
}

/// The facade's rustdoc opens with the sqlx service, the same text as the example's program
/// (after its one-line module doc), which CI compiles and runs.
#[test]
fn the_facade_docs_open_with_the_sqlx_service() {
    let facade = include_str!("../../../src/lib.rs");
    let (_, program, _) = GUIDE_PROGRAMS[0];
    let body = program
        .split_once("\n\n")
        .map(|(_, rest)| rest)
        .expect("a module doc line, then the program");
    let at = facade
        .find(body)
        .expect("src/lib.rs shows examples/sqlx-activitypub/src/main.rs: copy it there");
    let quick_start = facade
        .find("//! # Quick start")
        .expect("a Quick start section");
    assert!(quick_start < at, "the Quick start opens with it");
    assert_eq!(
        facade[quick_start..at].matches("```").count(),
        1,
        "the sqlx service is the Quick start's first block"
    );
}

/// Counts the in-process wake-ups of `notifier`.
fn count_wakes(notifier: &Notifier) -> (Arc<AtomicUsize>, Subscription) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let sub = notifier.subscribe(move || {
        c.fetch_add(1, Ordering::SeqCst);
    });
    (count, sub)
}

fn pending(store: &dyn ServiceStore) -> u64 {
    let actor = ActorId::new("https://notes.example/actor");
    store
        .status()
        .expect("status")
        .iter()
        .filter(|s| s.actor == actor)
        .map(|s| s.pending)
        .sum()
}

#[test]
fn the_sqlite_snippet_commits_the_note_and_its_rows_together() {
    use outbox_lanes::rusqlite::Connection;
    use outbox_lanes::store::{SqliteOptions, SqliteStore};

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("app.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open the store");
    let mut db = Connection::open(&path).expect("open the service's connection");
    db.execute_batch("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, text TEXT)")
        .expect("the notes table");
    let (wakes, _sub) = count_wakes(&store.notifier());
    let notes = |db: &Connection| -> i64 {
        db.query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
            .expect("count the notes")
    };

    let units = tx_sqlite::post_note(&store, &mut db, "n1", "hello").expect("post n1");
    assert_eq!(units, 1);
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "the wake-up fired once, after the commit"
    );
    assert_eq!((notes(&db), pending(&store)), (1, 1));

    // The note is refused (its id exists): nothing enqueued, nothing woken.
    assert!(tx_sqlite::post_note(&store, &mut db, "n1", "again").is_err());
    assert_eq!((notes(&db), pending(&store)), (1, 1));
    // The rows are refused (the row id was used): the note is rolled back with them.
    db.execute("DELETE FROM notes", [])
        .expect("delete the note");
    let refused = tx_sqlite::post_note(&store, &mut db, "n1", "hello").expect_err("row id reused");
    assert!(refused.to_string().contains("n1"), "{refused}");
    assert_eq!((notes(&db), pending(&store)), (0, 1));
    assert_eq!(wakes.load(Ordering::SeqCst), 1);
}

#[test]
fn the_postgres_snippet_commits_the_note_and_its_rows_together() {
    use outbox_lanes::postgres::{Client, NoTls};
    use outbox_lanes::store::{PgOptions, PgStore};

    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    let schema = format!("ol_readme_tx_{}", std::process::id());
    let mut db = Client::connect(&url, NoTls).expect("connect to OUTBOX_LANES_TEST_PG");
    db.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .expect("drop the test's schema");
    let opts = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    let store = PgStore::connect(&url, opts).expect("connect the store");
    // The service's notes beside the outbox, in the test's own schema.
    db.batch_execute(&format!(
        "SET search_path TO {schema}; CREATE TABLE notes (id TEXT PRIMARY KEY, text TEXT)"
    ))
    .expect("the notes table");
    let (wakes, _sub) = count_wakes(&store.notifier());
    let notes = |db: &mut Client| -> i64 {
        db.query_one("SELECT count(*) FROM notes", &[])
            .expect("count the notes")
            .get(0)
    };

    let units = tx_postgres::post_note(&store, &mut db, "n1", "hello").expect("post n1");
    assert_eq!(units, 1);
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "the wake-up fired once, after the commit"
    );
    assert_eq!((notes(&mut db), pending(&store)), (1, 1));

    assert!(tx_postgres::post_note(&store, &mut db, "n1", "again").is_err());
    assert_eq!((notes(&mut db), pending(&store)), (1, 1));
    db.execute("DELETE FROM notes", &[])
        .expect("delete the note");
    let refused =
        tx_postgres::post_note(&store, &mut db, "n1", "hello").expect_err("row id reused");
    assert!(refused.to_string().contains("n1"), "{refused}");
    assert_eq!((notes(&mut db), pending(&store)), (0, 1));
    assert_eq!(wakes.load(Ordering::SeqCst), 1);

    drop(store);
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .expect("drop the test's schema");
}

/// The signing example's functions, each request checked with verifiers we did not write
/// (RFC 9421: httpsig-hyper; draft-cavage: sigh) and every webhook with both of a rotating
/// customer's secrets, and not with another customer's.
#[test]
fn the_signing_example_signs_as_its_verifiers_expect() {
    use outbox_lanes::blocking::sign::StandardWebhooks;
    use outbox_lanes_test_support::Recipient;
    use outbox_lanes_test_support::signatures::{
        ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, CAROL_ED25519_PRIVATE, CAROL_ED25519_PUBLIC,
    };
    use outbox_lanes_test_support::verifiers;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let r = Recipient::start().expect("a recipient");
    let keys = Arc::new(
        signing::activitypub_keys(ALICE_PRIVATE_PKCS8, CAROL_ED25519_PRIVATE).expect("keys"),
    );
    let db = dir.path().join("ap.db");
    signing::deliver(&db, keys.clone(), signing::ALICE, &r.url("/alice")).expect("alice");
    signing::deliver(&db, keys, signing::CAROL, &r.url("/carol")).expect("carol");
    for (path, public, key_id, alg) in [
        ("/alice", ALICE_PUBLIC, "#main-key", "rsa-v1_5-sha256"),
        ("/carol", CAROL_ED25519_PUBLIC, "#ed25519-key", "ed25519"),
    ] {
        let q = r.requests(path);
        assert_eq!(q.len(), 1, "{path}");
        // `auto`: RFC 9421 first, to a host whose scheme is not known yet.
        let v = verifiers::rfc9421(&q[0], public).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(v.keyid.as_deref().unwrap_or("").ends_with(key_id), "{v:?}");
        assert_eq!(v.alg.as_deref(), Some(alg));
    }

    let (s1, old, new) = (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    );
    let other = "whsec_dGhpcyBpcyBhbm90aGVyIGN1c3RvbWVyIQ==";
    let secrets = Arc::new(signing::webhook_secrets(s1, old, new).expect("secrets"));
    signing::deliver(
        &dir.path().join("hooks.db"),
        secrets,
        "shop-2",
        &r.url("/shop-2"),
    )
    .expect("shop-2");
    let q = &r.requests("/shop-2")[0];
    let check = |whsec: &str| {
        StandardWebhooks::from_whsec(whsec)
            .expect("a secret")
            .verify(
                q.header("webhook-id").expect("webhook-id"),
                q.header("webhook-timestamp").expect("webhook-timestamp"),
                q.header("webhook-signature").expect("webhook-signature"),
                &q.body,
                std::time::SystemTime::now(),
                std::time::Duration::from_secs(300),
            )
    };
    assert!(
        check(old).is_ok() && check(new).is_ok(),
        "both secrets of the rotation verify"
    );
    assert!(check(other).is_err(), "another customer's secret does not");
}

/// The holder lock files beside the database at `db` (`<db>-holders/*.lock`).
fn lock_files(db: &Path) -> Vec<String> {
    let mut dir = db.as_os_str().to_owned();
    dir.push("-holders");
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".lock"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Runs a quick start's `run` on a database of its own against a recorder on 127.0.0.1, and
/// checks that its row arrived, that its stop (the one stop) cut nothing and left no lock
/// file.
fn quick_start(
    name: &str,
    run: impl FnOnce(&str, &str, outbox_lanes::blocking::OutboxConfig) -> Result<Stopped, String>,
) {
    use outbox_lanes_test_support::Recipient;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join(format!("{name}.db"));
    let r = Recipient::start().expect("a recipient");
    let config = outbox_lanes::blocking::OutboxConfig::default().allow_loopback();
    let stopped = run(db.to_str().expect("a UTF-8 path"), &r.url("/inbox"), config)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(r.count("/inbox"), 1, "{name}: the row was delivered once");
    assert_eq!(stopped, Stopped::default(), "{name}: nothing was cut");
    assert!(
        lock_files(&db).is_empty(),
        "{name}: the stop left no lock file: {:?}",
        lock_files(&db)
    );
}

#[test]
fn the_blocking_quick_start_delivers_and_stops() {
    quick_start("blocking", |db, inbox, config| {
        quickstart_blocking::run(db, inbox, config).map_err(|e| e.to_string())
    });
}

#[test]
fn the_tokio_quick_start_delivers_and_stops() {
    quick_start("tokio", |db, inbox, config| {
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        rt.block_on(quickstart_tokio::run(db, inbox, config))
            .map_err(|e| e.to_string())
    });
}

#[test]
fn the_smol_quick_start_delivers_and_stops() {
    quick_start("smol", |db, inbox, config| {
        smol::block_on(quickstart_smol::run(db, inbox, config)).map_err(|e| e.to_string())
    });
}

#[test]
fn the_async_std_quick_start_delivers_and_stops() {
    quick_start("async-std", |db, inbox, config| {
        async_std::task::block_on(quickstart_async_std::run(db, inbox, config))
            .map_err(|e| e.to_string())
    });
}
