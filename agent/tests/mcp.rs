//! Tools from MCP servers, against real servers: `@modelcontextprotocol/server-filesystem` and
//! `@modelcontextprotocol/server-everything` from npm, `mcp-server-time` from PyPI (installed at pinned versions by
//! `scripts/bootstrap.sh`), and toolgate's own misbehaving server (`tools/mcp/misbehaving-server.mjs`) for what can
//! go wrong. Every call goes through the real runtime: schema check, policy, execution, events.

mod support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent::harness::{Harness, RunHandle, RunSource, StartRun};
use agent::ids::{RunId, ToolCallId};
use agent::mcp::{McpConfig, McpServers, McpTransport, RequiredServerFailed};
use agent::policy::{PermissionPolicy, RuleSet, SessionGrants, grant, session_grant};
use agent::tools::Toolbox;
use agent::wire::DecisionScope;
use agent::wire::{
    ApprovalMode, ApprovalPolicy, McpServerState, McpServerStatus, McpTrust, PermissionDecision,
    RunErrorCode, StreamEvent, ToolAnnotations, ToolErrorCode, ToolOutput,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use support::{ReplayModel, all_events, failure, harness_over, text_step, tool_results, tool_step};

/// Any single wait in a test; a test that would hang fails instead.
const PATIENCE: Duration = Duration::from_secs(20);

fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/mcp")
}

/// A file the bootstrap script installs; a clear failure when it has not run.
fn installed(relative: &str) -> String {
    let path = tools_dir().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/bootstrap.sh, which installs the MCP test servers",
        path.display()
    );
    path.canonicalize().unwrap().display().to_string()
}

fn npm_server(package: &str) -> String {
    installed(&format!(
        "node_modules/@modelcontextprotocol/{package}/dist/index.js"
    ))
}

fn fixture_script() -> String {
    installed("misbehaving-server.mjs")
}

/// A fixture server's configuration, with `extra` fields.
fn fixture(extra: Value) -> Value {
    let mut server = json!({"command": "node", "args": [fixture_script()]});
    if let (Value::Object(server), Value::Object(extra)) = (&mut server, extra) {
        server.extend(extra);
    }
    server
}

/// Servers started in a fresh workspace.
struct Started {
    servers: McpServers,
    toolbox: Toolbox,
    workspace: tempfile::TempDir,
}

async fn start(servers: Value) -> Result<Started, RequiredServerFailed> {
    let workspace = tempfile::tempdir().unwrap();
    let config = McpConfig::parse(
        Path::new("test.json"),
        &json!({ "mcpServers": servers }).to_string(),
        &|name| std::env::var(name).ok(),
    )
    .expect("the configuration reads");
    let toolbox = Toolbox::new();
    let servers = tokio::time::timeout(
        PATIENCE,
        McpServers::start(&config, workspace.path(), &toolbox),
    )
    .await
    .expect("the servers start in time")?;
    Ok(Started {
        servers,
        toolbox,
        workspace,
    })
}

impl Started {
    fn status(&self, server: &str) -> McpServerStatus {
        self.toolbox
            .sources()
            .into_iter()
            .find(|status| status.name == server)
            .unwrap_or_else(|| panic!("no server {server}"))
    }

    fn context(&self, policy: ApprovalPolicy) -> Run {
        Run {
            toolbox: self.toolbox.clone(),
            policy,
            logged: None,
        }
    }

