//! The OpenAI-compatible client against a fake chat-completions server that speaks HTTP/1.1 and the real chunk
//! format over a real socket: streaming, tool-call assembly, the terminator, usage, every failure, and a
//! multi-step run with an approval in the middle. Each test asserts on what the fake received as well as on what
//! the client or the run produced.

mod support;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent::agent_loop::LoopLimits;
use agent::harness::Actor;
use agent::ids::RunId;
use agent::model::{
    ApiKey, Model, ModelChunk, ModelError, ModelRequest, OpenAiConfig, OpenAiModel, RetryPolicy,
    Usage,
};
use agent::wire::{Decision, Message, RunErrorCode, StreamEvent, ToolAnnotations, ToolSpec};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::timeout;

const KEY: &str = "sk-test-0123456789abcdef";

/// No test waits longer than this for anything; a hang is a failure, not a stuck suite.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------------------------
// The fake server
// ---------------------------------------------------------------------------------------------------------------

/// One request as the fake read it off the socket.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    /// Lower-cased names.
    headers: HashMap<String, String>,
    body: Value,
    at: Instant,
}

/// How the fake answers one request.
enum Reply {
    /// A 200 event stream: each piece written and flushed as one HTTP chunk, then the end.
    Stream { pieces: Vec<Piece>, end: End },
    /// A whole response with this status, these extra headers and this body.
    Status {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Reads the request and never answers.
    Silence,
}

enum Piece {
    Bytes(String),
    /// Waits until the test lets the stream go on.
    WaitFor(Arc<Notify>),
}

enum End {
    /// The chunked body's terminator; the connection closes cleanly.
    Complete,
    /// The socket closes in the middle of the chunked body.
    Drop,
    /// Nothing more is ever sent, and the connection stays open.
    Stall,
    /// A keep-alive comment at this interval, for ever: alive, never finished.
    KeepAlive(Duration),
}

struct Script {
    replies: VecDeque<Reply>,
    received: Vec<Received>,
}

struct FakeServer {
    base_url: String,
    script: Arc<Mutex<Script>>,
}

impl FakeServer {
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(Script {
            replies: replies.into(),
            received: Vec::new(),
        }));
        let accepting = Arc::clone(&script);
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&accepting)));
            }
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            script,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.script.lock().unwrap().received.clone()
    }

    fn unused_replies(&self) -> usize {
        self.script.lock().unwrap().replies.len()
    }
}

async fn serve(mut socket: TcpStream, script: Arc<Mutex<Script>>) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let reply = {
        let mut script = script.lock().unwrap();
        script.received.push(request);
        script.replies.pop_front()
    };
    let reply = reply.unwrap_or_else(|| Reply::Status {
        status: 500,
        headers: vec![],
        body: "the fake server has no reply scripted for this request".into(),
    });
    // Write errors mean the client went away, which some tests do on purpose.
    let _ = write_reply(&mut socket, reply).await;
}

async fn read_request(socket: &mut TcpStream) -> Option<Received> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let mut piece = [0u8; 4096];
        let read = socket.read(&mut piece).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&piece[..read]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let mut piece = [0u8; 4096];
        let read = socket.read(&mut piece).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&piece[..read]);
    }
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Some(Received {
        method,
        path,
        headers,
        body,
        at: Instant::now(),
    })
}

async fn write_reply(socket: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
            socket.shutdown().await
        }
        Reply::Stream { pieces, end } => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await?;
            socket.flush().await?;
            for piece in pieces {
                match piece {
                    Piece::Bytes(bytes) => {
                        let chunk = format!("{:x}\r\n{bytes}\r\n", bytes.len());
                        socket.write_all(chunk.as_bytes()).await?;
                        socket.flush().await?;
                    }
                    Piece::WaitFor(gate) => gate.notified().await,
                }
            }
            match end {
                End::Complete => {
                    socket.write_all(b"0\r\n\r\n").await?;
                    socket.shutdown().await
                }
                End::Drop => Ok(()),
                End::Stall => std::future::pending().await,
                End::KeepAlive(every) => loop {
                    tokio::time::sleep(every).await;
                    socket.write_all(b"e\r\n: keep-alive\n\n\r\n").await?;
                    socket.flush().await?;
                },
            }
        }
        Reply::Silence => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The chunk format
// ---------------------------------------------------------------------------------------------------------------

fn event(value: Value) -> String {
    format!("data: {value}\n\n")
}

fn choice(delta: Value, finish_reason: Option<&str>) -> String {
    event(json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        "usage": null
    }))
}

