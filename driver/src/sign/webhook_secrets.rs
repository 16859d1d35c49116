//! Standard Webhooks secrets per actor (a customer) and per endpoint: [`WebhookSecrets`], the
//! table, and its TOML file.
//!
//! One secret shared by every customer lets any of them forge the webhooks of another; here
//! each actor has secrets of its own, an endpoint (a recipient URL) of an actor may have its
//! own too, and each entry may hold several secrets, which all sign side by side while its
//! receiver moves to a new one ([`StandardWebhooks`]). A request whose actor has no entry
//! is not signed with someone else's secret, nor sent unsigned: the signer answers
//! [`SignError::NoKey`] and the attempt is not sent (retried later, not counted).
//!
//! The file format is [`WebhookSecrets`]'s documentation;
//! [`WebhookSecretsFile`](super::WebhookSecretsFile) (`sign/webhook_secrets_file.rs`) reads
//! it again when it changes.

use core::fmt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use outbox_lanes_core::ActorId;
use outbox_lanes_core::policy::Recipient;

use super::key_file::read_key_file;
use super::{SignError, SignRequest, Signer, StandardWebhooks};

/// Standard Webhooks secrets per actor, and per endpoint of an actor.
///
/// A request is signed with the secrets of its recipient's entry under its actor when there
/// is one (matched on the canonical URL, so `HTTPS://Hooks.Example:443/a` is
/// `https://hooks.example/a`), else with its actor's secrets; an actor with neither is a
/// [`SignError::NoKey`] (not sent). There is no default entry: a customer forgotten in the
/// table would otherwise be signed with a secret another customer holds.
///
/// ```
/// use outbox_lanes_core::policy::Recipient;
/// use outbox_lanes_driver::sign::{StandardWebhooks, WebhookSecrets};
///
/// let mut secrets = WebhookSecrets::new();
/// // Every endpoint of shop-1, while it moves from one secret to the next: both sign.
/// secrets.insert("shop-1", StandardWebhooks::from_whsec(
///     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_b3V0Ym94LWxhbmVzIHRlc3Qgc2VjcmV0")?);
/// // One endpoint of shop-2 with a secret of its own.
/// let orders = Recipient::parse("https://hooks.shop2.example/orders")?;
/// secrets.insert_endpoint("shop-2", &orders,
///     StandardWebhooks::from_whsec("whsec_c2hvcC0yJ3Mgb3JkZXJzIGVuZHBvaW50IHNlY3JldA==")?);
/// assert_eq!(secrets.get("shop-1", &orders).map(|s| s.secret_count()), Some(2));
/// assert!(secrets.get("shop-2", &Recipient::parse("https://hooks.shop2.example/x")?).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// From a TOML file ([`WebhookSecrets::from_file`];
/// [`WebhookSecretsFile`](super::WebhookSecretsFile) reads it again when it changes):
///
/// ```toml
/// [actors."shop-1"]
/// secrets = ["whsec_…old…", "whsec_…new…"]   # both sign while shop-1 rotates
///
/// [actors."shop-2".recipients."https://hooks.shop2.example/orders"]
/// secrets = ["whsec_…"]
/// ```
#[derive(Clone, Default)]
pub struct WebhookSecrets {
    actors: BTreeMap<String, ActorSecrets>,
}

/// One actor's entry.
#[derive(Clone, Default)]
struct ActorSecrets {
    /// For every endpoint without secrets of its own.
    every: Option<StandardWebhooks>,
    /// By canonical recipient URL.
    endpoints: BTreeMap<String, StandardWebhooks>,
}

impl WebhookSecrets {
    /// An empty table: every request is [`SignError::NoKey`] until entries are added.
    pub fn new() -> Self {
        WebhookSecrets::default()
    }

    /// Sets `actor`'s secrets (the canonical actor id, as the outbox's resolver gives it),
    /// for each of its endpoints that has none of its own; returns the secrets replaced.
    pub fn insert(
        &mut self,
        actor: impl Into<ActorId>,
        secrets: StandardWebhooks,
    ) -> Option<StandardWebhooks> {
        self.actors
            .entry(Into::<ActorId>::into(actor).into())
            .or_default()
            .every
            .replace(secrets)
    }

