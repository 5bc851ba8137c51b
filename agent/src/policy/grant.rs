//! Session grants: what a person approved "for the session", and nothing more than the card showed.
//!
//! | tool | `session` covers | `session_program` covers |
//! | --- | --- | --- |
//! | `run_command` | the same program with the same arguments | the same program with any arguments (not offered for programs that run other programs, [`PROGRAM_RUNNERS`](super::matcher::PROGRAM_RUNNERS)) |
//! | a file tool | the tool on any path in the workspace | not offered |
//! | any other tool (MCP tools) | the tool with any arguments | not offered |
//!
//! Every grant binds to a digest of the tool's spec when it was made: a tool whose name, description, input
//! schema or annotations changed no longer has it. Grants are kept in the store, one row per grant: a grant's id is
//! made from what it covers, so approving the same thing twice keeps one grant.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::matcher::{ToolKind, argv, is_program_runner};
use crate::clock::now_ms;
use crate::ids::{GrantId, RunId, ToolCallId};
use crate::permissions::{Grant, GrantChoice, GrantScope, SessionGrant, quoted, shell_words};
use crate::store::StoredGrant;
use crate::wire::{DecisionScope, ToolSpec};

/// SHA-256 (hex) of a tool's spec, with object keys in a fixed order so that the same definition always gives
/// the same digest.
pub fn spec_digest(spec: &ToolSpec) -> String {
    if let Some((known, digest)) = RECENT_DIGESTS.lock().get(&spec.name)
        && known == spec
    {
        return digest.clone();
    }
    let digest = canonical_digest(&serde_json::to_value(spec).unwrap_or(Value::Null));
    let mut recent = RECENT_DIGESTS.lock();
    if recent.len() >= RECENT_DIGESTS_KEPT {
        recent.clear();
    }
    recent.insert(spec.name.clone(), (spec.clone(), digest.clone()));
    digest
}

/// The digests of the specs asked about lately, by tool name, with the spec each was made from. A card asks for
/// its tool's digest once per scope on offer and a call once per grant check; the same few tools come back again
/// and again, and comparing a spec with the one kept costs a small part of hashing it again. A tool whose spec
/// changed is hashed anew.
static RECENT_DIGESTS: LazyLock<parking_lot::Mutex<HashMap<String, (ToolSpec, String)>>> =
    LazyLock::new(Default::default);

/// How many tools' digests are kept: more than any toolbox has; past it the cache starts over.
const RECENT_DIGESTS_KEPT: usize = 1_024;

/// SHA-256 (hex) of a JSON value with object keys in a fixed order.
fn canonical_digest(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// A grant's id: made from what it covers (the tool, its definition, the scope), so the same grant is one grant.
pub fn grant_id(grant: &Grant) -> GrantId {
    let digest = canonical_digest(&serde_json::to_value(grant).unwrap_or(Value::Null));
    GrantId::parse(format!("grant_{}", &digest[..32])).expect("grant_<hex> is a valid id")
}

/// The session grant approving `tool_call_id` of `run_id` makes.
pub fn session_grant(grant: Grant, run_id: RunId, tool_call_id: ToolCallId) -> SessionGrant {
    SessionGrant {
        id: grant_id(&grant),
        grant,
        granted_at: now_ms(),
        run_id,
        tool_call_id,
    }
}

/// A session grant as the store keeps it: the whole grant as JSON, under its id.
pub fn stored_grant(grant: &SessionGrant) -> StoredGrant {
    StoredGrant {
        id: grant.id.as_str().to_owned(),
        grant: serde_json::to_value(grant).unwrap_or(Value::Null),
        created_at: grant.granted_at,
    }
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The grant approving `input` with `scope` would create, when that scope is on offer for this call.
/// The grant approving a call with `scope` makes, when a person may have edited its arguments: the card offered
/// the grant of the arguments as asked (`asked`), and edited arguments keep that scope only when they make that
/// same grant (a file tool on another path), never another (another command, another program). `Ok(None)` when
/// the scope makes no grant for the call.
pub fn grant_for_approval(
    spec: &ToolSpec,
    asked: &Value,
    edited: Option<&Value>,
    scope: DecisionScope,
) -> Result<Option<Grant>, EditedGrant> {
    let offered = grant_for(spec, asked, scope);
    match (offered, edited) {
        (Some(offered), Some(edited))
            if grant_for(spec, edited, scope).as_ref() != Some(&offered) =>
        {
            Err(EditedGrant { offered })
        }
        (offered, _) => Ok(offered),
    }
}

/// Edited arguments that would make another grant than the one the card offered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "With the edited arguments, approving for the session would allow something else than the card offered ({}). Approve once, or for the session without editing.",
    offered.describe()
)]
pub struct EditedGrant {
    pub offered: Grant,
}

