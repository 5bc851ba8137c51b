//! `POST /api/agui`: approvals as AG-UI interrupts, and every way a resume can be wrong.

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::helpers::{PATIENCE, TestApp, spawn_app, spawn_app_with};

/// What one AG-UI request gave back: its status, and its events when it streamed.
struct Answer {
    status: u16,
    events: Vec<Value>,
    body: Value,
}

impl Answer {
    fn of_type(&self, kind: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == kind).collect()
    }

    fn finished(&self) -> &Value {
        let last = self.events.last().expect("the run streamed events");
        assert_eq!(last["type"], "RUN_FINISHED", "{:#?}", self.events);
        last
    }

    fn interrupts(&self) -> Vec<Value> {
        let finished = self.finished();
        assert_eq!(finished["outcome"]["type"], "interrupt");
        finished["outcome"]["interrupts"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// The conversation the run ended with, as the client should send it next.
    fn snapshot(&self) -> Vec<Value> {
        let snapshot = self.of_type("MESSAGES_SNAPSHOT");
        assert_eq!(snapshot.len(), 1);
        snapshot[0]["messages"].as_array().unwrap().clone()
    }

    fn refused(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.body["code"], code, "{}", self.body);
        assert_eq!(self.body["ok"], false);
    }
}

async fn agui(app: &TestApp, body: Value) -> Answer {
    let response = app.post_json("/api/agui", &body).await;
    let status = response.status().as_u16();
    if status != 200 {
        let body = response.json().await.unwrap_or(Value::Null);
        return Answer {
            status,
            events: Vec::new(),
            body,
        };
    }
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut stream = response.bytes_stream().eventsource();
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("AG-UI events arrive")
    {
        let event = event.expect("a well-formed SSE event");
        events.push(serde_json::from_str::<Value>(&event.data).expect("AG-UI events are JSON"));
    }
    Answer {
        status,
        events,
        body: Value::Null,
    }
}

fn user(text: &str) -> Value {
    json!({"id": "m-user", "role": "user", "content": text})
}

fn start(thread: &str, run: &str, text: &str) -> Value {
    json!({"threadId": thread, "runId": run, "messages": [user(text)], "tools": [], "context": [], "state": {}, "forwardedProps": {}})
}

fn resume(thread: &str, run: &str, parent: &str, messages: Vec<Value>, entries: Value) -> Value {
    json!({"threadId": thread, "runId": run, "parentRunId": parent, "messages": messages, "resume": entries, "tools": [], "context": []})
}

fn approve(interrupt: &Value) -> Value {
    json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true}})
}

fn deny(interrupt: &Value, reason: &str) -> Value {
    json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": false, "reason": reason}})
}

#[tokio::test]
async fn one_approval_interrupts_the_run_and_the_resume_runs_the_tool() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let first = agui(&app, start("thread-1", "run-1", "delete a.txt")).await;
    assert_eq!(first.status, 200);
    let types: Vec<&str> = first
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "MESSAGES_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        first.events[0],
        json!({"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-1"})
    );
    let interrupts = first.interrupts();
    assert_eq!(interrupts.len(), 1);
    let interrupt = &interrupts[0];
    assert_eq!(interrupt["reason"], "tool_call");
    assert_eq!(interrupt["toolCallId"], "call_1");
    assert_eq!(interrupt["message"], "delete_file is destructive.");
    assert!(interrupt["responseSchema"]["oneOf"].is_array());
    assert!(interrupt["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert!(app.file("a.txt").exists(), "nothing ran before the resume");

    let second = agui(
        &app,
        resume(
            "thread-1",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(interrupt)]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.events[0]["parentRunId"], "run-1");
    let results = second.of_type("TOOL_CALL_RESULT");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["toolCallId"], "call_1");
    assert!(
        second.of_type("TOOL_CALL_START").is_empty(),
        "a resumed call is not replayed"
    );
    assert_eq!(second.finished()["outcome"]["type"], "success");
    let text: String = second
        .of_type("TEXT_MESSAGE_CONTENT")
        .iter()
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "delete_file deleted a.txt.");
    assert!(!app.file("a.txt").exists());
    let snapshot = second.snapshot();
    assert_eq!(
        snapshot.last().unwrap()["content"],
        "delete_file deleted a.txt."
    );
    assert!(
        snapshot
            .iter()
            .any(|m| m["role"] == "tool" && m["toolCallId"] == "call_1")
    );
}

