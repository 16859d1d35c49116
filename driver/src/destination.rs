//! A lane's recipient URL, parsed once ([`Destination`]): what every attempt to the lane
//! shares, the key of the per-host caps and of the origin's host book, and the checks of an
//! attempt that need no I/O.

use core::fmt;
use std::sync::Arc;

use outbox_lanes_core::policy::{AddressPolicy, Classifier, Recipient, UrlError};

use crate::attempt::{AttemptResult, invalid_recipient, refused_result};

/// A lane's recipient URL, parsed once: a pass keeps one per lane, and every attempt to the
/// lane shares it, so no attempt parses the URL again.
///
/// The store keeps recipients canonical (enqueue parsed them), so the parse succeeds unless
/// the row was written with plain SQL by hand; a URL that does not parse fails every attempt
/// as `invalid_recipient`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    url: Result<Recipient, (String, UrlError)>,
    host_port: String,
    origin: Arc<str>,
}

impl Destination {
    /// Parses `url` (the recipient as stored).
    pub fn parse(url: &str) -> Destination {
        match Recipient::parse(url) {
            Ok(r) => Destination {
                host_port: format!("{}:{}", r.host(), r.port()),
                origin: Arc::from(format!(
                    "{}://{}:{}",
                    r.scheme().as_str(),
                    r.host(),
                    r.port()
                )),
                url: Ok(r),
            },
            Err(e) => Destination {
                host_port: url.to_owned(),
                origin: Arc::from(url),
                url: Err((url.to_owned(), e)),
            },
        }
    }

    /// The URL: canonical, or as stored when it does not parse.
    pub fn as_str(&self) -> &str {
        match &self.url {
            Ok(r) => r.as_str(),
            Err((text, _)) => text,
        }
    }

    /// The parsed URL.
    ///
    /// # Errors
    /// Why the stored URL is not a recipient URL.
    pub fn url(&self) -> Result<&Recipient, &UrlError> {
        self.url.as_ref().map_err(|(_, e)| e)
    }

    /// The checks of an attempt to this destination that need no I/O, the first that
    /// [`RequestPolicy::build`](crate::request::RequestPolicy::build) makes: the URL parsed, and an IP-literal host allowed by
    /// `addresses` (names are checked by the clients' resolvers, on the addresses they
    /// connect to). Their answer is the same for every attempt to the lane in a pass.
    ///
    /// # Errors
    /// The result of the attempt when nothing may be sent: an `invalid_recipient`
    /// [`Outcome::Permanent`](outbox_lanes_core::Outcome::Permanent), or a refused destination
    /// as `classifier` classifies it.
    pub fn check(
        &self,
        addresses: &AddressPolicy,
        classifier: &Classifier,
    ) -> Result<&Recipient, AttemptResult> {
        let url = self.url().map_err(invalid_recipient)?;
        if let Some(ip) = url.host().ip_addr() {
            addresses
                .check(ip)
                .map_err(|refused| refused_result(&refused, classifier))?;
        }
        Ok(url)
    }

    /// The canonical `host:port` (default port included), the key of the per-host caps; the
    /// URL itself when it does not parse (its attempts fail anyway).
    pub fn host_port(&self) -> &str {
        &self.host_port
    }

    /// The origin, `scheme://host:port` (default port included): the key of origin health
    /// and of the signature scheme learned ([`crate::origins`]), the same text as the store's
    /// [`origin_of`](outbox_lanes_store::origin_of). The URL itself when it does not parse.
    pub fn origin(&self) -> &Arc<str> {
        &self.origin
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
