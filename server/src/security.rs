//! Who may do what. One layer over the whole router, so a route added later is covered without anyone
//! remembering to:
//!
//! 1. Without a token, the server listens on loopback only and names only loopback public origins (both checked at
//!    start-up), and answers only requests whose `Host` is a loopback name or a `--public-origin` host: a web page
//!    cannot reach it by DNS rebinding, which would otherwise make the attacker's page "same-origin" with it.
//! 2. Every request that is not GET, HEAD or OPTIONS must not come from another origin: `Sec-Fetch-Site`, when
//!    sent, must be `same-origin` or `none`, and `Origin`, when sent, must be the server's own origin (each of
//!    `--public-origin`, or `http://{Host}` without it). Refused requests get a 403 and never reach a handler, so
//!    nothing changes. Requests with neither header (curl, scripts) pass this check; the token decides for them.
//! 3. With a token, every route except `GET /healthz`, the login page and `POST /logout` needs
//!    `Authorization: Bearer <token>` or the login cookie; a state-changing request that authenticates with the
//!    cookie must also carry `Origin` or `Sec-Fetch-Site` (browsers always do), so the cookie alone, which a
//!    browser attaches by itself, never suffices. Pages without credentials redirect to `/login`; everything else gets a 401. Login cookies carry
//!    their expiry under their MAC, and are `Secure` when every public origin is https. Wrong bearer tokens are
//!    counted per client address ([`attempts`]): past a few, the address gets a 429 until it may try again.
//!
//! Every response also refuses to be framed by another page, so nobody can trick a person into pressing Approve
//! through an invisible frame.

pub mod attempts;
pub mod cookies;
pub mod login;
pub mod origin;
pub mod token;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_extra::extract::cookie::CookieJar;

pub use cookies::{CookiePolicy, FromOtherSites};
pub use origin::PublicOrigin;
pub use token::AccessToken;

use crate::client::ClientAddr;
use crate::error::ApiError;
use agent::harness::Actor;
use agent::store::{Store, StoreError};
use futures::StreamExt as _;
use origin::{Authority, FetchSite};
use token::{AUTH_COOKIE, Credentials, Login, RandomUnavailable};

/// Why the server refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error(
        "refusing to listen on {addr} without an access token: anyone who can reach that address could start runs and approve tool calls that write files and run commands. Set a token with --token or the environment variable TOOLGATE_TOKEN (people then log in at /login, scripts send Authorization: Bearer <token>), or listen on a loopback address only, for example --addr 127.0.0.1:3000."
    )]
    ExposedWithoutToken { addr: SocketAddr },
    #[error(
        "refusing to serve {origin} without an access token: a public origin that is not a loopback address means people reach toolgate through a proxy or from other machines, and anyone who can reach it could start runs and approve tool calls that write files and run commands. Set a token with --token or the environment variable TOOLGATE_TOKEN (people then log in at /login, scripts send Authorization: Bearer <token>), or name only loopback origins with --public-origin, for example http://127.0.0.1:3000."
    )]
    PublicOriginWithoutToken { origin: PublicOrigin },
    #[error("cannot set up the access token: {0}")]
    Random(#[from] RandomUnavailable),
}

/// Where a state-changing request says it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provenance {
    /// A browser marked it as coming from our own origin (or from the person, not a page).
    OwnPage,
    /// No `Origin`, no `Sec-Fetch-Site`: not a browser's request, or a very old browser.
    Unmarked,
}

/// Why a request was refused. The messages say why and what to do; none repeats a credential.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    ForeignHost {
        host: String,
    },
    MalformedHeader {
        name: &'static str,
    },
    FetchSite {
        value: String,
    },
    OpaqueOrigin,
    ForeignOrigin {
        origin: String,
        expected: Vec<String>,
    },
    CookieWithoutOrigin,
    WrongToken,
    /// The client's address sent too many wrong tokens lately; its token was not looked at.
    TooManyWrongTokens {
        wait_secs: u64,
    },
    NoCredentials {
        page: bool,
    },
    /// The request's login cookie is valid, but whether it was logged out cannot be read now.
    LoginUnchecked,
}

