//! Cross-site requests cannot decide, start or cancel anything: a 403 that says why, and no state changes.

use serde_json::{Value, json};
use server::security::{AccessToken, PublicOrigin};

use super::{EVIL, headers, own_origin, pending, refusal};
use crate::helpers::{TestApp, spawn_app, spawn_app_with};

/// One state-changing request: a method, a path, a content type and a body.
struct Write {
    path: String,
    content_type: &'static str,
    body: String,
}

impl Write {
    fn json(path: impl Into<String>, body: Value) -> Self {
        Self {
            path: path.into(),
            content_type: "application/json",
            body: body.to_string(),
        }
    }

    /// What a plain HTML form (or a server function call) sends.
    fn form(path: impl Into<String>, body: &str) -> Self {
        Self {
            path: path.into(),
            content_type: "application/x-www-form-urlencoded",
            body: body.to_owned(),
        }
    }

    async fn send(&self, app: &TestApp, extra: &[(&str, &str)]) -> reqwest::Response {
        app.client
            .post(app.url(&self.path))
            .header("content-type", self.content_type)
            .headers(headers(extra))
            .body(self.body.clone())
            .send()
            .await
            .expect("the request is sent")
    }
}

/// Every state-changing route there is, a route added later, and a path that is no route at all.
fn every_write(run_id: &str, call_id: &str) -> Vec<Write> {
    let start = json!({"message": "delete b.txt", "sessionId": "target"});
    vec![
        Write::json(
            format!("/api/agent/approvals/{run_id}/{call_id}"),
            json!({"decision": "approve"}),
        ),
        Write::json(format!("/api/agent/runs/{run_id}/cancel"), json!({})),
        Write::json("/api/agent/runs", start.clone()),
        Write::json("/api/agent/stream", start.clone()),
        Write::json("/api/agent", start),
        Write::json(
            "/api/agui",
            json!({"threadId": "target", "runId": "agui-run", "messages": [{"id": "m1", "role": "user", "content": "delete b.txt"}]}),
        ),
        Write::form(
            "/api/fn/decide",
            &format!("run_id={run_id}&tool_call_id={call_id}&choice=Approve"),
        ),
        Write::form("/api/fn/cancel", &format!("run_id={run_id}")),
        Write::form("/api/fn/start_run", "message=delete+b.txt"),
        Write::json("/api/a-route-added-next-year", json!({})),
        Write::form("/not-an-api-route", "x=1"),
    ]
}

