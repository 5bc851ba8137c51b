//! MCP servers as toolgate runs them: started together at startup, their tools kept in the toolbox as the servers
//! change them, restarted lazily (with backoff) after a crash, stopped with everything they started.
//!
//! A server's link is one of: up (a connection, its tools in the toolbox), down (never started, crashed, or its
//! restart failed; the next call starts it again once its backoff has passed), or stopped (toolgate is shutting
//! down). A call never retries itself: a server that dies mid-call leaves that call's effect unknown, and the
//! model is told so.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::mcp::client::{CallError, ConnectError, MAX_MESSAGE_BYTES, McpClient, RemoteTool};
use crate::mcp::config::{McpConfig, McpServerConfig, McpTransport};
use crate::mcp::naming::qualify;
use crate::mcp::process::{ServerProcess, StderrTail, spawn};
use crate::mcp::tool::McpTool;
use crate::tools::{Tool, ToolError, Toolbox};
use crate::wire::{McpServerState, McpServerStatus, ToolErrorCode, ToolSpec};

/// How long a stdio server gets to exit after its input closes, and again after `SIGTERM`.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// The longest wait between restarts of a server that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a server whose call timed out has to answer a ping before its connection is taken for lost.
const PING_PATIENCE: Duration = Duration::from_secs(5);
/// The most tools one server may offer. Every tool's definition goes to the model with every step of every run, in
/// every session, and model APIs take a bounded number (128 on OpenAI's): a server offering more would fail the runs
/// that never use it. One that does is not started (or, its list changed, its tools are withdrawn), naming this.
pub const MAX_TOOLS: usize = 128;
/// The most bytes of one tool's description and input schema together; a tool past it is left out, with a warning.
pub const MAX_TOOL_DEFINITION_BYTES: usize = 32 * 1024;

/// A required server did not start, so toolgate does not either.
#[derive(Debug, thiserror::Error)]
#[error("the MCP server {server:?} is required (required = true), and it could not start: {message}{}",
    stderr_tail.as_ref().map(|tail| format!("\nthe end of its standard error:\n{tail}")).unwrap_or_default())]
pub struct RequiredServerFailed {
    pub server: String,
    pub message: String,
    pub stderr_tail: Option<String>,
}

/// Every configured MCP server.
#[derive(Clone, Default)]
pub struct McpServers {
    servers: Vec<Arc<McpServer>>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.servers.iter().map(|server| &server.config.name))
            .finish()
    }
}

impl McpServers {
    /// Starts every enabled server at once, each within its startup timeout, and puts their tools in `toolbox`.
    /// A server that fails is shown as failed and the others go on, unless it is required: then every server is
    /// stopped again and the error says why.
    pub async fn start(
        config: &McpConfig,
        workspace: &Path,
        toolbox: &Toolbox,
    ) -> Result<Self, RequiredServerFailed> {
        let servers: Vec<Arc<McpServer>> = config
            .servers
            .iter()
            .map(|server| {
                Arc::new(McpServer {
                    config: server.clone(),
                    workspace: workspace.to_owned(),
                    toolbox: toolbox.clone(),
                    link: Mutex::new(Link::Down(Down {
                        reason: String::new(),
                        stderr_tail: None,
                        failures: 0,
                        since: Instant::now(),
                        generation: 0,
                    })),
                    generations: std::sync::atomic::AtomicU64::new(0),
                    tasks: TaskTracker::new(),
                    stopping: CancellationToken::new(),
                    restarts: parking_lot::Mutex::new(Restarts::default()),
                })
            })
            .collect();
        let started = futures::future::join_all(servers.iter().map(|server| server.start())).await;
        let servers = Self { servers };
        if let Some(failed) = started.into_iter().flatten().next() {
            servers.shutdown().await;
            return Err(failed);
        }
        Ok(servers)
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Stops every server: closes its connection, then stops its process and everything the process started.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.servers.iter().map(|server| server.stop())).await;
    }
}

/// One configured server.
pub struct McpServer {
    config: McpServerConfig,
    workspace: PathBuf,
    toolbox: Toolbox,
    link: Mutex<Link>,
    /// Numbers each connection, so that news about an old one cannot touch a newer one.
    generations: std::sync::atomic::AtomicU64,
    tasks: TaskTracker,
    /// Cancelled when toolgate stops the server: a restart waiting out its backoff gives up.
    stopping: CancellationToken,
    /// The restarts toolgate made by itself lately (see `start_again`).
    restarts: parking_lot::Mutex<Restarts>,
}

