//! The scripted model: the offline default. Deterministic, no key, no network.
//!
//! It understands a few plain requests and turns them into tool calls:
//!
//! | request | tool call |
//! | --- | --- |
//! | `list files` / `list files in DIR` | `list_files {path?}` |
//! | `read PATH` | `read_file {path}` |
//! | `write PATH: TEXT` | `write_file {path, content}` |
//! | `delete PATH` | `delete_file {path}` |
//! | `run COMMAND [ARGS...]` | `run_command {command, args}` |
//! | `call TOOL [{JSON}]` | any tool, with the JSON as its arguments (`{}` when absent) |
//!
//! Several requests joined with ` and ` become parallel tool calls in one step. After the tool results come back it
//! answers with a summary of what ran, what was denied and why. Anything else gets an answer that explains what it
//! can do. Text is streamed in several deltas.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::{Model, ModelChunk, ModelRequest, ModelStream};
use crate::ids::ToolCallId;
use crate::wire::{Message, ToolCall, ToolErrorCode, ToolOutput};

const VERBS: [&str; 6] = ["list", "read", "write", "delete", "run", "call"];

/// The answer to anything the model does not understand.
pub const HELP: &str = "I am toolgate's scripted model, so I understand a few plain requests: `list files`, `read PATH`, `write PATH: TEXT`, `delete PATH`, `run COMMAND` and `call TOOL {JSON arguments}` (any tool). Join several with ` and ` to run them in parallel, for example `write notes.txt: hello and list files`.";

#[derive(Clone, Debug, Default)]
pub struct ScriptedModel {
    /// A pause before each text delta, to make streaming visible in a demo. Zero by default.
    pub delta_delay: Duration,
}

impl ScriptedModel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_delta_delay(delta_delay: Duration) -> Self {
        Self { delta_delay }
    }
}

impl Model for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let chunks = next_step(request.messages);
        let delay = self.delta_delay;
        futures::stream::iter(chunks)
            .then(move |chunk| async move {
                if matches!(chunk, ModelChunk::Text(_)) && !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(chunk)
            })
            .boxed()
    }
}

/// The whole next step for a conversation.
fn next_step(messages: &[Message]) -> Vec<ModelChunk> {
    let mut chunks = match messages.last() {
        Some(Message::Tool { .. }) => text_chunks(&summarize(messages)),
        Some(Message::User { content }) => match parse_request(content) {
            Some(calls) => {
                let first = count_tool_calls(messages) + 1;
                calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, arguments))| {
                        ModelChunk::ToolCall(ToolCall {
                            id: ToolCallId::parse(format!("call_{}", first + i))
                                .expect("call_N is a valid id"),
                            name,
                            arguments: arguments.to_string(),
                        })
                    })
                    .collect()
            }
            None => text_chunks(HELP),
        },
        _ => text_chunks(HELP),
    };
    let reason = if chunks.iter().any(|c| matches!(c, ModelChunk::ToolCall(_))) {
        "tool_calls"
    } else {
        "stop"
    };
    chunks.push(ModelChunk::Finish(reason.to_owned()));
    chunks
}

fn count_tool_calls(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|message| match message {
            Message::Assistant { tool_calls, .. } => tool_calls.len(),
            _ => 0,
        })
        .sum()
}

/// Splits text into deltas of a few words each, keeping every character.
fn text_chunks(text: &str) -> Vec<ModelChunk> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut words = 0;
    for piece in text.split_inclusive(' ') {
        current.push_str(piece);
        words += 1;
        if words == 4 {
            chunks.push(ModelChunk::Text(std::mem::take(&mut current)));
            words = 0;
        }
    }
    if !current.is_empty() {
        chunks.push(ModelChunk::Text(current));
    }
    chunks
}

/// Splits a request at each ` and ` that is followed by a verb, so `write a.txt: salt and pepper` stays whole, and
/// that is outside JSON (`call t {"text": "a and call b"}` is one call).
fn split_clauses(text: &str) -> Vec<&str> {
    let lower = text.to_ascii_lowercase();
    let mut clauses = Vec::new();
    let mut start = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find(" and ") {
        let at = search + found;
        let next = lower[at + 5..].trim_start();
        let next_word = next.split_whitespace().next().unwrap_or("");
        if VERBS.contains(&next_word) && !inside_json(&text[start..at]) {
            clauses.push(&text[start..at]);
            start = at + 5;
        }
        search = at + 5;
    }
    clauses.push(&text[start..]);
    clauses
}

