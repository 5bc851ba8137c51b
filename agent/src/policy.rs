//! Permission decisions: allow, ask or deny, each with a reason and what made it.
//!
//! A rule is a tool pattern, an optional argument matcher and an action (see [`rule`] for the written form).
//! For each call, in this order, the first that applies decides:
//!
//! | # | source | decides |
//! | --- | --- | --- |
//! | 1 | a matching `deny` rule | deny: nothing overrides it, not a grant, not a person's edited arguments |
//! | 2 | a matching `ask` rule | ask |
//! | 3 | a program that runs other programs (a shell, an interpreter, `find`, `git`, a build tool) while a `deny` rule restricts `run_command` | ask (what it runs cannot be read from its argv) |
//! | 4 | a matching `allow` rule | allow |
//! | 5 | a session grant covering the call (never in a `strict` run) | allow |
//! | 6 | the policy, reading the tool's annotations | `on_request`: read-only runs, destructive or incompletely annotated asks; `strict`: ask; `trusted`: allow |
//!
//! Within one action, the most specific matching rule names the reason ([`rule::Specificity`]): the longer
//! matcher, then an exact tool name over a glob. A rule's own reason is shown as it is; otherwise the reason says
//! which rule decided.

pub mod book;
pub mod grant;
pub mod matcher;
pub mod rule;

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

pub use book::{
    BookRule, ConfiguredRules, Removed, RuleBook, RuleBookError, RuleSet, RulesFile,
    RulesFileError, StoredRuleBook, parse_rule_entries, parse_rules_table,
};
pub use grant::{SessionGrants, session_grant, spec_digest, stored_grant};
pub use matcher::PathContext;
pub use rule::{CommandWords, Rule, RuleEntry, RuleError, RuleProblem};

use crate::ids::RuleId;
use crate::permissions::{ApprovalChoices, Grant, RuleOrigin, SessionGrant, quoted, shell_words};
use crate::wire::{
    ApprovalPolicy, DecisionScope, McpToolOrigin, McpTrust, PermissionDecision, RuleAction,
    ToolAnnotations, ToolSpec,
};
use matcher::{ToolKind, argv, is_program_runner};
use rule::CallFacts;

/// What made a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// A rule, by its id, written form and origin.
    Rule {
        id: RuleId,
        rule: String,
        origin: RuleOrigin,
    },
    /// A program that runs other programs met a `deny` or `ask` rule on `run_command`: it asks.
    ProgramRunner { program: String, rule: String },
    /// A session grant.
    Grant(SessionGrant),
    /// The policy's default for the tool's annotations.
    Policy(ApprovalPolicy),
}

impl fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rule { id, rule, origin } => {
                write!(f, "the rule {rule} ({id}, {})", origin.said())
            }
            Self::ProgramRunner { program, rule } => write!(
                f,
                "{} runs other programs while the rule {rule} restricts run_command",
                quoted(program)
            ),
            Self::Grant(grant) => write!(
                f,
                "the session grant {} ({})",
                grant.id,
                grant.grant.describe()
            ),
            Self::Policy(policy) => write!(f, "the {policy} policy and the tool's annotations"),
        }
    }
}

/// A decision and what made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: PermissionDecision,
    pub decided_by: DecidedBy,
}

/// The policy, the rules and the workspace a run's calls are checked against.
#[derive(Clone, Debug)]
pub struct PermissionPolicy {
    pub policy: ApprovalPolicy,
    rules: Arc<dyn RuleBook>,
    paths: Arc<PathContext>,
}

impl Default for PermissionPolicy {
    fn default() -> Self {
        Self::new(ApprovalPolicy::default(), RuleSet::new())
    }
}

/// Whether `schema` (a tool's input schema) types the property `key` as `kind` alone (`number` also as `integer`).
/// Not where a `$ref` stands beside it, which older drafts of JSON Schema read instead of the keywords next to it.
fn schema_fixes_type(schema: &Value, key: &str, kind: &str) -> bool {
    let property = &schema["properties"][key];
    if schema.get("$ref").is_some() || property.get("$ref").is_some() {
        return false;
    }
    let declared = &property["type"];
    match declared.as_str() {
        Some(declared) => declared == kind || (kind == "number" && declared == "integer"),
        None => false,
    }
}

/// Why a card for `run_command` of a file in the workspace offers no approval beyond this call.
pub const WORKSPACE_PROGRAM_NOTE: &str = "This program is a file in the workspace, which the file tools can rewrite: an approval for the session, or a rule, would cover whatever it holds later. Approve this call once.";

