//! [`WebhookSecretsFile`]: a [`WebhookSecrets`] read from its TOML file, and read again when
//! the file changes, without a restart.
//!
//! # Why no crate here
//!
//! The table is an `Arc` behind a `std::sync::RwLock`: signing takes the read lock only to
//! clone the `Arc` and signs outside it, and a reload swaps the `Arc` whole, so a request is
//! signed by the old table or the new one, never a mix. The `arc-swap` crate would spare the
//! read lock's shared counter; one uncontended atomic per attempt is nothing beside an HTTP
//! request, and the driver, which every runtime and the library's default build pull in,
//! takes no dependency for it.
//!
//! The file is looked at from the signing path: at most once per
//! [`WebhookSecretsFile::CHECK_EVERY`] of the attempts' own time ([`SignRequest::at`]: no
//! clock is read here), one `stat` of the path (following symlinks, so a Kubernetes secret
//! volume's swap of its `..data` link is seen), and the file is read and parsed only when
//! its size, modification or change time or inode moved. The `notify` crate would learn of a
//! change sooner, at the price of a thread of its own and a watch on the directory (editors
//! and secret volumes replace the file by renaming another over it); a relay that sends
//! nothing signs nothing, so a change seen at the next attempt is seen in time.
//! [`WebhookSecretsFile::reload`] reads the file at once (the binary calls it on SIGHUP).
//!
//! A file that cannot be read or parsed on a reload changes nothing: the secrets loaded
//! before go on signing, the error is logged once per version of the file, and nothing is
//! ever sent unsigned for it.

use core::fmt;
use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use super::{SecretsFileError, SignError, SignRequest, Signer, WebhookSecrets};

/// What tells one version of a file from another: its size, modification and change times
/// and (unix) its device and inode.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    node: (u64, u64, i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Stamp {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt as _;
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            node: (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The version of the file at `path` now; `None` when it cannot be found.
fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| Stamp::of(&m))
}

/// A [`WebhookSecrets`] read from a TOML file and read again when the file changes: a new
/// secret, a rotation or a new customer takes effect without a restart.
///
/// It signs as the table it holds does. Before signing, at most once per
/// [`CHECK_EVERY`](Self::CHECK_EVERY) of the attempts' own time ([`SignRequest::at`]), it
/// looks whether the file changed — one `stat` of the path, following symlinks (a
/// Kubernetes secret volume swaps a link), comparing size, modification and change times and
/// inode — and if so reads it again; [`reload`](Self::reload) reads it at once. The table is
/// swapped whole: a request is signed by the old table or the new one, never a mix. A
/// version of the file that cannot be read or has a bad entry keeps the table before
/// (logged at ERROR, once per version, when the signing path found it; returned by `reload`
/// and [`check`](Self::check)), so nothing is ever sent unsigned for it.
///
/// ```no_run
/// use std::sync::Arc;
/// use outbox_lanes_driver::sign::WebhookSecretsFile;
///
/// let signer = Arc::new(WebhookSecretsFile::open("/etc/outbox-lanes/webhook-secrets.toml")?);
/// // Give `Arc::clone(&signer)` to `Outbox::builder(..).signer(..)`;
/// // on a signal of your own, or a deploy hook:
/// signer.reload()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WebhookSecretsFile {
    path: PathBuf,
    table: RwLock<Arc<WebhookSecrets>>,
    check: Mutex<Check>,
    every: Option<Duration>,
}

/// When the file was last looked at, and what was found.
struct Check {
    /// The version of the file last read (whether it parsed or not); `None`: it could not
    /// be found.
    seen: Option<Stamp>,
    /// The attempt time of the last look.
    at: Option<SystemTime>,
}

impl WebhookSecretsFile {
    /// How often (in the attempts' time) signing looks whether the file changed, unless
    /// [`check_every`](Self::check_every) says otherwise.
    pub const CHECK_EVERY: Duration = Duration::from_secs(2);

    /// Reads the secrets file at `path`.
    ///
    /// # Errors
    /// [`SecretsFileError`], as [`WebhookSecrets::from_file`].
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, SecretsFileError> {
        let path = path.into();
        // The version is taken before the read: a change in between is read again later.
        let seen = stamp(&path);
        let table = WebhookSecrets::from_file(&path)?;
        Ok(WebhookSecretsFile {
            path,
            table: RwLock::new(Arc::new(table)),
            check: Mutex::new(Check { seen, at: None }),
            every: Some(Self::CHECK_EVERY),
        })
    }

