//! Talking to the server: HTTP/1.1 with keep-alive, and a real SSE parser for the event streams.

use std::borrow::Cow;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

/// Why one trip (or one stream) did not go as it must.
#[derive(Debug, thiserror::Error)]
pub enum TripError {
    #[error("{what}: the request failed: {source}")]
    Http {
        what: &'static str,
        source: reqwest::Error,
    },
    #[error("{what}: expected HTTP {expected}, got {status}: {body}")]
    Status {
        what: &'static str,
        expected: u16,
        status: u16,
        body: String,
    },
    /// The server refused the request with a 4xx JSON body carrying a machine-readable `code` (AG-UI does).
    #[error("{what}: refused with HTTP {status} {code}: {message}")]
    Refused {
        what: &'static str,
        status: u16,
        code: String,
        message: String,
    },
    #[error("the event stream is malformed: {0}")]
    Sse(String),
    #[error("waited {} s for {waiting_for} in vain", patience.as_secs_f64())]
    Timeout {
        waiting_for: String,
        patience: Duration,
    },
    #[error("the event stream ended before the {waiting_for} event")]
    Ended { waiting_for: String },
    #[error("the run ended with an error event: {0}")]
    RunFailed(String),
    #[error("not verified: {0}")]
    Unverified(String),
}

impl TripError {
    /// A short name for the kind of failure, to count failures by kind. A refusal's kind carries its code.
    pub fn kind(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Self::Http { .. } => "http",
            Self::Status { .. } => "status",
            Self::Refused { code, .. } => return Cow::Owned(format!("refused {code}")),
            Self::Sse(_) => "sse",
            Self::Timeout { .. } => "timeout",
            Self::Ended { .. } => "ended",
            Self::RunFailed(_) => "run failed",
            Self::Unverified(_) => "unverified",
        })
    }
}

/// A client for one server. Cloning shares the connection pool.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    /// Where decisions are posted: `base`, or another instance on the same database.
    decisions: String,
}

