//! The workspace directory the built-in tools are confined to.
//!
//! A path from the model is refused when it is absolute, when its `..` components climb above the workspace, or
//! when any existing component along it is a symlink that resolves outside the workspace (or nowhere: a dangling
//! link could be followed by a write). The check walks the path component by component, so a link in the middle
//! of a path is caught as well as one at its end.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::ToolError;
use crate::wire::ToolErrorCode;

#[derive(Clone, Debug)]
pub struct Workspace {
    root: PathBuf,
}

fn outside(message: impl Into<String>) -> ToolError {
    ToolError::new(ToolErrorCode::OutsideWorkspace, message)
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
        Ok(Self { root })
    }

    /// The canonical workspace directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a path relative to the workspace, refusing any that leaves it. An empty path or `.` is the
    /// workspace itself.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, ToolError> {
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

        // Walk the existing prefix; every symlink on it must resolve inside the workspace.
        let mut current = self.root.clone();
        for part in normalized.components() {
            current.push(part);
            match std::fs::symlink_metadata(&current) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target = current.canonicalize().map_err(|_| {
                        outside(format!(
                            "{relative:?} goes through a symlink that points nowhere; it is refused."
                        ))
                    })?;
                    if !target.starts_with(&self.root) {
                        return Err(outside(format!(
                            "{relative:?} goes through a symlink that points outside the workspace."
                        )));
                    }
                }
                Ok(_) => {}
                // Nothing exists from here on: the rest is created fresh, inside.
                Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                Err(error) => {
                    return Err(ToolError::failed(format!(
                        "cannot inspect {relative:?}: {error}"
                    )));
                }
            }
        }
        Ok(self.root.join(normalized))
    }

    /// The path as the model should see it: relative to the workspace.
    pub fn display(&self, path: &Path) -> String {
        let relative = path.strip_prefix(&self.root).unwrap_or(path);
        if relative.as_os_str().is_empty() {
            ".".to_owned()
        } else {
            relative.display().to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path().join("ws")).unwrap();
        (dir, workspace)
    }

    #[test]
    fn paths_inside_resolve() {
        let (_dir, ws) = workspace();
        assert_eq!(ws.resolve("a.txt").unwrap(), ws.root().join("a.txt"));
        assert_eq!(
            ws.resolve("docs/../a.txt").unwrap(),
            ws.root().join("a.txt")
        );
        assert_eq!(ws.resolve("").unwrap(), ws.root());
        assert_eq!(ws.resolve("./").unwrap(), ws.root());
    }

    #[test]
    fn parent_and_absolute_paths_are_refused() {
        let (_dir, ws) = workspace();
        for path in ["..", "../secret", "a/../../b", "/etc/passwd"] {
            let error = ws.resolve(path).unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{path}");
        }
        assert!(
            ws.resolve("/etc/passwd")
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
        std::os::unix::fs::symlink(outside_dir.join("gone"), ws.root().join("dangling")).unwrap();
        std::fs::create_dir(ws.root().join("inner")).unwrap();
        std::os::unix::fs::symlink(ws.root().join("inner"), ws.root().join("alias")).unwrap();

        for path in ["escape", "escape/secret.txt", "escape/new.txt", "dangling"] {
            let error = ws.resolve(path).unwrap_err();
            assert_eq!(error.code, ToolErrorCode::OutsideWorkspace, "{path}");
        }
        assert!(ws.resolve("alias/file.txt").is_ok());
    }
}
