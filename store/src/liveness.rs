//! Liveness of drain-slot holders on one SQLite file (beside the lease).
//!
//! A slot's lease protects against a holder that is alive but stuck; it cannot tell a dead
//! holder from a live one, so a relay killed with SIGKILL and restarted at once would wait
//! out the whole lease (30 s by default) before delivering again. Here every holder of this
//! database keeps an exclusive lock on `<database>-holders/<holder>.lock` for as long as its
//! store is open: the kernel drops the lock when the process dies, however it dies. A holder
//! whose file can be locked by someone else is dead, and its slots are taken over at once
//! (with a new fencing token, so anything it might still write is refused).
//!
//! The lock is `flock(2)` (through `rustix`; std's `File::try_lock` needs a newer Rust than
//! this crate's MSRV): a lock on an open file, released by the kernel with the process. On
//! other platforms there is no holder lock and the lease alone decides. A holder name shared by two live processes
//! (a misconfigured fixed `holder`) makes both look alive to each other: they fall back to
//! the lease. The default holder name is unique per process. Holders whose lock file is
//! missing (a version without liveness, another host on a network file system) are treated
//! as alive: the lease decides, as before.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The lock files of one database; see the module docs.
#[derive(Debug)]
pub(crate) struct Liveness {
    dir: PathBuf,
    /// The holders of this store, with their locked files (kept open: closing drops the lock).
    held: Mutex<HashMap<String, File>>,
}

impl Liveness {
    /// The lock directory of the database at `db`.
    pub(crate) fn new(db: &Path) -> Liveness {
        let mut dir = db.as_os_str().to_owned();
        dir.push("-holders");
        Liveness {
            dir: PathBuf::from(dir),
            held: Mutex::new(HashMap::new()),
        }
    }

    fn file_of(&self, holder: &str) -> PathBuf {
        // Hex: any holder name is a valid, unambiguous file name.
        let mut name = String::with_capacity(holder.len() * 2 + 5);
        for b in holder.bytes().take(120) {
            name.push_str(&format!("{b:02x}"));
        }
        name.push_str(".lock");
        self.dir.join(name)
    }

    /// Takes `holder`'s lock for as long as this store lives (once; later calls are free).
    /// A failure (a read-only directory) only means no liveness: the lease still works.
    pub(crate) fn register(&self, holder: &str) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains_key(holder) {
            return;
        }
        let path = self.file_of(holder);
        let open = || {
            std::fs::create_dir_all(&self.dir).and_then(|()| {
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
            })
        };
        // Once more if another holder's clean close removed the empty directory in between.
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => open(),
            r => r,
        };
        match file {
            Ok(f) => match try_lock(&f) {
                Ok(()) => {
                    held.insert(holder.to_owned(), f);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
                Err(e) => tracing::warn!(holder, error = %e,
                    "the holder's lock file is locked by another process (a holder name used twice?); slots of this holder wait for their lease"),
            },
            Err(e) => {
                tracing::debug!(holder, error = %e, "no holder lock file; slots wait for their lease")
            }
        }
    }

    /// The holders whose lock this store holds: no other store or process uses their names.
    pub(crate) fn held(&self) -> Vec<String> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Unlocks `holder`'s file and leaves it in place, so that other processes find the
    /// holder dead (and take its slots over) rather than unknown.
    pub(crate) fn leave_unlocked(&self, holder: &str) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
    }

    /// A clean stop of `holder` (it holds no slot any more): its lock file is removed at once,
    /// still locked, as a closing store removes it, while the store stays open. A later
    /// [`Liveness::register`] of the holder takes a new one.
    pub(crate) fn close(&self, holder: &str) {
        let file = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
        if let Some(file) = file {
            self.remove(holder, file);
        }
    }

    /// Removes `holder`'s lock file, then lets go of its lock, and the directory once empty.
    fn remove(&self, holder: &str, file: File) {
        let path = self.file_of(holder);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::debug!(holder, path = %path.display(), error = %e,
                "the holder's lock file could not be removed");
        }
        drop(file);
        // Empty once the last holder of the database is gone (not if another one still runs).
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// Whether `holder` is known dead: its lock file exists and nobody holds its lock.
    pub(crate) fn is_dead(&self, holder: &str) -> bool {
        if self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(holder)
        {
            return false;
        }
        let path = self.file_of(holder);
        let Ok(f) = OpenOptions::new().write(true).open(&path) else {
            return false;
        };
        match try_lock(&f) {
            Ok(()) => {
                // Dead: its file goes (a later holder of that name creates it again).
                let _ = std::fs::remove_file(&path);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Liveness {
    /// A store closed (a clean stop) removes its holders' lock files at once, still locked, so
    /// no other process can take them for a live holder's in between; one that dies without
    /// closing leaves its file, unlocked, for [`Liveness::is_dead`] to find and remove.
    fn drop(&mut self) {
        let held = std::mem::take(self.held.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (holder, file) in held {
            self.remove(&holder, file);
        }
    }
}

/// An exclusive `flock` on `f`, without waiting.
#[cfg(unix)]
fn try_lock(f: &File) -> std::io::Result<()> {
    rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(std::io::Error::from)
}

/// No holder locks here: nothing is ever known dead, the lease decides.
#[cfg(not(unix))]
fn try_lock(_: &File) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_alive_while_its_store_holds_the_lock_and_dead_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("outbox.db");
        let a = Liveness::new(&db);
        let b = Liveness::new(&db);
        assert!(!b.is_dead("relay-1"), "no lock file: unknown, so alive");
        a.register("relay-1");
        assert!(!a.is_dead("relay-1"), "our own holder");
        assert!(!b.is_dead("relay-1"), "locked by its store");
        // Its process died: the kernel dropped the lock, the file stayed.
        a.leave_unlocked("relay-1");
        assert!(b.is_dead("relay-1"), "its lock is gone: dead");
        assert!(!b.is_dead("relay-1"), "its file went with it");
        drop(a);
    }

    #[test]
    fn a_closed_holder_removes_its_lock_file_while_the_store_stays_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("outbox.db");
        let a = Liveness::new(&db);
        a.register("relay-1");
        a.register("relay-2");
        let (one, two) = (a.file_of("relay-1"), a.file_of("relay-2"));
        a.close("relay-1");
        assert!(!one.exists(), "a clean stop leaves no lock file behind");
        assert!(two.exists(), "another holder of the store keeps its own");
        assert_eq!(a.held(), vec!["relay-2".to_owned()]);
        a.close("relay-2");
        assert!(
            !dir.path().join("outbox.db-holders").exists(),
            "nor an empty directory"
        );
        a.register("relay-1");
        assert!(
            one.exists(),
            "registered again, the holder takes a new lock"
        );
        drop(a);
        assert!(!one.exists());
    }

    #[test]
    fn a_closed_store_removes_its_lock_files_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("outbox.db");
        let a = Liveness::new(&db);
        a.register("relay-1");
        let file = a.file_of("relay-1");
        assert!(file.exists());
        drop(a);
        assert!(!file.exists(), "a clean close leaves no lock file behind");
        assert!(
            !dir.path().join("outbox.db-holders").exists(),
            "nor an empty directory"
        );
    }
}
