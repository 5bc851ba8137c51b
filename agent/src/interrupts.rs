//! What interrupt-mode runs issued, kept until a resume uses it, once.
//!
//! An interrupted run leaves a [`Suspension`]: the conversation up to the batch, the batch itself, and one issued
//! interrupt per call that needs a person (its id, tool, argument digest and expiry). A resume names the run that
//! issued the interrupts; the server checks it against the suspension, and only if every check passes takes the
//! suspension in the store, once, in the transaction that starts the resuming run ([`crate::store::NewRun`]), before
//! anything executes. A second resume of the same run finds it used and is refused: a tool runs at most once per
//! approval, whatever a client resends. What was issued never changes, so a check made before the take holds at the take.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::agent_loop::Interruption;
use crate::ids::{RunId, SessionId};
use crate::wire::{InterruptRequest, Message};

/// The digest of a call's arguments: SHA-256 over their canonical JSON (object keys sorted), in hex.
pub fn arguments_digest(arguments: &Value) -> String {
    hex::encode(Sha256::digest(arguments.to_string().as_bytes()))
}

/// One interrupt as issued: what a client sees, and the digest of the arguments it was issued for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IssuedInterrupt {
    pub request: InterruptRequest,
    pub digest: String,
}

/// An interrupted run, waiting for its resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suspension {
    /// The run that issued the interrupts.
    pub run_id: RunId,
    /// Its session (the AG-UI thread).
    pub session_id: SessionId,
    /// The conversation up to and including the assistant message that made the interrupted batch.
    pub history: Vec<Message>,
    pub interruption: Interruption,
    pub interrupts: Vec<IssuedInterrupt>,
}

impl Suspension {
    /// The earliest expiry among the interrupts, in milliseconds since the Unix epoch.
    pub fn expires_at(&self) -> u64 {
        self.interrupts
            .iter()
            .map(|issued| issued.request.expires_at)
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digests_ignore_key_order_and_see_every_change() {
        assert_eq!(
            arguments_digest(&json!({"a": 1, "b": 2})),
            arguments_digest(&serde_json::from_str::<Value>(r#"{"b":2,"a":1}"#).unwrap())
        );
        assert_ne!(
            arguments_digest(&json!({"path": "a"})),
            arguments_digest(&json!({"path": "b"}))
        );
        assert_eq!(arguments_digest(&json!({})).len(), 64);
    }
}
