//! Destination address policy for the SSRF guard (§5).
//!
//! [`classify_addr`] sorts an IP address into an [`AddrClass`]; an [`AddressPolicy`] says
//! which classes a deployment may deliver to. Runtimes call [`AddressPolicy::check`] on IP
//! literal hosts before the request and on every address a name resolves to; an address
//! that fails the check is never connected to. The guard only sees addresses this process
//! connects to: behind an HTTP proxy it sees the proxy, not the recipient.
//!
//! Cloud metadata and credential services ([`AddrClass::CloudMetadata`]) are matched before
//! any range and refused whatever the policy's flags say: they hand out the host's cloud
//! credentials to whoever asks, which is what an SSRF through a recipient URL is after, and
//! several of them sit in space that a flag opens (unique local, shared CGNAT) or in public
//! space (Azure's `168.63.129.16`).
//!
//! IPv6 forms that carry an IPv4 address are judged by that address, so `::ffff:127.0.0.1`
//! is loopback and `::ffff:10.0.0.1` private:
//! - IPv4-mapped `::ffff:a.b.c.d` (how dual-stack sockets show IPv4 peers);
//! - IPv4-translated `::ffff:0:a.b.c.d` (RFC 6145 SIIT);
//! - IPv4-compatible `::a.b.c.d` (deprecated, but some stacks still route it), except `::`
//!   and `::1`, which are the IPv6 unspecified and loopback addresses;
//! - NAT64 `64:ff9b::a.b.c.d` (RFC 6052 well-known prefix): a NAT64 gateway would forward
//!   the connection to that IPv4 address, so the IPv4 verdict is the one that matters;
//! - 6to4 `2002:AABB:CCDD::/48` (RFC 3056): packets go encapsulated to `A.B.C.D`, so the
//!   prefix is judged by that IPv4 address.
//!
//! # Why not a crate
//!
//! The prefixes are [`ipnet`] networks (`no_std` + `alloc`). The classification around them
//! stays here: it is this product's policy (which space is refused, which flag opens
//! what, the cloud metadata services, IPv6 forms judged by their IPv4 address), and std's
//! own `Ipv4Addr::is_global` and kin are unstable and draw different lines.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{Ipv4Net, Ipv6Net};

/// The class of a destination address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddrClass {
    /// A globally routable unicast address: everything not listed below.
    Public,
    /// Loopback: `127.0.0.0/8`, `::1`.
    Loopback,
    /// A cloud metadata or credential service, refused whatever the policy says. Checked
    /// before every range below, and in every IPv6 form that embeds an IPv4 address
    /// (`::ffff:169.254.169.254` is one):
    /// - `169.254.169.254`: the instance metadata service of AWS, GCP, Azure, OpenStack,
    ///   Oracle Cloud and others;
    /// - `fd00:ec2::254`: AWS instance metadata over IPv6;
    /// - `fd20:ce::254`: GCP metadata over IPv6;
    /// - `169.254.170.2`: AWS ECS task metadata and credentials;
    /// - `169.254.170.23`, `fd00:ec2::23`: the AWS EKS Pod Identity Agent (credentials);
    /// - `100.100.100.200`: Alibaba Cloud metadata (in shared CGNAT space);
    /// - `168.63.129.16`: Azure WireServer (a public address).
    CloudMetadata,
    /// RFC 1918 private networks: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// Carrier-grade NAT shared space `100.64.0.0/10` (RFC 6598).
    SharedCgnat,
    /// Link-local: `169.254.0.0/16`, `fe80::/10` (the cloud metadata services in it are
    /// [`AddrClass::CloudMetadata`]).
    LinkLocal,
    /// IPv6 unique local addresses `fc00::/7` (RFC 4193), the IPv6 private networks.
    UniqueLocal,
    /// "This network" `0.0.0.0/8` (including the unspecified `0.0.0.0`) and `::`.
    /// Connecting to `0.0.0.0` reaches the local host on most systems.
    Unspecified,
    /// Multicast: `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// The limited broadcast address `255.255.255.255`.
    Broadcast,
    /// Documentation ranges: `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`
    /// (RFC 5737), `2001:db8::/32` (RFC 3849) and `3fff::/20` (RFC 9637).
    Documentation,
    /// Benchmarking: `198.18.0.0/15` (RFC 2544), `2001:2::/48` (RFC 5180).
    Benchmarking,
    /// Other special-purpose space that is not a delivery destination:
    /// - `192.0.0.0/24`, IETF protocol assignments (RFC 6890), taken whole although IANA
    ///   marks a few anycast addresses in it global;
    /// - `192.88.99.0/24`, the deprecated 6to4 relay anycast (RFC 7526);
    /// - `240.0.0.0/4`, reserved for future use (RFC 1112);
    /// - `100::/64`, discard-only (RFC 6666);
    /// - `2001::/23`, IETF protocol assignments (Teredo, ORCHID, AMT, …; RFC 2928), whole;
    /// - `64:ff9b:1::/48`, local-use NAT64 (RFC 8215): its translation is site-defined, so
    ///   its IPv4 target cannot be known here;
    /// - `fec0::/10`, deprecated site-local (RFC 3879);
    /// - every IPv6 address outside `2000::/3` not covered above: IANA has allocated no
    ///   other global unicast space, so nothing legitimate lives there (this includes the
    ///   `5f00::/16` SRv6 SIDs and the rest of `::/8`).
    Reserved,
}

