//! The names the model sees for MCP tools: `mcp__<server>__<tool>`.
//!
//! Model APIs accept tool names of at most 64 letters, digits, `_` and `-`. Server names are made safe once, when
//! the configuration is read, and never contain `__` or end in `_`, so the first `__` after `mcp__` always ends
//! the server's part: two servers' tools can never share a name. Within one server, a name that is too long, or
//! that two tools would share after being made safe, ends in a short digest of the tool's real name instead.

use sha2::{Digest, Sha256};

/// The longest tool name model APIs accept.
pub const MAX_TOOL_NAME_LEN: usize = 64;

const PREFIX: &str = "mcp__";

/// Letters, digits and `-` stay; every run of anything else becomes one `_`; no `_` at either end.
pub fn sanitize_server_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// Letters, digits, `_` and `-` stay; anything else becomes `_`.
pub fn sanitize_tool_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The name the model sees for `tool` of `server` (its safe name), ignoring other tools of the server.
pub fn qualified_name(server: &str, tool: &str) -> String {
    let plain = format!("{PREFIX}{server}__{}", sanitize_tool_name(tool));
    if plain.len() <= MAX_TOOL_NAME_LEN {
        plain
    } else {
        with_digest(&plain, tool, 0)
    }
}

/// The names the model sees for each of a server's tools, as `(model name, real name)` pairs in the order of the
/// real names: at most 64 characters, and unique.
pub fn qualify<'a>(
    server: &str,
    tools: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, String)> {
    let mut tools: Vec<&str> = tools.into_iter().collect();
    // A tool whose name is safe already keeps it; the others yield when they collide with it.
    tools.sort_unstable_by_key(|tool| (sanitize_tool_name(tool) != *tool, *tool));
    tools.dedup();
    let mut taken = std::collections::BTreeSet::new();
    let mut named = Vec::with_capacity(tools.len());
    for tool in tools {
        let mut name = qualified_name(server, tool);
        let mut attempt = 0;
        while taken.contains(&name) {
            attempt += 1;
            name = with_digest(
                &format!("{PREFIX}{server}__{}", sanitize_tool_name(tool)),
                tool,
                attempt,
            );
        }
        taken.insert(name.clone());
        named.push((name, tool.to_owned()));
    }
    named.sort_unstable_by(|a, b| a.1.cmp(&b.1));
    named
}

/// `name` cut short enough to end in `_` and eight hex digits of a digest of the real name (and `attempt`).
fn with_digest(name: &str, real: &str, attempt: u32) -> String {
    let digest = Sha256::digest(format!("{real}\u{0}{attempt}").as_bytes());
    let hex: String = digest[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let keep = MAX_TOOL_NAME_LEN - 1 - hex.len();
    // Safe names are ASCII, so any byte index is a character boundary.
    let head = &name[..name.len().min(keep)];
    format!("{head}_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_made_safe_once() {
        assert_eq!(sanitize_server_name("github"), "github");
        assert_eq!(sanitize_server_name("My Server.v2"), "My_Server_v2");
        assert_eq!(sanitize_server_name("__a__b__"), "a_b");
        assert_eq!(sanitize_server_name("file-system"), "file-system");
        assert_eq!(sanitize_server_name("!!"), "");
    }

    #[test]
    fn tools_are_named_mcp_server_tool_and_made_safe() {
        let named = qualify("fs", ["read_file", "write.file", "list dir"]);
        assert_eq!(
            named,
            [
                ("mcp__fs__list_dir".to_owned(), "list dir".to_owned()),
                ("mcp__fs__read_file".to_owned(), "read_file".to_owned()),
                ("mcp__fs__write_file".to_owned(), "write.file".to_owned()),
            ]
        );
    }

    #[test]
    fn long_and_colliding_names_stay_within_64_characters_and_unique() {
        let long = "a".repeat(100);
        let named = qualify("server", ["a.b", "a_b", "a-b", long.as_str()]);
        let names: Vec<&str> = named.iter().map(|(name, _)| name.as_str()).collect();
        assert!(
            names.iter().all(|name| name.len() <= MAX_TOOL_NAME_LEN),
            "{names:?}"
        );
        assert!(names.iter().all(|name| name.starts_with("mcp__server__")));
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), 4, "{names:?}");
        let name_of = |real: &str| named.iter().find(|(_, r)| r == real).unwrap().0.clone();
        assert_eq!(
            name_of("a_b"),
            "mcp__server__a_b",
            "a safe name keeps its own"
        );
        assert_eq!(name_of("a-b"), "mcp__server__a-b");
        assert!(name_of("a.b").starts_with("mcp__server__a_b_"));
        // Each maps back to its real name, and the same list gives the same names again.
        assert!(named.iter().any(|(_, real)| real == &long));
        assert_eq!(
            named,
            qualify("server", [long.as_str(), "a_b", "a-b", "a.b"])
        );
        assert_eq!(
            qualified_name("server", &long),
            named.iter().find(|(_, r)| r == &long).unwrap().0
        );
    }
}
