//! The chat-completions response body as server-sent events.
//!
//! The parsing itself is `eventsource-stream`'s (the HTML standard's rules: any line ending, data lines joined with
//! LF, comments, a leading byte order mark, no event without data). Two things a client of a remote server needs
//! come before it, on the raw bytes: each read of the body must arrive within the model's timeout (a keep-alive
//! comment counts, so a slow but alive server is not cut off), and neither a line nor an event may grow without end
//! (a broken server that sends megabytes without a line ending, or `data:` lines without the blank line that ends
//! their event, must not take our memory). A leading byte order mark is also taken
//! off here: `eventsource-stream` 0.2.3 slices it off by one byte, not three, and panics on it.

use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

/// The longest line we hold. A chat chunk is a few hundred bytes.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// The longest event we hold: its lines, up to the blank line that dispatches it.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server named the event.
    pub event: Option<String>,
    /// The `data:` lines, joined with LF.
    pub data: String,
}

/// Why the body is not a usable event stream.
#[derive(Debug, thiserror::Error)]
pub enum SseError<E> {
    #[error("a line of the event stream is not valid UTF-8")]
    InvalidUtf8,
    #[error("a line of the event stream is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("an event of the event stream is longer than {MAX_EVENT_BYTES} bytes")]
    EventTooLong,
    #[error("the event stream is malformed: {0}")]
    Malformed(String),
    #[error("no part of the answer arrived within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error(transparent)]
    Transport(E),
}

/// Errors of the bytes before they are parsed.
enum Read<E> {
    LineTooLong,
    EventTooLong,
    Timeout(Duration),
    Transport(E),
}

/// Counts the bytes of the line not yet ended and of the event not yet dispatched, across reads.
#[derive(Default)]
struct Bounds {
    line: usize,
    event: usize,
    /// The last byte was a CR: an LF now is the same line end.
    after_cr: bool,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Takes a byte order mark off the start of the body, even when it is split across reads.
#[derive(Default)]
struct LeadingBom {
    /// The body's first bytes, held while they may still be a byte order mark.
    held: Vec<u8>,
    done: bool,
}

impl LeadingBom {
    /// The bytes to pass on: none while the start is undecided.
    fn strip(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.done {
            return bytes.to_vec();
        }
        self.held.extend_from_slice(bytes);
        let n = self.held.len().min(BOM.len());
        if self.held[..n] != BOM[..n] {
            self.done = true;
            return std::mem::take(&mut self.held);
        }
        if self.held.len() < BOM.len() {
            return Vec::new();
        }
        self.done = true;
        self.held.split_off(BOM.len())
    }
}

impl Bounds {
    /// Follows the line ends of one read (CR, LF or CRLF, as the parser reads them): a line that ends empty is the
    /// blank line that dispatches the event. The error says which would hold too much.
    fn admit<E>(&mut self, bytes: &[u8]) -> Result<(), Read<E>> {
        for &byte in bytes {
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    if self.line == 0 {
                        self.event = 0;
                    }
                    self.line = 0;
                    self.after_cr = byte == b'\r';
                }
                _ => {
                    self.line += 1;
                    self.event += 1;
                    self.after_cr = false;
                }
            }
        }
        if self.line > MAX_LINE_BYTES {
            Err(Read::LineTooLong)
        } else if self.event > MAX_EVENT_BYTES {
            Err(Read::EventTooLong)
        } else {
            Ok(())
        }
    }
}

