//! A server-sent events parser, fed the response body as it arrives.
//!
//! Chat-completions streams are SSE, and a body read hands us bytes cut anywhere: in the middle of a line, of a
//! UTF-8 character, or between the CR and the LF of a CRLF. So the parser keeps the unfinished line and works line
//! by line, following the rules of the HTML standard that matter to a client:
//!
//! - a line ends with LF, CRLF or CR;
//! - a blank line dispatches the event; an event without `data` is not dispatched;
//! - the `data` lines of one event join with LF;
//! - a line that starts with `:` is a comment (servers send them as keep-alives);
//! - one space after the field's colon is dropped; a line without a colon is a field with an empty value;
//! - a UTF-8 byte order mark at the very start is ignored;
//! - an event still unfinished when the body ends is discarded.

/// The longest line we hold. A chat chunk is a few hundred bytes; a server that sends megabytes without a line end
/// is broken, and holding it all would let it take our memory.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server named the event.
    pub event: Option<String>,
    /// The `data:` lines, joined with LF.
    pub data: String,
}

/// Why the body is not a valid event stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("a line of the event stream is not valid UTF-8")]
    InvalidUtf8,
    #[error("a line of the event stream is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
}

#[derive(Debug, Default)]
pub struct SseParser {
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The previous read ended with a CR, so an LF at the start of the next one ends nothing.
    after_cr: bool,
    /// A line has been seen, so a BOM can no longer appear.
    started: bool,
    /// The data of the event being read, each line followed by an LF.
    data: String,
    event: Option<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next bytes of the body and returns the events they complete, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        while let Some((&first, rest)) = bytes.split_first() {
            if self.after_cr {
                self.after_cr = false;
                if first == b'\n' {
                    bytes = rest;
                    continue;
                }
            }
            let Some(end) = bytes.iter().position(|b| matches!(b, b'\n' | b'\r')) else {
                self.push(bytes)?;
                break;
            };
            self.push(&bytes[..end])?;
            self.after_cr = bytes[end] == b'\r';
            bytes = &bytes[end + 1..];
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_ended(&line)? {
                events.push(event);
            }
        }
        Ok(events)
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_ended(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        let line = if self.started {
            line
        } else {
            self.started = true;
            line.strip_prefix(BOM).unwrap_or(line)
        };
        let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => self.event = Some(value.to_owned()),
            // `id` and `retry` serve reconnection, which a chat completion cannot resume; other fields are ignored
            // by the standard.
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        Some(SseEvent { event, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(text: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: text.to_owned(),
        }
    }

    fn parse_all(body: &[u8]) -> Vec<SseEvent> {
        SseParser::new().feed(body).unwrap()
    }

    /// Feeds `body` in pieces of `size` bytes.
    fn parse_in_pieces(body: &[u8], size: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        body.chunks(size)
            .flat_map(|piece| parser.feed(piece).unwrap())
            .collect()
    }

    #[test]
    fn reads_data_events_and_ignores_what_is_not_data() {
        let body =
            b": keep-alive\n\ndata: {\"a\":1}\n\nid: 7\nretry: 100\nunknown: x\ndata:[DONE]\n\n";
        assert_eq!(parse_all(body), vec![data("{\"a\":1}"), data("[DONE]")]);
    }

    #[test]
    fn joins_multi_line_data_with_line_feeds() {
        let body = b"data: first\ndata:  second keeps one space\ndata\n\n";
        assert_eq!(
            parse_all(body),
            vec![data("first\n second keeps one space\n")]
        );
    }

    #[test]
    fn accepts_crlf_and_lone_cr_line_ends() {
        let body = b"data: a\r\n\r\ndata: b\r\rdata: c\n\r\n";
        assert_eq!(parse_all(body), vec![data("a"), data("b"), data("c")]);
    }

    #[test]
    fn gives_the_same_events_whatever_the_read_boundaries() {
        let body = "\u{FEFF}: hello\r\nevent: delta\r\ndata: {\"text\":\"héllo wörld ✓\"}\r\n\r\ndata: x\r\ndata: y\r\n\r\n: bye\r\n\r\ndata: [DONE]\r\n\r\n"
            .as_bytes();
        let whole = parse_all(body);
        assert_eq!(
            whole,
            vec![
                SseEvent {
                    event: Some("delta".into()),
                    data: "{\"text\":\"héllo wörld ✓\"}".into()
                },
                data("x\ny"),
                data("[DONE]"),
            ]
        );
        for size in 1..body.len() {
            assert_eq!(parse_in_pieces(body, size), whole, "pieces of {size} bytes");
        }
    }

    #[test]
    fn a_cr_at_the_end_of_one_read_and_an_lf_at_the_start_of_the_next_end_one_line() {
        let mut parser = SseParser::new();
        assert!(parser.feed(b"data: a\r").unwrap().is_empty());
        assert_eq!(parser.feed(b"\n\r").unwrap(), vec![data("a")]);
        assert_eq!(parser.feed(b"\ndata: b\n\n").unwrap(), vec![data("b")]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_its_name_does_not_leak() {
        let body = b"event: ping\n\ndata: real\n\n";
        assert_eq!(parse_all(body), vec![data("real")]);
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        assert!(parse_all(b"data: {\"half\":").is_empty());
        assert!(parse_all(b"data: complete line but no blank line\n").is_empty());
    }

    #[test]
    fn refuses_invalid_utf8_and_endless_lines() {
        assert_eq!(
            SseParser::new().feed(b"data: \xFF\xFE\n\n"),
            Err(SseError::InvalidUtf8)
        );
        let mut parser = SseParser::new();
        let big = vec![b'a'; MAX_LINE_BYTES / 2 + 1];
        assert!(parser.feed(&big).is_ok());
        assert_eq!(parser.feed(&big), Err(SseError::LineTooLong));
    }
}