/// Whether `clause` ends inside a JSON value: an open bracket or string.
fn inside_json(clause: &str) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for c in clause.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_string = false,
            (true, false, _) => {}
            (false, _, '"') if depth > 0 => in_string = true,
            (false, _, '{' | '[') => depth += 1,
            (false, _, '}' | ']') => depth = depth.saturating_sub(1),
            (false, _, _) => {}
        }
    }
    depth > 0 || in_string
}

/// Splits a command line into words, honouring single and double quotes.
fn split_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(current);
    }
    Some(words)
}

fn parse_clause(clause: &str) -> Option<(String, Value)> {
    let (name, arguments) = parse_builtin_clause(clause)?;
    Some((name.to_owned(), arguments))
}

/// `call TOOL [{JSON}]`: any tool with any arguments.
fn parse_call(rest: &str) -> Option<(String, Value)> {
    let (tool, arguments) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(tool, arguments)| (tool, arguments.trim()));
    if tool.is_empty() {
        return None;
    }
    let arguments = if arguments.is_empty() {
        json!({})
    } else {
        serde_json::from_str(arguments).ok()?
    };
    Some((tool.to_owned(), arguments))
}

fn parse_builtin_clause(clause: &str) -> Option<(&'static str, Value)> {
    let clause = clause.trim();
    let (verb, rest) = clause
        .split_once(char::is_whitespace)
        .map_or((clause, ""), |(verb, rest)| (verb, rest.trim()));
    match verb.to_ascii_lowercase().as_str() {
        "list" => {
            let mut rest = rest;
            for word in ["files", "file"] {
                if let Some(after) = strip_word(rest, word) {
                    rest = after;
                    break;
                }
            }
            for word in ["in", "under"] {
                if let Some(after) = strip_word(rest, word) {
                    rest = after;
                    break;
                }
            }
            Some(if rest.is_empty() {
                ("list_files", json!({}))
            } else {
                ("list_files", json!({ "path": rest }))
            })
        }
        "read" if !rest.is_empty() => Some(("read_file", json!({ "path": rest }))),
        "delete" if !rest.is_empty() => Some(("delete_file", json!({ "path": rest }))),
        "write" => {
            let (path, text) = rest.split_once(':')?;
            let path = path.trim();
            if path.is_empty() {
                return None;
            }
            let text = text.strip_prefix(' ').unwrap_or(text);
            Some(("write_file", json!({ "path": path, "content": text })))
        }
        "run" => {
            let mut words = split_words(rest)?.into_iter();
            let command = words.next()?;
            let args: Vec<String> = words.collect();
            Some(if args.is_empty() {
                ("run_command", json!({ "command": command }))
            } else {
                ("run_command", json!({ "command": command, "args": args }))
            })
        }
        _ => None,
    }
}

/// `rest` without a leading `word` (case-insensitive, whole word).
fn strip_word<'a>(rest: &'a str, word: &str) -> Option<&'a str> {
    let (first, after) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(first, after)| (first, after.trim_start()));
    first.eq_ignore_ascii_case(word).then_some(after)
}

/// The tool calls a request asks for, or `None` when any part of it is not understood.
fn parse_request(text: &str) -> Option<Vec<(String, Value)>> {
    split_clauses(text)
        .into_iter()
        .map(|clause| {
            let clause = clause.trim();
            match clause.split_once(char::is_whitespace) {
                Some((verb, rest)) if verb.eq_ignore_ascii_case("call") => parse_call(rest.trim()),
                _ => parse_clause(clause),
            }
        })
        .collect()
}

fn shorten(text: &str, max: usize) -> String {
    let text = text.trim_end();
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// One line about one tool result.
fn describe(call: Option<&ToolCall>, tool_name: &str, output: &ToolOutput) -> String {
    let args = call.map(ToolCall::arguments_value).unwrap_or(Value::Null);
    match output {
        // A person changed the call before approving it: say so, and describe what really ran.
        ToolOutput::Ok { content } if content.get("editedArguments").is_some() => {
            let edited = &content["editedArguments"];
            format!(
                "{tool_name} ran with arguments edited by a person ({edited}): {}",
                describe_ok(tool_name, edited, &content["result"])
            )
        }
        ToolOutput::Ok { content } => describe_ok(tool_name, &args, content),
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message,
        } => {
            let why = message
                .split(" The action was not performed.")
                .next()
                .unwrap_or(message);
            format!("{tool_name} was not run because it was denied: {why}")
        }
        ToolOutput::Error {
            code: ToolErrorCode::PermissionDenied,
            message,
        } => format!("{tool_name} was not run because the policy denies it: {message}"),
        ToolOutput::Error { code, message } => {
            format!("{tool_name} failed ({}): {message}", code.as_str())
        }
    }
}

