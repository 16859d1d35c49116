//! Request signing for `drain` and `relay`: the signer built from `--webhook-secret`,
//! `--webhook-secrets` or `--signing-keys`, and the check that every actor with work has a
//! key (or secrets).
//!
//! They are settled before anything is delivered, so a bad secret, secrets file or keys
//! file, or an actor the file forgets, is an input error (exit 2) with nothing sent.
//! ActivityPub servers refuse unsigned POSTs and a webhook customer must never receive
//! another's signature, so an actor without a key is never delivered unsigned: at startup
//! it stops the command; an actor that first shows up while a relay runs has its units kept
//! (not sent, retried without counting attempts, logged at `warn`) until the keys file has
//! it and the relay is restarted — or, for `--webhook-secrets`, until the secrets file has
//! it: that file is read again when it changes (the signer looks at most every 2 seconds)
//! and on SIGHUP, and a version of it that does not parse keeps the secrets before.

use std::path::Path;
use std::sync::Arc;

use outbox_lanes_tokio::sign::{
    HttpSignatures, KeysFileError, Signer, StandardWebhooks, WebhookSecretsFile,
};
use tracing::{error, info};

use super::UsageError;
use super::args::DeliveryFlags;
use super::backend::Backend;

/// The signer of a delivering command, and what its actors are checked against.
#[derive(Default)]
pub(crate) struct Signing {
    /// What the outbox signs with; `None`: requests are not signed.
    pub(crate) signer: Option<Arc<dyn Signer>>,
    /// With `--signing-keys` or `--webhook-secrets`: the file and its signer.
    file: Option<(String, PerActor)>,
}

/// A signer with an entry per actor.
enum PerActor {
    Keys(Arc<HttpSignatures>),
    Secrets(Arc<WebhookSecretsFile>),
}

impl PerActor {
    fn has(&self, actor: &str) -> bool {
        match self {
            PerActor::Keys(keys) => keys.key(actor).is_some(),
            PerActor::Secrets(file) => file.secrets().has_actor(actor),
        }
    }
}

impl Signing {
    /// The signer `d` asks for.
    ///
    /// # Errors
    /// A [`UsageError`] (exit 2) naming the flag, for a secret that is not `whsec_<base64>`
    /// of 24 to 64 bytes, a secrets or keys file that cannot be read or has bad entries
    /// (each one listed), or more than one of the three given (clap refuses that on the
    /// command line and in the environment; a `--config` file's settings are defaults, out
    /// of its sight).
    pub(crate) fn from_flags(d: &DeliveryFlags) -> anyhow::Result<Signing> {
        let given = [
            d.webhook_secret.is_some(),
            d.webhook_secrets.is_some(),
            d.signing_keys.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(UsageError(
                "--webhook-secret, --webhook-secrets and --signing-keys exclude each other, and \
                 more than one is set (command line, environment or --config file); nothing \
                 delivered"
                    .to_owned(),
            )
            .into());
        }
        if let Some(secret) = &d.webhook_secret {
            let signer = StandardWebhooks::from_whsec(secret).map_err(|e| {
                UsageError(format!(
                    "--webhook-secret (or OUTBOX_LANES_WEBHOOK_SECRET): {e}; nothing delivered"
                ))
            })?;
            return Ok(Signing {
                signer: Some(Arc::new(signer)),
                file: None,
            });
        }
        if let Some(file) = &d.webhook_secrets {
            let secrets = WebhookSecretsFile::open(file).map_err(|e| {
                UsageError(format!(
                    "--webhook-secrets (or OUTBOX_LANES_WEBHOOK_SECRETS): {e}; nothing delivered"
                ))
            })?;
            let secrets = Arc::new(secrets);
            info!(
                file = %file.display(),
                actors = secrets.secrets().actors().count(),
                "signing with the webhook secrets of each actor; the file is read again when it \
                 changes, or on SIGHUP"
            );
            reload_on_sighup(Arc::clone(&secrets))?;
            return Ok(Signing {
                signer: Some(Arc::clone(&secrets) as Arc<dyn Signer>),
                file: Some((display(file), PerActor::Secrets(secrets))),
            });
        }
        if let Some(file) = &d.signing_keys {
            let keys = HttpSignatures::from_keys_file(file).map_err(|e| {
                let e = match e {
                    KeysFileError::Syntax { .. } => without_quoted_lines(&e.to_string()),
                    e => e.to_string(),
                };
                UsageError(format!(
                    "--signing-keys (or OUTBOX_LANES_SIGNING_KEYS): {e}\nnothing delivered"
                ))
            })?;
            // Which keys were loaded (their ids and algorithms, never the keys themselves).
            for actor in keys.actors() {
                if let Some(k) = keys.key(actor) {
                    info!(file = %file.display(), actor, key_id = k.key_id(),
                        algorithm = k.algorithm().rfc9421_alg(), "signing key loaded");
                }
            }
            let keys = Arc::new(keys);
            return Ok(Signing {
                signer: Some(Arc::clone(&keys) as Arc<dyn Signer>),
                file: Some((display(file), PerActor::Keys(keys))),
            });
        }
        Ok(Signing::default())
    }

