//! Connection strings for [`PgStore::connect`](crate::PgStore::connect): a `postgres://` URL
//! or a libpq key=value string made into sqlx's connect options, with `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` as libpq defines them. sqlx's own parser reads URLs
//! only, ignores parameters it does not know, and never verifies the certificate under
//! `require`; this module takes the TLS parameters out first (both forms), refuses an unknown
//! parameter, reads the key=value form itself, and checks the files before any connection:
//!
//! | `sslmode`   | TLS                          | certificate checked                      |
//! |-------------|------------------------------|------------------------------------------|
//! | `disable`   | never (no `SSLRequest` sent) | —                                        |
//! | `prefer`    | if the server offers it      | none (with a CA file: as `verify-ca`)    |
//! | `require`   | always                       | none (with a CA file: as `verify-ca`)    |
//! | `verify-ca` | always                       | chain (CA file, else the webpki roots)   |
//! |`verify-full`| always                       | chain and host name                      |
//!
//! `prefer` is the default, as in libpq. A CA file given with `require` makes it `verify-ca`,
//! as libpq does; given with `prefer` it does too (TLS is then required: a chain to check is
//! never silently skipped over a plain connection). The handshake is sqlx's, on rustls with
//! the `ring` provider, the HTTP clients' provider, so a relay carries one TLS
//! implementation.
//!
//! A client certificate is sent when `sslcert` (its PEM chain) and `sslkey` (its PEM private
//! key) are both given, for servers whose `pg_hba.conf` says `cert` or
//! `clientcert=verify-ca|verify-full`. One without the other is refused. Unlike libpq,
//! nothing is read from `~/.postgresql/` when they are not given.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::postgres::{PgOptions, check_schema_name};
use crate::{Cause, StoreError};

/// Whether and how a Postgres connection uses TLS: libpq's `sslmode` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it; the certificate is checked only when a CA file is given.
    #[default]
    Prefer,
    /// TLS; the certificate is checked only when a CA file is given.
    Require,
    /// TLS; the certificate chain is checked (against the CA file, else the webpki roots),
    /// not the host name.
    VerifyCa,
    /// TLS; the certificate chain and the host name are checked.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    ///
    /// # Errors
    /// A message naming the accepted values. `allow` (plain first, TLS as a fallback) is
    /// refused rather than taken for `prefer`.
    pub fn parse(s: &str) -> Result<SslMode, String> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            _ => Err(format!(
                "invalid sslmode {s:?} (use disable, prefer, require, verify-ca or verify-full)"
            )),
        }
    }
}

/// The TLS parameters taken out of a connection string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// `sslmode`, if given.
    pub(crate) mode: Option<SslMode>,
    /// `sslrootcert`, if given.
    pub(crate) root_cert: Option<PathBuf>,
    /// `sslcert`, if given.
    pub(crate) cert: Option<PathBuf>,
    /// `sslkey`, if given.
    pub(crate) key: Option<PathBuf>,
}

impl TlsSettings {
    /// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of `conn` (a `postgres://`
    /// URL or a key=value string) and returns the rest.
    pub(crate) fn take(conn: &str) -> Result<(TlsSettings, String), String> {
        let mut settings = TlsSettings::default();
        let mut take = |key: &str, value: &str| -> Result<bool, String> {
            match key {
                "sslmode" => settings.mode = Some(SslMode::parse(value)?),
                "sslrootcert" => settings.root_cert = Some(PathBuf::from(value)),
                "sslcert" => settings.cert = Some(PathBuf::from(value)),
                "sslkey" => settings.key = Some(PathBuf::from(value)),
                _ => return Ok(false),
            }
            Ok(true)
        };
        let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
            let Some((base, query)) = conn.split_once('?') else {
                return Ok((settings, conn.to_owned()));
            };
            let mut kept = Vec::new();
            for pair in query.split('&') {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                if !take(&percent_decode(k)?, &percent_decode(v)?)? {
                    kept.push(pair);
                }
            }
            if kept.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        } else {
            let mut rest = String::new();
            for (start, end, key, value) in key_values(conn)? {
                if !take(&key, &value)? {
                    if !rest.is_empty() {
                        rest.push(' ');
                    }
                    rest.push_str(&conn[start..end]);
                }
            }
            rest
        };
        Ok((settings, rest))
    }
}

/// Decodes `%XX` escapes (a URL's query values).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("percent-encoding in {s:?} is not UTF-8"))
}

/// The `key=value` pairs of a libpq key=value string: each pair's byte span in `s`, its key
/// and its unquoted value (`'…'` with `\'` and `\\` escapes, or up to the next space).
fn key_values(s: &str) -> Result<Vec<(usize, usize, String, String)>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_owned();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() || b[i] != b'=' {
            return Err(format!(
                "missing \"=\" after {key:?} in the connection string"
            ));
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err(format!("unterminated quoted value of {key:?}")),
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        value.push(b[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                value.push(b[i]);
                i += 1;
            }
        }
        let value =
            String::from_utf8(value).map_err(|_| format!("value of {key:?} is not UTF-8"))?;
        out.push((start, i, key, value));
    }
}

