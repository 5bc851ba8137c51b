//! The built-in workspace tools: `list_files`, `read_file`, `write_file`, `delete_file` and `run_command`.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use std::io::Read;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use super::preview::{self, PREVIEW_HEAD_BYTES, PREVIEW_READ_BYTES};
use super::process_tree::ProcessTree;
use super::workspace::{Peek, io_failure};
use super::{Tool, ToolContext, ToolError, ToolFuture, Toolbox, Workspace, WorkspacePath};
use crate::wire::{ApprovalPreview, ToolAnnotations, ToolErrorCode, ToolSpec};
use cap_std::fs::FileTypeExt;

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

/// The state of the file a file tool's call names in its `path` ([`Tool::state`]).
fn path_state(workspace: &Workspace, input: &Value) -> Option<String> {
    let path = WorkspacePath::parse(str_field(input, "path")).ok()?;
    Some(workspace.state(&path))
}

/// Runs a file tool's whole body on the blocking pool: one hand-off per call, instead of one per file system call.
/// The body is bounded (nothing it opens can block: see the workspace), so it runs to its end even when the run is
/// aborted meanwhile, and its result is what happened.
fn blocking(
    work: impl FnOnce() -> Result<Value, ToolError> + Send + 'static,
) -> ToolFuture<'static> {
    Box::pin(async move {
        tokio::task::spawn_blocking(work).await.map_err(|error| {
            ToolError::failed(format!("The tool stopped unexpectedly: {error}."))
        })?
    })
}

