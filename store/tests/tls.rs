//! Postgres over TLS against a real server: a throwaway cluster started here with `ssl = on`,
//! a self-signed CA and a server certificate made with rcgen, and a pg_hba that accepts TLS
//! connections only (`hostnossl … reject`), so a connection that succeeds was encrypted.
//!
//! Needs the PostgreSQL server binaries (`/usr/lib/postgresql/*/bin`) and, as root, `runuser`
//! (initdb refuses to run as root). Without them the test prints why and passes — unless `CI`
//! is set, where it fails.
#![allow(missing_docs, clippy::unwrap_used)]
#![cfg(feature = "postgres")]

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use outbox_lanes_store::*;

/// Runs `cmd` (as the `postgres` user when we are root) and waits at most `limit`.
fn run(cluster: &Cluster, args: &[&str], limit: Duration) -> Result<String, String> {
    let mut cmd = if cluster.as_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]);
        c
    } else {
        Command::new(args[0])
    };
    let args = if cluster.as_root { args } else { &args[1..] };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {args:?}: {e}"))?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return if status.success() {
                Ok(text)
            } else {
                Err(format!("{args:?} failed ({status}): {text}"))
            };
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{args:?} did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running throwaway cluster; stopped (immediately) when dropped, also on a panic.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_root: bool,
    started: bool,
}

impl Cluster {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn tool(&self, name: &str) -> String {
        self.bin.join(name).display().to_string()
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started {
            let data = self.data().display().to_string();
            let _ = run(
                self,
                &[
                    &self.tool("pg_ctl"),
                    "-D",
                    &data,
                    "-m",
                    "immediate",
                    "-w",
                    "-t",
                    "20",
                    "stop",
                ],
                Duration::from_secs(30),
            );
        }
    }
}

