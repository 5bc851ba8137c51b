//! The names the model sees for MCP tools: `mcp__<server>__<tool>`.
//!
//! Model APIs accept tool names of at most 64 letters, digits, `_` and `-`. Server names are made safe once, when
//! the configuration is read, and never contain `__` or end in `_`, so the first `__` after `mcp__` always ends
//! the server's part: two servers' tools never share a name. A name that is too long is cut short and ends in a
//! short digest of the tool's real name; two servers whose names agree on all that a cut name keeps of them would
//! share those names, so the configuration refuses such a pair ([`may_share_names`]).

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

/// The name the model would see for `tool` of the server configured as `server` if names had no bound: what a
/// rule that names the tool in full, or a glob over its end (`mcp__*__delete_*`), reads. Equal to the tool's
/// [`qualified_name`] unless that had to be cut short.
pub fn uncut_name(server: &str, tool: &str) -> String {
    format!(
        "{PREFIX}{}__{}",
        sanitize_server_name(server),
        sanitize_tool_name(tool)
    )
}

/// The name the model sees for `tool` of `server` (its safe name), ignoring other tools of the server.
pub fn qualified_name(server: &str, tool: &str) -> String {
    let plain = format!("{PREFIX}{server}__{}", sanitize_tool_name(tool));
    if plain.len() <= MAX_TOOL_NAME_LEN {
        plain
    } else {
        with_digest(&plain, tool)
    }
}

/// The names the model sees for each of a server's tools, as `(model name, real name)` pairs in the order of the
/// real names: at most 64 characters, each the tool's own [`qualified_name`]. Tools whose names would be the same
/// (`drop.table` and `drop_table` are both `drop_table` to the model) are left out, all of them, and returned
/// apart: a rule in the server's configuration names a tool by its real name through [`qualified_name`], so a name
/// given to another tool (a digest added to one of the two, say) would let that rule land on the other, a `deny`
/// on a decoy. A server offers such names rarely, and only on purpose.
pub fn qualify<'a>(server: &str, tools: impl IntoIterator<Item = &'a str>) -> Qualified {
    let mut tools: Vec<&str> = tools.into_iter().collect();
    tools.sort_unstable();
    tools.dedup();
    let named: Vec<(String, &str)> = tools
        .into_iter()
        .map(|tool| (qualified_name(server, tool), tool))
        .collect();
    let mut uses = std::collections::HashMap::<&str, usize>::new();
    for (name, _) in &named {
        *uses.entry(name.as_str()).or_default() += 1;
    }
    let mut qualified = Qualified::default();
    for (name, real) in &named {
        if uses[name.as_str()] == 1 {
            qualified.named.push((name.clone(), (*real).to_owned()));
        } else {
            qualified.colliding.push((*real).to_owned());
        }
    }
    qualified
}

/// A server's tools as the model sees them, and those left out because their names collide.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qualified {
    /// `(model name, real name)`, in the order of the real names.
    pub named: Vec<(String, String)>,
    /// The real names left out, in order.
    pub colliding: Vec<String>,
}

/// How much of a name too long for model APIs [`with_digest`] keeps: all but `_` and eight hex digits.
const KEPT_OF_A_LONG_NAME: usize = MAX_TOOL_NAME_LEN - 1 - 8;

/// Whether tools of the two servers (by their safe names) could be given one name: when both names are long enough
/// that a tool's name cut short keeps only part of them, and that part is the same. (A cut name that keeps the whole
/// `mcp__<server>__` names its server; one that does not, keeps what the two agree on.)
pub fn may_share_names(server: &str, other: &str) -> bool {
    let kept = |server: &str| {
        let prefix = format!("{PREFIX}{server}__");
        (prefix.len() > KEPT_OF_A_LONG_NAME).then(|| prefix[..KEPT_OF_A_LONG_NAME].to_owned())
    };
    matches!((kept(server), kept(other)), (Some(a), Some(b)) if a == b)
}

/// `name` cut short enough to end in `_` and eight hex digits of a digest of the real name.
fn with_digest(name: &str, real: &str) -> String {
    // (The `0` keeps the names that earlier versions gave, which grants and rules name.)
    let digest = Sha256::digest(format!("{real}\u{0}0").as_bytes());
    let hex: String = digest[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    // Safe names are ASCII, so any byte index is a character boundary.
    let head = &name[..name.len().min(KEPT_OF_A_LONG_NAME)];
    format!("{head}_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two servers whose names agree on their first 50 characters give a long tool the same name; any other pair
    /// does not.
    #[test]
    fn servers_whose_long_names_agree_as_far_as_a_cut_name_keeps_may_share_names() {
        let production = "github-enterprise-acme-corporation-internal-mirror-production";
        let staging = "github-enterprise-acme-corporation-internal-mirror-staging";
        assert_eq!(
            qualified_name(production, "delete_repo"),
            qualified_name(staging, "delete_repo")
        );
        assert!(may_share_names(production, staging));
        assert!(!may_share_names(production, "github"));
        assert!(!may_share_names("github", "gitlab"));
        let (short, long) = ("a".repeat(47), "a".repeat(60));
        assert_ne!(
            qualified_name(&short, &"t".repeat(40)),
            qualified_name(&long, &"t".repeat(40))
        );
        assert!(!may_share_names(&short, &long));
        assert!(!may_share_names(&"a".repeat(49), &"a".repeat(60)));
        assert!(may_share_names(&"a".repeat(50), &"a".repeat(60)));
        assert_eq!(
            qualified_name(&"a".repeat(50), &"t".repeat(40)),
            qualified_name(&"a".repeat(60), &"t".repeat(40))
        );
    }

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
        let named = qualify("fs", ["read_file", "write.file", "list dir"]).named;
        assert_eq!(
            named,
            [
                ("mcp__fs__list_dir".to_owned(), "list dir".to_owned()),
                ("mcp__fs__read_file".to_owned(), "read_file".to_owned()),
                ("mcp__fs__write_file".to_owned(), "write.file".to_owned()),
            ]
        );
    }

    /// Names that would be the same to the model are left out, every one of them, so that a rule naming one by
    /// its real name can never land on another; a long name is shortened with a digest of itself.
    #[test]
    fn colliding_names_are_left_out_and_long_ones_stay_within_64_characters() {
        let long = "a".repeat(100);
        let qualified = qualify("server", ["a.b", "a_b", "a-b", long.as_str()]);
        assert_eq!(qualified.colliding, ["a.b", "a_b"]);
        let names: Vec<&str> = qualified
            .named
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert!(
            names.iter().all(|name| name.len() <= MAX_TOOL_NAME_LEN),
            "{names:?}"
        );
        for (name, real) in &qualified.named {
            assert_eq!(name, &qualified_name("server", real), "each its own name");
        }
        assert_eq!(qualified.named.len(), 2);
        assert_eq!(
            qualified,
            qualify("server", [long.as_str(), "a_b", "a-b", "a.b"]),
            "the same list gives the same names again"
        );
        // A safe name made to look like another's shortened one collides with it too.
        let shortened = qualified_name("server", &long);
        let decoy = shortened.strip_prefix("mcp__server__").unwrap();
        assert_eq!(qualify("server", [long.as_str(), decoy]).colliding.len(), 2);
    }
}