    /// Sets the secrets of `actor`'s requests to `recipient`; returns the secrets replaced.
    pub fn insert_endpoint(
        &mut self,
        actor: impl Into<ActorId>,
        recipient: &Recipient,
        secrets: StandardWebhooks,
    ) -> Option<StandardWebhooks> {
        self.actors
            .entry(Into::<ActorId>::into(actor).into())
            .or_default()
            .endpoints
            .insert(recipient.as_str().to_owned(), secrets)
    }

    /// The secrets that sign `actor`'s requests to `recipient`, if any.
    pub fn get(&self, actor: &str, recipient: &Recipient) -> Option<&StandardWebhooks> {
        let entry = self.actors.get(actor)?;
        entry
            .endpoints
            .get(recipient.as_str())
            .or(entry.every.as_ref())
    }

    /// Whether `actor` has an entry (secrets for all its endpoints, or for some).
    pub fn has_actor(&self, actor: &str) -> bool {
        self.actors.contains_key(actor)
    }

    /// The actors with an entry, in order.
    pub fn actors(&self) -> impl Iterator<Item = &str> {
        self.actors.keys().map(String::as_str)
    }

    /// Reads a TOML secrets file (see the [type documentation](WebhookSecrets) for its
    /// format). It must be a regular file of at most 1 MiB; one its group or others can read
    /// is logged at WARN, once.
    ///
    /// # Errors
    /// [`SecretsFileError`]: the file cannot be read, is not TOML of the expected shape,
    /// names no actor, or has bad entries (every one of them is listed).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SecretsFileError> {
        let path = path.as_ref();
        let text = read_key_file(path).map_err(|error| SecretsFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        WebhookSecrets::from_toml(&text, path)
    }

    /// Parses the text of a secrets file; `path` is only used in errors.
    ///
    /// # Errors
    /// As [`WebhookSecrets::from_file`], except reading the file itself.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, SecretsFileError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, path, &e))?;
        let syntax = |message: &str| SecretsFileError::Syntax {
            path: path.to_owned(),
            line: None,
            message: message.to_owned(),
        };
        if table.keys().any(|k| k != "actors") {
            return Err(syntax(
                "only [actors.\"<actor>\"] tables may be at the top level",
            ));
        }
        let actors = match table.get("actors") {
            None => None,
            Some(toml::Value::Table(t)) => Some(t).filter(|t| !t.is_empty()),
            Some(_) => return Err(syntax("`actors` must be tables: [actors.\"<actor>\"]")),
        };
        let Some(actors) = actors else {
            return Err(SecretsFileError::NoActors {
                path: path.to_owned(),
            });
        };
        let mut secrets = WebhookSecrets::new();
        let mut errors = Vec::new();
        // One bad entry does not hide the others: every one is checked and reported.
        for (actor, entry) in actors {
            match actor_entry(actor, entry, &mut errors) {
                Some(entry) => {
                    secrets.actors.insert(actor.clone(), entry);
                }
                None => continue,
            }
        }
        if errors.is_empty() {
            Ok(secrets)
        } else {
            Err(SecretsFileError::Entries {
                path: path.to_owned(),
                errors,
            })
        }
    }
}

/// `[actors."<actor>"]` as written in errors.
fn actor_label(actor: &str) -> String {
    format!("[actors.{actor:?}]")
}

