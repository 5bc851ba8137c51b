//! Tools from MCP servers over the real API: the same cards, decisions, rules and session grants as the built-in
//! tools, `GET /api/tools`, configuration mistakes that stop startup, and the real binary stopping its servers.
//! The servers are `@modelcontextprotocol/server-filesystem` (installed by `scripts/bootstrap.sh`) and toolgate's
//! misbehaving test server (`tools/mcp/misbehaving-server.mjs`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};
use server::config::Config;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::helpers::{PATIENCE, TestApp, spawn_app_with};

fn installed(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tools/mcp")
        .join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/bootstrap.sh, which installs the MCP test servers",
        path.display()
    );
    path.canonicalize().unwrap().display().to_string()
}

fn filesystem(extra: Value) -> Value {
    server(
        installed("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"),
        &["."],
        extra,
    )
}

fn fixture(extra: Value) -> Value {
    server(installed("misbehaving-server.mjs"), &[], extra)
}

fn server(script: String, args: &[&str], extra: Value) -> Value {
    let mut all = vec![script];
    all.extend(args.iter().map(|arg| (*arg).to_owned()));
    let mut server = json!({"command": "node", "args": all});
    if let (Value::Object(server), Value::Object(extra)) = (&mut server, extra) {
        server.extend(extra);
    }
    server
}

/// The configuration file, kept for as long as the app runs.
struct WithMcp {
    app: TestApp,
    _config: tempfile::TempDir,
}

impl std::ops::Deref for WithMcp {
    type Target = TestApp;
    fn deref(&self) -> &TestApp {
        &self.app
    }
}

fn write_config(servers: Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".mcp.json");
    std::fs::write(&path, json!({"mcpServers": servers}).to_string()).unwrap();
    (dir, path)
}

async fn spawn_with_mcp(servers: Value, configure: impl FnOnce(&mut Config)) -> WithMcp {
    let (dir, path) = write_config(servers);
    let app = spawn_app_with(|config| {
        config.mcp_config = vec![path];
        configure(config);
    })
    .await;
    WithMcp { app, _config: dir }
}

/// The pending approval's run and tool call ids.
fn ids(required: &Value) -> (String, String) {
    let request = &required["request"];
    (
        request["runId"].as_str().unwrap().to_owned(),
        request["toolCallId"].as_str().unwrap().to_owned(),
    )
}