impl PermissionPolicy {
    /// A policy with rules as `--rules` writes them, paths read lexically.
    pub fn new(policy: ApprovalPolicy, rules: RuleSet) -> Self {
        Self::with_rules(policy, Arc::new(ConfiguredRules::new(rules, Vec::new())))
    }

    /// A policy reading the rules of `rules`, paths read lexically.
    pub fn with_rules(policy: ApprovalPolicy, rules: Arc<dyn RuleBook>) -> Self {
        Self {
            policy,
            rules,
            paths: Arc::new(PathContext::lexical()),
        }
    }

    /// The same policy and workspace reading another rule book (the harness's, which adds the rules people
    /// added to the configured ones).
    pub fn with_rule_book(&self, rules: Arc<dyn RuleBook>) -> Self {
        Self {
            rules,
            ..self.clone()
        }
    }

    /// Reads file tools' paths through this workspace (its symlinks, its case sensitivity).
    pub fn with_paths(mut self, paths: PathContext) -> Self {
        self.paths = Arc::new(paths);
        self
    }

    /// The same rules and workspace under another policy (a run that asked for a stricter one).
    pub fn with_policy(&self, policy: ApprovalPolicy) -> Self {
        Self {
            policy,
            ..self.clone()
        }
    }

    pub fn rule_book(&self) -> &Arc<dyn RuleBook> {
        &self.rules
    }

    pub fn paths(&self) -> &PathContext {
        &self.paths
    }

    pub fn decide(
        &self,
        tool: &ToolSpec,
        input: &Value,
        grants: &SessionGrants,
    ) -> PermissionDecision {
        self.explain(tool, input, grants).decision
    }

    /// The decision for a call and what made it; see the module's table for the order.
    pub fn explain(&self, tool: &ToolSpec, input: &Value, grants: &SessionGrants) -> Verdict {
        let rules = self.rules.rules();
        let call = CallFacts::of(tool, input, &self.paths);
        let mut best: [Option<&BookRule>; 3] = [None, None, None];
        // A rule people added that allows a program in the workspace (an Always allow before this version offered
        // none) would allow whatever the file holds later: only a configured one does.
        let workspace_program = self.runs_workspace_file(tool, input);
        for entry in rules.iter() {
            if !entry.rule.matches(&call)
                || (workspace_program
                    && entry.origin == RuleOrigin::Added
                    && entry.rule.action() == RuleAction::Allow)
            {
                continue;
            }
            let slot = &mut best[entry.rule.action() as usize];
            // Strictly more specific replaces: among equals, the first written wins.
            if slot.is_none_or(|held| entry.rule.specificity() > held.rule.specificity()) {
                *slot = Some(entry);
            }
        }
        let by_rule = |entry: &BookRule, decision: PermissionDecision| Verdict {
            decision,
            decided_by: DecidedBy::Rule {
                id: entry.id.clone(),
                rule: entry.rule.to_string(),
                origin: entry.origin,
            },
        };
        let reason = |entry: &BookRule, otherwise: String| {
            entry.rule.reason().map_or(otherwise, str::to_owned)
        };
        if let Some(entry) = best[RuleAction::Deny as usize] {
            let reason = reason(entry, format!("The rule {} denies this call.", entry.rule));
            return by_rule(entry, PermissionDecision::Deny { reason });
        }
        if let Some(entry) = best[RuleAction::Ask as usize] {
            let reason = reason(
                entry,
                format!("The rule {} asks before this call runs.", entry.rule),
            );
            return by_rule(entry, PermissionDecision::Ask { reason });
        }
        if let Some(verdict) = self.opaque_program(tool, input, &rules) {
            return verdict;
        }
        if let Some(entry) = best[RuleAction::Allow as usize] {
            let reason = reason(entry, format!("The rule {} allows this call.", entry.rule));
            return by_rule(entry, PermissionDecision::Allow { reason });
        }
        if self.policy != ApprovalPolicy::Strict
            && !workspace_program
            && let Some(grant) = grants.covering(tool, input)
        {
            return Verdict {
                decision: PermissionDecision::Allow {
                    reason: format!("Approved for this session: {}.", grant.grant.describe()),
                },
                decided_by: DecidedBy::Grant(grant.clone()),
            };
        }
        Verdict {
            decision: self.default_decision(tool),
            decided_by: DecidedBy::Policy(self.policy),
        }
    }

    /// The action the rules give every call of `tool`, whatever its arguments (rules with an argument matcher are
    /// left out): the strictest among them, `None` when no rule names the tool as a whole.
    pub fn tool_rule(&self, tool: &ToolSpec) -> Option<RuleAction> {
        let no_arguments = Value::Object(serde_json::Map::new());
        let call = CallFacts::of(tool, &no_arguments, &self.paths);
        self.rules
            .rules()
            .iter()
            .filter(|entry| entry.rule.is_tool_wide() && entry.rule.matches(&call))
            .map(|entry| entry.rule.action())
            .max()
    }

