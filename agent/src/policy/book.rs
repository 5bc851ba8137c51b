//! Where rules live, behind one small trait the policy reads for every call, [`RuleBook`]:
//!
//! - configured rules (`--rules`, the rules file's `[[rule]]` tables) are fixed when toolgate starts and read-only:
//!   they can only be changed where they are written, and then toolgate restarted;
//! - rules a person added ("Always allow", `POST /api/rules`) are kept in the [`Store`], the one source of truth:
//!   they survive a restart with a durable store and are shared by every instance on one database.
//!
//! [`ConfiguredRules`] is a book of configured rules alone (what `toolgate rules check` starts from, and tests);
//! [`StoredRuleBook`] adds the store's rules, keeps them in memory for the policy, and is the only way rules are
//! added and removed: each change is written, with its audit entry, before it is in force.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::rule::{Rule, RuleEntry, RuleError, RuleProblem, split_rules};
use crate::clock::now_ms;
use crate::ids::RuleId;
use crate::logged_once::LoggedOnce;
use crate::permissions::{ListedRule, RuleOrigin};
use crate::store::{AuditEntry, AuditKind, Store, StoreError, StoreKind, StoredRule};

/// Rules as `--rules` writes them: separated by commas outside parentheses and quotes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleSet(Vec<Rule>);

impl RuleSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, rule: Rule) -> Self {
        self.0.push(rule);
        self
    }

    pub fn rules(&self) -> &[Rule] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for RuleSet {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts = split_rules(s).map_err(|problem| RuleError {
            rule: format!("list {:?}", s.trim()),
            problem,
        })?;
        let mut rules = Vec::new();
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            rules.push(Rule::parse(part)?);
        }
        Ok(Self(rules))
    }
}

impl fmt::Display for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let written: Vec<String> = self.0.iter().map(Rule::to_string).collect();
        f.write_str(&written.join(","))
    }
}

/// A rule in a book: its id, where it comes from, and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BookRule {
    pub id: RuleId,
    pub origin: RuleOrigin,
    pub added_at: Option<u64>,
    pub added_by: Option<String>,
    pub rule: Rule,
}

impl BookRule {
    pub fn listed(&self) -> ListedRule {
        ListedRule {
            id: self.id.clone(),
            rule: self.rule.to_string(),
            action: self.rule.action(),
            origin: self.origin,
            added_at: self.added_at,
            added_by: self.added_by.clone(),
        }
    }
}

/// Why a rule book refused a change; it changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum RuleBookError {
    #[error("No rule {0} is known.")]
    NotFound(RuleId),
    #[error(
        "Rule {id} ({rule}) comes from {}; it can only be removed there, and the server restarted.",
        origin.describe()
    )]
    NotRemovable {
        id: RuleId,
        rule: String,
        origin: RuleOrigin,
    },
    #[error("The rule {rule} is already in force as {id}.")]
    AlreadyPresent { id: RuleId, rule: String },
    /// A rule the store keeps no longer reads as a rule: nothing is decided on a book that misses one.
    #[error(
        "the rule {id} kept in the database cannot be read ({error}); remove it (DELETE /api/rules/{id} on an instance that runs, or its row of the rules table), or run the toolgate that added it"
    )]
    Stored { id: String, error: RuleError },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RuleBookError {
    /// The HTTP status of a refused change of the rules: the rules API's and the page's.
    pub fn status(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::NotRemovable { .. } => 403,
            Self::AlreadyPresent { .. } => 409,
            Self::Stored { .. } => 500,
            Self::Store(_) => 503,
        }
    }
}

/// The rules in force, as the policy reads them for every call.
pub trait RuleBook: Send + Sync + fmt::Debug {
    /// Every rule in force, configured ones first; cheap to call for every tool call.
    fn rules(&self) -> Arc<[BookRule]>;

    fn list(&self) -> Vec<ListedRule> {
        self.rules().iter().map(BookRule::listed).collect()
    }