/// The restarts a server got by itself, without a call: each waits longer than the one before, so that a server
/// whose connections keep failing is not started again in a loop, until one has gone a while without another.
#[derive(Default)]
struct Restarts {
    count: u32,
    last: Option<Instant>,
}

impl Restarts {
    /// How long the next restart waits, counting it.
    fn next(&mut self) -> Duration {
        if self
            .last
            .is_some_and(|last| last.elapsed() > 2 * MAX_BACKOFF)
        {
            self.count = 0;
        }
        let wait = backoff(self.count);
        self.count += 1;
        self.last = Some(Instant::now() + wait);
        wait
    }
}

enum Link {
    Up(Arc<Connection>),
    Down(Down),
    Stopped,
}

#[derive(Clone)]
struct Down {
    reason: String,
    stderr_tail: Option<String>,
    /// Failed starts since the server last ran.
    failures: u32,
    since: Instant,
    /// The connection that ended, if any.
    generation: u64,
}

/// One connection to a server, with what looks after it.
struct Connection {
    client: McpClient,
    generation: u64,
    /// Cancelled when the connection ends: the process exited, or toolgate closed it.
    ended: CancellationToken,
    /// Tells a stdio server's supervisor to stop the process.
    stop: CancellationToken,
    /// The highest count of tool-list announcements whose list is in the toolbox.
    applied: watch::Receiver<u64>,
    /// Whether the server's tools are withdrawn: its list past the bounds, or a new one that could not be read.
    withdrawn: std::sync::atomic::AtomicBool,
    stderr: Option<StderrTail>,
}

/// How a wait for the server's announced tool list ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// Every list announced so far is in the toolbox (or the tools were withdrawn, their list unreadable).
    Yes,
    /// Not within the patience given.
    TimedOut,
    /// The call's run was aborted meanwhile.
    Cancelled,
    /// The connection ended meanwhile: nothing follows its list any more.
    Ended,
}

impl Connection {
    /// Waits until every tool-list change the server announced so far is in the toolbox (or its tools are
    /// withdrawn, their new list unreadable), and says how the wait ended: bounded, as a server that never answers
    /// tools/list must not hold a call forever, nor a run aborted meanwhile.
    async fn tools_settled(&self, patience: Duration, cancel: &CancellationToken) -> Settled {
        let target = *self.client.announcements().borrow();
        let mut applied = self.applied.clone();
        let settled =
            tokio::time::timeout(patience, applied.wait_for(|applied| *applied >= target));
        tokio::select! {
            settled = settled => match settled {
                Ok(Ok(_)) => Settled::Yes,
                Ok(Err(_)) => Settled::Ended,
                Err(_) => Settled::TimedOut,
            },
            () = cancel.cancelled() => Settled::Cancelled,
        }
    }
}

impl McpServer {
    fn status(
        &self,
        state: McpServerState,
        message: Option<String>,
        stderr_tail: Option<String>,
    ) -> McpServerStatus {
        McpServerStatus {
            name: self.config.name.clone(),
            transport: self.config.transport_kind(),
            trust: self.config.trust,
            required: self.config.required,
            state,
            message,
            stderr_tail,
            tools: Vec::new(),
        }
    }

    /// The first start, at toolgate's startup.
    async fn start(self: &Arc<Self>) -> Option<RequiredServerFailed> {
        if !self.config.enabled {
            self.toolbox.replace_source(
                self.status(McpServerState::Disabled, None, None),
                Vec::new(),
            );
            return None;
        }
        self.toolbox.replace_source(
            self.status(McpServerState::Starting, None, None),
            Vec::new(),
        );
        let mut link = self.link.lock().await;
        match self.connect().await {
            Ok(connection) => {
                *link = Link::Up(connection);
                None
            }
            Err((message, stderr_tail)) => {
                tracing::warn!(server = self.config.name, %message, "an MCP server could not start");
                self.toolbox.replace_source(
                    self.status(
                        McpServerState::Failed,
                        Some(message.clone()),
                        stderr_tail.clone(),
                    ),
                    Vec::new(),
                );
                *link = Link::Down(Down {
                    reason: message.clone(),
                    stderr_tail: stderr_tail.clone(),
                    failures: 1,
                    since: Instant::now(),
                    generation: 0,
                });
                self.config.required.then(|| RequiredServerFailed {
                    server: self.config.name.clone(),
                    message,
                    stderr_tail,
                })
            }
        }
    }

