//! The access token: the API needs `Authorization: Bearer`, browsers log in for an HttpOnly, SameSite=Strict
//! cookie that is not the token and expires on the server, logins are rate-limited per client, a logout takes the
//! cookie back, and a server that is reachable from other machines cannot start without a token.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use server::config::Config;
use server::security::token::{Credentials, LOGIN_LIFETIME};
use server::security::{AccessToken, PublicOrigin};
use server::startup::{StartupError, build};

use super::{EVIL, headers, log_in_at, no_redirects, own_origin, post_form, refusal};
use crate::helpers::{TestApp, spawn_app_with};

const TOKEN: &str = "tg-7c1f0e9a4b2d48e6a1f3c5d7e9b0a2c4";

async fn protected() -> TestApp {
    spawn_app_with(|config| config.token = Some(AccessToken::parse(TOKEN).unwrap())).await
}

/// Logs out the login of `cookie` as the page's own form does (with the page's origin).
async fn log_out(app: &TestApp, cookie: &str) -> reqwest::Response {
    no_redirects()
        .post(app.url("/logout"))
        .header("cookie", cookie)
        .header("origin", own_origin(app))
        .send()
        .await
        .unwrap()
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// Logs in through the form and returns the cookie pair (`name=value`) the server set.
async fn log_in(app: &TestApp, token: &str) -> String {
    log_in_at(&own_origin(app), token).await
}

#[tokio::test]
async fn with_a_token_every_api_route_needs_it() {
    let app = protected().await;
    let client = &app.client;
    let unauthenticated = [
        client.get(app.url("/api/agent/approvals")),
        client.get(app.url("/api/agent/runs/run_x/events")),
        client.get(app.url("/api/agent/sessions/s1/events")),
        client
            .post(app.url("/api/agent/runs"))
            .json(&json!({"message": "list files"})),
        client
            .post(app.url("/api/agent/approvals/r/c"))
            .json(&json!({"decision": "approve"})),
        post_form(client, app.url("/api/fn/pending"), &[("run_id", "r")]),
        client
            .post(app.url("/api/a-route-added-later"))
            .json(&json!({})),
    ];
    for request in unauthenticated {
        let response = request.send().await.unwrap();
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"toolgate\""
        );
        let error = refusal(response, 401).await;
        assert_eq!(
            error,
            "This server needs its access token: send Authorization: Bearer <token>, or log in at /login."
        );
    }
    let wrong = client
        .get(app.url("/api/agent/approvals"))
        .header("authorization", format!("Bearer {TOKEN}x"))
        .send()
        .await
        .unwrap();
    assert!(
        refusal(wrong, 401)
            .await
            .starts_with("The access token is wrong.")
    );

    let listed = client
        .get(app.url("/api/agent/approvals"))
        .header("authorization", bearer())
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let started = client
        .post(app.url("/api/agent/runs"))
        .header("authorization", format!("bearer {TOKEN}"))
        .json(&json!({"message": "list files"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 201, "the scheme is case-insensitive");
    let run_id = started.json::<Value>().await.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = client
        .get(app.url(&format!("/api/agent/runs/{run_id}/events")))
        .header("authorization", bearer())
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);

    // The health check stays open, for load balancers and `serve.sh`.
    let health = app.get("/healthz").await.text().await.unwrap();
    assert_eq!(health.lines().next(), Some("ok"), "{health}");
}

#[tokio::test]
async fn pages_redirect_to_a_login_form_that_needs_no_script() {
    let app = protected().await;
    let client = no_redirects();
    for path in ["/", "/pkg/toolgate.js", "/favicon.svg"] {
        let response = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 303, "{path}");
        assert_eq!(response.headers()["location"], "/login");
    }
    let login = client.get(app.url("/login")).send().await.unwrap();
    assert_eq!(login.status(), 200);
    assert_eq!(login.headers()["cache-control"], "no-store");
    let csp = login.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.starts_with("default-src 'none';") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = login.text().await.unwrap();
    assert!(
        html.contains(r#"<form method="post" action="/login">"#),
        "{html}"
    );
    assert!(html.contains(r#"name="token" type="password""#), "{html}");
    assert!(!html.contains("<script"), "no script on the login page");
    assert!(!html.contains(TOKEN));
}

#[tokio::test]
async fn logging_in_sets_an_http_only_strict_cookie_that_is_not_the_token() {
    let app = protected().await;
    let client = no_redirects();
    let response = post_form(&client, app.url("/login"), &[("token", TOKEN)])
        .header("origin", own_origin(&app))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    let set_cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    let attributes: Vec<&str> = set_cookie.split("; ").collect();
    let (name, value) = attributes[0].split_once('=').unwrap();
    assert_eq!(name, "toolgate_auth");
    let [expires, login, mac] = value.split('.').collect::<Vec<_>>()[..] else {
        panic!("{value}")
    };
    assert_eq!(login.len(), 32, "the login's random id, in hex");
    assert_eq!(mac.len(), 64, "an HMAC-SHA256 in hex");
    let expires: u64 = expires.parse().unwrap();
    let week = unix_now() + LOGIN_LIFETIME.as_secs();
    assert!(
        (week - 5..=week).contains(&expires),
        "the cookie carries its expiry, a week away: {expires}"
    );
    assert!(!value.contains(TOKEN) && !set_cookie.contains(TOKEN));
    for attribute in ["Path=/", "HttpOnly", "SameSite=Strict", "Max-Age=604800"] {
        assert!(attributes.contains(&attribute), "{set_cookie}");
    }
    assert!(
        !attributes.contains(&"Secure"),
        "a plain-http loopback page could not keep it"
    );

    // Every login's cookie works; this one is used below.
    let cookie = log_in(&app, TOKEN).await;
    let page = client
        .get(app.url("/"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(
        page.headers()["cache-control"],
        "no-store",
        "the page carries the conversation: no cache keeps it"
    );
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("<title>toolgate</title>")
    );
    let audit = client
        .get(app.url("/api/audit"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(audit.status(), 200);
    assert_eq!(audit.headers()["cache-control"], "no-store");
    let to_home = client
        .get(app.url("/login"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(to_home.status(), 303, "a logged-in browser skips the form");
    let listed = client
        .get(app.url("/api/agent/approvals"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);

    // A state-changing request with the cookie: from the page itself it passes (and finds nothing to decide).
    let decide = |extra: &[(&str, &str)]| {
        client
            .post(app.url("/api/agent/approvals/r/c"))
            .header("cookie", &cookie)
            .headers(headers(extra))
            .json(&json!({"decision": "approve"}))
            .send()
    };
    let own = own_origin(&app);
    assert_eq!(decide(&[("origin", &own)]).await.unwrap().status(), 404);
    assert_eq!(
        decide(&[("sec-fetch-site", "same-origin")])
            .await
            .unwrap()
            .status(),
        404
    );
    // From another origin, or with nothing to show where it comes from, the cookie is not enough.
    assert_eq!(decide(&[("origin", EVIL)]).await.unwrap().status(), 403);
    let error = refusal(decide(&[]).await.unwrap(), 403).await;
    assert!(
        error.starts_with("Request refused: it is authenticated only by the login cookie and carries no Origin header"),
        "{error}"
    );
}

#[tokio::test]
async fn a_wrong_token_shows_the_form_again_with_a_401_and_no_cookie() {
    let app = protected().await;
    let client = no_redirects();
    for form in [
        vec![("token", "guess")],
        vec![("token", "")],
        vec![("other", TOKEN)],
    ] {
        let response = post_form(&client, app.url("/login"), &form)
            .header("origin", own_origin(&app))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401);
        assert!(response.headers().get("set-cookie").is_none());
        let html = response.text().await.unwrap();
        assert!(html.contains(
            r#"<p class="error" role="alert">That is not the access token. Try again.</p>"#
        ));
        assert!(html.contains(r#"<form method="post" action="/login">"#));
    }
    let not_a_form = client
        .post(app.url("/login"))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(not_a_form.status(), 415);
    assert!(not_a_form.headers().get("set-cookie").is_none());
    let long = "x".repeat(10_000);
    let too_long = post_form(&client, app.url("/login"), &[("token", &long)])
        .send()
        .await
        .unwrap();
    assert_eq!(too_long.status(), 413);
}

#[tokio::test]
async fn another_site_cannot_log_a_browser_in() {
    let app = protected().await;
    let response = post_form(&no_redirects(), app.url("/login"), &[("token", TOKEN)])
        .header("origin", EVIL)
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("set-cookie").is_none());
    let error = refusal(response, 403).await;
    assert!(error.starts_with("Cross-site request refused"), "{error}");
}

#[tokio::test]
async fn the_raw_token_or_a_forged_cookie_is_not_a_login() {
    let app = protected().await;
    let client = no_redirects();
    let other_token = "a-different-token-entirely";
    let other =
        spawn_app_with(|config| config.token = Some(AccessToken::parse(other_token).unwrap()))
            .await;
    let others_cookie = log_in(&other, other_token).await;
    for cookie in [
        format!("toolgate_auth={TOKEN}"),
        others_cookie,
        "toolgate_auth=".to_owned(),
    ] {
        let page = client
            .get(app.url("/"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 303, "{cookie}");
        let api = client
            .get(app.url("/api/agent/approvals"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(api.status(), 401, "{cookie}");
    }
}

#[tokio::test]
async fn a_wrong_bearer_token_is_not_rescued_by_a_good_cookie() {
    let app = protected().await;
    let cookie = log_in(&app, TOKEN).await;
    let response = app
        .client
        .get(app.url("/api/agent/approvals"))
        .header("cookie", &cookie)
        .header("authorization", "Bearer stale-token")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn listening_beyond_loopback_without_a_token_refuses_to_start() {
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        let mut config = Config::for_tests(&workspace);
        config.addr = addr.parse().unwrap();
        let Err(error) = build(config).await else {
            panic!("{addr}: the server started without a token");
        };
        assert!(matches!(error, StartupError::Security(_)), "{error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("refusing to listen on {addr} without an access token: anyone who can reach that address could start runs and approve tool calls")),
            "{message}"
        );
        assert!(
            message.contains("Set a token with --token or the environment variable TOOLGATE_TOKEN"),
            "{message}"
        );
        assert!(!workspace.exists(), "nothing was set up before refusing");
    }
    let app = spawn_app_with(|config| {
        config.addr = "0.0.0.0:0".parse().unwrap();
        config.token = Some(AccessToken::parse(TOKEN).unwrap());
    })
    .await;
    assert!(
        app.addr.ip().is_unspecified(),
        "with a token it listens where asked"
    );
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A client whose requests come from `ip` (any address of 127.0.0.0/8 reaches the server on 127.0.0.1).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn page_status(app: &TestApp, cookie: &str) -> u16 {
    no_redirects()
        .get(app.url("/"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_login_expires_on_the_server_and_a_tampered_cookie_is_refused() {
    let app = protected().await;
    // Another instance with the same token (here, credentials built apart from the server) mints cookies the
    // server accepts: the expiry and its MAC are all there is to check.
    let elsewhere = Credentials::new(&AccessToken::parse(TOKEN).unwrap()).unwrap();
    let now = SystemTime::now();
    let valid = elsewhere.login_cookie(now).unwrap();
    assert_eq!(
        page_status(&app, &format!("toolgate_auth={valid}")).await,
        200
    );

    let expired = elsewhere
        .login_cookie_expiring(now - Duration::from_secs(1))
        .unwrap();
    let [expires, login, mac] = valid.split('.').collect::<Vec<_>>()[..] else {
        panic!("{valid}")
    };
    let extended = format!("{}.{login}.{mac}", expires.parse::<u64>().unwrap() + 86_400);
    let other_mac = format!("{expires}.{login}.{}", "0".repeat(64));
    for value in [expired, extended, other_mac] {
        let cookie = format!("toolgate_auth={value}");
        assert_eq!(page_status(&app, &cookie).await, 303, "{cookie}");
        let api = app
            .client
            .get(app.url("/api/agent/approvals"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(api.status(), 401, "{cookie}");
    }
    // The browser keeps the cookie no longer than the server honours it.
    let response = post_form(&no_redirects(), app.url("/login"), &[("token", TOKEN)])
        .header("origin", own_origin(&app))
        .send()
        .await
        .unwrap();
    let set_cookie = response.headers()["set-cookie"].to_str().unwrap();
    assert!(
        set_cookie.contains(&format!("Max-Age={}", LOGIN_LIFETIME.as_secs())),
        "{set_cookie}"
    );
}

#[tokio::test]
async fn login_attempts_are_rate_limited_per_client() {
    let app = protected().await;
    let guesser = client_from("127.0.0.1");
    for attempt in 0..5 {
        let response = post_form(&guesser, app.url("/login"), &[("token", "guess")])
            .header("origin", own_origin(&app))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "attempt {attempt}");
    }
    // Past its attempts even the right token waits: guessing cannot go at network speed.
    let limited = post_form(&guesser, app.url("/login"), &[("token", TOKEN)])
        .header("origin", own_origin(&app))
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().get("set-cookie").is_none());
    let wait = retry_after(&limited);
    assert_eq!(limited.headers()["cache-control"], "no-store");
    let html = limited.text().await.unwrap();
    assert!(
        html.contains(&format!(
            r#"<p class="error" role="alert">Too many attempts from your address. Wait {wait} s and try again.</p>"#
        )),
        "{html}"
    );
    assert!(html.contains(r#"<form method="post" action="/login">"#));
    // The form itself still shows.
    let form = guesser.get(app.url("/login")).send().await.unwrap();
    assert_eq!(form.status(), 200);

    // Another client is not held back by the guesser.
    let person = client_from("127.0.0.2");
    let own = format!("http://127.0.0.1:{}", app.addr.port());
    let login = post_form(&person, app.url("/login"), &[("token", TOKEN)])
        .header("origin", &own)
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    assert!(login.headers().get("set-cookie").is_some());
}

#[tokio::test]
async fn logging_out_takes_the_cookie_back_and_the_page_offers_it() {
    let app = protected().await;
    let client = no_redirects();
    let cookie = log_in(&app, TOKEN).await;
    let page = client
        .get(app.url("/"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(r#"<form method="post" action="/logout" class="logout">"#),
        "{page}"
    );

    let refused = client
        .post(app.url("/logout"))
        .header("cookie", &cookie)
        .header("origin", EVIL)
        .send()
        .await
        .unwrap();
    assert!(refused.headers().get("set-cookie").is_none());
    assert!(
        refusal(refused, 403)
            .await
            .starts_with("Cross-site request refused")
    );

    let out = log_out(&app, &cookie).await;
    assert_eq!(out.status(), 303);
    assert_eq!(out.headers()["location"], "/login");
    let removal = out.headers()["set-cookie"].to_str().unwrap().to_owned();
    let attributes: Vec<&str> = removal.split("; ").collect();
    assert_eq!(attributes[0], "toolgate_auth=", "{removal}");
    for attribute in ["Path=/", "Max-Age=0"] {
        assert!(attributes.contains(&attribute), "{removal}");
    }
    let form = client.get(app.url("/login")).send().await.unwrap();
    assert_eq!(
        form.status(),
        200,
        "a browser without the cookie sees the form"
    );

    // Without a token there is nobody to log out, and the page says nothing of it.
    let open = spawn_app_with(|_| {}).await;
    let page = open.get("/").await.text().await.unwrap();
    assert!(page.contains("<title>toolgate</title>"));
    assert!(!page.contains("/logout"), "{page}");
}

/// A logout ends the login, not only the browser's copy of its cookie: a copy kept elsewhere (stolen, or another
/// tab's before the logout) is refused by the page, the API and the login form, which shows itself instead of
/// sending it home. Another browser's login goes on. Before, the cookie worked for its whole week after a logout.
#[tokio::test]
async fn a_logged_out_cookie_is_refused_even_where_it_was_kept() {
    let app = protected().await;
    let kept = log_in(&app, TOKEN).await;
    let other = log_in(&app, TOKEN).await;
    assert_ne!(kept, other, "each login has a cookie of its own");
    assert_eq!(page_status(&app, &kept).await, 200);
    let form = async |path: &str| {
        no_redirects()
            .get(app.url(path))
            .header("cookie", &kept)
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(form("/login").await, 303, "a logged-in browser goes home");
    assert_eq!(
        form("/login?ended").await,
        200,
        "where a page whose login was refused goes: the form whatever the cookie, so no instance sends it back"
    );

    let out = log_out(&app, &kept).await;
    assert_eq!(out.status(), 303);
    assert_eq!(out.headers()["location"], "/login");

    assert_eq!(page_status(&app, &kept).await, 303);
    let api = app
        .client
        .get(app.url("/api/agent/approvals"))
        .header("cookie", &kept)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 401);
    let form = no_redirects()
        .get(app.url("/login"))
        .header("cookie", &kept)
        .send()
        .await
        .unwrap();
    assert_eq!(
        form.status(),
        200,
        "the form, not a loop between / and /login"
    );
    assert_eq!(
        page_status(&app, &other).await,
        200,
        "another login goes on"
    );
}

/// An event stream a browser opened with its login ends when that login is logged out: it must not go on telling
/// what the runs do (their cards, their previews of files) to a page that can no longer open it. Another login's
/// stream goes on. Before, a stream opened before the logout ran until it closed.
#[tokio::test]
async fn a_logout_ends_the_event_streams_opened_with_its_login() {
    let app = protected().await;
    let created = app
        .client
        .post(app.url("/api/agent/runs"))
        .header("authorization", bearer())
        .json(&json!({"message": "write secret.txt: top secret"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let run_id = created.json::<Value>().await.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let follow = async |cookie: &str| {
        let response = app
            .client
            .get(app.url(&format!("/api/agent/runs/{run_id}/events")))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut stream = crate::helpers::SseStream::new(response);
        stream.until("approvalRequired").await;
        stream
    };
    let leaving = log_in(&app, TOKEN).await;
    let staying = log_in(&app, TOKEN).await;
    let mut ended = follow(&leaving).await;
    let mut going_on = follow(&staying).await;

    let out = log_out(&app, &leaving).await;
    assert_eq!(out.status(), 303);
    assert!(
        ended.next().await.is_none(),
        "the logged-out login's stream ends"
    );
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), going_on.next())
            .await
            .is_err(),
        "another login's stream stays open, waiting for the run's news"
    );
}

/// A stream a POST opened is its run, which the client asked for: a logout of the login that opened it does not end
/// it (which would abort the run); the run goes on to its end once approved.
#[tokio::test]
async fn a_logout_leaves_the_run_a_post_streams() {
    let app = protected().await;
    let cookie = log_in(&app, TOKEN).await;
    let response = app
        .client
        .post(app.url("/api/agent/stream"))
        .header("cookie", &cookie)
        .header("origin", own_origin(&app))
        .json(&json!({"message": "write posted.txt: kept"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = crate::helpers::SseStream::new(response);
    let required = stream.until("approvalRequired").await;
    assert_eq!(log_out(&app, &cookie).await.status(), 303);
    let run_id = required.data["request"]["runId"].as_str().unwrap();
    let call_id = required.data["request"]["toolCallId"].as_str().unwrap();
    let decided = app
        .client
        .post(app.url(&format!("/api/agent/approvals/{run_id}/{call_id}")))
        .header("authorization", bearer())
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
    assert_eq!(stream.until("done").await.name, "done");
    assert_eq!(
        std::fs::read_to_string(app.file("posted.txt")).unwrap(),
        "kept"
    );
}

/// A logout the database refuses still logs this browser out, and says plainly that a copy of the cookie is not: a
/// 503 page, not a redirect as if all were done.
#[tokio::test]
async fn a_logout_the_database_refuses_says_a_copy_of_the_cookie_still_works() {
    let (app, file, _dir) = super::sessions::on_sqlite_with(|config| {
        config.token = Some(AccessToken::parse(TOKEN).unwrap());
    })
    .await;
    let cookie = log_in(&app, TOKEN).await;
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_logouts BEFORE INSERT ON logged_out \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let out = log_out(&app, &cookie).await;
    assert_eq!(out.status(), 503);
    let removal = out.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(removal.starts_with("toolgate_auth=;"), "{removal}");
    let page = out.text().await.unwrap();
    assert!(
        page.contains("a copy of this browser's login cookie would still work until it expires, in at most 7 days"),
        "{page}"
    );
    assert_eq!(page_status(&app, &cookie).await, 200, "as the page says");
}

#[tokio::test]
async fn cookies_are_secure_when_the_public_origin_is_https() {
    let origin = "https://toolgate.example.com";
    let app = spawn_app_with(|config| {
        config.token = Some(AccessToken::parse(TOKEN).unwrap());
        config.public_origins = vec![PublicOrigin::parse(origin).unwrap()];
    })
    .await;
    let client = no_redirects();
    // However the browser marks its login (here by Sec-Fetch-Site alone), the cookie is Secure.
    let login = post_form(&client, app.url("/login"), &[("token", TOKEN)])
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let set_cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set_cookie.split("; ").any(|a| a == "Secure"),
        "{set_cookie}"
    );
    let page = client
        .get(app.url("/"))
        .header("host", "toolgate.example.com")
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    // The page sets the session cookie and the cookie that lists the browser's sessions: both Secure.
    let cookies: Vec<String> = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|value| value.to_str().unwrap().to_owned())
        .collect();
    assert!(
        cookies.iter().any(|c| c.starts_with("toolgate_session=")),
        "{cookies:?}"
    );
    for cookie in &cookies {
        assert!(cookie.split("; ").any(|a| a == "Secure"), "{cookie}");
    }
    let logout = client
        .post(app.url("/logout"))
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    let removal = logout.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(removal.split("; ").any(|a| a == "Secure"), "{removal}");
}

/// An `Authorization` header of another scheme (a proxy's own `Basic` login, which it forwards) is not a token: a
/// good login cookie beside it is a login, and such requests count as no wrong token, so the right token from the
/// same address is never held back by them.
#[tokio::test]
async fn an_authorization_header_of_another_scheme_is_not_a_wrong_token() {
    let app = protected().await;
    let cookie = log_in(&app, TOKEN).await;
    let client = client_from("127.0.0.1");
    for attempt in 0..7 {
        let response = client
            .get(app.url("/api/agent/approvals"))
            .header("cookie", &cookie)
            .header("authorization", "Basic dTpw")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "attempt {attempt}");
    }
    let without_cookie = client
        .get(app.url("/api/agent/approvals"))
        .header("authorization", "Basic dTpw")
        .send()
        .await
        .unwrap();
    assert_eq!(without_cookie.status(), 401, "no credentials");
    let with_token = client
        .get(app.url("/api/agent/approvals"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 200, "the right token is not held back");
}

/// Wrong bearer tokens are counted per client as wrong logins are: past a few, a client's requests with a token
/// get a 429 without the token being looked at, so the right one cannot be told from a guess at network speed.
/// Another client, and the right token once the wait is over, are not held back.
#[tokio::test]
async fn wrong_bearer_tokens_are_rate_limited_per_client() {
    let app = protected().await;
    let guesser = client_from("127.0.0.1");
    let with_token = |client: &reqwest::Client, token: &str| {
        client
            .get(app.url("/api/agent/approvals"))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    for attempt in 0..5 {
        let response = with_token(&guesser, &format!("guess-{attempt}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "attempt {attempt}");
    }
    let limited = with_token(&guesser, TOKEN).await.unwrap();
    assert_eq!(limited.status(), 429, "even the right token waits");
    let wait = retry_after(&limited);
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["code"], "TOO_MANY_ATTEMPTS");
    assert_eq!(
        body["error"],
        format!("Too many wrong access tokens from your address. Wait {wait} s and try again.")
    );

    let person = client_from("127.0.0.2");
    let response = with_token(&person, TOKEN).await.unwrap();
    assert_eq!(response.status(), 200, "another client");
}

/// The seconds a 429 asks to wait, which are at most one refill of an allowance (12 s).
fn retry_after(limited: &reqwest::Response) -> u64 {
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&wait), "{wait}");
    wait
}
