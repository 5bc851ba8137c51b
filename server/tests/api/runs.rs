//! Runs as resources: several viewers, reconnects with `Last-Event-ID`, cancellation, sessions.

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::helpers::spawn_app;

/// A stream's response waits a moment for its first event, so that its head goes out with it; a reader who has
/// seen everything of a waiting run gets its head without waiting for the run's next event, then that event.
#[tokio::test]
async fn a_reader_caught_up_with_a_waiting_run_gets_the_stream_before_anything_happens() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "write a.txt: one"})).await;
    let mut first = app.events(&run_id, None).await;
    // The run waits on its one call: the card is its last event until the decision.
    let required = first.until("approvalRequired").await;
    let last = required.id;
    drop(first);

    let mut caught_up = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        app.events(&run_id, Some(last)),
    )
    .await
    .expect("the stream's head comes while the run still waits");
    assert_eq!(caught_up.status, 200);

    app.approve(&run_id, &required).await;
    let resolved = caught_up.next().await.expect("the run goes on");
    assert_eq!(resolved.name, "approvalResolved");
    assert_eq!(resolved.id, last + 1);
}

#[tokio::test]
async fn a_reconnect_with_last_event_id_misses_nothing_and_repeats_nothing() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "write a.txt: one"})).await;

    let mut first = app.events(&run_id, None).await;
    let mut seen = Vec::new();
    let required = loop {
        let event = first.next().await.expect("the run goes on");
        seen.push(event.clone());
        if event.name == "approvalRequired" {
            break event;
        }
    };
    drop(first);

    app.approve(&run_id, &required).await;

    let mut resumed = app.events(&run_id, Some(required.id)).await;
    let rest = resumed.rest().await;
    assert_eq!(
        rest.first().unwrap().id,
        required.id + 1,
        "it resumes right after the last id seen"
    );
    seen.extend(rest);

    let mut fresh = app.events(&run_id, None).await;
    let everything = fresh.rest().await;
    let ids = |events: &[crate::helpers::SseEvent]| events.iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(&seen),
        ids(&everything),
        "nothing missed, nothing repeated"
    );
    let datas = |events: &[crate::helpers::SseEvent]| {
        events.iter().map(|e| e.data.clone()).collect::<Vec<_>>()
    };
    assert_eq!(datas(&seen), datas(&everything));
    assert_eq!(everything.last().unwrap().name, "done");

    // A reconnect after the ended run's last event: nothing more will come, and 204 tells an EventSource to stop
    // reconnecting (an empty stream that ended would have it come back every few seconds).
    let last = everything.last().unwrap().id;
    let mut after_the_end = app.events(&run_id, Some(last)).await;
    assert_eq!(after_the_end.status, 204);
    assert!(after_the_end.rest().await.is_empty());
    let before_the_end = app.events(&run_id, Some(last - 1)).await.rest().await;
    assert_eq!(ids(&before_the_end), [last]);
}

#[tokio::test]
async fn the_after_query_parameter_resumes_like_last_event_id() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "list files"})).await;
    let everything = app.events(&run_id, None).await.rest().await;
    let response = app
        .get(&format!("/api/agent/runs/{run_id}/events?after=3"))
        .await;
    let rest = crate::helpers::SseStream::new(response).rest().await;
    assert_eq!(rest.first().unwrap().id, 4);
    assert_eq!(rest.len(), everything.len() - 3);
    let bad = app
        .get(&format!("/api/agent/runs/{run_id}/events?after=x"))
        .await;
    assert_eq!(bad.status(), 400);
}