/// Runs a file tool's body on the task that calls it, within one poll, when `quick` says so (a few system calls that
/// this machine answers at once: see [`Workspace::removes_quickly`]); else on the blocking pool. Both are asked only
/// once the call is polled. The hand-off to the pool and back costs two thread wake-ups, more than such a body:
/// about a tenth of the server's CPU per approval round trip of `delete_file`, on either store. A panic in the body
/// fails the call, as on the pool, not the run.
fn quick_or_blocking(
    quick: impl FnOnce() -> bool + Send + 'static,
    work: impl FnOnce() -> Result<Value, ToolError> + Send + 'static,
) -> ToolFuture<'static> {
    Box::pin(async move {
        if !quick() {
            return blocking(work).await;
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
            Err(ToolError::failed(
                "The tool stopped unexpectedly: it panicked.",
            ))
        })
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
            let path = WorkspacePath::parse(str_field(&input, "path"))?;
            let dir = workspace.open_dir(&path)?;
            let reader = dir.entries().map_err(|e| io_failure("list", &path, e))?;
            let mut entries = Vec::new();
            let mut truncated = false;
            for entry in reader {
                let entry = entry.map_err(|e| io_failure("list", &path, e))?;
                if entries.len() == MAX_LIST_ENTRIES {
                    truncated = true;
                    break;
                }
                // What the file tools refuse (pipes, sockets, devices) is named as what it is, not a file.
                let kind = match entry.file_type() {
                    Ok(t) if t.is_symlink() => "symlink",
                    Ok(t) if t.is_dir() => "dir",
                    Ok(t) if t.is_file() => "file",
                    Ok(t) if t.is_fifo() => "fifo",
                    Ok(t) if t.is_socket() => "socket",
                    Ok(t) if t.is_char_device() || t.is_block_device() => "device",
                    _ => "other",
                };
                entries.push(json!({
                    "name": entry.file_name().to_string_lossy(),
                    "kind": kind,
                    "size": entry.metadata().map_or(0, |m| m.len()),
                }));
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json!({"path": path.to_string(), "entries": entries, "truncated": truncated}))
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
            let path = WorkspacePath::parse(str_field(&input, "path"))?;
            let (file, meta) = workspace.open_file(&path)?;
            let size = meta.len();
            let mut bytes = Vec::new();
            file.take(MAX_READ_BYTES as u64)
                .read_to_end(&mut bytes)
                .map_err(|e| io_failure("read", &path, e))?;
            Ok(json!({
                "path": path.to_string(),
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

/// The schema's maxLength counts characters; the limit is in bytes.
fn within_write_limit(content: &str) -> Result<(), ToolError> {
    if content.len() > MAX_WRITE_BYTES {
        return Err(ToolError::new(
            ToolErrorCode::InvalidInput,
            format!(
                "The content is {} bytes long; write_file writes at most {MAX_WRITE_BYTES} bytes.",
                content.len()
            ),
        ));
    }
    Ok(())
}

impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn check(&self, input: &Value) -> Result<(), ToolError> {
        within_write_limit(str_field(input, "content"))
    }

    fn execute<'a>(&'a self, input: Value, _: &'a ToolContext) -> ToolFuture<'a> {
        let workspace = self.workspace.clone();
        blocking(move || {
            let path = WorkspacePath::parse(str_field(&input, "path"))?;
            let content = str_field(&input, "content");
            within_write_limit(content)?;
            workspace.write_file(&path, content.as_bytes())?;
            Ok(json!({"path": path.to_string(), "bytes": content.len()}))
        })
    }

    fn state(&self, input: &Value) -> Option<String> {
        path_state(&self.workspace, input)
    }

    fn preview(&self, input: &Value) -> Option<ApprovalPreview> {
        let content = str_field(input, "content");
        let previewed = WorkspacePath::parse(str_field(input, "path")).and_then(|path| {
            let diff = match self.workspace.peek(&path, PREVIEW_READ_BYTES)? {
                Peek::Missing => preview::file_diff(None, content),
                Peek::Link => {
                    return Err(ToolError::new(
                        ToolErrorCode::OutsideWorkspace,
                        format!(
                            "{:?} is a symbolic link; write_file does not write through links, so this call will be refused.",
                            path.to_string()
                        ),
                    ));
                }
                Peek::File { size, .. } if size > PREVIEW_READ_BYTES as u64 => {
                    preview::uncomparable(
                        size,
                        content,
                        format!("The file has {size} bytes, too many to compare here; all of it would be replaced."),
                    )
                }
                Peek::File { head, size } => match preview::as_text(&head) {
                    Some(old) if old.len() == head.len() => preview::file_diff(Some(old), content),
                    _ => preview::uncomparable(
                        size,
                        content,
                        "The file is not text; all of it would be replaced.".into(),
                    ),
                },
            };
            Ok(ApprovalPreview::FileWrite {
                path: path.to_string(),
                diff,
            })
        });
        Some(
            previewed.unwrap_or_else(|error| ApprovalPreview::Unavailable {
                reason: error.message,
            }),
        )
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
        let (workspace, looked_at) = (self.workspace.clone(), self.workspace.clone());
        let named = str_field(&input, "path").to_owned();
        let quick =
            move || WorkspacePath::parse(&named).is_ok_and(|path| looked_at.removes_quickly(&path));
        quick_or_blocking(quick, move || {
            let path = WorkspacePath::parse(str_field(&input, "path"))?;
            workspace.remove_file(&path)?;
            Ok(json!({"path": path.to_string(), "deleted": true}))
        })
    }

    fn state(&self, input: &Value) -> Option<String> {
        path_state(&self.workspace, input)
    }

    fn preview(&self, input: &Value) -> Option<ApprovalPreview> {
        let previewed = WorkspacePath::parse(str_field(input, "path")).and_then(|path| {
            Ok(match self.workspace.peek(&path, PREVIEW_HEAD_BYTES)? {
                Peek::Missing => ApprovalPreview::Unavailable {
                    reason: format!(
                        "{:?} does not exist, so this call will fail.",
                        path.to_string()
                    ),
                },
                Peek::Link => ApprovalPreview::FileDelete {
                    path: path.to_string(),
                    bytes: 0,
                    head: Vec::new(),
                    more: false,
                    note: Some(
                        "A symbolic link: only the link is deleted, never what it points to."
                            .into(),
                    ),
                },
                Peek::File { head, size } => preview::deletion(path.to_string(), size, &head),
            })
        });
        Some(
            previewed.unwrap_or_else(|error| ApprovalPreview::Unavailable {
                reason: error.message,
            }),
        )
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
                description: "Run a program in the workspace directory, without a shell, and return its exit code and output. Pass the program name as command and each argument separately in args. Anything it leaves running when it exits is stopped.".into(),
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
            path_env: search_path_outside(
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
                workspace.root(),
            ),
            workspace,
            limits,
        }
    }
}

/// A command's own home directory: empty, readable by toolgate's user alone, removed when the call ends (on the
/// blocking pool: a command may have filled it).
struct CommandHome(Option<tempfile::TempDir>);

impl CommandHome {
    fn new() -> Result<Self, ToolError> {
        tempfile::Builder::new()
            .prefix("toolgate-home-")
            .tempdir()
            .map(|dir| Self(Some(dir)))
            .map_err(|error| {
                ToolError::failed(format!(
                    "Could not make the command's home directory: {error}."
                ))
            })
    }

    fn path(&self) -> &std::path::Path {
        self.0.as_ref().map_or(
            std::path::Path::new("/nonexistent"),
            tempfile::TempDir::path,
        )
    }
}

impl Drop for CommandHome {
    fn drop(&mut self) {
        let Some(dir) = self.0.take() else {
            return;
        };
        let remove = move || {
            // A command may leave directories it may not write (Go's module cache is read-only): made writable
            // first, or their contents would stay behind.
            writable_for_removal(dir.path());
            if let Err(error) = dir.close() {
                tracing::warn!(%error, "a command's home directory could not be removed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

/// Gives toolgate's user the right to empty every directory under `dir` (not following links).
fn writable_for_removal(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            let mode = metadata.permissions().mode();
            if mode & 0o700 != 0o700 {
                let _ =
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | 0o700));
            }
            writable_for_removal(&path);
        }
    }
}

/// The entries of a `PATH` that name a directory from the root and outside `workspace`. A relative one (`.`,
/// `node_modules/.bin`, an empty entry, which means `.`) is looked up from the workspace, and one inside it is there:
/// the file tools write there, and a program the model wrote would run under the name of one a rule allows. None left
/// (an empty `PATH` is the current directory to `execvp`): the system's usual directories.
fn search_path_outside(path: OsString, workspace: &std::path::Path) -> OsString {
    let root = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    let inside = |entry: &std::path::Path| {
        entry.starts_with(workspace)
            || entry.starts_with(&root)
            || std::fs::canonicalize(entry).is_ok_and(|real| real.starts_with(&root))
    };
    let kept = std::env::split_paths(&path).filter(|entry| entry.is_absolute() && !inside(entry));
    std::env::join_paths(kept)
        // Only an entry with the separator in it fails to join, and none of these has one: it was split on it.
        .ok()
        .filter(|joined| !joined.is_empty())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
}

/// Reads a pipe to its end, or until `stop` (then what is in it already), keeping at most `limit` bytes, so the child
/// never blocks on a full pipe.
async fn read_bounded(
    reader: Option<impl AsyncRead + Unpin>,
    limit: usize,
    stop: CancellationToken,
) -> (Vec<u8>, bool) {
    let Some(mut reader) = reader else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buffer = [0u8; 8192];
    let mut keep = |read: &[u8]| {
        let room = limit - kept.len();
        kept.extend_from_slice(&read[..read.len().min(room)]);
        truncated |= read.len() > room;
    };
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                // What is in the pipe already is kept (a few buffers at most), not what comes after.
                for _ in 0..16 {
                    match futures::FutureExt::now_or_never(reader.read(&mut buffer)) {
                        Some(Ok(n)) if n > 0 => keep(&buffer[..n]),
                        _ => break,
                    }
                }
                break;
            }
            read = reader.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => keep(&buffer[..n]),
            },
        }
    }
    (kept, truncated)
}

