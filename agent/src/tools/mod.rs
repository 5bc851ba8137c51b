//! Tools: a name, a description, a JSON Schema for the input, annotations, and an async execute.
//!
//! The [`Toolbox`] holds the tools of a harness with their compiled schemas. Input is validated against the schema
//! before anything runs; invalid input is a recoverable output for the model, never a crash.
//!
//! The set of tools can change while toolgate runs: an MCP server's tools come and go with the server, and the
//! server may change them (`notifications/tools/list_changed`). Those live in an immutable snapshot that a change
//! replaces whole ([`Toolbox::replace_source`]) and that a lookup reads without a lock; a call that started keeps
//! the tool it found. toolgate's own tools sit beside it, fixed, found without touching anything shared.

mod builtin;
pub mod mcp_names;
pub mod preview;
pub(crate) mod process_tree;
mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ids::RunId;
use crate::wire::{ApprovalPreview, McpServerStatus, ToolErrorCode, ToolOutput, ToolSpec};

pub use builtin::{
    CommandLimits, DeleteFile, ListFiles, ReadFile, RunCommand, WriteFile, workspace_tools,
};
pub use workspace::{Workspace, WorkspacePath};

/// A failure the model can read and recover from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ToolError {
    pub code: ToolErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn new(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ToolErrorCode::ToolFailed, message)
    }
}

impl From<ToolError> for ToolOutput {
    fn from(error: ToolError) -> Self {
        ToolOutput::Error {
            code: error.code,
            message: error.message,
        }
    }
}

/// What a tool may know about the run that calls it.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub run_id: RunId,
    /// Cancelled when the run aborts. A tool honours it itself: the runtime reports what the tool returns, even
    /// after an abort, and waits only a short grace period (`runtime::TOOL_ABORT_GRACE`) for it. So a tool that can
    /// take long stops early and says that it stopped; a short, bounded one may simply finish.
    pub cancel: CancellationToken,
}

pub type ToolFuture<'a> = BoxFuture<'a, Result<Value, ToolError>>;

/// A tool the agent can call.
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool with input that already satisfies its schema.
    fn execute<'a>(&'a self, input: Value, context: &'a ToolContext) -> ToolFuture<'a>;

    /// What the input must satisfy beyond what its schema can say (a limit in bytes, where a schema counts
    /// characters), checked with the schema: before a call asks, and for arguments a person edited.
    fn check(&self, _input: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    /// What a call with this input (which satisfies the schema) would do, for the person asked to approve it:
    /// worked out once, when the call asks, and sent with the approval request. It must be quick and bounded, and
    /// touch only what the tool itself may (see [`preview`]). `None`: the arguments say it all.
    fn preview(&self, _input: &Value) -> Option<ApprovalPreview> {
        None
    }

    /// For a tool whose effect depends on something that may change between its card and its approval (a file that
    /// is written or deleted): a fingerprint of that thing as it is now. Taken just before the preview, and again
    /// before an approved call runs; when the two differ, the approval was for something the card did not show, and
    /// the call is not run. It must be quick (metadata, not content). `None`: nothing to compare.
    fn state(&self, _input: &Value) -> Option<String> {
        None
    }

    /// The most of one output the model reads, in bytes of text: a longer output reaches the model as its head and
    /// tail with a note, while the run's log keeps all of it. `None` for tools that bound their own output.
    fn model_output_limit(&self) -> Option<usize> {
        None
    }
}

/// Why a tool cannot join a toolbox.
#[derive(Debug, thiserror::Error)]
pub enum ToolboxError {
    #[error("a tool named {0:?} is already registered")]
    Duplicate(String),
    #[error("the input schema of {tool:?} is not a valid JSON Schema: {message}")]
    InvalidSchema { tool: String, message: String },
}

/// A tool with its compiled input schema.
pub struct RegisteredTool {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
    /// The MCP server it came from; `None` for toolgate's own tools.
    source: Option<String>,
}

