//! Tools: a name, a description, a JSON Schema for the input, annotations, and an async execute.
//!
//! The [`Toolbox`] holds the tools of a harness with their compiled schemas. Input is validated against the schema
//! before anything runs; invalid input is a recoverable output for the model, never a crash.

mod builtin;
pub mod preview;
mod process_tree;
mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ids::RunId;
use crate::wire::{ApprovalPreview, ToolErrorCode, ToolOutput, ToolSpec};

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

    /// What a call with this input (which satisfies the schema) would do, for the person asked to approve it:
    /// worked out once, when the call asks, and sent with the approval request. It must be quick and bounded, and
    /// touch only what the tool itself may (see [`preview`]). `None`: the arguments say it all.
    fn preview(&self, _input: &Value) -> Option<ApprovalPreview> {
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

struct RegisteredTool {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

/// The tools of a harness, by name, with their compiled input schemas.
#[derive(Default)]
pub struct Toolbox {
    tools: BTreeMap<String, RegisteredTool>,
    /// Every tool's spec, built once: each model step sends them, and a waiting run holds them.
    specs: Arc<[ToolSpec]>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, tool: impl Tool + 'static) -> Result<(), ToolboxError> {
        let spec = tool.spec();
        if self.tools.contains_key(&spec.name) {
            return Err(ToolboxError::Duplicate(spec.name.clone()));
        }
        let validator = jsonschema::validator_for(&spec.input_schema).map_err(|error| {
            ToolboxError::InvalidSchema {
                tool: spec.name.clone(),
                message: error.to_string(),
            }
        })?;
        self.tools.insert(
            spec.name.clone(),
            RegisteredTool {
                tool: Arc::new(tool),
                validator,
            },
        );
        self.specs = self.tools.values().map(|r| r.tool.spec().clone()).collect();
        Ok(())
    }

    pub fn with(mut self, tool: impl Tool + 'static) -> Result<Self, ToolboxError> {
        self.register(tool)?;
        Ok(self)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|registered| &registered.tool)
    }

    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.get(name).map(|tool| tool.spec())
    }

    /// Every tool's spec, in name order; shared, not copied.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.specs)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Checks input against a tool's schema. The error lists every violation with where it is.
    pub fn validate(&self, name: &str, input: &Value) -> Result<(), ToolError> {
        let registered = self.tools.get(name).ok_or_else(|| {
            ToolError::new(ToolErrorCode::UnknownTool, unknown_tool_message(name, self))
        })?;
        let problems: Vec<String> = registered
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
            Ok(())
        } else {
            Err(ToolError::new(
                ToolErrorCode::InvalidInput,
                format!(
                    "The input for {name} does not match its schema: {}",
                    problems.join("; ")
                ),
            ))
        }
    }
}

pub(crate) fn unknown_tool_message(name: &str, toolbox: &Toolbox) -> String {
    let known: Vec<&str> = toolbox.names().collect();
    format!(
        "There is no tool named {name:?}. The tools are: {}.",
        known.join(", ")
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
