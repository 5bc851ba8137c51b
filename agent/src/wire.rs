//! The types that cross the wire between the server and its clients (the browser included).
//!
//! Everything here is plain serde and compiles to wasm32 without tokio, so the browser and the server share one
//! definition of every event, request and resolution.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{RunId, SessionId, ToolCallId};
use crate::permissions::{ApprovalChoices, SessionGrant};

/// How readily tool calls run without asking a person.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Nothing asks. Ordered first: the loosest.
    Trusted,
    /// Read-only tools run; anything destructive or not fully annotated asks.
    #[default]
    OnRequest,
    /// Every call asks.
    Strict,
}

impl ApprovalPolicy {
    pub const ALL: [ApprovalPolicy; 3] = [Self::Trusted, Self::OnRequest, Self::Strict];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trusted => "trusted",
            Self::OnRequest => "on_request",
            Self::Strict => "strict",
        }
    }
}

impl fmt::Display for ApprovalPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "trusted" => Ok(Self::Trusted),
            "on_request" => Ok(Self::OnRequest),
            "strict" => Ok(Self::Strict),
            other => Err(format!(
                "unknown policy {other:?}: expected one of on_request, strict, trusted"
            )),
        }
    }
}

/// What happens when the policy says `ask`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// No channel to a person: the run fails with an approval-required error.
    #[default]
    FailClosed,
    /// Register a pending approval and wait for a decision, a timeout or an abort.
    Interactive,
    /// End the run with the calls that need a person, as interrupts; a later run resumes with the decisions
    /// (the AG-UI model).
    Interrupt,
}

/// What a rule does with the calls it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    Allow,
    Ask,
    Deny,
}

impl RuleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }
}

impl fmt::Display for RuleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RuleAction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "allow" => Ok(Self::Allow),
            "ask" => Ok(Self::Ask),
            "deny" => Ok(Self::Deny),
            other => Err(format!(
                "unknown rule action {other:?}: expected allow, ask or deny"
            )),
        }
    }
}

/// The permission decision for one tool call, with the reason a person (and the model) is shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PermissionDecision {
    Allow { reason: String },
    Ask { reason: String },
    Deny { reason: String },
}

impl PermissionDecision {
    pub fn reason(&self) -> &str {
        match self {
            Self::Allow { reason } | Self::Ask { reason } | Self::Deny { reason } => reason,
        }
    }
}

/// MCP-style hints about what a tool does. `None` means the tool did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

impl ToolAnnotations {
    /// True when every hint is given.
    pub fn is_complete(&self) -> bool {
        self.read_only.is_some()
            && self.destructive.is_some()
            && self.idempotent.is_some()
            && self.open_world.is_some()
    }
}

/// What the model (and the UI) learns about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// What the tool says about itself. For a tool of an MCP server these are the server's claims, which the
    /// policy believes only when the server is trusted (see [`McpToolOrigin::trust`]).
    #[serde(default)]
    pub annotations: ToolAnnotations,
    /// Set when the tool belongs to an MCP server rather than to toolgate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpToolOrigin>,
}

/// How far toolgate believes what an MCP server says about its tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTrust {
    /// The MCP specification's default: the server's annotations may make the policy stricter, never looser, so
    /// every call asks unless a rule allows it.
    #[default]
    Untrusted,
    /// The server's annotations decide as a built-in tool's do.
    Annotations,
}

impl McpTrust {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Untrusted => "untrusted",
            Self::Annotations => "annotations",
        }
    }
}

/// Which MCP server a tool belongs to, under which name it knows the tool, and how far it is trusted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpToolOrigin {
    /// The server's name, as configured.
    pub server: String,
    /// The tool's own name on that server (the model sees `mcp__server__tool`, made safe).
    pub tool: String,
    pub trust: McpTrust,
    /// How the server is reached, as a digest (SHA-256, hex) of its command and arguments or of its URL: part of
    /// the tool's definition, so that a session grant for a tool does not cover it once the server's name leads
    /// somewhere else (a staging URL changed to production's, another program). Its environment and headers are
    /// left out, as a rotated token is the same server. Empty in a definition an older version wrote.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
}

