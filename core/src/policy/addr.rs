//! Destination address policy for the SSRF guard. PLACEHOLDER: filled by the policy work.

use core::net::IpAddr;

/// The class of a destination address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddrClass {
    /// A globally routable address.
    Public,
    /// Loopback.
    Loopback,
}

/// A refused destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DestinationRefused {
    /// The refused address.
    pub addr: IpAddr,
    /// Its class.
    pub class: AddrClass,
}

/// Which destination addresses are allowed.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddressPolicy {}

impl AddressPolicy {
    /// Checks one address.
    ///
    /// # Errors
    /// [`DestinationRefused`] when the address is not allowed.
    pub fn check(&self, addr: IpAddr) -> Result<(), DestinationRefused> {
        let _ = addr;
        Ok(())
    }
}
