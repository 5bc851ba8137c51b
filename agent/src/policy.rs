//! Permission decisions: allow, ask or deny, each with a reason.
//!
//! The order in which the sources speak, first match wins:
//!
//! 1. a `deny` rule for the tool: nothing overrides it, not even a session grant;
//! 2. a session grant (a person approved the tool for the session);
//! 3. an `allow` or `ask` rule for the tool;
//! 4. the policy, reading the tool's annotations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::wire::{ApprovalPolicy, PermissionDecision, RuleAction, ToolSpec};

/// Rules per tool name that force allow, ask or deny.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolRules(BTreeMap<String, RuleAction>);

impl ToolRules {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, tool: impl Into<String>, action: RuleAction) -> Self {
        self.0.insert(tool.into(), action);
        self
    }

    pub fn get(&self, tool: &str) -> Option<RuleAction> {
        self.0.get(tool).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, RuleAction)> {
        self.0.iter().map(|(name, action)| (name.as_str(), *action))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for ToolRules {
    type Err = String;

    /// Parses `tool=action` pairs separated by commas: `delete_file=deny,run_command=ask`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut rules = Self::new();
        for pair in s.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let (tool, action) = pair
                .split_once('=')
                .ok_or_else(|| format!("rule {pair:?} is not of the form tool=allow|ask|deny"))?;
            let tool = tool.trim();
            if tool.is_empty() {
                return Err(format!("rule {pair:?} names no tool"));
            }
            rules = rules.with(tool, action.parse()?);
        }
        Ok(rules)
    }
}

impl fmt::Display for ToolRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self
            .0
            .iter()
            .map(|(tool, action)| {
                let action = match action {
                    RuleAction::Allow => "allow",
                    RuleAction::Ask => "ask",
                    RuleAction::Deny => "deny",
                };
                format!("{tool}={action}")
            })
            .collect();
        f.write_str(&pairs.join(","))
    }
}

/// The tools a person approved for the rest of a session.
pub type SessionGrants = BTreeSet<String>;

/// The policy and the rules a run is checked against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PermissionPolicy {
    pub policy: ApprovalPolicy,
    pub rules: ToolRules,
}

impl PermissionPolicy {
    pub fn new(policy: ApprovalPolicy, rules: ToolRules) -> Self {
        Self { policy, rules }
    }

    pub fn decide(&self, tool: &ToolSpec, grants: &SessionGrants) -> PermissionDecision {
        let name = &tool.name;
        let rule = self.rules.get(name);
        if rule == Some(RuleAction::Deny) {
            return PermissionDecision::Deny {
                reason: format!("A rule denies {name}."),
            };
        }
        if grants.contains(name) {
            return PermissionDecision::Allow {
                reason: format!("{name} was approved for this session."),
            };
        }
        match rule {
            Some(RuleAction::Allow) => {
                return PermissionDecision::Allow {
                    reason: format!("A rule allows {name}."),
                };
            }
            Some(RuleAction::Ask) => {
                return PermissionDecision::Ask {
                    reason: format!("A rule asks before {name} runs."),
                };
            }
            Some(RuleAction::Deny) | None => {}
        }
        let hints = tool.annotations;
        match self.policy {
            ApprovalPolicy::Trusted => PermissionDecision::Allow {
                reason: "The trusted policy runs every tool.".to_owned(),
            },
            ApprovalPolicy::Strict => PermissionDecision::Ask {
                reason: format!("The strict policy asks before every call ({name})."),
            },
            ApprovalPolicy::OnRequest if hints.read_only == Some(true) => {
                PermissionDecision::Allow {
                    reason: format!("{name} is read-only."),
                }
            }
            ApprovalPolicy::OnRequest if hints.destructive == Some(true) => {
                let open_world = if hints.open_world == Some(true) {
                    " and reaches outside the workspace"
                } else {
                    ""
                };
                PermissionDecision::Ask {
                    reason: format!("{name} is destructive{open_world}."),
                }
            }
            ApprovalPolicy::OnRequest if !hints.is_complete() => PermissionDecision::Ask {
                reason: format!(
                    "{name} does not say whether it is safe (its annotations are incomplete)."
                ),
            },
            ApprovalPolicy::OnRequest => PermissionDecision::Allow {
                reason: format!("{name} is annotated as non-destructive."),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ToolAnnotations;
    use serde_json::json;

    fn tool(name: &str, annotations: ToolAnnotations) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            annotations,
        }
    }

    fn read_only() -> ToolSpec {
        tool(
            "read_file",
            ToolAnnotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: Some(true),
                open_world: Some(false),
            },
        )
    }

