//! The JSON body extractor: the content type must be JSON (415), the size is bounded (413), and malformed JSON is a
//! 400 in the `formErrors` / `fieldErrors` shape. Field validation happens in the handler, against the parsed value.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde_json::Value;

use crate::error::ApiError;
use agent::wire::ValidationErrors;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A request body that is a JSON value.
pub struct JsonValue(pub Value);

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

impl<S: Send + Sync> FromRequest<S> for JsonValue {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !is_json(content_type) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes =
            Bytes::from_request(request, state)
                .await
                .map_err(|rejection| match rejection.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge {
                        limit: MAX_BODY_BYTES,
                    },
                    _ => ApiError::Invalid(ValidationErrors::form(format!(
                        "The request body could not be read: {rejection}"
                    ))),
                })?;
        serde_json::from_slice(&bytes)
            .map(JsonValue)
            .map_err(|error| {
                ApiError::Invalid(ValidationErrors::form(format!("Malformed JSON: {error}")))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::is_json;

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