fn role() -> String {
    choice(json!({"role": "assistant", "content": ""}), None)
}

fn text(content: &str) -> String {
    choice(json!({"content": content}), None)
}

fn call_start(index: u32, id: &str, name: &str) -> String {
    choice(
        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                               "function": {"name": name, "arguments": ""}}]}),
        None,
    )
}

fn call_arguments(index: u32, arguments: &str) -> String {
    choice(
        json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
        None,
    )
}

fn finish(reason: &str) -> String {
    choice(json!({}), Some(reason))
}

fn usage(prompt: u64, completion: u64) -> String {
    event(json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-test",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    }))
}

const DONE: &str = "data: [DONE]\n\n";

fn bytes(pieces: &[String]) -> Vec<Piece> {
    pieces.iter().cloned().map(Piece::Bytes).collect()
}

fn stream(pieces: &[String]) -> Reply {
    Reply::Stream {
        pieces: bytes(pieces),
        end: End::Complete,
    }
}

fn status(status: u16, body: Value) -> Reply {
    Reply::Status {
        status,
        headers: vec![],
        body: body.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The client side
// ---------------------------------------------------------------------------------------------------------------

fn config(server: &FakeServer) -> OpenAiConfig {
    let mut config = OpenAiConfig::new("gpt-test");
    config.base_url = server.base_url.clone();
    config.api_key = ApiKey::new(KEY);
    // Long enough for a loaded machine; the timeout tests set their own short one.
    config.timeout = Duration::from_secs(10);
    config.retry = RetryPolicy {
        max_retries: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        max_retry_after: Duration::from_secs(5),
    };
    config
}

fn model(config: OpenAiConfig) -> OpenAiModel {
    OpenAiModel::new(config).expect("the test configuration is valid")
}

fn user(content: &str) -> Vec<Message> {
    vec![Message::User {
        content: content.into(),
    }]
}

fn read_file_tool() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: "Reads a file of the workspace.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"]
        }),
        annotations: ToolAnnotations::default(),
        mcp: None,
    }
}

fn run_id() -> RunId {
    RunId::parse("run-openai").unwrap()
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {PATIENCE:?}"))
}

/// Every item of one step, errors included.
async fn step(
    model: &OpenAiModel,
    messages: &[Message],
    tools: &[ToolSpec],
) -> Vec<Result<ModelChunk, ModelError>> {
    let run_id = run_id();
    let request = ModelRequest {
        run_id: &run_id,
        messages,
        tools,
    };
    within("the end of the step", model.stream(request).collect()).await
}

fn ok(items: Vec<Result<ModelChunk, ModelError>>) -> Vec<ModelChunk> {
    items
        .into_iter()
        .map(|item| item.unwrap_or_else(|error| panic!("the step failed: {error}")))
        .collect()
}

fn tool_call(id: &str, name: &str, arguments: &str) -> ModelChunk {
    ModelChunk::ToolCall(agent::wire::ToolCall {
        id: agent::ids::ToolCallId::parse(id).unwrap(),
        name: name.into(),
        arguments: arguments.into(),
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Streaming and assembly
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn streams_text_as_it_arrives_and_sends_the_request_the_api_expects() {
    let gate = Arc::new(Notify::new());
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: vec![
            Piece::Bytes(role()),
            Piece::Bytes(text("Hel")),
            Piece::WaitFor(Arc::clone(&gate)),
            Piece::Bytes(text("lo!")),
            Piece::Bytes(finish("stop")),
            Piece::Bytes(usage(12, 3)),
            Piece::Bytes(DONE.into()),
        ],
        end: End::Complete,
    }])
    .await;
    let model = model(config(&server));
    assert_eq!(model.name(), "gpt-test");
    let messages = vec![
        Message::System {
            content: "Be brief.".into(),
        },
        Message::User {
            content: "Say hello".into(),
        },
    ];
    let tools = vec![read_file_tool()];
    let run_id = run_id();
    let mut chunks = model.stream(ModelRequest {
        run_id: &run_id,
        messages: &messages,
        tools: &tools,
    });

    // The first delta arrives while the server still holds the rest of the step back.
    let first = within("the first delta", chunks.next()).await;
    assert_eq!(first, Some(Ok(ModelChunk::Text("Hel".into()))));
    gate.notify_one();
    let rest: Vec<_> = within("the rest of the step", chunks.collect()).await;
    assert_eq!(
        ok(rest),
        vec![
            ModelChunk::Text("lo!".into()),
            ModelChunk::Usage(Usage {
                prompt_tokens: 12,
                completion_tokens: 3,
                total_tokens: 15
            }),
            ModelChunk::Finish("stop".into()),
        ]
    );

    let received = server.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(request.headers["content-type"].starts_with("application/json"));
    assert_eq!(
        request.body,
        json!({
            "model": "gpt-test",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello"}
            ],
            "tools": [{
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Reads a file of the workspace.",
                    "parameters": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}},
                        "required": ["path"]
                    }
                }
            }]
        })
    );
}

