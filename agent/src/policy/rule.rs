//! One permission rule: a tool pattern, an optional argument matcher, an action and an optional reason.
//!
//! The written form (`--rules`, the API, rules people added as the store keeps them):
//!
//! ```text
//! rule     = tool [ "(" matcher ")" ] "=" action [ ":" reason ]
//! tool     = an exact tool name (run_command) or a glob over names (mcp__github__*)
//! action   = allow | ask | deny
//! reason   = text to the end of the rule, or a "double-quoted" string (\" and \\ escape)
//! matcher  = for run_command:   words of the argv prefix, split like a shell (quotes, backslashes); a last
//!                               unquoted word `$` means the argv must end there
//!            for any tool:      name=glob, name=glob, ... (globs on named arguments; all must match)
//!            for other tools:   a glob on the `path` argument (short for path=glob)
//! ```
//!
//! Inside parentheses and quotes, commas, `=` and parentheses belong to the matcher; `--rules` separates rules at
//! the other commas only. A glob may be double-quoted when it holds a comma outside `{}`/`[]` or an unbalanced
//! parenthesis.

use std::collections::BTreeMap;
use std::fmt;

use globset::GlobMatcher;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::matcher::{
    COMMAND_TOOL, FILE_TOOLS, LIST_TOOL, PathContext, Readings, RuleGlob, ToolKind, argv, basename,
    tool_glob,
};
use crate::permissions::shell_words;
use crate::wire::{RuleAction, ToolSpec};

/// What is wrong with a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleProblem {
    #[error("it is not of the form tool=allow|ask|deny or tool(matcher)=allow|ask|deny")]
    Shape,
    #[error("it names no tool")]
    NoTool,
    #[error(
        "{0:?} is not a tool name or a glob over tool names (letters, digits, _ - . : and the wildcards * ?)"
    )]
    ToolPattern(String),
    #[error("unknown action {0:?}: expected allow, ask or deny")]
    Action(String),
    #[error(
        "the allow glob {0:?} would allow nothing: no tool name the model sees has . or : (an MCP tool's real name has them as _); write _ there (which also allows tools whose names have _ there), or name each tool"
    )]
    AllowsNothing(String),
    #[error("a parenthesis or a quote is not closed")]
    Unbalanced,
    #[error("text follows the closing parenthesis: {0:?}")]
    TrailingText(String),
    #[error("the parentheses are empty; leave them out to match every call of the tool")]
    EmptyMatcher,
    #[error(
        "the command prefix cannot be split into words (an open quote or a trailing backslash)"
    )]
    CommandWords,
    #[error(
        "a word of the command prefix starts with an unquoted # (in shell words, a comment that would drop the rest); quote it: '#...'"
    )]
    CommandComment,
    #[error("the command prefix names no program")]
    NoProgram,
    #[error(
        "a command prefix applies to run_command only; other tools take name=glob or a path glob"
    )]
    CommandNotForTool,
    #[error("{0:?} is not an argument name")]
    ArgumentName(String),
    #[error("the argument {0:?} is named twice")]
    DuplicateArgument(String),
    #[error(
        "a last $ (no other argument) is for allow rules: a deny or ask with it would not meet a call that adds an argument, and another rule would decide it"
    )]
    OnlyArgumentsNotForAllow,
    #[error("{glob:?} is not a valid glob: {message}")]
    Glob { glob: String, message: String },
    #[error(
        "the path glob {0:?} leaves the workspace; paths are relative to it (no leading /, no ..)"
    )]
    PathOutside(String),
    #[error("the reason is empty")]
    EmptyReason,
    #[error("{0}")]
    Entry(String),
}

/// A rule that could not be read: the rule as written, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rule {rule}: {problem}")]
pub struct RuleError {
    /// The rule as written (or where it is, for a rules file).
    pub rule: String,
    pub problem: RuleProblem,
}

/// Which tools a rule is about.
#[derive(Clone, Debug)]
enum ToolPattern {
    Exact(String),
    Glob {
        pattern: String,
        matcher: GlobMatcher,
    },
}

impl ToolPattern {
    fn parse(text: &str, action: RuleAction) -> Result<Self, RuleProblem> {
        let text = text.trim();
        if text.is_empty() {
            return Err(RuleProblem::NoTool);
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
        if !text.chars().all(|c| allowed(c) || matches!(c, '*' | '?')) {
            return Err(RuleProblem::ToolPattern(text.to_owned()));
        }
        // The model sees no tool name with `.` or `:`: an MCP tool's name has them as `_` (`files.delete` of server
        // `fs` is `mcp__fs__files_delete`), so a rule written with its real name is read as the model's, and does
        // not silently match nothing. An exact name stands for one tool either way (names that would be the same are
        // left out of the toolbox). An `allow` glob with them is refused: read as the model's, `files.*` would also
        // allow a tool really named `files_purge`; kept as written, it would allow nothing.
        let exact = text.chars().all(allowed);
        if !exact && action == RuleAction::Allow && text.contains(['.', ':']) {
            return Err(RuleProblem::AllowsNothing(text.to_owned()));
        }
        let text = &text.replace(['.', ':'], "_");
        if exact {
            return Ok(Self::Exact(text.to_owned()));
        }
        let matcher = tool_glob(text).map_err(|error| RuleProblem::Glob {
            glob: text.to_owned(),
            message: error.kind().to_string(),
        })?;
        Ok(Self::Glob {
            pattern: text.to_owned(),
            matcher,
        })
    }

    fn as_str(&self) -> &str {
        match self {
            Self::Exact(name) => name,
            Self::Glob { pattern, .. } => pattern,
        }
    }

    fn matches(&self, tool_name: &str) -> bool {
        match self {
            Self::Exact(name) => name == tool_name,
            Self::Glob { matcher, .. } => matcher.is_match(tool_name),
        }
    }

    /// The kind of tool this pattern names, when it names exactly one.
    fn kind(&self) -> Option<ToolKind> {
        match self {
            Self::Exact(name) => Some(ToolKind::of(name)),
            Self::Glob { .. } => None,
        }
    }
}

/// A prefix of a `run_command` argv, or the whole argv when `exact`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CommandPrefix {
    words: Vec<String>,
    exact: bool,
}

impl CommandPrefix {
    /// Whether the call's argv starts with (or, exact, is) these words. The program is compared by its exact
    /// text, except that a `deny` or `ask` rule also catches it by name from any directory and in any case (`rm`
    /// catches `/bin/rm`, `/bin/rm` catches `rm` and `/usr/bin/rm`, and `RM`, which is `rm` where file names ignore
    /// case): that reading can only make a call stricter.
    fn matches(&self, argv: &[&str], lenient_program: bool) -> bool {
        if argv.len() < self.words.len() || (self.exact && argv.len() != self.words.len()) {
            return false;
        }
        self.words
            .iter()
            .zip(argv)
            .enumerate()
            .all(|(i, (word, arg))| {
                word.as_str() == *arg || (i == 0 && lenient_program && same_program(arg, word))
            })
    }
}