/// One actor's entry, or `None` with its errors pushed to `errors`.
fn actor_entry(
    actor: &str,
    entry: &toml::Value,
    errors: &mut Vec<(String, String)>,
) -> Option<ActorSecrets> {
    let label = actor_label(actor);
    let mut mine: Vec<(String, String)> = Vec::new();
    let fail = |mine: &mut Vec<(String, String)>, label: &str, why: String| {
        mine.push((label.to_owned(), why));
    };
    if actor.trim().is_empty() {
        errors.push((label, "the actor id is empty".to_owned()));
        return None;
    }
    let Some(entry) = entry.as_table() else {
        errors.push((
            label,
            "must be a table with secrets = [\"whsec_…\"]".to_owned(),
        ));
        return None;
    };
    if let Some(other) = entry.keys().find(|k| *k != "secrets" && *k != "recipients") {
        let why = format!("unknown key {other:?} (expected secrets or recipients)");
        errors.push((label, why));
        return None;
    }
    let mut out = ActorSecrets::default();
    if let Some(value) = entry.get("secrets") {
        match secrets_list(value) {
            Ok(s) => out.every = Some(s),
            Err(why) => fail(&mut mine, &label, why),
        }
    }
    match entry.get("recipients") {
        None => {}
        Some(toml::Value::Table(recipients)) => {
            // The spelling each canonical URL was first given as, to name both of a pair.
            let mut spelled: BTreeMap<String, &str> = BTreeMap::new();
            for (url, value) in recipients {
                let label = format!("{label}.recipients.{url:?}");
                let recipient = match Recipient::parse(url) {
                    Ok(r) => r,
                    Err(e) => {
                        fail(&mut mine, &label, format!("not a recipient URL: {e}"));
                        continue;
                    }
                };
                if let Some(first) = spelled.insert(recipient.as_str().to_owned(), url) {
                    fail(
                        &mut mine,
                        &label,
                        format!("the same endpoint as {first:?} ({})", recipient.as_str()),
                    );
                    continue;
                }
                let secrets = match value.as_table() {
                    Some(t) if t.keys().all(|k| k == "secrets") => t.get("secrets"),
                    _ => {
                        fail(
                            &mut mine,
                            &label,
                            "must be a table with secrets = [\"whsec_…\"] and nothing else"
                                .to_owned(),
                        );
                        continue;
                    }
                };
                match secrets.map(secrets_list) {
                    Some(Ok(s)) => {
                        out.endpoints.insert(recipient.as_str().to_owned(), s);
                    }
                    Some(Err(why)) => fail(&mut mine, &label, why),
                    None => fail(&mut mine, &label, "secrets is missing".to_owned()),
                }
            }
        }
        Some(_) => fail(
            &mut mine,
            &label,
            "recipients must be tables: [actors.\"<actor>\".recipients.\"<url>\"]".to_owned(),
        ),
    }
    if out.every.is_none() && out.endpoints.is_empty() && mine.is_empty() {
        fail(
            &mut mine,
            &label,
            "no secrets: give secrets = [\"whsec_…\"], or recipients with theirs".to_owned(),
        );
    }
    let ok = mine.is_empty();
    errors.append(&mut mine);
    ok.then_some(out)
}

/// A `secrets = ["whsec_…", …]` array: one secret per string, all signing.
fn secrets_list(value: &toml::Value) -> Result<StandardWebhooks, String> {
    let Some(items) = value.as_array() else {
        return Err("secrets must be an array of strings: secrets = [\"whsec_…\"]".to_owned());
    };
    let mut all: Option<StandardWebhooks> = None;
    for (i, item) in items.iter().enumerate() {
        let Some(text) = item.as_str() else {
            return Err(format!("secrets[{i}] is not a string"));
        };
        let one = StandardWebhooks::from_whsec(text).map_err(|e| format!("secrets[{i}]: {e}"))?;
        if one.secret_count() != 1 {
            return Err(format!(
                "secrets[{i}] holds several secrets: give one per string"
            ));
        }
        all = Some(match all {
            None => one,
            Some(all) => all.and(one),
        });
    }
    all.ok_or_else(|| "secrets is empty".to_owned())
}

/// A TOML error without the text of the line it is on (which may hold a secret): the
/// parser's own message, and the line and column.
fn syntax_error(text: &str, path: &Path, e: &toml::de::Error) -> SecretsFileError {
    let line = e.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    });
    SecretsFileError::Syntax {
        path: path.to_owned(),
        line,
        message: e.message().trim().replace('\n', " "),
    }
}

impl Signer for WebhookSecrets {
    /// Signs with the request's endpoint's or actor's secrets; [`SignError::NoKey`] when it
    /// has neither.
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        self.get(req.actor, req.recipient)
            .ok_or_else(|| SignError::NoKey {
                actor: req.actor.to_owned(),
            })?
            .sign(req)
    }
}