#[tokio::test]
async fn assembles_arguments_split_mid_token_across_chunks_and_reads() {
    // CRLF line ends, a keep-alive comment, and one event cut in the middle of its `data:` line between two writes.
    let split_event = call_arguments(0, "tes/a.t").replace('\n', "\r\n");
    let (head, tail) = split_event.split_at(split_event.len() / 2);
    let server = FakeServer::start(vec![stream(&[
        role(),
        ": keep-alive\r\n\r\n".into(),
        call_start(0, "call_abc", "read_file"),
        call_arguments(0, "{\"pa"),
        call_arguments(0, "th\": \"no"),
        head.to_owned(),
        tail.to_owned(),
        call_arguments(0, "xt\"}"),
        finish("tool_calls"),
        usage(40, 9),
        DONE.into(),
    ])])
    .await;
    let model = model(config(&server));

    let chunks = ok(step(&model, &user("read notes/a.txt"), &[read_file_tool()]).await);

    assert_eq!(
        chunks,
        vec![
            tool_call("call_abc", "read_file", "{\"path\": \"notes/a.txt\"}"),
            ModelChunk::Usage(Usage {
                prompt_tokens: 40,
                completion_tokens: 9,
                total_tokens: 49
            }),
            ModelChunk::Finish("tool_calls".into()),
        ]
    );
    assert_eq!(server.received().len(), 1);
}

/// The key is scrubbed from errors, never from what the model wrote: local servers take placeholder keys (`ollama`,
/// `lm-studio`, `EMPTY`) that a call's arguments may well hold, and a call runs as the model sent it.
#[tokio::test]
async fn what_the_model_wrote_is_read_as_sent_even_where_it_holds_the_key() {
    let server = FakeServer::start(vec![stream(&[
        role(),
        text("ollama is running. "),
        call_start(0, "call_1", "run_command"),
        call_arguments(0, r#"{"command": "ollama list"}"#),
        finish("tool_calls"),
        DONE.into(),
    ])])
    .await;
    let mut config = config(&server);
    config.api_key = ApiKey::new("ollama");
    let chunks = ok(step(&model(config), &user("what models are there?"), &[]).await);
    assert_eq!(
        chunks,
        vec![
            ModelChunk::Text("ollama is running. ".into()),
            tool_call("call_1", "run_command", r#"{"command": "ollama list"}"#),
            ModelChunk::Finish("tool_calls".into()),
        ]
    );
}

#[tokio::test]
async fn assembles_two_interleaved_tool_calls_in_the_models_order() {
    let server = FakeServer::start(vec![stream(&[
        role(),
        call_start(0, "call_one", "read_file"),
        call_start(1, "call_two", "read_file"),
        call_arguments(1, "{\"path\":"),
        call_arguments(0, "{\"path\":"),
        call_arguments(0, "\"a.txt\"}"),
        call_arguments(1, "\"b.txt\"}"),
        finish("tool_calls"),
        usage(50, 20),
        DONE.into(),
    ])])
    .await;
    let model = model(config(&server));

    let chunks = ok(step(&model, &user("read a.txt and b.txt"), &[read_file_tool()]).await);

    assert_eq!(
        chunks,
        vec![
            tool_call("call_one", "read_file", "{\"path\":\"a.txt\"}"),
            tool_call("call_two", "read_file", "{\"path\":\"b.txt\"}"),
            ModelChunk::Usage(Usage {
                prompt_tokens: 50,
                completion_tokens: 20,
                total_tokens: 70
            }),
            ModelChunk::Finish("tool_calls".into()),
        ]
    );
}

#[tokio::test]
async fn stops_reading_at_the_done_terminator() {
    // After `[DONE]` the server neither ends the body nor closes: a client that waited for more would time out.
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: bytes(&[text("All done."), finish("stop"), DONE.into()]),
        end: End::Stall,
    }])
    .await;
    let mut config = config(&server);
    config.timeout = Duration::from_secs(3);
    let model = model(config);

    let started = Instant::now();
    let chunks = ok(step(&model, &user("hi"), &[]).await);

    assert_eq!(
        chunks,
        vec![
            ModelChunk::Text("All done.".into()),
            ModelChunk::Finish("stop".into())
        ]
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the client waited past [DONE]"
    );
}