/// A run waiting for a person to approve deleting a.txt, which holds "keep".
async fn pending_deletion(app: &TestApp) -> (String, String) {
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let run_id = app.create_run(json!({"message": "delete a.txt"})).await;
    let mut events = app.events(&run_id, None).await;
    let required = events.until("approvalRequired").await;
    let call_id = required.data["request"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    (run_id, call_id)
}

/// Nothing moved: the approval is still pending, the file is intact, the run still runs, and the session the
/// refused requests tried to start a run in is free.
async fn assert_untouched(app: &TestApp, run_id: &str, call_id: &str) {
    let pending = pending(app).await;
    assert_eq!(
        pending.len(),
        1,
        "no refused request added or removed an approval: {pending:?}"
    );
    assert_eq!(pending[0]["toolCallId"], call_id);
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
    let run: Value = app
        .get(&format!("/api/agent/runs/{run_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(run["run"]["status"], "running", "{run}");
}

#[tokio::test]
async fn another_origin_cannot_decide_start_or_cancel_anything() {
    let app = spawn_app().await;
    let (run_id, call_id) = pending_deletion(&app).await;

    for write in every_write(&run_id, &call_id) {
        let response = write.send(&app, &[("origin", EVIL)]).await;
        let error = refusal(response, 403).await;
        assert!(
            error.starts_with("Cross-site request refused: it comes from a page at http://evil.example, which is not this server's origin"),
            "{}: {error}",
            write.path
        );
        assert!(error.contains(&own_origin(&app)), "{error}");
    }
    assert_untouched(&app, &run_id, &call_id).await;

    // The session the refused requests named is free: none of them started a run there.
    let started = app
        .post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": "target"}),
        )
        .await;
    assert_eq!(started.status(), 201);
}

#[tokio::test]
async fn fetch_metadata_from_another_site_is_refused_even_without_origin() {
    let app = spawn_app().await;
    let (run_id, call_id) = pending_deletion(&app).await;
    let decide = Write::json(
        format!("/api/agent/approvals/{run_id}/{call_id}"),
        json!({"decision": "approve"}),
    );
    for site in ["cross-site", "same-site", "something-new"] {
        let error = refusal(decide.send(&app, &[("sec-fetch-site", site)]).await, 403).await;
        assert!(
            error.starts_with(&format!(
                "Cross-site request refused: the browser marked it Sec-Fetch-Site: {site}"
            )),
            "{error}"
        );
    }
    // Another port of the same host is the same site but another origin: what a page on 127.0.0.1:9999 sends.
    let sibling = format!("http://127.0.0.1:{}", app.addr.port().wrapping_add(1));
    let error = refusal(decide.send(&app, &[("origin", &sibling)]).await, 403).await;
    assert!(error.contains(&format!("a page at {sibling}")), "{error}");
    let error = refusal(decide.send(&app, &[("origin", "null")]).await, 403).await;
    assert!(error.contains("opaque origin (Origin: null)"), "{error}");
    let error = refusal(
        decide
            .send(&app, &[("origin", &own_origin(&app)), ("origin", EVIL)])
            .await,
        403,
    )
    .await;
    assert!(
        error.contains("Origin header is malformed or repeated"),
        "{error}"
    );
    assert_untouched(&app, &run_id, &call_id).await;
}

#[tokio::test]
async fn the_servers_own_page_and_scripts_without_origin_may_decide() {
    let app = spawn_app().await;
    // A run of the page's own session (server functions act on nothing else).
    let run_id = app
        .create_run(json!({"message": "delete a.txt", "sessionId": "page-session"}))
        .await;
    let required = app
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let call_id = required.data["request"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    // What the browser sends for the page's own server-function call: same origin, same-origin fetch.
    let own = own_origin(&app);
    let response = Write::form(
        "/api/fn/decide",
        &format!("run_id={run_id}&tool_call_id={call_id}&choice=Deny"),
    )
    .send(
        &app,
        &[
            ("origin", &own),
            ("sec-fetch-site", "same-origin"),
            ("cookie", "toolgate_session=page-session"),
        ],
    )
    .await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert!(
        pending(&app).await.is_empty(),
        "the page's decision went through"
    );

    // A script (no Origin, no Sec-Fetch-Site) on a server without a token: allowed, as before.
    let (run_id, call_id) = {
        let run_id = app.create_run(json!({"message": "delete c.txt"})).await;
        let required = app
            .events(&run_id, None)
            .await
            .until("approvalRequired")
            .await;
        let call = required.data["request"]["toolCallId"]
            .as_str()
            .unwrap()
            .to_owned();
        (run_id, call)
    };
    let decided = app
        .decide(&run_id, &call_id, json!({"decision": "deny"}))
        .await;
    assert_eq!(decided.status(), 200);
    // A person typing the address (Sec-Fetch-Site: none) is not a page of another site either.
    let unknown = Write::json("/api/agent/approvals/r/c", json!({"decision": "deny"}))
        .send(&app, &[("sec-fetch-site", "none")])
        .await;
    assert_eq!(
        unknown.status(),
        404,
        "it passed the check and found nothing"
    );
}

#[tokio::test]
async fn event_streams_are_reads_and_need_no_origin() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "list files"})).await;
    let response = app
        .client
        .get(app.url(&format!("/api/agent/runs/{run_id}/events")))
        .header("origin", EVIL)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // No CORS header: the browser still hides the answer from the other page.
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}

