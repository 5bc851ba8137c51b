//! Bad input gets a clear 4xx and changes nothing: the cases `bodies.rs` does not cover.

use futures::stream;
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

use super::pending;
use crate::helpers::{TestApp, spawn_app, spawn_app_with};
use agent::request_body::{MAX_MESSAGE_BYTES, MAX_MESSAGE_FORM_BYTES};

async fn field_errors(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], false);
    assert_eq!(
        body["error"],
        "Invalid request: fieldErrors and formErrors say what is wrong."
    );
    body
}

async fn raw_post(
    app: &TestApp,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> reqwest::Response {
    let mut request = app.client.post(app.url(path)).body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    request.send().await.unwrap()
}

/// A server function's arguments that do not read are the client's mistake, answered `400` as the API answers a
/// body that does not read, with leptos's text (the page's client reads it back as before). Before, leptos answered
/// them `500`, as for a failure of the server's own.
#[tokio::test]
async fn a_server_function_whose_arguments_do_not_read_is_400() {
    let app = spawn_app().await;
    const FORM: &str = "application/x-www-form-urlencoded";
    let cases: [(&str, &[u8], &str); 3] = [
        ("/api/fn/decide", b"x=1", "Args|"),
        (
            "/api/fn/decide",
            b"run_id=run_1&tool_call_id=call_1&choice=maybe",
            "Args|",
        ),
        ("/api/fn/cancel", b"", "Args|"),
    ];
    for (path, form, encoded) in cases {
        let response = raw_post(&app, path, Some(FORM), form.to_vec()).await;
        assert_eq!(response.status(), 400, "{path} {form:?}");
        assert_eq!(
            response.headers().get("set-cookie"),
            None,
            "a refused call makes the browser no session: {path} {form:?}"
        );
        let text = response.text().await.unwrap();
        assert!(text.starts_with(encoded), "{path}: {text}");
    }
    // A refusal of the server function itself keeps the status it chose.
    let response = raw_post(
        &app,
        "/api/fn/cancel",
        Some(FORM),
        b"run_id=run_00000000000000000000000000000000".to_vec(),
    )
    .await;
    assert_eq!(response.status(), 404);
}

/// The audit log's filters: a filter it does not have, a time it cannot read, or a page of none or of more than a
/// page holds is a 400 that names the field, rather than a page of another size or of nothing.
#[tokio::test]
async fn an_audit_query_it_cannot_answer_as_asked_is_400() {
    let app = spawn_app().await;
    let cases = [
        ("limit=0", "limit", "Expected 1 to 1000 entries a page"),
        ("limit=1001", "limit", "Expected 1 to 1000 entries a page"),
        ("limit=-1", "limit", "Expected a non-negative integer"),
        ("after=x", "after", "Expected a non-negative integer"),
    ];
    for (query, field, message) in cases {
        let response = app.get(&format!("/api/audit?{query}")).await;
        let body = field_errors(response).await;
        assert_eq!(body["fieldErrors"][field], json!([message]), "{query}");
    }
    let response = app.get("/api/audit?outcomes=approved").await;
    let body = field_errors(response).await;
    assert!(
        body["fieldErrors"]["outcomes"][0]
            .as_str()
            .unwrap()
            .starts_with("Unknown query parameter"),
        "{body}"
    );
    let response = app.get("/api/audit?since=yesterday").await;
    assert!(field_errors(response).await["fieldErrors"]["since"].is_array());
    // The bounds themselves are pages.
    for query in ["limit=1", "limit=1000"] {
        let response = app.get(&format!("/api/audit?{query}")).await;
        assert_eq!(response.status(), 200, "{query}");
    }
}

#[tokio::test]
async fn a_last_event_id_that_is_not_an_event_id_is_400() {
    let app = spawn_app().await;
    let run_id = app.create_run(json!({"message": "list files"})).await;
    let run_events = app.url(&format!("/api/agent/runs/{run_id}/events"));
    let bad: [&[u8]; 6] = [
        b"abc",
        b"-1",
        b"1.5",
        b"99999999999999999999999",
        b"",
        b"\xff\xfe",
    ];
    for raw in bad {
        let response = app
            .client
            .get(&run_events)
            .header("last-event-id", HeaderValue::from_bytes(raw).unwrap())
            .send()
            .await
            .unwrap();
        let body = field_errors(response).await;
        assert_eq!(
            body["fieldErrors"]["Last-Event-ID"],
            json!(["Expected a non-negative integer event id"]),
            "{raw:?}"
        );
    }
    let session_events = app.url("/api/agent/sessions/some-session/events");
    let bad: [&[u8]; 5] = [b"42", b"run_1:x", b"../etc:1", b":5", b"run_1:\xff"];
    for raw in bad {
        let response = app
            .client
            .get(&session_events)
            .header("last-event-id", HeaderValue::from_bytes(raw).unwrap())
            .send()
            .await
            .unwrap();
        let body = field_errors(response).await;
        assert_eq!(
            body["fieldErrors"]["Last-Event-ID"],
            json!(["Expected runId:seq, as sent in the stream's ids"]),
            "{raw:?}"
        );
    }
}

#[tokio::test]
async fn a_json_body_that_is_not_an_object_is_400() {
    let app = spawn_app().await;
    for (body, received) in [
        (json!([{"decision": "approve"}]), "array"),
        (json!("approve"), "string"),
        (json!(null), "null"),
        (json!(42), "number"),
    ] {
        let response = app.decide("run-1", "call-1", body.clone()).await;
        let errors = field_errors(response).await;
        assert_eq!(
            errors["formErrors"],
            json!([format!("Expected object, received {received}")])
        );
        assert_eq!(errors["fieldErrors"], json!({}));
        let response = app.post_json("/api/agent/runs", &body).await;
        let errors = field_errors(response).await;
        assert_eq!(
            errors["formErrors"],
            json!([format!("Expected object, received {received}")])
        );
    }
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_400_malformed_json() {
    let app = spawn_app().await;
    let mut body = b"{\"message\": \"list ".to_vec();
    body.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    body.extend_from_slice(b"\"}");
    let response = raw_post(&app, "/api/agent/runs", Some("application/json"), body).await;
    let errors = field_errors(response).await;
    let message = errors["formErrors"][0].as_str().unwrap();
    assert!(message.starts_with("Malformed JSON:"), "{message}");
    assert_eq!(errors["fieldErrors"], json!({}));
}

#[tokio::test]
async fn unknown_and_mistyped_fields_of_a_start_body_are_400() {
    let app = spawn_app().await;
    let response = app
        .post_json(
            "/api/agent/stream",
            &json!({"message": "list files", "mesage": "typo", "sessionId": 7}),
        )
        .await;
    let errors = field_errors(response).await;
    assert_eq!(
        errors["formErrors"],
        json!(["Unrecognized key(s) in object: 'mesage'"])
    );
    assert_eq!(
        errors["fieldErrors"],
        json!({"sessionId": ["Expected string, received number"]})
    );
}

#[tokio::test]
async fn every_body_route_refuses_a_body_over_the_limit_even_when_chunked() {
    let app = spawn_app().await;
    let huge = "x".repeat(100 * 1024);
    for path in [
        "/api/agent",
        "/api/agent/stream",
        "/api/agent/runs",
        "/api/agent/approvals/r/c",
    ] {
        let response = app.post_json(path, &json!({"message": huge})).await;
        assert_eq!(response.status(), 413, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            body["error"],
            "The request body is larger than 65536 bytes."
        );
    }
    // No Content-Length: the limit holds while reading.
    let chunks = (0..100).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1024]));
    let response = app
        .client
        .post(app.url("/api/agent/runs"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
}

#[tokio::test]
async fn a_body_without_a_json_content_type_is_415() {
    let app = spawn_app().await;
    let body = br#"{"decision": "approve"}"#.to_vec();
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let response = raw_post(&app, "/api/agent/approvals/r/c", content_type, body.clone()).await;
        assert_eq!(response.status(), 415, "{content_type:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            body["error"],
            "The request body must be JSON (Content-Type: application/json)."
        );
    }
}