    /// Waits until the server's status is as `wanted` says, and gives it.
    async fn until_status(
        &self,
        server: &str,
        wanted: impl Fn(&McpServerStatus) -> bool,
    ) -> McpServerStatus {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let status = self.status(server);
                if wanted(&status) {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server {server} is still {:?}", self.status(server)))
    }

    /// The description of the tool the model sees as `tool`.
    fn description(&self, tool: &str) -> String {
        self.toolbox
            .lookup(tool)
            .map(|tool| tool.spec().description.clone())
            .unwrap_or_else(|| panic!("no tool {tool}"))
    }

    /// Waits until the fixture has been asked for `tool`. Only the server's process knows when a request reached it,
    /// so this reads its record of calls until the call shows.
    async fn until_fixture_called(&self, tool: &str) {
        tokio::time::timeout(PATIENCE, async {
            while !self.fixture_calls().iter().any(|call| call == tool) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the fixture was never asked for {tool}"));
    }

    /// Starts a run (interactive, everything trusted) whose one call is `tool` with `arguments`, and lets it go on.
    async fn call_in_a_run(&self, tool: &str, arguments: Value) -> (Harness, RunHandle) {
        let model = Arc::new(ReplayModel::new(vec![
            tool_step(&[support::call("call_1", tool, arguments)]),
            text_step("never"),
        ]));
        let harness = harness_over(model, self.toolbox.clone(), ApprovalPolicy::Trusted);
        let run = harness
            .start(start_run(ApprovalMode::Interactive))
            .await
            .unwrap();
        (harness, run)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.workspace.path().join(name)
    }

    /// The fixture's record of the calls it was asked to make.
    fn fixture_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.file("fixture-calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    async fn shut_down(self) {
        tokio::time::timeout(PATIENCE, self.servers.shutdown())
            .await
            .expect("the servers stop in time");
    }
}

/// Calls through a harness over the servers' toolbox, each as the one call of a run, as the model would make it.
struct Run {
    toolbox: Toolbox,
    policy: ApprovalPolicy,
    /// The output the run's log kept for the last call.
    logged: Option<ToolOutput>,
}

impl Run {
    /// Runs one call (fail-closed: a call that would ask ends the run) and returns what the model read of it.
    async fn call(&mut self, name: &str, arguments: Value) -> ToolOutput {
        let model = Arc::new(ReplayModel::new(vec![
            tool_step(&[support::call("call_1", name, arguments)]),
            text_step("done"),
        ]));
        let harness = harness_over(
            Arc::clone(&model) as Arc<dyn agent::model::Model>,
            self.toolbox.clone(),
            self.policy,
        );
        let run = harness
            .start(start_run(ApprovalMode::FailClosed))
            .await
            .unwrap();
        let events = tokio::time::timeout(PATIENCE, all_events(&run))
            .await
            .expect("the run ends in time");
        self.logged = logged_output(&events);
        let requests = model.requests();
        match requests
            .get(1)
            .and_then(|messages| tool_results(messages).pop())
        {
            Some((_, output)) => output,
            None => panic!("the model never read a result: {events:?}"),
        }
    }

    fn decision(&self, name: &str) -> PermissionDecision {
        let spec = self
            .toolbox
            .lookup(name)
            .map(|tool| tool.spec().clone())
            .expect("the tool exists");
        PermissionPolicy::new(self.policy, RuleSet::new()).decide(
            &spec,
            &json!({}),
            &SessionGrants::new(),
        )
    }

    /// The output the run's log kept for the last call.
    fn logged_output(&mut self) -> ToolOutput {
        self.logged.take().expect("a call finished")
    }
}

fn start_run(mode: ApprovalMode) -> StartRun {
    StartRun {
        message: "go".into(),
        session_id: None,
        policy: None,
        mode,
        run_id: None,
        source: RunSource::Session,
        refused_while_interrupted: false,
    }
}

/// Aborts `run` and reads its events to its end, which must come within [`PATIENCE`] and be the abort.
async fn aborted(harness: &Harness, run: &RunHandle) -> Vec<StreamEvent> {
    harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();
    let events = tokio::time::timeout(PATIENCE, all_events(run))
        .await
        .expect("the run ends in time");
    assert_eq!(
        failure(&events).map(|(code, _)| code),
        Some(RunErrorCode::Aborted)
    );
    events
}

/// The output the run's log kept for its (first) call.
fn logged_output(events: &[StreamEvent]) -> Option<ToolOutput> {
    events.iter().find_map(|event| match event {
        StreamEvent::ToolResult { output, .. } => Some(output.clone()),
        _ => None,
    })
}

fn text(output: &ToolOutput) -> String {
    match output {
        ToolOutput::Ok {
            content: Value::String(text),
        } => text.clone(),
        ToolOutput::Ok { content } => content.to_string(),
        ToolOutput::Error { code, message } => panic!("an error ({code:?}): {message}"),
    }
}

fn error(output: &ToolOutput) -> (ToolErrorCode, String) {
    match output {
        ToolOutput::Error { code, message } => (*code, message.clone()),
        ToolOutput::Ok { content } => panic!("no error: {content}"),
    }
}

/// Waits until the process `pid` has exited, without polling: a pidfd becomes readable when it does.
async fn exited(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ESRCH),
            "pidfd_open({pid})"
        );
        return;
    }
    // SAFETY: the descriptor is new and ours alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the descriptor stays open, and the same, for as long as the AsyncFd owns it.
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
async fn server_filesystem_writes_and_reads_in_the_workspace_behind_the_policy() {
    let started = start(json!({
        "fs": {"command": "node", "args": [npm_server("server-filesystem"), "."]}
    }))
    .await
    .unwrap();
    assert_eq!(started.status("fs").state, McpServerState::Ready);
    let spec = started
        .toolbox
        .lookup("mcp__fs__write_file")
        .map(|tool| tool.spec().clone())
        .unwrap();
    assert_eq!(
        spec.annotations,
        ToolAnnotations {
            read_only: Some(false),
            destructive: Some(true),
            idempotent: Some(true),
            open_world: Some(false)
        },
        "what the server claims"
    );
    assert_eq!(spec.mcp.as_ref().unwrap().tool, "write_file");
    assert_eq!(spec.mcp.as_ref().unwrap().trust, McpTrust::Untrusted);
    // Where the server is belongs to the tool's definition, so that a grant for it covers this server only.
    let transport = McpTransport::Stdio {
        command: "node".into(),
        args: vec![npm_server("server-filesystem"), ".".into()],
        env: Default::default(),
    };
    assert_eq!(
        spec.mcp.as_ref().unwrap().endpoint,
        transport.endpoint_digest()
    );

    // Untrusted: even its read-only tools ask under the default policy.
    let run = started.context(ApprovalPolicy::OnRequest);
    let decision = run.decision("mcp__fs__read_text_file");
    assert!(
        matches!(decision, PermissionDecision::Ask { .. }),
        "{decision:?}"
    );
    assert!(
        decision
            .reason()
            .contains("MCP server fs, which is not trusted")
    );

    // Schema first: a call without its required field never reaches the server.
    let mut run = started.context(ApprovalPolicy::Trusted);
    let refused = run
        .call("mcp__fs__write_file", json!({"path": "x.txt"}))
        .await;
    assert_eq!(error(&refused).0, ToolErrorCode::InvalidInput);

    let written = run
        .call(
            "mcp__fs__write_file",
            json!({"path": "notes.txt", "content": "from the filesystem server"}),
        )
        .await;
    assert!(text(&written).contains("notes.txt"), "{written:?}");
    assert_eq!(
        std::fs::read_to_string(started.file("notes.txt")).unwrap(),
        "from the filesystem server"
    );
    let read = run
        .call("mcp__fs__read_text_file", json!({"path": "notes.txt"}))
        .await;
    assert!(
        text(&read).contains("from the filesystem server"),
        "{read:?}"
    );
    started.shut_down().await;
}

#[tokio::test]
async fn server_everything_runs_in_the_workspace_with_a_reduced_environment() {
    let started = start(json!({
        "everything": {
            "command": "node",
            "args": [npm_server("server-everything")],
            "env": {"CONFIGURED": "yes"},
            "trust": "annotations"
        }
    }))
    .await
    .unwrap();
    let mut run = started.context(ApprovalPolicy::OnRequest);
    // Trusted annotations decide: echo claims to be read-only and closed-world.
    assert!(matches!(
        run.decision("mcp__everything__echo"),
        PermissionDecision::Allow { .. }
    ));
    let echoed = run
        .call("mcp__everything__echo", json!({"message": "hello"}))
        .await;
    assert_eq!(text(&echoed), "Echo: hello");

    let env: Value = serde_json::from_str(&text(
        &run.call("mcp__everything__get-env", json!({})).await,
    ))
    .unwrap();
    let mut names: Vec<&str> = env
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    let allowed = ["CONFIGURED", "HOME", "LANG", "PATH"];
    assert!(
        names.iter().all(|name| allowed.contains(name)),
        "the server saw {names:?}"
    );
    assert_eq!(env["CONFIGURED"], "yes");
    started.shut_down().await;
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = everything_over_http(port).await;
    let started = start(json!({
        "remote": {"type": "http", "url": format!("http://127.0.0.1:{port}/mcp"), "headers": {"X-Test": "1"}}
    }))
    .await
    .unwrap();
    assert_eq!(started.status("remote").state, McpServerState::Ready);
    let mut run = started.context(ApprovalPolicy::Trusted);
    let echoed = run
        .call("mcp__remote__echo", json!({"message": "over http"}))
        .await;
    assert_eq!(text(&echoed), "Echo: over http");
    let sum = run
        .call("mcp__remote__get-sum", json!({"a": 2, "b": 3}))
        .await;
    assert!(text(&sum).contains('5'), "{sum:?}");
    started.shut_down().await;
    server.kill().await.unwrap();
}

/// `@modelcontextprotocol/server-everything` serving streamable HTTP on `port`, once it listens.
async fn everything_over_http(port: u16) -> tokio::process::Child {
    let mut server = tokio::process::Command::new("node")
        .arg(npm_server("server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap()).lines();
    tokio::time::timeout(PATIENCE, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return;
            }
        }
        panic!("the server ended before it listened");
    })
    .await
    .expect("the HTTP server listens in time");
    server
}