impl RegisteredTool {
    fn new(tool: Arc<dyn Tool>, source: Option<String>) -> Result<Self, ToolboxError> {
        let spec = tool.spec();
        let validator = jsonschema::validator_for(&spec.input_schema).map_err(|error| {
            ToolboxError::InvalidSchema {
                tool: spec.name.clone(),
                message: error.to_string(),
            }
        })?;
        Ok(Self {
            tool,
            validator,
            source,
        })
    }

    pub fn tool(&self) -> &Arc<dyn Tool> {
        &self.tool
    }

    pub fn spec(&self) -> &ToolSpec {
        self.tool.spec()
    }

    /// Checks input against the tool's schema. The error lists every violation with where it is.
    pub fn validate(&self, input: &Value) -> Result<(), ToolError> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(input)
            .map(|error| {
                let at = error.instance_path().to_string();
                if at.is_empty() {
                    error.to_string()
                } else {
                    format!("{at}: {error}")
                }
            })
            .collect();
        if problems.is_empty() {
            self.tool.check(input)
        } else {
            Err(ToolError::new(
                ToolErrorCode::InvalidInput,
                format!(
                    "The input for {} does not match its schema: {}",
                    self.spec().name,
                    problems.join("; ")
                ),
            ))
        }
    }
}

/// toolgate's own tools, fixed once the toolbox is built.
#[derive(Clone, Default)]
struct BuiltinTools {
    tools: BTreeMap<String, Arc<RegisteredTool>>,
    /// Their specs in name order, built once: each model step sends them, and a waiting run holds them.
    specs: Arc<[ToolSpec]>,
}

/// One state of the MCP servers' side of the toolbox, replaced whole on every change.
#[derive(Default)]
struct SourceTools {
    tools: BTreeMap<String, Arc<RegisteredTool>>,
    /// Every tool's spec, the built-in ones included, in name order; empty while no source has tools.
    specs: Arc<[ToolSpec]>,
    statuses: BTreeMap<String, McpServerStatus>,
}

/// The tools of a harness, by name, with their compiled input schemas.
///
/// Two parts: toolgate's own tools, registered while the toolbox is built and looked up without touching anything
/// shared (the built-ins' path is as fast as a plain map), and the MCP servers' tools, which change while toolgate
/// runs and live in a snapshot that every clone of the toolbox shares and each change replaces whole.
#[derive(Clone, Default)]
pub struct Toolbox {
    builtin: Arc<BuiltinTools>,
    sources: Arc<ArcSwap<SourceTools>>,
    /// Whether any source has had tools: until then the specs are the built-in ones, read without the snapshot.
    sources_used: Arc<AtomicBool>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one of toolgate's own tools. Meant for building the toolbox: clones made before see no change.
    pub fn register(&mut self, tool: impl Tool + 'static) -> Result<(), ToolboxError> {
        let registered = RegisteredTool::new(Arc::new(tool), None)?;
        let name = registered.spec().name.clone();
        if self.lookup(&name).is_some() {
            return Err(ToolboxError::Duplicate(name));
        }
        let builtin = Arc::make_mut(&mut self.builtin);
        builtin.tools.insert(name, Arc::new(registered));
        builtin.specs = builtin.tools.values().map(|r| r.spec().clone()).collect();
        Ok(())
    }

    pub fn with(mut self, tool: impl Tool + 'static) -> Result<Self, ToolboxError> {
        self.register(tool)?;
        Ok(self)
    }

