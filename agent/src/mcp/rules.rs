//! Rules for MCP tools from the servers' configuration, joined to the policy's rules.
//!
//! A server's `rules` name its tools by their own names (`write_file=ask`); here they become rules for the names
//! the model sees (`mcp__fs__write_file=ask`) and join the rules given with `--rules`, the stricter action winning
//! where both name a tool (deny, then ask, then allow).
//!
//! The policy's rules match exact tool names today, so [`check_rule_tool`] refuses patterns (`read_*`,
//! `write_file(path=...)`) rather than let them silently match nothing. When the policy learns patterns, that check
//! goes and [`policy_rules`] hands each qualified rule string to the policy's own parser instead of building
//! [`ToolRules`] entry by entry: those two functions are the whole seam.

use crate::mcp::config::McpConfig;
use crate::mcp::naming::qualified_name;
use crate::policy::ToolRules;
use crate::wire::RuleAction;

/// Refuses what the policy cannot match yet: wildcards and argument patterns.
pub(crate) fn check_rule_tool(tool: &str) -> Result<(), String> {
    match tool.chars().find(|c| matches!(c, '*' | '?' | '[' | '(')) {
        Some(c) => Err(format!(
            "{tool:?} is a pattern ({c:?}), and rules match exact tool names; name each tool"
        )),
        None => Ok(()),
    }
}

/// The rules every enabled server's configuration gives, for the names the model sees.
pub fn policy_rules(config: &McpConfig) -> ToolRules {
    config
        .servers
        .iter()
        .filter(|server| server.enabled)
        .flat_map(|server| {
            server.rules.iter().map(|rule| {
                (
                    qualified_name(&server.tool_prefix_name, &rule.tool),
                    rule.action,
                )
            })
        })
        .fold(ToolRules::new(), |rules, (tool, action)| {
            let action = stricter(rules.get(&tool), action);
            rules.with(tool, action)
        })
}

/// `base` and `extra` together; where both name a tool, the stricter action.
pub fn join_rules(base: ToolRules, extra: &ToolRules) -> ToolRules {
    extra.iter().fold(base, |rules, (tool, action)| {
        let action = stricter(rules.get(tool), action);
        rules.with(tool, action)
    })
}

fn stricter(current: Option<RuleAction>, new: RuleAction) -> RuleAction {
    let rank = |action: RuleAction| match action {
        RuleAction::Allow => 0,
        RuleAction::Ask => 1,
        RuleAction::Deny => 2,
    };
    match current {
        Some(current) if rank(current) > rank(new) => current,
        _ => new,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn server_rules_name_the_qualified_tools_and_the_stricter_action_wins() {
        let config = McpConfig::parse(
            Path::new("x.json"),
            r#"{"mcpServers": {
                "fs": {"command": "x", "rules": ["write_file=ask", "read_text_file=allow"]},
                "off": {"command": "x", "enabled": false, "rules": ["anything=allow"]}
            }}"#,
            &|_| None,
        )
        .unwrap();
        let rules = policy_rules(&config);
        assert_eq!(rules.get("mcp__fs__write_file"), Some(RuleAction::Ask));
        assert_eq!(
            rules.get("mcp__fs__read_text_file"),
            Some(RuleAction::Allow)
        );
        assert_eq!(rules.get("mcp__off__anything"), None);
        let global: ToolRules =
            "mcp__fs__write_file=deny,mcp__fs__read_text_file=ask,delete_file=deny"
                .parse()
                .unwrap();
        let joined = join_rules(global, &rules);
        assert_eq!(joined.get("mcp__fs__write_file"), Some(RuleAction::Deny));
        assert_eq!(joined.get("mcp__fs__read_text_file"), Some(RuleAction::Ask));
        assert_eq!(joined.get("delete_file"), Some(RuleAction::Deny));
    }

    #[test]
    fn patterns_are_refused_until_the_policy_can_match_them() {
        for pattern in ["read_*", "write_file(path=*.txt)", "get?"] {
            let error = McpConfig::parse(
                Path::new("x.json"),
                &format!(r#"{{"mcpServers": {{"fs": {{"command": "x", "rules": ["{pattern}=allow"]}}}}}}"#),
                &|_| None,
            )
            .unwrap_err();
            assert_eq!(error.field.as_deref(), Some("rules[0]"));
            assert!(error.message.contains("exact tool names"), "{error}");
        }
    }
}