/// An HTTP server started again forgets its sessions. Before, every later call waited out its timeout, until toolgate
/// itself restarted; now the first one's timeout finds the server deaf to a ping, and the next call connects again
/// (listing the tools again, so that a call is made only on the definition it was decided for).
#[tokio::test]
async fn an_http_server_started_again_is_connected_again_and_listed_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = everything_over_http(port).await;
    let started = start(json!({
        "remote": {"type": "http", "url": format!("http://127.0.0.1:{port}/mcp"), "tool_timeout_secs": 3}
    }))
    .await
    .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let echoed = run
        .call("mcp__remote__echo", json!({"message": "one"}))
        .await;
    assert_eq!(text(&echoed), "Echo: one");
    server.kill().await.unwrap();
    let mut server = everything_over_http(port).await;
    // The restarted server answers the old session's call with an error no request can take: the call waits out
    // its timeout, and the server does not answer a ping on that session either.
    let lost = run
        .call("mcp__remote__echo", json!({"message": "two"}))
        .await;
    let (code, message) = error(&lost);
    assert_eq!(code, ToolErrorCode::Timeout);
    assert!(
        message
            .contains("did not answer a ping after it either, so toolgate closed the connection"),
        "{message}"
    );
    let echoed = run
        .call("mcp__remote__echo", json!({"message": "three"}))
        .await;
    assert_eq!(text(&echoed), "Echo: three");
    assert_eq!(started.status("remote").state, McpServerState::Ready);
    started.shut_down().await;
    server.kill().await.unwrap();
}

#[tokio::test]
async fn mcp_server_time_from_pypi_tells_the_time() {
    let started = start(json!({
        "time": {"command": installed("python/bin/mcp-server-time"), "args": ["--local-timezone", "UTC"]}
    }))
    .await
    .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let now = run
        .call("mcp__time__get_current_time", json!({"timezone": "UTC"}))
        .await;
    let ToolOutput::Ok { content } = &now else {
        panic!("{now:?}");
    };
    assert_eq!(content["structuredContent"]["timezone"], "UTC", "{content}");
    started.shut_down().await;
}

#[tokio::test]
async fn an_untrusted_servers_lying_annotations_ask_and_a_trusted_ones_decide() {
    let started = start(json!({
        "liar": fixture(json!({})),
        "believed": fixture(json!({"trust": "annotations"})),
    }))
    .await
    .unwrap();
    let run = started.context(ApprovalPolicy::OnRequest);
    // `tidy` claims to be read-only and deletes a file.
    let decision = run.decision("mcp__liar__tidy");
    assert!(matches!(decision, PermissionDecision::Ask { .. }));
    assert_eq!(
        decision.reason(),
        "mcp__liar__tidy belongs to the MCP server liar, which is not trusted, so every call asks (it claims to be read-only, not destructive, idempotent, not open-world, unverified)."
    );
    assert!(matches!(
        run.decision("mcp__believed__tidy"),
        PermissionDecision::Allow { .. }
    ));
    // What the policy lists and what the model sees both name the server and what it claims.
    let spec = started
        .toolbox
        .lookup("mcp__liar__tidy")
        .map(|tool| tool.spec().clone())
        .unwrap();
    assert_eq!(spec.annotations.read_only, Some(true));
    started.shut_down().await;
}

#[tokio::test]
async fn a_server_that_fails_to_start_is_shown_failed_with_its_stderr_and_the_others_work() {
    let started = start(json!({
        "broken": fixture(json!({"env": {"FIXTURE_FAIL_START": "a test"}})),
        "missing": {"command": "/no/such/program"},
        "fine": fixture(json!({})),
    }))
    .await
    .unwrap();
    let broken = started.status("broken");
    assert_eq!(broken.state, McpServerState::Failed);
    assert!(broken.tools.is_empty());
    let tail = broken.stderr_tail.unwrap();
    assert!(
        tail.ends_with("fixture: refusing to start on purpose (a test)"),
        "{tail}"
    );
    let missing = started.status("missing");
    assert_eq!(missing.state, McpServerState::Failed);
    assert!(
        missing
            .message
            .unwrap()
            .contains("cannot start \"/no/such/program\""),
    );
    assert_eq!(started.status("fine").state, McpServerState::Ready);
    let mut run = started.context(ApprovalPolicy::Trusted);
    let echoed = run
        .call("mcp__fine__echo", json!({"text": "still here"}))
        .await;
    assert_eq!(text(&echoed), "still here");
    started.shut_down().await;
}

