//! The access token and the credentials derived from it: the bearer check and the login cookie.
//!
//! The token itself is never stored anywhere a log or a `Debug` print could reach, never sent back to the browser,
//! and never compared with `==`: every comparison is an HMAC verification, constant-time in content and length.
//! A login cookie is not the token either: it is an expiry, the login's random id and a MAC over both keyed by the
//! token. A logout keeps the id in the store until the expiry, and every instance refuses the cookie from then on.

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

/// What the login cookie's MAC covers besides its expiry and its login's id (the token is the HMAC key). Changing
/// the token changes every MAC, so rotating the token logs every browser out. (A cookie of the version before, with
/// no id a logout could name, is not one of these: its browser logs in again.)
const COOKIE_LABEL: &[u8] = b"toolgate login cookie v3\0";

/// Random bytes in a login's id: no two logins share one.
const LOGIN_ID_BYTES: usize = 16;

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

/// A login, as its cookie names it once its MAC and expiry are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Login {
    /// The login's random id, in hex: what a logout keeps.
    pub id: String,
    /// When the server stops honouring the cookie, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// What a login cookie's MAC covers: the label, and the expiry and the login's id as they are written in the cookie.
fn cookie_message(expires: &str, login: &str) -> Vec<u8> {
    [COOKIE_LABEL, expires.as_bytes(), b".", login.as_bytes()].concat()
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

    /// A login cookie's value for a new login at `now`: valid for [`LOGIN_LIFETIME`].
    pub fn login_cookie(&self, now: SystemTime) -> Result<String, RandomUnavailable> {
        self.login_cookie_expiring(now + LOGIN_LIFETIME)
    }

    /// A login cookie's value for a new login that the server refuses from `expires` on: `{expires}.{login}.{mac}`,
    /// the expiry in Unix seconds, the login's random id, and the HMAC of the label, the expiry and the id, in hex.
    pub fn login_cookie_expiring(&self, expires: SystemTime) -> Result<String, RandomUnavailable> {
        let mut id = [0u8; LOGIN_ID_BYTES];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| RandomUnavailable)?;
        let expires = unix_secs(expires).to_string();
        let login = hex::encode(id);
        let mac = hmac::sign(&self.cookie_key, &cookie_message(&expires, &login));
        Ok(format!("{expires}.{login}.{}", hex::encode(mac.as_ref())))
    }

    /// The login `presented` names, when it is a login cookie this token signed that has not expired at `now`. The
    /// MAC is checked in constant time; a malformed value is refused before any of it. Whether the login was logged
    /// out is the store's to say.
    pub fn login_of(&self, presented: &str, now: SystemTime) -> Option<Login> {
        let mut parts = presented.splitn(3, '.');
        let (expires, login, mac) = (parts.next()?, parts.next()?, parts.next()?);
        let well_formed = !expires.is_empty()
            && expires.len() <= MAX_EXPIRY_DIGITS
            && expires.bytes().all(|b| b.is_ascii_digit())
            && login.len() == 2 * LOGIN_ID_BYTES
            && login
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let expires_secs = well_formed.then(|| expires.parse::<u64>().ok()).flatten()?;
        let mac = hex::decode(mac).ok()?;
        (unix_secs(now) < expires_secs
            && hmac::verify(&self.cookie_key, &cookie_message(expires, login), &mac).is_ok())
        .then(|| Login {
            id: login.to_owned(),
            expires_at_ms: expires_secs.saturating_mul(1000),
        })
    }

    /// Whether `presented` is a login cookie this token signed that has not expired at `now`.
    pub fn is_login_cookie(&self, presented: &str, now: SystemTime) -> bool {
        self.login_of(presented, now).is_some()
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
        let cookie = credentials.login_cookie(now).unwrap();
        let [expires, login, mac] = cookie.split('.').collect::<Vec<_>>()[..] else {
            panic!("{cookie}")
        };
        assert_eq!(
            expires,
            unix_secs(now + LOGIN_LIFETIME).to_string(),
            "the cookie carries its expiry"
        );
        assert_eq!(login.len(), 32, "hex of 16 random bytes");
        assert_eq!(mac.len(), 64, "hex of a SHA-256 HMAC");
        assert!(!cookie.contains("correct-horse"));
        assert_eq!(
            credentials.login_of(&cookie, now),
            Some(Login {
                id: login.to_owned(),
                expires_at_ms: unix_secs(now + LOGIN_LIFETIME) * 1000,
            })
        );
        let another = credentials.login_cookie(now).unwrap();
        assert_ne!(
            credentials.login_of(&another, now).unwrap().id,
            login,
            "each login has an id of its own"
        );
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
            two.is_login_cookie(&one.login_cookie(now).unwrap(), now),
            "a restart, or another instance, keeps browsers logged in"
        );
        let other = Credentials::new(&AccessToken::parse("battery-staple").unwrap()).unwrap();
        assert!(
            !one.is_login_cookie(&other.login_cookie(now).unwrap(), now),
            "a new token logs them out"
        );
    }

    #[test]
    fn an_expired_or_tampered_cookie_is_refused() {
        let credentials = Credentials::new(&AccessToken::parse("correct-horse").unwrap()).unwrap();
        let now = SystemTime::now();
        let cookie = credentials.login_cookie(now).unwrap();
        assert!(
            credentials.is_login_cookie(&cookie, now + LOGIN_LIFETIME - Duration::from_secs(1))
        );
        assert!(!credentials.is_login_cookie(&cookie, now + LOGIN_LIFETIME));
        let [expires, login, mac] = cookie.split('.').collect::<Vec<_>>()[..] else {
            panic!("{cookie}")
        };
        let later = expires.parse::<u64>().unwrap() + 365 * 24 * 60 * 60;
        let flip = |hex: &str| {
            let mut flipped = hex.to_owned().into_bytes();
            flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
            String::from_utf8(flipped).unwrap()
        };
        // What the version before wrote: an expiry and a MAC over it alone.
        let v2_mac = hmac::sign(
            &credentials.cookie_key,
            &[b"toolgate login cookie v2\0", expires.as_bytes()].concat(),
        );
        for tampered in [
            format!("{later}.{login}.{mac}"),
            format!("{expires}.{}.{mac}", flip(login)),
            format!("{expires}.{login}.{}", flip(mac)),
            format!("{expires}.{login}.{}", &mac[..62]),
            format!("{expires}.{}.{mac}", login.to_uppercase()),
            format!("+{expires}.{login}.{mac}"),
            format!("{expires}.{login}{mac}"),
            format!("{expires}.{login}.{mac}.{mac}"),
            format!(".{login}.{mac}"),
            format!("{expires}..{mac}"),
            format!("{expires}.{login}."),
            format!("{expires}.{}", hex::encode(v2_mac.as_ref())),
            String::new(),
        ] {
            assert!(!credentials.is_login_cookie(&tampered, now), "{tampered}");
        }
    }
}
