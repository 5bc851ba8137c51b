//! One error type for the HTTP API. Every response is JSON with `"ok": false` and an `error` message; internal
//! errors are logged and never shown to the client.

use agent::approvals::ApprovalNotFound;
use agent::harness::{CancelError, DecideError, RunNotFound, StartError, Unavailable};
use agent::ids::IdError;
use agent::wire::ValidationErrors;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body or a parameter failed validation: 400 in the `formErrors` / `fieldErrors` shape.
    #[error("Invalid request: {0}")]
    Invalid(ValidationErrors),
    #[error("The request body must be JSON (Content-Type: application/json).")]
    UnsupportedMediaType,
    #[error("The request body is larger than {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    #[error(transparent)]
    ApprovalNotFound(#[from] ApprovalNotFound),
    #[error(transparent)]
    RunNotFound(#[from] RunNotFound),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("There is no API route at this path.")]
    NoRoute,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Unauthorized(String),
    /// The store could not be read or written; nothing was half-written.
    #[error(
        "The server cannot reach its database right now; nothing was changed. Try again shortly."
    )]
    Unavailable(String),
    /// A failure inside the server. The detail goes to the log, not to the client.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ApprovalNotFound(_) | Self::RunNotFound(_) | Self::NoRoute => {
                StatusCode::NOT_FOUND
            }
            Self::Start(StartError::SessionBusy { .. } | StartError::RunIdTaken(_)) => {
                StatusCode::CONFLICT
            }
            Self::Start(StartError::PolicyTooLoose { .. }) | Self::Forbidden(_) => {
                StatusCode::FORBIDDEN
            }
            Self::Start(StartError::ShuttingDown | StartError::Unavailable(_))
            | Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A 400 about one field.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        let mut errors = ValidationErrors::default();
        errors.field(field, message);
        Self::Invalid(errors)
    }

    /// A 400 about an id in the path or the query.
    pub fn bad_id(field: &str, error: IdError) -> Self {
        Self::field(field, format!("Invalid id: {error}"))
    }
}

impl From<DecideError> for ApiError {
    fn from(error: DecideError) -> Self {
        match error {
            DecideError::NotFound(not_found) => Self::ApprovalNotFound(not_found),
            DecideError::InvalidArguments(message) => Self::field("arguments", message),
            DecideError::Unavailable(unavailable) => unavailable.into(),
        }
    }
}

impl From<Unavailable> for ApiError {
    fn from(error: Unavailable) -> Self {
        Self::Unavailable(error.to_string())
    }
}

impl From<CancelError> for ApiError {
    fn from(error: CancelError) -> Self {
        match error {
            CancelError::NotFound(not_found) => Self::RunNotFound(not_found),
            CancelError::Unavailable(unavailable) => unavailable.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            Self::Invalid(errors) => json!({
                "ok": false,
                "error": "Invalid request body.",
                "formErrors": errors.form_errors,
                "fieldErrors": errors.field_errors,
            }),
            Self::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                json!({"ok": false, "error": "Internal server error."})
            }
            Self::Unavailable(detail) => {
                tracing::error!(%detail, "the store is unavailable");
                json!({"ok": false, "code": "STORE_UNAVAILABLE", "error": self.to_string()})
            }
            other => json!({"ok": false, "error": other.to_string()}),
        };
        (status, Json(body)).into_response()
    }
}