#[tokio::test]
async fn malformed_ids_in_paths_and_queries_are_400() {
    let app = spawn_app().await;
    let long = "c".repeat(129);
    let cases = [
        ("/api/agent/approvals/run-1/a%2Fb", "toolCallId"),
        ("/api/agent/approvals/run-1/%C3%A9", "toolCallId"),
        (&*format!("/api/agent/approvals/run-1/{long}"), "toolCallId"),
        ("/api/agent/approvals/a%20b/call-1", "runId"),
    ];
    for (path, field) in cases {
        let response = app.post_json(path, &json!({"decision": "approve"})).await;
        let errors = field_errors(response).await;
        let message = errors["fieldErrors"][field][0].as_str().unwrap_or_default();
        assert!(message.starts_with("Invalid id:"), "{path}: {errors}");
    }
    let response = app
        .post_json("/api/agent/runs/..%2F..%2Fetc/cancel", &json!({}))
        .await;
    assert_eq!(
        field_errors(response).await["fieldErrors"]["runId"][0],
        "Invalid id: may contain only letters, digits and - _ . : (found '/')"
    );
    let response = app
        .get(&format!("/api/agent/runs/{}/events", "r".repeat(200)))
        .await;
    field_errors(response).await;
    let response = app.get("/api/agent/sessions/a%20b/events").await;
    field_errors(response).await;
    // Bytes that are not UTF-8 are refused the same way, on every route with ids in its path.
    for path in [
        "/api/agent/runs/%FF",
        "/api/agent/runs/%FF/events",
        "/api/agent/sessions/%FF/grants",
    ] {
        let errors = field_errors(app.get(path).await).await;
        let message = errors["fieldErrors"]["path"][0]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains("UTF-8"), "{path}: {errors}");
    }
    let errors = field_errors(
        app.post_json(
            "/api/agent/approvals/%FF/call-1",
            &json!({"decision": "approve"}),
        )
        .await,
    )
    .await;
    assert!(errors["fieldErrors"]["path"][0].is_string(), "{errors}");
}

