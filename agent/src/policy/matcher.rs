//! What an argument matcher looks at: a `run_command` call's argv, a file tool's path as it resolves inside the
//! workspace, a named argument's value; and the globs that match them.
//!
//! Every matcher reads *candidates*: the values a call stands for. A path that goes through a symlink stands for
//! two (the path as written, normalised, and where the link leads); an array argument stands for each element. A
//! `deny` or `ask` rule matches when its glob matches **any** candidate, an `allow` rule only when it matches
//! **every** candidate: whichever way a call could be read, it never slips past a deny and never rides an allow it
//! does not fully fit.

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde_json::Value;

/// The built-in tool that runs programs; its matcher is a prefix of the argv.
pub const COMMAND_TOOL: &str = "run_command";

/// The file tool that lists a directory.
pub const LIST_TOOL: &str = "list_files";

/// The built-in tools whose `path` argument names a file or directory in the workspace.
pub const FILE_TOOLS: [&str; 4] = [LIST_TOOL, "read_file", "write_file", "delete_file"];

/// Programs that run other programs: shells, wrappers, interpreters, programs with an option or a command that runs
/// one, and build tools and package managers, which run a project's own scripts. A prefix rule that does not name
/// one never matches a call of it (the argv's first word must equal the rule's), a session grant never covers one
/// with "any arguments", and while a `deny` rule restricts `run_command`, a call of one asks, because what it runs
/// cannot be read from its argv. Names are compared in lower case, and without a version
/// ([`is_program_runner`]).
pub const PROGRAM_RUNNERS: &[&str] = &[
    // Shells.
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "lksh",
    "oksh",
    "pdksh",
    "ash",
    "yash",
    "posh",
    "fish",
    "csh",
    "tcsh",
    "nu",
    "xonsh",
    "elvish",
    "busybox",
    "toybox",
    "rbash",
    // Wrappers that run the rest of their argv.
    "env",
    "nice",
    "nohup",
    "timeout",
    "stdbuf",
    "xargs",
    "sudo",
    "doas",
    "su",
    "runuser",
    "pkexec",
    "sg",
    "newgrp",
    "setsid",
    "setpriv",
    "prlimit",
    "numactl",
    "setarch",
    "linux32",
    "linux64",
    "capsh",
    "runcon",
    "cgexec",
    "chpst",
    "unbuffer",
    "xvfb-run",
    "systemd-nspawn",
    "chroot",
    "unshare",
    "nsenter",
    "bwrap",
    "proot",
    "fakeroot",
    "faketime",
    "flock",
    "ionice",
    "chrt",
    "taskset",
    "time",
    "watch",
    "entr",
    "script",
    "screen",
    "tmux",
    "exec",
    "command",
    "builtin",
    "eval",
    "parallel",
    "strace",
    "ltrace",
    "gdb",
    "valgrind",
    "perf",
    "catchsegv",
    "firejail",
    "systemd-run",
    "start-stop-daemon",
    "daemonize",
    "dbus-launch",
    "ssh-agent",
    "torsocks",
    "proxychains",
    "at",
    "batch",
    "crontab",
    "xterm",
    "systemd-cat",
    "choom",
    "uclampset",
    // Programs with an option or a command that runs a program: `find -exec`, git's aliases, hooks and `-c`
    // settings, GNU sed's `e`, ed's and the editors' `!`, `tar --to-command`, `rsync -e`, `rg --pre`, `sort
    // --compress-program`, `zip -TT`, `wget --use-askpass`, `man -P`, less's `+!`, the database shells' `.shell`
    // and `\!`, a container's command, a remote shell's command.
    "find",
    "fd",
    "fdfind",
    "git",
    "gh",
    "hg",
    "m4",
    "dc",
    "lldb",
    "sed",
    "ed",
    "patch",
    "vi",
    "vim",
    "nvim",
    "view",
    "ex",
    "emacs",
    "less",
    "more",
    "man",
    "tar",
    "rsync",
    "rg",
    "sort",
    "zip",
    "wget",
    "ssh",
    "scp",
    "sftp",
    "nc",
    "ncat",
    "socat",
    "expect",
    "sqlite3",
    "psql",
    "mysql",
    "docker",
    "podman",
    "kubectl",
    "bsdtar",
    "mariadb",
    "duckdb",
    "svn",
    "lftp",
    "yt-dlp",
    "youtube-dl",
    // Compilers: `gcc -wrapper sh,-c,...`, `rustc -C linker=...`.
    "cc",
    "c++",
    "gcc",
    "g++",
    "clang",
    "clang++",
    "rustc",
    // Build tools and package managers: they run the project's build scripts, tasks and hooks.
    "make",
    "just",
    "cmake",
    "ninja",
    "meson",
    "cargo",
    "go",
    "npm",
    "npx",
    "pnpm",
    "pnpx",
    "yarn",
    "yarnpkg",
    "corepack",
    "bunx",
    "pip",
    "pipx",
    "pipenv",
    "pdm",
    "hatch",
    "conda",
    "mamba",
    "nix",
    "apt",
    "apt-get",
    "dpkg",
    "uv",
    "uvx",
    "poetry",
    "tox",
    "nox",
    "gem",
    "bundle",
    "rake",
    "composer",
    "mvn",
    "mvnw",
    "gradle",
    "gradlew",
    "ant",
    "bazel",
    "dotnet",
    "rustup",
    "nix-shell",
    // Interpreters that run code given as an argument or a file.
    "python",
    "pypy",
    "micropython",
    "jython",
    "ipython",
    "perl",
    "ruby",
    "jruby",
    "irb",
    "node",
    "nodejs",
    "ts-node",
    "tsx",
    "deno",
    "bun",
    "php",
    "php-cgi",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "java",
    "jshell",
    "groovy",
    "scala",
    "kotlin",
    "swift",
    "julia",
    "r",
    "rscript",
    "octave",
    "gnuplot",
    "ghci",
    "runghc",
    "runhaskell",
    "erl",
    "escript",
    "elixir",
    "iex",
    "guile",
    "racket",
    "sbcl",
    "clisp",
    "ocaml",
    "osascript",
    "pwsh",
    "powershell",
];

