//! The login page of a server started with a token: a plain HTML form (no script, nothing loaded from anywhere)
//! that trades the token for an HttpOnly, SameSite=Strict cookie signed with it, and the logout that takes the
//! cookie back. The token never goes back to the browser, and no script on any page can read the cookie.
//!
//! Login attempts are rate-limited per client address, so the token cannot be guessed at network speed.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_extra::extract::cookie::CookieJar;
use tower_governor::GovernorError;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

use super::token::{AUTH_COOKIE, LOGIN_LIFETIME};
use super::{FromOtherSites, Security};
use crate::client::ClientAddr;
use crate::error::ApiError;

/// The largest login form accepted: a token of the longest length, percent-encoded, and then some.
const MAX_LOGIN_BODY: usize = 4 * 1024;

/// Login attempts a client may make at once, before it has to wait.
const LOGIN_BURST: u32 = 5;
/// How often a client that used its attempts gets one more: five a minute.
const LOGIN_REFILL: Duration = Duration::from_secs(12);
/// How often the rate limiter forgets clients that have all their attempts again, so its memory stays bounded.
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// The login page may load nothing and post only to itself.
const LOGIN_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Who a login attempt comes from, for its count: its address as the wrong bearer tokens are counted (an IPv6
/// client by its /64, since one host may pick any address of one), not the exact address that `tower_governor`
/// counts by default, which let a host with a /64 try a new address each time.
#[derive(Clone, Copy, Debug)]
struct ClientKey;

impl KeyExtractor for ClientKey {
    type Key = IpAddr;

    fn extract<T>(&self, request: &Request<T>) -> Result<IpAddr, GovernorError> {
        ClientAddr::of(request.extensions())
            .map(ClientAddr::counted)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// `/login` and `/logout`, with login attempts rate-limited per client address.
pub fn routes<S: Clone + Send + Sync + 'static>(security: Security) -> Router<S> {
    let limit = GovernorConfigBuilder::default()
        .key_extractor(ClientKey)
        .period(LOGIN_REFILL)
        .burst_size(LOGIN_BURST)
        .methods(vec![Method::POST])
        .finish()
        .map(Arc::new);
    let login = get(show).post(submit);
    let login = match limit {
        Some(limit) => {
            // Forget clients that are back to a full allowance, so the limiter's memory stays bounded; stop
            // once the routes are gone.
            let forget = Arc::downgrade(limit.limiter());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let mut every = tokio::time::interval(FORGET_EVERY);
                    loop {
                        every.tick().await;
                        let Some(limiter) = forget.upgrade() else {
                            return;
                        };
                        limiter.retain_recent();
                    }
                });
            }
            login.layer(GovernorLayer::new(limit).error_handler(too_many_attempts))
        }
        // Only a zero burst or period fails to build, and neither is zero.
        None => login,
    };
    Router::new()
        .route("/login", login)
        .route("/logout", post(logout))
        .layer(DefaultBodyLimit::max(MAX_LOGIN_BODY))
        .with_state(security)
}

