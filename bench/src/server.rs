//! The server under test: the real `toolgate` binary, started in a fresh temporary directory, watched through /proc.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::system::{self, CpuTime, Memory};

/// How long the server may take to answer `/healthz` after it starts.
const START_PATIENCE: Duration = Duration::from_secs(30);
/// How long the server may take to exit after SIGTERM (its own grace period is 3 s, then 6 s at most).
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// How to start the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub binary: PathBuf,
    /// Where the server keeps its state.
    pub store: Store,
    /// Extra options after the ones the bench sets.
    pub extra_args: Vec<String>,
    /// Keep the temporary directory (workspace and log) after the server stops.
    pub keep_workdir: bool,
    /// Where the server's temporary directory (its working directory and workspace) is created.
    pub tmpdir: PathBuf,
}

/// Where a measured server keeps its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    /// The default: a SQLite file, made on the disk (the system's temporary directory) even when the workspace is
    /// in memory, so that durability costs what it costs.
    Sqlite,
    /// `--database-url memory`: nothing survives the process.
    Memory,
    /// One instance on a database of a private PostgreSQL the bench starts and stops: the baseline of postgres2.
    Postgres,
    /// Two instances on one PostgreSQL database (a private cluster the bench starts and stops): each run is started
    /// and streamed on the first, its decision posted to the second. Round trips only.
    #[value(name = "postgres2")]
    #[serde(rename = "postgres×2")]
    Postgres2,
}

impl Store {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Memory => "memory",
            Self::Postgres => "postgres",
            Self::Postgres2 => "postgres×2",
        }
    }

    /// Whether the bench's private PostgreSQL keeps this store's state.
    pub fn on_postgres(self) -> bool {
        matches!(self, Self::Postgres | Self::Postgres2)
    }

    /// How many toolgate instances a level of this store runs on.
    pub fn instances(self) -> usize {
        match self {
            Self::Sqlite | Self::Memory | Self::Postgres => 1,
            Self::Postgres2 => 2,
        }
    }
}

/// The default place for the server's workspace: memory (tmpfs) when there is one, so that the figures measure
/// toolgate rather than the disk's filesystem (every trip creates a file).
pub fn default_tmpdir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let writable = tempfile::Builder::new()
        .prefix("toolgate-bench-probe-")
        .tempdir_in(shm)
        .is_ok();
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A running server. Dropping it kills the process.
pub struct Server {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    workdir: tempfile::TempDir,
    workspace: PathBuf,
    log: PathBuf,
    /// The directory of the SQLite database, on the disk.
    _database: Option<tempfile::TempDir>,
}

fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    /// Starts the server and waits until `/healthz` answers. Retries with another port if the chosen one was taken
    /// in the meantime.
    pub async fn start(options: &ServerOptions) -> Result<Self> {
        Self::start_with(options, None, None).await
    }

    /// Starts the server on the given `--database-url` (one that others may share) instead of its store's own, and
    /// on the given workspace when it shares one with another instance (whichever instance wins a decision runs the
    /// tool, so instances on one database share their workspace).
    pub async fn start_on(
        options: &ServerOptions,
        database_url: &str,
        workspace: Option<&Path>,
    ) -> Result<Self> {
        Self::start_with(options, Some(database_url), workspace).await
    }

    async fn start_with(
        options: &ServerOptions,
        database_url: Option<&str>,
        workspace: Option<&Path>,
    ) -> Result<Self> {
        let mut last_error = None;
        for _ in 0..3 {
            match Self::start_once(options, database_url, workspace).await {
                Ok(server) => return Ok(server),
                Err(StartFailure::PortTaken(error)) => last_error = Some(error),
                Err(StartFailure::Other(error)) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("the server did not start")))
    }

    async fn start_once(
        options: &ServerOptions,
        shared_database: Option<&str>,
        shared_workspace: Option<&Path>,
    ) -> Result<Self, StartFailure> {
        let binary = &options.binary;
        if !binary.is_file() {
            return Err(StartFailure::Other(anyhow::anyhow!(
                "no server binary at {}: build it with `make site` (or `scripts/site.sh`), \
                 or pass --server PATH",
                binary.display()
            )));
        }
        let workdir = tempfile::Builder::new()
            .prefix("toolgate-bench-")
            .tempdir_in(&options.tmpdir)
            .with_context(|| {
                format!(
                    "cannot create a temporary directory for the server in {}",
                    options.tmpdir.display()
                )
            })?;
        let workspace =
            shared_workspace.map_or_else(|| workdir.path().join("workspace"), Path::to_path_buf);
        let log = workdir.path().join("server.log");
        let log_file =
            File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let database = match (options.store, shared_database) {
            (_, Some(_)) | (Store::Memory, None) => None,
            (Store::Sqlite, None) => Some(
                tempfile::Builder::new()
                    .prefix("toolgate-bench-db-")
                    .tempdir()
                    .context("cannot create a temporary directory for the database")?,
            ),
            (Store::Postgres | Store::Postgres2, None) => {
                return Err(StartFailure::Other(anyhow::anyhow!(
                    "the {} store is on the bench's PostgreSQL: start its servers with Server::start_on",
                    options.store.as_str()
                )));
            }
        };
        let database_url = match (shared_database, &database) {
            (Some(url), _) => url.to_owned(),
            (None, Some(dir)) => format!("sqlite://{}", dir.path().join("toolgate.db").display()),
            (None, None) => "memory".to_owned(),
        };

        let mut command = Command::new(binary);
        command
            .current_dir(workdir.path())
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--workspace")
            .arg(&workspace)
            .args(["--log", "warn"])
            .arg("--database-url")
            .arg(&database_url)
            // Every approval stays pending until the bench decides, even at scale on a slow machine.
            .args(["--approval-timeout-secs", "900"])
            // The scale scenario opens every stream from this one client address.
            .args(["--max-streams-per-client", "1000000"])
            .args(&options.extra_args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                log_file
                    .try_clone()
                    .context("cannot share the server log file")?,
            ))
            .stderr(Stdio::from(log_file));
        // The caller's TOOLGATE_* settings must not change what is measured.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TOOLGATE_") {
                command.env_remove(key);
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id();
        let mut server = Self {
            child,
            pid,
            addr,
            workdir,
            workspace,
            log,
            _database: database,
        };
        if options.keep_workdir {
            server.workdir.disable_cleanup(true);
            if let Some(database) = &mut server._database {
                database.disable_cleanup(true);
            }
        }
        server.wait_until_healthy().await?;
        Ok(server)
    }

    async fn wait_until_healthy(&mut self) -> Result<(), StartFailure> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .context("cannot build an HTTP client")?;
        let url = self.url("/healthz");
        let started = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .context("cannot wait for the server")?
            {
                let log = self.log_tail();
                let error =
                    anyhow::anyhow!("the server exited at start ({status}); its log:\n{log}");
                return Err(if log.contains("cannot listen") {
                    StartFailure::PortTaken(error)
                } else {
                    StartFailure::Other(error)
                });
            }
            if let Ok(response) = client.get(&url).send().await
                && response.status().is_success()
                && response
                    .text()
                    .await
                    .is_ok_and(|body| body.lines().next() == Some("ok"))
            {
                return Ok(());
            }
            if started.elapsed() > START_PATIENCE {
                return Err(StartFailure::Other(anyhow::anyhow!(
                    "the server did not answer {url} within {} s; its log:\n{}",
                    START_PATIENCE.as_secs(),
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The directory the server's tools write in.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn cpu_time(&self) -> Result<CpuTime> {
        system::cpu_time(self.pid)
    }

    pub fn memory(&self) -> Result<Memory> {
        system::memory(self.pid)
    }

    /// Fails when the server is no longer running.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self
            .child
            .try_wait()
            .context("cannot wait for the server")?
        {
            bail!(
                "the server exited during the benchmark ({status}); its log:\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    /// The end of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "(empty)".to_owned()
        } else {
            tail
        }
    }

    /// Stops the server with SIGTERM, as an operator would, and waits for it to exit.
    pub async fn stop(mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid =
            libc::pid_t::try_from(self.pid).context("the server's pid does not fit a pid_t")?;
        // SAFETY: kill has no memory preconditions; the pid is our own child's, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < STOP_PATIENCE {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "the server did not exit within {} s of SIGTERM",
            STOP_PATIENCE.as_secs()
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

enum StartFailure {
    PortTaken(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for StartFailure {
    fn from(error: anyhow::Error) -> Self {
        Self::Other(error)
    }
}
