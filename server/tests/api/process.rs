//! The real `toolgate` binary as a user starts it: in a directory of its own (its home, where the default SQLite
//! file goes), with a clean environment, its log read line by line. A server can be stopped by a signal, killed
//! with SIGKILL, and started again in the same home.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use serde_json::Value;

use crate::helpers::{PATIENCE, SseStream};

/// How long a signalled server may take to exit: "within a few seconds", as the README promises.
pub const EXIT_WITHIN: Duration = Duration::from_secs(5);

/// The user and group `nobody` (65534 on Debian).
const NOBODY: libc::uid_t = 65_534;

/// The binary with a clean environment of its own (no `TOOLGATE_*` of whoever runs the tests), started in `home`.
pub fn toolgate_in(home: &Path, args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    for (name, _) in std::env::vars() {
        if name.starts_with("TOOLGATE_") || name == "OPENAI_API_KEY" {
            command.env_remove(name);
        }
    }
    command
        .current_dir(home)
        .args(args)
        .envs(envs.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The binary in a fresh empty home (for commands that end by themselves).
pub fn toolgate(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let home = tempfile::tempdir().unwrap().keep();
    toolgate_in(&home, args, envs)
}

/// Sends each line the process prints (stdout and stderr) to `lines`.
fn forward(
    output: Option<impl AsyncRead + Unpin + Send + 'static>,
    lines: mpsc::UnboundedSender<String>,
) {
    if let Some(output) = output {
        tokio::spawn(async move {
            let mut reader = BufReader::new(output).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let _ = lines.send(line);
            }
        });
    }
}

/// Removes terminal colour codes, in case the log is coloured anyway.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A directory a server lives in, kept across its restarts.
pub struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    lines: mpsc::UnboundedReceiver<String>,
    /// Everything it printed so far.
    pub log: String,
    home: PathBuf,
    _own_home: Option<Home>,
}

impl Server {
    /// Starts the binary in a home of its own, on a free loopback port (unless `args` name an address), and waits
    /// until it is ready.
    pub async fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let home = Home::new();
        let mut server = Self::start_in(&home, args, envs).await;
        server._own_home = Some(home);
        server
    }

    /// Starts the binary as a user without privileges would: as itself, or as `nobody` when the tests run as root
    /// (root may read any process's memory and environment anyway, whatever the process asks).
    pub async fn start_unprivileged(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let home = Home::new();
        // SAFETY: geteuid reads this process's effective user id and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let mut server = Self::start_as(&home, args, envs, root.then_some(NOBODY)).await;
        server._own_home = Some(home);
        server
    }

    /// Starts the binary in `home` (again, after an earlier server there stopped or died).
    pub async fn start_in(home: &Home, args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::start_as(home, args, envs, None).await
    }

    /// Starts the binary in `home`, as the user and group `user` when given.
    async fn start_as(
        home: &Home,
        args: &[&str],
        envs: &[(&str, &str)],
        user: Option<libc::uid_t>,
    ) -> Self {
        agent::model::install_crypto_provider();
        let mut all_args = Vec::new();
        if !args.contains(&"--workspace") {
            all_args.extend(["--workspace", "workspace"]);
        }
        if !args.contains(&"--addr") {
            all_args.extend(["--addr", "127.0.0.1:0"]);
        }
        all_args.extend_from_slice(args);
        let mut command = toolgate_in(home.path(), &all_args, envs);
        if let Some(user) = user {
            command.uid(user).gid(user);
        }
        let mut child = command.spawn().expect("the binary starts");
        let (send, lines) = mpsc::unbounded_channel();
        forward(child.stdout.take(), send.clone());
        forward(child.stderr.take(), send);
        let mut server = Self {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            lines,
            log: String::new(),
            home: home.path().to_owned(),
            _own_home: None,
        };
        let ready = server.line_containing("toolgate is ready").await;
        let addr = ready
            .split_whitespace()
            .find_map(|field| field.strip_prefix("addr="))
            .expect("the ready line names the address");
        let mut addr: SocketAddr = addr.parse().unwrap();
        if addr.ip().is_unspecified() {
            addr.set_ip([127, 0, 0, 1].into());
        }
        server.addr = addr;
        server
    }

    pub async fn line_containing(&mut self, needle: &str) -> String {
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} in time; the log so far:\n{}", self.log))
                .unwrap_or_else(|| panic!("the server ended before {needle:?}:\n{}", self.log));
            let line = plain(&line);
            self.log.push_str(&line);
            self.log.push('\n');
            if line.contains(needle) {
                return line;
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs a JSON body.
    pub async fn post_json(&self, path: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("the request is sent")
    }

    /// GETs a JSON body.
    pub async fn get_json(&self, path: &str) -> Value {
        reqwest::Client::new()
            .get(self.url(path))
            .send()
            .await
            .expect("the request is sent")
            .json()
            .await
            .expect("a JSON body")
    }

    /// `POST /api/agent/runs`: starts a run and returns its id.
    pub async fn create_run(&self, body: Value) -> String {
        let response = self.post_json("/api/agent/runs", body).await;
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["runId"].as_str().unwrap().to_owned()
    }

    /// `GET /api/agent/runs/{runId}/events`, optionally resuming after `last_event_id`.
    pub async fn events(&self, run_id: &str, last_event_id: Option<u64>) -> SseStream {
        let mut request =
            reqwest::Client::new().get(self.url(&format!("/api/agent/runs/{run_id}/events")));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        SseStream::new(request.send().await.expect("the request is sent"))
    }

    /// Every pending approval the server lists.
    pub async fn pending(&self) -> Vec<Value> {
        self.get_json("/api/agent/approvals").await["pending"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// The workspace directory, as the server sees it (canonical).
    pub fn workspace(&self) -> PathBuf {
        self.home.join("workspace").canonicalize().unwrap()
    }

    pub fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.child.id().expect("still running")).unwrap()
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// Kills the process at once, as a crash or `kill -9` would, and waits until it is gone.
    pub async fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = tokio::time::timeout(PATIENCE, self.child.wait()).await;
    }

    /// Waits for the process to exit (it must within `within`) and collects the rest of what it printed.
    pub async fn exit(mut self, within: Duration) -> (ExitStatus, String) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit within {within:?}:\n{}", self.log))
            .unwrap();
        while let Ok(Some(line)) = tokio::time::timeout(PATIENCE, self.lines.recv()).await {
            self.log.push_str(&plain(&line));
            self.log.push('\n');
        }
        (status, self.log)
    }
}
