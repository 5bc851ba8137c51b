//! What Linux tells about a process: CPU time and resident memory from /proc, the open-files limit, the machine.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Clock ticks per second, the unit of `utime` and `stime` in /proc/PID/stat (`getconf CLK_TCK`).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
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

    /// The CPU time spent since `earlier`.
    pub fn since(&self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

pub fn cpu_time(pid: u32) -> Result<CpuTime> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_cpu_time(&stat, clock_ticks()).with_context(|| format!("unexpected contents of {path}"))
}

fn parse_cpu_time(stat: &str, ticks_per_second: u64) -> Result<CpuTime> {
    // The command name (field 2) is in parentheses and may contain spaces: count fields after the last ')'.
    let after_name = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("no ')' after the command name")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime is field 14 and stime field 15.
    let ticks = |index: usize, name: &str| -> Result<Duration> {
        let ticks = fields
            .get(index)
            .with_context(|| format!("no {name} field"))?
            .parse::<u64>()
            .with_context(|| format!("{name} is not a number"))?;
        Ok(Duration::from_nanos(
            ticks.saturating_mul(1_000_000_000) / ticks_per_second,
        ))
    };
    Ok(CpuTime {
        user: ticks(11, "utime")?,
        system: ticks(12, "stime")?,
    })
}

/// The CPU time of this process.
pub fn own_cpu_time() -> Result<CpuTime> {
    cpu_time(std::process::id())
}

/// Resident memory of a process, from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// VmRSS, in bytes.
    pub rss_bytes: u64,
    /// VmHWM (the peak of VmRSS so far), in bytes.
    pub peak_rss_bytes: u64,
}

pub fn memory(pid: u32) -> Result<Memory> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_memory(&status).with_context(|| format!("unexpected contents of {path}"))
}

fn parse_memory(status: &str) -> Result<Memory> {
    let kib = |key: &str| -> Result<u64> {
        let line = status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .with_context(|| format!("no {key} line"))?;
        let number = line
            .trim()
            .strip_suffix("kB")
            .with_context(|| format!("{key} is not in kB"))?;
        number
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{key} is not a number"))
    };
    Ok(Memory {
        rss_bytes: kib("VmRSS:")? * 1024,
        peak_rss_bytes: kib("VmHWM:")? * 1024,
    })
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
    let path = format!("/proc/{pid}/limits");
    let limits = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .with_context(|| format!("no 'Max open files' line in {path}"))?;
    let soft = line["Max open files".len()..]
        .split_whitespace()
        .next()
        .with_context(|| format!("no soft limit in {path}"))?;
    if soft == "unlimited" {
        return Ok(u64::MAX);
    }
    soft.parse()
        .with_context(|| format!("the soft open-files limit in {path} is not a number"))
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
        let read = |path: &str| std::fs::read_to_string(Path::new(path)).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let memory_mib = read("/proc/meminfo")
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        Self {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            memory_mib,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            clock_ticks_per_second: clock_ticks(),
            load_average: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_utime_plus_stime_even_with_spaces_in_the_name() {
        let stat =
            "4242 (tool gate) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 50 0 0 20 0 9 0 100 0 0";
        let cpu = parse_cpu_time(stat, 100).unwrap();
        assert_eq!(cpu.user, Duration::from_millis(1500));
        assert_eq!(cpu.system, Duration::from_millis(500));
        assert_eq!(cpu.total(), Duration::from_millis(2000));
    }

    #[test]
    fn memory_is_read_in_bytes() {
        let status = "Name:\ttoolgate\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        let memory = parse_memory(status).unwrap();
        assert_eq!(memory.rss_bytes, 10 * 1024 * 1024);
        assert_eq!(memory.peak_rss_bytes, 20 * 1024 * 1024);
    }

    #[test]
    fn this_process_can_be_read() {
        let pid = std::process::id();
        assert!(memory(pid).unwrap().rss_bytes > 0);
        cpu_time(pid).unwrap();
        assert!(open_files_limit(pid).unwrap() > 0);
    }
}
