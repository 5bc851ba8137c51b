//! Request bodies as the API decodes them: arbitrary bytes under one of several content types go through the
//! server's JSON body extractor, and every value it accepts through the validators of a decision and of a run's
//! start. Nothing may panic; every refusal is a 4xx in the API's JSON shape; every accepted value is well-formed.

#![no_main]

use agent::request_body::{MAX_MESSAGE_BYTES, StartRunInput};
use agent::wire::{Decision, ValidationErrors};
use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use server::body::JsonValue;

/// The first input byte picks the content type, so the fuzzer explores the 415 path too.
const CONTENT_TYPES: [&str; 7] = [
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "application/vnd.api+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "",
];

fn is_json(content_type: &str) -> bool {
    !matches!(
        content_type,
        "text/plain" | "application/x-www-form-urlencoded" | ""
    )
}

/// A refusal names at least one problem, and each problem in words.
fn assert_explains(errors: &ValidationErrors) {
    assert!(!errors.is_empty(), "a refusal without a reason");
    for message in errors
        .form_errors
        .iter()
        .chain(errors.field_errors.values().flatten())
    {
        assert!(
            !message.trim().is_empty(),
            "an empty error message: {errors:?}"
        );
    }
    let _ = errors.to_string();
}

fn check_validators(value: &Value) {
    match Decision::from_json(value) {
        Ok(decision) => {
            let kind = value.get("decision").and_then(Value::as_str);
            match decision {
                Decision::Approve { .. } => assert_eq!(kind, Some("approve")),
                Decision::Deny { .. } => assert_eq!(kind, Some("deny")),
            }
        }
        Err(errors) => assert_explains(&errors),
    }
    match StartRunInput::from_json(value) {
        Ok(input) => {
            assert!(!input.message.trim().is_empty());
            assert!(input.message.len() <= MAX_MESSAGE_BYTES);
            assert_eq!(
                value.get("message").and_then(Value::as_str),
                Some(input.message.as_str())
            );
        }
        Err(errors) => assert_explains(&errors),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(selector) % CONTENT_TYPES.len()];
    let mut request = Request::builder().method("POST").uri("/api/agent/runs");
    if !content_type.is_empty() {
        request = request.header("content-type", content_type);
    }
    let request = request
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    match futures::executor::block_on(JsonValue::from_request(request, &())) {
        Ok(JsonValue(value)) => {
            assert!(
                is_json(content_type),
                "{content_type:?} was decoded as JSON"
            );
            assert_eq!(
                serde_json::from_slice::<Value>(body).ok().as_ref(),
                Some(&value)
            );
            check_validators(&value);
        }
        Err(error) => {
            let status = error.status();
            assert!(
                matches!(
                    status,
                    StatusCode::BAD_REQUEST
                        | StatusCode::UNSUPPORTED_MEDIA_TYPE
                        | StatusCode::PAYLOAD_TOO_LARGE
                ),
                "{status}"
            );
            assert_eq!(
                status == StatusCode::UNSUPPORTED_MEDIA_TYPE,
                !is_json(content_type)
            );
            assert_eq!(error.into_response().status(), status);
        }
    }
    // Whatever the header said, any JSON value must get a clear answer from the validators.
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        check_validators(&value);
    }
});