    /// Reads the rules again where another process may have changed them (a store several instances share):
    /// before each step's calls are decided, as the session's grants are. A book nobody else writes has nothing to
    /// read. When the store cannot say, the rules read last stay in force (dropping them would drop the denials
    /// too), and the book logs why.
    fn reread_shared(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The configured rules alone: `--rules` first (`flag-1`, `flag-2`, ...), then the rules file's (`file-1`, ...).
#[derive(Clone, Debug, Default)]
pub struct ConfiguredRules {
    rules: Arc<[BookRule]>,
}

impl ConfiguredRules {
    pub fn new(flag_rules: RuleSet, file_rules: Vec<Rule>) -> Self {
        let numbered = |origin: RuleOrigin, prefix: &'static str, rules: Vec<Rule>| {
            rules
                .into_iter()
                .enumerate()
                .map(move |(i, rule)| BookRule {
                    id: RuleId::parse(format!("{prefix}-{}", i + 1))
                        .expect("prefix-N is a valid id"),
                    origin,
                    added_at: None,
                    added_by: None,
                    rule,
                })
        };
        Self {
            rules: numbered(RuleOrigin::Flag, "flag", flag_rules.0)
                .chain(numbered(RuleOrigin::File, "file", file_rules))
                .collect(),
        }
    }
}

impl ConfiguredRules {
    /// These rules and, after them, the MCP configuration's (`mcp-1`, `mcp-2`, ...).
    pub fn with_mcp_rules(self, mcp_rules: Vec<Rule>) -> Self {
        let rules = self
            .rules
            .iter()
            .cloned()
            .chain(mcp_rules.into_iter().enumerate().map(|(i, rule)| BookRule {
                id: RuleId::parse(format!("mcp-{}", i + 1)).expect("mcp-N is a valid id"),
                origin: RuleOrigin::Mcp,
                added_at: None,
                added_by: None,
                rule,
            }))
            .collect();
        Self { rules }
    }
}

impl RuleBook for ConfiguredRules {
    fn rules(&self) -> Arc<[BookRule]> {
        Arc::clone(&self.rules)
    }
}

/// The id of an added rule: made from its text, so that the same rule added twice (by two people at once, or on
/// two instances) is one row.
pub fn added_rule_id(rule: &Rule) -> RuleId {
    let digest = Sha256::digest(rule.to_string().as_bytes());
    RuleId::parse(format!("rule_{}", &hex::encode(digest)[..16])).expect("rule_<hex> is a valid id")
}

/// The configured rules and the rules people added, which the store keeps.
///
/// The policy reads a copy held in memory. Every change made here updates it; with a store that several
/// instances share, [`StoredRuleBook::refresh`] reads the store again (a run does before each step's calls are
/// decided: [`RuleBook::reread_shared`]), so that a rule one instance added or removed applies on the others too. A
/// store only one process uses (memory, SQLite) has no other writer, so its copy is always current.
pub struct StoredRuleBook {
    configured: Arc<[BookRule]>,
    store: Arc<dyn Store>,
    /// The rules in force, and the number of the read (or change) they come from.
    in_force: RwLock<(u64, Arc<[BookRule]>)>,
    /// The number the next read of the store, or the next change, takes: a read that began before a change (or
    /// before another read) and ended after it does not put back what it read.
    reads: AtomicU64,
    /// One change at a time in this process: the check for a rule already in force and its write do not
    /// interleave with another change's.
    changing: tokio::sync::Mutex<()>,
    /// What a test has happen while a removal is between its read of the rules and its write.
    #[cfg(test)]
    meanwhile: parking_lot::Mutex<Option<Meanwhile>>,
}

#[cfg(test)]
type Meanwhile = Box<dyn FnOnce(&StoredRuleBook) + Send>;

impl fmt::Debug for StoredRuleBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRuleBook")
            .field("in_force", &self.in_force.read().1.len())
            .field("store", &self.store.kind())
            .finish()
    }
}

impl RuleBook for StoredRuleBook {
    fn rules(&self) -> Arc<[BookRule]> {
        Arc::clone(&self.in_force.read().1)
    }

