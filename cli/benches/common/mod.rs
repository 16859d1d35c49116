//! What the bench binaries share: sizes from the environment and the entry numbers the
//! recipients' bodies carry.

/// A size from the environment, or `default`.
pub(crate) fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The body of entry `entry`: `{"entry":N}`.
pub(crate) fn body(entry: usize) -> Vec<u8> {
    format!("{{\"entry\":{entry}}}").into_bytes()
}

/// The entry number of a body written by [`body`].
pub(crate) fn entry_of(b: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(b).ok()?;
    s.strip_prefix("{\"entry\":")?
        .strip_suffix('}')?
        .parse()
        .ok()
}