/// The kind of arguments a tool takes, as far as rules are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolKind {
    /// `run_command`: a program and its arguments.
    Command,
    /// A built-in file tool: a `path` inside the workspace.
    WorkspaceFile,
    /// Anything else, MCP tools included: named arguments only.
    Other,
}

impl ToolKind {
    pub fn of(tool_name: &str) -> Self {
        if tool_name == COMMAND_TOOL {
            Self::Command
        } else if FILE_TOOLS.contains(&tool_name) {
            Self::WorkspaceFile
        } else {
            Self::Other
        }
    }
}

/// The last component of a program path: `rm` for `/bin/rm`.
pub fn basename(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// True when `program` (by its name, whatever its directory) runs other programs. The name is read in lower case
/// (`SH` is `sh` where file names ignore case) and also without a version at its end ([`unversioned`]), so
/// `python3.12`, `python3.7m`, `python3.13t`, `pip3`, `pypy3`, `node-20` and Debian's `perl5.36-x86_64-linux-gnu`
/// are what they run, while `man2html` or `zip2john` are not `man` or `zip`; and in the other spellings packagers
/// give a program ([`spellings`]). A dynamic loader (`ld-linux-x86-64.so.2 /bin/rm x`) runs the program it is given.
/// Every reading can only make a call stricter.
pub fn is_program_runner(program: &str) -> bool {
    let name = basename(program).to_lowercase();
    let loader = (name.starts_with("ld-") && name.contains(".so")) || name.starts_with("ld.so");
    loader
        || spellings(&name).any(|spelling| {
            PROGRAM_RUNNERS.contains(&spelling) || PROGRAM_RUNNERS.contains(&unversioned(spelling))
        })
}

/// `name`, and the program it names as packagers spell it: without a build's suffix (`bash-static`,
/// `python3.12-dbg`, MinGW's `-posix` and `-win32` threads), before a first `.` (Debian's `vim.basic` and `vim.tiny`), as the GNU tool that macOS's
/// Homebrew installs with a `g` in front ([`GNU_RENAMED`]: `gsed`, `gmake`; not `gzip`, which is no `zip`), and
/// without a cross toolchain's target ([`without_target`]: `x86_64-linux-gnu-gcc-12`).
fn spellings(name: &str) -> impl Iterator<Item = &str> {
    let built = ["-static", "-dbg", "-posix", "-win32"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    let before_dot = built.split('.').next().filter(|part| !part.is_empty());
    let gnu = built
        .strip_prefix('g')
        .filter(|rest| GNU_RENAMED.contains(&unversioned(rest)));
    [Some(name), Some(built), before_dot, gnu]
        .into_iter()
        .flatten()
        .chain(without_target(built))
}

/// The names a cross toolchain's program may have after its target: `gcc-12` (then `12`) for
/// `x86_64-linux-gnu-gcc-12`, `gcc` for `arm-none-eabi-gcc` and `avr-gcc`, `gdb` for `aarch64-linux-gnu-gdb`. A
/// target starts with an architecture ([`ARCHITECTURES`]), and each name after it is read, as where the target ends
/// is not marked; a compiler ([`COMPILERS`]) is read after any target at all (`xtensa-esp32-elf-gcc`).
fn without_target(name: &str) -> impl Iterator<Item = &str> {
    let targeted = name.split_once('-').is_some_and(|(architecture, _)| {
        ARCHITECTURES
            .iter()
            .any(|known| architecture.starts_with(known))
    });
    name.match_indices('-')
        .map(move |(at, _)| &name[at + 1..])
        .filter(move |rest| targeted || COMPILERS.contains(&unversioned(rest)))
}

/// The compilers among the programs that run others (`gcc -wrapper`, `rustc -C linker`), which cross toolchains
/// install with a target in front.
const COMPILERS: &[&str] = &["cc", "c++", "gcc", "g++", "clang", "clang++", "rustc"];

/// How the architectures a GNU target triplet starts with begin (`armv7l` and `armhf` are `arm`'s, `mips64el`
/// `mips`'s).
const ARCHITECTURES: &[&str] = &[
    "x86_64",
    "amd64",
    "i386",
    "i486",
    "i586",
    "i686",
    "aarch64",
    "arm",
    "riscv",
    "mips",
    "powerpc",
    "ppc",
    "s390",
    "sparc",
    "loongarch",
    "m68k",
    "hppa",
    "ia64",
    "alpha",
    "avr",
    "xtensa",
    "wasm32",
    "wasm64",
    "sh",
    "arc",
    "or1k",
    "msp430",
    "bpf",
    "nios2",
    "csky",
    "microblaze",
    "hexagon",
];

/// The GNU tools that run programs and that Homebrew installs under a `g` name beside the system's own.
const GNU_RENAMED: &[&str] = &[
    "sed", "make", "find", "xargs", "env", "timeout", "tar", "sort", "time", "m4", "patch", "nice",
    "nohup", "stdbuf", "chroot", "awk", "vim", "view", "ed",
];

/// `name` without a version at its end: digits in dot- or underscore-separated groups after an optional `-`, `_`
/// or `.`, then at most a pre-release tag (`3.7m`, `1.21rc2`, `2.1.0-beta3`) and a platform (`-x86_64-linux-gnu`).
/// The name itself when it ends otherwise (`man2html`: `html` is no tag).
fn unversioned(name: &str) -> &str {
    let bytes = name.as_bytes();
    // The first digit that starts a version reaching the end is where the version begins. (A digit is one byte of
    // its own in UTF-8, so the slices fall between characters.)
    for (start, &byte) in bytes.iter().enumerate() {
        if start > 0
            && byte.is_ascii_digit()
            && !bytes[start - 1].is_ascii_digit()
            && is_version(&name[start..])
        {
            return name[..start].trim_end_matches(['-', '_', '.']);
        }
    }
    name
}

/// Whether `tail` (which starts with a digit) is a version and nothing else: `3`, `3.12`, `3.7m`, `1.21rc2`,
/// `2.1.0-beta3`, `5.36-x86_64-linux-gnu`.
fn is_version(tail: &str) -> bool {
    let (version, rest) = match tail.split_once('-') {
        Some((version, rest)) => (version, Some(rest)),
        None => (tail, None),
    };
    let end = version
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(version.len());
    let (numbers, tag) = version.split_at(end);
    let numeric = !numbers.is_empty()
        && numbers
            .split(['.', '_'])
            .all(|group| !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()));
    numeric
        && (tag.is_empty() || is_prerelease(tag))
        && rest.is_none_or(|rest| {
            rest.split('-').all(is_prerelease)
                || rest.contains("linux")
                || rest.contains("gnu")
                || rest.contains("darwin")
        })
}

/// A pre-release or build tag: `m`, `a1`, `b2`, `rc2`, `beta3`, `alpha`, `pre`, `dev`, and Python's `t` (free-threaded)
/// and `d` (debug).
fn is_prerelease(tag: &str) -> bool {
    let word = tag.trim_end_matches(|c: char| c.is_ascii_digit());
    matches!(
        word,
        "a" | "b" | "m" | "t" | "d" | "rc" | "alpha" | "beta" | "pre" | "dev"
    )
}

/// The argv of a `run_command` input: the program, then its arguments. `None` when the input does not have that
/// shape (such a call is refused by the tool's schema before anything runs).
pub fn argv(input: &Value) -> Option<Vec<&str>> {
    let command = input.get("command")?.as_str()?;
    let mut argv = vec![command];
    match input.get("args") {
        None | Some(Value::Null) => {}
        Some(Value::Array(args)) => {
            for arg in args {
                argv.push(arg.as_str()?);
            }
        }
        Some(_) => return None,
    }
    Some(argv)
}

/// A path relative to the workspace, normalised lexically: `.` dropped, `..` applied, `/`-separated, `""` for the
/// workspace itself. `None` for an absolute path, one that climbs above the workspace, or one with a NUL byte:
/// the file tools refuse those before anything runs.
pub fn normalize_relative(path: &str) -> Option<String> {
    if path.contains('\0') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Prefix(_) | Component::RootDir => return None,
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(part) => parts.push(part.to_str()?),
        }
    }
    Some(parts.join("/"))
}

