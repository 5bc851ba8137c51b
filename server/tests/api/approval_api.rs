//! The approval API's answers when nothing is pending, and the non-streaming route that stays fail-closed.

use serde_json::{Value, json};

use crate::helpers::{spawn_app, spawn_app_with};

#[tokio::test]
async fn listing_approvals_for_an_unknown_run_gives_an_empty_list() {
    let app = spawn_app().await;
    let response = app.get("/api/agent/approvals?runId=demo").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"ok":true,"pending":[]}"#
    );
}

#[tokio::test]
async fn deciding_an_approval_that_does_not_exist_is_404_with_the_not_found_text() {
    let app = spawn_app().await;
    let response = app
        .decide("demo-run", "demo-call", json!({"decision": "approve"}))
        .await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "No pending approval found for run demo-run and tool call demo-call. It may have already been resolved or timed out."
    );
    assert_eq!(body["ok"], false);
}

#[tokio::test]
async fn the_non_streaming_route_refuses_a_call_that_needs_approval() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let response = app
        .post_json("/api/agent", &json!({"message": "delete a.txt"}))
        .await;
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "APPROVAL_REQUIRED");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.starts_with("delete_file needs approval (delete_file is destructive.)"),
        "{error}"
    );
    assert!(body["runId"].as_str().unwrap().starts_with("run_"));
    assert_eq!(
        std::fs::read_to_string(app.file("a.txt")).unwrap(),
        "keep",
        "nothing ran"
    );
    let pending: Value = app.get("/api/agent/approvals").await.json().await.unwrap();
    assert_eq!(
        pending["pending"],
        json!([]),
        "fail-closed never leaves an approval pending"
    );
}

#[tokio::test]
async fn the_non_streaming_route_answers_with_the_final_answer_and_the_steps() {
    let app = spawn_app().await;
    std::fs::write(app.file("notes.txt"), "hello").unwrap();
    let response = app
        .post_json("/api/agent", &json!({"message": "read notes.txt"}))
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], true);
    assert_eq!(body["answer"], "read_file read notes.txt: \"hello\"");
    let steps = body["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    let call = &steps[0]["toolCalls"][0];
    assert_eq!(call["name"], "read_file");
    assert_eq!(call["permission"]["type"], "allow");
    assert_eq!(call["output"]["status"], "ok");
    assert_eq!(steps[1]["text"], "read_file read notes.txt: \"hello\"");
}

/// A decision that comes after the card's time ran out decides nothing, even while no sweep has timed the call out
/// yet (here the database refuses the sweep's write): it is answered as for any call no longer pending, and the call
/// times out once the sweep can write. Before, such a decision approved the call and its tool ran.
#[tokio::test]
async fn a_decision_after_the_approvals_expiry_is_refused_though_no_sweep_has_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("toolgate.db");
    let database = agent::store::sql::DatabaseUrl::Sqlite(file.clone());
    let app = spawn_app_with(|config| {
        config.database_url = server::config::Database::Sql(database);
        config.approval_timeout_secs = 1;
    })
    .await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let run_id = app
        .create_run(json!({"message": "delete a.txt", "sessionId": "late"}))
        .await;
    let mut events = app.events(&run_id, None).await;
    let required = events.until("approvalRequired").await;
    let request = &required.data["request"];
    let call_id = request["toolCallId"].as_str().unwrap().to_owned();
    let expires_at = request["expiresAt"].as_u64().unwrap();
    // The sweep cannot time the call out; a decision could still be written.
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_timeouts BEFORE UPDATE ON calls \
             WHEN OLD.status = 'pending' AND NEW.status <> 'approved' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    tokio::time::sleep(std::time::Duration::from_millis(
        expires_at.saturating_sub(now()) + 200,
    ))
    .await;

    let late = app
        .decide(&run_id, &call_id, json!({"decision": "approve"}))
        .await;
    assert_eq!(late.status(), 404);
    assert!(app.file("a.txt").exists(), "the tool did not run");

    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch("DROP TRIGGER refuse_timeouts;")
        .unwrap();
    let resolved = events.until("approvalResolved").await;
    assert_eq!(
        resolved.data["resolution"]["source"], "timeout",
        "{}",
        resolved.data
    );
    events.until("done").await;
    assert!(app.file("a.txt").exists(), "the tool never ran");
}