impl Refusal {
    /// What a request without valid credentials gets: a page is sent to the login form, anything else a 401.
    fn no_credentials(method: &Method, path: &str) -> Self {
        Self::NoCredentials {
            page: matches!(*method, Method::GET | Method::HEAD) && !is_api(path),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ForeignHost { host } => write!(
                f,
                "Request refused: it is addressed to {host:?}, which is not a loopback name. Without an access token toolgate answers only requests addressed to localhost or a loopback address, so that no web page can reach it by DNS rebinding. Start it with --token, or list this address with --public-origin."
            ),
            Self::MalformedHeader { name } => write!(
                f,
                "Request refused: its {name} header is malformed or repeated."
            ),
            Self::FetchSite { value } => write!(
                f,
                "Cross-site request refused: the browser marked it Sec-Fetch-Site: {value}, so it comes from a page that is not toolgate's own. Only toolgate's own page may start, decide or cancel anything."
            ),
            Self::OpaqueOrigin => f.write_str(
                "Cross-site request refused: it comes from an opaque origin (Origin: null), such as a sandboxed frame or a local file. Only toolgate's own page may start, decide or cancel anything.",
            ),
            Self::ForeignOrigin { origin, expected } => write!(
                f,
                "Cross-site request refused: it comes from a page at {origin}, which is not this server's origin ({}). Only toolgate's own page may start, decide or cancel anything. If you reach toolgate through a proxy, list that address with --public-origin.",
                if expected.is_empty() {
                    "unknown: the request has no Host header".to_owned()
                } else {
                    expected.join(", ")
                }
            ),
            Self::CookieWithoutOrigin => f.write_str(
                "Request refused: it is authenticated only by the login cookie and carries no Origin header, so it cannot be told apart from a forged one. Browsers send Origin by themselves; scripts should send Authorization: Bearer <token>.",
            ),
            Self::WrongToken => f.write_str(
                "The access token is wrong. Send Authorization: Bearer <token> with the token the server was started with.",
            ),
            Self::TooManyWrongTokens { wait_secs } => write!(
                f,
                "Too many wrong access tokens from your address. Wait {wait_secs} s and try again."
            ),
            Self::NoCredentials { .. } => f.write_str(
                "This server needs its access token: send Authorization: Bearer <token>, or log in at /login.",
            ),
            Self::LoginUnchecked => f.write_str(
                "The server cannot tell now whether this login was logged out (its database does not answer). Try again shortly, or send Authorization: Bearer <token>.",
            ),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::NoCredentials { page: true } => {
                (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response()
            }
            Self::WrongToken | Self::NoCredentials { page: false } => {
                let mut response = ApiError::Unauthorized(self.to_string()).into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"toolgate\""),
                );
                response
            }
            Self::TooManyWrongTokens { wait_secs } => {
                let mut response = ApiError::TooManyAttempts(self.to_string()).into_response();
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(wait_secs));
                response
            }
            Self::LoginUnchecked => ApiError::Unavailable(self.to_string()).into_response(),
            other => ApiError::Forbidden(other.to_string()).into_response(),
        }
    }
}

/// What the security layer needs from the configuration, and nothing more.
#[derive(Clone, Debug)]
pub struct SecuritySettings {
    /// Where the server listens.
    pub addr: SocketAddr,
    pub token: Option<AccessToken>,
    /// The origins browsers use; when empty, the server's origin is `http://{Host}`.
    pub public_origins: Vec<PublicOrigin>,
}

struct Policy {
    /// `--public-origin`; when empty, the server's origin is `http://{Host}`.
    origins: Vec<PublicOrigin>,
    credentials: Option<Credentials>,
    /// Wrong bearer tokens per client address.
    wrong_tokens: attempts::WrongTokens,
    /// Whether cookies are marked `Secure`: when every public origin is https, so that a browser never sends them
    /// over plain HTTP.
    secure_cookies: bool,
}

/// The security policy of one server, built from its configuration.
#[derive(Clone)]
pub struct Security {
    policy: Arc<Policy>,
    /// Where logouts are kept, shared by every instance on the same database: a logged-out login's cookie is
    /// refused. `None` before the store is open (and in unit tests of the checks), where nobody has logged out.
    logouts: Option<Arc<dyn Store>>,
    /// Counts the logouts kept by this instance: each wakes the event streams opened with a login cookie here, to
    /// see whether theirs was the one.
    logged_out_here: Arc<tokio::sync::watch::Sender<u64>>,
}

