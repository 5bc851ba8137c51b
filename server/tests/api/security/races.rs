//! Races over HTTP: concurrent decisions, a decision against the timeout, a decision against a cancel. Each
//! approval resolves exactly once, the answers to the deciders agree with the resolution the run's events show, and
//! the tool runs at most once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{SseEvent, TestApp, spawn_app, spawn_app_with};

const SEED_404: &str = "No pending approval found for run {run} and tool call {call}. It may have already been resolved or timed out.";

fn not_found_text(run_id: &str, call_id: &str) -> String {
    SEED_404.replace("{run}", run_id).replace("{call}", call_id)
}

/// A run that wrote nothing yet and waits for approval to write `file`; returns the run, the call and the moment
/// (ms since the epoch) its approval expires.
async fn pending_write(app: &TestApp, file: &str, content: &str) -> (String, String, u64) {
    let run_id = app
        .create_run(json!({"message": format!("write {file}: {content}"), "sessionId": format!("s-{file}")}))
        .await;
    let required = app
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let request = &required.data["request"];
    (
        run_id,
        request["toolCallId"].as_str().unwrap().to_owned(),
        request["expiresAt"].as_u64().unwrap(),
    )
}

/// Every event of a finished run.
async fn all_events(app: &TestApp, run_id: &str) -> Vec<SseEvent> {
    app.events(run_id, None).await.rest().await
}

/// The one `approvalResolved` for `call_id` (the test fails on none or several), and how many `toolResult`s.
fn resolution_of(events: &[SseEvent], call_id: &str) -> (Value, usize) {
    let of_call = |name: &str| -> Vec<&SseEvent> {
        events
            .iter()
            .filter(|e| e.name == name && e.data["toolCallId"] == call_id)
            .collect()
    };
    let resolved = of_call("approvalResolved");
    assert_eq!(resolved.len(), 1, "exactly one resolution: {resolved:?}");
    (
        resolved[0].data["resolution"].clone(),
        of_call("toolResult").len(),
    )
}

#[tokio::test]
async fn sixty_four_concurrent_decisions_resolve_once_and_the_tool_runs_once() {
    let app = Arc::new(spawn_app().await);
    let (run_id, call_id, _) = pending_write(&app, "race.txt", "won").await;
    let deciders = 64;
    let barrier = Arc::new(Barrier::new(deciders));
    let tasks: Vec<_> = (0..deciders)
        .map(|i| {
            let (app, barrier) = (Arc::clone(&app), Arc::clone(&barrier));
            let (run_id, call_id) = (run_id.clone(), call_id.clone());
            let decision = if i % 2 == 0 { "approve" } else { "deny" };
            tokio::spawn(async move {
                barrier.wait().await;
                let response = app
                    .decide(&run_id, &call_id, json!({"decision": decision}))
                    .await;
                let status = response.status().as_u16();
                (decision, status, response.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }

    let winners: Vec<&(&str, u16, Value)> = answers
        .iter()
        .filter(|(_, status, _)| *status == 200)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one success: {answers:?}");
    for (_, status, body) in answers.iter().filter(|(_, status, _)| *status != 200) {
        assert_eq!(*status, 404);
        assert_eq!(body["error"], not_found_text(&run_id, &call_id));
    }
    let (decision, _, won) = winners[0];
    let expected_type = if *decision == "approve" {
        "approved"
    } else {
        "denied"
    };
    assert_eq!(won["resolution"]["type"], expected_type);
    assert_eq!(won["resolution"]["source"], "user");

    let events = all_events(&app, &run_id).await;
    let (resolution, results) = resolution_of(&events, &call_id);
    assert_eq!(
        resolution, won["resolution"],
        "the run saw the winner's decision"
    );
    assert_eq!(results, 1, "one tool result");
    let written = std::fs::read_to_string(app.file("race.txt")).ok();
    if *decision == "approve" {
        assert_eq!(written.as_deref(), Some("won"));
    } else {
        assert_eq!(written, None, "a denied write wrote nothing");
    }
}

/// Whether a decision response and the run's resolution agree: 200 ⇔ the person's resolution, 404 ⇔ `source`.
async fn assert_one_way(
    app: &TestApp,
    run_id: &str,
    call_id: &str,
    decided: reqwest::Response,
    other_source: &str,
) -> bool {
    let status = decided.status().as_u16();
    let body: Value = decided.json().await.unwrap();
    let events = all_events(app, run_id).await;
    let (resolution, _) = resolution_of(&events, call_id);
    match status {
        200 => {
            assert_eq!(resolution["source"], "user", "{resolution}");
            assert_eq!(resolution, body["resolution"]);
            true
        }
        404 => {
            assert_eq!(resolution["source"], other_source, "{resolution}");
            assert_eq!(body["error"], not_found_text(run_id, call_id));
            false
        }
        other => panic!("a decision got {other}: {body}"),
    }
}

#[tokio::test]
async fn a_decision_racing_the_timeout_resolves_once_one_way() {
    let app = Arc::new(spawn_app_with(|config| config.approval_timeout_secs = 1).await);
    // Deliberate timing: each decision is sent at the approval's deadline plus an offset, so some land just before
    // the timeout fires and some just after; whichever wins, both sides must agree. Runs race in parallel.
    let offsets_ms: [i64; 8] = [-40, -20, -10, -5, 0, 5, 10, 30];
    let races: Vec<_> = offsets_ms
        .iter()
        .enumerate()
        .map(|(i, &offset)| {
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let file = format!("timeout-{i}.txt");
                let (run_id, call_id, expires_at) = pending_write(&app, &file, "in time").await;
                let at = expires_at as i64 + offset;
                let wait = (at - agent::clock::now_ms() as i64).max(0) as u64;
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let decided = app
                    .decide(&run_id, &call_id, json!({"decision": "approve"}))
                    .await;
                let user_won = assert_one_way(&app, &run_id, &call_id, decided, "timeout").await;
                let written = std::fs::read_to_string(app.file(&file)).ok();
                assert_eq!(
                    written.is_some(),
                    user_won,
                    "the file exists exactly when the approval won"
                );
            })
        })
        .collect();
    for race in races {
        race.await.unwrap();
    }
}

#[tokio::test]
async fn a_decision_racing_a_cancel_resolves_once_one_way() {
    let app = Arc::new(spawn_app().await);
    let races: Vec<_> = (0..18)
        .map(|i| {
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let (run_id, call_id, _) =
                    pending_write(&app, &format!("cancel-{i}.txt"), "x").await;
                let cancel_path = format!("/api/agent/runs/{run_id}/cancel");
                let empty = json!({});
                let decide = app.decide(&run_id, &call_id, json!({"decision": "approve"}));
                let cancel = app.post_json(&cancel_path, &empty);
                // The decision goes out first, at the same time, or right after the cancel's answer: the run's
                // abort happens in its own task, so either side may win in each of these orders.
                let (decided, cancelled) = match i % 3 {
                    0 => tokio::join!(decide, cancel),
                    1 => {
                        let (cancelled, decided) = tokio::join!(cancel, decide);
                        (decided, cancelled)
                    }
                    _ => {
                        let cancelled = cancel.await;
                        (decide.await, cancelled)
                    }
                };
                assert_eq!(cancelled.status(), 200);
                assert_one_way(&app, &run_id, &call_id, decided, "abort").await;
            })
        })
        .collect();
    for race in races {
        race.await.unwrap();
    }
}
