//! The built-in workspace tools: `list_files`, `read_file`, `write_file`, `delete_file` and `run_command`.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use std::io::Read;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Tool, ToolContext, ToolError, ToolFuture, Toolbox, Workspace};
use crate::wire::{ToolAnnotations, ToolErrorCode, ToolSpec};

/// The most a `read_file` returns, in bytes.
pub const MAX_READ_BYTES: usize = 256 * 1024;
/// The most a `write_file` writes, in bytes.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// The most entries a `list_files` returns.
pub const MAX_LIST_ENTRIES: usize = 1_000;

const READ_ONLY: ToolAnnotations = ToolAnnotations {
    read_only: Some(true),
    destructive: Some(false),
    idempotent: Some(true),
    open_world: Some(false),
};

const DESTRUCTIVE: ToolAnnotations = ToolAnnotations {
    read_only: Some(false),
    destructive: Some(true),
    idempotent: Some(true),
    open_world: Some(false),
};

fn path_property(description: &str) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 4096, "description": description})
}

/// The string field `field` of input that already passed the schema.
fn str_field<'a>(input: &'a Value, field: &str) -> &'a str {
    input.get(field).and_then(Value::as_str).unwrap_or_default()
}

fn io_error(action: &str, path: &str, error: std::io::Error) -> ToolError {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            ToolError::new(ToolErrorCode::NotFound, format!("{path:?} does not exist."))
        }
        _ => ToolError::failed(format!("Could not {action} {path:?}: {error}.")),
    }
}

/// Runs a file tool's whole body on the blocking pool: one hand-off per call, instead of one per file system call
/// (and the workspace's path checks, which touch the file system too, stay off the async threads).
fn blocking(
    work: impl FnOnce() -> Result<Value, ToolError> + Send + 'static,
) -> ToolFuture<'static> {
    Box::pin(async move {
        tokio::task::spawn_blocking(work).await.map_err(|error| {
            ToolError::failed(format!("The tool stopped unexpectedly: {error}."))
        })?
    })
}

/// The five built-in tools over one workspace.
pub fn workspace_tools(workspace: &Workspace, limits: CommandLimits) -> Toolbox {
    Toolbox::new()
        .with(ListFiles::new(workspace.clone()))
        .and_then(|t| t.with(ReadFile::new(workspace.clone())))
        .and_then(|t| t.with(WriteFile::new(workspace.clone())))
        .and_then(|t| t.with(DeleteFile::new(workspace.clone())))
        .and_then(|t| t.with(RunCommand::new(workspace.clone(), limits)))
        // The built-in schemas are constants and the names distinct; the tests prove both.
        .expect("built-in tools register")
}

pub struct ListFiles {
    spec: ToolSpec,
    workspace: Workspace,
}

impl ListFiles {
    pub fn new(workspace: Workspace) -> Self {
        Self {
            spec: ToolSpec {
                name: "list_files".into(),
                description: "List the files and directories in a workspace directory (the workspace itself by default).".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"path": {"type": "string", "maxLength": 4096, "description": "A directory relative to the workspace."}},
                    "additionalProperties": false
                }),
                annotations: READ_ONLY,
                mcp: None,
            },
            workspace,
        }
    }
}

impl Tool for ListFiles {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        let workspace = self.workspace.clone();
        blocking(move || {
            let relative = str_field(&input, "path");
            let dir = workspace.resolve(relative)?;
            let shown = workspace.display(&dir);
            let reader = std::fs::read_dir(&dir).map_err(|e| io_error("list", &shown, e))?;
            let mut entries = Vec::new();
            let mut truncated = false;
            for entry in reader {
                let entry = entry.map_err(|e| io_error("list", &shown, e))?;
                if entries.len() == MAX_LIST_ENTRIES {
                    truncated = true;
                    break;
                }
                let kind = match entry.file_type() {
                    Ok(t) if t.is_symlink() => "symlink",
                    Ok(t) if t.is_dir() => "dir",
                    _ => "file",
                };
                entries.push(json!({
                    "name": entry.file_name().to_string_lossy(),
                    "kind": kind,
                    "size": entry.metadata().map_or(0, |m| m.len()),
                }));
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json!({"path": shown, "entries": entries, "truncated": truncated}))
        })
    }
}

pub struct ReadFile {
    spec: ToolSpec,
    workspace: Workspace,
}

