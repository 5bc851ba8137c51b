//! `Last-Event-ID` as the event-stream routes parse it: a run's `seq`, a session's `runId:seq`. What is accepted
//! is what the server itself sends (it round-trips), and nothing panics.

#![no_main]

use axum::http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use server::api::{parse_run_event_id, parse_session_event_id};

fuzz_target!(|data: &[u8]| {
    if let Some(seq) = parse_run_event_id(data) {
        let trimmed = std::str::from_utf8(data.trim_ascii()).expect("accepted ids are text");
        assert!(
            trimmed
                .trim_start_matches('+')
                .bytes()
                .all(|b| b.is_ascii_digit()),
            "{trimmed:?}"
        );
        assert_eq!(parse_run_event_id(seq.to_string().as_bytes()), Some(seq));
    }
    if let Some((run, seq)) = parse_session_event_id(data) {
        let sent = format!("{run}:{seq}");
        assert_eq!(parse_session_event_id(sent.as_bytes()), Some((run, seq)));
    }
    // What a header can carry reaches the parsers the same way.
    if let Ok(value) = HeaderValue::from_bytes(data) {
        assert_eq!(
            parse_run_event_id(value.as_bytes()),
            parse_run_event_id(data)
        );
    }
});
