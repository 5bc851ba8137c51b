//! The access token and the credentials derived from it: the bearer check and the login cookie.
//!
//! The token itself is never stored anywhere a log or a `Debug` print could reach, never sent back to the browser,
//! and never compared with `==`: every comparison is an HMAC verification, constant-time in content and length.
//! A login cookie is not the token either: it is an expiry and a MAC over it keyed by the token.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The longest token accepted, in bytes: more than any password manager produces, small enough to hash at once.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// The name of the cookie the login page sets.
pub const AUTH_COOKIE: &str = "toolgate_auth";

/// How long a login lasts. The expiry travels inside the cookie, under its MAC, so the server refuses a cookie
/// past it whatever the browser keeps, and every instance started with the same token agrees.
pub const LOGIN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// What the login cookie's MAC covers besides its expiry (the token is the HMAC key). Changing the token changes
/// every MAC, so rotating the token logs every browser out.
const COOKIE_LABEL: &[u8] = b"toolgate login cookie v2\0";

/// The longest decimal expiry a cookie may carry (`u64::MAX` has 20 digits).
const MAX_EXPIRY_DIGITS: usize = 20;

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
    /// A random per-process key: token comparisons are HMAC verifications under it, so they take the same time
    /// whatever the presented value is, and the tag below reveals nothing across restarts.
    compare_key: hmac::Key,
    token_tag: hmac::Tag,
    /// Signs and checks login cookies: HMAC-SHA256 keyed by the token itself, so a cookie is useless without the
    /// token and the same on every instance that has it.
    cookie_key: hmac::Key,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// What a login cookie's MAC covers: the label and the expiry as it is written in the cookie.
fn cookie_message(expires: &str) -> Vec<u8> {
    [COOKIE_LABEL, expires.as_bytes()].concat()
}

impl Credentials {
    pub fn new(token: &AccessToken) -> Result<Self, RandomUnavailable> {
        let mut key = [0u8; 32];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| RandomUnavailable)?;
        let compare_key = hmac::Key::new(hmac::HMAC_SHA256, &key);
        Ok(Self {
            token_tag: hmac::sign(&compare_key, token.expose()),
            compare_key,
            cookie_key: hmac::Key::new(hmac::HMAC_SHA256, token.expose()),
        })
    }

    /// Whether `presented` is the token, in constant time.
    pub fn is_token(&self, presented: &[u8]) -> bool {
        hmac::verify(&self.compare_key, presented, self.token_tag.as_ref()).is_ok()
    }

    /// A login cookie's value for a login at `now`: valid for [`LOGIN_LIFETIME`].
    pub fn login_cookie(&self, now: SystemTime) -> String {
        self.login_cookie_expiring(now + LOGIN_LIFETIME)
    }

    /// A login cookie's value that the server refuses from `expires` on: `{expires}.{mac}`, the expiry in Unix
    /// seconds and the HMAC of the label and that expiry, in hex.
    pub fn login_cookie_expiring(&self, expires: SystemTime) -> String {
        let expires = unix_secs(expires).to_string();
        let mac = hmac::sign(&self.cookie_key, &cookie_message(&expires));
        format!("{expires}.{}", hex::encode(mac.as_ref()))
    }

    /// Whether `presented` is a login cookie this token signed that has not expired at `now`. The MAC is checked
    /// in constant time; a malformed value is refused before any of it.
    pub fn is_login_cookie(&self, presented: &str, now: SystemTime) -> bool {
        let Some((expires, mac)) = presented.split_once('.') else {
            return false;
        };
        let well_formed = !expires.is_empty()
            && expires.len() <= MAX_EXPIRY_DIGITS
            && expires.bytes().all(|b| b.is_ascii_digit());
        let Some(expires_secs) = well_formed.then(|| expires.parse::<u64>().ok()).flatten() else {
            return false;
        };
        let Ok(mac) = hex::decode(mac) else {
            return false;
        };
        unix_secs(now) < expires_secs
            && hmac::verify(&self.cookie_key, &cookie_message(expires), &mac).is_ok()
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
        let now = SystemTime::now();
        let cookie = credentials.login_cookie(now);
        let (expires, mac) = cookie.split_once('.').unwrap();
        assert_eq!(
            expires,
            unix_secs(now + LOGIN_LIFETIME).to_string(),
            "the cookie carries its expiry"
        );
        assert_eq!(mac.len(), 64, "hex of a SHA-256 HMAC");
        assert!(!cookie.contains("correct-horse"));
        assert!(credentials.is_login_cookie(&cookie, now));
        assert!(
            !credentials.is_login_cookie("correct-horse", now),
            "the raw token is not a cookie"
        );
        assert!(
            !credentials.is_token(cookie.as_bytes()),
            "the cookie is not the token"
        );
        assert_eq!(format!("{credentials:?}"), "Credentials(<redacted>)");
    }

    #[test]
    fn every_instance_with_the_token_accepts_its_cookies_and_no_other_token_does() {
        let token = AccessToken::parse("correct-horse").unwrap();
        let one = Credentials::new(&token).unwrap();
        let two = Credentials::new(&token).unwrap();
        let now = SystemTime::now();
        assert!(
            two.is_login_cookie(&one.login_cookie(now), now),
            "a restart, or another instance, keeps browsers logged in"
        );
        let other = Credentials::new(&AccessToken::parse("battery-staple").unwrap()).unwrap();
        assert!(
            !one.is_login_cookie(&other.login_cookie(now), now),
            "a new token logs them out"
        );
    }

    #[test]
    fn an_expired_or_tampered_cookie_is_refused() {
        let credentials = Credentials::new(&AccessToken::parse("correct-horse").unwrap()).unwrap();
        let now = SystemTime::now();
        let cookie = credentials.login_cookie(now);
        assert!(
            credentials.is_login_cookie(&cookie, now + LOGIN_LIFETIME - Duration::from_secs(1))
        );
        assert!(!credentials.is_login_cookie(&cookie, now + LOGIN_LIFETIME));
        let (expires, mac) = cookie.split_once('.').unwrap();
        let later = expires.parse::<u64>().unwrap() + 365 * 24 * 60 * 60;
        let mut flipped = mac.to_owned().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        for tampered in [
            format!("{later}.{mac}"),
            format!("{expires}.{flipped}"),
            format!("{expires}.{}", &mac[..62]),
            format!("+{expires}.{mac}"),
            format!("{expires}{mac}"),
            format!(".{mac}"),
            format!("{expires}."),
            String::new(),
        ] {
            assert!(!credentials.is_login_cookie(&tampered, now), "{tampered}");
        }
    }
}
