//! A browser acts only on its own session: the server functions decide, cancel and list what belongs to the
//! session its cookie names, and nothing of another session. Reading creates nothing: a GET of the page or of a
//! session's events makes the server hold no session.

use std::pin::Pin;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::pending;
use crate::helpers::{PATIENCE, TestApp, spawn_app, spawn_app_with};

/// A session's event stream: events named by their `type`, with `runId:seq` ids.
struct SessionStream(Pin<Box<dyn Stream<Item = (String, String, Value)> + Send>>);

impl SessionStream {
    fn new(response: reqwest::Response) -> Self {
        Self(
            response
                .bytes_stream()
                .eventsource()
                .map(|event| {
                    let event = event.expect("a well-formed SSE event");
                    let data = serde_json::from_str(&event.data).expect("SSE data is JSON");
                    (event.event, event.id, data)
                })
                .boxed(),
        )
    }

    /// Reads until an event named `name`; returns its id and data.
    async fn until(&mut self, name: &str) -> (String, Value) {
        loop {
            let next = tokio::time::timeout(PATIENCE, self.0.next())
                .await
                .expect("an event arrives in time");
            match next {
                Some((event, id, data)) if event == name => return (id, data),
                Some(_) => {}
                None => panic!("the stream ended before a {name} event"),
            }
        }
    }
}

/// A server function call as the page makes it: a form body, the session cookie.
async fn server_fn(
    app: &TestApp,
    name: &str,
    session: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    server_fn_with(app, name, &format!("toolgate_session={session}"), fields).await
}

/// A run of `session` that waits for a person: its id and its tool call's id.
async fn waiting_run(app: &TestApp, session: &str, file: &str) -> (String, String) {
    std::fs::write(app.file(file), "keep").unwrap();
    let run_id = app
        .create_run(json!({"message": format!("delete {file}"), "sessionId": session}))
        .await;
    let mut events = app.events(&run_id, None).await;
    let required = events.until("approvalRequired").await;
    let call_id = required.data["request"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    (run_id, call_id)
}

#[tokio::test]
async fn server_functions_act_only_on_the_callers_own_session() {
    let app = spawn_app().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;

    // Mallory knows the ids, and the server functions treat them as unknown.
    let listed = server_fn(&app, "pending", "mallory", &[]).await;
    assert_eq!(listed.status(), 200);
    assert_eq!(listed.json::<Value>().await.unwrap(), json!([]));
    let listed = server_fn(&app, "pending", "mallory", &[("run_id", &run_id)]).await;
    assert_eq!(listed.json::<Value>().await.unwrap(), json!([]));
    let decided = server_fn(
        &app,
        "decide",
        "mallory",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("choice", "Approve"),
        ],
    )
    .await;
    assert_eq!(decided.status(), 404);
    let text = decided.text().await.unwrap();
    assert!(
        text.contains(&format!(
            "No pending approval found for run {run_id} and tool call {call_id}."
        )),
        "{text}"
    );
    let cancelled = server_fn(&app, "cancel", "mallory", &[("run_id", &run_id)]).await;
    assert_eq!(cancelled.status(), 404);
    let text = cancelled.text().await.unwrap();
    assert!(
        text.contains(&format!("No run {run_id} is known.")),
        "{text}"
    );

    // Nor does Mallory learn how far the server holds Alice's run, nor that it exists: the same answer as for a run
    // nobody started; and naming Alice's conversation is refused.
    for run in [run_id.as_str(), "run_nobody"] {
        let progress = server_fn(
            &app,
            "run_progress",
            "mallory",
            &[("run_id", run), ("seen", "1")],
        )
        .await;
        assert_eq!(progress.status(), 200);
        assert_eq!(
            progress.json::<Value>().await.unwrap(),
            Value::Null,
            "{run}"
        );
    }
    let progress = server_fn(
        &app,
        "run_progress",
        "mallory",
        &[("run_id", &run_id), ("seen", "1"), ("session", "alice")],
    )
    .await;
    assert_eq!(progress.status(), 404);

    // Nothing changed: the approval waits, the run goes on, the file is there.
    let still = pending(&app).await;
    assert_eq!(still.len(), 1);
    assert_eq!(still[0]["toolCallId"], call_id);
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");

    // Alice sees and decides her own.
    let progress = server_fn(
        &app,
        "run_progress",
        "alice",
        &[("run_id", &run_id), ("seen", "1")],
    )
    .await;
    let progress: Value = progress.json().await.unwrap();
    assert_eq!(progress["finished"], false, "{progress}");
    assert!(progress["last_seq"].as_u64().unwrap() > 0, "{progress}");
    // The fingerprint of the run's first event, as the stream sent it.
    let response = app
        .client
        .get(app.url(&format!("/api/agent/runs/{run_id}/events")))
        .send()
        .await
        .unwrap();
    let mut raw = response.bytes_stream().eventsource();
    let first = tokio::time::timeout(PATIENCE, raw.next())
        .await
        .expect("the first event arrives")
        .unwrap()
        .unwrap();
    assert_eq!(first.id, format!("1"));
    assert_eq!(
        progress["fingerprint"],
        agent::wire::event_fingerprint(&first.data),
        "{progress}"
    );
    let listed = server_fn(&app, "pending", "alice", &[]).await;
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["toolCallId"], call_id);
    let decided = server_fn(
        &app,
        "decide",
        "alice",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("choice", "Approve"),
        ],
    )
    .await;
    assert_eq!(decided.status(), 200);
    let mut events = app.events(&run_id, None).await;
    events.until("done").await;
    assert!(!app.file("a.txt").exists());

    // And cancels her own.
    let (second, _) = waiting_run(&app, "alice", "b.txt").await;
    let cancelled = server_fn(&app, "cancel", "alice", &[("run_id", &second)]).await;
    assert_eq!(cancelled.status(), 200);
    let mut events = app.events(&second, None).await;
    assert_eq!(events.until("error").await.data["code"], "ABORTED");
}