/// A route asked with a method it does not take answers as the API does, and says which it takes.
#[tokio::test]
async fn a_method_a_route_does_not_take_is_405_with_the_api_error() {
    let app = spawn_app().await;
    let response = app.get("/api/agent").await;
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], false);
    assert_eq!(body["code"], "METHOD_NOT_ALLOWED");
}

#[tokio::test]
async fn refused_decisions_leave_the_approval_pending() {
    let app = spawn_app().await;
    std::fs::write(app.file("a.txt"), "keep").unwrap();
    let run_id = app.create_run(json!({"message": "delete a.txt"})).await;
    let mut events = app.events(&run_id, None).await;
    let required = events.until("approvalRequired").await;
    let call_id = required.data["request"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/api/agent/approvals/{run_id}/{call_id}");
    let bad_bodies: [(Option<&str>, Vec<u8>); 6] = [
        (
            Some("application/json"),
            br#"{"decision": "approve", "extra": 1}"#.to_vec(),
        ),
        (Some("application/json"), br#"{"decision": "yes"}"#.to_vec()),
        (
            Some("application/json"),
            br#"[{"decision": "approve"}]"#.to_vec(),
        ),
        (
            Some("application/json"),
            br#"{"decision": "approve""#.to_vec(),
        ),
        (Some("text/plain"), br#"{"decision": "approve"}"#.to_vec()),
        (
            Some("application/json"),
            br#"{"decision": "approve", "arguments": {"path": 5}}"#.to_vec(),
        ),
    ];
    for (content_type, body) in bad_bodies {
        let response = raw_post(&app, &path, content_type, body.clone()).await;
        assert!(
            response.status().is_client_error(),
            "{}: {}",
            String::from_utf8_lossy(&body),
            response.status()
        );
    }
    let still = pending(&app).await;
    assert_eq!(still.len(), 1);
    assert_eq!(still[0]["toolCallId"], call_id);
    assert_eq!(std::fs::read_to_string(app.file("a.txt")).unwrap(), "keep");
    let decided = app
        .decide(&run_id, &call_id, json!({"decision": "deny"}))
        .await;
    assert_eq!(
        decided.status(),
        200,
        "the approval was still there to decide"
    );
}

/// A form field of `bytes` bytes, as a server function call or an HTML form sends it.
fn huge_form(bytes: usize) -> String {
    format!("message={}", "x".repeat(bytes))
}

/// Sends `body` and checks the answer is the API's 413 that names `limit`.
async fn refused_as_too_large(
    app: &TestApp,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    limit: usize,
) {
    let response = app
        .client
        .request(method.parse().unwrap(), app.url(path))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413, "{method} {path}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({
            "ok": false,
            "code": "PAYLOAD_TOO_LARGE",
            "error": format!("The request body is larger than {limit} bytes.")
        }),
        "{method} {path}"
    );
}

