//! Who a request comes from: the address of its connection (behind a reverse proxy, the proxy's), which the serve
//! loop records on every request, and the client that address counts as wherever something is bounded per client
//! (open event streams, login attempts, wrong bearer tokens).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::Extensions;
use axum::http::request::Parts;

/// The address a request comes from, canonical (an IPv4 client on an IPv6 socket reads as IPv4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// The client of a request, as the serve loop recorded it.
    pub fn of(extensions: &Extensions) -> Option<Self> {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| Self(peer.ip().to_canonical()))
    }

    /// Who the client is for a bound kept per client: an IPv4 address, or the /64 an IPv6 address is in (one host
    /// has a whole /64 to pick addresses from, and would otherwise get the bound once per address).
    pub fn counted(self) -> IpAddr {
        counted_as(self.0)
    }
}

/// Who `address` is for a bound kept per client ([`ClientAddr::counted`]).
pub fn counted_as(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // A router served some other way (a test calling it directly) has one client.
        Ok(Self::of(&parts.extensions).unwrap_or(Self(IpAddr::V4(Ipv4Addr::UNSPECIFIED))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_counts_as_its_64_and_an_ipv4_one_as_itself() {
        let counted = |address: &str| ClientAddr(address.parse().unwrap()).counted().to_string();
        assert_eq!(counted("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(counted("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::");
        assert_eq!(counted("2001:db8:1:3::1"), "2001:db8:1:3::");
        assert_eq!(counted("192.0.2.7"), "192.0.2.7");
        assert_eq!(counted("::ffff:192.0.2.7"), "192.0.2.7");
    }
}