    /// Connects, lists the tools and puts them in the toolbox, within the startup timeout. The caller holds the
    /// link. The error is the reason and the end of the server's standard error.
    async fn connect(self: &Arc<Self>) -> Result<Arc<Connection>, (String, Option<String>)> {
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let timeout = self.config.startup_timeout;
        let (client, process) = match &self.config.transport {
            McpTransport::Stdio { command, args, env } => {
                let spawned = spawn(&self.config.name, command, args, env, &self.workspace)
                    .map_err(|source| {
                        let error = ConnectError::Spawn {
                            command: command.clone(),
                            source,
                        };
                        (error.to_string(), None)
                    })?;
                let process = spawned.process;
                let connected = tokio::time::timeout(
                    timeout,
                    McpClient::connect_stdio(spawned.stdout, spawned.stdin),
                )
                .await;
                match connected {
                    Ok(Ok(client)) => (client, Some(process)),
                    Ok(Err(error)) => return Err(failed_start(error.to_string(), process).await),
                    Err(_) => {
                        return Err(failed_start(
                            format!("it did not complete the MCP handshake within {timeout:?}"),
                            process,
                        )
                        .await);
                    }
                }
            }
            McpTransport::Http { url, headers } => {
                match tokio::time::timeout(timeout, McpClient::connect_http(url, headers)).await {
                    Ok(Ok(client)) => (client, None),
                    Ok(Err(error)) => return Err((error.to_string(), None)),
                    Err(_) => {
                        return Err((
                            format!("it did not complete the MCP handshake within {timeout:?}"),
                            None,
                        ));
                    }
                }
            }
        };
        let listed = match tokio::time::timeout(timeout, client.list_tools()).await {
            Ok(Ok(tools)) => self.bounded(tools),
            failed => Err(match failed {
                Ok(Err(error)) => ConnectError::ListTools(error).to_string(),
                _ => format!("it did not list its tools within {timeout:?}"),
            }),
        };
        let tools = match listed {
            Ok(tools) => tools,
            Err(message) => {
                client.close().await;
                return Err(match process {
                    Some(process) => failed_start(message, process).await,
                    None => (message, None),
                });
            }
        };
        if let Some(server) = client.server_info() {
            tracing::info!(
                server = self.config.name,
                implementation = server,
                tools = tools.len(),
                "an MCP server is ready"
            );
        }
        let ended = CancellationToken::new();
        let stop = CancellationToken::new();
        let (applied_tx, applied) = watch::channel(0);
        let connection = Arc::new(Connection {
            client,
            generation,
            ended: ended.clone(),
            stop: stop.clone(),
            applied,
            withdrawn: std::sync::atomic::AtomicBool::new(false),
            stderr: process.as_ref().map(ServerProcess::stderr),
        });
        self.publish(tools);
        if let Some(process) = process {
            self.tasks.spawn(supervise(
                Arc::downgrade(self),
                process,
                generation,
                ended.clone(),
                stop,
            ));
        }
        self.tasks.spawn(follow_tool_list(
            Arc::downgrade(self),
            Arc::downgrade(&connection),
            connection.client.announcements(),
            applied_tx,
            ended,
        ));
        Ok(connection)
    }