/// How an MCP server is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTransportKind {
    /// A child process speaking JSON-RPC on its standard input and output.
    Stdio,
    /// Streamable HTTP.
    Http,
}

/// Where an MCP server is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// Connecting and listing its tools.
    Starting,
    /// Connected; its tools are available.
    Ready,
    /// It could not start; it has no tools.
    Failed,
    /// It stopped after it was ready; it is started again, with backoff, when one of its tools is called.
    Crashed,
    /// Turned off in the configuration.
    Disabled,
    /// Stopped because toolgate is shutting down.
    Stopped,
}

/// An MCP server as `/api/tools` and the page show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    pub name: String,
    pub transport: McpTransportKind,
    pub trust: McpTrust,
    /// Whether toolgate refuses to start without it.
    pub required: bool,
    pub state: McpServerState,
    /// What went wrong, when something did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The end of what a stdio server wrote to its standard error, when it failed or crashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// Its tools, by the names the model sees.
    #[serde(default)]
    pub tools: Vec<String>,
}

/// A tool call as the model asked for it. `arguments` is the raw JSON text the model produced, which may not be
/// valid JSON: that is a recoverable error for the model, not a crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub id: ToolCallId,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as the tool reads them: the JSON text parsed, blank text (what models send for a call without
    /// arguments) as an empty object.
    pub fn arguments_json(&self) -> serde_json::Result<Value> {
        if self.arguments.trim().is_empty() {
            Ok(Value::Object(Default::default()))
        } else {
            serde_json::from_str(&self.arguments)
        }
    }

    /// The arguments as JSON when they parse, otherwise the raw text as a JSON string.
    pub fn arguments_value(&self) -> Value {
        serde_json::from_str(&self.arguments)
            .unwrap_or_else(|_| Value::String(self.arguments.clone()))
    }
}

/// One message of a conversation, as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    #[serde(rename_all = "camelCase")]
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        tool_call_id: ToolCallId,
        tool_name: String,
        output: ToolOutput,
    },
}

/// Machine-readable codes of recoverable tool outputs. The model sees them and can change course.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ToolErrorCode {
    /// A person (or a timeout, or an abort) denied the call.
    ApprovalDenied,
    /// The policy or a rule denies this tool.
    PermissionDenied,
    /// The model named a tool that does not exist.
    UnknownTool,
    /// The arguments are not valid JSON.
    InvalidArguments,
    /// The arguments do not satisfy the tool's input schema.
    InvalidInput,
    /// The same call was repeated too often.
    RepeatedCall,
    /// A path leaves the workspace.
    OutsideWorkspace,
    NotFound,
    Timeout,
    /// Any other failure reported by the tool.
    ToolFailed,
}

impl ToolErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApprovalDenied => "APPROVAL_DENIED",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::UnknownTool => "UNKNOWN_TOOL",
            Self::InvalidArguments => "INVALID_ARGUMENTS",
            Self::InvalidInput => "INVALID_INPUT",
            Self::RepeatedCall => "REPEATED_CALL",
            Self::OutsideWorkspace => "OUTSIDE_WORKSPACE",
            Self::NotFound => "NOT_FOUND",
            Self::Timeout => "TIMEOUT",
            Self::ToolFailed => "TOOL_FAILED",
        }
    }
}

/// What a tool call gave back to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum ToolOutput {
    Ok {
        content: Value,
    },
    Error {
        code: ToolErrorCode,
        message: String,
    },
}