    fn reread_shared(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.store.kind() != StoreKind::Postgres {
                return;
            }
            match self.refresh().await {
                Ok(_) => {}
                // What reads is in force; the row that does not is said once, not at every step.
                Err(RuleBookError::Stored { id, error }) => {
                    static UNREADABLE: std::sync::LazyLock<LoggedOnce<String>> =
                        std::sync::LazyLock::new(LoggedOnce::default);
                    if UNREADABLE.first(id.clone()) {
                        tracing::error!("{}", RuleBookError::Stored { id, error });
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the rules people added; the rules read last stay in force");
                }
            }
        })
    }
}

impl StoredRuleBook {
    /// A book of `configured` rules over a store that keeps no added rules yet (a new memory store).
    pub fn new(configured: Arc<[BookRule]>, store: Arc<dyn Store>) -> Self {
        Self {
            in_force: RwLock::new((0, Arc::clone(&configured))),
            reads: AtomicU64::new(1),
            configured,
            store,
            changing: tokio::sync::Mutex::new(()),
            #[cfg(test)]
            meanwhile: Default::default(),
        }
    }

    /// A book of `configured` rules and the added rules `store` keeps now. A kept rule that does not read as a
    /// rule is an error: a book that silently missed it could allow what it denies.
    pub async fn open(
        configured: Arc<[BookRule]>,
        store: Arc<dyn Store>,
    ) -> Result<Self, RuleBookError> {
        let book = Self::new(configured, store);
        book.refresh().await?;
        Ok(book)
    }

    /// Reads the added rules again; the rules in force are unchanged when that fails, and when a change made here
    /// (or a later read) put in force something newer than this read meanwhile. Returns what it read.
    pub async fn refresh(&self) -> Result<Arc<[BookRule]>, RuleBookError> {
        let read = self.next_number();
        let stored = self.store.rules().await?;
        self.put_read_in_force(read, stored)
    }

