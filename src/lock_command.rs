//! `fencelock lock RESOURCE -- CMD ARGS...`: run a command while holding a lease.
//!
//! The lease comes from [`Client::lock`] (one request; the server waits when
//! `--wait-seconds` asks it to) and renews itself in the background ([`Lease`]). This module
//! only joins the lease to a child process:
//!
//! - CMD runs with `FENCELOCK_RESOURCE`, `FENCELOCK_FENCE`, `FENCELOCK_FENCE_TOKEN` (only
//!   when the server signs fences; otherwise removed, so a stale one from the caller's
//!   environment cannot leak through) and `FENCELOCK_URL`; stdin, stdout and stderr are
//!   the caller's.
//! - The lease is released when CMD ends, whatever its status.
//! - Lost lease (renewal refused, or none confirmed before the TTL less a margin): CMD gets
//!   SIGTERM, then SIGKILL after the grace period, and the exit status is [`LEASE_LOST`],
//!   whatever CMD's own was: work cut short must never look like success.
//! - SIGTERM, SIGINT and SIGHUP sent to `fencelock lock` go on to CMD, which decides what
//!   they mean; `fencelock lock` goes on until CMD ends. A Ctrl-C at a terminal reaches CMD
//!   directly as well (it is in the same process group) and once more through us.
//! - Everything `fencelock lock` says is one line on stderr, prefixed `fencelock lock:`.
//!   The renewal task's retries are not logged: they are no failure until the lease is lost.

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::config::LockArgs;
use fencelock::client::{Client, Error, Lease};

/// RESOURCE was held by another owner for the whole wait (`EX_TEMPFAIL`).
pub(crate) const HELD: u8 = 75;
/// The lease server could not be reached, could not answer, or refused the request
/// (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lease was lost while CMD ran, and CMD was stopped (as `timeout(1)` says it stopped
/// its command).
pub(crate) const LEASE_LOST: u8 = 124;
/// CMD could not be run (as shells and `env(1)` say).
pub(crate) const CANNOT_RUN: u8 = 126;
/// CMD was not found (as shells and `env(1)` say).
pub(crate) const NOT_FOUND: u8 = 127;
/// Bad arguments (an unusable `--url` or `--token`), as for every `fencelock` command.
pub(crate) const USAGE: u8 = 2;

/// Runs `fencelock lock` to its end on a runtime of its own and gives its exit status.
pub(crate) fn main(args: LockArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let code = match runtime {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(e) => {
            say(&format!("cannot start: {e}"));
            CANNOT_RUN
        }
    };
    ExitCode::from(code)
}

/// The whole command: acquire, run CMD under the lease, release. Returns the exit status.
async fn run(args: LockArgs) -> u8 {
    let resource = args.resource.as_str();
    // Taken over before the lease exists, so that a signal while waiting for it is ours to
    // answer (and CMD never starts), and no signal is lost between acquiring and spawning.
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            say(&format!("cannot handle signals: {e}"));
            return CANNOT_RUN;
        }
    };
    let mut client = Client::builder(&args.url);
    if let Some(token) = &args.token {
        client = client.bearer_token(token);
    }
    let client = match client.build() {
        Ok(client) => client,
        Err(e) => {
            say(&format!("--url or --token: {e}"));
            return USAGE;
        }
    };
    let ttl = Duration::from_secs(u64::from(args.ttl_seconds));
    let wait = Duration::from_secs(u64::from(args.wait_seconds));
    let acquired = tokio::select! {
        acquired = client.lock(resource, ttl, wait) => acquired,
        signal = signals.recv() => {
            // Dropping the request closes its connection: a waiting server drops us from its
            // queue, and a lease granted unseen lapses at the end of its TTL.
            say(&format!("{signal} while acquiring `{resource}`; CMD not run"));
            return signal_status(signal as i32);
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(Error::Held { .. }) if wait.is_zero() => {
            say(&format!("`{resource}` is held by another owner"));
            return HELD;
        }
        Err(Error::Held { .. }) => {
            say(&format!(
                "`{resource}` is still held by another owner after waiting {} s",
                args.wait_seconds
            ));
            return HELD;
        }
        Err(e) => {
            say(&format!(
                "cannot acquire `{resource}` from {}: {e}",
                args.url
            ));
            return UNAVAILABLE;
        }
    };
    let mut child = match spawn(&args, &lease) {
        Ok(child) => child,
        Err(e) => {
            let _ = lease.release().await;
            let program = args.command[0].to_string_lossy();
            say(&format!("cannot run `{program}`: {e}"));
            return if e.kind() == io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_RUN
            };
        }
    };
    let grace = Duration::from_secs(u64::from(args.grace_seconds));
    match supervise(&mut child, &lease, &mut signals, grace).await {
        Ok(Ended::Exited(status)) => {
            if let Err(e) = lease.release().await {
                say(&format!(
                    "CMD ended, but the lease on `{resource}` was not released ({e}); it lapses by itself"
                ));
            }
            exit_status(status)
        }
        Ok(Ended::LeaseLost) => LEASE_LOST,
        Err(e) => {
            // Waiting for our own child failed: nothing sensible is left to do but stop it.
            let _ = child.start_kill();
            say(&format!("lost track of CMD: {e}"));
            CANNOT_RUN
        }
    }
}