/// A glob on one named argument.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ArgumentGlob {
    name: String,
    glob: RuleGlob,
    /// For a glob over tool names that covers the file tools: the `path` glob as the file tools' paths are
    /// compared (normalised), when that differs from the glob as written, which other tools' `path` meets.
    for_files: Option<RuleGlob>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ArgumentMatcher {
    Command(CommandPrefix),
    /// Globs on named arguments; all must match. A file tool's `path` is matched as it resolves inside the
    /// workspace.
    Named(NamedGlobs),
}

/// Globs on named arguments, and whether a call may give others (`(a=x, $)`: no other).
#[derive(Clone, Debug, PartialEq, Eq)]
struct NamedGlobs {
    globs: Vec<ArgumentGlob>,
    /// A last `$`: the call gives no argument the globs do not name. What "Always allow" makes for a tool of
    /// another kind than the built-in ones, so that it allows that very call, not one that adds an argument (one
    /// its server adds to the tool later, say).
    only: bool,
}

impl NamedGlobs {
    fn any(globs: Vec<ArgumentGlob>) -> Self {
        Self { globs, only: false }
    }

    /// Whether `input` gives only arguments the globs name, each a single value (always, without `$`): with `$`
    /// the rule is for exactly the call it names, and a list whose every item fits a glob (`["a@x", "a@x"]` for
    /// `to=a@x`) is another call.
    fn names_every_argument_of(&self, input: &Value) -> bool {
        !self.only
            || input.as_object().is_none_or(|arguments| {
                arguments.iter().all(|(key, value)| {
                    self.globs.iter().any(|glob| &glob.name == key)
                        && !matches!(value, Value::Array(_) | Value::Object(_))
                })
            })
    }
}

impl std::ops::Deref for NamedGlobs {
    type Target = [ArgumentGlob];

    fn deref(&self) -> &[ArgumentGlob] {
        &self.globs
    }
}

/// How specific a rule is; the most specific matching rule of the winning action names the reason. Compared
/// field by field: the matcher's literal characters, then an exact tool name over a glob, then the tool
/// pattern's literal characters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    matcher_literals: usize,
    exact_tool: bool,
    tool_literals: usize,
}

/// One permission rule.
#[derive(Clone, Debug)]
pub struct Rule {
    tool: ToolPattern,
    matcher: Option<ArgumentMatcher>,
    action: RuleAction,
    reason: Option<String>,
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Rule {}

/// The facts about one call that rules read.
pub struct CallFacts<'a> {
    pub tool_name: &'a str,
    /// For an MCP tool whose name was cut to the 64 characters model APIs take, its name uncut
    /// ([`uncut_name`](crate::tools::mcp_names::uncut_name)): a `deny` or `ask` rule also reads that, so that a
    /// glob over the end of a tool's name (`mcp__*__delete_*`) is not dodged by a long server name.
    pub uncut_name: Option<String>,
    pub input: &'a Value,
    pub paths: &'a PathContext,
}

/// Whether a schema's property takes only lists, objects or null, none of which an `allow` rule meets with `$`: its
/// `type` names no other (a `$ref`, or no `type`, may be anything).
fn never_a_single_value(property: &Value) -> bool {
    let is_compound = |kind: &Value| matches!(kind.as_str(), Some("array" | "object" | "null"));
    if property.get("$ref").is_some() {
        return false;
    }
    match &property["type"] {
        Value::Array(kinds) => !kinds.is_empty() && kinds.iter().all(is_compound),
        kind => is_compound(kind),
    }
}

/// An MCP tool's name uncut, when the name the model sees had to be cut (see [`CallFacts::uncut_name`]).
fn uncut_name(tool: &ToolSpec) -> Option<String> {
    tool.mcp
        .as_ref()
        .map(|origin| crate::tools::mcp_names::uncut_name(&origin.server, &origin.tool))
        .filter(|uncut| *uncut != tool.name)
}

impl<'a> CallFacts<'a> {
    /// The facts of a call of `tool` with `input`.
    pub fn of(tool: &'a ToolSpec, input: &'a Value, paths: &'a PathContext) -> Self {
        Self {
            tool_name: &tool.name,
            uncut_name: uncut_name(tool),
            input,
            paths,
        }
    }

    /// The facts of a call of the tool named `tool_name` with `input`, a name model APIs take whole.
    pub fn named(tool_name: &'a str, input: &'a Value, paths: &'a PathContext) -> Self {
        Self {
            tool_name,
            uncut_name: None,
            input,
            paths,
        }
    }
}

