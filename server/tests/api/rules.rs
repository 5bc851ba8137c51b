//! Rules that read the arguments, session grants that cover what the card showed, "Always allow", and
//! `toolgate rules check`, over real HTTP (and the real binary).

use serde_json::{Value, json};

use crate::helpers::{SseStream, TestApp, names, spawn_app, spawn_app_with};

/// Runs `message` fail-closed (no person) and returns the response's status and body.
async fn run_to_end(app: &TestApp, message: &str) -> (u16, Value) {
    let response = app
        .post_json("/api/agent", &json!({"message": message}))
        .await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Streams `message` in `session` until the first card, returning the stream and the approval request.
async fn until_card(app: &TestApp, session: &str, message: &str) -> (SseStream, Value) {
    let mut stream = app
        .stream(json!({"message": message, "sessionId": session}))
        .await;
    let required = stream.until("approvalRequired").await;
    (stream, required.data["request"].clone())
}

/// Streams `message` in `session` to its end and returns every event's data.
async fn run_in_session(app: &TestApp, session: &str, message: &str) -> Vec<Value> {
    let mut stream = app
        .stream(json!({"message": message, "sessionId": session}))
        .await;
    let events = stream.rest().await;
    assert_eq!(
        events.last().map(|e| e.name.as_str()),
        Some("done"),
        "{:?}",
        names(&events)
    );
    events.into_iter().map(|e| e.data).collect()
}

fn asked(events: &[Value]) -> bool {
    events.iter().any(|e| e["type"] == "approvalRequired")
}

async fn decide(app: &TestApp, request: &Value, body: Value) -> reqwest::Response {
    app.decide(
        request["runId"].as_str().unwrap(),
        request["toolCallId"].as_str().unwrap(),
        body,
    )
    .await
}

#[tokio::test]
async fn an_allowed_command_runs_without_a_card_and_another_still_asks() {
    let app = spawn_app_with(|config| {
        config.rules = "run_command(echo hello)=allow".parse().unwrap();
    })
    .await;
    let (status, body) = run_to_end(&app, "run echo hello world").await;
    assert_eq!(status, 200, "{body}");
    let call = &body["steps"][0]["toolCalls"][0];
    assert_eq!(call["permission"]["type"], "allow");
    assert_eq!(
        call["permission"]["reason"],
        "The rule run_command(echo hello)=allow allows this call."
    );
    assert_eq!(call["output"]["content"]["stdout"], "hello world\n");

    for other in ["run echo goodbye", "run echo", "run sh -c 'echo hello'"] {
        let (status, body) = run_to_end(&app, other).await;
        assert_eq!(status, 403, "{other}: {body}");
        assert_eq!(body["code"], "APPROVAL_REQUIRED");
    }
}

#[tokio::test]
async fn a_denied_path_is_refused_with_the_rules_reason() {
    let app = spawn_app_with(|config| {
        config.rules = "read_file(**/.env*)=deny:Secrets stay on this machine."
            .parse()
            .unwrap();
    })
    .await;
    std::fs::create_dir(app.file("src")).unwrap();
    std::fs::write(app.file(".env"), "API_KEY=sk-very-secret").unwrap();
    for path in [".env", "./src/../.env"] {
        let (status, body) = run_to_end(&app, &format!("read {path}")).await;
        assert_eq!(status, 200, "{body}");
        let call = &body["steps"][0]["toolCalls"][0];
        assert_eq!(call["permission"]["type"], "deny", "{path}");
        assert_eq!(
            call["output"],
            json!({"status": "error", "code": "PERMISSION_DENIED", "message": "Secrets stay on this machine."}),
            "{path}"
        );
        assert!(!body.to_string().contains("sk-very-secret"));
    }
}

#[tokio::test]
async fn a_path_cannot_climb_out_of_an_allowed_directory() {
    let app = spawn_app_with(|config| {
        config.rules = "write_file(src/**)=allow".parse().unwrap();
    })
    .await;
    std::fs::create_dir(app.file("src")).unwrap();
    let (status, _) = run_to_end(&app, "write src/main.rs: fn main() {}").await;
    assert_eq!(status, 200);
    assert!(app.file("src/main.rs").exists());
    let (status, body) = run_to_end(&app, "write src/../.env: EVIL=1").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "APPROVAL_REQUIRED");
    assert!(!app.file(".env").exists());
}

