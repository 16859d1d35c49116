//! Pure delivery policy shared by every runtime: status classification, Retry-After,
//! recipient URL canonicalisation and the SSRF guard's address policy.

pub mod addr;
pub mod classify;
pub mod retry_after;
pub mod url;

pub use addr::{AddrClass, AddressPolicy, DestinationRefused, classify_addr};
pub use classify::{
    Classifier, StatusClass, StatusOverride, TransportError, classify, default_class,
};
pub use retry_after::{DEFAULT_RETRY_AFTER_CAP, parse_retry_after};
pub use url::{Host, Recipient, Scheme, UrlError};