pub fn grant_for(spec: &ToolSpec, input: &Value, scope: DecisionScope) -> Option<Grant> {
    let grant_scope = match (ToolKind::of(&spec.name), scope) {
        (_, DecisionScope::Once) => return None,
        (ToolKind::Command, DecisionScope::Session) => {
            let argv = argv(input)?;
            let (command, args) = argv.split_first()?;
            GrantScope::Command {
                command: (*command).to_owned(),
                args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            }
        }
        (ToolKind::Command, DecisionScope::SessionProgram) => {
            let command = *argv(input)?.first()?;
            if is_program_runner(command) {
                return None;
            }
            GrantScope::Program {
                command: command.to_owned(),
            }
        }
        (ToolKind::WorkspaceFile, DecisionScope::Session) => GrantScope::Workspace,
        (ToolKind::Other, DecisionScope::Session) => GrantScope::AnyCall,
        (ToolKind::WorkspaceFile | ToolKind::Other, DecisionScope::SessionProgram) => return None,
    };
    Some(Grant {
        tool_name: spec.name.clone(),
        spec_digest: spec_digest(spec),
        scope: grant_scope,
    })
}

/// The session scopes a card offers for this call, narrowest first, and a note when a wider one is withheld.
pub fn grant_choices(spec: &ToolSpec, input: &Value) -> (Vec<GrantChoice>, Option<String>) {
    let mut choices = Vec::new();
    let mut note = None;
    if let Some(grant) = grant_for(spec, input, DecisionScope::Session) {
        let covers = match &grant.scope {
            GrantScope::Command { command, args } => format!(
                "For the rest of this session, {} runs again without asking: the same program with the same arguments. Any other command still asks.",
                quoted(&shell_words(command, args))
            ),
            GrantScope::Workspace => format!(
                "For the rest of this session, {} runs without asking on any path in the workspace.",
                spec.name
            ),
            GrantScope::AnyCall | GrantScope::Program { .. } => format!(
                "For the rest of this session, {} runs without asking with any arguments, as long as its definition stays the same.",
                spec.name
            ),
        };
        choices.push(GrantChoice {
            scope: DecisionScope::Session,
            label: "Approve for session".to_owned(),
            covers,
            grant,
        });
    }
    if ToolKind::of(&spec.name) == ToolKind::Command {
        match grant_for(spec, input, DecisionScope::SessionProgram) {
            Some(grant) => {
                let program = match &grant.scope {
                    GrantScope::Program { command } => quoted(&shell_words(command, &[])),
                    _ => String::new(),
                };
                choices.push(GrantChoice {
                    scope: DecisionScope::SessionProgram,
                    label: format!("Approve {program} with any arguments for session"),
                    covers: format!(
                        "For the rest of this session, {program} runs without asking whatever its arguments."
                    ),
                    grant,
                });
            }
            None => {
                if let Some(program) = argv(input).and_then(|argv| argv.first().copied()) {
                    note = Some(format!(
                        "{} runs other programs, so it is never approved with any arguments; only this exact command can be.",
                        quoted(&shell_words(program, &[]))
                    ));
                }
            }
        }
    }
    (choices, note)
}

/// The grants of one session, as the store keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionGrants {
    grants: Vec<SessionGrant>,
}

