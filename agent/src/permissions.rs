//! What crosses the wire about permissions beyond one decision: session grants, the choices an approval card
//! offers, and rules as they are listed. Plain serde, so the page shares these definitions with the server.

use serde::{Deserialize, Serialize};

use crate::ids::{GrantId, RuleId, RunId, ToolCallId};
use crate::wire::{DecisionScope, RuleAction};

/// What a session grant lets run without asking, within its tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum GrantScope {
    /// `run_command` with this program and exactly these arguments: what the card showed.
    Command { command: String, args: Vec<String> },
    /// `run_command` with this program and any arguments: a wider scope the person chose explicitly.
    Program { command: String },
    /// A file tool on any path inside the workspace (the tool itself refuses paths outside it).
    Workspace,
    /// Any call of the tool, as long as its definition stays the same.
    AnyCall,
}

/// What a grant covers: one tool, as it was defined when the grant was made, and a scope within it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub tool_name: String,
    /// SHA-256 (hex) of the tool's spec (name, description, input schema, annotations, and for an MCP tool its
    /// server's name, trust and endpoint) when the grant was made. A tool whose definition changed no longer has the
    /// grant.
    pub spec_digest: String,
    pub scope: GrantScope,
}

impl Grant {
    /// What the grant covers, in words a person reads on the card and in the list of grants.
    pub fn describe(&self) -> String {
        let tool = &self.tool_name;
        match &self.scope {
            GrantScope::Command { command, args } => {
                format!("{tool}: exactly {}", quoted(&shell_words(command, args)))
            }
            GrantScope::Program { command } => {
                format!(
                    "{tool}: {} with any arguments",
                    quoted(&shell_words(command, &[]))
                )
            }
            GrantScope::Workspace => format!("{tool} on any path in the workspace"),
            GrantScope::AnyCall => {
                format!("{tool} with any arguments, while its definition stays the same")
            }
        }
    }
}

/// Words a person reads as one thing (a command, a program) set off from the sentence around them. The texts of
/// cards and lists are plain text: no markup that a page would have to interpret.
pub fn quoted(text: &str) -> String {
    format!("“{text}”")
}

/// A program and its arguments as a person would type them, quoted where a shell would need it.
pub fn shell_words(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .map(|word| {
            shlex::try_quote(word)
                .map(|quoted| quoted.into_owned())
                // A word with a NUL byte cannot be quoted; show it escaped rather than not at all.
                .unwrap_or_else(|_| format!("{word:?}"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A grant as a session holds it: what it covers, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionGrant {
    pub id: GrantId,
    #[serde(flatten)]
    pub grant: Grant,
    /// Milliseconds since the Unix epoch.
    pub granted_at: u64,
    /// The run and the call whose approval made the grant.
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
}

/// One way to approve a call for the session, as the card offers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantChoice {
    pub scope: DecisionScope,
    /// The button's words.
    pub label: String,
    /// What approving this way lets run without asking for the rest of the session, in a sentence.
    pub covers: String,
    /// The grant this choice creates.
    pub grant: Grant,
}

/// What an approval card offers beyond approving once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalChoices {
    /// The session scopes on offer, narrowest first. Empty when none applies (a `strict` run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub session: Vec<GrantChoice>,
    /// Why a session scope is not offered, or a wider one is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_note: Option<String>,
    /// The narrowest rule that always allows this call, which "Always allow" adds once the person confirms it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_allow: Option<String>,
    /// Why "Always allow" is not offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_allow_note: Option<String>,
}

impl ApprovalChoices {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The choice for a session scope, when the card offers it.
    pub fn session_choice(&self, scope: DecisionScope) -> Option<&GrantChoice> {
        self.session.iter().find(|choice| choice.scope == scope)
    }

    /// True when approving with `scope` is something the card offered (approving once always is).
    pub fn offers(&self, scope: DecisionScope) -> bool {
        scope == DecisionScope::Once || self.session_choice(scope).is_some()
    }
}

/// Where a rule comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleOrigin {
    /// `--rules` (or `TOOLGATE_RULES`).
    Flag,
    /// A `[[rule]]` of the rules file.
    File,
    /// A server's `rules` in the MCP configuration (`--mcp-config`).
    Mcp,
    /// Added by a person ("Always allow", or `POST /api/rules`) and kept in the store; the only rules that can be
    /// removed over the API.
    Added,
}

impl RuleOrigin {
    /// Where the rule comes from, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Flag => "--rules",
            Self::File => "the rules file",
            Self::Mcp => "the MCP configuration",
            Self::Added => "added by a person",
        }
    }

    /// Where the rule comes from, said of it: `from --rules`, `added by a person`.
    pub fn said(self) -> String {
        match self {
            Self::Added => self.describe().to_owned(),
            _ => format!("from {}", self.describe()),
        }
    }
}

/// A rule as the API and the page list it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedRule {
    pub id: RuleId,
    /// The rule in the `--rules` syntax, for example `run_command(git status)=allow`.
    pub rule: String,
    pub action: RuleAction,
    pub origin: RuleOrigin,
    /// Milliseconds since the Unix epoch, for added rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_at: Option<u64>,
    /// Who added it, as the authentication layer named them, for added rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_by: Option<String>,
}

impl ListedRule {
    /// Only rules a person added can be removed over the API; the others live in the configuration.
    pub fn removable(&self) -> bool {
        self.origin == RuleOrigin::Added
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_session_grant_serialises_with_its_scope() {
        let grant = SessionGrant {
            id: GrantId::parse("grant_1").unwrap(),
            grant: Grant {
                tool_name: "run_command".into(),
                spec_digest: "ab".into(),
                scope: GrantScope::Command {
                    command: "ls".into(),
                    args: vec!["-la".into()],
                },
            },
            granted_at: 5,
            run_id: RunId::parse("run_1").unwrap(),
            tool_call_id: ToolCallId::parse("call_1").unwrap(),
        };
        let value = serde_json::to_value(&grant).unwrap();
        assert_eq!(
            value,
            json!({
                "id": "grant_1", "toolName": "run_command", "specDigest": "ab",
                "scope": {"type": "command", "command": "ls", "args": ["-la"]},
                "grantedAt": 5, "runId": "run_1", "toolCallId": "call_1"
            })
        );
        assert_eq!(
            serde_json::from_value::<SessionGrant>(value).unwrap(),
            grant
        );
        assert_eq!(grant.grant.describe(), "run_command: exactly “ls -la”");
    }

    #[test]
    fn commands_are_shown_quoted_like_a_shell() {
        assert_eq!(
            shell_words("git", &["commit".into(), "-m".into(), "fix it".into()]),
            "git commit -m 'fix it'"
        );
        assert_eq!(shell_words("echo", &["".into()]), "echo ''");
    }

    #[test]
    fn once_is_always_offered_and_session_scopes_only_when_listed() {
        let choices = ApprovalChoices::default();
        assert!(choices.is_empty());
        assert!(choices.offers(DecisionScope::Once));
        assert!(!choices.offers(DecisionScope::Session));
        assert!(!choices.offers(DecisionScope::SessionProgram));
    }
}
