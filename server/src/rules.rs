//! The permission rules the server runs with (`--rules`, `--rules-file`, and the rules people added, which the
//! database keeps), and `toolgate rules check`, which shows what they decide for one call before anyone trusts
//! them.

use std::fmt::Write as _;
use std::sync::Arc;

use agent::mcp::{McpConfig, policy_rules};
use agent::policy::{
    ConfiguredRules, PathContext, PermissionPolicy, RuleBook, RulesFile, RulesFileError,
    SessionGrants, StoredRuleBook,
};
use agent::store::Store;
use agent::store::sql::{DatabaseUrl, SqlStore};
use agent::tools::{CommandLimits, Workspace, workspace_tools};
use agent::wire::{McpToolOrigin, PermissionDecision, ToolAnnotations, ToolSpec};
use serde_json::Value;

use crate::config::{Config, Database};

/// Why the rules cannot be set up; the server does not start.
#[derive(Debug, thiserror::Error)]
pub enum RulesSetupError {
    #[error(transparent)]
    File(#[from] RulesFileError),
    #[error("cannot check how the workspace treats case: {0}")]
    Probe(std::io::Error),
}

/// The rules of `--rules`, of the rules file and of the MCP servers' configuration, read-only for as long as
/// toolgate runs.
pub fn configured_rules(
    config: &Config,
    mcp_config: &McpConfig,
) -> Result<ConfiguredRules, RulesSetupError> {
    let file_rules = match &config.rules_file {
        Some(path) => RulesFile::new(path).load()?,
        None => Vec::new(),
    };
    Ok(ConfiguredRules::new(config.rules.clone(), file_rules)
        .with_mcp_rules(policy_rules(mcp_config)))
}

/// The server's policy: `--policy`, the configured rules, and paths read through the workspace. The harness adds
/// the rules people added, from its store.
pub fn permission_policy(
    config: &Config,
    configured: ConfiguredRules,
    workspace: &Workspace,
) -> Result<PermissionPolicy, RulesSetupError> {
    let paths = PathContext::for_workspace(workspace.root()).map_err(RulesSetupError::Probe)?;
    Ok(PermissionPolicy::with_rules(config.policy, Arc::new(configured)).with_paths(paths))
}

/// The decision for one call, what made it, and anything else the person should know about the call.
pub async fn check(config: &Config, tool: &str, arguments: &str) -> Result<String, String> {
    let input: Value = serde_json::from_str(arguments)
        .map_err(|error| format!("the arguments are not JSON: {error}"))?;
    if !input.is_object() {
        return Err(
            "the arguments must be a JSON object, for example '{\"path\": \"a.txt\"}'".to_owned(),
        );
    }
    let mcp_config = McpConfig::load(&config.mcp_config, &|name| std::env::var(name).ok())
        .map_err(|error| error.to_string())?;
    let configured = configured_rules(config, &mcp_config).map_err(|error| error.to_string())?;
    let mut notes = Vec::new();
    let (book, added): (Arc<dyn RuleBook>, _) =
        match added_rules(config, configured.rules()).await? {
            Some(book) => (Arc::new(book), true),
            None => (Arc::new(configured), false),
        };
    if !added {
        notes.push(
            "no rules people added were read (no database yet, or --database-url memory): only the configured rules were checked"
                .to_owned(),
        );
    }
    // A check reads; it creates nothing. A workspace not made yet is read as the empty directory it will be made as.
    let _empty;
    let root = if config.workspace.exists() {
        config.workspace.clone()
    } else {
        notes.push(format!(
            "the workspace {} does not exist yet: paths were read as in an empty one",
            config.workspace.display()
        ));
        _empty = tempfile::tempdir()
            .map_err(|error| format!("cannot make an empty directory to read paths in: {error}"))?;
        _empty.path().to_owned()
    };
    let workspace = Workspace::open(&root).map_err(|error| {
        format!(
            "cannot open the workspace {}: {error}",
            config.workspace.display()
        )
    })?;
    let toolbox = workspace_tools(&workspace, CommandLimits::default());
    let paths = PathContext::for_workspace(workspace.root())
        .map_err(|error| RulesSetupError::Probe(error).to_string())?;
    let policy = PermissionPolicy::with_rules(config.policy, book).with_paths(paths);
    let spec = match toolbox.lookup(tool) {
        Some(registered) => {
            if let Err(error) = toolbox.validate(tool, &input) {
                notes.push(format!(
                    "these arguments would be refused before anything runs: {}",
                    error.message
                ));
            }
            registered.spec().clone()
        }
        None => match mcp_tool(&mcp_config, tool) {
            Some(spec) => {
                if let Some(origin) = &spec.mcp {
                    notes.push(format!(
                        "{tool:?} was checked as the tool {:?} of the MCP server {:?}, which a check does not start: as one that claims nothing in its annotations, under the name the model sees, {}",
                        origin.tool, origin.server, spec.name
                    ));
                }
                spec
            }
            None => {
                notes.push(format!(
                    "toolgate has no tool named {tool:?} now; it was checked as a tool that gives no annotations"
                ));
                ToolSpec {
                    name: tool.to_owned(),
                    description: String::new(),
                    input_schema: serde_json::json!({"type": "object"}),
                    annotations: ToolAnnotations::default(),
                    mcp: None,
                }
            }
        },
    };
    let verdict = policy.explain(&spec, &input, &SessionGrants::new());
    let kind = match &verdict.decision {
        PermissionDecision::Allow { .. } => "allow",
        PermissionDecision::Ask { .. } => "ask",
        PermissionDecision::Deny { .. } => "deny",
    };
    let mut report = String::new();
    let _ = writeln!(report, "{kind}: {}", verdict.decision.reason());
    let _ = writeln!(report, "decided by: {}", verdict.decided_by);
    for note in notes {
        let _ = writeln!(report, "note: {note}");
    }
    Ok(report)
}

/// The tool `name` (`mcp__<server>__<tool>`, the tool's name uncut) of a configured MCP server, as the policy would
/// see it were the server started: under the name the model sees (cut short where it is long) and from that server,
/// with its trust; its definition is the server's to give, so it claims nothing here.
fn mcp_tool(config: &McpConfig, name: &str) -> Option<ToolSpec> {
    config
        .servers
        .iter()
        .filter(|server| server.enabled)
        .find_map(|server| {
            let real = name
                .strip_prefix(&format!("mcp__{}__", server.tool_prefix_name))
                .filter(|real| !real.is_empty() && server.offers(real))?;
            Some(ToolSpec {
                name: agent::mcp::naming::qualified_name(&server.tool_prefix_name, real),
                description: String::new(),
                input_schema: serde_json::json!({"type": "object"}),
                annotations: ToolAnnotations::default(),
                mcp: Some(McpToolOrigin {
                    server: server.name.clone(),
                    tool: real.to_owned(),
                    trust: server.trust,
                    endpoint: server.transport.endpoint_digest(),
                }),
            })
        })
}

/// The configured rules and the ones people added, as the database keeps them (read-only, beside a running
/// server). `None` when there is nothing to read: a memory store, or a SQLite file not created yet.
async fn added_rules(
    config: &Config,
    configured: Arc<[agent::policy::BookRule]>,
) -> Result<Option<StoredRuleBook>, String> {
    let url = match &config.database_url {
        Database::Memory => return Ok(None),
        Database::Sql(DatabaseUrl::Sqlite(path)) if !path.exists() => return Ok(None),
        Database::Sql(url) => url,
    };
    let store: Arc<dyn Store> = SqlStore::read_only(url)
        .await
        .map_err(|error| error.to_string())?;
    StoredRuleBook::open(configured, store)
        .await
        .map(Some)
        .map_err(|error| format!("cannot read the rules people added: {error}"))
}
