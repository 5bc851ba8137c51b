//! The durable default against the real binary: what a restart (clean, or `kill -9` in the middle of anything)
//! keeps, what it ends, and what it never does twice. The SQLite file is the default one, beside where toolgate
//! runs; every restart is a new process on the same file.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::helpers::{PATIENCE, SseEvent, eventually, names};
use crate::process::{EXIT_WITHIN, Home, Server, toolgate_in};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// The events of a run that ended, from the start.
async fn all_events(server: &Server, run_id: &str) -> Vec<SseEvent> {
    server.events(run_id, None).await.rest().await
}

async fn audit(server: &Server, query: &str) -> Vec<Value> {
    let body = server.get_json(&format!("/api/audit{query}")).await;
    assert_eq!(body["ok"], true, "{body}");
    body["entries"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_approval_pending_at_a_kill_is_pending_after_the_restart_and_its_tool_runs_once() {
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[]).await;
    let run_id = server
        .create_run(json!({"message": "write notes.txt: hello"}))
        .await;
    let mut stream = server.events(&run_id, None).await;
    let required = stream.until("approvalRequired").await;
    let seen = required.id;
    let before = server.pending().await;
    assert_eq!(before.len(), 1);
    drop(stream);
    server.kill9().await;

    let server = Server::start_in(&home, &[], &[]).await;
    let after = server.pending().await;
    assert_eq!(after, before, "the same card, with the same expiry");
    let call_id = after[0]["toolCallId"].as_str().unwrap();
    let decided = server
        .post_json(
            &format!("/api/agent/approvals/{run_id}/{call_id}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(decided.status(), 200);
    // The stream resumes from the last event the client saw, across the restart.
    let rest = server.events(&run_id, Some(seen)).await.rest().await;
    assert_eq!(rest.first().unwrap().id, seen + 1, "nothing missed");
    assert_eq!(
        names(&rest)
            .into_iter()
            .filter(|n| *n != "assistantDelta")
            .collect::<Vec<_>>(),
        ["approvalResolved", "toolResult", "step", "done"]
    );
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("notes.txt")).unwrap(),
        "hello"
    );
    let results = all_events(&server, &run_id)
        .await
        .into_iter()
        .filter(|e| e.name == "toolResult")
        .count();
    assert_eq!(results, 1, "the approved tool ran once");
    let second = server
        .post_json(
            &format!("/api/agent/approvals/{run_id}/{call_id}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(second.status(), 404);
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_clean_shutdown_keeps_what_waits_and_a_page_reload_after_it_shows_the_same() {
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[]).await;
    let session = "durable-session";
    let run_id = server
        .create_run(json!({"message": "delete gone.txt", "sessionId": session}))
        .await;
    server
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let before = server.get_json(&format!("/api/agent/runs/{run_id}")).await;
    server.signal(libc::SIGTERM);
    let (status, log) = server.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{log}");

    let server = Server::start_in(&home, &[], &[]).await;
    let after = server.get_json(&format!("/api/agent/runs/{run_id}")).await;
    assert_eq!(after, before, "the run reads the same after the restart");
    assert_eq!(
        server.pending().await.len(),
        1,
        "a graceful shutdown ends no waiting run"
    );
    // The page draws the session from the store.
    let page = client()
        .get(server.url("/"))
        .header("cookie", format!("toolgate_session={session}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("delete gone.txt"), "the transcript is there");
    assert!(page.contains("approval-card"), "the card is there");
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_run_killed_in_a_model_step_ends_restarted_and_its_session_goes_on() {
    let home = Home::new();
    let server = Server::start_in(&home, &["--scripted-delay-ms", "300"], &[]).await;
    let session = "session-after-a-crash";
    let run_id = server
        .create_run(json!({"message": "hello there", "sessionId": session}))
        .await;
    let mut stream = server.events(&run_id, None).await;
    stream.until("assistantDelta").await;
    drop(stream);
    server.kill9().await;

    let server = Server::start_in(&home, &[], &[]).await;
    let ended = all_events(&server, &run_id).await;
    let last = ended.last().unwrap();
    assert_eq!(last.name, "error");
    assert_eq!(last.data["code"], "RESTARTED", "{:?}", last.data);
    let next = server
        .create_run(json!({"message": "hello again", "sessionId": session}))
        .await;
    let next = all_events(&server, &next).await;
    assert_eq!(next.last().unwrap().name, "done", "the session is usable");
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_tool_killed_while_it_ran_is_recorded_as_interrupted_and_never_run_again() {
    let home = Home::new();
    let server = Server::start_in(&home, &["--policy", "trusted"], &[]).await;
    let run_id = server
        .create_run(json!({"message": "run sh -c 'echo ran >> runs.txt; sleep 37'"}))
        .await;
    let workspace = server.workspace();
    eventually("the command to start", async || {
        std::fs::read_to_string(workspace.join("runs.txt")).ok()
    })
    .await;
    server.kill9().await;
    // What the dead server's command left running is not this test's subject: stop it.
    let _ = std::process::Command::new("pkill")
        .args(["-fx", "sleep 37"])
        .status();

    let server = Server::start_in(&home, &["--policy", "trusted"], &[]).await;
    let events = all_events(&server, &run_id).await;
    let result = events
        .iter()
        .find(|e| e.name == "toolResult")
        .expect("the interrupted call has a result");
    let message = result.data["output"]["message"].as_str().unwrap();
    assert!(
        message.contains("was interrupted") && message.contains("its effect is unknown"),
        "{message}"
    );
    assert_eq!(events.last().unwrap().data["code"], "RESTARTED");
    let interrupted = audit(&server, &format!("?runId={run_id}&outcome=interrupted")).await;
    assert_eq!(interrupted.len(), 1, "the audit log says so");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read_to_string(workspace.join("runs.txt")).unwrap(),
        "ran\n",
        "the command ran once, before the kill, and never again"
    );
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

/// One AG-UI request's status and events.
async fn agui(server: &Server, body: Value) -> (u16, Vec<Value>, Value) {
    let response = server.post_json("/api/agui", body).await;
    let status = response.status().as_u16();
    if status != 200 {
        return (
            status,
            Vec::new(),
            response.json().await.unwrap_or(Value::Null),
        );
    }
    let mut stream = response.bytes_stream().eventsource();
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(PATIENCE, stream.next()).await.unwrap() {
        events.push(serde_json::from_str(&event.unwrap().data).unwrap());
    }
    (status, events, Value::Null)
}

#[tokio::test]
async fn an_agui_interrupt_issued_before_a_kill_is_resumed_once_after_it() {
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[]).await;
    std::fs::write(server.workspace().join("a.txt"), "a").unwrap();
    let start = json!({"threadId": "t", "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "delete a.txt"}], "tools": [], "context": []});
    let (status, events, _) = agui(&server, start).await;
    assert_eq!(status, 200);
    let finished = events.last().unwrap();
    let interrupt = finished["outcome"]["interrupts"][0].clone();
    let snapshot = events
        .iter()
        .find(|e| e["type"] == "MESSAGES_SNAPSHOT")
        .unwrap()["messages"]
        .clone();
    server.kill9().await;

    let server = Server::start_in(&home, &[], &[]).await;
    let resume = |run: &str| {
        json!({"threadId": "t", "runId": run, "parentRunId": "r1", "messages": snapshot.clone(),
               "resume": [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": true}}],
               "tools": [], "context": []})
    };
    let (status, events, _) = agui(&server, resume("r2")).await;
    assert_eq!(status, 200);
    let result = events
        .iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .expect("the tool ran");
    assert!(
        !result["content"].as_str().unwrap().contains("error"),
        "{result}"
    );
    assert!(!server.workspace().join("a.txt").exists());
    let (status, _, body) = agui(&server, resume("r3")).await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "RESUME_ALREADY_USED");
    let refused = audit(&server, "?outcome=resume_already_used").await;
    assert_eq!(refused.len(), 1, "a refused resume is in the audit log");
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn the_audit_log_names_who_decided_from_the_token_never_from_the_body() {
    let token = "tg-audit-0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[("TOOLGATE_TOKEN", token)]).await;
    let bearer = |request: reqwest::RequestBuilder| request.bearer_auth(token);
    let start = |message: &str| {
        bearer(client().post(server.url("/api/agent/runs")))
            .json(&json!({"message": message}))
            .send()
    };
    let run_id = |response: reqwest::Response| async move {
        let body: Value = response.json().await.unwrap();
        body["runId"].as_str().unwrap().to_owned()
    };
    let first = run_id(start("delete a.txt").await.unwrap()).await;
    let pending_call = |run: String| {
        let request =
            bearer(client().get(server.url(&format!("/api/agent/approvals?runId={run}"))));
        async move {
            eventually("the approval", async || {
                let body: Value = request.try_clone()?.send().await.ok()?.json().await.ok()?;
                body["pending"][0]["toolCallId"].as_str().map(str::to_owned)
            })
            .await
        }
    };
    let call = pending_call(first.clone()).await;
    // A body that says who it is from is refused: the identity is the authentication's.
    let forged = bearer(client().post(server.url(&format!("/api/agent/approvals/{first}/{call}"))))
        .json(&json!({"decision": "approve", "actor": "mallory"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 400);
    let approved =
        bearer(client().post(server.url(&format!("/api/agent/approvals/{first}/{call}"))))
            .json(&json!({"decision": "approve", "scope": "session"}))
            .send()
            .await
            .unwrap();
    assert_eq!(approved.status(), 200);

    let second = run_id(start("write b.txt: x").await.unwrap()).await;
    let call = pending_call(second.clone()).await;
    let denied =
        bearer(client().post(server.url(&format!("/api/agent/approvals/{second}/{call}"))))
            .json(&json!({"decision": "deny", "reason": "not now"}))
            .send()
            .await
            .unwrap();
    assert_eq!(denied.status(), 200);

    let entries: Value = bearer(client().get(server.url("/api/audit")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = entries["entries"].as_array().unwrap();
    let outcomes: Vec<(&str, &str, Option<&str>)> = entries
        .iter()
        .map(|e| {
            (
                e["outcome"].as_str().unwrap(),
                e["tool"].as_str().unwrap_or_default(),
                e["actor"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("requested", "delete_file", None),
            ("approved", "delete_file", Some("token")),
            ("requested", "write_file", None),
            ("denied", "write_file", Some("token")),
        ]
    );
    assert_eq!(entries[1]["scope"], "session");
    assert!(entries[0]["argumentsDigest"].as_str().unwrap().len() == 64);
    assert_eq!(
        entries[3]["reason"],
        "The user denied this tool call: not now"
    );
    assert!(entries.iter().all(|e| e["sessionId"].is_string()));

    // `toolgate audit` reads the same log beside the running server, as JSON lines.
    let output = toolgate_in(home.path(), &["audit", "--outcome", "denied"], &[])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["runId"], second.as_str());
    // The database named after the subcommand, as `toolgate audit --help` shows it.
    let named = toolgate_in(
        home.path(),
        &[
            "audit",
            "--outcome",
            "denied",
            "--database-url",
            "sqlite://toolgate.db",
        ],
        &[],
    )
    .output()
    .await
    .unwrap();
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    assert_eq!(named.stdout, output.stdout);
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

/// A server that cannot listen on its port starts nothing: it opens no database, so it neither goes on with waiting
/// runs (approved calls would start, approvals time out) nor leaves them half done as it exits.
#[tokio::test]
async fn a_server_whose_port_is_taken_says_so_and_opens_no_database() {
    let home = Home::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let refused = toolgate_in(home.path(), &["--addr", &addr], &[])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&addr), "{stderr}");
    assert!(
        !home.path().join("toolgate.db").exists(),
        "the database was opened: {stderr}"
    );
}

#[tokio::test]
async fn a_second_server_on_the_same_file_refuses_to_start_and_says_why() {
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[]).await;
    let second = toolgate_in(home.path(), &["--addr", "127.0.0.1:0"], &[])
        .output()
        .await
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("another toolgate process is using the database")
            && stderr.contains(&format!("by process {}", server.pid())),
        "{stderr}"
    );
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_pending_approval_past_its_expiry_across_a_restart_times_out() {
    let home = Home::new();
    let args = ["--approval-timeout-secs", "2"];
    let server = Server::start_in(&home, &args, &[]).await;
    let run_id = server.create_run(json!({"message": "delete x.txt"})).await;
    server
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    server.kill9().await;
    tokio::time::sleep(Duration::from_millis(2_200)).await;

    let server = Server::start_in(&home, &args, &[]).await;
    let events = all_events(&server, &run_id).await;
    let resolved = events
        .iter()
        .find(|e| e.name == "approvalResolved")
        .expect("resolved");
    assert_eq!(resolved.data["resolution"]["source"], "timeout");
    assert_eq!(events.last().unwrap().name, "done");
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

/// Streams `message` in `session` until its first card, and returns the request.
async fn until_card(server: &Server, session: &str, message: &str) -> Value {
    let run_id = server
        .create_run(json!({"message": message, "sessionId": session}))
        .await;
    server
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await
        .data["request"]
        .clone()
}

/// Runs `message` in `session` to its end and returns the names of its events.
async fn run_in_session(server: &Server, session: &str, message: &str) -> Vec<String> {
    let run_id = server
        .create_run(json!({"message": message, "sessionId": session}))
        .await;
    let events = all_events(server, &run_id).await;
    assert_eq!(events.last().unwrap().name, "done", "{:?}", names(&events));
    events.into_iter().map(|e| e.name).collect()
}

#[tokio::test]
async fn a_session_grant_and_an_added_rule_survive_a_restart_and_still_cover_only_what_they_covered()
 {
    let home = Home::new();
    let server = Server::start_in(&home, &[], &[]).await;
    let session = "grants-after-restart";
    let request = until_card(&server, session, "run echo granted").await;
    let run_id = request["runId"].as_str().unwrap();
    let call_id = request["toolCallId"].as_str().unwrap();
    let decided = server
        .post_json(
            &format!("/api/agent/approvals/{run_id}/{call_id}"),
            json!({"decision": "approve", "scope": "session"}),
        )
        .await;
    assert_eq!(decided.status(), 200);
    all_events(&server, run_id).await;
    let grants_path = format!("/api/agent/sessions/{session}/grants");
    let before = server.get_json(&grants_path).await["grants"].clone();
    assert_eq!(before.as_array().unwrap().len(), 1, "{before}");
    let added = server
        .post_json("/api/rules", json!({"rule": "write_file(kept.txt)=allow"}))
        .await;
    assert_eq!(added.status(), 201);
    server.kill9().await;

    let server = Server::start_in(&home, &[], &[]).await;
    assert_eq!(
        server.get_json(&grants_path).await["grants"],
        before,
        "the same grant, listed the same"
    );
    let rules = server.get_json("/api/rules").await["rules"].clone();
    assert_eq!(rules[0]["rule"], "write_file(kept.txt)=allow");
    assert_eq!(rules[0]["origin"], "added");
    let again = run_in_session(&server, session, "run echo granted").await;
    assert!(
        !again.iter().any(|name| name == "approvalRequired"),
        "the grant still applies: {again:?}"
    );
    let written = run_in_session(&server, "another-session", "write kept.txt: hi").await;
    assert!(
        !written.iter().any(|name| name == "approvalRequired"),
        "the rule still applies: {written:?}"
    );
    assert_eq!(
        until_card(&server, session, "run echo other").await["toolName"],
        "run_command",
        "another command still asks"
    );
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;

    // `toolgate rules check` reads the added rule beside (or after) the server, from the same database.
    let output = toolgate_in(
        home.path(),
        &[
            "rules",
            "check",
            "write_file",
            r#"{"path": "kept.txt", "content": "x"}"#,
        ],
        &[],
    )
    .output()
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.starts_with(
            "allow: The rule write_file(kept.txt)=allow allows this call.\ndecided by: the rule write_file(kept.txt)=allow (rule_"
        ) && stdout.ends_with(", added by a person)\n"),
        "{stdout}"
    );
}
