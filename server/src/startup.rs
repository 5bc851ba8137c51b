//! Building the application from its configuration, and serving it until a shutdown signal.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent::harness::{Harness, HarnessConfig, Retention};
use agent::mcp::{McpConfig, McpServers};
use agent::model::{ApiKey, Model, OpenAiConfig, OpenAiModel, ScriptedModel};
use agent::store::Store;
use agent::store::memory::MemoryStore;
use agent::store::sql::{OpenError, SqlStore};
use agent::tools::{CommandLimits, Workspace, workspace_tools};
use app::api::ssr::LoginRequired;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};
use leptos::config::{Env, LeptosOptions};
use leptos::prelude::provide_context;
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tokio::net::TcpListener;

use crate::agui;
use crate::api;
use crate::assets;
use crate::body::{BodyDeadline, MAX_CONVERSATION_BODY_BYTES, limit_body};
use crate::config::{Config, Database, ModelKind};
use crate::error::ApiError;
use crate::rules_api;
use crate::security::{Security, SecurityError, SecuritySettings};
use crate::session_cookie::{SessionCookies, ensure_session};
use crate::state::AppState;
use crate::streams::StreamLimit;
use crate::tools;

/// How long shutdown waits for runs and connections to end before the process exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot open the workspace {path}: {source}")]
    Workspace {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    McpConfig(#[from] agent::mcp::ConfigError),
    #[error(transparent)]
    McpServer(#[from] agent::mcp::RequiredServerFailed),
    #[error(transparent)]
    Security(#[from] SecurityError),
    #[error(transparent)]
    Store(#[from] OpenError),
    #[error("cannot recover what a stopped toolgate left in the database: {0}")]
    Recover(String),
}

/// A built application, bound to its address, not yet serving.
pub struct Application {
    listener: TcpListener,
    router: Router,
    harness: Harness,
    mcp: McpServers,
}

fn model(config: &Config) -> Result<Arc<dyn Model>, StartupError> {
    match config.model {
        ModelKind::Scripted => Ok(Arc::new(ScriptedModel::with_delta_delay(
            Duration::from_millis(config.scripted_delay_ms),
        ))),
        ModelKind::Openai => {
            let mut openai = OpenAiConfig::new(config.openai_model.clone());
            openai.base_url = config.openai_base_url.clone();
            // Read here rather than kept in `Config`, so that nothing that prints the configuration can show it.
            openai.api_key = std::env::var(OPENAI_API_KEY).ok().and_then(ApiKey::new);
            openai.timeout = Duration::from_secs(config.openai_timeout_secs);
            openai.step_timeout = Duration::from_secs(config.openai_step_timeout_secs);
            let has_key = openai.api_key.is_some();
            let model = OpenAiModel::new(openai).map_err(|error| {
                StartupError::Config(format!("cannot use the openai model: {error}"))
            })?;
            tracing::info!(
                endpoint = model.endpoint(),
                model = model.name(),
                key = if has_key {
                    "from OPENAI_API_KEY"
                } else {
                    "none (OPENAI_API_KEY is not set; local servers need none)"
                },
                "using an OpenAI-compatible model"
            );
            Ok(Arc::new(model))
        }
    }
}

/// The only place the OpenAI-compatible API's key comes from.
const OPENAI_API_KEY: &str = "OPENAI_API_KEY";

fn leptos_options(addr: SocketAddr) -> LeptosOptions {
    let env = |key: &str, default: &str| std::env::var(key).unwrap_or_else(|_| default.to_owned());
    LeptosOptions::builder()
        .output_name(env("LEPTOS_OUTPUT_NAME", "toolgate"))
        .site_pkg_dir(env("LEPTOS_SITE_PKG_DIR", "pkg"))
        .env(if env("LEPTOS_ENV", "PROD").eq_ignore_ascii_case("dev") {
            Env::DEV
        } else {
            Env::PROD
        })
        .site_addr(addr)
        .reload_port(env("LEPTOS_RELOAD_PORT", "3001").parse().unwrap_or(3001))
        .build()
}

/// The page's routes, listed once a process. Listing them runs the app with its resources held back, by a flag that
/// leptos keeps for the whole process (leptos-rs/leptos#4773): a page that another server of the same process
/// rendered meanwhile would wait forever for its first resource. One server never renders before its routes are
/// listed, but a process may build several (the tests do).
fn page_routes() -> Vec<AxumRouteListing> {
    static ROUTES: OnceLock<Vec<AxumRouteListing>> = OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(app::App)).clone()
}

async fn api_not_found() -> ApiError {
    ApiError::NoRoute
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// How leptos writes the errors of a server function's arguments that do not read (`server_fn`'s
/// `ServerFnErrorEncoding`: the variant, `|`, the message).
const SERVER_FN_INPUT_ERRORS: [&[u8]; 3] = [b"Args|", b"MissingArg|", b"Deserialization|"];

/// The most of an error's text this reads to tell its kind; leptos's are a line.
const SERVER_FN_ERROR_READ: usize = 64 * 1024;

/// A server function's arguments that do not read are the client's mistake, which the API answers `400`; leptos
/// answers them `500`, as it does the server's own failures, before the function runs. This gives them `400`, and
/// keeps leptos's text, which the page's client reads back as the same error. (leptos decides the status of an
/// error it makes itself; a function's own refusals set theirs, and are left alone.)
async fn server_fn_input_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;

    let server_fn = request.uri().path().starts_with("/api/fn/");
    let response = next.run(request).await;
    if !server_fn || response.status() != StatusCode::INTERNAL_SERVER_ERROR {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, SERVER_FN_ERROR_READ).await {
        Ok(text) => text,
        Err(error) => {
            tracing::warn!(%error, "a server function's error could not be read");
            return axum::response::IntoResponse::into_response(ApiError::Internal(
                "the server function failed".into(),
            ));
        }
    };
    if SERVER_FN_INPUT_ERRORS
        .iter()
        .any(|kind| text.starts_with(kind))
    {
        parts.status = StatusCode::BAD_REQUEST;
    }
    axum::response::Response::from_parts(parts, axum::body::Body::from(text))
}

/// Builds the harness and the router, and binds the listener (port 0 picks a free port).
pub async fn build(config: Config) -> Result<Application, StartupError> {
    // First: a server that must not start should not create a workspace or bind a port either.
    let security = Security::new(SecuritySettings {
        addr: config.addr,
        token: config.token.clone(),
        public_origins: config.public_origins.clone(),
    })?;
    // Read before anything starts: a configuration with a mistake starts nothing.
    let mcp_config = McpConfig::load(&config.mcp_config, &|name| std::env::var(name).ok())?;
    let configured = crate::rules::configured_rules(&config, &mcp_config)
        .map_err(|error| StartupError::Config(error.to_string()))?;
    let workspace =
        Workspace::open(&config.workspace).map_err(|source| StartupError::Workspace {
            path: config.workspace.display().to_string(),
            source,
        })?;
    let toolbox = workspace_tools(
        &workspace,
        CommandLimits {
            timeout: Duration::from_secs(config.command_timeout_secs),
            ..CommandLimits::default()
        },
    );
    let permissions = crate::rules::permission_policy(&config, configured, &workspace)
        .map_err(|error| StartupError::Config(error.to_string()))?;
    let mut harness_config = HarnessConfig::new(permissions, config.approval_timeout());
    harness_config.limits.max_steps = config.max_steps;
    harness_config.limits.context_bytes =
        usize::try_from(config.context_kib * 1024).unwrap_or(usize::MAX);
    harness_config.retention = Retention {
        finished_ttl: Duration::from_secs(config.retention_days * 24 * 60 * 60),
        event_log_bytes: config.event_log_mib * 1024 * 1024,
        max_unfinished_runs: config.max_active_runs,
        max_sessions: config.max_sessions,
        ..Retention::default()
    };
    harness_config.takeover_every = Duration::from_secs(config.lease_secs).div_f64(2.0);
    // The port before anything starts working: opening the harness goes on with waiting runs (approved calls start,
    // expired approvals time out, a dead instance's runs are taken over), which a server that then cannot listen
    // would leave half done as it exits. Requests wait in the listen queue until the router serves them.
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| StartupError::Bind {
            addr: config.addr,
            source,
        })?;
    // The servers' tools join the toolbox before the harness opens, which goes on with the waiting runs' approved
    // calls at once (an MCP tool not there yet would fail them as unknown), and before the first request can come.
    // One that must start and cannot stops startup (after stopping the others).
    let mcp = McpServers::start(&mcp_config, workspace.root(), &toolbox).await?;
    // A configured rule with a typo in a tool's or an argument's name starts all the same (an MCP server may add
    // the tool later), and is said at once, as the rules API says it of a rule a person adds.
    let specs = toolbox.specs();
    for configured in harness_config.permissions.rule_book().rules().iter() {
        for warning in configured.rule.warnings(&specs) {
            tracing::warn!(
                rule = %configured.rule,
                from = configured.origin.describe(),
                %warning,
                "a configured rule may not do what it says"
            );
        }
    }
    let opened = async {
        let store =
            open_store(&config.database_url, Duration::from_secs(config.lease_secs)).await?;
        Harness::open(harness_config, model(&config)?, toolbox.clone(), store)
            .await
            .map_err(|error| StartupError::Recover(error.to_string()))
    }
    .await;
    let harness = match opened {
        Ok(opened) => opened,
        Err(error) => {
            mcp.shutdown().await;
            return Err(error);
        }
    };
    // Logouts are kept with the rest of the state, where every instance on the database reads them.
    let security = security.with_logouts(Arc::clone(harness.store()));
    let addr = listener.local_addr().map_err(|source| StartupError::Bind {
        addr: config.addr,
        source,
    })?;
    let state = AppState {
        harness: harness.clone(),
        leptos_options: leptos_options(addr),
        keep_alive: Duration::from_secs(config.keep_alive_secs),
        streams: StreamLimit::new(
            usize::try_from(config.max_streams_per_client).unwrap_or(usize::MAX),
        ),
    };
    tracing::info!(
        %addr,
        workspace = %workspace.root().display(),
        model = harness.model_name(),
        store = harness.store_kind().as_str(),
        database = %describe_database(&config.database_url),
        instance = %harness.store().instance(),
        policy = %config.policy,
        rules = %agent::policy::book::summary(&harness.config().permissions.rule_book().rules()),
        assets = assets::file_count(),
        security = %security.describe(),
        mcp_servers = mcp_config.servers.len(),
        "toolgate is ready"
    );
    Ok(Application {
        listener,
        router: router(
            state,
            &security,
            Duration::from_secs(config.body_timeout_secs),
        ),
        harness,
        mcp,
    })
}

/// Opens the store the configuration names.
pub async fn open_store(
    database: &Database,
    lease: Duration,
) -> Result<Arc<dyn Store>, StartupError> {
    Ok(match database {
        Database::Memory => Arc::new(MemoryStore::new()),
        Database::Sql(url) => SqlStore::open_with_lease(url, lease).await?,
    })
}

fn describe_database(database: &Database) -> String {
    match database {
        Database::Memory => "memory (nothing survives the process)".to_owned(),
        Database::Sql(url) => url.to_string(),
    }
}

fn router(state: AppState, security: &Security, body_deadline: Duration) -> Router {
    let api = Router::new()
        .route("/healthz", get(api::healthz))
        .route("/api/agent", post(api::run_to_end))
        .route("/api/agent/stream", post(api::run_streamed))
        .route("/api/agent/runs", post(api::create_run))
        .route("/api/agent/runs/{run_id}", get(api::get_run))
        .route("/api/agent/runs/{run_id}/events", get(api::run_events))
        .route("/api/agent/runs/{run_id}/cancel", post(api::cancel_run))
        .route(
            "/api/agent/sessions/{session_id}/events",
            get(api::session_events),
        )
        .route("/api/agent/approvals", get(api::list_approvals))
        .route(
            "/api/agent/approvals/{run_id}/{tool_call_id}",
            post(api::decide),
        )
        .route(
            "/api/agent/sessions/{session_id}/grants",
            get(rules_api::list_grants),
        )
        .route(
            "/api/agent/sessions/{session_id}/grants/{grant_id}",
            delete(rules_api::revoke_grant),
        )
        .route(
            "/api/rules",
            get(rules_api::list_rules).post(rules_api::add_rule),
        )
        .route("/api/rules/{rule_id}", delete(rules_api::remove_rule))
        .route("/api/agui", post(agui::run))
        .route("/api/tools", get(tools::list_tools))
        .route("/api/audit", get(api::audit_log))
        .route("/api/{*rest}", any(api_not_found))
        .method_not_allowed_fallback(method_not_allowed);

    let harness = state.harness.clone();
    let login_required = LoginRequired(security.has_logins());
    let pages = Router::new()
        .leptos_routes_with_context(
            &state,
            page_routes(),
            move || {
                provide_context(harness.clone());
                provide_context(login_required);
            },
            {
                let options = state.leptos_options.clone();
                move || app::shell(options.clone())
            },
        )
        .layer(axum::middleware::from_fn(server_fn_input_errors))
        .layer(axum::middleware::from_fn_with_state(
            SessionCookies {
                cookies: security.cookie_policy(),
                logins: security.has_logins(),
            },
            ensure_session,
        ));
    let routes = match security.routes() {
        Some(login) => api.merge(pages).merge(login),
        None => api.merge(pages),
    };

    let routes = routes.fallback(assets::static_file).with_state(state);
    // The layers every request passes wrap the router once, not each of its routes: a layer on a `Router` wraps
    // every route's boxed service in a box of its own, and each request cloned each of those boxes again at every
    // level it went through (about twenty allocations a request with these four).
    let layered = tower::ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(
            security.clone(),
            crate::security::guard,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn_with_state(
            BodyDeadline(body_deadline),
            limit_body,
        ))
        // The route's own limit is `limit_body`'s; this only lets the extractors read what it let through.
        .layer(DefaultBodyLimit::max(MAX_CONVERSATION_BODY_BYTES))
        .service(routes);
    Router::new().fallback_service(layered)
}

impl Application {
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn harness(&self) -> &Harness {
        &self.harness
    }

    /// Serves until `shutdown` completes; then stops accepting runs, aborts the running ones (their streams end
    /// with an event that says why), and returns once connections are done or the grace period is over.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let harness = self.harness.clone();
        let mcp = self.mcp.clone();
        let stop = async move {
            shutdown.await;
            tracing::info!("shutting down");
            if !harness.shutdown(SHUTDOWN_GRACE).await {
                tracing::warn!(
                    "the shutdown was not clean: some runs did not end within the grace period, or the store did not write everything (see above)"
                );
            }
            // Every MCP server, and whatever it started, stops with toolgate.
            mcp.shutdown().await;
        };
        crate::serve::serve(self.listener, self.router, stop, SHUTDOWN_GRACE).await;
        Ok(())
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
