//! The login page of a server started with a token: a plain HTML form (no script, nothing loaded from anywhere)
//! that trades the token for an HttpOnly, SameSite=Strict cookie derived from it. The token never goes back to the
//! browser, and no script on any page can read the cookie.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::Security;
use super::token::AUTH_COOKIE;

/// The largest login form accepted: a token of the longest length, percent-encoded, and then some.
const MAX_LOGIN_BODY: usize = 4 * 1024;

/// Thirty days; the cookie stays valid for as long as the token does not change.
const COOKIE_MAX_AGE_SECS: u64 = 30 * 24 * 60 * 60;

/// The login page may load nothing and post only to itself.
const LOGIN_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn routes(security: Security) -> Router {
    Router::new()
        .route("/login", get(show).post(submit))
        .layer(DefaultBodyLimit::max(MAX_LOGIN_BODY))
        .with_state(security)
}

/// Why the form is shown again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Problem {
    WrongToken,
    NotAForm,
    TooLarge,
}

impl Problem {
    fn status(self) -> StatusCode {
        match self {
            Self::WrongToken => StatusCode::UNAUTHORIZED,
            Self::NotAForm => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Self::WrongToken => "That is not the access token. Try again.",
            Self::NotAForm => "Send the token with the form below.",
            Self::TooLarge => "That is longer than any access token.",
        }
    }
}

fn page(problem: Option<Problem>) -> Response {
    let error = problem.map_or(String::new(), |problem| {
        format!(r#"<p class="error" role="alert">{}</p>"#, problem.message())
    });
    let html = format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>toolgate · log in</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; margin: 0; min-height: 100vh; display: grid; place-items: center; }}
main {{ width: min(24rem, 90vw); }}
h1 {{ font-size: 1.4rem; margin: 0 0 .5rem; }}
form {{ display: grid; gap: .5rem; margin: 1rem 0; }}
input, button {{ font: inherit; padding: .5rem .6rem; }}
.error {{ color: #b00020; font-weight: 600; }}
.hint {{ opacity: .75; font-size: .9rem; }}
</style>
</head>
<body>
<main>
<h1>toolgate</h1>
<p>This server asks for its access token.</p>
{error}
<form method="post" action="/login">
<label for="token">Access token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Log in</button>
</form>
<p class="hint">It is the value of <code>--token</code> or <code>TOOLGATE_TOKEN</code> the server was started with.</p>
</main>
</body>
</html>
"#
    );
    let status = problem.map_or(StatusCode::OK, Problem::status);
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, LOGIN_CSP),
        ],
        html,
    )
        .into_response()
}

fn to_home() -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response()
}

/// `GET /login`: the form, or home for a browser that is logged in already.
async fn show(State(security): State<Security>, headers: HeaderMap) -> Response {
    if security.has_login_cookie(&headers) {
        return to_home();
    }
    page(None)
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| {
            essence
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// `POST /login` with `token=...`: the cookie and a redirect home, or the form again with what went wrong.
/// The origin check has run before this: another site's page cannot log a browser in (login CSRF).
async fn submit(
    State(security): State<Security>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(credentials) = security.credentials() else {
        return to_home();
    };
    if !is_form(&headers) {
        return page(Some(Problem::NotAForm));
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return page(Some(Problem::TooLarge));
        }
        Err(_) => return page(Some(Problem::NotAForm)),
    };
    let presented = form_urlencoded::parse(&body)
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value);
    if !presented.is_some_and(|token| credentials.is_token(token.as_bytes())) {
        tracing::warn!("a login attempt with a wrong token");
        return page(Some(Problem::WrongToken));
    }
    // Secure when the page was served over https (behind a TLS proxy); a plain-http loopback page could not
    // store a Secure cookie.
    let secure = headers
        .get(header::ORIGIN)
        .is_some_and(|origin| origin.as_bytes().starts_with(b"https://"));
    let cookie = format!(
        "{AUTH_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_SECS}{}",
        credentials.cookie_value(),
        if secure { "; Secure" } else { "" }
    );
    let mut response = to_home();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
