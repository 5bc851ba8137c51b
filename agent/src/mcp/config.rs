//! MCP configuration: which servers to start and how far to trust them.
//!
//! Two shapes are read, chosen by the file's extension:
//!
//! - `.toml`: `[mcp_servers.NAME]` tables, as Codex writes them (other top-level keys are left alone, so a Codex
//!   `config.toml` can be given as it is);
//! - anything else, JSON: the common `.mcp.json` shape, `{"mcpServers": {"NAME": {...}}}`.
//!
//! Both take the same fields for a server: `command`, `args`, `env` (a child process speaking on stdio) or `url`,
//! `headers` (streamable HTTP; `type` may say which), plus toolgate's own: `enabled`, `required`,
//! `startup_timeout_secs`, `tool_timeout_secs`, `enabled_tools`, `disabled_tools`, `trust` and `rules`. Strings in
//! `command`, `args`, `env`, `url` and `headers` expand `${VAR}` and `${VAR:-default}` from toolgate's environment.
//! Anything wrong is an error that names the file, the server and the field; nothing starts with a configuration
//! that did not read cleanly.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::mcp::naming::sanitize_server_name;
use crate::policy::Rule;
use crate::wire::{McpTransportKind, McpTrust};

/// How long a server may take to start and list its tools, unless its configuration says otherwise.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one tool call may take, unless the server's configuration says otherwise.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest either timeout may be.
const MAX_TIMEOUT_SECS: f64 = 24.0 * 60.0 * 60.0;

/// Every configured MCP server: file by file, each file's servers by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct McpConfig {
    pub servers: Vec<McpServerConfig>,
}

/// One MCP server's configuration, checked and with its variables expanded.
#[derive(Clone, Debug, PartialEq)]
pub struct McpServerConfig {
    /// The name as configured; status and errors use it.
    pub name: String,
    /// The name as it appears in tool names (`mcp__<this>__tool`).
    pub tool_prefix_name: String,
    /// The file it was read from.
    pub file: PathBuf,
    pub transport: McpTransport,
    pub enabled: bool,
    /// When true, toolgate does not start without this server.
    pub required: bool,
    pub startup_timeout: Duration,
    pub tool_timeout: Duration,
    /// When set, only these of the server's tools (by their own names) are offered.
    pub enabled_tools: Option<BTreeSet<String>>,
    /// These of the server's tools are never offered.
    pub disabled_tools: BTreeSet<String>,
    pub trust: McpTrust,
    /// Rules for the server's tools, by the tools' own names.
    pub rules: Vec<ServerRule>,
}

impl McpServerConfig {
    /// Whether the server's tool `tool` (its own name) is offered to the model.
    pub fn offers(&self, tool: &str) -> bool {
        self.enabled_tools
            .as_ref()
            .is_none_or(|enabled| enabled.contains(tool))
            && !self.disabled_tools.contains(tool)
    }

    pub fn transport_kind(&self) -> McpTransportKind {
        match self.transport {
            McpTransport::Stdio { .. } => McpTransportKind::Stdio,
            McpTransport::Http { .. } => McpTransportKind::Http,
        }
    }
}

/// How a server is reached.
#[derive(Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process, started in the workspace with a reduced environment.
    Stdio {
        command: String,
        args: Vec<String>,
        /// The variables the configuration names; the child gets these and `PATH`, `HOME`, `LANG`, nothing else.
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl McpTransport {
    /// A digest (SHA-256, hex) of where the server is: its command and arguments, or its URL. The environment and
    /// the headers are left out: they hold the tokens, which are rotated without the server becoming another.
    pub fn endpoint_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        match self {
            Self::Stdio { command, args, .. } => {
                hasher.update(b"stdio\0");
                // Each word with its length before it, so that no two argvs read the same.
                for word in std::iter::once(command).chain(args) {
                    hasher.update((word.len() as u64).to_be_bytes());
                    hasher.update(word.as_bytes());
                }
            }
            Self::Http { url, .. } => {
                hasher.update(b"http\0");
                hasher.update(url.as_bytes());
            }
        }
        hex::encode(hasher.finalize())
    }
}

// Expanded values may hold secrets (tokens in headers, keys in the environment): never print them.
impl fmt::Debug for McpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", &args.len())
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish(),
            Self::Http { headers, .. } => f
                .debug_struct("Http")
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish_non_exhaustive(),
        }
    }
}