#[tokio::test]
async fn a_required_server_that_fails_stops_startup_and_says_why() {
    let failed = start(json!({
        "broken": fixture(json!({"required": true, "env": {"FIXTURE_FAIL_START": "required"}})),
        "fine": fixture(json!({})),
    }))
    .await
    .err()
    .expect("startup fails");
    assert_eq!(failed.server, "broken");
    let message = failed.to_string();
    assert!(message.contains("is required"), "{message}");
    assert!(
        message.contains("refusing to start on purpose (required)"),
        "{message}"
    );
}

#[tokio::test]
async fn a_crash_mid_call_leaves_the_effect_unknown_and_the_next_call_restarts_the_server() {
    let started = start(json!({"crashy": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let crashed = run.call("mcp__crashy__exit_mid_call", json!({})).await;
    let (code, message) = error(&crashed);
    assert_eq!(code, ToolErrorCode::ToolFailed);
    assert!(
        message.contains("whether the call took effect is unknown")
            && message.contains("did not retry"),
        "{message}"
    );
    let status = started.status("crashy");
    assert_eq!(status.state, McpServerState::Crashed);
    assert!(
        status
            .stderr_tail
            .as_deref()
            .unwrap_or("")
            .contains("exiting in the middle of a call"),
        "{status:?}"
    );
    // The next call starts it again; the crashed call was never made again.
    let echoed = run.call("mcp__crashy__echo", json!({"text": "back"})).await;
    assert_eq!(text(&echoed), "back");
    assert_eq!(started.status("crashy").state, McpServerState::Ready);
    assert_eq!(started.fixture_calls(), ["exit_mid_call", "echo"]);
    started.shut_down().await;
}

/// A run waiting on its card for `mcp__fixture__echo` as the server defined it after a change (version 2), the
/// server stopped while the card waits: the next call starts it again, and it lists the tool as it was before the
/// change (version 1).
struct CardForAToolAboutToChange {
    started: Started,
    harness: Harness,
    run: RunHandle,
    events: support::Events,
    card: agent::wire::ApprovalRequest,
}

async fn a_card_for_a_tool_about_to_change() -> CardForAToolAboutToChange {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut trusted = started.context(ApprovalPolicy::Trusted);
    trusted.call("mcp__fixture__change_tools", json!({})).await;
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[support::call(
            "call_1",
            "mcp__fixture__echo",
            json!({"text": "as asked"}),
        )]),
        text_step("done"),
    ]));
    let harness = harness_over(model, started.toolbox.clone(), ApprovalPolicy::Strict);
    let run = harness
        .start(start_run(ApprovalMode::Interactive))
        .await
        .unwrap();
    let mut events = support::Events::of(&run);
    let card = events.next_approval().await;
    let shown = started
        .toolbox
        .lookup("mcp__fixture__echo")
        .map(|tool| tool.spec().description.clone());
    assert_eq!(shown.as_deref(), Some("Echoes the text back (version 2)."));
    // The server stops while the card waits; the next call starts it again, and it says version 1.
    trusted.call("mcp__fixture__exit_mid_call", json!({})).await;
    assert_eq!(started.status("fixture").state, McpServerState::Crashed);
    CardForAToolAboutToChange {
        started,
        harness,
        run,
        events,
        card,
    }
}

/// An edited approval of an MCP tool that its restarted server defines otherwise is refused by the tool before
/// anything goes to the server: it ran with no arguments at all (the page said it ran with the edited ones), and the
/// model reads that what was refused was a person's edit of its call.
#[tokio::test]
async fn an_edited_call_its_tool_refused_to_make_records_no_executed_arguments() {
    let CardForAToolAboutToChange {
        started,
        harness,
        run,
        events,
        card,
    } = a_card_for_a_tool_about_to_change().await;
    harness
        .decide(
            run.run_id(),
            &card.tool_call_id,
            agent::wire::Decision::Approve {
                scope: agent::wire::DecisionScope::Once,
                reason: None,
                arguments: Some(json!({"text": "as edited"})),
            },
            &agent::harness::Actor::local(),
        )
        .await
        .unwrap();
    let rest = tokio::time::timeout(PATIENCE, events.rest())
        .await
        .expect("the run ends in time");
    let (executed, output) = rest
        .iter()
        .find_map(|event| match event {
            StreamEvent::ToolResult {
                executed_arguments,
                output,
                ..
            } => Some((executed_arguments.clone(), output.clone())),
            _ => None,
        })
        .expect("the call's result");
    let (code, message) = error(&output);
    assert_eq!(code, ToolErrorCode::PermissionDenied);
    assert_eq!(executed, None, "{message}");
    assert!(
        message.contains("A person edited the arguments"),
        "{message}"
    );
    assert!(!started.fixture_calls().iter().any(|call| call == "echo"));
    started.shut_down().await;
}

/// A card approved for a tool as its server defined it then: the server stopped meanwhile, and started again for the
/// call it lists the tool otherwise (here as it was before a change). The call is not made on that definition.
#[tokio::test]
async fn a_call_approved_for_a_tool_is_not_made_when_the_restarted_server_defines_it_otherwise() {
    let CardForAToolAboutToChange {
        started,
        harness,
        run,
        events,
        card,
    } = a_card_for_a_tool_about_to_change().await;
    harness
        .decide(
            run.run_id(),
            &card.tool_call_id,
            agent::wire::Decision::approve(),
            &agent::harness::Actor::local(),
        )
        .await
        .unwrap();
    let rest = tokio::time::timeout(PATIENCE, events.rest())
        .await
        .expect("the run ends in time");
    let (code, message) = error(&logged_output(&rest).expect("the call's result"));
    assert_eq!(code, ToolErrorCode::PermissionDenied);
    assert!(
        message.contains("changed after this call was decided")
            && message.contains("was started again"),
        "{message}"
    );
    // The audit log has the approval, then the line that says its call was not made, and why.
    let audit = support::audit_entries(&harness).await;
    let outcomes: Vec<&str> = audit.iter().map(|entry| entry.outcome.as_str()).collect();
    assert_eq!(outcomes, ["requested", "approved", "not_run"]);
    assert_eq!(audit[2].kind.as_str(), "call_refused");
    assert_eq!(audit[2].reason.as_deref(), Some(message.as_str()));
    assert_eq!(started.status("fixture").state, McpServerState::Ready);
    assert_eq!(
        started
            .toolbox
            .lookup("mcp__fixture__echo")
            .map(|tool| tool.spec().description.clone())
            .as_deref(),
        Some("Echoes the text back (version 1).")
    );
    assert_eq!(started.fixture_calls(), ["change_tools", "exit_mid_call"]);
    started.shut_down().await;
}

