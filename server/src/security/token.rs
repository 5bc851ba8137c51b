//! The access token and the credentials derived from it: the bearer check and the login cookie.
//!
//! The token itself is never stored anywhere a log or a `Debug` print could reach, never sent back to the browser,
//! and never compared with `==`: every comparison is an HMAC verification, constant-time in content and length.

use std::fmt;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The longest token accepted, in bytes: more than any password manager produces, small enough to hash at once.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// The name of the cookie the login page sets.
pub const AUTH_COOKIE: &str = "toolgate_auth";

/// What the login cookie's value is derived from (the token is the HMAC key). Changing the token changes the
/// cookie, so rotating the token logs every browser out.
const COOKIE_LABEL: &[u8] = b"toolgate login cookie v1";

/// The secret that `--token` / `TOOLGATE_TOKEN` sets. Its `Debug` never shows it, so printing the configuration
/// (or a panic message that includes it) cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// Accepts printable ASCII without spaces (what fits in an `Authorization` header unchanged), 1 to
    /// [`MAX_TOKEN_BYTES`] bytes. The error never repeats the value.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.is_empty() {
            return Err("the token must not be empty".into());
        }
        if value.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "the token must be at most {MAX_TOKEN_BYTES} bytes long"
            ));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the token may contain only printable ASCII characters, without spaces".into(),
            );
        }
        Ok(Self(value.to_owned()))
    }

    fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Short tokens are allowed (a local demo may use one) but deserve a warning.
    pub fn is_short(&self) -> bool {
        self.0.len() < 16
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the system's random number generator failed")]
pub struct RandomUnavailable;

/// Everything needed to check a request's credentials, derived once at start-up.
pub struct Credentials {
    /// A random per-process key: comparisons are HMAC verifications under it, so they take the same time whatever
    /// the presented value is, and the tags below reveal nothing across restarts.
    compare_key: hmac::Key,
    token_tag: hmac::Tag,
    cookie_tag: hmac::Tag,
    /// The login cookie's value: HMAC-SHA256(key = token, COOKIE_LABEL), hex. Not the token, and useless
    /// without it for anything but this server's cookie check.
    cookie_value: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Credentials {
    pub fn new(token: &AccessToken) -> Result<Self, RandomUnavailable> {
        let mut key = [0u8; 32];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| RandomUnavailable)?;
        let compare_key = hmac::Key::new(hmac::HMAC_SHA256, &key);
        let cookie_value = hex(hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, token.expose()),
            COOKIE_LABEL,
        )
        .as_ref());
        Ok(Self {
            token_tag: hmac::sign(&compare_key, token.expose()),
            cookie_tag: hmac::sign(&compare_key, cookie_value.as_bytes()),
            compare_key,
            cookie_value,
        })
    }

    /// Whether `presented` is the token, in constant time.
    pub fn is_token(&self, presented: &[u8]) -> bool {
        hmac::verify(&self.compare_key, presented, self.token_tag.as_ref()).is_ok()
    }

    /// Whether `presented` is the login cookie's value, in constant time.
    pub fn is_cookie(&self, presented: &[u8]) -> bool {
        hmac::verify(&self.compare_key, presented, self.cookie_tag.as_ref()).is_ok()
    }

    /// The value the login page puts in the cookie.
    pub fn cookie_value(&self) -> &str {
        &self.cookie_value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_printable_ascii_and_never_shown() {
        let token = AccessToken::parse("s3cret-Token_with.punct!").unwrap();
        assert_eq!(format!("{token:?}"), "AccessToken(<redacted>)");
        assert_eq!(
            AccessToken::parse("").unwrap_err(),
            "the token must not be empty"
        );
        for bad in ["has space", "tab\there", "é-accent", "new\nline"] {
            let error = AccessToken::parse(bad).unwrap_err();
            assert!(!error.contains(bad), "the error repeats the value: {error}");
        }
        assert!(AccessToken::parse(&"x".repeat(MAX_TOKEN_BYTES + 1)).is_err());
        assert!(AccessToken::parse(&"x".repeat(MAX_TOKEN_BYTES)).is_ok());
    }

    #[test]
    fn the_token_and_the_cookie_are_recognised_and_nothing_else() {
        let credentials = Credentials::new(&AccessToken::parse("correct-horse").unwrap()).unwrap();
        assert!(credentials.is_token(b"correct-horse"));
        for wrong in [
            &b"correct-hors"[..],
            b"correct-horsee",
            b"",
            b"CORRECT-HORSE",
        ] {
            assert!(!credentials.is_token(wrong));
        }
        let cookie = credentials.cookie_value().to_owned();
        assert_eq!(cookie.len(), 64, "hex of a SHA-256 HMAC");
        assert!(!cookie.contains("correct-horse"));
        assert!(credentials.is_cookie(cookie.as_bytes()));
        assert!(
            !credentials.is_cookie(b"correct-horse"),
            "the raw token is not a cookie"
        );
        assert!(
            !credentials.is_token(cookie.as_bytes()),
            "the cookie is not the token"
        );
        assert_eq!(format!("{credentials:?}"), "Credentials(<redacted>)");
    }

    #[test]
    fn the_cookie_is_stable_for_a_token_and_changes_with_it() {
        let token = AccessToken::parse("correct-horse").unwrap();
        let one = Credentials::new(&token).unwrap();
        let two = Credentials::new(&token).unwrap();
        assert_eq!(
            one.cookie_value(),
            two.cookie_value(),
            "a restart keeps browsers logged in"
        );
        let other = Credentials::new(&AccessToken::parse("battery-staple").unwrap()).unwrap();
        assert_ne!(
            one.cookie_value(),
            other.cookie_value(),
            "a new token logs them out"
        );
        assert!(!one.is_cookie(other.cookie_value().as_bytes()));
    }
}