/// How often an event stream opened with a login cookie looks whether its login was logged out on another instance
/// (a logout on this one ends it at once) or its cookie expired.
const LOGOUT_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How many looks in a row at whether a stream's login was logged out may fail before the stream ends.
const UNREAD_LOOKS: u32 = 3;

/// Milliseconds since the Unix epoch.
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Waits for this instance's next logout; never, once the sender is known to be gone.
async fn logout_here(
    here: &mut Option<tokio::sync::watch::Receiver<u64>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match here {
        Some(here) => here.changed().await,
        None => std::future::pending().await,
    }
}

/// A request let through, and the login its cookie names when the cookie was its credential (whether that login
/// was logged out is read from the store next).
struct Admitted {
    actor: Actor,
    login: Option<Login>,
}

impl fmt::Debug for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Security")
            .field("origins", &self.policy.origins)
            .field("token", &self.policy.credentials.is_some())
            .finish()
    }
}

/// The one value of a header that must appear at most once.
fn single<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
    shown: &'static str,
) -> Result<Option<&'a HeaderValue>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    match values.next() {
        Some(_) => Err(Refusal::MalformedHeader { name: shown }),
        None => Ok(first),
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme is case-insensitive).
/// Whether an `Authorization` header is of the `Bearer` scheme (well formed or not).
fn is_bearer_scheme(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    bytes
        .get(..6)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case(b"bearer"))
        && bytes.get(6).is_none_or(|next| next.is_ascii_whitespace())
}

fn bearer(value: &HeaderValue) -> Option<&[u8]> {
    let bytes = value.as_bytes();
    let scheme = bytes.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| bytes[7..].trim_ascii())
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// What anybody may reach when a token is set: the health check and the login page.
fn is_open(method: &Method, path: &str) -> bool {
    match path {
        "/healthz" => matches!(*method, Method::GET | Method::HEAD),
        "/login" => matches!(*method, Method::GET | Method::HEAD | Method::POST),
        // Logging out only removes the browser's cookie; a browser whose login expired may still do it.
        "/logout" => *method == Method::POST,
        _ => false,
    }
}

fn is_api(path: &str) -> bool {
    path == "/api" || path.starts_with("/api/")
}

impl Security {
    /// The policy for `settings`; without a token, refuses an address or a public origin beyond loopback.
    pub fn new(settings: SecuritySettings) -> Result<Self, SecurityError> {
        let SecuritySettings {
            addr,
            token,
            public_origins,
        } = settings;
        if token.is_none() {
            if !addr.ip().to_canonical().is_loopback() {
                return Err(SecurityError::ExposedWithoutToken { addr });
            }
            if let Some(origin) = public_origins
                .iter()
                .find(|origin| !origin.authority().is_loopback())
            {
                return Err(SecurityError::PublicOriginWithoutToken {
                    origin: origin.clone(),
                });
            }
        }
        let credentials = token.as_ref().map(Credentials::new).transpose()?;
        if token.as_ref().is_some_and(AccessToken::is_short) {
            tracing::warn!(
                "the access token is shorter than 16 characters; use a long random one (for example `openssl rand -hex 32`)"
            );
        }
        let secure_cookies =
            !public_origins.is_empty() && public_origins.iter().all(PublicOrigin::is_https);
        Ok(Self {
            logouts: None,
            logged_out_here: Arc::new(tokio::sync::watch::Sender::new(0)),
            policy: Arc::new(Policy {
                origins: public_origins,
                credentials,
                wrong_tokens: Default::default(),
                secure_cookies,
            }),
        })
    }

    /// How the cookies the server sets are marked.
    pub fn cookie_policy(&self) -> CookiePolicy {
        CookiePolicy {
            secure: self.policy.secure_cookies,
        }
    }

    /// Whether people log in (a token is set), so the page offers a way out.
    pub fn has_logins(&self) -> bool {
        self.policy.credentials.is_some()
    }