/// An app on a SQLite file in a directory of its own (kept while the returned guard lives), and the file, to change
/// it beside the server as a failing disk would.
async fn on_sqlite() -> (TestApp, std::path::PathBuf, tempfile::TempDir) {
    on_sqlite_with(|_| {}).await
}

/// The same, with the rest of the configuration as `configure` sets it.
pub(super) async fn on_sqlite_with(
    configure: impl FnOnce(&mut server::config::Config),
) -> (TestApp, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("toolgate.db");
    let database = agent::store::sql::DatabaseUrl::Sqlite(file.clone());
    let app = spawn_app_with(|config| {
        configure(config);
        config.database_url = server::config::Database::Sql(database);
    })
    .await;
    (app, file, dir)
}

/// A cancel the database refuses (a full disk, a failover) is a 503 that says so, not a 404 as if the run were
/// unknown: the run is still there, and the page may try again. Before, every error of a cancel was a 404.
#[tokio::test]
async fn a_cancel_the_database_refuses_is_503_not_404() {
    let (app, file, _dir) = on_sqlite().await;
    let (run_id, _) = waiting_run(&app, "alice", "a.txt").await;
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_aborts BEFORE UPDATE OF abort ON runs \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let cancelled = server_fn(&app, "cancel", "alice", &[("run_id", &run_id)]).await;
    assert_eq!(cancelled.status(), 503);
    let text = cancelled.text().await.unwrap();
    assert!(!text.contains("No run"), "{text}");
    assert_eq!(pending(&app).await.len(), 1, "the run still waits");
}

