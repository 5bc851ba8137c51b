//! Origins and hosts: which pages may change state on this server, and which `Host` names a server without a
//! token answers at all.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A host and an optional port, as in a `Host` header or an origin, normalized: lowercase, IPv6 in brackets and
/// in its canonical text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    pub host: String,
    pub port: Option<u16>,
}

impl Authority {
    /// Parses `host[:port]`; `None` for anything else (user info, a path, spaces, an empty or odd host).
    pub fn parse(raw: &str) -> Option<Self> {
        let digits = |port: &str| {
            (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
                .then(|| port.parse::<u16>().ok())
                .flatten()
        };
        let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
            let (inside, after) = rest.split_once(']')?;
            let ip: Ipv6Addr = inside.parse().ok()?;
            let port = match after {
                "" => None,
                _ => Some(digits(after.strip_prefix(':')?)?),
            };
            (format!("[{ip}]"), port)
        } else {
            let (host, port) = match raw.split_once(':') {
                Some((host, port)) => (host, Some(digits(port)?)),
                None => (raw, None),
            };
            let valid = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            if !valid {
                return None;
            }
            (host.to_ascii_lowercase(), port)
        };
        Some(Self { host, port })
    }

    /// Whether the host names this machine's loopback interface, which no other machine (and no DNS answer a web
    /// page's attacker controls) can be.
    pub fn is_loopback(&self) -> bool {
        if self.host == "localhost" || self.host.ends_with(".localhost") {
            return true;
        }
        if let Some(inside) = self
            .host
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
        {
            return inside
                .parse::<Ipv6Addr>()
                .is_ok_and(|ip| ip.to_canonical().is_loopback());
        }
        self.host
            .parse::<Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
    }

    /// `host[:port]`, without the port when it is the scheme's default.
    fn serialize(&self, default_port: u16) -> String {
        match self.port {
            Some(port) if port != default_port => format!("{}:{port}", self.host),
            _ => self.host.clone(),
        }
    }
}

/// An origin browsers use to reach this server (`--public-origin`), normalized the way browsers serialize the
/// `Origin` header: `scheme://host[:port]`, lowercase, without the default port or a trailing slash.
#[derive(Clone)]
pub struct PublicOrigin {
    serialized: String,
    authority: Authority,
}

/// Two origins are the same when they serialize the same (`http://a` and `http://a:80` are one origin).
impl PartialEq for PublicOrigin {
    fn eq(&self, other: &Self) -> bool {
        self.serialized == other.serialized
    }
}

impl Eq for PublicOrigin {}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl PublicOrigin {
    /// Parses an origin such as `https://toolgate.example.com` or `http://127.0.0.1:3000`.
    pub fn parse(value: &str) -> Result<Self, String> {
        let invalid = || {
            format!(
                "{value:?} is not an origin; expected scheme://host[:port] with scheme http or https, for example https://toolgate.example.com"
            )
        };
        let trimmed = value.trim();
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        let (scheme, rest) = trimmed.split_once("://").ok_or_else(invalid)?;
        let scheme = scheme.to_ascii_lowercase();
        let default = default_port(&scheme).ok_or_else(invalid)?;
        let authority = Authority::parse(rest).ok_or_else(invalid)?;
        Ok(Self {
            serialized: format!("{scheme}://{}", authority.serialize(default)),
            authority,
        })
    }

    /// The origin of a page served by plain HTTP under the `Host` it was requested with: the server's own origin
    /// when no `--public-origin` is given.
    pub fn from_host(host: &Authority) -> Self {
        Self {
            serialized: format!("http://{}", host.serialize(80)),
            authority: host.clone(),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.serialized
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn is_https(&self) -> bool {
        self.serialized.starts_with("https://")
    }
}

impl fmt::Display for PublicOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.serialized)
    }
}

impl fmt::Debug for PublicOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicOrigin({})", self.serialized)
    }
}