    /// The tools of `listed` this server offers (its configuration may leave some out), within the bounds a model
    /// takes: a tool whose definition is past [`MAX_TOOL_DEFINITION_BYTES`] is left out, as is a name listed more
    /// than once; more than [`MAX_TOOLS`] is an error that says so.
    fn bounded(&self, listed: Vec<RemoteTool>) -> Result<Vec<RemoteTool>, String> {
        // A name listed twice is left out, both times: a call names its tool by name alone, so which definition the
        // server would run (the read-only one, or the destructive one) is its choice, not what the card showed.
        let mut uses = std::collections::HashMap::<String, usize>::new();
        for tool in &listed {
            *uses.entry(tool.name.clone()).or_default() += 1;
        }
        let (listed, twice): (Vec<RemoteTool>, Vec<RemoteTool>) = listed
            .into_iter()
            .filter(|tool| self.config.offers(&tool.name))
            .partition(|tool| uses[&tool.name] == 1);
        for name in twice
            .iter()
            .map(|tool| &tool.name)
            .collect::<std::collections::BTreeSet<_>>()
        {
            tracing::warn!(
                server = self.config.name,
                tool = name.chars().take(200).collect::<String>(),
                "an MCP tool was left out: the server lists more than one tool of this name"
            );
        }
        let (fitting, oversized): (Vec<RemoteTool>, Vec<RemoteTool>) =
            listed.into_iter().partition(|tool| {
                let schema = serde_json::to_vec(&tool.input_schema).map_or(usize::MAX, |s| s.len());
                tool.description.len().saturating_add(schema) <= MAX_TOOL_DEFINITION_BYTES
            });
        for tool in &oversized {
            tracing::warn!(
                server = self.config.name,
                tool = tool.name.chars().take(200).collect::<String>(),
                "an MCP tool was left out: its description and input schema are over {MAX_TOOL_DEFINITION_BYTES} bytes"
            );
        }
        if fitting.len() > MAX_TOOLS {
            return Err(format!(
                "it offers {} tools, more than the {MAX_TOOLS} a server may (every tool is sent to the model at every step); offer fewer with enabled_tools or disabled_tools in its configuration",
                fitting.len()
            ));
        }
        Ok(fitting)
    }

    /// Puts the server's tools (what [`Self::bounded`] kept of its list) in the toolbox, replacing what it had
    /// there, and marks it ready.
    fn publish(self: &Arc<Self>, tools: Vec<RemoteTool>) {
        let qualified = qualify(
            &self.config.tool_prefix_name,
            tools.iter().map(|tool| tool.name.as_str()),
        );
        if !qualified.colliding.is_empty() {
            tracing::warn!(
                server = self.config.name,
                tools = ?qualified.colliding,
                "MCP tools left out: their names would be the same to the model"
            );
        }
        let tools: Vec<Arc<dyn Tool>> = qualified
            .named
            .into_iter()
            .filter_map(|(name, real)| {
                let remote = tools.iter().find(|tool| tool.name == real)?;
                Some(Arc::new(McpTool::new(
                    ToolSpec {
                        name,
                        description: remote.description.clone(),
                        input_schema: remote.input_schema.clone(),
                        annotations: remote.annotations,
                        mcp: Some(crate::wire::McpToolOrigin {
                            server: self.config.name.clone(),
                            tool: real,
                            trust: self.config.trust,
                            endpoint: self.config.transport.endpoint_digest(),
                        }),
                    },
                    Arc::downgrade(self),
                )) as Arc<dyn Tool>)
            })
            .collect();
        let left_out = self
            .toolbox
            .replace_source(self.status(McpServerState::Ready, None, None), tools);
        for error in left_out {
            tracing::warn!(server = self.config.name, %error, "an MCP tool was left out");
        }
    }

    /// The connection to call through, starting the server again when it is down and its backoff has passed.
    async fn connection(self: &Arc<Self>) -> Result<Arc<Connection>, ToolError> {
        let mut link = self.link.lock().await;
        let down = match &*link {
            Link::Up(connection) if !connection.ended.is_cancelled() => {
                return Ok(Arc::clone(connection));
            }
            Link::Up(connection) => Down {
                reason: "its connection ended".to_owned(),
                stderr_tail: connection.stderr.as_ref().and_then(StderrTail::text),
                failures: 0,
                since: Instant::now(),
                generation: connection.generation,
            },
            Link::Stopped => {
                return Err(ToolError::failed(format!(
                    "The MCP server {} is stopped because toolgate is shutting down. The call was not made.",
                    self.config.name
                )));
            }
            Link::Down(down) => down.clone(),
        };
        let wait = backoff(down.failures).saturating_sub(down.since.elapsed());
        if !wait.is_zero() {
            let message = format!(
                "The MCP server {} is down ({}); toolgate starts it again in {} s. The call was not made.",
                self.config.name,
                down.reason,
                wait.as_secs().max(1)
            );
            *link = Link::Down(down);
            return Err(ToolError::failed(message));
        }
        tracing::info!(server = self.config.name, "starting an MCP server again");
        match self.connect().await {
            Ok(connection) => {
                *link = Link::Up(Arc::clone(&connection));
                Ok(connection)
            }
            Err((message, stderr_tail)) => {
                self.toolbox.update_source_status(self.status(
                    McpServerState::Crashed,
                    Some(format!("it could not start again: {message}")),
                    stderr_tail.clone(),
                ));
                *link = Link::Down(Down {
                    reason: message.clone(),
                    stderr_tail,
                    failures: down.failures + 1,
                    since: Instant::now(),
                    generation: down.generation,
                });
                Err(ToolError::failed(format!(
                    "The MCP server {} is down and could not start again ({message}). The call was not made.",
                    self.config.name
                )))
            }
        }
    }