#[tokio::test]
async fn every_route_refuses_a_body_over_the_limit_with_the_api_error() {
    let app = spawn_app().await;
    let mib = 1024 * 1024;
    let json = json!({"message": "x".repeat(mib)}).to_string().into_bytes();
    let form = huge_form(mib).into_bytes();
    let routes: [(&str, &str, &str, &[u8]); 14] = [
        ("POST", "/api/agent", "application/json", &json),
        ("POST", "/api/agent/stream", "application/json", &json),
        ("POST", "/api/agent/runs", "application/json", &json),
        (
            "POST",
            "/api/agent/runs/r/cancel",
            "application/json",
            &json,
        ),
        (
            "POST",
            "/api/agent/approvals/r/c",
            "application/json",
            &json,
        ),
        (
            "POST",
            "/api/fn/page",
            "application/x-www-form-urlencoded",
            &form,
        ),
        (
            "POST",
            "/api/fn/decide",
            "application/x-www-form-urlencoded",
            &form,
        ),
        (
            "POST",
            "/api/fn/pending",
            "application/x-www-form-urlencoded",
            &form,
        ),
        (
            "POST",
            "/api/fn/cancel",
            "application/x-www-form-urlencoded",
            &form,
        ),
        (
            "POST",
            "/api/a-route-added-later",
            "application/json",
            &json,
        ),
        ("POST", "/login", "application/x-www-form-urlencoded", &form),
        ("GET", "/api/agent/approvals", "application/json", &json),
        ("GET", "/", "text/plain", &form),
        ("GET", "/favicon.svg", "text/plain", &form),
    ];
    for (method, path, content_type, body) in routes {
        refused_as_too_large(&app, method, path, content_type, body.to_vec(), 64 * 1024).await;
    }
    // The page's start of a run carries a message as a form, where a byte beyond plain ASCII takes three: its limit
    // is its own too.
    refused_as_too_large(
        &app,
        "POST",
        "/api/fn/start_run",
        "application/x-www-form-urlencoded",
        form.clone(),
        MAX_MESSAGE_FORM_BYTES,
    )
    .await;
    // AG-UI carries whole conversations: its limit is its own, and past it the answer is the same.
    let conversation = json!({"message": "x".repeat(16 * mib)})
        .to_string()
        .into_bytes();
    refused_as_too_large(
        &app,
        "POST",
        "/api/agui",
        "application/json",
        conversation,
        16 * mib,
    )
    .await;
    // Read as it streams, without a Content-Length: the same answer once the limit is passed.
    let chunks =
        (0..MAX_MESSAGE_FORM_BYTES / 1024 + 1).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 1024]));
    let response = app
        .client
        .post(app.url("/api/fn/start_run"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(reqwest::Body::wrap_stream(stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "PAYLOAD_TOO_LARGE"
    );
    assert_eq!(
        app.harness.sessions(usize::MAX).await.unwrap().len(),
        0,
        "nothing started"
    );
    assert!(pending(&app).await.is_empty());
    // A body within the limit still reaches the server function.
    let started = app
        .client
        .post(app.url("/api/fn/start_run"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("message=list%20files")
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
}

/// Any message the API takes can be sent from the page, whatever its script: its form (where a byte beyond plain
/// ASCII takes three) fits the route's limit, and the run starts with the message as it was written.
#[tokio::test]
async fn the_page_sends_a_message_of_the_longest_length_in_a_script_beyond_ascii() {
    let app = spawn_app().await;
    let message = "ж".repeat(MAX_MESSAGE_BYTES / 2);
    assert_eq!(message.len(), MAX_MESSAGE_BYTES);
    let form = message_form(&message);
    assert!(form.len() > 3 * MAX_MESSAGE_BYTES, "{} bytes", form.len());
    let started = raw_post(&app, "/api/fn/start_run", Some(FORM), form).await;
    assert_eq!(started.status(), 200);
    let run_id: String = started.json().await.unwrap();
    let view = app
        .harness
        .run_view(&agent::ids::RunId::parse(&run_id).unwrap())
        .await
        .unwrap()
        .expect("the run was started");
    assert_eq!(view.message, message);

    // One byte more is the API's refusal of the message, not the route's of the body.
    let longer = message_form(&format!("{message}x"));
    let refused = raw_post(&app, "/api/fn/start_run", Some(FORM), longer).await;
    assert_ne!(refused.status(), 413);
    assert!(refused.status().is_client_error() || refused.status().is_server_error());
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains(&format!("at most {MAX_MESSAGE_BYTES} byte(s)"))
    );
}

const FORM: &str = "application/x-www-form-urlencoded";

/// The page's form of a message, as a browser encodes it.
fn message_form(message: &str) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("message", message)
        .finish()
        .into_bytes()
}

/// A client that sends a request's headers and then trickles its body (or stops) gets a 408 once its time is up,
/// and its connection is closed; nothing started. Before, the server waited for the body for as long as the client
/// kept the connection open, holding a task and what had arrived.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_and_its_connection_closes() {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = spawn_app_with(|config| config.body_timeout_secs = 1).await;
    let mut connection = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let began = Instant::now();
    connection
        .write_all(
            b"POST /api/agent/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"message\": \"li",
        )
        .await
        .unwrap();
    // A byte now and then, never the whole body; then nothing more.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        connection.write_all(b" ").await.unwrap();
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), connection.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .unwrap();
    let waited = began.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408 "),
        "after {waited:?}: {answer}"
    );
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    let body: Value =
        serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(
        body,
        json!({
            "ok": false,
            "code": "BODY_TIMEOUT",
            "error": "The request body did not arrive within 1 s of its headers."
        })
    );
    assert_eq!(
        app.harness.sessions(usize::MAX).await.unwrap().len(),
        0,
        "nothing started"
    );
}

