//! TLS for the Postgres store: `sslmode` and `sslrootcert` as libpq defines them, on rustls
//! with the `ring` provider — the provider of both HTTP clients, so a relay carries one TLS
//! implementation.
//!
//! The `postgres` crate parses `sslmode=disable|prefer|require` only and refuses
//! `verify-ca`, `verify-full` and `sslrootcert` as unknown; [`TlsSettings::take`] takes both
//! parameters out of the connection string (URL or key=value form) before it is parsed, and
//! the connector made here applies them. The handshake itself is `tokio-postgres-rustls`'s
//! (it also provides SCRAM channel binding); only the certificate verifier is chosen here:
//!
//! | `sslmode`   | TLS                          | certificate checked                      |
//! |-------------|------------------------------|------------------------------------------|
//! | `disable`   | never (no `SSLRequest` sent) | —                                        |
//! | `prefer`    | if the server offers it      | chain, if a CA file is given; else none  |
//! | `require`   | always                       | chain, if a CA file is given; else none  |
//! | `verify-ca` | always                       | chain (CA file, else the webpki roots)   |
//! |`verify-full`| always                       | chain and host name                      |
//!
//! `prefer` is the default, as in libpq. With `disable` the plain connector is used: the same
//! start-up as before TLS existed, no extra round trip.
//!
//! A client certificate is sent when `sslcert` (its PEM chain) and `sslkey` (its PEM private
//! key: PKCS#8, PKCS#1 or SEC1) are both given, for servers whose `pg_hba.conf` says `cert`
//! or `clientcert=verify-ca|verify-full`. One without the other is refused. Unlike libpq,
//! nothing is read from `~/.postgresql/` when they are not given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres::config::SslMode as DriverMode;
use postgres::{Client, Config, NoTls};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

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
    /// URL or a key=value string) and returns the rest, for the `postgres` crate to parse.
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

/// Opens connections with or without TLS, as the `sslmode` says. Cheap to clone (the rustls
/// configuration is shared), built once per store.
#[derive(Clone)]
pub(crate) struct Connector {
    /// `None` for `sslmode=disable`.
    tls: Option<MakeRustlsConnect>,
}

impl core::fmt::Debug for Connector {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Connector {
    /// Parses `conn` (with `sslmode` and `sslrootcert` handled here; `root_cert` is the CA
    /// file when the string names none) into the driver's configuration and a connector.
    ///
    /// # Errors
    /// A message for the user: the bad parameter, or the CA file that cannot be read.
    pub(crate) fn new(
        conn: &str,
        root_cert: Option<&Path>,
    ) -> Result<(Config, Connector), ConfigError> {
        let (settings, rest) = TlsSettings::take(conn).map_err(ConfigError::Message)?;
        let mut config: Config = rest.parse().map_err(ConfigError::Driver)?;
        let mode = settings.mode.unwrap_or_default();
        let root_cert = settings.root_cert.as_deref().or(root_cert);
        config.ssl_mode(match mode {
            SslMode::Disable => DriverMode::Disable,
            SslMode::Prefer => DriverMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverMode::Require,
        });
        let identity = match (&settings.cert, &settings.key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Message(
                    "sslcert is given without sslkey".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::Message(
                    "sslkey is given without sslcert".into(),
                ));
            }
        };
        let tls = match mode {
            SslMode::Disable => None,
            _ => Some(MakeRustlsConnect::new(
                client_config(mode, root_cert, identity).map_err(ConfigError::Message)?,
            )),
        };
        Ok((config, Connector { tls }))
    }

    /// Opens one connection.
    pub(crate) fn connect(&self, config: &Config) -> Result<Client, postgres::Error> {
        match &self.tls {
            None => config.connect(NoTls),
            Some(tls) => config.connect(tls.clone()),
        }
    }
}

/// Why a connection string cannot be used.
#[derive(Debug)]
pub(crate) enum ConfigError {
    /// Refused by the driver's parser.
    Driver(postgres::Error),
    /// Refused here (sslmode, sslrootcert, quoting).
    Message(String),
}

/// The ring provider, as the HTTP clients use it (deprecated by rustls 0.23.48 for lacking the
/// post-quantum key exchange, which is aws-lc-rs's; ring stays the one provider, as
/// runtime-tokio/src/http.rs says).
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration for `mode` (not `Disable`), with the client certificate chain
/// and key files of `identity`, if any.
fn client_config(
    mode: SslMode,
    root_cert: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let roots = match root_cert {
        Some(p) if p.as_os_str() == "system" => Some(webpki_roots()),
        Some(p) => Some(read_roots(p)?),
        None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => Some(webpki_roots()),
        None => None,
    };
    let chain = match roots {
        None => None,
        Some(roots) => {
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .map_err(|e| format!("TLS setup: {e}"))?;
            if mode == SslMode::VerifyFull {
                return finish(
                    builder.dangerous().with_custom_certificate_verifier(webpki),
                    identity,
                );
            }
            Some(webpki)
        }
    };
    let verifier = Arc::new(Lenient {
        chain,
        algorithms: provider.signature_verification_algorithms,
    });
    finish(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier),
        identity,
    )
}

/// The configuration, with the client certificate chain and key files of `identity`, if any.
fn finish(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, String> {
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let (chain, key) = read_identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("sslcert/sslkey: {e}"))
        }
    }
}

/// The client certificate chain and private key of PEM files `cert` and `key`.
fn read_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let (shown_cert, shown_key) = (cert.display(), key.display());
    let pem = std::fs::read(cert).map_err(|e| format!("cannot read sslcert {shown_cert}: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("sslcert {shown_cert} is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err(format!("sslcert {shown_cert} holds no certificate"));
    }
    let pem = std::fs::read(key).map_err(|e| format!("cannot read sslkey {shown_key}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("sslkey {shown_key} holds no usable private key: {e}"))?;
    Ok((chain, key))
}

fn webpki_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// The certificates of the PEM file at `path`.
fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read sslrootcert {shown}: {e}"))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("sslrootcert {shown} is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {shown} holds a bad certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {shown} holds no certificate"));
    }
    Ok(roots)
}

/// The verifier of every mode but `verify-full`. Without `chain` (`prefer` and `require`
/// without a CA file): encrypted, but any certificate is accepted (as libpq does). With it
/// (`verify-ca`, and `prefer`/`require` with a CA file): the chain must lead to a root, the
/// host name need not match; webpki checks the chain before the name, so a name mismatch
/// means the chain was good. The handshake signatures are checked either way, so the peer
/// holds the key of the certificate it sent.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What to do about a certificate the handshake refused, if that is why `e` failed. rustls's
/// error sits inside an `io::Error`, whose `source()` skips it: `get_ref` reaches it.
pub(crate) fn hint(e: &postgres::Error) -> Option<&'static str> {
    let io = core::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
    match io.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            Some("set sslrootcert to the CA file that signed the server's certificate")
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => Some("connect by a name in the certificate, or use sslmode=verify-ca"),
        _ => None,
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
    fn a_missing_or_empty_ca_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let e = client_config(SslMode::VerifyFull, Some(&missing), None).expect_err("missing");
        assert!(
            e.contains("cannot read sslrootcert") && e.contains("missing.pem"),
            "{e}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = client_config(SslMode::VerifyFull, Some(&empty), None).expect_err("empty");
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