impl ReadFile {
    pub fn new(workspace: Workspace) -> Self {
        Self {
            spec: ToolSpec {
                name: "read_file".into(),
                description: "Read a text file from the workspace.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"path": path_property("A file relative to the workspace.")},
                    "required": ["path"],
                    "additionalProperties": false
                }),
                annotations: READ_ONLY,
                mcp: None,
            },
            workspace,
        }
    }
}

impl Tool for ReadFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        let workspace = self.workspace.clone();
        blocking(move || {
            let relative = str_field(&input, "path");
            let path = workspace.resolve(relative)?;
            let file = std::fs::File::open(&path).map_err(|e| io_error("read", relative, e))?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut bytes = Vec::new();
            file.take(MAX_READ_BYTES as u64)
                .read_to_end(&mut bytes)
                .map_err(|e| io_error("read", relative, e))?;
            Ok(json!({
                "path": workspace.display(&path),
                "content": String::from_utf8_lossy(&bytes),
                "bytes": size,
                "truncated": size > bytes.len() as u64,
            }))
        })
    }
}

pub struct WriteFile {
    spec: ToolSpec,
    workspace: Workspace,
}

impl WriteFile {
    pub fn new(workspace: Workspace) -> Self {
        Self {
            spec: ToolSpec {
                name: "write_file".into(),
                description:
                    "Create or overwrite a text file in the workspace, creating parent directories."
                        .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "path": path_property("A file relative to the workspace."),
                        "content": {"type": "string", "maxLength": MAX_WRITE_BYTES, "description": "The whole new content."}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
                annotations: DESTRUCTIVE,
                mcp: None,
            },
            workspace,
        }
    }
}

impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        let workspace = self.workspace.clone();
        blocking(move || {
            let relative = str_field(&input, "path");
            let content = str_field(&input, "content");
            let path = workspace.resolve(relative)?;
            if path == workspace.root() {
                return Err(ToolError::failed("The workspace itself is not a file."));
            }
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| io_error("create the directory for", relative, e))?;
            }
            std::fs::write(&path, content).map_err(|e| io_error("write", relative, e))?;
            Ok(json!({"path": workspace.display(&path), "bytes": content.len()}))
        })
    }
}

pub struct DeleteFile {
    spec: ToolSpec,
    workspace: Workspace,
}

impl DeleteFile {
    pub fn new(workspace: Workspace) -> Self {
        Self {
            spec: ToolSpec {
                name: "delete_file".into(),
                description: "Delete a file from the workspace (not a directory).".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"path": path_property("A file relative to the workspace.")},
                    "required": ["path"],
                    "additionalProperties": false
                }),
                annotations: DESTRUCTIVE,
                mcp: None,
            },
            workspace,
        }
    }
}

impl Tool for DeleteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        let workspace = self.workspace.clone();
        blocking(move || {
            let relative = str_field(&input, "path");
            let path = workspace.resolve(relative)?;
            let meta =
                std::fs::symlink_metadata(&path).map_err(|e| io_error("delete", relative, e))?;
            if meta.is_dir() {
                return Err(ToolError::failed(format!(
                    "{relative:?} is a directory; delete_file deletes files only."
                )));
            }
            std::fs::remove_file(&path).map_err(|e| io_error("delete", relative, e))?;
            Ok(json!({"path": workspace.display(&path), "deleted": true}))
        })
    }
}

/// Bounds on `run_command`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandLimits {
    pub timeout: Duration,
    /// Bytes kept of stdout and of stderr each; the rest is read and dropped.
    pub output_bytes: usize,
}

impl Default for CommandLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            output_bytes: 64 * 1024,
        }
    }
}

pub struct RunCommand {
    spec: ToolSpec,
    workspace: Workspace,
    limits: CommandLimits,
    path_env: OsString,
}

impl RunCommand {
    pub fn new(workspace: Workspace, limits: CommandLimits) -> Self {
        Self {
            spec: ToolSpec {
                name: "run_command".into(),
                description: "Run a program in the workspace directory, without a shell, and return its exit code and output. Pass the program name as command and each argument separately in args.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "command": {"type": "string", "minLength": 1, "maxLength": 256, "description": "The program to run, for example ls."},
                        "args": {"type": "array", "items": {"type": "string", "maxLength": 4096}, "maxItems": 64}
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }),
                annotations: ToolAnnotations {
                    read_only: Some(false),
                    destructive: Some(true),
                    idempotent: Some(false),
                    open_world: Some(true),
                },
                mcp: None,
            },
            workspace,
            limits,
            path_env: std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        }
    }
}

