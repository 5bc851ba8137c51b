//! toolgate's harness: an LLM agent whose every tool call passes a permission policy, with a person in the loop.
//!
//! Without features this crate is only the wire types (with [`permissions`]: session grants, a card's choices,
//! listed rules) and the transcript reducer, which compile to wasm32 for the browser. The `runtime` feature adds
//! everything that needs tokio, in the order a run flows through it:
//!
//! - [`harness`]: the [`Harness`](harness::Harness): sessions, runs as resources with replayable event logs;
//! - [`agent_loop`]: the sampling loop;
//! - [`model`]: the model trait, the scripted model and (feature `openai`) the OpenAI-compatible client;
//! - [`runtime`]: one tool call: prepare, decide, ask, execute;
//! - [`policy`]: permission decisions: rules, session grants and the policy's default;
//! - [`approvals`]: how a pending approval ends, in words the model, the page and the audit log share;
//! - [`store`]: sessions, runs, their logs, calls and approvals, suspensions, grants, rules and the audit log, in
//!   memory, SQLite or PostgreSQL;
//! - [`interrupts`]: what interrupt-mode (AG-UI) runs issued, until a resume uses it once;
//! - [`tools`]: tools, their schemas and the built-in workspace tools;
//! - `mcp` (feature `mcp`): tools from MCP servers;
//! - [`events`]: the internal events and their projection to the wire.

pub mod dates;
pub mod ids;
pub mod permissions;
pub mod request_body;
pub mod view;
pub mod wire;

#[cfg(feature = "runtime")]
pub mod agent_loop;
#[cfg(feature = "runtime")]
pub mod approvals;
#[cfg(feature = "runtime")]
pub mod clock;
#[cfg(feature = "runtime")]
pub mod events;
#[cfg(feature = "runtime")]
pub mod harness;
#[cfg(feature = "runtime")]
pub mod interrupts;
#[cfg(feature = "runtime")]
mod logged_once;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "runtime")]
pub mod model;
#[cfg(feature = "runtime")]
pub mod policy;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "runtime")]
pub mod store;
#[cfg(feature = "runtime")]
pub mod tools;
