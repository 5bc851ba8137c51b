//! The OpenAI-compatible chat-completions client: OpenAI itself, or a local server that speaks the same API
//! (Ollama, vLLM, llama.cpp's server, LM Studio).
//!
//! One step is one streamed `POST {base}/chat/completions`. Text deltas go to the loop as they arrive; tool calls
//! are assembled from their pieces and handed over whole when the step ends ([`protocol::StepAssembler`]). A 429
//! or a 5xx is retried a bounded number of times with exponential backoff, honouring `Retry-After`; every other
//! failure ends the step with a [`ModelError`] that says what happened.
//!
//! The API key only ever leaves this module as a sensitive `Authorization` header: [`ApiKey`] has no `Display`
//! and a redacted `Debug`, and every error message is scrubbed of the key, since providers quote what they were
//! sent.

mod protocol;
mod sse;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Once;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Response, StatusCode, Url};

use super::{Model, ModelChunk, ModelError, ModelRequest, ModelStream};
use protocol::{ChatChunk, ChatRequest, StepAssembler};
use sse::SseError;

/// The most of an error body we read: enough for any provider's explanation.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// What replaces the key wherever it would have been shown.
const REDACTED: &str = "[redacted]";

/// An API key. It has no `Display`, its `Debug` is redacted, and nothing in this crate writes it anywhere but
/// into the `Authorization` header.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key from its text, surrounding whitespace removed. `None` for a blank one: local servers need no key,
    /// and an empty `OPENAI_API_KEY` means "no key" rather than "send an empty one".
    pub fn new(value: impl Into<String>) -> Option<Self> {
        let value = value.into();
        let trimmed = value.trim();
        (!trimmed.is_empty()).then(|| Self(trimmed.to_owned()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

/// How often, and how patiently, a 429 or a 5xx is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; `0` never retries.
    pub max_retries: u32,
    /// The wait before the first retry; each further retry waits twice as long as the one before.
    pub initial_backoff: Duration,
    /// The longest wait the doubling reaches.
    pub max_backoff: Duration,
    /// The longest wait a `Retry-After` header can ask for. A provider may ask for minutes; a person watching a
    /// run should rather see the error.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based): what the provider asked for when it said, capped, and
    /// otherwise the exponential backoff.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(asked) => asked.min(self.max_retry_after),
            None => self
                .initial_backoff
                .saturating_mul(2u32.saturating_pow(retry))
                .min(self.max_backoff),
        }
    }
}

/// Where the API is, which model to ask, and how to talk to it.
#[derive(Clone, Debug)]
pub struct OpenAiConfig {
    /// The API's base URL, up to and including `/v1`: `https://api.openai.com/v1`, or
    /// `http://localhost:11434/v1` for Ollama.
    pub base_url: String,
    /// The model's name as the provider knows it (`gpt-4o-mini`, `llama3.1`, ...).
    pub model: String,
    /// Sent as a bearer token when present.
    pub api_key: Option<ApiKey>,
    /// How long we wait for the provider: for the response to begin, then for each next piece of the stream.
    pub timeout: Duration,
    /// How long one whole step may take, from its first request to its last chunk, retries and their waits
    /// included: a provider that keeps the stream alive (keep-alive comments, a trickle of text) without ever
    /// finishing would otherwise hold the run for good.
    pub step_timeout: Duration,
    pub retry: RetryPolicy,
}

impl OpenAiConfig {
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";
    /// Generous, because a local server may load the model into memory before its first token.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    /// Ten minutes, as OpenAI's own client allows a request.
    pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(600);

    /// The defaults for a model: OpenAI's API, no key, the default timeout and retries.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: Self::DEFAULT_BASE_URL.to_owned(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            step_timeout: Self::DEFAULT_STEP_TIMEOUT,
            retry: RetryPolicy::default(),
        }
    }
}

/// Why the client cannot be built. None of these messages contains the key.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiSetupError {
    #[error("the OpenAI base URL {url:?} is not usable: {reason}")]
    BaseUrl { url: String, reason: String },
    #[error("the OpenAI model name is empty")]
    EmptyModel,
    #[error("the OpenAI API key contains characters that cannot be sent in an HTTP header")]
    ApiKey,
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Removes the key from text that leaves this module: providers quote what they were sent, in error bodies and
/// in stream errors.
struct Redactor {
    key: Option<String>,
}

