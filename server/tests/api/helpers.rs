//! Starting the real server on port 0 and talking to it over HTTP, with a real SSE parser.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use agent::harness::Harness;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::Value;
use server::config::Config;
use server::startup::build;
use tokio::sync::oneshot;

/// Any single wait in a test; a test that would hang fails instead.
pub const PATIENCE: Duration = Duration::from_secs(15);

pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub workspace: tempfile::TempDir,
    /// The server's harness, to see what it holds.
    pub harness: Harness,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Config)) -> TestApp {
    // The workspace builds reqwest with rustls but no compiled-in crypto provider; the test client needs one.
    agent::model::install_crypto_provider();
    let workspace = tempfile::tempdir().expect("a temporary workspace");
    let mut config = Config::for_tests(workspace.path());
    config.log = "warn".into();
    configure(&mut config);
    let application = build(config).await.expect("the server builds");
    let addr = application.local_addr();
    let harness = application.harness().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(application.serve(async move {
        let _ = stopped.await;
    }));
    TestApp {
        addr,
        client: reqwest::Client::new(),
        workspace,
        harness,
        stop: Some(stop),
        served: Some(served),
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn file(&self, name: &str) -> std::path::PathBuf {
        self.workspace.path().join(name)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("the request is sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("the request is sent")
    }

    pub async fn decide(&self, run_id: &str, tool_call_id: &str, body: Value) -> reqwest::Response {
        self.post_json(
            &format!("/api/agent/approvals/{run_id}/{tool_call_id}"),
            &body,
        )
        .await
    }

    /// `GET /api/audit?{query}`: the audit log's entries that match, oldest first.
    pub async fn audit(&self, query: &str) -> Vec<Value> {
        let body: Value = self
            .get(&format!("/api/audit?{query}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["ok"], true, "{body}");
        body["entries"]
            .as_array()
            .expect("the log's entries")
            .clone()
    }

    /// Approves the call an `approvalRequired` event shows, and expects `200`.
    pub async fn approve(&self, run_id: &str, required: &SseEvent) {
        let call_id = required.data["request"]["toolCallId"]
            .as_str()
            .expect("the card names its call");
        let decided = self
            .decide(run_id, call_id, serde_json::json!({"decision": "approve"}))
            .await;
        assert_eq!(decided.status(), 200);
    }

    /// `POST /api/agent/stream`.
    pub async fn stream(&self, body: Value) -> SseStream {
        let response = self.post_json("/api/agent/stream", &body).await;
        SseStream::new(response)
    }

    /// `POST /api/agent/runs`, returning the run id.
    pub async fn create_run(&self, body: Value) -> String {
        let response = self.post_json("/api/agent/runs", &body).await;
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["runId"].as_str().unwrap().to_owned()
    }

    /// `GET /api/agent/runs/{runId}/events`, optionally resuming after `last_event_id`.
    pub async fn events(&self, run_id: &str, last_event_id: Option<u64>) -> SseStream {
        let mut request = self
            .client
            .get(self.url(&format!("/api/agent/runs/{run_id}/events")));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        SseStream::new(request.send().await.expect("the request is sent"))
    }

    /// Stops the server as SIGTERM would, and waits for it to finish.
    pub async fn shut_down(mut self) -> Duration {
        let started = std::time::Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            tokio::time::timeout(Duration::from_secs(10), served)
                .await
                .expect("the server stops in time")
                .unwrap()
                .unwrap();
        }
        started.elapsed()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(served) = self.served.take() {
            served.abort();
        }
    }
}

/// One SSE event: its `event:` name, its `id:` and its JSON data.
#[derive(Clone, Debug)]
pub struct SseEvent {
    pub name: String,
    pub id: u64,
    pub data: Value,
}

pub struct SseStream {
    pub status: reqwest::StatusCode,
    pub content_type: String,
    pub cache_control: String,
    events: Pin<Box<dyn Stream<Item = SseEvent> + Send>>,
}

impl SseStream {
    pub fn new(response: reqwest::Response) -> Self {
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let cache_control = response
            .headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let events = response
            .bytes_stream()
            .eventsource()
            .map(|event| {
                let event = event.expect("a well-formed SSE event");
                let data: Value = serde_json::from_str(&event.data).expect("SSE data is JSON");
                assert_eq!(
                    data["type"],
                    event.event.as_str(),
                    "the SSE event name is the JSON type"
                );
                SseEvent {
                    name: event.event,
                    id: event.id.parse().expect("the SSE id is a number"),
                    data,
                }
            })
            .boxed();
        Self {
            status,
            content_type,
            cache_control,
            events,
        }
    }

    /// The next event, or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(PATIENCE, self.events.next())
            .await
            .expect("an event arrives in time")
    }

    /// Reads until an event named `name`, returning it.
    pub async fn until(&mut self, name: &str) -> SseEvent {
        while let Some(event) = self.next().await {
            if event.name == name {
                return event;
            }
        }
        panic!("the stream ended before a {name} event");
    }

    /// Every remaining event until the stream ends.
    pub async fn rest(&mut self) -> Vec<SseEvent> {
        let mut all = Vec::new();
        while let Some(event) = self.next().await {
            all.push(event);
        }
        all
    }
}

/// The names of events, without the debug ones.
pub fn names(events: &[SseEvent]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.name.as_str())
        .filter(|name| *name != "debug")
        .collect()
}

/// Waits until `check` holds, reading again every few milliseconds: for what another process does in its own time,
/// where the test has nothing to await.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not happen in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