/// The same for a revocation of a session grant: a 503, not a 404 as if the grant were unknown.
#[tokio::test]
async fn a_revocation_the_database_refuses_is_503_not_404() {
    let (app, file, _dir) = on_sqlite().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let decided = server_fn(
        &app,
        "decide",
        "alice",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("choice", "ApproveForSession"),
        ],
    )
    .await;
    assert_eq!(decided.status(), 200);
    let grants: Value = app
        .client
        .get(app.url("/api/agent/sessions/alice/grants"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let grant_id = grants["grants"][0]["id"].as_str().unwrap().to_owned();
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let revoked = server_fn(&app, "revoke_grant", "alice", &[("grant_id", &grant_id)]).await;
    assert_eq!(revoked.status(), 503);
    let text = revoked.text().await.unwrap();
    assert!(!text.contains("No grant"), "{text}");
}

/// "Always allow" whose rule is added but whose approval the database refuses answers that the rule is in force
/// and why the call was not approved, so that the page shows the rule and does not say it was not added. Before, it
/// failed as a whole, and the page said "The rule was not added: The rule was added, but…".
#[tokio::test]
async fn always_allow_says_the_rule_is_in_force_when_only_its_approval_fails() {
    let (app, file, _dir) = on_sqlite().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let rule = pending_rule(&app, &run_id, &call_id).await;
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_decisions BEFORE UPDATE ON calls \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let answered = server_fn(
        &app,
        "always_allow",
        "alice",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("rule", &rule),
        ],
    )
    .await;
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    let reason = answered["RuleOnly"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("the rule only: {answered}"));
    // What the database said goes to the log, not to the page.
    assert_eq!(reason, app::api::APPROVAL_NOT_RECORDED);
    let listed: Value = app.get("/api/rules").await.json().await.unwrap();
    assert_eq!(listed["rules"][0]["rule"], rule.as_str(), "{listed}");
    assert_eq!(pending(&app).await.len(), 1, "the call still waits");

    // With the decision written again, the card approves as usual.
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch("DROP TRIGGER refuse_decisions;")
        .unwrap();
    let (run_id, call_id) = waiting_run(&app, "bob", "b.txt").await;
    let approved = server_fn(
        &app,
        "always_allow",
        "bob",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("rule", &pending_rule(&app, &run_id, &call_id).await),
        ],
    )
    .await;
    let status = approved.status();
    let approved = approved.text().await.unwrap();
    assert_eq!(status, 200, "{approved}");
    let approved: Value = serde_json::from_str(&approved).unwrap();
    assert_eq!(approved, json!("Approved"));
}

/// The rule the card of pending call `call_id` of `run_id` offers.
async fn pending_rule(app: &TestApp, run_id: &str, call_id: &str) -> String {
    pending(app)
        .await
        .iter()
        .find(|request| request["runId"] == run_id && request["toolCallId"] == call_id)
        .and_then(|request| request["choices"]["alwaysAllow"].as_str())
        .expect("the card offers a rule")
        .to_owned()
}

/// The page's audit view shows the newest entries however long the log is. Before, it read the log oldest first
/// within a bound of 200,000 entries, and past that showed the end of those as the newest: a browser no longer saw
/// its own recent decisions.
#[tokio::test]
async fn the_audit_view_shows_the_newest_entries_of_a_long_log() {
    let (app, file, _dir) = on_sqlite().await;
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200500) \
             INSERT INTO audit (at, kind, session_id, outcome) \
             SELECT 1000 + i, 'approval_requested', 'alice', 'requested' FROM n;",
        )
        .unwrap();
    let (run_id, _) = waiting_run(&app, "alice", "a.txt").await;
    let viewed = server_fn(&app, "audit", "alice", &[]).await;
    assert_eq!(viewed.status(), 200);
    let lines: Vec<Value> = viewed.json().await.unwrap();
    assert_eq!(lines.len(), 500, "a page");
    let newest = lines.last().unwrap();
    assert_eq!(newest["runId"], run_id.as_str(), "{newest}");
    assert!(
        lines
            .windows(2)
            .all(|pair| pair[0]["id"].as_u64() < pair[1]["id"].as_u64()),
        "oldest first"
    );
}

/// A server function that cannot read the database answers 503, whatever it reads first (here the run it checks is
/// the browser's own, before the decision or the cancel). Before, such a read failed as a 500.
#[tokio::test]
async fn the_page_is_told_503_when_the_database_cannot_be_read() {
    let (app, file, _dir) = on_sqlite().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let beside = rusqlite::Connection::open(&file).unwrap();
    beside
        .execute_batch("ALTER TABLE runs RENAME COLUMN created_at TO created_at_away")
        .unwrap();
    let decided = server_fn(
        &app,
        "decide",
        "alice",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("choice", "Approve"),
        ],
    )
    .await;
    assert_eq!(decided.status(), 503);
    // What the database said (its tables and columns) goes to the log, as on the REST API: the page is told that
    // the database did not answer, in the REST API's words.
    let said = decided.text().await.unwrap();
    assert!(said.contains(app::api::UNAVAILABLE), "{said}");
    assert!(!said.contains("created_at"), "{said}");
    let cancelled = server_fn(&app, "cancel", "alice", &[("run_id", &run_id)]).await;
    assert_eq!(cancelled.status(), 503);
    let said = cancelled.text().await.unwrap();
    assert!(!said.contains("created_at"), "{said}");
    beside
        .execute_batch("ALTER TABLE runs RENAME COLUMN created_at_away TO created_at")
        .unwrap();
    assert_eq!(pending(&app).await.len(), 1, "the run still waits");
}

