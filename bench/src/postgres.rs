//! A private PostgreSQL for the two-instance mode, from the machine's own packages, the way
//! `agent/tests/support/postgres.rs` makes one: `initdb` into a temporary directory, then `postgres` listening on
//! 127.0.0.1 on a free port (its socket in that directory). As root, both run as the `postgres` user (initdb refuses
//! root).
//!
//! [`Cluster`] is a guard: dropping it stops the server (a fast shutdown, SIGINT) and removes the directory, on
//! success, on error and on Ctrl-C alike (main drops the whole run then). The server is the child of a thread that
//! lives exactly as long as the guard, with the kernel's parent-death signal set, so that even a bench killed with
//! SIGKILL does not leave it running.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use procfs::process::Process;

use crate::system::{self, CpuTime};

/// How long initdb plus the server's start may take.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the server is killed.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// The directory of the newest PostgreSQL the machine has, unless given.
pub fn bin_dir(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = given {
        return Ok(dir.to_path_buf());
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .with_context(|| {
            format!(
                "PostgreSQL is not installed ({}); scripts/bootstrap.sh installs it, or pass --postgres-bin",
                root.display()
            )
        })?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .with_context(|| format!("no PostgreSQL server binaries under {}", root.display()))
}

/// The `postgres` user's ids, when this process is root.
fn server_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Option<u32> {
        let output = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8_lossy(&output.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok(Some((uid, gid))),
        _ => bail!("running as root, and there is no postgres user to run PostgreSQL as"),
    }
}

fn as_server_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

/// A running PostgreSQL cluster. Dropping it stops the server and removes its directory.
pub struct Cluster {
    bin: PathBuf,
    port: u16,
    /// The postmaster's pid.
    pid: u32,
    dir: PathBuf,
    /// Dropping it tells the server's thread to stop the server.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Option<ExitStatus>>>,
    databases: usize,
    /// The temporary directory (data, socket, log); removed last.
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// initdb, then the server, then waits until it accepts connections. The data directory is on the disk (the
    /// system's temporary directory), like the SQLite store's file; `fsync` stays on and `synchronous_commit` is off,
    /// the durability of the SQLite store's WAL with `synchronous = NORMAL`: a commit survives a crash of the
    /// process, a crash of the machine may lose the last ones.
    pub async fn start(bin: PathBuf, keep: bool) -> Result<Self> {
        for tool in ["initdb", "postgres", "pg_isready", "createdb"] {
            if !bin.join(tool).is_file() {
                bail!("no {tool} in {}", bin.display());
            }
        }
        let user = server_user()?;
        let mut dir = tempfile::Builder::new()
            .prefix("toolgate-bench-pg-")
            .tempdir()
            .context("cannot create a temporary directory for PostgreSQL")?;
        if keep {
            dir.disable_cleanup(true);
        }
        let path = dir.path().to_path_buf();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .with_context(|| format!("cannot give {} to postgres", path.display()))?;
        }
        let data = path.join("data");
        let initdb = as_server_user(&mut Command::new(bin.join("initdb")), user)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .context("cannot run initdb")?;
        if !initdb.status.success() {
            bail!(
                "initdb failed ({}): {}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr)
            );
        }

        let port = free_port()?;
        let log = path.join("server.log");
        let mut command = Command::new(bin.join("postgres"));
        as_server_user(&mut command, user)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "synchronous_commit=off", "-c", "max_connections=100"])
            .arg("-k")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&log)
                    .with_context(|| format!("cannot create {}", log.display()))?,
            ));
        // SAFETY: prctl only sets a flag of the child being created; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                // A fast shutdown when the thread that started it ends, whatever ends it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
                Ok(())
            });
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let (started, spawned) = mpsc::channel::<std::io::Result<u32>>();
        let thread = std::thread::Builder::new()
            .name("postgres".into())
            .spawn(move || {
                let mut child = match command.spawn() {
                    Ok(child) => child,
                    Err(error) => {
                        let _ = started.send(Err(error));
                        return None;
                    }
                };
                let _ = started.send(Ok(child.id()));
                watch(&mut child, &stopped)
            })
            .context("cannot start a thread for PostgreSQL")?;
        let pid = spawned
            .recv()
            .context("the PostgreSQL thread ended at once")?
            .with_context(|| format!("cannot start {}", bin.join("postgres").display()))?;
        let mut cluster = Self {
            bin,
            port,
            pid,
            dir: path,
            stop: Some(stop),
            thread: Some(thread),
            databases: 0,
            _dir: dir,
        };
        cluster.wait_until_ready().await?;
        Ok(cluster)
    }

    async fn wait_until_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                bail!("PostgreSQL exited at start; its log:\n{}", self.log_tail());
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return Ok(());
            }
            if started.elapsed() > START_PATIENCE {
                bail!(
                    "PostgreSQL did not accept connections within {} s; its log:\n{}",
                    START_PATIENCE.as_secs(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A fresh, empty database: its URL.
    pub fn create_database(&mut self, label: &str) -> Result<String> {
        self.ensure_running()?;
        self.databases += 1;
        let name = format!("bench_{}_{label}", self.databases);
        let created = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg(&name)
            .stdin(Stdio::null())
            .output()
            .context("cannot run createdb")?;
        if !created.status.success() {
            bail!(
                "createdb {name} failed: {}",
                String::from_utf8_lossy(&created.stderr)
            );
        }
        Ok(format!(
            "postgres://postgres@127.0.0.1:{}/{name}",
            self.port
        ))
    }

    /// Fails when the server is no longer running.
    pub fn ensure_running(&self) -> Result<()> {
        if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
            bail!("PostgreSQL exited; its log:\n{}", self.log_tail());
        }
        Ok(())
    }

    /// The CPU time of the whole server: the postmaster, its children that are running (the backends, the WAL
    /// writer, the checkpointer, autovacuum…), and the children it has already reaped.
    pub fn cpu_time(&self) -> Result<CpuTime> {
        let ticks = system::clock_ticks();
        let pid = i32::try_from(self.pid).context("a process id out of range")?;
        let stat = Process::new(pid)
            .and_then(|process| process.stat())
            .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
        let mut user = stat.utime + u64::try_from(stat.cutime).unwrap_or(0);
        let mut system = stat.stime + u64::try_from(stat.cstime).unwrap_or(0);
        let processes = procfs::process::all_processes().context("cannot list /proc")?;
        for process in processes.flatten() {
            // A process that exits while we read is skipped; the postmaster's cutime gets it.
            if let Ok(child) = process.stat()
                && child.ppid == pid
            {
                user += child.utime;
                system += child.stime;
            }
        }
        let time = |ticks_used: u64| {
            Duration::from_nanos(ticks_used.saturating_mul(1_000_000_000) / ticks.max(1))
        };
        Ok(CpuTime {
            user: time(user),
            system: time(system),
        })
    }

    /// Where the data, the socket and the log are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "(empty)".to_owned()
        } else {
            tail
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The thread sees the channel closed, stops the server and waits for it.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The server's thread: until told to stop (or the server exits by itself), then a fast shutdown, then SIGKILL if
/// it takes too long. Returns how the server ended.
fn watch(child: &mut Child, stopped: &mpsc::Receiver<()>) -> Option<ExitStatus> {
    // A message or a closed channel both mean stop.
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(100)) {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
    }
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let started = Instant::now();
    while started.elapsed() < STOP_PATIENCE {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().ok()
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}
