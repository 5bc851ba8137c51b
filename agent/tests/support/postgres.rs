//! A throwaway PostgreSQL for tests, from the machine's own packages: `initdb` into a temporary directory, then the
//! server as a child of a thread that lives as long as the test process, listening on 127.0.0.1 on a free port,
//! with its socket in that directory. When the test process ends, however it ends, the server is told to stop
//! (the kernel's parent-death signal), and the directory goes at a normal exit. As root, both run as the `postgres`
//! user (initdb refuses root).
//!
//! One cluster per test process; each test gets a database of its own ([`database`]).

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Cluster {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The directory of the newest PostgreSQL the machine has.
fn bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("TOOLGATE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|error| format!("PostgreSQL is not installed (/usr/lib/postgresql: {error}); scripts/bootstrap.sh installs it"))?
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
        .ok_or_else(|| "no PostgreSQL server binaries under /usr/lib/postgresql".to_owned())
}

/// The `postgres` user's ids, when this process is root (initdb and the server refuse to run as root).
fn server_user() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    let output = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .map_err(|error| format!("cannot run id: {error}"))?;
    let uid = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse::<u32>();
    let output = Command::new("id")
        .args(["-g", "postgres"])
        .output()
        .map_err(|error| format!("cannot run id: {error}"))?;
    let gid = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse::<u32>();
    match (uid, gid) {
        (Ok(uid), Ok(gid)) => Ok(Some((uid, gid))),
        _ => Err("running as root, and there is no postgres user to run PostgreSQL as".to_owned()),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

fn as_server_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

extern "C" fn remove_cluster_dir() {
    if let Some(Ok(cluster)) = CLUSTER.get() {
        let _ = Command::new(cluster.bin.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(cluster.dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&cluster.dir);
    }
}

fn start() -> Result<Cluster, String> {
    let bin = bin_dir()?;
    let user = server_user()?;
    let dir = std::env::temp_dir().join(format!(
        "toolgate-pg-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|error| format!("cannot give {} to postgres: {error}", dir.display()))?;
    }
    let data = dir.join("data");
    let initdb = as_server_user(&mut Command::new(bin.join("initdb")), user)
        .args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "-D",
        ])
        .arg(&data)
        .output()
        .map_err(|error| format!("cannot run initdb: {error}"))?;
    if !initdb.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        ));
    }
    let port = free_port();
    let (started, ready) = std::sync::mpsc::channel();
    let server = {
        let bin = bin.clone();
        let dir = dir.clone();
        move || {
            let mut command = Command::new(bin.join("postgres"));
            as_server_user(&mut command, user)
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "fsync=off", "-c", "max_connections=200"])
                .arg("-k")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(
                    std::fs::File::create(dir.join("server.log")).expect("a log file"),
                ));
            // SAFETY: prctl only sets a flag of the child being created; it allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    // A fast shutdown when the test process ends, whatever ends it.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
                    Ok(())
                });
            }
            let child = command.spawn();
            let _ = started.send(child.map(|_| ()).map_err(|error| error.to_string()));
            // The parent-death signal follows this thread: it must live as long as the process.
            loop {
                std::thread::park();
            }
        }
    };
    std::thread::Builder::new()
        .name("postgres".into())
        .spawn(server)
        .map_err(|error| error.to_string())?;
    ready
        .recv()
        .map_err(|error| error.to_string())?
        .map_err(|error| format!("cannot start postgres: {error}"))?;
    // SAFETY: registers a plain function to run at exit.
    unsafe { libc::atexit(remove_cluster_dir) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if ready {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            return Err(format!("postgres did not start within 30 s: {log}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Cluster {
        port,
        dir,
        bin,
        user,
    })
}

fn cluster() -> &'static Cluster {
    match CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(error) => panic!("the test PostgreSQL: {error}"),
    }
}

/// A fresh, empty database on the test cluster: its URL.
pub fn database() -> String {
    let cluster = cluster();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let created = Command::new(cluster.bin.join("createdb"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port.to_string(),
            "-U",
            "postgres",
            &name,
        ])
        .output()
        .expect("createdb runs");
    assert!(
        created.status.success(),
        "createdb: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    format!("postgres://postgres@127.0.0.1:{}/{name}", cluster.port)
}

/// The cluster's port, for tests that talk to it with psql.
pub fn psql(url: &str, sql: &str) -> String {
    let cluster = cluster();
    let output = Command::new(cluster.bin.join("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Where the cluster keeps its files (for its log).
pub fn dir() -> &'static Path {
    &cluster().dir
}