/// How paths are read for rules: lexically only, or also through the workspace's symlinks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathContext {
    /// The canonical workspace directory, when there is one to look into.
    root: Option<PathBuf>,
    /// True when the workspace's file system ignores case: path globs then ignore it too, so `.ENV` is `.env`.
    case_insensitive: bool,
}

impl PathContext {
    /// Whether `program`, as `run_command` runs it (from the workspace), may name a file in the workspace: a path
    /// relative to it (`./build.sh`, `scripts/test`), an absolute one inside it (as written, or where it leads), one
    /// that leads nowhere yet (the file tools may make it), or one that reads differently in the command's process
    /// than here (`/proc/self/cwd/build.sh` is the workspace's there). Such a file is what the file tools write, so
    /// what it runs can change after any approval of it. (A bare name is looked up on a `PATH` that leaves the
    /// workspace out; with no workspace to look into, every path is taken for one in it.)
    pub fn runs_workspace_file(&self, program: &str) -> bool {
        if !program.contains('/') {
            return false;
        }
        let path = Path::new(program);
        if path.is_relative() || path.starts_with("/proc") || path.starts_with("/dev/fd") {
            return true;
        }
        match &self.root {
            Some(root) => {
                path.starts_with(root)
                    || path
                        .canonicalize()
                        .ok()
                        .is_none_or(|resolved| resolved.starts_with(root))
            }
            None => true,
        }
    }

    /// Paths are matched as written, normalised; no file system is consulted.
    pub fn lexical() -> Self {
        Self::default()
    }

    /// Paths are also followed through the symlinks of the workspace at `root`, and matched ignoring case when
    /// the workspace's file system does. Probing the case writes and removes one empty file in the workspace.
    pub fn for_workspace(root: &Path) -> std::io::Result<Self> {
        let root = root.canonicalize()?;
        let case_insensitive = probe_case_insensitive(&root)?;
        Ok(Self {
            root: Some(root),
            case_insensitive,
        })
    }