    /// A program that runs others (a shell, `find -exec`) can run one a `deny` rule forbids, or an `ask` rule asks
    /// before, without naming it: while such a rule exists, calls of one ask.
    fn opaque_program(
        &self,
        tool: &ToolSpec,
        input: &Value,
        rules: &[BookRule],
    ) -> Option<Verdict> {
        if ToolKind::of(&tool.name) != ToolKind::Command {
            return None;
        }
        let program = *argv(input)?.first()?;
        let in_workspace = self.paths.runs_workspace_file(program);
        if !is_program_runner(program) && !in_workspace {
            return None;
        }
        // The strictest such rule names the reason, the first written of them.
        let restricting = rules
            .iter()
            .filter(|entry| entry.rule.restricts_commands())
            .min_by_key(|entry| std::cmp::Reverse(entry.rule.action()))?;
        let program = shell_words(program, &[]);
        let what = match restricting.rule.action() {
            RuleAction::Deny => "forbids some",
            _ => "asks before some",
        };
        let runs = if in_workspace {
            "is a file in the workspace, which may run any program"
        } else {
            "runs other programs"
        };
        Some(Verdict {
            decision: PermissionDecision::Ask {
                reason: format!(
                    "{} {runs}, and the rule {} {what}: a person decides.",
                    quoted(&program),
                    restricting.rule
                ),
            },
            decided_by: DecidedBy::ProgramRunner {
                program,
                rule: restricting.rule.to_string(),
            },
        })
    }