impl Rule {
    /// Parses one rule in the written form.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        Self::parse_inner(text).map_err(|problem| RuleError {
            rule: format!("{:?}", text.trim()),
            problem,
        })
    }

    fn parse_inner(text: &str) -> Result<Self, RuleProblem> {
        let text = text.trim();
        let equals = find_top_level(text, '=')?.ok_or(RuleProblem::Shape)?;
        let (head, tail) = (&text[..equals], &text[equals + 1..]);
        let (action, reason) = match tail.split_once(':') {
            Some((action, reason)) => (action, Some(parse_reason(reason)?)),
            None => (tail, None),
        };
        let action = action
            .trim()
            .parse::<RuleAction>()
            .map_err(|_| RuleProblem::Action(action.trim().to_owned()))?;
        let (tool, matcher) = match find_top_level(head, '(')? {
            None => (ToolPattern::parse(head, action)?, None),
            Some(open) => {
                let tool = ToolPattern::parse(&head[..open], action)?;
                let close = closing_paren(head, open)?;
                let after = head[close + 1..].trim();
                if !after.is_empty() {
                    return Err(RuleProblem::TrailingText(after.to_owned()));
                }
                let matcher = parse_matcher(&tool, &head[open + 1..close])?;
                (tool, Some(matcher))
            }
        };
        Self {
            tool,
            matcher,
            action,
            reason,
        }
        .checked()
    }

    /// Refuses what reads but cannot mean what it says: `$` on a deny or ask, which a call would dodge by adding an
    /// argument (a deny or ask reads a call every way it could be meant; `$` narrows).
    fn checked(self) -> Result<Self, RuleProblem> {
        match &self.matcher {
            Some(ArgumentMatcher::Named(globs))
                if globs.only && self.action != RuleAction::Allow =>
            {
                Err(RuleProblem::OnlyArgumentsNotForAllow)
            }
            _ => Ok(self),
        }
    }

    /// Parses one rule written for tools under other names: `rename` turns the tool part as written (an exact name
    /// or a glob) into the tool pattern the rule is for. The MCP configuration's rules name a server's tools by
    /// their own names; `rename` gives the names the model sees. Errors quote the rule as written.
    pub fn parse_renamed(text: &str, rename: impl Fn(&str) -> String) -> Result<Self, RuleError> {
        let written = text.trim();
        let error = |problem| RuleError {
            rule: format!("{written:?}"),
            problem,
        };
        let equals = find_top_level(written, '=')
            .map_err(error)?
            .ok_or_else(|| error(RuleProblem::Shape))?;
        let head = &written[..equals];
        let tool_end = find_top_level(head, '(')
            .map_err(error)?
            .unwrap_or(head.len());
        let tool = head[..tool_end].trim();
        if tool.is_empty() {
            return Err(error(RuleProblem::NoTool));
        }
        let renamed = format!("{}{}", rename(tool), &written[tool_end..]);
        Self::parse_inner(&renamed).map_err(error)
    }

    /// A rule for every call of `tool` (exact name or glob).
    pub fn for_tool(tool: &str, action: RuleAction) -> Result<Self, RuleError> {
        let wrap = |problem| RuleError {
            rule: format!("{tool:?}"),
            problem,
        };
        Ok(Self {
            tool: ToolPattern::parse(tool, action).map_err(wrap)?,
            matcher: None,
            action,
            reason: None,
        })
    }

    /// The narrowest rule allowing exactly this `run_command` argv.
    pub fn allow_exact_command(argv: &[&str]) -> Option<Self> {
        let (program, args) = argv.split_first()?;
        if program.is_empty() {
            return None;
        }
        Some(Self {
            tool: ToolPattern::Exact(COMMAND_TOOL.to_owned()),
            matcher: Some(ArgumentMatcher::Command(CommandPrefix {
                words: std::iter::once(*program)
                    .chain(args.iter().copied())
                    .map(str::to_owned)
                    .collect(),
                exact: true,
            })),
            action: RuleAction::Allow,
            reason: None,
        })
    }

    /// The narrowest rule allowing `tool` with exactly these argument values (globs escaped to match only
    /// themselves); with `only`, and no other argument.
    pub fn allow_exact_arguments(
        tool: &str,
        arguments: &[(&str, &str)],
        only: bool,
    ) -> Option<Self> {
        let mut globs = Vec::with_capacity(arguments.len());
        for (name, value) in arguments {
            let glob = RuleGlob::new(&super::matcher::escape_glob(value)).ok()?;
            globs.push(ArgumentGlob {
                name: (*name).to_owned(),
                glob,
                for_files: None,
            });
        }
        Some(Self {
            tool: ToolPattern::Exact(tool.to_owned()),
            matcher: Some(ArgumentMatcher::Named(NamedGlobs { globs, only })),
            action: RuleAction::Allow,
            reason: None,
        })
    }

    pub fn action(&self) -> RuleAction {
        self.action
    }

    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    pub fn tool_pattern(&self) -> &str {
        self.tool.as_str()
    }

    /// Whether the rule is about `tool` (whatever its arguments).
    pub fn covers_tool(&self, tool: &ToolSpec) -> bool {
        self.names_tool(&tool.name, uncut_name(tool).as_deref())
    }

    /// What a person who wrote the rule would want to know about it among `tools` (the toolbox's): that it is about
    /// no tool there is, that it names an argument no tool it is about takes, or that it ends in `$` on an argument
    /// that is a list. Such a rule is kept all the same (an MCP server may add the tool later; the others fail closed,
    /// or meet no call), and these say so.
    pub fn warnings(&self, tools: &[ToolSpec]) -> Vec<String> {
        let covered: Vec<&ToolSpec> = tools.iter().filter(|tool| self.covers_tool(tool)).collect();
        if covered.is_empty() {
            let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
            return vec![format!(
                "No tool is named {} now: the rule applies to none until one is. The tools are: {}.",
                self.tool_pattern(),
                names.join(", ")
            )];
        }
        let mut warnings = Vec::new();
        if let Some(ArgumentMatcher::Named(globs)) = &self.matcher {
            // An argument a tool's schema does not list, where it takes no other: no call of it gives one.
            let takes = |tool: &ToolSpec, name: &str| {
                let schema = &tool.input_schema;
                schema["properties"].get(name).is_some()
                    || schema.get("patternProperties").is_some()
                    || schema.get("additionalProperties") != Some(&Value::Bool(false))
            };
            for glob in globs.iter() {
                if !covered.iter().any(|tool| takes(tool, &glob.name)) {
                    let names: Vec<&str> = covered.iter().map(|tool| tool.name.as_str()).collect();
                    // One tool's arguments are named, to spot the typo by.
                    let arguments = match covered.as_slice() {
                        [tool] => {
                            let listed: Vec<&str> = tool.input_schema["properties"]
                                .as_object()
                                .map(|properties| properties.keys().map(String::as_str).collect())
                                .unwrap_or_default();
                            format!(" (its arguments are {})", listed.join(", "))
                        }
                        _ => String::new(),
                    };
                    warnings.push(format!(
                        "{} takes no argument {}{arguments}: the rule meets no call.",
                        names.join(", "),
                        glob.name,
                    ));
                }
            }
        }
        for tool in covered {
            let lists = self.arguments_it_cannot_meet(tool);
            if !lists.is_empty() {
                warnings.push(format!(
                    "A rule ending in $ allows single values only (text, a number, a flag), and {}'s schema makes {} a list, an object or null: the rule allows no call that gives it.",
                    tool.name,
                    lists.join(", ")
                ));
            }
        }
        warnings
    }

    /// The arguments of `tool` this rule can never meet in a call that gives them: a rule with a last `$` allows
    /// single values only (see [`NamedGlobs::names_every_argument_of`]), and the tool's schema makes each of these a
    /// list, an object or null (which no `allow` rule meets). Such a rule fails closed; [`Rule::warnings`] says so,
    /// as a person who wrote it by hand meant it to allow something.
    pub fn arguments_it_cannot_meet<'t>(&self, tool: &'t ToolSpec) -> Vec<&'t str> {
        let Some(ArgumentMatcher::Named(globs)) = &self.matcher else {
            return Vec::new();
        };
        if !globs.only || !self.covers_tool(tool) {
            return Vec::new();
        }
        let Some(properties) = tool.input_schema["properties"].as_object() else {
            return Vec::new();
        };
        properties
            .iter()
            .filter(|(key, property)| {
                globs.iter().any(|glob| &glob.name == *key) && never_a_single_value(property)
            })
            .map(|(key, _)| key.as_str())
            .collect()
    }

    /// Whether the rule's tool part names the tool called `name`, or, for a `deny` or `ask`, `uncut` (see
    /// [`CallFacts::uncut_name`]).
    fn names_tool(&self, name: &str, uncut: Option<&str>) -> bool {
        self.tool.matches(name)
            || (self.action != RuleAction::Allow
                && uncut.is_some_and(|uncut| self.tool.matches(uncut)))
    }

    /// True for a rule without an argument matcher.
    pub fn is_tool_wide(&self) -> bool {
        self.matcher.is_none()
    }

    /// True for a `deny` or an `ask` on what `run_command` runs: a command prefix, or a glob on its `command` or
    /// `args` (`run_command(command=rm)=deny`). A glob on another argument (`*(**/.env*)=deny`, whose `path` a command
    /// does not have) restricts no command. (An `ask` restricts as a `deny` does: `git -C . push` must not run
    /// unasked past `run_command(git push)=ask`, nor `env rm x` past `run_command(rm)=ask` under `trusted`.)
    pub fn restricts_commands(&self) -> bool {
        self.action >= RuleAction::Ask
            && self.tool.matches(COMMAND_TOOL)
            && match &self.matcher {
                Some(ArgumentMatcher::Command(_)) => true,
                Some(ArgumentMatcher::Named(globs)) => globs
                    .iter()
                    .any(|glob| glob.name == "command" || glob.name == "args"),
                None => false,
            }
    }

    pub fn specificity(&self) -> Specificity {
        let matcher_literals = match &self.matcher {
            None => 0,
            Some(ArgumentMatcher::Command(prefix)) => {
                prefix
                    .words
                    .iter()
                    .map(|w| w.chars().count() + 1)
                    .sum::<usize>()
                    + usize::from(prefix.exact)
            }
            Some(ArgumentMatcher::Named(globs)) => {
                globs
                    .iter()
                    .map(|g| g.name.len() + 1 + g.glob.literal_len())
                    .sum::<usize>()
                    + usize::from(globs.only)
            }
        };
        Specificity {
            matcher_literals,
            exact_tool: matches!(self.tool, ToolPattern::Exact(_)),
            tool_literals: super::matcher::literal_len(self.tool.as_str()),
        }
    }

    /// Whether the rule applies to a call. A `deny` or `ask` rule reads a call every way it could be read
    /// (matching any candidate); an `allow` rule must fit every reading.
    pub fn matches(&self, call: &CallFacts<'_>) -> bool {
        if !self.names_tool(call.tool_name, call.uncut_name.as_deref()) {
            return false;
        }
        let strict_reading = self.action == RuleAction::Allow;
        match &self.matcher {
            None => true,
            Some(ArgumentMatcher::Command(prefix)) => {
                argv(call.input).is_some_and(|argv| prefix.matches(&argv, !strict_reading))
            }
            Some(ArgumentMatcher::Named(globs)) if !globs.names_every_argument_of(call.input) => {
                false
            }
            Some(ArgumentMatcher::Named(globs)) => globs.iter().all(|argument| {
                let readings = argument_readings(call, &argument.name);
                let path = is_workspace_path(call.tool_name, &argument.name);
                let glob = match &argument.for_files {
                    Some(normalised) if path => normalised,
                    _ => &argument.glob,
                };
                let case_insensitive = path && call.paths.case_insensitive();
                // An argument that is not a workspace path may be any text: a `deny` or `ask` rule also reads its
                // glob as text, `*` crossing `/` (`command=rm *` catches `rm -rf /`); an `allow` keeps to the
                // narrower reading, where `*` stays between slashes.
                let as_text = !path && !strict_reading;
                // `run_command`'s program, named by a glob on `command`, is also caught by its name from any
                // directory, as the prefix form catches it: `command=rm` catches `/bin/rm`.
                let program =
                    !strict_reading && call.tool_name == COMMAND_TOOL && argument.name == "command";
                // Where case may not count, a `deny` or `ask` rule also folds letters beyond ASCII; and it sees a path
                // through a directory that may ignore case where the workspace does not (a mount inside it, a
                // casefold directory) as every spelling of it.
                // A `deny` or `ask` on whatever is under a directory (`secrets/**`, `secrets/*`) also covers listing
                // the directory itself, which would show the names the rule keeps from the model. Asked with a child
                // no file can have (a NUL in its name), which only such a glob meets, not one that names a file.
                let listing = path && !strict_reading && call.tool_name == LIST_TOOL;
                // Case matters in a command's flags (`-d` is not `-D`): only other tools' text is read in any case.
                let folded_text = call.tool_name != COMMAND_TOOL;
                // `candidate` as the glob reads it, and the path it stands for (the directory, for a listing's child).
                let hit_one = |candidate: &String, real: &String| {
                    glob.is_match(candidate, case_insensitive)
                        || (case_insensitive && !strict_reading && glob.is_folded_match(candidate))
                        || (as_text
                            && text_readings(candidate).iter().any(|text| {
                                glob.is_text_match(text)
                                    || (folded_text && glob.is_folded_text_match(text))
                            }))
                        || (program && glob.is_match(basename(candidate), true))
                        || (path
                            && !strict_reading
                            && glob.is_composed_match(candidate, case_insensitive))
                        || (path
                            && !strict_reading
                            && !case_insensitive
                            && (could_fold(candidate) || could_fold(glob.pattern()))
                            && (glob.is_match(candidate, true) || glob.is_folded_match(candidate))
                            && call.paths.may_fold_case(real))
                };
                let hit = |candidate: &String| {
                    hit_one(candidate, candidate)
                        || (listing
                            && !candidate.is_empty()
                            && hit_one(&format!("{candidate}/\0"), candidate))
                };
                if strict_reading {
                    !readings.unknown
                        && !readings.known.is_empty()
                        && readings.known.iter().all(hit)
                } else {
                    readings.unknown || readings.known.iter().any(hit)
                }
            }),
        }
    }

    /// The rule as it is written on the command line and stored; parsing it gives the same rule back.
    fn write_matcher(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.matcher {
            None => Ok(()),
            Some(ArgumentMatcher::Command(prefix)) => {
                let (program, args) = prefix
                    .words
                    .split_first()
                    .map_or(("", &[][..]), |(program, args)| (program.as_str(), args));
                write!(f, "({}", shell_words(program, args))?;
                if prefix.exact {
                    f.write_str(" $")?;
                }
                f.write_str(")")
            }
            Some(ArgumentMatcher::Named(globs)) => {
                let bare_path = globs.len() == 1
                    && !globs.only
                    && globs[0].name == "path"
                    && self.tool.kind() != Some(ToolKind::Command);
                let written: Vec<String> = globs
                    .iter()
                    .map(|argument| {
                        let glob = quote_if_needed(argument.glob.pattern());
                        if bare_path {
                            // A bare glob that reads as `name=glob` is quoted, so it is read back as a path.
                            if starts_with_argument_name(&glob) {
                                quote(argument.glob.pattern())
                            } else {
                                glob
                            }
                        } else {
                            format!("{}={glob}", argument.name)
                        }
                    })
                    .collect();
                let only = if globs.only { ", $" } else { "" };
                write!(f, "({}{only})", written.join(", "))
            }
        }
    }

    /// The rule in the rules file's table form.
    pub fn to_entry(&self) -> RuleEntry {
        let mut entry = RuleEntry {
            tool: self.tool.as_str().to_owned(),
            command: None,
            exact: false,
            path: None,
            arguments: BTreeMap::new(),
            action: self.action,
            reason: self.reason.clone(),
        };
        match &self.matcher {
            None => {}
            Some(ArgumentMatcher::Command(prefix)) => {
                entry.command = Some(CommandWords::Words(prefix.words.clone()));
                entry.exact = prefix.exact;
            }
            Some(ArgumentMatcher::Named(globs)) => {
                entry.exact = globs.only;
                for argument in globs.iter() {
                    if argument.name == "path" && self.tool.kind() != Some(ToolKind::Command) {
                        entry.path = Some(argument.glob.pattern().to_owned());
                    } else {
                        entry
                            .arguments
                            .insert(argument.name.clone(), argument.glob.pattern().to_owned());
                    }
                }
            }
        }
        entry
    }

    /// Reads one rule of a rules file (or of any TOML table in this shape).
    pub fn from_entry(entry: &RuleEntry) -> Result<Self, RuleProblem> {
        let tool = ToolPattern::parse(&entry.tool, entry.action)?;
        if let Some(reason) = &entry.reason
            && reason.trim().is_empty()
        {
            return Err(RuleProblem::EmptyReason);
        }
        let matcher = match (&entry.command, &entry.path, entry.arguments.is_empty()) {
            (None, None, true) => {
                if entry.exact {
                    return Err(RuleProblem::Entry(
                        "exact = true needs a command".to_owned(),
                    ));
                }
                None
            }
            (Some(command), None, true) => {
                if tool.kind() != Some(ToolKind::Command) {
                    return Err(RuleProblem::CommandNotForTool);
                }
                let words = match command {
                    CommandWords::Line(line) => command_words(line)?,
                    CommandWords::Words(words) => words.clone(),
                };
                Some(ArgumentMatcher::Command(command_prefix(
                    words,
                    entry.exact,
                )?))
            }
            (None, path, _) => {
                let mut globs = Vec::new();
                if let Some(path) = path {
                    globs.push(argument_glob(&tool, "path", path)?);
                }
                for (name, glob) in &entry.arguments {
                    if name == "path" && path.is_some() {
                        return Err(RuleProblem::DuplicateArgument(name.clone()));
                    }
                    check_argument_name(name)?;
                    globs.push(argument_glob(&tool, name, glob)?);
                }
                // `exact` with arguments: no argument but these.
                Some(ArgumentMatcher::Named(NamedGlobs {
                    globs,
                    only: entry.exact,
                }))
            }
            (Some(_), _, _) => {
                return Err(RuleProblem::Entry(
                    "a rule has either a command, or a path and arguments, not both".to_owned(),
                ));
            }
        };
        Self {
            tool,
            matcher,
            action: entry.action,
            reason: entry.reason.as_ref().map(|r| r.trim().to_owned()),
        }
        .checked()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tool.as_str())?;
        self.write_matcher(f)?;
        write!(f, "={}", self.action)?;
        if let Some(reason) = &self.reason {
            write!(f, ":{}", quote(reason))?;
        }
        Ok(())
    }
}

