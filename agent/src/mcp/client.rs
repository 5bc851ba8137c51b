//! The one place that speaks to `rmcp`, the official Rust SDK: connect to a server (a child process on stdio, or
//! streamable HTTP), list its tools, call one, close. The rest of toolgate sees only the types here, so a change in
//! the SDK or the protocol stays in this file. Results and tool definitions are read from their JSON form rather
//! than from the SDK's structs, which grow with every revision of the protocol.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::JsonRpcMessage;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, Implementation,
    ListToolsRequest, PaginatedRequestParams, RequestOptionalParam, ServerNotification,
    ServerResult,
};
use rmcp::service::{RoleClient, RunningService, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::wire::ToolAnnotations;

/// The longest message a server may send, on stdio or HTTP. The SDK drops a longer line without a word, and the
/// call it answered would wait for its timeout: on stdio, a longer message ends the connection instead (see
/// [`BoundedLines`]), and the call says why.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// At most this many pages of tools are read from one server.
const MAX_TOOL_PAGES: usize = 100;

/// A tool as its server defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub annotations: ToolAnnotations,
}

/// What a call returned: the content the model reads, and whether the server flagged it as an error.
#[derive(Clone, Debug, PartialEq)]
pub struct CallResult {
    pub content: Value,
    pub is_error: bool,
}

/// Why a call has no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("it did not answer within {0:?}")]
    TimedOut(Duration),
    #[error("the call was cancelled")]
    Cancelled,
    /// The connection ended (the process exited, the HTTP session failed) before the answer came.
    #[error("the connection ended before the answer came ({0})")]
    Disconnected(String),
    /// The server sent a message longer than [`MAX_MESSAGE_BYTES`]; the connection was closed on it.
    #[error(
        "it sent a message longer than {MAX_MESSAGE_BYTES} bytes, which toolgate does not read"
    )]
    TooLarge,
    /// The server answered with a protocol error (an unknown tool, invalid parameters).
    #[error("{0}")]
    Refused(String),
    /// The server answered with what the SDK cannot read as a result (a content block of a kind it does not know,
    /// an image without its type): the call was made, and what it did is not known.
    #[error("its answer cannot be read as a result ({0})")]
    Unreadable(String),
    /// The run was aborted before the call went out: nothing was sent.
    #[error("the call was not made: its run was aborted first")]
    NotSent,
    /// An HTTP server answered that it does not know the session (404): it was started again, or let the session
    /// expire. It refused the request without running it.
    #[error("the server no longer knows the session")]
    SessionForgotten,
}

/// Why a server could not be connected.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("the MCP handshake failed: {0}")]
    Handshake(String),
    #[error("cannot list its tools: {0}")]
    ListTools(CallError),
}

/// A connected server.
pub struct McpClient {
    service: RunningService<RoleClient, ClientConfig>,
    /// How many `notifications/tools/list_changed` the server has sent, counted as each arrives and before
    /// anything after it is handled.
    announced: watch::Receiver<u64>,
    /// Set when the server sent a message longer than [`MAX_MESSAGE_BYTES`] (stdio): why the connection ended.
    oversized: Arc<AtomicBool>,
}

impl McpClient {
    /// Speaks MCP over a child's standard input and output. Lines that are not JSON-RPC (junk a server prints on
    /// stdout) are skipped by the SDK.
    pub async fn connect_stdio(
        stdout: ChildStdout,
        stdin: ChildStdin,
    ) -> Result<Self, ConnectError> {
        let oversized = Arc::new(AtomicBool::new(false));
        let stdout = BoundedLines {
            inner: stdout,
            open: 0,
            oversized: Arc::clone(&oversized),
        };
        // The SDK's own bound is never the one met: a line it dropped would leave its call waiting.
        let transport = AsyncRwTransport::<RoleClient, _, _>::new(stdout, stdin)
            .with_max_line_length(MAX_MESSAGE_BYTES.saturating_mul(2));
        Self::connect(transport, oversized).await
    }

