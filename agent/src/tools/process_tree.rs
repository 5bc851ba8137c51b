//! A command and everything it starts, as one thing that ends together.
//!
//! A process group is not enough: a process the command starts may leave it (`setsid`, `setpgid`), and a daemon that
//! forks twice is re-parented to init, out of reach. So on Linux each command runs under a supervisor of its own: a
//! copy of this process, made by the spawn before anything is executed, that marks itself a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`) and then forks the command. Any process of the command's tree that loses its parent is
//! re-parented to the supervisor instead of init, so while the supervisor lives the whole tree is exactly its
//! descendants, whatever sessions or groups they made. The supervisor reports the command's exit status on a pipe,
//! reaps whatever is re-parented to it, and exits once it has no child left.
//!
//! Ending the tree: the supervisor is stopped (so it reaps nothing and no pid of the tree is freed for reuse), every
//! living descendant found in /proc is killed, again until none is left (a process forked meanwhile is found on the
//! next pass: its parent dies, so it is re-parented to the supervisor), and the supervisor is let go to reap them and
//! exit. No cgroup and no privilege: it works for any user on any Linux since 3.4. (Crates that manage process
//! groups, such as `process-wrap`, stop at the group, which `setsid` leaves; cgroups need a delegated hierarchy that
//! a user's machine may not have.)
//!
//! The command leads a process group of its own, apart from the supervisor's, and the supervisor ignores every
//! signal it can, so that nothing the tree does by accident (a shell's `kill 0`, a signal to its parent) ends it.
//! What it cannot stop: a process of the tree that kills its supervisor with SIGKILL on purpose (the same user may),
//! or a server killed with SIGKILL, leaves the tree to init; a server that shuts down ends its trees first.
//!
//! Elsewhere (other Unixes) the command gets its own process group, and the group is what is killed.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// How long the supervisor gets to reap the killed tree and exit before it is killed itself.
const SUPERVISOR_EXIT: Duration = Duration::from_secs(2);

/// A running command with its whole process tree. Dropping it kills the tree.
pub(super) struct ProcessTree {
    /// The supervisor on Linux, the command itself elsewhere.
    child: Child,
    #[cfg(target_os = "linux")]
    status: tokio::net::unix::pipe::Receiver,
    ended: bool,
}

