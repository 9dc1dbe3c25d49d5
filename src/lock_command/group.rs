//! CMD's process group, and the sentinel that kills it if `fencelock lock` dies.
//!
//! Signals that stop CMD go to its whole process group, so that what CMD started (a
//! pipeline, a `sleep` under `sh -c`) stops with it. `fencelock lock` cannot stop anything
//! once it is dead itself (`kill -9`, the OOM killer), and nothing else would, while its
//! lease runs out; so a sentinel does: a second child (`fencelock lock-sentinel`, this
//! binary) that reads a pipe only `fencelock lock` holds open. The kernel closes the pipe
//! when `fencelock lock` ends, however it ends; the sentinel then sends SIGKILL to the group.
//! SIGKILL, not SIGTERM: nobody renews the lease any more and nobody knows how long it has
//! left, and a SIGTERM that CMD traps and ignores would leave it running.
//!
//! The order leaves no gap: the sentinel starts first, as the leader of a new group; CMD
//! joins that group; then the sentinel leaves it for `fencelock lock`'s own group (so that
//! the signals meant for CMD pass it by, and the group is empty once CMD's processes are
//! gone). If `fencelock lock` dies at any point in between, the sentinel still kills the
//! group, CMD with it. The group's number cannot be reused while the sentinel lives: it is
//! the sentinel's process id.
//!
//! (`PR_SET_PDEATHSIG` would need code between `fork` and `exec`, which is `unsafe`, and this
//! crate forbids it; it would also reach CMD alone, not the processes CMD started.)
//!
//! Limits: a process that leaves the group (`setsid`, a daemon) is out of reach, as it is
//! for the terminal and the shell. On Linux `fencelock lock` is a child subreaper, so that
//! it reaps the group's orphans itself and "the group is empty" is never held up by zombies
//! that nobody reaps (as in a container whose init does not).

use std::io::{self, Read as _, Write as _};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::unistd::{Pid, getpgrp, setpgid};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long the sentinel may take to start, or to answer.
const SENTINEL_PATIENCE: Duration = Duration::from_secs(10);

/// CMD's process group, led (until CMD has joined it) by the sentinel.
pub(super) struct Group {
    pgid: Pid,
    sentinel: Child,
    /// The sentinel's lifeline: dropping it (or dying) makes it kill the group.
    lifeline: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

impl Group {
    /// Starts the sentinel in a new process group: the group CMD is to join.
    pub(super) fn start() -> io::Result<Self> {
        become_subreaper();
        let mut sentinel = Command::new(own_executable()?)
            .arg0("fencelock")
            .arg("lock-sentinel")
            .arg(getpgrp().as_raw().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let pgid = sentinel
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| io::Error::other("the sentinel ended at once"))?;
        let lifeline = sentinel.stdin.take();
        let answers = sentinel
            .stdout
            .take()
            .map(BufReader::new)
            .ok_or_else(|| io::Error::other("no pipe from the sentinel"))?;
        Ok(Self {
            pgid,
            sentinel,
            lifeline,
            answers,
        })
    }

    /// Starts `command` in the group.
    pub(super) fn spawn(&self, command: &mut Command) -> io::Result<Child> {
        command.process_group(self.pgid.as_raw()).spawn()
    }

    /// Has the sentinel leave the group, now that CMD is in it, and waits until it has.
    pub(super) async fn seal(&mut self) -> io::Result<()> {
        let lifeline = self
            .lifeline
            .as_mut()
            .ok_or_else(|| io::Error::other("the sentinel's pipe is closed"))?;
        let answer = tokio::time::timeout(SENTINEL_PATIENCE, async {
            lifeline.write_all(b"L").await?;
            lifeline.flush().await?;
            let mut answer = String::new();
            self.answers.read_line(&mut answer).await?;
            io::Result::Ok(answer)
        })
        .await
        .map_err(|_| io::Error::other("the sentinel did not answer"))??;
        match answer.trim() {
            "left" => Ok(()),
            "" => Err(io::Error::other("the sentinel ended")),
            other => Err(io::Error::other(format!("the sentinel: {other}"))),
        }
    }

    /// Sends `signal` to every process of the group, then SIGCONT, so that a stopped one
    /// (a Ctrl-Z, or a read from the terminal) acts on it too. A group already empty is not
    /// an error.
    pub(super) fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
        if !matches!(signal, Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGCONT) {
            let _ = killpg(self.pgid, Signal::SIGCONT);
        }
    }

    /// A Ctrl-Z (SIGTSTP): stops the group and `fencelock lock` with it, as a shell stops a
    /// job, and continues the group when `fencelock lock` is continued (`fg`, `bg`). While
    /// stopped nothing renews the lease; once continued, a lease that has run out meanwhile
    /// stops CMD as any other loss does.
    pub(super) fn suspend(&self) {
        let _ = killpg(self.pgid, Signal::SIGSTOP);
        suspend_self();
        let _ = killpg(self.pgid, Signal::SIGCONT);
    }

    /// True once no process is left in the group. Call it only after CMD itself has been
    /// waited for: it reaps the group's other processes that have become our children.
    pub(super) fn is_empty(&self) -> bool {
        reap_orphans(self.pgid);
        killpg(self.pgid, None) == Err(Errno::ESRCH)
    }

    /// Lets the sentinel go (the group is empty, or must be killed now) and waits for it.
    pub(super) async fn close(mut self) {
        drop(self.lifeline.take());
        if tokio::time::timeout(SENTINEL_PATIENCE, self.sentinel.wait())
            .await
            .is_err()
        {
            let _ = self.sentinel.start_kill();
        }
    }
}

/// Stops this process until it is continued. The lease and its runtime stop with it.
pub(super) fn suspend_self() {
    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
}

/// This binary, to run again as the sentinel. On Linux the running file itself, so that an
/// upgrade that replaced it on disk meanwhile makes no difference.
fn own_executable() -> io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

#[cfg(target_os = "linux")]
fn become_subreaper() {
    // Best effort: without it, the group's orphans go to init, which should reap them.
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() {}

/// Reaps every process of group `pgid` that is our child (an orphan handed to us, as a
/// subreaper) and has ended.
fn reap_orphans(pgid: Pid) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let group = Pid::from_raw(-pgid.as_raw());
    while let Ok(status) = waitpid(group, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// `fencelock lock-sentinel JOIN`: the sentinel's whole life. Its stdin is the lifeline: a
/// byte means "CMD is in the group: leave it for group JOIN"; the end of the pipe means
/// `fencelock lock` is done or dead, and the group gets SIGKILL.
pub(crate) fn sentinel(join: i32) -> ExitCode {
    let group = getpgrp();
    // The terminal's signals reach the sentinel once it is in `fencelock lock`'s group, and
    // the group's reach it until then; they are all meant for others. Blocked, not ignored,
    // so that nothing changes for the processes it signals.
    let mut blocked = SigSet::empty();
    for signal in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGHUP,
        Signal::SIGTERM,
    ] {
        blocked.add(signal);
    }
    let _ = blocked.thread_block();
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    let mut byte = [0u8; 1];
    loop {
        match stdin.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {
                let answer = match setpgid(Pid::from_raw(0), Pid::from_raw(join)) {
                    Ok(()) => "left".to_owned(),
                    Err(e) => format!("cannot leave the group: {e}"),
                };
                let _ = writeln!(stdout, "{answer}");
                let _ = stdout.flush();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // Still in the group if it never left: then this ends the sentinel too.
    let _ = killpg(group, Signal::SIGKILL);
    ExitCode::SUCCESS
}