    fn destructive() -> ToolSpec {
        tool(
            "delete_file",
            ToolAnnotations {
                read_only: Some(false),
                destructive: Some(true),
                idempotent: Some(true),
                open_world: Some(false),
            },
        )
    }

    fn harmless() -> ToolSpec {
        tool(
            "append_note",
            ToolAnnotations {
                read_only: Some(false),
                destructive: Some(false),
                idempotent: Some(false),
                open_world: Some(false),
            },
        )
    }

    fn unannotated() -> ToolSpec {
        tool("mystery", ToolAnnotations::default())
    }

    fn is_allow(d: &PermissionDecision) -> bool {
        matches!(d, PermissionDecision::Allow { .. })
    }
    fn is_ask(d: &PermissionDecision) -> bool {
        matches!(d, PermissionDecision::Ask { .. })
    }
    fn is_deny(d: &PermissionDecision) -> bool {
        matches!(d, PermissionDecision::Deny { .. })
    }

    #[test]
    fn on_request_runs_read_only_tools_and_asks_for_the_rest() {
        let policy = PermissionPolicy::default();
        let grants = SessionGrants::new();
        assert!(is_allow(&policy.decide(&read_only(), &grants)));
        assert!(is_allow(&policy.decide(&harmless(), &grants)));
        let decision = policy.decide(&destructive(), &grants);
        assert_eq!(decision.reason(), "delete_file is destructive.");
        assert!(is_ask(&decision));
        let decision = policy.decide(&unannotated(), &grants);
        assert!(is_ask(&decision));
        assert!(decision.reason().contains("annotations are incomplete"));
    }

    #[test]
    fn strict_asks_for_everything_and_trusted_for_nothing() {
        let grants = SessionGrants::new();
        let strict = PermissionPolicy::new(ApprovalPolicy::Strict, ToolRules::new());
        let trusted = PermissionPolicy::new(ApprovalPolicy::Trusted, ToolRules::new());
        for spec in [read_only(), destructive(), harmless(), unannotated()] {
            assert!(is_ask(&strict.decide(&spec, &grants)), "{}", spec.name);
            assert!(is_allow(&trusted.decide(&spec, &grants)), "{}", spec.name);
        }
    }

    #[test]
    fn rules_override_the_policy() {
        let rules: ToolRules = "read_file=deny, delete_file=allow ,append_note=ask"
            .parse()
            .unwrap();
        let policy = PermissionPolicy::new(ApprovalPolicy::OnRequest, rules);
        let grants = SessionGrants::new();
        let decision = policy.decide(&read_only(), &grants);
        assert!(is_deny(&decision));
        assert_eq!(decision.reason(), "A rule denies read_file.");
        assert!(is_allow(&policy.decide(&destructive(), &grants)));
        assert!(is_ask(&policy.decide(&harmless(), &grants)));
        let trusted =
            PermissionPolicy::new(ApprovalPolicy::Trusted, "delete_file=deny".parse().unwrap());
        assert!(is_deny(&trusted.decide(&destructive(), &grants)));
    }

    #[test]
    fn a_session_grant_allows_but_never_beats_a_deny_rule() {
        let grants: SessionGrants = ["delete_file".to_owned()].into();
        let policy = PermissionPolicy::new(ApprovalPolicy::Strict, ToolRules::new());
        let decision = policy.decide(&destructive(), &grants);
        assert!(is_allow(&decision));
        assert_eq!(
            decision.reason(),
            "delete_file was approved for this session."
        );
        let deny =
            PermissionPolicy::new(ApprovalPolicy::Strict, "delete_file=deny".parse().unwrap());
        assert!(is_deny(&deny.decide(&destructive(), &grants)));
    }

    #[test]
    fn malformed_rules_are_refused_with_a_reason() {
        assert!(
            "delete_file"
                .parse::<ToolRules>()
                .unwrap_err()
                .contains("tool=allow|ask|deny")
        );
        assert!(
            "delete_file=maybe"
                .parse::<ToolRules>()
                .unwrap_err()
                .contains("maybe")
        );
        assert!(
            "=deny"
                .parse::<ToolRules>()
                .unwrap_err()
                .contains("names no tool")
        );
        assert_eq!("".parse::<ToolRules>().unwrap(), ToolRules::new());
        let rules: ToolRules = "b=ask,a=deny".parse().unwrap();
        assert_eq!(rules.to_string(), "a=deny,b=ask");
    }
}