/// What the browser says about where a request comes from, in `Sec-Fetch-Site`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchSite {
    /// From a page of this very origin.
    SameOrigin,
    /// Started by the person (typed address, bookmark), not by any page.
    None,
    /// From another origin of the same site (another port of 127.0.0.1, a sibling subdomain): still not us.
    SameSite,
    CrossSite,
}

impl FetchSite {
    /// `None` for a value no browser sends, which is refused like a cross-site one.
    pub fn parse(value: &[u8]) -> Option<Self> {
        match value {
            b"same-origin" => Some(Self::SameOrigin),
            b"none" => Some(Self::None),
            b"same-site" => Some(Self::SameSite),
            b"cross-site" => Some(Self::CrossSite),
            _ => None,
        }
    }

    pub fn is_allowed(self) -> bool {
        matches!(self, Self::SameOrigin | Self::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_normalized_like_browsers_serialize_them() {
        for (given, normalized) in [
            (
                "https://Toolgate.Example.com/",
                "https://toolgate.example.com",
            ),
            (
                "https://toolgate.example.com:443",
                "https://toolgate.example.com",
            ),
            ("http://127.0.0.1:80", "http://127.0.0.1"),
            ("http://127.0.0.1:3000", "http://127.0.0.1:3000"),
            ("HTTP://[::1]:3000", "http://[::1]:3000"),
            ("http://[0:0:0:0:0:0:0:1]", "http://[::1]"),
            (
                "https://agent.example.com:8443",
                "https://agent.example.com:8443",
            ),
        ] {
            assert_eq!(
                PublicOrigin::parse(given).unwrap().as_str(),
                normalized,
                "{given}"
            );
        }
    }

    #[test]
    fn anything_that_is_not_an_origin_is_refused() {
        for bad in [
            "",
            "toolgate.example.com",
            "ftp://toolgate.example.com",
            "https://",
            "https://toolgate.example.com/path",
            "https://user@toolgate.example.com",
            "https://toolgate.example.com:99999",
            "https://toolgate.example.com:+80",
            "https://tool gate.example.com",
            "https://[not-ipv6]",
            "null",
        ] {
            let error = PublicOrigin::parse(bad).unwrap_err();
            assert!(error.contains("is not an origin"), "{bad}: {error}");
        }
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for host in [
            "localhost",
            "localhost:3000",
            "app.localhost:3000",
            "127.0.0.1:3000",
            "127.1.2.3",
            "[::1]:3000",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(Authority::parse(host).unwrap().is_loopback(), "{host}");
        }
        for host in [
            "evil.example:3000",
            "10.0.0.5:3000",
            "0.0.0.0:3000",
            "[::]:3000",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(!Authority::parse(host).unwrap().is_loopback(), "{host}");
        }
        assert_eq!(Authority::parse("a b"), None);
        assert_eq!(Authority::parse("host:"), None);
        assert_eq!(Authority::parse("user@host"), None);
    }

    #[test]
    fn the_default_origin_is_http_on_the_host() {
        let host = Authority::parse("127.0.0.1:3000").unwrap();
        assert_eq!(
            PublicOrigin::from_host(&host).as_str(),
            "http://127.0.0.1:3000"
        );
        let host = Authority::parse("Example.COM:80").unwrap();
        assert_eq!(
            PublicOrigin::from_host(&host).as_str(),
            "http://example.com"
        );
    }

    #[test]
    fn only_same_origin_and_user_initiated_fetches_are_allowed() {
        assert_eq!(
            FetchSite::parse(b"same-origin").map(FetchSite::is_allowed),
            Some(true)
        );
        assert_eq!(
            FetchSite::parse(b"none").map(FetchSite::is_allowed),
            Some(true)
        );
        assert_eq!(
            FetchSite::parse(b"same-site").map(FetchSite::is_allowed),
            Some(false)
        );
        assert_eq!(
            FetchSite::parse(b"cross-site").map(FetchSite::is_allowed),
            Some(false)
        );
        assert_eq!(FetchSite::parse(b"Same-Origin"), None);
    }
}