impl SessionGrants {
    pub fn new() -> Self {
        Self::default()
    }

    /// The grants of stored rows. A row that is not a grant of this kind (kept by an older toolgate, whose grants
    /// covered a whole tool) covers nothing: those calls ask again.
    pub fn from_stored(rows: &[StoredGrant]) -> Self {
        let grants = rows
            .iter()
            .filter_map(
                |row| match serde_json::from_value::<SessionGrant>(row.grant.clone()) {
                    Ok(grant) if grant.id.as_str() == row.id => Some(grant),
                    _ => {
                        tracing::warn!(grant_id = %row.id, "a stored session grant is not one this toolgate reads; it covers nothing");
                        None
                    }
                },
            )
            .collect();
        Self { grants }
    }

    /// Every grant, oldest first.
    pub fn list(&self) -> &[SessionGrant] {
        &self.grants
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Holds `grant`, replacing one with the same id (the same grant, given again).
    pub fn insert(&mut self, grant: SessionGrant) {
        self.grants.retain(|held| held.id != grant.id);
        self.grants.push(grant);
    }

    /// The grant that covers this call, if any: same tool, same definition, and a scope that fits the input.
    pub fn covering(&self, spec: &ToolSpec, input: &Value) -> Option<&SessionGrant> {
        let mut candidates = self
            .grants
            .iter()
            .filter(|held| held.grant.tool_name == spec.name)
            .peekable();
        candidates.peek()?;
        // Computed once per call, and only when the session holds a grant for this tool.
        let digest = spec_digest(spec);
        candidates.find(|held| held.grant.spec_digest == digest && covers(&held.grant, input))
    }
}

fn covers(grant: &Grant, input: &Value) -> bool {
    match &grant.scope {
        GrantScope::Command { command, args } => argv(input).is_some_and(|argv| {
            argv.first() == Some(&command.as_str())
                && argv.len() == args.len() + 1
                && argv[1..].iter().zip(args).all(|(a, b)| *a == b.as_str())
        }),
        GrantScope::Program { command } => {
            argv(input).is_some_and(|argv| argv.first() == Some(&command.as_str()))
        }
        GrantScope::Workspace | GrantScope::AnyCall => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ToolAnnotations;
    use serde_json::json;

    fn spec(name: &str, description: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: json!({"type": "object", "properties": {"a": {}, "b": {}}}),
            annotations: ToolAnnotations::default(),
            mcp: None,
        }
    }

    fn ids() -> (RunId, ToolCallId) {
        (
            RunId::parse("run").unwrap(),
            ToolCallId::parse("call").unwrap(),
        )
    }

    #[test]
    fn a_command_grant_covers_the_same_program_with_the_same_arguments_only() {
        let tool = spec("run_command", "runs");
        let ls = json!({"command": "ls", "args": ["-la"]});
        let mut grants = SessionGrants::new();
        let (run, call) = ids();
        grants.insert(session_grant(
            grant_for(&tool, &ls, DecisionScope::Session).unwrap(),
            run,
            call,
        ));
        assert!(grants.covering(&tool, &ls).is_some());
        for other in [
            json!({"command": "ls"}),
            json!({"command": "ls", "args": ["-la", ".."]}),
            json!({"command": "rm", "args": ["-rf", "x"]}),
            json!({"command": "/bin/ls", "args": ["-la"]}),
        ] {
            assert!(grants.covering(&tool, &other).is_none(), "{other}");
        }
    }

    #[test]
    fn the_program_scope_is_explicit_and_never_for_shells() {
        let tool = spec("run_command", "runs");
        let ls = json!({"command": "ls", "args": ["-l"]});
        let (choices, note) = grant_choices(&tool, &ls);
        let scopes: Vec<DecisionScope> = choices.iter().map(|c| c.scope).collect();
        assert_eq!(
            scopes,
            [DecisionScope::Session, DecisionScope::SessionProgram]
        );
        assert_eq!(note, None);
        let mut grants = SessionGrants::new();
        let (run, call) = ids();
        grants.insert(session_grant(choices[1].grant.clone(), run, call));
        assert!(
            grants
                .covering(&tool, &json!({"command": "ls", "args": ["-la", "/etc"]}))
                .is_some()
        );
        assert!(
            grants
                .covering(&tool, &json!({"command": "lsof"}))
                .is_none()
        );

        // A shell, and a program whose options run others (`find . -exec rm -rf {} +`), never with any arguments.
        for runner in [
            json!({"command": "sh", "args": ["-c", "ls"]}),
            json!({"command": "find", "args": [".", "-name", "*.rs"]}),
            json!({"command": "/usr/bin/git", "args": ["status"]}),
        ] {
            assert_eq!(
                grant_for(&tool, &runner, DecisionScope::SessionProgram),
                None,
                "{runner}"
            );
            let (choices, note) = grant_choices(&tool, &runner);
            assert_eq!(choices.len(), 1, "{runner}");
            assert!(note.unwrap().contains("runs other programs"), "{runner}");
        }
    }

    #[test]
    fn a_changed_definition_drops_the_grant() {
        let before = spec("mcp__github__create_issue", "Creates an issue");
        let input = json!({"repo": "acme/widgets"});
        let mut grants = SessionGrants::new();
        let (run, call) = ids();
        grants.insert(session_grant(
            grant_for(&before, &input, DecisionScope::Session).unwrap(),
            run,
            call,
        ));
        assert!(
            grants
                .covering(&before, &json!({"repo": "other"}))
                .is_some()
        );
        let after = spec(
            "mcp__github__create_issue",
            "Creates an issue and deletes the repo",
        );
        assert!(grants.covering(&after, &input).is_none());
    }

    #[test]
    fn the_digest_does_not_depend_on_key_order() {
        let mut a = spec("t", "d");
        a.input_schema =
            json!({"type": "object", "properties": {"x": {"type": "string"}, "y": {}}});
        let mut b = a.clone();
        b.input_schema = serde_json::from_str(
            r#"{"properties": {"y": {}, "x": {"type": "string"}}, "type": "object"}"#,
        )
        .unwrap();
        assert_eq!(spec_digest(&a), spec_digest(&b));
        assert_eq!(spec_digest(&a).len(), 64);
    }

    #[test]
    fn the_same_grant_is_one_grant_and_survives_the_store() {
        let tool = spec("delete_file", "deletes");
        let mut grants = SessionGrants::new();
        let (run, call) = ids();
        let grant = grant_for(&tool, &json!({"path": "a"}), DecisionScope::Session).unwrap();
        assert_eq!(grant.scope, GrantScope::Workspace);
        let first = session_grant(grant.clone(), run.clone(), call.clone());
        let second = session_grant(grant, run, ToolCallId::parse("later").unwrap());
        assert_eq!(first.id, second.id, "the id says what the grant covers");
        grants.insert(first.clone());
        grants.insert(second.clone());
        assert_eq!(grants.list(), std::slice::from_ref(&second));

        let other = session_grant(
            grant_for(&tool, &json!({"path": "a"}), DecisionScope::Session)
                .map(|mut grant| {
                    grant.tool_name = "write_file".into();
                    grant
                })
                .unwrap(),
            RunId::parse("run").unwrap(),
            ToolCallId::parse("call").unwrap(),
        );
        assert_ne!(other.id, first.id);

        let rows = [stored_grant(&second), stored_grant(&other)];
        let read = SessionGrants::from_stored(&rows);
        assert_eq!(read.list(), [second, other]);
        assert!(read.covering(&tool, &json!({"path": "b"})).is_some());

        // What an older toolgate kept (a whole tool) covers nothing now.
        let old = StoredGrant {
            id: "tool:delete_file".into(),
            grant: json!({"tool": "delete_file"}),
            created_at: 1,
        };
        let read = SessionGrants::from_stored(&[old]);
        assert!(read.is_empty());
        assert!(read.covering(&tool, &json!({"path": "b"})).is_none());
    }
}