impl ToolOutput {
    pub fn error(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            code,
            message: message.into(),
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok { .. })
    }

    /// The output as the model reads it, at most about `limit` bytes of text: a longer one keeps its head and its
    /// tail around a note that says how much was left out and that the run's log has all of it.
    pub fn bounded_for_model(self, limit: usize) -> Self {
        match self {
            Self::Ok {
                content: Value::String(text),
            } => Self::Ok {
                content: Value::String(head_and_tail(text, limit)),
            },
            Self::Ok { content } => {
                let text = content.to_string();
                if text.len() <= limit {
                    return Self::Ok { content };
                }
                Self::Ok {
                    content: Value::String(head_and_tail(text, limit)),
                }
            }
            Self::Error { code, message } => Self::Error {
                code,
                message: head_and_tail(message, limit),
            },
        }
    }

    /// The text the model receives as the tool's result.
    pub fn model_text(&self) -> String {
        match self {
            Self::Ok {
                content: Value::String(text),
            } => text.clone(),
            Self::Ok { content } => content.to_string(),
            Self::Error { code, message } => serde_json::json!({
                "error": { "code": code.as_str(), "message": message }
            })
            .to_string(),
        }
    }
}

/// `text` when it fits in `limit` bytes; otherwise its first and last `limit / 2` bytes (on character boundaries)
/// around a note.
fn head_and_tail(text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut head_end = limit / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - limit / 2;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[... {} of {} bytes left out here: a tool result gives the model at most {limit} bytes. The whole result is in the run's log. ...]\n{}",
        &text[..head_end],
        tail_start - head_end,
        text.len(),
        &text[tail_start..]
    )
}

/// The sentence the model receives when a call is denied. Its wording steers the model away from retrying.
pub fn approval_denied_message(reason: &str) -> String {
    let reason = reason.trim();
    let reason = if reason.ends_with(['.', '!', '?']) {
        reason.to_owned()
    } else {
        format!("{reason}.")
    };
    format!(
        "{reason} The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer."
    )
}

/// A pending approval as clients see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
    pub tool_name: String,
    pub arguments: Value,
    /// Why the policy asks.
    pub reason: String,
    /// What the card offers beyond approving once: the session grant each scope would create, and the rule
    /// "Always allow" would add.
    #[serde(default, skip_serializing_if = "ApprovalChoices::is_empty")]
    pub choices: ApprovalChoices,
    /// Milliseconds since the Unix epoch.
    pub requested_at: u64,
    /// Milliseconds since the Unix epoch; after this the call is denied with source `timeout`.
    pub expires_at: u64,
    /// What the call would do, worked out by the server when it asked, from the workspace as it was then: every
    /// viewer shows the same. Absent for tools that offer none (the arguments say it all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<ApprovalPreview>,
}

/// What a call waiting for approval would do, in the terms a person checks: the change to a file, what a deletion
/// loses, the exact program and arguments of a command. Bounded in size whatever the file or the arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ApprovalPreview {
    /// `write_file`: the file as it is against what would be written.
    #[serde(rename_all = "camelCase")]
    FileWrite { path: String, diff: FileDiff },
    /// `delete_file`: what would be lost.
    #[serde(rename_all = "camelCase")]
    FileDelete {
        path: String,
        bytes: u64,
        /// The first lines of the file (empty when it is not text).
        head: Vec<String>,
        /// More lines follow the head.
        more: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// `run_command`: the program and each argument as it reaches the program (no shell splits or expands them).
    #[serde(rename_all = "camelCase")]
    Command {
        program: String,
        args: Vec<String>,
        directory: String,
    },
    /// Any tool: its arguments one by one, and the MCP server it belongs to.
    #[serde(rename_all = "camelCase")]
    Fields {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
        /// The tool's own name on that server, where the name the model sees does not spell it (made safe, or cut
        /// short to the 64 characters model APIs take).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        fields: Vec<PreviewField>,
    },
    /// No preview could be made: the call would fail or be refused, and this says why.
    #[serde(rename_all = "camelCase")]
    Unavailable { reason: String },
}