    /// Replaces every tool of the MCP server `status.name` with `tools`, and its status, in one step: a lookup sees
    /// the old set or the new one, never a mix. A tool whose schema does not compile, or whose name is taken
    /// already, is left out; the errors say which.
    pub fn replace_source(
        &self,
        mut status: McpServerStatus,
        tools: Vec<Arc<dyn Tool>>,
    ) -> Vec<ToolboxError> {
        let mut joining = Vec::with_capacity(tools.len());
        let mut errors = Vec::new();
        for tool in tools {
            match RegisteredTool::new(tool, Some(status.name.clone())) {
                Ok(registered) => joining.push(Arc::new(registered)),
                Err(error) => errors.push(error),
            }
        }
        // Each server writes only its own part; the compare-and-swap loop keeps the other servers' changes.
        self.sources.rcu(|current| {
            let mut tools: BTreeMap<String, Arc<RegisteredTool>> = current
                .tools
                .iter()
                .filter(|(_, registered)| registered.source.as_deref() != Some(&status.name))
                .map(|(name, registered)| (name.clone(), Arc::clone(registered)))
                .collect();
            let mut names = Vec::with_capacity(joining.len());
            for registered in &joining {
                let name = &registered.spec().name;
                if !tools.contains_key(name) && !self.builtin.tools.contains_key(name) {
                    tools.insert(name.clone(), Arc::clone(registered));
                    names.push(name.clone());
                }
            }
            status.tools = names;
            let mut statuses = current.statuses.clone();
            statuses.insert(status.name.clone(), status.clone());
            let specs = if tools.is_empty() {
                Arc::from([])
            } else {
                let mut specs: Vec<ToolSpec> = self
                    .builtin
                    .specs
                    .iter()
                    .cloned()
                    .chain(tools.values().map(|r| r.spec().clone()))
                    .collect();
                specs.sort_by(|a, b| a.name.cmp(&b.name));
                specs.into()
            };
            SourceTools {
                tools,
                specs,
                statuses,
            }
        });
        if !status.tools.is_empty() {
            self.sources_used.store(true, Ordering::Release);
        }
        let kept = &status.tools;
        errors.extend(
            joining
                .iter()
                .map(|registered| registered.spec().name.clone())
                .filter(|name| !kept.contains(name))
                .map(ToolboxError::Duplicate),
        );
        errors
    }

    /// Updates an MCP server's status (its state, what went wrong) and keeps its tools.
    pub fn update_source_status(&self, status: McpServerStatus) {
        self.sources.rcu(|current| {
            let mut status = status.clone();
            if let Some(old) = current.statuses.get(&status.name) {
                status.tools = old.tools.clone();
            }
            let mut statuses = current.statuses.clone();
            statuses.insert(status.name.clone(), status);
            SourceTools {
                tools: current.tools.clone(),
                specs: Arc::clone(&current.specs),
                statuses,
            }
        });
    }

    /// The MCP servers, by name.
    pub fn sources(&self) -> Vec<McpServerStatus> {
        self.sources.load().statuses.values().cloned().collect()
    }

    /// The tool named `name` as it is now, with its schema.
    pub fn lookup(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        match self.builtin.tools.get(name) {
            Some(registered) => Some(Arc::clone(registered)),
            None => self.sources.load().tools.get(name).cloned(),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        match self.builtin.tools.get(name) {
            Some(registered) => Some(Arc::clone(&registered.tool)),
            None => self
                .sources
                .load()
                .tools
                .get(name)
                .map(|registered| Arc::clone(&registered.tool)),
        }
    }

    /// Every tool's spec, in name order; shared, not copied.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        if !self.sources_used.load(Ordering::Acquire) {
            return Arc::clone(&self.builtin.specs);
        }
        let sources = self.sources.load();
        if sources.tools.is_empty() {
            Arc::clone(&self.builtin.specs)
        } else {
            Arc::clone(&sources.specs)
        }
    }

    /// Every tool's name, in order.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.builtin.tools.keys().cloned().collect();
        names.extend(self.sources.load().tools.keys().cloned());
        names.sort_unstable();
        names
    }

    /// Checks input against a tool's schema. The error lists every violation with where it is.
    pub fn validate(&self, name: &str, input: &Value) -> Result<(), ToolError> {
        match self.builtin.tools.get(name) {
            Some(registered) => registered.validate(input),
            None => match self.sources.load().tools.get(name) {
                Some(registered) => registered.validate(input),
                None => Err(ToolError::new(
                    ToolErrorCode::UnknownTool,
                    unknown_tool_message(name, self),
                )),
            },
        }
    }
}