    /// For the start-up log line: how requests are authenticated, never the token.
    pub fn describe(&self) -> String {
        let auth = if self.policy.credentials.is_some() {
            "access token (log in at /login)"
        } else {
            "none (loopback only)"
        };
        let origins = if self.policy.origins.is_empty() {
            "http://{Host}".to_owned()
        } else {
            self.policy
                .origins
                .iter()
                .map(PublicOrigin::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("auth: {auth}; origins: {origins}")
    }

    fn credentials(&self) -> Option<&Credentials> {
        self.policy.credentials.as_ref()
    }

    /// Keeps logouts in `store`, and refuses the cookies of the logins logged out there.
    pub fn with_logouts(mut self, store: Arc<dyn Store>) -> Self {
        self.logouts = Some(store);
        self
    }

    /// The login the request's cookie names, when it is a login cookie this token signed that has not expired
    /// (logged out or not: see [`Self::logged_in`]).
    fn login_cookie(&self, headers: &HeaderMap) -> Option<Login> {
        let credentials = self.credentials()?;
        CookieJar::from_headers(headers)
            .get(AUTH_COOKIE)
            .and_then(|cookie| credentials.login_of(cookie.value(), SystemTime::now()))
    }

    /// Whether `login` was logged out, on this instance or any other that shares the store.
    async fn logged_out(&self, login: &Login) -> Result<bool, StoreError> {
        match &self.logouts {
            Some(store) => store.logged_out(&login.id).await,
            None => Ok(false),
        }
    }

    /// The login of the request's cookie, when it is valid and not logged out.
    async fn logged_in(&self, headers: &HeaderMap) -> Result<Option<Login>, StoreError> {
        match self.login_cookie(headers) {
            Some(login) if !self.logged_out(&login).await? => Ok(Some(login)),
            _ => Ok(None),
        }
    }

    /// Keeps that `login` was logged out, until a day after its cookie expires; the event streams opened with it here
    /// end.
    async fn log_out(&self, login: &Login) -> Result<(), StoreError> {
        if let Some(store) = &self.logouts {
            store.log_out(&login.id, login.expires_at_ms).await?;
        }
        self.logged_out_here.send_modify(|count| *count += 1);
        Ok(())
    }

    /// `response`, an event stream a browser opened (`GET`) with `login`'s cookie, ending when the login is logged
    /// out (at once for a logout on this instance, within [`LOGOUT_CHECK_EVERY`] for one on another), when its cookie
    /// expires, or when whether it was logged out cannot be read [`UNREAD_LOOKS`] times in a row (its reconnection
    /// then gets the `503` every request with the cookie gets meanwhile): a stream must not go on telling a browser
    /// that can no longer open it what the runs do.
    fn ending_with(&self, login: Login, response: Response) -> Response {
        let store = self.logouts.clone();
        let mut here = Some(self.logged_out_here.subscribe());
        // The cookie's expiry is read by the clock that `login_of` reads it by.
        let now = || unix_ms(SystemTime::now());
        let ended = async move {
            let mut unread = 0;
            loop {
                let expired = Duration::from_millis(login.expires_at_ms.saturating_sub(now()));
                let sender_gone = tokio::select! {
                    () = tokio::time::sleep(LOGOUT_CHECK_EVERY.min(expired)) => false,
                    changed = logout_here(&mut here) => changed.is_err(),
                };
                // The sender lives as long as the server's routes; were it gone, only the timer would wake.
                if sender_gone {
                    here = None;
                }
                if now() >= login.expires_at_ms {
                    return;
                }
                let Some(store) = &store else {
                    continue;
                };
                match store.logged_out(&login.id).await {
                    Ok(true) => return,
                    Ok(false) => unread = 0,
                    Err(error) => {
                        unread += 1;
                        tracing::warn!(%error, unread, "cannot read whether an event stream's login was logged out");
                        if unread >= UNREAD_LOOKS {
                            return;
                        }
                    }
                }
            }
        };
        let (parts, body) = response.into_parts();
        let body = Body::from_stream(body.into_data_stream().take_until(ended));
        Response::from_parts(parts, body)
    }

    /// The login and logout routes, when a token is set.
    pub fn routes<S: Clone + Send + Sync + 'static>(&self) -> Option<Router<S>> {
        self.credentials().map(|_| login::routes(self.clone()))
    }

    /// Admits a request or says why not; an admitted request is told who it comes from, for the audit log.
    fn admit(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        client: Option<IpAddr>,
    ) -> Result<Admitted, Refusal> {
        let host = match single(headers, &header::HOST, "Host")? {
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(Authority::parse)
                    .ok_or(Refusal::MalformedHeader { name: "Host" })?,
            ),
            None => None,
        };
        if self.credentials().is_none() {
            self.check_host(host.as_ref())?;
        }
        let provenance = if changes_state(method) {
            self.check_origin(host.as_ref(), headers)?
        } else {
            Provenance::Unmarked
        };
        let actor = |actor| Admitted { actor, login: None };
        match self.credentials() {
            Some(credentials) if !is_open(method, path) => {
                self.check_credentials(credentials, method, path, headers, provenance, client)
            }
            Some(_) => Ok(actor(Actor::new("anonymous"))),
            None => Ok(actor(Actor::local())),
        }
    }