/// Reads a pipe to its end, keeping at most `limit` bytes, so the child never blocks on a full pipe.
async fn read_bounded(reader: Option<impl AsyncRead + Unpin>, limit: usize) -> (Vec<u8>, bool) {
    let Some(mut reader) = reader else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buffer = [0u8; 8192];
    while let Ok(n) = reader.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let room = limit - kept.len();
        kept.extend_from_slice(&buffer[..n.min(room)]);
        truncated |= n > room;
    }
    (kept, truncated)
}

/// Kills the command's whole process group (the command and anything it started).
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: killpg has no memory-safety preconditions; a stale group id at worst fails with ESRCH.
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
    Aborted,
}

impl Tool for RunCommand {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: Value, context: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let command = str_field(&input, "command");
            if command.chars().any(char::is_whitespace) {
                return Err(ToolError::new(
                    ToolErrorCode::InvalidInput,
                    format!(
                        "{command:?} is not a program name. Put the program in command and each argument in args; no shell is used."
                    ),
                ));
            }
            let args: Vec<&str> = input
                .get("args")
                .and_then(Value::as_array)
                .map(|args| args.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();

            let mut child = tokio::process::Command::new(command)
                .args(&args)
                .current_dir(self.workspace.root())
                .env_clear()
                .env("PATH", &self.path_env)
                .env("HOME", self.workspace.root())
                .env("LANG", "C.UTF-8")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|error| match error.kind() {
                    std::io::ErrorKind::NotFound => ToolError::new(
                        ToolErrorCode::NotFound,
                        format!("There is no program named {command:?} on the PATH."),
                    ),
                    _ => ToolError::failed(format!("Could not start {command:?}: {error}.")),
                })?;
            let pid = child.id();
            let limit = self.limits.output_bytes;
            let stdout = tokio::spawn(read_bounded(child.stdout.take(), limit));
            let stderr = tokio::spawn(read_bounded(child.stderr.take(), limit));