    fn next_number(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::Relaxed)
    }

    /// The added rules `stored`, read from the store as read number `read`, with the configured ones: put in force
    /// unless something newer is. A row that does not read as a rule is an error (the first is named), but what
    /// reads goes in force all the same, with the version in force of a row that read before (damaged since): the
    /// rules people removed elsewhere stop applying, and nothing that applied stops for a row this version never
    /// read. (Opening a book refuses such a row: see [`Self::open`].)
    fn put_read_in_force(
        &self,
        read: u64,
        stored: Vec<StoredRule>,
    ) -> Result<Arc<[BookRule]>, RuleBookError> {
        let before = self.rules();
        let mut added = Vec::with_capacity(stored.len());
        let mut unreadable = None;
        for row in stored {
            let held = before
                .iter()
                .find(|held| held.origin == RuleOrigin::Added && held.id.as_str() == row.id);
            // A rule in force already, as the row says it, is not parsed again (its globs compiled again): on a
            // shared database the book is read before every step.
            if let Some(held) = held.filter(|held| held.rule.to_string() == row.rule) {
                added.push(kept(&row, held.id.clone(), held.rule.clone()));
                continue;
            }
            let parsed = Rule::parse(&row.rule).and_then(|rule| {
                RuleId::parse(row.id.as_str())
                    .map(|id| (id, rule))
                    .map_err(|error| RuleError {
                        rule: format!("{:?}", row.rule),
                        problem: RuleProblem::Entry(format!("its id is not valid: {error}")),
                    })
            });
            match parsed {
                Ok((id, rule)) => added.push(kept(&row, id, rule)),
                // Added before such globs were refused: it allowed nothing, and passing it over changes no decision.
                Err(RuleError {
                    problem: RuleProblem::AllowsNothing(_),
                    ..
                }) => {
                    static PASSED_OVER: std::sync::LazyLock<LoggedOnce<String>> =
                        std::sync::LazyLock::new(LoggedOnce::default);
                    if PASSED_OVER.first(row.id.clone()) {
                        tracing::warn!(
                            id = row.id,
                            rule = row.rule,
                            "a kept rule allows nothing (an allow glob with . or :); it is passed over"
                        );
                    }
                }
                Err(error) => {
                    added.extend(held.cloned());
                    unreadable.get_or_insert(RuleBookError::Stored { id: row.id, error });
                }
            }
        }
        let in_force = self.put_in_force(read, added);
        match unreadable {
            Some(error) => Err(error),
            None => Ok(in_force),
        }
    }

    /// Puts the configured rules and `added` in force as of `number`, unless what is in force is newer.
    fn put_in_force(&self, number: u64, added: Vec<BookRule>) -> Arc<[BookRule]> {
        let in_force: Arc<[BookRule]> = self.configured.iter().cloned().chain(added).collect();
        let mut held = self.in_force.write();
        if number > held.0 {
            *held = (number, Arc::clone(&in_force));
        }
        in_force
    }

    fn added(in_force: &[BookRule]) -> Vec<BookRule> {
        in_force
            .iter()
            .filter(|rule| rule.origin == RuleOrigin::Added)
            .cloned()
            .collect()
    }

    /// Adds a rule a person confirmed, by `actor`. Kept, with its audit entry, before it is in force.
    pub async fn add(&self, rule: Rule, actor: &str) -> Result<BookRule, RuleBookError> {
        let _one_at_a_time = self.changing.lock().await;
        let in_force = self.refresh().await?;
        if let Some(present) = in_force.iter().find(|held| held.rule == rule) {
            return Err(RuleBookError::AlreadyPresent {
                id: present.id.clone(),
                rule: rule.to_string(),
            });
        }
        let entry = BookRule {
            id: added_rule_id(&rule),
            origin: RuleOrigin::Added,
            added_at: Some(now_ms()),
            added_by: Some(actor.to_owned()),
            rule,
        };
        let stored = StoredRule {
            id: entry.id.as_str().to_owned(),
            rule: entry.rule.to_string(),
            created_at: entry.added_at.unwrap_or_default(),
            created_by: entry.added_by.clone(),
        };
        if !self
            .store
            .add_rule(stored, rule_audit(&entry, "added", actor))
            .await?
        {
            // Another instance added it since this book read the store: it is in force there, and here once read.
            // The answer is the same whether or not that read works now.
            if let Err(error) = self.refresh().await {
                tracing::warn!(%error, "cannot read the rules again after another instance added one");
            }
            return Err(RuleBookError::AlreadyPresent {
                id: entry.id,
                rule: entry.rule.to_string(),
            });
        }
        let mut added = Self::added(&in_force);
        added.push(entry.clone());
        self.put_in_force(self.next_number(), added);
        Ok(entry)
    }

    /// Removes a rule a person added, by `actor`. Configured rules are refused. A kept row that does not read as a
    /// rule (passed over, or one a newer version wrote) is removed too, by its id: it is the way out of a book that
    /// does not read, short of mending the database by hand.
    pub async fn remove(&self, id: &RuleId, actor: &str) -> Result<Removed, RuleBookError> {
        if let Some(configured) = self.configured.iter().find(|rule| &rule.id == id) {
            return Err(RuleBookError::NotRemovable {
                id: id.clone(),
                rule: configured.rule.to_string(),
                origin: configured.origin,
            });
        }
        let _one_at_a_time = self.changing.lock().await;
        let stored = self.store.rules().await?;
        let row = stored
            .iter()
            .find(|row| row.id == id.as_str())
            .ok_or_else(|| RuleBookError::NotFound(id.clone()))?;
        let removed = match Rule::parse(&row.rule) {
            Ok(rule) => Removed::Rule(Box::new(kept(row, id.clone(), rule))),
            Err(_) => Removed::Unreadable {
                id: id.clone(),
                text: row.rule.clone(),
            },
        };
        #[cfg(test)]
        if let Some(meanwhile) = self.meanwhile.lock().take() {
            meanwhile(self);
        }
        let existed = self
            .store
            .remove_rule(id.as_str(), removed.audit("removed", actor))
            .await?;
        // Numbered once written: a read that began before (whatever it saw) does not put the rule back. Another
        // row that does not read is for whoever reads the book to hear about; this one is gone either way.
        let left = stored
            .into_iter()
            .filter(|row| row.id != id.as_str())
            .collect();
        let _ = self.put_read_in_force(self.next_number(), left);
        if existed {
            Ok(removed)
        } else {
            // Another instance removed it between the read and the write.
            Err(RuleBookError::NotFound(id.clone()))
        }
    }
}

