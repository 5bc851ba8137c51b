//! The approval API's answers when nothing is pending, and the non-streaming route that stays fail-closed.

use serde_json::{Value, json};

use crate::helpers::spawn_app;

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
