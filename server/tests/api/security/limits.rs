//! No client makes the server hold more than its share: past its bound of open event streams a client gets a 429
//! that says why, starts nothing, and the streams it has keep going. Other clients are not counted against it.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::pending;
use crate::helpers::{SseStream, TestApp, spawn_app_with};

/// A client whose requests come from `ip` (any address of 127.0.0.0/8 reaches the server on 127.0.0.1).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

async fn too_many(response: reqwest::Response) {
    assert_eq!(response.status(), 429);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({
            "ok": false,
            "code": "TOO_MANY_STREAMS",
            "error": "This client has 2 event streams open, the most one client may; close one before opening another."
        })
    );
}

async fn run_events(app: &TestApp, client: &reqwest::Client, run_id: &str) -> reqwest::Response {
    client
        .get(app.url(&format!("/api/agent/runs/{run_id}/events")))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn past_its_stream_bound_a_client_gets_429_and_its_open_streams_go_on() {
    let app = spawn_app_with(|config| config.max_streams_per_client = 2).await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let run_id = app
        .create_run(json!({"message": "delete a.txt", "sessionId": "s1"}))
        .await;
    let mut run_stream = app.events(&run_id, None).await;
    let required = run_stream.until("approvalRequired").await;
    let call_id = required.data["request"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    let session_stream = app.get("/api/agent/sessions/s1/events").await;
    assert_eq!(session_stream.status(), 200);

    // Every kind of stream is refused past the bound, and the refused ones start nothing.
    too_many(run_events(&app, &app.client, &run_id).await).await;
    too_many(app.get("/api/agent/sessions/s2/events").await).await;
    too_many(
        app.post_json("/api/agent/stream", &json!({"message": "delete b.txt"}))
            .await,
    )
    .await;
    too_many(
        app.post_json(
            "/api/agui",
            &json!({"threadId": "t1", "runId": "agui-1", "messages": [{"id": "m1", "role": "user", "content": "delete b.txt"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(pending(&app).await.len(), 1, "only the first run waits");
    assert_eq!(app.harness.sessions(usize::MAX).await.unwrap().len(), 1);

    // Another client's streams are its own.
    let other = client_from("127.0.0.2");
    let mut other_stream = SseStream::new(run_events(&app, &other, &run_id).await);
    assert_eq!(other_stream.status, 200);

    // The open streams go on: the decision reaches all of them, and the run's streams end with the run.
    let decided = app
        .decide(&run_id, &call_id, json!({"decision": "approve"}))
        .await;
    assert_eq!(decided.status(), 200);
    for stream in [&mut run_stream, &mut other_stream] {
        let rest = stream.rest().await;
        let names: Vec<&str> = rest.iter().map(|e| e.name.as_str()).collect();
        assert!(names.contains(&"approvalResolved"), "{names:?}");
        assert_eq!(names.last(), Some(&"done"));
    }
    assert!(!app.file("a.txt").exists());

    // A stream that ended gave its place back.
    let again = run_events(&app, &app.client, &run_id).await;
    assert_eq!(again.status(), 200);
    drop(session_stream);
}

/// A start past a bound: 503 with the API's error body, code `SERVER_FULL`.
async fn full(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "SERVER_FULL", "{body}");
    assert!(body["error"].as_str().unwrap().contains(what), "{body}");
}

#[tokio::test]
async fn past_the_bound_on_runs_not_ended_a_new_run_is_refused_and_the_waiting_ones_go_on() {
    let app = spawn_app_with(|config| config.max_active_runs = 2).await;
    let mut waiting = Vec::new();
    for file in ["a.txt", "b.txt"] {
        let run_id = app
            .create_run(json!({"message": format!("delete {file}")}))
            .await;
        let required = app
            .events(&run_id, None)
            .await
            .until("approvalRequired")
            .await;
        waiting.push((
            run_id,
            required.data["request"]["toolCallId"]
                .as_str()
                .unwrap()
                .to_owned(),
        ));
    }
    full(
        app.post_json("/api/agent/runs", &json!({"message": "delete c.txt"}))
            .await,
        "runs that have not ended",
    )
    .await;
    let (run_id, call_id) = &waiting[0];
    assert_eq!(
        app.decide(run_id, call_id, json!({"decision": "deny"}))
            .await
            .status(),
        200,
        "nothing is lost for the runs held"
    );
    app.events(run_id, None).await.until("done").await;
    assert_eq!(
        app.post_json("/api/agent/runs", &json!({"message": "list files"}))
            .await
            .status(),
        201,
        "room again"
    );
}

#[tokio::test]
async fn past_the_bound_on_sessions_only_known_sessions_start_runs() {
    let app = spawn_app_with(|config| config.max_sessions = 1).await;
    let run_id = app
        .create_run(json!({"message": "list files", "sessionId": "known"}))
        .await;
    app.events(&run_id, None).await.until("done").await;
    full(
        app.post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": "new"}),
        )
        .await,
        "sessions",
    )
    .await;
    full(
        app.post_json("/api/agent/runs", &json!({"message": "list files"}))
            .await,
        "sessions",
    )
    .await;
    assert_eq!(
        app.post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": "known"})
        )
        .await
        .status(),
        201
    );
}

/// Starts sent at once, with the store (SQLite, the default) counting before any of their runs is in it, take the
/// places left and no more: the bound holds where it matters, at its edge. Before, every start counted the same
/// rows and found the last place free, so all of them went through.
#[tokio::test]
async fn starts_sent_at_once_do_not_pass_the_bound_on_runs_not_ended() {
    let dir = tempfile::tempdir().unwrap();
    let database = agent::store::sql::DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let app = spawn_app_with(|config| {
        config.database_url = server::config::Database::Sql(database);
        config.max_active_runs = 2;
    })
    .await;
    let bodies: Vec<Value> = (0..20)
        .map(|n| json!({"message": format!("delete at-once-{n}.txt")}))
        .collect();
    let starts = bodies
        .iter()
        .map(|body| app.post_json("/api/agent/runs", body));
    let answers = futures::future::join_all(starts).await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|answer| answer.status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|status| **status == 201).count(),
        2,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|status| [201, 503].contains(status)),
        "{statuses:?}"
    );
}
