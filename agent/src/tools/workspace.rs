//! The workspace directory the built-in tools are confined to.
//!
//! The directory is opened once, as a `cap-std` [`Dir`], and every file operation is made relative to that handle:
//! the kernel resolves each path beneath it (`openat2` with `RESOLVE_BENEATH`, or, on kernels without it, cap-std's
//! component-by-component walk with no-follow opens), so no path reaches outside the workspace however the tree
//! changes between a check and a use. A symlink inside the workspace that points inside still works; one that points
//! outside, or climbs out with `..`, is refused.
//!
//! What an operation opens is checked on the open descriptor, not on the path: the file tools read and write only
//! regular files with a single link (a second hard link may be a name outside the workspace), never FIFOs, sockets or
//! devices, and they open with `O_NONBLOCK | O_NOCTTY`, so that opening a FIFO cannot block and a terminal is never
//! taken. Writes never follow a symlink in the last component of their path.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, File, FileTypeExt, Metadata, MetadataExt, OpenOptions, OpenOptionsExt};

use super::ToolError;
use crate::wire::ToolErrorCode;

/// At most this many symlinks are read while translating a path (as the kernel's own limit for one lookup).
const MAX_LINKS: usize = 40;

fn outside(message: impl Into<String>) -> ToolError {
    ToolError::new(ToolErrorCode::OutsideWorkspace, message)
}

/// A path from the model, checked without touching the file system: relative, never climbing above the workspace,
/// without NUL bytes. `..` is applied to the words of the path; the empty path is the workspace itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspacePath(PathBuf);

impl WorkspacePath {
    pub fn parse(relative: &str) -> Result<Self, ToolError> {
        if relative.contains('\0') {
            return Err(outside("A path may not contain NUL bytes."));
        }
        let mut normalized = PathBuf::new();
        for component in Path::new(relative).components() {
            match component {
                Component::Prefix(_) | Component::RootDir => {
                    return Err(outside(format!(
                        "{relative:?} is an absolute path. Use a path relative to the workspace."
                    )));
                }
                Component::CurDir => {}
                Component::ParentDir => {
                    if !normalized.pop() {
                        return Err(outside(format!(
                            "{relative:?} leaves the workspace. Use a path inside it."
                        )));
                    }
                }
                Component::Normal(part) => normalized.push(part),
            }
        }
        Ok(Self(normalized))
    }

    /// True for the workspace itself.
    pub fn is_workspace(&self) -> bool {
        self.0.as_os_str().is_empty()
    }

    /// The path to hand to the workspace's directory handle.
    fn beneath(&self) -> &Path {
        if self.is_workspace() {
            Path::new(".")
        } else {
            &self.0
        }
    }
}

/// The path as the model should see it: relative to the workspace, `.` for the workspace itself.
impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_workspace() {
            f.write_str(".")
        } else {
            write!(f, "{}", self.0.display())
        }
    }
}

/// What an I/O error on `path` means for the model.
pub(crate) fn io_failure(action: &str, path: &WorkspacePath, error: io::Error) -> ToolError {
    if is_escape(&error) {
        return outside(format!(
            "{:?} goes through a symlink that points outside the workspace; it is refused.",
            path.to_string()
        ));
    }
    match error.kind() {
        io::ErrorKind::NotFound => ToolError::new(
            ToolErrorCode::NotFound,
            format!("{:?} does not exist.", path.to_string()),
        ),
        _ => ToolError::failed(format!(
            "Could not {action} {:?}: {error}.",
            path.to_string()
        )),
    }
}

/// cap-std's refusal of a path that would leave its directory: `PermissionDenied` with no OS error behind it (a real
/// `EACCES` carries its errno).
fn is_escape(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied && error.raw_os_error().is_none()
}