/// What `reading` ([`read_bounded`]) kept by its end, or by `deadline`, when it is told to stop where it is.
async fn read_until(
    mut reading: tokio::task::JoinHandle<(Vec<u8>, bool)>,
    deadline: tokio::time::Instant,
    stop: &CancellationToken,
) -> (Vec<u8>, bool) {
    if let Ok(read) = tokio::time::timeout_at(deadline, &mut reading).await {
        return read.unwrap_or_default();
    }
    stop.cancel();
    reading.await.unwrap_or_default()
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
    Aborted,
}

/// Refuses a `command` that is not a program's name (it has whitespace: a command line meant for a shell).
fn program_name(command: &str) -> Result<(), ToolError> {
    if command.chars().any(char::is_whitespace) {
        return Err(ToolError::new(
            ToolErrorCode::InvalidInput,
            format!(
                "{command:?} is not a program name. Put the program in command and each argument in args; no shell is used."
            ),
        ));
    }
    Ok(())
}

impl Tool for RunCommand {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// A command is a program's name, not a command line: one with whitespace could only fail once approved.
    fn check(&self, input: &Value) -> Result<(), ToolError> {
        program_name(str_field(input, "command"))
    }

    fn preview(&self, input: &Value) -> Option<ApprovalPreview> {
        let args = input
            .get("args")
            .and_then(Value::as_array)
            .map(|args| {
                args.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Some(ApprovalPreview::Command {
            program: str_field(input, "command").to_owned(),
            args,
            directory: self.workspace.root().display().to_string(),
        })
    }

    fn execute<'a>(&'a self, input: Value, context: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let command = str_field(&input, "command");
            program_name(command)?;
            let args: Vec<&str> = input
                .get("args")
                .and_then(Value::as_array)
                .map(|args| args.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();

            // A home of the command's own, empty, private and removed once its tree is gone. Not the workspace: its
            // dotfiles (`.gitconfig`, `.curlrc`, `.config/...`) are what the file tools write, and programs read them
            // as their user's settings (git's `core.fsmonitor` runs a program: a written `.gitconfig` would make an
            // allowed `git status` run anything). Not the user's either, whose settings and keys no command should
            // read or change; and nothing one command writes there (`git config --global`) reaches the next.
            // The card named the workspace by its path: a path given to another directory since toolgate opened the
            // workspace (moved, replaced) would have the command run elsewhere than the file tools act.
            if !self.workspace.path_leads_here() {
                return Err(ToolError::failed(format!(
                    "{} is no longer the workspace toolgate opened (it was moved or replaced since toolgate started), so {command:?} was not run: it would run elsewhere than the file tools act. Start toolgate again to use the directory there now.",
                    self.workspace.root().display()
                )));
            }
            let home = CommandHome::new()?;
            let mut spawning = tokio::process::Command::new(command);
            let workspace_fd = self.workspace.raw_fd();
            // SAFETY: between fork and exec the closure makes one system call, which allocates nothing and takes no
            // lock; the descriptor is the workspace's, open for as long as toolgate runs.
            unsafe {
                spawning.pre_exec(move || {
                    // In the directory the file tools act on, not wherever its path leads by now.
                    if libc::fchdir(workspace_fd) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
            let mut tree = ProcessTree::spawn(
                spawning
                    .args(&args)
                    .env_clear()
                    .env("PATH", &self.path_env)
                    .env("HOME", home.path())
                    .env("LANG", "C.UTF-8")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped()),
            )
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::NotFound => ToolError::new(
                    ToolErrorCode::NotFound,
                    format!("There is no program named {command:?} on the PATH."),
                ),
                _ => ToolError::failed(format!("Could not start {command:?}: {error}.")),
            })?;
            let limit = self.limits.output_bytes;
            let stop_reading = CancellationToken::new();
            let stdout = tokio::spawn(read_bounded(
                tree.take_stdout(),
                limit,
                stop_reading.clone(),
            ));
            let stderr = tokio::spawn(read_bounded(
                tree.take_stderr(),
                limit,
                stop_reading.clone(),
            ));

            let ending = tokio::select! {
                status = tree.command_exited() => match status {
                    Ok(status) => Ending::Exited(status),
                    Err(error) => {
                        tree.end().await;
                        return Err(ToolError::failed(format!("Could not wait for {command:?}: {error}.")));
                    }
                },
                () = tokio::time::sleep(self.limits.timeout) => Ending::TimedOut,
                () = context.cancel.cancelled() => Ending::Aborted,
            };
            // Whatever the command left running goes with it (including what left its session or group), so the
            // pipes close and nothing outlives the call.
            let ended = tree.end().await;
            if ended.killed > 0 {
                tracing::debug!(
                    command,
                    left_behind = ended.killed,
                    "stopped what a command left running"
                );
            }
            // A process the kill could not reach (one toolgate may not signal) may hold the pipes open: what was
            // read by then is kept, and such a process is not waited for long.
            let grace = tokio::time::Instant::now()
                + if ended.outliving.is_empty() {
                    Duration::from_secs(2)
                } else {
                    Duration::from_millis(200)
                };
            let (stdout, out_truncated) = read_until(stdout, grace, &stop_reading).await;
            let (stderr, err_truncated) = read_until(stderr, grace, &stop_reading).await;

            let (stdout, stderr) = (
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr),
            );
            // What a stopped command printed is part of what the model learns about it.
            let so_far = |stopped: String| {
                let mut message = stopped;
                for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
                    if !text.is_empty() {
                        message.push_str(&format!("\nIts {name} until then:\n{text}"));
                    }
                }
                message
            };
            match ending {
                Ending::Exited(status) => {
                    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
                    Ok(json!({
                        "command": command,
                        "args": args,
                        "exitCode": status.code(),
                        "signal": signal,
                        "stdout": stdout,
                        "stderr": stderr,
                        "truncated": out_truncated || err_truncated,
                    }))
                }
                Ending::TimedOut => Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    so_far(format!(
                        "{command:?} did not finish within {} s and was stopped.",
                        self.limits.timeout.as_secs_f64()
                    )),
                )),
                Ending::Aborted => Err(ToolError::failed(so_far(format!(
                    "{command:?} was stopped because the run was aborted."
                )))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RunId;
    use std::sync::Arc;
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
    async fn a_quick_body_runs_on_the_calling_task_any_other_on_the_pool_and_a_panic_fails_the_call()
     {
        let here = format!("{:?}", std::thread::current().id());
        let ran_on = |quick: bool| {
            quick_or_blocking(
                move || quick,
                || Ok(json!(format!("{:?}", std::thread::current().id()))),
            )
        };
        assert_eq!(ran_on(true).await.unwrap(), json!(here));
        assert_ne!(ran_on(false).await.unwrap(), json!(here));
        let error = quick_or_blocking(|| true, || panic!("a bug in a tool"))
            .await
            .unwrap_err();
        assert!(error.message.contains("panicked"), "{}", error.message);
    }

    #[tokio::test]
    async fn delete_file_deletes_on_a_workspace_that_may_hang_and_a_large_file_too() {
        let (_dir, ws, _) = setup();
        std::fs::write(ws.root().join("small.txt"), "a").unwrap();
        std::fs::write(ws.root().join("large.bin"), vec![b'x'; 4 << 20]).unwrap();
        let limits = CommandLimits {
            timeout: Duration::from_secs(5),
            output_bytes: 1024,
        };
        let remote = workspace_tools(&ws.clone().seen_as_remote(), limits);
        let deleted = call(&remote, "delete_file", json!({"path": "small.txt"}))
            .await
            .unwrap();
        assert_eq!(deleted["deleted"], true);
        let local = workspace_tools(&ws, limits);
        call(&local, "delete_file", json!({"path": "large.bin"}))
            .await
            .unwrap();
        assert!(!ws.root().join("small.txt").exists());
        assert!(!ws.root().join("large.bin").exists());
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

    /// A command's home is its own: outside the workspace (whose dotfiles the file tools write, and programs would
    /// read as their user's settings), empty, and gone once the call ends, so that nothing one command writes there
    /// reaches the next.
    #[tokio::test]
    async fn a_command_has_an_empty_home_of_its_own_outside_the_workspace() {
        let (_dir, ws, tools) = setup();
        std::fs::write(ws.root().join(".gitconfig"), "[core]\n").unwrap();
        let mut homes = Vec::new();
        for _ in 0..2 {
            let out = call(
                &tools,
                "run_command",
                json!({"command": "sh", "args": ["-c", "echo \"$HOME\"; ls -A \"$HOME\"; echo kept > \"$HOME/.gitconfig\"; mkdir -p \"$HOME/cache/mod\" && touch \"$HOME/cache/mod/f\" && chmod 555 \"$HOME/cache/mod\" \"$HOME/cache\""]}),
            )
            .await
            .unwrap();
            let stdout = out["stdout"].as_str().unwrap().to_owned();
            let mut lines = stdout.lines();
            let home = std::path::PathBuf::from(lines.next().unwrap());
            assert_eq!(lines.next(), None, "{home:?} starts empty");
            assert!(
                home.is_absolute() && !home.starts_with(ws.root()),
                "{home:?}"
            );
            homes.push(home);
        }
        assert_ne!(homes[0], homes[1]);
        // Removed on the blocking pool once the call ends.
        for _ in 0..100 {
            if homes.iter().all(|home| !home.exists()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(homes.iter().all(|home| !home.exists()), "{homes:?}");
        assert_eq!(
            std::fs::read_to_string(ws.root().join(".gitconfig")).unwrap(),
            "[core]\n"
        );
    }

    /// Entries of the server's `PATH` that lead into the workspace, where the model writes files, relative ones
    /// (`.`, an empty one, `node_modules/.bin`, looked up from it) and absolute ones inside it (also through a link):
    /// a command's `PATH` keeps only the others.
    #[test]
    fn a_commands_search_path_keeps_only_directories_outside_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(workspace.join("bin")).unwrap();
        std::os::unix::fs::symlink(workspace.join("bin"), dir.path().join("link")).unwrap();
        let ws = workspace.display();
        let link = dir.path().join("link");
        let path = format!(
            ".:/usr/bin::node_modules/.bin:/bin:bin:{ws}/bin:{ws}/not-yet:{}",
            link.display()
        );
        assert_eq!(
            search_path_outside(path.into(), &workspace),
            OsString::from("/usr/bin:/bin")
        );
        // None left, which `execvp` would read as the current directory: the system's.
        for path in ["", ".", "bin:", &format!("{ws}/bin")] {
            assert_eq!(
                search_path_outside(path.into(), &workspace),
                OsString::from("/usr/local/bin:/usr/bin:/bin")
            );
        }
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
        // Refused by the check every call passes before it may ask: a card never offers a command that can only
        // fail once approved.
        let error = tools
            .validate("run_command", &json!({"command": "ls -la"}))
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

    /// A command runs in the tree the file tools act on, and one whose workspace path now leads to another directory
    /// (the workspace moved, another made in its place) is not run: the card named the path. Before, the command ran
    /// in the new directory while the file tools went on writing into the old one.
    #[tokio::test]
    async fn a_command_is_not_run_once_the_workspace_path_leads_elsewhere() {
        let (dir, ws, tools) = setup();
        let write = |name: &str| call(&tools, "write_file", json!({"path": name, "content": "x"}));
        write("a.txt").await.unwrap();
        let out = call(&tools, "run_command", json!({"command": "ls"}))
            .await
            .unwrap();
        assert_eq!(out["stdout"], "a.txt\n");
        std::fs::rename(ws.root(), dir.path().join("ws.old")).unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        let error = call(&tools, "run_command", json!({"command": "ls"}))
            .await
            .unwrap_err();
        assert!(
            error
                .message
                .contains("is no longer the workspace toolgate opened"),
            "{error:?}"
        );
        // The file tools still act on the directory toolgate opened.
        write("b.txt").await.unwrap();
        assert!(dir.path().join("ws.old/b.txt").exists());
    }

    /// A pipe a process the kill could not reach holds open keeps what was read by the deadline: the command's output
    /// reaches the model. Before, a pipe that did not close within the grace gave nothing.
    #[tokio::test]
    async fn output_read_by_the_deadline_is_kept_when_the_pipe_stays_open() {
        let (mut writer, reader) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut writer, b"printed before the end\n")
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let reading = tokio::spawn(read_bounded(Some(reader), 1024, stop.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        let (kept, truncated) = read_until(reading, deadline, &stop).await;
        assert_eq!(kept, b"printed before the end\n");
        assert!(!truncated);
        drop(writer);
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

    /// Calls a tool on a thread of its own and fails, rather than hangs, when no answer comes within 5 s.
    fn call_promptly(
        tools: &Arc<Toolbox>,
        name: &'static str,
        input: Value,
    ) -> Result<Value, ToolError> {
        let (send, receive) = std::sync::mpsc::channel();
        let tools = Arc::clone(tools);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _ = send.send(runtime.block_on(call(&tools, name, input)));
        });
        receive
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{name} did not answer within 5 s"))
    }

    fn c_path(path: &std::path::Path) -> std::ffi::CString {
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap()
    }

    #[tokio::test]
    async fn files_with_another_hard_link_are_neither_read_written_nor_deleted() {
        let (dir, ws, tools) = setup();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "outside").unwrap();
        std::fs::hard_link(&secret, ws.root().join("linked.txt")).unwrap();

        let error = call(&tools, "read_file", json!({"path": "linked.txt"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::OutsideWorkspace);
        assert!(error.message.contains("2 hard links"), "{}", error.message);
        let error = call(
            &tools,
            "write_file",
            json!({"path": "linked.txt", "content": "overwritten"}),
        )
        .await
        .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::OutsideWorkspace);
        let error = call(&tools, "delete_file", json!({"path": "linked.txt"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::OutsideWorkspace);

        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "outside",
            "not truncated"
        );
        assert!(ws.root().join("linked.txt").exists());
    }

    /// The limit on what a write writes is in bytes, whatever the characters (the schema can count only those).
    #[tokio::test]
    async fn a_write_is_bounded_in_bytes() {
        let (_dir, ws, tools) = setup();
        let content = "𝄞".repeat(MAX_WRITE_BYTES / 4 + 1);
        assert!(content.chars().count() < MAX_WRITE_BYTES);
        let error = call(
            &tools,
            "write_file",
            json!({"path": "wide.txt", "content": content}),
        )
        .await
        .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error}");
        assert!(!ws.root().join("wide.txt").exists());
        // Checked with the schema, so that such a call never reaches a card.
        let input = json!({"path": "wide.txt", "content": "𝄞".repeat(MAX_WRITE_BYTES / 4 + 1)});
        let refused = tools.validate("write_file", &input).unwrap_err();
        assert!(refused.message.contains("at most"), "{refused}");
    }

    #[test]
    fn fifos_sockets_and_devices_are_refused_at_once() {
        let (_dir, ws, tools) = setup();
        let tools = Arc::new(tools);
        let fifo = ws.root().join("pipe");
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
        let _socket = std::os::unix::net::UnixListener::bind(ws.root().join("socket")).unwrap();
        let mut special = vec![("pipe", "FIFO"), ("socket", "socket")];
        let device = ws.root().join("null");
        // A character device (the null device's numbers) can be made only with CAP_MKNOD, as root.
        // SAFETY: mknod reads a NUL-terminated path that outlives the call.
        let made = unsafe {
            libc::mknod(
                c_path(&device).as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(1, 3),
            )
        };
        if made == 0 {
            special.push(("null", "device"));
        } else {
            eprintln!("not testing a device node: mknod needs CAP_MKNOD");
        }

        for (name, what) in &special {
            for (tool, input) in [
                ("read_file", json!({"path": name})),
                ("write_file", json!({"path": name, "content": "x"})),
                ("delete_file", json!({"path": name})),
            ] {
                let error = call_promptly(&tools, tool, input).unwrap_err();
                assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{tool} {name}");
                assert!(
                    error.message.contains(what) && error.message.contains("not a regular file"),
                    "{tool} {name}: {}",
                    error.message
                );
            }
            assert!(ws.root().join(name).exists(), "{name} is still there");
        }
        // The listing names each as what it is.
        let listed = call_promptly(&tools, "list_files", json!({})).unwrap();
        let kinds: Vec<(&str, &str)> = listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| {
                (
                    entry["name"].as_str().unwrap(),
                    entry["kind"].as_str().unwrap(),
                )
            })
            .collect();
        let mut expected = vec![("pipe", "fifo"), ("socket", "socket")];
        if made == 0 {
            expected.insert(0, ("null", "device"));
        }
        assert_eq!(kinds, expected);

        // With a reader waiting on the FIFO, a write would open it; it is still refused and nothing arrives.
        use std::os::unix::fs::OpenOptionsExt;
        let mut reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let error = call_promptly(
            &tools,
            "write_file",
            json!({"path": "pipe", "content": "x"}),
        )
        .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::OutsideWorkspace);
        let mut received = Vec::new();
        let _ = reader.read_to_end(&mut received);
        assert!(received.is_empty());
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_to_outside_never_lets_a_tool_out() {
        let (dir, ws, tools) = setup();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "outside").unwrap();
        std::fs::create_dir(ws.root().join("d")).unwrap();
        std::fs::write(ws.root().join("d/secret.txt"), "inside").unwrap();
        std::os::unix::fs::symlink(&outside, ws.root().join("swap")).unwrap();

        // `d` is the directory or the symlink to outside, swapped atomically, over and over.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = Arc::clone(&stop);
            let (d, swap) = (
                c_path(&ws.root().join("d")),
                c_path(&ws.root().join("swap")),
            );
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: renameat2 reads two NUL-terminated paths that outlive the call.
                    let swapped = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            d.as_ptr(),
                            libc::AT_FDCWD,
                            swap.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(swapped, 0, "{}", std::io::Error::last_os_error());
                    swaps += 1;
                }
                swaps
            })
        };

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (mut read_inside, mut refused) = (0, 0);
        for _ in 0..1_000 {
            runtime.block_on(async {
                match call(&tools, "read_file", json!({"path": "d/secret.txt"})).await {
                    Ok(read) => {
                        assert_eq!(read["content"], "inside", "read through the swapped link");
                        read_inside += 1;
                    }
                    Err(error) => {
                        assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{error}");
                        refused += 1;
                    }
                }
                let _ = call(
                    &tools,
                    "write_file",
                    json!({"path": "d/secret.txt", "content": "inside"}),
                )
                .await;
                let _ = call(
                    &tools,
                    "write_file",
                    json!({"path": "d/new.txt", "content": "written"}),
                )
                .await;
                let _ = call(&tools, "list_files", json!({"path": "d"})).await;
            });
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swapper.join().unwrap();

        assert_eq!(
            std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
            "outside"
        );
        assert!(!outside.join("new.txt").exists(), "a write went outside");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        // The race really happened: both sides of the swap were seen.
        assert!(
            read_inside > 0 && refused > 0,
            "read {read_inside} inside, {refused} refused, over {swaps} swaps"
        );
    }

    fn preview(tools: &Toolbox, name: &str, input: Value) -> ApprovalPreview {
        tools.validate(name, &input).unwrap();
        tools.get(name).unwrap().preview(&input).unwrap()
    }

    #[test]
    fn a_write_previews_its_diff_against_the_file_as_it_is() {
        let (_dir, ws, tools) = setup();
        std::fs::write(ws.root().join("a.txt"), "one\ntwo\n").unwrap();
        let ApprovalPreview::FileWrite { path, diff } = preview(
            &tools,
            "write_file",
            json!({"path": "./a.txt", "content": "one\n2\n"}),
        ) else {
            panic!("not a file write")
        };
        assert_eq!(path, "a.txt");
        assert!(!diff.new_file);
        assert_eq!((diff.old_bytes, diff.new_bytes), (Some(8), 6));
        assert_eq!((diff.added, diff.removed), (1, 1));

        let ApprovalPreview::FileWrite { diff, .. } = preview(
            &tools,
            "write_file",
            json!({"path": "new/b.txt", "content": "hi\n"}),
        ) else {
            panic!("not a file write")
        };
        assert!(diff.new_file);
        assert_eq!(diff.added, 1);
        // A preview changes nothing.
        assert!(!ws.root().join("new").exists());
        assert_eq!(
            std::fs::read_to_string(ws.root().join("a.txt")).unwrap(),
            "one\ntwo\n"
        );
    }

    #[test]
    fn a_write_over_a_large_or_binary_file_says_so_instead_of_a_diff() {
        let (_dir, ws, tools) = setup();
        let big = "x\n".repeat(PREVIEW_READ_BYTES);
        std::fs::write(ws.root().join("big.txt"), &big).unwrap();
        std::fs::write(ws.root().join("bin"), b"\x00\x01").unwrap();
        for (file, note) in [("big.txt", "too many to compare"), ("bin", "not text")] {
            let ApprovalPreview::FileWrite { diff, .. } =
                preview(&tools, "write_file", json!({"path": file, "content": "y"}))
            else {
                panic!("not a file write")
            };
            assert!(diff.lines.is_empty(), "{file}");
            assert!(
                diff.note.as_deref().unwrap().contains(note),
                "{file}: {diff:?}"
            );
        }
    }

    #[test]
    fn a_delete_previews_the_size_and_first_lines() {
        let (_dir, ws, tools) = setup();
        std::fs::write(ws.root().join("a.txt"), "first\nsecond\n").unwrap();
        assert_eq!(
            preview(&tools, "delete_file", json!({"path": "a.txt"})),
            ApprovalPreview::FileDelete {
                path: "a.txt".into(),
                bytes: 13,
                head: vec!["first".into(), "second".into()],
                more: false,
                note: None,
            }
        );
        std::os::unix::fs::symlink("a.txt", ws.root().join("link")).unwrap();
        let ApprovalPreview::FileDelete { note, .. } =
            preview(&tools, "delete_file", json!({"path": "link"}))
        else {
            panic!("a link inside has a preview")
        };
        assert!(note.unwrap().contains("only the link is deleted"));
        let ApprovalPreview::Unavailable { reason } = preview(
            &tools,
            "write_file",
            json!({"path": "link", "content": "x"}),
        ) else {
            panic!("a write through a link is refused")
        };
        assert!(reason.contains("does not write through links"), "{reason}");
        let ApprovalPreview::Unavailable { reason } =
            preview(&tools, "delete_file", json!({"path": "gone.txt"}))
        else {
            panic!("a missing file has no preview")
        };
        assert!(reason.contains("does not exist"), "{reason}");
    }

    #[test]
    fn previews_never_read_outside_the_workspace_nor_wait_on_a_fifo() {
        let (dir, ws, tools) = setup();
        let tools = Arc::new(tools);
        std::fs::write(dir.path().join("secret.txt"), "outside secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.root().join("escape"))
            .unwrap();
        std::os::unix::fs::symlink(dir.path(), ws.root().join("up")).unwrap();
        let fifo = ws.root().join("pipe");
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);

        for (tool, input, expected) in [
            (
                "write_file",
                json!({"path": "escape", "content": "x"}),
                "outside the workspace",
            ),
            (
                "write_file",
                json!({"path": "up/secret.txt", "content": "x"}),
                "outside the workspace",
            ),
            (
                "delete_file",
                json!({"path": "escape"}),
                "outside the workspace",
            ),
            (
                "delete_file",
                json!({"path": "up/secret.txt"}),
                "outside the workspace",
            ),
            (
                "write_file",
                json!({"path": "pipe", "content": "x"}),
                "FIFO",
            ),
            ("delete_file", json!({"path": "pipe"}), "FIFO"),
        ] {
            // On a thread of its own: a preview that waited on the FIFO would fail the test instead of hanging it.
            let (send, receive) = std::sync::mpsc::channel();
            let previewing = Arc::clone(&tools);
            std::thread::spawn(move || {
                let _ = send.send(previewing.get(tool).unwrap().preview(&input));
            });
            let previewed = receive
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{tool} {expected}: no preview within 5 s"));
            let Some(ApprovalPreview::Unavailable { reason }) = previewed else {
                panic!("{tool} {expected}: {previewed:?}")
            };
            assert!(reason.contains(expected), "{tool}: {reason}");
            assert!(!reason.contains("outside secret"));
        }
    }

    #[test]
    fn a_command_previews_its_program_arguments_and_directory() {
        let (_dir, ws, tools) = setup();
        assert_eq!(
            preview(
                &tools,
                "run_command",
                json!({"command": "echo", "args": ["a b", "*", "$HOME"]}),
            ),
            ApprovalPreview::Command {
                program: "echo".into(),
                args: vec!["a b".into(), "*".into(), "$HOME".into()],
                directory: ws.root().display().to_string(),
            }
        );
    }

    /// The command lines of the processes whose working directory is `dir`: a test's own workspace, so they are the
    /// processes its commands started, whatever session or group they moved to.
    fn processes_in(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| name.parse::<u32>().is_ok())
                    && std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir)
            })
            .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
            .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
            .collect()
    }

    /// Waits until `count` processes running `sleep 300` have `dir` as their working directory.
    async fn sleepers_started(dir: &std::path::Path, count: usize) {
        let started = std::time::Instant::now();
        loop {
            let sleepers = processes_in(dir)
                .iter()
                .filter(|cmdline| cmdline.starts_with("sleep 300"))
                .count();
            if sleepers == count {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "only {sleepers} sleepers: {:?}",
                processes_in(dir)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Runs `sh -c script`, which starts two `sleep 300` and waits for a file `go`; makes the file once both run.
    async fn run_until_told(
        tools: &Toolbox,
        ws: &Workspace,
        script: &str,
    ) -> Result<Value, ToolError> {
        let context = context();
        let run_command = tools.get("run_command").unwrap();
        let running =
            run_command.execute(json!({"command": "sh", "args": ["-c", script]}), &context);
        let exit_once_started = async {
            sleepers_started(ws.root(), 2).await;
            std::fs::write(ws.root().join("go"), "").unwrap();
        };
        let (result, ()) = tokio::join!(running, exit_once_started);
        result
    }

    /// A shell that starts two sleepers, one of them in a session of its own, and waits for them.
    const LEAVES_A_SESSION: &str = "sleep 300 & setsid sleep 300 & wait";

    #[tokio::test]
    async fn an_aborted_command_leaves_no_process_even_one_in_a_new_session() {
        let (_dir, ws, tools) = setup();
        let context = context();
        let run_command = tools.get("run_command").unwrap();
        let running = run_command.execute(
            json!({"command": "sh", "args": ["-c", LEAVES_A_SESSION]}),
            &context,
        );
        let abort_once_started = async {
            sleepers_started(ws.root(), 2).await;
            context.cancel.cancel();
        };
        let (result, ()) = tokio::join!(running, abort_once_started);
        let error = result.unwrap_err();
        assert!(error.message.contains("run was aborted"), "{error}");
        assert_eq!(processes_in(ws.root()), Vec::<String>::new());
    }

    /// `run_command` with a timeout of `seconds`.
    fn timing_out_after(ws: &Workspace, seconds: u64) -> RunCommand {
        RunCommand::new(
            ws.clone(),
            CommandLimits {
                timeout: Duration::from_secs(seconds),
                output_bytes: 1024,
            },
        )
    }

    #[tokio::test]
    async fn a_command_that_times_out_leaves_no_process() {
        let (_dir, ws, _tools) = setup();
        let tool = timing_out_after(&ws, 3);
        let context = context();
        let script = format!("echo started; echo warned >&2; {LEAVES_A_SESSION}");
        let running = tool.execute(json!({"command": "sh", "args": ["-c", script]}), &context);
        let (result, ()) = tokio::join!(running, sleepers_started(ws.root(), 2));
        let error = result.unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Timeout);
        assert_eq!(
            error.message,
            "\"sh\" did not finish within 3 s and was stopped.\n\
             Its stdout until then:\nstarted\n\nIts stderr until then:\nwarned\n",
            "what it printed is kept"
        );
        assert_eq!(processes_in(ws.root()), Vec::<String>::new());
    }

    /// A shell whose trap signals its own process group (`kill 0`, a common clean-up) ends as the shell, with
    /// its output; and what it left running, in the group or not, is stopped.
    #[tokio::test]
    async fn a_command_that_signals_its_own_group_keeps_its_output_and_leaves_nothing() {
        let (_dir, ws, tools) = setup();
        let script = "trap 'kill 0' EXIT; (trap '' TERM; sleep 300) & setsid sleep 300 & \
             until [ -e go ]; do sleep 0.01; done; echo hello";
        let output = run_until_told(&tools, &ws, script)
            .await
            .expect("the command's own result");
        assert_eq!(output["stdout"], "hello\n");
        assert_eq!(
            [&output["exitCode"], &output["signal"]],
            [&json!(null), &json!(libc::SIGTERM)],
            "the shell's own kill 0 ended it"
        );
        assert_eq!(processes_in(ws.root()), Vec::<String>::new());
    }

    /// A process whose main thread ended while its other threads run is alive, and is stopped with the rest.
    #[tokio::test]
    async fn a_process_whose_main_thread_ended_is_stopped_too() {
        let (_dir, ws, _tools) = setup();
        let tool = timing_out_after(&ws, 5);
        let script = "import ctypes, os, threading, time\n\
             threading.Thread(target=time.sleep, args=(300,)).start()\n\
             open('pid', 'w').write(str(os.getpid()))\n\
             ctypes.CDLL(None).pthread_exit(None)\n";
        let error = tool
            .execute(
                json!({"command": "python3", "args": ["-c", script]}),
                &context(),
            )
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Timeout, "{error}");
        let pid = std::fs::read_to_string(ws.root().join("pid")).unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived the call"
        );
    }

    #[tokio::test]
    async fn what_a_command_leaves_running_is_stopped_when_it_exits() {
        let (_dir, ws, tools) = setup();
        // The shell starts two sleepers, one of them in a session of its own, and exits once told to.
        let script =
            "sleep 300 & setsid sleep 300 & until [ -e go ]; do sleep 0.01; done; echo done";
        let output = run_until_told(&tools, &ws, script).await.unwrap();
        assert_eq!(output["exitCode"], 0);
        assert_eq!(output["stdout"], "done\n");
        assert_eq!(processes_in(ws.root()), Vec::<String>::new());
    }
}