impl fmt::Debug for WebhookSecrets {
    /// The actors and endpoints, with how many secrets each has; never a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Entry<'a>(&'a ActorSecrets);
        impl fmt::Debug for Entry<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct("Actor")
                    .field(
                        "secrets",
                        &self.0.every.as_ref().map_or(0, |s| s.secret_count()),
                    )
                    .field(
                        "endpoints",
                        &self
                            .0
                            .endpoints
                            .iter()
                            .map(|(url, s)| (url, s.secret_count()))
                            .collect::<BTreeMap<_, _>>(),
                    )
                    .finish()
            }
        }
        f.debug_map()
            .entries(self.actors.iter().map(|(a, e)| (a, Entry(e))))
            .finish()
    }
}

/// Why a webhook secrets file was not accepted. Its text never holds a secret, nor a line of
/// the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum SecretsFileError {
    /// The file could not be read.
    Read {
        /// The secrets file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or not a table of `[actors."<actor>"]` tables.
    Syntax {
        /// The secrets file.
        path: PathBuf,
        /// The line and column (from 1) of a TOML error.
        line: Option<(usize, usize)>,
        /// What is wrong.
        message: String,
    },
    /// The file names no actor at all: nothing could ever be signed.
    NoActors {
        /// The secrets file.
        path: PathBuf,
    },
    /// Some entries are wrong: each with its table (`[actors."shop-1"]`,
    /// `[actors."shop-1".recipients."https://…"]`) and why, in the file's order of actors.
    Entries {
        /// The secrets file.
        path: PathBuf,
        /// `(table, what is wrong)` for every bad entry.
        errors: Vec<(String, String)>,
    },
}

