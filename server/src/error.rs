//! One error type for the HTTP API, REST and AG-UI alike. Every refusal is JSON in one shape,
//! `{"ok": false, "code": "...", "error": "..."}` with the right status (invalid bodies add `formErrors` and
//! `fieldErrors`); internal errors are logged and never shown to the client.

use agent::approvals::ApprovalNotFound;
use agent::harness::{
    CancelError, DecideError, GrantNotFound, RevokeError, RunNotFound, StartError, Unavailable,
};
use agent::ids::IdError;
use agent::policy::RuleBookError;
use agent::wire::ValidationErrors;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refusal with its own status and code, for checks whose reasons are many (an AG-UI resume).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body or a parameter failed validation: 400 in the `formErrors` / `fieldErrors` shape.
    #[error("Invalid request: {0}")]
    Invalid(ValidationErrors),
    #[error("The request body must be JSON (Content-Type: application/json).")]
    UnsupportedMediaType,
    #[error("The request body is larger than {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    /// The client sent its headers and not the whole body after them within the time it had.
    #[error("The request body did not arrive within {secs} s of its headers.")]
    BodyTimeout { secs: u64 },
    #[error(transparent)]
    ApprovalNotFound(#[from] ApprovalNotFound),
    #[error(transparent)]
    RunNotFound(#[from] RunNotFound),
    #[error(transparent)]
    GrantNotFound(#[from] GrantNotFound),
    /// Adding or removing a rule was refused; nothing changed.
    #[error(transparent)]
    Rules(RuleBookError),
    /// A run that could not start, on every route that starts runs.
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("{}", .0.message)]
    Refused(Refusal),
    #[error(
        "This client has {limit} event streams open, the most one client may; close one before opening another."
    )]
    TooManyStreams { limit: usize },
    #[error("There is no API route at this path.")]
    NoRoute,
    #[error("This route does not take that method; the Allow header lists the ones it takes.")]
    MethodNotAllowed,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Unauthorized(String),
    /// A client that sent too many wrong credentials lately.
    #[error("{0}")]
    TooManyAttempts(String),
    /// The store could not be read or written; nothing was half-written.
    #[error("{}", app::api::UNAVAILABLE)]
    Unavailable(String),
    /// A failure inside the server. The detail goes to the log, not to the client.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The status and code of a run that could not start, as [`StartError::refusal`] maps them for every route.
fn start_refusal(error: &StartError) -> (StatusCode, &'static str) {
    let (status, code) = error.refusal();
    (status_of(status), code)
}

/// A status the harness names by its number.
fn status_of(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::ApprovalNotFound(_)
            | Self::RunNotFound(_)
            | Self::GrantNotFound(_)
            | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Rules(error) => status_of(error.status()),
            Self::Start(error) => start_refusal(error).0,
            Self::Refused(refusal) => refusal.status,
            Self::TooManyStreams { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::TooManyAttempts(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What went wrong, for programs: stable, upper snake case.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "INVALID_INPUT",
            Self::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Self::PayloadTooLarge { .. } => "PAYLOAD_TOO_LARGE",
            Self::BodyTimeout { .. } => "BODY_TIMEOUT",
            Self::ApprovalNotFound(_) => "APPROVAL_NOT_FOUND",
            Self::RunNotFound(_) => "RUN_NOT_FOUND",
            Self::GrantNotFound(_) => "GRANT_NOT_FOUND",
            Self::Rules(RuleBookError::NotFound(_)) => "RULE_NOT_FOUND",
            Self::Rules(RuleBookError::NotRemovable { .. }) => "RULE_NOT_REMOVABLE",
            Self::Rules(RuleBookError::AlreadyPresent { .. }) => "RULE_EXISTS",
            Self::Rules(RuleBookError::Stored { .. }) => "INTERNAL",
            Self::Rules(RuleBookError::Store(_)) => "STORE_UNAVAILABLE",
            Self::Start(error) => start_refusal(error).1,
            Self::Refused(refusal) => refusal.code,
            Self::TooManyStreams { .. } => "TOO_MANY_STREAMS",
            Self::NoRoute => "NO_ROUTE",
            Self::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Self::Forbidden(_) => "FORBIDDEN",
            Self::Unauthorized(_) => "UNAUTHORIZED",
            Self::TooManyAttempts(_) => "TOO_MANY_ATTEMPTS",
            Self::Unavailable(_) => "STORE_UNAVAILABLE",
            Self::Internal(_) => "INTERNAL",
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

    /// A refusal with its own status and code.
    pub fn refused(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused(Refusal::new(status, code, message))
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

impl From<DecideError> for ApiError {
    fn from(error: DecideError) -> Self {
        match error {
            DecideError::NotFound(not_found) => Self::ApprovalNotFound(not_found),
            DecideError::InvalidArguments(message) => Self::field("arguments", message),
            DecideError::ScopeNotOffered(message) => Self::field("scope", message),
            DecideError::Unavailable(unavailable) => unavailable.into(),
        }
    }
}

impl From<Unavailable> for ApiError {
    fn from(error: Unavailable) -> Self {
        Self::Unavailable(error.to_string())
    }
}

impl From<RevokeError> for ApiError {
    fn from(error: RevokeError) -> Self {
        match error {
            RevokeError::NotFound(not_found) => Self::GrantNotFound(not_found),
            RevokeError::Unavailable(unavailable) => unavailable.into(),
        }
    }
}

impl From<RuleBookError> for ApiError {
    fn from(error: RuleBookError) -> Self {
        match error {
            RuleBookError::Store(error) => Self::Unavailable(error.to_string()),
            // The detail names a row of the database: it goes to the log.
            RuleBookError::Stored { .. } => Self::Internal(error.to_string()),
            other => Self::Rules(other),
        }
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
        let code = self.code();
        let body = match &self {
            Self::Invalid(errors) => json!({
                "ok": false,
                "code": code,
                "error": "Invalid request: fieldErrors and formErrors say what is wrong.",
                "formErrors": errors.form_errors,
                "fieldErrors": errors.field_errors,
            }),
            Self::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                json!({"ok": false, "code": code, "error": app::api::INTERNAL})
            }
            Self::Unavailable(detail) | Self::Start(StartError::Unavailable(detail)) => {
                tracing::error!(%detail, "the store is unavailable");
                json!({"ok": false, "code": code, "error": app::api::UNAVAILABLE})
            }
            other => json!({"ok": false, "code": code, "error": other.to_string()}),
        };
        (status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::ids::{RunId, SessionId};

    #[test]
    fn a_run_that_cannot_start_has_one_status_and_code_per_reason() {
        let busy = StartError::SessionBusy {
            session_id: SessionId::parse("s").unwrap(),
            run_id: RunId::parse("r").unwrap(),
        };
        let cases = [
            (
                StartError::ShuttingDown,
                StatusCode::SERVICE_UNAVAILABLE,
                "SHUTTING_DOWN",
            ),
            (busy, StatusCode::CONFLICT, "THREAD_BUSY"),
            (
                StartError::RunIdTaken(RunId::parse("r").unwrap()),
                StatusCode::CONFLICT,
                "RUN_ID_TAKEN",
            ),
            (
                StartError::Interrupted {
                    session_id: SessionId::parse("s").unwrap(),
                    waiting: RunId::parse("r").unwrap(),
                },
                StatusCode::CONFLICT,
                "THREAD_INTERRUPTED",
            ),
        ];
        for (error, status, code) in cases {
            let error = ApiError::from(error);
            assert_eq!((error.status(), error.code()), (status, code));
        }
    }
}
