//! Test doubles that speak the harness's real interfaces: a model that replays scripted steps and records what it
//! was asked, and a tool that counts its executions; and a harness over them, read through its event stream.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::agent_loop::LoopLimits;
use agent::harness::{Actor, Harness, HarnessConfig, RunHandle, RunSource, StartRun};
use agent::ids::ToolCallId;
use agent::model::{Model, ModelChunk, ModelRequest, ModelStream};
use agent::policy::{PermissionPolicy, RuleSet};
use agent::store::EncodedEvent;
use agent::tools::{Tool, ToolContext, ToolFuture, Toolbox};
use agent::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalRequest, Decision, Message, RunErrorCode, StreamEvent,
    ToolAnnotations, ToolCall, ToolSpec,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

/// A model that plays back one scripted step per request and records every conversation it was sent.
pub struct ReplayModel {
    steps: Mutex<Vec<Vec<ModelChunk>>>,
    pub requests: Mutex<Vec<Vec<Message>>>,
}

impl ReplayModel {
    pub fn new(steps: Vec<Vec<ModelChunk>>) -> Self {
        let mut steps = steps;
        steps.reverse();
        Self {
            steps: Mutex::new(steps),
            requests: Mutex::new(Vec::new()),
        }
    }

    pub fn requests(&self) -> Vec<Vec<Message>> {
        self.requests.lock().unwrap().clone()
    }
}

impl Model for ReplayModel {
    fn name(&self) -> &str {
        "replay"
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        self.requests
            .lock()
            .unwrap()
            .push(request.messages.to_vec());
        let step = self
            .steps
            .lock()
            .unwrap()
            .pop()
            .unwrap_or_else(|| vec![ModelChunk::Text("(out of script)".into())]);
        futures::stream::iter(step.into_iter().map(Ok)).boxed()
    }
}

pub fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: ToolCallId::parse(id).unwrap(),
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

pub fn tool_step(calls: &[ToolCall]) -> Vec<ModelChunk> {
    calls.iter().cloned().map(ModelChunk::ToolCall).collect()
}

pub fn text_step(text: &str) -> Vec<ModelChunk> {
    vec![ModelChunk::Text(text.into())]
}

/// A tool that records each input it runs with.
pub struct CountingTool {
    spec: ToolSpec,
    pub runs: Arc<Mutex<Vec<Value>>>,
}

impl CountingTool {
    pub fn new(name: &str, annotations: ToolAnnotations) -> Self {
        Self {
            spec: ToolSpec {
                name: name.into(),
                description: format!("The {name} test tool"),
                input_schema: json!({
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                    "additionalProperties": false
                }),
                annotations,
                mcp: None,
            },
            runs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn destructive(name: &str) -> Self {
        Self::new(
            name,
            ToolAnnotations {
                read_only: Some(false),
                destructive: Some(true),
                idempotent: Some(true),
                open_world: Some(false),
            },
        )
    }

    pub fn read_only(name: &str) -> Self {
        Self::new(
            name,
            ToolAnnotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: Some(true),
                open_world: Some(false),
            },
        )
    }
}

impl Tool for CountingTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.runs.lock().unwrap().push(input.clone());
            Ok(json!({"done": input}))
        })
    }
}

/// The executions of a tool, counted from outside.
#[derive(Clone)]
pub struct Runs(pub Arc<Mutex<Vec<Value>>>);

impl Runs {
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn inputs(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }
}

/// A harness on a memory store over a toolbox of `delete_file` (destructive) and `read_file` (read-only) counting
/// tools, driven by a replayed model.
pub struct Fixture {
    pub harness: Harness,
    pub model: Arc<ReplayModel>,
    pub deletes: Runs,
    pub reads: Runs,
}

pub fn fixture_with(
    policy: ApprovalPolicy,
    rules: RuleSet,
    limits: LoopLimits,
    steps: Vec<Vec<ModelChunk>>,
) -> Fixture {
    let model = Arc::new(ReplayModel::new(steps));
    let tools = counting_tools(Arc::clone(&model) as Arc<dyn Model>, policy, rules, limits);
    Fixture {
        harness: tools.harness,
        model,
        deletes: tools.deletes,
        reads: tools.reads,
    }
}

/// A harness on a memory store over `delete_file` and `read_file` counting tools and any model.
pub struct CountingTools {
    pub harness: Harness,
    pub deletes: Runs,
    pub reads: Runs,
}