    /// Marks connection `generation` as ended: the server is down until a call starts it again, or, when its tools
    /// were withdrawn, at once, as no call could.
    async fn connection_lost(
        self: &Arc<Self>,
        generation: u64,
        reason: String,
        stderr_tail: Option<String>,
    ) {
        let mut link = self.link.lock().await;
        // A server whose tools were withdrawn offers the model none to call, so no call would start it again.
        let mut withdrawn = false;
        let (reason, stderr_tail) = match &*link {
            Link::Up(connection) if connection.generation == generation => {
                connection.ended.cancel();
                withdrawn = connection
                    .withdrawn
                    .load(std::sync::atomic::Ordering::Acquire);
                (reason, stderr_tail)
            }
            // A call and the process's supervisor may both notice; the status keeps what each saw.
            Link::Down(down)
                if down.generation == generation
                    && down.failures == 0
                    && !down.reason.contains(&reason) =>
            {
                (
                    format!("{}; {reason}", down.reason),
                    stderr_tail.or_else(|| down.stderr_tail.clone()),
                )
            }
            Link::Up(_) | Link::Down(_) | Link::Stopped => return,
        };
        tracing::warn!(server = self.config.name, %reason, "an MCP server stopped");
        self.toolbox.update_source_status(self.status(
            McpServerState::Crashed,
            Some(reason.clone()),
            stderr_tail.clone(),
        ));
        *link = Link::Down(Down {
            reason,
            stderr_tail,
            failures: 0,
            since: Instant::now(),
            generation,
        });
        if withdrawn {
            self.tasks.spawn(Arc::clone(self).start_again());
        }
    }