impl Redactor {
    fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.key {
            Some(key) if text.contains(key.as_str()) => {
                Cow::Owned(text.replace(key.as_str(), REDACTED))
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// The same error with the key scrubbed from its text, whichever part of the client wrote it.
    fn error(&self, error: ModelError) -> ModelError {
        let scrub = |text: String| self.scrub(&text).into_owned();
        match error {
            ModelError::Unauthorized(message) => ModelError::Unauthorized(scrub(message)),
            ModelError::NotFound(message) => ModelError::NotFound(scrub(message)),
            ModelError::RateLimited { attempts, message } => ModelError::RateLimited {
                attempts,
                message: scrub(message),
            },
            ModelError::Server {
                status,
                attempts,
                message,
            } => ModelError::Server {
                status,
                attempts,
                message: scrub(message),
            },
            ModelError::Http { status, message } => ModelError::Http {
                status,
                message: scrub(message),
            },
            ModelError::Connection(message) => ModelError::Connection(scrub(message)),
            ModelError::Malformed(message) => ModelError::Malformed(scrub(message)),
            ModelError::Provider(message) => ModelError::Provider(scrub(message)),
            ModelError::CutOff { reason, calls } => ModelError::CutOff {
                reason: scrub(reason),
                calls,
            },
            error @ (ModelError::Timeout(_)
            | ModelError::StepTimeout(_)
            | ModelError::TooLarge { .. }
            | ModelError::TooManyCalls { .. }) => error,
        }
    }
}

/// A model behind an OpenAI-compatible chat-completions API. No `Debug`: it holds the key.
pub struct OpenAiModel {
    client: reqwest::Client,
    endpoint: Url,
    /// The endpoint without user info or query, for logs.
    endpoint_for_logs: String,
    model: String,
    /// `Bearer {key}`, marked sensitive so that HTTP/2 never indexes it and `Debug` never shows it.
    authorization: Option<HeaderValue>,
    redactor: Redactor,
    timeout: Duration,
    step_timeout: Duration,
    retry: RetryPolicy,
}

impl OpenAiModel {
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiSetupError> {
        let model = config.model.trim().to_owned();
        if model.is_empty() {
            return Err(OpenAiSetupError::EmptyModel);
        }
        let endpoint = chat_completions_url(&config.base_url)?;
        let mut endpoint_for_logs = endpoint.clone();
        // Both only fail for URLs that cannot have user info, which an http(s) URL can.
        let _ = endpoint_for_logs.set_username("");
        let _ = endpoint_for_logs.set_password(None);
        endpoint_for_logs.set_query(None);

        let authorization = match &config.api_key {
            Some(ApiKey(key)) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| OpenAiSetupError::ApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };

        install_crypto_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(config.timeout)
            .build()
            .map_err(|error| OpenAiSetupError::Client(describe(&error)))?;

        Ok(Self {
            client,
            endpoint,
            endpoint_for_logs: endpoint_for_logs.to_string(),
            model,
            authorization,
            redactor: Redactor {
                key: config.api_key.map(|ApiKey(key)| key),
            },
            timeout: config.timeout,
            step_timeout: config.step_timeout,
            retry: config.retry,
        })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint_for_logs
    }

    /// Sends the request until it gets a response to stream, retrying 429s and 5xx as the policy allows.
    async fn send(&self, body: &[u8]) -> Result<Response, ModelError> {
        let mut attempt = 1;
        loop {
            tracing::debug!(endpoint = %self.endpoint_for_logs, model = %self.model, attempt, "requesting a chat completion");
            let response = self.post(body).await?;
            let status = response.status();
            if status.is_success() {
                return self.expect_event_stream(response).await;
            }
            let retry_after = retry_after(response.headers());
            let message = self.error_text(response, status).await;
            let retryable = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
            if !retryable || attempt > self.retry.max_retries {
                return Err(failure(status, attempt, message));
            }
            let delay = self.retry.delay(attempt - 1, retry_after);
            tracing::warn!(
                status = status.as_u16(),
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                %message,
                "the model provider failed; retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    async fn post(&self, body: &[u8]) -> Result<Response, ModelError> {
        let mut request = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body.to_vec());
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        match tokio::time::timeout(self.timeout, request.send()).await {
            Err(_) => Err(ModelError::Timeout(self.timeout)),
            Ok(Err(error)) => Err(ModelError::Connection(describe(&error))),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// A 200 that is not an event stream is a server that ignored `stream: true` or a proxy's error page; either
    /// way we cannot read it as a step.
    async fn expect_event_stream(&self, response: Response) -> Result<Response, ModelError> {
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.is_empty() || content_type.contains("text/event-stream") {
            return Ok(response);
        }
        let body = self.read_error_body(response).await;
        Err(ModelError::Malformed(format!(
            "expected an event stream but got {content_type}: {}",
            protocol::error_message(&body)
        )))
    }

    /// The provider's explanation of a failed response, or the status's name when it gave none.
    async fn error_text(&self, response: Response, status: StatusCode) -> String {
        let body = self.read_error_body(response).await;
        let message = protocol::error_message(&body);
        if message.is_empty() {
            status
                .canonical_reason()
                .unwrap_or("no explanation")
                .to_owned()
        } else {
            message
        }
    }

    /// At most [`MAX_ERROR_BODY_BYTES`] of a body, within the timeout, already scrubbed of the key (before any
    /// shortening could cut the key in two).
    async fn read_error_body(&self, mut response: Response) -> String {
        let read = async {
            let mut body = Vec::new();
            while let Ok(Some(piece)) = response.chunk().await {
                body.extend_from_slice(&piece);
                if body.len() >= MAX_ERROR_BODY_BYTES {
                    break;
                }
            }
            body
        };
        let body = tokio::time::timeout(self.timeout, read)
            .await
            .unwrap_or_default();
        self.redactor
            .scrub(&String::from_utf8_lossy(&body))
            .into_owned()
    }
}

impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.model
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let chat = ChatRequest::new(&self.model, request.messages, request.tools);
        // Strings, numbers and JSON values with string keys: serializing cannot fail.
        let body = serde_json::to_vec(&chat).expect("a chat request is plain JSON");
        tracing::debug!(
            run_id = %request.run_id,
            messages = request.messages.len(),
            tools = request.tools.len(),
            bytes = body.len(),
            "sending a conversation to the model"
        );
        let step = StepStream {
            model: self,
            deadline: tokio::time::Instant::now() + self.step_timeout,
            body,
            state: State::Connecting,
            ready: VecDeque::new(),
        };
        futures::stream::unfold(step, |mut step| async move {
            step.next().await.map(|item| (item, step))
        })
        .boxed()
    }
}

/// One step being streamed.
struct StepStream<'a> {
    model: &'a OpenAiModel,
    /// When the step must have ended ([`OpenAiConfig::step_timeout`]).
    deadline: tokio::time::Instant,
    body: Vec<u8>,
    state: State,
    /// Chunks read but not yet handed to the loop.
    ready: VecDeque<ModelChunk>,
}

enum State {
    Connecting,
    Reading(Box<Reading>),
    Ended,
}

/// The response being read, as events.
struct Reading {
    events: BoxStream<'static, Result<sse::SseEvent, SseError<reqwest::Error>>>,
    step: StepAssembler,
}

enum Progress {
    More,
    Done,
}

/// How long a step waits, once its model said why it stopped, for what may still follow (its token counts, `[DONE]`)
/// before it is taken as whole: the person has seen the whole answer by then.
const AFTER_FINISH: Duration = Duration::from_secs(2);

impl StepStream<'_> {
    /// The next chunk, by the step's deadline; after an error or the end of the step, `None`.
    async fn next(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        match tokio::time::timeout_at(self.deadline, self.read()).await {
            Ok(item) => item,
            // Nothing more is read after this: the state is `Ended` from here on.
            Err(_) => match std::mem::replace(&mut self.state, State::Ended) {
                // The model said why it stopped, and only what may follow it was awaited: the step is whole.
                State::Reading(mut reading) if reading.step.has_finished() => {
                    match std::mem::take(&mut reading.step).finish() {
                        Ok(chunks) => {
                            self.ready.extend(chunks);
                            self.ready.pop_front().map(Ok)
                        }
                        Err(error) => Some(Err(self.model.redactor.error(error))),
                    }
                }
                _ => {
                    tracing::debug!(endpoint = %self.model.endpoint_for_logs, "the model step ran out of time");
                    self.ready.clear();
                    Some(Err(ModelError::StepTimeout(self.model.step_timeout)))
                }
            },
        }
    }

    /// Reads until a chunk is ready. The response stays in the state while it is read, so that a deadline that
    /// stops the read can still see how far the step came.
    async fn read(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        loop {
            if let Some(chunk) = self.ready.pop_front() {
                return Some(Ok(chunk));
            }
            let result = match &mut self.state {
                State::Ended => return None,
                State::Connecting => self.model.send(&self.body).await.map(|response| {
                    self.state = State::Reading(Box::new(Reading {
                        events: sse::events(response.bytes_stream(), self.model.timeout),
                        step: StepAssembler::new(),
                    }));
                }),
                State::Reading(reading) => reading
                    .advance(&mut self.ready, &self.model.redactor)
                    .await
                    .map(|progress| {
                        if let Progress::Done = progress {
                            self.state = State::Ended;
                        }
                    }),
            };
            if let Err(error) = result {
                self.state = State::Ended;
                tracing::debug!(endpoint = %self.model.endpoint_for_logs, "the model step failed");
                return Some(Err(self.model.redactor.error(error)));
            }
        }
    }
}

impl Reading {
    /// Reads the next event of the body and queues what it completes.
    async fn advance(
        &mut self,
        ready: &mut VecDeque<ModelChunk>,
        redactor: &Redactor,
    ) -> Result<Progress, ModelError> {
        // Once the model said why it stopped, only its token counts and `[DONE]` may follow, and not for long.
        let finished = self.step.has_finished();
        let next = if finished {
            tokio::time::timeout(AFTER_FINISH, self.events.next())
                .await
                .unwrap_or(None)
        } else {
            self.events.next().await
        };
        let event = match next {
            // Some servers close without `[DONE]`, and a connection may break off or go quiet after the last chunk:
            // the step is whole all the same (without its token counts, if they had not come).
            None | Some(Err(SseError::Timeout(_) | SseError::Transport(_))) if finished => {
                ready.extend(std::mem::take(&mut self.step).finish()?);
                return Ok(Progress::Done);
            }
            // A server whose reasons do not end its steps (one with every chunk) ended this one when its stream did.
            None if self.step.said_why() => {
                ready.extend(std::mem::take(&mut self.step).finish()?);
                return Ok(Progress::Done);
            }
            None => {
                return Err(ModelError::Connection(
                    "the stream ended before the model finished its step".to_owned(),
                ));
            }
            Some(Err(SseError::Timeout(after))) => return Err(ModelError::Timeout(after)),
            Some(Err(SseError::Transport(error))) => {
                return Err(ModelError::Connection(format!(
                    "the stream broke off: {}",
                    describe(&error)
                )));
            }
            Some(Err(error)) => return Err(ModelError::Malformed(error.to_string())),
            Some(Ok(event)) => event,
        };
        // Read as sent: what the model wrote is its own (a tool's arguments, its answer), and a key such as Ollama's
        // `ollama` may well be in it. What an error quotes of it is scrubbed before it is cut short, as a key cut in
        // two would no longer be found whole (`Redactor::error` scrubs it again on its way out).
        let data = event.data.as_str();
        if data.trim() == "[DONE]" {
            ready.extend(std::mem::take(&mut self.step).finish()?);
            return Ok(Progress::Done);
        }
        if event.event.as_deref() == Some("error") {
            return Err(ModelError::Provider(protocol::error_message(
                &redactor.scrub(data),
            )));
        }
        let chunk: ChatChunk = serde_json::from_str(data).map_err(|error| {
            ModelError::Malformed(format!(
                "a chunk is not a chat-completion chunk ({error}): {}",
                protocol::shorten(&redactor.scrub(data))
            ))
        })?;
        if chunk.reports_error() {
            return Err(ModelError::Provider(protocol::error_message(
                &redactor.scrub(data),
            )));
        }
        if let Some(text) = self.step.apply(chunk)? {
            ready.push_back(ModelChunk::Text(text));
        }
        Ok(Progress::More)
    }
}

/// `{base}/chat/completions`, keeping any query the base URL has (some gateways put the API version there).
fn chat_completions_url(base_url: &str) -> Result<Url, OpenAiSetupError> {
    let refuse = |reason: &str| OpenAiSetupError::BaseUrl {
        url: base_url.to_owned(),
        reason: reason.to_owned(),
    };
    let mut url = Url::parse(base_url.trim()).map_err(|error| refuse(&error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse("it must start with http:// or https://"));
    }
    url.path_segments_mut()
        .map_err(|()| refuse("it cannot have a path"))?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

/// The error for a failed response that is not retried (any more).
fn failure(status: StatusCode, attempts: u32, message: String) -> ModelError {
    match status {
        StatusCode::UNAUTHORIZED => ModelError::Unauthorized(message),
        StatusCode::NOT_FOUND => ModelError::NotFound(message),
        StatusCode::TOO_MANY_REQUESTS => ModelError::RateLimited { attempts, message },
        status if status.is_server_error() => ModelError::Server {
            status: status.as_u16(),
            attempts,
            message,
        },
        status => ModelError::Http {
            status: status.as_u16(),
            message,
        },
    }
}

/// The wait a failed response asks for: OpenAI's `retry-after-ms`, or the standard `Retry-After` in seconds. The
/// HTTP-date form of `Retry-After` is not read; the backoff applies then.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    number("retry-after-ms")
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
        .or_else(|| number("retry-after").and_then(|secs| Duration::try_from_secs_f64(secs).ok()))
}

/// A transport error with its causes, which say what actually went wrong (refused, reset, DNS, TLS), and the URL
/// it names without its query or user info (a gateway's key may be in either; the text goes to the run's log).
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        text = text.replace(url.as_str(), shown.as_str());
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// reqwest is built without a TLS crypto provider so that none is compiled in that needs cmake (aws-lc); ring is
/// ours, installed as the process default once. If something else installed a provider first, that one serves.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_never_shows_in_debug() {
        let mut config = OpenAiConfig::new("gpt-test");
        config.api_key = ApiKey::new(" sk-secret-123 \n");
        let shown = format!("{config:?}");
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        assert!(shown.contains("ApiKey([redacted])"));
        assert!(ApiKey::new("  ").is_none());
    }

    #[test]
    fn the_redactor_scrubs_every_error() {
        let redactor = Redactor {
            key: Some("sk-secret-123".into()),
        };
        let error = redactor.error(ModelError::Unauthorized(
            "Incorrect API key provided: sk-secret-123.".into(),
        ));
        assert_eq!(
            error,
            ModelError::Unauthorized("Incorrect API key provided: [redacted].".into())
        );
        let error = redactor.error(ModelError::Server {
            status: 500,
            attempts: 2,
            message: "sk-secret-123 sk-secret-123".into(),
        });
        assert!(!error.to_string().contains("sk-secret-123"));
    }

    #[test]
    fn builds_the_endpoint_from_the_base_url() {
        let url = |base: &str| chat_completions_url(base).map(|url| url.to_string());
        assert_eq!(
            url("https://api.openai.com/v1").unwrap(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            url("http://localhost:11434/v1/").unwrap(),
            "http://localhost:11434/v1/chat/completions"
        );
        assert_eq!(
            url("https://gateway.example/openai/v1?api-version=2").unwrap(),
            "https://gateway.example/openai/v1/chat/completions?api-version=2"
        );
        assert!(matches!(
            url("localhost:11434/v1"),
            Err(OpenAiSetupError::BaseUrl { .. })
        ));
        assert!(matches!(
            url("ftp://example.com/v1"),
            Err(OpenAiSetupError::BaseUrl { .. })
        ));
    }

    #[test]
    fn refuses_an_empty_model_and_an_unsendable_key() {
        assert!(matches!(
            OpenAiModel::new(OpenAiConfig::new(" ")),
            Err(OpenAiSetupError::EmptyModel)
        ));
        let mut config = OpenAiConfig::new("gpt-test");
        config.api_key = ApiKey::new("sk-bad\u{7}key");
        let error = OpenAiModel::new(config).err().expect("the key is refused");
        assert!(matches!(error, OpenAiSetupError::ApiKey));
        assert!(!error.to_string().contains("sk-bad"));
    }

    #[test]
    fn backs_off_exponentially_and_caps_what_the_provider_asks_for() {
        let policy = RetryPolicy {
            max_retries: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(2),
        };
        let waits: Vec<u128> = (0..5).map(|n| policy.delay(n, None).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 500, 500]);
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(
            policy.delay(3, Some(Duration::from_secs(3600))),
            Duration::from_secs(2)
        );
        assert_eq!(policy.delay(u32::MAX, None), Duration::from_millis(500));
    }

    #[test]
    fn reads_retry_after_in_seconds_or_openais_milliseconds() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&headers(&[
                ("retry-after", "2"),
                ("retry-after-ms", "1500")
            ])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            None
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        assert_eq!(retry_after(&headers(&[])), None);
    }

    #[test]
    fn classifies_failed_responses() {
        let message = || "why".to_owned();
        assert_eq!(
            failure(StatusCode::UNAUTHORIZED, 1, message()),
            ModelError::Unauthorized(message())
        );
        assert_eq!(
            failure(StatusCode::NOT_FOUND, 1, message()),
            ModelError::NotFound(message())
        );
        assert_eq!(
            failure(StatusCode::TOO_MANY_REQUESTS, 4, message()),
            ModelError::RateLimited {
                attempts: 4,
                message: message()
            }
        );
        assert_eq!(
            failure(StatusCode::BAD_GATEWAY, 3, message()),
            ModelError::Server {
                status: 502,
                attempts: 3,
                message: message()
            }
        );
        assert_eq!(
            failure(StatusCode::BAD_REQUEST, 1, message()),
            ModelError::Http {
                status: 400,
                message: message()
            }
        );
    }
}
