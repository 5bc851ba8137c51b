//! An MCP server's tool as a toolgate [`Tool`]: the same schema check, policy, cards, grants and log as a built-in.

use std::sync::Weak;

use serde_json::Value;

use crate::mcp::server::McpServer;
use crate::tools::{Tool, ToolContext, ToolError, ToolFuture};
use crate::wire::{ApprovalPreview, ToolSpec};

/// The most of one MCP result the model reads, in bytes; the run's log keeps the whole result.
pub const MODEL_OUTPUT_LIMIT: usize = 64 * 1024;

/// One tool of one server. Its spec is what the model and the policy see: the name `mcp__server__tool`, the
/// server's description and schema, what the server claims in its annotations, and where it comes from.
pub struct McpTool {
    spec: ToolSpec,
    server: Weak<McpServer>,
}

impl McpTool {
    pub(crate) fn new(spec: ToolSpec, server: Weak<McpServer>) -> Self {
        Self { spec, server }
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Runs until the server answers, the call times out, or the run aborts (`context.cancel`); the last two tell
    /// the server with `notifications/cancelled`.
    fn execute<'a>(&'a self, input: Value, context: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let (Some(server), Some(origin)) = (self.server.upgrade(), self.spec.mcp.as_ref())
            else {
                return Err(ToolError::failed(format!(
                    "{} is no longer available. The call was not made.",
                    self.spec.name
                )));
            };
            McpServer::call(&server, &origin.tool, &self.spec, input, &context.cancel).await
        })
    }

    /// Each argument on its own, formatted for reading, under the name of the server the tool belongs to, and the
    /// tool's own name there when the name the model sees does not end in it.
    fn preview(&self, input: &Value) -> Option<ApprovalPreview> {
        let origin = self.spec.mcp.as_ref();
        Some(ApprovalPreview::fields(
            origin.map(|origin| origin.server.clone()),
            origin
                .filter(|origin| !self.spec.name.ends_with(&format!("__{}", origin.tool)))
                .map(|origin| origin.tool.clone()),
            input,
        ))
    }

    fn model_output_limit(&self) -> Option<usize> {
        Some(MODEL_OUTPUT_LIMIT)
    }
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.spec.name)
            .finish()
    }
}
