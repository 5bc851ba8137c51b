//! The child process of a stdio server: started in the workspace, as a process tree of its own (see
//! [`ProcessTree`]: what it starts stays within reach even when it leaves its session or group), with an
//! environment of `PATH`, `HOME`, `LANG` and what its configuration names (never the model's key); stopped with
//! everything it started.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::tools::process_tree::ProcessTree;

/// The variables of toolgate's own environment a server gets without being configured to.
pub const INHERITED_VARIABLES: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How much of a server's standard error is kept, to show when it fails.
const STDERR_KEPT: usize = 8 * 1024;
/// How much of it a status shows.
const STDERR_SHOWN: usize = 2 * 1024;

/// The end of what a server wrote to its standard error, and whether all of it was read.
#[derive(Clone, Debug, Default)]
pub struct StderrTail(
    Arc<Mutex<VecDeque<u8>>>,
    Arc<tokio::sync::watch::Sender<bool>>,
);

impl StderrTail {
    /// Waits (at most `patience`) until the pipe was read to its end: a process that exited may have written its
    /// last words without their being read yet.
    pub async fn read_to_end(&self, patience: Duration) {
        let mut done = self.1.subscribe();
        let _ = tokio::time::timeout(patience, done.wait_for(|done| *done)).await;
    }

    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.extend(bytes);
        let excess = kept.len().saturating_sub(STDERR_KEPT);
        kept.drain(..excess);
    }

    /// The last lines, at most about 2 KiB; `None` when the server wrote nothing.
    pub fn text(&self) -> Option<String> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let start = kept.len().saturating_sub(STDERR_SHOWN);
        let bytes: Vec<u8> = kept.range(start..).copied().collect();
        drop(kept);
        let text = String::from_utf8_lossy(&bytes);
        // Start at a line when the cut fell inside one.
        let text = match (start > 0, text.find('\n')) {
            (true, Some(newline)) => &text[newline + 1..],
            _ => &text[..],
        };
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    }
}

/// A started server process with everything it starts, its standard error kept as it comes. Dropping it kills
/// them all.
pub struct ServerProcess {
    tree: ProcessTree,
    stderr: StderrTail,
}

/// A started process and the pipes the protocol runs on.
pub struct Spawned {
    pub process: ServerProcess,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// Starts `command` with `args` in `workspace`.
pub fn spawn(
    server: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    workspace: &Path,
) -> io::Result<Spawned> {
    let mut child = Command::new(command);
    child
        .args(args)
        .current_dir(workspace)
        .env_clear()
        .envs(
            INHERITED_VARIABLES
                .iter()
                .filter_map(|name| std::env::var_os(name).map(|value| (name, value))),
        )
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut tree = ProcessTree::spawn(&mut child)?;
    let (Some(stdin), Some(stdout)) = (tree.take_stdin(), tree.take_stdout()) else {
        return Err(io::Error::other("the child's pipes are missing"));
    };
    let stderr = StderrTail::default();
    if let Some(mut pipe) = tree.take_stderr() {
        let tail = stderr.clone();
        let server = server.to_owned();
        tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            while let Ok(read) = pipe.read(&mut buffer).await {
                if read == 0 {
                    break;
                }
                tail.push(&buffer[..read]);
                tracing::debug!(
                    server,
                    stderr = %String::from_utf8_lossy(&buffer[..read]).trim_end(),
                    "MCP server wrote to stderr"
                );
            }
            tail.1.send_replace(true);
        });
    }
    Ok(Spawned {
        process: ServerProcess { tree, stderr },
        stdin,
        stdout,
    })
}

impl ServerProcess {
    pub fn stderr(&self) -> StderrTail {
        self.stderr.clone()
    }

    /// Waits until the server itself exits (what it started may still run: [`ServerProcess::end`] stops that).
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        self.tree.command_exited().await
    }

    /// Stops the server as the MCP specification describes for stdio (its input is closed already, by closing
    /// the connection): `grace` to exit, then `SIGTERM` to it and to what it started, then `SIGKILL`; then
    /// whatever is left of its tree is killed too.
    pub async fn stop(mut self, grace: Duration) {
        if tokio::time::timeout(grace, self.tree.command_exited())
            .await
            .is_err()
        {
            self.tree.signal(libc::SIGTERM);
            let _ = tokio::time::timeout(grace, self.tree.command_exited()).await;
        }
        self.end().await;
    }

    /// Kills what is left of the tree (the server's own children, once the server itself has exited) and waits
    /// until it is gone.
    pub async fn end(self) {
        let left_behind = self.tree.end().await.killed;
        if left_behind > 0 {
            tracing::debug!(left_behind, "stopped what an MCP server left running");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_the_last_whole_lines() {
        let tail = StderrTail::default();
        assert_eq!(tail.text(), None);
        tail.push(b"starting\n");
        assert_eq!(tail.text().as_deref(), Some("starting"));
        for i in 0..1_000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        let text = tail.text().unwrap();
        assert!(text.ends_with("line 999"), "{text}");
        assert!(text.starts_with("line "), "{text}");
        assert!(text.len() <= STDERR_SHOWN);
    }
}
