//! `POST /api/agent/stream`: interactive runs over SSE, decided through the REST route.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{names, spawn_app, spawn_app_with};

#[tokio::test]
async fn a_streamed_run_approved_through_the_rest_route_runs_the_tool() {
    let app = spawn_app().await;
    let mut stream = app
        .stream(json!({"message": "write notes.txt: hello"}))
        .await;
    assert_eq!(stream.status, 200);
    assert!(stream.content_type.starts_with("text/event-stream"));
    assert_eq!(
        stream.cache_control, "no-store",
        "no cache may hold a live stream"
    );

    let required = stream.until("approvalRequired").await;
    let request = &required.data["request"];
    assert_eq!(request["toolName"], "write_file");
    assert_eq!(
        request["arguments"],
        json!({"path": "notes.txt", "content": "hello"})
    );
    assert_eq!(request["reason"], "write_file is destructive.");
    let (run_id, call_id) = (
        request["runId"].as_str().unwrap(),
        request["toolCallId"].as_str().unwrap(),
    );

    let listed: Value = app
        .get(&format!("/api/agent/approvals?runId={run_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["pending"][0]["toolCallId"], call_id);

    let decided = app
        .decide(run_id, call_id, json!({"decision": "approve"}))
        .await;
    assert_eq!(decided.status(), 200);
    let decided: Value = decided.json().await.unwrap();
    assert_eq!(decided["pending"]["toolCallId"], call_id);
    assert_eq!(
        decided["resolution"],
        json!({"type": "approved", "source": "user", "scope": "once"})
    );

    let resolved = stream.until("approvalResolved").await;
    assert_eq!(resolved.data["resolution"]["type"], "approved");
    let result = stream.until("toolResult").await;
    assert_eq!(result.data["output"]["status"], "ok");
    let done = stream.until("done").await;
    assert_eq!(
        done.data["answer"],
        "write_file wrote 5 bytes to notes.txt."
    );
    assert!(stream.next().await.is_none(), "the stream ends after done");
    assert_eq!(
        std::fs::read_to_string(app.file("notes.txt")).unwrap(),
        "hello"
    );
}

#[tokio::test]
async fn every_event_has_a_type_a_matching_name_and_an_increasing_id() {
    let app = spawn_app().await;
    let mut stream = app.stream(json!({"message": "list files"})).await;
    let events = stream.rest().await;
    let ids: Vec<u64> = events.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    let mut flow = names(&events);
    flow.dedup();
    assert_eq!(
        flow,
        [
            "runStarted",
            "step",
            "toolCall",
            "toolResult",
            "step",
            "assistantDelta",
            "done"
        ]
    );
    assert!(
        events.iter().any(|e| e.name == "debug"),
        "debug events are on the stream too"
    );
}

#[tokio::test]
async fn a_denial_reaches_the_model_with_the_denial_wording() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let mut stream = app.stream(json!({"message": "delete a.txt"})).await;
    let required = stream.until("approvalRequired").await;
    let request = &required.data["request"];
    let response = app
        .decide(
            request["runId"].as_str().unwrap(),
            request["toolCallId"].as_str().unwrap(),
            json!({"decision": "deny", "reason": "it is the only copy"}),
        )
        .await;
    assert_eq!(response.status(), 200);

    let resolved = stream.until("approvalResolved").await;
    assert_eq!(
        resolved.data["resolution"],
        json!({"type": "denied", "source": "user", "reason": "The user denied this tool call: it is the only copy"})
    );
    let result = stream.until("toolResult").await;
    assert_eq!(result.data["output"]["code"], "APPROVAL_DENIED");
    assert_eq!(
        result.data["output"]["message"],
        "The user denied this tool call: it is the only copy. The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer."
    );
    let done = stream.until("done").await;
    assert_eq!(
        done.data["answer"],
        "delete_file was not run because it was denied: The user denied this tool call: it is the only copy."
    );
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
}

#[tokio::test]
async fn an_approval_nobody_decides_times_out_as_a_denial() {
    let app = spawn_app_with(|config| config.approval_timeout_secs = 1).await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let mut stream = app.stream(json!({"message": "delete a.txt"})).await;
    let required = stream.until("approvalRequired").await;
    let request = &required.data["request"];
    assert_eq!(
        request["expiresAt"].as_u64().unwrap() - request["requestedAt"].as_u64().unwrap(),
        1000
    );
    let resolved = stream.until("approvalResolved").await;
    assert_eq!(resolved.data["resolution"]["source"], "timeout");
    assert_eq!(
        stream.until("toolResult").await.data["output"]["code"],
        "APPROVAL_DENIED"
    );
    stream.until("done").await;
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
    let late = app
        .decide(
            request["runId"].as_str().unwrap(),
            request["toolCallId"].as_str().unwrap(),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(
        late.status(),
        404,
        "a timed-out approval cannot be decided any more"
    );
}

#[tokio::test]
async fn closing_the_stream_aborts_the_run_and_nothing_runs_after() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let mut stream = app.stream(json!({"message": "delete a.txt"})).await;
    let required = stream.until("approvalRequired").await;
    let request = required.data["request"].clone();
    let run_id = request["runId"].as_str().unwrap();
    // A second viewer of the same run watches what happens after the first one leaves.
    let mut watcher = app.events(run_id, Some(required.id)).await;
    drop(stream);

    let resolved = watcher.until("approvalResolved").await;
    assert_eq!(resolved.data["resolution"]["source"], "abort");
    let error = watcher.until("error").await;
    assert_eq!(error.data["code"], "ABORTED");
    assert_eq!(
        error.data["message"],
        "The client disconnected, so the run was aborted."
    );
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
    let pending: Value = app.get("/api/agent/approvals").await.json().await.unwrap();
    assert_eq!(pending["pending"], json!([]));
    let late = app
        .decide(
            run_id,
            request["toolCallId"].as_str().unwrap(),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(late.status(), 404);
}

#[tokio::test]
async fn an_idle_stream_sends_keep_alive_comments_while_waiting() {
    use futures::StreamExt;

    let app = spawn_app_with(|config| config.keep_alive_secs = 1).await;
    let response = app
        .post_json("/api/agent/stream", &json!({"message": "delete a.txt"}))
        .await;
    let mut bytes = response.bytes_stream();
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    // Past the approval request the run is idle, waiting for a person: only comments (`:` lines) keep it alive.
    let waiting_and_kept_alive = |seen: &str| {
        seen.contains("event: approvalRequired")
            && seen
                .rsplit("approvalRequired")
                .next()
                .is_some_and(|after| after.contains("\n:\n"))
    };
    while !waiting_and_kept_alive(&seen) {
        let chunk = tokio::time::timeout_at(deadline, bytes.next())
            .await
            .expect("a keep-alive comment arrives within the interval")
            .expect("the stream stays open")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}
