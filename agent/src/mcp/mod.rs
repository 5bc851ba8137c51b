//! Tools from elsewhere: MCP servers (stdio child processes and streamable HTTP) through the official `rmcp`
//! client, each of their tools a toolgate [`Tool`](crate::tools::Tool) behind the same policy, cards, session
//! grants and run log as the built-ins.
//!
//! - [`config`]: the `.mcp.json` and TOML configurations, checked, with `${VAR}` expanded;
//! - [`naming`]: the names the model sees, `mcp__<server>__<tool>`;
//! - [`rules`]: the servers' per-tool rules, joined to the policy's;
//! - [`server`]: starting, watching, restarting and stopping servers, and keeping their tools in the toolbox;
//! - `client`: the one module that speaks to `rmcp`;
//! - `process`: a stdio server's child process and everything it starts;
//! - `tool`: one server tool as a toolgate tool.
//!
//! By default a server is untrusted: its annotations are shown, never believed, and every call of its tools asks
//! unless a rule allows it. `trust = "annotations"` lets them decide as a built-in's do.

mod client;
pub mod config;
/// The names the model sees: kept with the tools, as the policy reads them too.
pub use crate::tools::mcp_names as naming;
mod process;
pub mod rules;
pub mod server;
mod tool;

pub use client::MAX_MESSAGE_BYTES;
pub use config::{ConfigError, McpConfig, McpServerConfig, McpTransport};
pub use process::INHERITED_VARIABLES;
pub use rules::{policy_rules, server_rule};
pub use server::{MAX_TOOL_DEFINITION_BYTES, MAX_TOOLS, McpServers, RequiredServerFailed};
pub use tool::{MODEL_OUTPUT_LIMIT, McpTool};
