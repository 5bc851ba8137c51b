//! Configuration: every option is a flag and an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent::policy::RuleSet;
use agent::store::sql::DatabaseUrl;
use agent::wire::ApprovalPolicy;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::security::{AccessToken, PublicOrigin};

/// Which model drives the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// The offline, deterministic scripted model. No key needed.
    Scripted,
    /// An OpenAI-compatible chat-completions API (OpenAI, Ollama, vLLM, llama.cpp, LM Studio).
    Openai,
}

/// Where toolgate keeps its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// In this process only: a restart loses everything, and what was pending counts as denied.
    Memory,
    /// SQLite or PostgreSQL.
    Sql(DatabaseUrl),
}

impl Database {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim() {
            "memory" => Ok(Self::Memory),
            other => DatabaseUrl::parse(other).map(Self::Sql),
        }
    }
}

/// What the binary can do besides serving.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Prints the audit log as JSON lines, oldest first (reads the database; the server may keep running).
    Audit(AuditArgs),
    /// Permission rules.
    #[command(subcommand)]
    Rules(RulesCommand),
}

/// What `toolgate rules` does.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum RulesCommand {
    /// Prints the decision for one call under the configured policy and rules (with the rules people added, read
    /// from the database), and what made it. Paths are read in the workspace, as the server reads them.
    Check {
        /// The tool, for example run_command or read_file.
        tool: String,
        /// The call's arguments as a JSON object, for example '{"command": "git", "args": ["status"]}'.
        arguments: String,
    },
}

/// Which audit entries `toolgate audit` prints.
#[derive(Clone, Debug, Args)]
pub struct AuditArgs {
    /// Only this session's entries.
    #[arg(long)]
    pub session: Option<String>,
    /// Only this run's entries.
    #[arg(long)]
    pub run: Option<String>,
    /// Only this tool's entries.
    #[arg(long)]
    pub tool: Option<String>,
    /// Only entries with this outcome (requested, approved, approved_with_edits, denied, timed_out, aborted, ...).
    #[arg(long)]
    pub outcome: Option<String>,
    /// From this time on: RFC 3339 (2026-11-30T10:00:00Z) or milliseconds since the Unix epoch.
    #[arg(long, value_parser = parse_time)]
    pub since: Option<u64>,
    /// Before this time: RFC 3339 or milliseconds since the Unix epoch.
    #[arg(long, value_parser = parse_time)]
    pub until: Option<u64>,
    /// At most this many entries.
    #[arg(long, default_value_t = 10_000)]
    pub limit: usize,
}

/// A time as RFC 3339 or as milliseconds since the Unix epoch.
pub fn parse_time(value: &str) -> Result<u64, String> {
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(value)
        .map_err(|error| {
            format!(
                "{value:?} is not a time ({error}): use RFC 3339 or milliseconds since the epoch"
            )
        })
        .and_then(|time| {
            time.duration_since(std::time::UNIX_EPOCH)
                .map(|since| since.as_millis() as u64)
                .map_err(|_| format!("{value:?} is before 1970"))
        })
}