#[tokio::test]
async fn public_origins_replace_the_host_as_the_servers_origin() {
    // A public origin beyond loopback needs a token.
    let token = "tg-5e0d7c2b9a4f4d1e8c3b6a9f2e5d8c1b";
    let bearer = format!("Bearer {token}");
    let app = spawn_app_with(|config| {
        config.public_origins = vec![PublicOrigin::parse("https://toolgate.example.com").unwrap()];
        config.token = Some(AccessToken::parse(token).unwrap());
    })
    .await;
    let decide = Write::json("/api/agent/approvals/r/c", json!({"decision": "approve"}));
    let passed = decide
        .send(
            &app,
            &[
                ("origin", "https://toolgate.example.com"),
                ("authorization", &bearer),
            ],
        )
        .await;
    assert_eq!(passed.status(), 404, "the listed origin passes the check");
    let error = refusal(
        decide
            .send(
                &app,
                &[("origin", &own_origin(&app)), ("authorization", &bearer)],
            )
            .await,
        403,
    )
    .await;
    assert!(
        error.contains("which is not this server's origin (https://toolgate.example.com)"),
        "{error}"
    );
    // The proxy may forward its own name as the Host.
    let through_proxy = app
        .client
        .get(app.url("/api/agent/approvals"))
        .header("host", "toolgate.example.com")
        .header("authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(through_proxy.status(), 200);
}

#[tokio::test]
async fn without_a_token_a_page_cannot_reach_the_server_by_dns_rebinding() {
    let app = spawn_app().await;
    let port = app.addr.port();
    // A page at evil.example:PORT whose name now resolves to 127.0.0.1 is "same-origin" with itself: its requests
    // carry Host evil.example:PORT and Origin http://evil.example:PORT, which match each other.
    let rebound_host = format!("evil.example:{port}");
    let rebound_origin = format!("http://{rebound_host}");
    let read = app
        .client
        .get(app.url("/api/agent/approvals"))
        .header("host", &rebound_host)
        .send()
        .await
        .unwrap();
    let error = refusal(read, 403).await;
    assert!(
        error.starts_with(
            "Request refused: it is addressed to \"evil.example\", which is not a loopback name."
        ),
        "{error}"
    );
    assert!(error.contains("DNS rebinding"), "{error}");
    let write = app
        .client
        .post(app.url("/api/agent/runs"))
        .header("host", &rebound_host)
        .header("origin", &rebound_origin)
        .json(&json!({"message": "list files"}))
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), 403);
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let response = app
            .client
            .get(app.url("/api/agent/approvals"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{host}");
    }
}

#[tokio::test]
async fn no_page_of_another_origin_may_frame_or_embed_toolgate() {
    let app = spawn_app().await;
    let page = app.get("/").await;
    let refused = app
        .client
        .post(app.url("/api/agent/runs"))
        .header("origin", EVIL)
        .json(&json!({"message": "list files"}))
        .send()
        .await
        .unwrap();
    for response in [page, app.get("/api/agent/approvals").await, refused] {
        let headers = response.headers();
        assert_eq!(headers["x-frame-options"], "DENY");
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(
            policy == "frame-ancestors 'none'" || policy.ends_with("; frame-ancestors 'none'"),
            "{policy}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["cross-origin-resource-policy"], "same-origin");
    }
}

/// The page runs only its own scripts: those served from its origin, and its inline ones (the hydration data), each
/// with the nonce its response's Content-Security-Policy names, a new one each time. Markup a model or a tool got
/// into the page could not run or load a script. Before, the policy only forbade framing.
#[tokio::test]
async fn the_page_runs_only_its_own_scripts() {
    let app = spawn_app().await;
    let mut nonces = Vec::new();
    for _ in 0..2 {
        let page = app.get("/").await;
        assert_eq!(page.status(), 200);
        let policy = page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = page.text().await.unwrap();
        let nonce = policy
            .split("'nonce-")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .unwrap_or_else(|| panic!("a nonce in {policy}"))
            .to_owned();
        assert_eq!(
            policy,
            format!(
                "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
                 connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
                 frame-ancestors 'none'"
            )
        );
        let scripts: Vec<&str> = body.split("<script").skip(1).collect();
        assert!(!scripts.is_empty(), "{body}");
        for script in scripts {
            let tag = &script[..script.find('>').unwrap()];
            assert!(
                tag.contains(&format!("nonce=\"{nonce}\"")),
                "every inline script carries the nonce: <script{tag}>"
            );
        }
        assert!(
            !body.contains(" style=\""),
            "no inline style, which style-src 'self' refuses"
        );
        nonces.push(nonce);
    }
    assert_ne!(nonces[0], nonces[1], "a nonce is used once");
}