    /// Starts the server again (a start that fails says so in its status, as at startup): at once the first time,
    /// then after a backoff that grows while such restarts follow each other. A start that fails is tried again
    /// after the next backoff, until one succeeds or toolgate stops: no call would (the server offers none). Boxed: it
    /// is spawned from what a connection's end runs, which a connection's start spawns, and a future cannot contain
    /// itself.
    fn start_again(self: Arc<Self>) -> futures::future::BoxFuture<'static, ()> {
        // Held weakly between the tries, as the server's other tasks hold it: a server dropped stops them.
        let server = Arc::downgrade(&self);
        drop(self);
        Box::pin(async move {
            loop {
                let Some((wait, stopping)) = server
                    .upgrade()
                    .map(|server| (server.restarts.lock().next(), server.stopping.clone()))
                else {
                    return;
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stopping.cancelled() => return,
                }
                let Some(server) = server.upgrade() else {
                    return;
                };
                if server.connection().await.is_ok() {
                    return;
                }
            }
        })
    }

    /// Calls the server's tool `tool`, as the model's tool `decided` was defined when the call was decided.
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &str,
        decided: &ToolSpec,
        input: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, ToolError> {
        let qualified = decided.name.as_str();
        let connection = self.connection().await?;
        // The server may have said that its tools changed, their new list not read yet: the call waits for it, and is
        // not made on the definitions it replaces.
        let timeout = self.config.tool_timeout;
        let server = &self.config.name;
        match connection.tools_settled(timeout, cancel).await {
            Settled::Yes => {}
            Settled::Cancelled => {
                return Err(ToolError::failed(format!(
                    "{qualified} was not called: its run was aborted before the call went out to the MCP server {server}."
                )));
            }
            Settled::TimedOut => {
                return Err(ToolError::new(
                    ToolErrorCode::PermissionDenied,
                    format!(
                        "{qualified} was not called: the MCP server {server} said its tools changed, and their new list did not come within {} s, so what was approved or allowed may not be what the tool is now.",
                        timeout.as_secs_f64()
                    ),
                ));
            }
            Settled::Ended => {
                return Err(ToolError::failed(format!(
                    "{qualified} was not called: the MCP server {server} said its tools changed, and its connection ended before their new list came. The server is started again for the next call."
                )));
            }
        }
        // The connection may be new (the server had stopped, or its HTTP session was gone): a server started again
        // listed its tools anew, and a call decided for the tool as it was defined is not made on another definition.
        let current = self.toolbox.lookup(qualified);
        if current
            .as_ref()
            .map(|tool| crate::policy::spec_digest(tool.spec()))
            != Some(crate::policy::spec_digest(decided))
        {
            return Err(ToolError::new(
                ToolErrorCode::PermissionDenied,
                format!(
                    "The tool {qualified} changed after this call was decided (the MCP server {} changed its tools, or was started again, and describes it differently now or no longer offers it), so the call was not made: what was approved or allowed was the tool as it was.",
                    self.config.name
                ),
            ));
        }
        match connection
            .client
            .call_tool(tool, input, timeout, cancel)
            .await
        {
            Ok(result) => {
                // A tool that changed the server's tools answers after announcing it: the next step sees them.
                let _settled = connection.tools_settled(timeout, cancel).await;
                if result.is_error {
                    let text = match result.content {
                        Value::String(text) => text,
                        other => other.to_string(),
                    };
                    Err(ToolError::failed(format!(
                        "{qualified} reported an error: {text}"
                    )))
                } else {
                    Ok(result.content)
                }
            }
            Err(CallError::TimedOut(after)) => {
                // A slow tool, or an HTTP server that no longer hears this session (one started again may answer it
                // with an error no request takes): one that does not answer a ping either is connected to again for
                // the next call. A stdio server is a process of toolgate's, whose end toolgate sees; a slow one may
                // not answer while its tool works, and stopping it would end its other calls.
                let deaf = matches!(self.config.transport, McpTransport::Http { .. })
                    && tokio::select! {
                        answered = connection.client.answers_ping(PING_PATIENCE) => !answered,
                        () = cancel.cancelled() => false,
                    };
                if deaf {
                    self.close_mid_call(
                        &connection,
                        format!(
                            "a call of {tool} timed out, and it did not answer a ping after it"
                        ),
                    )
                    .await;
                }
                Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!(
                        "{qualified} did not finish within {} s, so toolgate cancelled it (the MCP server {server} was sent notifications/cancelled). Whether it took effect is unknown.{}",
                        after.as_secs_f64(),
                        if deaf {
                            " The server did not answer a ping after it either, so toolgate closed the connection: the next call connects again."
                        } else {
                            ""
                        }
                    ),
                ))
            }
            Err(CallError::Cancelled) => Err(ToolError::failed(format!(
                "{qualified} was cancelled because its run was aborted (the MCP server {server} was sent notifications/cancelled); whether it took effect is unknown."
            ))),
            Err(CallError::Disconnected(why)) => {
                self.close_mid_call(
                    &connection,
                    format!("the connection ended during a call of {tool} ({why})"),
                )
                .await;
                Err(ToolError::failed(format!(
                    "The MCP server {server} stopped while {qualified} was running, so whether the call took effect is unknown. toolgate did not retry it: check before calling it again. The server is started again for the next call."
                )))
            }
            Err(CallError::TooLarge) => {
                self.close_mid_call(
                    &connection,
                    format!(
                        "it sent a message longer than {MAX_MESSAGE_BYTES} bytes during a call of {tool}"
                    ),
                )
                .await;
                Err(ToolError::failed(format!(
                    "The MCP server {server} sent a message longer than {} MiB while {qualified} was running (most likely its result), which toolgate does not read. The connection was closed on it, so whether the call took effect is not known for sure. toolgate did not retry it: check before calling it again, or ask for less. The server is started again for the next call.",
                    MAX_MESSAGE_BYTES / (1024 * 1024)
                )))
            }
            Err(CallError::Refused(why)) => Err(ToolError::failed(format!(
                "The MCP server {server} refused the call of {qualified}: {why}"
            ))),
            Err(CallError::Unreadable(why)) => Err(ToolError::failed(format!(
                "The MCP server {server} answered the call of {qualified} with a result toolgate cannot read ({why}), so whether the call took effect is unknown. toolgate did not retry it: check before calling it again."
            ))),
            Err(CallError::NotSent) => Err(ToolError::failed(format!(
                "{qualified} was not called: its run was aborted before the call went out to the MCP server {server}."
            ))),
            Err(CallError::SessionForgotten) => {
                self.close_mid_call(
                    &connection,
                    format!(
                        "it no longer knew toolgate's session when {tool} was called (HTTP 404)"
                    ),
                )
                .await;
                Err(ToolError::failed(format!(
                    "{qualified} was not called: the MCP server {server} no longer knows toolgate's session (it was started again, or let the session expire), and refused the call without running it. toolgate connects again for the next call, which may be this one again."
                )))
            }
        }
    }

    /// Ends a connection a call found unusable (its output closed, or carried what toolgate does not read): a stdio
    /// server's process is stopped even if it still runs, and the server is shown stopped with `reason` until the
    /// next call starts it again.
    async fn close_mid_call(self: &Arc<Self>, connection: &Connection, reason: String) {
        connection.stop.cancel();
        let stderr_tail = connection.stderr.as_ref().and_then(StderrTail::text);
        self.connection_lost(connection.generation, reason, stderr_tail)
            .await;
    }

    /// Ends a connection whose tool list could not be read because the connection is gone, its tools withdrawn: the
    /// server is started again by itself (see `connection_lost`), as no call of its tools could start it.
    async fn lost_with_tools_withdrawn(self: &Arc<Self>, connection: &Connection, reason: String) {
        connection
            .withdrawn
            .store(true, std::sync::atomic::Ordering::Release);
        self.close_mid_call(connection, reason).await;
    }

    /// Stops the server for good.
    async fn stop(&self) {
        self.stopping.cancel();
        let connection = {
            let mut link = self.link.lock().await;
            match std::mem::replace(&mut *link, Link::Stopped) {
                Link::Up(connection) => Some(connection),
                Link::Down(_) | Link::Stopped => None,
            }
        };
        if let Some(connection) = connection {
            connection.ended.cancel();
            // Ending the session closes a stdio server's input, its cue to exit; the supervisor does the rest.
            connection.client.cancel();
            connection.stop.cancel();
        }
        self.tasks.close();
        self.tasks.wait().await;
        if self.config.enabled {
            self.toolbox
                .update_source_status(self.status(McpServerState::Stopped, None, None));
        }
    }
}