/// toolgate: an LLM agent whose every tool call passes a permission policy, with a person in the loop.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "toolgate: an LLM agent whose every tool call passes a permission policy, with a person in the loop.",
    long_about = None
)]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Where toolgate keeps sessions, runs, approvals, grants and the audit log: `sqlite://PATH` (a file, created
    /// when missing; one toolgate process per file), `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (several
    /// instances may share it), or `memory` (nothing survives the process).
    #[arg(long, env = "TOOLGATE_DATABASE_URL", default_value = "sqlite://toolgate.db", value_parser = Database::parse, hide_env_values = true, global = true)]
    pub database_url: Database,

    /// With PostgreSQL: seconds an instance may go without a heartbeat (sent every fifth of it) before the others
    /// take its work over. Measured on the database's clock.
    #[arg(long, env = "TOOLGATE_LEASE_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub lease_secs: u64,

    /// Runs not ended (sampling, or waiting for people) the server may hold; past it a new run gets 503
    /// `SERVER_FULL` and the runs it holds go on.
    #[arg(long, env = "TOOLGATE_MAX_ACTIVE_RUNS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_active_runs: u64,

    /// Sessions the server may hold; past it a run in a new session gets 503 `SERVER_FULL`.
    #[arg(long, env = "TOOLGATE_MAX_SESSIONS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions: u64,

    /// Days a finished run (its events and transcript) is kept.
    #[arg(long, env = "TOOLGATE_RETENTION_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    pub retention_days: u64,

    /// MiB of event log kept over all runs; past it the oldest finished runs go first.
    #[arg(long, env = "TOOLGATE_EVENT_LOG_MIB", default_value_t = 1_024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub event_log_mib: u64,

    /// Address to listen on.
    #[arg(long, env = "TOOLGATE_ADDR", default_value = "127.0.0.1:3000")]
    pub addr: SocketAddr,

    /// An access token (printable ASCII, no spaces; long and random). When set, the API needs
    /// `Authorization: Bearer <token>` and people log in at /login. Needed to listen on anything but loopback.
    /// Prefer the environment variable: other users of the machine can see a flag in the process list.
    #[arg(long, env = "TOOLGATE_TOKEN", hide_env_values = true, value_parser = AccessToken::parse)]
    pub token: Option<AccessToken>,

    /// The origins browsers reach this server at, when that is not `http://` and the address they asked for:
    /// behind a reverse proxy or TLS, for example https://toolgate.example.com. Repeat the flag or separate them
    /// with commas. Pages of any other origin may not start, decide or cancel anything. Anything but a loopback
    /// origin needs `--token`; when every origin is https, cookies are Secure.
    #[arg(
        long = "public-origin",
        env = "TOOLGATE_PUBLIC_ORIGIN",
        value_delimiter = ',',
        value_parser = PublicOrigin::parse
    )]
    pub public_origins: Vec<PublicOrigin>,

    /// The model: `scripted` (offline, the default) or `openai` (any OpenAI-compatible API; its key, if it needs
    /// one, comes from the environment variable OPENAI_API_KEY, never from a flag).
    #[arg(long, env = "TOOLGATE_MODEL", value_enum, default_value = "scripted")]
    pub model: ModelKind,

    /// With `--model openai`: the API's base URL, up to and including `/v1` (Ollama: http://localhost:11434/v1).
    #[arg(
        long,
        env = "TOOLGATE_OPENAI_BASE_URL",
        default_value = "https://api.openai.com/v1"
    )]
    pub openai_base_url: String,

    /// With `--model openai`: the model's name as the API knows it (for example gpt-4o-mini or llama3.1).
    #[arg(long, env = "TOOLGATE_OPENAI_MODEL", default_value = "gpt-4o-mini")]
    pub openai_model: String,

    /// With `--model openai`: seconds to wait for the API to start answering, and then for each next piece of
    /// the answer. Local servers may need long for the first answer while they load the model.
    #[arg(long, env = "TOOLGATE_OPENAI_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub openai_timeout_secs: u64,

    /// With `--model openai`: seconds one step of the model (one answer, retries included) may take in all, even
    /// while the API keeps sending. Past it the run ends with a model error.
    #[arg(long, env = "TOOLGATE_OPENAI_STEP_TIMEOUT_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub openai_step_timeout_secs: u64,

    /// Approval policy: `on_request` (read-only tools run, the rest asks), `strict` (every call asks) or
    /// `trusted` (nothing asks). A run may ask for a stricter policy, never a looser one.
    #[arg(long, env = "TOOLGATE_POLICY", default_value = "on_request", value_parser = parse_policy)]
    pub policy: ApprovalPolicy,

    /// Rules that override the policy, separated by commas: `tool=allow|ask|deny`, or with an argument matcher,
    /// `run_command(git status)=allow,read_file(**/.env*)=deny` (see the README, "Policies and rules").
    #[arg(long, env = "TOOLGATE_RULES", default_value = "", value_parser = parse_rules)]
    pub rules: RuleSet,

    /// A TOML rules file of `[[rule]]` tables, read when toolgate starts (toolgate never writes it: rules people
    /// add are kept in the database).
    #[arg(long, env = "TOOLGATE_RULES_FILE")]
    pub rules_file: Option<PathBuf>,

    /// MCP servers whose tools the agent may use: a `.mcp.json` file (`{"mcpServers": {...}}`) or a TOML file with
    /// `[mcp_servers.NAME]` tables. Repeat the flag, or separate files with commas. A server runs with your user's
    /// rights, outside the workspace confinement; by default its tools ask before every call.
    #[arg(
        long = "mcp-config",
        env = "TOOLGATE_MCP_CONFIG",
        value_delimiter = ','
    )]
    pub mcp_config: Vec<PathBuf>,

    /// Seconds a person has to decide before a pending call is denied.
    #[arg(long, env = "TOOLGATE_APPROVAL_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub approval_timeout_secs: u64,

    /// The directory the built-in tools work in (created when missing).
    #[arg(long, env = "TOOLGATE_WORKSPACE", default_value = "./workspace")]
    pub workspace: PathBuf,

    /// Seconds a `run_command` call may take before it is stopped.
    #[arg(long, env = "TOOLGATE_COMMAND_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub command_timeout_secs: u64,

    /// KiB of the earlier conversation a model step may be sent (the messages' JSON); past it the oldest turns are
    /// left out, and the transcript says so. A run's own messages are always sent.
    #[arg(long, env = "TOOLGATE_CONTEXT_KIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub context_kib: u64,

    /// Model steps a run may take before it stops without an answer.
    #[arg(long, env = "TOOLGATE_MAX_STEPS", default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub max_steps: u32,

    /// Milliseconds the scripted model pauses before each text delta (0: none), to make streaming visible.
    #[arg(long, env = "TOOLGATE_SCRIPTED_DELAY_MS", default_value_t = 0)]
    pub scripted_delay_ms: u64,

    /// Seconds between keep-alive comments on an idle event stream (while a run waits for a person, say).
    #[arg(long, env = "TOOLGATE_KEEP_ALIVE_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub keep_alive_secs: u64,

    /// Event streams one client (one address, an IPv6 one by its /64; behind a reverse proxy, the proxy) may hold
    /// open at once. Past it a new stream is refused with 429 and the open ones go on.
    #[arg(long, env = "TOOLGATE_MAX_STREAMS_PER_CLIENT", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_streams_per_client: u64,

    /// Seconds a client has to send a request's body once its headers arrived (they have 30), and one more for every
    /// 64 KiB the body may have; past it the request is answered 408 and its connection closed, so a client that
    /// trickles a body cannot hold the server's memory and a task for as long as it likes.
    #[arg(long, env = "TOOLGATE_BODY_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub body_timeout_secs: u64,

    /// Log filter, in `tracing` directive syntax (for example `info` or `toolgate=debug,tower_http=debug`).
    #[arg(long, env = "TOOLGATE_LOG", default_value = "info")]
    pub log: String,
}

