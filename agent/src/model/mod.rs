//! Models: anything that turns a conversation into the next step, streamed.
//!
//! A step is text deltas, then zero or more complete tool calls, then optionally usage and a finish reason. A model
//! client assembles streamed tool-call fragments itself and hands the loop whole calls.
//!
//! Two models exist: the [`ScriptedModel`] (offline, deterministic) and, with the `openai` feature, the
//! `OpenAiModel` for any OpenAI-compatible chat-completions API (OpenAI, Ollama, vLLM, llama.cpp, LM Studio).

#[cfg(feature = "openai")]
mod openai;
mod scripted;

use std::time::Duration;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::ids::RunId;
use crate::wire::{Message, ToolCall, ToolSpec};

#[cfg(feature = "openai")]
pub use openai::{
    ApiKey, OpenAiConfig, OpenAiModel, OpenAiSetupError, RetryPolicy, install_crypto_provider,
};
pub use scripted::ScriptedModel;

/// Token counts reported by a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// One piece of a streamed step.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelChunk {
    Text(String),
    ToolCall(ToolCall),
    Usage(Usage),
    /// Why the model stopped (`stop`, `tool_calls`, `length`, ...).
    Finish(String),
}

/// Why a model could not produce a step. Messages never contain credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("the model provider refused the credentials (HTTP 401): {0}")]
    Unauthorized(String),
    #[error("the model provider does not know this model or endpoint (HTTP 404): {0}")]
    NotFound(String),
    #[error(
        "the model provider kept rate-limiting the request (HTTP 429) after {attempts} attempts: {message}"
    )]
    RateLimited { attempts: u32, message: String },
    #[error("the model provider failed (HTTP {status}) after {attempts} attempts: {message}")]
    Server {
        status: u16,
        attempts: u32,
        message: String,
    },
    #[error("the model provider answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("the connection to the model provider failed: {0}")]
    Connection(String),
    #[error("the model provider sent a malformed stream: {0}")]
    Malformed(String),
    /// The provider accepted the request, then reported a failure inside the stream.
    #[error("the model provider reported an error: {0}")]
    Provider(String),
    #[error("the model provider did not answer within {0:?}")]
    Timeout(Duration),
    /// The provider kept the answer going, but did not finish one step within the step's time.
    #[error("the model did not finish its answer within {0:?}")]
    StepTimeout(Duration),
    /// The provider stopped the answer before its end (its output limit, a content filter) while it was making
    /// tool calls: what they would have done is not known, so none of them runs.
    #[error(
        "the model's answer was cut off (finish reason `{reason}`) while it made {calls} tool call(s); none of them ran"
    )]
    CutOff { reason: String, calls: usize },
    #[error(
        "the model's answer for one step is larger than {limit} bytes; it was not read further"
    )]
    TooLarge { limit: usize },
    #[error("the model made more than {limit} tool calls in one step; none of them ran")]
    TooManyCalls { limit: usize },
}

/// What the loop asks a model for.
#[derive(Clone, Copy, Debug)]
pub struct ModelRequest<'a> {
    pub run_id: &'a RunId,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
}

pub type ModelStream<'a> = BoxStream<'a, Result<ModelChunk, ModelError>>;

pub trait Model: Send + Sync {
    /// A short name for logs and the UI.
    fn name(&self) -> &str;

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a>;
}
