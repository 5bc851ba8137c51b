//! The cookies the server sets, all alike but for which other sites' requests carry them: HttpOnly (no script on any
//! page reads them), for the whole site, and `Secure` when every public origin is https. The login cookie goes with
//! no other site's request (SameSite=Strict); the browser's list of its conversations also goes with a link followed
//! from another site to a page (SameSite=Lax), which therefore opens with the browser's conversations instead of
//! finding none and starting the list over.

use std::time::Duration;

use axum_extra::extract::cookie::{Cookie, SameSite};

/// How the server's cookies are marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CookiePolicy {
    /// Whether browsers may send the cookies over https only.
    pub secure: bool,
}

/// Which requests from another site carry a cookie. None of them is a request that changes anything: a `POST` from
/// another site carries no cookie of toolgate's, and the origin check refuses it anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FromOtherSites {
    /// None (SameSite=Strict).
    Never,
    /// A link followed to a page (SameSite=Lax).
    Links,
}

impl CookiePolicy {
    /// A cookie the browser keeps for `max_age`.
    pub fn cookie(
        self,
        name: &'static str,
        value: String,
        max_age: Duration,
        from_other_sites: FromOtherSites,
    ) -> Cookie<'static> {
        let max_age =
            cookie::time::Duration::try_from(max_age).unwrap_or(cookie::time::Duration::MAX);
        Cookie::build((name, value))
            .path("/")
            .http_only(true)
            .same_site(match from_other_sites {
                FromOtherSites::Never => SameSite::Strict,
                FromOtherSites::Links => SameSite::Lax,
            })
            .secure(self.secure)
            .max_age(max_age)
            .build()
    }

    /// What tells the browser to drop the cookie `name`.
    pub fn removal(self, name: &'static str) -> Cookie<'static> {
        let mut cookie = self.cookie(name, String::new(), Duration::ZERO, FromOtherSites::Never);
        cookie.make_removal();
        cookie
    }
}