/// The rule a person added, `rule` with its `id`, as its kept `row` says who added it and when.
fn kept(row: &StoredRule, id: RuleId, rule: Rule) -> BookRule {
    BookRule {
        id,
        origin: RuleOrigin::Added,
        added_at: Some(row.created_at),
        added_by: row.created_by.clone(),
        rule,
    }
}

/// A rule removed: one in force, or a kept row that did not read as a rule.
#[derive(Clone, Debug)]
pub enum Removed {
    Rule(Box<BookRule>),
    Unreadable { id: RuleId, text: String },
}

impl Removed {
    pub fn id(&self) -> &RuleId {
        match self {
            Self::Rule(rule) => &rule.id,
            Self::Unreadable { id, .. } => id,
        }
    }

    /// Its text, as it was kept.
    pub fn text(&self) -> String {
        match self {
            Self::Rule(rule) => rule.rule.to_string(),
            Self::Unreadable { text, .. } => text.clone(),
        }
    }

    fn audit(&self, outcome: &str, actor: &str) -> AuditEntry {
        match self {
            Self::Rule(rule) => rule_audit(rule, outcome, actor),
            Self::Unreadable { text, .. } => AuditEntry {
                tool: None,
                reason: Some(text.clone()),
                ..rule_audit_of(outcome, actor)
            },
        }
    }
}

/// The audit entry of a rule added or removed: the rule's text as its reason.
fn rule_audit(rule: &BookRule, outcome: &str, actor: &str) -> AuditEntry {
    AuditEntry {
        tool: Some(rule.rule.tool_pattern().to_owned()),
        reason: Some(rule.rule.to_string()),
        ..rule_audit_of(outcome, actor)
    }
}

/// The audit entry of a change of the rules by `actor`, naming nothing yet.
fn rule_audit_of(outcome: &str, actor: &str) -> AuditEntry {
    AuditEntry {
        source: Some("user".to_owned()),
        actor: Some(actor.to_owned()),
        ..AuditEntry::new(AuditKind::RuleChanged, outcome)
    }
}

/// Why a rules file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RulesFileError {
    #[error("cannot read the rules file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the rules file {path} is not valid: {message}")]
    Syntax { path: String, message: String },
    #[error("the rules file {path}: {which}: {problem}")]
    Rule {
        path: String,
        /// Which entry, for example `[[rule]] 3 (tool = "read_file")`.
        which: String,
        problem: RuleProblem,
    },
}

/// The rules of a TOML table: its `rule` array of tables, in the [`RuleEntry`] shape. The MCP configuration's
/// per-tool rules use the same shape. `origin` names the table in errors.
pub fn parse_rules_table(table: &toml::Table, origin: &str) -> Result<Vec<Rule>, RulesFileError> {
    let entries = match table.get("rule") {
        None => Vec::new(),
        Some(value) => value
            .clone()
            .try_into::<Vec<RuleEntry>>()
            .map_err(|error| RulesFileError::Syntax {
                path: origin.to_owned(),
                message: format!("[[rule]]: {}", error.message()),
            })?,
    };
    parse_rule_entries(&entries, origin)
}

/// Rules from entries already read (for a configuration that embeds `Vec<RuleEntry>`).
pub fn parse_rule_entries(
    entries: &[RuleEntry],
    origin: &str,
) -> Result<Vec<Rule>, RulesFileError> {
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            Rule::from_entry(entry).map_err(|problem| RulesFileError::Rule {
                path: origin.to_owned(),
                which: format!("[[rule]] {} (tool = {:?})", i + 1, entry.tool),
                problem,
            })
        })
        .collect()
}

/// The whole file: `[[rule]]` entries a person writes. toolgate never writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    #[serde(default)]
    rule: Vec<RuleEntry>,
}

/// A TOML rules file, read once at startup.
#[derive(Clone, Debug)]
pub struct RulesFile {
    path: PathBuf,
}