impl AddrClass {
    /// A stable snake_case code, for logs and dead letters.
    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Public => "public",
            AddrClass::Loopback => "loopback",
            AddrClass::CloudMetadata => "cloud_metadata",
            AddrClass::Private => "private",
            AddrClass::SharedCgnat => "shared_cgnat",
            AddrClass::LinkLocal => "link_local",
            AddrClass::UniqueLocal => "unique_local",
            AddrClass::Unspecified => "unspecified",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Documentation => "documentation",
            AddrClass::Benchmarking => "benchmarking",
            AddrClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddrClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifies an address (see [`AddrClass`] for the ranges and the module docs for IPv6
/// forms that embed an IPv4 address).
pub fn classify_addr(addr: IpAddr) -> AddrClass {
    match addr {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// `prefix/len` (checked at compile time: every use is in a constant).
const fn net4(prefix: [u8; 4], len: u8) -> Ipv4Net {
    let [a, b, c, d] = prefix;
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

/// `prefix/len` (checked at compile time: every use is in a constant).
const fn net6(prefix: [u16; 8], len: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = prefix;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

/// The IPv4 addresses of [`AddrClass::CloudMetadata`].
const METADATA_V4: &[[u8; 4]] = &[
    [169, 254, 169, 254],
    [169, 254, 170, 2],
    [169, 254, 170, 23],
    [100, 100, 100, 200],
    [168, 63, 129, 16],
];

/// The IPv6 addresses of [`AddrClass::CloudMetadata`] (the IPv4 ones are also caught in
/// every IPv6 form that embeds them).
const METADATA_V6: &[[u16; 8]] = &[
    [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254],
    [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23],
    [0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254],
];

fn classify_v4(a: Ipv4Addr) -> AddrClass {
    if METADATA_V4.contains(&a.octets()) {
        return AddrClass::CloudMetadata;
    }
    const TABLE: &[(Ipv4Net, AddrClass)] = &[
        (net4([0, 0, 0, 0], 8), AddrClass::Unspecified),
        (net4([127, 0, 0, 0], 8), AddrClass::Loopback),
        (net4([10, 0, 0, 0], 8), AddrClass::Private),
        (net4([172, 16, 0, 0], 12), AddrClass::Private),
        (net4([192, 168, 0, 0], 16), AddrClass::Private),
        (net4([100, 64, 0, 0], 10), AddrClass::SharedCgnat),
        (net4([169, 254, 0, 0], 16), AddrClass::LinkLocal),
        (net4([192, 0, 0, 0], 24), AddrClass::Reserved),
        (net4([192, 0, 2, 0], 24), AddrClass::Documentation),
        (net4([198, 51, 100, 0], 24), AddrClass::Documentation),
        (net4([203, 0, 113, 0], 24), AddrClass::Documentation),
        (net4([198, 18, 0, 0], 15), AddrClass::Benchmarking),
        (net4([192, 88, 99, 0], 24), AddrClass::Reserved),
        (net4([224, 0, 0, 0], 4), AddrClass::Multicast),
        // Before 240/4, which contains it.
        (net4([255, 255, 255, 255], 32), AddrClass::Broadcast),
        (net4([240, 0, 0, 0], 4), AddrClass::Reserved),
    ];
    TABLE
        .iter()
        .find(|(net, _)| net.contains(&a))
        .map_or(AddrClass::Public, |&(_, class)| class)
}

fn classify_v6(a: Ipv6Addr) -> AddrClass {
    if METADATA_V6.contains(&a.segments()) {
        return AddrClass::CloudMetadata;
    }
    if a == Ipv6Addr::UNSPECIFIED {
        return AddrClass::Unspecified;
    }
    if a == Ipv6Addr::LOCALHOST {
        return AddrClass::Loopback;
    }
    if let Some(v4) = embedded_v4(a) {
        return classify_v4(v4);
    }
    // Most specific first: 2001:2::/48 and 2001:db8::/32 sit near 2001::/23, 64:ff9b:1::/48
    // is outside 2000::/3.
    const TABLE: &[(Ipv6Net, AddrClass)] = &[
        (
            net6([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48),
            AddrClass::Benchmarking,
        ),
        (net6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), AddrClass::Reserved),
        (
            net6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
            AddrClass::Documentation,
        ),
        (
            net6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
            AddrClass::Documentation,
        ),
        (
            net6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
            AddrClass::UniqueLocal,
        ),
        (
            net6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
            AddrClass::LinkLocal,
        ),
        (net6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), AddrClass::Reserved),
        (net6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), AddrClass::Multicast),
        (net6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3), AddrClass::Public),
    ];
    TABLE
        .iter()
        .find(|(net, _)| net.contains(&a))
        .map_or(AddrClass::Reserved, |&(_, class)| class)
}

/// The IPv4 address an IPv6 address stands for, if it is one of the embedding forms in the
/// module docs. `::` and `::1` are not (the caller handles them first).
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let o = a.octets();
    let low = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    const EMBED_LOW: &[Ipv6Net] = &[
        net6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),    // mapped
        net6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),    // translated
        net6([0, 0, 0, 0, 0, 0, 0, 0], 96),         // compatible
        net6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), // NAT64
    ];
    const SIX_TO_FOUR: Ipv6Net = net6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16);
    let embeds_low = EMBED_LOW.iter().any(|net| net.contains(&a));
    if embeds_low {
        return Some(low);
    }
    if SIX_TO_FOUR.contains(&a) {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// A destination address the [`AddressPolicy`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DestinationRefused {
    /// The refused address, as given (an IPv4-mapped address stays IPv6).
    pub addr: IpAddr,
    /// Its class (for IPv6 forms that embed an IPv4 address, the class of that address).
    pub class: AddrClass,
}