/// A rule for a server's tools in the policy's rule syntax (`TOOL=allow`, `TOOL(name=glob)=ask`, `read_*=deny`),
/// `TOOL` being the tool's own name on the server or a glob over those names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRule {
    /// The rule as written in the configuration.
    pub written: String,
    /// The same rule for the names the model sees (`mcp__<server>__TOOL`).
    pub rule: Rule,
}

/// What is wrong with a configuration, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    pub server: Option<String>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MCP configuration {}", self.file.display())?;
        if let Some(server) = &self.server {
            write!(f, ", server {server:?}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ", field {field:?}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The fields a server may have; anything else is a mistake worth stopping for (a misspelt `trust` must not
/// silently leave a server trusted or not).
const FIELDS: [&str; 18] = [
    "type",
    "command",
    "args",
    "env",
    "url",
    "headers",
    "http_headers",
    "enabled",
    "required",
    "startup_timeout_secs",
    "startup_timeout_sec",
    "tool_timeout_secs",
    "tool_timeout_sec",
    "enabled_tools",
    "disabled_tools",
    "trust",
    "rules",
    "description",
];

impl McpConfig {
    /// Reads every file, in order, expanding variables with `lookup` (toolgate's environment, in production).
    pub fn load(
        files: &[PathBuf],
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for file in files {
            let text = std::fs::read_to_string(file).map_err(|error| ConfigError {
                file: file.clone(),
                server: None,
                field: None,
                message: format!("cannot read it: {error}"),
            })?;
            for server in Self::parse(file, &text, lookup)?.servers {
                config.add(server)?;
            }
        }
        Ok(config)
    }

    /// Reads one file's text; `file` names it in errors and decides the shape (`.toml` or JSON).
    pub fn parse(
        file: &Path,
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let error = |message: String| ConfigError {
            file: file.to_owned(),
            server: None,
            field: None,
            message,
        };
        let is_toml = file
            .extension()
            .is_some_and(|extension| extension.eq_ignore_ascii_case("toml"));
        let (document, key) = if is_toml {
            let document: toml::Table =
                toml::from_str(text).map_err(|e| error(format!("it is not valid TOML: {e}")))?;
            let document = serde_json::to_value(document)
                .map_err(|e| error(format!("it cannot be read: {e}")))?;
            (document, "mcp_servers")
        } else {
            let UniqueKeys(document) = serde_json::from_str(text).map_err(|e| {
                error(match e.classify() {
                    // A key written twice: JSON itself allows it; a configuration must not.
                    serde_json::error::Category::Data => format!("it cannot be read: {e}"),
                    _ => format!("it is not valid JSON: {e}"),
                })
            })?;
            (document, "mcpServers")
        };
        let Some(servers) = document.get(key) else {
            return Err(error(format!(
                "it has no {key} table, so it names no server"
            )));
        };
        let Value::Object(servers) = servers else {
            return Err(error(format!(
                "{key} must be a table of servers by name, not {}",
                kind_of(servers)
            )));
        };
        let base = file.parent().unwrap_or(Path::new("."));
        let mut config = Self::default();
        for (name, server) in servers {
            let reader = ServerReader {
                file,
                base,
                name,
                lookup,
            };
            config.add(reader.read(server)?)?;
        }
        Ok(config)
    }

    fn add(&mut self, server: McpServerConfig) -> Result<(), ConfigError> {
        if let Some(other) = self.servers.iter().find(|other| {
            other.tool_prefix_name == server.tool_prefix_name
                || crate::mcp::naming::may_share_names(
                    &other.tool_prefix_name,
                    &server.tool_prefix_name,
                )
        }) {
            let message = if other.name == server.name {
                format!(
                    "a server of this name is configured already in {}",
                    other.file.display()
                )
            } else if other.tool_prefix_name == server.tool_prefix_name {
                format!(
                    "its tools would be named like those of server {:?} (mcp__{}__...); rename one",
                    other.name, server.tool_prefix_name
                )
            } else {
                format!(
                    "its tools with long names would be named like those of server {:?}: tool names are cut to 64 \
                     characters, and the two server names agree on all that is kept of them; shorten one",
                    other.name
                )
            };
            return Err(ConfigError {
                file: server.file.clone(),
                server: Some(server.name.clone()),
                field: None,
                message,
            });
        }
        self.servers.push(server);
        Ok(())
    }
}

/// Reads one server's table.
struct ServerReader<'a> {
    file: &'a Path,
    /// The directory relative commands are found from.
    base: &'a Path,
    name: &'a str,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl ServerReader<'_> {
    fn error(&self, field: Option<&str>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            server: Some(self.name.to_owned()),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }

    fn read(&self, value: &Value) -> Result<McpServerConfig, ConfigError> {
        let Value::Object(table) = value else {
            return Err(self.error(
                None,
                format!("a server must be a table of fields, not {}", kind_of(value)),
            ));
        };
        let tool_prefix_name = sanitize_server_name(self.name);
        if tool_prefix_name.is_empty() {
            return Err(self.error(
                None,
                "the name needs at least one letter or digit: tool names are mcp__<server>__<tool>",
            ));
        }
        if let Some(unknown) = table.keys().find(|key| !FIELDS.contains(&key.as_str())) {
            return Err(self.error(
                Some(unknown),
                format!("unknown field; the fields are {}", FIELDS.join(", ")),
            ));
        }
        let transport = self.transport(table)?;
        let timeout = |fields: [&str; 2], default: Duration| -> Result<Duration, ConfigError> {
            match fields
                .iter()
                .find_map(|field| table.get(*field).map(|v| (*field, v)))
            {
                None => Ok(default),
                Some((field, value)) => match value.as_f64() {
                    Some(secs) if secs > 0.0 && secs <= MAX_TIMEOUT_SECS => {
                        Ok(Duration::from_secs_f64(secs))
                    }
                    _ => Err(self.error(
                        Some(field),
                        format!(
                            "must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECS}"
                        ),
                    )),
                },
            }
        };
        let tools = |field: &str| -> Result<Option<BTreeSet<String>>, ConfigError> {
            table
                .get(field)
                .map(|value| {
                    self.strings(field, value)
                        .map(|names| names.into_iter().collect())
                })
                .transpose()
        };
        let rules = self.rules(table, &tool_prefix_name)?;
        Ok(McpServerConfig {
            name: self.name.to_owned(),
            tool_prefix_name,
            file: self.file.to_owned(),
            transport,
            enabled: self.flag(table, "enabled", true)?,
            required: self.flag(table, "required", false)?,
            startup_timeout: timeout(
                ["startup_timeout_secs", "startup_timeout_sec"],
                DEFAULT_STARTUP_TIMEOUT,
            )?,
            tool_timeout: timeout(
                ["tool_timeout_secs", "tool_timeout_sec"],
                DEFAULT_TOOL_TIMEOUT,
            )?,
            enabled_tools: tools("enabled_tools")?,
            disabled_tools: tools("disabled_tools")?.unwrap_or_default(),
            trust: self.trust(table)?,
            rules,
        })
    }

    fn transport(&self, table: &Map<String, Value>) -> Result<McpTransport, ConfigError> {
        let declared = match table.get("type") {
            None => None,
            Some(Value::String(kind)) => Some(kind.as_str()),
            Some(other) => {
                return Err(self.error(
                    Some("type"),
                    format!("must be \"stdio\" or \"http\", not {}", kind_of(other)),
                ));
            }
        };
        let kind = match declared {
            Some("stdio") => McpTransportKind::Stdio,
            Some("http" | "streamable_http" | "streamable-http" | "streamableHttp") => {
                McpTransportKind::Http
            }
            Some("sse") => {
                return Err(self.error(
                    Some("type"),
                    "the SSE transport is not supported (it is deprecated); use the server's streamable HTTP endpoint with \"type\": \"http\"",
                ));
            }
            Some(other) => {
                return Err(self.error(
                    Some("type"),
                    format!("unknown transport {other:?}; it must be \"stdio\" or \"http\""),
                ));
            }
            None if table.contains_key("url") => McpTransportKind::Http,
            None if table.contains_key("command") => McpTransportKind::Stdio,
            None => {
                return Err(self.error(
                    None,
                    "it needs either a command (a program started on stdio) or a url (streamable HTTP)",
                ));
            }
        };
        let misplaced = match kind {
            McpTransportKind::Stdio => ["url", "headers", "http_headers"].as_slice(),
            McpTransportKind::Http => ["command", "args", "env"].as_slice(),
        };
        if let Some(field) = misplaced.iter().find(|field| table.contains_key(**field)) {
            let what = match kind {
                McpTransportKind::Stdio => "a stdio server",
                McpTransportKind::Http => "an HTTP server",
            };
            return Err(self.error(Some(field), format!("{what} takes no {field}")));
        }
        match kind {
            McpTransportKind::Stdio => {
                let command = match table.get("command") {
                    Some(Value::String(command)) => self.expand("command", command)?,
                    Some(other) => {
                        return Err(self.error(
                            Some("command"),
                            format!("must be a string, not {}", kind_of(other)),
                        ));
                    }
                    None => return Err(self.error(Some("command"), "a stdio server needs one")),
                };
                if command.trim().is_empty() {
                    return Err(self.error(Some("command"), "must not be empty"));
                }
                let args = match table.get("args") {
                    None => Vec::new(),
                    Some(value) => self
                        .strings("args", value)?
                        .iter()
                        .enumerate()
                        .map(|(i, arg)| self.expand(&format!("args[{i}]"), arg))
                        .collect::<Result<_, _>>()?,
                };
                let env = self.string_table("env", table.get("env"))?;
                if let Some(name) = env.keys().find(|name| !is_env_name(name)) {
                    return Err(self.error(
                        Some(&format!("env.{name}")),
                        "is not a valid environment variable name",
                    ));
                }
                Ok(McpTransport::Stdio {
                    command: self.resolve_command(command),
                    args,
                    env,
                })
            }
            McpTransportKind::Http => {
                let url = match table.get("url") {
                    Some(Value::String(url)) => self.expand("url", url)?,
                    Some(other) => {
                        return Err(self.error(
                            Some("url"),
                            format!("must be a string, not {}", kind_of(other)),
                        ));
                    }
                    None => return Err(self.error(Some("url"), "an HTTP server needs one")),
                };
                match reqwest::Url::parse(&url) {
                    Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                    Ok(parsed) => {
                        return Err(self.error(
                            Some("url"),
                            format!("must be http or https, not {}", parsed.scheme()),
                        ));
                    }
                    Err(error) => {
                        return Err(self.error(Some("url"), format!("is not a URL: {error}")));
                    }
                }
                let field = if table.contains_key("http_headers") {
                    "http_headers"
                } else {
                    "headers"
                };
                let headers = self.string_table(field, table.get(field))?;
                for (name, value) in &headers {
                    let at = format!("{field}.{name}");
                    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(self.error(Some(&at), "is not a valid HTTP header name"));
                    }
                    if reqwest::header::HeaderValue::from_str(value).is_err() {
                        return Err(
                            self.error(Some(&at), "its value is not a valid HTTP header value")
                        );
                    }
                }
                Ok(McpTransport::Http { url, headers })
            }
        }
    }

    /// A command with a `/` that is not absolute is found from the configuration file's directory, so a
    /// configuration can sit beside the server it starts; a bare name is looked up in `PATH`.
    fn resolve_command(&self, command: String) -> String {
        let path = Path::new(&command);
        if command.contains('/') && path.is_relative() {
            self.base.join(path).display().to_string()
        } else {
            command
        }
    }

    fn flag(
        &self,
        table: &Map<String, Value>,
        field: &str,
        default: bool,
    ) -> Result<bool, ConfigError> {
        match table.get(field) {
            None => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(other) => Err(self.error(
                Some(field),
                format!("must be true or false, not {}", kind_of(other)),
            )),
        }
    }

    fn trust(&self, table: &Map<String, Value>) -> Result<McpTrust, ConfigError> {
        match table.get("trust") {
            None => Ok(McpTrust::Untrusted),
            Some(Value::String(trust)) if trust == "untrusted" => Ok(McpTrust::Untrusted),
            Some(Value::String(trust)) if trust == "annotations" => Ok(McpTrust::Annotations),
            Some(other) => Err(self.error(
                Some("trust"),
                format!(
                    "must be \"untrusted\" (the default) or \"annotations\" (its annotations decide), not {other}"
                ),
            )),
        }
    }

    fn rules(
        &self,
        table: &Map<String, Value>,
        tool_prefix_name: &str,
    ) -> Result<Vec<ServerRule>, ConfigError> {
        let Some(value) = table.get("rules") else {
            return Ok(Vec::new());
        };
        let mut rules = Vec::new();
        for (i, written) in self.strings("rules", value)?.into_iter().enumerate() {
            let rule = crate::mcp::rules::server_rule(tool_prefix_name, &written)
                .map_err(|error| self.error(Some(&format!("rules[{i}]")), error.to_string()))?;
            rules.push(ServerRule { written, rule });
        }
        Ok(rules)
    }

    fn strings(&self, field: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
        let Value::Array(items) = value else {
            return Err(self.error(
                Some(field),
                format!("must be a list of strings, not {}", kind_of(value)),
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(self.error(
                    Some(&format!("{field}[{i}]")),
                    format!("must be a string, not {}", kind_of(other)),
                )),
            })
            .collect()
    }

    /// A table of strings, each expanded.
    fn string_table(
        &self,
        field: &str,
        value: Option<&Value>,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let Some(value) = value else {
            return Ok(BTreeMap::new());
        };
        let Value::Object(entries) = value else {
            return Err(self.error(
                Some(field),
                format!("must be a table of strings, not {}", kind_of(value)),
            ));
        };
        entries
            .iter()
            .map(|(key, value)| {
                let at = format!("{field}.{key}");
                match value {
                    Value::String(text) => Ok((key.clone(), self.expand(&at, text)?)),
                    other => Err(self.error(
                        Some(&at),
                        format!("must be a string, not {}", kind_of(other)),
                    )),
                }
            })
            .collect()
    }

    fn expand(&self, field: &str, text: &str) -> Result<String, ConfigError> {
        expand_variables(text, self.lookup).map_err(|message| self.error(Some(field), message))
    }
}

/// Expands `${VAR}` and `${VAR:-default}` (the default when `VAR` is unset or empty). A `$` not followed by `{`
/// stays as it is.
pub fn expand_variables(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{:?} opens a ${{ that is never closed", text))?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        if !is_env_name(name) {
            return Err(format!(
                "${{{inner}}} does not name a variable (letters, digits and _)"
            ));
        }
        match (lookup(name).filter(|value| !value.is_empty()), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(format!(
                    "${{{name}}} is not set in toolgate's environment (give a default with ${{{name}:-...}})"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

/// A JSON document in which no object names a key twice. `serde_json` keeps the last of a repeated key without a
/// word; in a configuration that would drop a server, or a setting the person wrote, unseen. (TOML refuses a
/// repeated key itself.)
struct UniqueKeys(Value);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key \"{key}\" appears twice in one object"
                )));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("t0k".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn parse(file: &str, text: &str) -> Result<McpConfig, ConfigError> {
        McpConfig::parse(Path::new(file), text, &env)
    }

    /// A grant for a server's tool holds while the server is reached the same way: its command and arguments, or
    /// its URL. A rotated token (the environment, a header) is the same server.
    #[test]
    fn a_server_is_known_by_where_it_is_not_by_its_secrets() {
        let stdio = |command: &str, args: &[&str], token: &str| McpTransport::Stdio {
            command: command.into(),
            args: args.iter().map(|&arg| arg.into()).collect(),
            env: BTreeMap::from([("TOKEN".to_owned(), token.to_owned())]),
        };
        let http = |url: &str, token: &str| McpTransport::Http {
            url: url.into(),
            headers: BTreeMap::from([("Authorization".to_owned(), format!("Bearer {token}"))]),
        };
        let digest = McpTransport::endpoint_digest;
        assert_eq!(
            digest(&stdio("mcp-fs", &["--root", "a"], "old")),
            digest(&stdio("mcp-fs", &["--root", "a"], "new"))
        );
        assert_eq!(
            digest(&http("https://mcp.example/v1", "old")),
            digest(&http("https://mcp.example/v1", "new"))
        );
        let distinct = [
            digest(&stdio("mcp-fs", &["--root", "a"], "t")),
            digest(&stdio("mcp-fs", &["--root", "b"], "t")),
            digest(&stdio("mcp-fs", &["--root a"], "t")),
            digest(&stdio("mcp-fs-2", &["--root", "a"], "t")),
            digest(&http("https://staging.mcp.example/v1", "t")),
            digest(&http("https://mcp.example/v1", "t")),
        ];
        let unique: BTreeSet<&String> = distinct.iter().collect();
        assert_eq!(unique.len(), distinct.len(), "{distinct:?}");
    }

    #[test]
    fn a_key_written_twice_in_json_is_an_error_where_it_is() {
        for text in [
            r#"{"mcpServers": {"fs": {"command": "a"}, "fs": {"command": "b"}}}"#,
            r#"{"mcpServers": {"fs": {"command": "a", "args": ["x"], "command": "b"}}}"#,
            r#"{"mcpServers": {"fs": {"command": "a", "env": {"K": "1", "K": "2"}}}}"#,
        ] {
            let error = parse("servers.json", text).unwrap_err().to_string();
            assert!(
                error.contains("it cannot be read: the key ") && error.contains("appears twice"),
                "{error}"
            );
        }
        // Objects apart may use the same keys; arrays and numbers read as before.
        let config = parse(
            "servers.json",
            r#"{"mcpServers": {"a": {"command": "x", "args": ["1", "2"], "tool_timeout_secs": 5}, "b": {"command": "x", "enabled_tools": ["echo"]}}}"#,
        );
        assert!(config.is_ok(), "{config:?}");
    }

    #[test]
    fn the_mcp_json_shape_reads_with_variables_expanded() {
        let config = parse(
            "/etc/toolgate/.mcp.json",
            r#"{"mcpServers": {
                "fs": {"command": "npx", "args": ["server", "${HOME_DIR:-/srv}"], "env": {"KEY": "${TOKEN}"}},
                "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
                "local": {"command": "./bin/server"}
            }, "other": "ignored"}"#,
        )
        .unwrap();
        let [fs, local, remote] = config.servers.as_slice() else {
            panic!("three servers: {config:?}");
        };
        assert_eq!(fs.name, "fs");
        assert_eq!(
            fs.transport,
            McpTransport::Stdio {
                command: "npx".into(),
                args: vec!["server".into(), "/srv".into()],
                env: [("KEY".to_owned(), "t0k".to_owned())].into(),
            }
        );
        assert!(fs.enabled && !fs.required);
        assert_eq!(fs.trust, McpTrust::Untrusted);
        assert_eq!(fs.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(fs.tool_timeout, DEFAULT_TOOL_TIMEOUT);
        assert_eq!(
            remote.transport,
            McpTransport::Http {
                url: "https://mcp.example.com/mcp".into(),
                headers: [("Authorization".to_owned(), "Bearer t0k".to_owned())].into(),
            }
        );
        let McpTransport::Stdio { command, .. } = &local.transport else {
            panic!("stdio");
        };
        assert_eq!(command, "/etc/toolgate/./bin/server");
    }

    #[test]
    fn the_toml_shape_reads_with_toolgates_own_fields() {
        let config = parse(
            "config.toml",
            r#"
            model = "o3"   # a Codex config's other keys are left alone

            [mcp_servers.github]
            url = "https://api.example.com/mcp"
            http_headers = { "X-Token" = "${TOKEN}" }
            required = true
            startup_timeout_sec = 20
            tool_timeout_secs = 2.5
            enabled_tools = ["create_issue", "list_issues"]
            trust = "annotations"
            rules = ["create_issue=ask", "list_issues = allow"]

            [mcp_servers.time]
            command = "mcp-server-time"
            enabled = false
            disabled_tools = ["convert_time"]
            "#,
        )
        .unwrap();
        let [github, time] = config.servers.as_slice() else {
            panic!("two servers: {config:?}");
        };
        assert!(github.required);
        assert_eq!(github.startup_timeout, Duration::from_secs(20));
        assert_eq!(github.tool_timeout, Duration::from_millis(2_500));
        assert_eq!(github.trust, McpTrust::Annotations);
        assert!(github.offers("create_issue") && !github.offers("delete_repo"));
        let rules: Vec<(&str, String)> = github
            .rules
            .iter()
            .map(|rule| (rule.written.as_str(), rule.rule.to_string()))
            .collect();
        assert_eq!(
            rules,
            [
                (
                    "create_issue=ask",
                    "mcp__github__create_issue=ask".to_owned()
                ),
                (
                    "list_issues = allow",
                    "mcp__github__list_issues=allow".to_owned()
                )
            ]
        );
        assert!(!time.enabled);
        assert!(time.offers("get_current_time") && !time.offers("convert_time"));
    }

    #[test]
    fn mistakes_name_the_file_the_server_and_the_field() {
        let cases = [
            (
                r#"{"mcpServers": {"fs": {"command": "x", "trusted": true}}}"#,
                Some("trusted"),
                "unknown field",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "args": ["${NOPE}"]}}}"#,
                Some("args[0]"),
                "${NOPE} is not set",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "args": "a b"}}}"#,
                Some("args"),
                "must be a list of strings",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "trust": "yes"}}}"#,
                Some("trust"),
                "must be \"untrusted\"",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "tool_timeout_secs": 0}}}"#,
                Some("tool_timeout_secs"),
                "above 0",
            ),
            (
                r#"{"mcpServers": {"fs": {"url": "ftp://x"}}}"#,
                Some("url"),
                "http or https",
            ),
            (
                r#"{"mcpServers": {"fs": {"type": "sse", "url": "http://x"}}}"#,
                Some("type"),
                "not supported",
            ),
            (
                r#"{"mcpServers": {"fs": {"type": "stdio", "command": "x", "url": "http://x"}}}"#,
                Some("url"),
                "a stdio server takes no url",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "url": "http://x"}}}"#,
                Some("command"),
                "an HTTP server takes no command",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "rules": ["write=maybe"]}}}"#,
                Some("rules[0]"),
                "maybe",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "env": {"A": 1}}}}"#,
                Some("env.A"),
                "must be a string",
            ),
            (r#"{"mcpServers": {"fs": {}}}"#, None, "either a command"),
            (
                r#"{"mcpServers": {"!!": {"command": "x"}}}"#,
                None,
                "letter or digit",
            ),
        ];
        for (text, field, message) in cases {
            let error = parse("servers.json", text).unwrap_err();
            assert_eq!(error.file, Path::new("servers.json"), "{text}");
            assert_eq!(error.field.as_deref(), field, "{text}: {error}");
            assert!(error.message.contains(message), "{text}: {error}");
            assert!(
                error
                    .to_string()
                    .starts_with("MCP configuration servers.json, server")
            );
        }
        let error = parse("servers.json", "{").unwrap_err();
        assert!(error.message.contains("not valid JSON"), "{error}");
        let error = parse("servers.toml", "[mcp_servers.a]\ncommand = ").unwrap_err();
        assert!(error.message.contains("not valid TOML"), "{error}");
        let error = parse("servers.json", r#"{"servers": {}}"#).unwrap_err();
        assert!(error.message.contains("no mcpServers"), "{error}");
    }

    #[test]
    fn servers_whose_tool_names_would_collide_are_refused() {
        let error = parse(
            "x.json",
            r#"{"mcpServers": {"my.fs": {"command": "a"}, "my_fs": {"command": "b"}}}"#,
        )
        .unwrap_err();
        assert_eq!(error.server.as_deref(), Some("my_fs"));
        assert!(error.message.contains("mcp__my_fs__"), "{error}");
        // Long names that differ only past what a tool's name cut to 64 characters keeps of them.
        let error = parse(
            "x.json",
            r#"{"mcpServers": {
                "github-enterprise-acme-corporation-internal-mirror-production": {"command": "a"},
                "github-enterprise-acme-corporation-internal-mirror-staging": {"command": "b"}
            }}"#,
        )
        .unwrap_err();
        assert_eq!(
            error.server.as_deref(),
            Some("github-enterprise-acme-corporation-internal-mirror-staging")
        );
        assert!(error.message.contains("shorten one"), "{error}");
    }

    #[test]
    fn variables_expand_with_defaults_and_unclosed_ones_are_errors() {
        assert_eq!(expand_variables("a${TOKEN}b", &env).unwrap(), "at0kb");
        assert_eq!(expand_variables("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(expand_variables("${NOPE:-}", &env).unwrap(), "");
        assert_eq!(
            expand_variables("$HOME and $", &env).unwrap(),
            "$HOME and $"
        );
        assert!(
            expand_variables("${TOKEN", &env)
                .unwrap_err()
                .contains("never closed")
        );
        assert!(
            expand_variables("${A B}", &env)
                .unwrap_err()
                .contains("does not name")
        );
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let config = parse(
            "x.json",
            r#"{"mcpServers": {"a": {"command": "x", "env": {"KEY": "${TOKEN}"}}, "b": {"url": "http://h/?k=${TOKEN}", "headers": {"A": "${TOKEN}"}}}}"#,
        )
        .unwrap();
        let printed = format!("{config:?}");
        assert!(!printed.contains("t0k"), "{printed}");
    }
}