impl ProcessTree {
    /// Starts `command` (stdio already configured) as a tree of its own.
    pub(super) fn spawn(command: &mut Command) -> io::Result<Self> {
        #[cfg(target_os = "linux")]
        {
            let (status_sender, status) = tokio::net::unix::pipe::pipe()?;
            let status_fd = std::os::fd::AsRawFd::as_raw_fd(&status_sender);
            command.process_group(0);
            // SAFETY: the closure runs in the forked child and makes only async-signal-safe system calls (see
            // `linux::supervise`); it captures nothing but a file descriptor number.
            unsafe {
                command.pre_exec(move || linux::supervise(status_fd));
            }
            let child = command.spawn()?;
            // The supervisor holds the only writer now: end of file means it is gone.
            drop(status_sender);
            Ok(Self {
                child,
                status,
                ended: false,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            command.process_group(0);
            Ok(Self {
                child: command.spawn()?,
                ended: false,
            })
        }
    }

    pub(super) fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    pub(super) fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits for the command itself to exit (what it started may still run).
    pub(super) async fn command_exited(&mut self) -> io::Result<ExitStatus> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::ExitStatusExt;
            use tokio::io::AsyncReadExt;

            let mut raw = [0u8; 4];
            match self.status.read_exact(&mut raw).await {
                Ok(_) => Ok(ExitStatus::from_raw(i32::from_ne_bytes(raw))),
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Err(
                    io::Error::other("its supervisor ended before the command did"),
                ),
                Err(error) => Err(error),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.child.wait().await
        }
    }

    /// Kills whatever is left of the tree and waits until it is gone. Returns how many processes were killed.
    pub(super) async fn end(mut self) -> usize {
        self.ended = true;
        let killed = self.kill_all();
        if tokio::time::timeout(SUPERVISOR_EXIT, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "a command's supervisor did not exit after its tree was killed; killing it"
            );
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        killed
    }

    fn kill_all(&mut self) -> usize {
        // `id()` is `None` only once the child was reaped, and then nothing of the tree is left to kill.
        let Some(pid) = self
            .child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
        else {
            return 0;
        };
        #[cfg(target_os = "linux")]
        {
            linux::kill_descendants(pid)
        }
        #[cfg(not(target_os = "linux"))]
        {
            // SAFETY: killpg has no memory-safety preconditions; the group is our unreaped child's.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
            0
        }
    }
}

impl Drop for ProcessTree {
    /// A tree whose owner went away (the run's task was dropped, the runtime is shutting down) is killed at once;
    /// the supervisor then reaps it and exits, and tokio reaps the supervisor.
    fn drop(&mut self) {
        if !self.ended {
            self.kill_all();
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::{HashMap, HashSet};
    use std::io;
    use std::os::fd::RawFd;
    use std::time::{Duration, Instant};

    use libc::pid_t;

    /// How long killing a tree may take before giving up on processes that do not die (stuck in the kernel).
    const KILL_PATIENCE: Duration = Duration::from_secs(2);

    /// Runs in the child the spawn forked, before exec. Becomes the supervisor and forks the command: in the
    /// command this returns `Ok` and the spawn goes on to exec it; in the supervisor it never returns.
    ///
    /// Only async-signal-safe system calls here: the parent is multi-threaded, so the fork copied locks that other
    /// threads may hold. Nothing allocates.
    pub(super) fn supervise(status_fd: RawFd) -> io::Result<()> {
        // SAFETY: plain system calls on integers and on a stack buffer; see each comment.
        unsafe {
            // Variadic calls: every argument is passed at the width the kernel reads, a long.
            let (one, zero): (libc::c_ulong, libc::c_ulong) = (1, 0);
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, one, zero, zero, zero) != 0 {
                return Err(io::Error::last_os_error());
            }
            // A bare clone with the exit signal of a fork: unlike fork(3) it runs no atfork handlers, which could
            // take locks copied in a held state. The child shares nothing (no CLONE_* flags but the signal).
            let command = libc::syscall(
                libc::SYS_clone,
                libc::c_long::from(libc::SIGCHLD),
                zero,
                zero,
                zero,
                zero,
            );
            if command < 0 {
                return Err(io::Error::last_os_error());
            }
            if command == 0 {
                // The command: the subreaper mark is not inherited, and the status pipe closes on exec. It leads a
                // process group of its own, so that a signal it sends its group (`kill 0` in a shell's trap, say)
                // does not reach the supervisor.
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                return Ok(());
            }
            run_supervisor(command as pid_t, status_fd)
        }
    }

    /// The supervisor's whole life: report the command's status, reap everything, exit when nothing is left.
    unsafe fn run_supervisor(command: pid_t, status_fd: RawFd) -> ! {
        // SAFETY: signal dispositions, descriptor closing, waitpid, write and _exit are all async-signal-safe and
        // touch only this process.
        unsafe {
            // The server's signal handlers (copied by the fork) must not run here. Any process of the tree may
            // signal the supervisor (its pid is the tree's parent's, or its group's once the command moved), and a
            // supervisor that died of it would let the tree go to init and lose the command's status: it ignores
            // every signal it may, and only the server ends it (with SIGKILL, or SIGSTOP and SIGCONT while it kills
            // the tree). SIGCHLD keeps its default, so that the children it reaps are waited for; a closed status
            // pipe does not end it either.
            for signal in 1..65 {
                if ![libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD, libc::SIGCONT].contains(&signal) {
                    libc::signal(signal, libc::SIG_IGN);
                }
            }
            // Keep nothing of the server (its listening socket, the command's pipes, the spawn's error pipe) but the
            // status pipe: the command's output must end when the command's tree ends, and the port must close when
            // the server does.
            close_all_but(status_fd);
            let mut status_fd = Some(status_fd);
            loop {
                let mut status = 0;
                let reaped = libc::waitpid(-1, &mut status, 0);
                if reaped == command {
                    if let Some(fd) = status_fd.take() {
                        let bytes = status.to_ne_bytes();
                        libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                        libc::close(fd);
                    }
                } else if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                    // ECHILD: the whole tree is gone.
                    libc::_exit(0);
                }
            }
        }
    }