impl fmt::Display for DestinationRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "destination address {} refused: {} addresses are not allowed",
            self.addr, self.class
        )
    }
}

impl core::error::Error for DestinationRefused {}

/// Which destination addresses are allowed.
///
/// Public addresses always are, except the cloud metadata services. The default refuses
/// everything else; the flags open loopback and the local networks one at a time. Cloud
/// metadata, unspecified, multicast, broadcast, documentation, benchmarking and reserved
/// addresses are refused whatever the flags say: none of them is a place an HTTP recipient
/// can legitimately live, and the first is the classic SSRF target.
///
/// ```
/// use core::net::{IpAddr, Ipv4Addr};
/// use outbox_lanes_core::policy::{AddrClass, AddressPolicy};
///
/// let strict = AddressPolicy::default();
/// let refused = strict.check(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap_err();
/// assert_eq!(refused.class, AddrClass::Loopback);
/// assert!(AddressPolicy::allow_loopback_only().check(IpAddr::V4(Ipv4Addr::LOCALHOST)).is_ok());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddressPolicy {
    /// Admit [`AddrClass::Loopback`] (tests, and relays that deliver to a local service).
    pub allow_loopback: bool,
    /// Admit [`AddrClass::Private`], [`AddrClass::SharedCgnat`] and
    /// [`AddrClass::UniqueLocal`]: recipients on the organisation's own networks. The cloud
    /// metadata services in that space (AWS `fd00:ec2::254`, Alibaba `100.100.100.200`)
    /// stay refused: they are [`AddrClass::CloudMetadata`].
    pub allow_private: bool,
    /// Admit [`AddrClass::LinkLocal`]. Separate from `allow_private` because link-local
    /// space is where cloud services live next to the host (the metadata services, such as
    /// `169.254.169.254`, stay refused even so: they are [`AddrClass::CloudMetadata`]).
    pub allow_link_local: bool,
}