/// A fingerprint of an event's JSON as the log keeps it and the stream sends it (64-bit FNV-1a): a page that
/// reconnects compares the event it applied last with the one the server's log has under its number, which differ
/// when a power loss took the server's last writes and it wrote others since. Not a digest for anything a client
/// could choose to collide with: a mismatch only makes the page read the conversation again.
pub fn event_fingerprint(json: &str) -> u64 {
    json.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One argument, formatted for reading: a string as itself, anything else as indented JSON; a string that would read
/// as JSON of a single value (`"false"`, `"5"`, `"null"`, or quoted text) is written as JSON too, quoted, so that the
/// text `false` and the flag `false` never look the same. (A text holding a JSON document stays as itself, on its own
/// lines: a list or an object shown is indented, and a file's content quoted on one line could not be read.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewField {
    pub name: String,
    pub value: String,
}

impl ApprovalPreview {
    /// The generic form: each top-level argument on its own (a non-object is one field named `arguments`).
    pub fn fields(server: Option<String>, tool: Option<String>, arguments: &Value) -> Self {
        let format = |value: &Value| match value {
            Value::String(text)
                if !serde_json::from_str::<Value>(text)
                    .is_ok_and(|value| !value.is_array() && !value.is_object()) =>
            {
                text.clone()
            }
            other => serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
        };
        let fields = match arguments {
            Value::Object(map) => map
                .iter()
                .map(|(name, value)| PreviewField {
                    name: name.clone(),
                    value: format(value),
                })
                .collect(),
            other => vec![PreviewField {
                name: "arguments".into(),
                value: format(other),
            }],
        };
        Self::Fields {
            server,
            tool,
            fields,
        }
    }
}

/// A line diff of a file, with line numbers; long unchanged stretches folded, and at most a bounded number of lines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileDiff {
    /// The file does not exist yet: every line is added.
    pub new_file: bool,
    /// The size of the file as it is, when it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_bytes: Option<u64>,
    pub new_bytes: u64,
    pub added: u32,
    pub removed: u32,
    pub lines: Vec<DiffLine>,
    /// Lines of the diff left out after `lines`, past the bound.
    #[serde(default)]
    pub omitted: u32,
    /// Why there is no line diff (the file is too large or not text), when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One line of a [`FileDiff`]. Line numbers start at 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum DiffLine {
    Same {
        old: u32,
        new: u32,
        text: String,
    },
    Added {
        new: u32,
        text: String,
    },
    Removed {
        old: u32,
        text: String,
    },
    /// `count` unchanged lines, from `old` in the file as it is and `new` in what would be written, not shown.
    Folded {
        old: u32,
        new: u32,
        count: u32,
    },
}

/// A call an interrupted run left for a person; a later run answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptRequest {
    /// The interrupt's id, which the resume answers.
    pub id: String,
    pub tool_call_id: ToolCallId,
    pub tool_name: String,
    pub arguments: Value,
    /// Why the policy asks.
    pub reason: String,
    /// Milliseconds since the Unix epoch; a resume after this is refused.
    pub expires_at: u64,
    /// What approving it may cover beyond this call, as the page's card offers it: an AG-UI client shows it. Empty
    /// for an interrupt an older version issued.
    #[serde(
        default,
        skip_serializing_if = "crate::permissions::ApprovalChoices::is_empty"
    )]
    pub choices: crate::permissions::ApprovalChoices,
}

/// Who approved a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalSource {
    User,
}

/// Who (or what) denied a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenialSource {
    User,
    Timeout,
    Abort,
}

/// How far an approval reaches. A session scope covers what the card showed, no more: see
/// [`GrantScope`](crate::permissions::GrantScope) for what each tool's session grant covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionScope {
    /// This call only.
    #[default]
    Once,
    /// This call and, for the rest of the session, later calls the card said it covers: for `run_command` the
    /// same program with the same arguments, for a file tool any path in the workspace, for any other tool that
    /// tool while its definition stays the same.
    Session,
    /// `run_command` only, chosen explicitly: this program with any arguments, for the rest of the session.
    SessionProgram,
}