/// The parameters a connection string may carry besides the TLS ones, in either form.
const PARAMETERS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// sqlx's connect options for `url` with `opts`, and the target to name in errors (the
/// connection string without its password). Reads the TLS files it names, to refuse a
/// missing or unreadable one by name before any connection.
///
/// # Errors
/// [`StoreError::Open`], with a reason for the user: the bad parameter, the unreadable file,
/// the invalid schema name.
pub(crate) fn connect_options(
    url: &str,
    opts: &PgOptions,
) -> Result<(PgConnectOptions, String), StoreError> {
    let target = redact(url);
    let open = |reason: String| StoreError::Open {
        target: target.clone(),
        reason,
        cause: None,
    };
    check_schema_name(&opts.schema).map_err(open)?;
    let (tls, rest) = TlsSettings::take(url).map_err(open)?;
    let by_address = rest.contains("hostaddr");
    let mode = tls.mode.unwrap_or_default();
    let mut options = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let key =
                    percent_decode(pair.split_once('=').map_or(pair, |(k, _)| k)).map_err(open)?;
                if !PARAMETERS.contains(&key.as_str()) {
                    return Err(open(format!("unknown connection parameter {key:?}")));
                }
            }
        }
        PgConnectOptions::from_str(&rest).map_err(|e| open(e.to_string()))?
    } else {
        let mut options = PgConnectOptions::new_without_pgpass();
        for (_, _, key, value) in key_values(&rest).map_err(open)? {
            options = match key.as_str() {
                "host" if value.starts_with('/') => options.socket(&value),
                "host" | "hostaddr" => options.host(&value),
                "port" => options.port(
                    value
                        .parse()
                        .map_err(|_| open(format!("invalid port {value:?}")))?,
                ),
                "dbname" => options.database(&value),
                "user" => options.username(&value),
                "password" => options.password(&value),
                "application_name" => options.application_name(&value),
                "options" => options.options([("options", value.as_str())]),
                _ => return Err(open(format!("unknown connection parameter {key:?}"))),
            };
        }
        options
    };
    // sqlx connects to `hostaddr` by putting it in place of the host, so the name verify-full
    // would check is the address: refused rather than checked against what the user did not
    // mean.
    if by_address && mode == SslMode::VerifyFull {
        return Err(open(
            "hostaddr cannot be used with sslmode=verify-full here (the address \
             would be the name checked): connect by the name, or use sslmode=verify-ca"
                .into(),
        ));
    }
    if options.get_application_name().is_none() {
        options = options.application_name(&opts.application_name);
    }
    let root = tls.root_cert.or_else(|| opts.ssl_root_cert.clone());
    // "system": the webpki roots, as when no CA file is given to a verify-* mode.
    let root = root.filter(|p| p.as_os_str() != "system");
    if let Some(p) = &root {
        readable("sslrootcert", p, "-----BEGIN CERTIFICATE-----").map_err(open)?;
    }
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            readable("sslcert", cert, "-----BEGIN CERTIFICATE-----").map_err(open)?;
            readable("sslkey", key, "PRIVATE KEY-----").map_err(open)?;
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        (None, None) => {}
        (Some(_), None) => return Err(open("sslcert is given without sslkey".into())),
        (None, Some(_)) => return Err(open("sslkey is given without sslcert".into())),
    }
    options = options.ssl_mode(match (mode, &root) {
        (SslMode::Disable, _) => PgSslMode::Disable,
        (SslMode::Prefer | SslMode::Require, Some(_)) | (SslMode::VerifyCa, _) => {
            PgSslMode::VerifyCa
        }
        (SslMode::Prefer, None) => PgSslMode::Prefer,
        (SslMode::Require, None) => PgSslMode::Require,
        (SslMode::VerifyFull, _) => PgSslMode::VerifyFull,
    });
    if let Some(p) = root {
        options = options.ssl_root_cert(p);
    }
    Ok((options, target))
}

/// Refuses a TLS file that cannot be read or does not hold what it should (`marker`: a PEM
/// block's header or its end).
fn readable(what: &str, path: &Path, marker: &str) -> Result<(), String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
    let text = String::from_utf8_lossy(&pem);
    if !text.contains(marker) {
        return Err(format!(
            "{what} {shown} holds no PEM {}",
            marker.trim_matches('-')
        ));
    }
    Ok(())
}

/// A store error met while connecting, as [`StoreError::Open`] of `target`: what the server
/// or the TLS handshake said, with a hint for the certificate errors a user can fix, and the
/// driver's error as the cause.
pub(crate) fn connect_error(target: &str, e: StoreError) -> StoreError {
    let (reason, cause) = match e {
        StoreError::ConnectionLost { reason, cause } => (reason, cause),
        StoreError::Driver { reason, cause } => (reason, Some(cause)),
        e => return e,
    };
    let reason = match hint(&reason) {
        Some(h) => format!("{reason} ({h})"),
        None => reason,
    };
    StoreError::Open {
        target: target.to_owned(),
        reason,
        cause: cause.map(|c: Cause| c),
    }
}