/// Refuses what the file tools never touch: anything but a regular file, and a regular file with another name.
fn regular_with_one_link(meta: &Metadata, path: &WorkspacePath) -> Result<(), ToolError> {
    let shown = path.to_string();
    let kind = meta.file_type();
    let what = if kind.is_file() {
        let links = meta.nlink();
        if links > 1 {
            return Err(outside(format!(
                "{shown:?} has {links} hard links. Another name of the same file may be outside the workspace, so the file tools refuse files with more than one link."
            )));
        }
        return Ok(());
    } else if kind.is_dir() {
        return Err(ToolError::failed(format!(
            "{shown:?} is a directory; use list_files to see what it holds."
        )));
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    };
    Err(outside(format!(
        "{shown:?} is {what}, not a regular file; the file tools only touch regular files and directories."
    )))
}

/// What a preview found at a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Peek {
    Missing,
    /// A symbolic link (to somewhere inside the workspace, or to nothing).
    Link,
    /// A regular file: its first bytes, and its size.
    File {
        head: Vec<u8>,
        size: u64,
    },
}

/// The largest file whose content [`Workspace::state`] reads into its fingerprint: as much as a card's diff reads.
pub(crate) const STATE_CONTENT_BYTES: usize = super::preview::PREVIEW_READ_BYTES;

/// What [`Workspace::state`] says of an entry with `meta` and, when read, `content`.
fn fingerprint(meta: &Metadata, content: Option<&[u8]>) -> String {
    use sha2::Digest as _;
    let mut text = format!(
        "inode {} {} bytes, modified {}.{:09}, changed {}.{:09}",
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    );
    if let Some(content) = content {
        text.push_str(", content sha256 ");
        text.push_str(&hex::encode(sha2::Sha256::digest(content)));
    }
    text
}

#[derive(Clone, Debug)]
pub struct Workspace {
    /// The canonical workspace directory, for what needs a path (a command's working directory, the log).
    root: PathBuf,
    /// The workspace, opened once: every file operation is relative to it.
    dir: Arc<Dir>,
    /// The device the workspace is on, when its file system answers from this machine (see [`ANSWERED_HERE`]).
    local_device: Option<u64>,
}

/// The most a file may hold for its removal to be done on the calling task: the unlink of a file's last name frees
/// its blocks inside the call, which takes longer the more there are.
const QUICK_REMOVAL_BYTES: u64 = 1024 * 1024;

/// The types of file system (`statfs`'s `f_type`, from Linux's `magic.h`) whose calls this machine answers itself,
/// from a local disk or from memory: ext2/3/4, XFS, Btrfs, tmpfs, ramfs, overlayfs (a container's root), F2FS, ZFS
/// and bcachefs. Any other (NFS, SMB, FUSE, Ceph, 9p, one not known here) may wait on a network or on another
/// process for as long as it likes.
const ANSWERED_HERE: [u32; 9] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x8584_58F6,
    0x794C_7630,
    0xF2F5_2010,
    0x2FC1_2FC1,
    0xCA45_1A4E,
];

/// Whether a file system of type `kind` is one of [`ANSWERED_HERE`].
fn answered_here(kind: u64) -> bool {
    // The type is a 32-bit magic number in a field as wide as a C `long`.
    ANSWERED_HERE.contains(&((kind & 0xFFFF_FFFF) as u32))
}

/// Whether the file system `dir` is on answers from this machine (false when it cannot be told).
#[cfg(target_os = "linux")]
fn file_system_answered_here(dir: &Dir) -> bool {
    use std::os::fd::AsRawFd;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes a whole `statfs` into the buffer when it returns 0, and reads nothing from it.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: initialized by the successful call above.
    let stat = unsafe { stat.assume_init() };
    answered_here(stat.f_type as u64)
}

/// Elsewhere `f_type` does not hold Linux's numbers: never told.
#[cfg(not(target_os = "linux"))]
fn file_system_answered_here(_: &Dir) -> bool {
    false
}