pub fn counting_tools(
    model: Arc<dyn Model>,
    policy: ApprovalPolicy,
    rules: RuleSet,
    limits: LoopLimits,
) -> CountingTools {
    let (toolbox, deletes, reads) = counting_toolbox();
    let mut config = HarnessConfig::new(
        PermissionPolicy::new(policy, rules),
        Duration::from_secs(120),
    );
    config.limits = limits;
    CountingTools {
        harness: Harness::new(config, model, toolbox),
        deletes,
        reads,
    }
}

fn counting_toolbox() -> (Toolbox, Runs, Runs) {
    let delete = CountingTool::destructive("delete_file");
    let read = CountingTool::read_only("read_file");
    let deletes = Runs(Arc::clone(&delete.runs));
    let reads = Runs(Arc::clone(&read.runs));
    let toolbox = Toolbox::new().with(delete).unwrap().with(read).unwrap();
    (toolbox, deletes, reads)
}

/// The same on `store`, as one of the instances that share it (the default policy, no configured rules).
#[cfg(feature = "sql")]
pub async fn counting_tools_on(
    model: Arc<dyn Model>,
    store: Arc<dyn agent::store::Store>,
) -> CountingTools {
    let (toolbox, deletes, reads) = counting_toolbox();
    let config = HarnessConfig::new(
        PermissionPolicy::new(ApprovalPolicy::OnRequest, RuleSet::new()),
        Duration::from_secs(120),
    );
    CountingTools {
        harness: Harness::open(config, model, toolbox, store).await.unwrap(),
        deletes,
        reads,
    }
}

/// A harness on the durable default: a SQLite file in `dir`, the built-in tools on the workspace `dir/ws`, the
/// scripted model, and the default policy (`on_request`, no rules) with `approval_timeout`.
#[cfg(feature = "sql")]
pub async fn sqlite_harness(dir: &std::path::Path, approval_timeout: Duration) -> Harness {
    use agent::store::sql::{DatabaseUrl, SqlStore};
    let workspace = agent::tools::Workspace::open(dir.join("ws")).unwrap();
    let store = SqlStore::open(&DatabaseUrl::Sqlite(dir.join("toolgate.db")))
        .await
        .unwrap();
    Harness::open(
        HarnessConfig::new(
            PermissionPolicy::new(ApprovalPolicy::OnRequest, Default::default()),
            approval_timeout,
        ),
        Arc::new(agent::model::ScriptedModel::new()),
        agent::tools::workspace_tools(&workspace, Default::default()),
        store,
    )
    .await
    .unwrap()
}

pub fn fixture(policy: ApprovalPolicy, rules: RuleSet, steps: Vec<Vec<ModelChunk>>) -> Fixture {
    fixture_with(policy, rules, LoopLimits::default(), steps)
}

/// The default policy (`on_request`, no rules).
pub fn on_request(steps: Vec<Vec<ModelChunk>>) -> Fixture {
    fixture(ApprovalPolicy::OnRequest, RuleSet::new(), steps)
}

