//! Pure formatting for the page: the same text on the server and in the browser, so hydration matches.

use agent::view::{RunStatus, ToolCallStatus, ToolCallView};
use agent::wire::{DenialSource, PermissionDecision, Resolution, ToolErrorCode, ToolOutput};
use leptos::prelude::ServerFnError;
use serde_json::Value;

/// Whether a character would change how a card reads without being seen: the controls of text direction (an
/// `U+202E` shows `txt.kcab` as `back.txt`), characters that are invisible (zero-width spaces, a byte order mark, a
/// soft hyphen, the tag characters that can hide text, the blank fillers of Hangul, the joiner of graphemes, the
/// formatting marks of Mongolian, Khmer and musical notation, the separators of lines and paragraphs), and the
/// control characters other than a tab and a line feed, which a page shows as nothing or as a space (a carriage
/// return, an escape, the C1 controls). The joiners that emoji and some scripts need are not among them (see
/// [`stray_joiner`]).
fn hides_itself(c: char) -> bool {
    matches!(c,
        '\u{0000}'..='\u{0008}' | '\u{000B}'..='\u{001F}' | '\u{007F}'..='\u{009F}'
        | '\u{061C}' | '\u{00AD}' | '\u{034F}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}'
        | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{3164}'
        | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}' | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0000}'..='\u{E007F}')
}

/// Whether `c` is a joiner (`U+200C`, `U+200D`) that joins nothing after `previous`: at the start, or after a
/// character of ASCII, where no emoji or script uses one and it only hides between letters.
fn stray_joiner(previous: Option<char>, c: char) -> bool {
    matches!(c, '\u{200C}' | '\u{200D}') && previous.is_none_or(|previous| previous.is_ascii())
}

/// Whether `c`, after `previous`, is written out by [`visible`].
fn hidden_on_a_card(previous: Option<char>, c: char) -> bool {
    hides_itself(c) || smuggled_selector(previous, c) || stray_joiner(previous, c)
}

/// Whether `c`, a variation selector after `previous`, would carry something nobody sees rather than choose how
/// `previous` looks: a selector chooses a glyph of the one character before it, so one after another selector (or
/// at the start) is data, as is a selector of the supplementary range (`U+E0100`…, the ideographic variations)
/// after anything but a CJK ideograph. Runs of selectors can spell whole hidden messages after an emoji.
fn smuggled_selector(previous: Option<char>, c: char) -> bool {
    let is_selector = |c: char| matches!(c, '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}');
    let is_ideograph = |c: char| {
        matches!(c, '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}'
            | '\u{20000}'..='\u{3134F}')
    };
    match c {
        '\u{FE00}'..='\u{FE0F}' => previous.is_none_or(is_selector),
        '\u{E0100}'..='\u{E01EF}' => !previous.is_some_and(is_ideograph),
        _ => false,
    }
}

/// `text` with each character written out as `\u{…}` that `hidden(previous, c)` says would hide itself.
fn written_out(text: &str, mut hidden: impl FnMut(Option<char>, char) -> bool) -> String {
    let mut shown = String::with_capacity(text.len() + 16);
    let mut previous = None;
    for c in text.chars() {
        if hidden(previous, c) {
            shown.push_str(&format!("\\u{{{:04X}}}", u32::from(c)));
        } else {
            shown.push(c);
        }
        previous = Some(c);
    }
    shown
}