/// The reason a server could not start, with the end of its standard error, once its process is stopped.
async fn failed_start(message: String, process: ServerProcess) -> (String, Option<String>) {
    let stderr = process.stderr();
    process.stop(STOP_GRACE).await;
    stderr.read_to_end(STDERR_PATIENCE).await;
    (message, stderr.text())
}

/// How long the end of a stopped server's standard error may take to be read, after the process is gone.
const STDERR_PATIENCE: Duration = Duration::from_secs(1);

/// How long to wait before starting a server again after `failures` failed starts: none after a crash, then 1 s,
/// doubling up to a minute.
fn backoff(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 1).min(6)).min(MAX_BACKOFF),
    }
}

/// Watches a stdio server's process: when it exits by itself the server is down; when toolgate stops it, it is
/// stopped with everything it started.
async fn supervise(
    server: Weak<McpServer>,
    mut process: ServerProcess,
    generation: u64,
    ended: CancellationToken,
    stop: CancellationToken,
) {
    let exited = tokio::select! {
        status = process.exited() => Some(status),
        () = stop.cancelled() => None,
    };
    match exited {
        None => process.stop(STOP_GRACE).await,
        Some(status) => {
            let stderr = process.stderr();
            process.end().await;
            ended.cancel();
            let reason = match status {
                Ok(status) => format!("its process exited ({status})"),
                Err(error) => format!("its process could not be waited for ({error})"),
            };
            stderr.read_to_end(STDERR_PATIENCE).await;
            let stderr_tail = stderr.text();
            if let Some(server) = server.upgrade() {
                server
                    .connection_lost(generation, reason, stderr_tail)
                    .await;
            }
        }
    }
}