/// The audit log, oldest first (the first hundred entries: more than a test writes).
pub async fn audit_entries(harness: &Harness) -> Vec<agent::store::AuditEntry> {
    harness
        .audit_log(agent::store::AuditQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Starts a run of `message` in a session of its own.
pub async fn start_run(harness: &Harness, mode: ApprovalMode, message: &str) -> RunHandle {
    harness
        .start(StartRun {
            message: message.into(),
            session_id: None,
            policy: None,
            mode,
            run_id: None,
            source: RunSource::Session,
            refused_while_interrupted: false,
        })
        .await
        .unwrap()
}

/// An interactive run of `message` in the session `session_id`.
pub fn start_in(session_id: &str, message: &str) -> StartRun {
    StartRun {
        message: message.into(),
        session_id: Some(session_id.parse().unwrap()),
        policy: None,
        mode: ApprovalMode::Interactive,
        run_id: None,
        source: RunSource::Session,
        refused_while_interrupted: false,
    }
}

/// Decides a pending approval as a person at this machine.
pub async fn decide_pending(harness: &Harness, request: &ApprovalRequest, decision: Decision) {
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            decision,
            &Actor::local(),
        )
        .await
        .expect("the approval is pending");
}

impl Fixture {
    pub async fn start(&self, mode: ApprovalMode, message: &str) -> RunHandle {
        start_run(&self.harness, mode, message).await
    }

    pub async fn decide(&self, request: &ApprovalRequest, decision: Decision) {
        decide_pending(&self.harness, request, decision).await;
    }

    pub async fn pending(&self) -> Vec<ApprovalRequest> {
        self.harness.pending(None).await.unwrap()
    }
}

/// Reads a run's events as they come.
pub struct Events(BoxStream<'static, Arc<EncodedEvent>>);

impl Events {
    pub fn of(run: &RunHandle) -> Self {
        Self(run.subscribe(0))
    }

    /// The next event that matches, with its sequence number.
    pub async fn until(&mut self, matches: impl Fn(&StreamEvent) -> bool) -> (u64, StreamEvent) {
        while let Some(encoded) = self.0.next().await {
            let event: StreamEvent = serde_json::from_str(&encoded.json).unwrap();
            assert_eq!(encoded.kind, event.kind());
            if matches(&event) {
                return (encoded.seq, event);
            }
        }
        panic!("the run ended first");
    }

    /// The next approval the run asks for.
    pub async fn next_approval(&mut self) -> ApprovalRequest {
        match self
            .until(|e| matches!(e, StreamEvent::ApprovalRequired { .. }))
            .await
        {
            (_, StreamEvent::ApprovalRequired { request }) => request,
            _ => unreachable!(),
        }
    }

    /// The run's terminal event.
    pub async fn end(&mut self) -> StreamEvent {
        self.until(StreamEvent::is_terminal).await.1
    }

    /// Everything up to the run's end.
    pub async fn rest(self) -> Vec<StreamEvent> {
        self.0
            .map(|encoded| serde_json::from_str(&encoded.json).unwrap())
            .collect()
            .await
    }
}

/// Every event of a run, decoded, once it ended.
pub async fn all_events(run: &RunHandle) -> Vec<StreamEvent> {
    run.finished().await;
    Events::of(run).rest().await
}

/// The answer of a run that ended with one.
pub fn answer(events: &[StreamEvent]) -> Option<&str> {
    events.iter().find_map(|event| match event {
        StreamEvent::Done { answer, .. } => Some(answer.as_str()),
        _ => None,
    })
}

/// The error a run ended with.
pub fn failure(events: &[StreamEvent]) -> Option<(RunErrorCode, &str)> {
    events.iter().find_map(|event| match event {
        StreamEvent::Error { code, message, .. } => Some((*code, message.as_str())),
        _ => None,
    })
}

/// The `type`s of the events about one tool call, in order (no debug events).
pub fn call_kinds(events: &[StreamEvent], call_id: &str) -> Vec<&'static str> {
    events
        .iter()
        .filter(|event| match event {
            StreamEvent::ToolCall { tool_call_id, .. }
            | StreamEvent::ApprovalResolved { tool_call_id, .. }
            | StreamEvent::ToolResult { tool_call_id, .. } => tool_call_id.as_str() == call_id,
            StreamEvent::ApprovalRequired { request } => request.tool_call_id.as_str() == call_id,
            _ => false,
        })
        .map(StreamEvent::kind)
        .collect()
}

/// Each tool result the model was sent, in order.
pub fn tool_results(messages: &[Message]) -> Vec<(String, agent::wire::ToolOutput)> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_name, output, ..
            } => Some((tool_name.clone(), output.clone())),
            _ => None,
        })
        .collect()
}

pub fn rules(text: &str) -> RuleSet {
    text.parse().unwrap()
}

/// A harness on a memory store over any model and toolbox.
pub fn harness_over(model: Arc<dyn Model>, toolbox: Toolbox, policy: ApprovalPolicy) -> Harness {
    let config = HarnessConfig::new(
        PermissionPolicy::new(policy, RuleSet::new()),
        Duration::from_secs(120),
    );
    Harness::new(config, model, toolbox)
}

/// Starts an interactive run of `message` in a new session.
pub async fn start_interactive(harness: &Harness, message: &str) -> RunHandle {
    harness
        .start(StartRun {
            message: message.into(),
            session_id: None,
            policy: None,
            mode: ApprovalMode::Interactive,
            run_id: None,
            source: RunSource::Session,
            refused_while_interrupted: false,
        })
        .await
        .unwrap()
}

/// Approves `request` in the store alone, as a decision is before its run goes on, with `arguments` if given.
pub async fn approved_in_the_store(
    harness: &Harness,
    request: &ApprovalRequest,
    arguments: Option<Value>,
) {
    harness
        .store()
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Box::new(move |record| {
                Ok(agent::approvals::settlement(
                    record,
                    agent::wire::Resolution::from_decision(
                        Decision::Approve {
                            scope: agent::wire::DecisionScope::Once,
                            reason: None,
                            arguments,
                        },
                        &record.input,
                    ),
                    Some("local"),
                ))
            }),
        )
        .await
        .unwrap()
        .unwrap();
}
