//! Bad input gets a clear 4xx and changes nothing.

use serde_json::{Value, json};

use crate::helpers::spawn_app;

#[tokio::test]
async fn an_invalid_decision_is_400_in_the_form_errors_shape() {
    let app = spawn_app().await;
    let response = app
        .decide("run-1", "call-1", json!({"decision": "maybe", "extra": 1}))
        .await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["formErrors"],
        json!(["Unrecognized key(s) in object: 'extra'"])
    );
    assert_eq!(
        body["fieldErrors"],
        json!({"decision": ["Invalid enum value. Expected 'approve' | 'deny', received 'maybe'"]})
    );
}

#[tokio::test]
async fn malformed_json_and_wrong_content_types_are_refused() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/agent/approvals/run-1/call-1"))
        .header("content-type", "application/json")
        .body("{\"decision\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["formErrors"][0]
            .as_str()
            .unwrap()
            .starts_with("Malformed JSON")
    );
    assert_eq!(body["fieldErrors"], json!({}));

    let response = app
        .client
        .post(app.url("/api/agent/runs"))
        .header("content-type", "text/plain")
        .body("{\"message\": \"list files\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let app = spawn_app().await;
    let huge = "x".repeat(100 * 1024);
    let response = app
        .post_json("/api/agent/runs", &json!({"message": huge}))
        .await;
    assert_eq!(response.status(), 413);
}

#[tokio::test]
async fn ids_that_are_too_long_or_malformed_are_400() {
    let app = spawn_app().await;
    let long = "r".repeat(200);
    let response = app
        .decide(&long, "call-1", json!({"decision": "approve"}))
        .await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["fieldErrors"]["runId"][0]
            .as_str()
            .unwrap()
            .contains("at most 128")
    );
    let response = app.get("/api/agent/approvals?runId=a%20b").await;
    assert_eq!(response.status(), 400);
    let response = app
        .post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": "../../etc"}),
        )
        .await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn a_start_body_is_validated_field_by_field() {
    let app = spawn_app().await;
    let response = app
        .post_json("/api/agent", &json!({"message": "", "policy": "yolo"}))
        .await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["fieldErrors"]["message"],
        json!(["String must contain at least 1 character(s)"])
    );
    assert_eq!(
        body["fieldErrors"]["policy"],
        json!([
            "Invalid enum value. Expected 'trusted' | 'on_request' | 'strict', received 'yolo'"
        ])
    );
}

#[tokio::test]
async fn unknown_api_routes_are_json_404s() {
    let app = spawn_app().await;
    let response = app.get("/api/nope").await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], false);
}