/// `text` with each character that would hide itself (see [`hides_itself`]), each variation selector that
/// chooses no glyph ([`smuggled_selector`]) and each joiner that joins nothing ([`stray_joiner`]) written out as
/// `\u{…}`, so that a card shows exactly what would run. A carriage return before a line feed ends a line, as a text
/// written on Windows (or in a mail) ends each: it stays.
pub fn visible(text: &str) -> String {
    text.split("\r\n")
        .map(|line| written_out(line, hidden_on_a_card))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A card's title (a path, a command) as [`visible`] shows text, but with every carriage return written out, one
/// before a line feed too: no path or command ends its lines so, and a path ending in one would show as the path
/// without it.
pub fn visible_title(text: &str) -> String {
    written_out(text, hidden_on_a_card)
}

/// Whether a character of prose (a message, the model's text, a tool's text result) would change how the text
/// around it reads without being seen: the controls that reorder text (embeddings, overrides, isolates) and the
/// tag characters, which can carry text nobody sees to the model. Prose keeps what cards write out only because a
/// card must show every character: the marks right-to-left writing needs (`U+200E`, `U+200F`, `U+061C`), the
/// zero-width space some scripts separate words with, joiners, the soft hyphen; and the tags of the three flags
/// that are emoji.
fn reorders_or_hides(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{E0000}'..='\u{E007F}')
}

/// The flags written with tags, the emoji of England, Scotland and Wales: a black flag, the region's code in tag
/// letters, a cancel tag. No other tag sequence is an emoji.
const TAG_FLAGS: [&str; 3] = [
    "\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}",
    "\u{1F3F4}\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}",
    "\u{1F3F4}\u{E0067}\u{E0062}\u{E0077}\u{E006C}\u{E0073}\u{E007F}",
];

/// Prose as the page shows it: each character that would reorder the text around it or hide text (see
/// [`reorders_or_hides`]), and each variation selector that chooses no glyph, written out as `\u{…}`, so that
/// `important\u{202E}txt.kcab` does not read as `importantback.txt`. The flags of England, Scotland and Wales stay
/// as they are; every other tag is written out, since tags can spell what no one sees.
pub fn visible_prose(text: &str) -> String {
    let mut shown = String::with_capacity(text.len() + 16);
    let mut rest = text;
    let mut previous = None;
    // Between flags, what is written out is decided a character at a time.
    while let Some(at) = rest.find('\u{1F3F4}') {
        let (before, from) = rest.split_at(at);
        shown.push_str(&prose_part(before, previous));
        let flag = TAG_FLAGS.iter().find(|flag| from.starts_with(*flag));
        let taken = flag.map_or('\u{1F3F4}'.len_utf8(), |flag| flag.len());
        shown.push_str(&from[..taken]);
        previous = from[..taken].chars().next_back();
        rest = &from[taken..];
    }
    shown.push_str(&prose_part(rest, previous));
    shown
}

/// A part of prose with no flag in it, after `previous`.
fn prose_part(text: &str, previous: Option<char>) -> String {
    let mut first = true;
    written_out(text, |before, c| {
        let before = if std::mem::take(&mut first) {
            previous
        } else {
            before
        };
        reorders_or_hides(c) || smuggled_selector(before, c)
    })
}

/// Whether `text` holds a character [`visible`] writes out.
pub fn has_hidden(text: &str) -> bool {
    text.split("\r\n").any(|line| {
        let mut previous = None;
        line.chars().any(|c| {
            let hidden = hidden_on_a_card(previous, c);
            previous = Some(c);
            hidden
        })
    })
}

/// JSON indented for reading, as the page shows a call's arguments or output: with its hidden characters written
/// out ([`visible`]). (An editor's text is [`pretty_json`], which parses back.)
pub fn shown_json(value: &Value) -> String {
    visible(&pretty_json(value))
}

/// JSON indented for reading.
pub fn pretty_json(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// A size a person reads: bytes, KiB or MiB.
pub fn byte_size(bytes: u64) -> String {
    match bytes {
        1 => "1 byte".to_owned(),
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

/// `1 line`, `2 lines`.
pub fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, from milliseconds since the Unix epoch.
pub fn date_time(ms: u64) -> String {
    let (year, month, day) = agent::dates::civil_from_days((ms / 86_400_000) as i64);
    let time = clock(ms);
    format!("{year:04}-{month:02}-{day:02} {}", &time[..8])
}

/// `HH:MM:SS.mmm` in UTC, from milliseconds since the Unix epoch.
pub fn clock(ms: u64) -> String {
    let day_ms = ms % 86_400_000;
    let (h, m, s, milli) = (
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000,
    );
    format!("{h:02}:{m:02}:{s:02}.{milli:03}")
}

/// The time left before a pending approval times out, as `m:ss left`.
pub fn countdown(expires_at: u64, now: u64) -> String {
    if now >= expires_at {
        return "timing out…".to_owned();
    }
    let left = (expires_at - now).div_ceil(1000);
    format!("{}:{:02} left", left / 60, left % 60)
}

/// How a tool call of a run that stands at `run` stands, as a CSS class and a label a person reads.
pub fn call_status(call: &ToolCallView, run: RunStatus) -> (&'static str, String) {
    let approved = matches!(call.resolution, Some(Resolution::Approved { .. }));
    match call.status_in(run) {
        ToolCallStatus::Unfinished if approved => {
            ("failed", "approved · no result: its run ended".to_owned())
        }
        ToolCallStatus::Unfinished => ("failed", "no result: its run ended".to_owned()),
        ToolCallStatus::AwaitingApproval => ("waiting", "waiting for approval".to_owned()),
        ToolCallStatus::Interrupted => ("waiting", "waiting for a resume".to_owned()),
        ToolCallStatus::Running if approved => ("running", "approved · running".to_owned()),
        ToolCallStatus::Running => ("running", "running".to_owned()),
        ToolCallStatus::Succeeded if approved => ("ok", "approved · done".to_owned()),
        ToolCallStatus::Succeeded => ("ok", "done".to_owned()),
        ToolCallStatus::Failed => match (&call.resolution, &call.output) {
            (Some(Resolution::Denied { source, .. }), _) => match source {
                DenialSource::User => ("denied", "denied by you".to_owned()),
                DenialSource::Timeout => ("denied", "timed out".to_owned()),
                DenialSource::Abort => ("denied", "aborted".to_owned()),
            },
            // Approved, then refused when its turn came: its file or its tool changed since the card, or a deny rule
            // was added meanwhile (the result says which). The person's approval stands in the record; the call
            // did not run.
            (
                _,
                Some(ToolOutput::Error {
                    code: ToolErrorCode::PermissionDenied,
                    ..
                }),
            ) if approved => ("denied", "approved · not run".to_owned()),
            (
                _,
                Some(ToolOutput::Error {
                    code: ToolErrorCode::PermissionDenied,
                    ..
                }),
            ) => ("denied", "denied by policy".to_owned()),
            // Approved, then its run was aborted before the call began: it did not run either.
            (
                _,
                Some(ToolOutput::Error {
                    code: ToolErrorCode::ApprovalDenied,
                    ..
                }),
            ) if approved => ("denied", "approved · not run".to_owned()),
            (_, Some(ToolOutput::Error { code, .. })) if approved => {
                ("failed", format!("approved · failed · {}", code.as_str()))
            }
            (_, Some(ToolOutput::Error { code, .. })) => {
                ("failed", format!("failed · {}", code.as_str()))
            }
            _ => ("failed", "failed".to_owned()),
        },
    }
}

/// The policy's verdict, briefly.
pub fn permission_label(permission: &PermissionDecision) -> &'static str {
    match permission {
        PermissionDecision::Allow { .. } => "allowed",
        PermissionDecision::Ask { .. } => "asks",
        PermissionDecision::Deny { .. } => "denied",
    }
}

/// The most of one result the transcript shows; the run's events keep all of it.
pub const OUTPUT_SHOWN: usize = 64 * 1024;

/// What a tool gave back, for the transcript: a long result's head and tail.
pub fn output_text(output: &ToolOutput) -> String {
    // Cut first, then write out what hides (a cut through `\u{202E}` would leave half of it, one through a flag
    // its tags).
    let (text, shown): (String, fn(&str) -> String) = match output {
        ToolOutput::Ok {
            content: Value::String(text),
        } => (text.clone(), visible_prose),
        // A result is what a tool said, prose in JSON: what writing needs stays (the call's arguments, which ran,
        // are written out as a card writes them).
        ToolOutput::Ok { content } => (pretty_json(content), visible_prose),
        ToolOutput::Error { code, message } => {
            (format!("{}: {message}", code.as_str()), visible_prose)
        }
    };
    if text.len() <= OUTPUT_SHOWN {
        return shown(&text);
    }
    let mut head = OUTPUT_SHOWN / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - OUTPUT_SHOWN / 2;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} of {} bytes not shown; the run's events have all of it ...]\n{}",
        shown(&text[..head]),
        tail - head,
        text.len(),
        shown(&text[tail..])
    )
}

/// What a failed server function tells a person: the server's own message, without the library's wording around
/// it. A request the server refused before any function ran (a body over the size limit, a missing token) is
/// answered with the API's JSON error, which the server functions' client cannot read and reports with the body
/// quoted; the body's `error` is the message.
pub fn server_said(error: &ServerFnError) -> String {
    match error {
        ServerFnError::ServerError(message) => message.clone(),
        ServerFnError::Request(message) => format!("the server could not be reached ({message})"),
        ServerFnError::Deserialization(text) => api_body_in(text)
            .and_then(|body| body.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| error.to_string()),
        other => other.to_string(),
    }
}

/// Whether a server function was refused for want of a login (the API's `UNAUTHORIZED`): the page's login was
/// logged out, in this tab or another, or its cookie expired.
pub fn needs_login(error: &ServerFnError) -> bool {
    matches!(error, ServerFnError::Deserialization(text)
        if api_body_in(text).is_some_and(|body| body.get("code").and_then(Value::as_str) == Some("UNAUTHORIZED")))
}

/// An API error body quoted in `text` (as the client quotes it: a Rust string literal, which reads as a JSON string
/// when it holds no `\u{…}` escapes) or written in it as it is.
fn api_body_in(text: &str) -> Option<Value> {
    let quoted = text.find("\"{").and_then(|start| {
        let end = text.rfind("}\"")?;
        serde_json::from_str::<String>(text.get(start..end + 2)?).ok()
    });
    let body = match quoted {
        Some(body) => body,
        None => text.get(text.find('{')?..=text.rfind('}')?)?.to_owned(),
    };
    serde_json::from_str(&body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_error_reads_as_the_servers_own_message() {
        // What the server functions' client made of a 413 with the API's JSON body, as the page showed it.
        let refused = ServerFnError::Deserialization(
            r#"Invalid format: missing delimiter in "{\"code\":\"PAYLOAD_TOO_LARGE\",\"error\":\"The request body is larger than 65536 bytes.\",\"ok\":false}""#
                .into(),
        );
        assert_eq!(
            server_said(&refused),
            "The request body is larger than 65536 bytes."
        );
        assert!(!needs_login(&refused));
        let logged_out = ServerFnError::Deserialization(
            r#"Invalid format: missing delimiter in "{\"code\":\"UNAUTHORIZED\",\"error\":\"This server needs its access token: send Authorization: Bearer <token>, or log in at /login.\",\"ok\":false}""#
                .into(),
        );
        assert!(needs_login(&logged_out));
        assert_eq!(
            server_said(&ServerFnError::new("No pending approval call_1 in run r.")),
            "No pending approval call_1 in run r."
        );
        assert_eq!(
            server_said(&ServerFnError::Request("Failed to fetch".into())),
            "the server could not be reached (Failed to fetch)"
        );
        let unreadable = ServerFnError::Deserialization("expected value at line 1".into());
        assert_eq!(server_said(&unreadable), unreadable.to_string());
    }

    #[test]
    fn prose_writes_out_what_turns_it_around_or_hides_in_it_and_keeps_what_scripts_need() {
        assert_eq!(
            visible_prose("delete important\u{202E}txt.kcab"),
            "delete important\\u{202E}txt.kcab"
        );
        assert_eq!(
            visible_prose("a\u{2067}b\u{2069}c\u{202A}d\u{202C}"),
            "a\\u{2067}b\\u{2069}c\\u{202A}d\\u{202C}"
        );
        // Tags that spell a hidden "hi" are written out, alone or after a black flag.
        assert_eq!(
            visible_prose("ok\u{E0068}\u{E0069}"),
            "ok\\u{E0068}\\u{E0069}"
        );
        let smuggled: String = std::iter::once('\u{1F3F4}')
            .chain(
                "ignoreall"
                    .chars()
                    .map(|c| char::from_u32(0xE0000 + u32::from(c)).unwrap()),
            )
            .chain(['\u{E007F}'])
            .collect();
        assert!(visible_prose(&smuggled).starts_with("\u{1F3F4}\\u{E0069}\\u{E0067}"));
        // The marks and spaces of right-to-left and Thai writing, joiners and the flags of the nations of Britain stay.
        let scotland = "\u{1F3F4}\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}";
        for plain in [
            "שלום\u{200F} world",
            "ภาษา\u{200B}ไทย",
            "👩\u{200D}💻 co\u{00AD}operate",
            scotland,
            "🏴 a black flag alone",
        ] {
            assert_eq!(visible_prose(plain), plain);
        }
        assert_eq!(
            visible_prose(&format!("{scotland}\u{202E}")),
            format!("{scotland}\\u{{202E}}")
        );
        for flag in TAG_FLAGS {
            assert_eq!(
                visible_prose(&format!("{flag}{flag}!")),
                format!("{flag}{flag}!")
            );
        }
        // Short runs of tags behind black flags, one after another, are not flags: they spell "ignore previous".
        let tags = |word: &str| -> String {
            word.chars()
                .map(|c| char::from_u32(0xE0000 + u32::from(c)).unwrap())
                .collect()
        };
        let chained = format!(
            "\u{1F3F4}{}\u{E007F}\u{1F3F4}{}\u{E007F}",
            tags("ignore"),
            tags("previo")
        );
        let shown = visible_prose(&chained);
        assert!(
            shown
                .chars()
                .all(|c| !('\u{E0000}'..='\u{E007F}').contains(&c)),
            "{shown}"
        );
        assert!(
            shown.starts_with("\u{1F3F4}\\u{E0069}\\u{E0067}"),
            "{shown}"
        );
    }

    /// A card shows a text as it is: control characters other than a tab and a line feed (a page shows them as
    /// nothing, or as a space), the blank fillers and formatting marks no font draws, and a joiner that joins nothing
    /// are written out; the joiners of emoji and scripts, tabs and line feeds stay.
    #[test]
    fn a_card_writes_out_controls_blank_fillers_and_stray_joiners() {
        for (hidden, shown) in [
            ("echo hi\rrm -rf ~", "echo hi\\u{000D}rm -rf ~"),
            (
                "a lone\r\r\nbefore a line feed",
                "a lone\\u{000D}\r\nbefore a line feed",
            ),
            ("a\u{1B}[2Kb", "a\\u{001B}[2Kb"),
            ("a\u{0085}b\u{007F}", "a\\u{0085}b\\u{007F}"),
            (
                "x\u{3164}y\u{115F}\u{1160}\u{FFA0}",
                "x\\u{3164}y\\u{115F}\\u{1160}\\u{FFA0}",
            ),
            (
                "a\u{034F}b\u{180B}c\u{17B4}d\u{1D173}",
                "a\\u{034F}b\\u{180B}c\\u{17B4}d\\u{1D173}",
            ),
            ("line\u{2028}two", "line\\u{2028}two"),
            ("pay\u{200D}pal\u{200C}.com", "pay\\u{200D}pal\\u{200C}.com"),
            ("\u{200D}start", "\\u{200D}start"),
        ] {
            assert_eq!(visible(hidden), shown, "{hidden:?}");
            assert!(has_hidden(hidden), "{hidden:?}");
        }
        for kept in [
            "tab\tand\nline feed",
            "a mail's lines\r\nend with\r\nCRLF",
            "👩\u{200D}💻",
            "क्\u{200D}ष",
            "می\u{200C}خواهم",
            "plain text, 漢字 and emoji 😀",
        ] {
            assert_eq!(visible(kept), kept, "{kept:?}");
            assert!(!has_hidden(kept), "{kept:?}");
        }
        // A title keeps no line's end of that kind: a path ending in one would read as the path without it.
        assert_eq!(visible_title("notes.txt\r\n"), "notes.txt\\u{000D}\n");
    }

    #[test]
    fn a_variation_selector_is_kept_where_it_chooses_a_glyph_and_written_out_where_it_carries_data()
    {
        for kept in ["❤\u{FE0F} ok", "☺\u{FE0E}", "葛\u{E0100}城市"] {
            assert_eq!(visible(kept), kept);
            assert_eq!(visible_prose(kept), kept);
            assert!(!has_hidden(kept), "{kept}");
        }
        // Bytes hidden as selectors: a run after an emoji, a supplementary one after a letter, one at the start.
        for (hidden, shown) in [
            ("😀\u{FE0F}\u{FE01}\u{FE02}", "😀\u{FE0F}\\u{FE01}\\u{FE02}"),
            ("a\u{E0101}b", "a\\u{E0101}b"),
            ("\u{FE00}x", "\\u{FE00}x"),
        ] {
            assert_eq!(visible(hidden), shown);
            assert_eq!(visible_prose(hidden), shown);
            assert!(has_hidden(hidden), "{hidden}");
        }
    }

    #[test]
    fn characters_that_hide_themselves_are_written_out() {
        assert_eq!(
            visible("important\u{202E}txt.kcab"),
            "important\\u{202E}txt.kcab"
        );
        assert_eq!(visible("a\u{200B}b\u{E0041}"), "a\\u{200B}b\\u{E0041}");
        // What reads as it is stays: other scripts, and emoji joined by their joiner.
        let plain = "straße שלום 👩\u{200D}💻";
        assert_eq!(visible(plain), plain);
        assert!(!has_hidden(plain) && has_hidden("\u{2066}x"));
    }
    use agent::ids::ToolCallId;
    use agent::wire::{ApprovalRequest, ApprovalSource, DecisionScope};
    use serde_json::json;

    fn call() -> ToolCallView {
        ToolCallView {
            id: ToolCallId::parse("c").unwrap(),
            name: "delete_file".into(),
            arguments: json!({"path": "a"}),
            permission: PermissionDecision::Ask {
                reason: "destructive".into(),
            },
            approval: None,
            resolution: None,
            executed_arguments: None,
            output: None,
            duration_ms: None,
            interrupt: None,
        }
    }

    #[test]
    fn sizes_and_dates() {
        assert_eq!(byte_size(5), "5 bytes");
        assert_eq!(byte_size(1), "1 byte");
        assert_eq!(byte_size(0), "0 bytes");
        assert_eq!(counted(1, "line", "lines"), "1 line");
        assert_eq!(counted(3, "line", "lines"), "3 lines");
        assert_eq!(byte_size(2048), "2.0 KiB");
        assert_eq!(byte_size(3 * 1_048_576), "3.0 MiB");
        assert_eq!(date_time(0), "1970-01-01 00:00:00");
        assert_eq!(
            date_time(1_764_547_200_000 + 3_723_000),
            "2025-12-01 01:02:03"
        );
    }

    #[test]
    fn clocks_and_countdowns() {
        assert_eq!(clock(0), "00:00:00.000");
        assert_eq!(clock(86_400_000 + 3_723_045), "01:02:03.045");
        assert_eq!(countdown(120_000, 0), "2:00 left");
        assert_eq!(countdown(120_000, 1), "2:00 left");
        assert_eq!(countdown(120_000, 61_000), "0:59 left");
        assert_eq!(countdown(120_000, 120_000), "timing out…");
    }

    #[test]
    fn a_call_says_how_it_was_resolved() {
        let mut waiting = call();
        waiting.approval = Some(ApprovalRequest {
            run_id: "r".parse().unwrap(),
            tool_call_id: "c".parse().unwrap(),
            tool_name: "delete_file".into(),
            arguments: json!({}),
            reason: "destructive".into(),
            choices: Default::default(),
            requested_at: 0,
            expires_at: 1,
            preview: None,
        });
        assert_eq!(
            call_status(&waiting, RunStatus::Running).1,
            "waiting for approval"
        );

        let denied = |source| {
            let mut c = waiting.clone();
            c.resolution = Some(Resolution::Denied {
                source,
                reason: "r".into(),
            });
            c.output = Some(ToolOutput::error(ToolErrorCode::ApprovalDenied, "r"));
            call_status(&c, RunStatus::Running).1
        };
        assert_eq!(denied(DenialSource::User), "denied by you");
        assert_eq!(denied(DenialSource::Timeout), "timed out");
        assert_eq!(denied(DenialSource::Abort), "aborted");

        let mut approved = waiting.clone();
        approved.resolution = Some(Resolution::Approved {
            source: ApprovalSource::User,
            scope: DecisionScope::Once,
            reason: None,
            edited_arguments: None,
        });
        assert_eq!(
            call_status(&approved, RunStatus::Running).1,
            "approved · running"
        );
        approved.output = Some(ToolOutput::Ok { content: json!({}) });
        assert_eq!(
            call_status(&approved, RunStatus::Running).1,
            "approved · done"
        );
        approved.output = Some(ToolOutput::error(ToolErrorCode::NotFound, "gone"));
        assert_eq!(
            call_status(&approved, RunStatus::Running).1,
            "approved · failed · NOT_FOUND"
        );
        // Approved, then refused when it came to run (its file changed since the card): not a denial of the policy's.
        approved.output = Some(ToolOutput::error(
            ToolErrorCode::PermissionDenied,
            "write_file was not run: what it acts on changed after approval was asked for it",
        ));
        assert_eq!(
            call_status(&approved, RunStatus::Running).1,
            "approved · not run"
        );
        // Approved, then its run was aborted before the call began: it did not run, it did not fail.
        approved.output = Some(ToolOutput::error(
            ToolErrorCode::ApprovalDenied,
            "The run was aborted before this call ran.",
        ));
        assert_eq!(
            call_status(&approved, RunStatus::Running).1,
            "approved · not run"
        );

        // A call its run ended without a result for (the batch of a run that failed on a repeated call) is not
        // running any more.
        let mut left = approved.clone();
        left.output = None;
        assert_eq!(
            call_status(&left, RunStatus::Running).1,
            "approved · running"
        );
        assert_eq!(
            call_status(&left, RunStatus::Failed).1,
            "approved · no result: its run ended"
        );
        assert_eq!(
            call_status(&call(), RunStatus::Failed).1,
            "no result: its run ended"
        );
        assert_eq!(
            call_status(&approved, RunStatus::Failed).1,
            "approved · not run"
        );

        let mut policy = call();
        policy.output = Some(ToolOutput::error(ToolErrorCode::PermissionDenied, "no"));
        assert_eq!(
            call_status(&policy, RunStatus::Running).1,
            "denied by policy"
        );
    }

    #[test]
    fn a_text_result_shows_as_text_and_a_long_one_as_its_head_and_tail() {
        assert_eq!(
            output_text(&ToolOutput::Ok {
                content: json!("Echo: hi")
            }),
            "Echo: hi"
        );
        assert_eq!(
            output_text(&ToolOutput::Ok {
                content: json!({"a": 1})
            }),
            "{\n  \"a\": 1\n}"
        );
        let long = format!("HEAD{}TAIL", "x".repeat(1_000_000));
        let shown = output_text(&ToolOutput::Ok {
            content: Value::String(long.clone()),
        });
        assert!(shown.len() < OUTPUT_SHOWN + 200);
        assert!(shown.starts_with("HEADx") && shown.ends_with("xTAIL"));
        assert!(shown.contains(&format!("of {} bytes not shown", long.len())));
    }
}