/// What a client that used up its login attempts gets: the form again, with how long to wait.
fn too_many_attempts(error: GovernorError) -> Response<Body> {
    match error {
        GovernorError::TooManyRequests { wait_time, .. } => {
            let wait = wait_time.max(1);
            let mut response = page(Some(Problem::TooManyAttempts { wait_secs: wait }));
            if let Ok(value) = HeaderValue::from_str(&wait.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        other => {
            ApiError::Internal(format!("the login rate limit failed: {other}")).into_response()
        }
    }
}

/// Why the form is shown again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Problem {
    WrongToken,
    NotAForm,
    TooLarge,
    TooManyAttempts {
        wait_secs: u64,
    },
    /// A logout the store could not keep.
    LogoutNotKept,
}

impl Problem {
    fn status(self) -> StatusCode {
        match self {
            Self::WrongToken => StatusCode::UNAUTHORIZED,
            Self::NotAForm => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TooManyAttempts { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::LogoutNotKept => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn message(self) -> String {
        match self {
            Self::WrongToken => "That is not the access token. Try again.".to_owned(),
            Self::NotAForm => "Send the token with the form below.".to_owned(),
            Self::TooLarge => "That is longer than any access token.".to_owned(),
            Self::TooManyAttempts { wait_secs } => {
                format!("Too many attempts from your address. Wait {wait_secs} s and try again.")
            }
            Self::LogoutNotKept => format!(
                "This browser is logged out, but the server could not record the logout (its database does not answer): a copy of this browser's login cookie would still work until it expires, in at most {} days. Log in and out again once the server works, or change the token to log every browser out.",
                LOGIN_LIFETIME.as_secs() / 86_400
            ),
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

fn to_login() -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response()
}

/// `GET /login`: the form, or home for a browser that is logged in already (with a login not logged out: home
/// would send a logged-out cookie back here). `GET /login?ended`, where a page goes when the server refused its
/// login, is always the form: an instance that honours a cookie another refuses (a rolling upgrade, clocks apart)
/// would otherwise send the page home, to be sent back here, again and again.
async fn show(
    State(security): State<Security>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let ended = uri.query().is_some_and(|query| {
        form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "ended")
    });
    if !ended && let Ok(Some(_)) = security.logged_in(&headers).await {
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
    let login = match credentials.login_cookie(SystemTime::now()) {
        Ok(login) => login,
        Err(error) => return ApiError::Internal(error.to_string()).into_response(),
    };
    let cookie =
        security
            .cookie_policy()
            .cookie(AUTH_COOKIE, login, LOGIN_LIFETIME, FromOtherSites::Never);
    (CookieJar::new().add(cookie), to_home()).into_response()
}

/// `POST /logout`: the login is kept as logged out until its cookie expires, so that no copy of the cookie works on
/// any instance, and the browser drops the cookie and goes to the form. The origin check has run before this, so
/// another site's page cannot log a browser out either. When the logout cannot be kept, the browser is logged out
/// all the same, and told that a copy of its cookie is not.
async fn logout(State(security): State<Security>, headers: HeaderMap) -> Response {
    let removal = CookieJar::new().add(security.cookie_policy().removal(AUTH_COOKIE));
    if let Some(login) = security.login_cookie(&headers)
        && let Err(error) = security.log_out(&login).await
    {
        tracing::error!(%error, "cannot keep a logout: a copy of the login's cookie works until it expires");
        return (removal, page(Some(Problem::LogoutNotKept))).into_response();
    }
    (removal, to_login()).into_response()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    use tower::ServiceExt;

    use super::*;
    use crate::security::{AccessToken, SecuritySettings};

    /// A wrong token from `address`, as the server hands the request to the routes (with its client's address).
    fn wrong_token_from(address: &str) -> Request<Body> {
        let mut request = Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("token=wrong"))
            .unwrap();
        request.extensions_mut().insert(ConnectInfo(SocketAddr::new(
            address.parse().unwrap(),
            40_000,
        )));
        request
    }

    /// A host with an IPv6 /64 (any server's) picks a new address for each try: its tries count together.
    #[tokio::test]
    async fn login_attempts_from_one_ipv6_64_count_together() {
        let security = Security::new(SecuritySettings {
            addr: "127.0.0.1:3000".parse().unwrap(),
            token: Some(AccessToken::parse("a-long-enough-token").unwrap()),
            public_origins: Vec::new(),
        })
        .unwrap();
        let login = routes::<()>(security);
        let status = |address: String| {
            let login = login.clone();
            async move {
                login
                    .oneshot(wrong_token_from(&address))
                    .await
                    .unwrap()
                    .status()
            }
        };
        for i in 1..=LOGIN_BURST {
            assert_eq!(
                status(format!("2001:db8::{i}")).await,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(
            status("2001:db8::ffff:1".to_owned()).await,
            StatusCode::TOO_MANY_REQUESTS,
            "another address of the same /64"
        );
        assert_eq!(
            status("2001:db8:0:1::1".to_owned()).await,
            StatusCode::UNAUTHORIZED,
            "another /64"
        );
    }
}
