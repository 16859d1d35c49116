//! The HTTP Signatures signer ([`HttpSignatures`]): a key per actor, from Rust or a TOML keys
//! file, signing each request in the scheme it asks for: RFC 9421 (`sign/rfc9421.rs`) or
//! draft-cavage (here, [`HttpSignatures::headers`]).

use core::fmt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use outbox_lanes_core::ActorId;
use outbox_lanes_core::policy::Recipient;
use rsa::sha2 as rsa_sha2;

use super::key_file::read_key_file;
use super::{ActorKey, KeyError, SignError, SignRequest, SignatureSpec, Signer, rfc9421};

/// The headers a draft-cavage [`HttpSignatures`] signature covers, in order (the `headers`
/// parameter).
pub const SIGNED_HEADERS: &str = "(request-target) host date digest";

/// An HTTP Signatures signer with a key per actor (RSA or Ed25519), in the scheme each
/// request asks for ([`SignRequest::spec`]): RFC 9421 or draft-cavage.
///
/// Under [`SignatureSpec::Rfc9421`] it adds `Content-Digest`, `Signature-Input` and
/// `Signature` (see the [module documentation](crate::sign) for what is covered, and the
/// `Accept-Signature` challenge).
///
/// Under [`SignatureSpec::Cavage`] (draft-cavage-http-signatures-12, as Mastodon verifies it)
/// it adds three headers ([`HttpSignatures::headers`]):
/// - `Date`: the attempt's time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`), fresh on
///   every retry (receivers refuse dates more than a few minutes off, Mastodon 12 hours,
///   GoToSocial 30 seconds);
/// - `Digest`: `SHA-256=` and the base64 of the body's SHA-256;
/// - `Signature`: `keyId="…",algorithm="rsa-sha256",headers="(request-target) host date
///   digest",signature="…"` (`algorithm="hs2019"` with an Ed25519 key), the signature being
///   the base64 of the RSASSA-PKCS1-v1_5 SHA-256 (or Ed25519) signature of the signing
///   string
///   ```text
///   (request-target): post /inbox
///   host: example.com
///   date: Sun, 06 Nov 1994 08:49:37 GMT
///   digest: SHA-256=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=
///   ```
///   (lines joined by `\n`), where the request target is the recipient's path and query and
///   `host` is exactly the `Host` header the clients send: the host, with `:port` when the
///   port is not the scheme's default.
///
/// The key is picked by [`SignRequest::actor`]; an actor without a key is a
/// [`SignError::NoKey`] and the request is not sent (see the [module documentation](crate::sign)).
///
/// Build it from Rust with [`HttpSignatures::insert`], or from a TOML keys file with
/// [`HttpSignatures::from_keys_file`]:
///
/// ```toml
/// [actors."https://example.com/users/alice"]
/// key_id = "https://example.com/users/alice#main-key"
/// private_key_file = "alice.pem"      # relative to the keys file's directory
///
/// [actors."https://example.com/users/bob"]
/// key_id = "https://example.com/users/bob#main-key"
/// private_key_pem = """
/// -----BEGIN PRIVATE KEY-----
/// ...
/// -----END PRIVATE KEY-----
/// """
/// ```
///
/// A key is RSA (PKCS#1 or PKCS#8) or Ed25519 (PKCS#8, `BEGIN PRIVATE KEY`): the key itself
/// says which, so the file names no algorithm.
///
/// The RSA private-key operation is blinded with fresh randomness from the OS on every
/// signature (RSA blinding, against timing attacks on the key).
#[derive(Clone, Default)]
pub struct HttpSignatures {
    keys: BTreeMap<String, ActorKey>,
}

/// Why a keys file was not accepted.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeysFileError {
    /// The file could not be read.
    Read {
        /// The keys file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or not a table of `[actors."<actor>"]` tables.
    Syntax {
        /// The keys file.
        path: PathBuf,
        /// What the parser said (with the line and column).
        message: String,
    },
    /// The file names no actor at all: nothing could ever be signed.
    NoActors {
        /// The keys file.
        path: PathBuf,
    },
    /// Some entries are wrong: each with its actor and why, in the file's order of actors.
    Entries {
        /// The keys file.
        path: PathBuf,
        /// `(actor, what is wrong)` for every bad entry.
        errors: Vec<(String, String)>,
    },
}