/// What to do about a certificate the handshake refused, from rustls's words for it.
fn hint(reason: &str) -> Option<&'static str> {
    if reason.contains("UnknownIssuer") {
        Some("set sslrootcert to the CA file that signed the server's certificate")
    } else if reason.contains("NotValidForName") || reason.contains("not valid for name") {
        Some("connect by a name in the certificate, or use sslmode=verify-ca")
    } else {
        None
    }
}

/// A connection string without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &userinfo[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(s: &str) -> (TlsSettings, String) {
        TlsSettings::take(s).expect("parses")
    }

    #[test]
    fn url_parameters_are_taken_and_the_rest_kept() {
        let (s, rest) = take(
            "postgres://u@db.example/app?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20b.pem",
        );
        assert_eq!(s.mode, Some(SslMode::VerifyFull));
        assert_eq!(s.root_cert, Some(PathBuf::from("/etc/ca b.pem")));
        assert_eq!(rest, "postgres://u@db.example/app?application_name=x");
        let (s, rest) = take("postgresql://h/d?sslmode=disable");
        assert_eq!(
            (s.mode, s.root_cert, rest.as_str()),
            (Some(SslMode::Disable), None, "postgresql://h/d")
        );
        let (s, rest) = take("postgres://h/d");
        assert_eq!(
            (s, rest.as_str()),
            (TlsSettings::default(), "postgres://h/d")
        );
        let (s, rest) = take("postgres://h/d?sslcert=%2Fk%2Fc.pem&connect_timeout=3&sslkey=k.pem");
        assert_eq!(
            (s.cert, s.key, rest.as_str()),
            (
                Some(PathBuf::from("/k/c.pem")),
                Some(PathBuf::from("k.pem")),
                "postgres://h/d?connect_timeout=3"
            )
        );
    }

    #[test]
    fn key_value_parameters_are_taken_and_the_rest_kept() {
        let (s, rest) =
            take("host=h  sslmode = verify-ca sslrootcert='/a b/c\\'a.pem' dbname='my db'");
        assert_eq!(s.mode, Some(SslMode::VerifyCa));
        assert_eq!(s.root_cert, Some(PathBuf::from("/a b/c'a.pem")));
        assert_eq!(rest, "host=h dbname='my db'");
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for (s, says) in [
            ("postgres://h/d?sslmode=allow", "invalid sslmode \"allow\""),
            ("postgres://h/d?sslmode=verify%2", "percent-encoding"),
            ("host=h sslmode", "missing \"=\""),
            ("host=h sslrootcert='x", "unterminated"),
        ] {
            let e = TlsSettings::take(s).expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn a_missing_or_empty_tls_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |q: &str| {
            let url = format!("postgres://u@h/d?sslmode=verify-full&{q}");
            match connect_options(&url, &PgOptions::default()) {
                Ok(_) => panic!("{q}: accepted"),
                Err(e) => e.to_string(),
            }
        };
        let missing = dir.path().join("missing.pem").display().to_string();
        let e = at(&format!("sslrootcert={missing}"));
        assert!(
            e.contains("cannot read sslrootcert") && e.contains("missing.pem"),
            "{e}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = at(&format!("sslrootcert={}", empty.display()));
        assert!(e.contains("holds no PEM"), "{e}");
        let e = at("sslcert=c.pem");
        assert!(e.contains("sslcert is given without sslkey"), "{e}");
        let e = at("application_nam=x");
        assert!(
            e.contains("unknown connection parameter \"application_nam\""),
            "{e}"
        );
        let e = connect_options("host=h bogus=1", &PgOptions::default())
            .map(drop)
            .expect_err("unknown key");
        assert!(
            e.to_string()
                .contains("unknown connection parameter \"bogus\""),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_makes_prefer_and_require_verify_the_chain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let mode = |q: &str| {
            let url = format!("postgres://u:secret@h/d?{q}");
            let (o, target) = connect_options(&url, &PgOptions::default()).expect(q);
            assert!(!target.contains("secret"), "{target}");
            o.get_ssl_mode()
        };
        let with_ca = format!("sslrootcert={}", ca.display());
        assert!(matches!(mode(""), PgSslMode::Prefer));
        assert!(matches!(mode("sslmode=require"), PgSslMode::Require));
        assert!(matches!(mode(&with_ca), PgSslMode::VerifyCa));
        assert!(matches!(
            mode(&format!("sslmode=require&{with_ca}")),
            PgSslMode::VerifyCa
        ));
        assert!(matches!(
            mode(&format!("sslmode=verify-full&{with_ca}")),
            PgSslMode::VerifyFull
        ));
        assert!(matches!(mode("sslmode=disable"), PgSslMode::Disable));
    }
}
