//! The page's state: the session as the page knows it, folded from the server's snapshot and then from live events.

use std::collections::HashSet;

use agent::ids::{RunId, SessionId, ToolCallId};
use agent::view::SessionView;
use agent::wire::{ApprovalRequest, McpServerStatus, RunEvent};
use leptos::prelude::*;
use serde_json::Value;

use crate::api::{Conversation, PageState, ToolInput};

/// The live connection to the session's event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// The server rendered the page from what it holds; the stream's errors say when that stops being true.
    Live,
    /// The browser is reconnecting on its own.
    Reconnecting,
    /// The browser gave up; the page opens the stream again at this many seconds.
    Lost { retry_in_secs: u32 },
}

/// What the main column shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Conversation,
    Audit,
}

/// An approval, by its key.
pub type ApprovalKey = (RunId, ToolCallId);

pub fn key_of(request: &ApprovalRequest) -> ApprovalKey {
    (request.run_id.clone(), request.tool_call_id.clone())
}

/// The id of a card's element, which notifications and focus use.
pub fn card_dom_id(key: &ApprovalKey) -> String {
    format!("approval-{}-{}", key.0, key.1)
}

/// Every signal of the page, copied freely into closures.
#[derive(Clone, Copy)]
pub struct Ui {
    pub session: RwSignal<SessionView>,
    /// Approvals whose decision is on its way to the server: their buttons are disabled.
    pub deciding: RwSignal<HashSet<ApprovalKey>>,
    /// Approvals the server no longer holds (found when the page reconnected): their cards are gone.
    pub gone: RwSignal<HashSet<ApprovalKey>>,
    /// Runs the server no longer holds, found when the page reconnected (a `memory` store's server restarted): no
    /// event will ever end them here, and they hold nothing back.
    pub gone_runs: RwSignal<HashSet<RunId>>,
    /// Approvals whose card has an edit open: what the card shows is not yet what a decision would send.
    pub editing: RwSignal<HashSet<ApprovalKey>>,
    /// An error the person should know about.
    pub error: RwSignal<Option<String>>,
    pub connection: RwSignal<Connection>,
    /// The server's clock as the page estimates it, in milliseconds since the Unix epoch: what countdowns read.
    pub now_ms: RwSignal<u64>,
    /// The server's clock minus the browser's, measured when the page hydrated.
    pub clock_offset_ms: StoredValue<i64>,
    pub debug_open: RwSignal<bool>,
    /// A message is on its way to the server.
    pub sending: RwSignal<bool>,
    /// True once the WASM is live.
    pub hydrated: RwSignal<bool>,
    /// Bumped whenever the page changed a rule or a grant, so the rules panel reloads.
    pub rules_changed: RwSignal<u64>,
    pub tools: StoredValue<Vec<ToolInput>>,
    pub conversations: RwSignal<Vec<Conversation>>,
    pub view: RwSignal<View>,
    /// Whether the browser may show notifications (`granted`, `denied`, `default`), once hydrated.
    pub notifications: RwSignal<Option<String>>,
    /// The MCP servers as the page was rendered.
    pub mcp_servers: StoredValue<Vec<McpServerStatus>>,
}

impl Ui {
    pub fn new(page: &PageState) -> Self {
        Self {
            session: RwSignal::new(page.session.clone()),
            deciding: RwSignal::new(HashSet::new()),
            gone: RwSignal::new(HashSet::new()),
            gone_runs: RwSignal::new(HashSet::new()),
            editing: RwSignal::new(HashSet::new()),
            error: RwSignal::new(page.notice.clone()),
            connection: RwSignal::new(Connection::Live),
            now_ms: RwSignal::new(page.now_ms),
            clock_offset_ms: StoredValue::new(0),
            debug_open: RwSignal::new(false),
            sending: RwSignal::new(false),
            hydrated: RwSignal::new(false),
            rules_changed: RwSignal::new(0),
            tools: StoredValue::new(page.tools.clone()),
            conversations: RwSignal::new(page.sessions.clone()),
            view: RwSignal::new(View::Conversation),
            notifications: RwSignal::new(None),
            mcp_servers: StoredValue::new(page.mcp_servers.clone()),
        }
    }

    pub fn session_id(&self) -> SessionId {
        self.session
            .with_untracked(|session| session.session_id.clone())
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

    /// Applies one live event; an event seen before changes nothing. Returns whether it changed the view.
    pub fn apply(&self, event: &RunEvent) -> bool {
        let mut applied = false;
        self.session.update(|session| {
            applied = session.apply(event);
        });
        applied
    }

    /// Pending approvals, oldest first.
    pub fn pending(&self) -> Vec<ApprovalRequest> {
        let gone = self.gone.get();
        self.session.with(|session| {
            session
                .pending_approvals()
                .filter(|request| !gone.contains(&key_of(request)))
                .cloned()
                .collect()
        })
    }

    /// The run the page waits for: the session's unfinished run, unless the server no longer holds it, or all it
    /// waits for are approvals the server no longer holds (its process ended without a word, as a `memory` store's
    /// does when killed): no event will ever end that run here, and the person must not be held back by it.
    pub fn active_run(&self) -> Option<RunId> {
        let gone = self.gone.get();
        let gone_runs = self.gone_runs.get();
        self.session.with(|session| {
            session
                .active_run()
                .filter(|run| !gone_runs.contains(&run.run_id))
                .filter(|run| {
                    let mut waiting = run.pending_approvals().peekable();
                    waiting.peek().is_none()
                        || waiting.any(|request| !gone.contains(&key_of(request)))
                })
                .map(|run| run.run_id.clone())
        })
    }

    /// The same, outside what the page's views track (a timer's, a stream's handler).
    pub fn is_gone_untracked(&self, key: &ApprovalKey) -> bool {
        self.gone.with_untracked(|gone| gone.contains(key))
    }

    /// Whether the server no longer holds this run (found when the page reconnected).
    pub fn is_run_gone(&self, run_id: &RunId) -> bool {
        self.gone_runs.with(|gone| gone.contains(run_id))
    }

    /// Whether this approval's card is gone: the server no longer holds it.
    pub fn is_gone(&self, key: &ApprovalKey) -> bool {
        self.gone.with(|gone| gone.contains(key))
    }

    /// The last event the page shows: the stream resumes after it.
    pub fn last_seen(&self) -> Option<(RunId, u64)> {
        self.session.with_untracked(|session| {
            session
                .runs
                .last()
                .map(|run| (run.run_id.clone(), run.last_seq))
        })
    }

    /// The input schema of a tool, when the page knows it.
    pub fn schema_of(&self, tool: &str) -> Option<Value> {
        self.tools.with_value(|tools| {
            tools
                .iter()
                .find(|input| input.name == tool)
                .map(|input| input.input_schema.clone())
        })
    }

    /// The server's clock now, from the browser's and the offset measured at hydration.
    pub fn server_now(&self, browser_now_ms: u64) -> u64 {
        browser_now_ms.saturating_add_signed(self.clock_offset_ms.get_value())
    }
}

/// Sends the page to the login form when a server function's `error` says its login ended (logged out in another
/// tab or on another machine, or its cookie expired), as a reload of the page would; whether it did. The page then
/// has nothing to say of the refused action: the form is where the person can go on.
pub fn left_for_login(error: &leptos::prelude::ServerFnError) -> bool {
    if !crate::format::needs_login(error) {
        return false;
    }
    #[cfg(feature = "hydrate")]
    if let Some(window) = web_sys::window() {
        // `?ended`: the form whatever the cookie, so an instance that still honours it does not send the page back.
        let _ = window.location().assign("/login?ended");
    }
    true
}