/// A rule in table form, as the rules file (and the MCP configuration's per-tool rules) write it:
///
/// ```toml
/// [[rule]]
/// tool = "run_command"          # an exact tool name or a glob over names
/// command = "git status"        # run_command only: the argv prefix, as shell words or as ["git", "status"]
/// exact = false                 # with command: true when the argv must be exactly that
/// path = "src/**"               # a glob on the path argument (resolved in the workspace for the file tools)
/// arguments = { repo = "acme/*" }  # globs on named arguments; all must match
/// action = "allow"              # allow, ask or deny
/// reason = "Reading the status is harmless."  # optional: shown on the card or to the model
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandWords>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
    pub action: RuleAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A command prefix in a table: one string of shell words, or the words as an array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommandWords {
    Line(String),
    Words(Vec<String>),
}

/// Whether two programs are the same by name, wherever they are and in whichever case.
fn same_program(one: &str, other: &str) -> bool {
    basename(one).to_lowercase() == basename(other).to_lowercase()
}

fn parse_matcher(tool: &ToolPattern, text: &str) -> Result<ArgumentMatcher, RuleProblem> {
    if text.trim().is_empty() {
        return Err(RuleProblem::EmptyMatcher);
    }
    if starts_with_argument_name(text) {
        let mut globs: Vec<ArgumentGlob> = Vec::new();
        let parts = split_top_level(text, ',')?;
        // A last part `$`: no argument but the named ones.
        let only = parts.last().is_some_and(|part| part.trim() == "$");
        for part in &parts[..parts.len() - usize::from(only)] {
            let Some((name, glob)) = part.split_once('=') else {
                return Err(RuleProblem::ArgumentName(part.trim().to_owned()));
            };
            let name = name.trim();
            check_argument_name(name)?;
            if globs.iter().any(|g| g.name == name) {
                return Err(RuleProblem::DuplicateArgument(name.to_owned()));
            }
            globs.push(argument_glob(tool, name, &unquote(glob.trim())?)?);
        }
        return Ok(ArgumentMatcher::Named(NamedGlobs { globs, only }));
    }
    if tool.kind() == Some(ToolKind::Command) {
        let trimmed = text.trim();
        let words = command_words(trimmed)?;
        // A last word `$` written bare (not quoted) anchors the end.
        let anchored = words.last().is_some_and(|w| w == "$")
            && trimmed.ends_with('$')
            && trimmed[..trimmed.len() - 1].ends_with(char::is_whitespace);
        let mut words = words;
        if anchored {
            words.pop();
        }
        return Ok(ArgumentMatcher::Command(command_prefix(words, anchored)?));
    }
    Ok(ArgumentMatcher::Named(NamedGlobs::any(vec![
        argument_glob(tool, "path", &unquote(text.trim())?)?,
    ])))
}