#[tokio::test]
async fn a_local_server_gets_no_authorization_header_and_no_tools_when_there_are_none() {
    let server = FakeServer::start(vec![stream(&[text("Hi."), finish("stop"), DONE.into()])]).await;
    let mut config = config(&server);
    config.api_key = None;
    config.base_url = format!("{}/", server.base_url);
    config.model = "llama3.1".into();
    let model = model(config);

    let chunks = ok(step(&model, &user("hi"), &[]).await);

    assert_eq!(
        chunks,
        vec![
            ModelChunk::Text("Hi.".into()),
            ModelChunk::Finish("stop".into())
        ]
    );
    let received = server.received();
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert!(!received[0].headers.contains_key("authorization"));
    assert_eq!(received[0].body["model"], "llama3.1");
    assert!(received[0].body.get("tools").is_none());
}

#[tokio::test]
async fn a_stream_without_done_is_whole_once_the_model_said_why_it_stopped() {
    let finished = FakeServer::start(vec![stream(&[text("Short."), finish("length")])]).await;
    let chunks = ok(step(&model(config(&finished)), &user("hi"), &[]).await);
    assert_eq!(
        chunks,
        vec![
            ModelChunk::Text("Short.".into()),
            ModelChunk::Finish("length".into())
        ]
    );

    // The same clean end without a finish reason is a step cut short.
    let unfinished = FakeServer::start(vec![stream(&[
        text("Short."),
        call_start(0, "call_1", "read_file"),
    ])])
    .await;
    let items = step(&model(config(&unfinished)), &user("hi"), &[]).await;
    assert_eq!(items[0], Ok(ModelChunk::Text("Short.".into())));
    assert!(
        matches!(&items[1], Err(ModelError::Connection(message)) if message.contains("ended before")),
        "{items:?}"
    );
    assert_eq!(items.len(), 2, "no tool call comes out of a cut step");
}