    /// The same, with case sensitivity given rather than probed (for tests).
    pub fn with_root(root: &Path, case_insensitive: bool) -> std::io::Result<Self> {
        Ok(Self {
            root: Some(root.canonicalize()?),
            case_insensitive,
        })
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    pub fn case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Whether a directory on the way to `relative` (each directory its names are looked up in) may ignore case
    /// although the workspace's own file system, probed at startup, does not: one with the casefold attribute (ext4,
    /// f2fs: per directory), or a file system mounted inside the workspace, which the probe did not see (a FAT
    /// stick, an SMB share). A mount is taken to ignore case without a probe, which would write in it. Where it
    /// cannot be told, it may.
    pub fn may_fold_case(&self, relative: &str) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let Some(root) = &self.root else {
            return false;
        };
        if self.case_insensitive {
            return true;
        }
        let Ok(root_device) = std::fs::metadata(root).map(|m| m.dev()) else {
            return true;
        };
        let mut dir = root.clone();
        let mut parts = Path::new(relative).components().peekable();
        loop {
            match std::fs::metadata(&dir) {
                Ok(found) if !found.is_dir() => return false,
                Ok(found) => {
                    if found.dev() != root_device || folds_case(&dir).unwrap_or(true) {
                        return true;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return false,
                Err(_) => return true,
            }
            // The last part is looked up in the directory just read.
            match parts.next() {
                Some(part) if parts.peek().is_some() => dir.push(part),
                _ => return false,
            }
        }
    }

    /// What a file tool's path stands for: the path normalised, and, when it goes through a symlink inside the
    /// workspace, where that leads (relative to the workspace). Nothing when the path leaves the workspace either
    /// way: the tool refuses it, and no path glob matches it. Partly unknown when its links cannot be followed
    /// (a path too long to resolve, a loop of links, a directory that may not be read): the tool may still reach
    /// a file through them.
    pub fn candidates(&self, raw: &str) -> Readings {
        let Some(lexical) = normalize_relative(raw) else {
            return Readings::default();
        };
        let Some(root) = &self.root else {
            return Readings::known(vec![lexical]);
        };
        match resolve_in(root, &lexical) {
            Resolved::Inside(resolved) if resolved != lexical => {
                Readings::known(vec![lexical, resolved])
            }
            Resolved::Inside(_) => Readings::known(vec![lexical]),
            Resolved::Outside => Readings::default(),
            Resolved::Unknown => Readings {
                known: vec![lexical],
                unknown: true,
            },
        }
    }
}

/// What a value stands for, to a matcher: the readings known, and whether it may stand for something else too,
/// which cannot be told (a path whose links cannot be followed, a value that is not text, a number or a flag).
/// A `deny` or `ask` rule matches a value partly unknown, and an `allow` rule does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    pub known: Vec<String>,
    pub unknown: bool,
}

impl Readings {
    pub fn known(known: Vec<String>) -> Self {
        Self {
            known,
            unknown: false,
        }
    }
}

/// Where a path inside the workspace leads through its symlinks.
enum Resolved {
    /// Inside the workspace, relative to it.
    Inside(String),
    Outside,
    /// The links could not be followed (not because a part does not exist yet).
    Unknown,
}

/// Follows `relative` through the symlinks that exist under `root`; the part that does not exist yet is taken
/// as written.
fn resolve_in(root: &Path, relative: &str) -> Resolved {
    let full = root.join(relative);
    let mut existing = full.as_path();
    let mut missing: Vec<&std::ffi::OsStr> = Vec::new();
    let canonical = loop {
        match existing.canonicalize() {
            Ok(canonical) => break canonical,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let (Some(name), Some(parent)) = (existing.file_name(), existing.parent()) else {
                    return Resolved::Outside;
                };
                missing.push(name);
                existing = parent;
                if !existing.starts_with(root) {
                    return Resolved::Outside;
                }
            }
            Err(_) => return Resolved::Unknown,
        }
    };
    let mut resolved = canonical;
    for part in missing.iter().rev() {
        resolved.push(part);
    }
    match resolved
        .strip_prefix(root)
        .ok()
        .and_then(|inside| normalize_relative(inside.to_str()?))
    {
        Some(inside) => Resolved::Inside(inside),
        None => Resolved::Outside,
    }
}

/// Whether the directory at `dir` has the casefold attribute (`chattr +F`): its names are looked up ignoring case.
/// A file system without attributes has none.
#[cfg(target_os = "linux")]
fn folds_case(dir: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    /// `FS_CASEFOLD_FL` of linux/fs.h, which the libc crate does not name.
    const FS_CASEFOLD_FL: libc::c_long = 0x4000_0000;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK)
        .open(dir)?;
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes the attributes into `flags`, a live integer as wide as the kernel may write.
    if unsafe { libc::ioctl(opened.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL) => Ok(false),
            _ => Err(error),
        };
    }
    Ok(flags & FS_CASEFOLD_FL != 0)
}

/// Elsewhere, no directory is known to have it; a mount inside the workspace still counts.
#[cfg(not(target_os = "linux"))]
fn folds_case(_: &Path) -> std::io::Result<bool> {
    Ok(false)
}

/// Makes an empty file of a lower-case name nobody could have foreseen, looks for it under the upper-case name, and
/// removes it. The workspace is anybody's (a cloned repository, a command run earlier): a name it already holds, as
/// a file, a symlink to a file elsewhere or a FIFO, is never opened, only passed over.
fn probe_case_insensitive(root: &Path) -> std::io::Result<bool> {
    use std::hash::{BuildHasher, Hasher};
    let mut attempt = 0;
    loop {
        // Random enough for a name no one plants beforehand, without a dependency: the standard library's hash
        // keys come from the system's randomness.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        match probe_case_insensitive_as(root, &format!(".toolgate-case-probe-{random:016x}")) {
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < 3 => {
                attempt += 1;
            }
            answer => return answer,
        }
    }
}