impl DecisionScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Once => "once",
            Self::Session => "session",
            Self::SessionProgram => "session_program",
        }
    }
}

/// How a pending approval ended. It ends exactly once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Resolution {
    Approved {
        source: ApprovalSource,
        #[serde(default)]
        scope: DecisionScope,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Arguments the person edited before approving; they replace the model's.
        #[serde(
            default,
            rename = "editedArguments",
            skip_serializing_if = "Option::is_none"
        )]
        edited_arguments: Option<Value>,
    },
    Denied {
        source: DenialSource,
        reason: String,
    },
}

impl Resolution {
    pub fn is_approved(&self) -> bool {
        matches!(self, Self::Approved { .. })
    }
}

/// A person's decision on a pending approval, validated.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Approve {
        scope: DecisionScope,
        reason: Option<String>,
        arguments: Option<Value>,
    },
    Deny {
        reason: Option<String>,
    },
}

impl Decision {
    pub fn approve() -> Self {
        Self::Approve {
            scope: DecisionScope::Once,
            reason: None,
            arguments: None,
        }
    }

    pub fn deny() -> Self {
        Self::Deny { reason: None }
    }
}

/// Codes of errors that end a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunErrorCode {
    /// Fail-closed mode met a call that needs approval.
    ApprovalRequired,
    StepLimit,
    RepeatedCall,
    Aborted,
    Shutdown,
    Model,
    EventLimit,
    /// The server restarted (or the instance running it died) while the run was sampling the model.
    Restarted,
    /// The store could not record the run's progress, or read what it saved of it.
    Store,
    Internal,
}

/// The events a run streams, as JSON objects with a `type` field. The same name is the SSE `event:` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum StreamEvent {
    /// The run began: the user's message and the policy it runs under.
    #[serde(rename_all = "camelCase")]
    RunStarted {
        run_id: RunId,
        session_id: SessionId,
        message: String,
        policy: ApprovalPolicy,
        approval_mode: ApprovalMode,
        /// The interrupted run this one resumes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<RunId>,
    },
    /// A step of the sampling loop began (1-based).
    #[serde(rename_all = "camelCase")]
    Step { run_id: RunId, step: u32 },
    /// Text from the model, as it arrives.
    #[serde(rename_all = "camelCase")]
    AssistantDelta {
        run_id: RunId,
        step: u32,
        delta: String,
    },
    /// The model asked for a tool call, and the policy decided.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        run_id: RunId,
        step: u32,
        tool_call_id: ToolCallId,
        tool_name: String,
        arguments: Value,
        permission: PermissionDecision,
    },
    /// A call waits for a person.
    ApprovalRequired { request: ApprovalRequest },
    /// A pending call was approved or denied.
    #[serde(rename_all = "camelCase")]
    ApprovalResolved {
        run_id: RunId,
        tool_call_id: ToolCallId,
        tool_name: String,
        resolution: Resolution,
        /// The session grant the approval created, when it was approved for the session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grant: Option<SessionGrant>,
    },
    /// A call finished (or was refused) and its output went to the model.
    #[serde(rename_all = "camelCase")]
    ToolResult {
        run_id: RunId,
        tool_call_id: ToolCallId,
        tool_name: String,
        /// The arguments the tool ran with, when a person edited them before approving.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        executed_arguments: Option<Value>,
        output: ToolOutput,
        duration_ms: u64,
    },
    /// Runtime observations for the debug console. The UI never depends on them.
    #[serde(rename_all = "camelCase")]
    Debug {
        run_id: RunId,
        /// Milliseconds since the Unix epoch.
        at: u64,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
    },
    /// What the model is sent was bounded: the oldest turns of the conversation were left out of it (they stay in
    /// the session).
    #[serde(rename_all = "camelCase")]
    ContextTrimmed {
        run_id: RunId,
        step: u32,
        /// Messages left out, the oldest ones.
        omitted_messages: u32,
    },
    /// The run ended with a final answer.
    #[serde(rename_all = "camelCase")]
    Done {
        run_id: RunId,
        answer: String,
        steps: u32,
    },
    /// The run ended because calls need a person; a later run resumes it.
    #[serde(rename_all = "camelCase")]
    Interrupted {
        run_id: RunId,
        interrupts: Vec<InterruptRequest>,
    },
    /// The run ended with an error.
    #[serde(rename_all = "camelCase")]
    Error {
        run_id: RunId,
        code: RunErrorCode,
        message: String,
    },
}