/// Some servers send `stop` with every chunk: once more came after a reason, a pause longer than the wait after a
/// finish does not end the step there, and the rest of the answer and its calls come. Before, the step ended at the
/// first pause of 2 s, its answer cut and its later calls lost, as a whole step.
#[tokio::test]
async fn a_server_that_says_stop_with_every_chunk_keeps_its_step_whole_across_a_pause() {
    let gate = Arc::new(Notify::new());
    let with_stop = |delta: Value| choice(delta, Some("stop"));
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: vec![
            Piece::Bytes(with_stop(json!({"content": "Reading "}))),
            Piece::Bytes(with_stop(json!({"content": "both"}))),
            Piece::WaitFor(Arc::clone(&gate)),
            Piece::Bytes(with_stop(json!({"content": "."}))),
            Piece::Bytes(with_stop(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}]}),
            )),
            Piece::Bytes(DONE.into()),
        ],
        end: End::Complete,
    }])
    .await;
    let opened = Arc::clone(&gate);
    tokio::spawn(async move {
        // Longer than the wait for what follows a finish (2 s).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        opened.notify_one();
    });
    let chunks = ok(step(&model(config(&server)), &user("hi"), &[read_file_tool()]).await);
    let text: String = chunks
        .iter()
        .filter_map(|chunk| match chunk {
            ModelChunk::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Reading both.");
    assert!(
        chunks.contains(&tool_call("call_1", "read_file", r#"{"path": "a"}"#)),
        "{chunks:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_bad_key_fails_at_once_and_the_message_never_shows_the_key() {
    let server = FakeServer::start(vec![
        status(
            401,
            json!({"error": {
                "message": format!("Incorrect API key provided: {KEY}. You can find your API key at https://platform.openai.com/account/api-keys."),
                "type": "invalid_request_error",
                "param": null,
                "code": "invalid_api_key"
            }}),
        ),
        stream(&[text("never sent"), finish("stop"), DONE.into()]),
    ])
    .await;
    let model = model(config(&server));

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(items.len(), 1, "{items:?}");
    let Err(error @ ModelError::Unauthorized(message)) = &items[0] else {
        panic!("expected a 401 error, got {items:?}");
    };
    assert!(
        message.contains("Incorrect API key provided: [redacted]."),
        "{message}"
    );
    assert!(!error.to_string().contains(KEY));
    assert!(error.to_string().contains("HTTP 401"));
    assert_eq!(server.received().len(), 1, "a 401 is not retried");
}

#[tokio::test]
async fn an_unknown_model_fails_with_not_found() {
    let server = FakeServer::start(vec![status(
        404,
        json!({"error": {"message": "model \"llama9\" not found, try pulling it first", "type": "api_error"}}),
    )])
    .await;
    let mut config = config(&server);
    config.model = "llama9".into();
    let model = model(config);

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![Err(ModelError::NotFound(
            "model \"llama9\" not found, try pulling it first".into()
        ))]
    );
    assert_eq!(server.received().len(), 1, "a 404 is not retried");
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_wait_the_provider_asks_for() {
    let server = FakeServer::start(vec![
        Reply::Status {
            status: 429,
            headers: vec![("retry-after", "1".into())],
            body: json!({"error": {"message": "Rate limit reached for gpt-test.", "type": "requests"}})
                .to_string(),
        },
        stream(&[text("Made it."), finish("stop"), DONE.into()]),
    ])
    .await;
    let model = model(config(&server));

    let chunks = ok(step(&model, &user("hi"), &[]).await);

    assert_eq!(
        chunks,
        vec![
            ModelChunk::Text("Made it.".into()),
            ModelChunk::Finish("stop".into())
        ]
    );
    let received = server.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[0].body, received[1].body,
        "the retry sends the same request"
    );
    let waited = received[1].at - received[0].at;
    // The backoff alone would be 10 ms: the second is Retry-After's.
    assert!(
        waited >= Duration::from_millis(950),
        "retried after {waited:?}"
    );
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times() {
    let unavailable = || {
        status(
            503,
            json!({"error": {"message": "The engine is currently overloaded."}}),
        )
    };
    let server = FakeServer::start(vec![
        unavailable(),
        unavailable(),
        unavailable(),
        stream(&[text("too late"), finish("stop"), DONE.into()]),
    ])
    .await;
    let model = model(config(&server));

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![Err(ModelError::Server {
            status: 503,
            attempts: 3,
            message: "The engine is currently overloaded.".into()
        })]
    );
    assert_eq!(server.received().len(), 3, "one attempt and two retries");
    assert_eq!(server.unused_replies(), 1);
}

#[tokio::test]
async fn a_rate_limit_that_persists_ends_with_the_number_of_attempts() {
    let limited = || status(429, json!({"error": {"message": "Slow down."}}));
    let server = FakeServer::start(vec![status(500, json!({})), limited(), limited()]).await;
    let model = model(config(&server));

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![Err(ModelError::RateLimited {
            attempts: 3,
            message: "Slow down.".into()
        })]
    );
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let server = FakeServer::start(vec![status(
        400,
        json!({"error": {"message": "Invalid schema for function 'read_file'."}}),
    )])
    .await;
    let items = step(&model(config(&server)), &user("hi"), &[read_file_tool()]).await;
    assert_eq!(
        items,
        vec![Err(ModelError::Http {
            status: 400,
            message: "Invalid schema for function 'read_file'.".into()
        })]
    );
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_connection_dropped_mid_stream_ends_the_step_with_a_connection_error() {
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: bytes(&[
            text("Let me look"),
            call_start(0, "call_1", "read_file"),
            call_arguments(0, "{\"pa"),
        ]),
        end: End::Drop,
    }])
    .await;
    let model = model(config(&server));

    let items = step(&model, &user("read a.txt"), &[read_file_tool()]).await;

    assert_eq!(items[0], Ok(ModelChunk::Text("Let me look".into())));
    assert!(
        matches!(&items[1], Err(ModelError::Connection(message)) if message.contains("broke off")),
        "{items:?}"
    );
    assert_eq!(items.len(), 2, "nothing comes after the error");
}