/// An approval given through an interrupt is for the file as it was when the interrupt was issued: a file rewritten
/// before the resume is kept, and the model is told why. Before, the resume deleted whatever the file held by then.
#[tokio::test]
async fn a_resume_does_not_touch_a_file_that_changed_after_its_interrupt() {
    // On the durable store, whose audit log is the one kept.
    let database = tempfile::tempdir().unwrap();
    let file = database.path().join("toolgate.db");
    let app = spawn_app_with(|config| {
        config.database_url =
            server::config::Database::Sql(agent::store::sql::DatabaseUrl::Sqlite(file));
    })
    .await;
    std::fs::write(app.file("a.txt"), "scratch").unwrap();
    let first = agui(&app, start("thread-changed", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    std::fs::write(app.file("a.txt"), "a day of real work").unwrap();
    let second = agui(
        &app,
        resume(
            "thread-changed",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    let results = second.of_type("TOOL_CALL_RESULT");
    assert_eq!(results.len(), 1);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("changed after approval was asked"),
        "{}",
        results[0]
    );
    assert_eq!(
        std::fs::read_to_string(app.file("a.txt")).unwrap(),
        "a day of real work"
    );
    // The log has the approval, then a line that says its call was not run, and why.
    let audit = app.audit("").await;
    let lines: Vec<(&str, &str)> = audit
        .iter()
        .map(|entry| {
            (
                entry["kind"].as_str().unwrap(),
                entry["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("approval_requested", "requested"),
            ("approval_resolved", "approved"),
            ("call_refused", "not_run")
        ],
        "{audit:?}"
    );
    assert!(audit[2]["toolCallId"].is_string(), "{}", audit[2]);
    assert_eq!(audit[2]["toolCallId"], audit[1]["toolCallId"]);
    assert_eq!(audit[2]["tool"], "delete_file");
    assert!(
        audit[2]["reason"]
            .as_str()
            .unwrap()
            .contains("changed after approval was asked"),
        "{}",
        audit[2]
    );
}

/// A resume's answers are in the audit log as a decision on the approval API is: one entry per interrupt, about the
/// interrupted run and its call, with the outcome and who sent it. Before, an accepted resume left only the
/// interrupt's `requested` entry: the log never said how it ended, nor who decided.
#[tokio::test]
async fn a_resumes_answers_are_in_the_audit_log_with_who_sent_them() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("b.txt"), "b").unwrap();
    let first = agui(
        &app,
        start("thread-audited", "run-1", "delete a.txt and delete b.txt"),
    )
    .await;
    let interrupts = first.interrupts();
    assert_eq!(interrupts.len(), 2);
    let second = agui(
        &app,
        resume(
            "thread-audited",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0]), deny(&interrupts[1], "keep b")]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    let resolved: Vec<Value> = app
        .audit("runId=run-1")
        .await
        .into_iter()
        .filter(|entry| entry["kind"] == "approval_resolved")
        .collect();
    let mut outcomes: Vec<(String, String, String)> = resolved
        .iter()
        .map(|entry| {
            assert_eq!(entry["sessionId"], "thread-audited", "{entry}");
            assert_eq!(entry["runId"], "run-1", "{entry}");
            assert!(entry["argumentsDigest"].is_string(), "{entry}");
            (
                entry["toolCallId"].as_str().unwrap().to_owned(),
                entry["outcome"].as_str().unwrap().to_owned(),
                entry["actor"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    outcomes.sort();
    let call = |interrupt: &Value| interrupt["toolCallId"].as_str().unwrap().to_owned();
    let mut expected = vec![
        (
            call(&interrupts[0]),
            "approved".to_owned(),
            "local".to_owned(),
        ),
        (
            call(&interrupts[1]),
            "denied".to_owned(),
            "local".to_owned(),
        ),
    ];
    expected.sort();
    assert_eq!(outcomes, expected, "{resolved:#?}");
}

/// A deny rule added while an interrupt waits refuses the call its resume approves: a rule beats a person. Before,
/// an approved resume ran it.
#[tokio::test]
async fn a_resume_does_not_run_what_a_rule_added_meanwhile_denies() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let first = agui(&app, start("thread-ruled", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    let added = app
        .post_json(
            "/api/rules",
            &json!({"rule": "delete_file(a.txt)=deny:Keep it."}),
        )
        .await;
    assert_eq!(added.status(), 201);
    let second = agui(
        &app,
        resume(
            "thread-ruled",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    let results = second.of_type("TOOL_CALL_RESULT");
    assert_eq!(results.len(), 1);
    assert!(
        results[0]["content"].as_str().unwrap().contains("Keep it."),
        "{}",
        results[0]
    );
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
}

/// The snapshot that ends an interrupted run holds the results of the calls of its batch that ran already: the stream
/// sent them as `TOOL_CALL_RESULT`, and a client that keeps the snapshot as its conversation keeps them. A resume
/// with that conversation works, and its own snapshot does not repeat them.
#[tokio::test]
async fn an_interrupted_runs_snapshot_keeps_the_results_of_the_calls_that_ran() {
    let app = spawn_app().await;
    std::fs::write(app.file("b.txt"), "b").unwrap();
    let first = agui(
        &app,
        start("thread-1", "run-1", "list files and delete b.txt"),
    )
    .await;
    let results = first.of_type("TOOL_CALL_RESULT");
    assert_eq!(results.len(), 1, "{:#?}", first.events);
    let listed = results[0]["toolCallId"].clone();
    let snapshot = first.snapshot();
    let results_kept: Vec<&Value> = snapshot.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(results_kept.len(), 1, "{snapshot:#?}");
    assert_eq!(results_kept[0]["toolCallId"], listed);
    assert_eq!(results_kept[0]["id"], results[0]["messageId"]);
    assert_eq!(results_kept[0]["content"], results[0]["content"]);
    let interrupts = first.interrupts();
    assert_eq!(interrupts.len(), 1);

    let second = agui(
        &app,
        resume(
            "thread-1",
            "run-2",
            "run-1",
            snapshot,
            json!([approve(&interrupts[0])]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.finished()["outcome"]["type"], "success");
    let after = second.snapshot();
    assert_eq!(
        after
            .iter()
            .filter(|m| m["role"] == "tool" && m["toolCallId"] == listed)
            .count(),
        1,
        "{after:#?}"
    );
    assert!(!app.file("b.txt").exists());
}

/// An AG-UI client sends the whole conversation with every run, tool results included: a thread that read a file
/// of a few hundred KiB goes on. Before, every route took at most 64 KiB, and such a thread could not go on at all.
/// The limit of this route is 16 MiB; the others keep theirs.
#[tokio::test]
async fn a_conversation_with_large_tool_results_goes_on_and_its_limit_is_its_own() {
    let app = spawn_app().await;
    let read = "r".repeat(300 * 1024);
    let conversation = |content: &str| {
        json!([
            {"id": "m-1", "role": "user", "content": "read big.txt"},
            {"id": "m-2", "role": "assistant", "toolCalls": [
                {"id": "call_read", "type": "function", "function": {"name": "read_file", "arguments": r#"{"path":"big.txt"}"#}},
            ]},
            {"id": "m-3", "role": "tool", "toolCallId": "call_read", "content": content},
            {"id": "m-4", "role": "user", "content": "list files"},
        ])
    };
    let body = |messages: Value| json!({"threadId": "thread-big", "runId": "run-big", "messages": messages, "tools": [], "context": []});
    let answer = agui(&app, body(conversation(&read))).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.finished()["outcome"]["type"], "success");

    let too_large = "r".repeat(16 * 1024 * 1024);
    let refused = agui(&app, body(conversation(&too_large))).await;
    refused.refused(413, "PAYLOAD_TOO_LARGE");
    assert_eq!(
        refused.body["error"],
        "The request body is larger than 16777216 bytes."
    );
    // The other routes keep their 64 KiB.
    let response = app
        .post_json(
            "/api/agent/runs",
            &json!({"message": "list files", "sessionId": read}),
        )
        .await;
    assert_eq!(response.status(), 413);
}

#[tokio::test]
async fn a_batch_of_two_resolves_each_call_its_own_way() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("b.txt"), "b").unwrap();
    let first = agui(
        &app,
        start("thread-2", "run-1", "delete a.txt and delete b.txt"),
    )
    .await;
    let interrupts = first.interrupts();
    assert_eq!(interrupts.len(), 2);
    let second = agui(
        &app,
        resume(
            "thread-2",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0]), deny(&interrupts[1], "b is needed")]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert!(!app.file("a.txt").exists());
    assert_eq!(std::fs::read_to_string(app.file("b.txt")).unwrap(), "b");
    let denied = second
        .of_type("TOOL_CALL_RESULT")
        .into_iter()
        .find(|e| e["toolCallId"] == interrupts[1]["toolCallId"])
        .unwrap()
        .clone();
    let output: Value = serde_json::from_str(denied["content"].as_str().unwrap()).unwrap();
    assert_eq!(output["error"]["code"], "APPROVAL_DENIED");
    assert_eq!(
        output["error"]["message"],
        "The user denied this tool call: b is needed. The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer."
    );
}

#[tokio::test]
async fn approved_edited_arguments_run_instead_and_the_model_is_told() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("c.txt"), "c").unwrap();
    let first = agui(&app, start("thread-3", "run-1", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    let entry = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "arguments": {"path": "c.txt"}}});
    let second = agui(
        &app,
        resume(
            "thread-3",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([entry]),
        ),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert!(app.file("a.txt").exists());
    assert!(!app.file("c.txt").exists());
    let result = second.of_type("TOOL_CALL_RESULT")[0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.contains("edited"), "{result}");
    let text: String = second
        .of_type("TEXT_MESSAGE_CONTENT")
        .iter()
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert!(text.contains("edited by a person"), "{text}");
    assert!(text.contains("c.txt"), "{text}");

    // Edited arguments that break the tool's schema are refused, and nothing runs.
    let first = agui(&app, start("thread-3b", "run-3", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    let entry = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "arguments": {"path": 7}}});
    let refused = agui(
        &app,
        resume(
            "thread-3b",
            "run-4",
            "run-3",
            first.snapshot(),
            json!([entry]),
        ),
    )
    .await;
    refused.refused(422, "INVALID_ARGUMENTS");
    assert!(app.file("a.txt").exists());
}

#[tokio::test]
async fn a_made_up_parent_run_is_refused() {
    let app = spawn_app().await;
    let first = agui(&app, start("thread-4", "run-1", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    let refused = agui(
        &app,
        resume(
            "thread-4",
            "run-2",
            "run-made-up",
            first.snapshot(),
            json!([approve(interrupt)]),
        ),
    )
    .await;
    refused.refused(404, "UNKNOWN_PARENT_RUN");
    // Another thread's run is not this thread's parent either.
    let other = agui(
        &app,
        resume(
            "thread-other",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([approve(interrupt)]),
        ),
    )
    .await;
    other.refused(409, "THREAD_MISMATCH");
}

#[tokio::test]
async fn a_history_whose_interrupted_call_was_edited_is_refused_and_executes_nothing() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("important.txt"), "keep").unwrap();
    let first = agui(&app, start("thread-5", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    let mut edited = first.snapshot();
    for message in &mut edited {
        if let Some(calls) = message.get_mut("toolCalls") {
            calls[0]["function"]["arguments"] = json!("{\"path\":\"important.txt\"}");
        }
    }
    let refused = agui(
        &app,
        resume(
            "thread-5",
            "run-2",
            "run-1",
            edited,
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    refused.refused(409, "HISTORY_MISMATCH");
    assert!(app.file("important.txt").exists() && app.file("a.txt").exists());

    // All or nothing: the interrupts are still open, and a faithful resume works.
    let honest = agui(
        &app,
        resume(
            "thread-5",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    assert_eq!(honest.status, 200, "{}", honest.body);
    assert!(!app.file("a.txt").exists());
    assert!(app.file("important.txt").exists());
}

/// A person who types instead of answering the card: the client sends the card cancelled with the new message after
/// the interrupted call (assistant-ui's "steer away"). The resumed run reads it after the call's result, and acts on
/// it. Before, the message was left unread, and the model answered as if it had not been written.
#[tokio::test]
async fn a_user_message_sent_with_a_resume_is_read_after_the_calls_results() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let first = agui(&app, start("thread-21", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    let mut steered = first.snapshot();
    steered.push(user("list files"));
    let resumed = agui(
        &app,
        resume(
            "thread-21",
            "run-2",
            "run-1",
            steered,
            json!([{"interruptId": interrupt["id"], "status": "cancelled"}]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(app.file("a.txt").exists(), "the cancelled call did not run");
    let called: Vec<&str> = resumed
        .of_type("TOOL_CALL_START")
        .iter()
        .filter_map(|event| event["toolCallName"].as_str())
        .collect();
    assert_eq!(called, ["list_files"], "{}", resumed.body);
}

/// A model may send blank arguments for a call that takes none; the call runs with an empty object, and approval is
/// asked for that. The history the client sends back has the blank text the model sent, and its resume is taken.
/// Before, the blank text did not read as JSON, and every resume of such a call was refused as HISTORY_MISMATCH.
#[tokio::test]
async fn a_call_the_model_sent_with_blank_arguments_can_be_resumed() {
    let app = spawn_app_with(|config| config.policy = agent::wire::ApprovalPolicy::Strict).await;
    let first = agui(&app, start("thread-blank", "run-1", "call list_files {}")).await;
    let interrupt = first.interrupts()[0].clone();
    let mut history = first.snapshot();
    let mut blanked = 0;
    for message in &mut history {
        if let Some(calls) = message.get_mut("toolCalls") {
            calls[0]["function"]["arguments"] = json!("");
            blanked += 1;
        }
    }
    assert_eq!(blanked, 1);
    let resumed = agui(
        &app,
        resume(
            "thread-blank",
            "run-2",
            "run-1",
            history,
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert_eq!(resumed.finished()["outcome"]["type"], "success");
}

/// A resume that passes its check but names a run id already in use is refused when it starts: nothing runs, its
/// interrupts stay open, and the refusal is in the audit log like that of any refused resume.
#[tokio::test]
async fn a_resume_under_a_run_id_in_use_is_refused_audited_and_leaves_its_interrupts_open() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "").unwrap();
    let first = agui(&app, start("thread-7", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    let approved = || json!([approve(&interrupt)]);
    let elsewhere = agui(&app, start("thread-8", "run-9", "hello")).await;
    assert_eq!(elsewhere.status, 200, "{}", elsewhere.body);

    let taken = agui(
        &app,
        resume("thread-7", "run-9", "run-1", first.snapshot(), approved()),
    )
    .await;
    taken.refused(409, "RUN_ID_TAKEN");
    assert!(app.file("a.txt").exists());
    let entries = app.audit("outcome=run_id_taken").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["kind"], "resume_refused", "{entries:?}");
    assert_eq!(entries[0]["runId"], "run-1", "{entries:?}");
    // Without a parent named, on a thread with nothing to resume, the taken id is still what is refused.
    let mut unnamed = resume(
        "thread-fresh",
        "run-9",
        "run-1",
        first.snapshot(),
        approved(),
    );
    unnamed.as_object_mut().unwrap().remove("parentRunId");
    agui(&app, unnamed).await.refused(409, "RUN_ID_TAKEN");

    let honest = agui(
        &app,
        resume("thread-7", "run-2", "run-1", first.snapshot(), approved()),
    )
    .await;
    assert_eq!(honest.status, 200, "{}", honest.body);
    assert!(!app.file("a.txt").exists());
}

#[tokio::test]
async fn a_replayed_resume_is_refused_and_the_tool_runs_once() {
    let app = spawn_app().await;
    std::fs::write(app.file("log.txt"), "").unwrap();
    let first = agui(&app, start("thread-6", "run-1", "write log.txt: once")).await;
    let interrupt = first.interrupts()[0].clone();
    let body = resume(
        "thread-6",
        "run-2",
        "run-1",
        first.snapshot(),
        json!([approve(&interrupt)]),
    );
    let once = agui(&app, body.clone()).await;
    assert_eq!(once.status, 200);
    let again = agui(&app, body).await;
    again.refused(409, "RUN_ID_TAKEN");
    let mut replay = resume(
        "thread-6",
        "run-3",
        "run-1",
        first.snapshot(),
        json!([approve(&interrupt)]),
    );
    replay["runId"] = json!("run-3");
    let replayed = agui(&app, replay).await;
    replayed.refused(409, "RESUME_ALREADY_USED");
    assert!(
        replayed.body["error"]
            .as_str()
            .unwrap()
            .contains("already resumed by run run-2")
    );
    assert_eq!(once.of_type("TOOL_CALL_RESULT").len(), 1);
}

#[tokio::test]
async fn a_partial_batch_is_refused() {
    let app = spawn_app().await;
    let first = agui(
        &app,
        start("thread-7", "run-1", "delete a.txt and delete b.txt"),
    )
    .await;
    let interrupts = first.interrupts();
    let partial = agui(
        &app,
        resume(
            "thread-7",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0])]),
        ),
    )
    .await;
    partial.refused(422, "INCOMPLETE_RESUME");
    assert!(
        partial.body["error"]
            .as_str()
            .unwrap()
            .contains(interrupts[1]["id"].as_str().unwrap())
    );
    let twice = agui(
        &app,
        resume(
            "thread-7",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0]), approve(&interrupts[0])]),
        ),
    )
    .await;
    twice.refused(422, "DUPLICATE_RESUME_ENTRY");
    let unknown = agui(
        &app,
        resume(
            "thread-7",
            "run-4",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0]), approve(&interrupts[1]), {"interruptId": "int_nope", "status": "cancelled"}]),
        ),
    )
    .await;
    unknown.refused(422, "UNKNOWN_INTERRUPT");
    let malformed = agui(
        &app,
        resume(
            "thread-7",
            "run-5",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupts[0]), {"interruptId": interrupts[1]["id"], "status": "resolved", "payload": {"approved": "yes"}}]),
        ),
    )
    .await;
    malformed.refused(422, "INVALID_RESUME_PAYLOAD");
    // Payloads outside the interrupt's responseSchema, each refused before anything runs: a denial with a scope or
    // arguments (its branch has only a reason), and a field given as null (of none of its types).
    for (n, payload) in [
        json!({"approved": false, "scope": "once"}),
        json!({"approved": false, "arguments": {"path": "b.txt"}}),
        json!({"approved": true, "arguments": null}),
        json!({"approved": true, "scope": null}),
    ]
    .into_iter()
    .enumerate()
    {
        let outside = agui(
            &app,
            resume(
                "thread-7",
                &format!("run-outside-{n}"),
                "run-1",
                first.snapshot(),
                json!([approve(&interrupts[0]), {"interruptId": interrupts[1]["id"], "status": "resolved", "payload": payload}]),
            ),
        )
        .await;
        outside.refused(422, "INVALID_RESUME_PAYLOAD");
    }
    // Nothing of them was used: the interrupts still answer.
    let answered = agui(
        &app,
        resume(
            "thread-7",
            "run-answered",
            "run-1",
            first.snapshot(),
            json!([deny(&interrupts[0], "no"), deny(&interrupts[1], "no")]),
        ),
    )
    .await;
    assert_eq!(answered.status, 200, "{}", answered.body);
}

#[tokio::test]
async fn an_expired_interrupt_is_refused() {
    let app = spawn_app_with(|config| config.approval_timeout_secs = 1).await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let first = agui(&app, start("thread-8", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    // The interrupt expires one second after it was issued; this test has to let that second pass.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let late = agui(
        &app,
        resume(
            "thread-8",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    late.refused(410, "INTERRUPT_EXPIRED");
    assert!(app.file("a.txt").exists());
}

#[tokio::test]
async fn a_thread_waiting_for_a_resume_refuses_a_new_run_and_a_cancel_frees_it() {
    let app = spawn_app().await;
    let first = agui(&app, start("thread-9", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    let blocked = agui(&app, start("thread-9", "run-2", "list files")).await;
    blocked.refused(409, "THREAD_INTERRUPTED");
    // @ag-ui/client sends no parentRunId: the thread's open interrupts name it.
    let mut cancel = resume(
        "thread-9",
        "run-3",
        "ignored",
        first.snapshot(),
        json!([{"interruptId": interrupt["id"], "status": "cancelled"}]),
    );
    cancel.as_object_mut().unwrap().remove("parentRunId");
    let cancelled = agui(&app, cancel).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let output: Value = serde_json::from_str(
        cancelled.of_type("TOOL_CALL_RESULT")[0]["content"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(output["error"]["code"], "APPROVAL_DENIED");
    let next = agui(&app, start("thread-9", "run-4", "list files")).await;
    assert_eq!(next.finished()["outcome"]["type"], "success");
}

#[tokio::test]
async fn the_same_policy_rules_and_session_grants_apply() {
    let app = spawn_app_with(|config| config.rules = "run_command=deny".parse().unwrap()).await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    std::fs::write(app.file("b.txt"), "b").unwrap();
    // Read-only tools run at once: no interrupt.
    let read = agui(&app, start("thread-10", "run-1", "read a.txt")).await;
    assert_eq!(read.finished()["outcome"]["type"], "success");
    // A denying rule is a recoverable output, never an interrupt.
    let denied = agui(&app, start("thread-10", "run-2", "run ls")).await;
    assert_eq!(denied.finished()["outcome"]["type"], "success");
    assert!(
        denied.of_type("TOOL_CALL_RESULT")[0]["content"]
            .as_str()
            .unwrap()
            .contains("PERMISSION_DENIED")
    );
    // Approving for the session lets the thread's next call of that tool run without an interrupt; the interrupt says
    // so, in the card's words, before anyone approves.
    let first = agui(&app, start("thread-10", "run-3", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    let covers = interrupt["metadata"]["session"]["covers"]
        .as_str()
        .unwrap_or_default();
    assert!(covers.contains("any path in the workspace"), "{interrupt}");
    assert_eq!(
        interrupt["responseSchema"]["oneOf"][0]["properties"]["scope"]["enum"],
        json!(["once", "session"])
    );
    let entry = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session"}});
    let resumed = agui(
        &app,
        resume(
            "thread-10",
            "run-4",
            "run-3",
            first.snapshot(),
            json!([entry]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200);
    let next = agui(&app, start("thread-10", "run-5", "delete b.txt")).await;
    assert_eq!(next.finished()["outcome"]["type"], "success");
    assert!(!app.file("b.txt").exists());
}

/// An interrupt a rule asked for cannot be approved for the session, as its card on the approval API offers no such
/// approval: the rule asks again before any grant is read. The resume is refused and uses nothing; approved once, it
/// runs. Before, the resume was taken, a grant was stored and announced, and the next identical call asked anyway.
#[tokio::test]
async fn an_interrupt_a_rule_asked_for_cannot_be_approved_for_the_session() {
    let app = spawn_app_with(|config| {
        config.rules = "delete_file(a.txt)=ask:Always ask about a.txt."
            .parse()
            .unwrap();
    })
    .await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let first = agui(&app, start("thread-asked", "run-1", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    // Its schema offers `once` alone, and says why: a client does not offer what would be refused.
    assert_eq!(
        interrupt["responseSchema"]["oneOf"][0]["properties"]["scope"]["enum"],
        json!(["once"]),
        "{interrupt}"
    );
    assert!(
        interrupt["metadata"].get("session").is_none(),
        "{interrupt}"
    );
    let note = interrupt["metadata"]["sessionNote"]
        .as_str()
        .unwrap_or_default();
    assert!(note.contains("delete_file(a.txt)=ask"), "{interrupt}");
    let for_session = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session"}});
    let refused = agui(
        &app,
        resume(
            "thread-asked",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([for_session]),
        ),
    )
    .await;
    refused.refused(422, "INVALID_RESUME_PAYLOAD");
    let message = refused.body["error"].as_str().unwrap();
    assert!(message.contains("delete_file(a.txt)=ask"), "{message}");
    let grants: Value = app
        .get("/api/agent/sessions/thread-asked/grants")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(grants["grants"], json!([]), "{grants}");
    let resumed = agui(
        &app,
        resume(
            "thread-asked",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([approve(interrupt)]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(!app.file("a.txt").exists());
}

/// A resume is decided against what the interrupt offered when it was issued, as a card is: a rule removed since
/// does not make the session scope it kept from the interrupt available to the resume.
#[tokio::test]
async fn a_resume_may_not_take_a_session_scope_the_interrupt_did_not_offer_after_the_rules_changed()
{
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let added = app
        .post_json("/api/rules", &json!({"rule": "delete_file(a.txt)=ask"}))
        .await;
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    let first = agui(&app, start("thread-changed", "run-1", "delete a.txt")).await;
    let interrupt = &first.interrupts()[0];
    assert_eq!(
        interrupt["responseSchema"]["oneOf"][0]["properties"]["scope"]["enum"],
        json!(["once"]),
        "{interrupt}"
    );
    // The rule goes: a card shown now would offer the session, but this interrupt did not.
    let removed = app
        .client
        .delete(app.url(&format!(
            "/api/rules/{}",
            added["rule"]["id"].as_str().unwrap()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let for_session = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session"}});
    let refused = agui(
        &app,
        resume(
            "thread-changed",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([for_session]),
        ),
    )
    .await;
    refused.refused(422, "INVALID_RESUME_PAYLOAD");
    let message = refused.body["error"].as_str().unwrap();
    assert!(
        message.contains("was not offered for this call"),
        "{message}"
    );
    assert!(app.file("a.txt").exists());
    let grants: Value = app
        .get("/api/agent/sessions/thread-changed/grants")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(grants["grants"], json!([]), "{grants}");
}

#[tokio::test]
async fn approving_a_command_for_the_session_covers_that_command_and_no_other() {
    let app = spawn_app().await;
    std::fs::create_dir(app.file("x")).unwrap();
    let first = agui(&app, start("thread-ls", "run-1", "run ls")).await;
    let interrupt = &first.interrupts()[0];
    // A wider scope than the interrupt's schema offers is refused, and uses nothing.
    let wider = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session_program"}});
    agui(
        &app,
        resume(
            "thread-ls",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([wider]),
        ),
    )
    .await
    .refused(422, "INVALID_RESUME_PAYLOAD");
    // So is an edit that would make another grant than the one offered (another command), and uses nothing.
    let edited = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session", "arguments": {"command": "rm", "args": ["-rf", "x"]}}});
    let refused = agui(
        &app,
        resume(
            "thread-ls",
            "run-2b",
            "run-1",
            first.snapshot(),
            json!([edited]),
        ),
    )
    .await;
    refused.refused(422, "INVALID_RESUME_PAYLOAD");
    let message = refused.body["error"].as_str().unwrap();
    assert!(
        message.contains("would allow something else than the card offered"),
        "{message}"
    );
    let entry = json!({"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true, "scope": "session"}});
    let resumed = agui(
        &app,
        resume(
            "thread-ls",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([entry]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200);
    let grants: Value = app
        .get("/api/agent/sessions/thread-ls/grants")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        grants["grants"][0]["scope"],
        json!({"type": "command", "command": "ls", "args": []})
    );
    let again = agui(&app, start("thread-ls", "run-4", "run ls")).await;
    assert_eq!(again.finished()["outcome"]["type"], "success");
    let other = agui(&app, start("thread-ls", "run-5", "run rm -rf x")).await;
    assert_eq!(other.finished()["outcome"]["type"], "interrupt");
    assert!(app.file("x").exists());
}

#[tokio::test]
async fn malformed_input_is_400() {
    let app = spawn_app().await;
    let bad = agui(&app, json!({"threadId": "t", "messages": []})).await;
    bad.refused(400, "INVALID_INPUT");
    let bad = agui(
        &app,
        json!({"threadId": "t t", "runId": "r", "messages": []}),
    )
    .await;
    bad.refused(400, "INVALID_INPUT");
    let no_user = agui(&app, json!({"threadId": "t", "runId": "r", "messages": []})).await;
    no_user.refused(422, "NO_USER_MESSAGE");
}

#[tokio::test]
async fn a_resume_that_cannot_start_uses_nothing_and_can_be_sent_again() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "a").unwrap();
    let first = agui(&app, start("thread-11", "run-1", "delete a.txt")).await;
    let interrupt = first.interrupts()[0].clone();
    // Another client keeps the thread busy through the REST API (the thread is the session).
    let busy = app
        .create_run(json!({"message": "delete b.txt", "sessionId": "thread-11"}))
        .await;
    let mut events = app.events(&busy, None).await;
    events.until("approvalRequired").await;

    let refused = agui(
        &app,
        resume(
            "thread-11",
            "run-2",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    refused.refused(409, "THREAD_BUSY");
    assert!(app.file("a.txt").exists());

    // Once the thread is free, the same interrupt is still open and the resume goes through.
    let cancelled = app
        .post_json(&format!("/api/agent/runs/{busy}/cancel"), &json!({}))
        .await;
    assert_eq!(cancelled.status(), 200);
    events.until("error").await;
    let resumed = agui(
        &app,
        resume(
            "thread-11",
            "run-3",
            "run-1",
            first.snapshot(),
            json!([approve(&interrupt)]),
        ),
    )
    .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(!app.file("a.txt").exists());
}
