//! HTTP delivery (temporary minimal version; replaced by the full client).
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::policy::{AddressPolicy, Classifier};
use outbox_lanes_core::{Outcome, UnitId};

use crate::sign::Signer;

#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub timeout: Duration,
    pub user_agent: String,
    pub max_response_body: usize,
    pub addresses: AddressPolicy,
    pub proxy: Option<String>,
    pub classifier: Classifier,
    pub retry_after_cap: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: Duration::from_secs(30),
            user_agent: String::from("outbox-lanes"),
            max_response_body: 64 * 1024,
            addresses: AddressPolicy::default(),
            proxy: None,
            classifier: Classifier::default(),
            retry_after_cap: Duration::from_secs(3600),
        }
    }
}

pub struct Delivery<'a> {
    pub unit: UnitId,
    pub recipient: &'a str,
    pub body: &'a [u8],
    pub content_type: &'a str,
    pub attempt: u32,
}

#[derive(Clone, Debug)]
pub struct AttemptResult {
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub error: Option<String>,
}

#[derive(Debug)]
pub enum HttpError {}

impl std::fmt::Display for HttpError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

#[derive(Clone)]
pub struct HttpClient {}

impl HttpClient {
    pub fn new(_cfg: HttpConfig, _signer: Option<Arc<dyn Signer>>) -> Result<Self, HttpError> {
        Ok(HttpClient {})
    }
    pub fn deliver(&self, _d: &Delivery<'_>, _now: SystemTime) -> AttemptResult {
        AttemptResult {
            outcome: Outcome::Transient { retry_after: None },
            status: None,
            error: Some("not implemented".into()),
        }
    }
}
impl std::error::Error for HttpError {}