/// A stream that breaks off, or goes quiet, after the model said why it stopped: the step is whole (only its token
/// counts may be missing), not a failed run. Before, the person saw the whole answer and then a connection error.
#[tokio::test]
async fn a_stream_that_breaks_off_or_stalls_after_the_model_finished_keeps_its_step() {
    for end in [End::Drop, End::Stall] {
        let server = FakeServer::start(vec![Reply::Stream {
            pieces: bytes(&[text("Hi"), finish("stop")]),
            end,
        }])
        .await;
        let model = model(config(&server));
        let started = std::time::Instant::now();

        let items = step(&model, &user("hi"), &[]).await;

        assert_eq!(
            items,
            vec![
                Ok(ModelChunk::Text("Hi".into())),
                Ok(ModelChunk::Finish("stop".into()))
            ]
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "taken as whole within seconds: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn a_malformed_chunk_ends_the_step() {
    let server = FakeServer::start(vec![stream(&[
        text("ok"),
        "data: {\"choices\": [{\"delta\": {\"content\": \"unterminated\n\n".into(),
        text("never read"),
        DONE.into(),
    ])])
    .await;
    let model = model(config(&server));

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(items[0], Ok(ModelChunk::Text("ok".into())));
    assert!(
        matches!(&items[1], Err(ModelError::Malformed(message)) if message.contains("not a chat-completion chunk")),
        "{items:?}"
    );
    assert_eq!(items.len(), 2);
}

#[tokio::test]
async fn an_error_reported_inside_the_stream_ends_the_step() {
    let server = FakeServer::start(vec![stream(&[
        text("Hi"),
        event(json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}})),
        DONE.into(),
    ])])
    .await;

    let items = step(&model(config(&server)), &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![
            Ok(ModelChunk::Text("Hi".into())),
            Err(ModelError::Provider(
                "The server had an error while processing your request.".into()
            ))
        ]
    );
}

/// An error reported inside the stream may quote what the server was sent, the key included; its text is cut short
/// for the person, and the key is scrubbed before the cut. Before, a key that the cut split in two kept its first
/// part in the run's error and the audit log, as the scrub only knew the whole key.
#[tokio::test]
async fn an_error_inside_the_stream_that_quotes_the_key_where_it_is_cut_shows_none_of_it() {
    // The key begins 8 characters before the message's cut at 500.
    let quoting =
        |before: usize| format!("{}Authorization: Bearer {KEY}", "x".repeat(470 - before));
    let unterminated = "{\"choices\": [{\"delta\": \"";
    let replies = [
        event(json!({"error": {"message": quoting(0)}})),
        format!(
            "event: error\ndata: {}\n\n",
            json!({"error": {"message": quoting(0)}})
        ),
        format!("data: {unterminated}{}\n\n", quoting(unterminated.len())),
    ];
    for reply in replies {
        let server = FakeServer::start(vec![stream(&[reply, DONE.into()])]).await;
        let items = step(&model(config(&server)), &user("hi"), &[]).await;
        let Some(Err(error)) = items.last() else {
            panic!("{items:?}")
        };
        let message = error.to_string();
        assert!(message.contains("Authorization: Bearer"), "{message}");
        for start in 0..=KEY.len() - 8 {
            assert!(
                !message.contains(&KEY[start..start + 8]),
                "{message} shows part of the key"
            );
        }
    }
}

#[tokio::test]
async fn a_server_that_ignores_stream_true_is_refused_with_a_clear_message() {
    let server = FakeServer::start(vec![status(
        200,
        json!({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}),
    )])
    .await;

    let items = step(&model(config(&server)), &user("hi"), &[]).await;

    assert!(
        matches!(&items[..], [Err(ModelError::Malformed(message))] if message.contains("expected an event stream but got application/json")),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_provider_that_never_answers_times_out() {
    let server = FakeServer::start(vec![Reply::Silence]).await;
    let mut config = config(&server);
    config.timeout = Duration::from_millis(300);
    let model = model(config);

    let started = Instant::now();
    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![Err(ModelError::Timeout(Duration::from_millis(300)))]
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(server.received().len(), 1, "a timeout is not retried");
}

#[tokio::test]
async fn a_stream_that_stalls_times_out() {
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: bytes(&[text("Thinking")]),
        end: End::Stall,
    }])
    .await;
    let mut config = config(&server);
    config.timeout = Duration::from_millis(300);
    let model = model(config);

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![
            Ok(ModelChunk::Text("Thinking".into())),
            Err(ModelError::Timeout(Duration::from_millis(300)))
        ]
    );
}

#[tokio::test]
async fn a_stream_kept_alive_without_an_end_fails_at_the_steps_deadline() {
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: bytes(&[text("Thinking")]),
        end: End::KeepAlive(Duration::from_millis(50)),
    }])
    .await;
    let mut config = config(&server);
    // Each keep-alive comes well within the wait for a next piece; the step as a whole does not end.
    config.timeout = Duration::from_millis(500);
    config.step_timeout = Duration::from_millis(1_500);
    let model = model(config);

    let started = Instant::now();
    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![
            Ok(ModelChunk::Text("Thinking".into())),
            Err(ModelError::StepTimeout(Duration::from_millis(1_500)))
        ]
    );
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(
        ModelError::StepTimeout(Duration::from_secs(600)).to_string(),
        "the model did not finish its answer within 600s"
    );
}

