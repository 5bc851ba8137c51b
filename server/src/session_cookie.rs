//! The browser's session: a cookie that names it. Pages and server functions read it from the request's
//! extensions; a browser without one gets a fresh session and the cookie to keep it.

use agent::ids::SessionId;
use app::api::ssr::{SESSION_COOKIE, SessionCookie};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// Thirty days.
const MAX_AGE_SECS: u64 = 30 * 24 * 60 * 60;

/// The session id in the request's cookies, when there is a valid one.
pub fn session_from_cookies(headers: &HeaderMap) -> Option<SessionId> {
    crate::security::cookies(headers, SESSION_COOKIE).find_map(|value| SessionId::parse(value).ok())
}

pub async fn ensure_session(mut request: Request, next: Next) -> Response {
    let existing = session_from_cookies(request.headers());
    let fresh = existing.is_none();
    let session = existing.unwrap_or_else(SessionId::generate);
    request
        .extensions_mut()
        .insert(SessionCookie(session.clone()));
    let mut response = next.run(request).await;
    if fresh {
        let cookie = format!(
            "{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={MAX_AGE_SECS}"
        );
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

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
