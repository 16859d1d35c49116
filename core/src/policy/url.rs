//! Recipient URL canonicalisation (OL-19). PLACEHOLDER: filled by the policy work.

use alloc::string::String;
use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

/// URL scheme of a recipient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http`
    Http,
    /// `https`
    Https,
}

/// The host of a recipient URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lower-cased.
    Domain(String),
    /// An IPv4 literal.
    Ipv4(Ipv4Addr),
    /// An IPv6 literal (written in brackets in the URL).
    Ipv6(Ipv6Addr),
}

/// A canonical absolute http(s) recipient URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Recipient {
    canonical: String,
    scheme: Scheme,
    host: Host,
    port: u16,
}

/// Why a string is not a recipient URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlError {
    /// Not an absolute http(s) URL.
    NotAbsoluteHttp,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an absolute http(s) URL")
    }
}

impl Recipient {
    /// Parses and canonicalises a recipient URL.
    ///
    /// # Errors
    /// [`UrlError`] when the string is not an absolute http(s) URL.
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        let _ = s;
        Err(UrlError::NotAbsoluteHttp)
    }
    /// The canonical form.
    pub fn as_str(&self) -> &str {
        &self.canonical
    }
    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }
    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }
    /// The effective port (default port of the scheme when absent).
    pub fn port(&self) -> u16 {
        self.port
    }
}