/// A step whose model said why it stopped is whole, even when the step's deadline comes while toolgate waits for
/// what may follow (token counts, `[DONE]`). Before, the deadline threw the finished step away as timed out.
#[tokio::test]
async fn a_step_finished_before_its_deadline_is_kept_when_the_deadline_comes_during_the_wait_after()
{
    let server = FakeServer::start(vec![Reply::Stream {
        pieces: bytes(&[text("Hi"), finish("stop")]),
        end: End::KeepAlive(Duration::from_millis(50)),
    }])
    .await;
    let mut config = config(&server);
    // Within the 2 s toolgate waits after the finish for what may follow.
    config.step_timeout = Duration::from_millis(700);
    let model = model(config);

    let items = step(&model, &user("hi"), &[]).await;

    assert_eq!(
        items,
        vec![
            Ok(ModelChunk::Text("Hi".into())),
            Ok(ModelChunk::Finish("stop".into()))
        ]
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error() {
    // Bind a port, then free it: nothing listens there any more.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = OpenAiConfig::new("gpt-test");
    config.base_url = format!("http://{addr}/v1");
    config.api_key = ApiKey::new(KEY);
    config.timeout = Duration::from_secs(5);
    let model = model(config);

    let items = step(&model, &user("hi"), &[]).await;

    assert!(
        matches!(&items[..], [Err(ModelError::Connection(message))] if !message.contains(KEY)),
        "{items:?}"
    );
}

/// Some gateways take their key in the base URL's query (`?api-key=...`). A connection error says which server it
/// could not reach, without the query: the error goes into the run's log and to the page. Before, reqwest's error
/// text carried the whole URL.
#[tokio::test]
async fn a_connection_error_does_not_show_the_base_urls_query() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = OpenAiConfig::new("gpt-test");
    config.base_url = format!("http://{addr}/v1?api-key=gateway-secret-77");
    config.timeout = Duration::from_secs(5);
    let model = model(config);

    let items = step(&model, &user("hi"), &[]).await;

    let [Err(ModelError::Connection(message))] = &items[..] else {
        panic!("{items:?}")
    };
    assert!(!message.contains("gateway-secret-77"), "{message}");
    assert!(
        message.contains(&format!("http://{addr}/v1/chat/completions")),
        "it says which server: {message}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Whole runs
// ---------------------------------------------------------------------------------------------------------------

fn tools_over(model: OpenAiModel) -> support::CountingTools {
    support::counting_tools(
        Arc::new(model),
        agent::wire::ApprovalPolicy::OnRequest,
        agent::policy::RuleSet::new(),
        LoopLimits::default(),
    )
}

/// The run's events as clients see them, serialized.
fn wire_text(events: &[StreamEvent]) -> String {
    events
        .iter()
        .map(|event| serde_json::to_string(event).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_multi_step_run_pauses_for_approval_and_sends_the_call_and_its_result_back() {
    let server = FakeServer::start(vec![
        stream(&[
            role(),
            text("I'll delete it."),
            call_start(0, "call_del", "delete_file"),
            call_arguments(0, "{\"path\""),
            call_arguments(0, ": \"old.txt\"}"),
            finish("tool_calls"),
            usage(80, 15),
            DONE.into(),
        ]),
        stream(&[
            text("Deleted "),
            text("old.txt."),
            finish("stop"),
            usage(120, 4),
            DONE.into(),
        ]),
    ])
    .await;
    let fx = tools_over(model(config(&server)));
    let run = support::start_interactive(&fx.harness, "delete old.txt").await;

    let request = within(
        "the approval request",
        support::Events::of(&run).next_approval(),
    )
    .await;
    assert_eq!(request.tool_call_id.as_str(), "call_del");
    assert_eq!(
        server.received().len(),
        1,
        "the run waits for the person before asking the model again"
    );
    assert_eq!(fx.deletes.count(), 0, "nothing ran before the approval");
    fx.harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::approve(),
            &Actor::local(),
        )
        .await
        .unwrap();
    let events = within("the end of the run", support::all_events(&run)).await;

    assert_eq!(support::answer(&events), Some("Deleted old.txt."));
    assert!(matches!(
        events.last(),
        Some(StreamEvent::Done { steps: 2, .. })
    ));
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "old.txt"})]);

    let received = server.received();
    assert_eq!(received.len(), 2);
    let tools: Vec<&str> = received[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, vec!["delete_file", "read_file"]);
    assert_eq!(
        received[0].body["messages"],
        json!([{"role": "user", "content": "delete old.txt"}])
    );
    assert_eq!(
        received[1].body["messages"],
        json!([
            {"role": "user", "content": "delete old.txt"},
            {"role": "assistant", "content": "I'll delete it.", "tool_calls": [{
                "id": "call_del",
                "type": "function",
                "function": {"name": "delete_file", "arguments": "{\"path\": \"old.txt\"}"}
            }]},
            {"role": "tool", "tool_call_id": "call_del",
             "content": json!({"done": {"path": "old.txt"}}).to_string()}
        ])
    );

    // Each step's end, with why the model stopped and what it used, as the debug console shows it.
    let finished: Vec<(String, Option<Value>)> = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::Debug { message, data, .. } if message.contains("the model finished") => {
                Some((message.clone(), data.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 2);
    assert!(
        finished[0]
            .0
            .starts_with("step 1: the model finished (tool_calls)")
    );
    assert_eq!(
        finished[0].1,
        Some(json!({"usage": {"promptTokens": 80, "completionTokens": 15, "totalTokens": 95}}))
    );
    assert!(
        finished[1]
            .0
            .starts_with("step 2: the model finished (stop)")
    );
    assert_eq!(
        finished[1].1,
        Some(json!({"usage": {"promptTokens": 120, "completionTokens": 4, "totalTokens": 124}}))
    );
    let deltas: Vec<(u32, &str)> = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::AssistantDelta { step, delta, .. } => Some((*step, delta.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deltas,
        vec![(1, "I'll delete it."), (2, "Deleted "), (2, "old.txt.")]
    );
    assert!(!wire_text(&events).contains(KEY));
}

#[tokio::test]
async fn a_denied_call_goes_back_to_the_model_as_a_denial_output() {
    let server = FakeServer::start(vec![
        stream(&[
            call_start(0, "call_del", "delete_file"),
            call_arguments(0, "{\"path\": \"old.txt\"}"),
            finish("tool_calls"),
            DONE.into(),
        ]),
        stream(&[text("I left old.txt alone."), finish("stop"), DONE.into()]),
    ])
    .await;
    let fx = tools_over(model(config(&server)));
    let run = support::start_interactive(&fx.harness, "delete old.txt").await;
    let request = within(
        "the approval request",
        support::Events::of(&run).next_approval(),
    )
    .await;
    fx.harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Deny {
                reason: Some("Keep it.".into()),
            },
            &Actor::local(),
        )
        .await
        .unwrap();
    let events = within("the end of the run", support::all_events(&run)).await;

    assert_eq!(support::answer(&events), Some("I left old.txt alone."));
    assert_eq!(fx.deletes.count(), 0);
    let received = server.received();
    assert_eq!(received.len(), 2);
    let messages = received[1].body["messages"].as_array().unwrap();
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_del",
            "type": "function",
            "function": {"name": "delete_file", "arguments": "{\"path\": \"old.txt\"}"}
        }]})
    );
    assert_eq!(messages[2]["role"], "tool");
    assert_eq!(messages[2]["tool_call_id"], "call_del");
    let content: Value = serde_json::from_str(messages[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["error"]["code"], "APPROVAL_DENIED");
    let denial = content["error"]["message"].as_str().unwrap();
    assert!(denial.contains("Keep it."), "{denial}");
    assert!(denial.contains("Do not retry the same call"), "{denial}");
}

#[tokio::test]
async fn a_provider_failure_ends_the_run_with_a_model_error_that_hides_the_key() {
    let server = FakeServer::start(vec![status(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}."), "code": "invalid_api_key"}}),
    )])
    .await;
    let fx = tools_over(model(config(&server)));
    let run = support::start_interactive(&fx.harness, "hi").await;
    let events = within("the end of the run", support::all_events(&run)).await;

    let Some((code, message)) = support::failure(&events) else {
        panic!("expected a model error, got {events:?}");
    };
    assert_eq!(code, RunErrorCode::Model);
    assert!(message.contains("HTTP 401"), "{message}");
    assert!(!message.contains(KEY), "{message}");
    let wire = wire_text(&events);
    assert!(wire.contains("\"type\":\"error\""), "{wire}");
    assert!(!wire.contains(KEY), "{wire}");
    assert_eq!(
        server.received()[0].headers["authorization"],
        format!("Bearer {KEY}")
    );
}