/// Keeps the toolbox up to date with the server's tools: each `notifications/tools/list_changed` brings a new list.
///
/// A list that cannot be read (an error, or no answer within the tool timeout) withdraws the server's tools: once
/// the server has said they changed, what toolgate holds of them no longer says what a call would run, and a call
/// decided on it is refused. The list is asked for again, with backoff, until it comes or the server changes it
/// again. A list that failed because the connection is gone (its session forgotten, its output closed) ends the
/// connection instead: the server is started again, and lists its tools anew.
async fn follow_tool_list(
    server: Weak<McpServer>,
    connection: Weak<Connection>,
    mut announced: watch::Receiver<u64>,
    applied: watch::Sender<u64>,
    ended: CancellationToken,
) {
    // Failed reads of the list in a row; none while the server's tools are as it last listed them.
    let mut failures = 0;
    loop {
        let wait = backoff(failures);
        let announcing = tokio::select! {
            changed = announced.changed() => changed.is_ok(),
            () = tokio::time::sleep(wait), if failures > 0 => true,
            () = ended.cancelled() => return,
        };
        let (Some(server), Some(connection)) = (server.upgrade(), connection.upgrade()) else {
            return;
        };
        if !announcing {
            // The client stopped hearing the server. Its tools, if withdrawn, would stay so for good.
            if connection
                .withdrawn
                .load(std::sync::atomic::Ordering::Acquire)
            {
                server
                    .close_mid_call(
                        &connection,
                        "its connection ended while its new tool list was awaited".to_owned(),
                    )
                    .await;
            }
            return;
        }
        let target = *announced.borrow_and_update();
        // Bounded like a call: a server that never answers must hold up neither the calls that wait for its list
        // (see `tools_settled`) nor its later changes.
        let patience = server.config.tool_timeout;
        let listed = match tokio::time::timeout(patience, connection.client.list_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(
                error @ (CallError::Disconnected(_)
                | CallError::SessionForgotten
                | CallError::TooLarge),
            )) => {
                server
                    .lost_with_tools_withdrawn(
                        &connection,
                        format!("its new tool list could not be read: {error}"),
                    )
                    .await;
                return;
            }
            Ok(Err(error)) => Err(format!("it answered tools/list with an error: {error}")),
            // An HTTP server that does not answer a ping either is taken for lost, as after a call (see `call`).
            Err(_)
                if matches!(server.config.transport, McpTransport::Http { .. })
                    && !connection.client.answers_ping(PING_PATIENCE).await =>
            {
                server
                    .lost_with_tools_withdrawn(
                        &connection,
                        format!(
                            "it did not answer tools/list within {patience:?}, nor a ping after it"
                        ),
                    )
                    .await;
                return;
            }
            Err(_) => Err(format!("it did not answer tools/list within {patience:?}")),
        };
        let link = server.link.lock().await;
        if !matches!(&*link, Link::Up(up) if up.generation == connection.generation) {
            return;
        }
        let withdrawn = match listed.map(|tools| server.bounded(tools)) {
            Ok(Ok(tools)) => {
                failures = 0;
                server.publish(tools);
                None
            }
            // Past the bounds now: none of its tools is offered to the model until its list fits again.
            Ok(Err(message)) => {
                failures = 0;
                Some(message)
            }
            Err(why) => {
                failures += 1;
                Some(format!(
                    "it said its tools changed, and their new list could not be read ({why}); they are withdrawn until it can be, and toolgate asks again in {} s",
                    backoff(failures).as_secs()
                ))
            }
        };
        connection
            .withdrawn
            .store(withdrawn.is_some(), std::sync::atomic::Ordering::Release);
        if let Some(message) = withdrawn {
            tracing::warn!(server = server.config.name, %message, "an MCP server's tools are withdrawn");
            server.toolbox.replace_source(
                server.status(McpServerState::Failed, Some(message), None),
                Vec::new(),
            );
        }
        drop(link);
        applied.send_replace(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_from_none_to_a_minute() {
        let waits: Vec<u64> = (0..10)
            .map(|failures| backoff(failures).as_secs())
            .collect();
        assert_eq!(waits, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// The restarts a server gets by itself back off as its calls' restarts do: the first at once, then longer.
    #[test]
    fn restarts_without_a_call_wait_longer_each_time() {
        let mut restarts = Restarts::default();
        let waits: Vec<u64> = (0..4).map(|_| restarts.next().as_secs()).collect();
        assert_eq!(waits, [0, 1, 2, 4]);
    }
}