    /// Speaks MCP over streamable HTTP, sending `headers` with every request.
    pub async fn connect_http(
        url: &str,
        headers: &BTreeMap<String, String>,
    ) -> Result<Self, ConnectError> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| {
                ConnectError::Handshake(format!("cannot build an HTTP client: {error}"))
            })?;
        let mut custom = HashMap::new();
        for (name, value) in headers {
            // The configuration checked both already.
            if let (Ok(name), Ok(value)) = (
                reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                reqwest::header::HeaderValue::from_str(value),
            ) {
                custom.insert(name, value);
            }
        }
        // A session the server forgot (it restarted) ends the connection, rather than the SDK's silent new session:
        // toolgate then connects again itself and lists the tools again, so a call approved for a tool as it was
        // defined never runs on a server that now defines it otherwise (`McpServer::call`).
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
            .reinit_on_expired_session(false)
            .custom_headers(custom)
            .max_json_response_size(MAX_MESSAGE_BYTES)
            .max_sse_event_size(MAX_MESSAGE_BYTES);
        Self::connect(
            StreamableHttpClientTransport::with_client(client, config),
            Arc::new(AtomicBool::new(false)),
        )
        .await
    }

    async fn connect<T>(transport: T, oversized: Arc<AtomicBool>) -> Result<Self, ConnectError>
    where
        T: Transport<RoleClient> + 'static,
    {
        let (announce, announced) = watch::channel(0);
        let transport = Observed {
            inner: transport,
            announce,
        };
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
        );
        let service = rmcp::serve_client(info, transport)
            .await
            .map_err(|error| ConnectError::Handshake(error.to_string()))?;
        Ok(Self {
            service,
            announced,
            oversized,
        })
    }

    /// What a failed request says: a connection that ended on an overlong message ended for that reason.
    fn call_error(&self, error: rmcp::ServiceError) -> CallError {
        match call_error(error) {
            CallError::Disconnected(_) if self.oversized.load(Ordering::Acquire) => {
                CallError::TooLarge
            }
            error => error,
        }
    }

    /// The server's name and version, as it gave them.
    pub fn server_info(&self) -> Option<String> {
        let info = self.service.peer().peer_info()?;
        let value = serde_json::to_value(info.as_ref()).ok()?;
        let server = value.get("serverInfo")?;
        Some(format!(
            "{} {}",
            server.get("name")?.as_str()?,
            server.get("version").and_then(Value::as_str).unwrap_or("")
        ))
    }

    /// Counts the server's tool-list announcements.
    pub fn announcements(&self) -> watch::Receiver<u64> {
        self.announced.clone()
    }

    /// Every tool the server has now, page after page. Asked of the server each time: the SDK's cache could answer
    /// with a list the server has just announced is stale.
    pub async fn list_tools(&self) -> Result<Vec<RemoteTool>, CallError> {
        let peer = self.service.peer();
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let request = match cursor.take() {
                None => ListToolsRequest::default(),
                Some(cursor) => RequestOptionalParam::with_param(
                    PaginatedRequestParams::default().with_cursor(Some(cursor)),
                ),
            };
            let page = match peer
                .send_request(ClientRequest::ListToolsRequest(request))
                .await
                .map_err(|error| self.call_error(error))?
            {
                ServerResult::ListToolsResult(page) => page,
                other => {
                    return Err(CallError::Refused(format!(
                        "it answered tools/list with {other:?}"
                    )));
                }
            };
            let page =
                serde_json::to_value(&page).map_err(|e| CallError::Refused(e.to_string()))?;
            for tool in page["tools"].as_array().into_iter().flatten() {
                tools.push(remote_tool(tool)?);
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(tools),
            }
        }
        Err(CallError::Refused(format!(
            "it listed more than {MAX_TOOL_PAGES} pages of tools"
        )))
    }

    /// Calls a tool. A call that runs past `timeout`, is cancelled, or whose future is dropped is abandoned, and
    /// the server is told with `notifications/cancelled`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<CallResult, CallError> {
        let arguments = match arguments {
            Value::Object(arguments) => arguments,
            Value::Null => Map::new(),
            other => {
                return Err(CallError::Refused(format!(
                    "MCP tools take an object of arguments, not {other}"
                )));
            }
        };
        // A run aborted before the call goes out sends nothing: the SDK would put the request on the wire before it
        // saw the cancellation, and a server may run it whatever notifications/cancelled says after it.
        if cancel.is_cancelled() {
            return Err(CallError::NotSent);
        }
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        // Dropping the call makes the SDK send notifications/cancelled. The call is polled first, so that a request
        // cancelled once it is under way still goes out before its cancellation.
        let result = tokio::select! {
            biased;
            result = self.service.peer().call_tool(params) => {
                result.map_err(|error| self.call_error(error))?
            }
            () = tokio::time::sleep(timeout) => return Err(CallError::TimedOut(timeout)),
            () = cancel.cancelled() => return Err(CallError::Cancelled),
        };
        let result =
            serde_json::to_value(&result).map_err(|e| CallError::Refused(e.to_string()))?;
        Ok(CallResult {
            is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
            content: model_content(&result),
        })
    }

    /// Whether the server answers a ping within `patience`. One that does not is stuck, or no longer knows this
    /// session: an HTTP server started again answers the old session's requests with an error no request can take
    /// (`@modelcontextprotocol/server-everything` says 400 with no id), so every call would wait out its timeout.
    pub async fn answers_ping(&self, patience: Duration) -> bool {
        let ping = ClientRequest::PingRequest(Default::default());
        // Any answer is one: an error (a server without ping, say) was sent by a server that heard.
        matches!(
            tokio::time::timeout(patience, self.service.peer().send_request(ping)).await,
            Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_)))
        )
    }

    /// Ends the session and waits (briefly) until it is closed; for a stdio server this closes its standard input.
    pub async fn close(mut self) {
        let _ = self
            .service
            .close_with_timeout(Duration::from_secs(1))
            .await;
    }

    /// Ends the session without waiting; calls still going end with it.
    pub fn cancel(&self) {
        self.service.cancellation_token().cancel();
    }
}