/// The probe with a given name: `AlreadyExists` when the workspace holds it already, under either case.
fn probe_case_insensitive_as(root: &Path, name: &str) -> std::io::Result<bool> {
    let lower = root.join(name);
    let upper = root.join(name.to_uppercase());
    // An upper-case name there already would answer for a file the probe did not make.
    if std::fs::symlink_metadata(&upper).is_ok() {
        return Err(std::io::ErrorKind::AlreadyExists.into());
    }
    // Made new (O_CREAT|O_EXCL): it fails on any name there already, following no symlink and opening no FIFO.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lower)?;
    let insensitive = std::fs::symlink_metadata(&upper).is_ok();
    std::fs::remove_file(&lower)?;
    Ok(insensitive)
}

/// A glob as written in a rule. A glob without wildcards is compared as text (the narrowest rules, "Always
/// allow" makes them, are all literals); the others compile once, and their case-insensitive form only when a
/// file system ignores case.
#[derive(Clone, Debug)]
pub struct RuleGlob {
    pattern: String,
    compiled: Option<CompiledGlob>,
    /// The glob in composed form (Unicode's NFC), when that is not how it is written.
    composed: OnceLock<Option<Box<RuleGlob>>>,
}

#[derive(Clone, Debug)]
struct CompiledGlob {
    exact_case: GlobMatcher,
    any_case: OnceLock<GlobMatcher>,
    /// The glob with its letters folded ([`fold_glob`]), when that still reads as a glob.
    folded: OnceLock<Option<GlobMatcher>>,
    /// The glob read as text, `*` crossing `/` too.
    as_text: OnceLock<GlobMatcher>,
    /// The glob read as text with its letters folded, when that still reads as a glob.
    as_folded_text: OnceLock<Option<GlobMatcher>>,
}

impl PartialEq for RuleGlob {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for RuleGlob {}

fn build_glob(pattern: &str, case_insensitive: bool) -> Result<GlobMatcher, globset::Error> {
    build_glob_with(pattern, case_insensitive, true)
}

fn build_glob_with(
    pattern: &str,
    case_insensitive: bool,
    literal_separator: bool,
) -> Result<GlobMatcher, globset::Error> {
    GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .backslash_escape(true)
        .case_insensitive(case_insensitive)
        .build()
        .map(|glob| glob.compile_matcher())
}

impl RuleGlob {
    /// A glob where `*` and `?` stay within one path segment and `**` crosses segments, as in `.gitignore`;
    /// `\` escapes the character after it.
    pub fn new(pattern: &str) -> Result<Self, globset::Error> {
        let literal = !pattern.contains(['*', '?', '[', ']', '{', '}', '\\']);
        let compiled = if literal {
            None
        } else {
            Some(CompiledGlob {
                exact_case: build_glob(pattern, false)?,
                any_case: OnceLock::new(),
                folded: OnceLock::new(),
                as_text: OnceLock::new(),
                as_folded_text: OnceLock::new(),
            })
        };
        Ok(Self {
            pattern: pattern.to_owned(),
            compiled,
            composed: OnceLock::new(),
        })
    }

