//! Ids as clients send them (path segments, query parameters, JSON fields): every parser accepts exactly the
//! well-formed ones, says truly why it refuses the others, and what it accepts round-trips through JSON.

#![no_main]

use agent::ids::{IdError, MAX_ID_LEN, RunId, SessionId, ToolCallId};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();
    let run = RunId::parse(text);
    assert_eq!(run.as_ref().err(), ToolCallId::parse(text).as_ref().err());
    assert_eq!(run.as_ref().err(), SessionId::parse(text).as_ref().err());
    match &run {
        Ok(id) => {
            assert_eq!(id.as_str(), text);
            assert!(!text.is_empty() && text.len() <= MAX_ID_LEN && text.chars().all(allowed));
            let json = serde_json::to_string(id).expect("an id serializes");
            assert_eq!(
                &serde_json::from_str::<RunId>(&json).expect("and parses back"),
                id
            );
        }
        Err(IdError::Empty) => assert!(text.is_empty()),
        Err(IdError::TooLong { max, len }) => {
            assert_eq!((*max, *len), (MAX_ID_LEN, text.len()));
            assert!(text.len() > MAX_ID_LEN);
        }
        Err(IdError::InvalidChar { found }) => {
            assert!(!allowed(*found) && text.contains(*found));
            assert!(text.len() <= MAX_ID_LEN);
        }
    }
    // In a JSON body the same rules hold.
    let from_json = serde_json::from_value::<SessionId>(Value::String(text.to_owned()));
    assert_eq!(from_json.is_ok(), run.is_ok());
});