fn parse_policy(value: &str) -> Result<ApprovalPolicy, String> {
    value.parse()
}

fn parse_rules(value: &str) -> Result<RuleSet, String> {
    value
        .parse()
        .map_err(|error: agent::policy::RuleError| error.to_string())
}

impl Config {
    pub fn approval_timeout(&self) -> Duration {
        Duration::from_secs(self.approval_timeout_secs)
    }

    /// A configuration for tests: port 0 on loopback, scripted model, the given workspace, a memory store (tests
    /// of the durable stores say so).
    pub fn for_tests(workspace: impl Into<PathBuf>) -> Self {
        let mut config = Self::parse_from(["toolgate"]);
        config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
        config.workspace = workspace.into();
        config.database_url = Database::Memory;
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::try_parse_from(["toolgate"]).unwrap();
        assert_eq!(config.addr, "127.0.0.1:3000".parse().unwrap());
        assert_eq!(config.model, ModelKind::Scripted);
        assert_eq!(config.policy, ApprovalPolicy::OnRequest);
        assert_eq!(config.approval_timeout_secs, 120);
        assert_eq!(config.workspace, PathBuf::from("./workspace"));
        assert_eq!(config.openai_base_url, "https://api.openai.com/v1");
        assert_eq!(config.openai_model, "gpt-4o-mini");
        assert_eq!(config.openai_timeout_secs, 120);
        assert_eq!(config.max_streams_per_client, 1_000);
        assert_eq!(config.body_timeout_secs, 60);
        assert_eq!(
            config.database_url,
            Database::Sql(DatabaseUrl::Sqlite(PathBuf::from("toolgate.db"))),
            "durable by default, a file beside where toolgate runs"
        );
        assert_eq!(config.retention_days, 30);
        assert!(config.mcp_config.is_empty());
    }

    #[test]
    fn mcp_configurations_repeat_or_come_comma_separated() {
        let config = Config::try_parse_from([
            "toolgate",
            "--mcp-config",
            ".mcp.json",
            "--mcp-config",
            "a.toml,b.json",
        ])
        .unwrap();
        assert_eq!(
            config.mcp_config,
            [
                PathBuf::from(".mcp.json"),
                PathBuf::from("a.toml"),
                PathBuf::from("b.json")
            ]
        );
    }