    /// Whether the glob fits `candidate` with both read in one Unicode normalization (composed, NFC): `é` written as
    /// `e` and a combining accent is `é`, as a file system that ignores normalization (APFS) opens one file by
    /// either name. For a `deny` or `ask` only, where a reading can only make a call stricter; case as
    /// [`RuleGlob::is_match`] and [`RuleGlob::is_folded_match`] read it with `case_insensitive`.
    pub fn is_composed_match(&self, candidate: &str, case_insensitive: bool) -> bool {
        use unicode_normalization::UnicodeNormalization as _;
        if candidate.is_ascii() && self.pattern.is_ascii() {
            // ASCII is composed already: the plain readings decide.
            return false;
        }
        let candidate: String = candidate.nfc().collect();
        let composed = self.composed.get_or_init(|| {
            let pattern: String = self.pattern.nfc().collect();
            (pattern != self.pattern)
                .then(|| RuleGlob::new(&pattern).ok().map(Box::new))
                .flatten()
        });
        let glob = composed.as_deref().unwrap_or(self);
        glob.is_match(&candidate, case_insensitive)
            || (case_insensitive && glob.is_folded_match(&candidate))
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether the glob fits `candidate`; with `case_insensitive`, ignoring the case of ASCII letters (globset's
    /// reading; [`RuleGlob::is_folded_match`] is the wider one a `deny` or `ask` adds).
    pub fn is_match(&self, candidate: &str, case_insensitive: bool) -> bool {
        match (&self.compiled, case_insensitive) {
            (None, false) => candidate == self.pattern,
            (None, true) => candidate.to_lowercase() == self.pattern.to_lowercase(),
            (Some(compiled), false) => compiled.exact_case.is_match(candidate),
            (Some(compiled), true) => compiled
                .any_case
                .get_or_init(|| {
                    // The same pattern compiled once already; ignoring case cannot make it invalid.
                    build_glob(&self.pattern, true).unwrap_or_else(|_| compiled.exact_case.clone())
                })
                .is_match(candidate),
        }
    }

    /// Whether the glob fits `candidate` with the letters of both folded in every script ([`fold_case`]): on a
    /// case-insensitive file system `DONNÉES` is `données`, `ΟΔΟΣ` is `οδος` and the Kelvin sign is `k`, which
    /// globset, folding ASCII only, does not see. Only a `deny` or `ask` reads a call this way, beside
    /// [`RuleGlob::is_match`]: a file system may fold fewer letters than Unicode does, so the reading can only make a
    /// call stricter. A character class is left as written (folding `[A-_]` would move or break its range).
    pub fn is_folded_match(&self, candidate: &str) -> bool {
        match &self.compiled {
            None => fold_case(candidate) == fold_case(&self.pattern),
            Some(compiled) => compiled
                .folded
                .get_or_init(|| build_glob(&fold_glob(&self.pattern), true).ok())
                .as_ref()
                .is_some_and(|folded| folded.is_match(fold_case(candidate))),
        }
    }

    /// Whether the glob fits `candidate` read as text rather than as a path: `*` and `?` match `/` too, so that
    /// `rm *` fits `rm -rf /` and `*evil.com*` fits `https://evil.com/x`. Case counts.
    pub fn is_text_match(&self, candidate: &str) -> bool {
        match &self.compiled {
            None => candidate == self.pattern,
            Some(compiled) => compiled
                .as_text
                .get_or_init(|| {
                    // The same pattern compiled once already; reading `/` as any character cannot make it invalid.
                    build_glob_with(&self.pattern, false, false)
                        .unwrap_or_else(|_| compiled.exact_case.clone())
                })
                .is_match(candidate),
        }
    }

    /// [`RuleGlob::is_text_match`] with the letters of both folded ([`fold_case`]): `*evil.com*` fits
    /// `https://EVIL.COM/x`. For a `deny` or `ask` only, where any reading can only make a call stricter.
    pub fn is_folded_text_match(&self, candidate: &str) -> bool {
        match &self.compiled {
            None => fold_case(candidate) == fold_case(&self.pattern),
            Some(compiled) => compiled
                .as_folded_text
                .get_or_init(|| build_glob_with(&fold_glob(&self.pattern), true, false).ok())
                .as_ref()
                .is_some_and(|folded| folded.is_match(fold_case(candidate))),
        }
    }

    /// Characters that match only themselves: how specific the glob is.
    pub fn literal_len(&self) -> usize {
        literal_len(&self.pattern)
    }
}

/// A name with its letters folded as Unicode's simple case folding does, one letter for one: each in lower case,
/// and the letters whose lower case is not their folding (a final sigma, the long s, the micro sign, the Greek
/// symbol forms) as their folding. A letter whose lower case is several stays as it is.
fn fold_case(text: &str) -> String {
    text.chars().map(fold_char).collect()
}

fn fold_char(c: char) -> char {
    match c {
        'ς' => 'σ',
        '\u{17F}' => 's',
        'µ' => 'μ',
        'ϐ' => 'β',
        'ϑ' => 'θ',
        'ϕ' => 'φ',
        'ϖ' => 'π',
        'ϰ' => 'κ',
        'ϱ' => 'ρ',
        'ϵ' => 'ε',
        'ẛ' => 'ṡ',
        c => {
            let mut lower = c.to_lowercase();
            match (lower.next(), lower.next()) {
                (Some(one), None) => one,
                _ => c,
            }
        }
    }
}

/// A glob with its letters folded ([`fold_char`]) outside its character classes, which keep their letters and
/// ranges; an escaped letter is folded as the letter it stands for.
fn fold_glob(pattern: &str) -> String {
    let mut folded = String::with_capacity(pattern.len());
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                folded.push(c);
                if let Some(escaped) = chars.next() {
                    folded.push(fold_char(escaped));
                }
            }
            '[' => {
                // The class as written, up to its closing `]`; a `]` first (after a `!` or `^`) is one of its members.
                folded.push(c);
                if let Some(&negation @ ('!' | '^')) = chars.peek() {
                    folded.push(negation);
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    folded.push(']');
                    chars.next();
                }
                for member in chars.by_ref() {
                    folded.push(member);
                    if member == ']' {
                        break;
                    }
                }
            }
            c => folded.push(fold_char(c)),
        }
    }
    folded
}

/// A glob over tool names, where `*` matches any run of characters: `mcp__github__*`.
pub fn tool_glob(pattern: &str) -> Result<GlobMatcher, globset::Error> {
    Glob::new(pattern).map(|glob| glob.compile_matcher())
}

/// The characters of a glob outside its wildcards, classes and alternations.
pub fn literal_len(pattern: &str) -> usize {
    let mut count = 0;
    let mut depth = 0usize;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let escaped = chars.next();
                count += usize::from(escaped.is_some() && depth == 0);
            }
            '[' | '{' => depth += 1,
            ']' | '}' => depth = depth.saturating_sub(1),
            '*' | '?' => {}
            _ if depth == 0 => count += 1,
            _ => {}
        }
    }
    count
}