impl StreamEvent {
    /// The value of the `type` field, also used as the SSE `event:` name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "runStarted",
            Self::Step { .. } => "step",
            Self::AssistantDelta { .. } => "assistantDelta",
            Self::ToolCall { .. } => "toolCall",
            Self::ApprovalRequired { .. } => "approvalRequired",
            Self::ApprovalResolved { .. } => "approvalResolved",
            Self::ToolResult { .. } => "toolResult",
            Self::Debug { .. } => "debug",
            Self::ContextTrimmed { .. } => "contextTrimmed",
            Self::Done { .. } => "done",
            Self::Interrupted { .. } => "interrupted",
            Self::Error { .. } => "error",
        }
    }

    /// Every event name, for clients that subscribe by name (EventSource).
    pub const KINDS: [&'static str; 12] = [
        "runStarted",
        "step",
        "assistantDelta",
        "toolCall",
        "approvalRequired",
        "approvalResolved",
        "toolResult",
        "debug",
        "contextTrimmed",
        "done",
        "interrupted",
        "error",
    ];

    /// True for the events that end a run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Done { .. } | Self::Interrupted { .. } | Self::Error { .. }
        )
    }
}

/// An event with its per-run sequence number (the SSE `id:`), starting at 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    pub seq: u64,
    pub event: StreamEvent,
}

/// A 400 body in the shape clients know from Zod's `flatten()`: errors about the whole body, and errors per field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationErrors {
    pub form_errors: Vec<String>,
    pub field_errors: BTreeMap<String, Vec<String>>,
}

impl ValidationErrors {
    pub fn form(message: impl Into<String>) -> Self {
        Self {
            form_errors: vec![message.into()],
            field_errors: BTreeMap::new(),
        }
    }

    pub fn field(&mut self, field: &str, message: impl Into<String>) {
        self.field_errors
            .entry(field.to_owned())
            .or_default()
            .push(message.into());
    }