/// How CMD's run ended.
enum Ended {
    /// CMD ended while the lease was held.
    Exited(ExitStatus),
    /// The lease was lost; CMD was stopped and has ended.
    LeaseLost,
}

/// Starts CMD with the lease in its environment.
fn spawn(args: &LockArgs, lease: &Lease) -> io::Result<Child> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("FENCELOCK_RESOURCE", &args.resource)
        .env("FENCELOCK_FENCE", lease.fence().to_string())
        .env("FENCELOCK_URL", &args.url);
    match lease.fence_token() {
        Some(token) => command.env("FENCELOCK_FENCE_TOKEN", token),
        None => command.env_remove("FENCELOCK_FENCE_TOKEN"),
    };
    command.spawn()
}

/// Waits for CMD to end, passing signals on, and stops it if the lease is lost.
async fn supervise(
    child: &mut Child,
    lease: &Lease,
    signals: &mut Signals,
    grace: Duration,
) -> io::Result<Ended> {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    // Once the lease is lost: when CMD gets SIGKILL, and whether it has had it.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        tokio::select! {
            // CMD's end first: a status it has reached is the truth, even if the loss or a
            // signal is noticed in the same poll.
            biased;
            status = child.wait() => {
                let status = status?;
                return Ok(if kill_at.is_some() { Ended::LeaseLost } else { Ended::Exited(status) });
            }
            signal = signals.recv() => send(pid, signal),
            reason = lease.lost(), if kill_at.is_none() => {
                let resource = lease.resource();
                say(&format!(
                    "lost the lease on `{resource}` ({reason}): stopping CMD (SIGTERM, then SIGKILL after {} s)",
                    grace.as_secs()
                ));
                send(pid, Signal::SIGTERM);
                kill_at = Some(Instant::now() + grace);
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                killed = true;
                child.start_kill()?;
            }
        }
    }
}

/// Sends `signal` to CMD. CMD may have ended unseen (not yet reaped), which is harmless.
fn send(pid: Option<Pid>, signal: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, signal);
    }
}

/// The signals passed on to CMD.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal that arrives. Cancel-safe.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// CMD's status as a shell gives it: its exit code, or 128+N if signal N ended it.
fn exit_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => signal_status(signal),
        (None, None) => 1,
    }
}

/// 128+N for signal N, as shells report a command ended by it.
fn signal_status(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// One line on stderr.
fn say(message: &str) {
    let line = message.replace('\n', "; ");
    eprintln!("fencelock lock: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_reported_as_shells_do() {
        assert_eq!(exit_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_status(ExitStatus::from_raw(7 << 8)), 7);
        // Ended by SIGTERM (15), and by SIGKILL (9).
        assert_eq!(exit_status(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_status(ExitStatus::from_raw(9)), 137);
    }
}