/// `1 byte`, `2 bytes`.
fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// One line about a successful call that ran with `args`.
fn describe_ok(tool_name: &str, args: &Value, content: &Value) -> String {
    let arg = |field: &str| {
        args.get(field)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    match tool_name {
        "list_files" => {
            let names: Vec<&str> = content["entries"]
                .as_array()
                .map(|entries| entries.iter().filter_map(|e| e["name"].as_str()).collect())
                .unwrap_or_default();
            let place = match content["path"].as_str().unwrap_or(".") {
                "." | "" => "the workspace".to_owned(),
                place => place.to_owned(),
            };
            if names.is_empty() {
                format!("list_files found nothing in {place}.")
            } else {
                let shown: Vec<&str> = names.iter().copied().take(20).collect();
                let more = names.len().saturating_sub(shown.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                format!(
                    "list_files found {} in {place}: {}{more}.",
                    counted(names.len() as u64, "entry", "entries"),
                    shown.join(", ")
                )
            }
        }
        "read_file" => format!(
            "read_file read {}: \"{}\"",
            arg("path"),
            shorten(content["content"].as_str().unwrap_or(""), 400)
        ),
        "write_file" => format!(
            "write_file wrote {} to {}.",
            counted(
                content["bytes"].as_u64().unwrap_or_default(),
                "byte",
                "bytes"
            ),
            content["path"].as_str().unwrap_or("the file")
        ),
        "delete_file" => format!("delete_file deleted {}.", arg("path")),
        "run_command" => {
            let stdout = shorten(content["stdout"].as_str().unwrap_or(""), 400);
            let exit = &content["exitCode"];
            if stdout.is_empty() {
                format!(
                    "run_command ran {} (exit code {exit}) with no output.",
                    arg("command")
                )
            } else {
                format!(
                    "run_command ran {} (exit code {exit}): {stdout}",
                    arg("command")
                )
            }
        }
        other => {
            let text = match content {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            format!("{other} returned: {}", shorten(&text, 400))
        }
    }
}

/// A summary of the latest batch of tool results.
fn summarize(messages: &[Message]) -> String {
    let batch_start = messages
        .iter()
        .rposition(|m| !matches!(m, Message::Tool { .. }))
        .map_or(0, |i| i + 1);
    let calls: Vec<&ToolCall> = match batch_start.checked_sub(1).map(|i| &messages[i]) {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls.iter().collect(),
        _ => Vec::new(),
    };
    let lines: Vec<String> = messages[batch_start..]
        .iter()
        .filter_map(|message| match message {
            Message::Tool {
                tool_call_id,
                tool_name,
                output,
            } => {
                let call = calls.iter().copied().find(|c| &c.id == tool_call_id);
                Some(describe(call, tool_name, output))
            }
            _ => None,
        })
        .collect();
    match lines.as_slice() {
        [one] => one.clone(),
        many => format!(
            "Here is what happened:\n{}",
            many.iter()
                .map(|l| format!("- {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::approval_denied_message;

    fn user(text: &str) -> Vec<Message> {
        vec![Message::User {
            content: text.into(),
        }]
    }

    fn calls(chunks: &[ModelChunk]) -> Vec<(String, Value)> {
        chunks
            .iter()
            .filter_map(|c| match c {
                ModelChunk::ToolCall(call) => Some((call.name.clone(), call.arguments_value())),
                _ => None,
            })
            .collect()
    }

    fn text(chunks: &[ModelChunk]) -> String {
        chunks
            .iter()
            .filter_map(|c| match c {
                ModelChunk::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn plain_requests_become_tool_calls() {
        let cases = [
            ("list files", ("list_files", json!({}))),
            (
                "List files in docs",
                ("list_files", json!({"path": "docs"})),
            ),
            (
                "read notes.txt",
                ("read_file", json!({"path": "notes.txt"})),
            ),
            (
                "write a.txt: salt and pepper",
                (
                    "write_file",
                    json!({"path": "a.txt", "content": "salt and pepper"}),
                ),
            ),
            (
                "delete old.txt",
                ("delete_file", json!({"path": "old.txt"})),
            ),
            (
                "run echo 'hello world' x",
                (
                    "run_command",
                    json!({"command": "echo", "args": ["hello world", "x"]}),
                ),
            ),
            ("run ls", ("run_command", json!({"command": "ls"}))),
        ];
        for (request, (tool, args)) in cases {
            let step = next_step(&user(request));
            assert_eq!(calls(&step), vec![(tool.to_owned(), args)], "{request}");
            assert_eq!(step.last(), Some(&ModelChunk::Finish("tool_calls".into())));
        }
    }

    #[test]
    fn call_drives_any_tool_with_json_arguments() {
        let step = next_step(&user(
            r#"call mcp__fs__write_file {"path": "a.txt", "content": "salt and call pepper"} and call mcp__time__now"#,
        ));
        assert_eq!(
            calls(&step),
            vec![
                (
                    "mcp__fs__write_file".to_owned(),
                    json!({"path": "a.txt", "content": "salt and call pepper"})
                ),
                ("mcp__time__now".to_owned(), json!({})),
            ]
        );
        let step = next_step(&user("call x {not json} and list files"));
        assert!(calls(&step).is_empty());
        assert_eq!(text(&step), HELP);
        let step = next_step(&user("list files and call echo {\"m\": 1}"));
        let names: Vec<String> = calls(&step).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["list_files", "echo"]);
    }

    #[test]
    fn requests_joined_with_and_become_parallel_calls() {
        let step = next_step(&user("delete a.txt and delete b.txt and list files"));
        let names: Vec<String> = calls(&step).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["delete_file", "delete_file", "list_files"]);
        let ids: Vec<String> = step
            .iter()
            .filter_map(|c| match c {
                ModelChunk::ToolCall(call) => Some(call.id.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(ids, ["call_1", "call_2", "call_3"]);
    }

    #[test]
    fn anything_else_gets_help_streamed_in_several_deltas() {
        for request in ["hello", "write no-colon", "read", "run 'unclosed"] {
            let step = next_step(&user(request));
            assert!(calls(&step).is_empty(), "{request}");
            assert_eq!(text(&step), HELP);
            assert!(step.len() > 3, "streamed in several deltas");
        }
    }

    #[test]
    fn a_result_is_told_in_words_that_count_right() {
        let listed = |path: &str, names: &[&str]| {
            let entries: Vec<Value> = names.iter().map(|name| json!({"name": name})).collect();
            describe_ok(
                "list_files",
                &json!({}),
                &json!({"path": path, "entries": entries}),
            )
        };
        assert_eq!(
            listed(".", &[]),
            "list_files found nothing in the workspace."
        );
        assert_eq!(
            listed(".", &["a.txt"]),
            "list_files found 1 entry in the workspace: a.txt."
        );
        assert_eq!(
            listed("src", &["a.rs", "b.rs"]),
            "list_files found 2 entries in src: a.rs, b.rs."
        );
        let wrote = |bytes: u64| {
            describe_ok(
                "write_file",
                &json!({}),
                &json!({"path": "a.txt", "bytes": bytes}),
            )
        };
        assert_eq!(wrote(1), "write_file wrote 1 byte to a.txt.");
        assert_eq!(wrote(0), "write_file wrote 0 bytes to a.txt.");
    }

    #[test]
    fn after_results_it_says_what_ran_and_what_was_denied_and_why() {
        let call = |id: &str, name: &str, args: Value| ToolCall {
            id: ToolCallId::parse(id).unwrap(),
            name: name.into(),
            arguments: args.to_string(),
        };
        let messages = vec![
            Message::User {
                content: "write a.txt: hi and delete b.txt".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![
                    call(
                        "call_1",
                        "write_file",
                        json!({"path": "a.txt", "content": "hi"}),
                    ),
                    call("call_2", "delete_file", json!({"path": "b.txt"})),
                ],
            },
            Message::Tool {
                tool_call_id: ToolCallId::parse("call_1").unwrap(),
                tool_name: "write_file".into(),
                output: ToolOutput::Ok {
                    content: json!({"path": "a.txt", "bytes": 2}),
                },
            },
            Message::Tool {
                tool_call_id: ToolCallId::parse("call_2").unwrap(),
                tool_name: "delete_file".into(),
                output: ToolOutput::error(
                    ToolErrorCode::ApprovalDenied,
                    approval_denied_message("The user denied this tool call: keep it"),
                ),
            },
        ];
        let answer = text(&next_step(&messages));
        assert_eq!(
            answer,
            "Here is what happened:\n- write_file wrote 2 bytes to a.txt.\n- delete_file was not run because it was denied: The user denied this tool call: keep it."
        );
    }
}