/// The events of a body, each read of which must come within `timeout`.
pub fn events<B, E>(
    body: impl Stream<Item = Result<B, E>> + Send + 'static,
    timeout: Duration,
) -> BoxStream<'static, Result<SseEvent, SseError<E>>>
where
    B: AsRef<[u8]> + Send + 'static,
    E: Send + 'static,
{
    let bytes = futures::stream::unfold(
        (
            body.boxed(),
            Bounds::default(),
            LeadingBom::default(),
            false,
        ),
        move |(mut body, mut bound, mut bom, failed)| async move {
            if failed {
                return None;
            }
            let item = match tokio::time::timeout(timeout, body.next()).await {
                Err(_) => Err(Read::Timeout(timeout)),
                Ok(None) => return None,
                Ok(Some(Err(error))) => Err(Read::Transport(error)),
                Ok(Some(Ok(bytes))) => bound
                    .admit(bytes.as_ref())
                    .map(|()| bom.strip(bytes.as_ref())),
            };
            let failed = item.is_err();
            Some((item, (body, bound, bom, failed)))
        },
    );
    bytes
        .eventsource()
        .map(|item| match item {
            Ok(event) => Ok(SseEvent {
                event: (event.event != "message").then_some(event.event),
                data: event.data,
            }),
            Err(EventStreamError::Utf8(_)) => Err(SseError::InvalidUtf8),
            Err(EventStreamError::Parser(error)) => Err(SseError::Malformed(error.to_string())),
            Err(EventStreamError::Transport(Read::LineTooLong)) => Err(SseError::LineTooLong),
            Err(EventStreamError::Transport(Read::EventTooLong)) => Err(SseError::EventTooLong),
            Err(EventStreamError::Transport(Read::Timeout(after))) => Err(SseError::Timeout(after)),
            Err(EventStreamError::Transport(Read::Transport(error))) => {
                Err(SseError::Transport(error))
            }
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENT: Duration = Duration::from_secs(5);

    fn data(text: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: text.to_owned(),
        }
    }

    async fn parse_pieces(pieces: Vec<Vec<u8>>) -> Result<Vec<SseEvent>, String> {
        let body = futures::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
        let mut out = Vec::new();
        let mut stream = events(body, PATIENT);
        while let Some(item) = stream.next().await {
            out.push(item.map_err(|error| error.to_string())?);
        }
        Ok(out)
    }

    async fn parse_all(body: &[u8]) -> Vec<SseEvent> {
        parse_pieces(vec![body.to_vec()]).await.unwrap()
    }

    /// Feeds `body` in pieces of `size` bytes.
    async fn parse_in_pieces(body: &[u8], size: usize) -> Vec<SseEvent> {
        parse_pieces(body.chunks(size).map(<[u8]>::to_vec).collect())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn reads_data_events_and_ignores_what_is_not_data() {
        let body =
            b": keep-alive\n\ndata: {\"a\":1}\n\nid: 7\nretry: 100\nunknown: x\ndata:[DONE]\n\n";
        assert_eq!(
            parse_all(body).await,
            vec![data("{\"a\":1}"), data("[DONE]")]
        );
    }

    #[tokio::test]
    async fn joins_multi_line_data_with_line_feeds() {
        let body = b"data: first\ndata:  second keeps one space\ndata\n\n";
        assert_eq!(
            parse_all(body).await,
            vec![data("first\n second keeps one space\n")]
        );
    }

    #[tokio::test]
    async fn accepts_crlf_and_lone_cr_line_ends() {
        let body = b"data: a\r\n\r\ndata: b\r\rdata: c\n\r\n";
        assert_eq!(parse_all(body).await, vec![data("a"), data("b"), data("c")]);
    }

    #[tokio::test]
    async fn gives_the_same_events_whatever_the_read_boundaries() {
        let body = "\u{FEFF}: hello\r\nevent: delta\r\ndata: {\"text\":\"héllo wörld ✓\"}\r\n\r\ndata: x\r\ndata: y\r\n\r\n: bye\r\n\r\ndata: [DONE]\r\n\r\n"
            .as_bytes();
        let whole = parse_all(body).await;
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
            assert_eq!(
                parse_in_pieces(body, size).await,
                whole,
                "pieces of {size} bytes"
            );
        }
    }

    #[tokio::test]
    async fn a_cr_at_the_end_of_one_read_and_an_lf_at_the_start_of_the_next_end_one_line() {
        let pieces = vec![
            b"data: a\r".to_vec(),
            b"\n\r".to_vec(),
            b"\ndata: b\n\n".to_vec(),
        ];
        assert_eq!(
            parse_pieces(pieces).await.unwrap(),
            vec![data("a"), data("b")]
        );
    }

    #[tokio::test]
    async fn an_event_without_data_is_not_dispatched_and_its_name_does_not_leak() {
        let body = b"event: ping\n\ndata: real\n\n";
        assert_eq!(parse_all(body).await, vec![data("real")]);
    }

    #[tokio::test]
    async fn an_unfinished_event_is_not_dispatched() {
        assert!(parse_all(b"data: {\"half\":").await.is_empty());
        assert!(
            parse_all(b"data: complete line but no blank line\n")
                .await
                .is_empty()
        );
    }

    #[tokio::test]
    async fn refuses_invalid_utf8_and_endless_lines() {
        assert_eq!(
            parse_pieces(vec![b"data: \xFF\xFE\n\n".to_vec()]).await,
            Err("a line of the event stream is not valid UTF-8".to_owned())
        );
        let big = vec![b'a'; MAX_LINE_BYTES / 2 + 1];
        assert_eq!(
            parse_pieces(vec![big.clone(), big]).await,
            Err(format!(
                "a line of the event stream is longer than {MAX_LINE_BYTES} bytes"
            ))
        );
        let mut ended = vec![b'a'; MAX_LINE_BYTES / 2 + 1];
        ended.push(b'\n');
        assert!(
            parse_pieces(vec![ended.clone(), ended]).await.is_ok(),
            "only one line is bounded, not the body"
        );
    }

    #[tokio::test]
    async fn refuses_an_event_whose_lines_never_end_it() {
        // Lines of 1 MiB, each short enough, never followed by the blank line that would dispatch them.
        let mut line = b"data: ".to_vec();
        line.extend(vec![b'a'; 1024 * 1024]);
        line.extend(b"\r\n");
        let endless = vec![line.clone(); MAX_EVENT_BYTES / (1024 * 1024) + 1];
        assert_eq!(
            parse_pieces(endless).await,
            Err(format!(
                "an event of the event stream is longer than {MAX_EVENT_BYTES} bytes"
            ))
        );
    }

    #[test]
    fn an_event_is_bounded_up_to_the_blank_line_that_ends_it_whatever_the_line_ends() {
        let line = vec![b'a'; 1024 * 1024];
        for end in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r", b"\r\n\n", b"\n\r\n"] {
            let mut event = line.clone();
            event.extend(end);
            let body = event.repeat(MAX_EVENT_BYTES / line.len() + 1);
            let mut bounds = Bounds::default();
            for piece in body.chunks(4093) {
                assert!(bounds.admit::<()>(piece).is_ok(), "events ended by {end:?}");
            }
        }
        // Lines that end, with no blank line between them, are one event.
        let mut event_line = line.clone();
        event_line.extend(b"\r\n");
        let mut bounds = Bounds::default();
        let overflowed = event_line
            .repeat(MAX_EVENT_BYTES / line.len() + 1)
            .chunks(4093)
            .any(|piece| matches!(bounds.admit::<()>(piece), Err(Read::EventTooLong)));
        assert!(overflowed);
    }
}