impl fmt::Display for SecretsFileError {
    /// One line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretsFileError::Read { path, error } => write!(
                f,
                "cannot read the webhook secrets file {}: {error}",
                path.display()
            ),
            SecretsFileError::Syntax {
                path,
                line,
                message,
            } => {
                write!(
                    f,
                    "the webhook secrets file {} is not valid",
                    path.display()
                )?;
                if let Some((line, column)) = line {
                    write!(f, " at line {line}, column {column}")?;
                }
                write!(f, ": {message}")
            }
            SecretsFileError::NoActors { path } => write!(
                f,
                "the webhook secrets file {} has no [actors.\"<actor>\"] entry",
                path.display()
            ),
            SecretsFileError::Entries { path, errors } => {
                write!(
                    f,
                    "the webhook secrets file {} has bad entries: ",
                    path.display()
                )?;
                for (i, (table, why)) in errors.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{table}: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for SecretsFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SecretsFileError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
pub(super) mod tests {
    use super::*;
    use crate::sign::{SecretError, SignatureSpec};
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use outbox_lanes_core::UnitId;
    use std::time::{Duration, UNIX_EPOCH};

    /// A valid secret: 32 bytes of `n`.
    pub(crate) fn whsec(n: u8) -> String {
        format!("whsec_{}", BASE64.encode([n; 32]))
    }

    const T0: u64 = 1_700_000_000;

    /// The headers `signer` gives `actor`'s request to `to` at `T0 + secs`, or its error.
    pub(crate) fn sign(
        signer: &dyn Signer,
        actor: &str,
        to: &str,
        secs: u64,
    ) -> Result<Vec<(String, String)>, SignError> {
        let recipient = Recipient::parse(to).unwrap();
        signer.sign(&SignRequest {
            actor,
            unit: UnitId(5),
            idempotency_key: "c0ffee-5",
            recipient: &recipient,
            body: br#"{"n":5}"#,
            content_type: "application/json",
            at: UNIX_EPOCH + Duration::from_secs(T0 + secs),
            attempt: 1,
            spec: SignatureSpec::Rfc9421,
            challenge: None,
        })
    }

    /// Whether `headers` verify with the secrets `whsec` (the receiving side).
    pub(crate) fn verifies(whsec: &str, headers: &[(String, String)]) -> bool {
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).unwrap().1.as_str();
        let ts = get("webhook-timestamp");
        let now = UNIX_EPOCH + Duration::from_secs(ts.parse().unwrap());
        StandardWebhooks::from_whsec(whsec)
            .unwrap()
            .verify(
                get("webhook-id"),
                ts,
                get("webhook-signature"),
                br#"{"n":5}"#,
                now,
                Duration::from_secs(300),
            )
            .is_ok()
    }

    pub(crate) fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }

    /// shop-1: one secret for every endpoint, another for one endpoint (written in another
    /// spelling of its URL); shop-2: two secrets (a rotation); shop-3: only one endpoint.
    fn file_text() -> String {
        format!(
            "[actors.\"shop-1\"]\nsecrets = [\"{}\"]\n\
             [actors.\"shop-1\".recipients.\"HTTPS://Hooks.Shop1.example:443/a/../orders\"]\n\
             secrets = [\"{}\"]\n\
             [actors.\"shop-2\"]\nsecrets = [\"{}\", \"{}\"]\n\
             [actors.\"shop-3\".recipients.\"https://shop3.example/hook\"]\nsecrets = [\"{}\"]\n",
            whsec(1),
            whsec(11),
            whsec(2),
            whsec(22),
            whsec(3)
        )
    }

    #[test]
    fn each_actor_and_endpoint_signs_with_its_own_secrets() {
        let s = WebhookSecrets::from_toml(&file_text(), Path::new("s.toml")).unwrap();
        assert_eq!(
            s.actors().collect::<Vec<_>>(),
            ["shop-1", "shop-2", "shop-3"]
        );
        // shop-1's endpoints: its own secret, never another customer's.
        let h = sign(&s, "shop-1", "https://hooks.shop1.example/other", 0).unwrap();
        assert!(verifies(&whsec(1), &h));
        for other in [11, 2, 22, 3] {
            assert!(!verifies(&whsec(other), &h), "{other}");
        }
        // The endpoint with secrets of its own, matched on its canonical URL.
        let h = sign(&s, "shop-1", "https://hooks.shop1.example/orders", 0).unwrap();
        assert!(verifies(&whsec(11), &h));
        assert!(!verifies(&whsec(1), &h));
        // A rotation: one header, two signatures, each secret verifies alone.
        let h = sign(&s, "shop-2", "https://shop2.example/hook", 0).unwrap();
        let sig = &h.iter().find(|(k, _)| k == "webhook-signature").unwrap().1;
        assert_eq!(sig.split(' ').filter(|s| s.starts_with("v1,")).count(), 2);
        assert!(verifies(&whsec(2), &h) && verifies(&whsec(22), &h));
        assert!(!verifies(&whsec(1), &h));
        // Another customer's endpoint is not signed for shop-3, nor is an unknown actor.
        assert!(verifies(
            &whsec(3),
            &sign(&s, "shop-3", "https://shop3.example/hook", 0).unwrap()
        ));
        for (actor, to) in [
            ("shop-3", "https://shop3.example/other"),
            ("shop-3", "https://hooks.shop1.example/orders"),
            ("shop-4", "https://shop3.example/hook"),
        ] {
            assert_eq!(
                sign(&s, actor, to, 0),
                Err(SignError::NoKey {
                    actor: actor.to_owned()
                }),
                "{actor} {to}"
            );
        }
        assert!(s.has_actor("shop-3") && !s.has_actor("shop-4"));
        // Debug names actors and endpoints, never a secret.
        let debug = format!("{s:?}");
        assert!(
            debug.contains("https://hooks.shop1.example/orders"),
            "{debug}"
        );
        for n in [1, 11, 2, 22, 3] {
            assert!(!debug.contains(&whsec(n)[6..20]), "{debug}");
        }
    }

    #[test]
    fn the_same_from_rust() {
        let mut s = WebhookSecrets::new();
        assert!(sign(&s, "a", "https://x.example/", 0).is_err());
        s.insert("a", StandardWebhooks::from_whsec(&whsec(1)).unwrap());
        let to = Recipient::parse("https://x.example/special").unwrap();
        s.insert_endpoint("a", &to, StandardWebhooks::from_whsec(&whsec(2)).unwrap());
        assert!(verifies(
            &whsec(1),
            &sign(&s, "a", "https://x.example/", 0).unwrap()
        ));
        assert!(verifies(&whsec(2), &sign(&s, "a", to.as_str(), 0).unwrap()));
        let old = s.insert("a", StandardWebhooks::from_whsec(&whsec(3)).unwrap());
        assert_eq!(old.map(|o| o.secret_count()), Some(1));
        assert!(verifies(
            &whsec(3),
            &sign(&s, "a", "https://x.example/", 0).unwrap()
        ));
    }

    #[test]
    fn every_bad_entry_is_named_on_one_line_without_its_secret() {
        let text = format!(
            "[actors.bare]\nsecrets = [\"{bare}\"]\n\
             [actors.short]\nsecrets = [\"{ok}\", \"whsec_aGVsbG8=\"]\n\
             [actors.string]\nsecrets = \"{ok}\"\n\
             [actors.empty]\nsecrets = []\n\
             [actors.nothing]\n\
             [actors.unknown]\nsecret = [\"{ok}\"]\n\
             [actors.two]\nsecrets = [\"{ok} {ok2}\"]\n\
             [actors.urls.recipients.\"ftp://x.example/\"]\nsecrets = [\"{ok}\"]\n\
             [actors.urls.recipients.\"https://X.example/h\"]\nsecrets = [\"{ok}\"]\n\
             [actors.urls.recipients.\"https://x.example:443/h\"]\nsecrets = [\"{ok}\"]\n\
             [actors.urls.recipients.\"https://y.example/\"]\nkey = 1\n\
             [actors.fine]\nsecrets = [\"{ok}\"]\n",
            bare = &whsec(9)[6..],
            ok = whsec(1),
            ok2 = whsec(2),
        );
        let err = WebhookSecrets::from_toml(&text, Path::new("s.toml")).unwrap_err();
        let SecretsFileError::Entries { errors, .. } = &err else {
            panic!("{err}")
        };
        let why = |table: &str| {
            errors
                .iter()
                .find(|(t, _)| t == table)
                .unwrap_or_else(|| panic!("{table}: {errors:?}"))
                .1
                .clone()
        };
        assert!(why("[actors.\"bare\"]").contains(&SecretError::NoPrefix.to_string()));
        assert!(why("[actors.\"short\"]").starts_with("secrets[1]: the webhook secret is 5 bytes"));
        assert!(why("[actors.\"string\"]").contains("must be an array"));
        assert!(why("[actors.\"empty\"]").contains("secrets is empty"));
        assert!(why("[actors.\"nothing\"]").contains("no secrets"));
        assert!(why("[actors.\"unknown\"]").contains("unknown key \"secret\""));
        assert!(why("[actors.\"two\"]").contains("one per string"));
        assert!(
            why("[actors.\"urls\"].recipients.\"ftp://x.example/\"")
                .contains("not a recipient URL")
        );
        assert!(
            why("[actors.\"urls\"].recipients.\"https://x.example:443/h\"")
                .contains("the same endpoint as \"https://X.example/h\"")
        );
        assert!(
            why("[actors.\"urls\"].recipients.\"https://y.example/\"").contains("nothing else")
        );
        assert_eq!(errors.len(), 10, "{errors:#?}");
        let shown = err.to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(
            shown.starts_with("the webhook secrets file s.toml has bad entries: [actors.\"bare\"]"),
            "{shown}"
        );
        for n in [9, 1, 2] {
            assert!(!shown.contains(&whsec(n)[6..20]), "{shown}");
        }
        assert!(!shown.contains("aGVsbG8"), "{shown}");
    }

    #[test]
    fn a_file_of_the_wrong_shape_is_refused_without_its_text() {
        let p = Path::new("s.toml");
        let err =
            WebhookSecrets::from_toml("[actors.a]\nsecrets = [\"whsec_S3CRET\n", p).unwrap_err();
        let SecretsFileError::Syntax { line, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(line.map(|(l, _)| l), Some(2));
        let shown = err.to_string();
        assert!(shown.contains("at line 2, column"), "{shown}");
        assert!(
            !shown.contains("S3CRET") && !shown.contains('\n'),
            "{shown}"
        );
        for (text, said) in [
            ("secrets = []\n", "only [actors."),
            ("actors = 1\n", "must be tables"),
        ] {
            let shown = WebhookSecrets::from_toml(text, p).unwrap_err().to_string();
            assert!(shown.contains(said), "{shown}");
        }
        for empty in ["", "[actors]\n"] {
            assert!(matches!(
                WebhookSecrets::from_toml(empty, p),
                Err(SecretsFileError::NoActors { .. })
            ));
        }
        let missing = WebhookSecrets::from_file("/nonexistent/secrets.toml").unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("cannot read the webhook secrets file /nonexistent/secrets.toml"),
            "{missing}"
        );
    }
}