/// A query parameter a route does not read is refused, not ignored: a misspelt filter (`runid`) would otherwise list
/// every run's approvals, and a session stream's `after` without its run would replay from the start.
#[tokio::test]
async fn an_unknown_query_parameter_is_refused_and_not_read_as_no_filter() {
    let app = spawn_app().await;
    for (path, field) in [
        ("/api/agent/approvals?runid=r1", "runid"),
        ("/api/agent/sessions/s1/events?from=3", "from"),
        ("/api/agent/runs/r1/events?since=3", "since"),
        ("/api/agent/sessions/s1/events?after=5", "after"),
    ] {
        let body = field_errors(app.get(path).await).await;
        assert!(body["fieldErrors"][field][0].is_string(), "{path}: {body}");
    }
    assert_eq!(app.get("/api/agent/approvals?runId=r1").await.status(), 200);
}

/// An AG-UI resume's interrupt ids are ids (toolgate issues them): a text of another shape is refused before anything
/// is looked up, so that no refusal repeats it into the audit log, which keeps every line for good. The context
/// items count toward the history's bound with the messages.
#[tokio::test]
async fn an_agui_input_with_a_long_interrupt_id_or_too_much_context_is_refused() {
    let app = spawn_app().await;
    let long_id = "x".repeat(10_000);
    let response = app
        .post_json(
            "/api/agui",
            &json!({"threadId": "t", "runId": "r2", "parentRunId": "r1", "messages": [],
                    "resume": [{"interruptId": long_id, "status": "cancelled"}]}),
        )
        .await;
    let body = field_errors(response).await;
    assert!(
        body["fieldErrors"]["resume.0.interruptId"][0]
            .as_str()
            .unwrap()
            .starts_with("Invalid id"),
        "{body}"
    );
    let context: Vec<Value> = (0..1_000)
        .map(|_| json!({"description": "d", "value": "v"}))
        .collect();
    let response = app
        .post_json(
            "/api/agui",
            &json!({"threadId": "t", "runId": "r3", "context": context,
                    "messages": [{"id": "m1", "role": "user", "content": "hi"}]}),
        )
        .await;
    let body = field_errors(response).await;
    assert!(body["fieldErrors"]["context"][0].is_string(), "{body}");
    let audit: Value = app.get("/api/audit").await.json().await.unwrap();
    assert_eq!(audit["entries"], json!([]), "nothing was written");
}