/// A server's standard output, read line by line by the SDK, that ends with an error at a line longer than
/// [`MAX_MESSAGE_BYTES`]. The SDK would drop such a line and read on, and the request it answered would wait for
/// its timeout; ending the stream ends the connection, and every request waiting on it fails at once.
struct BoundedLines<R> {
    inner: R,
    /// The bytes of the line not yet ended.
    open: usize,
    oversized: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.inner).poll_read(context, buf);
        if let Poll::Ready(Ok(())) = read {
            // Each line this read ends, and the one it leaves open: the first goes on from the last read.
            let mut longest = 0;
            let mut lines = buf.filled()[before..].split(|&byte| byte == b'\n');
            let mut open = this
                .open
                .saturating_add(lines.next().map_or(0, <[u8]>::len));
            for line in lines {
                longest = longest.max(open);
                open = line.len();
            }
            this.open = open;
            if longest.max(open) > MAX_MESSAGE_BYTES {
                this.oversized.store(true, Ordering::Release);
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a message longer than {MAX_MESSAGE_BYTES} bytes"),
                )));
            }
        }
        read
    }
}

/// The TLS provider for HTTP servers: ring, as the OpenAI client uses (aws-lc would need cmake at build time).
fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn call_error(error: rmcp::ServiceError) -> CallError {
    match error {
        rmcp::ServiceError::McpError(error) => CallError::Refused(error.message.to_string()),
        rmcp::ServiceError::TransportClosed => {
            CallError::Disconnected("the transport closed".to_owned())
        }
        rmcp::ServiceError::TransportSend(error)
            if matches!(
                error
                    .error
                    .downcast_ref::<rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>>(),
                Some(rmcp::transport::streamable_http_client::StreamableHttpError::SessionExpired)
            ) =>
        {
            CallError::SessionForgotten
        }
        rmcp::ServiceError::TransportSend(error) => CallError::Disconnected(error.to_string()),
        // The session itself was closed (toolgate is stopping the server).
        rmcp::ServiceError::Cancelled { .. } => {
            CallError::Disconnected("the session was closed".to_owned())
        }
        rmcp::ServiceError::Timeout { timeout } => CallError::TimedOut(timeout),
        rmcp::ServiceError::UnexpectedResponse => {
            CallError::Unreadable("the MCP SDK does not read it as any result".to_owned())
        }
        other => CallError::Refused(other.to_string()),
    }
}

