//! Request signing (temporary minimal version; replaced by the full signer).
#![allow(missing_docs)]

use std::time::SystemTime;

use outbox_lanes_core::UnitId;

pub struct SignRequest<'a> {
    pub unit: UnitId,
    pub recipient: &'a str,
    pub body: &'a [u8],
    pub content_type: &'a str,
    pub at: SystemTime,
    pub attempt: u32,
}

pub trait Signer: Send + Sync {
    fn sign(&self, req: &SignRequest<'_>) -> Vec<(String, String)>;
}
