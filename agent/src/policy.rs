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

use sha2::{Digest, Sha256};

use crate::wire::{
    ApprovalPolicy, McpToolOrigin, McpTrust, PermissionDecision, RuleAction, ToolAnnotations,
    ToolSpec,
};

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

/// The tools a person approved for the rest of a session, by [`grant_key`].
pub type SessionGrants = BTreeSet<String>;

/// What a session grant remembers of a tool: its name and a digest of its whole definition (description, schema,
/// annotations, origin). A grant covers the tool the person saw; a tool that changes, as an MCP server's tools may
/// at any time, is asked about again.
pub fn grant_key(tool: &ToolSpec) -> String {
    let definition = serde_json::to_string(tool).unwrap_or_default();
    let digest = Sha256::digest(definition.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}#{hex}", tool.name)
}

/// A session grant as the store keeps it: the tool's name, for people, and its [`grant_key`] as the toolbox defines
/// the tool now.
pub fn stored_grant(tool_name: &str, toolbox: &crate::tools::Toolbox) -> serde_json::Value {
    let key = toolbox.spec(tool_name).map(|spec| grant_key(&spec));
    serde_json::json!({"tool": tool_name, "key": key})
}

/// The [`grant_key`] a stored grant holds. A grant without one (older, or for a tool that was gone) covers nothing.
pub fn grant_of(stored: &serde_json::Value) -> Option<String> {
    stored.get("key")?.as_str().map(str::to_owned)
}

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
        if !grants.is_empty() && grants.contains(&grant_key(tool)) {
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
        let untrusted = tool
            .mcp
            .as_ref()
            .filter(|origin| origin.trust == McpTrust::Untrusted);
        match self.policy {
            ApprovalPolicy::Trusted => PermissionDecision::Allow {
                reason: "The trusted policy runs every tool.".to_owned(),
            },
            ApprovalPolicy::Strict => PermissionDecision::Ask {
                reason: format!("The strict policy asks before every call ({name})."),
            },
            // An untrusted server's claims never make a call run without asking.
            ApprovalPolicy::OnRequest if untrusted.is_some() => PermissionDecision::Ask {
                reason: untrusted
                    .map(|origin| untrusted_reason(name, origin, hints))
                    .unwrap_or_default(),
            },
            ApprovalPolicy::OnRequest
                if hints.read_only == Some(true) && hints.open_world == Some(true) =>
            {
                PermissionDecision::Ask {
                    reason: format!(
                        "{name} only reads, but it reaches outside the workspace (open world)."
                    ),
                }
            }
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

/// Why a tool of an untrusted MCP server asks: the server, and what it claims.
fn untrusted_reason(name: &str, origin: &McpToolOrigin, hints: ToolAnnotations) -> String {
    let claim = |hint: Option<bool>, yes: &'static str, no: &'static str| {
        hint.map(|h| if h { yes } else { no })
    };
    let claims: Vec<&str> = [
        claim(hints.read_only, "read-only", "not read-only"),
        claim(hints.destructive, "destructive", "not destructive"),
        claim(hints.idempotent, "idempotent", "not idempotent"),
        claim(hints.open_world, "open-world", "not open-world"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let claims = if claims.is_empty() {
        "it makes no claims about what it does".to_owned()
    } else {
        format!("it claims to be {}, unverified", claims.join(", "))
    };
    format!(
        "{name} belongs to the MCP server {}, which is not trusted, so every call asks ({claims}).",
        origin.server
    )
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
            mcp: None,
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

    fn from_mcp(mut spec: ToolSpec, trust: McpTrust) -> ToolSpec {
        spec.mcp = Some(McpToolOrigin {
            server: "fs".into(),
            tool: spec.name.clone(),
            trust,
        });
        spec
    }

    #[test]
    fn an_untrusted_servers_claims_never_let_a_call_run_without_asking() {
        let policy = PermissionPolicy::default();
        let grants = SessionGrants::new();
        for spec in [read_only(), harmless(), destructive(), unannotated()] {
            let decision = policy.decide(&from_mcp(spec.clone(), McpTrust::Untrusted), &grants);
            assert!(is_ask(&decision), "{}", spec.name);
            assert!(
                decision
                    .reason()
                    .contains("the MCP server fs, which is not trusted")
            );
        }
        let decision = policy.decide(&from_mcp(read_only(), McpTrust::Untrusted), &grants);
        assert_eq!(
            decision.reason(),
            "read_file belongs to the MCP server fs, which is not trusted, so every call asks (it claims to be read-only, not destructive, idempotent, not open-world, unverified)."
        );
        // Trusted, its annotations decide as a built-in's do.
        let trusted = |spec| policy.decide(&from_mcp(spec, McpTrust::Annotations), &grants);
        assert!(is_allow(&trusted(read_only())));
        assert!(is_ask(&trusted(destructive())));
        // A rule still allows it, and the strict policy still asks.
        let rules = PermissionPolicy::new(
            ApprovalPolicy::OnRequest,
            "read_file=allow".parse().unwrap(),
        );
        assert!(is_allow(
            &rules.decide(&from_mcp(read_only(), McpTrust::Untrusted), &grants)
        ));
    }

    #[test]
    fn a_read_only_tool_that_reaches_outside_asks_under_on_request() {
        let mut spec = read_only();
        spec.annotations.open_world = Some(true);
        let decision = PermissionPolicy::default().decide(&spec, &SessionGrants::new());
        assert!(is_ask(&decision));
        assert!(
            decision.reason().contains("outside the workspace"),
            "{}",
            decision.reason()
        );
    }

    #[test]
    fn a_session_grant_covers_the_tool_as_it_was_approved() {
        let policy = PermissionPolicy::new(ApprovalPolicy::Strict, ToolRules::new());
        let grants: SessionGrants = [grant_key(&destructive())].into();
        assert!(is_allow(&policy.decide(&destructive(), &grants)));
        let mut changed = destructive();
        changed.description = "Deletes a file, and more.".into();
        assert!(is_ask(&policy.decide(&changed, &grants)));
        let mut changed = destructive();
        changed.input_schema = json!({"type": "object", "properties": {"path": {}}});
        assert!(is_ask(&policy.decide(&changed, &grants)));
    }

    #[test]
    fn a_session_grant_allows_but_never_beats_a_deny_rule() {
        let grants: SessionGrants = [grant_key(&destructive())].into();
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
