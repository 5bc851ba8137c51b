//! Identifiers that cross the wire: run ids, tool call ids, session ids, grant ids and rule ids.
//!
//! Each is a newtype whose only constructor validates, so a malformed id (empty, too long, or with characters that
//! would need escaping in a URL path or a log line) cannot exist past the edge where it was parsed.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest id we accept from a client.
pub const MAX_ID_LEN: usize = 128;

/// Why a string is not a valid id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {max} characters long (got {len})")]
    TooLong { max: usize, len: usize },
    #[error("may contain only letters, digits and - _ . : (found {found:?})")]
    InvalidChar { found: char },
}

fn validate(value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty);
    }
    if value.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            max: MAX_ID_LEN,
            len: value.len(),
        });
    }
    match value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        Some(found) => Err(IdError::InvalidChar { found }),
        None => Ok(()),
    }
}

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        ///
        /// Shared text: an id is cloned into every event, record and audit entry that names it, and a clone
        /// counts a reference instead of copying the text.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Parses and validates an id received from outside.
            pub fn parse(value: impl AsRef<str>) -> Result<Self, IdError> {
                let value = value.as_ref();
                validate(value)?;
                Ok(Self(Arc::from(value)))
            }

            /// A fresh random id with a readable prefix.
            #[cfg(feature = "runtime")]
            pub fn generate() -> Self {
                Self(Arc::from(format!(concat!($prefix, "_{}"), uuid::Uuid::new_v4().simple())))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(IdVisitor).map(Self)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// Reads an id's text, borrowed when the input allows, and validates it before it is kept.
struct IdVisitor;

impl Visitor<'_> for IdVisitor {
    type Value = Arc<str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Self::Value, E> {
        validate(value).map_err(E::custom)?;
        Ok(Arc::from(value))
    }
}

id_type!(
    /// One run of the agent: from a user message to a final answer, an error or an abort.
    RunId,
    "run"
);
id_type!(
    /// One tool call inside a run, as named by the model.
    ToolCallId,
    "call"
);
id_type!(
    /// A conversation: its runs, its history and its session grants.
    SessionId,
    "session"
);
id_type!(
    /// One session grant: what a person approved for the rest of a session. Made from what the grant covers, so
    /// the same grant given twice is one grant.
    GrantId,
    "grant"
);
id_type!(
    /// One permission rule, configured (`flag-N`, `file-N`) or added by a person (made from the rule's text).
    RuleId,
    "rule"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_ids_clients_send() {
        for id in [
            "demo",
            "demo-run",
            "call_1",
            "run_0123abcd",
            "thread:1.2",
            "a",
        ] {
            assert!(RunId::parse(id).is_ok(), "{id}");
        }
    }

    #[test]
    fn refuses_empty_long_and_odd_ids() {
        assert_eq!(RunId::parse(""), Err(IdError::Empty));
        assert_eq!(
            RunId::parse("x".repeat(129)),
            Err(IdError::TooLong { max: 128, len: 129 })
        );
        assert_eq!(
            ToolCallId::parse("a/b"),
            Err(IdError::InvalidChar { found: '/' })
        );
        assert_eq!(
            ToolCallId::parse("a b"),
            Err(IdError::InvalidChar { found: ' ' })
        );
        assert!(SessionId::parse("é").is_err());
    }

    #[test]
    fn deserializing_validates() {
        let err = serde_json::from_str::<RunId>("\"../etc\"").unwrap_err();
        assert!(err.to_string().contains("may contain only"), "{err}");
        let ok: RunId = serde_json::from_str("\"run_1\"").unwrap();
        assert_eq!(ok.as_str(), "run_1");
        // Escaped text, owned text and a value that is no string at all.
        let escaped: RunId = serde_json::from_str("\"run\\u005f2\"").unwrap();
        assert_eq!(escaped.as_str(), "run_2");
        let owned: RunId = serde_json::from_value(serde_json::json!("run_3")).unwrap();
        assert_eq!(owned.as_str(), "run_3");
        let err = serde_json::from_value::<RunId>(serde_json::json!("a b")).unwrap_err();
        assert!(err.to_string().contains("may contain only"), "{err}");
        let err = serde_json::from_str::<RunId>("5").unwrap_err();
        assert!(err.to_string().contains("expected a string"), "{err}");
    }

    #[test]
    fn an_id_serializes_as_its_text_and_a_clone_shares_it() {
        let id = SessionId::parse("thread:1.2").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"thread:1.2\"");
        let copy = id.clone();
        assert!(std::ptr::eq(id.as_str(), copy.as_str()));
    }
}