    #[test]
    fn databases_are_named_by_url_and_bad_ones_are_refused() {
        let parse = |url: &str| Config::try_parse_from(["toolgate", "--database-url", url]);
        assert_eq!(parse("memory").unwrap().database_url, Database::Memory);
        assert_eq!(
            parse("sqlite:///var/lib/toolgate/state.db")
                .unwrap()
                .database_url,
            Database::Sql(DatabaseUrl::Sqlite(PathBuf::from(
                "/var/lib/toolgate/state.db"
            )))
        );
        assert_eq!(
            parse("postgres://tg:secret@db:5432/toolgate")
                .unwrap()
                .database_url,
            Database::Sql(DatabaseUrl::Postgres(
                "postgres://tg:secret@db:5432/toolgate".into()
            ))
        );
        let error = parse("mysql://x").unwrap_err().to_string();
        assert!(
            error.contains("use sqlite://PATH, postgres://..., or memory"),
            "{error}"
        );
        // Options toolgate would not read are refused, not dropped: `mode=ro` would open the file to write.
        let error = parse("sqlite://tg.db?mode=ro").unwrap_err().to_string();
        assert!(
            error.contains("gives options (mode=ro) that toolgate does not read"),
            "{error}"
        );
        let printed = format!("{:?}", parse("postgres://tg:secret@db/x").unwrap());
        assert!(
            !printed.contains("secret"),
            "a password is never printed: {printed}"
        );
        assert!(printed.contains("postgres://tg:***@db/x"), "{printed}");
    }

    #[test]
    fn audit_times_are_rfc3339_or_milliseconds() {
        assert_eq!(parse_time("1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(parse_time("2026-11-30T10:00:00Z"), Ok(1_796_032_800_000));
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
    }

    #[test]
    fn the_openai_model_is_configured_with_flags_and_no_key_flag_exists() {
        let config = Config::try_parse_from([
            "toolgate",
            "--model",
            "openai",
            "--openai-base-url",
            "http://localhost:11434/v1",
            "--openai-model",
            "llama3.1",
            "--openai-timeout-secs",
            "300",
            "--openai-step-timeout-secs",
            "1800",
        ])
        .unwrap();
        assert_eq!(config.model, ModelKind::Openai);
        assert_eq!(config.openai_base_url, "http://localhost:11434/v1");
        assert_eq!(config.openai_model, "llama3.1");
        assert_eq!(config.openai_timeout_secs, 300);
        assert_eq!(config.openai_step_timeout_secs, 1800);
        let error =
            Config::try_parse_from(["toolgate", "--openai-api-key", "sk-secret"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let error = Config::try_parse_from(["toolgate", "--policy", "yolo"]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("expected one of on_request, strict, trusted")
        );
        let error = Config::try_parse_from(["toolgate", "--rules", "delete_file"]).unwrap_err();
        assert!(error.to_string().contains("tool=allow|ask|deny"));
        let error =
            Config::try_parse_from(["toolgate", "--rules", "read_file(../x)=deny"]).unwrap_err();
        assert!(
            error.to_string().contains("leaves the workspace"),
            "{error}"
        );
        assert!(Config::try_parse_from(["toolgate", "--approval-timeout-secs", "0"]).is_err());
    }

    #[test]
    fn the_token_is_optional_validated_and_never_printed() {
        let config = Config::try_parse_from(["toolgate"]).unwrap();
        assert_eq!(config.token, None);
        assert!(config.public_origins.is_empty());
        let config =
            Config::try_parse_from(["toolgate", "--token", "tok-3f9a1c77e2b54d08"]).unwrap();
        assert_eq!(
            config.token,
            Some(AccessToken::parse("tok-3f9a1c77e2b54d08").unwrap())
        );
        let printed = format!("{config:?}");
        assert!(!printed.contains("tok-3f9a1c77e2b54d08"), "{printed}");
        assert!(printed.contains("AccessToken(<redacted>)"), "{printed}");
        let error = Config::try_parse_from(["toolgate", "--token", "two words"]).unwrap_err();
        assert!(error.to_string().contains("printable ASCII"), "{error}");
        assert!(Config::try_parse_from(["toolgate", "--token", ""]).is_err());
    }

    #[test]
    fn public_origins_repeat_or_come_comma_separated_and_are_normalized() {
        let config = Config::try_parse_from([
            "toolgate",
            "--public-origin",
            "https://Toolgate.example.com/",
            "--public-origin",
            "http://127.0.0.1:3000,http://localhost:3000",
        ])
        .unwrap();
        let origins: Vec<&str> = config
            .public_origins
            .iter()
            .map(PublicOrigin::as_str)
            .collect();
        assert_eq!(
            origins,
            [
                "https://toolgate.example.com",
                "http://127.0.0.1:3000",
                "http://localhost:3000"
            ]
        );
        let error = Config::try_parse_from(["toolgate", "--public-origin", "toolgate.example.com"])
            .unwrap_err();
        assert!(error.to_string().contains("is not an origin"), "{error}");
    }
}