impl AddressPolicy {
    /// Public addresses only (the same as `default()`).
    pub const fn public_only() -> Self {
        AddressPolicy {
            allow_loopback: false,
            allow_private: false,
            allow_link_local: false,
        }
    }

    /// Public addresses and loopback (what tests against servers on 127.0.0.1 need).
    pub const fn allow_loopback_only() -> Self {
        AddressPolicy {
            allow_loopback: true,
            allow_private: false,
            allow_link_local: false,
        }
    }

    /// Whether addresses of `class` are allowed.
    pub fn allows(&self, class: AddrClass) -> bool {
        match class {
            AddrClass::Public => true,
            AddrClass::Loopback => self.allow_loopback,
            AddrClass::Private | AddrClass::SharedCgnat | AddrClass::UniqueLocal => {
                self.allow_private
            }
            AddrClass::LinkLocal => self.allow_link_local,
            AddrClass::CloudMetadata
            | AddrClass::Unspecified
            | AddrClass::Multicast
            | AddrClass::Broadcast
            | AddrClass::Documentation
            | AddrClass::Benchmarking
            | AddrClass::Reserved => false,
        }
    }

    /// Checks one address.
    ///
    /// # Errors
    /// [`DestinationRefused`] when the address's class is not allowed.
    pub fn check(&self, addr: IpAddr) -> Result<(), DestinationRefused> {
        let class = classify_addr(addr);
        if self.allows(class) {
            Ok(())
        } else {
            Err(DestinationRefused { addr, class })
        }
    }

    /// A resolver's filter: passes to `keep`, in order, each of a name's resolved addresses
    /// the policy allows, so that the name is reached at those alone (both HTTP clients'
    /// guarded resolvers use it).
    ///
    /// # Errors
    /// When it allows none of them: the first refusal, or `None` if there was no address.
    pub fn admit(
        &self,
        resolved: impl IntoIterator<Item = SocketAddr>,
        mut keep: impl FnMut(SocketAddr),
    ) -> Result<(), Option<DestinationRefused>> {
        let mut kept = false;
        let mut first_refused = None;
        for addr in resolved {
            match self.check(addr.ip()) {
                Ok(()) => {
                    kept = true;
                    keep(addr);
                }
                Err(refused) => {
                    first_refused.get_or_insert(refused);
                }
            }
        }
        if kept { Ok(()) } else { Err(first_refused) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;
    use alloc::vec::Vec;

    #[test]
    fn admit_keeps_the_allowed_addresses_in_order_or_names_the_first_refusal() {
        let sock = |s: &str| -> SocketAddr { s.parse().unwrap() };
        let resolved = [
            sock("10.0.0.1:0"),
            sock("127.0.0.1:0"),
            sock("169.254.169.254:0"),
            sock("[::1]:0"),
        ];
        let mut kept = Vec::new();
        let loopback = AddressPolicy::allow_loopback_only();
        assert_eq!(loopback.admit(resolved, |a| kept.push(a)), Ok(()));
        assert_eq!(kept, [sock("127.0.0.1:0"), sock("[::1]:0")]);

        kept.clear();
        let refused = AddressPolicy::default()
            .admit(resolved, |a| kept.push(a))
            .unwrap_err()
            .unwrap();
        assert!(kept.is_empty());
        assert_eq!(
            (refused.addr, refused.class),
            (v4("10.0.0.1"), AddrClass::Private)
        );

        assert_eq!(loopback.admit([], |a| kept.push(a)), Err(None));
        assert!(kept.is_empty());
    }

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse().unwrap())
    }