/// Escapes a literal so that it is a glob matching exactly itself.
pub fn escape_glob(literal: &str) -> String {
    globset::escape(literal)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The case probe writes into the workspace with toolgate's own rights. A name the workspace holds already (a
    /// symlink to a file elsewhere, a FIFO) is passed over, never opened: before, the probe's name was foreseeable
    /// (the pid and a count), a symlink of that name had its target emptied at start-up, and a FIFO hung it.
    #[cfg(unix)]
    #[test]
    fn the_case_probe_opens_nothing_the_workspace_holds() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let precious = dir.path().join("precious.txt");
        std::fs::write(&precious, "keep").unwrap();
        std::os::unix::fs::symlink(&precious, workspace.join(".toolgate-case-probe-planted"))
            .unwrap();
        let fifo = workspace.join(".toolgate-case-probe-fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        // The names the probe once took, each a symlink to the file outside.
        for count in 0..512 {
            let name = format!(".toolgate-case-probe-{}-{count}", std::process::id());
            std::os::unix::fs::symlink(&precious, workspace.join(name)).unwrap();
        }
        assert!(
            !PathContext::for_workspace(&workspace)
                .unwrap()
                .case_insensitive()
        );
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
        for planted in [".toolgate-case-probe-planted", ".toolgate-case-probe-fifo"] {
            let error = probe_case_insensitive_as(&workspace, planted).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{planted}");
        }
        // An upper-case name planted beside the probe's would make a case-sensitive system look insensitive.
        std::fs::write(workspace.join(".TOOLGATE-CASE-PROBE-UPPER"), "").unwrap();
        let error =
            probe_case_insensitive_as(&workspace, ".toolgate-case-probe-upper").unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
        // The probe itself picks names nobody planted, and leaves nothing behind.
        let before = std::fs::read_dir(&workspace).unwrap().count();
        assert!(
            !PathContext::for_workspace(&workspace)
                .unwrap()
                .case_insensitive()
        );
        assert_eq!(std::fs::read_dir(&workspace).unwrap().count(), before);
    }

    #[test]
    fn paths_normalise_inside_the_workspace_or_not_at_all() {
        assert_eq!(normalize_relative("./src/../.env").as_deref(), Some(".env"));
        assert_eq!(normalize_relative("src//a/./b").as_deref(), Some("src/a/b"));
        assert_eq!(normalize_relative("").as_deref(), Some(""));
        assert_eq!(normalize_relative(".").as_deref(), Some(""));
        assert_eq!(normalize_relative("../x"), None);
        assert_eq!(normalize_relative("a/../../x"), None);
        assert_eq!(normalize_relative("/etc/passwd"), None);
        assert_eq!(normalize_relative("a\0b"), None);
    }

    #[test]
    fn the_argv_is_the_program_then_its_arguments() {
        assert_eq!(
            argv(&json!({"command": "git", "args": ["status", "--short"]})),
            Some(vec!["git", "status", "--short"])
        );
        assert_eq!(argv(&json!({"command": "ls"})), Some(vec!["ls"]));
        assert_eq!(argv(&json!({"command": "ls", "args": [1]})), None);
        assert_eq!(argv(&json!({"args": ["x"]})), None);
    }

    #[test]
    fn shells_interpreters_and_wrappers_are_known_by_name_wherever_they_live() {
        for program in [
            "sh",
            "/bin/bash",
            "env",
            "python3",
            "python3.12",
            "/usr/bin/xargs",
            // A program with an option that runs another: `find . -exec rm -rf {} +`.
            "find",
            // git's aliases (`-c alias.x='!rm -rf x' x`), hooks and `-c core.sshCommand=...`.
            "/usr/bin/git",
            "sed",
            "cargo",
            "npm",
            // Versions that are not only trailing digits, and a name in another case.
            "python3.7m",
            "perl5.36-x86_64-linux-gnu",
            "pip3",
            "pypy3",
            "node-20",
            "lua5.4",
            "go1.21",
            "go1.21rc2",
            "luajit-2.1.0-beta3",
            "SH",
            "/bin/Bash",
            "./gradlew",
            "linux64",
            // The spellings packagers give a program, and a dynamic loader.
            "/lib64/ld-linux-x86-64.so.2",
            "ld-musl-x86_64.so.1",
            "ld.so",
            "systemd-cat",
            "vim.basic",
            "vim.tiny",
            "bash-static",
            "zsh-static",
            "python3.13t",
            "python3-dbg",
            "python3.12-dbg",
            "gmake",
            "gsed",
            "gfind",
            "gtar",
            "genv",
            "gxargs",
            "gtimeout",
            "gvim",
            "bsdtar",
            "mariadb",
            "svn",
            "rustup",
            "nix-shell",
            "gcc",
            "choom",
            "uclampset",
            "yt-dlp",
            // A cross toolchain's compilers, with the target in front.
            "x86_64-linux-gnu-gcc-12",
            "/usr/bin/aarch64-linux-gnu-g++",
            "arm-none-eabi-gcc",
            "x86_64-w64-mingw32-gcc-win32",
            "riscv64-unknown-elf-gcc",
            "armv7l-linux-gnueabihf-clang",
            "mips64el-linux-gnuabi64-cc",
            "avr-gcc",
            "msp430-gcc",
            "sh4-linux-gnu-gcc",
            "arm-none-eabi-gdb",
            "xtensa-esp32-elf-gcc",
            "nvptx-none-gcc",
        ] {
            assert!(is_program_runner(program), "{program}");
        }
        for program in [
            "ls",
            "rm",
            "shred",
            "environment",
            "echo",
            "cat",
            "sha256sum",
            "7z",
            "gitk",
            "finder",
            // A digit inside a name is not a version: a converter is not the program it converts from.
            "man2html",
            "zip2john",
            "gem2deb",
            "go2rtc",
            "python3-config",
            "grep",
            "gitk",
            "gpg",
            "gzip",
            "gperf",
            "gsh",
            "ldd",
            "ldconfig",
            "file.txt",
            // A cross toolchain's programs that run none, and names that only begin like a target.
            "x86_64-linux-gnu-objdump",
            "aarch64-linux-gnu-strip",
            "docker-compose",
            "avr-objcopy",
        ] {
            assert!(!is_program_runner(program), "{program}");
        }
    }

    /// The folded reading folds letters outside character classes only: a class keeps its range as written.
    #[test]
    fn the_folded_reading_folds_letters_and_leaves_classes_as_written() {
        let glob = |pattern: &str| RuleGlob::new(pattern).unwrap();
        assert!(glob("**/données/**").is_folded_match("DONNÉES/x"));
        assert!(glob("**/οδος/*").is_folded_match("ΟΔΟΣ/x"));
        assert!(glob("\\Été*").is_folded_match("ÉTÉ 2026"));
        assert!(glob("données").is_folded_match("DONNÉES"));
        // `[0-Z]` folded would be `[0-z]`, which takes `_`: the class is kept, and `_` is still outside it.
        assert!(!glob("[0-Z]*").is_folded_match("_x"));
        // `[A-_]` folded would be no range at all: kept, it still reads.
        assert!(glob("[A-_]*").is_folded_match("Bx"));
        assert!(glob("[]a]*").is_folded_match("]x"));
        assert!(!glob("**/données/**").is_folded_match("donnees/x"));
    }

    #[test]
    fn star_stays_in_one_segment_and_double_star_crosses() {
        let glob = RuleGlob::new("src/*").unwrap();
        assert!(glob.is_match("src/a.rs", false));
        assert!(!glob.is_match("src/a/b.rs", false));
        let glob = RuleGlob::new("src/**").unwrap();
        assert!(glob.is_match("src/a/b.rs", false));
        let glob = RuleGlob::new("**/.env*").unwrap();
        assert!(glob.is_match(".env", false));
        assert!(glob.is_match("deep/er/.env.local", false));
        assert!(!glob.is_match(".ENV", false));
        assert!(glob.is_match(".ENV", true));
        let literal = RuleGlob::new("src/a.rs").unwrap();
        assert!(literal.is_match("src/a.rs", false));
        assert!(!literal.is_match("src/A.rs", false));
        assert!(literal.is_match("src/A.rs", true));
        assert!(!literal.is_match("src/a.rsx", true));
        let escaped = RuleGlob::new(&escape_glob("a*b")).unwrap();
        assert!(escaped.is_match("a*b", false));
        assert!(!escaped.is_match("axb", false));
    }

    #[test]
    fn symlinks_inside_the_workspace_add_where_they_lead() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(root.join(".env"), "secret").unwrap();
        std::os::unix::fs::symlink(root.join(".env"), root.join("src/config")).unwrap();
        std::os::unix::fs::symlink(root.join("src"), root.join("code")).unwrap();
        let paths = PathContext::with_root(root, false).unwrap();
        let known = |path: &str| {
            let readings = paths.candidates(path);
            assert!(!readings.unknown, "{path}");
            readings.known
        };
        assert_eq!(known("src/config"), ["src/config", ".env"]);
        assert_eq!(known("code/new.txt"), ["code/new.txt", "src/new.txt"]);
        assert_eq!(known("src/plain.txt"), ["src/plain.txt"]);
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        assert!(known("out/passwd").is_empty());
        assert!(known("../x").is_empty());
    }

    /// A path whose links cannot be followed may lead anywhere its links do: a long path ending in a link to
    /// `.env` resolves past the system's limit on a path's length, while the tool, which opens it from the
    /// workspace's directory a part at a time, does not.
    #[test]
    fn a_path_whose_links_cannot_be_followed_is_partly_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join(".env"), "secret").unwrap();
        let long = deep_link_to_env(root);
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        let paths = PathContext::with_root(root, false).unwrap();
        assert_eq!(
            paths.candidates(&long),
            Readings {
                known: vec![long.clone()],
                unknown: true
            }
        );
        assert!(paths.candidates("loop/x").unknown);
        assert!(!paths.candidates("missing/x").unknown);
    }

    /// Makes a link to the workspace's `.env` under directories deep enough that its whole path is longer than
    /// the system resolves (made a directory at a time, from within, as only a relative path can be), and returns
    /// the link's path in the workspace, which is shorter than a file tool's limit.
    pub(crate) fn deep_link_to_env(root: &Path) -> String {
        use std::ffi::CString;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // Sixteen directories of 250 characters and one of 69: the link's path is 4,090 characters long.
        let mut names = vec!["d".repeat(250); 16];
        names.push("d".repeat(69));
        let depth = names.len();
        let mut dir = OwnedFd::from(std::fs::File::open(root).unwrap());
        for name in &names {
            let c_name = CString::new(name.as_str()).unwrap();
            // SAFETY: mkdirat and openat read a NUL-terminated name that outlives the calls, relative to an open
            // directory; the descriptor openat returns is owned at once.
            dir = unsafe {
                assert_eq!(libc::mkdirat(dir.as_raw_fd(), c_name.as_ptr(), 0o755), 0);
                let next = libc::openat(
                    dir.as_raw_fd(),
                    c_name.as_ptr(),
                    libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
                );
                assert!(next >= 0);
                OwnedFd::from_raw_fd(next)
            };
        }
        let target = CString::new(format!("{}.env", "../".repeat(depth))).unwrap();
        // SAFETY: symlinkat reads two NUL-terminated strings that outlive the call.
        let linked = unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), c"link".as_ptr()) };
        assert_eq!(linked, 0);
        let long = format!("{}/link", names.join("/"));
        assert!(root.as_os_str().len() + long.len() > 4_096 && long.len() < 4_096);
        long
    }

    #[test]
    fn literal_length_counts_what_only_matches_itself() {
        assert_eq!(literal_len("src/**"), 4);
        assert_eq!(literal_len("**/.env*"), 5);
        assert_eq!(literal_len("a[bc]{d,e}\\*"), 2);
    }
}