    /// With a keys or secrets file: refuses to start when an actor with pending units (only
    /// `actor`, when given) has no entry in it.
    ///
    /// # Errors
    /// A [`UsageError`] (exit 2) listing the actors without a key; a store failure.
    pub(crate) async fn check_actors(
        &self,
        backend: &Backend,
        actor: Option<&str>,
    ) -> anyhow::Result<()> {
        let Some((file, per_actor)) = &self.file else {
            return Ok(());
        };
        let missing: Vec<String> = backend
            .status()
            .await?
            .into_iter()
            .filter(|s| s.pending > 0)
            .map(|s| s.actor.as_str().to_owned())
            .filter(|a| actor.is_none_or(|only| only == a))
            .filter(|a| !per_actor.has(a))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let (what, why) = match per_actor {
            PerActor::Keys(_) => ("signing key", "their requests would be refused unsigned"),
            PerActor::Secrets(_) => ("webhook secret", "their webhooks cannot be signed"),
        };
        let names: Vec<String> = missing.iter().map(|a| format!("{a:?}")).collect();
        // The entries to add, named: `[actors."alice"]`, the first three.
        let mut entries: Vec<String> = missing
            .iter()
            .take(3)
            .map(|a| format!("[actors.{a:?}]"))
            .collect();
        if missing.len() > 3 {
            entries.push(format!("and {} more", missing.len() - 3));
        }
        Err(UsageError(format!(
            "no {what} in {file} for {}: {why}; add {} (nothing delivered)",
            names.join(", "),
            entries.join(", ")
        ))
        .into())
    }
}

/// Reads the secrets file again on every SIGHUP, on the blocking pool, for as long as the
/// process runs. A file that does not parse keeps the secrets before (logged at ERROR).
#[cfg(unix)]
fn reload_on_sighup(file: Arc<WebhookSecretsFile>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("cannot catch SIGHUP")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let f = Arc::clone(&file);
            let shown = file.path().display().to_string();
            match tokio::task::spawn_blocking(move || f.reload()).await {
                Ok(Ok(())) => info!(
                    file = %shown,
                    actors = file.secrets().actors().count(),
                    "SIGHUP: webhook secrets read again; they sign from now on"
                ),
                Ok(Err(e)) => error!(
                    file = %shown,
                    error = %e,
                    "SIGHUP: the webhook secrets file cannot be used; the secrets read before \
                     still sign"
                ),
                Err(e) => error!(error = %e, "SIGHUP: reading the webhook secrets failed"),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_sighup(_: Arc<WebhookSecretsFile>) -> anyhow::Result<()> {
    Ok(())
}

/// A TOML parser's error without the lines it quotes from the file (`2 | private_key_pem =
/// "…`, with a caret line beneath): they may hold a key. Its other lines (the position, the
/// reason) are joined into one.
fn without_quoted_lines(message: &str) -> String {
    let quoted = |l: &str| {
        l.trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start()
            .starts_with('|')
    };
    message
        .lines()
        .filter(|l| !l.trim().is_empty() && !quoted(l))
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join(": ")
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_error_loses_the_lines_it_quotes() {
        let e = toml::from_str::<toml::Table>("[actors.a]\nprivate_key_pem = \"MIIsecret\n")
            .expect_err("not TOML");
        let text = without_quoted_lines(&e.to_string());
        assert!(!text.contains("MIIsecret"), "{text}");
        assert!(text.contains("line 2"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}