/// A command prefix's words, split as a shell splits them, except that a word may not start with an unquoted
/// `#`: a shell (and `shlex`) reads it as a comment and drops the rest of the line, `$` included, so that an exact
/// rule would become a prefix rule.
fn command_words(line: &str) -> Result<Vec<String>, RuleProblem> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut word_start = true;
    for c in line.chars() {
        if escaped {
            (escaped, word_start) = (false, false);
            continue;
        }
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            (Some(_), '\\') => escaped = true,
            (Some(_), '"') => quote = None,
            (Some(_), _) => {}
            (None, '#') if word_start => return Err(RuleProblem::CommandComment),
            (None, '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (None, c) => {
                word_start = c.is_whitespace();
                continue;
            }
        }
        word_start = false;
    }
    shlex::split(line).ok_or(RuleProblem::CommandWords)
}

fn command_prefix(words: Vec<String>, exact: bool) -> Result<CommandPrefix, RuleProblem> {
    match words.first() {
        None => Err(RuleProblem::NoProgram),
        Some(program) if program.is_empty() => Err(RuleProblem::NoProgram),
        Some(_) => Ok(CommandPrefix { words, exact }),
    }
}

/// True when `tool`'s argument `name` is a path inside the workspace.
fn is_workspace_path(tool_name: &str, name: &str) -> bool {
    name == "path" && FILE_TOOLS.contains(&tool_name)
}

