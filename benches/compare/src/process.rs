//! Processes the benchmark starts (the lease server, Redis) and who spent the CPU: the
//! benchmark itself (`getrusage`), a child (`/proc/PID/stat`) and the whole machine
//! (`/proc/stat`), so that a reader sees which side was busy in each run.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, SysconfVar, sysconf};

/// A child process with its output in a log file. Killed (with its process group) when
/// dropped, so that an error, a panic or Ctrl-C never leaves one running.
pub struct Proc {
    child: Child,
    name: String,
    log: PathBuf,
}

impl Proc {
    /// Starts `command` in a process group of its own (a Ctrl-C in the terminal reaches the
    /// benchmark alone, which then stops its children itself), stdout and stderr appended to
    /// `log`.
    pub fn spawn(mut command: Command, name: &str, log: &Path) -> anyhow::Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", command.get_program()))?;
        Ok(Self {
            child,
            name: name.to_owned(),
            log: log.to_owned(),
        })
    }

    /// Starts `command` as [`spawn`](Self::spawn) does, then asks `ready` every 25 ms until
    /// it answers `true`; fails with the end of the log if the process exits first or is not
    /// ready within `limit`.
    pub async fn start<F: Future<Output = bool>>(
        command: Command,
        name: &str,
        log: &Path,
        limit: Duration,
        mut ready: impl FnMut() -> F,
    ) -> anyhow::Result<Self> {
        let mut process = Self::spawn(command, name, log)?;
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = process.exited() {
                bail!(
                    "{name} exited during start-up ({status}):\n{}",
                    process.log_tail(20)
                );
            }
            if ready().await {
                return Ok(process);
            }
            if Instant::now() > until {
                bail!(
                    "{name} was not ready within {} s:\n{}",
                    limit.as_secs(),
                    process.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some` once the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process's peak resident set size (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        self.status_kib("VmHWM")
    }

    /// The process's resident set size now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        self.status_kib("VmRSS")
    }

    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {field} in /proc/PID/status"))
    }

    /// The last `lines` lines of the log, for an error message.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Asks the process to stop (SIGTERM) and waits for it, killing it after `grace`.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        let _ = kill(self.pid_t(), Signal::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = killpg(self.pid_t(), Signal::SIGKILL);
        let _ = self.child.wait();
        bail!(
            "{} did not stop within {grace:?} of SIGTERM and was killed",
            self.name
        )
    }

    fn pid_t(&self) -> Pid {
        Pid::from_raw(self.pid() as i32)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = killpg(self.pid_t(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The last `lines` lines of the file at `path` (at most its last 64 KiB are read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process could take it before
/// the child binds it; the child then fails to start, and says so.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Raises this process's open-file limit to its hard limit: the idle-connection measurement
/// holds a thousand sockets.
pub fn raise_open_file_limit() -> anyhow::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(hard)
}

fn clock_ticks() -> f64 {
    sysconf(SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// The figures of one `/proc/PID/stat` this module uses.
struct Stat {
    command: String,
    parent: u32,
    /// utime + stime, in clock ticks.
    own: u64,
    /// cutime + cstime: what its ended, waited-for children used, in clock ticks.
    children: u64,
}

fn read_stat(pid: u32) -> anyhow::Result<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?)
}

fn parse_stat(stat: &str) -> anyhow::Result<Stat> {
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let open = stat.find('(').context("malformed /proc/PID/stat")?;
    let close = stat.rfind(')').context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
    };
    Ok(Stat {
        command: stat[open + 1..close].to_owned(),
        parent: u32::try_from(field(1)?)?,
        own: field(11)? + field(12)?,
        children: field(13)? + field(14)?,
    })
}

fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

/// CPU time of process `pid` from `/proc/PID/stat` (`utime` + `stime`).
pub fn process_cpu(pid: u32) -> anyhow::Result<Duration> {
    Ok(ticks_to_duration(read_stat(pid)?.own))
}

/// CPU time used so far by PostgreSQL on this machine: every process named `postgres`, plus
/// what each postmaster has collected from its ended backends (so that backends ending
/// within an interval still count). `None` when no such process is visible (PostgreSQL on
/// another machine).
pub fn postgres_cpu() -> Option<Duration> {
    let stats: Vec<(u32, Stat)> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(pid).ok()?)))
        .filter(|(_, s)| s.command == "postgres")
        .collect();
    if stats.is_empty() {
        return None;
    }
    let pids: std::collections::HashSet<u32> = stats.iter().map(|(pid, _)| *pid).collect();
    let ticks: u64 = stats
        .iter()
        .map(|(_, s)| {
            let postmaster = !pids.contains(&s.parent);
            s.own + if postmaster { s.children } else { 0 }
        })
        .sum();
    Some(ticks_to_duration(ticks))
}

/// CPU time used by this process (all its threads) so far.
pub fn own_cpu() -> Duration {
    rusage(UsageWho::RUSAGE_SELF)
}

/// CPU time used by this process's children that have ended and been waited for.
pub fn children_cpu() -> Duration {
    rusage(UsageWho::RUSAGE_CHILDREN)
}

fn rusage(who: UsageWho) -> Duration {
    getrusage(who).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// The machine's CPU counters (`/proc/stat`), in clock ticks, all cores together.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineCpu {
    busy: u64,
    iowait: u64,
}

impl MachineCpu {
    pub fn now() -> Self {
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
            return Self::default();
        };
        let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
            return Self::default();
        };
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|f| f.parse().ok())
            .collect();
        if v.len() < 8 {
            return Self::default();
        }
        Self {
            busy: v[0] + v[1] + v[2] + v[5] + v[6] + v[7],
            iowait: v[4],
        }
    }
}

/// Where the CPU went during one measured interval, in cores (CPU seconds per second).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    /// The load generator: this process, or pgbench.
    pub client: f64,
    /// The server under load (fencelock, Redis); `None` when it cannot be told apart
    /// (PostgreSQL's backends under pgbench).
    pub server: Option<f64>,
    /// PostgreSQL's processes, when it runs on this machine and the run uses it.
    pub database: Option<f64>,
    /// Every process on the machine, the ones above included.
    pub machine_busy: f64,
    /// Time the machine's cores sat idle waiting for I/O.
    pub machine_iowait: f64,
}

/// CPU counters at the start of an interval.
pub struct CpuMeter {
    started: Instant,
    own: Duration,
    server: Option<(u32, Duration)>,
    database: Option<Duration>,
    machine: MachineCpu,
}

impl CpuMeter {
    /// Starts measuring this process, the machine, `server` if given, and PostgreSQL if
    /// `database`.
    pub fn start(server: Option<u32>, database: bool) -> Self {
        Self {
            started: Instant::now(),
            own: own_cpu(),
            server: server.and_then(|pid| process_cpu(pid).ok().map(|cpu| (pid, cpu))),
            database: if database { postgres_cpu() } else { None },
            machine: MachineCpu::now(),
        }
    }

    /// The CPU used since [`CpuMeter::start`], and the wall time it was spread over.
    pub fn finish(&self) -> (CpuUse, Duration) {
        let wall = self.started.elapsed();
        let secs = wall.as_secs_f64().max(1e-9);
        let machine = MachineCpu::now();
        let ticks = clock_ticks();
        let cores = |d: Duration| d.as_secs_f64() / secs;
        let use_ = CpuUse {
            client: cores(own_cpu().saturating_sub(self.own)),
            server: self.server.and_then(|(pid, before)| {
                process_cpu(pid)
                    .ok()
                    .map(|now| cores(now.saturating_sub(before)))
            }),
            database: self
                .database
                .and_then(|before| Some(cores(postgres_cpu()?.saturating_sub(before)))),
            machine_busy: machine.busy.saturating_sub(self.machine.busy) as f64 / ticks / secs,
            machine_iowait: machine.iowait.saturating_sub(self.machine.iowait) as f64
                / ticks
                / secs,
        };
        (use_, wall)
    }

    /// Like [`CpuMeter::finish`], with the client's CPU given (a child's, from
    /// [`children_cpu`]) instead of this process's.
    pub fn finish_with_client(&self, client: Duration) -> (CpuUse, Duration) {
        let (mut use_, wall) = self.finish();
        use_.client = client.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        (use_, wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_grows_with_work() {
        let before = own_cpu();
        let until = Instant::now() + Duration::from_millis(50);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        assert!(x != 1);
        assert!(own_cpu() > before);
    }

    #[test]
    fn stat_reads_a_command_with_spaces_and_parentheses() {
        let line = "1234 (a (b) c) S 77 1234 1234 0 -1 4194560 1000 0 0 0 50 25 3 4 20 0 1 0 100";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.command, "a (b) c");
        assert_eq!((stat.parent, stat.own, stat.children), (77, 75, 7));
        assert!(parse_stat("1234 (x) S 1").is_err());
    }

    #[test]
    fn process_cpu_reads_this_process() {
        let cpu = process_cpu(std::process::id()).expect("own /proc/PID/stat");
        assert!(cpu < Duration::from_secs(24 * 3600));
    }
}
