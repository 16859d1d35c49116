//! Request signing for `drain` and `relay`: the signer built from `--webhook-secret` or
//! `--signing-keys`, and the check that every actor with work has a key.
//!
//! Both are settled before anything is delivered, so a bad secret or keys file, or an actor
//! the keys file forgets, is an input error (exit 2) with nothing sent. ActivityPub servers
//! refuse unsigned POSTs, so an actor without a key is never delivered unsigned: at startup
//! it stops the command; an actor that first shows up while a relay runs has its units kept
//! (not sent, retried without counting attempts, logged at `warn`) until the keys file has
//! it and the relay is restarted.

use std::path::Path;
use std::sync::Arc;

use outbox_lanes_tokio::sign::{HttpSignatures, KeysFileError, Signer, StandardWebhooks};

use super::UsageError;
use super::args::DeliveryFlags;
use super::backend::Backend;

/// The signer of a delivering command, and the keys an HTTP Signatures signer holds.
#[derive(Default)]
pub(crate) struct Signing {
    /// What the outbox signs with; `None`: requests are not signed.
    pub(crate) signer: Option<Arc<dyn Signer>>,
    /// With `--signing-keys`: the keys file and its signer, to check actors against.
    keys: Option<(String, Arc<HttpSignatures>)>,
}

impl Signing {
    /// The signer `d` asks for (clap makes the two flags exclusive).
    ///
    /// # Errors
    /// A [`UsageError`] (exit 2) naming the flag, for a secret that is not `whsec_<base64>`
    /// or a keys file that cannot be read or has bad entries (each one listed).
    pub(crate) fn from_flags(d: &DeliveryFlags) -> anyhow::Result<Signing> {
        if let Some(secret) = &d.webhook_secret {
            let signer = StandardWebhooks::from_whsec(secret).map_err(|e| {
                UsageError(format!(
                    "--webhook-secret (or OUTBOX_LANES_WEBHOOK_SECRET): {e}; nothing delivered"
                ))
            })?;
            return Ok(Signing {
                signer: Some(Arc::new(signer)),
                keys: None,
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
            let keys = Arc::new(keys);
            return Ok(Signing {
                signer: Some(Arc::clone(&keys) as Arc<dyn Signer>),
                keys: Some((display(file), keys)),
            });
        }
        Ok(Signing::default())
    }

    /// With a keys file: refuses to start when an actor with pending units (only `actor`,
    /// when given) has no key in it.
    ///
    /// # Errors
    /// A [`UsageError`] (exit 2) listing the actors without a key; a store failure.
    pub(crate) async fn check_actors(
        &self,
        backend: &Backend,
        actor: Option<&str>,
    ) -> anyhow::Result<()> {
        let Some((file, keys)) = &self.keys else {
            return Ok(());
        };
        let missing: Vec<String> = backend
            .status()
            .await?
            .into_iter()
            .filter(|s| s.pending > 0)
            .map(|s| s.actor.as_str().to_owned())
            .filter(|a| actor.is_none_or(|only| only == a))
            .filter(|a| keys.key(a).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(UsageError(format!(
            "no signing key in {file} for {}: their requests would be refused unsigned; add \
             [actors.\"<actor>\"] entries (nothing delivered)",
            missing
                .iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into())
    }
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