    fn v6(s: &str) -> IpAddr {
        IpAddr::V6(s.parse().unwrap())
    }

    fn class(s: &str) -> AddrClass {
        let addr: IpAddr = s.parse().unwrap();
        classify_addr(addr)
    }

    /// Checks the first and last address of a range and the neighbours just outside.
    fn range(first: &str, last: &str, inside: AddrClass, before: AddrClass, after: AddrClass) {
        let first: IpAddr = first.parse().unwrap();
        let last: IpAddr = last.parse().unwrap();
        let (prev, next) = match (first, last) {
            (IpAddr::V4(f), IpAddr::V4(l)) => (
                IpAddr::V4(Ipv4Addr::from(u32::from(f).wrapping_sub(1))),
                IpAddr::V4(Ipv4Addr::from(u32::from(l).wrapping_add(1))),
            ),
            (IpAddr::V6(f), IpAddr::V6(l)) => (
                IpAddr::V6(Ipv6Addr::from(u128::from(f).wrapping_sub(1))),
                IpAddr::V6(Ipv6Addr::from(u128::from(l).wrapping_add(1))),
            ),
            _ => panic!("mixed families"),
        };
        assert_eq!(classify_addr(first), inside, "first {first}");
        assert_eq!(classify_addr(last), inside, "last {last}");
        assert_eq!(classify_addr(prev), before, "before {prev}");
        assert_eq!(classify_addr(next), after, "after {next}");
    }

    #[test]
    fn ipv4_ranges_with_their_neighbours() {
        use AddrClass::*;
        range("0.0.0.0", "0.255.255.255", Unspecified, Broadcast, Public);
        range("10.0.0.0", "10.255.255.255", Private, Public, Public);
        range("100.64.0.0", "100.127.255.255", SharedCgnat, Public, Public);
        range("127.0.0.0", "127.255.255.255", Loopback, Public, Public);
        range("169.254.0.0", "169.254.255.255", LinkLocal, Public, Public);
        range("172.16.0.0", "172.31.255.255", Private, Public, Public);
        range("192.0.0.0", "192.0.0.255", Reserved, Public, Public);
        range("192.0.2.0", "192.0.2.255", Documentation, Public, Public);
        range("192.88.99.0", "192.88.99.255", Reserved, Public, Public);
        range("192.168.0.0", "192.168.255.255", Private, Public, Public);
        range("198.18.0.0", "198.19.255.255", Benchmarking, Public, Public);
        range(
            "198.51.100.0",
            "198.51.100.255",
            Documentation,
            Public,
            Public,
        );
        range(
            "203.0.113.0",
            "203.0.113.255",
            Documentation,
            Public,
            Public,
        );
        range("224.0.0.0", "239.255.255.255", Multicast, Public, Reserved);
        range(
            "240.0.0.0",
            "255.255.255.254",
            Reserved,
            Multicast,
            Broadcast,
        );
        range(
            "255.255.255.255",
            "255.255.255.255",
            Broadcast,
            Reserved,
            Unspecified,
        );
        assert_eq!(class("192.0.1.255"), Public);
        assert_eq!(class("192.0.3.0"), Public);
        assert_eq!(class("1.1.1.1"), Public);
        assert_eq!(class("8.8.8.8"), Public);
        assert_eq!(class("169.254.169.253"), LinkLocal);
        assert_eq!(class("169.254.169.255"), LinkLocal);
    }