    fn default_decision(&self, tool: &ToolSpec) -> PermissionDecision {
        let name = &tool.name;
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
            // A tool reaches outside unless it says it does not: MCP's `openWorldHint` is true when left out.
            ApprovalPolicy::OnRequest
                if hints.read_only == Some(true) && hints.open_world != Some(false) =>
            {
                PermissionDecision::Ask {
                    reason: if hints.open_world == Some(true) {
                        format!(
                            "{name} only reads, but it reaches outside the workspace (open world)."
                        )
                    } else {
                        format!(
                            "{name} only reads, but it does not say that it stays inside the workspace (no openWorldHint: a tool is taken to reach outside)."
                        )
                    },
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

    /// The grant approving this call with `scope` creates: `None` for `once`, for a scope not on offer, and in a
    /// `strict` run, where grants do not apply. With arguments a person edited, the grant the card offered for the
    /// arguments `asked`, when the edited ones make that same grant, or an error.
    pub fn grant_for(
        &self,
        tool: &ToolSpec,
        asked: &Value,
        edited: Option<&Value>,
        scope: DecisionScope,
    ) -> Result<Option<Grant>, grant::EditedGrant> {
        if self.policy == ApprovalPolicy::Strict || self.runs_workspace_file(tool, asked) {
            return Ok(None);
        }
        grant::grant_for_approval(tool, asked, edited, scope)
    }

    /// Whether the call is `run_command` of a file in the workspace (see [`PathContext::runs_workspace_file`]): the
    /// file tools may rewrite it, so no approval of it holds for later calls, neither a session's nor a rule's.
    pub fn runs_workspace_file(&self, tool: &ToolSpec, input: &Value) -> bool {
        ToolKind::of(&tool.name) == ToolKind::Command
            && argv(input)
                .and_then(|argv| argv.first().copied())
                .is_some_and(|program| self.paths.runs_workspace_file(program))
    }

    /// What a card for this call offers beyond approving once: each session scope with the exact grant it
    /// creates, and the narrowest rule "Always allow" would add.
    pub fn approval_choices(
        &self,
        tool: &ToolSpec,
        input: &Value,
        grants: &SessionGrants,
    ) -> ApprovalChoices {
        let verdict = self.explain(tool, input, grants);
        // A program in the workspace is approved once only, whatever else would have been offered (but a rule that
        // asks, which says so itself).
        let workspace_program = self.runs_workspace_file(tool, input);
        // A grant is read after the rules that ask (see `explain`): where one of them asked, a grant would never
        // apply, and the card does not offer one.
        let (session, session_note) = match &verdict.decided_by {
            _ if self.policy == ApprovalPolicy::Strict => (
                Vec::new(),
                Some("This run uses the strict policy, which asks before every call: approvals for the session do not apply.".to_owned()),
            ),
            DecidedBy::Rule { rule, .. } => (
                Vec::new(),
                Some(format!(
                    "The rule {rule} asks before every such call: an approval for the session would not apply."
                )),
            ),
            _ if workspace_program => (Vec::new(), Some(WORKSPACE_PROGRAM_NOTE.to_owned())),
            DecidedBy::ProgramRunner { program, rule } => (
                Vec::new(),
                Some(format!(
                    "{} runs other programs while the rule {rule} restricts run_command, so it asks every time: an approval for the session would not apply.",
                    quoted(program)
                )),
            ),
            DecidedBy::Grant(_) | DecidedBy::Policy(_) => grant::grant_choices(tool, input),
        };
        let (always_allow, always_allow_note) = match &verdict.decided_by {
            DecidedBy::Rule { rule, .. } => (
                None,
                Some(format!(
                    "The rule {rule} asks before this call, and asking beats allowing: change that rule to run it without asking."
                )),
            ),
            _ if workspace_program => (None, Some(WORKSPACE_PROGRAM_NOTE.to_owned())),
            DecidedBy::ProgramRunner { program, rule } => (
                None,
                Some(format!(
                    "{} runs other programs while the rule {rule} restricts run_command, so it always asks.",
                    quoted(program)
                )),
            ),
            DecidedBy::Grant(_) | DecidedBy::Policy(_) => {
                match self.narrowest_allow_rule(tool, input) {
                    Ok(rule) => (Some(rule.to_string()), None),
                    Err(note) => (None, Some(note)),
                }
            }
        };
        ApprovalChoices {
            session,
            session_note,
            always_allow,
            always_allow_note,
        }
    }

    /// The narrowest rule that allows this call: the exact command, the exact path, or every argument pinned and no
    /// other (`$`).
    /// It is checked to read back as itself and to match the call, or it is not offered.
    pub fn narrowest_allow_rule(&self, tool: &ToolSpec, input: &Value) -> Result<Rule, String> {
        let name = &tool.name;
        let rule = match ToolKind::of(name) {
            ToolKind::Command => argv(input).and_then(|argv| Rule::allow_exact_command(&argv)),
            ToolKind::WorkspaceFile => {
                let raw = input.get("path").and_then(Value::as_str).unwrap_or("");
                let readings = self.paths.candidates(raw);
                if readings.unknown {
                    return Err(format!(
                        "{raw:?} cannot be followed through the workspace's links, so no rule can tell where it leads."
                    ));
                }
                match readings.known.as_slice() {
                    [] => return Err(format!("{raw:?} is not a path inside the workspace.")),
                    [lexical] if lexical.is_empty() => {
                        return Err(
                            "A rule cannot name the workspace itself by its path.".to_owned()
                        );
                    }
                    [lexical] => Rule::allow_exact_arguments(name, &[("path", lexical)], false),
                    [_, resolved, ..] => {
                        return Err(format!(
                            "{raw:?} goes through a symlink to {resolved:?}; a rule for it would have to allow both."
                        ));
                    }
                }
            }
            ToolKind::Other => {
                let Some(arguments) = input.as_object().filter(|map| !map.is_empty()) else {
                    return Err(format!(
                        "{name} has no arguments a rule could pin to this call."
                    ));
                };
                // Each argument pinned to its value, and no other argument (`$`): this call alone, whatever the
                // tool's schema takes now or later (a server may add an argument to its tool).
                let mut pinned = Vec::with_capacity(arguments.len());
                for (key, value) in arguments {
                    let (text, kind) = match value {
                        Value::String(text) => (text.clone(), "string"),
                        Value::Number(number) => (number.to_string(), "number"),
                        Value::Bool(flag) => (flag.to_string(), "boolean"),
                        _ => {
                            return Err(format!(
                                "The argument {key:?} is not a single value, and a rule can only pin single values."
                            ));
                        }
                    };
                    // A rule pins the value's text: `false` would also allow the string "false" (which a server in
                    // JavaScript reads as true), unless the tool's schema fixes the argument's type.
                    if kind != "string" && !schema_fixes_type(&tool.input_schema, key, kind) {
                        return Err(format!(
                            "The tool's schema does not fix the type of {key:?}, and a rule pins only the text of its value: it would also allow {text:?} as a string."
                        ));
                    }
                    pinned.push((key.as_str(), text));
                }
                let pinned: Vec<(&str, &str)> =
                    pinned.iter().map(|(k, v)| (*k, v.as_str())).collect();
                Rule::allow_exact_arguments(name, &pinned, true)
            }
        };
        let unavailable = || format!("No rule can say exactly this call of {name}.");
        let rule = rule.ok_or_else(unavailable)?;
        let reads_back = Rule::parse(&rule.to_string()).is_ok_and(|back| back == rule);
        let call = CallFacts::named(name, input, &self.paths);
        if reads_back && rule.matches(&call) {
            Ok(rule)
        } else {
            Err(unavailable())
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
mod tests;
