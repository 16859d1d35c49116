//! Signing from Rust (the library guide's "Signing"): HTTP Signatures for ActivityPub actors
//! (an RSA key and an Ed25519 key; RFC 9421 first, draft-cavage for a host that refuses it,
//! learned per host) and Standard Webhooks secrets per customer (one of them rotating).
//!
//! `cargo run -p outbox-lanes-readme --example signing` delivers to a recipient on 127.0.0.1
//! and prints the signature headers it received; `tests/readme.rs` runs the same functions and
//! verifies every request with verifiers we did not write.
#![deny(warnings)]

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use outbox_lanes::blocking::sign::{HttpSignatures, IntoSigner, StandardWebhooks, WebhookSecrets};
use outbox_lanes::blocking::{Outbox, OutboxConfig};
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

/// An actor with an RSA key.
pub const ALICE: &str = "https://example.com/users/alice";
/// An actor with an Ed25519 key.
pub const CAROL: &str = "https://example.com/users/carol";

/// Each actor signs with its own key: `key_id` is what recipients fetch the public key by.
pub fn activitypub_keys(
    rsa_pem: &str,
    ed25519_pem: &str,
) -> Result<HttpSignatures, Box<dyn Error>> {
    let keys = HttpSignatures::new()
        .with_key(ALICE, format!("{ALICE}#main-key"), rsa_pem)?
        .with_key(CAROL, format!("{CAROL}#ed25519-key"), ed25519_pem)?;
    Ok(keys)
}

/// Each customer signs with its own secrets; shop-2 is moving to a new one (both sign).
pub fn webhook_secrets(
    shop1: &str,
    shop2_old: &str,
    shop2_new: &str,
) -> Result<WebhookSecrets, Box<dyn Error>> {
    let mut secrets = WebhookSecrets::new();
    secrets.insert("shop-1", StandardWebhooks::from_whsec(shop1)?);
    secrets.insert(
        "shop-2",
        StandardWebhooks::from_whsec(&format!("{shop2_old} {shop2_new}"))?,
    );
    Ok(secrets)
}

/// One row of `actor` to `inbox`, delivered by an outbox on `db` that signs with `signer`
/// (given by value, or shared in an `Arc`).
pub fn deliver(
    db: &Path,
    signer: impl IntoSigner,
    actor: &str,
    inbox: &str,
) -> Result<(), Box<dyn Error>> {
    let store = Arc::new(SqliteStore::open(db, SqliteOptions::default())?);
    let config = OutboxConfig::default().allow_loopback(); // the example's recipient is 127.0.0.1
    let outbox = Outbox::builder(store, config).signer(signer).open()?;
    let activity = serde_json::json!({"type": "Create", "actor": actor});
    let row = NewRow::activity(format!("{actor}/activities/1"), &activity)?.recipient(inbox);
    outbox.enqueue(actor, &[row])?;
    outbox.drain(actor)?; // signed at every attempt, with the attempt's time
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    use outbox_lanes_test_support::Recipient;
    use outbox_lanes_test_support::signatures::{ALICE_PRIVATE_PKCS8, CAROL_ED25519_PRIVATE};
    let dir = tempfile::tempdir()?;
    let r = Recipient::start()?;
    let keys = activitypub_keys(ALICE_PRIVATE_PKCS8, CAROL_ED25519_PRIVATE)?;
    deliver(
        &dir.path().join("ap.db"),
        keys.clone(),
        ALICE,
        &r.url("/alice"),
    )?;
    deliver(&dir.path().join("ap.db"), keys, CAROL, &r.url("/carol"))?;
    let whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let secrets = webhook_secrets(whsec, whsec, "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
    deliver(
        &dir.path().join("hooks.db"),
        secrets,
        "shop-2",
        &r.url("/shop-2"),
    )?;
    for q in r.all_requests() {
        println!("{}", q.path);
        for name in [
            "signature-input",
            "signature",
            "webhook-id",
            "webhook-signature",
        ] {
            if let Some(v) = q.header(name) {
                println!("  {name}: {v}");
            }
        }
    }
    Ok(())
}