    /// How often signing looks whether the file changed; `None`: never (only
    /// [`reload`](Self::reload) and [`check`](Self::check) read it again).
    #[must_use]
    pub fn check_every(mut self, every: Option<Duration>) -> Self {
        self.every = every;
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table that signs now.
    pub fn secrets(&self) -> Arc<WebhookSecrets> {
        Arc::clone(&self.table.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the file again, changed or not, and signs with it from now on.
    ///
    /// # Errors
    /// [`SecretsFileError`] when it cannot be read or has bad entries: the table signing
    /// before is kept.
    pub fn reload(&self) -> Result<(), SecretsFileError> {
        let mut check = self.check.lock().unwrap_or_else(PoisonError::into_inner);
        self.load(&mut check)
    }

    /// Reads the file again if it changed since it was last read; whether it did.
    ///
    /// # Errors
    /// [`SecretsFileError`] when it changed but cannot be read or has bad entries: the
    /// table signing before is kept, and the same version of the file is not reported
    /// again.
    pub fn check(&self) -> Result<bool, SecretsFileError> {
        let mut check = self.check.lock().unwrap_or_else(PoisonError::into_inner);
        self.check_locked(&mut check)
    }

    fn check_locked(&self, check: &mut Check) -> Result<bool, SecretsFileError> {
        if stamp(&self.path) == check.seen {
            return Ok(false);
        }
        self.load(check).map(|()| true)
    }

    /// Reads and parses the file; swaps the table in when it parsed. Either way, the version
    /// read is the one seen: taken before the read, so a change in between is read again at
    /// the next look.
    fn load(&self, check: &mut Check) -> Result<(), SecretsFileError> {
        check.seen = stamp(&self.path);
        let table = WebhookSecrets::from_file(&self.path)?;
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
        Ok(())
    }

    /// Looks at the file if the last look is [`check_every`](Self::check_every) old at
    /// `at`; another thread looking already is not waited for.
    fn check_due(&self, at: SystemTime) {
        let Some(every) = self.every else { return };
        let Ok(mut check) = self.check.try_lock() else {
            return;
        };
        // A clock set back by more than the interval counts as due too.
        let due = check.at.is_none_or(|last| match at.duration_since(last) {
            Ok(ahead) => ahead >= every,
            Err(behind) => behind.duration() >= every,
        });
        if !due {
            return;
        }
        check.at = Some(at);
        match self.check_locked(&mut check) {
            Ok(false) => {}
            Ok(true) => tracing::info!(
                file = %self.path.display(),
                actors = self.secrets().actors().count(),
                "the webhook secrets file changed: its secrets sign from now on"
            ),
            Err(e) => tracing::error!(
                file = %self.path.display(),
                error = %e,
                "the webhook secrets file changed but cannot be used: the secrets read before \
                 still sign"
            ),
        }
    }
}

impl Signer for WebhookSecretsFile {
    /// Signs as the table does (after looking whether the file changed, when that is due).
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        self.check_due(req.at);
        self.secrets().sign(req)
    }
}

impl fmt::Debug for WebhookSecretsFile {
    /// The file and its table's actors and endpoints; never a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSecretsFile")
            .field("path", &self.path)
            .field("secrets", &*self.secrets())
            .field("check_every", &self.every)
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use crate::sign::webhook_secrets::tests::{sign, verifies, whsec, write};

    #[test]
    fn a_changed_file_signs_from_the_next_look_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        let one = |secrets: &str| format!("[actors.a]\nsecrets = [{secrets}]\n");
        write(&path, &one(&format!("\"{}\"", whsec(1))));
        let file = WebhookSecretsFile::open(&path).unwrap();
        let to = "https://a.example/hook";
        assert!(verifies(&whsec(1), &sign(&file, "a", to, 0).unwrap()));

        // A rotation: signed with both from the first look after the change.
        write(&path, &one(&format!("\"{}\", \"{}\"", whsec(1), whsec(2))));
        let h = sign(&file, "a", to, 1).unwrap();
        assert!(!verifies(&whsec(2), &h), "looked again before CHECK_EVERY");
        let h = sign(&file, "a", to, 2).unwrap();
        assert!(verifies(&whsec(1), &h) && verifies(&whsec(2), &h));

        // The rotation done: the old secret no longer verifies.
        write(&path, &one(&format!("\"{}\"", whsec(2))));
        let h = sign(&file, "a", to, 4).unwrap();
        assert!(verifies(&whsec(2), &h) && !verifies(&whsec(1), &h));

        // A bad file (a 5-byte secret), then no file at all: the secrets before go on
        // signing; the same bad version is reported once, by `check`, and again by `reload`.
        write(&path, &one("\"whsec_aGVsbG8=\""));
        let h = sign(&file, "a", to, 6).unwrap();
        assert!(verifies(&whsec(2), &h));
        assert!(matches!(file.check(), Ok(false)));
        assert!(matches!(
            file.reload(),
            Err(SecretsFileError::Entries { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.check(), Err(SecretsFileError::Read { .. })));
        assert!(matches!(file.check(), Ok(false)));
        assert!(verifies(&whsec(2), &sign(&file, "a", to, 8).unwrap()));

        // Back, with a new customer: `check` reads it at once.
        write(
            &path,
            &format!(
                "{}[actors.b]\nsecrets = [\"{}\"]\n",
                one(&format!("\"{}\"", whsec(3))),
                whsec(4)
            ),
        );
        assert!(matches!(file.check(), Ok(true)));
        assert!(verifies(&whsec(3), &sign(&file, "a", to, 8).unwrap()));
        assert!(verifies(&whsec(4), &sign(&file, "b", to, 8).unwrap()));
        assert_eq!(file.secrets().actors().count(), 2);
        let debug = format!("{file:?}");
        assert!(
            debug.contains("secrets.toml") && !debug.contains(&whsec(3)[6..20]),
            "{debug}"
        );
    }

    #[test]
    fn without_looks_only_reload_reads_the_file_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        write(
            &path,
            &format!("[actors.a]\nsecrets = [\"{}\"]\n", whsec(1)),
        );
        let file = WebhookSecretsFile::open(&path).unwrap().check_every(None);
        write(
            &path,
            &format!("[actors.a]\nsecrets = [\"{}\"]\n", whsec(2)),
        );
        let to = "https://a.example/hook";
        assert!(verifies(&whsec(1), &sign(&file, "a", to, 60).unwrap()));
        file.reload().unwrap();
        assert!(verifies(&whsec(2), &sign(&file, "a", to, 61).unwrap()));
        assert_eq!(file.path(), path);
    }
}
