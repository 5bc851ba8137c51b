//! Rules for MCP tools from the servers' configuration, in the policy's own rule syntax.
//!
//! A server's `rules` name its tools by their own names (`write_file=ask`, `create_issue(repo=acme/*)=allow`,
//! `read_*=allow`); here each becomes a rule for the names the model sees (`mcp__fs__write_file=ask`). They join
//! the rules of `--rules` and the rules file as configured rules like any other: a rule that matches decides by the
//! policy's order (deny, then ask, then allow), so where the flag and a server's configuration both name a tool,
//! the stricter action wins, and `deny` beats everything.

use crate::mcp::config::McpConfig;
use crate::mcp::naming::qualified_name;
use crate::policy::{Rule, RuleError};

/// One of a server's rules for the names the model sees. The tool part is the tool's own name (made safe as the
/// model sees it) or a glob over the server's tools' names. A glob matches the names the model sees, and a `deny` or
/// `ask` glob also a name that had to be shortened with a digest as it is uncut; an `allow` glob does not, so such a
/// tool is allowed only by an exact rule.
pub fn server_rule(tool_prefix_name: &str, written: &str) -> Result<Rule, RuleError> {
    Rule::parse_renamed(written, |tool| {
        let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
        if tool.chars().all(name_char) {
            qualified_name(tool_prefix_name, tool)
        } else {
            // A glob, or something the policy's parser refuses with the rule as written.
            format!("mcp__{tool_prefix_name}__{tool}")
        }
    })
}