    #[test]
    fn ipv6_ranges_with_their_neighbours() {
        use AddrClass::*;
        assert_eq!(class("::"), Unspecified);
        assert_eq!(class("::1"), Loopback);
        range(
            "fc00::",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            UniqueLocal,
            Reserved,
            Reserved,
        );
        range(
            "fe80::",
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            LinkLocal,
            Reserved,
            Reserved,
        );
        range(
            "fec0::",
            "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Reserved,
            LinkLocal,
            Multicast,
        );
        range(
            "ff00::",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Multicast,
            Reserved,
            Unspecified,
        );
        range(
            "2001:db8::",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            Documentation,
            Public,
            Public,
        );
        range(
            "3fff::",
            "3fff:0fff:ffff:ffff:ffff:ffff:ffff:ffff",
            Documentation,
            Public,
            Public,
        );
        range(
            "2001::",
            "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
            Reserved,
            Public,
            Public,
        );
        range(
            "2001:2::",
            "2001:2:0:ffff:ffff:ffff:ffff:ffff",
            Benchmarking,
            Reserved,
            Reserved,
        );
        range(
            "2000::",
            "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Public,
            Reserved,
            Reserved,
        );
        range(
            "100::",
            "100::ffff:ffff:ffff:ffff",
            Reserved,
            Reserved,
            Reserved,
        );
        range(
            "64:ff9b:1::",
            "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            Reserved,
            Reserved,
            Reserved,
        );
        assert_eq!(class("2606:4700:4700::1111"), Public);
        assert_eq!(class("2a00:1450:4001::200e"), Public);
        assert_eq!(class("5f00::1"), Reserved);
        assert_eq!(class("4000::1"), Reserved);
        assert_eq!(class("1fff:ffff::1"), Reserved);
    }

    #[test]
    fn ipv6_forms_embedding_ipv4_are_judged_by_the_ipv4() {
        use AddrClass::*;
        for prefix in ["::ffff:", "::ffff:0:", "::", "64:ff9b::"] {
            for (v4addr, want) in [
                ("127.0.0.1", Loopback),
                ("10.1.2.3", Private),
                ("169.254.169.254", CloudMetadata),
                ("169.254.1.1", LinkLocal),
                ("100.64.0.1", SharedCgnat),
                ("0.0.0.0", Unspecified),
                ("224.0.0.1", Multicast),
                ("255.255.255.255", Broadcast),
                ("192.0.2.1", Documentation),
                ("198.18.0.1", Benchmarking),
                ("8.8.8.8", Public),
            ] {
                let s = format!("{prefix}{v4addr}");
                if s == "::0.0.0.0" {
                    continue; // that is `::`, unspecified anyway
                }
                assert_eq!(class(&s), want, "{s}");
            }
        }
        // `::1` is IPv6 loopback, not the IPv4-compatible 0.0.0.1; `::2` is 0.0.0.2.
        assert_eq!(class("::1"), Loopback);
        assert_eq!(class("::2"), Unspecified);
        assert_eq!(class("::ffff:0:0"), Unspecified);
        // Just outside the mapped and NAT64 /96s.
        assert_eq!(class("::fffe:ffff:ffff"), Reserved);
        assert_eq!(class("::ffff:1:0:0"), Reserved);
        assert_eq!(class("::1:0:0:0"), Reserved);
        assert_eq!(class("64:ff9b::1:0:0:0"), Reserved);
        assert_eq!(class("64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff"), Reserved);
        // 6to4 by the IPv4 in bits 16..48.
        assert_eq!(class("2002:7f00:1::1"), Loopback);
        assert_eq!(class("2002:c0a8:101::1"), Private);
        assert_eq!(class("2002:808:808::1"), Public);
        assert_eq!(class("2002::1"), Unspecified);
    }