impl Workspace {
    /// Opens (and creates, when missing) the workspace directory.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        std::fs::create_dir_all(path)?;
        let root = path.canonicalize()?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("workspace {} is not a directory", root.display()),
            ));
        }
        // The one use of ambient authority: from here on, nothing is opened by an absolute path.
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority())?;
        // (A workspace whose device cannot be read is only never quick.)
        let local_device = file_system_answered_here(&dir)
            .then(|| dir.dir_metadata().ok().map(|meta| meta.dev()))
            .flatten();
        Ok(Self {
            root,
            local_device,
            dir: Arc::new(dir),
        })
    }

    /// The canonical workspace directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The workspace directory as opened, for a command to start in (`fchdir`): the tree the file tools act on, even
    /// if its path has since been given to another directory.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.dir.as_raw_fd()
    }

    /// Whether the workspace's path still leads to the directory toolgate opened: not when it was moved, or
    /// replaced by another, since.
    pub(crate) fn path_leads_here(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let (Ok(by_path), Ok(opened)) = (std::fs::metadata(&self.root), self.dir.dir_metadata())
        else {
            return false;
        };
        by_path.dev() == opened.dev() && by_path.ino() == opened.ino()
    }

    /// Whether removing what `path` names takes a few microseconds, so that it may be done on the calling task: the
    /// workspace's file system answers from this machine, a local disk or memory (by its type when the workspace
    /// was opened; on any other, a network's or a FUSE process's, a call may hang), and what the path names now is
    /// on that same device (not on a file system mounted inside the workspace) and holds at most
    /// [`QUICK_REMOVAL_BYTES`]. Looks at the name (an `lstat`, on the calling task: a mount inside the workspace
    /// that hangs would hang it). A name that cannot be looked at is quick: its removal fails the same way at once.
    pub(crate) fn removes_quickly(&self, path: &WorkspacePath) -> bool {
        let Some(device) = self.local_device else {
            return false;
        };
        match self.beneath(path, FollowSymlinks::No, |p| self.dir.symlink_metadata(p)) {
            Ok(meta) => {
                meta.dev() == device && meta.blocks().saturating_mul(512) <= QUICK_REMOVAL_BYTES
            }
            Err(_) => true,
        }
    }

    /// The same workspace, taken for one on a file system that may hang.
    #[cfg(test)]
    pub(crate) fn seen_as_remote(mut self) -> Self {
        self.local_device = None;
        self
    }

    /// Opens a directory of the workspace to list it.
    pub(crate) fn open_dir(&self, path: &WorkspacePath) -> Result<Dir, ToolError> {
        self.beneath(path, FollowSymlinks::Yes, |p| self.dir.open_dir(p))
            .map_err(|error| io_failure("list", path, error))
    }

    /// Opens a file to read it: a regular file with one link, following symlinks only inside the workspace.
    pub(crate) fn open_file(&self, path: &WorkspacePath) -> Result<(File, Metadata), ToolError> {
        self.open_regular(path, FollowSymlinks::Yes)
    }

    /// Opens a regular file with one link to read it, without ever waiting (non-blocking, never a controlling
    /// terminal), checked on the descriptor; `follow` says whether a symlink in the last component is followed
    /// (within the workspace only).
    fn open_regular(
        &self,
        path: &WorkspacePath,
        follow: FollowSymlinks,
    ) -> Result<(File, Metadata), ToolError> {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .follow(follow)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = self
            .beneath(path, follow, |p| self.dir.open_with(p, &options))
            .map_err(|error| self.open_failure("read", path, error))?;
        let meta = file
            .metadata()
            .map_err(|error| io_failure("read", path, error))?;
        regular_with_one_link(&meta, path)?;
        Ok((file, meta))
    }

    /// Replaces a file's content with `content`, creating it and its parent directories when missing. What is
    /// there must be nothing, or a regular file with one link (never a link: a write does not go through one). The
    /// content goes to a new file beside it, which then takes the name in one rename: a write that fails (a full
    /// disk) leaves the old content whole, and a reader never sees half of the new. The new file keeps the old
    /// one's permissions.
    pub(crate) fn write_file(&self, path: &WorkspacePath, content: &[u8]) -> Result<(), ToolError> {
        if path.is_workspace() {
            return Err(ToolError::failed("The workspace itself is not a file."));
        }
        let link = || {
            outside(format!(
                "{:?} is a symbolic link; write_file does not write through links. Write to the path it points to.",
                path.to_string()
            ))
        };
        let permissions =
            match self.beneath(path, FollowSymlinks::No, |p| self.dir.symlink_metadata(p)) {
                Ok(meta) if meta.is_symlink() => return Err(link()),
                Ok(meta) => {
                    regular_with_one_link(&meta, path)?;
                    // A file this process may not write (read-only, another user's) stays as it is: the rename
                    // below needs only the directory's permission, so the file's own is asked first, by opening
                    // it to write (it is neither truncated nor followed).
                    let mut probe = OpenOptions::new();
                    probe
                        .write(true)
                        .follow(FollowSymlinks::No)
                        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
                    self.beneath(path, FollowSymlinks::No, |p| self.dir.open_with(p, &probe))
                        .map_err(|error| self.open_failure("write", path, error))?;
                    Some(meta.permissions())
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => None,
                Err(error) => return Err(io_failure("write", path, error)),
            };
        // The new file is made no more open than the old one (a new file as any other), so that nobody reads the
        // content of a private file while it is written.
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .follow(FollowSymlinks::No)
            .mode(
                permissions
                    .as_ref()
                    .map_or(0o666, |old| cap_std::fs::PermissionsExt::mode(old) & 0o777),
            );
        // Named apart from the file (whose name may be as long as a name can be), and hidden.
        let temporary_name = format!(".toolgate-write-{}", uuid::Uuid::new_v4().simple());
        let written = self.beneath(path, FollowSymlinks::No, |p| {
            let temporary = p.with_file_name(&temporary_name);
            let mut file = match self.dir.open_with(&temporary, &options) {
                // Parents are created only once the open says they are missing: creating them first would hide an
                // escape behind "already exists".
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    if let Some(parent) = p.parent() {
                        self.dir.create_dir_all(parent)?;
                    }
                    self.dir.open_with(&temporary, &options)?
                }
                opened => opened?,
            };
            let replaced = (|| {
                if let Some(permissions) = &permissions {
                    file.set_permissions(permissions.clone())?;
                }
                file.write_all(content)?;
                self.dir.rename(&temporary, &self.dir, p)
            })();
            if replaced.is_err() {
                let _ = self.dir.remove_file(&temporary);
            }
            replaced
        });
        written.map_err(|error| {
            let failure = io_failure("write", path, error);
            if permissions.is_some() && failure.code == ToolErrorCode::ToolFailed {
                ToolError::failed(format!(
                    "{} The file keeps its old content.",
                    failure.message
                ))
            } else {
                failure
            }
        })
    }

    /// Deletes a file, or a symlink (never what it points to). A symlink that leads outside the workspace, a
    /// directory and anything the file tools do not touch are refused.
    pub(crate) fn remove_file(&self, path: &WorkspacePath) -> Result<(), ToolError> {
        let meta = self
            .beneath(path, FollowSymlinks::No, |p| self.dir.symlink_metadata(p))
            .map_err(|error| io_failure("delete", path, error))?;
        if meta.is_dir() {
            return Err(ToolError::failed(format!(
                "{:?} is a directory; delete_file deletes files only.",
                path.to_string()
            )));
        }
        if meta.is_symlink() {
            match self.beneath(path, FollowSymlinks::Yes, |p| self.dir.metadata(p)) {
                Err(error) if is_escape(&error) => return Err(io_failure("delete", path, error)),
                // A link to something inside, or to nothing inside: removing the link touches nothing else.
                _ => {}
            }
        } else {
            regular_with_one_link(&meta, path)?;
        }
        // The name could be swapped between the check and the unlink; the unlink is still beneath the workspace and
        // only ever removes a name, so nothing outside loses content.
        self.beneath(path, FollowSymlinks::No, |p| self.dir.remove_file(p))
            .map_err(|error| io_failure("delete", path, error))
    }

    /// A fingerprint of what is at `path` now (not following a symlink in its last component): nothing, or an entry
    /// by its inode, size, and the times of its last change of content and of anything about it (the second no call
    /// can set back), and for a file of at most [`STATE_CONTENT_BYTES`], a digest of its content. A file written,
    /// replaced or deleted since reads differently: the content's digest catches a rewrite of the same size within
    /// one tick of a file system's clock, which on many kernels is a few milliseconds. Not its device: instances that
    /// share the workspace on a network volume each number it their own way, as a mount may after a restart.
    pub(crate) fn state(&self, path: &WorkspacePath) -> String {
        match self.beneath(path, FollowSymlinks::No, |p| self.dir.symlink_metadata(p)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => "missing".to_owned(),
            Err(error) => format!("unreadable: {}", error.kind()),
            Ok(meta) => {
                let content = (meta.is_file() && meta.len() <= STATE_CONTENT_BYTES as u64)
                    .then(|| self.peek(path, STATE_CONTENT_BYTES))
                    .and_then(|peeked| match peeked {
                        Ok(Peek::File { head, size }) if head.len() as u64 == size => Some(head),
                        _ => None,
                    });
                fingerprint(&meta, content.as_deref())
            }
        }
    }

    /// What is at `path` now, for a preview of a call that would write or delete it: read at most `limit` bytes of
    /// it. Confined like every other operation, and it never waits: anything but a regular file with one link is
    /// refused from its metadata before any open, and the open itself is non-blocking and checked again on the
    /// descriptor (the name may have changed in between). A symlink in the last component is reported, not followed,
    /// unless it leads outside the workspace, which is refused.
    pub(crate) fn peek(&self, path: &WorkspacePath, limit: usize) -> Result<Peek, ToolError> {
        if path.is_workspace() {
            return Err(ToolError::failed("The workspace itself is not a file."));
        }
        let meta = match self.beneath(path, FollowSymlinks::No, |p| self.dir.symlink_metadata(p)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Peek::Missing),
            Err(error) => return Err(io_failure("read", path, error)),
            Ok(meta) => meta,
        };
        if meta.is_symlink() {
            return match self.beneath(path, FollowSymlinks::Yes, |p| self.dir.metadata(p)) {
                Err(error) if is_escape(&error) => Err(io_failure("read", path, error)),
                _ => Ok(Peek::Link),
            };
        }
        regular_with_one_link(&meta, path)?;
        let (file, meta) = self.open_regular(path, FollowSymlinks::No)?;
        let mut head = Vec::new();
        io::Read::read_to_end(&mut io::Read::take(file, limit as u64), &mut head)
            .map_err(|error| io_failure("read", path, error))?;
        Ok(Peek::File {
            head,
            size: meta.len(),
        })
    }

    /// Explains an open that failed: a socket cannot be opened at all (`ENXIO`), and neither can a FIFO for writing
    /// while nobody reads it; say what the path names rather than quote the errno.
    fn open_failure(&self, action: &str, path: &WorkspacePath, error: io::Error) -> ToolError {
        if error.raw_os_error() == Some(libc::ENXIO)
            && let Ok(meta) = self.beneath(path, FollowSymlinks::Yes, |p| self.dir.metadata(p))
            && let Err(refused) = regular_with_one_link(&meta, path)
        {
            return refused;
        }
        io_failure(action, path, error)
    }

    /// Runs `operation` on `path` beneath the workspace. When cap-std refuses the path as an escape, it may still go
    /// through an absolute symlink that names a place inside the workspace by its full path (what
    /// `ln -s "$PWD/docs" link` makes); such links are translated into the relative path they stand for and the
    /// operation runs once more, as confined as the first time. The translation grants nothing: it only reads links.
    fn beneath<T>(
        &self,
        path: &WorkspacePath,
        follow_last: FollowSymlinks,
        operation: impl Fn(&Path) -> io::Result<T>,
    ) -> io::Result<T> {
        match operation(path.beneath()) {
            Err(error) if is_escape(&error) => {
                match self.translate_absolute_links(path.beneath(), follow_last) {
                    Some(translated) if translated.as_os_str().is_empty() => {
                        operation(Path::new("."))
                    }
                    Some(translated) => operation(&translated),
                    None => Err(error),
                }
            }
            other => other,
        }
    }

    /// `path` with its symlinks resolved by reading them, when at least one is absolute and names the workspace
    /// itself; `None` when a link leads elsewhere, a `..` climbs out, or no absolute link was involved.
    fn translate_absolute_links(
        &self,
        path: &Path,
        follow_last: FollowSymlinks,
    ) -> Option<PathBuf> {
        fn push_reversed(pending: &mut Vec<OsString>, path: &Path) {
            for component in path.components().rev() {
                match component {
                    Component::Normal(part) => pending.push(part.to_owned()),
                    Component::ParentDir => pending.push("..".into()),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
        }

        let mut pending = Vec::new();
        push_reversed(&mut pending, path);
        let mut resolved = PathBuf::new();
        let mut links = 0;
        let mut through_absolute = false;
        while let Some(part) = pending.pop() {
            if part == ".." {
                if !resolved.pop() {
                    return None;
                }
                continue;
            }
            let candidate = resolved.join(&part);
            if pending.is_empty() && follow_last == FollowSymlinks::No {
                resolved = candidate;
                break;
            }
            match self.dir.symlink_metadata(&candidate) {
                Ok(meta) if meta.is_symlink() => {
                    links += 1;
                    if links > MAX_LINKS {
                        return None;
                    }
                    let target = self.dir.read_link_contents(&candidate).ok()?;
                    if target.has_root() {
                        let inside = target.strip_prefix(&self.root).ok()?;
                        through_absolute = true;
                        resolved = PathBuf::new();
                        push_reversed(&mut pending, inside);
                    } else {
                        // Relative to the link's own directory, which is what `resolved` holds.
                        push_reversed(&mut pending, &target);
                    }
                }
                _ => resolved = candidate,
            }
        }
        through_absolute.then_some(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Two contents of one size under one inode and one set of times (a rewrite within one tick of a coarse clock)
    /// read as two states: the fingerprint holds a digest of the content. Before, they read as one, and a call
    /// approved on the first content ran on the second.
    #[test]
    fn a_same_size_rewrite_within_one_clock_tick_reads_as_another_state() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), "a = 1\n").unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let meta = workspace.dir.symlink_metadata("config.toml").unwrap();
        assert_ne!(
            fingerprint(&meta, Some(b"a = 1\n")),
            fingerprint(&meta, Some(b"a = 2\n"))
        );
        let path = WorkspacePath::parse("config.toml").unwrap();
        assert_eq!(
            workspace.state(&path),
            fingerprint(&meta, Some(b"a = 1\n")),
            "a small file's state holds its content"
        );
    }

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path().join("ws")).unwrap();
        (dir, workspace)
    }

    fn path(relative: &str) -> WorkspacePath {
        WorkspacePath::parse(relative).unwrap()
    }

    fn read(ws: &Workspace, relative: &str) -> Result<String, ToolError> {
        let (mut file, _) = ws.open_file(&path(relative))?;
        let mut content = String::new();
        file.read_to_string(&mut content).unwrap();
        Ok(content)
    }

    fn write(ws: &Workspace, relative: &str, content: &str) -> Result<(), ToolError> {
        ws.write_file(&path(relative), content.as_bytes())
    }

    /// Runs the test `name` of this module again in a process of its own, with `CHILD` set, and checks that it ran
    /// and passed there. Returns true in that process, where the test does its work.
    fn in_own_process(name: &str) -> bool {
        const CHILD: &str = "TOOLGATE_TEST_IN_OWN_PROCESS";
        if std::env::var_os(CHILD).is_some() {
            return true;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &format!("tools::workspace::tests::{name}"),
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("test result: ok. 1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        false
    }

    /// A write that fails part of the way (here past the process's limit on a file's size, as a full disk would)
    /// leaves the file's old content whole, and nothing beside it. Run in a process of its own, which alone has
    /// that limit.
    #[test]
    fn a_write_that_fails_leaves_the_old_content() {
        if !in_own_process("a_write_that_fails_leaves_the_old_content") {
            return;
        }
        let (_dir, ws) = workspace();
        write(&ws, "keep.txt", "the old content").unwrap();
        // SAFETY: getrlimit, setrlimit and signal change only this process, which runs this test alone.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
            limit.rlim_cur = 4_096;
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
        }
        let error = write(&ws, "keep.txt", &"new ".repeat(10_000)).unwrap_err();
        assert!(
            error.message.contains("The file keeps its old content."),
            "{error}"
        );
        assert_eq!(read(&ws, "keep.txt").unwrap(), "the old content");
        let names: Vec<_> = std::fs::read_dir(ws.root())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["keep.txt"]);
    }

    /// A file this process may not write (read-only) is refused, as when it was written in place: the rename that
    /// replaces a file needs only the directory's permission. Run as an unprivileged user (nobody, when the tests
    /// run as root, who may write anything), in a process of its own. A private file stays private.
    #[test]
    fn a_file_the_process_may_not_write_is_refused_and_modes_are_kept() {
        use std::os::unix::fs::PermissionsExt;
        if !in_own_process("a_file_the_process_may_not_write_is_refused_and_modes_are_kept") {
            return;
        }
        // SAFETY: setgroups, setgid and setuid change only this process, which runs this test alone.
        unsafe {
            if libc::geteuid() == 0 {
                assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
                assert_eq!(libc::setgid(65_534), 0);
                assert_eq!(libc::setuid(65_534), 0);
            }
        }
        let (_dir, ws) = workspace();
        let mode = |name: &str| {
            std::fs::metadata(ws.root().join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        write(&ws, "locked.txt", "the old content").unwrap();
        let read_only = std::fs::Permissions::from_mode(0o444);
        std::fs::set_permissions(ws.root().join("locked.txt"), read_only).unwrap();
        let error = write(&ws, "locked.txt", "new").unwrap_err();
        assert!(error.message.contains("ermission denied"), "{error}");
        assert_eq!(read(&ws, "locked.txt").unwrap(), "the old content");
        assert_eq!(mode("locked.txt"), 0o444);

        write(&ws, "private.txt", "old").unwrap();
        let private = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(ws.root().join("private.txt"), private).unwrap();
        write(&ws, "private.txt", "new").unwrap();
        assert_eq!(read(&ws, "private.txt").unwrap(), "new");
        assert_eq!(mode("private.txt"), 0o600);
    }

    #[test]
    fn local_file_systems_are_told_from_those_that_may_hang() {
        // ext4, XFS, tmpfs, overlayfs; a wide field whose upper half is set (a sign-extended `long`) still reads.
        for kind in [
            0xEF53,
            0x5846_5342,
            0x0102_1994,
            0x794C_7630,
            0xFFFF_FFFF_9123_683E,
        ] {
            assert!(answered_here(kind), "{kind:#x}");
        }
        // NFS, SMB2, CIFS, FUSE, Ceph, 9p, and nothing at all.
        for kind in [
            0x6969,
            0xFE53_4D42,
            0xFF53_4D42,
            0x6573_5546,
            0x00C3_6400,
            0x0102_1997,
            0,
        ] {
            assert!(!answered_here(kind), "{kind:#x}");
        }
    }

    /// (Linux only: elsewhere no file system is told local.)
    #[cfg(target_os = "linux")]
    #[test]
    fn only_a_small_file_on_the_workspaces_own_local_device_is_removed_quickly() {
        let (_dir, workspace) = workspace();
        write(&workspace, "small.txt", "a few bytes").unwrap();
        write(&workspace, "large.bin", &"x".repeat(4 * 1024 * 1024)).unwrap();
        assert!(
            workspace.removes_quickly(&path("small.txt")),
            "the temporary directory is on a local file system"
        );
        assert!(
            workspace.removes_quickly(&path("missing.txt")),
            "fails at once"
        );
        assert!(
            !workspace.removes_quickly(&path("large.bin")),
            "its blocks are freed inside the unlink"
        );
        let remote = workspace.seen_as_remote();
        assert!(!remote.removes_quickly(&path("small.txt")));
    }

    #[test]
    fn paths_are_normalized_and_shown_relative() {
        assert_eq!(path("a.txt").to_string(), "a.txt");
        assert_eq!(path("docs/../a.txt").to_string(), "a.txt");
        assert_eq!(path("./docs//b.txt").to_string(), "docs/b.txt");
        assert!(path("").is_workspace());
        assert!(path("./").is_workspace());
        assert_eq!(path("").to_string(), ".");
    }

    #[test]
    fn parent_and_absolute_paths_are_refused() {
        for relative in ["..", "../secret", "a/../../b", "/etc/passwd", "a\0b"] {
            let error = WorkspacePath::parse(relative).unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{relative:?}");
        }
        assert!(
            WorkspacePath::parse("/etc/passwd")
                .unwrap_err()
                .message
                .contains("absolute")
        );
    }

    #[test]
    fn symlinks_pointing_out_are_refused_and_inside_ones_work() {
        let (dir, ws) = workspace();
        let outside_dir = dir.path().join("outside");
        std::fs::create_dir(&outside_dir).unwrap();
        std::fs::write(outside_dir.join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(&outside_dir, ws.root().join("escape")).unwrap();
        std::os::unix::fs::symlink("../outside", ws.root().join("climb")).unwrap();
        std::os::unix::fs::symlink(outside_dir.join("gone"), ws.root().join("dangling")).unwrap();
        std::fs::create_dir(ws.root().join("inner")).unwrap();
        // Absolute (by the workspace's own path) and relative links that stay inside.
        std::os::unix::fs::symlink(ws.root().join("inner"), ws.root().join("alias")).unwrap();
        std::os::unix::fs::symlink("inner", ws.root().join("relative")).unwrap();

        for relative in [
            "escape/secret.txt",
            "climb/secret.txt",
            "dangling",
            "escape/new.txt",
        ] {
            let error = read(&ws, relative).unwrap_err();
            assert_eq!(
                error.code,
                ToolErrorCode::OutsideWorkspace,
                "{relative}: {error}"
            );
            let error = write(&ws, relative, "x").unwrap_err();
            assert_eq!(
                error.code,
                ToolErrorCode::OutsideWorkspace,
                "{relative}: {error}"
            );
        }
        for relative in ["escape", "climb", "dangling"] {
            let error = ws.open_dir(&path(relative)).unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{relative}");
            let error = ws.remove_file(&path(relative)).unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{relative}");
        }
        assert!(!outside_dir.join("new.txt").exists());
        assert_eq!(
            std::fs::read_to_string(outside_dir.join("secret.txt")).unwrap(),
            "s"
        );

        write(&ws, "alias/file.txt", "through the absolute link").unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.root().join("inner/file.txt")).unwrap(),
            "through the absolute link"
        );
        assert_eq!(
            read(&ws, "relative/file.txt").unwrap(),
            "through the absolute link"
        );
        assert!(ws.open_dir(&path("alias")).is_ok());
        std::os::unix::fs::symlink(ws.root().join("inner/file.txt"), ws.root().join("last"))
            .unwrap();
        assert_eq!(read(&ws, "last").unwrap(), "through the absolute link");
        ws.remove_file(&path("alias")).unwrap();
        assert!(
            ws.root().join("inner/file.txt").exists(),
            "only the link went"
        );
    }

    #[test]
    fn a_write_does_not_follow_a_symlink_in_its_last_component() {
        let (_dir, ws) = workspace();
        std::fs::write(ws.root().join("real.txt"), "kept").unwrap();
        std::os::unix::fs::symlink("real.txt", ws.root().join("link.txt")).unwrap();
        std::os::unix::fs::symlink("missing.txt", ws.root().join("dangling.txt")).unwrap();
        for relative in ["link.txt", "dangling.txt"] {
            let error = write(&ws, relative, "changed").unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{relative}");
            assert!(error.message.contains("symbolic link"), "{}", error.message);
        }
        assert_eq!(
            std::fs::read_to_string(ws.root().join("real.txt")).unwrap(),
            "kept"
        );
        assert!(!ws.root().join("missing.txt").exists());
    }
}