/// The rules every enabled server's configuration gives, for the names the model sees, in the order written.
pub fn policy_rules(config: &McpConfig) -> Vec<Rule> {
    config
        .servers
        .iter()
        .filter(|server| server.enabled)
        .flat_map(|server| server.rules.iter().map(|rule| rule.rule.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::policy::{ConfiguredRules, PermissionPolicy, RuleSet, SessionGrants};
    use crate::wire::{ApprovalPolicy, McpToolOrigin, McpTrust, PermissionDecision, ToolSpec};

    fn config(servers: &str) -> McpConfig {
        McpConfig::parse(Path::new("x.json"), servers, &|_| None).unwrap()
    }

    fn mcp_tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            annotations: Default::default(),
            mcp: Some(McpToolOrigin {
                server: "fs".into(),
                tool: name.rsplit("__").next().unwrap_or(name).into(),
                trust: McpTrust::Untrusted,
                endpoint: String::new(),
            }),
        }
    }

    fn kind(decision: &PermissionDecision) -> &'static str {
        match decision {
            PermissionDecision::Allow { .. } => "allow",
            PermissionDecision::Ask { .. } => "ask",
            PermissionDecision::Deny { .. } => "deny",
        }
    }

    #[test]
    fn server_rules_name_the_qualified_tools_and_the_stricter_action_wins() {
        let config = config(
            r#"{"mcpServers": {
                "fs": {"command": "x", "rules": ["write_file=ask", "read_text_file=allow"]},
                "off": {"command": "x", "enabled": false, "rules": ["anything=allow"]}
            }}"#,
        );
        let rules: Vec<String> = policy_rules(&config).iter().map(Rule::to_string).collect();
        assert_eq!(
            rules,
            ["mcp__fs__write_file=ask", "mcp__fs__read_text_file=allow"]
        );
        let global: RuleSet =
            "mcp__fs__write_file=deny,mcp__fs__read_text_file=ask,delete_file=deny"
                .parse()
                .unwrap();
        let policy = PermissionPolicy::with_rules(
            ApprovalPolicy::OnRequest,
            std::sync::Arc::new(
                ConfiguredRules::new(global, Vec::new()).with_mcp_rules(policy_rules(&config)),
            ),
        );
        let decide =
            |name: &str| kind(&policy.decide(&mcp_tool(name), &json!({}), &SessionGrants::new()));
        assert_eq!(decide("mcp__fs__write_file"), "deny");
        assert_eq!(decide("mcp__fs__read_text_file"), "ask");
        assert_eq!(
            decide("mcp__off__anything"),
            "ask",
            "a disabled server's rules do not apply"
        );
    }

    #[test]
    fn server_rules_take_globs_on_names_and_on_arguments() {
        let config = config(
            r#"{"mcpServers": {"github": {"command": "x", "rules": [
                "create_issue(repo=acme/*)=allow",
                "list_*=allow",
                "delete_repo=deny:Never from here."
            ]}}}"#,
        );
        let policy = PermissionPolicy::with_rules(
            ApprovalPolicy::OnRequest,
            std::sync::Arc::new(
                ConfiguredRules::new(RuleSet::new(), Vec::new())
                    .with_mcp_rules(policy_rules(&config)),
            ),
        );
        let decide = |name: &str, input: serde_json::Value| {
            policy.decide(&mcp_tool(name), &input, &SessionGrants::new())
        };
        assert_eq!(
            kind(&decide(
                "mcp__github__create_issue",
                json!({"repo": "acme/widgets"})
            )),
            "allow"
        );
        assert_eq!(
            kind(&decide(
                "mcp__github__create_issue",
                json!({"repo": "other/widgets"})
            )),
            "ask"
        );
        assert_eq!(
            kind(&decide("mcp__github__list_issues", json!({}))),
            "allow"
        );
        // A glob over a server's names stays within that server.
        assert_eq!(kind(&decide("mcp__other__list_issues", json!({}))), "ask");
        let denied = decide("mcp__github__delete_repo", json!({}));
        assert_eq!(kind(&denied), "deny");
        assert_eq!(denied.reason(), "Never from here.");
    }

    /// A tool's real name may hold `.` or `:`, which the model sees as `_`: a server's glob written with them, and a
    /// `--rules` name written with them, match the names the model sees. Before, `files.*=deny` became
    /// `mcp__fs__files.*`, which no name the model sees fits, and the deny did nothing.
    #[test]
    fn names_with_dots_or_colons_are_read_as_the_model_sees_them() {
        let config = config(
            r#"{"mcpServers": {"fs": {"command": "x", "rules": ["files.*=deny", "db:drop=deny"]}}}"#,
        );
        let global: RuleSet = "mcp__fs__admin.reset=deny".parse().unwrap();
        let policy = PermissionPolicy::with_rules(
            ApprovalPolicy::Trusted,
            std::sync::Arc::new(
                ConfiguredRules::new(global, Vec::new()).with_mcp_rules(policy_rules(&config)),
            ),
        );
        let decide =
            |name: &str| kind(&policy.decide(&mcp_tool(name), &json!({}), &SessionGrants::new()));
        assert_eq!(decide("mcp__fs__files_delete"), "deny");
        assert_eq!(decide("mcp__fs__db_drop"), "deny");
        assert_eq!(decide("mcp__fs__admin_reset"), "deny");
        assert_eq!(decide("mcp__fs__other"), "allow");
    }

    #[test]
    fn a_rule_the_policy_cannot_read_is_refused_where_it_is_written() {
        for (rule, expected) in [
            ("read_[=allow", "read_["),
            ("write_file(path=*.txt=allow", "write_file"),
            ("get=maybe", "maybe"),
            // Read as the model's names, it would also allow `reads_all_then_purge`; kept, it would allow nothing.
            ("reads.*=allow", "would allow nothing"),
            ("=allow", "=allow"),
        ] {
            let error = McpConfig::parse(
                Path::new("x.json"),
                &format!(r#"{{"mcpServers": {{"fs": {{"command": "x", "rules": ["{rule}"]}}}}}}"#),
                &|_| None,
            )
            .unwrap_err();
            assert_eq!(error.field.as_deref(), Some("rules[0]"), "{rule}");
            assert!(error.message.contains(expected), "{rule}: {error}");
        }
    }
}