/// An answer the SDK cannot read as a result comes after the call was made: the model is told that what it did is
/// unknown, not that the server refused it (which would invite the same call again).
#[tokio::test]
async fn an_answer_that_cannot_be_read_leaves_the_effect_unknown() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let unread = run.call("mcp__fixture__malformed", json!({})).await;
    let (code, message) = error(&unread);
    assert_eq!(code, ToolErrorCode::ToolFailed);
    assert!(
        message.contains("with a result toolgate cannot read")
            && message.contains("whether the call took effect is unknown")
            && !message.contains("refused"),
        "{message}"
    );
    started.shut_down().await;
}

/// A stdio server busy in a tool past its call's timeout is slow, not lost: it answers no ping meanwhile, and it is not
/// stopped for that (its other calls go on, and so does what it keeps); the same process answers the next call.
#[tokio::test]
async fn a_stdio_server_busy_past_a_calls_timeout_is_not_stopped() {
    let started = start(json!({"busy": fixture(json!({"tool_timeout_secs": 1}))}))
        .await
        .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let slow = run.call("mcp__busy__block", json!({"ms": 2500})).await;
    let (code, message) = error(&slow);
    assert_eq!(code, ToolErrorCode::Timeout);
    assert!(!message.contains("ping"), "{message}");
    assert_eq!(started.status("busy").state, McpServerState::Ready);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let echoed = run
        .call("mcp__busy__echo", json!({"text": "still here"}))
        .await;
    assert_eq!(text(&echoed), "still here");
    assert_eq!(started.status("busy").state, McpServerState::Ready);
    started.shut_down().await;
}

/// A call whose run was aborted before it went out is not sent at all: a server may run a request whatever the
/// cancellation that follows it says.
#[tokio::test]
async fn a_call_whose_run_was_aborted_before_it_went_out_is_not_sent() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let tool = started.toolbox.get("mcp__fixture__echo").unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let context = agent::tools::ToolContext {
        run_id: RunId::parse("aborted").unwrap(),
        cancel,
    };
    let refused = tool
        .execute(json!({"text": "never"}), &context)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("was not called: its run was aborted before the call went out"),
        "{refused}"
    );
    // Asked after it, over the same connection, the server has read everything sent before.
    let mut run = started.context(ApprovalPolicy::Trusted);
    run.call("mcp__fixture__cancellations", json!({})).await;
    assert_eq!(started.fixture_calls(), ["cancellations"]);
    started.shut_down().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_again_waits_out_its_backoff_before_the_next_attempt() {
    let started = start(json!({"crashy": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    run.call("mcp__crashy__exit_mid_call", json!({})).await;
    std::fs::write(started.file("fixture-refuse-start"), "").unwrap();
    let (_, message) = error(&run.call("mcp__crashy__echo", json!({"text": "a"})).await);
    assert!(message.contains("could not start again"), "{message}");
    let status = started.status("crashy");
    assert_eq!(status.state, McpServerState::Crashed);
    assert!(
        status
            .stderr_tail
            .unwrap()
            .contains("refusing to start again on purpose"),
        "the failed restart's stderr"
    );
    // Within its backoff no new process is started: the call is refused at once.
    let (_, message) = error(&run.call("mcp__crashy__echo", json!({"text": "b"})).await);
    assert!(
        message.contains("toolgate starts it again in 1 s. The call was not made."),
        "{message}"
    );
    assert_eq!(started.fixture_calls(), ["exit_mid_call"]);
    started.shut_down().await;
}

#[tokio::test]
async fn a_call_past_its_timeout_is_cancelled_on_the_server() {
    let started = start(json!({"slow": fixture(json!({"tool_timeout_secs": 0.5}))}))
        .await
        .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let timed_out = run.call("mcp__slow__sleep", json!({"ms": 60_000})).await;
    let (code, message) = error(&timed_out);
    assert_eq!(code, ToolErrorCode::Timeout);
    assert!(message.contains("notifications/cancelled"), "{message}");
    let cancelled: Value = serde_json::from_str(&text(
        &run.call("mcp__slow__cancellations", json!({})).await,
    ))
    .unwrap();
    assert_eq!(cancelled.as_array().unwrap().len(), 1, "{cancelled}");
    started.shut_down().await;
}

#[tokio::test]
async fn a_run_aborted_mid_call_cancels_the_call_on_the_server() {
    let started = start(json!({"slow": fixture(json!({}))})).await.unwrap();
    let (harness, run) = started
        .call_in_a_run("mcp__slow__sleep", json!({"ms": 60_000}))
        .await;
    started.until_fixture_called("sleep").await;
    let events = aborted(&harness, &run).await;
    let message = events
        .iter()
        .find_map(|event| match event {
            StreamEvent::ToolResult {
                output: ToolOutput::Error { message, .. },
                ..
            } => Some(message.clone()),
            _ => None,
        })
        .expect("the call's result says what happened");
    assert!(
        message.contains("was cancelled because its run was aborted"),
        "{message}"
    );
    let mut after = started.context(ApprovalPolicy::Trusted);
    let cancelled: Value = serde_json::from_str(&text(
        &after.call("mcp__slow__cancellations", json!({})).await,
    ))
    .unwrap();
    assert_eq!(cancelled.as_array().unwrap().len(), 1, "{cancelled}");
    started.shut_down().await;
}

#[tokio::test]
async fn an_is_error_result_reaches_the_model_as_an_error() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let failed = run.call("mcp__fixture__fail", json!({})).await;
    assert_eq!(
        error(&failed),
        (
            ToolErrorCode::ToolFailed,
            "mcp__fixture__fail reported an error: the fixture failed on purpose".to_owned()
        )
    );
    started.shut_down().await;
}

#[tokio::test]
async fn a_huge_result_reaches_the_model_as_head_and_tail_and_the_log_keeps_all_of_it() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let bytes = 20 * 1024 * 1024;
    let for_model = text(
        &run.call("mcp__fixture__huge", json!({"bytes": bytes}))
            .await,
    );
    assert!(
        for_model.len() <= agent::mcp::MODEL_OUTPUT_LIMIT + 200,
        "{}",
        for_model.len()
    );
    assert!(for_model.starts_with("HEADxxx") && for_model.ends_with("xxxTAIL"));
    assert!(
        for_model.contains(&format!("of {bytes} bytes left out")),
        "the note says so"
    );
    let logged = text(&run.logged_output());
    assert_eq!(logged.len(), bytes);
    started.shut_down().await;
}

/// A tool that its server withdraws while it runs (the server announces a list without it before it answers): its
/// result is bounded for the model all the same, by the tool as it was when it ran. Before, the limit was looked up
/// again after the call, found no tool, and the whole result went to the model.
#[tokio::test]
async fn a_result_is_bounded_for_the_model_even_when_its_tool_was_withdrawn_meanwhile() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let bytes = 1024 * 1024;
    let for_model = text(
        &run.call("mcp__fixture__huge_and_go", json!({"bytes": bytes}))
            .await,
    );
    assert!(
        for_model.len() <= agent::mcp::MODEL_OUTPUT_LIMIT + 200,
        "{}",
        for_model.len()
    );
    assert!(
        started
            .toolbox
            .lookup("mcp__fixture__huge_and_go")
            .is_none(),
        "the tool is gone"
    );
    started.shut_down().await;
}

