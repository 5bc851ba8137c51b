//! What Linux tells about a process and the machine: CPU time and resident memory, the open-files limit, the CPU
//! and memory. Read with the `procfs` crate; raising the limit and the port range are the two things it does not do.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use procfs::Current;
use procfs::process::{LimitValue, Process};

/// Clock ticks per second, the unit of `utime` and `stime` in /proc/PID/stat (`getconf CLK_TCK`).
pub fn clock_ticks() -> u64 {
    procfs::ticks_per_second()
}

/// CPU time of a whole process (every thread, including threads that already exited), from /proc/PID/stat. Its
/// resolution is one clock tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTime {
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// The CPU time of this and `other` together.
    pub fn plus(&self, other: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }

    /// The CPU time spent since `earlier`.
    pub fn since(&self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    fn from_stat(stat: &procfs::process::Stat, ticks_per_second: u64) -> Self {
        let time = |ticks: u64| {
            Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / ticks_per_second.max(1))
        };
        Self {
            user: time(stat.utime),
            system: time(stat.stime),
        }
    }
}

fn process(pid: u32) -> Result<Process> {
    let pid = i32::try_from(pid).context("a process id out of range")?;
    Process::new(pid).with_context(|| format!("cannot open /proc/{pid}"))
}

/// The CPU time of a process.
pub fn cpu_time(pid: u32) -> Result<CpuTime> {
    let stat = process(pid)?
        .stat()
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    Ok(CpuTime::from_stat(&stat, clock_ticks()))
}

/// The CPU time of this process.
pub fn own_cpu_time() -> Result<CpuTime> {
    cpu_time(std::process::id())
}

/// Resident memory of a process, from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Of `rss_bytes`, the process's own memory (RssAnon): its heap and stacks.
    pub anon_bytes: u64,
    /// Of `rss_bytes`, pages of files it maps (RssFile): its binary's code and data, shared with the page cache.
    pub file_bytes: u64,
}

impl Memory {
    fn from_status(status: &procfs::process::Status) -> Result<Self> {
        let kib = |value: Option<u64>, name: &str| value.with_context(|| format!("no {name} line"));
        Ok(Self {
            rss_bytes: kib(status.vmrss, "VmRSS")? * 1024,
            peak_rss_bytes: kib(status.vmhwm, "VmHWM")? * 1024,
            anon_bytes: kib(status.rssanon, "RssAnon")? * 1024,
            file_bytes: kib(status.rssfile, "RssFile")? * 1024,
        })
    }
}

/// The resident memory of a process.
pub fn memory(pid: u32) -> Result<Memory> {
    let status = process(pid)?
        .status()
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    Memory::from_status(&status)
}

/// Raises this process's soft open-files limit to its hard limit and returns the new soft limit. Children inherit
/// it, so the server started afterwards gets it too.
pub fn raise_open_files_limit() -> Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        bail!(
            "getrlimit(RLIMIT_NOFILE) failed: {}",
            std::io::Error::last_os_error()
        );
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            bail!(
                "setrlimit(RLIMIT_NOFILE, {}) failed: {}",
                limit.rlim_max,
                std::io::Error::last_os_error()
            );
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

/// The soft open-files limit of a running process, from /proc/PID/limits.
pub fn open_files_limit(pid: u32) -> Result<u64> {
    let limits = process(pid)?
        .limits()
        .with_context(|| format!("cannot read /proc/{pid}/limits"))?;
    Ok(match limits.max_open_files.soft_limit {
        LimitValue::Unlimited => u64::MAX,
        LimitValue::Value(limit) => limit,
    })
}

/// How many local ports the kernel hands out to outgoing connections (net.ipv4.ip_local_port_range).
pub fn ephemeral_ports() -> Result<u64> {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let range = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let bounds: Vec<u64> = range
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("unexpected contents of {path}"))?;
    match bounds.as_slice() {
        [low, high] if high >= low => Ok(high - low + 1),
        _ => bail!("unexpected contents of {path}: {range:?}"),
    }
}

/// A line about the machine, for the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    pub kernel: String,
    pub clock_ticks_per_second: u64,
    /// The 1, 5 and 15 minute load averages when the bench started: other work on the machine shares its CPUs.
    pub load_average: String,
}

impl Machine {
    pub fn detect() -> Self {
        let cpu_model = procfs::CpuInfo::current()
            .ok()
            .and_then(|info| info.model_name(0).map(str::to_owned))
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let memory_mib =
            procfs::Meminfo::current().map_or(0, |info| info.mem_total / (1024 * 1024));
        let kernel = procfs::sys::kernel::Version::current()
            .map(|version| format!("{}.{}.{}", version.major, version.minor, version.patch))
            .unwrap_or_default();
        let load_average = procfs::LoadAverage::current()
            .map(|load| format!("{} {} {}", load.one, load.five, load.fifteen))
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            memory_mib,
            kernel,
            clock_ticks_per_second: clock_ticks(),
            load_average,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::FromRead;

    #[test]
    fn cpu_time_is_utime_plus_stime_even_with_spaces_in_the_name() {
        // A whole line as Linux writes it (every field procfs reads), with a space in the command's name.
        let stat = "4242 (tool gate) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 50 0 0 20 0 9 0 100 \
                    1290240000 6000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 \
                    0 0 0 0 0 0 0 0 0\n";
        let stat = procfs::process::Stat::from_read(stat.as_bytes()).unwrap();
        let cpu = CpuTime::from_stat(&stat, 100);
        assert_eq!(cpu.user, Duration::from_millis(1500));
        assert_eq!(cpu.system, Duration::from_millis(500));
        assert_eq!(cpu.total(), Duration::from_millis(2000));
    }

    #[test]
    fn memory_is_read_in_bytes() {
        let status = "Name:\ttoolgate\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t1\nNgid:\t0\nPid:\t1\nPPid:\t0\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t64\nGroups:\t\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nRssAnon:\t    2048 kB\nRssFile:\t    8192 kB\nRssShmem:\t       0 kB\nThreads:\t1\nSigQ:\t0/1\nSigPnd:\t0\nShdPnd:\t0\nSigBlk:\t0\nSigIgn:\t0\nSigCgt:\t0\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\nCapBnd:\t0\nCapAmb:\t0\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed:\t1\nMems_allowed_list:\t0\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t1\n";
        let status = procfs::process::Status::from_read(status.as_bytes()).unwrap();
        let memory = Memory::from_status(&status).unwrap();
        assert_eq!(memory.rss_bytes, 10 * 1024 * 1024);
        assert_eq!(memory.peak_rss_bytes, 20 * 1024 * 1024);
        assert_eq!(memory.anon_bytes, 2 * 1024 * 1024);
        assert_eq!(memory.file_bytes, 8 * 1024 * 1024);
    }

    #[test]
    fn this_process_can_be_read() {
        let pid = std::process::id();
        assert!(memory(pid).unwrap().rss_bytes > 0);
        cpu_time(pid).unwrap();
        assert!(open_files_limit(pid).unwrap() > 0);
    }
}