/// The newest server binaries and whether we are root, or why the cluster cannot start.
fn probe() -> Result<(PathBuf, bool), String> {
    let mut bins: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    bins.sort();
    let bin = bins
        .pop()
        .ok_or("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")?;
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("cannot run id -u: {e}"))?;
    let as_root = String::from_utf8_lossy(&uid.stdout).trim() == "0";
    let runuser = || {
        Command::new("runuser")
            .args(["-u", "postgres", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if as_root && !runuser() {
        return Err(
            "running as root and `runuser -u postgres` does not work (initdb refuses root)".into(),
        );
    }
    Ok((bin, as_root))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes the CA and the server's certificate and key (SANs: localhost, 127.0.0.1).
fn make_certs(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "outbox-lanes test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = server.signed_by(&key, &issuer).unwrap();
    // A client certificate for role `certuser` (cert authentication matches the CN).
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "certuser");
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();
    std::fs::write(dir.join("client.crt"), client_cert.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

/// Starts the cluster, or says why it cannot (`Err`).
fn start() -> Result<Cluster, String> {
    let (bin, as_root) = probe()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut c = Cluster {
        bin,
        dir,
        port: free_port(),
        as_root,
        started: false,
    };
    make_certs(c.dir.path());
    if as_root {
        let path = c.dir.path().display().to_string();
        let out = Command::new("chown")
            .args(["-R", "postgres:postgres", &path])
            .status()
            .map_err(|e| e.to_string())?;
        assert!(out.success(), "chown {path}");
    }
    let data = c.data().display().to_string();
    run(
        &c,
        &[
            &c.tool("initdb"),
            "-D",
            &data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        Duration::from_secs(120),
    )
    .map_err(|e| format!("initdb: {e}"))?;
    let d = c.dir.path().display().to_string();
    let conf = format!(
        "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{d}'\n\
         ssl = on\nssl_cert_file = '{d}/server.crt'\nssl_key_file = '{d}/server.key'\n\
         ssl_ca_file = '{d}/ca.pem'\n\
         fsync = off\nmax_connections = 20\nshared_buffers = 16MB\n",
        c.port
    );
    let conf_path = c.data().join("postgresql.conf");
    let mut all = std::fs::read_to_string(&conf_path).map_err(|e| e.to_string())?;
    all.push_str(&conf);
    std::fs::write(&conf_path, all).map_err(|e| e.to_string())?;
    std::fs::write(
        c.data().join("pg_hba.conf"),
        "local all all trust\n\
         hostssl all certuser 127.0.0.1/32 cert\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 127.0.0.1/32 reject\n",
    )
    .map_err(|e| e.to_string())?;
    let log = c.dir.path().join("log").display().to_string();
    c.started = true;
    run(
        &c,
        &[
            &c.tool("pg_ctl"),
            "-D",
            &data,
            "-l",
            &log,
            "-w",
            "-t",
            "60",
            "start",
        ],
        Duration::from_secs(90),
    )
    .map_err(|e| {
        let log = std::fs::read_to_string(c.dir.path().join("log")).unwrap_or_default();
        format!("pg_ctl start: {e}\n{log}")
    })?;
    Ok(c)
}

fn opts(schema: &str) -> PgOptions {
    PgOptions {
        schema: schema.into(),
        connect_timeout: Duration::from_secs(10),
        ..PgOptions::default()
    }
}

fn open_err(url: &str, o: PgOptions) -> String {
    match PgStore::connect(url, o) {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => {
            assert!(matches!(e, StoreError::Open { .. }), "{url}: {e:?}");
            e.to_string()
        }
    }
}

#[test]
fn postgres_over_tls_honours_sslmode_and_the_ca_file() {
    let c = match start() {
        Ok(c) => c,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none_or(|v| v.is_empty()),
                "CI is set but the TLS cluster cannot start: {why}"
            );
            eprintln!("SKIPPED: the TLS test cluster cannot start: {why}");
            return;
        }
    };
    let port = c.port;
    let ca = c.ca().display().to_string();
    let base = |host: &str, q: &str| format!("postgres://postgres@{host}:{port}/postgres?{q}");

    // require: encrypted, certificate unchecked (no CA given). pg_hba rejects plain
    // connections, so connecting at all proves TLS.
    drop(PgStore::connect(&base("127.0.0.1", "sslmode=require"), opts("tls_require")).unwrap());
    // prefer (the default): TLS, since the server offers it.
    drop(PgStore::connect(&base("127.0.0.1", ""), opts("tls_prefer")).unwrap());
    assert!(PgStore::exists(&base("127.0.0.1", "sslmode=require"), &opts("tls_require")).unwrap());

    // verify-full with the CA file, by name and by address (both in the SANs): a real round
    // trip of enqueue, claim and ack over TLS.
    for (host, schema) in [("localhost", "tls_full_name"), ("127.0.0.1", "tls_full_ip")] {
        let url = base(host, &format!("sslmode=verify-full&sslrootcert={ca}"));
        let store = PgStore::connect(&url, opts(schema)).unwrap_or_else(|e| panic!("{host}: {e}"));
        let a = actor("alice");
        let to = "https://example.org/inbox";
        store
            .enqueue(&a, &[row("r1", &[to]), row("r2", &[to])])
            .unwrap();
        let t = acquire(&store, &a, "h", LEASE);
        let lane = lane_of(&store, &a, to);
        let got = claim_lane(&store, &t, lane, 0, 10);
        assert_eq!(row_ids(&got), ["r1", "r2"], "{host}");
    }
    // The CA file as a PgOptions field, in key=value form.
    let kv =
        format!("host=localhost port={port} user=postgres dbname=postgres sslmode=verify-full");
    let o = PgOptions {
        ssl_root_cert: Some(c.ca()),
        ..opts("tls_kv")
    };
    drop(PgStore::connect(&kv, o).unwrap());

    // verify-ca checks the chain, not the name: a host name that is not in the certificate
    // (hostaddr reaches the server) passes verify-ca and fails verify-full.
    let other = |mode: &str| {
        format!(
            "postgres://postgres@not-in-the-cert.invalid:{port}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={ca}"
        )
    };
    drop(PgStore::connect(&other("verify-ca"), opts("tls_ca")).unwrap());
    let e = open_err(&other("verify-full"), opts("tls_ca"));
    assert!(
        e.contains("certificate not valid for name") && e.contains("sslmode=verify-ca"),
        "{e}"
    );

    // verify-full without the CA: the webpki roots do not know the test CA.
    let e = open_err(&base("localhost", "sslmode=verify-full"), opts("tls_noca"));
    assert!(
        e.contains("invalid peer certificate: UnknownIssuer") && e.contains("set sslrootcert"),
        "{e}"
    );
    // A CA file that cannot be read is named.
    let e = open_err(
        &base(
            "localhost",
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        ),
        opts("tls_noca"),
    );
    assert!(
        e.contains("cannot read sslrootcert /nonexistent/ca.pem"),
        "{e}"
    );

    // disable: plain, refused by the server's hostnossl line; its message reaches the user,
    // and the driver's error is the source.
    let url = base("127.0.0.1", "sslmode=disable");
    let err = PgStore::connect(&url, opts("tls_plain")).unwrap_err();
    let e = err.to_string();
    assert!(
        e.contains("pg_hba.conf rejects connection")
            && e.contains("no encryption")
            && e.contains("SQLSTATE 28000"),
        "{e}"
    );
    let pg = core::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<::postgres::Error>())
        .expect("the driver's error is the source");
    assert!(pg.as_db_error().is_some(), "{pg:?}");

    // Client certificates: role `certuser` may only log in with a certificate the CA signed
    // for it (pg_hba `cert`).
    let dir = c.dir.path().display().to_string();
    let mut admin = ::postgres::Client::connect(
        &format!("host={dir} port={port} user=postgres dbname=postgres"),
        ::postgres::NoTls,
    )
    .expect("the cluster's unix socket");
    admin
        .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
        .unwrap();
    drop(admin);
    let cert_url = |extra: &str| {
        format!(
            "postgres://certuser@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}{extra}"
        )
    };
    let with_cert = cert_url(&format!(
        "&sslcert={dir}/client.crt&sslkey={dir}/client.key"
    ));
    let store = PgStore::connect(&with_cert, opts("tls_cert"))
        .unwrap_or_else(|e| panic!("with a client certificate: {e}"));
    let a = actor("carol");
    let to = "https://example.org/inbox";
    store.enqueue(&a, &[row("c1", &[to])]).unwrap();
    let t = acquire(&store, &a, "h", LEASE);
    let lane = lane_of(&store, &a, to);
    assert_eq!(row_ids(&claim_lane(&store, &t, lane, 0, 10)), ["c1"]);
    drop(store);
    // Without the certificate the server refuses, and says why.
    let e = open_err(&cert_url(""), opts("tls_cert"));
    assert!(
        e.contains("certificate") && e.contains("SQLSTATE 28000"),
        "{e}"
    );
    // One file without the other, or a file that cannot be read, is refused here, by name.
    let e = open_err(
        &cert_url(&format!("&sslcert={dir}/client.crt")),
        opts("tls_cert"),
    );
    assert!(e.contains("sslcert is given without sslkey"), "{e}");
    let e = open_err(
        &cert_url(&format!(
            "&sslcert={dir}/client.crt&sslkey=/nonexistent/k.pem"
        )),
        opts("tls_cert"),
    );
    assert!(e.contains("cannot read sslkey /nonexistent/k.pem"), "{e}");
}
