//! Request bodies: a size limit for every route, and the JSON body extractor.
//!
//! The limit is a layer over the whole router, so that routes whose bodies no toolgate extractor reads (the server
//! functions, anything added later) refuse an oversized body the same way: 413 in the API's error shape, before
//! any handler runs. It is [`MAX_BODY_BYTES`] everywhere but AG-UI, whose client sends the whole conversation with
//! every run, tool results included ([`MAX_CONVERSATION_BODY_BYTES`]), and the page's start of a run, whose form
//! carries a message beyond plain ASCII at up to three times its size ([`MAX_MESSAGE_FORM_BYTES`]). The extractor checks that the content type is JSON (415) and turns malformed JSON into a 400
//! in the `formErrors` / `fieldErrors` shape. Field validation happens in the handler, against the parsed value.

use axum::body::{Body, Bytes};
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::Value;

use crate::error::ApiError;
use agent::wire::ValidationErrors;

pub use agent::request_body::{MAX_BODY_BYTES, MAX_MESSAGE_FORM_BYTES};

/// The largest body of `POST /api/agui`: a conversation of many steps, each tool result in it up to the 64 KiB the
/// model reads of an MCP result (more for a file read whole), and up to 1,000 messages.
pub const MAX_CONVERSATION_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The path of the page's server function that starts a run.
const START_RUN_FORM: &str = "/api/fn/start_run";

/// The largest body a request to `path` may have.
pub fn body_limit(path: &str) -> usize {
    match path {
        "/api/agui" => MAX_CONVERSATION_BODY_BYTES,
        START_RUN_FORM => MAX_MESSAGE_FORM_BYTES,
        _ => MAX_BODY_BYTES,
    }
}

/// How long a client has to send a request's body once its headers arrived: a time every body has, and one second
/// more for every [`BYTES_PER_SECOND`] it may have (its `Content-Length`, or its route's limit when it announces
/// none), so that a large body from a slow link still arrives while a trickle of a small one is cut off.
#[derive(Clone, Copy, Debug)]
pub struct BodyDeadline(pub Duration);

/// The slowest upload a body's deadline allows for beyond its base time: 64 KiB a second, about 0.5 Mbit/s.
pub const BYTES_PER_SECOND: u64 = 64 * 1024;

impl BodyDeadline {
    /// The time a body of at most `bytes` has.
    pub fn for_body(self, bytes: u64) -> Duration {
        self.0 + Duration::from_secs(bytes / BYTES_PER_SECOND)
    }
}

/// Reads the request's body, up to its route's [`body_limit`] and within its [`BodyDeadline`], before the route sees
/// it: a larger body (announced by `Content-Length` or found while reading a chunked one) is a 413, one that does not
/// arrive in time a 408 that closes the connection (nothing more of it is read), and neither reaches a handler. Every
/// body toolgate accepts is JSON or a form the handler reads whole anyway.
pub async fn limit_body(
    State(deadline): State<BodyDeadline>,
    request: Request,
    next: Next,
) -> Response {
    let limit = body_limit(request.uri().path());
    let too_large = || ApiError::PayloadTooLarge { limit };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return too_large().into_response();
    }
    let (parts, body) = request.into_parts();
    let deadline = deadline.for_body(declared.unwrap_or(limit as u64));
    let Ok(read) = tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await else {
        let mut response = ApiError::BodyTimeout {
            secs: deadline.as_secs(),
        }
        .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    };
    let bytes = match read {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => return too_large().into_response(),
        Err(error) => {
            return ApiError::Invalid(ValidationErrors::form(format!(
                "The request body could not be read: {error}"
            )))
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A request body that says it is JSON, read whole but not yet parsed: for a handler that reads it straight into
/// its own types ([`JsonBody::value`] is the parse every other route makes).
pub struct JsonBody(pub Bytes);

/// A request body that is a JSON value.
pub struct JsonValue(pub Value);

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

impl JsonBody {
    /// The body as a JSON value: malformed JSON is a 400.
    pub fn value(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.0).map_err(|error| {
            ApiError::Invalid(ValidationErrors::form(format!("Malformed JSON: {error}")))
        })
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = body_limit(request.uri().path());
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !is_json(content_type) {
            return Err(ApiError::UnsupportedMediaType);
        }
        Bytes::from_request(request, state)
            .await
            .map(JsonBody)
            .map_err(|rejection| match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge { limit },
                _ => ApiError::Invalid(ValidationErrors::form(format!(
                    "The request body could not be read: {rejection}"
                ))),
            })
    }
}

impl<S: Send + Sync> FromRequest<S> for JsonValue {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        JsonBody::from_request(request, state)
            .await?
            .value()
            .map(JsonValue)
    }
}

/// Path parameters, refused as any other bad input is: a JSON 400 that names the problem (axum's own rejection is
/// plain text).
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> axum::extract::FromRequestParts<S>
    for Path<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Self(value))
            .map_err(|rejection| ApiError::field("path", rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16 MiB conversation from a link of 0.5 Mbit/s arrives in time; a small body has the base time alone.
    #[test]
    fn a_bodys_deadline_grows_with_what_it_may_carry() {
        let deadline = BodyDeadline(Duration::from_secs(60));
        assert_eq!(deadline.for_body(0), Duration::from_secs(60));
        assert_eq!(
            deadline.for_body(MAX_BODY_BYTES as u64),
            Duration::from_secs(61)
        );
        assert_eq!(
            deadline.for_body(MAX_CONVERSATION_BODY_BYTES as u64),
            Duration::from_secs(60 + 256)
        );
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("Application/JSON"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }
}
