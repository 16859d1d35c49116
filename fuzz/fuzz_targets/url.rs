//! `Recipient::parse` on arbitrary UTF-8: it never panics, and when it accepts a URL its
//! canonical form is a fixed point (parsing it again gives the same string and the same
//! recipient).
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_lanes_core::policy::url::{Recipient, Scheme};

fuzz_target!(|input: &str| {
    let Ok(r) = Recipient::parse(input) else {
        return;
    };
    let canonical = r.as_str();
    let again = Recipient::parse(canonical)
        .unwrap_or_else(|e| panic!("canonical form {canonical:?} of {input:?} refused: {e}"));
    assert_eq!(
        again.as_str(),
        canonical,
        "canonicalisation is not idempotent for {input:?}"
    );
    assert_eq!(again, r, "re-parsed recipient differs for {input:?}");
    assert_eq!(again.port(), r.port());
    assert_eq!(again.host(), r.host());
    // The shape of the canonical form.
    let prefix = match r.scheme() {
        Scheme::Http => "http://",
        Scheme::Https => "https://",
    };
    assert!(canonical.starts_with(prefix), "{canonical:?}");
    assert!(r.path_and_query().starts_with('/'), "{canonical:?}");
    assert!(canonical.ends_with(r.path_and_query()), "{canonical:?}");
    assert!(!canonical.contains('#'), "fragment kept in {canonical:?}");
    assert!(
        canonical.bytes().all(|b| b.is_ascii_graphic()),
        "canonical form {canonical:?} is not visible ASCII"
    );
    assert_eq!(r.to_string(), canonical);
});