    fn check_host(&self, host: Option<&Authority>) -> Result<(), Refusal> {
        match host {
            // Browsers always send Host; a request without one is not a rebinding page's.
            None => Ok(()),
            Some(host)
                if host.is_loopback()
                    || self
                        .policy
                        .origins
                        .iter()
                        .any(|origin| origin.authority().host == host.host) =>
            {
                Ok(())
            }
            Some(host) => Err(Refusal::ForeignHost {
                host: host.host.clone(),
            }),
        }
    }

    fn check_origin(
        &self,
        host: Option<&Authority>,
        headers: &HeaderMap,
    ) -> Result<Provenance, Refusal> {
        let mut provenance = Provenance::Unmarked;
        if let Some(value) = single(headers, &SEC_FETCH_SITE, "Sec-Fetch-Site")? {
            match FetchSite::parse(value.as_bytes()) {
                Some(site) if site.is_allowed() => provenance = Provenance::OwnPage,
                _ => {
                    return Err(Refusal::FetchSite {
                        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    });
                }
            }
        }
        if let Some(value) = single(headers, &header::ORIGIN, "Origin")? {
            let raw = String::from_utf8_lossy(value.as_bytes());
            if raw == "null" {
                return Err(Refusal::OpaqueOrigin);
            }
            let expected: Vec<PublicOrigin> = if self.policy.origins.is_empty() {
                host.map(PublicOrigin::from_host).into_iter().collect()
            } else {
                self.policy.origins.clone()
            };
            match PublicOrigin::parse(&raw) {
                Ok(origin) if expected.contains(&origin) => provenance = Provenance::OwnPage,
                _ => {
                    return Err(Refusal::ForeignOrigin {
                        origin: raw.into_owned(),
                        expected: expected.iter().map(|o| o.as_str().to_owned()).collect(),
                    });
                }
            }
        }
        Ok(provenance)
    }

    fn check_credentials(
        &self,
        credentials: &Credentials,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        provenance: Provenance,
        client: Option<IpAddr>,
    ) -> Result<Admitted, Refusal> {
        // Only a `Bearer` header is a token: another scheme (`Basic`, which a proxy's own login forwards) is not toolgate's
        // to judge, and is neither a wrong token nor a reason to pass over a good login cookie.
        if let Some(value) = single(headers, &header::AUTHORIZATION, "Authorization")?
            && is_bearer_scheme(value)
        {
            let wrong_tokens = &self.policy.wrong_tokens;
            let now = Instant::now();
            if let Some(client) = client
                && let Err(wait) = wrong_tokens.may_try(client, now)
            {
                return Err(Refusal::TooManyWrongTokens {
                    wait_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
                });
            }
            // A wrong token is wrong even with a good cookie: a script should learn its token is stale.
            return match bearer(value) {
                Some(token) if credentials.is_token(token) => Ok(Admitted {
                    actor: Actor::new("token"),
                    login: None,
                }),
                _ => {
                    if let Some(client) = client {
                        wrong_tokens.failed(client, now);
                    }
                    Err(Refusal::WrongToken)
                }
            };
        }
        if let Some(login) = self.login_cookie(headers) {
            if changes_state(method) && provenance == Provenance::Unmarked {
                return Err(Refusal::CookieWithoutOrigin);
            }
            return Ok(Admitted {
                actor: Actor::new("login"),
                login: Some(login),
            });
        }
        Err(Refusal::no_credentials(method, path))
    }
}