/// A path glob as the file tools' paths are compared: relative to the workspace, without `.` segments or empty
/// ones (`./src//a/` is `src/a`), also inside an alternative ([`normalised_alternatives`]). `None` for a glob that
/// starts at `/` or climbs with `..`, which no such path meets, also inside an alternative (`{a,../b}`).
fn normalised_path_glob(glob: &str) -> Option<String> {
    if glob.starts_with('/') || glob.split(['/', '{', ',', '}']).any(|part| part == "..") {
        return None;
    }
    let glob = normalised_alternatives(glob);
    Some(
        glob.split('/')
            .filter(|part| !part.is_empty() && *part != ".")
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// A path glob with the alternatives inside `{…}` normalised as [`normalised_path_glob`] normalises its segments,
/// which it reads by `/` and so cannot see into them: a `.` segment, an empty one and a trailing `/` dropped
/// (`{.env,./secrets/**}` is `{.env,secrets/**}`, `{a//b,secrets/}` is `{a/b,secrets}`), so that no alternative keeps
/// a spelling no compared path has. Outside `{…}`, in character classes and after `\`, nothing changes.
fn normalised_alternatives(glob: &str) -> String {
    let mut out = String::with_capacity(glob.len());
    let (mut depth, mut in_class) = (0usize, false);
    // Where the segment being read began in `out`, and what began it (`/`, `{`, `,`, or the glob's start).
    let (mut start, mut began) = (0usize, None::<char>);
    let mut chars = glob.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push(c);
                out.extend(chars.next());
                continue;
            }
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '{' | '}' | ',' | '/' if !in_class && depth > 0 => {
                let segment = &out[start..];
                let dot = segment == ".";
                let empty_after_slash = segment.is_empty() && began == Some('/');
                if dot || empty_after_slash {
                    out.truncate(start);
                    if c == '/' {
                        // `./` or `//`: the next segment begins where this one did.
                        continue;
                    }
                    // `a/.` or `a/` ending the alternative: its slash goes too.
                    if began == Some('/') {
                        out.pop();
                    }
                }
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                out.push(c);
                (start, began) = (out.len(), Some(c));
                continue;
            }
            '{' if !in_class => {
                depth += 1;
                out.push(c);
                (start, began) = (out.len(), Some(c));
                continue;
            }
            '/' | ',' | '}' if !in_class => {
                out.push(c);
                (start, began) = (out.len(), Some(c));
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

fn argument_glob(tool: &ToolPattern, name: &str, glob: &str) -> Result<ArgumentGlob, RuleProblem> {
    let written = glob.trim();
    if written.is_empty() {
        return Err(RuleProblem::Glob {
            glob: written.to_owned(),
            message: "it is empty".to_owned(),
        });
    }
    let compile = |glob: &str| {
        RuleGlob::new(glob).map_err(|error| RuleProblem::Glob {
            glob: glob.to_owned(),
            message: error.kind().to_string(),
        })
    };
    // A `path` glob is also read as the file tools' paths are compared (normalised). On a file tool that reading
    // is the rule's, and a glob that leaves the workspace is refused; a glob over tool names that covers file tools
    // keeps the glob as written for the others and the normalised one for the file tools. A glob that normalises to
    // nothing (`.`, `./`) names the workspace itself, whose path is empty: it is kept as written, so that the rule
    // reads back, and meets the workspace's path as the normalised one.
    let normalised = (name == "path")
        .then(|| normalised_path_glob(written))
        .flatten();
    let file_tool = tool.kind() == Some(ToolKind::WorkspaceFile);
    if file_tool && name == "path" && normalised.is_none() {
        return Err(RuleProblem::PathOutside(written.to_owned()));
    }
    let (glob, for_files) = match normalised {
        Some(normalised) if file_tool && !normalised.is_empty() => (normalised, None),
        Some(normalised)
            if normalised != written
                && FILE_TOOLS.iter().any(|file_tool| tool.matches(file_tool)) =>
        {
            (written.to_owned(), Some(compile(&normalised)?))
        }
        _ => (written.to_owned(), None),
    };
    Ok(ArgumentGlob {
        name: name.to_owned(),
        glob: compile(&glob)?,
        for_files,
    })
}

fn check_argument_name(name: &str) -> Result<(), RuleProblem> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if valid {
        Ok(())
    } else {
        Err(RuleProblem::ArgumentName(name.to_owned()))
    }
}

fn starts_with_argument_name(text: &str) -> bool {
    text.split_once('=')
        .is_some_and(|(name, _)| check_argument_name(name.trim()).is_ok())
}

/// What a named argument stands for: a file tool's path as it resolves, each element of an array, a scalar as
/// its text (a whole number also as an integer: `1e3` and `1000.0` are `1000`). A missing argument stands for
/// nothing, so no glob matches it; an object, or an array inside an array, stands for what no glob can tell.
/// Whether `text` may read differently ignoring case: it has an upper-case ASCII letter, or any letter outside ASCII
/// (whose folding, `ſ` to `s` or the Kelvin sign to `k`, is not worth telling apart here). A path and a glob in
/// lower-case ASCII match ignoring case exactly when they match as written, so most calls skip the second match.
fn could_fold(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_ascii_uppercase() || !c.is_ascii())
}

/// The ways a `deny` or `ask` reads an argument that is free text: as written; with its runs of white space made one
/// space and its ends trimmed (`rm\t-rf /` and ` rm -rf /` are `rm -rf /`); and, should it be a command line a
/// shell reads, each command in it (`true; rm -rf /`, `a && rm x`, `a | rm x`, `$(rm x)`, a line of its own). More
/// readings can only make a call stricter. (Not a shell's parse: quotes, escapes and expansions still hide a
/// command from a glob, which is why a `deny` on a shell's input is a guard and not a sandbox.)
fn text_readings(text: &str) -> Vec<String> {
    let spaced = |part: &str| part.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut readings = vec![text.to_owned(), spaced(text)];
    readings.extend(
        text.split([';', '&', '|', '\n', '\r', '`', '(', ')', '{', '}'])
            .map(|part| spaced(part.trim_start_matches('$')))
            .filter(|part| !part.is_empty()),
    );
    readings.dedup();
    readings
}

fn argument_readings(call: &CallFacts<'_>, name: &str) -> Readings {
    fn scalar(value: &Value, readings: &mut Readings) {
        match value {
            Value::String(text) => readings.known.push(text.clone()),
            Value::Number(number) => {
                readings.known.push(number.to_string());
                // A whole number written as a float (1e3, 1000.0, 1e16) is also its integer's digits.
                if let Some(whole) = number
                    .as_f64()
                    .filter(|n| number.is_f64() && n.is_finite() && n.fract() == 0.0)
                {
                    readings.known.push(if whole == 0.0 {
                        "0".to_owned()
                    } else {
                        format!("{whole:.0}")
                    });
                }
            }
            Value::Bool(flag) => readings.known.push(flag.to_string()),
            Value::Null | Value::Array(_) | Value::Object(_) => readings.unknown = true,
        }
    }
    let mut readings = Readings::default();
    match call.input.get(name) {
        None | Some(Value::Null) => {
            // A file tool without a path works on the workspace itself.
            if is_workspace_path(call.tool_name, name) {
                return call.paths.candidates("");
            }
        }
        Some(Value::String(path)) if is_workspace_path(call.tool_name, name) => {
            return call.paths.candidates(path);
        }
        Some(Value::Array(items)) => {
            for item in items {
                scalar(item, &mut readings);
            }
        }
        Some(value) => scalar(value, &mut readings),
    }
    readings
}

/// Finds `wanted` outside parentheses, quotes and backslash escapes.
fn find_top_level(text: &str, wanted: char) -> Result<Option<usize>, RuleProblem> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (_, '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c == wanted && depth == 0 => return Ok(Some(i)),
            (None, '(') => depth += 1,
            (None, ')') => depth = depth.checked_sub(1).ok_or(RuleProblem::Unbalanced)?,
            (None, _) => {}
        }
    }
    if depth != 0 || quote.is_some() {
        return Err(RuleProblem::Unbalanced);
    }
    Ok(None)
}

