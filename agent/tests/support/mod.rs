//! Test doubles that speak the harness's real interfaces: a model that replays scripted steps and records what it
//! was asked, and a tool that counts its executions.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::approvals::ApprovalRegistry;
use agent::events::{AgentEvent, EventSink};
use agent::ids::{RunId, SessionId, ToolCallId};
use agent::model::{Model, ModelChunk, ModelRequest, ModelStream};
use agent::policy::{PermissionPolicy, SessionGrants, ToolRules};
use agent::runtime::{RunAbort, RunContext};
use agent::tools::{Tool, ToolContext, ToolFuture, Toolbox};
use agent::wire::{ApprovalMode, ApprovalPolicy, Message, ToolAnnotations, ToolCall, ToolSpec};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

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

/// A run context over a toolbox of `delete_file` (destructive) and `read_file` (read-only) counting tools.
pub struct Fixture {
    pub context: RunContext,
    pub registry: ApprovalRegistry,
    pub events: mpsc::UnboundedReceiver<AgentEvent>,
    pub deletes: Runs,
    pub reads: Runs,
}

pub fn fixture(mode: ApprovalMode, policy: ApprovalPolicy, rules: ToolRules) -> Fixture {
    let delete = CountingTool::destructive("delete_file");
    let read = CountingTool::read_only("read_file");
    let deletes = Runs(Arc::clone(&delete.runs));
    let reads = Runs(Arc::clone(&read.runs));
    let toolbox = Toolbox::new().with(delete).unwrap().with(read).unwrap();
    let registry = ApprovalRegistry::new(Duration::from_secs(120));
    let (sender, events) = mpsc::unbounded_channel();
    let context = RunContext {
        run_id: RunId::parse("run-1").unwrap(),
        session_id: SessionId::parse("session-1").unwrap(),
        approval_mode: mode,
        permissions: PermissionPolicy::new(policy, rules),
        grants: Arc::new(Mutex::new(SessionGrants::new())),
        approvals: registry.clone(),
        approval_timeout: registry.default_timeout(),
        toolbox: Arc::new(toolbox),
        abort: RunAbort::new(),
        events: Arc::new(sender) as Arc<dyn EventSink>,
    };
    Fixture {
        context,
        registry,
        events,
        deletes,
        reads,
    }
}

pub fn interactive() -> Fixture {
    fixture(
        ApprovalMode::Interactive,
        ApprovalPolicy::OnRequest,
        ToolRules::new(),
    )
}

/// Waits for the next `ApprovalRequested` event, returning its tool call id.
pub async fn next_approval(events: &mut mpsc::UnboundedReceiver<AgentEvent>) -> ToolCallId {
    loop {
        match events.recv().await {
            Some(AgentEvent::ApprovalRequested { request }) => return request.tool_call_id,
            Some(_) => continue,
            None => panic!("the run ended without asking for approval"),
        }
    }
}

/// Drains every event emitted so far.
pub fn drain(events: &mut mpsc::UnboundedReceiver<AgentEvent>) -> Vec<AgentEvent> {
    let mut all = Vec::new();
    while let Ok(event) = events.try_recv() {
        all.push(event);
    }
    all
}

/// The last message the model was sent, which after a tool batch is a tool result.
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

pub fn rules(text: &str) -> ToolRules {
    text.parse().unwrap()
}
