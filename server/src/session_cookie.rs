//! The browser's sessions: one cookie names the session the page opens at `/` (the current one), a second lists the
//! sessions this browser created or opened (its conversations). Pages and server functions read both from the
//! request's extensions; a browser without a current session gets a fresh id and the cookies to keep it. Minting an
//! id holds nothing on the server: the session itself begins with its first run.
//!
//! A page may name the session it shows: `/?session=ID` opens that conversation, and makes it the current one, when
//! it is one of this browser's (or when people log in to this server: whoever has the token may open any); another
//! id is refused with a notice, so a link cannot put a person into somebody else's conversation. `/?new` starts a
//! new conversation and redirects to its address.

use std::time::Duration;

use agent::ids::SessionId;
use app::api::ssr::{
    BrowserSessions, SESSION_COOKIE, SESSIONS_COOKIE, SessionCookie, SessionNotice,
};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::CookieJar;

use crate::security::{CookiePolicy, FromOtherSites};

/// Thirty days.
const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// The most sessions the list cookie keeps (the most recently opened), within a cookie's size.
pub const MAX_LISTED: usize = 40;
/// Separates ids in the list cookie: a character no id contains and a cookie value may.
const SEPARATOR: char = '|';

/// What the session middleware needs: how cookies are marked, and whether people log in.
#[derive(Clone, Copy, Debug)]
pub struct SessionCookies {
    pub cookies: CookiePolicy,
    /// People log in with the token: a logged-in person may open any session.
    pub logins: bool,
}

/// The session id in the request's cookies, when there is a valid one.
pub fn session_from_cookies(headers: &HeaderMap) -> Option<SessionId> {
    CookieJar::from_headers(headers)
        .get(SESSION_COOKIE)
        .and_then(|cookie| SessionId::parse(cookie.value()).ok())
}

/// The sessions the list cookie names, most recent first; malformed entries are dropped.
pub fn sessions_from_cookies(headers: &HeaderMap) -> Vec<SessionId> {
    CookieJar::from_headers(headers)
        .get(SESSIONS_COOKIE)
        .map(|cookie| {
            cookie
                .value()
                .split(SEPARATOR)
                .filter_map(|id| SessionId::parse(id).ok())
                .take(MAX_LISTED)
                .collect()
        })
        .unwrap_or_default()
}

/// `known` with `session` first, each id once, at most [`MAX_LISTED`].
fn listed_first(session: &SessionId, known: &[SessionId]) -> Vec<SessionId> {
    std::iter::once(session.clone())
        .chain(known.iter().filter(|id| *id != session).cloned())
        .take(MAX_LISTED)
        .collect()
}

/// What the query string asks of the session: `?new`, or `?session=ID`.
enum Asked {
    Nothing,
    New,
    Open(String),
}

fn asked(request: &Request) -> Asked {
    if request.method() != Method::GET {
        return Asked::Nothing;
    }
    let Some(query) = request.uri().query() else {
        return Asked::Nothing;
    };
    // A new conversation is the browser's own page's to start, or the person's (a typed address): another page's
    // link to `?new` (which carries the cookies), from another site or another origin of this one (another port of
    // the same host), opens the current one, so that no other page can push the browser's conversations off its list.
    let from_another_site = request.headers().get("sec-fetch-site").is_some_and(|site| {
        !crate::security::origin::FetchSite::parse(&site.as_bytes().to_ascii_lowercase())
            .is_some_and(crate::security::origin::FetchSite::is_allowed)
    });
    let mut asked = Asked::Nothing;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "new" if from_another_site => {}
            "new" => return Asked::New,
            "session" => asked = Asked::Open(value.into_owned()),
            _ => {}
        }
    }
    asked
}

pub async fn ensure_session(
    State(settings): State<SessionCookies>,
    mut request: Request,
    next: Next,
) -> Response {
    let known = sessions_from_cookies(request.headers());
    let existing = session_from_cookies(request.headers());
    let mut notice = None;
    let session = match asked(&request) {
        Asked::New => {
            let fresh = SessionId::generate();
            let listed = listed_first(&fresh, &known);
            let to = format!("/?session={fresh}");
            return with_cookies(settings, &fresh, &listed, Redirect::to(&to).into_response());
        }
        Asked::Open(wanted) => match SessionId::parse(wanted) {
            Ok(wanted)
                if settings.logins
                    || known.contains(&wanted)
                    || existing.as_ref() == Some(&wanted) =>
            {
                Some(wanted)
            }
            _ => {
                notice = Some(
                    "That conversation is not one of this browser's, so the page shows your current one."
                        .to_owned(),
                );
                existing.clone()
            }
        },
        Asked::Nothing => existing.clone(),
    };
    let session = session.unwrap_or_else(SessionId::generate);
    // The current session leads the list; a browser from before the list has its one session listed.
    let listed = listed_first(&session, &known);
    let changed = existing.as_ref() != Some(&session) || listed != known;
    let extensions = request.extensions_mut();
    extensions.insert(SessionCookie(session.clone()));
    extensions.insert(BrowserSessions(listed.clone()));
    if let Some(notice) = notice {
        extensions.insert(SessionNotice(notice));
    }
    let response = next.run(request).await;
    // A refused request changes nothing, the browser's conversations included: a new session is the browser's only
    // once something answered for it.
    let refused = response.status().is_client_error() || response.status().is_server_error();
    if changed && !refused {
        return with_cookies(settings, &session, &listed, response);
    }
    response
}

fn with_cookies(
    settings: SessionCookies,
    session: &SessionId,
    listed: &[SessionId],
    response: Response,
) -> Response {
    let list = listed
        .iter()
        .map(SessionId::as_str)
        .collect::<Vec<_>>()
        .join(&SEPARATOR.to_string());
    // Carried by a link from another site too: without them, the page that link opens would take the browser for a
    // new one, and its cookies would replace the list of its conversations with a fresh one.
    let cookie = |name, value| {
        settings
            .cookies
            .cookie(name, value, MAX_AGE, FromOtherSites::Links)
    };
    let jar = CookieJar::new()
        .add(cookie(SESSION_COOKIE, session.to_string()))
        .add(cookie(SESSIONS_COOKIE, list));
    (jar, response).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, header};

    fn id(value: &str) -> SessionId {
        SessionId::parse(value).unwrap()
    }

    #[test]
    fn the_session_is_read_from_the_cookie_header() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; toolgate_session=session_1; c=d"),
        );
        assert_eq!(session_from_cookies(&headers), Some(id("session_1")));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("toolgate_session=../x"),
        );
        assert_eq!(session_from_cookies(&headers), None);
    }

    #[test]
    fn the_list_keeps_valid_ids_and_puts_the_current_one_first() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("toolgate_sessions=a|../bad|b:1|c"),
        );
        let known = sessions_from_cookies(&headers);
        assert_eq!(known, [id("a"), id("b:1"), id("c")]);
        assert_eq!(
            listed_first(&id("c"), &known),
            [id("c"), id("a"), id("b:1")]
        );
        let many: Vec<_> = (0..100).map(|n| id(&format!("s{n}"))).collect();
        let listed = listed_first(&id("new"), &many);
        assert_eq!(listed.len(), MAX_LISTED);
        assert_eq!(listed[0], id("new"));
    }
}