/// A stream resumed after an event the run has not sent (its last commits lost to a machine's crash, or a client's
/// mistake) resumes after the run's last event, on the run's stream and on its session's: it goes on with the run to
/// its end. Before, it waited for that event and sent nothing of the run, not even its end.
#[tokio::test]
async fn a_stream_resumed_past_the_runs_last_event_goes_on_from_its_end() {
    let app = spawn_app().await;
    let run_id = app
        .create_run(json!({"message": "write a.txt: one", "sessionId": "past-the-end"}))
        .await;
    let required = app
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let past = required.id + 100;
    let mut by_run = crate::helpers::SseStream::new(
        app.get(&format!("/api/agent/runs/{run_id}/events?after={past}"))
            .await,
    );
    let mut by_session = app
        .get(&format!(
            "/api/agent/sessions/past-the-end/events?run={run_id}&after={past}"
        ))
        .await
        .bytes_stream()
        .eventsource();
    app.approve(&run_id, &required).await;
    let rest = by_run.rest().await;
    assert_eq!(rest.first().map(|event| event.id), Some(required.id + 1));
    assert_eq!(rest.last().map(|event| event.name.as_str()), Some("done"));
    let resolved = tokio::time::timeout(crate::helpers::PATIENCE, by_session.next())
        .await
        .expect("the session's stream goes on")
        .expect("an event")
        .expect("a well-formed event");
    assert_eq!(resolved.event, "approvalResolved");
    assert_eq!(resolved.id, format!("{run_id}:{}", required.id + 1));
}

#[tokio::test]
async fn two_subscribers_of_one_run_see_the_same_events() {
    let app = spawn_app().await;
    let run_id = app
        .create_run(json!({"message": "delete a.txt and delete b.txt"}))
        .await;
    let mut one = app.events(&run_id, None).await;
    let mut two = app.events(&run_id, None).await;
    let first = one.until("approvalRequired").await;
    let second = one.until("approvalRequired").await;
    for required in [&first, &second] {
        let call_id = required.data["request"]["toolCallId"].as_str().unwrap();
        assert_eq!(
            app.decide(&run_id, call_id, json!({"decision": "deny"}))
                .await
                .status(),
            200
        );
    }
    let rest_one = one.rest().await;
    let all_two = two.rest().await;
    let all_one: Vec<Value> = [first, second]
        .into_iter()
        .chain(rest_one)
        .map(|e| e.data)
        .collect();
    let all_two_approval_onwards: Vec<Value> = all_two
        .iter()
        .skip_while(|e| e.name != "approvalRequired")
        .map(|e| e.data.clone())
        .collect();
    // `one` skipped what came before its first approval; from there both saw the same sequence.
    assert_eq!(all_one, all_two_approval_onwards);
    assert_eq!(all_two.last().unwrap().name, "done");
}

#[tokio::test]
async fn approving_for_the_session_lets_the_next_call_of_that_tool_run_without_asking() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("b.txt"), "b").unwrap();
    let mut first = app
        .stream(json!({"message": "delete a.txt", "sessionId": "session-grants"}))
        .await;
    let required = first.until("approvalRequired").await;
    let request = &required.data["request"];
    let decided = app
        .decide(
            request["runId"].as_str().unwrap(),
            request["toolCallId"].as_str().unwrap(),
            json!({"decision": "approve", "scope": "session"}),
        )
        .await;
    assert_eq!(decided.status(), 200);
    first.until("done").await;

    let mut second = app
        .stream(json!({"message": "delete b.txt", "sessionId": "session-grants"}))
        .await;
    let events = second.rest().await;
    assert!(
        events.iter().all(|e| e.name != "approvalRequired"),
        "no approval was asked"
    );
    let call = events.iter().find(|e| e.name == "toolCall").unwrap();
    assert_eq!(call.data["permission"]["type"], "allow");
    assert_eq!(
        call.data["permission"]["reason"],
        "Approved for this session: delete_file on any path in the workspace."
    );
    assert!(!app.file("a.txt").exists() && !app.file("b.txt").exists());

    // Another session still asks.
    let mut other = app
        .stream(json!({"message": "delete c.txt", "sessionId": "someone-else"}))
        .await;
    other.until("approvalRequired").await;
}

#[tokio::test]
async fn a_session_remembers_its_conversation() {
    let app = spawn_app().await;
    for message in ["list files", "list files"] {
        let response = app
            .post_json(
                "/api/agent",
                &json!({"message": message, "sessionId": "memory"}),
            )
            .await;
        assert_eq!(response.status(), 200);
    }
    // The scripted model numbers tool calls by the conversation it sees: the second run saw the first.
    let response = app
        .post_json(
            "/api/agent",
            &json!({"message": "list files", "sessionId": "memory"}),
        )
        .await;
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["steps"][0]["toolCalls"][0]["id"], "call_3");
}