impl Api {
    /// HTTP/1.1 with keep-alive: each idle connection goes back to the pool and is reused; each open event stream
    /// holds one connection of its own.
    pub fn new(base: String) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(300))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|error| anyhow::anyhow!("cannot build the HTTP client: {error}"))?;
        Ok(Self {
            client,
            decisions: base.clone(),
            base,
        })
    }

    /// The same client, posting its decisions to another instance (one sharing the database), so that the
    /// decision reaches the run's instance through the database.
    pub fn with_decisions_at(mut self, base: String) -> Self {
        self.decisions = base;
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /api/agent/stream`: an interactive run, streamed.
    pub async fn start_stream(
        &self,
        message: &str,
        session_id: &str,
        patience: Duration,
    ) -> Result<SseStream, TripError> {
        let what = "POST /api/agent/stream";
        let response = self
            .client
            .post(self.url("/api/agent/stream"))
            .json(&json!({ "message": message, "sessionId": session_id }))
            .send()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        SseStream::new(what, response, patience).await
    }

    /// `POST /api/agent/runs`: a run started without a stream; returns its id. The run goes on without anyone
    /// listening, and one that asks for approval waits in the server's store.
    pub async fn create_run(&self, message: &str, session_id: &str) -> Result<String, TripError> {
        let what = "POST /api/agent/runs";
        let response = self
            .client
            .post(self.url("/api/agent/runs"))
            .json(&json!({ "message": message, "sessionId": session_id }))
            .send()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        if status != StatusCode::CREATED {
            return Err(TripError::Status {
                what,
                expected: 201,
                status: status.as_u16(),
                body,
            });
        }
        let value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        value["runId"].as_str().map(str::to_owned).ok_or_else(|| {
            TripError::Unverified(format!("{what} answered 201 without a runId: {body}"))
        })
    }

    /// `GET /api/agent/runs/{runId}/events`: a run's events from the first, then live.
    pub async fn run_events(
        &self,
        run_id: &str,
        patience: Duration,
    ) -> Result<SseStream, TripError> {
        let what = "GET /api/agent/runs/{runId}/events";
        let response = self
            .client
            .get(self.url(&format!("/api/agent/runs/{run_id}/events")))
            .send()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        SseStream::new(what, response, patience).await
    }

    /// `POST /api/agui` with `Accept: text/event-stream`: one AG-UI run (`body` is its `RunAgentInput`), streamed.
    /// Returns when the response's head arrived; a refusal is [`TripError::Refused`] with the server's code.
    pub async fn agui(&self, body: &Value, patience: Duration) -> Result<SseStream, TripError> {
        let what = "POST /api/agui";
        let send = self
            .client
            .post(self.url("/api/agui"))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(body)
            .send();
        let response = tokio::time::timeout(patience, send)
            .await
            .map_err(|_| TripError::Timeout {
                waiting_for: format!("the response to {what}"),
                patience,
            })?
            .map_err(|source| TripError::Http { what, source })?;
        SseStream::new(what, response, patience).await
    }

    /// `POST /api/agent/approvals/{runId}/{toolCallId}`: returns the status and the JSON body (`Null` when the
    /// body is not JSON).
    pub async fn decide(
        &self,
        run_id: &str,
        tool_call_id: &str,
        decision: &str,
    ) -> Result<(StatusCode, Value), TripError> {
        let what = "POST /api/agent/approvals/{runId}/{toolCallId}";
        let response = self
            .client
            .post(format!(
                "{}/api/agent/approvals/{run_id}/{tool_call_id}",
                self.decisions
            ))
            .json(&json!({ "decision": decision }))
            .send()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// `POST /api/agent/approvals/...` with `approve`, which must answer 200 with an `approved` resolution.
    pub async fn approve(&self, run_id: &str, tool_call_id: &str) -> Result<(), TripError> {
        let (status, body) = self.decide(run_id, tool_call_id, "approve").await?;
        if status != StatusCode::OK {
            return Err(TripError::Status {
                what: "the decision",
                expected: 200,
                status: status.as_u16(),
                body: body.to_string(),
            });
        }
        let resolution = body["resolution"]["type"].as_str().unwrap_or("");
        if body["ok"] != true || resolution != "approved" {
            return Err(TripError::Unverified(format!(
                "the decision answered 200 without an approved resolution: {body}"
            )));
        }
        Ok(())
    }

    /// `GET /api/agent/approvals`: the pending approvals as (runId, toolCallId).
    pub async fn pending(&self) -> Result<Vec<(String, String)>, TripError> {
        let what = "GET /api/agent/approvals";
        let response = self
            .client
            .get(self.url("/api/agent/approvals"))
            .send()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        let status = response.status();
        let body: Value = response
            .json()
            .await
            .map_err(|source| TripError::Http { what, source })?;
        let ids = |request: &Value| {
            Some((
                request["runId"].as_str()?.to_owned(),
                request["toolCallId"].as_str()?.to_owned(),
            ))
        };
        match body["pending"].as_array() {
            Some(pending) if status == StatusCode::OK => pending
                .iter()
                .map(|request| {
                    ids(request).ok_or_else(|| {
                        TripError::Unverified(format!("a pending approval without ids: {request}"))
                    })
                })
                .collect(),
            _ => Err(TripError::Status {
                what,
                expected: 200,
                status: status.as_u16(),
                body: body.to_string(),
            }),
        }
    }
}

/// One SSE event: its `event:` name and its data, parsed as JSON only when asked (most events are only counted,
/// and the load generator shares the machine with the server).
#[derive(Clone, Debug)]
pub struct SseEvent {
    pub name: String,
    pub data: String,
}

impl SseEvent {
    /// The data as JSON, whose `type` must be the event's name.
    pub fn json(&self) -> Result<Value, TripError> {
        let value: Value = serde_json::from_str(&self.data).map_err(|error| {
            TripError::Sse(format!(
                "the data of a {:?} event is not JSON ({error}): {:?}",
                self.name, self.data
            ))
        })?;
        if value["type"] != self.name.as_str() {
            return Err(TripError::Sse(format!(
                "an event named {:?} carries type {}",
                self.name, value["type"]
            )));
        }
        Ok(value)
    }
}

/// A response other than 200: [`TripError::Refused`] when it is a 4xx whose JSON body has a `code`, else
/// [`TripError::Status`].
fn refusal(what: &'static str, status: StatusCode, body: String) -> TripError {
    if status.is_client_error()
        && let Ok(value) = serde_json::from_str::<Value>(&body)
        && let Some(code) = value["code"].as_str()
    {
        return TripError::Refused {
            what,
            status: status.as_u16(),
            code: code.to_owned(),
            message: value["error"].as_str().unwrap_or_default().to_owned(),
        };
    }
    TripError::Status {
        what,
        expected: 200,
        status: status.as_u16(),
        body,
    }
}

/// One AG-UI event: an unnamed SSE event whose data is a JSON object; `kind` is its `type`. The rest is parsed
/// only when asked.
#[derive(Clone, Debug)]
pub struct AguiEvent {
    pub kind: String,
    pub data: String,
}

impl AguiEvent {
    fn parse(event: SseEvent) -> Result<Self, TripError> {
        #[derive(Deserialize)]
        struct Head {
            #[serde(rename = "type")]
            kind: String,
        }
        if event.name != "message" {
            return Err(TripError::Sse(format!(
                "AG-UI events are unnamed, got one named {:?}: {:?}",
                event.name, event.data
            )));
        }
        let head: Head = serde_json::from_str(&event.data).map_err(|error| {
            TripError::Sse(format!(
                "an AG-UI event is not a JSON object with a type ({error}): {:?}",
                event.data
            ))
        })?;
        Ok(Self {
            kind: head.kind,
            data: event.data,
        })
    }

    pub fn json(&self) -> Result<Value, TripError> {
        serde_json::from_str(&self.data).map_err(|error| {
            TripError::Sse(format!(
                "the data of a {} event is not JSON ({error}): {:?}",
                self.kind, self.data
            ))
        })
    }
}

type EventResult = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>;

/// The events of one response, parsed as they arrive. Every wait is bounded by `patience`.
pub struct SseStream {
    events: Pin<Box<dyn Stream<Item = EventResult> + Send>>,
    patience: Duration,
}

impl SseStream {
    async fn new(
        what: &'static str,
        response: reqwest::Response,
        patience: Duration,
    ) -> Result<Self, TripError> {
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.text().await.unwrap_or_default();
            return Err(refusal(what, status, body));
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("text/event-stream") {
            return Err(TripError::Sse(format!(
                "{what} answered with content type {content_type:?}, not text/event-stream"
            )));
        }
        Ok(Self {
            events: response.bytes_stream().eventsource().boxed(),
            patience,
        })
    }

    pub fn set_patience(&mut self, patience: Duration) {
        self.patience = patience;
    }

    /// The next event, or `None` when the server ended the stream.
    pub async fn next(&mut self, waiting_for: &str) -> Result<Option<SseEvent>, TripError> {
        let next = tokio::time::timeout(self.patience, self.events.next())
            .await
            .map_err(|_| TripError::Timeout {
                waiting_for: waiting_for.to_owned(),
                patience: self.patience,
            })?;
        let Some(event) = next else {
            return Ok(None);
        };
        let event = event.map_err(|error| TripError::Sse(error.to_string()))?;
        Ok(Some(SseEvent {
            name: event.event,
            data: event.data,
        }))
    }

    /// The next AG-UI event, or `None` when the server ended the stream.
    pub async fn next_agui(&mut self, waiting_for: &str) -> Result<Option<AguiEvent>, TripError> {
        match self.next(waiting_for).await? {
            Some(event) => AguiEvent::parse(event).map(Some),
            None => Ok(None),
        }
    }

    /// Reads until an event named `name` and returns its JSON. An `error` event or the end of the stream fails.
    pub async fn until(&mut self, name: &str) -> Result<Value, TripError> {
        loop {
            match self.next(name).await? {
                Some(event) if event.name == name => return event.json(),
                Some(event) if event.name == "error" => {
                    return Err(TripError::RunFailed(event.data));
                }
                Some(_) => {}
                None => {
                    return Err(TripError::Ended {
                        waiting_for: name.to_owned(),
                    });
                }
            }
        }
    }

    /// After the terminal event: the server must end the stream (which also frees the connection for reuse).
    pub async fn expect_end(&mut self) -> Result<(), TripError> {
        match self.next("the end of the stream").await? {
            None => Ok(()),
            Some(event) => Err(TripError::Unverified(format!(
                "a {} event came after the terminal event",
                event.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_with_a_code_is_counted_by_its_code() {
        let body = r#"{"ok":false,"code":"RESUME_ALREADY_USED","error":"used once"}"#;
        let error = refusal("POST /api/agui", StatusCode::CONFLICT, body.to_owned());
        assert_eq!(error.kind(), "refused RESUME_ALREADY_USED");
        assert!(
            error
                .to_string()
                .contains("409 RESUME_ALREADY_USED: used once")
        );
        // Without a code, or not a client error, it stays a plain status failure.
        let plain = refusal("x", StatusCode::NOT_FOUND, r#"{"ok":false}"#.to_owned());
        assert_eq!(plain.kind(), "status");
        let server = refusal("x", StatusCode::SERVICE_UNAVAILABLE, body.to_owned());
        assert_eq!(server.kind(), "status");
    }

    #[test]
    fn agui_events_are_unnamed_json_objects_with_a_type() {
        let event = |name: &str, data: &str| SseEvent {
            name: name.to_owned(),
            data: data.to_owned(),
        };
        let parsed =
            AguiEvent::parse(event("message", r#"{"type":"RUN_STARTED","runId":"r"}"#)).unwrap();
        assert_eq!(parsed.kind, "RUN_STARTED");
        assert_eq!(parsed.json().unwrap()["runId"], "r");
        assert!(AguiEvent::parse(event("done", r#"{"type":"done"}"#)).is_err());
        assert!(AguiEvent::parse(event("message", r#"{"runId":"r"}"#)).is_err());
        assert!(AguiEvent::parse(event("message", "not json")).is_err());
    }
}