async fn run_to_end(app: &TestApp, body: Value) -> (u16, Value) {
    let response = app.post_json("/api/agent", &body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn an_untrusted_servers_write_asks_and_runs_once_on_approval() {
    let app = spawn_with_mcp(json!({"fs": filesystem(json!({}))}), |_| {}).await;
    let mut stream = app
        .stream(json!({"message": r#"call mcp__fs__write_file {"path": "notes.txt", "content": "approved"}"#}))
        .await;
    let required = stream.until("approvalRequired").await;
    let request = &required.data["request"];
    assert_eq!(request["toolName"], "mcp__fs__write_file");
    let reason = request["reason"].as_str().unwrap();
    assert!(
        reason.contains("the MCP server fs, which is not trusted")
            && reason.contains("it claims to be not read-only, destructive, idempotent"),
        "the card shows the server and what it claims: {reason}"
    );
    // The preview names the server and shows each argument formatted for reading.
    let preview = &request["preview"];
    assert_eq!(preview["kind"], "fields", "{preview}");
    assert_eq!(preview["server"], "fs", "{preview}");
    assert!(
        preview.get("tool").is_none(),
        "the name the model sees spells the tool's own: {preview}"
    );
    let fields: Vec<(&str, &str)> = preview["fields"]
        .as_array()
        .expect("the preview lists the arguments")
        .iter()
        .map(|field| {
            (
                field["name"].as_str().unwrap_or_default(),
                field["value"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(fields.len(), 2, "{preview}");
    assert!(fields.contains(&("path", "notes.txt")), "{preview}");
    assert!(fields.contains(&("content", "approved")), "{preview}");
    assert!(
        !app.file("notes.txt").exists(),
        "nothing ran before the decision"
    );
    let (run_id, call_id) = ids(&required.data);
    let decided = app
        .decide(&run_id, &call_id, json!({"decision": "approve"}))
        .await;
    assert_eq!(decided.status(), 200);
    let events = stream.rest().await;
    let results: Vec<&Value> = events
        .iter()
        .filter(|event| event.name == "toolResult")
        .map(|event| &event.data)
        .collect();
    assert_eq!(results.len(), 1, "it ran once");
    assert_eq!(results[0]["output"]["status"], "ok");
    assert_eq!(events.last().unwrap().name, "done");
    assert_eq!(
        std::fs::read_to_string(app.file("notes.txt")).unwrap(),
        "approved"
    );
    let again = app
        .decide(&run_id, &call_id, json!({"decision": "approve"}))
        .await;
    assert_eq!(again.status(), 404, "a decision counts once");
}

#[tokio::test]
async fn a_denied_call_leaves_the_file_alone() {
    let app = spawn_with_mcp(json!({"fs": filesystem(json!({}))}), |_| {}).await;
    std::fs::write(app.file("keep.txt"), "original").unwrap();
    let mut stream = app
        .stream(json!({"message": r#"call mcp__fs__write_file {"path": "keep.txt", "content": "overwritten"}"#}))
        .await;
    let required = stream.until("approvalRequired").await;
    let (run_id, call_id) = ids(&required.data);
    app.decide(
        &run_id,
        &call_id,
        json!({"decision": "deny", "reason": "keep it"}),
    )
    .await;
    let result = stream.until("toolResult").await;
    assert_eq!(result.data["output"]["code"], "APPROVAL_DENIED");
    stream.until("done").await;
    assert_eq!(
        std::fs::read_to_string(app.file("keep.txt")).unwrap(),
        "original"
    );
}

#[tokio::test]
async fn a_trusted_servers_read_only_tool_runs_without_a_card() {
    let app = spawn_with_mcp(
        json!({"fs": filesystem(json!({"trust": "annotations"}))}),
        |_| {},
    )
    .await;
    std::fs::write(app.file("notes.txt"), "read me").unwrap();
    // Fail-closed: a call that needed a person would end the run with 403.
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fs__read_text_file {"path": "notes.txt"}"#}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["answer"].as_str().unwrap().contains("read me"),
        "{body}"
    );
    // Its destructive tools still ask.
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fs__write_file {"path": "x.txt", "content": "x"}"#}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "APPROVAL_REQUIRED");
}

#[tokio::test]
async fn rules_from_the_servers_configuration_and_from_the_flag_decide_mcp_tools() {
    let app = spawn_with_mcp(
        json!({"fs": filesystem(json!({"rules": [
            "read_text_file=allow",
            "list_directory=allow",
            "read_text_file(path=secret*)=deny:Secrets stay here."
        ]}))}),
        |config| config.rules = "mcp__fs__list_directory=deny".parse().unwrap(),
    )
    .await;
    std::fs::write(app.file("notes.txt"), "allowed by a rule").unwrap();
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fs__read_text_file {"path": "notes.txt"}"#}),
    )
    .await;
    assert_eq!(
        status, 200,
        "an untrusted tool runs when a rule allows it: {body}"
    );
    assert!(
        body["answer"]
            .as_str()
            .unwrap()
            .contains("allowed by a rule")
    );
    // A server's rule on an argument: the same tool, another path, is denied with the rule's reason.
    std::fs::write(app.file("secret.txt"), "never shown").unwrap();
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fs__read_text_file {"path": "secret.txt"}"#}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("was not run because the policy denies it")
            && !answer.contains("never shown"),
        "{body}"
    );
    // Deny beats everything: the flag's deny wins over the server's allow.
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fs__list_directory {"path": "."}"#}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["answer"]
            .as_str()
            .unwrap()
            .contains("was not run because the policy denies it"),
        "{body}"
    );
}

#[tokio::test]
async fn a_session_grant_is_lost_when_the_server_changes_the_tool() {
    let app = spawn_with_mcp(json!({"fx": fixture(json!({}))}), |_| {}).await;
    let session = "mcp-grants";
    let mut stream = app
        .stream(json!({"message": r#"call mcp__fx__echo {"text": "first"}"#, "sessionId": session}))
        .await;
    let required = stream.until("approvalRequired").await;
    let (run_id, call_id) = ids(&required.data);
    app.decide(
        &run_id,
        &call_id,
        json!({"decision": "approve", "scope": "session"}),
    )
    .await;
    stream.until("done").await;

    // Granted: the same tool runs without a card.
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fx__echo {"text": "second"}"#, "sessionId": session}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The server changes the tool (its description) and announces it.
    let mut stream = app
        .stream(json!({"message": "call mcp__fx__change_tools", "sessionId": session}))
        .await;
    let required = stream.until("approvalRequired").await;
    let (run_id, call_id) = ids(&required.data);
    app.decide(&run_id, &call_id, json!({"decision": "approve"}))
        .await;
    stream.until("done").await;
    let tools: Value = app.get("/api/tools").await.json().await.unwrap();
    let echo = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "mcp__fx__echo")
        .unwrap();
    assert_eq!(echo["description"], "Echoes the text back (version 2).");

    // The grant covered the tool as it was: the changed tool asks again.
    let (status, body) = run_to_end(
        &app,
        json!({"message": r#"call mcp__fx__echo {"text": "third"}"#, "sessionId": session}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "APPROVAL_REQUIRED");
}

#[tokio::test]
async fn api_tools_lists_every_tool_with_its_trust_and_decision_and_the_servers() {
    let app = spawn_with_mcp(
        json!({
            "fx": fixture(json!({"rules": ["fail=deny"]})),
            "trusted": fixture(json!({"trust": "annotations", "enabled_tools": ["echo"]})),
            "broken": fixture(json!({"env": {"FIXTURE_FAIL_START": "for the listing"}})),
        }),
        |_| {},
    )
    .await;
    let response = app.get("/api/tools").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let tools = body["tools"].as_array().unwrap();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    };

    let write = tool("write_file");
    assert_eq!(write["source"], "builtin");
    assert_eq!(write["trust"], "builtin");
    assert_eq!(write["decision"]["type"], "ask");
    assert_eq!(tool("read_file")["decision"]["type"], "allow");

    let echo = tool("mcp__fx__echo");
    assert_eq!(
        echo["source"],
        json!({"mcp": {"server": "fx", "tool": "echo"}})
    );
    assert_eq!(echo["trust"], "untrusted");
    assert_eq!(
        echo["annotations"]["readOnly"], true,
        "what the server claims"
    );
    assert_eq!(echo["decision"]["type"], "ask");
    assert_eq!(echo["inputSchema"]["required"], json!(["text"]));
    let fail = tool("mcp__fx__fail");
    assert_eq!(fail["rule"], "deny");
    assert_eq!(fail["decision"]["type"], "deny");
    let trusted = tool("mcp__trusted__echo");
    assert_eq!(trusted["trust"], "annotations");
    assert_eq!(trusted["decision"]["type"], "allow");
    assert!(
        tools
            .iter()
            .all(|tool| tool["name"] != "mcp__trusted__fail")
    );

    let servers = body["servers"].as_array().unwrap();
    let server = |name: &str| servers.iter().find(|s| s["name"] == name).unwrap();
    assert_eq!(server("fx")["state"], "ready");
    assert_eq!(server("trusted")["tools"], json!(["mcp__trusted__echo"]));
    let broken = server("broken");
    assert_eq!(broken["state"], "failed");
    assert_eq!(broken["transport"], "stdio");
    assert!(
        broken["stderrTail"]
            .as_str()
            .unwrap()
            .contains("refusing to start on purpose (for the listing)"),
        "{broken}"
    );
}

#[tokio::test]
async fn a_configuration_mistake_stops_startup_and_names_the_file_server_and_field() {
    let (_dir, path) = write_config(json!({"fs": {"command": "node", "trust": "total"}}));
    let workspace = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(workspace.path());
    config.mcp_config = vec![path.clone()];
    let error = server::startup::build(config)
        .await
        .err()
        .expect("startup fails");
    assert_eq!(
        error.to_string(),
        format!(
            "MCP configuration {}, server \"fs\", field \"trust\": must be \"untrusted\" (the default) or \"annotations\" (its annotations decide), not \"total\"",
            path.display()
        )
    );
}

#[tokio::test]
async fn a_required_server_that_cannot_start_stops_startup() {
    let (_dir, path) = write_config(json!({
        "needed": fixture(json!({"required": true, "env": {"FIXTURE_FAIL_START": "required"}}))
    }));
    let workspace = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(workspace.path());
    config.mcp_config = vec![path];
    let error = server::startup::build(config)
        .await
        .err()
        .expect("startup fails")
        .to_string();
    assert!(error.contains("\"needed\" is required"), "{error}");
    assert!(
        error.contains("refusing to start on purpose (required)"),
        "{error}"
    );
}

/// Waits until the process `pid` has exited, without polling: a pidfd becomes readable when it does.
async fn exited(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ESRCH)
        );
        return;
    }
    // SAFETY: the descriptor is new and ours alone, and stays open while the AsyncFd owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .unwrap();
    let _ready = tokio::time::timeout(PATIENCE, fd.readable())
        .await
        .unwrap_or_else(|_| panic!("process {pid} is still running"))
        .unwrap();
}

#[tokio::test]
async fn the_binary_keeps_the_model_key_from_mcp_servers_and_stops_them_all_on_sigterm() {
    let (_dir, path) = write_config(json!({
        "fx": fixture(json!({"trust": "annotations", "rules": ["spawn_child=allow"]}))
    }));
    let workspace = tempfile::tempdir().unwrap();
    let mut toolgate = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"));
    for (name, _) in std::env::vars() {
        if name.starts_with("TOOLGATE_") {
            toolgate.env_remove(name);
        }
    }
    let mut toolgate = toolgate
        .args([
            "--addr",
            "127.0.0.1:0",
            "--database-url",
            "memory",
            "--mcp-config",
        ])
        .arg(&path)
        .arg("--workspace")
        .arg(workspace.path())
        .env("OPENAI_API_KEY", "sk-must-not-reach-mcp-servers")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    agent::model::install_crypto_provider();
    let mut log = BufReader::new(toolgate.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = log.next_line().await.unwrap() {
            if line.contains("toolgate is ready")
                && let Some(addr) = line
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix("addr="))
            {
                return addr.to_owned();
            }
        }
        panic!("toolgate ended before it was ready");
    })
    .await
    .expect("toolgate starts in time");
    // Keep reading its log, so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
    let client = reqwest::Client::new();
    let run = |message: &str| {
        client
            .post(format!("http://{addr}/api/agent"))
            .json(&json!({"message": message}))
            .send()
    };
    let body: Value = run("call mcp__fx__whereami")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("\"PATH\""), "{body}");
    assert!(!answer.contains("OPENAI_API_KEY"), "{answer}");
    let body: Value = run("call mcp__fx__spawn_child")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let answer = body["answer"].as_str().unwrap();
    let pids: Value = serde_json::from_str(
        answer
            .strip_prefix("mcp__fx__spawn_child returned: ")
            .unwrap_or_else(|| panic!("{answer}")),
    )
    .unwrap();

    // SAFETY: kill only sends a signal to the toolgate we started.
    unsafe { libc::kill(toolgate.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(PATIENCE, toolgate.wait())
        .await
        .expect("toolgate exits in time")
        .unwrap();
    assert!(status.success(), "{status}");
    exited(pids["server"].as_i64().unwrap() as i32).await;
    exited(pids["child"].as_i64().unwrap() as i32).await;
}

/// A call a person approved that had not run when toolgate stopped runs once it starts again, MCP tools included:
/// the servers' tools are in the toolbox before the harness goes on with waiting runs. (The approval is written
/// into the stopped server's file, as a decision made just before a stop leaves it.)
#[tokio::test]
async fn an_approved_mcp_call_left_by_a_stop_runs_after_the_restart() {
    use crate::process::{Home, Server};
    let (_dir, path) = write_config(json!({"fx": fixture(json!({}))}));
    let path = path.display().to_string();
    let args = ["--mcp-config", path.as_str()];
    let home = Home::new();
    let server = Server::start_in(&home, &args, &[]).await;
    let run_id = server
        .create_run(json!({"message": "call mcp__fx__echo {\"text\": \"after the restart\"}"}))
        .await;
    server
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let pending = server.pending().await;
    let call_id = pending[0]["toolCallId"].as_str().unwrap().to_owned();
    server.kill9().await;

    let database = rusqlite::Connection::open(home.path().join("toolgate.db")).unwrap();
    let text: String = database
        .query_row(
            "SELECT record FROM calls WHERE call_id = ?1",
            [&call_id],
            |row| row.get(0),
        )
        .unwrap();
    let mut record: agent::store::CallRecord = serde_json::from_str(&text).unwrap();
    record.status = agent::store::CallStatus::Approved;
    record.resolution = Some(agent::wire::Resolution::Approved {
        source: agent::wire::ApprovalSource::User,
        scope: Default::default(),
        reason: None,
        edited_arguments: None,
    });
    let changed = database
        .execute(
            "UPDATE calls SET status = 'approved', record = ?1 WHERE call_id = ?2",
            [serde_json::to_string(&record).unwrap(), call_id],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(database);

    let server = Server::start_in(&home, &args, &[]).await;
    let events = server.events(&run_id, None).await.rest().await;
    let result = events
        .iter()
        .find(|event| event.name == "toolResult")
        .expect("the approved call ran");
    assert_eq!(
        result.data["output"],
        json!({"status": "ok", "content": "after the restart"})
    );
    assert_eq!(events.last().unwrap().name, "done");
}