#[tokio::test]
async fn always_allow_runs_the_same_call_without_a_card_while_another_still_asks() {
    let app = spawn_app().await;
    let (mut stream, request) = until_card(&app, "always", "run ls -la").await;
    let rule = request["choices"]["alwaysAllow"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(rule, "run_command(ls -la $)=allow");

    // The person confirms the rule text: the page adds it, then approves the call.
    let added = app.post_json("/api/rules", &json!({ "rule": rule })).await;
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(added["rule"]["rule"], rule);
    assert_eq!(added["rule"]["origin"], "added");
    assert_eq!(added["rule"]["removable"], true);
    assert_eq!(
        decide(&app, &request, json!({"decision": "approve"}))
            .await
            .status(),
        200
    );
    stream.until("done").await;

    let again = run_in_session(&app, "always", "run ls -la").await;
    assert!(!asked(&again), "the same call runs without a card");
    let other = until_card(&app, "other", "run ls -la ..").await.1;
    assert_eq!(other["toolName"], "run_command");

    let listed: Value = app.get("/api/rules").await.json().await.unwrap();
    assert_eq!(listed["rules"].as_array().unwrap().len(), 1);
    let id = listed["rules"][0]["id"].as_str().unwrap().to_owned();
    let removed = app
        .client
        .delete(app.url(&format!("/api/rules/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let (status, _) = run_to_end(&app, "run ls -la").await;
    assert_eq!(status, 403, "without the rule, the call asks again");

    let audit = app.audit("outcome=added").await;
    let added = &audit[0];
    assert_eq!(added["kind"], "rule_changed");
    assert_eq!(added["reason"], rule);
    assert_eq!(added["actor"], "local");
    let audit = app.audit("outcome=removed").await;
    assert_eq!(audit[0]["reason"], rule);
}

#[tokio::test]
async fn configured_rules_are_listed_and_cannot_be_removed_and_bad_rules_are_refused() {
    let app = spawn_app_with(|config| config.rules = "delete_file=deny".parse().unwrap()).await;
    let listed: Value = app.get("/api/rules").await.json().await.unwrap();
    assert_eq!(
        listed["rules"],
        json!([{"id": "flag-1", "rule": "delete_file=deny", "action": "deny", "origin": "flag", "removable": false}])
    );
    let refused = app
        .client
        .delete(app.url("/api/rules/flag-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"],
        "Rule flag-1 (delete_file=deny) comes from --rules; it can only be removed there, and the server restarted."
    );

    let bad = app
        .post_json("/api/rules", &json!({"rule": "read_file(../secret)=allow"}))
        .await;
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert_eq!(
        body["fieldErrors"]["rule"][0],
        "rule \"read_file(../secret)=allow\": the path glob \"../secret\" leaves the workspace; paths are relative to it (no leading /, no ..)"
    );
    let duplicate = app
        .post_json("/api/rules", &json!({"rule": "delete_file=deny"}))
        .await;
    assert_eq!(duplicate.status(), 409);
    let unknown = app
        .client
        .delete(app.url("/api/rules/rule_nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let listed: Value = app.get("/api/rules").await.json().await.unwrap();
    assert_eq!(
        listed["rules"].as_array().unwrap().len(),
        1,
        "nothing changed"
    );
}

#[tokio::test]
async fn approving_ls_for_the_session_does_not_let_rm_through() {
    let app = spawn_app().await;
    std::fs::create_dir(app.file("x")).unwrap();
    let (mut stream, request) = until_card(&app, "ls-session", "run ls").await;
    let choice = &request["choices"]["session"][0];
    assert_eq!(choice["scope"], "session");
    assert_eq!(
        choice["grant"]["scope"],
        json!({"type": "command", "command": "ls", "args": []})
    );
    assert_eq!(
        decide(
            &app,
            &request,
            json!({"decision": "approve", "scope": "session"})
        )
        .await
        .status(),
        200
    );
    stream.until("done").await;

    let again = run_in_session(&app, "ls-session", "run ls").await;
    assert!(!asked(&again), "the same command runs without a card");
    let (_, card) = until_card(&app, "ls-session", "run rm -rf x").await;
    assert_eq!(
        card["arguments"],
        json!({"command": "rm", "args": ["-rf", "x"]})
    );
    assert!(app.file("x").exists(), "rm did not run");
}

#[tokio::test]
async fn grants_are_listed_in_the_events_and_over_the_api_and_revoked() {
    let app = spawn_app().await;
    let (mut stream, request) = until_card(&app, "grants", "run echo granted").await;
    decide(
        &app,
        &request,
        json!({"decision": "approve", "scope": "session"}),
    )
    .await;
    let resolved = stream.until("approvalResolved").await.data;
    let grant = &resolved["grant"];
    assert_eq!(
        grant["scope"],
        json!({"type": "command", "command": "echo", "args": ["granted"]})
    );
    assert_eq!(grant["toolName"], "run_command");
    assert_eq!(grant["specDigest"].as_str().unwrap().len(), 64);
    stream.until("done").await;

    let listed: Value = app
        .get("/api/agent/sessions/grants/grants")
        .await
        .json()
        .await
        .unwrap();
    let grants = listed["grants"].as_array().unwrap();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["id"], grant["id"]);
    assert_eq!(
        grants[0]["description"],
        "run_command: exactly “echo granted”"
    );
    assert!(!asked(
        &run_in_session(&app, "grants", "run echo granted").await
    ));

    let id = grant["id"].as_str().unwrap();
    let revoke = |app: &TestApp, id: String| {
        let request = app
            .client
            .delete(app.url(&format!("/api/agent/sessions/grants/grants/{id}")));
        async move { request.send().await.unwrap() }
    };
    let revoked = revoke(&app, id.to_owned()).await;
    assert_eq!(revoked.status(), 200);
    assert_eq!(revoke(&app, id.to_owned()).await.status(), 404);
    let listed: Value = app
        .get("/api/agent/sessions/grants/grants")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["grants"], json!([]));
    until_card(&app, "grants", "run echo granted").await;

    let audit = app.audit("outcome=revoked").await;
    let revoked = &audit[0];
    assert_eq!(revoked["kind"], "grant_revoked");
    assert_eq!(revoked["sessionId"], "grants");
    assert_eq!(revoked["reason"], "run_command: exactly “echo granted”");
    assert_eq!(revoked["actor"], "local");
    let approved = app.audit("outcome=approved&sessionId=grants").await;
    assert_eq!(approved[0]["scope"], "session");
}

#[tokio::test]
async fn a_strict_run_is_asked_even_where_a_grant_exists() {
    let app = spawn_app().await;
    let (mut stream, request) = until_card(&app, "strict", "delete a.txt").await;
    assert_eq!(
        request["choices"]["session"][0]["covers"],
        "For the rest of this session, delete_file runs without asking on any path in the workspace."
    );
    decide(
        &app,
        &request,
        json!({"decision": "approve", "scope": "session"}),
    )
    .await;
    stream.until("done").await;
    assert!(!asked(
        &run_in_session(&app, "strict", "delete b.txt").await
    ));

    let mut strict = app
        .stream(json!({"message": "delete c.txt", "sessionId": "strict", "policy": "strict"}))
        .await;
    let card = strict.until("approvalRequired").await.data["request"].clone();
    assert!(card["choices"].get("session").is_none());
    assert!(
        card["choices"]["sessionNote"]
            .as_str()
            .unwrap()
            .contains("strict policy")
    );
    let refused = decide(
        &app,
        &card,
        json!({"decision": "approve", "scope": "session"}),
    )
    .await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["fieldErrors"]["scope"][0]
            .as_str()
            .unwrap()
            .starts_with("This approval does not offer the scope session."),
        "{body}"
    );
    assert_eq!(
        decide(&app, &card, json!({"decision": "deny"}))
            .await
            .status(),
        200,
        "the refused decision left the card pending"
    );
}

#[tokio::test]
async fn the_program_scope_is_chosen_explicitly_and_never_offered_for_a_shell() {
    let app = spawn_app().await;
    let (mut stream, request) = until_card(&app, "program", "run echo one").await;
    let scopes: Vec<&str> = request["choices"]["session"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["session", "session_program"]);
    decide(
        &app,
        &request,
        json!({"decision": "approve", "scope": "session_program"}),
    )
    .await;
    stream.until("done").await;
    assert!(!asked(
        &run_in_session(&app, "program", "run echo two three").await
    ));

    let (_, shell) = until_card(&app, "program", "run sh -c 'echo hi'").await;
    assert_eq!(shell["choices"]["session"].as_array().unwrap().len(), 1);
    let refused = decide(
        &app,
        &shell,
        json!({"decision": "approve", "scope": "session_program"}),
    )
    .await;
    assert_eq!(refused.status(), 400);
}

#[tokio::test]
async fn edited_arguments_cannot_reach_a_denied_path() {
    let app = spawn_app_with(|config| {
        config.rules = "write_file(**/.env*)=deny".parse().unwrap();
    })
    .await;
    let (mut stream, request) = until_card(&app, "edits", "write notes.txt: hi").await;
    decide(
        &app,
        &request,
        json!({"decision": "approve", "arguments": {"path": ".env", "content": "EVIL=1"}}),
    )
    .await;
    let result = stream.until("toolResult").await.data;
    assert_eq!(result["output"]["code"], "PERMISSION_DENIED");
    assert!(!app.file(".env").exists());
    // Refused before its tool was called, it ran with no arguments at all (the page said the edited ones ran), and
    // the model reads that what was refused was a person's edit of its call, not its own call.
    assert!(result.get("executedArguments").is_none(), "{result}");
    let message = result["output"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("A person edited the arguments of this call before approving it")
            && message.contains(".env"),
        "{message}"
    );
    let done = stream.until("done").await;
    let told = done.data.to_string();
    assert!(told.contains("A person edited the arguments"), "{told}");
}

#[tokio::test]
async fn a_bad_rules_file_stops_startup_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\ntool = \"run_command\"\ncommand = \"git status\"\naction = \"allow\"\n\n[[rule]]\ntool = \"read_file\"\ncommand = \"cat\"\naction = \"deny\"\n",
    )
    .unwrap();
    let mut config = server::config::Config::for_tests(dir.path().join("workspace"));
    config.rules_file = Some(rules.clone());
    let error = server::startup::build(config).await.err().unwrap();
    assert_eq!(
        error.to_string(),
        format!(
            "the rules file {}: [[rule]] 2 (tool = \"read_file\"): a command prefix applies to run_command only; other tools take name=glob or a path glob",
            rules.display()
        )
    );
    assert!(
        !dir.path().join("workspace").exists(),
        "a server that does not start creates no workspace"
    );
}

#[tokio::test]
async fn rules_from_the_file_apply_and_stay_as_written_while_added_ones_go_to_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    let written = "# commands\n[[rule]]\ntool = \"run_command\"\ncommand = [\"echo\", \"from\", \"file\"]\naction = \"allow\"\n";
    std::fs::write(&rules, written).unwrap();
    let path = rules.clone();
    let app = spawn_app_with(move |config| config.rules_file = Some(path)).await;
    let (status, _) = run_to_end(&app, "run echo from file").await;
    assert_eq!(status, 200);
    let listed: Value = app.get("/api/rules").await.json().await.unwrap();
    assert_eq!(listed["rules"][0]["id"], "file-1");
    assert_eq!(listed["rules"][0]["origin"], "file");
    let refused = app
        .client
        .delete(app.url("/api/rules/file-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "RULE_NOT_REMOVABLE");
    assert_eq!(
        body["error"],
        "Rule file-1 (run_command(echo from file)=allow) comes from the rules file; it can only be removed there, and the server restarted."
    );

    let added = app
        .post_json("/api/rules", &json!({"rule": "run_command(pwd $)=allow"}))
        .await;
    assert_eq!(added.status(), 201);
    let (status, _) = run_to_end(&app, "run pwd").await;
    assert_eq!(status, 200, "the added rule applies");
    assert_eq!(
        std::fs::read_to_string(&rules).unwrap(),
        written,
        "toolgate never writes the rules file"
    );
    let kept = app.harness.store().rules().await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].rule, "run_command(pwd $)=allow");
}