pub(crate) fn unknown_tool_message(name: &str, toolbox: &Toolbox) -> String {
    format!(
        "There is no tool named {name:?}. The tools are: {}.",
        toolbox.names().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ToolAnnotations;
    use serde_json::json;

    struct Echo(ToolSpec);

    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
            Box::pin(async move { Ok(input) })
        }
    }

    fn echo(schema: Value) -> Echo {
        Echo(ToolSpec {
            name: "echo".into(),
            description: "Echoes its input".into(),
            input_schema: schema,
            annotations: ToolAnnotations::default(),
            mcp: None,
        })
    }

    #[test]
    fn input_is_checked_against_the_schema() {
        let toolbox = Toolbox::new()
            .with(echo(json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false
            })))
            .unwrap();
        assert!(toolbox.validate("echo", &json!({"text": "hi"})).is_ok());
        let error = toolbox
            .validate("echo", &json!({"text": 3, "x": 1}))
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidInput);
        assert!(error.message.contains("/text"), "{}", error.message);
        assert!(
            error.message.contains("'x' was unexpected"),
            "{}",
            error.message
        );
        let error = toolbox.validate("nope", &json!({})).unwrap_err();
        assert_eq!(error.code, ToolErrorCode::UnknownTool);
        assert!(error.message.contains("The tools are: echo."));
    }

    fn named(name: &str, schema: Value) -> Arc<dyn Tool> {
        let mut tool = echo(schema);
        tool.0.name = name.into();
        Arc::new(tool)
    }

    fn status(name: &str) -> McpServerStatus {
        McpServerStatus {
            name: name.into(),
            transport: crate::wire::McpTransportKind::Stdio,
            trust: crate::wire::McpTrust::Untrusted,
            required: false,
            state: crate::wire::McpServerState::Ready,
            message: None,
            stderr_tail: None,
            tools: Vec::new(),
        }
    }

    #[test]
    fn a_source_replaces_its_own_tools_and_every_handle_sees_the_change() {
        let toolbox = Toolbox::new().with(echo(json!({}))).unwrap();
        let handle = toolbox.clone();
        let left_out = toolbox.replace_source(
            status("fs"),
            vec![
                named("mcp__fs__a", json!({})),
                named("mcp__fs__b", json!({"type": "no-such-type"})),
                named("echo", json!({})),
            ],
        );
        assert_eq!(left_out.len(), 2, "a broken schema and a taken name");
        assert_eq!(handle.names(), ["echo", "mcp__fs__a"]);
        assert_eq!(handle.sources()[0].tools, ["mcp__fs__a"]);
        let old = handle.get("mcp__fs__a").unwrap();

        toolbox.replace_source(status("other"), vec![named("mcp__other__x", json!({}))]);
        toolbox.replace_source(
            status("fs"),
            vec![named("mcp__fs__c", json!({"type": "object"}))],
        );
        assert_eq!(handle.names(), ["echo", "mcp__fs__c", "mcp__other__x"]);
        assert_eq!(handle.specs().len(), 3);
        assert!(handle.get("mcp__fs__a").is_none());
        // A call that found the old tool keeps it.
        assert_eq!(old.spec().name, "mcp__fs__a");

        let mut crashed = status("fs");
        crashed.state = crate::wire::McpServerState::Crashed;
        toolbox.update_source_status(crashed);
        let fs = handle
            .sources()
            .into_iter()
            .find(|s| s.name == "fs")
            .unwrap();
        assert_eq!(fs.state, crate::wire::McpServerState::Crashed);
        assert_eq!(fs.tools, ["mcp__fs__c"], "a status change keeps the tools");
        assert!(handle.validate("mcp__fs__c", &json!(1)).is_err());
    }

    #[test]
    fn a_tool_with_a_broken_schema_or_a_taken_name_is_refused() {
        let error = Toolbox::new()
            .with(echo(json!({"type": "no-such-type"})))
            .unwrap_err();
        assert!(
            matches!(error, ToolboxError::InvalidSchema { .. }),
            "{error}"
        );
        let error = Toolbox::new()
            .with(echo(json!({})))
            .unwrap()
            .with(echo(json!({})))
            .unwrap_err();
        assert!(matches!(error, ToolboxError::Duplicate(_)));
    }
}