    unsafe fn close_all_but(keep: RawFd) {
        // SAFETY: closing descriptors of this (forked, single-threaded) process only.
        unsafe {
            let keep = keep as libc::c_uint;
            let close_range = |first: libc::c_uint, last: libc::c_uint| {
                first > last
                    || libc::syscall(
                        libc::SYS_close_range,
                        libc::c_ulong::from(first),
                        libc::c_ulong::from(last),
                        0 as libc::c_ulong,
                    ) == 0
            };
            let below = keep == 0 || close_range(0, keep - 1);
            if !below || !close_range(keep + 1, libc::c_uint::MAX) {
                // No close_range (Linux before 5.9): close one by one up to the descriptor limit.
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                let last = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                    limit.rlim_cur.min(1 << 20) as libc::c_uint
                } else {
                    1024
                };
                for fd in 0..last {
                    if fd != keep {
                        libc::close(fd as libc::c_int);
                    }
                }
            }
        }
    }

    fn signal(pid: pid_t, signal: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// Kills every living descendant of `supervisor` (our own unreaped child), then lets the supervisor reap them.
    /// Returns how many processes were killed.
    pub(super) fn kill_descendants(supervisor: pid_t) -> usize {
        // Stopped, the supervisor reaps nothing, so the pids of the processes it adopts stay theirs while this
        // reads and kills them. (A process of the tree that reaps its own child could free a pid between a pass and
        // its kill; reuse of that very pid within microseconds would need the whole pid space to wrap.)
        signal(supervisor, libc::SIGSTOP);
        let deadline = Instant::now() + KILL_PATIENCE;
        let mut killed = HashSet::new();
        loop {
            let living = living_descendants(supervisor);
            if living.is_empty() {
                break;
            }
            for &pid in &living {
                signal(pid, libc::SIGKILL);
                killed.insert(pid);
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    supervisor,
                    left = living.len(),
                    "processes of a command did not die when killed"
                );
                break;
            }
            // A killed process takes a moment to become a zombie; look again once it had the chance.
            std::thread::yield_now();
        }
        signal(supervisor, libc::SIGCONT);
        killed.len()
    }

    /// One pass over /proc: the descendants of `root` that are not zombies.
    fn living_descendants(root: pid_t) -> Vec<pid_t> {
        let mut children: HashMap<pid_t, Vec<(pid_t, bool)>> = HashMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<pid_t>().ok())
            else {
                continue;
            };
            // A process may end between the listing and the read: then it is no longer anyone's concern.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if let Some((parent, alive)) = parse_stat(&stat) {
                let alive = alive || threads_alive(pid);
                children.entry(parent).or_default().push((pid, alive));
            }
        }
        let mut living = Vec::new();
        let mut pending = vec![root];
        while let Some(parent) = pending.pop() {
            for &(pid, alive) in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
                if alive {
                    living.push(pid);
                }
                pending.push(pid);
            }
        }
        living
    }

    /// Whether a process whose first thread is a zombie still has threads that run: its main thread ended
    /// (`pthread_exit`) and the others go on, so the process lives on and must be killed (a signal to its pid
    /// reaches them all).
    fn threads_alive(pid: pid_t) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().any(|task| {
            task.file_name().to_str() != Some(&pid.to_string())
                && std::fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|stat| parse_stat(&stat))
                    .is_some_and(|(_, alive)| alive)
        })
    }

    /// The parent pid and whether the process is alive (not a zombie), from `/proc/<pid>/stat`. The command name
    /// in parentheses may hold spaces and parentheses, so the fields are read after its last `)`.
    fn parse_stat(stat: &str) -> Option<(pid_t, bool)> {
        let after_name = &stat[stat.rfind(')')? + 1..];
        let mut fields = after_name.split_whitespace();
        let state = fields.next()?;
        let parent = fields.next()?.parse().ok()?;
        Some((parent, !matches!(state, "Z" | "X" | "x")))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stat_lines_are_read_after_the_command_name() {
            assert_eq!(
                parse_stat("42 (sleep) S 7 42 42 0 -1 4194304"),
                Some((7, true))
            );
            assert_eq!(parse_stat("43 (a) (b) Z) Z 9 43 43 0 -1"), Some((9, false)));
            assert_eq!(parse_stat("garbage"), None);
        }
    }
}