            let ending = tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => Ending::Exited(status),
                    Err(error) => {
                        kill_group(pid);
                        return Err(ToolError::failed(format!("Could not wait for {command:?}: {error}.")));
                    }
                },
                () = tokio::time::sleep(self.limits.timeout) => Ending::TimedOut,
                () = context.cancel.cancelled() => Ending::Aborted,
            };
            // Whatever the command left running goes with it, so the pipes close and nothing outlives the call.
            kill_group(pid);
            let grace = Duration::from_secs(2);
            let (stdout, out_truncated) = tokio::time::timeout(grace, stdout)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let (stderr, err_truncated) = tokio::time::timeout(grace, stderr)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();

            match ending {
                Ending::Exited(status) => Ok(json!({
                    "command": command,
                    "args": args,
                    "exitCode": status.code(),
                    "stdout": String::from_utf8_lossy(&stdout),
                    "stderr": String::from_utf8_lossy(&stderr),
                    "truncated": out_truncated || err_truncated,
                })),
                Ending::TimedOut => Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!(
                        "{command:?} did not finish within {} s and was stopped.",
                        self.limits.timeout.as_secs_f64()
                    ),
                )),
                Ending::Aborted => Err(ToolError::failed(format!(
                    "{command:?} was stopped because the run was aborted."
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RunId;
    use tokio_util::sync::CancellationToken;

    fn setup() -> (tempfile::TempDir, Workspace, Toolbox) {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path().join("ws")).unwrap();
        let toolbox = workspace_tools(
            &workspace,
            CommandLimits {
                timeout: Duration::from_secs(5),
                output_bytes: 1024,
            },
        );
        (dir, workspace, toolbox)
    }

    fn context() -> ToolContext {
        ToolContext {
            run_id: RunId::parse("run").unwrap(),
            cancel: CancellationToken::new(),
        }
    }

    async fn call(toolbox: &Toolbox, name: &str, input: Value) -> Result<Value, ToolError> {
        toolbox.validate(name, &input)?;
        toolbox.get(name).unwrap().execute(input, &context()).await
    }

    #[tokio::test]
    async fn write_read_list_and_delete_a_file() {
        let (_dir, ws, tools) = setup();
        let written = call(
            &tools,
            "write_file",
            json!({"path": "notes/a.txt", "content": "hello"}),
        )
        .await
        .unwrap();
        assert_eq!(written, json!({"path": "notes/a.txt", "bytes": 5}));
        assert_eq!(
            std::fs::read_to_string(ws.root().join("notes/a.txt")).unwrap(),
            "hello"
        );

        let read = call(&tools, "read_file", json!({"path": "notes/a.txt"}))
            .await
            .unwrap();
        assert_eq!(read["content"], "hello");
        assert_eq!(read["truncated"], false);

        let listed = call(&tools, "list_files", json!({})).await.unwrap();
        assert_eq!(
            listed["entries"],
            json!([{"name": "notes", "kind": "dir", "size": listed["entries"][0]["size"]}])
        );
        let listed = call(&tools, "list_files", json!({"path": "notes"}))
            .await
            .unwrap();
        assert_eq!(listed["entries"][0]["name"], "a.txt");

        let deleted = call(&tools, "delete_file", json!({"path": "notes/a.txt"}))
            .await
            .unwrap();
        assert_eq!(deleted["deleted"], true);
        assert!(!ws.root().join("notes/a.txt").exists());
        let error = call(&tools, "delete_file", json!({"path": "notes/a.txt"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::NotFound);
        let error = call(&tools, "delete_file", json!({"path": "notes"}))
            .await
            .unwrap_err();
        assert!(error.message.contains("directory"));
    }

    #[tokio::test]
    async fn every_file_tool_refuses_paths_outside_the_workspace() {
        let (dir, _ws, tools) = setup();
        std::fs::write(dir.path().join("secret.txt"), "s").unwrap();
        for (tool, input) in [
            ("read_file", json!({"path": "../secret.txt"})),
            (
                "write_file",
                json!({"path": "../secret.txt", "content": "x"}),
            ),
            ("delete_file", json!({"path": "../secret.txt"})),
            ("list_files", json!({"path": ".."})),
            ("read_file", json!({"path": "/etc/passwd"})),
        ] {
            let error = call(&tools, tool, input).await.unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{tool}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.path().join("secret.txt")).unwrap(),
            "s"
        );
    }

    #[tokio::test]
    async fn a_large_file_is_read_truncated() {
        let (_dir, ws, tools) = setup();
        std::fs::write(ws.root().join("big.txt"), "x".repeat(MAX_READ_BYTES + 10)).unwrap();
        let read = call(&tools, "read_file", json!({"path": "big.txt"}))
            .await
            .unwrap();
        assert_eq!(read["truncated"], true);
        assert_eq!(read["content"].as_str().unwrap().len(), MAX_READ_BYTES);
    }

    #[tokio::test]
    async fn run_command_runs_a_program_in_the_workspace_without_a_shell() {
        let (_dir, ws, tools) = setup();
        std::fs::write(ws.root().join("a.txt"), "").unwrap();
        let out = call(&tools, "run_command", json!({"command": "ls"}))
            .await
            .unwrap();
        assert_eq!(out["exitCode"], 0);
        assert_eq!(out["stdout"], "a.txt\n");
        // No shell: the glob and the semicolon reach echo as plain text.
        let out = call(
            &tools,
            "run_command",
            json!({"command": "echo", "args": ["*;", "$HOME"]}),
        )
        .await
        .unwrap();
        assert_eq!(out["stdout"], "*; $HOME\n");
        let error = call(&tools, "run_command", json!({"command": "ls -la"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidInput);
        let error = call(
            &tools,
            "run_command",
            json!({"command": "no-such-program-xyz"}),
        )
        .await
        .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::NotFound);
        let out = call(&tools, "run_command", json!({"command": "false"}))
            .await
            .unwrap();
        assert_eq!(out["exitCode"], 1);
    }

    #[tokio::test]
    async fn run_command_does_not_pass_the_servers_environment() {
        let (_dir, _ws, tools) = setup();
        // SAFETY: this test only adds a variable no other test reads.
        unsafe { std::env::set_var("TOOLGATE_TEST_SECRET", "sk-should-not-leak") };
        let out = call(&tools, "run_command", json!({"command": "env"}))
            .await
            .unwrap();
        let env = out["stdout"].as_str().unwrap();
        assert!(!env.contains("sk-should-not-leak"), "{env}");
        assert!(env.contains("PATH="));
    }

    #[tokio::test]
    async fn run_command_bounds_its_output_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let tool = RunCommand::new(
            ws,
            CommandLimits {
                timeout: Duration::from_millis(300),
                output_bytes: 100,
            },
        );
        let out = tool
            .execute(
                json!({"command": "seq", "args": ["1", "100000"]}),
                &context(),
            )
            .await
            .unwrap();
        assert_eq!(out["truncated"], true);
        assert_eq!(out["stdout"].as_str().unwrap().len(), 100);
        let error = tool
            .execute(json!({"command": "sleep", "args": ["30"]}), &context())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Timeout);
    }
}
