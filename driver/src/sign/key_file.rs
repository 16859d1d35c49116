//! Reading a key file safely: a regular file of bounded size ([`read_regular_file`]), with a
//! warning when a key file is readable by others ([`read_key_file`]). The signing keys file,
//! its `private_key_file`s and the webhook secrets file are read with it.

use std::path::{Path, PathBuf};

/// A key file (a keys file, a `private_key_file`) holds at most this many bytes.
const MAX_KEY_FILE: u64 = 1 << 20;

/// The text of the file at `path` if it is a regular file of at most `max` bytes (a device
/// or a pipe given by mistake would be read without end), with the metadata of what was
/// opened. Checked before opening (opening a FIFO waits for a writer) and again on the opened
/// file, in case the path changed in between. The binary reads its `--config` with it too.
///
/// # Errors
/// The file cannot be read, is not a regular file, is larger than `max` or is not UTF-8.
pub fn read_regular_file(path: &Path, max: u64) -> std::io::Result<(String, std::fs::Metadata)> {
    use std::io::{Error, ErrorKind, Read as _};
    let not_regular = || Error::new(ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {} KiB", max / 1024),
        ));
    }
    Ok((text, meta))
}

/// The text of a key file: a regular file of at most [`MAX_KEY_FILE`] bytes
/// ([`read_regular_file`]). Logs a warning, once per file, if it is readable by its group or
/// others (unix).
pub(super) fn read_key_file(path: &Path) -> std::io::Result<String> {
    let (text, meta) = read_regular_file(path, MAX_KEY_FILE)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        static WARNED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        let mode = meta.permissions().mode();
        let first = || {
            let mut warned = WARNED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            warned.insert(path.to_owned())
        };
        if mode & 0o077 != 0 && first() {
            tracing::warn!(
                file = %path.display(),
                mode = %format_args!("{:o}", mode & 0o777),
                "a signing key file is readable by its group or others; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(text)
}