/// The page's server functions answer a refusal with the status the approval and rules APIs give it: a decision
/// another tab made first is 404, arguments or a scope that cannot be used 400, a run that cannot start 409, a rule
/// that is not there 404 and a configured one 403. Before, each was a 500, as if the server had failed.
#[tokio::test]
async fn the_page_is_refused_with_the_apis_statuses_not_500() {
    let app = spawn_app_with(|config| config.rules = "list_files=allow".parse().unwrap()).await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let decide = |choice: &'static str, arguments: Option<&'static str>| {
        let (app, run_id, call_id) = (&app, run_id.clone(), call_id.clone());
        async move {
            let mut fields = vec![
                ("run_id", run_id.as_str()),
                ("tool_call_id", call_id.as_str()),
                ("choice", choice),
            ];
            fields.extend(arguments.map(|arguments| ("arguments", arguments)));
            server_fn(app, "decide", "alice", &fields).await.status()
        }
    };
    assert_eq!(decide("Approve", Some("not json")).await, 400);
    assert_eq!(decide("Approve", Some(r#"{"path": 7}"#)).await, 400);
    let busy = server_fn(&app, "start_run", "alice", &[("message", "list files")]).await;
    assert_eq!(busy.status(), 409, "{}", busy.text().await.unwrap());
    assert_eq!(decide("Approve", None).await, 200);
    assert_eq!(decide("Approve", None).await, 404, "decided by another tab");

    let unknown = server_fn(
        &app,
        "remove_rule",
        "alice",
        &[("rule_id", "rule_0123456789abcdef")],
    )
    .await;
    assert_eq!(unknown.status(), 404);
    let configured = server_fn(&app, "remove_rule", "alice", &[("rule_id", "flag-1")]).await;
    assert_eq!(configured.status(), 403);
}

#[tokio::test]
async fn a_get_never_makes_the_server_hold_a_session() {
    let app = spawn_app().await;
    let page = app.get("/").await;
    assert_eq!(page.status(), 200);
    let minted = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .find_map(|cookie| {
            cookie
                .to_str()
                .unwrap()
                .strip_prefix("toolgate_session=")?
                .split(';')
                .next()
                .map(str::to_owned)
        })
        .unwrap();
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("<title>toolgate</title>")
    );
    assert_eq!(
        app.harness.sessions(usize::MAX).await.unwrap().len(),
        0,
        "the page's GET"
    );

    // Following a session that has no run yet, as a fresh page does, holds nothing either.
    let follow = app
        .get(&format!("/api/agent/sessions/{minted}/events"))
        .await;
    assert_eq!(follow.status(), 200);
    let mut follow = SessionStream::new(follow);
    let made_up = app.get("/api/agent/sessions/never-used/events").await;
    assert_eq!(made_up.status(), 200);
    assert_eq!(
        app.harness.sessions(usize::MAX).await.unwrap().len(),
        0,
        "the session streams' GETs"
    );

    // The session begins with its first run, and the stream that waited for it follows it.
    let started = app
        .client
        .post(app.url("/api/fn/start_run"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("toolgate_session={minted}"))
        .body("message=list%20files")
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
    let run_id: String = started.json().await.unwrap();
    let (id, first) = follow.until("runStarted").await;
    assert_eq!(id, format!("{run_id}:1"));
    assert_eq!(first["sessionId"], minted);
    follow.until("done").await;
    assert_eq!(app.harness.sessions(usize::MAX).await.unwrap().len(), 1);
}

/// A server function call with the cookies `cookie` (as a browser would send them).
async fn server_fn_with(
    app: &TestApp,
    name: &str,
    cookie: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    app.client
        .post(app.url(&format!("/api/fn/{name}")))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", cookie)
        .body(body)
        .send()
        .await
        .expect("the request is sent")
}

#[tokio::test]
async fn a_browser_acts_on_the_sessions_its_cookies_list_and_no_other() {
    let app = spawn_app().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let decide = [
        ("run_id", run_id.as_str()),
        ("tool_call_id", call_id.as_str()),
        ("choice", "Deny"),
        ("session", "alice"),
    ];

    // Mallory names Alice's session: as good as unknown. Her pending approvals are refused as no conversation of
    // this browser's, not answered as none: a page of a conversation its browser no longer lists (cookies cleared)
    // would take an empty list for its cards' having been decided, and hide them.
    let mallory = "toolgate_session=mallory; toolgate_sessions=mallory";
    let listed = server_fn_with(&app, "pending", mallory, &[("session", "alice")]).await;
    assert_eq!(listed.status(), 404);
    let said = listed.text().await.unwrap();
    assert!(
        said.contains("This conversation is not one of this browser's."),
        "{said}"
    );
    let decided = server_fn_with(&app, "decide", mallory, &decide).await;
    assert_eq!(decided.status(), 404);
    let sessions = server_fn_with(&app, "sessions", mallory, &[]).await;
    let sessions: Value = sessions.json().await.unwrap();
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{sessions}");
    assert_eq!(sessions[0]["sessionId"], "mallory");
    assert_eq!(pending(&app).await.len(), 1);

    // The page's GET of `?session=alice` does not switch Mallory's browser to it, and shows none of it.
    let page = app
        .client
        .get(app.url("/?session=alice"))
        .header("cookie", mallory)
        .send()
        .await
        .unwrap();
    assert!(
        page.headers()
            .get_all("set-cookie")
            .iter()
            .all(|cookie| !cookie.to_str().unwrap().contains("alice")),
        "{:?}",
        page.headers()
    );
    let html = page.text().await.unwrap();
    assert!(
        html.contains("not one of this browser&#x27;s")
            || html.contains("not one of this browser's")
    );
    assert!(!html.contains("delete a.txt"));

    // A browser whose list holds Alice's session, while another one is its current, acts on it by naming it.
    let alice = "toolgate_session=alice-second-tab; toolgate_sessions=alice-second-tab|alice";
    let listed = server_fn_with(&app, "pending", alice, &[("session", "alice")]).await;
    assert_eq!(
        listed
            .json::<Value>()
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let sessions: Value = server_fn_with(&app, "sessions", alice, &[])
        .await
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alice-second-tab", "alice"]);
    assert_eq!(sessions[1]["title"], "delete a.txt");
    let decided = server_fn_with(&app, "decide", alice, &decide).await;
    assert_eq!(decided.status(), 200);
    let mut events = app.events(&run_id, None).await;
    events.until("done").await;
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
}

#[tokio::test]
async fn a_new_conversation_is_listed_and_a_listed_one_becomes_current() {
    let app = spawn_app().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let set_cookies = |response: &reqwest::Response| -> Vec<String> {
        response
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|cookie| {
                cookie
                    .to_str()
                    .unwrap()
                    .split(';')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let fresh = client
        .get(app.url("/?new"))
        .header("cookie", "toolgate_session=first; toolgate_sessions=first")
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), 303);
    let to = fresh.headers()["location"].to_str().unwrap().to_owned();
    let id = to.strip_prefix("/?session=").unwrap().to_owned();
    assert_ne!(id, "first");
    let cookies = set_cookies(&fresh);
    assert!(
        cookies.contains(&format!("toolgate_session={id}")),
        "{cookies:?}"
    );
    assert!(
        cookies.contains(&format!("toolgate_sessions={id}%7Cfirst")),
        "{cookies:?}"
    );

    // Back to the first: it becomes the current one, and leads the list.
    let back = client
        .get(app.url("/?session=first"))
        .header(
            "cookie",
            format!("toolgate_session={id}; toolgate_sessions={id}%7Cfirst"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(back.status(), 200);
    let cookies = set_cookies(&back);
    assert!(
        cookies.contains(&"toolgate_session=first".to_owned()),
        "{cookies:?}"
    );
    assert!(
        cookies.contains(&format!("toolgate_sessions=first%7C{id}")),
        "{cookies:?}"
    );

    // Another site's link to `?new`, or another origin's of this site (another port of the same host), opens the
    // current conversation and starts none: else any such page could push the browser's conversations off its
    // list, a new one at a time.
    for site in ["cross-site", "same-site", "something-else"] {
        let linked = client
            .get(app.url("/?new"))
            .header("sec-fetch-site", site)
            .header(
                "cookie",
                format!("toolgate_session=first; toolgate_sessions=first%7C{id}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(linked.status(), 200);
        assert!(
            set_cookies(&linked).is_empty(),
            "{site}: {:?}",
            set_cookies(&linked)
        );
    }
}

/// The sidebar lists the browser's own conversations however many sessions other clients started since: they are
/// read by their ids, not looked for among the server's most recent sessions. Before, once 200 sessions had been
/// started after it (REST and AG-UI clients each start one per run), an own conversation left the sidebar.
#[tokio::test]
async fn the_sidebar_lists_the_browsers_conversations_however_many_others_there_are() {
    let app = spawn_app().await;
    let first = app
        .create_run(json!({"message": "list files", "sessionId": "first"}))
        .await;
    let mut events = app.events(&first, None).await;
    events.until("done").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for i in 0..201 {
        let other = app
            .create_run(json!({"message": "list files", "sessionId": format!("other-{i}")}))
            .await;
        app.events(&other, None).await.until("done").await;
    }

    let listed = server_fn_with(
        &app,
        "sessions",
        "toolgate_session=second; toolgate_sessions=second|first",
        &[],
    )
    .await;
    assert_eq!(listed.status(), 200);
    let listed: Vec<Value> = listed.json().await.unwrap();
    let ids: Vec<&str> = listed
        .iter()
        .map(|conversation| conversation["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["second", "first"],
        "the new one, then the one with a run"
    );
    assert_eq!(listed[1]["title"], "list files");
}

/// For a person logged in, who may open any conversation, the sidebar lists the server's most recent ones; the one the
/// page shows is listed first as it is (its title, its runs) even when more than 200 newer ones (other clients')
/// push it out of those. Before, it was listed as a new conversation with no message.
#[tokio::test]
async fn a_logged_in_sidebar_lists_the_shown_conversation_as_it_is_however_many_are_newer() {
    const TOKEN: &str = "tg-5d2a9c4e7b1f46a8b3c0d9e2f4a6b8c1";
    let app = crate::helpers::spawn_app_with(|config| {
        config.token = Some(server::security::AccessToken::parse(TOKEN).unwrap());
    })
    .await;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {TOKEN}").parse().unwrap(),
    );
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let answered = async |session: &str| {
        let started: Value = client
            .post(app.url("/api/agent/runs"))
            .json(&json!({"message": "list files", "sessionId": session}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run_id = started["runId"].as_str().unwrap().to_owned();
        tokio::time::timeout(PATIENCE, async {
            loop {
                let run: Value = client
                    .get(app.url(&format!("/api/agent/runs/{run_id}")))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if run["run"]["status"] == "done" {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the run answers");
    };
    answered("shown").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for i in 0..201 {
        answered(&format!("other-{i}")).await;
    }

    let listed = client
        .post(app.url("/api/fn/sessions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", "toolgate_session=shown")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let listed: Vec<Value> = listed.json().await.unwrap();
    assert_eq!(listed[0]["sessionId"], "shown");
    assert_eq!(listed[0]["title"], "list files");
    assert_eq!(listed[0]["runs"], 1);
}

/// The audit view of a browser without a login shows its own conversations' newest entries however many entries
/// other clients' sessions added after them: the log is read for its sessions (and for no session) in one query.
/// Before, it was read newest first and filtered afterwards, up to 200,000 entries, and past them said "No entries
/// match." although the browser's entries were there.
#[tokio::test]
async fn the_audit_view_finds_the_browsers_entries_however_many_other_sessions_added_since() {
    let (app, file, _dir) = on_sqlite().await;
    let (run_id, call_id) = waiting_run(&app, "alice", "a.txt").await;
    let decided = server_fn(
        &app,
        "decide",
        "alice",
        &[
            ("run_id", &run_id),
            ("tool_call_id", &call_id),
            ("choice", "Deny"),
        ],
    )
    .await;
    assert_eq!(decided.status(), 200);
    // Other clients' sessions' entries, more than the old view ever read, all newer than Alice's.
    let mut beside = rusqlite::Connection::open(&file).unwrap();
    beside
        .busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    let written = beside.transaction().unwrap();
    {
        let mut insert = written
            .prepare(
                "INSERT INTO audit (at, kind, session_id, outcome) \
                 VALUES (?1, 'approval_requested', 'someone-else', 'requested')",
            )
            .unwrap();
        for i in 0..200_001_i64 {
            insert.execute([i]).unwrap();
        }
    }
    written.commit().unwrap();

    let lines: Vec<Value> = server_fn(&app, "audit", "alice", &[])
        .await
        .json()
        .await
        .unwrap();
    assert!(
        lines.iter().all(|line| line["sessionId"] == "alice"),
        "only Alice's"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["outcome"] == "denied" && line["runId"] == run_id.as_str()),
        "{lines:?}"
    );
}