    #[test]
    fn policies() {
        let all = [
            v4("8.8.8.8"),
            v4("127.0.0.1"),
            v6("::1"),
            v6("::ffff:127.0.0.1"),
            v4("10.0.0.1"),
            v4("100.64.0.1"),
            v6("fd00:ec2::254"),
            v4("169.254.169.254"),
            v6("fe80::1"),
            v4("0.0.0.0"),
            v6("::"),
            v4("224.0.0.1"),
            v4("255.255.255.255"),
            v4("192.0.2.1"),
            v4("198.18.0.1"),
            v4("240.0.0.1"),
        ];
        let admitted = |p: AddressPolicy| -> Vec<IpAddr> {
            all.iter()
                .copied()
                .filter(|&a| p.check(a).is_ok())
                .collect()
        };
        assert_eq!(admitted(AddressPolicy::default()), [v4("8.8.8.8")]);
        assert_eq!(AddressPolicy::default(), AddressPolicy::public_only());
        assert_eq!(
            admitted(AddressPolicy::allow_loopback_only()),
            [
                v4("8.8.8.8"),
                v4("127.0.0.1"),
                v6("::1"),
                v6("::ffff:127.0.0.1")
            ]
        );
        let private = AddressPolicy {
            allow_private: true,
            ..AddressPolicy::default()
        };
        assert_eq!(
            admitted(private),
            [v4("8.8.8.8"), v4("10.0.0.1"), v4("100.64.0.1")]
        );
        let link_local = AddressPolicy {
            allow_link_local: true,
            ..AddressPolicy::default()
        };
        assert_eq!(admitted(link_local), [v4("8.8.8.8"), v6("fe80::1")]);
        let everything = AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: true,
        };
        assert_eq!(admitted(everything).len(), 7);

        let refused = AddressPolicy::default().check(v6("::ffff:10.0.0.1"));
        assert_eq!(
            refused,
            Err(DestinationRefused {
                addr: v6("::ffff:10.0.0.1"),
                class: AddrClass::Private
            })
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "destination address ::ffff:10.0.0.1 refused: private addresses are not allowed"
        );
        assert_eq!(AddrClass::SharedCgnat.to_string(), "shared_cgnat");
        assert_eq!(AddrClass::LinkLocal.as_str(), "link_local");
    }

    #[test]
    fn cloud_metadata_is_refused_whatever_the_flags() {
        let metadata_v4 = [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.170.23",
            "100.100.100.200",
            "168.63.129.16",
        ];
        let mut refused: Vec<IpAddr> = ["fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254"]
            .iter()
            .map(|s| v6(s))
            .collect();
        for a in metadata_v4 {
            refused.push(v4(a));
            // Every IPv6 form that carries it: mapped, translated, compatible, NAT64, 6to4.
            for prefix in ["::ffff:", "::ffff:0:", "::", "64:ff9b::"] {
                refused.push(v6(&format!("{prefix}{a}")));
            }
            let o: Ipv4Addr = a.parse().unwrap();
            let o = o.octets();
            refused.push(v6(&format!(
                "2002:{:02x}{:02x}:{:02x}{:02x}::1",
                o[0], o[1], o[2], o[3]
            )));
        }
        // Spelt out, as a resolver or a URL parser may hand it over.
        refused.push(v6("::ffff:a9fe:a9fe"));
        refused.push(v6("0:0:0:0:0:ffff:a9fe:a9fe"));
        refused.push(v6("FD00:EC2:0:0:0:0:0:254"));
        let mut policies = Vec::new();
        for bits in 0..8u8 {
            policies.push(AddressPolicy {
                allow_loopback: bits & 1 != 0,
                allow_private: bits & 2 != 0,
                allow_link_local: bits & 4 != 0,
            });
        }
        for addr in refused {
            assert_eq!(classify_addr(addr), AddrClass::CloudMetadata, "{addr}");
            for p in policies.iter() {
                assert_eq!(
                    p.check(addr),
                    Err(DestinationRefused {
                        addr,
                        class: AddrClass::CloudMetadata
                    }),
                    "{addr} with {p:?}"
                );
            }
        }
        assert_eq!(AddrClass::CloudMetadata.as_str(), "cloud_metadata");
        // Their neighbours keep their classes.
        assert_eq!(class("168.63.129.15"), AddrClass::Public);
        assert_eq!(class("168.63.129.17"), AddrClass::Public);
        assert_eq!(class("100.100.100.201"), AddrClass::SharedCgnat);
        assert_eq!(class("169.254.170.3"), AddrClass::LinkLocal);
        assert_eq!(class("fd00:ec2::253"), AddrClass::UniqueLocal);
        assert_eq!(class("fd20:ce::255"), AddrClass::UniqueLocal);
        let open = AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: true,
        };
        assert!(open.check(v4("168.63.129.17")).is_ok());
        assert!(open.check(v6("fd00:ec2::253")).is_ok());
    }
}