#[tokio::test]
async fn cancelling_a_run_denies_its_pending_approval_as_aborted() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "delete a.txt"})).await;
    let mut events = app.events(&run_id, None).await;
    events.until("approvalRequired").await;
    let cancelled = app
        .post_json(&format!("/api/agent/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancelled.status(), 200);
    assert_eq!(
        events.until("approvalResolved").await.data["resolution"]["source"],
        "abort"
    );
    let error = events.until("error").await;
    assert_eq!(
        error.data,
        json!({"type": "error", "runId": run_id, "code": "ABORTED", "message": "The run was cancelled."})
    );

    let view: Value = app
        .get(&format!("/api/agent/runs/{run_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(view["run"]["status"], "failed");
    let unknown = app
        .post_json("/api/agent/runs/run_unknown/cancel", &json!({}))
        .await;
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn a_session_runs_one_run_at_a_time() {
    let app = spawn_app().await;
    app.create_run(json!({"message": "delete a.txt", "sessionId": "busy"}))
        .await;
    let second = app
        .post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": "busy"}),
        )
        .await;
    assert_eq!(second.status(), 409);
    let body: Value = second.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("Session busy is busy with run")
    );
}

#[tokio::test]
async fn a_run_may_not_ask_for_a_looser_policy_than_the_servers() {
    let app = spawn_app().await;
    let response = app
        .post_json(
            "/api/agent/runs",
            &json!({"message": "delete a.txt", "policy": "trusted"}),
        )
        .await;
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "Policy trusted is looser than the server's policy on_request; a run may only ask for a stricter one."
    );
}

#[tokio::test]
async fn shutdown_aborts_pending_runs_ends_their_streams_and_exits_quickly() {
    let app = spawn_app().await;
    let mut stream = app.stream(json!({"message": "delete a.txt"})).await;
    stream.until("approvalRequired").await;
    let stopping = tokio::spawn(async move { app.shut_down().await });
    assert_eq!(
        stream.until("approvalResolved").await.data["resolution"]["source"],
        "abort"
    );
    let error = stream.until("error").await;
    assert_eq!(error.data["code"], "SHUTDOWN");
    assert_eq!(
        error.data["message"],
        "The server is shutting down, so the run was aborted."
    );
    let took = stopping.await.unwrap();
    assert!(
        took < std::time::Duration::from_secs(5),
        "shutdown took {took:?}"
    );
}

#[tokio::test]
async fn once_a_cancel_answered_no_decision_succeeds_and_every_call_of_the_run_has_its_end() {
    let app = spawn_app().await;
    let run_id = app
        .create_run(json!({"message": "write a.txt: one and write b.txt: two"}))
        .await;
    let mut events = app.events(&run_id, None).await;
    let first = events.until("approvalRequired").await;
    let second = events.until("approvalRequired").await;
    let call = |event: &crate::helpers::SseEvent| {
        event.data["request"]["toolCallId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (first, second) = (call(&first), call(&second));
    // One approved, then the run cancelled before the other is decided.
    assert_eq!(
        app.decide(&run_id, &first, json!({"decision": "approve"}))
            .await
            .status(),
        200
    );
    let cancelled = app
        .post_json(&format!("/api/agent/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancelled.status(), 200);
    let late = app
        .decide(&run_id, &second, json!({"decision": "approve"}))
        .await;
    assert_eq!(
        late.status(),
        404,
        "no decision succeeds once the cancel answered"
    );

    let rest = events.rest().await;
    assert_eq!(rest.last().unwrap().data["code"], "ABORTED");
    let run: Value = app
        .get(&format!("/api/agent/runs/{run_id}"))
        .await
        .json()
        .await
        .unwrap();
    let calls: Vec<&Value> = run["run"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|step| step["toolCalls"].as_array().unwrap())
        .collect();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert!(
            call["output"].is_object(),
            "every call has its end, none is left running: {call}"
        );
    }
    assert!(!app.file("b.txt").exists(), "the undecided call never ran");
}
