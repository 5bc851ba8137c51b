//! A command and everything it starts, as one thing that ends together: `run_command`'s commands and the MCP
//! stdio servers.
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
//! The supervisor watches the server too: when the status pipe's reading end closes with the command's tree still
//! there (the server was killed, or crashed), it kills the tree itself, a pass over /proc at a time, as the server
//! would have. What it cannot stop: a process of the tree that kills its supervisor with SIGKILL on purpose (the
//! same user may) leaves the tree to init.
//!
//! Elsewhere (other Unixes) the command gets its own process group, and the group is what is killed.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// How long the supervisor gets to reap the killed tree and exit before it is killed itself.
const SUPERVISOR_EXIT: Duration = Duration::from_secs(2);

/// A running command with its whole process tree. Dropping it kills the tree.
pub(crate) struct ProcessTree {
    /// The supervisor on Linux, the command itself elsewhere.
    child: Child,
    #[cfg(target_os = "linux")]
    status: tokio::net::unix::pipe::Receiver,
    ended: bool,
}

impl ProcessTree {
    /// Starts `command` (stdio already configured) as a tree of its own.
    pub(crate) fn spawn(command: &mut Command) -> io::Result<Self> {
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

    // Only MCP's servers talk to their command over its input, and are asked to stop politely.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub(crate) fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    pub(crate) fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits for the command itself to exit (what it started may still run).
    pub(crate) async fn command_exited(&mut self) -> io::Result<ExitStatus> {
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

    /// Kills whatever is left of the tree and waits until it is gone, but for processes toolgate may not signal.
    /// The kill passes read `/proc` and may go on for a while (a process stuck in the kernel): they run on the
    /// blocking pool, not on a worker of the runtime (inline when the pool is gone, as at the runtime's end).
    pub(crate) async fn end(mut self) -> Ended {
        self.ended = true;
        let (killed, outliving) = match self.root() {
            Some(pid) => match tokio::task::spawn_blocking(move || kill_tree(pid)).await {
                Ok(ended) => ended,
                Err(_) => kill_tree(pid),
            },
            None => (0, Vec::new()),
        };
        if !outliving.is_empty() {
            // The supervisor adopted them and would wait for them: it goes now, and they go to init.
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        } else if tokio::time::timeout(SUPERVISOR_EXIT, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "a command's supervisor did not exit after its tree was killed; killing it"
            );
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        Ended { killed, outliving }
    }

    /// Sends `signal` to every process of the tree that lives (a polite `SIGTERM` before the end, say). What a
    /// process starts after this is not reached: [`ProcessTree::end`] is what ends them all.
    // Only MCP's servers talk to their command over its input, and are asked to stop politely.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn signal(&self, signal: libc::c_int) {
        let Some(pid) = self.root() else {
            return;
        };
        #[cfg(target_os = "linux")]
        {
            linux::signal_descendants(pid, signal);
        }
        #[cfg(not(target_os = "linux"))]
        {
            // SAFETY: killpg has no memory-safety preconditions; the group is our unreaped child's.
            unsafe { libc::killpg(pid, signal) };
        }
    }

    /// The supervisor's pid (the command's elsewhere). `id()` is `None` only once the child was reaped, and then
    /// nothing of the tree is left to reach.
    fn root(&self) -> Option<libc::pid_t> {
        self.child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
    }

    fn kill_all(&mut self) -> usize {
        self.root().map_or(0, |root| kill_tree(root).0)
    }
}

/// What [`ProcessTree::end`] did.
#[derive(Debug)]
pub(crate) struct Ended {
    /// How many processes it killed.
    pub killed: usize,
    /// The processes it may not signal (a setuid program's), which outlive the tree and may hold its pipes open.
    pub outliving: Vec<libc::pid_t>,
}

/// Kills the tree under `root` (our own unreaped child). Returns how many processes were killed, and those it may
/// not signal.
fn kill_tree(root: libc::pid_t) -> (usize, Vec<libc::pid_t>) {
    #[cfg(target_os = "linux")]
    {
        linux::kill_descendants(root, linux::signal)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // SAFETY: killpg has no memory-safety preconditions; the group is our unreaped child's.
        unsafe { libc::killpg(root, libc::SIGKILL) };
        (0, Vec::new())
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

    /// The supervisor's whole life: report the command's status, reap everything, exit when nothing is left. If
    /// the server goes away first (killed, crashed: the status pipe's reading end closes), it kills the tree
    /// itself.
    unsafe fn run_supervisor(command: pid_t, status_fd: RawFd) -> ! {
        // SAFETY: signal dispositions and masks, descriptor calls, poll, waitpid, kill, write and _exit are all
        // async-signal-safe and touch only this process and its descendants.
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
            // SIGCHLD through a descriptor, so that one poll waits both for a child to end and for the server to
            // go. (Without signalfd, the supervisor only waits for its children.)
            let mut children: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut children);
            libc::sigaddset(&mut children, libc::SIGCHLD);
            let ended = if libc::sigprocmask(libc::SIG_BLOCK, &children, std::ptr::null_mut()) == 0
            {
                libc::signalfd(-1, &children, libc::SFD_CLOEXEC)
            } else {
                -1
            };
            let mut reported = false;
            let mut server_gone = false;
            loop {
                // Reap whatever ended; the command's status goes to the server (once).
                loop {
                    let mut status = 0;
                    let reaped = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if reaped == command && !reported {
                        let bytes = status.to_ne_bytes();
                        libc::write(status_fd, bytes.as_ptr().cast(), bytes.len());
                        reported = true;
                    } else if reaped == 0 {
                        break;
                    } else if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                        // ECHILD: the whole tree is gone.
                        libc::_exit(0);
                    }
                }
                if server_gone {
                    kill_children();
                    let mut status = 0;
                    libc::waitpid(-1, &mut status, 0);
                    continue;
                }
                if ended < 0 {
                    let mut status = 0;
                    if libc::waitpid(-1, &mut status, 0) == command && !reported {
                        let bytes = status.to_ne_bytes();
                        libc::write(status_fd, bytes.as_ptr().cast(), bytes.len());
                        reported = true;
                    }
                    continue;
                }
                // The status pipe's writing end reports an error once nobody reads it: the server is gone.
                let mut waiting = [
                    libc::pollfd {
                        fd: ended,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: status_fd,
                        events: 0,
                        revents: 0,
                    },
                ];
                if libc::poll(waiting.as_mut_ptr(), 2, -1) < 0 {
                    continue;
                }
                if waiting[0].revents & libc::POLLIN != 0 {
                    let mut drained = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
                    libc::read(ended, drained.as_mut_ptr().cast(), drained.len());
                }
                if waiting[1].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                    server_gone = true;
                }
            }
        }
    }

    /// Kills every child of this process (the supervisor, whose server is gone): what they leave behind is
    /// re-parented to it, a subreaper, and killed on the next pass. It reaps nothing meanwhile, so no pid it reads
    /// is freed for reuse before its kill. Reads /proc with system calls and buffers on the stack only: the
    /// supervisor is a fork of a multi-threaded process, where the allocator's locks may be held.
    unsafe fn kill_children() {
        // SAFETY: open, getdents64, read, close and kill on buffers of this stack frame.
        unsafe {
            let me = libc::getpid();
            let proc = libc::open(
                c"/proc".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if proc < 0 {
                return;
            }
            let mut entries = [0u8; 4096];
            loop {
                let read = libc::syscall(
                    libc::SYS_getdents64,
                    proc,
                    entries.as_mut_ptr(),
                    entries.len(),
                );
                if read <= 0 {
                    break;
                }
                let mut at = 0usize;
                while at + 19 < read as usize {
                    // struct linux_dirent64: inode (8), offset (8), record length (2), type (1), name.
                    let length = u16::from_ne_bytes([entries[at + 16], entries[at + 17]]) as usize;
                    if length == 0 {
                        break;
                    }
                    let name = &entries[at + 19..(at + length).min(read as usize)];
                    if let Some(pid) = pid_of(name)
                        && parent_of(pid) == Some(me)
                    {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    at += length;
                }
            }
            libc::close(proc);
        }
    }

    /// The pid a /proc entry's NUL-terminated name is, if it is a number.
    fn pid_of(name: &[u8]) -> Option<pid_t> {
        let digits = &name[..name.iter().position(|&b| b == 0)?];
        if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0, |pid: pid_t, &digit| pid * 10 + pid_t::from(digit - b'0')),
        )
    }

    /// A process's parent, read from /proc/<pid>/stat without allocating.
    unsafe fn parent_of(pid: pid_t) -> Option<pid_t> {
        let mut path = [0u8; 32];
        let mut length = 0;
        for &b in b"/proc/" {
            path[length] = b;
            length += 1;
        }
        let mut digits = [0u8; 10];
        let mut count = 0;
        let mut rest = pid;
        loop {
            digits[count] = b'0' + (rest % 10) as u8;
            count += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        for i in (0..count).rev() {
            path[length] = digits[i];
            length += 1;
        }
        for &b in b"/stat" {
            path[length] = b;
            length += 1;
        }
        // SAFETY: the path is NUL-terminated (the buffer was zeroed), the read stays within the buffer.
        let stat = unsafe {
            let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return None;
            }
            let mut stat = [0u8; 1024];
            let read = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
            libc::close(fd);
            if read <= 0 {
                return None;
            }
            (stat, read as usize)
        };
        let text = &stat.0[..stat.1];
        let after_name = &text[text.iter().rposition(|&b| b == b')')? + 1..];
        // " S 1234 ...": the state, then the parent.
        let mut fields = after_name
            .split(|&b| b == b' ')
            .filter(|field| !field.is_empty());
        fields.next()?;
        let parent = fields.next()?;
        if parent.is_empty() || !parent.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(parent.iter().fold(0, |pid: pid_t, &digit| {
            pid.wrapping_mul(10) + pid_t::from(digit - b'0')
        }))
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

    /// Sends `signal` to `pid`; the error is the kernel's (`EPERM` for a process not ours to signal).
    pub(super) fn signal(pid: pid_t, signal: libc::c_int) -> io::Result<()> {
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Kills every living descendant of `supervisor` (our own unreaped child) with `kill`, then lets the
    /// supervisor reap them. Returns how many processes were killed, and those it may not signal. One that may not be signalled (a setuid
    /// program's, another user's: `EPERM`) is left at once and named in the log; one that does not die (stuck in
    /// the kernel) is looked at again, a moment apart, until [`KILL_PATIENCE`] has passed.
    pub(super) fn kill_descendants(
        supervisor: pid_t,
        kill: impl Fn(pid_t, libc::c_int) -> io::Result<()>,
    ) -> (usize, Vec<pid_t>) {
        // Stopped, the supervisor reaps nothing, so the pids of the processes it adopts stay theirs while this
        // reads and kills them. (A process of the tree that reaps its own child could free a pid between a pass and
        // its kill; reuse of that very pid within microseconds would need the whole pid space to wrap.)
        let _ = signal(supervisor, libc::SIGSTOP);
        let deadline = Instant::now() + KILL_PATIENCE;
        let mut killed = HashSet::new();
        let mut not_ours = HashSet::new();
        for pass in 0.. {
            let living: Vec<pid_t> = living_descendants(supervisor)
                .into_iter()
                .filter(|pid| !not_ours.contains(pid))
                .collect();
            if living.is_empty() {
                break;
            }
            for &pid in &living {
                match kill(pid, libc::SIGKILL) {
                    Err(error) if error.raw_os_error() == Some(libc::EPERM) => {
                        not_ours.insert(pid);
                    }
                    _ => {
                        killed.insert(pid);
                    }
                }
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    supervisor,
                    left = living.len(),
                    "processes of a command did not die when killed"
                );
                break;
            }
            // A killed process takes a moment to become a zombie; look again once it had the chance: at once the
            // first times, then a few milliseconds apart, so that one that does not die costs no core meanwhile.
            if pass < 8 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let mut pids: Vec<pid_t> = not_ours.into_iter().collect();
        pids.sort_unstable();
        if !pids.is_empty() {
            tracing::warn!(
                supervisor,
                ?pids,
                "processes a command started could not be killed: toolgate may not signal them (a setuid program's, another user's), so they outlive it"
            );
        }
        let _ = signal(supervisor, libc::SIGCONT);
        (killed.len(), pids)
    }

    /// Sends `sent` once to every living descendant of `supervisor` (our own unreaped child), with the supervisor
    /// stopped meanwhile, as in [`kill_descendants`], so that no pid read is freed before its signal.
    // Only MCP's servers talk to their command over its input, and are asked to stop politely.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(super) fn signal_descendants(supervisor: pid_t, sent: libc::c_int) {
        let _ = signal(supervisor, libc::SIGSTOP);
        for pid in living_descendants(supervisor) {
            let _ = signal(pid, sent);
        }
        let _ = signal(supervisor, libc::SIGCONT);
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

        /// A process toolgate may not signal (a setuid program's: `kill` answers `EPERM`) is left at once, named,
        /// and the rest of the tree dies. Before, the passes went on reading `/proc` without a pause until the
        /// patience ran out, on a worker of the runtime.
        #[tokio::test]
        async fn a_process_that_may_not_be_signalled_is_left_at_once_and_the_rest_dies() {
            let mut command = tokio::process::Command::new("sh");
            command
                .args(["-c", "sleep 30 & sleep 30 & wait"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let tree = super::super::ProcessTree::spawn(&mut command).unwrap();
            let supervisor = tree.root().unwrap();
            let living = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let living = living_descendants(supervisor);
                    if living.len() >= 3 {
                        return living;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("sh and its two sleeps start");
            let spared = *living.iter().max().unwrap();
            let started = Instant::now();
            let (killed, not_ours) = kill_descendants(supervisor, |pid, sent| {
                if pid == spared {
                    Err(io::Error::from_raw_os_error(libc::EPERM))
                } else {
                    signal(pid, sent)
                }
            });
            assert!(started.elapsed() < KILL_PATIENCE, "{:?}", started.elapsed());
            assert_eq!(not_ours, [spared]);
            assert_eq!(killed, living.len() - 1);
            signal(spared, libc::SIGKILL).unwrap();
            tree.end().await;
        }

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