/// A message longer than toolgate reads fails its call at once and says why; before, the line was dropped and the
/// call waited its whole tool timeout, then was reported as timed out. The server is started again for the next call.
#[tokio::test]
async fn a_result_longer_than_toolgate_reads_fails_its_call_at_once_and_says_why() {
    let started = start(json!({"fixture": fixture(json!({"tool_timeout_secs": 60}))}))
        .await
        .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let bytes = agent::mcp::MAX_MESSAGE_BYTES + 1024;
    let called = tokio::time::timeout(
        Duration::from_secs(30),
        run.call("mcp__fixture__huge", json!({"bytes": bytes})),
    )
    .await
    .expect("the call fails long before the 60 s tool timeout");
    let (code, message) = error(&called);
    assert_eq!(code, ToolErrorCode::ToolFailed);
    assert!(
        message.starts_with(
            "The MCP server fixture sent a message longer than 64 MiB while mcp__fixture__huge was running"
        ),
        "{message}"
    );
    assert_eq!(
        text(
            &run.call("mcp__fixture__echo", json!({"text": "again"}))
                .await
        ),
        "again"
    );
    started.shut_down().await;
}

#[tokio::test]
async fn junk_on_stdout_is_skipped() {
    let started = start(json!({"fixture": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let answered = run.call("mcp__fixture__junk", json!({})).await;
    assert_eq!(text(&answered), "answered after the junk");
    let echoed = run
        .call("mcp__fixture__echo", json!({"text": "after"}))
        .await;
    assert_eq!(text(&echoed), "after");
    started.shut_down().await;
}

#[tokio::test]
async fn a_changed_tool_is_in_the_toolbox_when_the_call_that_changed_it_answers() {
    let started = start(json!({"fixture": fixture(json!({"trust": "annotations"}))}))
        .await
        .unwrap();
    let before = started
        .toolbox
        .lookup("mcp__fixture__echo")
        .map(|tool| tool.spec().clone())
        .unwrap();
    assert_eq!(before.description, "Echoes the text back (version 1).");
    let input = json!({"text": "hi"});
    let mut grants = SessionGrants::new();
    grants.insert(session_grant(
        grant::grant_for(&before, &input, DecisionScope::Session).expect("a session scope"),
        RunId::parse("run").unwrap(),
        ToolCallId::parse("call").unwrap(),
    ));
    assert!(grants.covering(&before, &input).is_some());
    let mut run = started.context(ApprovalPolicy::Trusted);
    run.call("mcp__fixture__change_tools", json!({})).await;
    // No waiting: the call answered after the new list was in the toolbox.
    let after = started
        .toolbox
        .lookup("mcp__fixture__echo")
        .map(|tool| tool.spec().clone())
        .unwrap();
    assert_eq!(after.description, "Echoes the text back (version 2).");
    // A grant covers the tool it was given for; the changed tool asks again.
    assert!(grants.covering(&after, &input).is_none());
    started.shut_down().await;
}

/// A server that says its tools changed and never answers tools/list holds up nothing for longer than its tool
/// timeout, and what toolgate held of its tools is used no more: they are withdrawn, and a call of one is not made.
/// The list is asked for again, and once it comes the tools are back and the server's next change applies as
/// before. (Before, the old definitions stayed, for as long as the list did not come.)
#[tokio::test]
async fn a_tool_list_never_answered_withdraws_the_tools_until_it_is_read_again() {
    let started = start(json!({"fixture": fixture(json!({"tool_timeout_secs": 1}))}))
        .await
        .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    // Its next two lists hang: the tools stay withdrawn from 1 s (the first list given up) to 5 s (the third asked).
    run.call("mcp__fixture__change_tools_hang_list", json!({"lists": 2}))
        .await;
    let withdrawn = started
        .until_status("fixture", |status| status.tools.is_empty())
        .await;
    assert_eq!(withdrawn.state, McpServerState::Failed);
    let message = withdrawn.message.unwrap_or_default();
    assert!(
        message.contains("their new list could not be read"),
        "{message}"
    );
    let (_, refused) = error(&run.call("mcp__fixture__echo", json!({"text": "hi"})).await);
    assert!(refused.contains("mcp__fixture__echo"), "{refused}");
    assert!(!started.fixture_calls().contains(&"echo".to_owned()));
    // Asked again, the list comes: echo as the server changed it.
    let back = started
        .until_status("fixture", |status| {
            status.state == McpServerState::Ready && !status.tools.is_empty()
        })
        .await;
    assert!(back.message.is_none(), "{back:?}");
    assert_eq!(
        started.description("mcp__fixture__echo"),
        "Echoes the text back (version 2)."
    );
    run.call("mcp__fixture__change_tools", json!({})).await;
    assert_eq!(
        started.description("mcp__fixture__echo"),
        "Echoes the text back (version 3)."
    );
    started.shut_down().await;
}

/// A call decided on a tool's definition while its server has said the tools changed, their new list not read yet,
/// waits for the list: it is not made on the definition the server replaced. Here the list never comes, so the call is
/// refused and the tool never runs. (Before, it ran on the old definition.)
#[tokio::test]
async fn a_call_of_a_tool_whose_server_said_it_changed_waits_for_the_new_list() {
    let started = start(json!({"fixture": fixture(json!({"tool_timeout_secs": 2}))}))
        .await
        .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    run.call("mcp__fixture__change_tools_later", json!({}))
        .await;
    // toolgate heard the announcement: it asked for the list, which hangs.
    started.until_fixture_called("tools/list hangs").await;
    assert_eq!(
        started.description("mcp__fixture__echo"),
        "Echoes the text back (version 1).",
        "the old definition is still in the toolbox when the call is decided"
    );
    let (code, message) = error(&run.call("mcp__fixture__echo", json!({"text": "hi"})).await);
    assert_eq!(code, ToolErrorCode::PermissionDenied, "{message}");
    assert!(
        message.contains("changed after this call was decided")
            || message.contains("did not come within"),
        "{message}"
    );
    assert!(!started.fixture_calls().contains(&"echo".to_owned()));
    started.shut_down().await;
}

/// A run aborted while a call's announced tool list is awaited reports the call's real result at once: the call took
/// effect. Before, the wait went on to the server's tool timeout, and the call was left behind as unknown.
#[tokio::test]
async fn a_run_aborted_while_a_tool_list_is_awaited_ends_at_once() {
    let started = start(json!({"fixture": fixture(json!({"tool_timeout_secs": 60}))}))
        .await
        .unwrap();
    let (harness, run) = started
        .call_in_a_run("mcp__fixture__change_tools_hang_list", json!({}))
        .await;
    // The fixture logs this as it returns the call's result: once the result has travelled, what holds it is the
    // list that never comes.
    started
        .until_fixture_called("change_tools_hang_list answered")
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Within PATIENCE: long before the 60 s tool timeout.
    let events = aborted(&harness, &run).await;
    let output = logged_output(&events).expect("the call has a result");
    assert!(
        text(&output).contains("echo is now version 2"),
        "{output:?}"
    );
    started.shut_down().await;
}

#[tokio::test]
async fn only_the_enabled_tools_are_offered_and_disabled_servers_start_nothing() {
    let started = start(json!({
        "some": fixture(json!({"enabled_tools": ["echo", "fail"], "disabled_tools": ["fail"]})),
        "off": fixture(json!({"enabled": false})),
    }))
    .await
    .unwrap();
    assert_eq!(started.status("some").tools, ["mcp__some__echo"]);
    let off = started.status("off");
    assert_eq!(off.state, McpServerState::Disabled);
    assert!(off.tools.is_empty());
    let mut names = started.toolbox.names();
    names.sort();
    assert_eq!(names, ["mcp__some__echo"]);
    started.shut_down().await;
}

#[tokio::test]
async fn shutdown_stops_every_server_and_what_it_started() {
    let started = start(json!({"parent": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let (server, child) = spawn_child(&mut run, "parent", false).await;
    let (_, daemon) = spawn_child(&mut run, "parent", true).await;
    let whereami: Value =
        serde_json::from_str(&text(&run.call("mcp__parent__whereami", json!({})).await)).unwrap();
    assert_eq!(
        Path::new(whereami["cwd"].as_str().unwrap()),
        started.workspace.path().canonicalize().unwrap(),
        "it runs in the workspace"
    );
    let names: Vec<&str> = whereami["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        names
            .iter()
            .all(|name| ["HOME", "LANG", "PATH"].contains(name)),
        "{names:?}"
    );
    tokio::time::timeout(PATIENCE, started.servers.shutdown())
        .await
        .expect("the servers stop in time");
    exited(server).await;
    exited(child).await;
    exited(daemon).await;
    assert_eq!(started.status("parent").state, McpServerState::Stopped);
}

#[tokio::test]
async fn a_crashed_server_leaves_nothing_running_not_even_what_left_its_session() {
    let started = start(json!({"crashy": fixture(json!({}))})).await.unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let (server, child) = spawn_child(&mut run, "crashy", false).await;
    let (_, daemon) = spawn_child(&mut run, "crashy", true).await;
    run.call("mcp__crashy__exit_mid_call", json!({})).await;
    assert_eq!(started.status("crashy").state, McpServerState::Crashed);
    exited(server).await;
    exited(child).await;
    exited(daemon).await;
    started.shut_down().await;
}

/// Asks the fixture `server` to start a long sleep (in a session of its own, as a daemon does, when `own_session`): the
/// server's process id and the sleep's.
async fn spawn_child(run: &mut Run, server: &str, own_session: bool) -> (i32, i32) {
    let tool = format!("mcp__{server}__spawn_child");
    let pids: Value = serde_json::from_str(&text(
        &run.call(&tool, json!({"own_session": own_session})).await,
    ))
    .unwrap();
    let pid = |name: &str| i32::try_from(pids[name].as_i64().unwrap()).unwrap();
    (pid("server"), pid("child"))
}

/// Every tool's definition goes to the model at every step of every run: a server that offers more tools than a
/// model takes is not started (the runs that never use it would fail), and a tool whose definition is too large is
/// left out; both bounds hold exactly. A name listed twice is left out too. The damage stays with that server; the
/// others work.
#[tokio::test]
async fn a_server_offering_too_many_tools_or_too_large_a_tool_is_bounded_and_the_others_work() {
    let own = {
        let plain = start(json!({"plain": fixture(json!({}))})).await.unwrap();
        let own = plain.status("plain").tools.len();
        plain.shut_down().await;
        own
    };
    let extra = |count: usize| fixture(json!({"env": {"FIXTURE_EXTRA_TOOLS": count.to_string()}}));
    // The fixture's huge tool has the schema of its tools without arguments.
    let schema = serde_json::to_vec(&json!({
        "type": "object", "properties": {}, "required": [], "additionalProperties": false
    }))
    .unwrap()
    .len();
    let description =
        |bytes: usize| fixture(json!({"env": {"FIXTURE_HUGE_DESCRIPTION": bytes.to_string()}}));
    let fits = agent::mcp::MAX_TOOL_DEFINITION_BYTES - schema;
    let started = start(json!({
        "full": extra(agent::mcp::MAX_TOOLS - own),
        "many": extra(agent::mcp::MAX_TOOLS - own + 1),
        "edge": description(fits),
        "huge": description(fits + 1),
        "twice": fixture(json!({"env": {"FIXTURE_SECOND_ECHO": "1"}})),
        "fine": fixture(json!({})),
    }))
    .await
    .unwrap();
    let full = started.status("full");
    assert_eq!(full.state, McpServerState::Ready);
    assert_eq!(full.tools.len(), agent::mcp::MAX_TOOLS);
    let many = started.status("many");
    assert_eq!(many.state, McpServerState::Failed);
    assert!(many.tools.is_empty());
    let message = many.message.unwrap();
    assert!(
        message.contains(&format!("more than the {}", agent::mcp::MAX_TOOLS)),
        "{message}"
    );
    let edge = started.status("edge");
    assert!(
        edge.tools
            .iter()
            .any(|tool| tool == "mcp__edge__huge_description"),
        "{:?}",
        edge.tools
    );
    let huge = started.status("huge");
    assert_eq!(huge.state, McpServerState::Ready);
    assert!(
        !huge
            .tools
            .iter()
            .any(|tool| tool.contains("huge_description")),
        "{:?}",
        huge.tools
    );
    assert!(
        huge.tools.iter().any(|tool| tool == "mcp__huge__echo"),
        "{:?}",
        huge.tools
    );
    // Its second echo is destructive: neither is offered, as a call names one by its name alone.
    let twice = started.status("twice");
    assert_eq!(twice.state, McpServerState::Ready);
    assert!(
        !twice.tools.iter().any(|tool| tool == "mcp__twice__echo"),
        "{:?}",
        twice.tools
    );
    assert_eq!(twice.tools.len(), own - 1);
    let mut run = started.context(ApprovalPolicy::Trusted);
    let echoed = run
        .call("mcp__fine__echo", json!({"text": "still here"}))
        .await;
    assert_eq!(text(&echoed), "still here");
    // A list that grows past the bound later has its tools withdrawn, the reason said.
    let (full_pid, _) = spawn_child(&mut run, "full", false).await;
    run.call("mcp__full__add_tools", json!({"count": 1})).await;
    let grown = started
        .until_status("full", |status| status.tools.is_empty())
        .await;
    assert_eq!(grown.state, McpServerState::Failed);
    let message = grown.message.unwrap();
    assert!(
        message.contains(&format!("it offers {} tools", agent::mcp::MAX_TOOLS + 1)),
        "{message}"
    );
    // With no tool to call, no call would start it again once its process ends: it is started again at once, and
    // offers its tools as it lists them now.
    // SAFETY: kill takes a pid and a signal.
    assert_eq!(unsafe { libc::kill(full_pid, libc::SIGKILL) }, 0);
    let again = started
        .until_status("full", |status| !status.tools.is_empty())
        .await;
    assert_eq!(again.state, McpServerState::Ready);
    assert_eq!(again.tools.len(), agent::mcp::MAX_TOOLS);
    started.shut_down().await;
}

/// A server whose tools were withdrawn and that then exits is started again by itself; a start that fails is tried
/// again after its backoff, as no call would try it (the server offers none), until one succeeds.
#[tokio::test]
async fn a_server_whose_tools_were_withdrawn_is_started_again_until_a_start_succeeds() {
    let own = {
        let plain = start(json!({"plain": fixture(json!({}))})).await.unwrap();
        let own = plain.status("plain").tools.len();
        plain.shut_down().await;
        own
    };
    let started = start(json!({"full": fixture(json!({
        "env": {"FIXTURE_EXTRA_TOOLS": (agent::mcp::MAX_TOOLS - own).to_string()},
    }))}))
    .await
    .unwrap();
    let mut run = started.context(ApprovalPolicy::Trusted);
    let (pid, _) = spawn_child(&mut run, "full", false).await;
    run.call("mcp__full__add_tools", json!({"count": 1})).await;
    started
        .until_status("full", |status| status.tools.is_empty())
        .await;
    std::fs::write(started.file("fixture-refuse-start"), "").unwrap();
    // SAFETY: kill takes a pid and a signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let refused = started
        .until_status("full", |status| {
            status
                .message
                .as_deref()
                .is_some_and(|message| message.contains("could not start again"))
        })
        .await;
    assert_eq!(refused.state, McpServerState::Crashed);
    assert!(refused.tools.is_empty());
    std::fs::remove_file(started.file("fixture-refuse-start")).unwrap();
    let again = started
        .until_status("full", |status| !status.tools.is_empty())
        .await;
    assert_eq!(again.state, McpServerState::Ready);
    assert_eq!(again.tools.len(), agent::mcp::MAX_TOOLS);
    started.shut_down().await;
}

/// A server that offers no tool at all and exits is not started again in a loop: only a server whose tools toolgate
/// withdrew is started again by itself (no call could start it), and this one's were never there.
#[tokio::test]
async fn a_server_offering_no_tool_that_exits_is_not_started_again_by_itself() {
    let started = start(json!({"quiet": fixture(json!({
        "enabled_tools": ["no_such_tool"],
        "env": {"FIXTURE_LOG_START": "1", "FIXTURE_EXIT_AFTER_MS": "300"},
    }))}))
    .await
    .unwrap();
    assert!(started.status("quiet").tools.is_empty());
    started
        .until_status("quiet", |status| status.state == McpServerState::Crashed)
        .await;
    // Long enough for several starts, were it started again as it exits.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(started.fixture_calls(), ["started"]);
    started.shut_down().await;
}
