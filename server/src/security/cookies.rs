//! The cookies the server sets, all alike: HttpOnly (no script on any page reads them), SameSite=Strict (no other
//! site's request carries them), for the whole site, and `Secure` when every public origin is https.

use std::time::Duration;

use axum_extra::extract::cookie::{Cookie, SameSite};

/// How the server's cookies are marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CookiePolicy {
    /// Whether browsers may send the cookies over https only.
    pub secure: bool,
}

impl CookiePolicy {
    /// A cookie the browser keeps for `max_age`.
    pub fn cookie(self, name: &'static str, value: String, max_age: Duration) -> Cookie<'static> {
        let max_age =
            cookie::time::Duration::try_from(max_age).unwrap_or(cookie::time::Duration::MAX);
        Cookie::build((name, value))
            .path("/")
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .max_age(max_age)
            .build()
    }

    /// What tells the browser to drop the cookie `name`.
    pub fn removal(self, name: &'static str) -> Cookie<'static> {
        let mut cookie = self.cookie(name, String::new(), Duration::ZERO);
        cookie.make_removal();
        cookie
    }
}