/// A tool from its JSON definition.
fn remote_tool(tool: &Value) -> Result<RemoteTool, CallError> {
    let name = tool["name"]
        .as_str()
        .ok_or_else(|| CallError::Refused(format!("it listed a tool without a name: {tool}")))?;
    let hint = |field: &str| tool["annotations"][field].as_bool();
    let title = tool["title"]
        .as_str()
        .or_else(|| tool["annotations"]["title"].as_str());
    let description = tool["description"].as_str().unwrap_or_default();
    let description = match title {
        Some(title) if description.is_empty() => title.to_owned(),
        _ => description.to_owned(),
    };
    Ok(RemoteTool {
        name: name.to_owned(),
        description,
        input_schema: tool
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        annotations: ToolAnnotations {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
            open_world: hint("openWorldHint"),
        },
    })
}

/// What the model reads of a result: its text, when the content is only text; otherwise the content blocks and
/// the structured content as JSON.
fn model_content(result: &Value) -> Value {
    let blocks = result["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    let texts: Option<Vec<&str>> = blocks
        .iter()
        .map(|block| match block["type"].as_str() {
            Some("text") => block["text"].as_str(),
            _ => None,
        })
        .collect();
    match (texts, structured) {
        (Some(texts), None) => Value::String(texts.join("\n")),
        (_, structured) => {
            let mut content = Map::new();
            content.insert("content".to_owned(), Value::Array(blocks.to_vec()));
            if let Some(structured) = structured {
                content.insert("structuredContent".to_owned(), structured.clone());
            }
            Value::Object(content)
        }
    }
}

/// A transport that counts `notifications/tools/list_changed` as they arrive. The SDK hands notifications to a
/// task of their own, which may run after the response that followed them; counting here, in the order the
/// server sent them, lets a call know that the tools changed before its answer.
struct Observed<T> {
    inner: T,
    announce: watch::Sender<u64>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Observed<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(notification) = &message
            && matches!(
                notification.notification,
                ServerNotification::ToolListChangedNotification(_)
            )
        {
            self.announce.send_modify(|count| *count += 1);
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An HTTP server that answers 404 for toolgate's session (it was started again, or let the session expire)
    /// refused the request unrun: the call was not made. (rmcp gives it to the request only with its own
    /// re-initialisation off.) Other failures of the transport leave the call's effect unknown.
    #[test]
    fn a_session_the_server_forgot_is_told_from_a_lost_connection() {
        use rmcp::transport::streamable_http_client::StreamableHttpError;
        let failed = |error: StreamableHttpError<reqwest::Error>| {
            call_error(rmcp::ServiceError::TransportSend(
                rmcp::transport::DynamicTransportError::from_parts(
                    "streamable-http",
                    std::any::TypeId::of::<()>(),
                    Box::new(error),
                ),
            ))
        };
        assert!(matches!(
            failed(StreamableHttpError::SessionExpired),
            CallError::SessionForgotten
        ));
        assert!(matches!(
            failed(StreamableHttpError::UnexpectedEndOfStream),
            CallError::Disconnected(_)
        ));
    }

    #[test]
    fn text_content_reaches_the_model_as_text_and_the_rest_as_json() {
        let text =
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(model_content(&text), json!("a\nb"));
        let image =
            json!({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]});
        assert_eq!(model_content(&image), json!({"content": image["content"]}));
        let structured =
            json!({"content": [{"type": "text", "text": "{}"}], "structuredContent": {"a": 1}});
        assert_eq!(
            model_content(&structured),
            json!({"content": structured["content"], "structuredContent": {"a": 1}})
        );
        assert_eq!(model_content(&json!({"content": []})), json!(""));
    }

    #[test]
    fn a_tool_definition_is_read_from_its_json() {
        let tool = remote_tool(&json!({
            "name": "echo",
            "title": "Echo Tool",
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }))
        .unwrap();
        assert_eq!(tool.name, "echo");
        assert_eq!(tool.description, "Echo Tool");
        assert_eq!(
            tool.annotations,
            ToolAnnotations {
                read_only: Some(true),
                destructive: None,
                idempotent: None,
                open_world: Some(false)
            }
        );
        assert!(remote_tool(&json!({"description": "nameless"})).is_err());
    }
}