impl fmt::Display for KeysFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeysFileError::Read { path, error } => {
                write!(
                    f,
                    "cannot read the signing keys file {}: {error}",
                    path.display()
                )
            }
            KeysFileError::Syntax { path, message } => write!(
                f,
                "the signing keys file {} is not valid: {}",
                path.display(),
                message.trim_end()
            ),
            KeysFileError::NoActors { path } => write!(
                f,
                "the signing keys file {} has no [actors.\"<actor>\"] entry",
                path.display()
            ),
            KeysFileError::Entries { path, errors } => {
                write!(
                    f,
                    "the signing keys file {} has bad entries:",
                    path.display()
                )?;
                for (actor, why) in errors {
                    write!(f, "\n  [actors.{actor:?}]: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for KeysFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeysFileError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl HttpSignatures {
    /// A signer with no keys yet.
    pub fn new() -> Self {
        HttpSignatures::default()
    }

    /// A signer with one actor's key, read from its key id and PEM private key as
    /// [`ActorKey::from_pem`] reads it; [`with_key`](HttpSignatures::with_key) adds more:
    ///
    /// ```no_run
    /// # use outbox_lanes_driver::sign::HttpSignatures;
    /// # let (alice_pem, bob_pem) = (String::new(), String::new());
    /// let keys = HttpSignatures::from_pem(
    ///     "https://example.com/users/alice",
    ///     "https://example.com/users/alice#main-key",
    ///     &alice_pem,
    /// )?
    /// .with_key(
    ///     "https://example.com/users/bob",
    ///     "https://example.com/users/bob#main-key",
    ///     &bob_pem,
    /// )?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`ActorKey::from_pem`].
    pub fn from_pem(
        actor: impl Into<ActorId>,
        key_id: impl Into<String>,
        pem: &str,
    ) -> Result<Self, KeyError> {
        HttpSignatures::new().with_key(actor, key_id, pem)
    }

    /// This signer with `actor`'s key (the canonical actor id, as the outbox's resolver gives
    /// it) read from its key id and PEM private key as [`ActorKey::from_pem`] reads it,
    /// replacing a key the actor had.
    ///
    /// # Errors
    /// As [`ActorKey::from_pem`].
    pub fn with_key(
        mut self,
        actor: impl Into<ActorId>,
        key_id: impl Into<String>,
        pem: &str,
    ) -> Result<Self, KeyError> {
        self.insert(actor, ActorKey::from_pem(key_id, pem)?);
        Ok(self)
    }

    /// Sets `actor`'s key (the canonical actor id, as the outbox's resolver gives it);
    /// returns the key it replaces.
    pub fn insert(&mut self, actor: impl Into<ActorId>, key: ActorKey) -> Option<ActorKey> {
        self.keys.insert(Into::<ActorId>::into(actor).into(), key)
    }

    /// The key of `actor`, if it has one.
    pub fn key(&self, actor: &str) -> Option<&ActorKey> {
        self.keys.get(actor)
    }

    /// The actors with a key, in order.
    pub fn actors(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Loads a TOML keys file (see the [type documentation](HttpSignatures) for its
    /// format). A `private_key_file` is read relative to the keys file's directory.
    ///
    /// # Errors
    /// [`KeysFileError`]: the file cannot be read, is not TOML of the expected shape, names
    /// no actor, or has bad entries (every one of them is listed, with its actor).
    pub fn from_keys_file(path: impl AsRef<Path>) -> Result<Self, KeysFileError> {
        let path = path.as_ref();
        let text = read_key_file(path).map_err(|error| KeysFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        HttpSignatures::from_toml(&text, path, dir)
    }

    /// Parses the text of a keys file; `path` is only used in errors, `dir` is where
    /// relative `private_key_file` paths are read from.
    ///
    /// # Errors
    /// As [`HttpSignatures::from_keys_file`], except reading the file itself.
    pub fn from_toml(text: &str, path: &Path, dir: &Path) -> Result<Self, KeysFileError> {
        let syntax = |message: String| KeysFileError::Syntax {
            path: path.to_owned(),
            message,
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        if let Some(other) = table.keys().find(|k| *k != "actors") {
            return Err(syntax(format!(
                "unknown key {other:?} at the top level (only [actors.\"<actor>\"] tables)"
            )));
        }
        let actors = match table.get("actors") {
            None => {
                return Err(KeysFileError::NoActors {
                    path: path.to_owned(),
                });
            }
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                return Err(syntax(
                    "`actors` must be tables: [actors.\"<actor>\"]".to_owned(),
                ));
            }
        };
        if actors.is_empty() {
            return Err(KeysFileError::NoActors {
                path: path.to_owned(),
            });
        }
        let mut signer = HttpSignatures::new();
        let mut errors = Vec::new();
        // One bad entry does not hide the others: every one is checked and reported.
        for (actor, entry) in actors {
            match entry_key(actor, entry, dir) {
                Ok(key) => {
                    signer.insert(actor.clone(), key);
                }
                Err(why) => errors.push((actor.clone(), why)),
            }
        }
        if errors.is_empty() {
            Ok(signer)
        } else {
            Err(KeysFileError::Entries {
                path: path.to_owned(),
                errors,
            })
        }
    }

    /// The draft-cavage `Date`, `Digest` and `Signature` headers for a POST of `body` to
    /// `recipient` at `at`, signed with `key` (`rsa-sha256`, or `hs2019` with an Ed25519
    /// key).
    ///
    /// # Errors
    /// [`SignError::Failed`] when the RSA operation fails.
    pub fn headers(
        key: &ActorKey,
        url: &Recipient,
        body: &[u8],
        at: SystemTime,
    ) -> Result<Vec<(String, String)>, SignError> {
        let mut host = url.host().to_string();
        if url.port() != url.scheme().default_port() {
            host.push(':');
            host.push_str(&url.port().to_string());
        }
        let date = httpdate::fmt_http_date(at);
        let digest = format!(
            "SHA-256={}",
            BASE64.encode(<rsa_sha2::Sha256 as rsa_sha2::Digest>::digest(body))
        );
        let signing_string = format!(
            "(request-target): post {}\nhost: {host}\ndate: {date}\ndigest: {digest}",
            url.path_and_query()
        );
        let signature = key.sign_bytes(signing_string.as_bytes())?;
        let signature = format!(
            "keyId=\"{}\",algorithm=\"{}\",headers=\"{SIGNED_HEADERS}\",signature=\"{}\"",
            key.key_id(),
            key.algorithm().cavage_algorithm(),
            BASE64.encode(signature)
        );
        Ok(vec![
            ("Date".to_owned(), date),
            ("Digest".to_owned(), digest),
            ("Signature".to_owned(), signature),
        ])
    }
}

/// One `[actors."<actor>"]` entry's key, or what is wrong with it.
fn entry_key(actor: &str, entry: &toml::Value, dir: &Path) -> Result<ActorKey, String> {
    if actor.trim().is_empty() {
        return Err("the actor id is empty".to_owned());
    }
    let Some(entry) = entry.as_table() else {
        return Err("must be a table with key_id and private_key_pem or private_key_file".into());
    };
    if let Some(other) = entry.keys().find(|k| {
        !matches!(
            k.as_str(),
            "key_id" | "private_key_pem" | "private_key_file"
        )
    }) {
        return Err(format!(
            "unknown key {other:?} (expected key_id, private_key_pem or private_key_file)"
        ));
    }
    let text = |name: &str| -> Result<Option<&str>, String> {
        match entry.get(name) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(format!("{name} must be a string")),
        }
    };
    let key_id = text("key_id")?.ok_or("key_id is missing")?;
    let pem = match (text("private_key_pem")?, text("private_key_file")?) {
        (Some(pem), None) => pem.to_owned(),
        (None, Some(file)) => {
            let file = dir.join(file);
            read_key_file(&file)
                .map_err(|e| format!("cannot read private_key_file {}: {e}", file.display()))?
        }
        (Some(_), Some(_)) => {
            return Err("give private_key_pem or private_key_file, not both".to_owned());
        }
        (None, None) => return Err("private_key_pem or private_key_file is missing".to_owned()),
    };
    ActorKey::from_pem(key_id, &pem).map_err(|e| e.to_string())
}

impl Signer for HttpSignatures {
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        let key = self.keys.get(req.actor).ok_or_else(|| SignError::NoKey {
            actor: req.actor.to_owned(),
        })?;
        match req.spec {
            SignatureSpec::Rfc9421 => rfc9421::headers(key, req),
            SignatureSpec::Cavage => HttpSignatures::headers(key, req.recipient, req.body, req.at),
        }
    }

    fn http_signatures(&self) -> bool {
        true
    }

    fn honours_challenge(&self, actor: &str, challenge: &str, body_len: usize) -> bool {
        self.keys
            .get(actor)
            .is_some_and(|key| rfc9421::honours(challenge, key, body_len))
    }
}

impl fmt::Debug for HttpSignatures {
    /// The actors and key ids, never the private keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.keys.iter().map(|(a, k)| (a, k.key_id())))
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use crate::sign::{KeyAlgorithm, StandardWebhooks};
    use outbox_lanes_core::UnitId;
    use outbox_lanes_test_support::signatures::{
        ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PRIVATE_PKCS1, BOB_PUBLIC, CAROL_ED25519_PRIVATE,
        CAROL_ED25519_PUBLIC, P256_PRIVATE_PKCS8,
    };
    use rsa::pkcs1v15::{Signature, VerifyingKey};
    use rsa::pkcs8::DecodePublicKey as _;
    use rsa::signature::Verifier as _;
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    const ALICE: &str = "https://example.com/users/alice";
    const BOB: &str = "https://example.com/users/bob";

    fn signer() -> HttpSignatures {
        let mut s = HttpSignatures::new();
        s.insert(
            ALICE,
            ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).unwrap(),
        );
        s.insert(
            BOB,
            ActorKey::from_pem(format!("{BOB}#main-key"), BOB_PRIVATE_PKCS1).unwrap(),
        );
        s
    }

    fn req<'a>(actor: &'a str, recipient: &'a Recipient, body: &'a [u8]) -> SignRequest<'a> {
        SignRequest {
            actor,
            unit: UnitId(9),
            idempotency_key: "0123abcd-9",
            recipient,
            body,
            content_type: "application/activity+json",
            at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_500),
            attempt: 1,
            spec: SignatureSpec::Cavage,
            challenge: None,
        }
    }

    fn verify(public: &str, signing_string: &str, signature_header: &str) -> bool {
        let b64 = signature_header
            .rsplit_once("signature=\"")
            .unwrap()
            .1
            .trim_end_matches('"');
        let sig = Signature::try_from(BASE64.decode(b64).unwrap().as_slice()).unwrap();
        let key = rsa::RsaPublicKey::from_public_key_pem(public).unwrap();
        VerifyingKey::<rsa_sha2::Sha256>::new(key)
            .verify(signing_string.as_bytes(), &sig)
            .is_ok()
    }

    /// The headers and signing string written out by hand from draft-cavage §2.3, for a
    /// PKCS#8 key (non-default port: `host` carries it) and a PKCS#1 key (default port).
    #[test]
    fn signs_the_cavage_string_with_each_actors_key() {
        let s = signer();
        let cases = [
            (
                ALICE,
                ALICE_PUBLIC,
                "https://inbox.example:8443/users/x/inbox?a=1",
                "inbox.example:8443",
                "/users/x/inbox?a=1",
            ),
            (
                BOB,
                BOB_PUBLIC,
                "https://inbox.example/inbox",
                "inbox.example",
                "/inbox",
            ),
        ];
        for (actor, public, url, host, target) in cases {
            let url = Recipient::parse(url).unwrap();
            let headers = s.sign(&req(actor, &url, b"{}")).unwrap();
            let names: Vec<_> = headers.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["Date", "Digest", "Signature"]);
            let date = "Tue, 14 Nov 2023 22:13:20 GMT";
            let digest = "SHA-256=RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=";
            assert_eq!(headers[0].1, date);
            assert_eq!(headers[1].1, digest);
            let sig = &headers[2].1;
            assert!(
                sig.starts_with(&format!(
                    "keyId=\"{actor}#main-key\",algorithm=\"rsa-sha256\",\
                     headers=\"(request-target) host date digest\",signature=\""
                )),
                "{sig}"
            );
            let string = format!(
                "(request-target): post {target}\nhost: {host}\ndate: {date}\ndigest: {digest}"
            );
            assert!(verify(public, &string, sig), "{actor}");
            // Another body, host or key does not verify.
            assert!(!verify(
                public,
                &string.replace("{}", "[]").replace("post", "get"),
                sig
            ));
            let other = if public == ALICE_PUBLIC {
                BOB_PUBLIC
            } else {
                ALICE_PUBLIC
            };
            assert!(!verify(other, &string, sig));
        }
        // http on 80 and an IPv6 literal: the Host header forms the clients send.
        let h = HttpSignatures::headers(
            s.key(ALICE).unwrap(),
            &Recipient::parse("http://[::1]:8080/i").unwrap(),
            b"",
            UNIX_EPOCH,
        )
        .unwrap();
        let string = format!(
            "(request-target): post /i\nhost: [::1]:8080\ndate: {}\ndigest: {}",
            h[0].1, h[1].1
        );
        assert!(verify(ALICE_PUBLIC, &string, &h[2].1));
    }

    #[test]
    fn an_actor_without_a_key_is_an_error_not_an_unsigned_request() {
        let s = signer();
        let to = Recipient::parse("https://x.example/i").unwrap();
        let err = s.sign(&req("https://example.com/users/carol", &to, b"{}"));
        assert_eq!(
            err,
            Err(SignError::NoKey {
                actor: "https://example.com/users/carol".to_owned()
            })
        );
        assert!(err.unwrap_err().to_string().contains("users/carol"));
    }

    #[test]
    fn keys_file_with_inline_and_relative_file_keys() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys/bob.pem"), BOB_PRIVATE_PKCS1).unwrap();
        let file = dir.path().join("signing.toml");
        std::fs::write(
            &file,
            format!(
                "[actors.\"{ALICE}\"]\nkey_id = \"{ALICE}#main-key\"\n\
                 private_key_pem = \"\"\"\n{ALICE_PRIVATE_PKCS8}\"\"\"\n\n\
                 [actors.\"{BOB}\"]\nkey_id = \"{BOB}#main-key\"\n\
                 private_key_file = \"keys/bob.pem\"\n"
            ),
        )
        .unwrap();
        let s = HttpSignatures::from_keys_file(&file).unwrap();
        assert_eq!(s.actors().collect::<Vec<_>>(), [ALICE, BOB]);
        assert_eq!(s.key(BOB).unwrap().key_id(), format!("{BOB}#main-key"));
        let debug = format!("{s:?}");
        assert!(
            debug.contains("#main-key") && !debug.contains("PRIVATE"),
            "{debug}"
        );
    }

    #[test]
    fn every_bad_entry_of_a_keys_file_is_named() {
        let short = include_str!("../../../test-support/keys/short1024.pkcs1.pem");
        let text = format!(
            "[actors.a]\nprivate_key_pem = \"x\"\n\
             [actors.b]\nkey_id = \"k\"\n\
             [actors.c]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PUBLIC}\"\"\"\n\
             [actors.d]\nkey_id = \"k\"\nprivate_key_file = \"missing.pem\"\n\
             [actors.e]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{short}\"\"\"\n\
             [actors.f]\nkey_id = \"k\"\nprivate_key_pem = \"x\"\nprivate_key_file = \"y\"\n\
             [actors.g]\nkey_id = \"k\"\nprivate_key = \"x\"\n\
             [actors.h]\nkey_id = 'a\"b'\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n\
             [actors.i]\nkey_id = \"k\"\nprivate_key_pem = \"not a key\"\n\
             [actors.ok]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = HttpSignatures::from_toml(&text, Path::new("keys.toml"), dir.path()).unwrap_err();
        let KeysFileError::Entries { errors, .. } = &err else {
            panic!("{err}")
        };
        let actors: Vec<_> = errors.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(actors, ["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
        let why = |a: &str| &errors.iter().find(|(x, _)| x == a).unwrap().1;
        assert!(why("a").contains("key_id is missing"));
        assert!(why("b").contains("missing"));
        assert!(why("c").contains("public key"));
        assert!(why("d").contains("missing.pem"));
        assert!(why("e").contains("1024 bits"));
        assert!(why("f").contains("not both"));
        assert!(why("g").contains("unknown key \"private_key\""));
        assert!(why("h").contains("double quote"));
        assert!(why("i").contains("no PEM private key"));
        let text = err.to_string();
        assert!(text.starts_with("the signing keys file keys.toml has bad entries:"));
        assert!(
            text.contains("[actors.\"e\"]: the RSA key has 1024 bits"),
            "{text}"
        );
    }

    #[test]
    fn a_keys_file_of_the_wrong_shape_is_refused() {
        let p = Path::new("k.toml");
        let d = Path::new(".");
        let syntax = |t: &str| match HttpSignatures::from_toml(t, p, d) {
            Err(KeysFileError::Syntax { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert!(syntax("[actors.a\n").contains("line 1"));
        assert!(syntax("actor = 1\n").contains("unknown key \"actor\""));
        assert!(syntax("actors = 1\n").contains("[actors."));
        for empty in ["", "[actors]\n"] {
            assert!(matches!(
                HttpSignatures::from_toml(empty, p, d),
                Err(KeysFileError::NoActors { .. })
            ));
        }
        let missing = HttpSignatures::from_keys_file("/nonexistent/keys.toml").unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/keys.toml"),
            "{missing}"
        );
    }

    #[test]
    fn key_errors() {
        assert_eq!(
            ActorKey::from_pem(" ", ALICE_PRIVATE_PKCS8).unwrap_err(),
            KeyError::EmptyKeyId
        );
        assert_eq!(
            ActorKey::from_pem("k\n", ALICE_PRIVATE_PKCS8).unwrap_err(),
            KeyError::BadKeyId
        );
        assert_eq!(
            ActorKey::from_pem(
                "k",
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----"
            )
            .unwrap_err(),
            KeyError::Encrypted
        );
        assert!(matches!(
            ActorKey::from_pem("k", &ALICE_PRIVATE_PKCS8.replace("MII", "XII")),
            Err(KeyError::Invalid(_))
        ));
    }

    /// One call per actor: `from_pem` and `with_key` read the key as `ActorKey::from_pem`
    /// does, take the actor in any form, and sign as keys inserted one by one do.
    #[test]
    fn keys_by_value_in_one_call_each() {
        const CAROL: &str = "https://example.com/users/carol";
        let bob = ActorId::new(BOB);
        let carol = String::from(CAROL);
        let s = HttpSignatures::from_pem(ALICE, format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8)
            .unwrap()
            .with_key(&bob, format!("{BOB}#main-key"), BOB_PRIVATE_PKCS1)
            .unwrap()
            .with_key(&carol, "carol-key", CAROL_ED25519_PRIVATE)
            .unwrap();
        assert_eq!(s.actors().collect::<Vec<_>>(), [ALICE, BOB, CAROL]);
        assert_eq!(s.key(BOB).unwrap().key_id(), format!("{BOB}#main-key"));
        assert_eq!(s.key(CAROL).unwrap().algorithm(), KeyAlgorithm::Ed25519);
        let url = Recipient::parse("https://b.example/inbox").unwrap();
        for actor in [ALICE, BOB] {
            assert_eq!(
                s.sign(&req(actor, &url, b"{}")).unwrap(),
                signer().sign(&req(actor, &url, b"{}")).unwrap(),
                "{actor}"
            );
        }
        // A key replaced by a later one for the same actor.
        let s = s.with_key(BOB, "bob-2", BOB_PRIVATE_PKCS1).unwrap();
        assert_eq!(s.key(BOB).unwrap().key_id(), "bob-2");
        // A refused key is the key's error.
        assert_eq!(
            HttpSignatures::from_pem(ALICE, " ", ALICE_PRIVATE_PKCS8).unwrap_err(),
            KeyError::EmptyKeyId
        );
        assert!(matches!(
            s.with_key("dave", "k", P256_PRIVATE_PKCS8),
            Err(KeyError::Unsupported { .. })
        ));
    }

    #[test]
    fn an_ed25519_key_signs_cavage_as_hs2019() {
        use ed25519_dalek::Verifier as _;
        use ed25519_dalek::pkcs8::DecodePublicKey as _;
        const CAROL: &str = "https://example.com/users/carol";
        let key = ActorKey::from_pem(format!("{CAROL}#key"), CAROL_ED25519_PRIVATE).unwrap();
        assert_eq!(key.algorithm(), KeyAlgorithm::Ed25519);
        assert_eq!(key.algorithm().cavage_algorithm(), "hs2019");
        assert!(format!("{key:?}").contains("Ed25519"));
        let mut s = HttpSignatures::new();
        s.insert(CAROL, key);
        let url = Recipient::parse("http://[::1]:8080/i").unwrap();
        let h = s.sign(&req(CAROL, &url, b"{}")).unwrap();
        let names: Vec<_> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Date", "Digest", "Signature"]);
        let prefix = format!(
            "keyId=\"{CAROL}#key\",algorithm=\"hs2019\",\
             headers=\"(request-target) host date digest\",signature=\""
        );
        let b64 = h[2]
            .1
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{}", h[2].1));
        let sig = ed25519_dalek::Signature::from_slice(&BASE64.decode(b64).unwrap()).unwrap();
        let public =
            ed25519_dalek::VerifyingKey::from_public_key_pem(CAROL_ED25519_PUBLIC).unwrap();
        let string = format!(
            "(request-target): post /i\nhost: [::1]:8080\ndate: {}\ndigest: {}",
            h[0].1, h[1].1
        );
        assert!(public.verify(string.as_bytes(), &sig).is_ok());
        assert!(
            public
                .verify(string.replace("/i", "/j").as_bytes(), &sig)
                .is_err()
        );
    }

    #[test]
    fn the_key_tells_its_algorithm() {
        for (pem, alg) in [
            (ALICE_PRIVATE_PKCS8, KeyAlgorithm::Rsa),
            (BOB_PRIVATE_PKCS1, KeyAlgorithm::Rsa),
            (CAROL_ED25519_PRIVATE, KeyAlgorithm::Ed25519),
        ] {
            assert_eq!(ActorKey::from_pem("k", pem).unwrap().algorithm(), alg);
        }
        assert_eq!(KeyAlgorithm::Rsa.rfc9421_alg(), "rsa-v1_5-sha256");
        assert_eq!(KeyAlgorithm::Ed25519.rfc9421_alg(), "ed25519");
        assert_eq!(KeyAlgorithm::Rsa.cavage_algorithm(), "rsa-sha256");
        let err = ActorKey::from_pem("k", P256_PRIVATE_PKCS8).unwrap_err();
        assert_eq!(
            err,
            KeyError::Unsupported {
                oid: "1.2.840.10045.2.1".to_owned()
            }
        );
        assert!(err.to_string().contains("not RSA or Ed25519"), "{err}");
        // A PKCS#8 block whose content is no key at all, and an Ed25519 key cut short.
        for bad in [
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIIVMcfUANtQiOi/ngTDljDyr\n\
             -----END PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----\n\u{e9}\n-----END PRIVATE KEY-----",
        ] {
            assert!(
                matches!(ActorKey::from_pem("k", bad), Err(KeyError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_keys_file_takes_ed25519_keys_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("carol.pem"), CAROL_ED25519_PRIVATE).unwrap();
        let text = format!(
            "[actors.carol]\nkey_id = \"https://example.com/users/carol#key\"\n\
             private_key_file = \"carol.pem\"\n\
             [actors.alice]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n\
             [actors.ec]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{P256_PRIVATE_PKCS8}\"\"\"\n"
        );
        let err = HttpSignatures::from_toml(&text, Path::new("keys.toml"), dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("[actors.\"ec\"]: the PKCS#8 key's algorithm (OID 1.2.840.10045.2.1)"),
            "{err}"
        );
        let text = text.split("[actors.ec]").next().unwrap();
        let s = HttpSignatures::from_toml(text, Path::new("keys.toml"), dir.path()).unwrap();
        assert_eq!(s.key("carol").unwrap().algorithm(), KeyAlgorithm::Ed25519);
        assert_eq!(s.key("alice").unwrap().algorithm(), KeyAlgorithm::Rsa);
    }

    #[test]
    fn the_spec_picks_the_scheme_and_has_a_code() {
        let s = signer();
        assert!(s.http_signatures());
        assert!(!StandardWebhooks::new(&b"k"[..]).unwrap().http_signatures());
        let url = Recipient::parse("https://inbox.example/inbox").unwrap();
        let mut r = req(ALICE, &url, b"{}");
        let names = |h: Vec<(String, String)>| h.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(s.sign(&r).unwrap()), ["Date", "Digest", "Signature"]);
        r.spec = SignatureSpec::Rfc9421;
        assert_eq!(
            names(s.sign(&r).unwrap()),
            ["Content-Digest", "Signature-Input", "Signature"]
        );
        // A challenge means nothing to draft-cavage.
        r.spec = SignatureSpec::Cavage;
        r.challenge = Some("sig1=(\"date\")");
        assert_eq!(names(s.sign(&r).unwrap()), ["Date", "Digest", "Signature"]);
        for spec in [SignatureSpec::Rfc9421, SignatureSpec::Cavage] {
            assert_eq!(SignatureSpec::from_code(spec.as_str()), Some(spec));
        }
        assert_eq!(SignatureSpec::Rfc9421.as_str(), "rfc9421");
        assert_eq!(SignatureSpec::Cavage.as_str(), "cavage");
        for other in ["", "RFC9421", "auto", "cavage "] {
            assert_eq!(SignatureSpec::from_code(other), None);
        }
    }
}