impl RulesFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn load(&self) -> Result<Vec<Rule>, RulesFileError> {
        let shown = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|source| RulesFileError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// Reads a rules file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Vec<Rule>, RulesFileError> {
        let shape: FileShape = toml::from_str(text).map_err(|error| RulesFileError::Syntax {
            path: origin.to_owned(),
            message: error.message().to_owned(),
        })?;
        parse_rule_entries(&shape.rule, origin)
    }
}

/// How many rules come from where, for a compact log line.
pub fn summary(rules: &[BookRule]) -> String {
    let mut by_origin: BTreeMap<String, usize> = BTreeMap::new();
    for rule in rules {
        *by_origin.entry(rule.origin.said()).or_default() += 1;
    }
    if by_origin.is_empty() {
        return "none".to_owned();
    }
    by_origin
        .iter()
        .map(|(origin, count)| format!("{count} {origin}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::AuditQuery;
    use crate::store::memory::MemoryStore;

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap()
    }

    #[test]
    fn the_flag_separates_rules_at_commas_outside_parentheses_and_quotes() {
        let set: RuleSet =
            "run_command(git status)=allow, read_file({.env,.envrc})=deny,x(a=\"1,2\")=ask:\"no, never\""
                .parse()
                .unwrap();
        let written: Vec<String> = set.rules().iter().map(Rule::to_string).collect();
        assert_eq!(
            written,
            [
                "run_command(git status)=allow",
                "read_file({.env,.envrc})=deny",
                "x(a=\"1,2\")=ask:\"no, never\""
            ]
        );
        assert_eq!("".parse::<RuleSet>().unwrap(), RuleSet::new());
        let error = "a=allow,b(=deny".parse::<RuleSet>().unwrap_err();
        assert_eq!(error.problem, RuleProblem::Unbalanced);
        let error = "a=allow,b=maybe".parse::<RuleSet>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "rule \"b=maybe\": unknown action \"maybe\": expected allow, ask or deny"
        );
    }

    #[test]
    fn the_summary_counts_rules_by_where_they_come_from_in_words() {
        let rules: Vec<BookRule> = [
            ("flag-1", RuleOrigin::Flag),
            ("flag-2", RuleOrigin::Flag),
            ("rule_1", RuleOrigin::Added),
        ]
        .into_iter()
        .map(|(id, origin)| BookRule {
            id: RuleId::parse(id).unwrap(),
            origin,
            added_at: None,
            added_by: None,
            rule: rule("read_file=allow"),
        })
        .collect();
        assert_eq!(summary(&rules), "1 added by a person, 2 from --rules");
        assert_eq!(summary(&[]), "none");
    }

    fn book(flags: &str, store: &Arc<dyn Store>) -> StoredRuleBook {
        let configured = ConfiguredRules::new(flags.parse().unwrap(), Vec::new());
        StoredRuleBook::new(configured.rules(), Arc::clone(store))
    }

    /// A read of the store that began before a change here and ends after it (a listing, which the rules panel makes
    /// on every opening, while another tab removes a rule) does not put back what it read: the removed rule stays
    /// out of force, an added one in force. Before, the late read's rules were put in force whatever came between.
    #[tokio::test]
    async fn a_read_of_the_rules_that_began_before_a_change_does_not_undo_it() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let book = book("", &store);
        let added = book
            .add(rule("run_command(ls $)=allow"), "local")
            .await
            .unwrap();
        let read = book.next_number();
        let stored = store.rules().await.unwrap();
        book.remove(&added.id, "local").await.unwrap();
        let listed = book.put_read_in_force(read, stored).unwrap();
        assert_eq!(listed.len(), 1, "the read returns what it read");
        assert!(book.rules().is_empty(), "the removed rule stays removed");

        let read = book.next_number();
        let stored = store.rules().await.unwrap();
        book.add(rule("run_command(ls $)=allow"), "local")
            .await
            .unwrap();
        book.put_read_in_force(read, stored).unwrap();
        assert_eq!(book.rules().len(), 1, "the added rule stays in force");
    }

    #[tokio::test]
    async fn configured_rules_cannot_be_removed_and_added_ones_can_with_an_audit_entry_each() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let book = book("delete_file=deny", &store);
        let flag_id = book.list()[0].id.clone();
        let error = book.remove(&flag_id, "local").await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "Rule flag-1 (delete_file=deny) comes from --rules; it can only be removed there, and the server restarted."
        );
        let added = book
            .add(rule("run_command(ls $)=allow"), "token")
            .await
            .unwrap();
        assert_eq!(added.id, added_rule_id(&rule("run_command(ls $)=allow")));
        assert_eq!(added.added_by.as_deref(), Some("token"));
        assert_eq!(book.rules().len(), 2);
        assert_eq!(
            store.rules().await.unwrap()[0].rule,
            "run_command(ls $)=allow"
        );
        assert!(matches!(
            book.add(rule("run_command(ls $)=allow"), "token").await,
            Err(RuleBookError::AlreadyPresent { .. })
        ));
        assert_eq!(
            book.remove(&added.id, "login").await.unwrap().id(),
            &added.id
        );
        assert!(matches!(
            book.remove(&added.id, "login").await,
            Err(RuleBookError::NotFound(_))
        ));
        assert_eq!(book.rules().len(), 1);
        assert!(store.rules().await.unwrap().is_empty());

        let audit = store
            .audit_log(AuditQuery {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        let seen: Vec<(AuditKind, &str, Option<&str>, Option<&str>)> = audit
            .iter()
            .map(|entry| {
                (
                    entry.kind.clone(),
                    entry.outcome.as_str(),
                    entry.reason.as_deref(),
                    entry.actor.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    AuditKind::RuleChanged,
                    "added",
                    Some("run_command(ls $)=allow"),
                    Some("token")
                ),
                (
                    AuditKind::RuleChanged,
                    "removed",
                    Some("run_command(ls $)=allow"),
                    Some("login")
                ),
            ]
        );
    }

    /// Keeps a row in the rules table beside the book, as another version of toolgate (or an older one) wrote it.
    async fn keep_row(store: &Arc<dyn Store>, id: &str, text: &str) {
        let row = StoredRule {
            id: id.into(),
            rule: text.into(),
            created_at: 1,
            created_by: None,
        };
        store
            .add_rule(row, rule_audit_of("added", "local"))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_book_reads_the_rules_the_store_keeps_and_refuses_one_it_cannot_read() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let first = book("", &store);
        first
            .add(rule("write_file(notes.txt)=allow"), "local")
            .await
            .unwrap();
        // Another instance on the same store, or this one after a restart.
        let configured = ConfiguredRules::new(RuleSet::new(), Vec::new()).rules();
        let second = StoredRuleBook::open(configured.clone(), Arc::clone(&store))
            .await
            .unwrap();
        assert_eq!(second.list()[0].rule, "write_file(notes.txt)=allow");
        assert_eq!(second.list()[0].origin, RuleOrigin::Added);

        keep_row(&store, "rule_future", "write_file(notes.txt)=maybe").await;
        let error = StoredRuleBook::open(configured, Arc::clone(&store))
            .await
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("the rule rule_future kept in the database cannot be read"),
            "{error}"
        );
        assert!(second.refresh().await.is_err());
        assert_eq!(second.rules().len(), 1, "what reads stays in force");
    }

    /// An allow glob with `.` or `:` allowed nothing and is refused now; one a person added before (the rules API
    /// took it) is passed over when the book is read, which changes no decision, and the other rules stay in force.
    #[tokio::test]
    async fn a_kept_rule_that_allows_nothing_is_passed_over() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let first = book("", &store);
        first
            .add(rule("write_file(notes.txt)=allow"), "local")
            .await
            .unwrap();
        keep_row(&store, "rule_inert", "mcp__fs__files.*=allow").await;
        let configured = ConfiguredRules::new(RuleSet::new(), Vec::new()).rules();
        let second = StoredRuleBook::open(configured, Arc::clone(&store))
            .await
            .expect("the book reads");
        assert_eq!(
            second
                .list()
                .iter()
                .map(|rule| rule.rule.as_str())
                .collect::<Vec<_>>(),
            ["write_file(notes.txt)=allow"]
        );
        // Passed over, and still removable by its id (the warning names it).
        let removed = second
            .remove(&RuleId::parse("rule_inert").unwrap(), "local")
            .await
            .expect("removed");
        assert!(matches!(removed, Removed::Unreadable { .. }), "{removed:?}");
        assert_eq!(removed.text(), "mcp__fs__files.*=allow");
        assert_eq!(store.rules().await.unwrap().len(), 1);
        assert_eq!(second.list().len(), 1);
    }

    /// A kept row that does not read as a rule (a newer version's syntax) stops the book from reading, naming the
    /// row, whose removal by id is the way out; the rules in force meanwhile stay as they were.
    #[tokio::test]
    async fn a_kept_rule_that_does_not_read_is_named_and_removable() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let book = book("", &store);
        let kept = book
            .add(rule("write_file(notes.txt)=deny"), "local")
            .await
            .unwrap();
        keep_row(&store, "rule_newer", "write_file(notes.txt)=quarantine").await;
        let error = book.refresh().await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("remove it (DELETE /api/rules/rule_newer "),
            "{error}"
        );
        assert_eq!(book.list().len(), 1, "what reads is in force");

        // Another rule goes elsewhere (another instance) while a row does not read: a read of the book that fails
        // for that row still takes it out of force.
        let elsewhere = self::book("", &store);
        elsewhere.remove(&kept.id, "local").await.expect("removed");
        assert!(book.refresh().await.is_err());
        assert!(book.list().is_empty());
        let removed = book
            .remove(&RuleId::parse("rule_newer").unwrap(), "local")
            .await
            .expect("removed");
        assert_eq!(removed.text(), "write_file(notes.txt)=quarantine");
        book.refresh().await.expect("the book reads again");
        let audit = store
            .audit_log(AuditQuery {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        let removals: Vec<_> = audit
            .iter()
            .filter(|entry| entry.outcome == "removed")
            .map(|entry| entry.reason.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(
            removals,
            [
                "write_file(notes.txt)=deny",
                "write_file(notes.txt)=quarantine"
            ]
        );
    }

    /// A read of the rules that began while a removal was between its read and its write (the page's panel
    /// reloading as a person removes a rule) does not put the removed rule back in force.
    #[tokio::test]
    async fn a_read_during_a_removal_does_not_put_the_rule_back() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let book = book("", &store);
        let added = book
            .add(rule("run_command(ls $)=allow"), "local")
            .await
            .unwrap();
        let rows = store.rules().await.unwrap();
        *book.meanwhile.lock() = Some(Box::new(move |book: &StoredRuleBook| {
            let read = book.next_number();
            book.put_read_in_force(read, rows).unwrap();
        }));
        book.remove(&added.id, "local").await.unwrap();
        assert!(book.rules().is_empty(), "{:?}", book.rules());
    }

    #[test]
    fn a_bad_rules_file_names_the_entry_and_the_problem() {
        let error = RulesFile::parse(
            "[[rule]]\ntool = \"run_command\"\naction = \"allow\"\n[[rule]]\ntool = \"read_file\"\npath = \"../x\"\naction = \"deny\"\n",
            "rules.toml",
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the rules file rules.toml: [[rule]] 2 (tool = \"read_file\"): the path glob \"../x\" leaves the workspace; paths are relative to it (no leading /, no ..)"
        );
        let error = RulesFile::parse("[[rule]]\ntool = \"x\"\nactoin = \"deny\"\n", "rules.toml")
            .unwrap_err();
        assert!(
            error.to_string().contains("unknown field `actoin`"),
            "{error}"
        );
        let error = RulesFile::parse("[[rules]]\ntool = \"x\"\n", "rules.toml").unwrap_err();
        assert!(
            error.to_string().contains("unknown field `rules`"),
            "{error}"
        );
    }

    #[test]
    fn a_table_of_rules_parses_on_its_own() {
        let table: toml::Table = toml::from_str(
            "[[rule]]\ntool = \"create_issue\"\narguments = { repo = \"acme/*\" }\naction = \"allow\"\n",
        )
        .unwrap();
        let rules = parse_rules_table(&table, "mcp.github").unwrap();
        assert_eq!(rules[0].to_string(), "create_issue(repo=acme/*)=allow");
    }
}
