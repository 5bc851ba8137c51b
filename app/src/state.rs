//! The page's state: the session as the page knows it, folded from the server's snapshot and then from live events.

use std::collections::HashSet;

use agent::ids::{RunId, ToolCallId};
use agent::view::SessionView;
use agent::wire::{ApprovalRequest, McpServerStatus, RunEvent};
use leptos::prelude::*;

use crate::api::PageState;

/// The live connection to the session's event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// The server rendered the page from what it holds; the stream's errors say when that stops being true.
    Live,
    Reconnecting,
    Lost,
}

/// An approval, by its key.
pub type ApprovalKey = (RunId, ToolCallId);

pub fn key_of(request: &ApprovalRequest) -> ApprovalKey {
    (request.run_id.clone(), request.tool_call_id.clone())
}

/// Every signal of the page, copied freely into closures.
#[derive(Clone, Copy)]
pub struct Ui {
    pub session: RwSignal<SessionView>,
    /// Approvals whose decision is on its way to the server: their buttons are disabled.
    pub deciding: RwSignal<HashSet<ApprovalKey>>,
    /// An error the person should know about.
    pub error: RwSignal<Option<String>>,
    pub connection: RwSignal<Connection>,
    /// The clock the countdowns read; the server's at first, the browser's once hydrated.
    pub now_ms: RwSignal<u64>,
    pub debug_open: RwSignal<bool>,
    /// A message is on its way to the server.
    pub sending: RwSignal<bool>,
    /// True once the WASM is live.
    pub hydrated: RwSignal<bool>,
    /// Bumped whenever the page changed a rule or a grant, so the rules panel reloads.
    pub rules_changed: RwSignal<u64>,
    /// The MCP servers as the page was rendered.
    pub mcp_servers: StoredValue<Vec<McpServerStatus>>,
}

impl Ui {
    pub fn new(page: &PageState) -> Self {
        Self {
            session: RwSignal::new(page.session.clone()),
            deciding: RwSignal::new(HashSet::new()),
            error: RwSignal::new(None),
            connection: RwSignal::new(Connection::Live),
            now_ms: RwSignal::new(page.now_ms),
            debug_open: RwSignal::new(false),
            sending: RwSignal::new(false),
            hydrated: RwSignal::new(false),
            rules_changed: RwSignal::new(0),
            mcp_servers: StoredValue::new(page.mcp_servers.clone()),
        }
    }

    /// The MCP server a tool belongs to, by the tool's name.
    pub fn mcp_server_of(&self, tool_name: &str) -> Option<McpServerStatus> {
        self.mcp_servers.with_value(|servers| {
            servers
                .iter()
                .find(|server| server.tools.iter().any(|tool| tool == tool_name))
                .cloned()
        })
    }

    /// Applies one live event; an event seen before changes nothing.
    pub fn apply(&self, event: &RunEvent) {
        self.session.update(|session| {
            session.apply(event);
        });
    }

    /// Pending approvals, oldest first.
    pub fn pending(&self) -> Vec<ApprovalRequest> {
        self.session
            .with(|session| session.pending_approvals().cloned().collect())
    }
}