const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Whether a response is an event stream (`text/event-stream`), which goes on as long as the client listens.
fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// Headers every response carries: no framing by other pages (clickjacking the Approve button), no MIME sniffing,
/// no embedding of our responses by other origins, and no copy kept by a cache (the page and the API carry
/// conversations, tool arguments and outputs; a browser's Back after logging out, or a shared proxy, would show
/// them) unless the response says otherwise (the static assets are revalidated instead).
fn harden(headers: &mut HeaderMap) {
    let defaults = [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in defaults {
        if !headers.contains_key(&name) {
            headers.insert(name, HeaderValue::from_static(value));
        }
    }
}

/// The checks every request passes before it is routed (a layer around the whole router: see `startup`).
pub(crate) async fn guard(
    State(security): State<Security>,
    mut request: Request,
    next: Next,
) -> Response {
    let client = ClientAddr::of(request.extensions()).map(|client| client.0);
    let is_get = request.method() == Method::GET;
    let verdict = match security.admit(
        request.method(),
        request.uri().path(),
        request.headers(),
        client,
    ) {
        Ok(Admitted { actor, login: None }) => Ok((actor, None)),
        // A login cookie is valid until its expiry unless its login was logged out, here or on another instance.
        Ok(Admitted {
            actor,
            login: Some(login),
        }) => match security.logged_out(&login).await {
            Ok(false) => Ok((actor, Some(login))),
            Ok(true) => Err(Refusal::no_credentials(
                request.method(),
                request.uri().path(),
            )),
            Err(error) => {
                tracing::warn!(%error, "cannot read whether a login was logged out");
                Err(Refusal::LoginUnchecked)
            }
        },
        Err(refusal) => Err(refusal),
    };
    let mut response = match verdict {
        Ok((actor, login)) => {
            // Who is acting comes from here, never from a request body.
            request.extensions_mut().insert(actor);
            let response = next.run(request).await;
            match login {
                // A browser's own streams (`GET`); a stream a POST opened is its run, which the client asked for, and
                // ending it would abort the run.
                Some(login) if is_get && is_event_stream(&response) => {
                    security.ending_with(login, response)
                }
                _ => response,
            }
        }
        Err(refusal) => {
            if !matches!(refusal, Refusal::NoCredentials { page: true }) {
                tracing::warn!(
                    method = %request.method(),
                    path = request.uri().path(),
                    reason = %refusal,
                    "refused a request"
                );
            }
            refusal.into_response()
        }
    };
    harden(response.headers_mut());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "a-long-enough-token";

    fn settings(addr: &str, token: Option<&str>, origins: &[&str]) -> SecuritySettings {
        SecuritySettings {
            addr: addr.parse().unwrap(),
            token: token.map(|token| AccessToken::parse(token).unwrap()),
            public_origins: origins
                .iter()
                .map(|origin| PublicOrigin::parse(origin).unwrap())
                .collect(),
        }
    }

    fn security(token: Option<&str>, origins: &[&str]) -> Security {
        Security::new(settings("127.0.0.1:3000", token, origins)).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_non_loopback_address_without_a_token_refuses_to_start() {
        for addr in ["0.0.0.0:3000", "[::]:3000", "192.168.1.20:3000"] {
            let error = Security::new(settings(addr, None, &[]))
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with(&format!(
                    "refusing to listen on {addr} without an access token"
                )),
                "{error}"
            );
            assert!(error.contains("--token"), "{error}");
        }
        for addr in ["127.0.0.1:3000", "127.0.0.2:3000", "[::1]:3000"] {
            assert!(Security::new(settings(addr, None, &[])).is_ok());
        }
        assert!(Security::new(settings("0.0.0.0:3000", Some(TOKEN), &[])).is_ok());
    }

    #[test]
    fn a_public_origin_beyond_loopback_without_a_token_refuses_to_start() {
        for origin in [
            "https://toolgate.example.com",
            "http://192.168.1.20:3000",
            "http://[::]:3000",
        ] {
            let error = Security::new(settings(
                "127.0.0.1:3000",
                None,
                &["http://localhost:3000", origin],
            ))
            .unwrap_err()
            .to_string();
            let shown = PublicOrigin::parse(origin).unwrap();
            assert!(
                error.starts_with(&format!(
                    "refusing to serve {shown} without an access token"
                )),
                "{error}"
            );
            assert!(error.contains("--token"), "{error}");
            assert!(
                Security::new(settings("127.0.0.1:3000", Some(TOKEN), &[origin])).is_ok(),
                "{origin} with a token"
            );
        }
        for loopback in [
            "http://127.0.0.1:3000",
            "http://localhost:8080",
            "https://[::1]",
        ] {
            assert!(Security::new(settings("127.0.0.1:3000", None, &[loopback])).is_ok());
        }
    }

    #[test]
    fn cookies_are_secure_when_every_public_origin_is_https() {
        assert!(!security(None, &[]).cookie_policy().secure);
        assert!(
            !security(None, &["http://localhost:3000"])
                .cookie_policy()
                .secure
        );
        assert!(
            security(Some(TOKEN), &["https://a.example"])
                .cookie_policy()
                .secure
        );
        assert!(
            security(Some(TOKEN), &["https://a.example", "https://b.example"])
                .cookie_policy()
                .secure
        );
        assert!(
            !security(
                Some(TOKEN),
                &["https://a.example", "http://192.168.1.20:3000"]
            )
            .cookie_policy()
            .secure,
            "a browser on the plain-http origin could not keep a Secure cookie"
        );
    }

    #[test]
    fn the_description_names_the_mode_and_never_the_token() {
        let open = security(None, &[]);
        assert_eq!(
            open.describe(),
            "auth: none (loopback only); origins: http://{Host}"
        );
        let closed = security(Some(TOKEN), &["https://a.example"]);
        assert_eq!(
            closed.describe(),
            "auth: access token (log in at /login); origins: https://a.example"
        );
        assert!(!format!("{closed:?}").contains(TOKEN));
    }

    #[test]
    fn bearer_tokens_are_read_with_any_case_of_the_scheme() {
        assert_eq!(
            bearer(&HeaderValue::from_static("Bearer abc")),
            Some(&b"abc"[..])
        );
        assert_eq!(
            bearer(&HeaderValue::from_static("bearer  abc ")),
            Some(&b"abc"[..])
        );
        assert_eq!(bearer(&HeaderValue::from_static("Basic abc")), None);
        assert_eq!(bearer(&HeaderValue::from_static("Bearer")), None);
        for scheme in ["Bearer abc", "bearer", "BEARER  x"] {
            assert!(
                is_bearer_scheme(&HeaderValue::from_static(scheme)),
                "{scheme}"
            );
        }
        for other in ["Basic dTpw", "Bearerx abc", "Digest x", ""] {
            assert!(
                !is_bearer_scheme(&HeaderValue::from_static(other)),
                "{other}"
            );
        }
    }

    #[test]
    fn reads_pass_the_origin_check_and_writes_do_not() {
        let open = security(None, &[]);
        let evil = headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(
            open.admit(&Method::GET, "/api/agent/approvals", &evil, None)
                .map(|admitted| admitted.actor),
            Ok(Actor::local())
        );
        assert!(matches!(
            open.admit(&Method::POST, "/api/anything-added-later", &evil, None),
            Err(Refusal::ForeignOrigin { .. })
        ));
        assert!(matches!(
            open.admit(&Method::DELETE, "/api/x", &evil, None),
            Err(Refusal::ForeignOrigin { .. })
        ));
    }

    #[test]
    fn repeated_origin_headers_are_refused() {
        let open = security(None, &[]);
        let twice = headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://127.0.0.1:3000"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(
            open.admit(&Method::POST, "/api/agent/runs", &twice, None)
                .map(|admitted| admitted.actor),
            Err(Refusal::MalformedHeader { name: "Origin" })
        );
    }
}