async fn rules_check(home: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let output = crate::process::toolgate_in(home, args, &[])
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn rules_check_prints_the_decision_and_the_rule_that_made_it() {
    let home = tempfile::tempdir().unwrap();
    let check = |tool: &'static str, arguments: &'static str| {
        let home = home.path().to_owned();
        async move {
            rules_check(
                &home,
                &[
                    "--rules",
                    "run_command(git status)=allow,read_file(**/.env*)=deny",
                    "rules",
                    "check",
                    tool,
                    arguments,
                ],
            )
            .await
        }
    };
    let (code, stdout, _) = check(
        "run_command",
        r#"{"command": "git", "args": ["status", "--short"]}"#,
    )
    .await;
    assert_eq!(code, Some(0));
    // Nothing was made in this directory: no database, and no workspace, which checking does not make either.
    let no_database = "note: no rules people added were read (no database yet, or --database-url memory): only the configured rules were checked\n\
        note: the workspace ./workspace does not exist yet: paths were read as in an empty one\n";
    assert_eq!(
        stdout,
        format!(
            "allow: The rule run_command(git status)=allow allows this call.\ndecided by: the rule run_command(git status)=allow (flag-1, from --rules)\n{no_database}"
        )
    );
    let (_, stdout, _) = check("read_file", r#"{"path": "config/../.env"}"#).await;
    assert_eq!(
        stdout,
        format!(
            "deny: The rule read_file(**/.env*)=deny denies this call.\ndecided by: the rule read_file(**/.env*)=deny (flag-2, from --rules)\n{no_database}"
        )
    );
    let (_, stdout, _) = check("run_command", r#"{"command": "git", "args": ["push"]}"#).await;
    assert_eq!(
        stdout,
        format!(
            "ask: run_command is destructive and reaches outside the workspace.\ndecided by: the on_request policy and the tool's annotations\n{no_database}"
        )
    );
    let (code, _, stderr) = check("run_command", "not json").await;
    assert_eq!(code, Some(2));
    assert!(
        stderr.starts_with("toolgate: the arguments are not JSON"),
        "{stderr}"
    );
    assert!(
        !home.path().join("toolgate.db").exists(),
        "checking creates no database"
    );
    assert!(
        !home.path().join("workspace").exists(),
        "checking creates no workspace"
    );
    // Reading the audit log where nothing was recorded says so, rather than that it could not create the file.
    let (code, stdout, stderr) = rules_check(home.path(), &["audit"]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stderr.starts_with("toolgate: no database at ")
            && stderr.contains("toolgate.db: toolgate creates it at its first start"),
        "{stderr}"
    );
    assert!(!home.path().join("toolgate.db").exists());
}

/// `rules check` of an MCP tool, named `mcp__<server>__<tool>`, decides as the policy would with the server started:
/// as that server's tool (its trust, its rules), under the name the model sees. For a server whose long name leaves
/// the model only a digest, a server rule's `allow` glob does not meet the tool there, so the check asks as a run
/// would; before, it was read under the name as typed, and said `allow`.
#[tokio::test]
async fn rules_check_reads_an_mcp_tool_as_its_servers() {
    let home = tempfile::tempdir().unwrap();
    let long = "a-server-whose-name-is-long-enough-that-tool-names-are-cut";
    let servers = json!({"mcpServers": {
        long: {"command": "node", "args": ["server.js"], "rules": ["list_*=allow", "delete_*=deny"]},
        "fs": {"command": "node", "args": ["server.js"], "rules": ["list_*=allow"], "disabled_tools": ["list_secrets"]},
    }});
    std::fs::write(home.path().join("mcp.json"), servers.to_string()).unwrap();
    let check = |tool: String| {
        let home = home.path().to_owned();
        async move {
            let (code, stdout, stderr) = rules_check(
                &home,
                &["--mcp-config", "mcp.json", "rules", "check", &tool, "{}"],
            )
            .await;
            assert_eq!(code, Some(0), "{stderr}");
            stdout
        }
    };
    let listed = check("mcp__fs__list_dir".to_owned()).await;
    assert!(listed.starts_with("allow: "), "{listed}");
    let cut = check(format!("mcp__{long}__list_repos")).await;
    assert!(cut.starts_with("ask: "), "{cut}");
    assert!(
        cut.contains(&format!(
            "checked as the tool \"list_repos\" of the MCP server \"{long}\""
        )),
        "{cut}"
    );
    let denied = check(format!("mcp__{long}__delete_repo")).await;
    assert!(denied.starts_with("deny: "), "{denied}");
    // A tool the configuration leaves out is no tool of the server's.
    let hidden = check("mcp__fs__list_secrets".to_owned()).await;
    assert!(
        hidden.contains("toolgate has no tool named \"mcp__fs__list_secrets\""),
        "{hidden}"
    );
}

/// A kept rule this version cannot read (a newer instance's, on a shared database) makes the rules unreadable (the
/// log names it, and how to remove it); `DELETE` removes it by its id, and the rules read again.
#[tokio::test]
async fn a_kept_rule_that_does_not_read_is_named_and_can_be_removed_by_its_id() {
    let app = spawn_app().await;
    let newer = agent::store::StoredRule {
        id: "rule_newer".into(),
        rule: "write_file(notes.txt)=quarantine".into(),
        created_at: 1,
        created_by: None,
    };
    let audit = agent::store::AuditEntry::new(agent::store::AuditKind::RuleChanged, "added");
    app.harness.store().add_rule(newer, audit).await.unwrap();

    // The row's id and how to remove it go to the server's log, not to a client.
    let listed = app.get("/api/rules").await;
    assert_eq!(listed.status(), 500);
    let removed = app
        .client
        .delete(app.url("/api/rules/rule_newer"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let removed: Value = removed.json().await.unwrap();
    assert_eq!(
        removed["removed"],
        json!({"id": "rule_newer", "rule": "write_file(notes.txt)=quarantine", "origin": "added", "unreadable": true})
    );
    let listed = app.get("/api/rules").await;
    assert_eq!(listed.status(), 200);
}

/// A rule about a tool that does not exist is kept (an MCP server may add it later), and the answer says so: a typo
/// in a tool's name does not pass unseen as a rule that protects nothing.
#[tokio::test]
async fn a_rule_about_no_tool_is_kept_with_a_warning() {
    let app = spawn_app().await;
    let typo = app
        .post_json("/api/rules", &json!({"rule": "read_fle(**/.env*)=deny"}))
        .await;
    assert_eq!(typo.status(), 201);
    let typo: Value = typo.json().await.unwrap();
    let warning = typo["warnings"][0].as_str().unwrap_or_default().to_owned();
    assert!(
        warning.starts_with("No tool is named read_fle now") && warning.contains("read_file"),
        "{typo}"
    );
    let meant = app
        .post_json("/api/rules", &json!({"rule": "read_file(**/.env*)=deny"}))
        .await;
    assert_eq!(meant.status(), 201);
    let meant: Value = meant.json().await.unwrap();
    assert!(meant.get("warnings").is_none(), "{meant}");
    let globbed = app
        .post_json("/api/rules", &json!({"rule": "*_file(secrets/**)=deny"}))
        .await;
    let globbed: Value = globbed.json().await.unwrap();
    assert!(globbed.get("warnings").is_none(), "{globbed}");
}

/// A rule ending in `$` allows single values only: one written for an argument the tool's schema makes a list is
/// kept (it fails closed) with a warning that it allows no call giving it, and one for single values has none.
#[tokio::test]
async fn a_last_dollar_rule_on_a_list_argument_is_kept_with_a_warning() {
    let app = spawn_app().await;
    let listed = app
        .post_json(
            "/api/rules",
            &json!({"rule": "run_command(command=ls, args=-la, $)=allow"}),
        )
        .await;
    assert_eq!(listed.status(), 201);
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(
        listed["warnings"],
        json!([
            "A rule ending in $ allows single values only (text, a number, a flag), and run_command's schema makes args a list, an object or null: the rule allows no call that gives it."
        ]),
        "{listed}"
    );
    let single = app
        .post_json(
            "/api/rules",
            &json!({"rule": "write_file(path=notes.txt, content=*, $)=allow"}),
        )
        .await;
    assert_eq!(single.status(), 201);
    let single: Value = single.json().await.unwrap();
    assert!(single.get("warnings").is_none(), "{single}");
}

/// A configured rule that names an argument no tool it is about takes (`cmd` for `command`) meets no call: a deny
/// that protects nothing. It starts all the same, and the log says so at start; the rules API says the same of a
/// rule a person adds.
#[tokio::test]
async fn a_rule_naming_an_argument_its_tool_does_not_take_is_said_at_start_and_when_added() {
    let server = crate::process::Server::start(
        &[
            "--database-url",
            "memory",
            "--rules",
            "run_command(cmd=rm)=deny",
        ],
        &[],
    )
    .await;
    assert!(
        server.log.contains("run_command takes no argument cmd")
            && server.log.contains("the rule meets no call"),
        "{}",
        server.log
    );
    let added = server
        .post_json(
            "/api/rules",
            json!({"rule": "delete_file(file=secrets/**)=deny"}),
        )
        .await;
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(
        added["warnings"],
        json!([
            "delete_file takes no argument file (its arguments are path): the rule meets no call."
        ]),
        "{added}"
    );
}
