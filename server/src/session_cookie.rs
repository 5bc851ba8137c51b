//! The browser's session: a cookie that names it. Pages and server functions read it from the request's
//! extensions; a browser without one gets a fresh session id and the cookie to keep it. Minting the id holds
//! nothing on the server: the session itself begins with its first run.

use std::time::Duration;

use agent::ids::SessionId;
use app::api::ssr::{SESSION_COOKIE, SessionCookie};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_extra::extract::cookie::CookieJar;

use crate::security::CookiePolicy;

/// Thirty days.
const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The session id in the request's cookies, when there is a valid one.
pub fn session_from_cookies(headers: &HeaderMap) -> Option<SessionId> {
    CookieJar::from_headers(headers)
        .get(SESSION_COOKIE)
        .and_then(|cookie| SessionId::parse(cookie.value()).ok())
}

pub async fn ensure_session(
    State(cookies): State<CookiePolicy>,
    mut request: Request,
    next: Next,
) -> Response {
    let existing = session_from_cookies(request.headers());
    let fresh = existing.is_none();
    let session = existing.unwrap_or_else(SessionId::generate);
    request
        .extensions_mut()
        .insert(SessionCookie(session.clone()));
    let response = next.run(request).await;
    if fresh {
        let cookie = cookies.cookie(SESSION_COOKIE, session.to_string(), MAX_AGE);
        return (CookieJar::new().add(cookie), response).into_response();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, header};

    #[test]
    fn the_session_is_read_from_the_cookie_header() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; toolgate_session=session_1; c=d"),
        );
        assert_eq!(
            session_from_cookies(&headers),
            Some(SessionId::parse("session_1").unwrap())
        );
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("toolgate_session=../x"),
        );
        assert_eq!(session_from_cookies(&headers), None);
    }
}