    pub fn is_empty(&self) -> bool {
        self.form_errors.is_empty() && self.field_errors.is_empty()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.form_errors.clone();
        for (field, errors) in &self.field_errors {
            for error in errors {
                parts.push(format!("{field}: {error}"));
            }
        }
        f.write_str(&parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A card's fields tell a text from the value it spells: the flag `false` and the text "false" read otherwise.
    #[test]
    fn a_field_that_is_text_never_reads_as_another_value() {
        let shown = |arguments: Value| -> Vec<String> {
            match ApprovalPreview::fields(None, None, &arguments) {
                ApprovalPreview::Fields { fields, .. } => {
                    fields.into_iter().map(|field| field.value).collect()
                }
                other => panic!("{other:?}"),
            }
        };
        let values = [
            (json!(false), "false"),
            (json!("false"), "\"false\""),
            (json!(5), "5"),
            (json!("5"), "\"5\""),
            (json!(null), "null"),
            (json!("null"), "\"null\""),
            (json!("[1]"), "[1]"),
            (
                json!("{\n  \"debug\": false\n}"),
                "{\n  \"debug\": false\n}",
            ),
            (json!("\"quoted\""), "\"\\\"quoted\\\"\""),
            (json!(" true "), "\" true \""),
            (json!("notes.txt"), "notes.txt"),
            (json!("rm -rf build"), "rm -rf build"),
            (json!(""), ""),
        ];
        for (value, expected) in values {
            assert_eq!(
                shown(json!({ "recursive": value.clone() })),
                [expected],
                "{value}"
            );
        }
    }

    #[test]
    fn resolutions_have_the_approval_api_shape() {
        let approved = Resolution::Approved {
            source: ApprovalSource::User,
            scope: DecisionScope::Once,
            reason: None,
            edited_arguments: None,
        };
        assert_eq!(
            serde_json::to_value(&approved).unwrap(),
            json!({"type": "approved", "source": "user", "scope": "once"})
        );
        let denied = Resolution::Denied {
            source: DenialSource::Timeout,
            reason: "No decision arrived in time.".into(),
        };
        assert_eq!(
            serde_json::to_value(&denied).unwrap(),
            json!({"type": "denied", "source": "timeout", "reason": "No decision arrived in time."})
        );
    }

    #[test]
    fn the_denial_wording_is_the_approval_apis() {
        assert_eq!(
            approval_denied_message("The user denied this tool call."),
            "The user denied this tool call. The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer."
        );
        assert!(approval_denied_message("too risky").starts_with("too risky. The action"));
    }

    #[test]
    fn events_carry_their_type_and_kind_matches() {
        let event = StreamEvent::ApprovalResolved {
            run_id: RunId::parse("r").unwrap(),
            tool_call_id: ToolCallId::parse("c").unwrap(),
            tool_name: "delete_file".into(),
            resolution: Resolution::Denied {
                source: DenialSource::User,
                reason: "no".into(),
            },
            grant: None,
        };
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(value["type"], "approvalResolved");
        assert_eq!(value["toolCallId"], "c");
        assert_eq!(value["type"], event.kind());
        let back: StreamEvent = serde_json::from_value(value).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn policies_parse_and_order_from_loose_to_strict() {
        assert_eq!("on-request".parse(), Ok(ApprovalPolicy::OnRequest));
        assert_eq!("STRICT".parse(), Ok(ApprovalPolicy::Strict));
        assert!("yolo".parse::<ApprovalPolicy>().is_err());
        assert!(ApprovalPolicy::Trusted < ApprovalPolicy::OnRequest);
        assert!(ApprovalPolicy::OnRequest < ApprovalPolicy::Strict);
    }

    #[test]
    fn a_long_output_reaches_the_model_as_its_head_and_tail_with_a_note() {
        for short in [json!("short"), json!({"a": [1, 2]})] {
            let short = ToolOutput::Ok { content: short };
            assert_eq!(short.clone().bounded_for_model(100), short);
        }
        let long = format!(
            "{}{}{}",
            "a".repeat(600),
            "b".repeat(10_000),
            "ééé".repeat(200)
        );
        let ToolOutput::Ok {
            content: Value::String(bounded),
        } = (ToolOutput::Ok {
            content: Value::String(long.clone()),
        })
        .bounded_for_model(1_000)
        else {
            panic!("an ok output stays ok");
        };
        assert!(bounded.starts_with(&"a".repeat(500)), "{bounded}");
        assert!(bounded.ends_with(&"é".repeat(250)), "{bounded}");
        assert!(bounded.contains(&format!("of {} bytes left out", long.len())));
        assert!(bounded.contains("The whole result is in the run's log."));
        assert!(bounded.len() < 1_300);
        let ToolOutput::Error { code, message } =
            ToolOutput::error(ToolErrorCode::ToolFailed, "x".repeat(5_000)).bounded_for_model(100)
        else {
            panic!("an error stays an error");
        };
        assert_eq!(code, ToolErrorCode::ToolFailed);
        assert!(
            message.len() < 400 && message.contains("left out"),
            "{message}"
        );
    }

    #[test]
    fn tool_outputs_tell_the_model_the_code() {
        let output = ToolOutput::error(ToolErrorCode::ApprovalDenied, "no");
        assert_eq!(
            output.model_text(),
            r#"{"error":{"code":"APPROVAL_DENIED","message":"no"}}"#
        );
        assert_eq!(
            ToolOutput::Ok {
                content: json!("hi")
            }
            .model_text(),
            "hi"
        );
    }
}