/// The index of the parenthesis that closes the one at `open`.
fn closing_paren(text: &str, open: usize) -> Result<usize, RuleProblem> {
    let inner = &text[open + 1..];
    find_top_level(inner, ')')?
        .map(|close| open + 1 + close)
        .ok_or(RuleProblem::Unbalanced)
}

/// Splits at `separator` outside parentheses, braces, brackets, quotes and escapes.
pub(crate) fn split_top_level(text: &str, separator: char) -> Result<Vec<&str>, RuleProblem> {
    split(text, separator, false)
}

/// Splits a list of rules at the commas between them: outside parentheses and quotes, and past each rule's reason
/// (an unquoted reason runs to the next comma whatever it holds, so the `'` of "don't" opens no quote).
pub(crate) fn split_rules(text: &str) -> Result<Vec<&str>, RuleProblem> {
    split(text, ',', true)
}

fn split(text: &str, separator: char, reasons: bool) -> Result<Vec<&str>, RuleProblem> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut start = 0;
    // Within this part: past its `=` (at the top level), and within its unquoted reason.
    let mut past_equals = false;
    let mut in_reason = false;
    for (i, c) in text.char_indices() {
        if in_reason {
            if c == separator {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
                (past_equals, in_reason) = (false, false);
            }
            continue;
        }
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (None, '=') if reasons && depth == 0 => past_equals = true,
            (None, ':') if reasons && depth == 0 && past_equals => {
                in_reason = !text[i + 1..].trim_start().starts_with('"');
            }
            (_, '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '{' | '[') => depth += 1,
            (None, ')' | '}' | ']') => {
                depth = depth.checked_sub(1).ok_or(RuleProblem::Unbalanced)?;
            }
            (None, c) if c == separator && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
                past_equals = false;
            }
            (None, _) => {}
        }
    }
    if depth != 0 || quote.is_some() || escaped {
        return Err(RuleProblem::Unbalanced);
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_reason(text: &str) -> Result<String, RuleProblem> {
    let reason = unquote(text.trim())?;
    if reason.trim().is_empty() {
        return Err(RuleProblem::EmptyReason);
    }
    Ok(reason.trim().to_owned())
}

/// A double-quoted string with `\"` and `\\` escapes, or the text as it is.
fn unquote(text: &str) -> Result<String, RuleProblem> {
    let Some(inner) = text.strip_prefix('"') else {
        return Ok(text.to_owned());
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().ok_or(RuleProblem::Unbalanced)?),
            '"' => {
                return if chars.as_str().trim().is_empty() {
                    Ok(out)
                } else {
                    Err(RuleProblem::TrailingText(chars.as_str().trim().to_owned()))
                };
            }
            c => out.push(c),
        }
    }
    Err(RuleProblem::Unbalanced)
}

fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A glob written bare when that reads back the same, quoted otherwise.
fn quote_if_needed(glob: &str) -> String {
    let plain = !glob.starts_with('"')
        && !glob.contains(['\'', '"'])
        && glob.trim() == glob
        && split_top_level(glob, ',').is_ok_and(|parts| parts.len() == 1)
        && find_top_level(glob, ')').is_ok_and(|found| found.is_none())
        && find_top_level(glob, '(').is_ok_and(|found| found.is_none());
    if plain { glob.to_owned() } else { quote(glob) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap_or_else(|error| panic!("{error}"))
    }

    fn problem(text: &str) -> RuleProblem {
        Rule::parse(text).unwrap_err().problem
    }

    fn matches(rule_text: &str, tool: &str, input: Value) -> bool {
        let paths = PathContext::lexical();
        rule(rule_text).matches(&CallFacts::named(tool, &input, &paths))
    }

    #[test]
    fn the_written_forms_parse_and_print_back_the_same() {
        for text in [
            "delete_file=deny",
            "mcp__github__*=ask",
            "run_command(git status)=allow",
            "run_command(git commit -m 'fix it')=ask",
            "run_command(ls -la $)=allow",
            "run_command(echo '$')=allow",
            "read_file(**/.env*)=deny",
            "write_file(src/**)=allow",
            "mcp__github__create_issue(repo=acme/*)=allow",
            "mcp__github__create_issue(repo=acme/*, title=\"a, b\")=allow",
            "mcp__github__create_issue(repo=acme/w, $)=allow",
            "read_file(path=a.txt, $)=allow",
            "*_file(\"odd(name\")=deny",
            "read_file(**/.env*)=deny:\"Secrets stay on this machine.\"",
            "read_file({a,b}/*)=deny",
            "read_file(\"x=y\")=deny",
            "run_command(git log '#abc' $)=allow",
        ] {
            let parsed = rule(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(Rule::parse(&parsed.to_string()).unwrap(), parsed);
        }
        assert_eq!(
            rule(" run_command( git   status ) = allow : harmless ").to_string(),
            "run_command(git status)=allow:\"harmless\""
        );
        assert_eq!(
            rule("read_file(./src/**)=deny").to_string(),
            "read_file(src/**)=deny"
        );
        // A path glob that reads as an argument is written quoted, so that it stays a path glob.
        let path = rule("read_file(path=x=y)=deny");
        assert_eq!(path.to_string(), "read_file(\"x=y\")=deny");
        assert_eq!(Rule::parse(&path.to_string()).unwrap(), path);
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        // An allow glob with `.` or `:` allowed nothing, silently (no name the model sees has them); a deny glob and
        // an exact name are read as the model's names.
        assert_eq!(
            problem("mcp__fs__files.*=allow"),
            RuleProblem::AllowsNothing("mcp__fs__files.*".into())
        );
        assert_eq!(
            problem("mcp__db__query:*(sql=select*)=allow"),
            RuleProblem::AllowsNothing("mcp__db__query:*".into())
        );
        assert!(Rule::parse("mcp__fs__files.*=deny").is_ok());
        assert!(Rule::parse("mcp__fs__files.read=allow").is_ok());
        assert_eq!(problem("delete_file"), RuleProblem::Shape);
        assert_eq!(problem("=deny"), RuleProblem::NoTool);
        assert_eq!(
            problem("delete_file=maybe"),
            RuleProblem::Action("maybe".into())
        );
        assert_eq!(problem("run_command(git=deny"), RuleProblem::Unbalanced);
        assert_eq!(problem("run_command()=deny"), RuleProblem::EmptyMatcher);
        assert_eq!(problem("run_command(\"git)=deny"), RuleProblem::Unbalanced);
        assert_eq!(
            problem("read_file(../x)=deny"),
            RuleProblem::PathOutside("../x".into())
        );
        assert_eq!(
            problem("read_file(/etc/**)=deny"),
            RuleProblem::PathOutside("/etc/**".into())
        );
        // `$` narrows: on a deny or an ask, a call would dodge it by adding an argument.
        for action in ["deny", "ask"] {
            assert_eq!(
                problem(&format!("mcp__gh__delete_repo(repo=acme/prod, $)={action}")),
                RuleProblem::OnlyArgumentsNotForAllow
            );
        }
        // Inside an alternative too.
        assert_eq!(
            problem("read_file({a,../b})=deny"),
            RuleProblem::PathOutside("{a,../b}".into())
        );
        // The alternatives inside `{…}` are normalised as the rest of a path glob is.
        for (glob, normalised) in [
            ("{.env,./secrets/**}", "{.env,secrets/**}"),
            ("{a//b,c}", "{a/b,c}"),
            ("src/{./a,b}", "src/{a,b}"),
            ("{a,b/.}", "{a,b}"),
            ("{secrets/,.env}", "{secrets,.env}"),
            ("{x,{./y,z/}}", "{x,{y,z}}"),
            ("src{/a,/b}", "src{/a,/b}"),
            ("[./]x", "[./]x"),
            ("{a,\\./b}", "{a,\\./b}"),
            ("./{a,b}", "{a,b}"),
        ] {
            assert_eq!(
                normalised_path_glob(glob).as_deref(),
                Some(normalised),
                "{glob}"
            );
        }
        assert!(matches!(
            problem("read_file(a[)=deny"),
            RuleProblem::Glob { .. }
        ));
        assert_eq!(
            problem("read file=deny"),
            RuleProblem::ToolPattern("read file".into())
        );
        assert_eq!(
            problem("x(a=1, a=2)=deny"),
            RuleProblem::DuplicateArgument("a".into())
        );
        assert_eq!(problem("x=deny:"), RuleProblem::EmptyReason);
        assert_eq!(
            problem("run_command(git log -n 1 #abc $)=allow"),
            RuleProblem::CommandComment
        );
        // A `#` inside a word, escaped or quoted is a `#`.
        assert_eq!(
            rule("run_command(git log a#b \\#c \"#d\" $)=allow").to_string(),
            "run_command(git log 'a#b' '#c' '#d' $)=allow"
        );
        assert_eq!(
            problem("run_command(a) b=deny"),
            RuleProblem::TrailingText("b".into())
        );
        let error = Rule::parse("read_file(../x)=deny").unwrap_err();
        assert_eq!(
            error.to_string(),
            "rule \"read_file(../x)=deny\": the path glob \"../x\" leaves the workspace; paths are relative to it (no leading /, no ..)"
        );
    }

    #[test]
    fn a_command_prefix_matches_whole_words_from_the_start() {
        let status = "run_command(git status)=allow";
        assert!(matches(
            status,
            "run_command",
            json!({"command": "git", "args": ["status"]})
        ));
        assert!(matches(
            status,
            "run_command",
            json!({"command": "git", "args": ["status", "--short"]})
        ));
        assert!(!matches(
            status,
            "run_command",
            json!({"command": "git", "args": ["statusx"]})
        ));
        assert!(!matches(status, "run_command", json!({"command": "git"})));
        assert!(!matches(
            status,
            "run_command",
            json!({"command": "sh", "args": ["-c", "git status"]})
        ));
        assert!(!matches(
            status,
            "run_command",
            json!({"command": "/usr/bin/git", "args": ["status"]})
        ));
        let exact = "run_command(ls -la $)=allow";
        assert!(matches(
            exact,
            "run_command",
            json!({"command": "ls", "args": ["-la"]})
        ));
        assert!(!matches(
            exact,
            "run_command",
            json!({"command": "ls", "args": ["-la", ".."]})
        ));
        // A deny catches the program by name from any directory; an allow does not.
        assert!(matches(
            "run_command(rm)=deny",
            "run_command",
            json!({"command": "/bin/rm"})
        ));
    }

    #[test]
    fn a_table_entry_is_the_same_rule_as_its_written_form() {
        let entry: RuleEntry = toml::from_str(
            r#"
            tool = "run_command"
            command = "git commit -m 'fix it'"
            action = "ask"
            reason = "Commits change history."
            "#,
        )
        .unwrap();
        let from_entry = Rule::from_entry(&entry).unwrap();
        assert_eq!(
            from_entry.to_string(),
            "run_command(git commit -m 'fix it')=ask:\"Commits change history.\""
        );
        assert_eq!(
            Rule::from_entry(&from_entry.to_entry()).unwrap(),
            from_entry
        );
        // `exact` with arguments: no argument but these, as `$` writes it.
        let only: RuleEntry = toml::from_str(
            r#"
            tool = "mcp__gh__create_issue"
            arguments = { repo = "acme/w" }
            exact = true
            action = "allow"
            "#,
        )
        .unwrap();
        let only = Rule::from_entry(&only).unwrap();
        assert_eq!(
            only.to_string(),
            "mcp__gh__create_issue(repo=acme/w, $)=allow"
        );
        assert_eq!(Rule::from_entry(&only.to_entry()).unwrap(), only);
        let mut asking = only.to_entry();
        asking.action = RuleAction::Ask;
        assert_eq!(
            Rule::from_entry(&asking),
            Err(RuleProblem::OnlyArgumentsNotForAllow)
        );
        let entry = RuleEntry {
            tool: "read_file".into(),
            command: Some(CommandWords::Line("cat".into())),
            exact: false,
            path: None,
            arguments: BTreeMap::new(),
            action: RuleAction::Deny,
            reason: None,
        };
        assert_eq!(
            Rule::from_entry(&entry).unwrap_err(),
            RuleProblem::CommandNotForTool
        );
    }
}
